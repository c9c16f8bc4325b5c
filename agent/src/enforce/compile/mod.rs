//! NetworkPolicy semantics ([`netpol`], the one definition the controller's evaluator shares),
//! compiled for the pods of one node: which of them are isolated in which direction, and what each
//! may still send or receive. Pure: [`compile`] turns a [`Cluster`] into a [`Ruleset`];
//! [`crate::enforce::nft`] renders that for the kernel.
//!
//! What [`netpol`] decides per connection is turned into sets here:
//! - the pods a policy isolates ([`Policy::isolates`]) get the union of its rules for the direction;
//! - a peer's selectors become the addresses of the running pods they choose (host-network pods
//!   excepted: their address is the node's); an `ipBlock` stays a block;
//! - a named port resolves on ingress to the isolated pod's own container port, on egress to each
//!   destination pod's (so one named port may stand for several numbers).
//!
//! What cannot be enforced is reported in [`Ruleset::warnings`] and allows nothing (what the API
//! server would reject, [`netpol::Invalid`], and SCTP, which the node's table does not filter): a
//! policy is never widened by what it cannot express.

use crate::enforce::model::{Cluster, PodEntry};
use ipnet::IpNet;
use netpol::cluster::{Action, ClusterPolicy, PeerRef, Tier};
use netpol::{Direction, Labels, Peer, Policy, Port, Rule};
use network_enforcer_api::selector;
use network_enforcer_api::{NameRule, Protocol};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

/// Who a rule lets through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peers {
    /// Every address.
    Any,
    /// These pod addresses (never empty; shared by every pod the same peer applies to).
    Addresses(Arc<BTreeSet<IpAddr>>),
    /// An `ipBlock`.
    Block { cidr: IpNet, except: Vec<IpNet> },
}

/// Ports `first..=last` of one protocol; `0..=65535` is the whole protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortRange {
    pub protocol: Protocol,
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    pub fn is_whole_protocol(&self) -> bool {
        self.first == 0 && self.last == u16::MAX
    }
}

/// One allowance: these peers on these ports (`None`: every port of every protocol).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allow {
    pub peers: Peers,
    pub ports: Option<Vec<PortRange>>,
}

/// One direction of a pod that policies govern: the ClusterNetworkPolicy tiers around its
/// NetworkPolicies ([`netpol::cluster`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Side {
    /// `namespace/name` of the NetworkPolicies isolating it, then `cnp/<name>` of the
    /// ClusterNetworkPolicies with rules for it (for logs and deny evidence).
    pub policies: Vec<String>,
    /// The Admin tier's rules, in precedence order: the first that matches decides, unless it
    /// passes.
    pub admin: Vec<TierRule>,
    /// Whether NetworkPolicies isolate the pod this way: then `allows` (and `names`) are final,
    /// and the Baseline tier is never reached.
    pub isolated: bool,
    /// What the NetworkPolicies let through; empty: nothing.
    pub allows: Vec<Allow>,
    /// Egress only: outside services allowed by name (`spec.egressNames` of a rendered policy). What
    /// the pod resolves from them is let through by the DNS hold ([`crate::enforce::dns_hold`]).
    pub names: Vec<Arc<NameAllowance>>,
    /// The Baseline tier's rules, in precedence order, for a side no NetworkPolicy isolates.
    pub baseline: Vec<TierRule>,
}

/// One ClusterNetworkPolicy rule as the node enforces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierRule {
    /// `<policy> <direction>[<index>]`, for the table's comments.
    pub name: String,
    pub action: Action,
    /// What the rule matches; empty: nothing.
    pub matches: Vec<Allow>,
}

/// Names a pod may reach on these ports: what it resolves from them becomes reachable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameAllowance {
    /// Host names and wildcards (`*.example.com`), as `spec.egressNames` writes them.
    pub names: Vec<String>,
    /// Never empty: a rule without ports is every TCP and UDP port (SCTP is not enforced).
    pub ports: Vec<PortRange>,
}

impl NameAllowance {
    /// Whether `name` (what a pod asked its resolver) is one of these names.
    pub fn allows(&self, name: &str) -> bool {
        self.names
            .iter()
            .any(|pattern| network_enforcer_api::dns_name::matches(pattern, name))
    }
}

/// A pod of this node that at least one policy governs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IsolatedPod {
    pub namespace: String,
    pub name: String,
    pub ips: Vec<IpAddr>,
    /// `None`: no policy says anything about its ingress.
    pub ingress: Option<Side>,
    /// `None`: no policy says anything about its egress.
    pub egress: Option<Side>,
}

