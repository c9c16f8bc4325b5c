//! Violation bookkeeping of a WorkloadNetworkPolicy's status (docs/behaviour.md §3.7, §3.8), as one
//! pure function from (current status, annotations, new observations, now) to the next status plus what
//! changed:
//!
//! 1. **merge** each observation: a record with the same dedupe key only gets a newer timestamp, a
//!    new one gets `id = violationCount`; every observation increments `violationCount`, except one
//!    that the status counted already: within [`REPEAT_WINDOW`] of the timestamp of an active or
//!    acknowledged record with its key (the §3.6 rule, checked against what is persisted, so that an
//!    occurrence sent again to a new leader, whose in-memory repeat filter starts empty, does not
//!    count twice), and adds to its hour in `violationHistory` ([`history`]); records are sorted
//!    newest first and capped at [`MAX_VIOLATIONS`];
//! 2. **clear** the records the current spec now allows (decided by the caller's semantic
//!    evaluator, [`crate::monitor::evaluate::attribution::record_allowed_now`]);
//! 3. **acknowledge** each `acknowledge-<id>` annotation: record `<id>` moves to
//!    `acknowledgedViolations` (reason = the annotation value, `acknowledgedAt` = now, newest first,
//!    capped at [`MAX_ACKNOWLEDGED`]); the annotation is to be removed, also when `<id>` is unknown
//!    (reported so the caller emits an Event);
//! 4. `activeViolationCount = len(violations)`, `observedGeneration = generation`.
//!
//! The caller patches the status only when [`SyncOutcome::status_changed`], removes
//! [`SyncOutcome::remove_annotations`], and keeps its observations pending until the patch that
//! contains them succeeded: this function is deterministic, so a retry from the re-read status gives
//! the same result.

use evidence::REPEAT_WINDOW;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use network_enforcer_api::keys::acknowledged_id;
use network_enforcer_api::{
    AcknowledgedViolation, Direction, PolicyMode, Protocol, ViolationRecord,
    WorkloadNetworkPolicyStatus, WorkloadRef,
};
use std::cmp::Reverse;
use std::collections::BTreeMap;

/// At most this many active records are kept (the oldest are dropped).
pub const MAX_VIOLATIONS: usize = 100;

/// At most this many acknowledged records are kept (the oldest acknowledgements are dropped).
pub const MAX_ACKNOWLEDGED: usize = 100;
/// At most this many characters of an acknowledgement's reason are kept: annotations may hold 256 KiB,
/// and [`MAX_ACKNOWLEDGED`] uncut reasons could grow the status past what etcd stores.
pub const MAX_REASON_CHARS: usize = 1024;

/// `reason` cut to [`MAX_REASON_CHARS`] characters, marked with `…` when cut.
pub fn cap_reason(reason: &str) -> String {
    cap_text(reason, MAX_REASON_CHARS)
}

/// `text` cut to `max_chars` characters, marked with `…` when cut.
pub fn cap_text(text: &str, max_chars: usize) -> String {
    match cut_at(text, max_chars) {
        None => text.to_string(),
        Some(end) => format!("{}…", &text[..end]),
    }
}

/// [`cap_text`] for a string the caller owns: cut in place, no copy.
pub fn cap_string(mut text: String, max_chars: usize) -> String {
    if let Some(end) = cut_at(&text, max_chars) {
        text.truncate(end);
        text.push('…');
    }
    text
}

/// Where `text` is cut to keep `max_chars` characters, if it has more.
fn cut_at(text: &str, max_chars: usize) -> Option<usize> {
    // No more bytes than characters allowed: nothing to count.
    if text.len() <= max_chars {
        return None;
    }
    text.char_indices().nth(max_chars).map(|(end, _)| end)
}

/// One occurrence of a violating flow, attributed to a policy: a [`ViolationRecord`] without its id.
#[derive(Clone, Debug, PartialEq)]
pub struct Observation {
    /// When the flow was seen.
    pub timestamp: Time,
    pub source: WorkloadRef,
    pub dest: WorkloadRef,
    pub protocol: Protocol,
    /// The destination container port, when known.
    pub dst_port: Option<i32>,
    /// The policy's mode when the flow was seen.
    pub action: PolicyMode,
    /// The policy's direction.
    pub direction: Direction,
    pub denying_policy_namespace: String,
    pub denying_policy_name: String,
}

