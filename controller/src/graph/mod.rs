//! The learned workload graph as Graphviz DOT, for `network-enforcer-controller graph`, and as the
//! plain model ([`model()`]) the web view lays out: one model, below both `tools` and `ui`.
//!
//! Input: WorkloadNetworkPolicyProposals (what learning saw) and WorkloadNetworkPolicies (what is
//! in force, with their violations). Output:
//!
//! - a node per workload (`Deployment demo/http-client`), grouped in a cluster per namespace, with
//!   what governs it: a proposal per direction (dashed, "learning") or a policy and its mode
//!   (orange "monitor", blue bold "protect");
//! - a node per peer that is no known workload: a selector (`kube-system {k8s-app=kube-dns}`), a
//!   CIDR, a mesh identity (`cluster.local/ns/x/sa/y`), an address of a violation;
//! - a node per DNS name of an outside service: each name (or wildcard) of a `spec.egressNames`
//!   entry, with an edge from its workload labelled with the entry's ports, and each name a
//!   violation's destination was resolved from (`dest.dnsName`), drawn as the name with the
//!   violations' addresses under it: people know `api.example.test`, not its rotating addresses;
//! - an edge per allowed connection, labelled with its ports (`TCP 18080`), from both directions'
//!   rules merged (the client's egress rule and the server's ingress rule are one edge);
//! - an edge in red per active violation (`UDP 18081 monitor`);
//! - under an edge's ports, the usage of each policy rule that allows it when the policy's status
//!   records `ruleUsage` (`web ingress[0]: last matched 2h ago, 3 peers`, `... never matched`).
//!
//! Pure: objects in, text out; the CLI reads the objects and runs `dot`.

use crate::policy::rule_usage::{self, RuleRef};
use k8s_openapi::api::networking::v1::{NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use network_enforcer_api::RuleUsage;
use network_enforcer_api::keys::NAMESPACE_NAME_LABEL;
use network_enforcer_api::{
    Direction, IstioPolicy, NameRule, PolicyMode, Protocol, WorkloadNetworkPolicy,
    WorkloadNetworkPolicyProposal, WorkloadRef,
};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// The objects a graph is drawn from.
#[derive(Clone, Debug, Default)]
pub struct GraphInput {
    pub proposals: Vec<WorkloadNetworkPolicyProposal>,
    pub policies: Vec<WorkloadNetworkPolicy>,
}

/// A node of the graph.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Node {
    /// A workload: namespace, kind, name.
    Workload(String, String, String),
    /// Pods selected by labels in a namespace (`None`: any namespace matching a selector).
    Selector(String, String),
    /// An IP block or address.
    External(String),
    /// A mesh identity.
    Identity(String),
    /// A DNS name (or wildcard) of an outside service.
    Name(String),
}

impl Node {
    fn id(&self) -> String {
        match self {
            Node::Workload(ns, kind, name) => format!("w:{ns}/{kind}/{name}"),
            Node::Selector(ns, sel) => format!("s:{ns}/{sel}"),
            Node::External(a) => format!("x:{a}"),
            Node::Identity(i) => format!("i:{i}"),
            Node::Name(n) => format!("n:{n}"),
        }
    }

    /// The node's [`ModelNode::kind`], namespace, workload kind and name.
    fn parts(&self) -> (&'static str, String, String, String) {
        match self {
            Node::Workload(ns, kind, name) => ("workload", ns.clone(), kind.clone(), name.clone()),
            Node::Selector(ns, sel) => ("selector", ns.clone(), String::new(), sel.clone()),
            Node::External(a) => ("external", String::new(), String::new(), a.clone()),
            Node::Identity(i) => ("identity", String::new(), String::new(), i.clone()),
            Node::Name(n) => ("name", String::new(), String::new(), n.clone()),
        }
    }
}

