//! What waits for the index (docs/behaviour.md §1.3, "Waiting for the index"): one queue, one set of
//! bounds, one metric family, for everything ingest cannot resolve yet but soon may.
//!
//! The index follows the API server, and the API server lags what agents see:
//! - **a record's local pod** ([`Waiter::Record`]): an agent learns of its node's pods from the API
//!   server, as the controller does, and the two watches do not deliver at the same moment; a
//!   controller whose watch lags can get a new pod's first connections before the pod, or before its
//!   binding to a node. Refused, those records would be lost (the agent forgets what was
//!   acknowledged). Once the index knows the pod with a node, the record is taken in as if it had
//!   just arrived (a pod on another node is refused then, `not_on_node`); once the grace is over it
//!   is refused (`records_rejected_total{reason="unknown_local_pod"}`).
//! - **an observation's peer** ([`Waiter::Observation`]): a new pod sends its first packets before
//!   its IP reaches the API server, and a Service's backends may not be listed yet. Learned at once,
//!   such a peer would become an `ipBlock` /32 rule for a pod IP: wrong, and never removed. So an
//!   observation whose peer resolves to an external address, or not at all, waits and is learned as
//!   soon as the index places it or, once the grace is over, as it resolves then. A repeat of one
//!   that waits already (agents send a connection again every flush) takes no place of its own: it is
//!   learned with it (`repeat`).
//! - **blocked evidence's peer** ([`Waiter::Evidence`]): a blocked connection whose peer is such an
//!   address (a new pod's first SYN, refused by a node that had not learned the pod's address yet)
//!   would be judged as that bare address, a violation the policy does not make (§3.2). It is handed
//!   on to the evidence pass once the index places its peer or the grace is over, marked
//!   [`Evidence::waited_for_peer`].
//!
//! Everything waits up to the resolution grace (`--resolution-grace-seconds`) from its arrival and is
//! looked at again before every flush; records waiting for their pod also as batches come in (at most
//! every [`RETRY_EVERY_MS`]: [`Look::Batch`]), so a lagging watch delays them no longer than it lags. With
//! `--cluster-cidrs` (the ranges the cluster gives pods and Services) a peer outside them does not
//! wait: no pod or Service the index has not seen yet can have it.
//!
//! A batch with something waiting is acknowledged only after a flush that started once its grace was
//! over (by then it was learned and written, its evidence handed on), so a controller restart within
//! the grace loses nothing: the agent sends it again.
//!
//! **Bounds**, because a hostile agent may name pods and peers that will never exist: at most
//! [`MAX_WAITING`] entries, [`MAX_WAITING_PER_NODE`] of them from one node (a cluster source's records
//! filed under a node have a share of their own), [`MAX_WAITING_RECORDS`] of them records waiting for
//! their pod, each at most [`MAX_RECORD_BYTES`] encoded. What does not fit does not wait: it is
//! decided at once, as the index resolves it now (a record is refused, an observation learned,
//! evidence handed on), as is everything when the grace is 0. At the bounds the queue holds about 10
//! MiB of records and 15 MiB of observations and evidence.
//!
//! Counted in `network_enforcer_controller_waits_total{waiter, outcome}` (`waiter`: `record`,
//! `observation`, `evidence`; `outcome`: `waits`, `repeat`, `placed`, `expired`, `full`) and the gauge
//! `network_enforcer_controller_waiting{waiter}`.

use crate::FastSet;
use crate::cluster::index::{End, FlowEnd, Flows, Index, NoFlow, Opened};
use crate::ingest::claims::{ClaimGate, Counts};
use crate::ingest::evidence::Evidence;
use crate::ingest::flow_record;
use crate::ingest::reported::{ReportedConnection, Reporter};
use crate::runtime::metrics::{WaitMetrics, WaitOutcome, Waiter as WaiterLabel};
use ipnet::IpNet;
use network_enforcer_api::Protocol;
use network_enforcer_api::uplink::FlowRecord;
use prost::Message;
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The default grace, in milliseconds.
pub const DEFAULT_GRACE_MS: i64 = 30_000;

/// At most this many entries wait (an observation or evidence about 150 bytes).
pub const MAX_WAITING: usize = 100_000;

