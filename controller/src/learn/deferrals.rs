//! Observations the index cannot place yet wait a little before they are learned (docs/behaviour.md
//! §1.3, "Waiting for the index").
//!
//! A new pod sends its first packets before its IP reaches the API server (the kubelet reports the pod
//! IP after the sandbox is up, its containers may already be talking), and agents report within a
//! second or two. Learned at once, such a peer resolves to no pod and becomes an `ipBlock` /32 rule for
//! a pod IP: wrong, and never removed. The same holds for a Service whose backends are not listed yet.
//! (A record whose local pod the controller's watch has not delivered yet waits at ingest, before it
//! becomes an observation: [`crate::ingest::early_records`].)
//!
//! So an observation that resolves to an external address, or not at all, waits up to the grace
//! (`--resolution-grace-seconds`, default 30 s) and is resolved again before every flush; it is learned
//! as soon as the index places it, or, once the grace is over, as it resolves then (a real external
//! address becomes its /32 rule; a pod that never appeared is counted as unresolved). The queue is
//! bounded: past [`MAX_WAITING`] the oldest is decided at once. A repeat of an observation that waits
//! already (agents send a connection again every flush) takes no place: it is learned with it
//! (`deferred_repeat`).
//!
//! Outcomes are counted in `network_enforcer_controller_resolutions_total{outcome}`: `deferred` when
//! one starts waiting, `deferred_resolved` when the index caught up, `deferred_expired` when the grace
//! ran out.
//!
//! With `--cluster-cidrs` (the ranges the cluster gives pods and Services) an external address outside
//! them does not wait: no pod or Service the index has not seen yet can have it, so waiting cannot
//! change how it resolves, and its batch is acknowledged at the next flush instead of after the grace.
//!
//! An agent batch with a waiting record is acknowledged only after a flush that started once its grace
//! was over (by then it was learned and written), so a controller restart within the grace loses
//! nothing: the agent sends it again.
//!
//! **Evidence waits here too** (docs/behaviour.md §3.2). A blocked connection whose peer is such an
//! address (a new pod's first SYN, refused by a node that had not learned the pod's address yet)
//! would be judged as that bare address: a violation the policy does not make. So its evidence
//! ([`Evidence::may_wait_for_peer`]) waits in the same queue, with the same grace and bound, and is
//! handed on to the evidence pass ([`Decided::evidence`]) once the index places its peer or the grace
//! is over; the pass judges it as the index then resolves it. One queue, so one bound, one settling
//! before every flush and one rule for acknowledgements.

use crate::FastSet;
use crate::cluster::index::{Connection, End, FlowEnd, Flows, Index, NoFlow, Opened};
use crate::ingest::evidence::Evidence;
use crate::learn::{self, ReportedConnection, Reporter, WorkloadFlow};
use ipnet::IpNet;
use network_enforcer_api::Protocol;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The default grace, in milliseconds.
pub const DEFAULT_GRACE_MS: i64 = 30_000;

/// At most this many observations and evidence wait (about 100 bytes each).
pub const MAX_WAITING: usize = 100_000;

/// What an observation resolves to.
pub type Resolution = Result<Vec<WorkloadFlow>, NoFlow>;

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

struct Waiting {
    what: Waiter,
    until_ms: i64,
}

/// The waiting entries, and what the waiting observations teach.
#[derive(Default)]
struct Queue {
    entries: VecDeque<Waiting>,
    /// Agents send a connection again every flush while it lasts: a repeat of an observation that
    /// waits already waits in its place, instead of taking a place of its own (a few busy nodes
    /// would otherwise fill [`MAX_WAITING`] with repeats within the grace, and push out a new pod's
    /// first record before the index knows the pod).
    observations: FastSet<LearnKey>,
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
    fn of(obs: &ReportedConnection) -> Self {
        Self {
            local: Arc::as_ptr(&obs.local) as usize,
            peer: obs.peer,
            port: obs.port,
            protocol: obs.protocol,
            opened: obs.opened,
            reporter: obs.reporter,
            peer_name: obs.peer_name.clone(),
        }
    }
}

/// What [`Deferrals::admit`] made of an observation.
#[derive(Debug, PartialEq)]
pub enum Admitted {
    /// Learn it now, as it resolves.
    Now(Resolution),
    /// It waits (it comes back from [`Deferrals::settle`]).
    Waits,
    /// The same observation waits already: this one is learned with it.
    Repeat,
}

