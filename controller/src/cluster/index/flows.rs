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

/// An address's family: a host-network local pod is its address of its peer's family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }

    /// An address of this family, standing for one whose only use is its family.
    fn any_address(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            Family::V6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        }
    }
}

/// Where a connection's peer is, as the index placed it at the record's time ([`Index::place`]):
/// the part of a record's resolution that reads the index's history of addresses, done once per
/// record and kept (small: what waits between two evidence passes holds one) until
/// [`Index::flows_at`] expands it.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerAt {
    /// Not placed yet: the address as the record gave it.
    Unplaced(IpAddr),
    /// The pod that held the address.
    Pod(Arc<PodRecord>, Family),
    /// A Service ClusterIP's backends on the connection's port.
    Backends(Arc<Vec<Backend>>, Family),
    /// A Service ClusterIP without a backend on that port yet.
    NoBackends(IpAddr),
    /// No pod's and no Service's: a node's or an outside address.
    Address(IpAddr),
}

impl PeerAt {
    /// Whether placing it again may give another answer: not placed yet, a Service without
    /// backends, or an address a pod or Service could still turn out to have (any address when
    /// `cluster_cidrs` is empty: the ranges are not known; else only one inside them) that is no
    /// node's.
    pub fn may_improve(&self, index: &Index, cluster_cidrs: &[ipnet::IpNet]) -> bool {
        match self {
            PeerAt::Unplaced(_) | PeerAt::NoBackends(_) => true,
            PeerAt::Pod(..) | PeerAt::Backends(..) => false,
            PeerAt::Address(ip) => {
                !index.nodes.contains_key(ip)
                    && (cluster_cidrs.is_empty() || cluster_cidrs.iter().any(|c| c.contains(ip)))
            }
        }
    }

    /// The address, when the placement keeps it (for logs).
    pub fn address(&self) -> Option<IpAddr> {
        match self {
            PeerAt::Unplaced(ip) | PeerAt::NoBackends(ip) | PeerAt::Address(ip) => Some(*ip),
            PeerAt::Pod(..) | PeerAt::Backends(..) => None,
        }
    }
}

impl Index {
    /// The flows `connection` stands for: to the pod that held the peer's address at the record's
    /// time, to each backend of a Service ClusterIP (on the port each is reached on after DNAT), or
    /// to a node or outside address. An inbound peer is never a ClusterIP (kube-proxy keeps the
    /// client's address). A host-network local pod is its address of the peer's family.
    pub fn flows(&self, connection: &Connection<'_>) -> Result<Flows, NoFlow> {
        self.flows_at(connection, &self.place(connection))
    }

    /// Where `connection`'s peer is at the record's time (see [`PeerAt`]).
    pub fn place(&self, connection: &Connection<'_>) -> PeerAt {
        let Connection {
            peer,
            port,
            protocol,
            opened,
            at_ms,
            ..
        } = *connection;
        let family = Family::of(peer);
        if let Some(pod) = self.pod_at(peer, at_ms) {
            return PeerAt::Pod(Arc::clone(pod), family);
        }
        if opened == Opened::Inbound {
            return PeerAt::Address(peer);
        }
        match self.service_ips.get(&peer) {
            Some(key) if self.services.contains_key(key) => {
                match self
                    .backends
                    .get(key)
                    .and_then(|b| b.by_port.get(&(port, protocol)))
                {
                    Some(b) if !b.is_empty() => PeerAt::Backends(Arc::clone(b), family),
                    _ => PeerAt::NoBackends(peer),
                }
            }
            _ => PeerAt::Address(peer),
        }
    }

    /// The flows of `connection` whose peer is `placed` (an [`PeerAt::Unplaced`] one is placed
    /// now): [`Index::flows`] without reading the history of addresses again.
    pub fn flows_at(&self, connection: &Connection<'_>, placed: &PeerAt) -> Result<Flows, NoFlow> {
        let Connection {
            local,
            port,
            opened,
            ..
        } = *connection;
        let placed = match placed {
            PeerAt::Unplaced(_) => &self.place(connection),
            placed => placed,
        };
        let family = match placed {
            PeerAt::Pod(_, family) | PeerAt::Backends(_, family) => *family,
            PeerAt::Unplaced(ip) | PeerAt::NoBackends(ip) | PeerAt::Address(ip) => Family::of(*ip),
        };
        let local = self.local_end(local, family.any_address())?;
        let flow = |source, destination, port| Flow {
            source,
            destination,
            port,
            to_address: false,
        };
        let peer = match placed {
            PeerAt::Pod(pod, _) => End::Pod(Arc::clone(pod)),
            PeerAt::Backends(backends, _) => {
                return Ok(backends
                    .iter()
                    .map(|(backend, port)| flow(local.clone(), End::Other(backend.clone()), *port))
                    .collect());
            }
            PeerAt::NoBackends(ip) => {
                let (namespace, name) = self
                    .service_ips
                    .get(ip)
                    .cloned()
                    .unwrap_or_else(|| (String::new(), ip.to_string()));
                return Err(NoFlow::ServiceWithoutBackends(namespace, name));
            }
            PeerAt::Address(ip) | PeerAt::Unplaced(ip) => {
                let end = match self.nodes.get(ip) {
                    Some(node) => FlowEnd::Node {
                        ip: *ip,
                        name: node.clone(),
                    },
                    None => FlowEnd::External(*ip),
                };
                let to_address = opened == Opened::Outbound;
                let (source, destination) = match opened {
                    Opened::Outbound => (local, End::Other(end)),
                    Opened::Inbound => (End::Other(end), local),
                };
                return Ok(smallvec::smallvec![Flow {
                    to_address,
                    ..flow(source, destination, port)
                }]);
            }
        };
        Ok(match opened {
            Opened::Outbound => smallvec::smallvec![flow(local, peer, port)],
            Opened::Inbound => smallvec::smallvec![flow(peer, local, port)],
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
