//! `check --diff-policies` (docs/operations.md, "`check`"): the scenario's flows under its own
//! policies (old) and under another set (new), and the flows whose decision changes, each side
//! explained under both.

use super::explain::explanation_text;
use super::{CheckError, CheckReport, CheckResult, ScenarioPeer, Side, peer_text, table};
use network_enforcer_api::Protocol;
use serde::Serialize;
use std::fmt::Write as _;

/// Reads the new policies: YAML or JSON, as a list of objects, a `kind: List` with `items`, one
/// object, or several `---` documents (what `kubectl get -o yaml` prints, or a directory's files
/// concatenated). Each object is checked later as a scenario's `policies[i]` is, `i` counting objects
/// across documents.
pub fn parse_policies(text: &str) -> Result<Vec<serde_json::Value>, CheckError> {
    use serde::Deserialize as _;
    let mut policies = Vec::new();
    for (d, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let field = format!("document {}", d + 1);
        let value = serde_json::Value::deserialize(document)
            .map_err(|e| CheckError::new(&field, format!("invalid YAML or JSON: {e}")))?;
        match value {
            // An empty document (a trailing `---`) holds nothing.
            serde_json::Value::Null => {}
            serde_json::Value::Array(items) => policies.extend(items),
            serde_json::Value::Object(mut map) if map.contains_key("items") => {
                match map.remove("items") {
                    Some(serde_json::Value::Array(items)) => policies.extend(items),
                    // `items: null` is an empty List, as kubectl prints one.
                    Some(serde_json::Value::Null) | None => {}
                    Some(_) => {
                        return Err(CheckError::new(
                            format!("{field}.items"),
                            "must be a list of NetworkPolicy and WorkloadNetworkPolicy objects",
                        ));
                    }
                }
            }
            object @ serde_json::Value::Object(_) => policies.push(object),
            _ => {
                return Err(CheckError::new(
                    field,
                    "expected a policy object, a list of them, or a `kind: List` with `items`",
                ));
            }
        }
    }
    Ok(policies)
}

/// A flow's verdict under one set of policies, both sides explained.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub allowed: bool,
    pub egress: Side,
    pub ingress: Side,
}

/// A flow whose decision differs between the old and the new policies.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DiffChange {
    pub from: ScenarioPeer,
    pub to: ScenarioPeer,
    pub protocol: Protocol,
    pub port: u16,
    pub old: Verdict,
    pub new: Verdict,
}

/// What changes from the old policies to the new ones.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DiffReport {
    /// Flows compared.
    pub flows: usize,
    /// Flows with the same decision under both (the deciding rules may still differ).
    pub unchanged: usize,
    /// Flows the old policies allow and the new ones deny.
    pub now_denied: Vec<DiffChange>,
    /// Flows the old policies deny and the new ones allow.
    pub now_allowed: Vec<DiffChange>,
}

/// Compares the results of the same flows under old and new policies, flow by flow in input order
/// ([`super::Checker::with_policies`] builds the new checker with the same pods and flows). Pass
/// explained reports ([`super::Checker::explain`]) so that each change says which rule decided.
pub fn diff(old: &CheckReport, new: &CheckReport) -> DiffReport {
    let mut report = DiffReport {
        flows: old.results.len().min(new.results.len()),
        unchanged: 0,
        now_denied: Vec::new(),
        now_allowed: Vec::new(),
    };
    for (old, new) in old.results.iter().zip(&new.results) {
        if old.allowed == new.allowed {
            report.unchanged += 1;
            continue;
        }
        let verdict = |r: &CheckResult| Verdict {
            allowed: r.allowed,
            egress: r.egress.clone(),
            ingress: r.ingress.clone(),
        };
        let change = DiffChange {
            from: old.from.clone(),
            to: old.to.clone(),
            protocol: old.protocol,
            port: old.port,
            old: verdict(old),
            new: verdict(new),
        };
        if old.allowed {
            report.now_denied.push(change);
        } else {
            report.now_allowed.push(change);
        }
    }
    report
}

