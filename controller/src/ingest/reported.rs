//! What ingest hands on to learning: each accepted record that teaches something, as one
//! [`ReportedConnection`], and the sink it goes to ([`ObservationSink`], the learner in the running
//! controller). Defined here, where records come in, so ingest resolves, waits and hands on without
//! importing the learning stage (as [`crate::ingest::evidence`] does for the monitor stage).

use crate::cluster::index::{Connection, Flows, Index, NoFlow, Opened, PodRecord};
use crate::ingest::flow_record::Decoded;
use crate::ingest::ledger::WaitsFor;
use network_enforcer_api::Protocol;
use std::net::IpAddr;
use std::sync::Arc;

/// One allowed connection as an agent reports it, with the local side already known.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportedConnection {
    /// The local pod as ingest found it in the index (shared with it): learning needs no second
    /// lookup by name, and a pod deleted since is learned as it was.
    pub local: Arc<PodRecord>,
    pub peer: IpAddr,
    /// The service port: the peer's port when outbound, the local port when inbound.
    pub port: u16,
    pub protocol: Protocol,
    pub opened: Opened,
    /// When it was last seen, ms since the epoch (resolves IPs that were reused since).
    pub at_ms: i64,
    /// Who reported it, which bounds whose proposals it may teach.
    pub reporter: Reporter,
    /// For an outbound connection: the host name the local pod resolved `peer` from (checked at
    /// ingest, lower-case). Used only when the peer is outside the cluster.
    pub peer_name: Option<Arc<str>>,
}

impl ReportedConnection {
    /// A record as ingest read it, reported by `reporter`.
    pub fn of(decoded: &Decoded, reporter: Reporter) -> Self {
        Self {
            local: decoded.local.clone(),
            peer: decoded.peer,
            port: decoded.port,
            protocol: decoded.protocol,
            opened: decoded.opened,
            at_ms: decoded.at_ms,
            reporter,
            peer_name: decoded.peer_name.name(),
        }
    }

    /// What the index resolves.
    pub fn connection(&self) -> Connection<'_> {
        Connection {
            local: &self.local,
            peer: self.peer,
            port: self.port,
            protocol: self.protocol,
            opened: self.opened,
            at_ms: self.at_ms,
        }
    }
}

/// Who reported an observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reporter {
    /// The agent of the local pod's node. A node speaks for its own pods: it teaches the peer's
    /// proposal only when the peer's workload has a pod on that node too (the peer's own node reports
    /// the connection from its side). So a compromised node cannot add rules to workloads elsewhere.
    Node,
    /// A cluster-wide source the controller reads itself (Calico Goldmane): both sides.
    Cluster,
}

/// Where ingest hands what records teach (the learner).
pub trait ObservationSink: Send + Sync {
    /// Learns `obs`, whose connection the index resolved to `flows` (now, or once it waited for
    /// the index: [`crate::ingest::waiting`]). Returns how many of its edges a flush has yet to
    /// decide (0: its acknowledgement need not wait for a write), and adds their proposals to
    /// `waits`; `Err` when it resolved to nothing (counted by the sink).
    fn learn(
        &self,
        index: &Index,
        obs: &ReportedConnection,
        flows: Result<Flows, NoFlow>,
        waits: &mut WaitsFor,
    ) -> Result<usize, NoFlow>;
}
