//! ClusterNetworkPolicy (`policy.networking.k8s.io/v1alpha2`): the tiers around NetworkPolicy.
//!
//! For one side of a connection (egress at the source pod, ingress at the destination pod):
//! 1. the **Admin** tier: the Admin policies whose subject selects the pod, by precedence (lower
//!    `priority` first; ties, which upstream leaves to the implementation, by name), each one's rules
//!    of that direction in order. The first rule whose peers and protocols match decides: `Accept`
//!    and `Deny` are final, `Pass` goes on to the next tier;
//! 2. the **NetworkPolicy** tier: if NetworkPolicies isolate the pod for the direction, their
//!    verdict is final;
//! 3. the **Baseline** tier, like the Admin one; `Pass` (or no match) ends in
//! 4. the default: allowed.
//!
//! Fail closed: a rule with a part the API server would reject, or that we do not support (the
//! experimental `nodes` and `domainNames` peers), matches nothing when it accepts, and denies
//! everything when it denies or passes (upstream's rule for peers it cannot read).

use crate::peer::{Block, End};
use crate::policy::Query;
use crate::port::Port;
use crate::{Direction, Invalid, Labels, Protocol};
use ipnet::IpNet;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use network_enforcer_api::cluster_network_policy::{
    ClusterNetworkPolicyPeer, ClusterNetworkPolicyProtocol, ClusterNetworkPolicyRule,
    ClusterNetworkPolicySpec, ClusterNetworkPolicySubject, NamespacedPod,
};
use network_enforcer_api::selector;
use std::borrow::Cow;
use std::fmt;

/// Where a cluster policy sits: before or after NetworkPolicies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    Admin,
    Baseline,
}

/// What a rule does to the connections it matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Accept,
    Deny,
    /// Skip the rest of this tier: the next tier decides.
    Pass,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Admin => "Admin",
            Tier::Baseline => "Baseline",
        })
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Accept => "Accept",
            Action::Deny => "Deny",
            Action::Pass => "Pass",
        })
    }
}

/// A ClusterNetworkPolicy ready to match connections.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterPolicy<'a> {
    pub name: Cow<'a, str>,
    pub tier: Tier,
    pub priority: i32,
    subject: Pods<'a>,
    ingress: Vec<ClusterRule<'a>>,
    egress: Vec<ClusterRule<'a>>,
}

/// Pods by namespace selector and (optionally) pod selector.
#[derive(Clone, Debug, PartialEq)]
struct Pods<'a> {
    namespace: Cow<'a, LabelSelector>,
    /// `None`: every pod of those namespaces.
    pod: Option<Cow<'a, LabelSelector>>,
}

/// One rule of a direction.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterRule<'a> {
    pub name: Option<Cow<'a, str>>,
    pub action: Action,
    peers: Vec<ClusterPeer<'a>>,
    /// `None`: every protocol and port.
    ports: Option<Vec<Port<'a>>>,
    /// Why the rule fails closed, if it does.
    pub invalid: Option<Invalid>,
}

#[derive(Clone, Debug, PartialEq)]
enum ClusterPeer<'a> {
    Pods(Pods<'a>),
    /// CIDRs, which match pod addresses too.
    Networks(Vec<Block>),
}

/// A rule's peer as enforcers read it ([`ClusterRule::peers`]).
#[derive(Clone, Copy, Debug)]
pub enum PeerRef<'p> {
    /// Pods: those of the namespaces `namespace` selects, and of them those `pod` selects (`None`:
    /// every pod).
    Pods {
        namespace: &'p LabelSelector,
        pod: Option<&'p LabelSelector>,
    },
    /// Address blocks (without excepts), which match pod addresses too.
    Networks(&'p [Block]),
}

/// The rule of a tier that decided a side.
#[derive(Clone, Copy, Debug)]
pub struct Match<'p, 'a> {
    pub policy: &'p ClusterPolicy<'a>,
    /// The rule's index in the policy's rules of the direction, and its name if it has one.
    pub rule: usize,
    pub rule_name: Option<&'p str>,
    pub action: Action,
}

/// The tier whose answer stood for one side; ordered as the tiers are consulted (Admin first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Decider {
    Admin,
    NetworkPolicy,
    Baseline,
    /// No tier decided: allowed.
    Default,
}

impl Decider {
    /// The cluster tier that decided, when one did (not the NetworkPolicies, not the default).
    pub fn tier(self) -> Option<Tier> {
        match self {
            Decider::Admin => Some(Tier::Admin),
            Decider::Baseline => Some(Tier::Baseline),
            Decider::NetworkPolicy | Decider::Default => None,
        }
    }
}