/// What the node enforces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ruleset {
    pub pods: Vec<IsolatedPod>,
    /// Policy parts that allow nothing because they cannot be enforced (each names the policy).
    pub warnings: Vec<String>,
}

impl Ruleset {
    /// Whether some isolated pod may reach outside services by name.
    pub fn has_names(&self) -> bool {
        self.pods
            .iter()
            .any(|p| p.egress.as_ref().is_some_and(|e| !e.names.is_empty()))
    }

    /// Pods NetworkPolicies isolate, per direction: `(ingress, egress)`.
    pub fn isolated(&self) -> (usize, usize) {
        let isolated = |side: &Option<Side>| side.as_ref().is_some_and(|s| s.isolated);
        let ingress = self.pods.iter().filter(|p| isolated(&p.ingress)).count();
        let egress = self.pods.iter().filter(|p| isolated(&p.egress)).count();
        (ingress, egress)
    }
}

/// The ruleset of node `node`: every running pod there (not host-network, with an address) that a
/// policy governs, with the ClusterNetworkPolicy rules that apply to it and the union of what the
/// NetworkPolicies isolating it allow.
pub fn compile(cluster: &Cluster, node: &str) -> Ruleset {
    let mut ruleset = Ruleset::default();
    // Every policy parsed once, per namespace, so each pod looks only at its own namespace's.
    let mut by_namespace: BTreeMap<&str, Vec<Policy<'_>>> = BTreeMap::new();
    for ((namespace, name), spec) in &cluster.policies {
        by_namespace
            .entry(namespace)
            .or_default()
            .push(Policy::parse(namespace, name, spec));
    }
    // The cluster policies by tier and precedence; one that applies to nothing is reported.
    let mut cluster_policies: Vec<ClusterPolicy<'_>> = Vec::new();
    for (name, spec) in &cluster.cluster_policies {
        match ClusterPolicy::parse(name, spec) {
            Ok(policy) => cluster_policies.push(policy),
            Err(why) => ruleset.warnings.push(format!(
                "ClusterNetworkPolicy {name}: {why} (it applies to nothing)"
            )),
        }
    }
    cluster_policies.sort_by(|a, b| (a.tier, a.precedence()).cmp(&(b.tier, b.precedence())));
    let mut memo = Memo::new();
    // A policy's name allowances are the same for every pod it selects: built once.
    let mut names_memo: HashMap<(&str, &str), Vec<Arc<NameAllowance>>> = HashMap::new();
    // A cluster policy's rules are the same for every pod it selects, but for named ports on
    // ingress (the pod's own): built once per pod otherwise, which is cheap next to choosing peers.
    // Warned once per policy that governs a pod here.
    let mut warned: BTreeSet<String> = BTreeSet::new();
    let mut namespace_labels: HashMap<&str, Labels> = HashMap::new();
    for ((namespace, name), pod) in &cluster.pods {
        if pod.node.as_deref() != Some(node) || pod.host_network || pod.ips.is_empty() {
            continue;
        }
        let mut governed = IsolatedPod {
            namespace: namespace.clone(),
            name: name.clone(),
            ips: pod.ips.clone(),
            ingress: None,
            egress: None,
        };
        for policy in by_namespace.get(namespace.as_str()).into_iter().flatten() {
            if !policy.selects(&pod.labels) {
                continue;
            }
            let compiler = Compiler {
                owner: format!("NetworkPolicy {}/{}", policy.namespace, policy.name),
                namespace: &policy.namespace,
                cluster,
                subject: pod,
            };
            if warned.insert(compiler.owner.clone()) {
                for why in policy.invalid() {
                    compiler.warn(&mut ruleset.warnings, why.to_string());
                }
            }
            for direction in [Direction::Ingress, Direction::Egress] {
                let Some(rules) = policy.rules(direction) else {
                    continue;
                };
                let side = governed.side(direction);
                side.isolated = true;
                side.policies
                    .push(format!("{}/{}", policy.namespace, policy.name));
                for rule in rules {
                    let chosen = compiler.chosen(rule, &mut memo);
                    let allows = compiler.allowances(
                        direction,
                        &chosen,
                        rule.ports.as_deref(),
                        &mut ruleset.warnings,
                    );
                    side.allows.extend(allows);
                }
                if direction == Direction::Ingress {
                    continue;
                }
                let key = (namespace.clone(), policy.name.to_string());
                match cluster.name_rules.get(&key) {
                    Some(Ok(rules)) => {
                        let allowances = names_memo
                            .entry((policy.namespace.as_ref(), policy.name.as_ref()))
                            .or_insert_with(|| {
                                rules
                                    .iter()
                                    .filter_map(|rule| {
                                        compiler.name_allowance(rule, &mut ruleset.warnings)
                                    })
                                    .map(Arc::new)
                                    .collect::<Vec<_>>()
                            });
                        side.names.extend(allowances.iter().cloned());
                    }
                    Some(Err(why)) => compiler.warn(&mut ruleset.warnings, why.clone()),
                    None => {}
                }
            }
        }
        if !cluster_policies.is_empty() {
            let labels = namespace_labels
                .entry(namespace.as_str())
                .or_insert_with(|| cluster.namespace_labels(namespace));
            for policy in cluster_policies
                .iter()
                .filter(|p| p.selects(labels, &pod.labels))
            {
                let compiler = Compiler {
                    owner: format!("ClusterNetworkPolicy {}", policy.name),
                    namespace: "",
                    cluster,
                    subject: pod,
                };
                let first = warned.insert(compiler.owner.clone());
                for direction in [Direction::Ingress, Direction::Egress] {
                    let rules = policy.rules(direction);
                    if rules.is_empty() {
                        continue;
                    }
                    let mut tier_rules = Vec::new();
                    for (i, rule) in rules.iter().enumerate() {
                        let name =
                            format!("{} {}[{i}]", policy.name, direction.as_str().to_lowercase());
                        if let Some(why) = &rule.invalid {
                            if first {
                                compiler.warn(
                                    &mut ruleset.warnings,
                                    format!("{name}: {why} (it fails closed)"),
                                );
                            }
                            // Fails closed: an Accept matches nothing, a Deny or Pass denies all.
                            if let Some(action) = rule.fails_closed_to() {
                                tier_rules.push(TierRule {
                                    name,
                                    action,
                                    matches: vec![Allow {
                                        peers: Peers::Any,
                                        ports: None,
                                    }],
                                });
                            }
                            continue;
                        }
                        let chosen: Vec<Chosen> = rule
                            .peers()
                            .flat_map(|peer| compiler.cluster_peer(peer, &mut memo))
                            .collect();
                        let matches = compiler.allowances(
                            direction,
                            &chosen,
                            rule.ports(),
                            &mut ruleset.warnings,
                        );
                        tier_rules.push(TierRule {
                            name,
                            action: rule.action,
                            matches,
                        });
                    }
                    let side = governed.side(direction);
                    side.policies.push(format!("cnp/{}", policy.name));
                    match policy.tier {
                        Tier::Admin => side.admin.extend(tier_rules),
                        Tier::Baseline => side.baseline.extend(tier_rules),
                    }
                }
            }
        }
        if governed.ingress.is_some() || governed.egress.is_some() {
            ruleset.pods.push(governed);
        }
    }
    ruleset.warnings.sort();
    ruleset.warnings.dedup();
    ruleset
}

