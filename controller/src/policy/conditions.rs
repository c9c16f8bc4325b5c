//! Standard `metav1.Condition` bookkeeping: set a condition, keeping `lastTransitionTime` when the
//! status does not change, so that an unchanged situation produces an unchanged status (and no write).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition type: the policy (or proposal) is fully processed and its rendered objects are in sync.
pub const READY: &str = "Ready";
/// Condition type: another policy already targets the same workload and direction.
pub const DUPLICATE_TARGET: &str = "DuplicateTarget";
/// Condition type: the policy's selector also selects pods of another workload.
pub const SELECTOR_OVERLAPS_WORKLOAD: &str = "SelectorOverlapsWorkload";
/// Condition type: rules of the policy allowed no observed flow for `--unused-rule-after`
/// ([`crate::policy::rule_usage::unused_rules`]).
pub const UNUSED_RULES: &str = "UnusedRules";
/// Condition type: replaying the observed traffic shows flows the policy would block in protect
/// ([`crate::policy::protect_gate`]).
pub const WOULD_BLOCK: &str = "WouldBlock";
/// Condition type on proposals: the promotion could not be carried out.
pub const PROMOTED: &str = "Promoted";

/// A desired condition, without timestamps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl Desired {
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: &str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.to_string(),
            message: message.into(),
        }
    }
}

/// Sets `desired` in `conditions` (replacing a condition of the same type). Returns whether anything
/// changed. `lastTransitionTime` moves to `now` only when the status flips or the condition is new.
pub fn set(
    conditions: &mut Vec<Condition>,
    desired: &Desired,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let status = if desired.status { "True" } else { "False" }.to_string();
    let existing = conditions.iter_mut().find(|c| c.type_ == desired.type_);
    match existing {
        Some(c) => {
            let transition = if c.status == status {
                c.last_transition_time.clone()
            } else {
                now.clone()
            };
            let updated = Condition {
                type_: desired.type_.to_string(),
                status,
                reason: desired.reason.clone(),
                message: desired.message.clone(),
                observed_generation: generation,
                last_transition_time: transition,
            };
            let changed = *c != updated;
            *c = updated;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: desired.type_.to_string(),
                status,
                reason: desired.reason.clone(),
                message: desired.message.clone(),
                observed_generation: generation,
                last_transition_time: now.clone(),
            });
            true
        }
    }
}

/// `policy`'s condition of type `type_`, as its status holds it.
pub fn of<'a>(
    policy: &'a network_enforcer_api::WorkloadNetworkPolicy,
    type_: &str,
) -> Option<&'a Condition> {
    let status = policy.status.as_ref()?;
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// Whether `conditions` already say what `desired` says (status, reason and message; the generation
/// aside): what an Event about a condition's change is published on.
pub fn holds(conditions: &[Condition], desired: &Desired) -> bool {
    let status = if desired.status { "True" } else { "False" };
    conditions.iter().any(|c| {
        c.type_ == desired.type_
            && c.status == status
            && c.reason == desired.reason
            && c.message == desired.message
    })
}

/// Removes the condition of `type_`; returns whether it was there.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    conditions.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let mut cs = vec![];
        let ready = Desired::new(READY, true, "Rendered", "ok");
        assert!(set(&mut cs, &ready, Some(1), &t(10)));
        assert!(
            !set(&mut cs, &ready, Some(1), &t(20)),
            "same condition is no change"
        );
        assert_eq!(cs[0].last_transition_time, t(10));
        let msg = Desired::new(READY, true, "Rendered", "still ok");
        assert!(set(&mut cs, &msg, Some(2), &t(30)));
        assert_eq!(cs[0].last_transition_time, t(10));
        let down = Desired::new(READY, false, "NotOwned", "x");
        assert!(set(&mut cs, &down, Some(2), &t(40)));
        assert_eq!(cs[0].last_transition_time, t(40));
        assert_eq!(cs.len(), 1);
        assert!(remove(&mut cs, READY));
        assert!(!remove(&mut cs, READY));
    }

    #[test]
    fn a_condition_holds_whatever_the_generation() {
        let mut cs = vec![];
        let invalid = Desired::new(READY, false, "Invalid", "podSelector must not be empty");
        assert!(!holds(&cs, &invalid));
        set(&mut cs, &invalid, Some(1), &t(10));
        assert!(holds(&cs, &invalid));
        set(&mut cs, &invalid, Some(2), &t(20));
        assert!(holds(&cs, &invalid), "a new generation, the same refusal");
        let other = Desired::new(READY, false, "Invalid", "backend is immutable");
        assert!(!holds(&cs, &other));
        let flipped = Desired::new(READY, true, "Invalid", "podSelector must not be empty");
        assert!(!holds(&cs, &flipped));
    }
}
