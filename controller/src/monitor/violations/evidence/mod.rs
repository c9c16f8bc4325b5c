//! Violation evidence: which flow records are evidence for which policy mode ([`EvidenceKind`](crate::ingest::evidence::EvidenceKind),
//! docs/behaviour.md §3.5), how a record becomes flows between pods the evaluators know
//! ([`observed_flows`], §3.2), when a repeat of the same flow counts again ([`RepeatFilter`],
//! [`REPEAT_WINDOW`], §3.6), and the observations waiting for the status patch that records them
//! ([`Pending`], §3.9). Why: docs/design.md, "Violations".
//!
//! All pure: the status sync ([`crate::monitor::status_sync`]) feeds records in and patches what comes out.

use super::Observation;
use crate::FastMap;
use crate::cluster::index::{self, End, Index, NoFlow, WorkloadEndpoint};
use crate::ingest::flow_record::Decoded;
use crate::monitor::evaluate::attribution::{FlowSide, ObservedFlow, PolicyKey, RepeatKey};
use crate::monitor::evaluate::view::{ClusterView, Endpoint, PodKey};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use network_enforcer_api::{WorkloadKind, WorkloadRef};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// Repeats of the same violation within this window of the last counted one count once.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(60);

/// At most this many observations wait per policy for a successful status patch; beyond, the
/// oldest are dropped (and counted) rather than growing without bound while the API refuses patches.
pub const MAX_PENDING_PER_POLICY: usize = 10_000;

/// What blocked evidence that waited for its peer came to, judged against the policies as they are
/// at the pass (`evidence_waited_for_peer_total{outcome}`, docs/behaviour.md §3.2).
// Variants in precedence order: a record's outcome is the greatest of its flows'.
#[derive(
    Clone,
    Copy,
    Debug,
    Hash,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    prometheus_client::encoding::EncodeLabelValue,
)]
#[allow(non_camel_case_types)]
pub enum WaitedOutcome {
    /// Its peer is a pod now and no policy records the flow: refused only because a node did not
    /// know the pod's address yet. Not a violation.
    startup_drop,
    /// Its peer is a pod now and a policy records a violation, named by the pod's workload.
    violation,
    /// Its peer is still no pod: judged as the address, as evidence that never waited.
    unknown_address,
}

impl WaitedOutcome {
    /// The outcome of a record from its flows, each as (its peer is a workload, a policy records a
    /// violation of it); `None` for a record without flows. One flow still judged as an address
    /// makes the record's outcome `unknown_address`, whatever was recorded.
    pub fn of(flows: impl IntoIterator<Item = (bool, bool)>) -> Option<Self> {
        flows
            .into_iter()
            .map(
                |(peer_is_workload, violation)| match (peer_is_workload, violation) {
                    (false, _) => WaitedOutcome::unknown_address,
                    (true, true) => WaitedOutcome::violation,
                    (true, false) => WaitedOutcome::startup_drop,
                },
            )
            .max()
    }
}

/// Whether `side`, the peer of an observed flow, is a workload (not a bare address).
pub fn names_a_workload(side: &FlowSide) -> bool {
    !side.workload.owner_name.is_empty()
}

/// The flows between evaluable endpoints a decoded record stands for, as of the record's last
/// sighting: the index's one resolution ([`Index::flows`]) with its ends named as the evaluators
/// know them: a pod as itself (a host-network pod by its address, as NetworkPolicies see it), a
/// Service backend workload by one of its pods (pods of a workload share their template's labels
/// and ports, so any of its pods stands for it), anything else by its address. A backend workload
/// without a pod in `view` gives no flow.
pub fn observed_flows(
    index: &Index,
    view: &ClusterView,
    names: &mut WorkloadNames,
    record: &Decoded,
    now: &Time,
) -> Result<Vec<ObservedFlow>, NoFlow> {
    let at = record.at_ms;
    let seen_at = k8s_openapi::jiff::Timestamp::from_millisecond(at)
        .ok()
        .filter(|_| at > 0)
        .map_or_else(|| now.clone(), Time);
    let flows = index.flows(&record.connection())?;
    Ok(flows
        .iter()
        .filter_map(|flow| {
            // An address (outside, or a node's), with the name the pod resolved it from (if the
            // agent saw it): evaluated by it (`peer_name`) and recorded with it (`dns_name`), so a
            // violation says which name to list in `spec.egressNames`.
            let peer_name = flow.to_address.then(|| record.peer_name.name()).flatten();
            Some(ObservedFlow {
                source: side(view, names, &flow.source, None)?,
                destination: side(view, names, &flow.destination, peer_name.as_deref())?,
                protocol: record.protocol,
                port: flow.port,
                seen_at: seen_at.clone(),
                peer_name,
            })
        })
        .collect())
}

