//! The proposals' shape from small graphs; that they allow exactly the observed traffic is checked
//! through the evaluator in `tools::check` (`proposed_cluster_policies_allow_what_was_observed`).

use super::*;

fn edge(from: &str, to: &str) -> NamespaceEdge {
    NamespaceEdge {
        from: from.into(),
        to: match to.parse::<IpAddr>() {
            Ok(ip) => EdgeEnd::Address(ip),
            Err(_) => EdgeEnd::Namespace(to.into()),
        },
    }
}

fn names(rule: &ClusterNetworkPolicyPeer) -> Vec<String> {
    rule.namespaces
        .as_ref()
        .and_then(|s| s.match_expressions.as_ref())
        .map(|e| e[0].values.clone().unwrap_or_default())
        .unwrap_or_default()
}

#[test]
fn each_namespace_gets_its_isolation_and_its_floor() {
    let edges = [
        edge("shop", "shop"),
        edge("web", "shop"),
        edge("shop", "kube-system"),
        edge("kube-system", "shop"),
        edge("shop", "203.0.113.7"),
    ];
    let proposed = propose(&edges, &Settings::default());
    let by_name: BTreeMap<String, &ClusterNetworkPolicy> = proposed
        .policies
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect();
    assert_eq!(
        by_name.keys().collect::<Vec<_>>(),
        [
            "ne-floor-shop",
            "ne-floor-web",
            "ne-isolate-shop",
            "ne-isolate-web"
        ],
        "system namespaces are never subjects"
    );
    let isolate = &by_name["ne-isolate-shop"].spec;
    assert_eq!((isolate.tier.as_str(), isolate.priority), ("Admin", 900));
    assert_eq!(isolate.ingress[0].action, "Pass");
    assert_eq!(
        names(&isolate.ingress[0].from[0]),
        ["kube-system", "shop", "web"]
    );
    assert_eq!(isolate.ingress[1].action, "Deny");
    let floor = &by_name["ne-floor-shop"].spec;
    assert_eq!(floor.tier, "Baseline");
    let rules: Vec<(&str, &str)> = floor
        .egress
        .iter()
        .map(|r| (r.name.as_deref().unwrap(), r.action.as_str()))
        .collect();
    assert_eq!(
        rules,
        [
            ("dns", "Accept"),
            ("namespaces", "Accept"),
            ("outside", "Accept"),
            ("floor", "Deny")
        ]
    );
    assert_eq!(names(&floor.egress[1].to[0]), ["kube-system", "shop"]);
    assert_eq!(
        floor.egress[2].to[0].networks.as_deref(),
        Some(&["203.0.113.7/32".to_string()][..])
    );
    assert!(proposed.notes.is_empty());
}

#[test]
fn outside_addresses_stay_within_the_api_limits() {
    // 30 addresses in two /24s: widened to the /24s.
    let edges: Vec<NamespaceEdge> = (0..30)
        .map(|i| edge("shop", &format!("198.51.{}.{}", i % 2, i + 1)))
        .collect();
    let proposed = propose(&edges, &Settings::default());
    let floor = &proposed.policies[1].spec;
    assert_eq!(floor.tier, "Baseline");
    assert_eq!(
        floor.egress[2].to[0].networks.as_deref(),
        Some(&["198.51.0.0/24".to_string(), "198.51.1.0/24".to_string()][..])
    );
    // 30 addresses in 30 /24s: more than 25 networks; outside addresses are left alone, and said so.
    let edges: Vec<NamespaceEdge> = (0..30)
        .map(|i| edge("shop", &format!("198.51.{i}.1")))
        .collect();
    let proposed = propose(&edges, &Settings::default());
    let floor = &proposed.policies[1].spec;
    let last = floor.egress.last().unwrap();
    assert_eq!(last.action, "Deny");
    assert!(last.to.iter().all(|p| p.networks.is_none()), "{last:?}");
    assert_eq!(proposed.notes.len(), 1, "{:?}", proposed.notes);
    assert!(floor.egress.iter().all(|r| r.to.len() <= MAX_PER_RULE));
}
