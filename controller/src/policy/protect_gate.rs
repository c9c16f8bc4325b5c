//! The protect gate (docs/api.md, "Protect gate"): what replaying the observed traffic against a policy
//! ([`crate::monitor::edge_history::EdgeHistory::replay`]) means for it: the `WouldBlock` condition,
//! the Event, and whether a `strict` policy in protect is held in monitor.

use crate::policy::conditions::{self, Desired};
use network_enforcer_api::keys::{PROTECT_GATE_ANNOTATION, PROTECT_GATE_STRICT};
use network_enforcer_api::{PolicyMode, Protocol, WorkloadNetworkPolicy};
use std::fmt::Write as _;

/// Condition reasons of `WouldBlock`.
pub const REASON_CLEAN: &str = "NoObservedFlowBlocked";
pub const REASON_BLOCKS: &str = "WouldBlockObservedFlows";
pub const REASON_DNS: &str = "WouldCutDNS";
pub const REASON_API_SERVER: &str = "WouldCutAPIServer";
pub const REASON_NO_HISTORY: &str = "NoHistory";
/// `Ready` reason of a strict protect policy held in monitor.
pub const REASON_HELD: &str = "HeldByProtectGate";

/// A flow a policy would block, for the condition and the Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    /// The other end, as the graph and `check` name it (`ns/Kind/name` or the address).
    pub peer: String,
    pub protocol: Protocol,
    pub port: u16,
    pub last_seen_ms: i64,
}

/// What replaying the history against one policy found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GateReport {
    /// Edges of the policy's side (its target as source for egress, as destination for ingress).
    pub considered: usize,
    /// Of those, the edges the policy would block.
    pub would_block: usize,
    /// Up to `MAX_EXAMPLES` (monitor's edge history) of them, most recently seen first.
    pub examples: Vec<Example>,
    /// One of them is the workload's DNS (port 53 to kube-system).
    pub cuts_dns: bool,
    /// One of them is the workload's access to the API server.
    pub cuts_api_server: bool,
    /// Edges that could not be evaluated now (a peer workload with no pod left, say).
    pub not_evaluable: usize,
    /// The history is still being rebuilt after the controller started (`--edge-history-warmup`):
    /// a flow not seen since may be missing, so finding nothing to block proves nothing yet.
    pub warming_up: bool,
}

/// Where the gate's history lives (the status sync, which sees every accepted flow).
pub trait History: Send + Sync {
    /// Replays the observed edges against `policy`; `None` when no history is kept here.
    fn replay(&self, policy: &WorkloadNetworkPolicy) -> Option<GateReport>;
    /// Notes whether `policy` is held in monitor by the gate.
    fn hold(&self, policy: &WorkloadNetworkPolicy, held: bool);
}

/// A shared [`History`], as settings carry it.
#[derive(Clone)]
pub struct GateHistory(pub std::sync::Arc<dyn History>);

impl std::fmt::Debug for GateHistory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GateHistory")
    }
}

/// Whether the policy asks for the strict gate.
pub fn is_strict(policy: &WorkloadNetworkPolicy) -> bool {
    policy
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROTECT_GATE_ANNOTATION))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(PROTECT_GATE_STRICT))
}

/// What the gate decides for a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The `WouldBlock` condition.
    pub condition: Desired,
    /// A strict policy in protect that would block observed flows renders as monitor.
    pub held: bool,
}

/// The verdict for `policy` given the replay `report` (`None`: this controller has no edge history,
/// e.g. it is not the leader yet or the history is turned off).
///
/// Until the history can answer (`None`, or a report of a history still being rebuilt after a start
/// that finds nothing to block) the gate keeps what it said before, as the policy's status holds it:
/// a strict policy held stays held, one rendered stays rendered (a restart must not render a held
/// policy for a minute, nor flap a rendered one), and a `WouldBlock` condition stays as it was; a
/// policy without one gets `NoHistory`. Never `NoObservedFlowBlocked` from a history not complete.
pub fn verdict(policy: &WorkloadNetworkPolicy, report: Option<&GateReport>) -> Verdict {
    let report = match report {
        None => {
            return as_before(
                policy,
                "no observed traffic is held by this controller yet; the gate is checked again later",
            );
        }
        Some(r) if r.warming_up && r.would_block == 0 => {
            return as_before(
                policy,
                "the observed traffic is being gathered again since this controller started: flows \
                 not seen since may be missing; the gate is checked again later",
            );
        }
        Some(r) => r,
    };
    if report.would_block == 0 {
        let mut message = format!(
            "none of the {} observed flows of this side would be blocked",
            report.considered
        );
        if report.not_evaluable > 0 {
            let _ = write!(
                message,
                " ({} could not be evaluated: a peer without pods now)",
                report.not_evaluable
            );
        }
        return Verdict {
            condition: Desired::new(conditions::WOULD_BLOCK, false, REASON_CLEAN, message),
            held: false,
        };
    }
    let reason = if report.cuts_dns {
        REASON_DNS
    } else if report.cuts_api_server {
        REASON_API_SERVER
    } else {
        REASON_BLOCKS
    };
    let held = policy.spec.mode == PolicyMode::Protect && is_strict(policy);
    Verdict {
        condition: Desired::new(conditions::WOULD_BLOCK, true, reason, message(report, held)),
        held,
    }
}

