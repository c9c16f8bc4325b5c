//! A reported connection's two ends as the index places them at the record's time: the one
//! resolution of a record that learning (proposal edges), violation evidence, the edge history and
//! the protect gate share (docs/behaviour.md §1.3, §3.2). Each consumer only names the ends in its
//! own terms: learning as [`FlowEnd`]s, evidence as evaluable pods and addresses.

use super::*;
use smallvec::SmallVec;

/// Who opened the connection, seen from the local pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Opened {
    /// The local pod connected to the peer.
    Outbound,
    /// The peer connected to the local pod.
    Inbound,
}

/// Why a connection has no flow (yet). Counted by the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoFlow {
    #[error("Service {0}/{1} has no backend for that port yet")]
    ServiceWithoutBackends(String, String),
    #[error("the host-network pod {0}/{1} has no address of the peer's family yet")]
    HostAddressUnknown(String, String),
}

impl NoFlow {
    /// The `outcome` label counted in `resolutions_total`.
    pub fn label(&self) -> &'static str {
        match self {
            NoFlow::ServiceWithoutBackends(..) => "service_without_backends",
            NoFlow::HostAddressUnknown(..) => "host_address_unknown",
        }
    }
}

/// A connection as a record reports it, its local pod already found (borrowed from the record).
#[derive(Clone, Copy, Debug)]
pub struct Connection<'r> {
    pub local: &'r Arc<PodRecord>,
    pub peer: IpAddr,
    /// The service port: the peer's port when outbound, the local port when inbound.
    pub port: u16,
    pub protocol: Protocol,
    pub opened: Opened,
    /// When it was last seen, ms since the epoch: an address is resolved to what held it then.
    pub at_ms: i64,
}

/// One end of a [`Flow`] (sharing the index's records: no copies).
#[derive(Clone, Debug, PartialEq)]
pub enum End {
    /// A pod on the pod network: the local pod, or the pod that held the peer's address.
    Pod(Arc<PodRecord>),
    /// Any other end: a Service's backend workload (any of its pods stands for it, they share their
    /// template), a host-network pod at its address of the other end's family, a node, an outside
    /// address.
    Other(FlowEnd),
}

impl End {
    /// The end as learning names it.
    pub fn flow_end(&self) -> FlowEnd {
        match self {
            End::Pod(pod) => FlowEnd::Workload(Arc::clone(&pod.endpoint)),
            End::Other(end) => end.clone(),
        }
    }
}

/// A connection between two ends on a destination (container) port: what kube-proxy's DNAT made of
/// the connection, which is what NetworkPolicies see.
#[derive(Clone, Debug, PartialEq)]
pub struct Flow {
    pub source: End,
    pub destination: End,
    pub port: u16,
    /// Whether the destination is the address the source pod reached itself, a node's or an
    /// outside one: no pod held it and no Service is behind it, so a name the pod resolved it from
    /// may name it (learning names only an outside one, [`FlowEnd::External`]; evidence both, as the
    /// agent's enforcement allows them, docs/behaviour.md §3.4).
    pub to_address: bool,
}

/// The flows of one connection: one, or one per backend workload of a Service.
pub type Flows = SmallVec<[Flow; 1]>;

impl Index {
    /// The flows `connection` stands for: to the pod that held the peer's address at the record's
    /// time, to each backend of a Service ClusterIP (on the port each is reached on after DNAT), or
    /// to a node or outside address. An inbound peer is never a ClusterIP (kube-proxy keeps the
    /// client's address). A host-network local pod is its address of the peer's family.
    pub fn flows(&self, connection: &Connection<'_>) -> Result<Flows, NoFlow> {
        let Connection {
            local,
            peer,
            port,
            protocol,
            opened,
            at_ms,
        } = *connection;
        let local = self.local_end(local, peer)?;
        let flow = |source, destination, port| Flow {
            source,
            destination,
            port,
            to_address: false,
        };
        Ok(match opened {
            Opened::Outbound => match self.resolve_ref(peer, port, protocol, at_ms) {
                ResolvedRef::Pod(pod, port) => {
                    smallvec::smallvec![flow(local, End::Pod(Arc::clone(pod)), port)]
                }
                ResolvedRef::Backends(backends) => backends
                    .iter()
                    .map(|(backend, port)| flow(local.clone(), End::Other(backend.clone()), *port))
                    .collect(),
                ResolvedRef::Address(end, port) => smallvec::smallvec![Flow {
                    to_address: true,
                    ..flow(local, End::Other(end), port)
                }],
                ResolvedRef::ServiceWithoutBackends(svc) => {
                    return Err(NoFlow::ServiceWithoutBackends(
                        svc.namespace.clone(),
                        svc.name.clone(),
                    ));
                }
            },
            Opened::Inbound => {
                let source = match self.pod_at(peer, at_ms) {
                    Some(pod) => End::Pod(Arc::clone(pod)),
                    None => End::Other(self.address_endpoint(peer, at_ms)),
                };
                smallvec::smallvec![flow(source, local, port)]
            }
        })
    }

    /// The local pod as an end whose other end is `peer`: itself, or for a host-network pod its
    /// address of `peer`'s family ([`Index::pod_endpoint`]).
    fn local_end(&self, pod: &Arc<PodRecord>, peer: IpAddr) -> Result<End, NoFlow> {
        if !pod.host_network {
            return Ok(End::Pod(Arc::clone(pod)));
        }
        self.pod_endpoint(pod, peer)
            .map(End::Other)
            .ok_or_else(|| NoFlow::HostAddressUnknown(pod.namespace.clone(), pod.name.clone()))
    }
}