/// `end` as a flow side the evaluators know, named by its workload (an address by `dns_name`, the
/// name the source pod resolved it from, if any); `None` for a backend workload without a pod.
fn side(
    view: &ClusterView,
    names: &mut WorkloadNames,
    end: &End,
    dns_name: Option<&str>,
) -> Option<FlowSide> {
    Some(match end {
        End::Pod(pod) => FlowSide {
            // A host-network pod only here when it took over the address of a pod of its name
            // (the index keeps a recreated pod's record on its former address): by its address.
            endpoint: match (pod.host_network, pod.ips.first()) {
                (true, Some(ip)) => Endpoint::Ip(*ip),
                _ => Endpoint::Pod(PodKey::new(&pod.namespace, &pod.name)),
            },
            workload: names.of(&pod.endpoint),
        },
        End::Other(index::FlowEnd::Workload(workload)) => workload_side(view, names, workload)?,
        End::Other(index::FlowEnd::HostNetwork { workload, ip, .. }) => FlowSide {
            endpoint: Endpoint::Ip(*ip),
            workload: names.of(workload),
        },
        End::Other(index::FlowEnd::Node { ip, .. } | index::FlowEnd::External(ip)) => {
            named_address_side(*ip, dns_name)
        }
    })
}

/// A Service backend workload as a flow side: one of its pods stands for it.
fn workload_side(
    view: &ClusterView,
    names: &mut WorkloadNames,
    workload: &Arc<WorkloadEndpoint>,
) -> Option<FlowSide> {
    // A pod without a workload (kind `None`) is its own: `pods_of` finds it by name.
    let kind = workload.kind.unwrap_or(WorkloadKind::Pod);
    let pod = view
        .pods_of(&workload.namespace, kind, &workload.name)
        .next()?
        .key();
    Some(FlowSide {
        endpoint: Endpoint::Pod(pod),
        workload: names.of(workload),
    })
}

/// An address as a flow side, named by the DNS name the source pod resolved it from, if any.
fn named_address_side(ip: IpAddr, dns_name: Option<&str>) -> FlowSide {
    FlowSide {
        endpoint: Endpoint::Ip(ip),
        workload: Arc::new(WorkloadRef {
            address: ip.to_string(),
            dns_name: dns_name.unwrap_or_default().to_string(),
            ..WorkloadRef::default()
        }),
    }
}

/// The names ([`workload_ref`]) of the workloads evidence passes meet, each built once: every record
/// names both its ends, and a pass's records come from far fewer workloads than records. Kept from
/// one pass to the next (a name no record of a pass used is forgotten at its end), so that the edge
/// history, which knows its names by address, finds them without comparing their strings.
#[derive(Debug, Default)]
pub struct WorkloadNames {
    /// By the endpoint's address. The index shares one endpoint among a workload's pods, and the
    /// endpoint is held here, so its address cannot be reused by another while the map lives.
    built: FastMap<usize, Built>,
}

#[derive(Debug)]
struct Built {
    /// Held so that its address stays this entry's key.
    _endpoint: Arc<WorkloadEndpoint>,
    name: Arc<WorkloadRef>,
    /// Asked for since the last [`WorkloadNames::end_pass`].
    used: bool,
}