/// What waits for the index.
enum Waiter {
    /// An observation, to learn.
    Learn(ReportedConnection),
    /// Evidence of a blocked connection, to hand on to the evidence pass.
    Evidence(Evidence),
}

impl Waiter {
    /// What it teaches: `None` for evidence (each is an occurrence of its own).
    fn key(&self) -> Option<LearnKey> {
        match self {
            Waiter::Learn(obs) => Some(LearnKey::of(obs)),
            Waiter::Evidence(_) => None,
        }
    }

    /// The connection it reports.
    fn connection(&self) -> Connection<'_> {
        match self {
            Waiter::Learn(obs) => obs.connection(),
            Waiter::Evidence(e) => e.record.connection(),
        }
    }
}

/// What [`Deferrals`] decided: learn these observations now, hand this evidence on now.
#[derive(Debug, Default)]
pub struct Decided {
    /// Observations to merge, with their resolution.
    pub ready: Vec<(ReportedConnection, Resolution)>,
    /// How many of them the index caught up with.
    pub resolved: u64,
    /// How many of them ran out of grace (or of room in the queue).
    pub expired: u64,
    /// Evidence to hand on, marked [`Evidence::waited_for_peer`]; the pass resolves it again.
    pub evidence: Vec<Evidence>,
    /// How many of them the index caught up with.
    pub evidence_resolved: u64,
    /// How many of them ran out of grace (or of room in the queue).
    pub evidence_expired: u64,
}

impl Decided {
    /// Takes `what`, whose connection resolves to `flows`: placed by the index (`resolved`), or out
    /// of time.
    fn take(&mut self, what: Waiter, flows: Result<Flows, NoFlow>, resolved: bool) {
        match what {
            Waiter::Learn(obs) => {
                let resolution = learn::workload_flows(flows, &obs);
                if resolved {
                    self.resolved += 1;
                } else {
                    self.expired += 1;
                }
                self.ready.push((obs, resolution));
            }
            Waiter::Evidence(evidence) => {
                if resolved {
                    self.evidence_resolved += 1;
                } else {
                    self.evidence_expired += 1;
                }
                self.evidence.push(evidence);
            }
        }
    }
}

/// The waiting observations and evidence (see the module docs).
pub struct Deferrals {
    grace_ms: i64,
    cluster_cidrs: Vec<IpNet>,
    waiting: Mutex<Queue>,
}

impl Default for Deferrals {
    fn default() -> Self {
        Self::new(DEFAULT_GRACE_MS)
    }
}

impl Deferrals {
    /// Observations wait up to `grace_ms` (0: nothing waits, everything is learned as it resolves).
    pub fn new(grace_ms: i64) -> Self {
        Self {
            grace_ms: grace_ms.max(0),
            cluster_cidrs: Vec::new(),
            waiting: Mutex::default(),
        }
    }

    /// The same, with the ranges the cluster gives pods and Services: external addresses outside them
    /// are learned at once (see the module docs).
    pub fn with_cluster_cidrs(mut self, cidrs: Vec<IpNet>) -> Self {
        self.cluster_cidrs = cidrs;
        self
    }