/// Whether one side lets a connection through, and which tier decided: `admin` and `baseline` are
/// the first matching actions of those tiers (for the side's pod), `network_policy` whether the
/// NetworkPolicies isolating the pod allow it (`None`: none isolates it).
pub fn combine(
    admin: Option<Action>,
    network_policy: Option<bool>,
    baseline: Option<Action>,
) -> (bool, Decider) {
    match admin {
        Some(Action::Accept) => return (true, Decider::Admin),
        Some(Action::Deny) => return (false, Decider::Admin),
        Some(Action::Pass) | None => {}
    }
    if let Some(allowed) = network_policy {
        return (allowed, Decider::NetworkPolicy);
    }
    match baseline {
        Some(Action::Accept) => (true, Decider::Baseline),
        Some(Action::Deny) => (false, Decider::Baseline),
        Some(Action::Pass) | None => (true, Decider::Default),
    }
}

/// The first rule, in precedence order, of `policies` (one tier's policies that select the side's
/// pod, sorted by [`ClusterPolicy::precedence`]) that matches `query`.
pub fn first_match<'p, 'a: 'p>(
    policies: impl IntoIterator<Item = &'p ClusterPolicy<'a>>,
    direction: Direction,
    query: &Query<'_>,
) -> Option<Match<'p, 'a>> {
    policies.into_iter().find_map(|policy| {
        policy
            .rules(direction)
            .iter()
            .enumerate()
            .find_map(|(rule, r)| {
                r.decides(query).map(|action| Match {
                    policy,
                    rule,
                    rule_name: r.name.as_deref(),
                    action,
                })
            })
    })
}

impl<'a> ClusterPolicy<'a> {
    /// Parses policy `name`; `Err` when it cannot apply to anything (an unknown tier, or a subject
    /// without exactly one field), which callers report.
    pub fn parse(name: &'a str, spec: &'a ClusterNetworkPolicySpec) -> Result<Self, Invalid> {
        let tier = match spec.tier.as_str() {
            "Admin" => Tier::Admin,
            "Baseline" => Tier::Baseline,
            other => return Err(Invalid::Tier(other.to_string())),
        };
        let subject = match &spec.subject {
            ClusterNetworkPolicySubject {
                namespaces: Some(namespaces),
                pods: None,
            } => Pods {
                namespace: Cow::Borrowed(namespaces),
                pod: None,
            },
            ClusterNetworkPolicySubject {
                namespaces: None,
                pods: Some(pods),
            } => Pods::of(pods),
            _ => return Err(Invalid::Subject),
        };
        let rules = |rules: &'a [ClusterNetworkPolicyRule], direction| {
            rules
                .iter()
                .map(|r| ClusterRule::parse(r, direction))
                .collect()
        };
        Ok(ClusterPolicy {
            name: Cow::Borrowed(name),
            tier,
            priority: spec.priority,
            subject,
            ingress: rules(&spec.ingress, Direction::Ingress),
            egress: rules(&spec.egress, Direction::Egress),
        })
    }

    /// The same policy owning all it refers to.
    pub fn into_owned(self) -> ClusterPolicy<'static> {
        let rules =
            |rules: Vec<ClusterRule<'a>>| rules.into_iter().map(ClusterRule::into_owned).collect();
        ClusterPolicy {
            name: Cow::Owned(self.name.into_owned()),
            tier: self.tier,
            priority: self.priority,
            subject: self.subject.into_owned(),
            ingress: rules(self.ingress),
            egress: rules(self.egress),
        }
    }

    /// The sort key within a tier: lower priority first, then name.
    pub fn precedence(&self) -> (i32, &str) {
        (self.priority, &self.name)
    }

    /// Whether the subject selects a pod with `labels` in a namespace with `namespace_labels`
    /// (callers never ask for host-network pods).
    pub fn selects(&self, namespace_labels: &Labels, labels: &Labels) -> bool {
        self.subject.select(namespace_labels, labels)
    }

    /// The rules of `direction`, in order of precedence.
    pub fn rules(&self, direction: Direction) -> &[ClusterRule<'a>] {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }
}

impl<'a> Pods<'a> {
    fn of(pods: &'a NamespacedPod) -> Self {
        Pods {
            namespace: Cow::Borrowed(&pods.namespace_selector),
            pod: Some(Cow::Borrowed(&pods.pod_selector)),
        }
    }