impl WorkloadNames {
    /// The name of `endpoint`, built at its first use.
    pub fn of(&mut self, endpoint: &Arc<WorkloadEndpoint>) -> Arc<WorkloadRef> {
        let built = self
            .built
            .entry(Arc::as_ptr(endpoint) as usize)
            .or_insert_with(|| Built {
                _endpoint: Arc::clone(endpoint),
                name: Arc::new(workload_ref(endpoint)),
                used: false,
            });
        built.used = true;
        Arc::clone(&built.name)
    }

    /// Ends a pass: forgets the names it did not use, and takes each kept name as `interned` holds
    /// an equal one (the edge history's own copy), so that later passes hand out that copy.
    pub fn end_pass(&mut self, mut interned: impl FnMut(&WorkloadRef) -> Option<Arc<WorkloadRef>>) {
        self.built
            .retain(|_, built| std::mem::take(&mut built.used));
        for built in self.built.values_mut() {
            if let Some(name) = interned(&built.name) {
                built.name = name;
            }
        }
    }

    /// Names held.
    pub fn len(&self) -> usize {
        self.built.len()
    }

    pub fn is_empty(&self) -> bool {
        self.built.is_empty()
    }
}

/// At most this many characters of a workload's selector are written into a violation record. A bare
/// pod's selector is its labels, which may hold 256 KiB: uncut, one such pod calling a policy's
/// workload would make every status write of that policy too large for etcd.
pub const MAX_SELECTOR_CHARS: usize = 512;

/// How violation records name a workload: namespace, kind (`Pod` for a pod without a supported
/// controller), name, Istio principal and selector (cut at [`MAX_SELECTOR_CHARS`]).
pub fn workload_ref(workload: &WorkloadEndpoint) -> WorkloadRef {
    // Built in one string and cut in place: the evidence pass names both ends of every record, so
    // a copy per label (and of the whole text to cut it) showed in the controller's profile.
    let mut selector = String::new();
    for (k, v) in &workload.selector {
        // Past this many bytes it has more characters than are kept (at most 4 bytes each).
        if selector.len() > 4 * MAX_SELECTOR_CHARS {
            break;
        }
        if !selector.is_empty() {
            selector.push(',');
        }
        selector.push_str(k);
        selector.push('=');
        selector.push_str(v);
    }
    WorkloadRef {
        namespace: workload.namespace.clone(),
        owner_kind: workload.kind.map_or("Pod", |k| k.as_str()).to_string(),
        owner_name: workload.name.clone(),
        identity: workload.principal(),
        selector: super::cap_string(selector, MAX_SELECTOR_CHARS),
        address: String::new(),
        dns_name: String::new(),
    }
}

/// Counts one observation per flow per [`REPEAT_WINDOW`] (see the module docs).
#[derive(Debug)]
pub struct RepeatFilter {
    window_ms: i64,
    /// Keys are remembered by a keyed hash (SipHash with a per-process random key, so not
    /// predictable from outside): nothing is copied per observation. Two different keys share one
    /// with odds of about n²/2⁶⁵ for n keys remembered; one of them is then counted once less.
    fingerprints: std::hash::RandomState,
    /// When each key was last counted (the observation's time, ms).
    counted: HashMap<u64, i64>,
}

impl RepeatFilter {
    /// A filter with the given window.
    pub fn new(window: Duration) -> Self {
        RepeatFilter {
            window_ms: i64::try_from(window.as_millis()).unwrap_or(i64::MAX),
            fingerprints: std::hash::RandomState::new(),
            counted: HashMap::new(),
        }
    }

    /// Whether `observation` counts: true the first time its key is seen, and when its time is at
    /// least a window away from the last counted one.
    pub fn admit(&mut self, observation: &Observation) -> bool {
        self.admit_key(
            RepeatKey::of(observation),
            observation.timestamp.0.as_millisecond(),
        )
    }

    /// [`RepeatFilter::admit`] for an observation of `key` at `at_ms`, before it is built.
    pub fn admit_key(&mut self, key: RepeatKey<'_>, at_ms: i64) -> bool {
        use std::hash::BuildHasher;
        let fingerprint = self.fingerprints.hash_one(key);
        match self.counted.get(&fingerprint) {
            Some(last) if (at_ms - last).abs() < self.window_ms => false,
            _ => {
                self.counted.insert(fingerprint, at_ms);
                true
            }
        }
    }

