//! The explain panel (docs/ui.md, "Explain"): why one edge of the graph is allowed or denied, as
//! `check --explain` says it, and the command that reproduces the answer offline. The request names
//! the edge as the graph does (node ids, protocol, port); an [`Explainer`] (the checker, wired in by
//! the app) evaluates it against the cluster as it is now. Parsing the request and building the
//! answer are pure.

use super::server::ApiError;
use axum::http::StatusCode;
use network_enforcer_api::{Protocol, WorkloadRef};
use serde::Serialize;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

/// One flow to explain: from one graph node to another, on a protocol and port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExplainRequest {
    /// The namespace whose graph the edge is on.
    pub namespace: String,
    /// The node ids as the graph gives them (`w:ns/kind/name`, `x:address`).
    pub from_id: String,
    pub to_id: String,
    pub from: WorkloadRef,
    pub to: WorkloadRef,
    pub protocol: Protocol,
    pub port: u16,
    /// `format=scenario`: answer the scenario itself (what `check --scenario` reads).
    pub scenario_only: bool,
}

/// How an [`Explainer`] decided the flow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Explanation {
    pub allowed: bool,
    pub egress: String,
    pub ingress: String,
    /// The scenario `check --scenario FILE --explain` reads to give the same answer.
    pub scenario: serde_json::Value,
}

/// Evaluates a flow against the cluster as it is now (implemented by the checker; the app wires it).
pub trait Explainer: Send + Sync {
    /// The explanation, or what made it impossible (no pod of a workload now, an API error).
    fn explain<'a>(
        &'a self,
        request: &'a ExplainRequest,
    ) -> Pin<Box<dyn Future<Output = Result<Explanation, ApiError>> + Send + 'a>>;
}

/// The explain route's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExplainAnswer {
    pub namespace: String,
    pub from: String,
    pub to: String,
    pub protocol: Protocol,
    pub port: u16,
    pub allowed: bool,
    pub egress: String,
    pub ingress: String,
    /// Reproduces the answer offline: fetch the scenario, then `check` it.
    pub command: String,
}

/// What the explain route needs to explain one flow: the graph's node ids of its ends, protocol and
/// port (the web view asks it when a violation's "why" is clicked).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExplainLink {
    pub from: String,
    pub to: String,
    pub protocol: Protocol,
    pub port: u16,
}

/// The link for a violation from `source` to `dest`; `None` when an end is neither a workload nor
/// one address, or the record has no port: such a flow cannot be explained.
pub fn link(
    source: &WorkloadRef,
    dest: &WorkloadRef,
    protocol: Protocol,
    port: Option<i32>,
) -> Option<ExplainLink> {
    let (from, to) = (crate::graph::node_id(source), crate::graph::node_id(dest));
    let port = u16::try_from(port?).ok().filter(|p| *p > 0)?;
    (side(&from).is_ok() && side(&to).is_ok()).then_some(ExplainLink {
        from,
        to,
        protocol,
        port,
    })
}

/// The request of `namespace`'s explain route from its query string: `from`, `to` (graph node ids),
/// `protocol` (TCP when absent), `port`, and `format=scenario`.
pub fn request(namespace: &str, query: Option<&str>) -> Result<ExplainRequest, ApiError> {
    let bad = |message: String| ApiError::new(StatusCode::BAD_REQUEST, message);
    let params: std::collections::BTreeMap<String, String> =
        form_urlencoded::parse(query.unwrap_or_default().as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
    let node = |key: &str| -> Result<(String, WorkloadRef), ApiError> {
        let id = params
            .get(key)
            .ok_or_else(|| bad(format!("give {key}=<graph node id>")))?;
        Ok((id.clone(), side(id).map_err(bad)?))
    };
    let (from_id, from) = node("from")?;
    let (to_id, to) = node("to")?;
    if from.namespace != namespace && to.namespace != namespace {
        return Err(bad(format!(
            "neither end is in namespace {namespace}: explain a flow from the graph it is on"
        )));
    }
    let protocol = match params.get("protocol").map(String::as_str) {
        None | Some("TCP") => Protocol::TCP,
        Some("UDP") => Protocol::UDP,
        Some("SCTP") => Protocol::SCTP,
        Some(other) => return Err(bad(format!("protocol {other:?}: give TCP, UDP or SCTP"))),
    };
    let port = params
        .get("port")
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| bad("give port=<1-65535>".into()))?;
    Ok(ExplainRequest {
        namespace: namespace.to_string(),
        from_id,
        to_id,
        from,
        to,
        protocol,
        port,
        scenario_only: params.get("format").map(String::as_str) == Some("scenario"),
    })
}

