//! The API server's validation of NetworkPolicy objects, for `check` (docs/operations.md, "`check`":
//! Validation). A policy the API server would refuse never exists in a cluster, so evaluating it would
//! answer a question nobody can ask: `check` refuses it instead, naming the field.
//!
//! The rules are those of Kubernetes' `ValidateNetworkPolicy` (pkg/apis/networking/validation) and the
//! metadata and label-selector checks it calls, read from the upstream sources: names, label keys and
//! values, selector operators, ports, named ports, protocols, ipBlocks and policyTypes. CIDRs are read
//! as the evaluator reads them (`ipnet`): host bits may be set and IPv4 octets may have leading zeros
//! (read as decimal), as the API server allows unless its strict IP validation is on.
//!
//! Only the first problem is reported, in upstream order: metadata, podSelector, each ingress rule's
//! ports then peers, each egress rule's, policyTypes.

use super::CheckError;
use ipnet::IpNet;
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use network_enforcer_api::validation::is_dns1123_subdomain;
use std::collections::BTreeMap;

type Checked = Result<(), CheckError>;

fn invalid(field: impl Into<String>, message: impl Into<String>) -> Checked {
    Err(CheckError::new(field, message))
}

/// `metadata` of a namespaced object (`field` is its path): the name a DNS-1123 subdomain, the
/// namespace a DNS-1123 label, valid labels. Returns (namespace, name).
pub(super) fn metadata(field: &str, metadata: &ObjectMeta) -> Result<(String, String), CheckError> {
    let namespace = metadata.namespace.clone().unwrap_or_default();
    let name = metadata.name.clone().unwrap_or_default();
    if namespace.is_empty() {
        invalid(format!("{field}.namespace"), "must not be empty")?;
    }
    if !is_dns1123_label(&namespace) {
        invalid(
            format!("{field}.namespace"),
            format!("{namespace:?} {DNS1123_LABEL}"),
        )?;
    }
    if name.is_empty() {
        invalid(format!("{field}.name"), "must not be empty")?;
    }
    if !is_dns1123_subdomain(&name) {
        invalid(
            format!("{field}.name"),
            format!("{name:?} {DNS1123_SUBDOMAIN}"),
        )?;
    }
    if let Some(labels) = &metadata.labels {
        label_map(&format!("{field}.labels"), labels)?;
    }
    Ok((namespace, name))
}

/// A NetworkPolicy spec; `field` is its path (`policies[2].spec`, or `.spec.kubernetes` of a
/// WorkloadNetworkPolicy, which renders into one).
pub(super) fn spec(field: &str, spec: &NetworkPolicySpec) -> Checked {
    if let Some(selector) = &spec.pod_selector {
        label_selector(&format!("{field}.podSelector"), selector)?;
    }
    for (i, rule) in spec.ingress.iter().flatten().enumerate() {
        let rule_field = format!("{field}.ingress[{i}]");
        rule_ports(&rule_field, rule.ports.as_deref())?;
        for (j, peer_spec) in rule.from.iter().flatten().enumerate() {
            peer(&format!("{rule_field}.from[{j}]"), peer_spec)?;
        }
    }
    for (i, rule) in spec.egress.iter().flatten().enumerate() {
        let rule_field = format!("{field}.egress[{i}]");
        rule_ports(&rule_field, rule.ports.as_deref())?;
        for (j, peer_spec) in rule.to.iter().flatten().enumerate() {
            peer(&format!("{rule_field}.to[{j}]"), peer_spec)?;
        }
    }
    let types = spec.policy_types.as_deref().unwrap_or_default();
    if types.len() > 2 {
        invalid(
            format!("{field}.policyTypes"),
            "may not specify more than two policyTypes",
        )?;
    }
    for (i, t) in types.iter().enumerate() {
        if t != "Ingress" && t != "Egress" {
            invalid(
                format!("{field}.policyTypes[{i}]"),
                format!("{t:?} is not supported: expected Ingress or Egress"),
            )?;
        }
    }
    Ok(())
}

