//! Who the local side of an edge is, as a pure state machine over plain data: the pod watch feeds it
//! pods (UID, namespace, name, IPs), the `/proc` + cgroup scans ([`crate::identity::pod_identity`]) feed it network
//! namespaces and cgroups, and [`Attributor::resolve`] answers for a (netns, cgroup, local IP, time).
//! This is the agent's only attribution path.
//!
//! Rules, in order:
//! - a socket in a pod's own network namespace (known from a scan) is that pod's;
//! - a socket in a namespace no scan knows (the pod ended before the scan, or started after it, or the scan
//!   could not read it) is the pod whose cgroup created it, else the pod that held its local IP at the
//!   event's time, from the pod watch's short IP history;
//! - a socket in the host namespace is a hostNetwork pod's when its cgroup is a pod's, else the host's;
//! - anything else is [`Owner::Unknown`] (counted by the caller, never guessed).
//!
//! Pods deleted mid-flow stay resolvable for [`Attributor::retention`] (tombstones), so the edges they
//! made before dying are still named at the next flush. Each IP keeps a short history of which pod held
//! it when ([`IP_HISTORY`] leases), so an IP reused by a new pod does not rename the old pod's edges.
//! Everything is bounded: tombstones and closed leases expire after the retention, and at most
//! [`MAX_TOMBSTONES`] deleted pods are kept.
//!
//! Times are kernel CLOCK_MONOTONIC durations, the clock events carry, so leases and events compare
//! directly. The pod watch sees a pod's IP a moment after the pod may already have used it: a lease
//! also covers [`LEASE_GRACE`] before it opened, unless that overlaps another lease (then the event is
//! ambiguous and unknown).

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// Leases remembered per IP (the current one and the last few holders).
pub const IP_HISTORY: usize = 4;
/// How far before a lease's start an event may be and still count as the lease holder's.
pub const LEASE_GRACE: Duration = Duration::from_secs(30);
/// Deleted pods kept at most, oldest dropped first.
pub const MAX_TOMBSTONES: usize = 4096;
/// How long deleted pods, closed leases and scan results no longer seen are kept by default.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(120);

/// A pod on this node as the watch reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `status.podIPs` (empty until the pod has its sandbox).
    pub ips: Vec<IpAddr>,
    /// `spec.hostNetwork`: its IPs are the node's, and never leased.
    pub host_network: bool,
}

/// The local side's pod, as far as it is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// The pod's UID (always known).
    pub uid: Arc<str>,
    /// Namespace and name, when the pod watch knows the UID.
    pub name: Option<(Arc<str>, Arc<str>)>,
    /// The socket is in the host network namespace (a hostNetwork pod).
    pub host_network: bool,
}

impl PodRef {
    /// `namespace/name` when known, else `uid:<UID>`.
    pub fn label(&self) -> String {
        match &self.name {
            Some((ns, name)) => format!("{ns}/{name}"),
            None => format!("uid:{}", self.uid),
        }
    }
}

/// Who an edge's local side is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// A pod of this node.
    Pod(PodRef),
    /// The node itself.
    Host,
    /// Not attributable: counted, never guessed.
    Unknown,
}

/// Counters of what the state machine had to decide around.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttributionStats {
    /// Pods removed because the watch said so, or because a relist no longer had them.
    pub pods_deleted: u64,
    /// An IP passed from one pod to another (the previous lease was closed by the new holder).
    pub ip_reassigned: u64,
    /// Deleted pods dropped early because more than [`MAX_TOMBSTONES`] were held.
    pub tombstones_dropped: u64,
}

struct Entry {
    pod: Arc<PodMeta>,
    ips: Vec<IpAddr>,
    /// When the pod was deleted (a tombstone), or `None` while it exists.
    deleted_at: Option<Duration>,
}

/// Namespace and name of a UID, shared by every [`PodRef`] that names it.
#[derive(Debug)]
struct PodMeta {
    uid: Arc<str>,
    namespace: Arc<str>,
    name: Arc<str>,
}