    /// Forgets keys last counted more than a window before `now_ms`, so memory follows the flows of
    /// the last window only.
    pub fn forget_before(&mut self, now_ms: i64) {
        let window = self.window_ms;
        self.counted
            .retain(|_, at| now_ms.saturating_sub(*at) < window);
    }

    /// The number of keys remembered.
    pub fn len(&self) -> usize {
        self.counted.len()
    }

    /// Whether no key is remembered.
    pub fn is_empty(&self) -> bool {
        self.counted.is_empty()
    }
}

/// Observations per policy, waiting for the status patch that records them. The sync reads a
/// policy's observations ([`Pending::read`]), patches, and only on success [`Pending::commit`]s the ones
/// it read; what arrived meanwhile stays for the next sync, and a failed patch loses nothing. Each
/// observation carries a sequence number, so a commit forgets exactly what was read even when the queue
/// overflowed during the patch (its oldest dropped, newer ones pushed): counting "the first n" would
/// then forget newer observations the patch never held.
#[derive(Debug, Default)]
pub struct Pending {
    by_policy: HashMap<PolicyKey, VecDeque<(u64, Observation)>>,
    next: u64,
    dropped: u64,
}

/// What a [`Pending::read`] saw: commit it once the status holds those observations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Read {
    /// The sequence number of the newest observation read (0: none).
    through: u64,
}

impl Pending {
    /// Queues an observation for `policy`; when the policy already has [`MAX_PENDING_PER_POLICY`]
    /// waiting, the oldest is dropped and counted in [`Pending::dropped`].
    pub fn push(&mut self, policy: PolicyKey, observation: Observation) {
        let queue = self.by_policy.entry(policy).or_default();
        if queue.len() >= MAX_PENDING_PER_POLICY {
            queue.pop_front();
            self.dropped += 1;
        }
        self.next += 1;
        queue.push_back((self.next, observation));
    }

    /// The observations waiting for `policy`, oldest first, and what to [`Pending::commit`] once they
    /// are recorded.
    pub fn read(&self, policy: &PolicyKey) -> (Vec<Observation>, Read) {
        let Some(queue) = self.by_policy.get(policy) else {
            return (Vec::new(), Read::default());
        };
        let through = queue.back().map_or(0, |(seq, _)| *seq);
        (
            queue.iter().map(|(_, o)| o.clone()).collect(),
            Read { through },
        )
    }

    /// The observations waiting for `policy`, oldest first.
    pub fn get(&self, policy: &PolicyKey) -> Vec<Observation> {
        self.read(policy).0
    }

    /// The number of observations waiting for `policy`.
    pub fn len_of(&self, policy: &PolicyKey) -> usize {
        self.by_policy.get(policy).map_or(0, VecDeque::len)
    }

    /// The observations of `read` are in `policy`'s status now: forget them (and only them).
    pub fn commit(&mut self, policy: &PolicyKey, read: Read) {
        if let Some(queue) = self.by_policy.get_mut(policy) {
            while queue.front().is_some_and(|(seq, _)| *seq <= read.through) {
                queue.pop_front();
            }
            if queue.is_empty() {
                self.by_policy.remove(policy);
            }
        }
    }

    /// Forgets the observations of policies that no longer exist; returns how many were dropped.
    pub fn retain_policies(&mut self, mut exists: impl FnMut(&PolicyKey) -> bool) -> usize {
        let mut dropped = 0;
        self.by_policy.retain(|key, queue| {
            let keep = exists(key);
            if !keep {
                dropped += queue.len();
            }
            keep
        });
        dropped
    }

    /// The policies with observations waiting.
    pub fn policies(&self) -> impl Iterator<Item = &PolicyKey> {
        self.by_policy.keys()
    }

    /// Observations waiting, over every policy.
    pub fn len(&self) -> usize {
        self.by_policy.values().map(VecDeque::len).sum()
    }

    /// Whether no observation waits.
    pub fn is_empty(&self) -> bool {
        self.by_policy.values().all(VecDeque::is_empty)
    }

    /// Observations dropped because a policy's queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests;