/// What governs one workload, per direction.
#[derive(Clone, Debug, Default)]
struct Governance {
    /// direction → (policy name, mode); `None` mode for a proposal.
    by_direction: BTreeMap<Direction, (String, Option<PolicyMode>)>,
}

/// A workload that rules target, with the selector that identifies its pods.
struct Target {
    node: Node,
    namespace: String,
    selector: Option<BTreeMap<String, String>>,
}

#[derive(Default)]
struct Builder {
    nodes: BTreeSet<Node>,
    governance: BTreeMap<Node, Governance>,
    /// (from, to) → port labels.
    edges: BTreeMap<(Node, Node), BTreeSet<String>>,
    /// (from, to) → violation labels.
    violations: BTreeMap<(Node, Node), BTreeSet<String>>,
    /// (from, to) → usage of the policy rules that allow it, from `status.ruleUsage`
    /// (`web ingress[0]: last matched 2h ago, 3 peers`).
    usage: BTreeMap<(Node, Node), BTreeSet<String>>,
    /// (from, to) → (policy, mode) of the policies whose rules allow it (none: learned only).
    allowed_by: BTreeMap<(Node, Node), BTreeSet<(String, &'static str)>>,
    /// DNS name → the addresses violations to it were resolved to.
    addresses: BTreeMap<String, BTreeSet<String>>,
}

/// At most this many addresses are written under a name in the DOT graph (the web view lists all).
const MAX_ADDRESSES_SHOWN: usize = 3;

/// A rule's peers and ports.
pub(crate) type Rule<'a> = (
    Option<&'a Vec<NetworkPolicyPeer>>,
    Option<&'a Vec<NetworkPolicyPort>>,
);

/// The peers and ports of each rule of `spec` in `direction` (`to` for egress, `from` for ingress).
pub(crate) fn rules_in(spec: &NetworkPolicySpec, direction: Direction) -> Vec<Rule<'_>> {
    match direction {
        Direction::Egress => spec
            .egress
            .iter()
            .flatten()
            .map(|r| (r.to.as_ref(), r.ports.as_ref()))
            .collect(),
        Direction::Ingress => spec
            .ingress
            .iter()
            .flatten()
            .map(|r| (r.from.as_ref(), r.ports.as_ref()))
            .collect(),
    }
}

/// One payload to draw: a policy or a proposal.
struct Payload<'a> {
    namespace: String,
    name: String,
    mode: Option<PolicyMode>,
    kind: &'a str,
    target: &'a str,
    direction: Direction,
    kubernetes: Option<&'a NetworkPolicySpec>,
    istio: Option<&'a IstioPolicy>,
    /// `spec.egressNames`.
    egress_names: &'a [NameRule],
    /// A policy's rules and the usage its status records; `None` when it records none.
    usage: Option<(Vec<RuleRef>, &'a [RuleUsage])>,
}

impl Payload<'_> {
    /// `<policy> <rule>: <usage>` for rule `index`, when the status records usage.
    fn usage_text(&self, index: usize, now: &Time) -> Option<String> {
        let (rules, usage) = self.usage.as_ref()?;
        let rule = rules.get(index)?;
        Some(format!(
            "{} {}: {}",
            self.name,
            rule.name(),
            rule_usage::describe(rule, usage, now)
        ))
    }
}

/// Renders the graph of `input`, restricted to objects of `namespace` when given (their peers in
/// other namespaces still appear).
/// Rules whose policy's status records `ruleUsage` show it under their edge's ports.
pub fn render_dot(input: &GraphInput, namespace: Option<&str>) -> String {
    render_dot_at(input, namespace, &Time(k8s_openapi::jiff::Timestamp::now()))
}

/// [`render_dot`], with "how long ago" measured from `now`.
pub fn render_dot_at(input: &GraphInput, namespace: Option<&str>, now: &Time) -> String {
    build(input, namespace, now).dot()
}