impl Observation {
    fn into_record(self, id: i64) -> ViolationRecord {
        ViolationRecord {
            id,
            timestamp: self.timestamp,
            source: self.source,
            dest: self.dest,
            protocol: self.protocol,
            dst_port: self.dst_port,
            action: self.action,
            direction: Some(self.direction),
            denying_policy_namespace: self.denying_policy_namespace,
            denying_policy_name: self.denying_policy_name,
        }
    }
}

/// Whether an occurrence at `at` with `record`'s key is one the status counted already: it lies
/// within [`REPEAT_WINDOW`] of the record's timestamp, the latest counted occurrence (§3.6).
fn counted_by(record: &ViolationRecord, at: &Time) -> bool {
    let window = k8s_openapi::jiff::SignedDuration::try_from(REPEAT_WINDOW).unwrap_or_default();
    record.timestamp.0.duration_since(at.0).abs() < window
}

/// The fields that make two observations the same violation: the reference's key (source and
/// destination namespace/kind/name/identity, protocol, dstPort, action, denying policy, direction),
/// plus the peer address, which tells apart peers that are no workload (two internet hosts would
/// otherwise share one record; for pods the address is empty and changes nothing), plus the name
/// the pod resolved that address from. The name is part of what the policy decides on
/// (`spec.egressNames`): two names served from one address (a CDN, shared hosting) or the address
/// reached by name and as a literal are allowed or denied independently, and the user fixes each by
/// listing a name. One record for both would show one name while the other is the one still denied,
/// and clearing it (step 2) when its name is allowed would hide the other until it is seen again.
#[derive(PartialEq, Eq)]
struct DedupeKey<'a> {
    source: WorkloadKey<'a>,
    dest: WorkloadKey<'a>,
    protocol: Protocol,
    dst_port: Option<i32>,
    action: PolicyMode,
    policy: (&'a str, &'a str),
    direction: Option<Direction>,
}

#[derive(PartialEq, Eq)]
struct WorkloadKey<'a> {
    namespace: &'a str,
    kind: &'a str,
    name: &'a str,
    identity: &'a str,
    address: &'a str,
    dns_name: &'a str,
}

impl<'a> WorkloadKey<'a> {
    fn of(w: &'a WorkloadRef) -> Self {
        WorkloadKey {
            namespace: &w.namespace,
            kind: &w.owner_kind,
            name: &w.owner_name,
            identity: &w.identity,
            address: &w.address,
            dns_name: &w.dns_name,
        }
    }
}

fn observation_key(o: &Observation) -> DedupeKey<'_> {
    DedupeKey {
        source: WorkloadKey::of(&o.source),
        dest: WorkloadKey::of(&o.dest),
        protocol: o.protocol,
        dst_port: o.dst_port,
        action: o.action,
        policy: (&o.denying_policy_namespace, &o.denying_policy_name),
        direction: Some(o.direction),
    }
}

fn record_key(r: &ViolationRecord) -> DedupeKey<'_> {
    DedupeKey {
        source: WorkloadKey::of(&r.source),
        dest: WorkloadKey::of(&r.dest),
        protocol: r.protocol,
        dst_port: r.dst_port,
        action: r.action,
        policy: (&r.denying_policy_namespace, &r.denying_policy_name),
        direction: r.direction,
    }
}

/// Everything one sync of a policy's status needs.
#[derive(Clone, Copy, Debug)]
pub struct SyncInput<'a> {
    /// The policy's current status (`None` before the first sync).
    pub status: Option<&'a WorkloadNetworkPolicyStatus>,
    /// The policy's `metadata.generation`.
    pub generation: Option<i64>,
    /// The policy's annotations; `acknowledge-<id>` ones are consumed.
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// Observations attributed to this policy since the last successful patch, in arrival order.
    pub observations: &'a [Observation],
    /// The time of this sync, used as `acknowledgedAt` and to age `violationHistory`.
    pub now: &'a Time,
}

/// An `acknowledge-<id>` annotation that named no active or acknowledged record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownAcknowledgement {
    /// The full annotation key, to name in the Event.
    pub annotation: String,
    pub problem: UnknownId,
}

/// Why an acknowledge annotation could not be consumed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnknownId {
    #[error("violation {0} is not an active violation of this policy")]
    NotFound(i64),
    #[error("`{0}` is not a violation id (expected an integer)")]
    NotANumber(String),
}

