//! Merging edges into a proposal spec, within the limits on what one proposal may hold.

use super::*;

/// What one proposal may hold, whatever its workload does: a pod sending to every port or every
/// address must not grow its proposal (or its peers') past what the API server stores
/// (docs/design.md, "Bounds on what is learned").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Single external addresses per (protocol, port) (`--max-external-peers-per-port`).
    pub max_external_peers: usize,
    /// Port entries per rule (`--max-ports-per-rule`): past it, runs of consecutive ports are
    /// collapsed into ranges (`endPort`), and a port that still does not fit is refused.
    pub max_ports_per_rule: usize,
    /// Rules (one per peer) per proposal (`--max-rules-per-proposal`).
    pub max_rules: usize,
    /// Sibling names on one port before their parent is proposed as a wildcard
    /// (`--wildcard-min-names`; 0: never; see [`super::wildcards`]).
    pub wildcard_min_names: usize,
}

impl Limits {
    /// No bound at all (tests, and what the reference does).
    pub const NONE: Limits = Limits {
        max_external_peers: usize::MAX,
        max_ports_per_rule: usize::MAX,
        max_rules: usize::MAX,
        wildcard_min_names: 0,
    };
}

/// Default of [`Limits::max_ports_per_rule`].
pub const DEFAULT_MAX_PORTS_PER_RULE: usize = 64;
/// Default of [`Limits::max_rules`].
pub const DEFAULT_MAX_RULES: usize = 500;

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_external_peers: learner::DEFAULT_MAX_EXTERNAL_PEERS,
            max_ports_per_rule: DEFAULT_MAX_PORTS_PER_RULE,
            max_rules: DEFAULT_MAX_RULES,
            wildcard_min_names: super::wildcards::DEFAULT_WILDCARD_MIN_NAMES,
        }
    }
}

/// What merging edges into a spec did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Merged {
    /// Whether the spec changed.
    pub changed: bool,
    /// External peers not added, per (protocol, port), because that port already allows
    /// `max_external_peers` single addresses (the fan-out cap).
    pub capped: BTreeMap<(Protocol, u16), usize>,
    /// Ports not added because their rule held [`Limits::max_ports_per_rule`] entries even with
    /// consecutive ports collapsed into ranges.
    pub ports_capped: usize,
    /// Peers not added because the proposal held [`Limits::max_rules`] rules.
    pub rules_capped: usize,
    /// Wildcards that took over sibling names ([`super::wildcards::fold`]).
    pub wildcards: Vec<String>,
}

/// Merges `edge` into `spec`, as in the reference: the rule whose single peer equals the edge's peer
/// gets the port if missing; otherwise a rule is appended. Never removes a peer (a learned wildcard
/// may take sibling names' place, [`super::wildcards`]). Returns whether
/// `spec` changed.
pub fn apply(spec: &mut WorkloadNetworkPolicyProposalSpec, edge: &Edge) -> bool {
    merge(spec, [edge], &Limits::NONE).changed
}

/// Merges `edges` into `proposal` as [`merge()`] does, keeping the object's JSON within `max_bytes`: when
/// all of them would make it too big, the longest prefix (in arrival order) that fits. Returns what the
/// merge did and how many edges were left out for size.
pub fn merge_within(
    proposal: &mut WorkloadNetworkPolicyProposal,
    edges: &[Edge],
    limits: &Limits,
    max_bytes: usize,
) -> (Merged, usize) {
    let encoded_len =
        |p: &WorkloadNetworkPolicyProposal| serde_json::to_vec(p).map_or(usize::MAX, |v| v.len());
    let base = proposal.clone();
    let merged = merge(&mut proposal.spec, edges, limits);
    if !merged.changed || encoded_len(proposal) <= max_bytes {
        return (merged, 0);
    }
    let fits = |n: usize| {
        let mut trial = base.clone();
        merge(&mut trial.spec, &edges[..n], limits);
        encoded_len(&trial) <= max_bytes
    };
    // Merging never removes a peer, so more edges almost never weigh less (a learned wildcard can
    // replace sibling names, and then the prefix found fits but may not be the longest): bisect on the
    // prefix length.
    let (mut lo, mut hi) = (0, edges.len() - 1);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) { lo = mid } else { hi = mid - 1 }
    }
    *proposal = base;
    let merged = merge(&mut proposal.spec, &edges[..lo], limits);
    (merged, edges.len() - lo)
}