fn build(input: &GraphInput, namespace: Option<&str>, now: &Time) -> Builder {
    let mut payloads = Vec::new();
    for p in &input.policies {
        payloads.push(Payload {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            mode: Some(p.spec.mode),
            kind: p.spec.target_ref.kind.as_str(),
            target: &p.spec.target_ref.name,
            direction: p.spec.direction,
            kubernetes: p.spec.kubernetes.as_ref(),
            istio: p.spec.istio.as_ref(),
            egress_names: &p.spec.egress_names,
            usage: p
                .status
                .as_ref()
                .filter(|s| !s.rule_usage.is_empty())
                .map(|s| (rule_usage::rules_of(&p.spec), s.rule_usage.as_slice())),
        });
    }
    for p in &input.proposals {
        payloads.push(Payload {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone().unwrap_or_default(),
            mode: None,
            kind: p.spec.target_ref.kind.as_str(),
            target: &p.spec.target_ref.name,
            direction: p.spec.direction,
            kubernetes: p.spec.kubernetes.as_ref(),
            istio: p.spec.istio.as_ref(),
            egress_names: &p.spec.egress_names,
            usage: None,
        });
    }
    payloads.retain(|p| namespace.is_none_or(|ns| p.namespace == ns));
    // A policy and the proposal it was promoted from describe the same thing: the policy wins.
    let governed: BTreeSet<(String, String, String, Direction)> = payloads
        .iter()
        .filter(|p| p.mode.is_some())
        .map(|p| {
            (
                p.namespace.clone(),
                p.kind.to_string(),
                p.target.to_string(),
                p.direction,
            )
        })
        .collect();
    payloads.retain(|p| {
        p.mode.is_some()
            || !governed.contains(&(
                p.namespace.clone(),
                p.kind.to_string(),
                p.target.to_string(),
                p.direction,
            ))
    });

    // Targets first, so that peers given by selector resolve to the workload they select.
    let targets: Vec<Target> = payloads
        .iter()
        .map(|p| Target {
            node: Node::Workload(
                p.namespace.clone(),
                p.kind.to_string(),
                p.target.to_string(),
            ),
            namespace: p.namespace.clone(),
            selector: p
                .kubernetes
                .and_then(|k| k.pod_selector.as_ref())
                .or(p.istio.map(|i| &i.selector))
                .and_then(plain_labels),
        })
        .collect();

    let mut b = Builder::default();
    for (payload, target) in payloads.iter().zip(&targets) {
        b.nodes.insert(target.node.clone());
        b.governance
            .entry(target.node.clone())
            .or_default()
            .by_direction
            .insert(payload.direction, (payload.name.clone(), payload.mode));
        if let Some(spec) = payload.kubernetes {
            let rules = rules_in(spec, payload.direction);
            for (index, (peers, ports)) in rules.into_iter().enumerate() {
                let usage = payload.usage_text(index, now);
                let ports = port_labels(ports);
                let peers: Vec<Node> = match peers {
                    None => vec![Node::External("any".into())],
                    Some(peers) if peers.is_empty() => vec![Node::External("any".into())],
                    Some(peers) => peers
                        .iter()
                        .map(|peer| peer_node(peer, &target.namespace, &targets))
                        .collect(),
                };
                for peer in peers {
                    let key = b.add_edge(&target.node, peer, payload.direction, &ports);
                    b.note_usage(&key, usage.as_ref());
                    b.allow(key, payload);
                }
            }
        }
        // Usage numbers `egressNames` entries after the direction's own rules (`rules_of`).
        let own = payload
            .kubernetes
            .map_or(0, |spec| rules_in(spec, payload.direction).len());
        for (index, entry) in payload.egress_names.iter().enumerate() {
            let usage = payload.usage_text(own + index, now);
            let ports = port_labels(Some(&entry.ports));
            for name in &entry.names {
                let key = b.add_edge(
                    &target.node,
                    Node::Name(name.clone()),
                    Direction::Egress,
                    &ports,
                );
                b.note_usage(&key, usage.as_ref());
                b.allow(key, payload);
            }
        }
        if let Some(istio) = payload.istio {
            for (index, rule) in istio.rules.iter().enumerate() {
                let usage = payload.usage_text(index, now);
                let ports: BTreeSet<String> = if rule.to.is_empty() {
                    BTreeSet::from(["any port".to_string()])
                } else {
                    rule.to
                        .iter()
                        .flat_map(|t| &t.operation.ports)
                        .map(|p| format!("TCP {p}"))
                        .collect()
                };
                let principals: Vec<&String> = rule
                    .from
                    .iter()
                    .flat_map(|f| &f.source.principals)
                    .collect();
                let peers: Vec<Node> = if principals.is_empty() {
                    vec![Node::Identity("*".into())]
                } else {
                    principals
                        .into_iter()
                        .map(|p| Node::Identity(p.clone()))
                        .collect()
                };
                for peer in peers {
                    let key = b.add_edge(&target.node, peer, Direction::Ingress, &ports);
                    b.note_usage(&key, usage.as_ref());
                    b.allow(key, payload);
                }
            }
        }
    }
    for policy in &input.policies {
        if namespace.is_some_and(|ns| policy.metadata.namespace.as_deref() != Some(ns)) {
            continue;
        }
        for v in policy.status.iter().flat_map(|s| &s.violations) {
            let from = workload_node(&v.source);
            let to = workload_node(&v.dest);
            if let Node::Name(name) = &to {
                b.addresses
                    .entry(name.clone())
                    .or_default()
                    .insert(v.dest.address.clone());
            }
            let port = v.dst_port.map(|p| format!(" {p}")).unwrap_or_default();
            let label = format!("{}{port} {}", v.protocol.as_str(), v.action.as_str());
            b.nodes.insert(from.clone());
            b.nodes.insert(to.clone());
            b.violations.entry((from, to)).or_default().insert(label);
        }
    }
    b
}