fn rule_ports(rule_field: &str, ports: Option<&[NetworkPolicyPort]>) -> Checked {
    for (j, p) in ports.unwrap_or_default().iter().enumerate() {
        port(&format!("{rule_field}.ports[{j}]"), p)?;
    }
    Ok(())
}

const PORT_RANGE: &str = "must be between 1 and 65535";

fn port(field: &str, port: &NetworkPolicyPort) -> Checked {
    if let Some(protocol) = &port.protocol {
        if network_enforcer_api::Protocol::from_kubernetes(Some(protocol)).is_none() {
            invalid(
                format!("{field}.protocol"),
                format!("{protocol:?} is not supported: expected TCP, UDP or SCTP"),
            )?;
        }
    }
    let end_field = format!("{field}.endPort");
    match (&port.port, port.end_port) {
        (Some(IntOrString::Int(number)), end) => {
            if !(1..=65535).contains(number) {
                invalid(format!("{field}.port"), format!("{number} {PORT_RANGE}"))?;
            }
            if let Some(end) = end {
                if end < *number {
                    invalid(
                        end_field.clone(),
                        format!("{end} must be greater than or equal to `port` ({number})"),
                    )?;
                }
                if !(1..=65535).contains(&end) {
                    invalid(end_field, format!("{end} {PORT_RANGE}"))?;
                }
            }
        }
        (Some(IntOrString::String(name)), end) => {
            if end.is_some() {
                invalid(end_field, "may not be specified when `port` is non-numeric")?;
            }
            if let Some(problem) = port_name_problem(name) {
                invalid(format!("{field}.port"), format!("{name:?} {problem}"))?;
            }
        }
        (None, Some(_)) => invalid(
            end_field,
            "may not be specified when `port` is not specified",
        )?,
        (None, None) => {}
    }
    Ok(())
}

/// What is wrong with a named port (an IANA service name: RFC 6335, lowercase only), if anything.
fn port_name_problem(name: &str) -> Option<&'static str> {
    if name.len() > 15 {
        Some("must be no more than 15 characters")
    } else if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        || name.is_empty()
    {
        Some("must contain only lowercase alphanumeric characters (a-z, 0-9) and hyphens (-)")
    } else if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        Some("must contain at least one letter (a-z)")
    } else if name.contains("--") {
        Some("must not contain consecutive hyphens")
    } else if name.starts_with('-') || name.ends_with('-') {
        Some("must not begin or end with a hyphen")
    } else {
        None
    }
}

fn peer(field: &str, peer: &NetworkPolicyPeer) -> Checked {
    if let Some(selector) = &peer.pod_selector {
        label_selector(&format!("{field}.podSelector"), selector)?;
    }
    if let Some(selector) = &peer.namespace_selector {
        label_selector(&format!("{field}.namespaceSelector"), selector)?;
    }
    if let Some(block) = &peer.ip_block {
        ip_block(&format!("{field}.ipBlock"), block)?;
        if peer.pod_selector.is_some() || peer.namespace_selector.is_some() {
            invalid(field, "may not specify both ipBlock and another peer")?;
        }
    } else if peer.pod_selector.is_none() && peer.namespace_selector.is_none() {
        invalid(
            field,
            "must specify a peer: podSelector, namespaceSelector or ipBlock",
        )?;
    }
    Ok(())
}

fn ip_block(field: &str, block: &IPBlock) -> Checked {
    let cidr_field = format!("{field}.cidr");
    if block.cidr.is_empty() {
        invalid(&cidr_field, "must not be empty")?;
    }
    let cidr = parse_cidr(&cidr_field, &block.cidr)?;
    for (i, text) in block.except.iter().flatten().enumerate() {
        let except_field = format!("{field}.except[{i}]");
        let except = parse_cidr(&except_field, text)?;
        // As upstream: the except's network address lies in `cidr` and its prefix is longer (an IPv4
        // except never lies in an IPv6 cidr).
        let same_family = matches!(
            (cidr, except),
            (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_))
        );
        if !same_family
            || !cidr.contains(&except.network())
            || cidr.prefix_len() >= except.prefix_len()
        {
            invalid(
                except_field,
                format!(
                    "{text:?} must be a strict subset of `cidr` ({})",
                    block.cidr
                ),
            )?;
        }
    }
    Ok(())
}