/// Whether `ports` already allow `port` over `protocol` (as a single port or within a range).
pub(super) fn covers(ports: &[NetworkPolicyPort], protocol: &str, port: i32) -> bool {
    ports.iter().any(|p| {
        p.protocol.as_deref().unwrap_or("TCP") == protocol
            && match p.port {
                Some(IntOrString::Int(n)) => {
                    n == port || p.end_port.is_some_and(|e| n <= port && port <= e)
                }
                _ => false,
            }
    })
}

/// Collapses numbered ports into the fewest entries: per protocol, overlapping or adjacent ports and
/// ranges become one range (`port`..`endPort`), a lone port stays a port. Named ports are kept as
/// they are, first. The set of allowed ports does not change.
pub(super) fn collapse(ports: &mut Vec<NetworkPolicyPort>) {
    let mut spans: BTreeMap<String, Vec<(i32, i32)>> = BTreeMap::new();
    let mut named = Vec::new();
    for p in ports.drain(..) {
        match p.port {
            Some(IntOrString::Int(n)) => spans
                .entry(p.protocol.clone().unwrap_or_else(|| "TCP".into()))
                .or_default()
                .push((n, p.end_port.unwrap_or(n).max(n))),
            _ => named.push(p),
        }
    }
    ports.extend(named);
    for (protocol, mut list) in spans {
        list.sort_unstable();
        let mut runs: Vec<(i32, i32)> = Vec::with_capacity(list.len());
        for (from, to) in list {
            match runs.last_mut() {
                Some(last) if from <= last.1.saturating_add(1) => last.1 = last.1.max(to),
                _ => runs.push((from, to)),
            }
        }
        ports.extend(runs.into_iter().map(|(from, to)| NetworkPolicyPort {
            protocol: Some(protocol.clone()),
            port: Some(IntOrString::Int(from)),
            end_port: (to > from).then_some(to),
        }));
    }
}

/// A hashable key for a rule's peers (their JSON: equal peers, equal keys).
fn peers_key<T: serde::Serialize>(peers: &T) -> String {
    serde_json::to_string(peers).unwrap_or_default()
}

/// Whether `peers` is one single-address ipBlock (a /32 or /128, no exceptions): what an external or
/// node peer becomes, and what the fan-out cap counts.
fn single_address(peers: Option<&Vec<NetworkPolicyPeer>>) -> bool {
    match peers.map(Vec::as_slice) {
        Some(
            [
                NetworkPolicyPeer {
                    ip_block: Some(block),
                    namespace_selector: None,
                    pod_selector: None,
                },
            ],
        ) => {
            block.except.as_ref().is_none_or(Vec::is_empty)
                && (block.cidr.ends_with("/32") || block.cidr.ends_with("/128"))
        }
        _ => false,
    }
}

/// Merges `edges` into `spec`, in order, as [`apply`] does for each, in time linear in rules + edges
/// (rules are found by a hash of their peers, not a scan per edge). Within `limits`: an external peer
/// is not added when its (protocol, port) already has `max_external_peers` single-address rules
/// (nodes count towards it too, they are single addresses as well), counted in [`Merged::capped`]; a
/// port or peer past the other limits is counted in [`Merged::ports_capped`] / [`Merged::rules_capped`].
pub fn merge<'e>(
    spec: &mut WorkloadNetworkPolicyProposalSpec,
    edges: impl IntoIterator<Item = &'e Edge>,
    limits: &Limits,
) -> Merged {
    let mut merged = Merged::default();
    if spec.kubernetes.is_some() && spec.direction == Direction::Egress {
        // Collected first: `edges` is iterated once, and most proposals learn no name.
        let edges: Vec<&Edge> = edges.into_iter().collect();
        merge_names(&mut spec.egress_names, &edges, limits, &mut merged);
        return merge_kubernetes(spec, edges, limits, merged);
    }
    merge_kubernetes(spec, edges, limits, merged)
}