    fn into_owned(self) -> Pods<'static> {
        Pods {
            namespace: Cow::Owned(self.namespace.into_owned()),
            pod: self.pod.map(|p| Cow::Owned(p.into_owned())),
        }
    }

    fn select(&self, namespace_labels: &Labels, labels: &Labels) -> bool {
        selector::matches(&self.namespace, namespace_labels)
            && self
                .pod
                .as_deref()
                .is_none_or(|s| selector::matches(s, labels))
    }
}

impl<'a> ClusterRule<'a> {
    fn parse(rule: &'a ClusterNetworkPolicyRule, direction: Direction) -> Self {
        let mut invalid = None;
        let action = match rule.action.as_str() {
            "Accept" => Action::Accept,
            "Deny" => Action::Deny,
            "Pass" => Action::Pass,
            other => {
                invalid = Some(Invalid::Action(other.to_string()));
                // An action we cannot read denies (fail closed).
                Action::Deny
            }
        };
        let listed = match direction {
            Direction::Ingress => &rule.from,
            Direction::Egress => &rule.to,
        };
        let mut peers = Vec::new();
        if listed.is_empty() {
            invalid.get_or_insert(Invalid::EmptyPeer);
        }
        for peer in listed {
            match ClusterPeer::parse(peer, direction) {
                Ok(peer) => peers.push(peer),
                Err(why) => {
                    invalid.get_or_insert(why);
                }
            }
        }
        let ports = match &rule.protocols {
            None => None,
            Some(protocols) if protocols.is_empty() => {
                invalid.get_or_insert(Invalid::ProtocolFields);
                None
            }
            Some(protocols) => {
                let mut ports = Vec::new();
                for protocol in protocols {
                    match ports_of(protocol) {
                        Ok(list) => ports.extend(list),
                        Err(why) => {
                            invalid.get_or_insert(why);
                        }
                    }
                }
                Some(ports)
            }
        };
        ClusterRule {
            name: rule.name.as_deref().map(Cow::Borrowed),
            action,
            peers,
            ports,
            invalid,
        }
    }

    fn into_owned(self) -> ClusterRule<'static> {
        ClusterRule {
            name: self.name.map(|n| Cow::Owned(n.into_owned())),
            action: self.action,
            peers: self
                .peers
                .into_iter()
                .map(|p| match p {
                    ClusterPeer::Pods(pods) => ClusterPeer::Pods(pods.into_owned()),
                    ClusterPeer::Networks(blocks) => ClusterPeer::Networks(blocks),
                })
                .collect(),
            ports: self
                .ports
                .map(|ports| ports.into_iter().map(Port::into_owned).collect()),
            invalid: self.invalid,
        }
    }

    /// The rule's peers, for enforcers that turn them into address sets. A rule that fails closed
    /// ([`ClusterRule::invalid`]) is read by [`ClusterRule::fails_closed_to`] instead.
    pub fn peers(&self) -> impl Iterator<Item = PeerRef<'_>> {
        self.peers.iter().map(|p| match p {
            ClusterPeer::Pods(pods) => PeerRef::Pods {
                namespace: &pods.namespace,
                pod: pods.pod.as_deref(),
            },
            ClusterPeer::Networks(blocks) => PeerRef::Networks(blocks),
        })
    }

    /// The rule's ports; `None`: every protocol and port.
    pub fn ports(&self) -> Option<&[Port<'a>]> {
        self.ports.as_deref()
    }

    /// For a rule that fails closed: `None` when it matches nothing (an Accept), `Some(Deny)` when
    /// it denies everything (a Deny or a Pass); for a readable rule, `None`.
    pub fn fails_closed_to(&self) -> Option<Action> {
        self.invalid.as_ref()?;
        match self.action {
            Action::Accept => None,
            Action::Deny | Action::Pass => Some(Action::Deny),
        }
    }

    /// What the rule does to `query`: `None` when it does not match. A rule that fails closed
    /// matches nothing when it accepts, and denies everything otherwise.
    pub fn decides(&self, query: &Query<'_>) -> Option<Action> {
        if self.invalid.is_some() {
            return self.fails_closed_to();
        }
        let port = self
            .ports
            .as_ref()
            .is_none_or(|ports| ports.iter().any(|p| p.matches(&query.port)));
        let peer = self.peers.iter().any(|p| p.matches(query.peer));
        (port && peer).then_some(self.action)
    }
}