/// The end a graph node id names: a workload (`w:ns/kind/name`) or one address (`x:address`).
/// Selectors, address blocks, identities and names stand for many pods or addresses: one flow
/// cannot be evaluated for them.
fn side(id: &str) -> Result<WorkloadRef, String> {
    if let Some(workload) = id.strip_prefix("w:") {
        let mut parts = workload.splitn(3, '/');
        if let (Some(ns), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next()) {
            // What Kubernetes accepts, nothing else: the parts go into API paths.
            let known = network_enforcer_api::WorkloadKind::from_kind(kind).is_some();
            if dns_label(ns) && known && dns_subdomain(name) {
                return Ok(WorkloadRef {
                    namespace: ns.to_string(),
                    owner_kind: kind.to_string(),
                    owner_name: name.to_string(),
                    ..WorkloadRef::default()
                });
            }
        }
        return Err(format!(
            "{id:?} is not a workload node id (w:<namespace>/<kind>/<name>)"
        ));
    }
    if let Some(address) = id.strip_prefix("x:") {
        return match address.parse::<IpAddr>() {
            Ok(ip) => Ok(WorkloadRef {
                address: ip.to_string(),
                ..WorkloadRef::default()
            }),
            Err(_) => Err(format!(
                "{id:?} is an address block: a flow is explained for one address (use `check \
                 --scenario` with an address of the block)"
            )),
        };
    }
    Err(format!(
        "{id:?}: only flows between workloads and addresses can be explained (not selectors, \
         identities or DNS names)"
    ))
}

/// A namespace name: a DNS-1123 label.
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// An object name: a DNS-1123 subdomain (labels joined by dots).
fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(dns_label)
}