/// [`merge()`] without the names: the kubernetes payload's rules, or the istio payload's.
fn merge_kubernetes<'e>(
    spec: &mut WorkloadNetworkPolicyProposalSpec,
    edges: impl IntoIterator<Item = &'e Edge>,
    limits: &Limits,
    mut merged: Merged,
) -> Merged {
    if let Some(np) = spec.kubernetes.as_mut() {
        // Egress and ingress rules are different types with the same shape: (peers, ports).
        match spec.direction {
            Direction::Egress => merge_rules(
                np.egress.get_or_insert_with(Vec::new),
                |r| (r.to.as_ref(), &mut r.ports),
                |to, ports| NetworkPolicyEgressRule {
                    to: Some(to),
                    ports: Some(ports),
                },
                edges,
                limits,
                &mut merged,
            ),
            Direction::Ingress => merge_rules(
                np.ingress.get_or_insert_with(Vec::new),
                |r| (r.from.as_ref(), &mut r.ports),
                |from, ports| NetworkPolicyIngressRule {
                    from: Some(from),
                    ports: Some(ports),
                },
                edges,
                limits,
                &mut merged,
            ),
        }
    } else if let Some(istio) = spec.istio.as_mut() {
        let mut by_principal: HashMap<String, usize> = istio
            .rules
            .iter()
            .enumerate()
            .filter_map(|(i, r)| match r.from.as_slice() {
                [IstioFrom { source }] if source.principals.len() == 1 => {
                    Some((source.principals[0].clone(), i))
                }
                _ => None,
            })
            .collect();
        for edge in edges {
            let Edge::Istio { source, port } = edge else {
                continue;
            };
            let principal = source.principal();
            let port = port.to_string();
            match by_principal.get(&principal) {
                Some(&i) => {
                    let rule = &mut istio.rules[i];
                    if rule.to.is_empty() {
                        rule.to.push(IstioTo::default());
                    }
                    let ports = &mut rule.to[0].operation.ports;
                    if ports.contains(&port) {
                        continue;
                    }
                    if ports.len() >= limits.max_ports_per_rule {
                        merged.ports_capped += 1;
                        continue;
                    }
                    ports.push(port);
                    merged.changed = true;
                }
                None if istio.rules.len() >= limits.max_rules => merged.rules_capped += 1,
                None => {
                    by_principal.insert(principal.clone(), istio.rules.len());
                    istio.rules.push(IstioRule {
                        from: vec![IstioFrom {
                            source: IstioSource {
                                principals: vec![principal],
                            },
                        }],
                        to: vec![IstioTo {
                            operation: IstioOperation { ports: vec![port] },
                        }],
                    });
                    merged.changed = true;
                }
            }
        }
    }
    merged
}

/// Adds each name edge's port to the entry of exactly that name, or appends an entry. Names share the
/// caps of addresses: at most `max_external_peers` names per (protocol, port) (a pod that reaches
/// thousands of names on one port is a crawler, not a dependency), `max_ports_per_rule` ports per
/// name, `max_rules` entries.
fn merge_names(rules: &mut Vec<NameRule>, edges: &[&Edge], limits: &Limits, merged: &mut Merged) {
    let mut by_name: HashMap<String, usize> = HashMap::with_capacity(rules.len());
    let mut per_port: HashMap<(String, i32), usize> = HashMap::new();
    for (i, rule) in rules.iter().enumerate() {
        if let [name] = rule.names.as_slice() {
            by_name.entry(name.clone()).or_insert(i);
        }
        for p in &rule.ports {
            if let Some(IntOrString::Int(n)) = p.port {
                let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
                *per_port.entry((proto, n)).or_default() += rule.names.len();
            }
        }
    }
    for edge in edges {
        let Edge::Name {
            name,
            protocol,
            port,
        } = edge
        else {
            continue;
        };
        let key = (protocol.as_str().to_string(), i32::from(*port));
        if wildcards::covered(rules, name, &key.0, key.1) {
            continue;
        }
        let np_port = NetworkPolicyPort {
            protocol: Some(key.0.clone()),
            port: Some(IntOrString::Int(key.1)),
            end_port: None,
        };
        let capped = per_port.get(&key).copied().unwrap_or(0) >= limits.max_external_peers;
        match by_name.get(&**name) {
            Some(&i) => {
                let ports = &mut rules[i].ports;
                if covers(ports, &key.0, key.1) {
                    continue;
                }
                if capped {
                    *merged.capped.entry((*protocol, *port)).or_default() += 1;
                    continue;
                }
                if ports.len() >= limits.max_ports_per_rule {
                    merged.ports_capped += 1;
                    continue;
                }
                ports.push(np_port);
            }
            None => {
                if capped {
                    *merged.capped.entry((*protocol, *port)).or_default() += 1;
                    continue;
                }
                // The API's bound too, whatever --max-rules says.
                if rules.len() >= limits.max_rules.min(network_enforcer_api::MAX_NAME_RULES) {
                    merged.rules_capped += 1;
                    continue;
                }
                by_name.insert(name.to_string(), rules.len());
                rules.push(NameRule {
                    names: vec![name.to_string()],
                    ports: vec![np_port],
                });
            }
        }
        *per_port.entry(key).or_default() += 1;
        merged.changed = true;
    }
    if merged.changed {
        merged.wildcards = wildcards::fold(rules, limits.wildcard_min_names);
    }
}

