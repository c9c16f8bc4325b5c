//! A rule's peers: pods chosen by selectors, or an address block.

use crate::{Invalid, Labels};
use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use network_enforcer_api::selector;
use std::borrow::Cow;
use std::net::IpAddr;

/// One entry of a rule's `from` or `to`.
#[derive(Clone, Debug, PartialEq)]
pub enum Peer<'a> {
    /// Matches nothing.
    Invalid(Invalid),
    /// An `ipBlock`.
    Block(Block),
    /// Pods: `namespace: None` means the policy's own namespace, `pod: None` every pod.
    Selectors {
        namespace: Option<Cow<'a, LabelSelector>>,
        pod: Option<Cow<'a, LabelSelector>>,
    },
}

/// An `ipBlock`: `cidr` minus every `except`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Normalized to its network address (`10.0.0.1/8` is `10.0.0.0/8`).
    pub cidr: IpNet,
    pub except: Vec<IpNet>,
}

impl Block {
    /// Reads `block`; a malformed CIDR or except is [`Invalid`] (dropping an except would widen it).
    pub fn parse(block: &IPBlock) -> Result<Self, Invalid> {
        let cidr = block
            .cidr
            .parse::<IpNet>()
            .map_err(|_| Invalid::Cidr(block.cidr.clone()))?
            .trunc();
        let except = block
            .except
            .iter()
            .flatten()
            .map(|e| {
                e.parse::<IpNet>()
                    .map(|e| e.trunc())
                    .map_err(|_| Invalid::Except(e.clone()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Block { cidr, except })
    }

    /// Whether `ip` is inside the block and outside its excepts; a block of the other address family
    /// never contains it.
    pub fn contains(&self, ip: &IpAddr) -> bool {
        self.cidr.contains(ip) && !self.except.iter().any(|e| e.contains(ip))
    }
}

/// A pod as a connection's other end (or as the subject of a selector).
#[derive(Clone, Copy, Debug)]
pub struct PodEnd<'a> {
    pub namespace: &'a str,
    /// The labels of the pod's namespace (with its `kubernetes.io/metadata.name`).
    pub namespace_labels: &'a Labels,
    pub labels: &'a Labels,
    pub ips: &'a [IpAddr],
}

/// The other end of a connection: a pod, or an address that is no pod (outside the cluster, a node,
/// a host-network pod).
#[derive(Clone, Copy, Debug)]
pub enum End<'a> {
    Pod(PodEnd<'a>),
    Address(IpAddr),
}

impl<'a> Peer<'a> {
    /// Reads `peer` as the API server would accept it; anything it would reject is
    /// [`Peer::Invalid`].
    pub fn parse(peer: &'a NetworkPolicyPeer) -> Self {
        match (&peer.ip_block, &peer.namespace_selector, &peer.pod_selector) {
            (Some(block), None, None) => match Block::parse(block) {
                Ok(block) => Peer::Block(block),
                Err(why) => Peer::Invalid(why),
            },
            (Some(_), _, _) => Peer::Invalid(Invalid::BlockWithSelector),
            (None, None, None) => Peer::Invalid(Invalid::EmptyPeer),
            (None, namespace, pod) => Peer::Selectors {
                namespace: namespace.as_ref().map(Cow::Borrowed),
                pod: pod.as_ref().map(Cow::Borrowed),
            },
        }
    }

    /// The same peer owning its selectors.
    pub fn into_owned(self) -> Peer<'static> {
        match self {
            Peer::Invalid(why) => Peer::Invalid(why),
            Peer::Block(block) => Peer::Block(block),
            Peer::Selectors { namespace, pod } => Peer::Selectors {
                namespace: namespace.map(|s| Cow::Owned(s.into_owned())),
                pod: pod.map(|s| Cow::Owned(s.into_owned())),
            },
        }
    }

    /// Whether the peer's selectors look into namespace `namespace` (with `labels`), for a policy of
    /// `policy_namespace`. Blocks choose no namespace.
    pub fn selects_namespace(
        &self,
        policy_namespace: &str,
        namespace: &str,
        labels: &Labels,
    ) -> bool {
        match self {
            Peer::Selectors {
                namespace: None, ..
            } => namespace == policy_namespace,
            Peer::Selectors {
                namespace: Some(s), ..
            } => selector::matches(s, labels),
            Peer::Invalid(_) | Peer::Block(_) => false,
        }
    }

    /// Whether the peer's `podSelector` chooses a pod with `labels` (of a namespace it looks into).
    pub fn selects_labels(&self, labels: &Labels) -> bool {
        match self {
            Peer::Selectors { pod, .. } => {
                pod.as_deref().is_none_or(|s| selector::matches(s, labels))
            }
            Peer::Invalid(_) | Peer::Block(_) => false,
        }
    }

    /// Whether `end` is this peer, for a policy of `policy_namespace`. A pod matches a block only
    /// when `ip_blocks_match_pods` (CNIs differ: most match pod addresses against ipBlocks, some
    /// never do); one of its addresses in the block is enough.
    pub fn matches(
        &self,
        policy_namespace: &str,
        end: End<'_>,
        ip_blocks_match_pods: bool,
    ) -> bool {
        match (self, end) {
            (Peer::Invalid(_), _) => false,
            (Peer::Block(block), End::Address(ip)) => block.contains(&ip),
            (Peer::Block(block), End::Pod(pod)) => {
                ip_blocks_match_pods && pod.ips.iter().any(|ip| block.contains(ip))
            }
            // Selectors choose pods, never bare addresses.
            (Peer::Selectors { .. }, End::Address(_)) => false,
            (Peer::Selectors { .. }, End::Pod(pod)) => {
                self.selects_namespace(policy_namespace, pod.namespace, pod.namespace_labels)
                    && self.selects_labels(pod.labels)
            }
        }
    }

    /// Why the peer allows nothing, if it does not.
    pub fn invalid(&self) -> Option<&Invalid> {
        match self {
            Peer::Invalid(why) => Some(why),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn peer(value: serde_json::Value) -> NetworkPolicyPeer {
        serde_json::from_value(value).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn peers_parse_as_the_api_server_accepts_them() {
        let cases = [
            (json!({}), Some(Invalid::EmptyPeer)),
            (
                json!({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}),
                Some(Invalid::BlockWithSelector),
            ),
            (
                json!({"ipBlock": {"cidr": "10.0.0.0/33"}}),
                Some(Invalid::Cidr("10.0.0.0/33".into())),
            ),
            (
                json!({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1/16"]}}),
                Some(Invalid::Except("10.1/16".into())),
            ),
            (
                json!({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}),
                None,
            ),
            (json!({"podSelector": {}}), None),
            (json!({"namespaceSelector": {}}), None),
        ];
        for (input, want) in cases {
            let p = peer(input.clone());
            assert_eq!(Peer::parse(&p).invalid(), want.as_ref(), "{input}");
        }
    }

    #[test]
    fn a_peer_matches_pods_by_selectors_and_addresses_by_block() {
        let ns_a = labels(&[("kubernetes.io/metadata.name", "a"), ("team", "x")]);
        let ns_b = labels(&[("kubernetes.io/metadata.name", "b")]);
        let web = labels(&[("app", "web")]);
        let ips: [IpAddr; 1] = ["10.1.0.5".parse().unwrap()];
        let pod = |namespace, namespace_labels| {
            End::Pod(PodEnd {
                namespace,
                namespace_labels,
                labels: &web,
                ips: &ips,
            })
        };
        let outside = End::Address("192.0.2.1".parse().unwrap());
        let inside = End::Address("10.1.0.5".parse().unwrap());
        let cases = [
            // podSelector alone: the policy's namespace only.
            (
                json!({"podSelector": {"matchLabels": {"app": "web"}}}),
                pod("a", &ns_a),
                true,
            ),
            (
                json!({"podSelector": {"matchLabels": {"app": "web"}}}),
                pod("b", &ns_b),
                false,
            ),
            (
                json!({"podSelector": {"matchLabels": {"app": "db"}}}),
                pod("a", &ns_a),
                false,
            ),
            // namespaceSelector alone: every pod of those namespaces.
            (
                json!({"namespaceSelector": {"matchLabels": {"team": "x"}}}),
                pod("a", &ns_a),
                true,
            ),
            (
                json!({"namespaceSelector": {"matchLabels": {"team": "x"}}}),
                pod("b", &ns_b),
                false,
            ),
            (json!({"namespaceSelector": {}}), pod("b", &ns_b), true),
            // Both: ANDed.
            (
                json!({"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "db"}}}),
                pod("b", &ns_b),
                false,
            ),
            // Selectors never choose an address.
            (json!({"namespaceSelector": {}}), inside, false),
            (json!({"ipBlock": {"cidr": "10.0.0.0/8"}}), inside, true),
            (
                json!({"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}),
                inside,
                false,
            ),
            (json!({"ipBlock": {"cidr": "10.0.0.0/8"}}), outside, false),
            (json!({"ipBlock": {"cidr": "::/0"}}), outside, false),
            // A pod's address in a block (CNIs that match pods against ipBlocks).
            (
                json!({"ipBlock": {"cidr": "10.0.0.0/8"}}),
                pod("b", &ns_b),
                true,
            ),
            (json!({}), pod("a", &ns_a), false),
        ];
        for (i, (input, end, want)) in cases.into_iter().enumerate() {
            let p = peer(input.clone());
            assert_eq!(
                Peer::parse(&p).matches("a", end, true),
                want,
                "case {i}: {input}"
            );
        }
        let block = peer(json!({"ipBlock": {"cidr": "10.0.0.0/8"}}));
        assert!(
            !Peer::parse(&block).matches("a", pod("a", &ns_a), false),
            "without ip_blocks_match_pods a block never matches a pod"
        );
    }

    #[test]
    fn blocks_contain_what_they_should() {
        let cases = [
            ("10.0.0.0/8", "10.255.1.1", true),
            ("10.0.0.0/8", "11.0.0.1", false),
            ("0.0.0.0/0", "1.2.3.4", true),
            ("10.0.0.5/32", "10.0.0.5", true),
            ("10.0.0.5/32", "10.0.0.6", false),
            ("fd00::/8", "fd12::1", true),
            ("fd00::/8", "10.0.0.1", false),
            ("::/0", "::1", true),
            ("0.0.0.0/0", "::1", false),
        ];
        for (cidr, ip, inside) in cases {
            let block: IPBlock = serde_json::from_value(json!({"cidr": cidr})).unwrap();
            let block = Block::parse(&block).unwrap();
            assert_eq!(block.contains(&ip.parse().unwrap()), inside, "{cidr} {ip}");
        }
        for bad in ["10.0.0.0", "10.0.0.0/33", "x/8", "::/129", ""] {
            let block: IPBlock = serde_json::from_value(json!({"cidr": bad})).unwrap();
            assert_eq!(
                Block::parse(&block),
                Err(Invalid::Cidr(bad.into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_block_is_kept_as_its_network() {
        let block: IPBlock = serde_json::from_value(json!({"cidr": "10.1.2.3/16"})).unwrap();
        assert_eq!(
            Block::parse(&block).unwrap().cidr.to_string(),
            "10.1.0.0/16"
        );
    }
}