/// The answer to `request` from `explanation`: the verdicts in words, and the command that fetches
/// the scenario from this route (through the usual port-forward on 8090) and checks it offline.
pub fn answer(request: &ExplainRequest, explanation: Explanation) -> ExplainAnswer {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("from", &request.from_id)
        .append_pair("to", &request.to_id)
        .append_pair("protocol", request.protocol.as_str())
        .append_pair("port", &request.port.to_string())
        .append_pair("format", "scenario")
        .finish();
    let command = format!(
        "curl -sSf 'http://127.0.0.1:8090/api/v1/namespaces/{}/explain?{query}' > scenario.json && \
         network-enforcer-controller check --scenario scenario.json --explain",
        request.namespace
    );
    ExplainAnswer {
        namespace: request.namespace.clone(),
        from: request.from_id.clone(),
        to: request.to_id.clone(),
        protocol: request.protocol,
        port: request.port,
        allowed: explanation.allowed,
        egress: explanation.egress,
        ingress: explanation.ingress,
        command,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_name_workloads_and_addresses_and_refuse_the_rest() {
        let ok = request(
            "shop",
            Some("from=w:shop/Deployment/web&to=x:10.0.0.7&protocol=UDP&port=53"),
        )
        .unwrap();
        assert_eq!(
            (ok.from.owner_name.as_str(), ok.to.address.as_str()),
            ("web", "10.0.0.7")
        );
        assert_eq!(
            (ok.protocol, ok.port, ok.scenario_only),
            (Protocol::UDP, 53, false)
        );
        let cases = [
            ("to=w:shop/Deployment/db&port=5432", "give from="),
            (
                "from=w:shop/Deployment/web&to=w:shop/Deployment/db",
                "give port=",
            ),
            (
                "from=w:shop/Deployment/web&to=w:shop/Deployment/db&port=0",
                "give port=",
            ),
            (
                "from=w:shop/Deployment/web&to=w:shop/Deployment/db&port=80&protocol=ICMP",
                "protocol",
            ),
            (
                "from=w:shop/web&to=w:shop/Deployment/db&port=80",
                "not a workload node id",
            ),
            (
                "from=w:shop/Deployment/web&to=x:10.0.0.0/8&port=80",
                "address block",
            ),
            (
                "from=w:shop/Deployment/web&to=s:shop/app=db&port=80",
                "only flows between",
            ),
            (
                "from=w:a%2F..%2Fb/Deployment/web&to=x:10.0.0.7&port=80",
                "not a workload node id",
            ),
            (
                "from=w:shop/Secret/web&to=x:10.0.0.7&port=80",
                "not a workload node id",
            ),
            (
                "from=w:shop/Deployment/a%3Fb&to=x:10.0.0.7&port=80",
                "not a workload node id",
            ),
            (
                "from=w:other/Deployment/web&to=x:10.0.0.7&port=80",
                "neither end is in namespace shop",
            ),
            (
                "from=w:shop/Deployment/web&to=n:api.example.com&port=443",
                "only flows between",
            ),
        ];
        for (query, error) in cases {
            let refused = request("shop", Some(query)).unwrap_err();
            assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{query}");
            assert!(
                refused.message.contains(error),
                "{query}: {}",
                refused.message
            );
        }
    }

    #[test]
    fn a_violation_links_to_its_explanation_when_both_ends_are_one_workload_or_address() {
        let workload = WorkloadRef {
            namespace: "shop".into(),
            owner_kind: "Deployment".into(),
            owner_name: "web".into(),
            ..WorkloadRef::default()
        };
        let address = WorkloadRef {
            address: "203.0.113.7".into(),
            ..WorkloadRef::default()
        };
        let named = WorkloadRef {
            dns_name: "api.example.com".into(),
            ..address.clone()
        };
        assert_eq!(
            link(&workload, &address, Protocol::TCP, Some(443)),
            Some(ExplainLink {
                from: "w:shop/Deployment/web".into(),
                to: "x:203.0.113.7".into(),
                protocol: Protocol::TCP,
                port: 443,
            })
        );
        // The link names what the route accepts.
        let l = link(&address, &workload, Protocol::UDP, Some(53)).unwrap();
        let query = format!("from={}&to={}&protocol=UDP&port=53", l.from, l.to);
        assert!(request("shop", Some(&query)).is_ok());
        assert_eq!(link(&workload, &named, Protocol::TCP, Some(443)), None);
        assert_eq!(link(&workload, &address, Protocol::TCP, None), None);
        assert_eq!(
            link(&workload, &WorkloadRef::default(), Protocol::TCP, Some(80)),
            None
        );
    }

    #[test]
    fn the_answer_gives_the_verdicts_and_a_command_that_fetches_the_same_scenario() {
        let request = request(
            "shop",
            Some("from=w:shop/Deployment/web&to=w:shop/Deployment/db&port=5432"),
        )
        .unwrap();
        let explanation = Explanation {
            allowed: false,
            egress: "not isolated".into(),
            ingress: "isolated by np/shop/db; no rule matches".into(),
            scenario: serde_json::json!({}),
        };
        let answer = answer(&request, explanation);
        assert!(!answer.allowed);
        assert_eq!(answer.ingress, "isolated by np/shop/db; no rule matches");
        assert!(
            answer.command.contains(
                "/api/v1/namespaces/shop/explain?from=w%3Ashop%2FDeployment%2Fweb&to=w%3Ashop%2FDeployment%2Fdb&protocol=TCP&port=5432&format=scenario"
            ),
            "{}",
            answer.command
        );
        assert!(
            answer
                .command
                .ends_with("check --scenario scenario.json --explain")
        );
        assert!(
            answer.command.starts_with("curl -sSf '"),
            "{}",
            answer.command
        );
        // The fetched scenario is what the command checks: the same request, scenario only.
        let again = super::request(
            "shop",
            Some("from=w%3Ashop%2FDeployment%2Fweb&to=w%3Ashop%2FDeployment%2Fdb&protocol=TCP&port=5432&format=scenario"),
        )
        .unwrap();
        assert_eq!(
            again,
            ExplainRequest {
                scenario_only: true,
                ..request
            }
        );
    }
}
