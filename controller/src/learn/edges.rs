//! From a flow to proposal edges: which workloads' proposals it teaches, and what.

use super::*;

/// The workload kind of an endpoint's proposals: its controller's, or [`WorkloadKind::Pod`] for a bare
/// pod. `None` when no NetworkPolicy can select exactly its pods (see [`WorkloadEndpoint::selectable`]),
/// and for a pod of a controller the index does not resolve (each replica would get a proposal).
fn proposal_kind(w: &WorkloadEndpoint) -> Option<WorkloadKind> {
    if !w.selectable() {
        return None;
    }
    match (w.kind, &w.foreign_controller) {
        (Some(kind), _) => Some(kind),
        (None, None) => Some(WorkloadKind::Pod),
        (None, Some(_)) => None,
    }
}

/// Whether an endpoint can be written as a peer: not an unselectable workload (a host-network pod is
/// a peer by its address).
fn usable_peer(e: &FlowEnd) -> bool {
    match e {
        FlowEnd::Workload(w) => w.selectable(),
        _ => true,
    }
}

/// Whether a flow has a workload side no selector can name exactly (a bare pod without labels, a
/// CronJob whose runs share no label): what it teaches about that side is skipped.
pub fn has_unselectable_side(flow: &WorkloadFlow) -> bool {
    [&flow.source, &flow.destination]
        .into_iter()
        .any(|e| e.workload().is_some_and(|w| !w.selectable()))
}

/// The proposal edges a flow produces for `backend`, as in the reference: kubernetes → the source's
/// egress and the destination's ingress; istio → the destination's ingress only, TCP only, from a
/// workload with an identity. Bare pods get proposals of kind `Pod`; an unselectable workload (see
/// [`WorkloadEndpoint::selectable`]) gets no proposal and is no peer. A host-network pod gets its own
/// proposals but is a peer of others as its node's address ([`FlowEnd::as_peer`]).
pub fn edges(flow: &WorkloadFlow, backend: Backend) -> Vec<(Target, Edge)> {
    let mut out = Vec::new();
    match backend {
        Backend::Kubernetes => {
            if let Some(src) = flow.source.workload() {
                if let (Some(kind), true) = (proposal_kind(src), usable_peer(&flow.destination)) {
                    let target = Target {
                        workload: src.clone(),
                        kind,
                        direction: Direction::Egress,
                    };
                    // An outside peer the pod resolved from a name is learned as that name: its
                    // addresses change, the name does not (protect renders the addresses the
                    // workload's pods resolve it to, `cluster::names`).
                    let edge = match &flow.peer_name {
                        Some(name) => Edge::Name {
                            name: name.clone(),
                            protocol: flow.protocol,
                            port: flow.port,
                        },
                        None => Edge::Kubernetes {
                            peer: flow.destination.as_peer(),
                            protocol: flow.protocol,
                            port: flow.port,
                        },
                    };
                    out.push((target, edge));
                }
            }
            if let Some(dst) = flow.destination.workload() {
                if let (Some(kind), true) = (proposal_kind(dst), usable_peer(&flow.source)) {
                    out.push((
                        Target {
                            workload: dst.clone(),
                            kind,
                            direction: Direction::Ingress,
                        },
                        Edge::Kubernetes {
                            peer: flow.source.as_peer(),
                            protocol: flow.protocol,
                            port: flow.port,
                        },
                    ));
                }
            }
        }
        Backend::Istio => {
            // Not host-network pods: the mesh neither captures them nor gives them an identity.
            if let (FlowEnd::Workload(src), FlowEnd::Workload(dst), Protocol::TCP) =
                (&flow.source, &flow.destination, flow.protocol)
            {
                if let Some(kind) = proposal_kind(dst) {
                    out.push((
                        Target {
                            workload: dst.clone(),
                            kind,
                            direction: Direction::Ingress,
                        },
                        Edge::Istio {
                            source: src.clone(),
                            port: flow.port,
                        },
                    ));
                }
            }
        }
    }
    out
}
