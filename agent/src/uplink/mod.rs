//! The uplink: ships the agent's flow records to the controller over one long-lived gRPC stream
//! (`FlowUplink.Stream`, `api/proto/networkenforcer/agent/v1/uplink.proto`; docs/behaviour.md §7.2, and
//! §1.10 for when the controller acknowledges).
//!
//! - The data path hands record batches to [`UplinkSender::send`], which never waits: when the queue to the
//!   uplink task is full the batch is dropped and counted. Capturing connections matters more than shipping
//!   every aggregate, and records are aggregates that recur, so a dropped batch costs counts, rarely edges.
//! - The uplink task ([`spawn`]) numbers each batch, keeps it in a [`ResendBuffer`] until the controller
//!   acknowledges that sequence number, and resends everything unacknowledged after each reconnect (the
//!   controller merges records idempotently, so a batch delivered twice does no harm). When the buffer is
//!   full (in batches, or in records: memory stays bounded whatever the batch sizes) the oldest batches are
//!   dropped and counted: recent flows are worth more than old ones.
//! - A flow source that must not lose what it read (the ztunnel log positions) hands [`Receipt`]s along
//!   with its records ([`UplinkSender::send_with_receipts`]); a receipt is settled once every batch made
//!   from that send is acknowledged, or dropped and counted (docs/flow-sources.md, "Read positions").
//! - Every (re)connect reads the token file again, because the kubelet rotates projected ServiceAccount
//!   tokens; the token goes in `authorization: Bearer <token>` metadata.
//! - The controller's limits are kept, since breaking one ends the stream and a resend would break it
//!   again: batches are split to at most [`UplinkConfig::max_records_per_batch`] records and written at
//!   most [`UplinkConfig::max_batches_per_second`] a second (also when resending after a reconnect).
//! - Any error or end of the stream leads to a reconnect after a capped exponential backoff with jitter
//!   ([`Backoff`]), so agents do not hammer a restarting controller in lockstep.
//!
//! [`UplinkCounters`] are Prometheus counters, registered by [`crate::metrics::AgentMetrics`].

mod config;
mod connect;
mod receipt;
mod record;
mod resend_buffer;
mod task;

use crate::error::chain;
pub use config::UplinkConfig;
pub use connect::{check, connect};
use connect::{endpoint, read_token};
pub use receipt::{Receipt, ReceiptWatch, receipt};
pub use record::{epoch_ms, flow_record};
pub use resend_buffer::{DEFAULT_MAX_PENDING_RECORDS, Pushed, ResendBuffer};
pub use task::spawn;