impl Builder {
    fn add_edge(
        &mut self,
        target: &Node,
        peer: Node,
        direction: Direction,
        ports: &BTreeSet<String>,
    ) -> (Node, Node) {
        self.nodes.insert(peer.clone());
        let key = match direction {
            Direction::Egress => (target.clone(), peer),
            Direction::Ingress => (peer, target.clone()),
        };
        self.edges
            .entry(key.clone())
            .or_default()
            .extend(ports.iter().cloned());
        key
    }

    /// Notes the usage of a rule that allows edge `key`.
    fn note_usage(&mut self, key: &(Node, Node), usage: Option<&String>) {
        if let Some(usage) = usage {
            self.usage
                .entry(key.clone())
                .or_default()
                .insert(usage.clone());
        }
    }

    /// Records that `payload`'s rules allow edge `key`, when it is a policy (not a proposal).
    fn allow(&mut self, key: (Node, Node), payload: &Payload<'_>) {
        if let Some(mode) = payload.mode {
            self.allowed_by
                .entry(key)
                .or_default()
                .insert((payload.name.clone(), mode.as_str()));
        }
    }

    fn dot(&self) -> String {
        let mut out = String::new();
        out.push_str("digraph workloads {\n");
        out.push_str("  rankdir=LR;\n");
        out.push_str("  node [shape=box, style=rounded, fontname=\"Helvetica\"];\n");
        out.push_str("  edge [fontname=\"Helvetica\", fontsize=10];\n");
        // Workloads grouped by namespace.
        let mut by_namespace: BTreeMap<&str, Vec<&Node>> = BTreeMap::new();
        let mut others = Vec::new();
        for node in &self.nodes {
            match node {
                Node::Workload(ns, _, _) | Node::Selector(ns, _) if !ns.is_empty() => {
                    by_namespace.entry(ns).or_default().push(node)
                }
                _ => others.push(node),
            }
        }
        for (i, (ns, nodes)) in by_namespace.iter().enumerate() {
            let _ = writeln!(out, "  subgraph cluster_{i} {{");
            let _ = writeln!(out, "    label={};", quote(&format!("namespace {ns}")));
            out.push_str("    style=dashed; color=gray50;\n");
            for node in nodes {
                let _ = writeln!(out, "    {}", self.node_line(node));
            }
            out.push_str("  }\n");
        }
        for node in others {
            let _ = writeln!(out, "  {}", self.node_line(node));
        }
        for ((from, to), ports) in &self.edges {
            let usage = self.usage.get(&(from.clone(), to.clone()));
            let label = ports
                .iter()
                .chain(usage.into_iter().flatten())
                .map(|p| escape(p))
                .collect::<Vec<_>>()
                .join("\\n");
            let _ = writeln!(
                out,
                "  {} -> {} [label={}];",
                quote(&from.id()),
                quote(&to.id()),
                quote_label(&label)
            );
        }
        for ((from, to), labels) in &self.violations {
            let label = labels
                .iter()
                .map(|l| escape(l))
                .collect::<Vec<_>>()
                .join("\\n");
            let _ = writeln!(
                out,
                "  {} -> {} [label={}, color=red, fontcolor=red, penwidth=2, style=bold];",
                quote(&from.id()),
                quote(&to.id()),
                quote_label(&format!("violation: {label}"))
            );
        }
        out.push_str("}\n");
        out
    }