impl DiffReport {
    /// The diff for people: `-` for flows now denied, `+` for flows now allowed, each side explained
    /// under the old then the new policies, then a summary line.
    pub fn render_table(&self) -> String {
        let mut rows = Vec::new();
        for (sign, changes) in [("-", &self.now_denied), ("+", &self.now_allowed)] {
            for c in changes {
                let sides = [
                    ("egress", &c.old.egress, &c.new.egress),
                    ("ingress", &c.old.ingress, &c.new.ingress),
                ];
                for (s, (name, old, new)) in sides.into_iter().enumerate() {
                    // The flow is written once, on its first row.
                    let flow = if s == 0 {
                        vec![
                            sign.to_string(),
                            peer_text(&c.from),
                            peer_text(&c.to),
                            c.protocol.to_string(),
                            c.port.to_string(),
                        ]
                    } else {
                        vec![String::new(); 5]
                    };
                    let mut row = flow;
                    row.extend([name.to_string(), "old".into(), explanation_text(old)]);
                    rows.push(row);
                    let mut row = vec![String::new(); 6];
                    row.extend(["new".to_string(), explanation_text(new)]);
                    rows.push(row);
                }
            }
        }
        let mut out = table(
            &[
                "", "FROM", "TO", "PROTO", "PORT", "SIDE", "POLICIES", "DECISION",
            ],
            &rows,
        );
        let _ = writeln!(
            out,
            "{} flow(s): {} now denied, {} now allowed, {} unchanged",
            self.flows,
            self.now_denied.len(),
            self.now_allowed.len(),
            self.unchanged
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::check::explain::{Decision, MatchedRule};
    use crate::tools::check::{DecidingPolicy, PolicyKind};

    fn peer(pod: &str) -> ScenarioPeer {
        ScenarioPeer {
            pod: Some(pod.into()),
            ip: None,
            name: None,
        }
    }

    fn np(name: &str) -> DecidingPolicy {
        DecidingPolicy {
            kind: PolicyKind::NetworkPolicy,
            namespace: "shop".into(),
            name: name.into(),
            mode: None,
        }
    }

    fn open() -> Side {
        Side {
            allowed: true,
            policies: vec![],
            decision: Some(Decision::NotIsolated),
            rules: vec![],
            tiers: vec![],
            decided_by: None,
        }
    }

    fn allowed_by(name: &str, rule: &str) -> Side {
        Side {
            allowed: true,
            policies: vec![np(name)],
            decision: Some(Decision::Allowed),
            rules: vec![MatchedRule {
                policy: np(name),
                index: 0,
                rule: rule.into(),
            }],
            tiers: vec![],
            decided_by: None,
        }
    }

    fn isolated(names: &[&str]) -> Side {
        Side {
            allowed: false,
            policies: names.iter().map(|n| np(n)).collect(),
            decision: Some(Decision::Isolated),
            rules: vec![],
            tiers: vec![],
            decided_by: None,
        }
    }

    fn result(port: u16, egress: Side, ingress: Side) -> CheckResult {
        CheckResult {
            from: peer("shop/web-0"),
            to: peer("shop/db-0"),
            protocol: Protocol::TCP,
            port,
            allowed: egress.allowed && ingress.allowed,
            egress,
            ingress,
        }
    }

    /// Which flows change, and in which list; unchanged decisions are counted even when the
    /// deciding rule changed.
    #[test]
    fn only_changed_decisions_are_listed() {
        let rule = "ingress[0] from app=web ns=shop TCP/5432";
        // Name, old result, new result, and (now denied, now allowed, unchanged).
        type Case = (
            &'static str,
            CheckResult,
            CheckResult,
            (usize, usize, usize),
        );
        let cases: Vec<Case> = vec![
            (
                "allowed → denied by a new isolating policy",
                result(5432, open(), open()),
                result(5432, open(), isolated(&["db-ingress", "deny-all"])),
                (1, 0, 0),
            ),
            (
                "denied → allowed by a new rule",
                result(5432, isolated(&["web-egress"]), open()),
                result(5432, allowed_by("web-egress", rule), open()),
                (0, 1, 0),
            ),
            (
                "allowed by another rule: unchanged",
                result(5432, open(), allowed_by("db-ingress", rule)),
                result(5432, open(), allowed_by("db-ingress-2", rule)),
                (0, 0, 1),
            ),
            (
                "denied by the egress side only now: unchanged",
                result(5432, open(), isolated(&["db-ingress"])),
                result(5432, isolated(&["web-egress"]), open()),
                (0, 0, 1),
            ),
        ];
        for (name, old, new, (denied, allowed, unchanged)) in cases {
            let report = diff(
                &CheckReport {
                    results: vec![old.clone()],
                },
                &CheckReport {
                    results: vec![new.clone()],
                },
            );
            assert_eq!(report.flows, 1, "{name}");
            assert_eq!(
                (
                    report.now_denied.len(),
                    report.now_allowed.len(),
                    report.unchanged
                ),
                (denied, allowed, unchanged),
                "{name}"
            );
            if let Some(change) = report.now_denied.first().or(report.now_allowed.first()) {
                assert_eq!(change.old.ingress, old.ingress, "{name}");
                assert_eq!(change.new.ingress, new.ingress, "{name}");
                assert_eq!(change.new.egress, new.egress, "{name}");
                assert_eq!(change.port, 5432, "{name}");
            }
        }
    }

    #[test]
    fn the_table_explains_both_sides_old_and_new() {
        let old = CheckReport {
            results: vec![result(5432, open(), open()), result(80, open(), open())],
        };
        let new = CheckReport {
            results: vec![
                result(5432, open(), isolated(&["db-ingress", "deny-all"])),
                result(80, open(), open()),
            ],
        };
        let text = diff(&old, &new).render_table();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 6, "{text}");
        assert!(
            lines[1].starts_with("-  shop/web-0  shop/db-0  TCP"),
            "{text}"
        );
        assert!(
            lines[1].ends_with("egress   old       not isolated"),
            "{text}"
        );
        assert!(lines[2].trim_start().starts_with("new"), "{text}");
        assert!(
            lines[4].ends_with(
                "new       isolated by np/shop/db-ingress, np/shop/deny-all; no rule matches"
            ),
            "{text}"
        );
        assert_eq!(
            lines[5],
            "2 flow(s): 1 now denied, 0 now allowed, 1 unchanged"
        );
    }

    #[test]
    fn policies_files_take_kubectl_shapes() {
        let np = "{kind: NetworkPolicy, metadata: {name: a, namespace: shop}}";
        let cases = [
            (format!("- {np}\n- {np}\n"), 2),
            (format!("kind: List\nitems:\n- {np}\n"), 1),
            ("kind: List\nitems: null\n".to_string(), 0),
            (format!("{np}\n---\n{np}\n---\n"), 2),
            (String::new(), 0),
            (format!("[{np}]"), 1),
        ];
        for (text, count) in cases {
            assert_eq!(parse_policies(&text).unwrap().len(), count, "{text}");
        }
        let err = parse_policies("kind: List\nitems: 3\n").unwrap_err();
        assert_eq!(err.field, "document 1.items", "{err}");
        let err = parse_policies(&format!("{np}\n---\n7\n")).unwrap_err();
        assert_eq!(err.field, "document 2", "{err}");
        let err = parse_policies("[\n").unwrap_err();
        assert_eq!(err.field, "document 1", "{err}");
    }
}