/// At most this many of them are records waiting for their pod (each up to [`MAX_RECORD_BYTES`]:
/// about 10 MiB).
pub const MAX_WAITING_RECORDS: usize = 10_000;

/// At most this many of them from one node: one agent naming pods or peers that never come cannot
/// take the room of the others.
pub const MAX_WAITING_PER_NODE: usize = 10_000;

/// A record larger than this (encoded) does not wait for its pod: a real one is a few hundred bytes.
pub const MAX_RECORD_BYTES: usize = 1_024;

/// Incoming batches look at what waits at most this often (a flush always does).
pub const RETRY_EVERY_MS: i64 = 250;

/// A record waiting for its local pod, as it arrived.
#[derive(Debug, Clone, PartialEq)]
pub struct Early {
    /// The node whose stream (or cluster source) sent it: its pod must run there.
    pub node: Arc<str>,
    pub reporter: Reporter,
    pub record: FlowRecord,
    /// When it arrived, ms since the epoch: it is taken in as of then.
    pub arrived_ms: i64,
    /// Whether it counts as violation evidence (not when its batch is a repeat: [`super::claims`]).
    pub counts: bool,
    /// Its batch's claim ([`ClaimGate`]).
    pub gate: Option<ClaimGate>,
}

/// What waits (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Waiter {
    /// A record whose local pod the index does not know yet, or knows without a node (boxed: the
    /// other entries are a third of its size).
    Record(Box<Early>),
    /// An observation whose peer the index may place yet.
    Observation(ReportedConnection),
    /// Evidence of a blocked connection whose peer the index may place yet.
    Evidence(Evidence),
}

impl Waiter {
    fn label(&self) -> WaiterLabel {
        match self {
            Waiter::Record(_) => WaiterLabel::record,
            Waiter::Observation(_) => WaiterLabel::observation,
            Waiter::Evidence(_) => WaiterLabel::evidence,
        }
    }

    /// Whether `index` now places what it waits for.
    fn placed(&self, index: &Index, cluster_cidrs: &[IpNet]) -> bool {
        match self {
            Waiter::Record(early) => {
                flow_record::local_pod(&early.record, index).is_some_and(|pod| pod.node.is_some())
            }
            Waiter::Observation(obs) => {
                !may_improve(&index.flows(&obs.connection()), obs.opened, cluster_cidrs)
            }
            Waiter::Evidence(e) => !may_improve(
                &index.flows(&e.record.connection()),
                e.record.opened,
                cluster_cidrs,
            ),
        }
    }
}

/// The share of the bounds that an entry from `node`, reported by `reporter`, takes: the node's, or
/// for a cluster-wide source's records filed under that node, one of their own (a busy Goldmane
/// window must not push the node's agent's new pods out of the queue).
pub fn share(node: &str, reporter: Reporter) -> std::borrow::Cow<'_, str> {
    match reporter {
        Reporter::Node => node.into(),
        Reporter::Cluster => format!("{node} (cluster source)").into(),
    }
}

/// Whether the flows of a connection `opened` so might change once the index catches up: it has
/// none, or a peer is an external address that a pod or Service could still turn out to have: any
/// address when `cluster_cidrs` is empty (the ranges are not known), else only one inside them.
pub fn may_improve(flows: &Result<Flows, NoFlow>, opened: Opened, cluster_cidrs: &[IpNet]) -> bool {
    let in_cluster =
        |ip: &IpAddr| cluster_cidrs.is_empty() || cluster_cidrs.iter().any(|c| c.contains(ip));
    match flows {
        Err(_) => true,
        Ok(flows) => flows.iter().any(|f| {
            let peer = match opened {
                Opened::Outbound => &f.destination,
                Opened::Inbound => &f.source,
            };
            matches!(peer, End::Other(FlowEnd::External(ip)) if in_cluster(ip))
        }),
    }
}

/// Why something does not wait: it is decided at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoWait {
    /// The resolution grace is 0, or nothing better can come of waiting.
    Needless,
    /// The record is larger than [`MAX_RECORD_BYTES`].
    TooLarge,
    /// [`MAX_WAITING`] or [`MAX_WAITING_PER_NODE`] entries wait already.
    Full,
}

