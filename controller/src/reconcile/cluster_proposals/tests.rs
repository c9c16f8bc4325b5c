use super::*;
use crate::learn::cluster_policies::{EdgeEnd, NamespaceEdge};

/// The proposals learning writes for namespaces `a` and `b` (each calls the other), labelled as
/// given.
fn proposals(labels: &[(&str, &[(&str, &str)])]) -> Vec<ClusterNetworkPolicyProposal> {
    let edges = [("a", "b"), ("b", "a")].map(|(from, to)| NamespaceEdge {
        from: from.into(),
        to: EdgeEnd::Namespace(to.into()),
    });
    let learned = cluster_policies::propose(&edges, &Settings::default()).policies;
    labels
        .iter()
        .map(|(name, labels)| {
            let policy = learned
                .iter()
                .find(|p| p.name_any() == *name)
                .unwrap_or_else(|| panic!("{name} is learned"));
            let mut p = ClusterNetworkPolicyProposal::new(
                name,
                ClusterNetworkPolicyProposalSpec {
                    policy: policy.spec.clone(),
                },
            );
            p.metadata.labels = Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            );
            p
        })
        .collect()
}

#[test]
fn learned_proposals_of_a_deleted_namespace_go_unless_promoted() {
    let managed = (MANAGED_BY_LABEL.0, MANAGED_BY_LABEL.1);
    let promoted = (PROMOTE_LABEL, "protect");
    let all = proposals(&[
        ("ne-isolate-a", &[managed]),
        ("ne-floor-a", &[managed]),
        ("ne-isolate-b", &[managed, promoted]),
        ("ne-floor-b", &[]),
    ]);
    let namespaces = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
    let cases: [(&[&str], &[&str]); 4] = [
        // Both namespaces exist: nothing goes.
        (&["a", "b"], &[]),
        // `a` deleted: both of its learned proposals go.
        (&["b"], &["ne-isolate-a", "ne-floor-a"]),
        // `b` deleted: its promoted isolation stays (an admin approved it), and a proposal without
        // the managed-by label is not learning's to delete.
        (&["a"], &[]),
        (&[], &["ne-isolate-a", "ne-floor-a"]),
    ];
    for (existing, expected) in cases {
        assert_eq!(
            gone(&all, &namespaces(existing)),
            expected,
            "namespaces {existing:?}"
        );
    }
    assert_eq!(
        all.iter()
            .map(|p| cluster_policies::subject_namespace(&p.spec.policy))
            .collect::<Vec<_>>(),
        [Some("a"), Some("a"), Some("b"), Some("b")]
    );
}
