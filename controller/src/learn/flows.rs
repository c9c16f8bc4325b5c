//! From an observed connection to workload-level flows, through the index.

use super::*;

/// The workload-level flows an observation stands for (a Service with several backend workloads gives one
/// flow per workload). A host-network local pod is [`FlowEnd::HostNetwork`] at its node's address, so
/// the peer learns it as that address, as the peer's own record does.
pub fn flows(index: &Index, obs: &ReportedConnection) -> Result<Vec<WorkloadFlow>, NoFlow> {
    let local = index.pod_endpoint(&obs.local, obs.peer).ok_or_else(|| {
        NoFlow::HostAddressUnknown(obs.local.namespace.clone(), obs.local.name.clone())
    })?;
    match obs.opened {
        Opened::Outbound => match index.resolve_ref(obs.peer, obs.port, obs.protocol, obs.at_ms) {
            ResolvedRef::Pod(w, port) => Ok(vec![WorkloadFlow {
                source: local,
                destination: FlowEnd::Workload(w.clone()),
                protocol: obs.protocol,
                port,
                peer_name: None,
            }]),
            // What the connection reached after kube-proxy's DNAT, which is what NetworkPolicies see.
            ResolvedRef::Backends(backends) => Ok(backends
                .iter()
                .map(|(backend, port)| WorkloadFlow {
                    source: local.clone(),
                    destination: backend.clone(),
                    protocol: obs.protocol,
                    port: *port,
                    peer_name: None,
                })
                .collect()),
            ResolvedRef::Address(peer, port) => Ok(vec![WorkloadFlow {
                source: local,
                // Only an outside address is learned by name: a node's is what it is.
                peer_name: matches!(peer, FlowEnd::External(_))
                    .then(|| obs.peer_name.clone())
                    .flatten(),
                destination: peer,
                protocol: obs.protocol,
                port,
            }]),
            ResolvedRef::ServiceWithoutBackends(svc) => Err(NoFlow::ServiceWithoutBackends(
                svc.namespace.clone(),
                svc.name.clone(),
            )),
        },
        Opened::Inbound => {
            // An inbound peer is never a ClusterIP (kube-proxy preserves the client IP).
            let source = match index.resolve_ref(obs.peer, 0, obs.protocol, obs.at_ms) {
                ResolvedRef::Pod(w, _) => FlowEnd::Workload(w.clone()),
                ResolvedRef::Address(peer, _) => peer,
                _ => FlowEnd::External(obs.peer),
            };
            Ok(vec![WorkloadFlow {
                source,
                destination: local,
                protocol: obs.protocol,
                port: obs.port,
                peer_name: None,
            }])
        }
    }
}