    /// The addresses violations to `name` went to, sorted.
    fn addresses_of(&self, name: &str) -> Vec<String> {
        self.addresses
            .get(name)
            .map(|a| a.iter().filter(|a| !a.is_empty()).cloned().collect())
            .unwrap_or_default()
    }

    fn node_line(&self, node: &Node) -> String {
        let (label, attrs) = match node {
            Node::Workload(_, kind, name) => {
                // The kind of a violation's workload is text from a status, like the names.
                let mut label = format!("{}\\n{}", escape(kind), escape(name));
                let mut color = "black";
                let mut style = "rounded";
                if let Some(g) = self.governance.get(node) {
                    for (direction, (policy, mode)) in &g.by_direction {
                        let state = match mode {
                            None => "learning",
                            Some(m) => m.as_str(),
                        };
                        let _ = write!(
                            label,
                            "\\n{}: {} ({})",
                            direction.as_str().to_lowercase(),
                            state,
                            escape(policy)
                        );
                    }
                    let modes: Vec<Option<PolicyMode>> =
                        g.by_direction.values().map(|(_, m)| *m).collect();
                    if modes.contains(&Some(PolicyMode::Protect)) {
                        color = "blue";
                        style = "rounded,bold";
                    } else if modes.contains(&Some(PolicyMode::Monitor)) {
                        color = "orange";
                    } else if !modes.is_empty() {
                        style = "rounded,dashed";
                    }
                }
                (label, format!("color={color}, style=\"{style}\""))
            }
            Node::Selector(_, selector) => (
                format!("pods {}", escape(selector)),
                "shape=box, style=\"rounded,dotted\"".to_string(),
            ),
            Node::External(address) => (escape(address), "shape=ellipse".to_string()),
            Node::Identity(identity) => (
                format!("identity\\n{}", escape(identity)),
                "shape=ellipse, style=dotted".to_string(),
            ),
            Node::Name(name) => {
                let mut label = escape(name);
                let addresses = self.addresses_of(name);
                if !addresses.is_empty() {
                    let mut shown: Vec<&str> = addresses
                        .iter()
                        .take(MAX_ADDRESSES_SHOWN)
                        .map(String::as_str)
                        .collect();
                    let more = format!("+{} more", addresses.len().saturating_sub(shown.len()));
                    if addresses.len() > shown.len() {
                        shown.push(&more);
                    }
                    let _ = write!(label, "\\n({})", escape(&shown.join(", ")));
                }
                (label, "shape=ellipse, style=bold".to_string())
            }
        };
        format!("{} [label=\"{label}\", {attrs}];", quote(&node.id()))
    }
}

