//! Ingest: the gRPC endpoint agents stream flow batches to (what it accepts and refuses:
//! docs/behaviour.md §7.7; when it acknowledges: §1.10).
//!
//! Every stream is authenticated before a record is read: the agent presents its projected ServiceAccount
//! token (audience [`AUDIENCE`]), the controller checks it with a TokenReview, requires the agent's
//! ServiceAccount, and learns the agent's node from the pod the token is bound to. Records are accepted
//! only for pods the index places on that node, so a compromised agent cannot speak for other nodes; a
//! record for a pod the index has not seen yet waits for it a little ([`waiting`]).
//! Limits (records per batch, batches per second per stream, message size) are answered with a clear
//! status and counted; nothing an agent sends can crash the controller.
//!
//! **Acknowledged means written.** Learned edges wait in the learner until the next flush.
//! A batch acknowledged before then would be lost if the controller stopped in between (crash,
//! rollout, lost Lease): the agent has already forgotten it. So, with [`IngestService::written`] set
//! (the controller binary always sets it), a batch that taught anything is acknowledged only once a
//! flush that started after it was merged has written every pending proposal ([`Ledger`]); until then
//! the agent keeps it in its resend buffer and resends it after a reconnect. Resends merge idempotently
//! (same edges, same rules), so the price of a restart is a few duplicate records, never a lost or
//! duplicated rule. Violation evidence is held the same way: while any policy exists, a batch is
//! acknowledged only once the evidence pass after it has found no violation in it that still waits for
//! its status patch ([`Holds`]). Batches that teach nothing and carry no evidence (refused records, or
//! only edges a flush has already written, with no policy in force) are acknowledged at once. A proposal whose write keeps failing holds back only
//! the acknowledgements of batches that taught it something ([`WaitsFor`]): one hostile or broken
//! proposal cannot stall every agent. Those agents' resend buffers rotate their oldest batches out,
//! which this controller has already merged.
//!
//! **A resend counts once.** A batch resent after its evidence was handed on (recognised by agent
//! process and sequence, [`claims`]) is learned from again but is not evidence again; its
//! acknowledgement waits for what its first attempt's waited for.

pub mod admission;
mod auth;
pub mod auth_cache;
pub mod claims;
pub mod claims_store;
pub mod evidence;
pub mod flow_record;
mod holds;
mod learning;
pub mod ledger;
pub mod peer_names;
pub mod presence;
pub mod reported;
mod service;
pub mod source_cursors;
pub mod tls;
pub mod waiting;

pub use auth::{AUDIENCE, AgentIdentity, Authenticate, TokenReviewAuthenticator};
pub use holds::{Claim, Holds, RepeatOf};
pub use learning::{CLOCK_SKEW_MS, clamp_times, observation};

use crate::cluster::index::{FlowEnd, Index, ResolvedRef};
use crate::cluster::names::{Change, WorkloadKey};
use crate::cluster::watches::SharedIndex;
use crate::ingest::evidence::Evidence;
use crate::runtime::leader::Leading;
use crate::runtime::metrics::ControllerMetrics;
use claims::ClaimGate;
use flow_record::{BadRecord, Decoded, PeerFrom};
use futures::Stream;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, Client};
use ledger::{Ledger, WaitsFor};
use network_enforcer_api::uplink::encoded::{
    self,
    flow_uplink_server::{FlowUplink, FlowUplinkServer},
};
use network_enforcer_api::uplink::{self, BatchAck, FlowBatch, FlowRecord};
use network_enforcer_api::{Protocol, WorkloadKind};
use prost::Message;
use reported::{ObservationSink, ReportedConnection, Reporter};
use std::borrow::Cow;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, mpsc};
use tonic::{Request, Response, Status, Streaming};
use waiting::{Admitted, Look, Waiting};

/// Limits on what one agent stream may send.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_records_per_batch: usize,
    pub max_batches_per_second: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_records_per_batch: 10_000,
            max_batches_per_second: 20,
        }
    }
}

/// Where accepted records go: the index to resolve them, the learner to learn from them, and the
/// status sync that turns them into violation evidence (docs/behaviour.md §3).
pub struct Learning {
    pub index: Arc<SharedIndex>,
    /// Where what records teach goes (the learner).
    pub learner: Arc<dyn ObservationSink>,
    /// Whose leadership decides whether agents' streams are taken (the proposal writer's).
    pub leader: Arc<dyn Leading>,
    /// The process's metrics, which ingest counts into.
    pub metrics: ControllerMetrics,
    /// Every accepted record is also handed here (never blocks); `None`: no violations recorded.
    pub evidence: Option<Arc<dyn crate::ingest::evidence::EvidenceSink>>,
    /// What waits for the index: records for their pod, observations and evidence for their peer.
    pub waiting: Waiting,
    /// Where resolutions go (`OUTCOME_RESOLVED` records); `None`: they are counted and dropped.
    pub names: Option<Arc<crate::cluster::names::ResolvedNames>>,
    /// The batches whose evidence was counted, to recognise them when resent ([`claims`]).
    pub claims: Arc<claims::Claims>,
}

/// The gRPC service.
pub struct IngestService {
    pub authenticator: Arc<dyn Authenticate>,
    pub learning: Arc<Learning>,
    pub limits: Limits,
    /// How many streams, one per agent pod, and for how long ([`admission`]).
    pub admission: Arc<admission::Admission>,
    /// `Some`: acknowledge a batch that taught something only once a flush counted here has written
    /// it (what the controller does; see the module docs). `None`: acknowledge once merged in memory
    /// (for tests that flush by hand).
    pub written: Option<Arc<Ledger>>,
    /// Which nodes' agents stream now ([`presence`]).
    pub presence: Arc<presence::Presence>,
}

/// The largest batch message an agent may send, encoded.
pub const MAX_BATCH_BYTES: usize = 8 * 1024 * 1024;

#[cfg(test)]
mod tests;