fn parse_cidr(field: &str, text: &str) -> Result<IpNet, CheckError> {
    text.parse::<IpNet>().map_err(|_| {
        CheckError::new(
            field,
            format!("{text:?} must be a valid CIDR such as 10.0.0.0/8 or fd00::/64"),
        )
    })
}

fn label_selector(field: &str, selector: &LabelSelector) -> Checked {
    if let Some(labels) = &selector.match_labels {
        label_map(&format!("{field}.matchLabels"), labels)?;
    }
    for (i, e) in selector.match_expressions.iter().flatten().enumerate() {
        let field = format!("{field}.matchExpressions[{i}]");
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => invalid(
                format!("{field}.values"),
                "must be specified when `operator` is In or NotIn",
            )?,
            "Exists" | "DoesNotExist" if !values.is_empty() => invalid(
                format!("{field}.values"),
                "may not be specified when `operator` is Exists or DoesNotExist",
            )?,
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => invalid(
                format!("{field}.operator"),
                format!(
                    "{other:?} is not a valid selector operator: expected In, NotIn, Exists or DoesNotExist"
                ),
            )?,
        }
        if let Some(problem) = label_key_problem(&e.key) {
            invalid(format!("{field}.key"), format!("{:?} {problem}", e.key))?;
        }
        for (j, value) in values.iter().enumerate() {
            if let Some(problem) = label_value_problem(value) {
                invalid(
                    format!("{field}.values[{j}]"),
                    format!("{value:?} {problem}"),
                )?;
            }
        }
    }
    Ok(())
}

fn label_map(field: &str, labels: &BTreeMap<String, String>) -> Checked {
    for (key, value) in labels {
        if let Some(problem) = label_key_problem(key) {
            invalid(field, format!("key {key:?} {problem}"))?;
        }
        if let Some(problem) = label_value_problem(value) {
            invalid(field, format!("value {value:?} of {key:?} {problem}"))?;
        }
    }
    Ok(())
}

const DNS1123_LABEL: &str = "must be a lowercase RFC 1123 label: at most 63 characters, lowercase alphanumerics or '-', starting and ending with an alphanumeric";
const DNS1123_SUBDOMAIN: &str = "must be a lowercase RFC 1123 subdomain: at most 253 characters, lowercase alphanumerics, '-' or '.', starting and ending with an alphanumeric";
const NAME_PART: &str = "must be at most 63 characters, alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric";

fn is_dns1123_label(name: &str) -> bool {
    name.len() <= 63 && !name.contains('.') && is_dns1123_subdomain(name)
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters: the name part of a label key,
/// and a non-empty label value.
fn is_name_part(s: &str) -> bool {
    let alphanumeric = |b: &u8| b.is_ascii_alphanumeric();
    let bytes = s.as_bytes();
    s.len() <= 63
        && bytes.first().is_some_and(alphanumeric)
        && bytes.last().is_some_and(alphanumeric)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// What is wrong with a label key (`[prefix/]name`, the prefix a DNS-1123 subdomain), if anything.
fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some("has an empty prefix before '/'".into());
        }
        if !is_dns1123_subdomain(prefix) {
            return Some(format!("has a prefix that {DNS1123_SUBDOMAIN}"));
        }
    }
    if name.is_empty() {
        return Some("has an empty name part".into());
    }
    if !is_name_part(name) {
        return Some(format!(
            "has a name part that {NAME_PART} (at most one '/' after a prefix)"
        ));
    }
    None
}

fn label_value_problem(value: &str) -> Option<String> {
    (!value.is_empty() && !is_name_part(value)).then(|| NAME_PART.to_string())
}

