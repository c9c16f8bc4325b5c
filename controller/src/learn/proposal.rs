//! A new proposal for a target, and how a peer is written in its rules.

use super::*;

/// The NetworkPolicy peer for an endpoint, as in the reference: a workload by namespace name and its
/// own selector; anything outside the cluster's pods by its address as a /32 (/128) ipBlock.
pub fn peer_of(endpoint: &FlowEnd) -> NetworkPolicyPeer {
    match endpoint {
        FlowEnd::Workload(w) => NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    NAMESPACE_NAME_LABEL.to_string(),
                    w.namespace.clone(),
                )])),
                match_expressions: None,
            }),
            pod_selector: Some(w.label_selector()),
            ip_block: None,
        },
        FlowEnd::Node { ip, .. } | FlowEnd::HostNetwork { ip, .. } | FlowEnd::External(ip) => {
            NetworkPolicyPeer {
                ip_block: Some(IPBlock {
                    cidr: match ip {
                        IpAddr::V4(_) => format!("{ip}/32"),
                        IpAddr::V6(_) => format!("{ip}/128"),
                    },
                    except: None,
                }),
                ..NetworkPolicyPeer::default()
            }
        }
    }
}

/// A new, empty proposal for `target`, owned by its workload (a bare pod: by the pod) when its uid is
/// known.
pub fn new_proposal(target: &Target, backend: Backend) -> WorkloadNetworkPolicyProposal {
    let selector = target.workload.label_selector();
    let owner_references = target.workload.uid.as_ref().map(|uid| {
        vec![OwnerReference {
            api_version: target.workload.api_version.clone(),
            kind: target.kind.as_str().into(),
            name: target.workload.name.clone(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }]
    });
    let (kubernetes, istio) = match backend {
        Backend::Kubernetes => (
            Some(NetworkPolicySpec {
                pod_selector: Some(selector),
                policy_types: Some(vec![target.direction.as_str().into()]),
                ..NetworkPolicySpec::default()
            }),
            None,
        ),
        Backend::Istio => (
            None,
            Some(IstioPolicy {
                selector,
                rules: vec![],
            }),
        ),
    };
    WorkloadNetworkPolicyProposal {
        metadata: ObjectMeta {
            name: Some(target.name()),
            namespace: Some(target.workload.namespace.clone()),
            owner_references,
            ..ObjectMeta::default()
        },
        spec: WorkloadNetworkPolicyProposalSpec {
            backend,
            kubernetes,
            istio,
            target_ref: TargetRef {
                kind: target.kind,
                name: target.workload.name.clone(),
            },
            direction: target.direction,
            egress_names: Vec::new(),
        },
        status: None,
    }
}
