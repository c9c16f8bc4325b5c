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
//! bounded: past [`MAX_WAITING`] the oldest is decided at once.
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

use crate::cluster::index::{FlowEnd, Index};
use crate::learn::{self, NoFlow, Opened, ReportedConnection, WorkloadFlow};
use ipnet::IpNet;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Mutex;

/// The default grace, in milliseconds.
pub const DEFAULT_GRACE_MS: i64 = 30_000;

/// At most this many observations wait (about 100 bytes each).
pub const MAX_WAITING: usize = 100_000;

/// What an observation resolves to.
pub type Resolution = Result<Vec<WorkloadFlow>, NoFlow>;

/// Whether a resolution might improve once the index catches up: it failed, or a peer is an external
/// address that a pod or Service could still turn out to have: any address when `cluster_cidrs` is
/// empty (the ranges are not known), else only one inside them.
pub fn may_improve(resolution: &Resolution, opened: Opened, cluster_cidrs: &[IpNet]) -> bool {
    let in_cluster =
        |ip: &IpAddr| cluster_cidrs.is_empty() || cluster_cidrs.iter().any(|c| c.contains(ip));
    match resolution {
        Err(_) => true,
        Ok(flows) => flows.iter().any(|f| {
            let peer = match opened {
                Opened::Outbound => &f.destination,
                Opened::Inbound => &f.source,
            };
            matches!(peer, FlowEnd::External(ip) if in_cluster(ip))
        }),
    }
}

struct Waiting {
    obs: ReportedConnection,
    until_ms: i64,
}

/// What [`Deferrals`] decided about observations: learn these now.
#[derive(Debug, Default)]
pub struct Decided {
    /// Observations to merge, with their resolution.
    pub ready: Vec<(ReportedConnection, Resolution)>,
    /// How many of them the index caught up with.
    pub resolved: u64,
    /// How many of them ran out of grace.
    pub expired: u64,
}

/// The waiting observations (see the module docs).
pub struct Deferrals {
    grace_ms: i64,
    cluster_cidrs: Vec<IpNet>,
    waiting: Mutex<VecDeque<Waiting>>,
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
            waiting: Mutex::new(VecDeque::new()),
        }
    }

    /// The same, with the ranges the cluster gives pods and Services: external addresses outside them
    /// are learned at once (see the module docs).
    pub fn with_cluster_cidrs(mut self, cidrs: Vec<IpNet>) -> Self {
        self.cluster_cidrs = cidrs;
        self
    }

    /// Number of observations waiting.
    pub fn len(&self) -> usize {
        self.waiting.lock().expect("deferrals lock").len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Resolves `obs` against `index` at `now_ms`: `Some` to learn it now, `None` when it waits (it
    /// comes back from [`Deferrals::settle`]). When the queue is full, the oldest waiting observation
    /// is decided instead and returned in `overflow`.
    pub fn admit(
        &self,
        index: &Index,
        obs: &ReportedConnection,
        now_ms: i64,
        overflow: &mut Vec<(ReportedConnection, Resolution)>,
    ) -> Option<Resolution> {
        let resolution = learn::flows(index, obs);
        if self.grace_ms == 0 || !may_improve(&resolution, obs.opened, &self.cluster_cidrs) {
            return Some(resolution);
        }
        let mut waiting = self.waiting.lock().expect("deferrals lock");
        if waiting.len() >= MAX_WAITING
            && let Some(oldest) = waiting.pop_front()
        {
            let r = learn::flows(index, &oldest.obs);
            overflow.push((oldest.obs, r));
        }
        waiting.push_back(Waiting {
            obs: obs.clone(),
            until_ms: now_ms.saturating_add(self.grace_ms),
        });
        None
    }

    /// How long an observation may wait, in milliseconds.
    pub fn grace_ms(&self) -> i64 {
        self.grace_ms
    }

    /// Resolves every waiting observation again: those the index now places, and those whose grace
    /// is over, are returned to be learned; the others keep waiting.
    pub fn settle(&self, index: &Index, now_ms: i64) -> Decided {
        let batch = std::mem::take(&mut *self.waiting.lock().expect("deferrals lock"));
        let mut decided = Decided::default();
        let mut still = VecDeque::new();
        for w in batch {
            let resolution = learn::flows(index, &w.obs);
            if !may_improve(&resolution, w.obs.opened, &self.cluster_cidrs) {
                decided.resolved += 1;
                decided.ready.push((w.obs, resolution));
            } else if now_ms >= w.until_ms {
                decided.expired += 1;
                decided.ready.push((w.obs, resolution));
            } else {
                still.push_back(w);
            }
        }
        let mut waiting = self.waiting.lock().expect("deferrals lock");
        // Observations admitted meanwhile are newer: they go after the ones that keep waiting.
        let newer = std::mem::replace(&mut *waiting, still);
        waiting.extend(newer);
        decided
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let mut overflow = Vec::new();
        let obs = inbound_from("10.0.0.3", 1_000);
        assert!(
            deferrals
                .admit(&index, &obs, 1_000, &mut overflow)
                .is_none(),
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
        assert!(overflow.is_empty());
    }

    #[test]
    fn a_real_external_address_is_learned_once_the_grace_is_over() {
        let mut index = Index::default();
        index.apply_pod(&pod("api", "10.0.0.2"), 0);
        let deferrals = Deferrals::new(30_000);
        let mut overflow = Vec::new();
        assert!(
            deferrals
                .admit(&index, &inbound_from("203.0.113.9", 0), 0, &mut overflow)
                .is_none()
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
        let mut overflow = Vec::new();
        let waits = Deferrals::new(30_000);
        assert!(
            waits
                .admit(&index, &inbound_from("10.0.0.3", 0), 0, &mut overflow)
                .is_some()
        );
        let never = Deferrals::new(0);
        assert!(
            never
                .admit(&index, &inbound_from("203.0.113.9", 0), 0, &mut overflow)
                .is_some()
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
        let mut overflow = Vec::new();
        // Outside the cluster's ranges: no pod or Service can have it, learned at once.
        let outside = deferrals.admit(&index, &inbound_from("203.0.113.9", 0), 0, &mut overflow);
        assert_eq!(
            outside.map(|r| peer_of(&r)),
            Some(FlowEnd::External("203.0.113.9".parse().unwrap()))
        );
        // Inside a pod range or the Service range: a pod or Service not listed yet may have it.
        for peer in ["10.0.0.3", "10.96.7.7"] {
            assert!(
                deferrals
                    .admit(&index, &inbound_from(peer, 0), 0, &mut overflow)
                    .is_none(),
                "{peer} must wait"
            );
        }
        assert_eq!(deferrals.len(), 2);
    }
}