/// A DOT string literal.
fn quote(s: &str) -> String {
    format!("\"{}\"", escape(s))
}

/// A label whose parts are already escaped and joined by DOT `\n` line breaks.
fn quote_label(s: &str) -> String {
    format!("\"{s}\"")
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// `matchLabels` of a selector without expressions, else `None`.
fn plain_labels(selector: &LabelSelector) -> Option<BTreeMap<String, String>> {
    if selector
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        return None;
    }
    selector.match_labels.clone().filter(|l| !l.is_empty())
}

pub(crate) fn selector_text(selector: &LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(format!("{} {} ({values})", e.key, e.operator));
    }
    if parts.is_empty() {
        "all".into()
    } else {
        format!("{{{}}}", parts.join(", "))
    }
}

/// The node a rule's peer stands for: the target workload its selectors pick, else the selector.
fn peer_node(peer: &NetworkPolicyPeer, own_namespace: &str, targets: &[Target]) -> Node {
    if let Some(block) = &peer.ip_block {
        let except = block.except.clone().unwrap_or_default();
        return Node::External(if except.is_empty() {
            block.cidr.clone()
        } else {
            format!("{} except {}", block.cidr, except.join(", "))
        });
    }
    // The namespace: the policy's own for a bare podSelector, the metadata.name label's value when
    // the namespaceSelector names one, else a selector over namespaces.
    let namespace = match &peer.namespace_selector {
        None => Some(own_namespace.to_string()),
        Some(s) => match plain_labels(s) {
            Some(labels) if labels.len() == 1 => labels.get(NAMESPACE_NAME_LABEL).cloned(),
            _ => None,
        },
    };
    let labels = peer.pod_selector.as_ref().and_then(plain_labels);
    if let (Some(ns), Some(labels)) = (&namespace, &labels) {
        if let Some(t) = targets
            .iter()
            .find(|t| &t.namespace == ns && t.selector.as_ref() == Some(labels))
        {
            return t.node.clone();
        }
    }
    let pods = peer
        .pod_selector
        .as_ref()
        .map(selector_text)
        .unwrap_or_else(|| "all".into());
    match namespace {
        Some(ns) => Node::Selector(ns, pods),
        None => Node::Selector(
            String::new(),
            format!(
                "namespaces {} / {pods}",
                peer.namespace_selector
                    .as_ref()
                    .map(selector_text)
                    .unwrap_or_default()
            ),
        ),
    }
}

pub(crate) fn port_labels(ports: Option<&Vec<NetworkPolicyPort>>) -> BTreeSet<String> {
    let Some(ports) = ports.filter(|p| !p.is_empty()) else {
        return BTreeSet::from(["any port".to_string()]);
    };
    ports
        .iter()
        .map(|p| {
            let protocol = p.protocol.as_deref().unwrap_or(Protocol::TCP.as_str());
            match (&p.port, p.end_port) {
                (None, _) => format!("{protocol} any"),
                (Some(IntOrString::Int(port)), Some(end)) => format!("{protocol} {port}-{end}"),
                (Some(IntOrString::Int(port)), None) => format!("{protocol} {port}"),
                (Some(IntOrString::String(name)), _) => format!("{protocol} {name}"),
            }
        })
        .collect()
}

/// The id of the node one side of a violation record or of an observed flow is drawn as
/// ([`ModelNode::id`]).
pub fn node_id(w: &WorkloadRef) -> String {
    workload_node(w).id()
}

/// The node of one side of a violation record.
fn workload_node(w: &WorkloadRef) -> Node {
    if !w.owner_name.is_empty() && !w.owner_kind.is_empty() {
        Node::Workload(
            w.namespace.clone(),
            w.owner_kind.clone(),
            w.owner_name.clone(),
        )
    } else if !w.dns_name.is_empty() {
        // An outside address the pod resolved from a name: the name is what a policy lists.
        Node::Name(w.dns_name.clone())
    } else if !w.address.is_empty() {
        Node::External(w.address.clone())
    } else if !w.identity.is_empty() {
        Node::Identity(w.identity.clone())
    } else {
        Node::External("unknown".into())
    }
}