/// What [`Waiting::observation`] made of an observation.
#[derive(Debug, PartialEq)]
pub enum Admitted {
    /// Learn it now, as it resolves.
    Now(Result<Flows, NoFlow>),
    /// It waits until then, ms since the epoch (it comes back from [`Waiting::take_decided`]).
    Waits(i64),
    /// The same observation waits already: this one is learned with it. Its batch waits as long.
    Repeat(i64),
}

/// Who looks at what waits ([`Waiting::take_decided`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// A batch as it comes: only records waiting for their pod (observations and evidence wait for
    /// the flush: resolving them all every [`RETRY_EVERY_MS`] would cost every batch), and not while
    /// another thread decides ([`Waiting::settling`]).
    Batch,
    /// A flush: everything, after whoever decides now.
    Flush,
}

/// What [`Waiting::take_decided`] hands back.
#[derive(Debug, Default, PartialEq)]
pub struct Decided {
    /// Records to take in (`true`: the index knows their pod with a node) or refuse (their grace is
    /// over).
    pub records: Vec<(Early, bool)>,
    /// Observations to learn, as they resolve now.
    pub observations: Vec<(ReportedConnection, Result<Flows, NoFlow>)>,
    /// Evidence to hand on, marked [`Evidence::waited_for_peer`]; the evidence pass resolves it again.
    pub evidence: Vec<Evidence>,
}

/// What makes two observations teach the same: everything but when they were seen.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct LearnKey {
    /// The local pod's record, by address: the entry that holds the key holds the record.
    local: usize,
    peer: IpAddr,
    port: u16,
    protocol: Protocol,
    opened: Opened,
    reporter: Reporter,
    peer_name: Option<Arc<str>>,
}

impl LearnKey {
    fn of(waiter: &Waiter) -> Option<Self> {
        let Waiter::Observation(obs) = waiter else {
            // Records wait for their pod before anything is known of them; each piece of evidence
            // is an occurrence of its own.
            return None;
        };
        Some(Self {
            local: Arc::as_ptr(&obs.local) as usize,
            peer: obs.peer,
            port: obs.port,
            protocol: obs.protocol,
            opened: obs.opened,
            reporter: obs.reporter,
            peer_name: obs.peer_name.clone(),
        })
    }
}

#[derive(Debug)]
struct Entry {
    /// Its share of the bound: the node whose stream sent it ([`share`]).
    node: Arc<str>,
    until_ms: i64,
    what: Waiter,
}

#[derive(Debug, Default)]
struct Queue {
    entries: VecDeque<Entry>,
    /// Entries waiting, counted apart from `entries`: a settling takes them out while it decides,
    /// and the bounds must hold meanwhile.
    total: usize,
    /// Records among them.
    records: usize,
    per_node: HashMap<Arc<str>, usize>,
    /// The waiting observations: a repeat waits in their place.
    observations: FastSet<LearnKey>,
}

impl Queue {
    /// Gives back the place of an entry of `node`'s, keyed `key`, that left the queue.
    fn left(&mut self, node: &Arc<str>, key: Option<&LearnKey>, record: bool) {
        self.total -= 1;
        self.records -= usize::from(record);
        if let Some(n) = self.per_node.get_mut(node) {
            *n -= 1;
            if *n == 0 {
                self.per_node.remove(node);
            }
        }
        if let Some(key) = key {
            self.observations.remove(key);
        }
    }
}

/// What waits for the index (see the module docs).
#[derive(Debug)]
pub struct Waiting {
    grace_ms: i64,
    cluster_cidrs: Vec<IpNet>,
    queue: Mutex<Queue>,
    /// Held by whoever takes entries out to decide them ([`Waiting::settling`]).
    settling: Mutex<()>,
    /// How many wait, read without the lock.
    len: AtomicUsize,
    /// How many records wait for their pod, read without the lock by every batch.
    records: AtomicUsize,
    /// When a batch last looked at them, ms since the epoch.
    last_try_ms: AtomicI64,
    metrics: WaitMetrics,
}

impl Default for Waiting {
    fn default() -> Self {
        Self::new(0, Vec::new(), WaitMetrics::default())
    }
}