/// A ClusterNetworkPolicy's spec as the CRD's schema and rules (network-policy-api v1alpha2) accept
/// it: a tier, a priority in 0..=1000, exactly one subject field, at most 25 rules per direction and
/// what [`netpol::cluster`] reads (an action, exactly one field per peer and protocol entry, valid
/// CIDRs and ports). The experimental `nodes` and `domainNames` peers are accepted: the evaluation
/// fails closed on them, as docs/behaviour.md says.
pub(super) fn cluster_policy(
    field: &str,
    name: &str,
    spec: &network_enforcer_api::cluster_network_policy::ClusterNetworkPolicySpec,
) -> Checked {
    use netpol::cluster::ClusterPolicy;
    use network_enforcer_api::Direction;
    if !(0..=1000).contains(&spec.priority) {
        invalid(format!("{field}.priority"), "must be between 0 and 1000")?;
    }
    let policy = ClusterPolicy::parse(name, spec).map_err(|why| {
        let at = match why {
            netpol::Invalid::Tier(_) => "tier",
            _ => "subject",
        };
        CheckError::new(format!("{field}.{at}"), why.to_string())
    })?;
    if let Some(s) = &spec.subject.namespaces {
        label_selector(&format!("{field}.subject.namespaces"), s)?;
    }
    for (direction, list) in [
        (Direction::Ingress, "ingress"),
        (Direction::Egress, "egress"),
    ] {
        let rules = policy.rules(direction);
        if rules.len() > 25 {
            invalid(format!("{field}.{list}"), "at most 25 rules")?;
        }
        for (i, rule) in rules.iter().enumerate() {
            match &rule.invalid {
                None | Some(netpol::Invalid::Unsupported(_)) => {}
                Some(why) => invalid(format!("{field}.{list}[{i}]"), why.to_string())?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A valid policy with every kind of field, to change one at a time.
    fn base() -> Value {
        json!({
            "metadata": {"name": "web.v1", "namespace": "demo", "labels": {"app.kubernetes.io/name": "web"}},
            "spec": {
                "podSelector": {"matchLabels": {"app": "web"},
                                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{
                    "from": [{"podSelector": {}}, {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                    "ports": [{"port": 80}, {"protocol": "UDP", "port": 8000, "endPort": 8100}, {"port": "http"}]
                }],
                "egress": [{"to": [{"namespaceSelector": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}],
                            "ports": [{"protocol": "SCTP"}]}]
            }
        })
    }

    fn run(policy: &Value) -> Checked {
        let np: k8s_openapi::api::networking::v1::NetworkPolicy =
            serde_json::from_value(policy.clone()).expect("the case deserializes");
        metadata("p.metadata", &np.metadata)?;
        spec("p.spec", &np.spec.unwrap_or_default())
    }

    /// `base()` with the value at `pointer` replaced (`None`: removed).
    fn with(pointer: &str, value: Option<Value>) -> Value {
        let mut policy = base();
        let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
        let target = policy.pointer_mut(parent).expect("the parent exists");
        match (target, value) {
            (Value::Object(map), Some(v)) => {
                map.insert(key.to_string(), v);
            }
            (Value::Object(map), None) => {
                map.remove(key);
            }
            (Value::Array(items), Some(v)) => items[key.parse::<usize>().unwrap()] = v,
            (other, _) => panic!("cannot set {pointer} in {other}"),
        }
        policy
    }

    /// What a case is, where it changes `base()`, the new value (`None`: removed), and Ok or the field
    /// with a piece of the message.
    type Case = (
        &'static str,
        String,
        Option<Value>,
        Result<(), (&'static str, &'static str)>,
    );

    #[test]
    fn every_rule_accepts_the_valid_and_refuses_the_invalid_naming_the_field() {
        assert_eq!(run(&base()), Ok(()));
        let ingress = "/spec/ingress/0";
        let port0 = "/spec/ingress/0/ports/0";
        let peer1 = "/spec/ingress/0/from/1";
        let expr = "/spec/podSelector/matchExpressions/0";
        let cases: Vec<Case> = vec![
            // metadata
            (
                "name at 253",
                "/metadata/name".into(),
                Some(json!("a".repeat(253))),
                Ok(()),
            ),
            (
                "name too long",
                "/metadata/name".into(),
                Some(json!("a".repeat(254))),
                Err(("p.metadata.name", "RFC 1123 subdomain")),
            ),
            (
                "name uppercase",
                "/metadata/name".into(),
                Some(json!("Web")),
                Err(("p.metadata.name", "RFC 1123 subdomain")),
            ),
            (
                "name underscore",
                "/metadata/name".into(),
                Some(json!("a_b")),
                Err(("p.metadata.name", "RFC 1123")),
            ),
            (
                "name missing",
                "/metadata/name".into(),
                None,
                Err(("p.metadata.name", "must not be empty")),
            ),
            (
                "namespace missing",
                "/metadata/namespace".into(),
                None,
                Err(("p.metadata.namespace", "must not be empty")),
            ),
            (
                "namespace with a dot",
                "/metadata/namespace".into(),
                Some(json!("a.b")),
                Err(("p.metadata.namespace", "RFC 1123 label")),
            ),
            (
                "namespace at 63",
                "/metadata/namespace".into(),
                Some(json!("n".repeat(63))),
                Ok(()),
            ),
            (
                "namespace at 64",
                "/metadata/namespace".into(),
                Some(json!("n".repeat(64))),
                Err(("p.metadata.namespace", "RFC 1123 label")),
            ),
            (
                "metadata label value",
                "/metadata/labels".into(),
                Some(json!({"a": "-x"})),
                Err(("p.metadata.labels", "value \"-x\"")),
            ),
            // label keys and values
            (
                "key with prefix",
                format!("{expr}/key"),
                Some(json!("example.com/tier")),
                Ok(()),
            ),
            (
                "key empty prefix",
                format!("{expr}/key"),
                Some(json!("/tier")),
                Err(("p.spec.podSelector.matchExpressions[0].key", "empty prefix")),
            ),
            (
                "key bad prefix",
                format!("{expr}/key"),
                Some(json!("Example.com/tier")),
                Err(("p.spec.podSelector.matchExpressions[0].key", "prefix")),
            ),
            (
                "key two slashes",
                format!("{expr}/key"),
                Some(json!("a/b/c")),
                Err(("p.spec.podSelector.matchExpressions[0].key", "name part")),
            ),
            (
                "key empty",
                format!("{expr}/key"),
                Some(json!("")),
                Err((
                    "p.spec.podSelector.matchExpressions[0].key",
                    "empty name part",
                )),
            ),
            (
                "key name 63",
                format!("{expr}/key"),
                Some(json!("k".repeat(63))),
                Ok(()),
            ),
            (
                "key name 64",
                format!("{expr}/key"),
                Some(json!("k".repeat(64))),
                Err(("p.spec.podSelector.matchExpressions[0].key", "at most 63")),
            ),
            (
                "key space",
                "/spec/podSelector/matchLabels".into(),
                Some(json!({"a b": "x"})),
                Err(("p.spec.podSelector.matchLabels", "key \"a b\"")),
            ),
            (
                "value empty",
                "/spec/podSelector/matchLabels".into(),
                Some(json!({"a": ""})),
                Ok(()),
            ),
            (
                "value underscore dot",
                "/spec/podSelector/matchLabels".into(),
                Some(json!({"a": "x_y.z"})),
                Ok(()),
            ),
            (
                "value trailing dash",
                "/spec/podSelector/matchLabels".into(),
                Some(json!({"a": "x-"})),
                Err(("p.spec.podSelector.matchLabels", "value \"x-\"")),
            ),
            (
                "value 64",
                "/spec/podSelector/matchLabels".into(),
                Some(json!({"a": "v".repeat(64)})),
                Err(("p.spec.podSelector.matchLabels", "at most 63")),
            ),
            (
                "expression value",
                format!("{expr}/values"),
                Some(json!(["ok", "not ok"])),
                Err((
                    "p.spec.podSelector.matchExpressions[0].values[1]",
                    "\"not ok\"",
                )),
            ),
            // selector operators
            (
                "operator unknown",
                format!("{expr}/operator"),
                Some(json!("Like")),
                Err((
                    "p.spec.podSelector.matchExpressions[0].operator",
                    "not a valid selector operator",
                )),
            ),
            (
                "operator lowercase",
                format!("{expr}/operator"),
                Some(json!("in")),
                Err(("p.spec.podSelector.matchExpressions[0].operator", "\"in\"")),
            ),
            (
                "In without values",
                format!("{expr}/values"),
                None,
                Err((
                    "p.spec.podSelector.matchExpressions[0].values",
                    "must be specified",
                )),
            ),
            (
                "NotIn with empty values",
                expr.to_string(),
                Some(json!({"key": "a", "operator": "NotIn", "values": []})),
                Err((
                    "p.spec.podSelector.matchExpressions[0].values",
                    "must be specified",
                )),
            ),
            (
                "Exists with values",
                expr.to_string(),
                Some(json!({"key": "a", "operator": "Exists", "values": ["x"]})),
                Err((
                    "p.spec.podSelector.matchExpressions[0].values",
                    "may not be specified",
                )),
            ),
            (
                "DoesNotExist",
                expr.to_string(),
                Some(json!({"key": "a", "operator": "DoesNotExist"})),
                Ok(()),
            ),
            (
                "peer selector",
                "/spec/egress/0/to/0/namespaceSelector/matchExpressions/0/operator".into(),
                Some(json!("Gt")),
                Err((
                    "p.spec.egress[0].to[0].namespaceSelector.matchExpressions[0].operator",
                    "\"Gt\"",
                )),
            ),
            // ports
            (
                "port 65535",
                format!("{port0}/port"),
                Some(json!(65535)),
                Ok(()),
            ),
            (
                "port 0",
                format!("{port0}/port"),
                Some(json!(0)),
                Err(("p.spec.ingress[0].ports[0].port", "between 1 and 65535")),
            ),
            (
                "port 65536",
                format!("{port0}/port"),
                Some(json!(65536)),
                Err(("p.spec.ingress[0].ports[0].port", "between 1 and 65535")),
            ),
            (
                "port negative",
                format!("{port0}/port"),
                Some(json!(-1)),
                Err(("p.spec.ingress[0].ports[0].port", "between 1 and 65535")),
            ),
            (
                "endPort = port",
                port0.to_string(),
                Some(json!({"port": 80, "endPort": 80})),
                Ok(()),
            ),
            (
                "endPort < port",
                format!("{ingress}/ports/1/endPort"),
                Some(json!(7999)),
                Err((
                    "p.spec.ingress[0].ports[1].endPort",
                    "greater than or equal to `port` (8000)",
                )),
            ),
            (
                "endPort 65536",
                format!("{ingress}/ports/1/endPort"),
                Some(json!(65536)),
                Err(("p.spec.ingress[0].ports[1].endPort", "between 1 and 65535")),
            ),
            (
                "endPort without port",
                port0.to_string(),
                Some(json!({"endPort": 90})),
                Err((
                    "p.spec.ingress[0].ports[0].endPort",
                    "`port` is not specified",
                )),
            ),
            (
                "endPort with named port",
                port0.to_string(),
                Some(json!({"port": "http", "endPort": 90})),
                Err(("p.spec.ingress[0].ports[0].endPort", "non-numeric")),
            ),
            (
                "protocol lowercase",
                format!("{port0}/protocol"),
                Some(json!("tcp")),
                Err((
                    "p.spec.ingress[0].ports[0].protocol",
                    "\"tcp\" is not supported",
                )),
            ),
            (
                "protocol ICMP",
                format!("{port0}/protocol"),
                Some(json!("ICMP")),
                Err((
                    "p.spec.ingress[0].ports[0].protocol",
                    "expected TCP, UDP or SCTP",
                )),
            ),
            // named ports
            (
                "name 15",
                format!("{port0}/port"),
                Some(json!("abcdefghij-1234")),
                Ok(()),
            ),
            (
                "name 16",
                format!("{port0}/port"),
                Some(json!("abcdefghij-12345")),
                Err(("p.spec.ingress[0].ports[0].port", "15 characters")),
            ),
            (
                "name uppercase",
                format!("{port0}/port"),
                Some(json!("HTTP")),
                Err(("p.spec.ingress[0].ports[0].port", "lowercase alphanumeric")),
            ),
            (
                "name empty",
                format!("{port0}/port"),
                Some(json!("")),
                Err(("p.spec.ingress[0].ports[0].port", "lowercase alphanumeric")),
            ),
            (
                "name backslash",
                format!("{port0}/port"),
                Some(json!("ht\\tp")),
                Err(("p.spec.ingress[0].ports[0].port", "lowercase alphanumeric")),
            ),
            (
                "name digits only",
                format!("{port0}/port"),
                Some(json!("8080")),
                Err(("p.spec.ingress[0].ports[0].port", "at least one letter")),
            ),
            (
                "name double hyphen",
                format!("{port0}/port"),
                Some(json!("a--b")),
                Err(("p.spec.ingress[0].ports[0].port", "consecutive hyphens")),
            ),
            (
                "name leading hyphen",
                format!("{port0}/port"),
                Some(json!("-ab")),
                Err((
                    "p.spec.ingress[0].ports[0].port",
                    "begin or end with a hyphen",
                )),
            ),
            (
                "name trailing hyphen",
                format!("{port0}/port"),
                Some(json!("ab-")),
                Err((
                    "p.spec.ingress[0].ports[0].port",
                    "begin or end with a hyphen",
                )),
            ),
            (
                "name with digits",
                format!("{port0}/port"),
                Some(json!("h2c-8080")),
                Ok(()),
            ),
            // peers and ipBlocks
            (
                "empty peer",
                format!("{ingress}/from/0"),
                Some(json!({})),
                Err(("p.spec.ingress[0].from[0]", "must specify a peer")),
            ),
            (
                "ipBlock and podSelector",
                peer1.to_string(),
                Some(json!({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}})),
                Err(("p.spec.ingress[0].from[1]", "both ipBlock and another peer")),
            ),
            (
                "ipBlock and namespaceSelector",
                peer1.to_string(),
                Some(json!({"ipBlock": {"cidr": "10.0.0.0/8"}, "namespaceSelector": {}})),
                Err(("p.spec.ingress[0].from[1]", "both ipBlock and another peer")),
            ),
            (
                "both selectors",
                peer1.to_string(),
                Some(json!({"podSelector": {}, "namespaceSelector": {}})),
                Ok(()),
            ),
            (
                "cidr empty",
                format!("{peer1}/ipBlock/cidr"),
                Some(json!("")),
                Err((
                    "p.spec.ingress[0].from[1].ipBlock.cidr",
                    "must not be empty",
                )),
            ),
            (
                "cidr no prefix",
                format!("{peer1}/ipBlock"),
                Some(json!({"cidr": "10.0.0.1"})),
                Err(("p.spec.ingress[0].from[1].ipBlock.cidr", "valid CIDR")),
            ),
            (
                "cidr prefix 33",
                format!("{peer1}/ipBlock"),
                Some(json!({"cidr": "10.0.0.0/33"})),
                Err(("p.spec.ingress[0].from[1].ipBlock.cidr", "valid CIDR")),
            ),
            (
                "cidr octet 256",
                format!("{peer1}/ipBlock"),
                Some(json!({"cidr": "10.0.0.256/32"})),
                Err(("p.spec.ingress[0].from[1].ipBlock.cidr", "valid CIDR")),
            ),
            (
                "cidr leading zero",
                format!("{peer1}/ipBlock"),
                Some(json!({"cidr": "010.0.0.0/8"})),
                Ok(()),
            ),
            (
                "cidr host bits",
                format!("{peer1}/ipBlock"),
                Some(json!({"cidr": "10.0.0.1/8"})),
                Ok(()),
            ),
            (
                "cidr ipv6",
                format!("{peer1}/ipBlock"),
                Some(json!({"cidr": "fd00::/8", "except": ["fd00:1::/32"]})),
                Ok(()),
            ),
            (
                "except invalid",
                format!("{peer1}/ipBlock/except"),
                Some(json!(["10.1.0.0/16", "x"])),
                Err(("p.spec.ingress[0].from[1].ipBlock.except[1]", "valid CIDR")),
            ),
            (
                "except equal",
                format!("{peer1}/ipBlock/except"),
                Some(json!(["10.0.0.0/8"])),
                Err((
                    "p.spec.ingress[0].from[1].ipBlock.except[0]",
                    "strict subset",
                )),
            ),
            (
                "except wider",
                format!("{peer1}/ipBlock/except"),
                Some(json!(["10.0.0.0/7"])),
                Err((
                    "p.spec.ingress[0].from[1].ipBlock.except[0]",
                    "strict subset",
                )),
            ),
            (
                "except outside",
                format!("{peer1}/ipBlock/except"),
                Some(json!(["11.0.0.0/16"])),
                Err((
                    "p.spec.ingress[0].from[1].ipBlock.except[0]",
                    "strict subset",
                )),
            ),
            (
                "except other family",
                format!("{peer1}/ipBlock/except"),
                Some(json!(["::/128"])),
                Err((
                    "p.spec.ingress[0].from[1].ipBlock.except[0]",
                    "strict subset",
                )),
            ),
            (
                "ipv4 except in ipv6",
                format!("{peer1}/ipBlock"),
                Some(json!({"cidr": "::/0", "except": ["10.0.0.0/8"]})),
                Err((
                    "p.spec.ingress[0].from[1].ipBlock.except[0]",
                    "strict subset",
                )),
            ),
            (
                "except host bits inside",
                format!("{peer1}/ipBlock/except"),
                Some(json!(["10.1.2.3/16"])),
                Ok(()),
            ),
            (
                "egress cidr",
                "/spec/egress/0/to/0".into(),
                Some(json!({"ipBlock": {"cidr": "nope"}})),
                Err(("p.spec.egress[0].to[0].ipBlock.cidr", "valid CIDR")),
            ),
            // policyTypes
            (
                "policyTypes Egress",
                "/spec/policyTypes".into(),
                Some(json!(["Egress"])),
                Ok(()),
            ),
            (
                "policyTypes lowercase",
                "/spec/policyTypes".into(),
                Some(json!(["Ingress", "egress"])),
                Err(("p.spec.policyTypes[1]", "\"egress\" is not supported")),
            ),
            (
                "policyTypes three",
                "/spec/policyTypes".into(),
                Some(json!(["Ingress", "Egress", "Ingress"])),
                Err(("p.spec.policyTypes", "more than two")),
            ),
        ];
        let mut failures = Vec::new();
        for (what, pointer, value, expected) in cases {
            let got = run(&with(&pointer, value));
            let ok = match (&got, expected) {
                (Ok(()), Ok(())) => true,
                (Err(e), Err((field, message))) => e.field == field && e.message.contains(message),
                _ => false,
            };
            if !ok {
                failures.push(format!("{what}: expected {expected:?}, got {got:?}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn the_first_problem_in_upstream_order_is_reported() {
        let mut policy = with("/spec/policyTypes", Some(json!(["nope"])));
        policy["spec"]["ingress"][0]["ports"][0]["port"] = json!(0);
        policy["metadata"]["name"] = json!("Bad");
        assert_eq!(run(&policy).unwrap_err().field, "p.metadata.name");
        policy["metadata"]["name"] = json!("good");
        assert_eq!(
            run(&policy).unwrap_err().field,
            "p.spec.ingress[0].ports[0].port"
        );
    }
}