/// One node of [`GraphModel`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ModelNode {
    /// Stable id, also the key of [`ModelEdge::from`] / [`ModelEdge::to`].
    pub id: String,
    /// `workload`, `selector` (pods no known workload stands for), `external`, `identity` or
    /// `name` (a DNS name of an outside service).
    pub kind: &'static str,
    /// Empty for external peers and selectors over namespaces.
    pub namespace: String,
    /// Deployment, StatefulSet, ... for workloads; empty otherwise.
    pub workload_kind: String,
    /// The workload's name, the selector, the address, the identity or the DNS name.
    pub name: String,
    /// For a DNS name: the addresses its violations went to (the pods resolved it to), sorted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// What governs a workload per direction: (direction, policy or proposal, mode or `learning`).
    pub governance: Vec<(Direction, String, &'static str)>,
}

/// One edge of [`GraphModel`]: the rules of both directions merged, or the violations of one pair.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ModelEdge {
    pub from: String,
    pub to: String,
    /// Port labels (`TCP 18080`), or violation labels (`UDP 18081 monitor`).
    pub labels: Vec<String>,
    /// (policy, mode) of the policies whose rules allow it; empty when only proposals have it.
    pub allowed_by: Vec<(String, &'static str)>,
}

/// The graph [`render_dot`] draws, as data (the web view lays it out itself).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GraphModel {
    pub nodes: Vec<ModelNode>,
    pub edges: Vec<ModelEdge>,
    pub violations: Vec<ModelEdge>,
}

