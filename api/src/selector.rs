//! Label selector semantics (`metav1.LabelSelector`), shared by overlap checks and policy evaluation.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

/// True when `labels` satisfy `selector`: every matchLabels entry and every matchExpression.
/// An empty selector matches everything (as in NetworkPolicy); an unknown operator matches nothing,
/// so a malformed selector can never widen what a policy covers.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let expressions_ok = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && expressions_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sel(v: serde_json::Value) -> LabelSelector {
        serde_json::from_value(v).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn match_labels_and_expressions() {
        let s = sel(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "env", "operator": "NotIn", "values": ["dev"]},
                {"key": "team", "operator": "Exists"}
            ]
        }));
        assert!(matches(
            &s,
            &labels(&[("app", "web"), ("tier", "a"), ("team", "x")])
        ));
        assert!(!matches(
            &s,
            &labels(&[("app", "web"), ("tier", "c"), ("team", "x")])
        ));
        assert!(!matches(
            &s,
            &labels(&[
                ("app", "web"),
                ("tier", "a"),
                ("team", "x"),
                ("canary", "1")
            ])
        ));
        assert!(!matches(
            &s,
            &labels(&[("app", "web"), ("tier", "a"), ("team", "x"), ("env", "dev")])
        ));
        assert!(!matches(&s, &labels(&[("app", "web"), ("tier", "a")])));
        assert!(!matches(
            &s,
            &labels(&[("app", "api"), ("tier", "a"), ("team", "x")])
        ));
    }

    #[test]
    fn empty_selects_all_and_unknown_operator_selects_nothing() {
        assert!(matches(&LabelSelector::default(), &labels(&[])));
        let bad = sel(json!({"matchExpressions": [{"key": "a", "operator": "Like"}]}));
        assert!(!matches(&bad, &labels(&[("a", "1")])));
        // Whether a selector selects something at all is `network_enforcer_api::validation::selects_something`.
    }
}
