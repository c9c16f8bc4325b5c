//! From an observed connection to workload-level flows: the index's one resolution
//! ([`Index::flows`]), named as learning names its ends.

use super::*;

/// The workload-level flows an observation stands for (a Service with several backend workloads gives one
/// flow per workload). A host-network local pod is [`FlowEnd::HostNetwork`] at its node's address, so
/// the peer learns it as that address, as the peer's own record does.
pub fn flows(index: &Index, obs: &ReportedConnection) -> Result<Vec<WorkloadFlow>, NoFlow> {
    workload_flows(index.flows(&obs.connection()), obs)
}

/// `resolved`, the flows of `obs`, as workload-level flows. Only an outside destination is learned
/// by the name the pod resolved it from: a node's address is what it is.
pub fn workload_flows(
    resolved: Result<Flows, NoFlow>,
    obs: &ReportedConnection,
) -> Result<Vec<WorkloadFlow>, NoFlow> {
    Ok(resolved?
        .iter()
        .map(|flow| WorkloadFlow {
            source: flow.source.flow_end(),
            destination: flow.destination.flow_end(),
            protocol: obs.protocol,
            port: flow.port,
            peer_name: (flow.to_address
                && matches!(flow.destination, End::Other(FlowEnd::External(_))))
            .then(|| obs.peer_name.clone())
            .flatten(),
        })
        .collect())
}