#[derive(Clone, Debug)]
struct Lease {
    uid: Arc<str>,
    from: Duration,
    until: Option<Duration>,
}

struct Seen {
    uid: Arc<str>,
    last_seen: Duration,
}

/// The attribution state; see the module documentation.
pub struct Attributor {
    pods: HashMap<Arc<str>, Entry>,
    leases: HashMap<IpAddr, VecDeque<Lease>>,
    host_netns: Option<u32>,
    netns: HashMap<u32, Seen>,
    cgroups: HashMap<u64, Seen>,
    relisted: Option<HashSet<Arc<str>>>,
    retention: Duration,
    stats: AttributionStats,
    watching: bool,
}

impl Default for Attributor {
    fn default() -> Self {
        Self::new(DEFAULT_RETENTION)
    }
}

impl Attributor {
    /// Empty state keeping deleted pods, closed leases and vanished namespaces for `retention`.
    pub fn new(retention: Duration) -> Self {
        Self {
            pods: HashMap::new(),
            leases: HashMap::new(),
            host_netns: None,
            netns: HashMap::new(),
            cgroups: HashMap::new(),
            relisted: None,
            retention,
            stats: AttributionStats::default(),
            watching: false,
        }
    }

    /// How long deleted pods and closed leases are kept.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// What happened so far.
    pub fn stats(&self) -> AttributionStats {
        self.stats
    }

    /// Pods that exist (tombstones not counted).
    pub fn live_pods(&self) -> usize {
        self.pods
            .values()
            .filter(|e| e.deleted_at.is_none())
            .count()
    }

    /// Whether a pod watch has delivered a complete list at least once (else records carry UIDs only).
    pub fn watching(&self) -> bool {
        self.watching
    }

    /// A pod was added or changed at `now`.
    pub fn apply(&mut self, pod: PodInfo, now: Duration) {
        let uid: Arc<str> = pod.uid.as_str().into();
        if let Some(seen) = &mut self.relisted {
            seen.insert(uid.clone());
        }
        let ips: Vec<IpAddr> = if pod.host_network {
            Vec::new()
        } else {
            pod.ips.iter().map(|ip| ip.to_canonical()).collect()
        };
        let old_ips = match self.pods.get(&uid) {
            Some(e) if e.deleted_at.is_none() => e.ips.clone(),
            _ => Vec::new(),
        };
        for ip in old_ips.iter().filter(|ip| !ips.contains(ip)) {
            self.close_lease(*ip, &uid, now);
        }
        for ip in ips.iter().filter(|ip| !old_ips.contains(ip)) {
            self.open_lease(*ip, &uid, now);
        }
        let meta = Arc::new(PodMeta {
            uid: uid.clone(),
            namespace: pod.namespace.into(),
            name: pod.name.into(),
        });
        self.pods.insert(
            uid,
            Entry {
                pod: meta,
                ips,
                deleted_at: None,
            },
        );
    }

    /// A pod was deleted at `now`: it stays resolvable as a tombstone for the retention.
    pub fn delete(&mut self, uid: &str, now: Duration) {
        let Some(entry) = self.pods.get_mut(uid) else {
            return;
        };
        if entry.deleted_at.is_some() {
            return;
        }
        entry.deleted_at = Some(now);
        let (uid, ips) = (entry.pod.uid.clone(), std::mem::take(&mut entry.ips));
        self.stats.pods_deleted += 1;
        for ip in ips {
            self.close_lease(ip, &uid, now);
        }
    }

    /// The watch starts a full list (after a start or a watch error); pods it does not list again are
    /// deleted at [`Attributor::relist_done`].
    pub fn relist_start(&mut self) {
        self.relisted = Some(HashSet::new());
    }