use crate::aggregate::Edge;
use crate::clock::WallClock;
use crate::kernel::events::{Direction, Outcome, Protocol};
use network_enforcer_api::backoff::{Backoff, jitter};
use network_enforcer_api::uplink::flow_uplink_client::FlowUplinkClient;
use network_enforcer_api::uplink::{
    self as proto, AgentHealth, BatchAck, FlowBatch, FlowRecord, LocalPod,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// What the data path hands to the uplink task: records, and the receipts to settle once they are
/// acknowledged.
#[derive(Debug, Default)]
struct Outgoing {
    records: Vec<FlowRecord>,
    receipts: Vec<Receipt>,
    /// What the data path lost so far (the uplink adds its own dropped batches).
    health: Option<AgentHealth>,
}

/// The receipts of one send, waiting for the batches it was split into.
#[derive(Debug)]
struct Waiting {
    /// Sequence numbers neither acknowledged nor dropped yet.
    sequences: Vec<u64>,
    receipts: Vec<Receipt>,
}

/// The uplink's counters, as Prometheus metrics (cheap to clone: shared atomics).
#[derive(Clone, Debug, Default)]
pub struct UplinkCounters {
    /// Batches written to a stream, resends included.
    pub batches_sent: Counter,
    /// Batches the controller acknowledged.
    pub batches_acked: Counter,
    /// Batches lost: the queue from the data path was full, or the resend buffer overflowed.
    pub batches_dropped: Counter,
    /// Reconnect attempts after an error or the end of a stream.
    pub reconnects: Counter,
    /// Records the controller took in.
    pub records_accepted: Counter,
    /// Records the controller refused (unknown pod, pod on another node, malformed).
    pub records_rejected: Counter,
    /// Batches waiting for an acknowledgement now.
    pub pending_batches: Gauge,
    /// 1 while a stream to the controller is open (for `/readyz`).
    pub connected: Gauge,
}

/// Why the uplink could not start, or why a stream ended (then it reconnects).
#[derive(Debug, thiserror::Error)]
pub enum UplinkError {
    /// The endpoint is not a URL tonic can connect to.
    #[error("invalid controller URL {url:?}: {source}")]
    Endpoint {
        /// The URL given.
        url: String,
        /// What tonic said.
        source: tonic::transport::Error,
    },
    /// Neither `https://` nor `http://`.
    #[error("controller URL {0:?}: use https:// (or http:// with --controller-insecure)")]
    Scheme(String),
    /// `http://` without the explicit insecure flag.
    #[error(
        "controller URL {0:?} is plaintext: use https:// with --controller-ca-file \
         (NE_CONTROLLER_CA_FILE), or allow plaintext with --controller-insecure (NE_CONTROLLER_INSECURE=true)"
    )]
    Plaintext(String),
    /// `https://` without a CA to check the controller against.
    #[error(
        "controller URL {0:?} needs the CA that signed the controller's certificate: \
         --controller-ca-file (NE_CONTROLLER_CA_FILE)"
    )]
    NoCa(String),
    /// The CA file could not be used.
    #[error("the controller CA file {path}: {detail}")]
    Ca {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The token file could not be read.
    #[error("reading the token file {path}: {source}")]
    Token {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The token file holds no token (yet).
    #[error("the token file {0} is empty")]
    EmptyToken(PathBuf),
    /// The token has characters a header cannot carry.
    #[error("the token in {0} is not printable ASCII, so it cannot be sent as a header")]
    TokenHeader(PathBuf),
    /// The TCP or HTTP/2 connection failed.
    #[error("connecting to the controller: {}", chain(.0))]
    Connect(#[source] tonic::transport::Error),
    /// The controller answered the stream with an error (e.g. unauthenticated, not ready yet).
    #[error("the controller refused the stream: {0}")]
    Refused(#[source] tonic::Status),
    /// The stream broke, or the controller ended it with an error (e.g. a limit).
    #[error("the stream failed: {0}")]
    Stream(#[source] tonic::Status),
    /// The controller closed the stream.
    #[error("the controller ended the stream")]
    Ended,
}

/// The data path's handle to the uplink task. Cheap to clone.
#[derive(Clone, Debug)]
pub struct UplinkSender {
    queue: mpsc::Sender<Outgoing>,
    counters: UplinkCounters,
}

impl UplinkSender {
    /// Hands a batch of records to the uplink task without ever waiting. Returns false, and counts the
    /// batch as dropped, when the queue is full or the task has ended. An empty batch is not sent.
    pub fn send(&self, records: Vec<FlowRecord>) -> bool {
        self.send_with_receipts(records, Vec::new())
    }

    /// [`UplinkSender::send`], settling `receipts` once every record is acknowledged. Without records
    /// the receipts are settled now; when the batch is dropped, too (its records are gone either way).
    pub fn send_with_receipts(&self, records: Vec<FlowRecord>, receipts: Vec<Receipt>) -> bool {
        self.send_with_health(records, receipts, None)
    }

    /// [`UplinkSender::send_with_receipts`], the batch telling the controller what the data path lost
    /// so far (`health`: cumulative since the agent started).
    pub fn send_with_health(
        &self,
        records: Vec<FlowRecord>,
        receipts: Vec<Receipt>,
        health: Option<AgentHealth>,
    ) -> bool {
        if records.is_empty() {
            receipts.into_iter().for_each(Receipt::settle);
            return true;
        }
        match self.queue.try_send(Outgoing {
            records,
            receipts,
            health,
        }) {
            Ok(()) => true,
            Err(error) => {
                self.counters.batches_dropped.inc();
                error
                    .into_inner()
                    .receipts
                    .into_iter()
                    .for_each(Receipt::settle);
                false
            }
        }
    }
}

struct Task {
    config: UplinkConfig,
    buffer: ResendBuffer,
    queue: mpsc::Receiver<Outgoing>,
    /// False once every sender is gone: finish when everything is acknowledged.
    queue_open: bool,
    counters: UplinkCounters,
    /// Receipts of sends whose batches are not all acknowledged (or dropped) yet, oldest first.
    waiting: VecDeque<Waiting>,
}

#[cfg(test)]
mod tests;