/// The nodes and edges of `input` that [`render_dot`] draws (same namespace rule).
pub fn model(input: &GraphInput, namespace: Option<&str>) -> GraphModel {
    let b = build(input, namespace, &Time(k8s_openapi::jiff::Timestamp::now()));
    let nodes = b
        .nodes
        .iter()
        .map(|node| {
            let (kind, namespace, workload_kind, name) = node.parts();
            let addresses = match node {
                Node::Name(n) => b.addresses_of(n),
                _ => Vec::new(),
            };
            let governance = b
                .governance
                .get(node)
                .map(|g| {
                    g.by_direction
                        .iter()
                        .map(|(d, (name, mode))| {
                            (
                                *d,
                                name.clone(),
                                mode.map_or("learning", PolicyMode::as_str),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            ModelNode {
                id: node.id(),
                kind,
                namespace,
                workload_kind,
                name,
                addresses,
                governance,
            }
        })
        .collect();
    let edge = |(from, to): &(Node, Node), labels: &BTreeSet<String>| ModelEdge {
        from: from.id(),
        to: to.id(),
        labels: labels.iter().cloned().collect(),
        allowed_by: b
            .allowed_by
            .get(&(from.clone(), to.clone()))
            .map(|a| a.iter().cloned().collect())
            .unwrap_or_default(),
    };
    GraphModel {
        nodes,
        edges: b.edges.iter().map(|(k, l)| edge(k, l)).collect(),
        violations: b
            .violations
            .iter()
            .map(|(k, l)| ModelEdge {
                allowed_by: Vec::new(),
                ..edge(k, l)
            })
            .collect(),
    }
}

/// The node one end of an observed flow is drawn as when no rule or record names it: as a
/// violation's end is, without governance.
pub fn flow_node(w: &WorkloadRef) -> ModelNode {
    let node = workload_node(w);
    let (kind, namespace, workload_kind, name) = node.parts();
    ModelNode {
        id: node.id(),
        kind,
        namespace,
        workload_kind,
        name,
        addresses: Vec::new(),
        governance: Vec::new(),
    }
}

/// Why a `--from-file` document cannot be drawn.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {message}")]
pub struct GraphInputError {
    pub field: String,
    pub message: String,
}

/// Reads WorkloadNetworkPolicy and WorkloadNetworkPolicyProposal objects from YAML or JSON: a list
/// of objects, a `kind: List` with `items`, or several `---` documents. Other kinds are an error.
pub fn parse_objects(text: &str) -> Result<GraphInput, GraphInputError> {
    use serde::Deserialize as _;
    let mut objects = Vec::new();
    for (d, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_json::Value::deserialize(document).map_err(|e| GraphInputError {
            field: format!("document {}", d + 1),
            message: format!("invalid YAML: {e}"),
        })?;
        match value {
            serde_json::Value::Null => {}
            serde_json::Value::Array(items) => objects.extend(items),
            serde_json::Value::Object(ref map) if map.contains_key("items") => {
                objects.extend(map["items"].as_array().cloned().unwrap_or_default())
            }
            other => objects.push(other),
        }
    }
    let mut input = GraphInput::default();
    for (i, object) in objects.into_iter().enumerate() {
        let field = format!("items[{i}]");
        let kind = object
            .get("kind")
            .and_then(|k| k.as_str())
            .unwrap_or_default()
            .to_string();
        let error = |e: serde_path_to_error::Error<serde_json::Error>| GraphInputError {
            field: format!("{field}.{}", e.path()),
            message: e.into_inner().to_string(),
        };
        match kind.as_str() {
            "WorkloadNetworkPolicy" => input
                .policies
                .push(serde_path_to_error::deserialize(object).map_err(error)?),
            "WorkloadNetworkPolicyProposal" => input
                .proposals
                .push(serde_path_to_error::deserialize(object).map_err(error)?),
            other => {
                return Err(GraphInputError {
                    field: format!("{field}.kind"),
                    message: format!(
                        "{other:?}: expected WorkloadNetworkPolicy or WorkloadNetworkPolicyProposal"
                    ),
                });
            }
        }
    }
    Ok(input)
}

/// Lists the proposals and policies of `namespace` (all namespaces when `None`) from the cluster.
pub async fn load_from_cluster(
    client: &kube::Client,
    namespace: Option<&str>,
) -> Result<GraphInput, kube::Error> {
    use kube::api::{Api, ListParams};
    let (policies, proposals): (
        Api<WorkloadNetworkPolicy>,
        Api<WorkloadNetworkPolicyProposal>,
    ) = match namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    Ok(GraphInput {
        policies: policies.list(&ListParams::default()).await?.items,
        proposals: proposals.list(&ListParams::default()).await?.items,
    })
}

/// Why `dot` could not render SVG.
#[derive(Debug, thiserror::Error)]
pub enum SvgError {
    #[error(
        "Graphviz `dot` is not installed (Debian: apt-get install graphviz); use `-o dot` for the DOT source"
    )]
    DotMissing,
    #[error("running dot: {0}")]
    Io(#[from] std::io::Error),
    #[error("dot failed: {0}")]
    Failed(String),
}

/// Renders DOT source to SVG with Graphviz (`dot -Tsvg`), `dot` found on PATH.
pub fn to_svg(dot: &str) -> Result<Vec<u8>, SvgError> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = match Command::new("dot")
        .arg("-Tsvg")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(SvgError::DotMissing),
        Err(e) => return Err(SvgError::Io(e)),
    };
    // Written from a thread so a large graph cannot deadlock against dot's full stdout pipe.
    let mut stdin = child.stdin.take().expect("piped stdin");
    let source = dot.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(source.as_bytes()));
    let output = child.wait_with_output()?;
    writer.join().expect("writer thread")?;
    if !output.status.success() {
        return Err(SvgError::Failed(
            String::from_utf8_lossy(&output.stderr).trim().to_string(),
        ));
    }
    Ok(output.stdout)
}

#[cfg(test)]
mod tests;