/// The result of one sync.
#[derive(Clone, Debug, PartialEq)]
pub struct SyncOutcome {
    /// The next status. Conditions are carried over untouched.
    pub status: WorkloadNetworkPolicyStatus,
    /// Whether `status` differs from the current one: patch only then.
    pub status_changed: bool,
    /// Acknowledge annotations to remove from the policy: consumed ones, ones naming an already
    /// acknowledged record (a previous removal failed), and unknown ones.
    pub remove_annotations: Vec<String>,
    /// Unknown or malformed acknowledge annotations, for an Event each.
    pub unknown: Vec<UnknownAcknowledgement>,
    /// Records acknowledged by this sync, for `policy_violation_acknowledged` once the patch succeeds.
    pub acknowledged: Vec<AcknowledgedViolation>,
    /// Records cleared because the current spec allows them now.
    pub cleared: Vec<ViolationRecord>,
}

/// Runs steps 1-4 of the module docs on a policy's status. `allowed_now` tells whether the policy's
/// current spec allows a record's flow (step 2).
pub fn sync(
    input: SyncInput<'_>,
    mut allowed_now: impl FnMut(&ViolationRecord) -> bool,
) -> SyncOutcome {
    // The history settled before comparing: hours that only aged out change nothing worth a write
    // (the page shows the last 48 hours whatever is stored); they leave with the next real one.
    let mut before = input.status.cloned().unwrap_or_default();
    history::settle(&mut before.violation_history, input.now);
    let mut status = before.clone();

    // 1. Merge.
    for observation in input.observations {
        let key = observation_key(observation);
        let at = &observation.timestamp;
        match status.violations.iter_mut().find(|r| record_key(r) == key) {
            Some(record) => {
                if counted_by(record, at) {
                    continue;
                }
                if at.0 > record.timestamp.0 {
                    record.timestamp = at.clone();
                }
            }
            None => {
                let acknowledged = status
                    .acknowledged_violations
                    .iter()
                    .any(|a| record_key(&a.violation) == key && counted_by(&a.violation, at));
                if acknowledged {
                    continue;
                }
                let record = observation.clone().into_record(status.violation_count);
                status.violations.push(record);
            }
        }
        status.violation_count += 1;
        history::count(&mut status.violation_history, at, input.now);
    }
    // Newest first; among equal timestamps the later id first, so the order is total.
    status
        .violations
        .sort_by_key(|r| Reverse((r.timestamp.0, r.id)));
    status.violations.truncate(MAX_VIOLATIONS);

    // 2. Clear.
    let (cleared, active): (Vec<_>, Vec<_>) = std::mem::take(&mut status.violations)
        .into_iter()
        .partition(|r| allowed_now(r));
    status.violations = active;

    // 3. Acknowledge.
    let mut remove_annotations = Vec::new();
    let mut unknown = Vec::new();
    let mut acknowledged = Vec::new();
    for (annotation, reason) in input.annotations.into_iter().flatten() {
        let Some(id) = acknowledged_id(annotation) else {
            continue;
        };
        remove_annotations.push(annotation.clone());
        let problem = match id {
            Err(suffix) => UnknownId::NotANumber(suffix.to_string()),
            Ok(id) => match status.violations.iter().position(|r| r.id == id) {
                Some(i) => {
                    acknowledged.push(AcknowledgedViolation {
                        violation: status.violations.remove(i),
                        reason: cap_reason(reason),
                        acknowledged_at: input.now.clone(),
                    });
                    continue;
                }
                // Consumed by an earlier sync whose annotation removal did not happen.
                None if status
                    .acknowledged_violations
                    .iter()
                    .any(|a| a.violation.id == id) =>
                {
                    continue;
                }
                None => UnknownId::NotFound(id),
            },
        };
        unknown.push(UnknownAcknowledgement {
            annotation: annotation.clone(),
            problem,
        });
    }
    // Annotations come in key order ("-10" before "-9"); list the newest record first.
    acknowledged.sort_by_key(|a| Reverse(a.violation.id));
    let mut acknowledged_list = acknowledged.clone();
    acknowledged_list.append(&mut status.acknowledged_violations);
    // Stable: this sync's acknowledgements stay ahead of older ones with the same time.
    acknowledged_list.sort_by_key(|a| Reverse(a.acknowledged_at.0));
    acknowledged_list.truncate(MAX_ACKNOWLEDGED);
    status.acknowledged_violations = acknowledged_list;

    // 4. Counters.
    status.active_violation_count = status.violations.len() as i64;
    status.observed_generation = input.generation;

    SyncOutcome {
        status_changed: status != before,
        status,
        remove_annotations,
        unknown,
        acknowledged,
        cleared,
    }
}

pub mod evidence;
pub mod history;

#[cfg(test)]
mod tests;