impl<'a> ClusterPeer<'a> {
    fn parse(peer: &'a ClusterNetworkPolicyPeer, direction: Direction) -> Result<Self, Invalid> {
        let ClusterNetworkPolicyPeer {
            namespaces,
            pods,
            nodes,
            networks,
            domain_names,
        } = peer;
        let set = usize::from(namespaces.is_some())
            + usize::from(pods.is_some())
            + usize::from(nodes.is_some())
            + usize::from(networks.is_some())
            + usize::from(domain_names.is_some());
        if set != 1 {
            return Err(Invalid::PeerFields);
        }
        let egress_only = |field| match direction {
            Direction::Egress => Err(Invalid::Unsupported(field)),
            Direction::Ingress => Err(Invalid::PeerFields),
        };
        if let Some(namespaces) = namespaces {
            return Ok(ClusterPeer::Pods(Pods {
                namespace: Cow::Borrowed(namespaces),
                pod: None,
            }));
        }
        if let Some(pods) = pods {
            return Ok(ClusterPeer::Pods(Pods::of(pods)));
        }
        if nodes.is_some() {
            return egress_only("nodes");
        }
        if domain_names.is_some() {
            return egress_only("domainNames");
        }
        let networks = networks.as_deref().unwrap_or_default();
        if direction == Direction::Ingress || networks.is_empty() {
            return Err(Invalid::PeerFields);
        }
        let blocks = networks
            .iter()
            .map(|cidr| {
                cidr.parse::<IpNet>()
                    .map(|net| Block {
                        cidr: net.trunc(),
                        except: Vec::new(),
                    })
                    .map_err(|_| Invalid::Cidr(cidr.clone()))
            })
            .collect::<Result<_, _>>()?;
        Ok(ClusterPeer::Networks(blocks))
    }

    /// Whether `end` is this peer: pods by selectors (never a bare address), networks by address
    /// (a pod's addresses included).
    fn matches(&self, end: End<'_>) -> bool {
        match (self, end) {
            (ClusterPeer::Pods(pods), End::Pod(pod)) => {
                pods.select(pod.namespace_labels, pod.labels)
            }
            (ClusterPeer::Pods(_), End::Address(_)) => false,
            (ClusterPeer::Networks(blocks), End::Address(ip)) => {
                blocks.iter().any(|b| b.contains(&ip))
            }
            (ClusterPeer::Networks(blocks), End::Pod(pod)) => pod
                .ips
                .iter()
                .any(|ip| blocks.iter().any(|b| b.contains(ip))),
        }
    }
}

/// The ports one `protocols` entry stands for. A named port has no protocol of its own: it matches
/// the destination's container port of that name with whatever protocol it is declared.
fn ports_of(protocol: &ClusterNetworkPolicyProtocol) -> Result<Vec<Port<'_>>, Invalid> {
    let ClusterNetworkPolicyProtocol {
        tcp,
        udp,
        sctp,
        destination_named_port,
    } = protocol;
    match (tcp, udp, sctp, destination_named_port) {
        (Some(p), None, None, None) => Ok(vec![port(Protocol::TCP, p)?]),
        (None, Some(p), None, None) => Ok(vec![port(Protocol::UDP, p)?]),
        (None, None, Some(p), None) => Ok(vec![port(Protocol::SCTP, p)?]),
        (None, None, None, Some(name)) if !name.is_empty() => {
            Ok([Protocol::TCP, Protocol::UDP, Protocol::SCTP]
                .into_iter()
                .map(|p| Port::Named(p, Cow::Borrowed(name.as_str())))
                .collect())
        }
        _ => Err(Invalid::ProtocolFields),
    }
}

fn port(
    protocol: Protocol,
    port: &network_enforcer_api::cluster_network_policy::ProtocolPort,
) -> Result<Port<'static>, Invalid> {
    let Some(destination) = &port.destination_port else {
        return Err(Invalid::ProtocolFields);
    };
    let (first, last) = match (destination.number, &destination.range) {
        (Some(n), None) => (n, n),
        (None, Some(range)) if range.start < range.end => (range.start, range.end),
        (None, Some(range)) => {
            return Err(Invalid::Range {
                first: range.start,
                last: range.end,
            });
        }
        _ => return Err(Invalid::ProtocolFields),
    };
    match (u16::try_from(first), u16::try_from(last)) {
        (Ok(f), Ok(l)) if f >= 1 => Ok(Port::Range(protocol, f, l)),
        _ => Err(Invalid::Range { first, last }),
    }
}

#[cfg(test)]
mod tests;