    /// Number of observations and evidence waiting.
    pub fn len(&self) -> usize {
        self.waiting.lock().expect("deferrals lock").entries.len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves `obs` against `index` at `now_ms`: to learn now, or to wait. When the queue is full,
    /// the oldest waiting one is decided instead and added to `overflow`.
    pub fn admit(
        &self,
        index: &Index,
        obs: &ReportedConnection,
        now_ms: i64,
        overflow: &mut Decided,
    ) -> Admitted {
        let flows = index.flows(&obs.connection());
        if self.grace_ms == 0 || !may_improve(&flows, obs.opened, &self.cluster_cidrs) {
            return Admitted::Now(learn::workload_flows(flows, obs));
        }
        match self.wait(index, Waiter::Learn(obs.clone()), now_ms, overflow) {
            true => Admitted::Waits,
            false => Admitted::Repeat,
        }
    }

    /// [`Deferrals::admit`] for violation evidence: `Some` to hand it on now, `None` when it waits
    /// (it comes back from [`Deferrals::settle`] in [`Decided::evidence`]). Only evidence that
    /// [`Evidence::may_wait_for_peer`] waits, and only when its peer resolves as an observation's
    /// would wait.
    pub fn admit_evidence(
        &self,
        index: &Index,
        evidence: Evidence,
        now_ms: i64,
        overflow: &mut Decided,
    ) -> Option<Evidence> {
        if self.grace_ms == 0 || !evidence.may_wait_for_peer() {
            return Some(evidence);
        }
        let flows = index.flows(&evidence.record.connection());
        if !may_improve(&flows, evidence.record.opened, &self.cluster_cidrs) {
            return Some(evidence);
        }
        let evidence = Evidence {
            waited_for_peer: true,
            ..evidence
        };
        // Evidence has no key: it is always queued.
        self.wait(index, Waiter::Evidence(evidence), now_ms, overflow);
        None
    }

    /// Queues `what` until the grace from `now_ms` is over; past [`MAX_WAITING`] the oldest is
    /// decided now, into `overflow`. `false`: `what` repeats an observation that waits already, and
    /// is not queued (checked under the same lock as the queuing, so two batches cannot both queue
    /// one observation).
    fn wait(&self, index: &Index, what: Waiter, now_ms: i64, overflow: &mut Decided) -> bool {
        let key = what.key();
        let mut waiting = self.waiting.lock().expect("deferrals lock");
        if key
            .as_ref()
            .is_some_and(|k| waiting.observations.contains(k))
        {
            return false;
        }
        if waiting.entries.len() >= MAX_WAITING
            && let Some(oldest) = waiting.entries.pop_front()
        {
            if let Some(key) = oldest.what.key() {
                waiting.observations.remove(&key);
            }
            let flows = index.flows(&oldest.what.connection());
            overflow.take(oldest.what, flows, false);
        }
        waiting.observations.extend(key);
        waiting.entries.push_back(Waiting {
            what,
            until_ms: now_ms.saturating_add(self.grace_ms),
        });
        true
    }

    /// How long an observation may wait, in milliseconds.
    pub fn grace_ms(&self) -> i64 {
        self.grace_ms
    }

    /// Resolves every waiting observation and evidence again: those the index now places, and those
    /// whose grace is over, are returned; the others keep waiting.
    pub fn settle(&self, index: &Index, now_ms: i64) -> Decided {
        // What the waiting observations teach stays behind: a repeat arriving meanwhile is one.
        let batch = std::mem::take(&mut self.waiting.lock().expect("deferrals lock").entries);
        let mut decided = Decided::default();
        let mut left = FastSet::default();
        let mut still = VecDeque::new();
        for w in batch {
            let connection = w.what.connection();
            let flows = index.flows(&connection);
            let resolved = !may_improve(&flows, connection.opened, &self.cluster_cidrs);
            if resolved || now_ms >= w.until_ms {
                left.extend(w.what.key());
                decided.take(w.what, flows, resolved);
            } else {
                still.push_back(w);
            }
        }
        let mut waiting = self.waiting.lock().expect("deferrals lock");
        waiting.observations.retain(|key| !left.contains(key));
        // Observations admitted meanwhile are newer: they go after the ones that keep waiting.
        let newer = std::mem::replace(&mut waiting.entries, still);
        waiting.entries.extend(newer);
        decided
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingest::evidence::EvidenceKind;
    use crate::ingest::flow_record::Decoded;
    use k8s_openapi::api::core::v1::Pod;
    use network_enforcer_api::Protocol;

    fn pod(name: &str, ip: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": name, "uid": format!("uid-{name}"),
                         "labels": {"app": name}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}
        }))
        .unwrap()
    }

    /// A connection to the `api` pod (10.0.0.2), as ingest found that pod in the index.
    fn inbound_from(peer: &str, at_ms: i64) -> ReportedConnection {
        let mut index = Index::default();
        index.apply_pod(&pod("api", "10.0.0.2"), 0);
        ReportedConnection {
            local: index.pod("shop", "api").expect("indexed").clone(),
            peer: peer.parse().unwrap(),
            port: 8080,
            protocol: Protocol::TCP,
            opened: Opened::Inbound,
            at_ms,
            reporter: crate::learn::Reporter::Node,
            peer_name: Default::default(),
        }
    }

    impl Admitted {
        fn is_now(&self) -> bool {
            matches!(self, Admitted::Now(_))
        }
    }

    fn peer_of(r: &Resolution) -> FlowEnd {
        r.as_ref().unwrap()[0].source.clone()
    }

    #[test]
    fn a_pod_peer_the_index_learns_late_is_learned_as_that_pod_not_as_an_address() {
        let mut index = Index::default();
        index.apply_pod(&pod("api", "10.0.0.2"), 0);
        let deferrals = Deferrals::new(30_000);
        let mut overflow = Decided::default();
        let obs = inbound_from("10.0.0.3", 1_000);
        assert!(
            deferrals.admit(&index, &obs, 1_000, &mut overflow) == Admitted::Waits,
            "an address that is no pod yet waits"
        );
        assert_eq!(deferrals.len(), 1);
        // Nothing changed yet: it keeps waiting.
        let d = deferrals.settle(&index, 2_000);
        assert!(d.ready.is_empty());
        assert_eq!(deferrals.len(), 1);
        // The frontend's IP reaches the index.
        index.apply_pod(&pod("frontend", "10.0.0.3"), 3_000);
        let d = deferrals.settle(&index, 4_000);
        assert_eq!((d.resolved, d.expired), (1, 0));
        assert_eq!(d.ready.len(), 1);
        match peer_of(&d.ready[0].1) {
            FlowEnd::Workload(w) => assert_eq!(w.name, "frontend"),
            other => panic!("expected the frontend pod, got {other:?}"),
        }
        assert!(deferrals.is_empty());
        assert!(overflow.ready.is_empty());
    }

    /// `obs` as violation evidence of `kind`, as ingest hands it on.
    fn evidence_of(obs: &ReportedConnection, kind: EvidenceKind) -> Evidence {
        Evidence {
            kind,
            record: Decoded {
                local: obs.local.clone(),
                peer: obs.peer,
                peer_from: crate::ingest::flow_record::PeerFrom::Address,
                port: obs.port,
                protocol: obs.protocol,
                opened: obs.opened,
                at_ms: obs.at_ms,
                peer_name: Default::default(),
            },
            waited_for_peer: false,
            claim: None,
        }
    }

    #[test]
    fn blocked_evidence_waits_for_its_peer_in_the_same_queue_and_comes_back_marked() {
        let mut index = Index::default();
        index.apply_pod(&pod("api", "10.0.0.2"), 0);
        index.apply_pod(&pod("known", "10.0.0.4"), 0);
        let deferrals = Deferrals::new(30_000);
        let mut overflow = Decided::default();
        let blocked = |peer| evidence_of(&inbound_from(peer, 1_000), EvidenceKind::Blocked);
        // (evidence, waits)
        let cases = [
            (blocked("10.0.0.3"), true),
            (blocked("10.0.0.5"), true),
            // A known pod is judged at once; so is a connection that went through.
            (blocked("10.0.0.4"), false),
            (
                evidence_of(&inbound_from("10.0.0.3", 1_000), EvidenceKind::WentThrough),
                false,
            ),
        ];
        for (evidence, waits) in cases {
            let now = deferrals.admit_evidence(&index, evidence.clone(), 1_000, &mut overflow);
            assert_eq!(now.is_none(), waits, "{evidence:?}");
            if let Some(now) = now {
                assert_eq!(now, evidence, "handed on unchanged");
            }
        }
        assert_eq!(deferrals.len(), 2);
        // With no grace nothing waits.
        let never = Deferrals::new(0);
        assert!(
            never
                .admit_evidence(&index, blocked("10.0.0.3"), 1_000, &mut overflow)
                .is_some()
        );

        // 10.0.0.3 becomes a pod; 10.0.0.5 does not, within the grace.
        index.apply_pod(&pod("frontend", "10.0.0.3"), 3_000);
        let d = deferrals.settle(&index, 4_000);
        assert_eq!((d.evidence_resolved, d.evidence_expired), (1, 0));
        assert!(d.ready.is_empty(), "evidence is not learned");
        assert_eq!(d.evidence.len(), 1);
        assert_eq!(d.evidence[0].record.peer.to_string(), "10.0.0.3");
        assert!(d.evidence[0].waited_for_peer);
        let d = deferrals.settle(&index, 31_000);
        assert_eq!((d.evidence_resolved, d.evidence_expired), (0, 1));
        assert_eq!(d.evidence[0].record.peer.to_string(), "10.0.0.5");
        assert!(deferrals.is_empty() && overflow.evidence.is_empty());
    }

    #[test]
    fn a_real_external_address_is_learned_once_the_grace_is_over() {
        let mut index = Index::default();
        index.apply_pod(&pod("api", "10.0.0.2"), 0);
        let deferrals = Deferrals::new(30_000);
        let mut overflow = Decided::default();
        assert!(
            deferrals.admit(&index, &inbound_from("203.0.113.9", 0), 0, &mut overflow)
                == Admitted::Waits
        );
        assert!(deferrals.settle(&index, 29_999).ready.is_empty());
        let d = deferrals.settle(&index, 30_000);
        assert_eq!((d.resolved, d.expired), (0, 1));
        assert_eq!(
            peer_of(&d.ready[0].1),
            FlowEnd::External("203.0.113.9".parse().unwrap())
        );
    }

    #[test]
    fn pods_known_at_once_never_wait_and_no_grace_means_no_waiting() {
        let mut index = Index::default();
        index.apply_pod(&pod("api", "10.0.0.2"), 0);
        index.apply_pod(&pod("frontend", "10.0.0.3"), 0);
        let mut overflow = Decided::default();
        let waits = Deferrals::new(30_000);
        assert!(
            waits
                .admit(&index, &inbound_from("10.0.0.3", 0), 0, &mut overflow)
                .is_now()
        );
        let never = Deferrals::new(0);
        assert!(
            never
                .admit(&index, &inbound_from("203.0.113.9", 0), 0, &mut overflow)
                .is_now()
        );
        assert!(waits.is_empty() && never.is_empty());
    }

    #[test]
    fn with_cluster_cidrs_only_addresses_inside_them_wait() {
        let mut index = Index::default();
        index.apply_pod(&pod("api", "10.0.0.2"), 0);
        let deferrals = Deferrals::new(30_000).with_cluster_cidrs(vec![
            "10.0.0.0/16".parse().unwrap(),
            "10.96.0.0/12".parse().unwrap(),
        ]);
        let mut overflow = Decided::default();
        // Outside the cluster's ranges: no pod or Service can have it, learned at once.
        let outside = deferrals.admit(&index, &inbound_from("203.0.113.9", 0), 0, &mut overflow);
        let Admitted::Now(outside) = outside else {
            panic!("{outside:?}: learned at once");
        };
        assert_eq!(
            peer_of(&outside),
            FlowEnd::External("203.0.113.9".parse().unwrap())
        );
        // Inside a pod range or the Service range: a pod or Service not listed yet may have it.
        for peer in ["10.0.0.3", "10.96.7.7"] {
            assert!(
                deferrals.admit(&index, &inbound_from(peer, 0), 0, &mut overflow)
                    == Admitted::Waits,
                "{peer} must wait"
            );
        }
        assert_eq!(deferrals.len(), 2);
    }

    #[test]
    fn a_repeat_of_a_waiting_observation_waits_in_its_place() {
        let mut index = Index::default();
        index.apply_pod(&pod("api", "10.0.0.2"), 0);
        let deferrals = Deferrals::new(30_000);
        let mut overflow = Decided::default();
        let obs = inbound_from("10.0.0.3", 0);
        assert_eq!(
            deferrals.admit(&index, &obs, 0, &mut overflow),
            Admitted::Waits
        );
        // Every flush of its agent sends it again while the connection lasts.
        for at in 1..1_000 {
            let again = ReportedConnection {
                at_ms: at,
                ..obs.clone()
            };
            assert_eq!(
                deferrals.admit(&index, &again, at, &mut overflow),
                Admitted::Repeat
            );
        }
        assert_eq!(deferrals.len(), 1, "one place for one observation");
        // Another port, another reporter: not repeats.
        let other_port = ReportedConnection {
            port: 9090,
            ..obs.clone()
        };
        let other_reporter = ReportedConnection {
            reporter: crate::learn::Reporter::Cluster,
            ..obs.clone()
        };
        for other in [other_port, other_reporter] {
            assert_eq!(
                deferrals.admit(&index, &other, 1_000, &mut overflow),
                Admitted::Waits
            );
        }
        assert_eq!(deferrals.len(), 3);
        // Decided once; after that it waits anew.
        let d = deferrals.settle(&index, 30_000);
        assert_eq!((d.resolved, d.expired), (0, 1));
        assert_eq!(
            deferrals.admit(&index, &obs, 30_000, &mut overflow),
            Admitted::Waits
        );
        assert!(overflow.ready.is_empty(), "nothing overflowed");
    }
}