    /// The full list is complete.
    pub fn relist_done(&mut self, now: Duration) {
        let Some(seen) = self.relisted.take() else {
            return;
        };
        let gone: Vec<Arc<str>> = self
            .pods
            .iter()
            .filter(|(uid, e)| e.deleted_at.is_none() && !seen.contains(*uid))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in gone {
            self.delete(&uid, now);
        }
        self.watching = true;
    }

    fn open_lease(&mut self, ip: IpAddr, uid: &Arc<str>, now: Duration) {
        let history = self.leases.entry(ip).or_default();
        for lease in history.iter_mut().filter(|l| l.until.is_none()) {
            if lease.uid != *uid {
                // The watch can report the new holder before the old one's deletion.
                lease.until = Some(now);
                self.stats.ip_reassigned += 1;
            }
        }
        history.push_back(Lease {
            uid: uid.clone(),
            from: now,
            until: None,
        });
        while history.len() > IP_HISTORY {
            history.pop_front();
        }
    }

    fn close_lease(&mut self, ip: IpAddr, uid: &str, now: Duration) {
        if let Some(history) = self.leases.get_mut(&ip) {
            for lease in history
                .iter_mut()
                .filter(|l| l.until.is_none() && &*l.uid == uid)
            {
                lease.until = Some(now);
            }
        }
    }