impl Waiting {
    /// Everything waits up to `grace_ms` (0: nothing waits); peers outside `cluster_cidrs` (the
    /// ranges the cluster gives pods and Services; empty: unknown) never do. Counts into `metrics`.
    pub fn new(grace_ms: i64, cluster_cidrs: Vec<IpNet>, metrics: WaitMetrics) -> Self {
        Self {
            grace_ms: grace_ms.max(0),
            cluster_cidrs,
            queue: Mutex::default(),
            settling: Mutex::default(),
            len: AtomicUsize::new(0),
            records: AtomicUsize::new(0),
            last_try_ms: AtomicI64::new(0),
            metrics,
        }
    }

    /// How long anything may wait, in milliseconds.
    pub fn grace_ms(&self) -> i64 {
        self.grace_ms
    }

    /// Number of entries waiting.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether none waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lets `record`, from `node`, which arrived at `now_ms`, wait for its local pod; returns when its
    /// wait ends. `counts`: whether it counts as violation evidence, and for which claim.
    pub fn record(
        &self,
        node: &str,
        reporter: Reporter,
        record: &FlowRecord,
        now_ms: i64,
        counts: Counts<'_>,
    ) -> Result<i64, NoWait> {
        if self.grace_ms == 0 {
            return Err(NoWait::Needless);
        }
        if record.encoded_len() > MAX_RECORD_BYTES {
            return Err(NoWait::TooLarge);
        }
        let early = Early {
            node: node.into(),
            reporter,
            record: record.clone(),
            arrived_ms: now_ms,
            counts: counts.counts,
            gate: counts.gate.cloned(),
        };
        self.wait(
            &share(node, reporter),
            Waiter::Record(Box::new(early)),
            now_ms,
        )
        .map(|(until, _)| until)
    }

    /// Resolves `obs`, from `node`, against `index` at `now_ms`: to learn now, or to wait for its
    /// peer.
    pub fn observation(
        &self,
        index: &Index,
        node: &str,
        obs: &ReportedConnection,
        now_ms: i64,
    ) -> Admitted {
        let flows = index.flows(&obs.connection());
        if self.grace_ms == 0 || !may_improve(&flows, obs.opened, &self.cluster_cidrs) {
            return Admitted::Now(flows);
        }
        let share = share(node, obs.reporter);
        match self.wait(&share, Waiter::Observation(obs.clone()), now_ms) {
            Ok((until, true)) => Admitted::Waits(until),
            Ok((until, false)) => Admitted::Repeat(until),
            Err(_) => Admitted::Now(flows),
        }
    }

    /// Violation `evidence` from `node`, reported by `reporter`, that arrived at `now_ms`: `Ok` to
    /// hand on now, `Err(until)`
    /// when it waits for its peer until then (it comes back from [`Waiting::take_decided`]). Only
    /// evidence that [`Evidence::may_wait_for_peer`] waits, and only when its peer resolves as an
    /// observation's would wait.
    pub fn evidence(
        &self,
        index: &Index,
        node: &str,
        reporter: Reporter,
        evidence: Evidence,
        now_ms: i64,
    ) -> Result<Evidence, i64> {
        if self.grace_ms == 0 || !evidence.may_wait_for_peer() {
            return Ok(evidence);
        }
        let flows = index.flows(&evidence.record.connection());
        if !may_improve(&flows, evidence.record.opened, &self.cluster_cidrs) {
            return Ok(evidence);
        }
        let waiting = Evidence {
            waited_for_peer: true,
            ..evidence.clone()
        };
        match self.wait(&share(node, reporter), Waiter::Evidence(waiting), now_ms) {
            Ok((until, _)) => Err(until),
            Err(_) => Ok(evidence),
        }
    }

