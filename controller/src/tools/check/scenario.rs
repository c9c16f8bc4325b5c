//! The input of `check`: a scenario's namespaces, pods, policies and flows, and parsing it.

use super::*;

/// The input of `check --scenario`.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub namespaces: Vec<ScenarioNamespace>,
    #[serde(default)]
    pub pods: Vec<ScenarioPod>,
    /// NetworkPolicy and WorkloadNetworkPolicy objects, as `kubectl get -o yaml` prints them.
    #[serde(default)]
    pub policies: Vec<serde_json::Value>,
    #[serde(default)]
    pub flows: Vec<ScenarioFlow>,
}

/// A namespace and its labels (namespaces pods use need not be listed).
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioNamespace {
    pub name: String,
    #[serde(default)]
    pub labels: Labels,
}

/// A pod: what NetworkPolicy selectors, ipBlocks and named ports see.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScenarioPod {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub labels: Labels,
    /// The pod's IP: ipBlocks match it, and replayed records are mapped to the pod by it.
    #[serde(default)]
    pub ip: Option<IpAddr>,
    #[serde(default)]
    pub ports: Vec<ScenarioPort>,
    /// The pod's ServiceAccount: its mesh identity `cluster.local/ns/<namespace>/sa/<name>` is what
    /// istio policies match. Without one the pod has no identity.
    #[serde(default)]
    pub service_account: Option<String>,
}

/// A declared container port.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScenarioPort {
    #[serde(default)]
    pub name: Option<String>,
    pub container_port: u16,
    #[serde(default = "tcp")]
    pub protocol: Protocol,
}

fn tcp() -> Protocol {
    Protocol::TCP
}

/// One end of a flow: a pod (`namespace/name`) or an address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioPeer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<IpAddr>,
    /// A flow's `to` only, with `ip`: the DNS name the source pod resolved the address from (what
    /// the agent reports), which `spec.egressNames` may allow. A lower-case host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A connection to evaluate.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFlow {
    pub from: ScenarioPeer,
    pub to: ScenarioPeer,
    /// TCP (default), UDP or SCTP.
    #[serde(default = "tcp")]
    pub protocol: Protocol,
    /// The destination (container) port.
    pub port: u16,
}

/// Parses a scenario document: JSON when it starts with `{`, YAML otherwise. Errors name the field.
pub fn parse_scenario(text: &str) -> Result<Scenario, CheckError> {
    let value: serde_json::Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text)
            .map_err(|e| CheckError::new(".", format!("invalid JSON: {e}")))?
    } else {
        serde_yaml::from_str(text)
            .map_err(|e| CheckError::new(".", format!("invalid YAML: {e}")))?
    };
    if value.is_null() {
        return Err(CheckError::new(".", "the scenario is empty"));
    }
    from_value("", value)
}

/// Deserializes `value`, naming the failing field below `prefix` in the error.
pub(super) fn from_value<T: DeserializeOwned>(
    prefix: &str,
    value: serde_json::Value,
) -> Result<T, CheckError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let mut path = e.path().to_string();
        // A key of blanks or control characters (`{"\n": 1}`) is shown quoted and escaped; an empty
        // key is an empty path: the document, or the object, is at fault.
        if !path.is_empty() && (path.trim().is_empty() || path.chars().any(char::is_control)) {
            path = format!("{path:?}");
        }
        let field = match (prefix.is_empty(), path.as_str()) {
            (true, "." | "") => ".".to_string(),
            (true, _) => path,
            (false, "." | "") => prefix.to_string(),
            (false, _) => format!("{prefix}.{path}"),
        };
        CheckError::new(field, e.into_inner().to_string())
    })
}
