//! The protect gate (docs/api.md, "Protect gate"): what replaying the observed traffic against a policy
//! ([`crate::monitor::edge_history::EdgeHistory::replay`]) means for it: the `WouldBlock` condition,
//! the Event, and whether a `strict` policy in protect is held in monitor.

use crate::monitor::edge_history::GateReport;
use crate::policy::conditions::{self, Desired};
use network_enforcer_api::keys::{PROTECT_GATE_ANNOTATION, PROTECT_GATE_STRICT};
use network_enforcer_api::{PolicyMode, WorkloadNetworkPolicy};
use std::fmt::Write as _;

/// Condition reasons of `WouldBlock`.
pub const REASON_CLEAN: &str = "NoObservedFlowBlocked";
pub const REASON_BLOCKS: &str = "WouldBlockObservedFlows";
pub const REASON_DNS: &str = "WouldCutDNS";
pub const REASON_API_SERVER: &str = "WouldCutAPIServer";
pub const REASON_NO_HISTORY: &str = "NoHistory";
/// `Ready` reason of a strict protect policy held in monitor.
pub const REASON_HELD: &str = "HeldByProtectGate";

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
pub fn verdict(policy: &WorkloadNetworkPolicy, report: Option<&GateReport>) -> Verdict {
    let Some(report) = report else {
        return Verdict {
            condition: Desired::new(
                conditions::WOULD_BLOCK,
                false,
                REASON_NO_HISTORY,
                "no observed traffic is held by this controller yet; the gate is checked again later",
            ),
            held: false,
        };
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
    use crate::monitor::edge_history::Example;
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