    /// Takes in a scan of the node's pod network namespaces and cgroups made at `now`. Entries no longer
    /// in a scan are kept for the retention (a pod that just ended still names its late events).
    pub fn observe_scan<'a>(
        &mut self,
        host_netns: u32,
        netns: impl IntoIterator<Item = (u32, &'a str)>,
        cgroups: impl IntoIterator<Item = (u64, &'a str)>,
        now: Duration,
    ) {
        self.host_netns = Some(host_netns);
        let intern = |pods: &HashMap<Arc<str>, Entry>, uid: &str| -> Arc<str> {
            pods.get(uid)
                .map_or_else(|| uid.into(), |e| e.pod.uid.clone())
        };
        for (ns, uid) in netns {
            let uid = intern(&self.pods, uid);
            self.netns.insert(
                ns,
                Seen {
                    uid,
                    last_seen: now,
                },
            );
        }
        for (cg, uid) in cgroups {
            let uid = intern(&self.pods, uid);
            self.cgroups.insert(
                cg,
                Seen {
                    uid,
                    last_seen: now,
                },
            );
        }
    }

    /// Whether a scan knows this namespace (or it is the host's): when not, a new scan may help.
    pub fn knows_netns(&self, netns: Option<u32>) -> bool {
        match netns {
            None => true,
            Some(ns) => Some(ns) == self.host_netns || self.netns.contains_key(&ns),
        }
    }

    /// Forgets tombstones, closed leases and scan entries older than the retention.
    pub fn expire(&mut self, now: Duration) {
        let keep = |t: Duration| now.saturating_sub(t) <= self.retention;
        self.pods.retain(|_, e| e.deleted_at.is_none_or(&keep));
        let mut tombstones: Vec<(Duration, Arc<str>)> = self
            .pods
            .iter()
            .filter_map(|(uid, e)| e.deleted_at.map(|t| (t, uid.clone())))
            .collect();
        if tombstones.len() > MAX_TOMBSTONES {
            tombstones.sort();
            let excess = tombstones.len() - MAX_TOMBSTONES;
            for (_, uid) in tombstones.into_iter().take(excess) {
                self.pods.remove(&uid);
                self.stats.tombstones_dropped += 1;
            }
        }
        self.leases.retain(|_, history| {
            history.retain(|l| l.until.is_none_or(&keep));
            !history.is_empty()
        });
        self.netns.retain(|_, s| keep(s.last_seen));
        self.cgroups.retain(|_, s| keep(s.last_seen));
    }

    fn pod_ref(&self, uid: &Arc<str>, host_network: bool) -> PodRef {
        PodRef {
            uid: uid.clone(),
            name: self
                .pods
                .get(uid)
                .map(|e| (e.pod.namespace.clone(), e.pod.name.clone())),
            host_network,
        }
    }

    /// The pod that held `ip` at time `at`, if exactly one did.
    pub fn pod_by_ip(&self, ip: IpAddr, at: Duration) -> Option<PodRef> {
        let history = self.leases.get(&ip.to_canonical())?;
        let covers = |l: &Lease, grace: Duration| {
            l.from.saturating_sub(grace) <= at && l.until.is_none_or(|u| at <= u)
        };
        let mut exact = history.iter().rev().filter(|l| covers(l, Duration::ZERO));
        // A lease closed exactly when the next opened: the newest holder.
        if let Some(last) = exact.next() {
            return Some(self.pod_ref(&last.uid, false));
        }
        let mut graced = history.iter().filter(|l| covers(l, LEASE_GRACE));
        let first = graced.next()?;
        // Two different pods within the grace: ambiguous.
        graced
            .all(|l| l.uid == first.uid)
            .then(|| self.pod_ref(&first.uid, false))
    }

    /// Whose a socket of a pod's network namespace is, known only by its cgroup and local IP (the
    /// kernel's packet hooks do not tell the namespace): the pod of its cgroup, else the pod that held
    /// the IP at `at`, else unknown. Never the host: a host socket has the node's IP, which no pod
    /// leases.
    pub fn resolve_socket(&self, cgroup: Option<u64>, local_ip: IpAddr, at: Duration) -> Owner {
        if let Some(seen) = cgroup.and_then(|c| self.cgroups.get(&c)) {
            return Owner::Pod(self.pod_ref(&seen.uid, false));
        }
        if local_ip.is_unspecified() || local_ip.is_loopback() {
            return Owner::Unknown;
        }
        self.pod_by_ip(local_ip, at)
            .map_or(Owner::Unknown, Owner::Pod)
    }

    /// Who a socket with this network namespace, cgroup and local IP was at kernel time `at`.
    pub fn resolve(
        &self,
        netns: Option<u32>,
        cgroup: Option<u64>,
        local_ip: IpAddr,
        at: Duration,
    ) -> Owner {
        match netns {
            Some(ns) if Some(ns) != self.host_netns => {
                if let Some(seen) = self.netns.get(&ns) {
                    return Owner::Pod(self.pod_ref(&seen.uid, false));
                }
                // A namespace the /proc scan could not read (without CAP_SYS_PTRACE, only processes
                // with no more capabilities than the agent's): the socket's cgroup is its creator's
                // container. A host process in a pod's namespace (a CNI plugin) has no pod cgroup.
                if let Some(seen) = cgroup.and_then(|c| self.cgroups.get(&c)) {
                    return Owner::Pod(self.pod_ref(&seen.uid, false));
                }
                if local_ip.is_unspecified() || local_ip.is_loopback() {
                    return Owner::Unknown;
                }
                self.pod_by_ip(local_ip, at)
                    .map_or(Owner::Unknown, Owner::Pod)
            }
            _ => match cgroup.and_then(|c| self.cgroups.get(&c)) {
                Some(seen) => Owner::Pod(self.pod_ref(&seen.uid, true)),
                None => Owner::Host,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaa-0000-0000-0000-000000000001";
    const B: &str = "bbbbbbbb-0000-0000-0000-000000000002";
    const HOST_NS: u32 = 1;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    fn pod(uid: &str, name: &str, ip: &str) -> PodInfo {
        PodInfo {
            uid: uid.into(),
            namespace: "shop".into(),
            name: name.into(),
            ips: vec![ip.parse().unwrap()],
            host_network: false,
        }
    }

    fn name_of(owner: &Owner) -> Option<String> {
        match owner {
            Owner::Pod(p) => Some(p.label()),
            _ => None,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn names_a_scanned_namespace_once_the_watch_knows_its_uid() {
        let mut at = Attributor::default();
        at.observe_scan(HOST_NS, [(10, A)], [], s(1));
        let before = at.resolve(Some(10), None, ip("10.1.0.5"), s(1));
        assert_eq!(name_of(&before).as_deref(), Some(&*format!("uid:{A}")));
        at.apply(pod(A, "web", "10.1.0.5"), s(2));
        let owner = at.resolve(Some(10), None, ip("10.1.0.5"), s(2));
        assert_eq!(name_of(&owner).as_deref(), Some("shop/web"));
        let Owner::Pod(p) = owner else { unreachable!() };
        assert_eq!(&*p.uid, A);
        assert!(!p.host_network);
    }

    #[test]
    fn host_namespace_goes_by_cgroup_then_host() {
        let mut at = Attributor::default();
        at.apply(
            PodInfo {
                host_network: true,
                ..pod(A, "node-exporter", "192.168.1.10")
            },
            s(1),
        );
        at.observe_scan(HOST_NS, [], [(99, A)], s(1));
        let owner = at.resolve(Some(HOST_NS), Some(99), ip("192.168.1.10"), s(1));
        assert_eq!(name_of(&owner).as_deref(), Some("shop/node-exporter"));
        assert!(matches!(
            owner,
            Owner::Pod(PodRef {
                host_network: true,
                ..
            })
        ));
        assert_eq!(
            at.resolve(Some(HOST_NS), Some(5), ip("192.168.1.10"), s(1)),
            Owner::Host
        );
        assert_eq!(
            at.resolve(None, None, ip("192.168.1.10"), s(1)),
            Owner::Host
        );
        assert_eq!(
            at.pod_by_ip(ip("192.168.1.10"), s(1)),
            None,
            "a hostNetwork pod's IP is the node's and names no pod"
        );
    }

    #[test]
    fn resolves_by_namespace_then_by_cgroup_on_the_host_network() {
        // Scan results only, no pod watch: owners carry UIDs only.
        let mut at = Attributor::default();
        at.observe_scan(HOST_NS, [(10, "pod-a")], [(99, "pod-h")], s(1));
        let pod = |uid: &str, host_network| {
            Owner::Pod(PodRef {
                uid: uid.into(),
                name: None,
                host_network,
            })
        };
        let local = ip("10.1.0.5"); // leased by no pod
        let resolve = |netns, cgroup| at.resolve(netns, cgroup, local, s(1));
        assert_eq!(resolve(Some(10), Some(5)), pod("pod-a", false));
        assert_eq!(resolve(Some(HOST_NS), Some(99)), pod("pod-h", true));
        assert_eq!(resolve(Some(HOST_NS), Some(5)), Owner::Host);
        assert_eq!(resolve(None, None), Owner::Host);
        assert_eq!(
            resolve(Some(11), Some(99)),
            pod("pod-h", false),
            "a namespace the scan could not read is the pod whose cgroup created the socket"
        );
        assert_eq!(
            resolve(Some(10), Some(99)),
            pod("pod-a", false),
            "the scanned namespace wins over the cgroup"
        );
        assert_eq!(
            resolve(Some(11), Some(5)),
            Owner::Unknown,
            "a foreign namespace with a cgroup that is no pod's is not guessed"
        );
    }

    #[test]
    fn an_unscanned_namespace_is_named_by_its_local_ip_or_unknown() {
        let mut at = Attributor::default();
        at.observe_scan(HOST_NS, [], [], s(0));
        at.apply(pod(A, "web", "10.1.0.5"), s(10));
        assert_eq!(
            name_of(&at.resolve(Some(77), None, ip("10.1.0.5"), s(12))).as_deref(),
            Some("shop/web")
        );
        // Within the grace before the watch saw the IP: still the pod.
        assert_eq!(
            name_of(&at.resolve(Some(77), None, ip("10.1.0.5"), s(1))).as_deref(),
            Some("shop/web")
        );
        assert_eq!(
            at.resolve(Some(77), None, ip("10.9.9.9"), s(12)),
            Owner::Unknown
        );
        assert_eq!(
            at.resolve(Some(77), None, ip("0.0.0.0"), s(12)),
            Owner::Unknown
        );
        assert_eq!(
            at.resolve(Some(77), None, ip("127.0.0.1"), s(12)),
            Owner::Unknown
        );
    }

    #[test]
    fn an_unscanned_namespace_is_named_by_the_sockets_pod_cgroup_before_its_ip() {
        // Without CAP_SYS_PTRACE the scan sees no pod namespaces, only the pods' cgroups; a UDP socket
        // bound to 0.0.0.0 has no local IP to go by.
        let mut at = Attributor::default();
        at.observe_scan(HOST_NS, [], [(500, A)], s(0));
        at.apply(pod(A, "web", "10.1.0.5"), s(0));
        at.apply(pod(B, "db", "10.1.0.6"), s(0));
        let owner = at.resolve(Some(77), Some(500), ip("0.0.0.0"), s(1));
        assert_eq!(name_of(&owner).as_deref(), Some("shop/web"));
        assert!(
            matches!(&owner, Owner::Pod(p) if !p.host_network),
            "its own namespace, not the host's: {owner:?}"
        );
        assert_eq!(
            name_of(&at.resolve(Some(77), Some(500), ip("10.1.0.6"), s(1))).as_deref(),
            Some("shop/web"),
            "the creator's cgroup wins over a local IP"
        );
        assert_eq!(
            at.resolve(Some(77), Some(999), ip("0.0.0.0"), s(1)),
            Owner::Unknown,
            "a cgroup that is no pod's names nothing"
        );
    }

    #[test]
    fn a_pod_deleted_mid_flow_is_still_named_until_the_retention_ends() {
        let mut at = Attributor::new(s(60));
        at.apply(pod(A, "web", "10.1.0.5"), s(1));
        at.observe_scan(HOST_NS, [(10, A)], [], s(1));
        at.delete(A, s(5));
        at.delete(A, s(6)); // a repeated delete changes nothing
        assert_eq!(at.stats().pods_deleted, 1);
        assert_eq!(at.live_pods(), 0);
        // The next scan no longer finds its namespace; the event came before the deletion.
        at.observe_scan(HOST_NS, [], [], s(10));
        at.expire(s(10));
        assert_eq!(
            name_of(&at.resolve(Some(10), None, ip("10.1.0.5"), s(4))).as_deref(),
            Some("shop/web")
        );
        at.expire(s(70));
        assert_eq!(
            at.resolve(Some(10), None, ip("10.1.0.5"), s(4)),
            Owner::Unknown
        );
    }

    #[test]
    fn a_reused_ip_names_each_pod_for_its_own_time() {
        let mut at = Attributor::new(s(600));
        at.observe_scan(HOST_NS, [], [], s(0));
        at.apply(pod(A, "old", "10.1.0.5"), s(100));
        at.delete(A, s(200));
        at.apply(pod(B, "new", "10.1.0.5"), s(260));
        let who = |t| name_of(&at.resolve(Some(77), None, ip("10.1.0.5"), s(t)));
        assert_eq!(who(150).as_deref(), Some("shop/old"));
        assert_eq!(who(200).as_deref(), Some("shop/old"));
        assert_eq!(
            who(240).as_deref(),
            Some("shop/new"),
            "within the new lease's grace"
        );
        assert_eq!(who(300).as_deref(), Some("shop/new"));
        assert_eq!(who(50), None, "before anyone's lease");
    }

    #[test]
    fn the_new_holder_reported_before_the_old_ones_deletion_closes_its_lease() {
        let mut at = Attributor::new(s(600));
        at.observe_scan(HOST_NS, [], [], s(0));
        at.apply(pod(A, "old", "10.1.0.5"), s(100));
        at.apply(pod(B, "new", "10.1.0.5"), s(200));
        assert_eq!(at.stats().ip_reassigned, 1);
        let who = |t| name_of(&at.resolve(Some(77), None, ip("10.1.0.5"), s(t)));
        assert_eq!(who(150).as_deref(), Some("shop/old"));
        assert_eq!(who(250).as_deref(), Some("shop/new"));
        // The late deletion of the old pod does not end the new pod's lease.
        at.delete(A, s(300));
        let who = |t| name_of(&at.resolve(Some(77), None, ip("10.1.0.5"), s(t)));
        assert_eq!(who(400).as_deref(), Some("shop/new"));
    }

    #[test]
    fn two_pods_within_the_grace_and_no_exact_lease_are_ambiguous() {
        let mut at = Attributor::new(s(600));
        at.observe_scan(HOST_NS, [], [], s(0));
        at.apply(pod(A, "a", "10.1.0.5"), s(100));
        at.delete(A, s(101));
        at.apply(pod(B, "b", "10.1.0.5"), s(110));
        // At 90 s, before either lease: both within the grace.
        assert_eq!(at.pod_by_ip(ip("10.1.0.5"), s(90)), None);
    }

    #[test]
    fn ip_history_is_bounded() {
        let mut at = Attributor::new(s(10_000));
        for i in 0..10u64 {
            let uid = format!("{i:08}-0000-0000-0000-000000000000");
            at.apply(pod(&uid, &format!("p{i}"), "10.1.0.5"), s(i * 100));
        }
        assert_eq!(at.leases[&ip("10.1.0.5")].len(), IP_HISTORY);
        assert_eq!(
            name_of(&at.resolve(Some(77), None, ip("10.1.0.5"), s(950))).as_deref(),
            Some("shop/p9")
        );
    }

    #[test]
    fn a_relist_deletes_the_pods_it_no_longer_lists() {
        let mut at = Attributor::default();
        assert!(!at.watching());
        at.relist_start();
        at.apply(pod(A, "a", "10.1.0.5"), s(1));
        at.apply(pod(B, "b", "10.1.0.6"), s(1));
        at.relist_done(s(1));
        assert!(at.watching());
        assert_eq!(at.live_pods(), 2);
        // The watch failed and lists again: B was deleted meanwhile.
        at.relist_start();
        at.apply(pod(A, "a", "10.1.0.5"), s(50));
        at.relist_done(s(50));
        assert_eq!(at.live_pods(), 1);
        assert_eq!(at.stats().pods_deleted, 1);
        assert_eq!(at.pod_by_ip(ip("10.1.0.6"), s(60)), None);
        assert!(
            at.pod_by_ip(ip("10.1.0.6"), s(40)).is_some(),
            "still named before"
        );
    }

    #[test]
    fn a_pod_whose_ip_changes_moves_its_lease() {
        let mut at = Attributor::new(s(600));
        at.apply(pod(A, "a", "10.1.0.5"), s(100));
        at.apply(pod(A, "a", "10.1.0.7"), s(200));
        assert!(at.pod_by_ip(ip("10.1.0.5"), s(150)).is_some());
        assert_eq!(at.pod_by_ip(ip("10.1.0.5"), s(250)), None);
        assert!(at.pod_by_ip(ip("10.1.0.7"), s(250)).is_some());
        assert_eq!(at.stats().ip_reassigned, 0);
    }

    #[test]
    fn tombstones_are_bounded() {
        let mut at = Attributor::new(s(10_000));
        for i in 0..(MAX_TOMBSTONES as u64 + 10) {
            let uid = format!("{i:08}-0000-0000-0000-000000000000");
            at.apply(pod(&uid, "p", "10.1.0.5"), s(i));
            at.delete(&uid, s(i));
        }
        at.expire(s(MAX_TOMBSTONES as u64 + 10));
        assert_eq!(at.pods.len(), MAX_TOMBSTONES);
        assert_eq!(at.stats().tombstones_dropped, 10);
    }
}