impl IsolatedPod {
    /// The side of `direction`, made when no policy governed it yet.
    fn side(&mut self, direction: Direction) -> &mut Side {
        match direction {
            Direction::Ingress => self.ingress.get_or_insert_with(Side::default),
            Direction::Egress => self.egress.get_or_insert_with(Side::default),
        }
    }
}

/// One policy applied to one pod.
struct Compiler<'a> {
    /// `NetworkPolicy ns/name` or `ClusterNetworkPolicy name`, for warnings.
    owner: String,
    /// A NetworkPolicy's namespace (where its bare podSelector peers choose); empty for a cluster
    /// policy, whose peers always say their namespaces.
    namespace: &'a str,
    cluster: &'a Cluster,
    subject: &'a PodEntry,
}

/// Peers already chosen in this compilation, by the address of their parsed [`Peer`] (the parsed
/// policies live for the whole compilation, so addresses are stable): a policy's peers are the same
/// for every pod it selects, so each is chosen once, not once per isolated pod.
type Memo<'a> = HashMap<usize, Option<Chosen<'a>>>;

/// A peer before ports are applied: pods (for named ports on egress) or a block.
#[derive(Clone)]
enum Chosen<'a> {
    Any,
    /// The pods, and their addresses as peers (`None`: none has one).
    Pods(Vec<&'a PodEntry>, Option<Peers>),
    Block(&'a netpol::Block),
}

impl<'a> Compiler<'a> {
    /// What a NetworkPolicy rule's peers choose (`Any` for a rule without peers).
    fn chosen(&self, rule: &'a Rule<'a>, memo: &mut Memo<'a>) -> Vec<Chosen<'a>> {
        match &rule.peers {
            None => vec![Chosen::Any],
            Some(peers) => peers
                .iter()
                .filter_map(|p| {
                    let key = std::ptr::from_ref(p) as usize;
                    memo.entry(key).or_insert_with(|| self.peer(p)).clone()
                })
                .collect(),
        }
    }

    /// What a ClusterNetworkPolicy rule's peer chooses: pods by selectors, or blocks.
    fn cluster_peer(&self, peer: PeerRef<'a>, memo: &mut Memo<'a>) -> Vec<Chosen<'a>> {
        match peer {
            PeerRef::Networks(blocks) => blocks.iter().map(Chosen::Block).collect(),
            PeerRef::Pods { namespace, pod } => {
                let key = std::ptr::from_ref(namespace) as usize;
                let chosen = memo
                    .entry(key)
                    .or_insert_with(|| {
                        let pods: Vec<&PodEntry> = self
                            .cluster
                            .namespaces
                            .iter()
                            .filter(|(_, labels)| selector::matches(namespace, labels))
                            .flat_map(|(ns, _)| self.cluster.pods_in(ns))
                            .filter(|p| {
                                !p.host_network
                                    && !p.ips.is_empty()
                                    && pod.is_none_or(|s| selector::matches(s, &p.labels))
                            })
                            .collect();
                        Some(Chosen::of_pods(pods))
                    })
                    .clone();
                chosen.into_iter().collect()
            }
        }
    }

    /// What `chosen` peers on `ports` (`None`: every port) match, as allowances.
    fn allowances(
        &self,
        direction: Direction,
        chosen: &[Chosen<'a>],
        ports: Option<&[Port<'_>]>,
        warnings: &mut Vec<String>,
    ) -> Vec<Allow> {
        let mut out = Vec::new();
        let Some(ports) = ports else {
            for peer in chosen {
                if let Some(peers) = peers_of(peer) {
                    out.push(Allow { peers, ports: None });
                }
            }
            return out;
        };
        // Numbered ports apply to every peer alike; named ones resolve per pod.
        let mut numbered = Vec::new();
        let mut named = Vec::new();
        for port in ports {
            let protocol = match port {
                // Already reported with the policy's other invalid parts.
                Port::Invalid(_) => continue,
                Port::Any(protocol) | Port::Range(protocol, ..) | Port::Named(protocol, _) => {
                    *protocol
                }
            };
            if protocol == Protocol::SCTP {
                // A ClusterNetworkPolicy's named port stands for every protocol, SCTP included:
                // only an SCTP port someone wrote is worth a warning.
                if !matches!(port, Port::Named(..)) {
                    self.warn(
                        warnings,
                        "SCTP ports are not enforced (they match nothing)".into(),
                    );
                }
                continue;
            }
            match port {
                Port::Any(_) => numbered.push(PortRange {
                    protocol,
                    first: 0,
                    last: u16::MAX,
                }),
                Port::Range(_, first, last) => numbered.push(PortRange {
                    protocol,
                    first: *first,
                    last: *last,
                }),
                Port::Named(_, name) => named.push((name.as_ref(), protocol)),
                Port::Invalid(_) => {}
            }
        }
        for peer in chosen {
            if !numbered.is_empty()
                && let Some(peers) = peers_of(peer)
            {
                out.push(Allow {
                    peers,
                    ports: Some(numbered.clone()),
                });
            }
            for &(name, protocol) in &named {
                match direction {
                    // The isolated pod's own port of that name.
                    Direction::Ingress => {
                        if let (Some(number), Some(peers)) =
                            (self.subject.resolve(name, protocol), peers_of(peer))
                        {
                            out.push(Allow {
                                peers,
                                ports: Some(vec![PortRange {
                                    protocol,
                                    first: number,
                                    last: number,
                                }]),
                            });
                        }
                    }
                    // Each destination pod's port of that name: one allowance per number.
                    Direction::Egress => {
                        let mut by_number: BTreeMap<u16, BTreeSet<IpAddr>> = BTreeMap::new();
                        for pod in self.destinations(peer) {
                            if let Some(number) = pod.resolve(name, protocol) {
                                by_number.entry(number).or_default().extend(
                                    pod.ips.iter().copied().filter(|ip| match peer {
                                        Chosen::Block(block) => block.contains(ip),
                                        _ => true,
                                    }),
                                );
                            }
                        }
                        for (number, ips) in by_number {
                            if !ips.is_empty() {
                                out.push(Allow {
                                    peers: Peers::Addresses(Arc::new(ips)),
                                    ports: Some(vec![PortRange {
                                        protocol,
                                        first: number,
                                        last: number,
                                    }]),
                                });
                            }
                        }
                    }
                }
            }
        }
        out
    }

    /// An `egressNames` entry as ports per protocol; `None` (with a warning) when a port cannot be
    /// enforced, so the entry allows nothing rather than more.
    fn name_allowance(&self, rule: &NameRule, warnings: &mut Vec<String>) -> Option<NameAllowance> {
        let mut ports = Vec::new();
        for port in &rule.ports {
            let range = match Port::parse(port) {
                Port::Any(protocol) if protocol != Protocol::SCTP => Some((protocol, 0, u16::MAX)),
                // Port 0 is no port a name's address is reached on.
                Port::Range(protocol, first, last) if protocol != Protocol::SCTP && first > 0 => {
                    Some((protocol, first, last))
                }
                _ => None,
            };
            let Some((protocol, first, last)) = range else {
                self.warn(
                    warnings,
                    format!(
                        "egressNames port {port:?} cannot be enforced (the entry allows nothing)"
                    ),
                );
                return None;
            };
            ports.push(PortRange {
                protocol,
                first,
                last,
            });
        }
        if ports.is_empty() {
            ports = [Protocol::TCP, Protocol::UDP]
                .into_iter()
                .map(|protocol| PortRange {
                    protocol,
                    first: 0,
                    last: u16::MAX,
                })
                .collect();
        }
        Some(NameAllowance {
            names: rule.names.clone(),
            ports,
        })
    }

    /// The pods a peer may reach by a named port on egress: its pods, every pod for "any", and
    /// the pods inside a block.
    fn destinations(&self, peer: &Chosen<'a>) -> Vec<&'a PodEntry> {
        match peer {
            Chosen::Pods(pods, _) => pods.clone(),
            Chosen::Any | Chosen::Block(_) => self
                .cluster
                .pods
                .values()
                .filter(|p| !p.host_network && !p.ips.is_empty())
                .collect(),
        }
    }

    /// What a peer chooses; `None` when it allows nothing (invalid, reported with the policy).
    fn peer(&self, peer: &'a Peer<'a>) -> Option<Chosen<'a>> {
        match peer {
            Peer::Invalid(_) => None,
            Peer::Block(block) => Some(Chosen::Block(block)),
            Peer::Selectors { .. } => {
                let policy_namespace = self.namespace;
                // Only the namespaces the peer looks into are read (each is one range of the pods).
                let pods: Vec<&PodEntry> = self
                    .cluster
                    .namespaces
                    .iter()
                    .filter(|(ns, labels)| peer.selects_namespace(policy_namespace, ns, labels))
                    .flat_map(|(ns, _)| self.cluster.pods_in(ns))
                    .filter(|pod| {
                        !pod.host_network && !pod.ips.is_empty() && peer.selects_labels(&pod.labels)
                    })
                    .collect();
                Some(Chosen::of_pods(pods))
            }
        }
    }

    fn warn(&self, warnings: &mut Vec<String>, what: String) {
        warnings.push(format!("{}: {what}", self.owner));
    }
}

impl<'a> Chosen<'a> {
    /// Pods, with their addresses as peers.
    fn of_pods(pods: Vec<&'a PodEntry>) -> Self {
        let ips: BTreeSet<IpAddr> = pods.iter().flat_map(|p| p.ips.iter().copied()).collect();
        let peers = (!ips.is_empty()).then(|| Peers::Addresses(Arc::new(ips)));
        Chosen::Pods(pods, peers)
    }
}

/// The addresses of a chosen peer; `None` when it has none (a selector matching no running pod).
fn peers_of(peer: &Chosen) -> Option<Peers> {
    match peer {
        Chosen::Any => Some(Peers::Any),
        Chosen::Block(block) => Some(Peers::Block {
            cidr: block.cidr,
            except: block.except.clone(),
        }),
        Chosen::Pods(_, peers) => peers.clone(),
    }
}

#[cfg(test)]
mod tests;