/// What the gate said before, as `policy`'s status holds it (see [`verdict`]); `NoHistory` saying
/// `why` when it said nothing yet.
fn as_before(policy: &WorkloadNetworkPolicy, why: &str) -> Verdict {
    let condition = conditions::of(policy, conditions::WOULD_BLOCK)
        .filter(|c| c.reason != REASON_NO_HISTORY)
        .map(|c| {
            Desired::new(
                conditions::WOULD_BLOCK,
                c.status == "True",
                &c.reason,
                &c.message,
            )
        })
        .unwrap_or_else(|| Desired::new(conditions::WOULD_BLOCK, false, REASON_NO_HISTORY, why));
    let held_before =
        conditions::of(policy, conditions::READY).is_some_and(|c| c.reason == REASON_HELD);
    Verdict {
        condition,
        held: policy.spec.mode == PolicyMode::Protect && is_strict(policy) && held_before,
    }
}

fn message(report: &GateReport, held: bool) -> String {
    let mut m = format!(
        "{} of {} observed flows would be blocked",
        report.would_block, report.considered
    );
    if report.cuts_dns {
        m.push_str(", including the workload's DNS");
    }
    if report.cuts_api_server {
        m.push_str(", including its access to the API server");
    }
    m.push_str(": ");
    let examples: Vec<String> = report
        .examples
        .iter()
        .map(|e| {
            // To the minute, so that a flow seen again does not rewrite the condition every pass.
            let seen = k8s_openapi::jiff::Timestamp::from_millisecond(
                e.last_seen_ms - e.last_seen_ms % 60_000,
            )
            .map(|t| t.strftime("%Y-%m-%dT%H:%MZ").to_string())
            .unwrap_or_default();
            format!(
                "{} {}/{} (last seen {seen})",
                e.peer,
                e.protocol.as_str(),
                e.port
            )
        })
        .collect();
    m.push_str(&examples.join(", "));
    if report.would_block > report.examples.len() {
        let _ = write!(
            m,
            " and {} more",
            report.would_block - report.examples.len()
        );
    }
    if held {
        m.push_str(
            "; protect-gate strict: the policy stays in monitor until no observed flow would be blocked \
             (allow them in the policy, or let them age out of the history)",
        );
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use network_enforcer_api::Protocol;
    use serde_json::json;

    fn policy(mode: &str, gate: Option<&str>) -> WorkloadNetworkPolicy {
        let annotations = gate.map(|g| json!({ PROTECT_GATE_ANNOTATION: g }));
        serde_json::from_value(json!({
            "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
            "kind": "WorkloadNetworkPolicy",
            "metadata": {"name": "p", "namespace": "demo", "annotations": annotations},
            "spec": {"backend": "kubernetes", "direction": "Egress", "mode": mode,
                     "targetRef": {"kind": "Deployment", "name": "web"},
                     "kubernetes": {"podSelector": {}, "policyTypes": ["Egress"]}}
        }))
        .unwrap()
    }

    fn report(would_block: usize, dns: bool, api: bool) -> GateReport {
        GateReport {
            considered: 20,
            would_block,
            examples: (0..would_block.min(2))
                .map(|i| Example {
                    peer: "demo/Deployment/db".into(),
                    protocol: Protocol::TCP,
                    port: 5432 + i as u16,
                    // 2026-01-01T10:20:30.5Z: shown to the minute.
                    last_seen_ms: 1_767_262_830_500,
                })
                .collect(),
            cuts_dns: dns,
            cuts_api_server: api,
            not_evaluable: 0,
            warming_up: false,
        }
    }

    /// (mode, annotation, report, condition status, reason, held)
    type Case = (
        &'static str,
        Option<&'static str>,
        Option<GateReport>,
        bool,
        &'static str,
        bool,
    );

    #[test]
    fn verdicts() {
        let cases: [Case; 9] = [
            ("protect", None, None, false, REASON_NO_HISTORY, false),
            (
                "protect",
                Some("strict"),
                Some(report(0, false, false)),
                false,
                REASON_CLEAN,
                false,
            ),
            (
                "protect",
                None,
                Some(report(3, false, false)),
                true,
                REASON_BLOCKS,
                false,
            ),
            (
                "protect",
                Some("strict"),
                Some(report(3, false, false)),
                true,
                REASON_BLOCKS,
                true,
            ),
            (
                "protect",
                Some(" Strict "),
                Some(report(1, true, false)),
                true,
                REASON_DNS,
                true,
            ),
            (
                "protect",
                Some("off"),
                Some(report(1, false, true)),
                true,
                REASON_API_SERVER,
                false,
            ),
            // DNS names the condition before the API server.
            (
                "protect",
                None,
                Some(report(2, true, true)),
                true,
                REASON_DNS,
                false,
            ),
            // Monitor is never held, but shows what protect would block.
            (
                "monitor",
                Some("strict"),
                Some(report(1, false, false)),
                true,
                REASON_BLOCKS,
                false,
            ),
            (
                "monitor",
                None,
                Some(report(0, false, false)),
                false,
                REASON_CLEAN,
                false,
            ),
        ];
        for (mode, gate, report, status, reason, held) in cases {
            let v = verdict(&policy(mode, gate), report.as_ref());
            assert_eq!(
                (v.condition.status, v.condition.reason.as_str(), v.held),
                (status, reason, held),
                "{mode} {gate:?} {report:?}"
            );
            assert_eq!(v.condition.type_, conditions::WOULD_BLOCK);
        }
    }

    /// A strict protect policy the gate held, with its conditions as the status holds them.
    fn held_before() -> WorkloadNetworkPolicy {
        let mut p = policy("protect", Some("strict"));
        p.status = Some(
            serde_json::from_value(json!({"conditions": [
                {"type": "WouldBlock", "status": "True", "reason": REASON_BLOCKS,
                 "message": "2 of 5 observed flows would be blocked: before",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Ready", "status": "False", "reason": REASON_HELD, "message": "held",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}]}))
            .unwrap(),
        );
        p
    }

    /// Until the history can answer (none yet, or one still being rebuilt after a start that finds
    /// nothing), the gate says what it said before: a held policy stays held with its condition (a
    /// restart used to render it as protect until the history was back), and a policy without a
    /// condition gets NoHistory, never NoObservedFlowBlocked. Flows a warming history does find to be
    /// blocked are reported at once.
    #[test]
    fn until_the_history_can_answer_the_gate_keeps_what_it_said() {
        let warming = |would_block| GateReport {
            warming_up: true,
            ..report(would_block, false, false)
        };
        let before = held_before();
        for report in [None, Some(warming(0))] {
            let v = verdict(&before, report.as_ref());
            assert!(v.held, "{report:?}");
            assert_eq!(
                (v.condition.status, v.condition.reason.as_str()),
                (true, REASON_BLOCKS)
            );
            assert_eq!(
                v.condition.message,
                "2 of 5 observed flows would be blocked: before"
            );
            let fresh = verdict(&policy("protect", Some("strict")), report.as_ref());
            assert!(!fresh.held);
            assert_eq!(
                (fresh.condition.status, fresh.condition.reason.as_str()),
                (false, REASON_NO_HISTORY)
            );
        }
        let found = verdict(&before, Some(&warming(3)));
        assert!(found.held && found.condition.message.starts_with("3 of 20"));
        let complete = verdict(&before, Some(&report(0, false, false)));
        assert!(!complete.held);
        assert_eq!(complete.condition.reason, REASON_CLEAN);
    }

    #[test]
    fn the_message_names_count_examples_and_what_is_cut() {
        let v = verdict(
            &policy("protect", Some("strict")),
            Some(&report(3, true, false)),
        );
        assert_eq!(
            v.condition.message,
            "3 of 20 observed flows would be blocked, including the workload's DNS: \
             demo/Deployment/db TCP/5432 (last seen 2026-01-01T10:20Z), \
             demo/Deployment/db TCP/5433 (last seen 2026-01-01T10:20Z) and 1 more; \
             protect-gate strict: the policy stays in monitor until no observed flow would be blocked \
             (allow them in the policy, or let them age out of the history)"
        );
    }
}
