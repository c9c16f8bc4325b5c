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
mod tests;