    /// Queues `what` from `node` until the grace from `now_ms` is over. `Ok((until, false))`: `what`
    /// repeats an observation that waits already and is not queued (checked under the same lock as
    /// the queuing, so two batches cannot both queue one observation).
    fn wait(&self, node: &str, what: Waiter, now_ms: i64) -> Result<(i64, bool), NoWait> {
        let label = what.label();
        let until_ms = now_ms.saturating_add(self.grace_ms);
        let key = LearnKey::of(&what);
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if key.as_ref().is_some_and(|k| queue.observations.contains(k)) {
            self.metrics.count(label, WaitOutcome::repeat, 1);
            return Ok((until_ms, false));
        }
        let record = matches!(what, Waiter::Record(_));
        let from_node = queue.per_node.get(node).copied().unwrap_or(0);
        if queue.total >= MAX_WAITING
            || from_node >= MAX_WAITING_PER_NODE
            || (record && queue.records >= MAX_WAITING_RECORDS)
        {
            self.metrics.count(label, WaitOutcome::full, 1);
            return Err(NoWait::Full);
        }
        let node: Arc<str> = match queue.per_node.get_key_value(node) {
            Some((known, _)) => known.clone(),
            None => node.into(),
        };
        queue.per_node.insert(node.clone(), from_node + 1);
        queue.observations.extend(key);
        queue.entries.push_back(Entry {
            node,
            until_ms,
            what,
        });
        queue.total += 1;
        queue.records += usize::from(record);
        self.len.store(queue.total, Ordering::Relaxed);
        self.records.store(queue.records, Ordering::Relaxed);
        self.metrics.count(label, WaitOutcome::waits, 1);
        self.metrics.waiting(label).inc();
        Ok((until_ms, true))
    }

    /// The right to take entries out ([`Waiting::take_decided`]) and decide them, held until they
    /// are: a flush that settles must not start writing while another thread has entries out but not
    /// merged yet (it would write without them, and acknowledge their batches). `wait: false` (a
    /// batch's look): `None` when someone else settles.
    pub fn settling(&self, wait: bool) -> Option<MutexGuard<'_, ()>> {
        if wait {
            Some(self.settling.lock().unwrap_or_else(|p| p.into_inner()))
        } else {
            self.settling.try_lock().ok()
        }
    }

    /// Whether a batch arriving at `now_ms` should look at the records waiting for their pod
    /// ([`Look::Batch`]): some do and no batch looked in the last [`RETRY_EVERY_MS`]. Claims the look.
    pub fn due(&self, now_ms: i64) -> bool {
        if self.records.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let last = self.last_try_ms.load(Ordering::Relaxed);
        now_ms.saturating_sub(last) >= RETRY_EVERY_MS
            && self
                .last_try_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Takes out what `index` now places and what is out of grace at `now_ms` (`i64::MAX`: on the way
    /// out, everything), of what `look` looks at; the rest keeps waiting, in order. Resolves outside
    /// the queue's lock: batches keep queuing meanwhile.
    pub fn take_decided(&self, index: &Index, now_ms: i64, look: Look) -> Decided {
        // What the waiting observations teach stays behind: a repeat arriving meanwhile is one.
        let entries =
            std::mem::take(&mut self.queue.lock().unwrap_or_else(|p| p.into_inner()).entries);
        let mut decided = Decided::default();
        let mut left = Vec::new();
        let mut still = VecDeque::with_capacity(entries.len());
        for entry in entries {
            let record = matches!(entry.what, Waiter::Record(_));
            if look == Look::Batch && !record {
                still.push_back(entry);
                continue;
            }
            let placed = entry.what.placed(index, &self.cluster_cidrs);
            if !placed && now_ms < entry.until_ms {
                still.push_back(entry);
                continue;
            }
            let label = entry.what.label();
            match (placed, record && now_ms == i64::MAX) {
                (true, _) => self.metrics.count(label, WaitOutcome::placed, 1),
                // Not refused: left to their agents to send again.
                (false, true) => {}
                (false, false) => self.metrics.count(label, WaitOutcome::expired, 1),
            }
            self.metrics.waiting(label).dec();
            left.push((entry.node.clone(), LearnKey::of(&entry.what), record));
            match entry.what {
                Waiter::Record(early) => decided.records.push((*early, placed)),
                Waiter::Observation(obs) => {
                    let flows = index.flows(&obs.connection());
                    decided.observations.push((obs, flows));
                }
                Waiter::Evidence(e) => decided.evidence.push(e),
            }
        }
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        for (node, key, record) in &left {
            queue.left(node, key.as_ref(), *record);
        }
        // Entries queued meanwhile are newer: they go after the ones that keep waiting.
        let newer = std::mem::replace(&mut queue.entries, still);
        queue.entries.extend(newer);
        self.len.store(queue.total, Ordering::Relaxed);
        self.records.store(queue.records, Ordering::Relaxed);
        decided
    }
}

#[cfg(test)]
mod tests;
