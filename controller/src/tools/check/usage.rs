//! Rule usage: when each rule of a WorkloadNetworkPolicy last allowed an observed flow, as its
//! status records it.

use super::*;

/// One rule's usage as `check` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleUsageLine {
    pub namespace: String,
    pub name: String,
    /// `ingress[0]`.
    pub rule: String,
    /// `last matched 2h ago, 3 peers`, `never matched`, or `usage unknown` (the status has no entry
    /// for the rule as it is now).
    pub usage: String,
    /// When the rule last allowed an observed flow, as recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_matched: Option<Time>,
    /// Distinct peers it allowed (at most 1000).
    pub peers: i64,
}

/// The usage of every rule of the WorkloadNetworkPolicies whose status records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuleUsageReport {
    pub rules: Vec<RuleUsageLine>,
}

impl RuleUsageReport {
    /// `POLICY  RULE  USAGE` rows.
    pub fn render_table(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .rules
            .iter()
            .map(|r| {
                vec![
                    format!("wnp/{}/{}", r.namespace, r.name),
                    r.rule.clone(),
                    r.usage.clone(),
                ]
            })
            .collect();
        table(&["POLICY", "RULE", "USAGE"], &rows)
    }
}

impl Checker {
    /// Measures "how long ago" in [`Checker::rule_usage`] from `now` instead of the clock.
    pub fn with_now(mut self, now: Time) -> Self {
        self.now = now;
        self
    }

    /// The usage of each rule of the scenario's WorkloadNetworkPolicies whose status records
    /// `ruleUsage` (e.g. taken with `kubectl get -o yaml`); `None` when none does.
    pub fn rule_usage(&self) -> Option<RuleUsageReport> {
        if self.usage.is_empty() {
            return None;
        }
        let rules = self
            .usage
            .iter()
            .flat_map(|p| {
                p.rules.iter().map(move |rule| {
                    let entry = rule.entry_in(&p.usage);
                    RuleUsageLine {
                        namespace: p.namespace.clone(),
                        name: p.name.clone(),
                        rule: rule.name(),
                        usage: rule_usage::describe(rule, &p.usage, &self.now),
                        last_matched: entry.and_then(|e| e.last_matched.clone()),
                        peers: entry.map_or(0, |e| e.peers),
                    }
                })
            })
            .collect();
        Some(RuleUsageReport { rules })
    }
}