/// Adds each kubernetes edge's port to the rule whose peers are exactly the edge's peer, or appends a
/// new rule, with the fan-out cap of [`merge()`].
fn merge_rules<'e, R>(
    rules: &mut Vec<R>,
    parts: impl Fn(
        &mut R,
    ) -> (
        Option<&Vec<NetworkPolicyPeer>>,
        &mut Option<Vec<NetworkPolicyPort>>,
    ),
    new_rule: impl Fn(Vec<NetworkPolicyPeer>, Vec<NetworkPolicyPort>) -> R,
    edges: impl IntoIterator<Item = &'e Edge>,
    limits: &Limits,
    merged: &mut Merged,
) {
    // Rules by their peers, and single-address rules per (protocol, port).
    let mut by_peers: HashMap<String, usize> = HashMap::with_capacity(rules.len());
    let mut addresses: HashMap<(String, i32), usize> = HashMap::new();
    for (i, rule) in rules.iter_mut().enumerate() {
        let (peers, ports) = parts(rule);
        let single = single_address(peers);
        by_peers.entry(peers_key(&peers)).or_insert(i);
        if single {
            for p in ports.iter().flatten() {
                if let Some(IntOrString::Int(n)) = p.port {
                    let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
                    *addresses.entry((proto, n)).or_default() += 1;
                }
            }
        }
    }
    for edge in edges {
        let Edge::Kubernetes {
            peer,
            protocol,
            port,
        } = edge
        else {
            continue;
        };
        let peers = vec![peer_of(peer)];
        let np_port = NetworkPolicyPort {
            protocol: Some(protocol.as_str().into()),
            port: Some(IntOrString::Int(i32::from(*port))),
            end_port: None,
        };
        let address_key = (protocol.as_str().to_string(), i32::from(*port));
        let single = !matches!(peer, FlowEnd::Workload(_));
        let count = addresses.get(&address_key).copied().unwrap_or(0);
        let capped = edge.external().is_some() && count >= limits.max_external_peers;
        let key = peers_key(&Some(&peers));
        match by_peers.get(&key) {
            Some(&i) => {
                let (_, ports) = parts(&mut rules[i]);
                let ports = ports.get_or_insert_with(Vec::new);
                if covers(ports, &address_key.0, address_key.1) {
                    continue;
                }
                if capped {
                    *merged.capped.entry((*protocol, *port)).or_default() += 1;
                    continue;
                }
                if ports.len() >= limits.max_ports_per_rule
                    || ports.iter().any(|p| p.end_port.is_some())
                {
                    // A scan of many ports: collapse runs into ranges before refusing anything (and
                    // keep a rule that has ranges collapsed).
                    let mut collapsed = ports.clone();
                    collapsed.push(np_port);
                    collapse(&mut collapsed);
                    if collapsed.len() > limits.max_ports_per_rule {
                        merged.ports_capped += 1;
                        continue;
                    }
                    *ports = collapsed;
                } else {
                    ports.push(np_port);
                }
            }
            None => {
                if capped {
                    *merged.capped.entry((*protocol, *port)).or_default() += 1;
                    continue;
                }
                if rules.len() >= limits.max_rules {
                    merged.rules_capped += 1;
                    continue;
                }
                by_peers.insert(key, rules.len());
                rules.push(new_rule(peers, vec![np_port]));
            }
        }
        if single {
            *addresses.entry(address_key).or_default() += 1;
        }
        merged.changed = true;
    }
}

/// Number of peers (rules, and learned names) in a proposal spec.
pub fn peer_count(spec: &WorkloadNetworkPolicyProposalSpec) -> usize {
    match (&spec.kubernetes, &spec.istio) {
        (Some(np), _) => {
            np.ingress.as_ref().map_or(0, Vec::len)
                + np.egress.as_ref().map_or(0, Vec::len)
                + spec.egress_names.len()
        }
        (None, Some(istio)) => istio.rules.len(),
        (None, None) => 0,
    }
}
