//! The custom resources (docs/api.md): `WorkloadNetworkPolicy` (an allow-list in force, in
//! `monitor` or `protect` mode) and `WorkloadNetworkPolicyProposal` (what learning has seen so far).
//!
//! Both share the same spec payload. Admission rules are CEL `x-kubernetes-validations` so a bad object
//! is refused by the API server with a message, before the controller ever sees it.

// kube's `printcolumn(...)` repeats keys like `type_` by design; clippy reads that as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::api::networking::v1::{NetworkPolicyPort, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// CEL rules shared by both kinds, with the message the API server returns when one fails.
pub mod rules {
    /// The istio backend accepts `Ingress` only.
    pub const ISTIO_INGRESS_ONLY: &str = "self.backend != 'istio' || self.direction == 'Ingress'";
    pub const ISTIO_INGRESS_ONLY_MSG: &str =
        "the istio backend supports direction Ingress only (ztunnel enforces inbound traffic)";
    /// The kubernetes payload's `policyTypes` must be exactly `[direction]`.
    pub const POLICY_TYPES: &str = "self.backend != 'kubernetes' || !has(self.kubernetes) || \
        (has(self.kubernetes.policyTypes) && size(self.kubernetes.policyTypes) == 1 && \
        self.kubernetes.policyTypes[0] == self.direction)";
    pub const POLICY_TYPES_MSG: &str =
        "spec.kubernetes.policyTypes must be exactly [spec.direction]";
    /// Exactly one payload, the one `backend` names.
    pub const ONE_PAYLOAD: &str = "(self.backend == 'kubernetes') == has(self.kubernetes) && \
        (self.backend == 'istio') == has(self.istio)";
    pub const ONE_PAYLOAD_MSG: &str =
        "exactly one of spec.kubernetes or spec.istio must be set, and it must match spec.backend";
    /// The NetworkPolicy must select pods by something: an empty podSelector selects the whole namespace.
    pub const POD_SELECTOR_NOT_EMPTY: &str = "!has(self.kubernetes) || \
        (has(self.kubernetes.podSelector) && \
        ((has(self.kubernetes.podSelector.matchLabels) && size(self.kubernetes.podSelector.matchLabels) > 0) || \
        (has(self.kubernetes.podSelector.matchExpressions) && size(self.kubernetes.podSelector.matchExpressions) > 0)))";
    pub const POD_SELECTOR_NOT_EMPTY_MSG: &str = "spec.kubernetes.podSelector must have at least one matchLabels entry or matchExpression (an empty selector selects every pod in the namespace)";
    /// The Istio selector must select pods by something, for the same reason.
    pub const ISTIO_SELECTOR_NOT_EMPTY: &str = "!has(self.istio) || \
        ((has(self.istio.selector.matchLabels) && size(self.istio.selector.matchLabels) > 0) || \
        (has(self.istio.selector.matchExpressions) && size(self.istio.selector.matchExpressions) > 0))";
    pub const ISTIO_SELECTOR_NOT_EMPTY_MSG: &str = "spec.istio.selector must have at least one matchLabels entry or matchExpression (an empty selector selects every pod in the namespace)";
    /// Required fields, checked here too so a client gets one clear message.
    pub const REQUIRED: &str = "has(self.targetRef) && has(self.direction)";
    pub const REQUIRED_MSG: &str = "spec.targetRef and spec.direction are required";
    /// `backend` cannot change after creation.
    pub const BACKEND_IMMUTABLE: &str = "self == oldSelf";
    pub const BACKEND_IMMUTABLE_MSG: &str = "backend is immutable";
    /// The target kinds the product resolves workloads to.
    pub const TARGET_KIND: &str =
        "self.kind in ['Deployment', 'StatefulSet', 'DaemonSet', 'CronJob', 'Job', 'Pod']";
    pub const TARGET_KIND_MSG: &str =
        "spec.targetRef.kind must be one of Deployment, StatefulSet, DaemonSet, CronJob, Job, Pod";
    /// A workload name is a DNS-1123 subdomain.
    pub const TARGET_NAME: &str = "size(self.name) >= 1 && size(self.name) <= 253 && \
        self.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')";
    pub const TARGET_NAME_MSG: &str = "spec.targetRef.name must be a DNS-1123 subdomain: 1-253 lowercase alphanumerics, '-' or '.', starting and ending with an alphanumeric";

    // `spec.egressNames` (the rules below on `NameRule` run once per entry).
    //
    // Cost: the API server refuses a CRD whose rules' estimated cost, each rule's times the number of
    // times it can run, adds up to more than 100,000,000. It takes a string of `maxLength` n as 4n
    // bytes and prices `matches` at ceil((size + 1) * 0.1) * ceil(len(regex) * 0.25): about 1,640 per
    // name for NAME_RULE_NAMES, so 1,000 entries of 20 names cost about 33,000,000, and 100 names an
    // entry would cost 164,000,000 (the CRD would not install). `api/tests/cel_rules.rs` recomputes it
    // from the generated schema.

    /// `egressNames` only where a name means something: outside services the workload connects to.
    pub const EGRESS_NAMES_SCOPE: &str = "!has(self.egressNames) || size(self.egressNames) == 0 || \
        (self.direction == 'Egress' && self.backend == 'kubernetes')";
    pub const EGRESS_NAMES_SCOPE_MSG: &str = "spec.egressNames requires direction Egress and backend kubernetes (the names are outside services the workload connects to; the istio backend governs Ingress only)";
    /// At most [`MAX_NAME_RULES`](super::MAX_NAME_RULES) entries (also the schema's `maxItems`).
    pub const EGRESS_NAMES_COUNT: &str = "!has(self.egressNames) || size(self.egressNames) <= 1000";
    pub const EGRESS_NAMES_COUNT_MSG: &str = "spec.egressNames must have at most 1000 entries";
    /// Each entry: 1 to [`MAX_NAMES_PER_RULE`](super::MAX_NAMES_PER_RULE) names, at most
    /// [`MAX_PORTS_PER_NAME_RULE`](super::MAX_PORTS_PER_NAME_RULE) ports (also in the schema).
    pub const NAME_RULE_SIZE: &str = "size(self.names) >= 1 && size(self.names) <= 20 && \
        (!has(self.ports) || size(self.ports) <= 100)";
    pub const NAME_RULE_SIZE_MSG: &str =
        "each spec.egressNames entry must have 1 to 20 names and at most 100 ports";
    /// Each name is a host name as the API writes it, or `*.` and at least two labels: what
    /// `crate::dns_name::name_pattern` accepts. (RE2: `*` and `.` escaped, anchored at both ends.)
    pub const NAME_RULE_NAMES: &str = "self.names.all(n, size(n) <= 253 && \
        n.matches('^(\\\\*\\\\.[a-z0-9_-]{1,63}\\\\.)?([a-z0-9_-]{1,63}\\\\.)*[a-z0-9_-]{1,63}$'))";
    pub const NAME_RULE_NAMES_MSG: &str = "spec.egressNames names must be lower-case host names without a trailing dot (at most 253 characters; labels of 1-63 letters, digits, '-' or '_'), or a wildcard: '*.' followed by at least two labels, such as *.example.com (not *.com, a.*.com or *example.com)";
    /// Ports as a NetworkPolicy writes them, by number (the schema types `port` as an integer).
    pub const NAME_RULE_PORTS: &str = "!has(self.ports) || self.ports.all(p, \
        (!has(p.protocol) || p.protocol in ['TCP', 'UDP', 'SCTP']) && \
        (!has(p.port) || (p.port >= 1 && p.port <= 65535)))";
    pub const NAME_RULE_PORTS_MSG: &str = "spec.egressNames ports must have protocol TCP, UDP or SCTP and a port number from 1 to 65535 (not a named port: it names a pod's container port, and an outside service has none)";
}

/// Most entries in `spec.egressNames` ([`rules::EGRESS_NAMES_COUNT`]).
pub const MAX_NAME_RULES: usize = 1000;
/// Most names in one `spec.egressNames` entry ([`rules::NAME_RULE_SIZE`]; bounded by the API
/// server's CEL cost budget, see [`rules`]).
pub const MAX_NAMES_PER_RULE: usize = 20;
/// Most ports in one `spec.egressNames` entry ([`rules::NAME_RULE_SIZE`]).
pub const MAX_PORTS_PER_NAME_RULE: usize = 100;

/// Which data plane enforces the policy, and so which payload the spec carries.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// A `networking.k8s.io/v1` NetworkPolicy, enforced by the CNI (Calico, Cilium, ...).
    Kubernetes,
    /// An Istio ambient `security.istio.io/v1` AuthorizationPolicy, enforced by ztunnel on the receiving side.
    Istio,
}

/// The traffic direction a policy governs, seen from its target workload.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
pub enum Direction {
    /// Connections the target workload receives.
    Ingress,
    /// Connections the target workload opens.
    Egress,
}

impl Direction {
    /// The name as it appears in the API (`Ingress`/`Egress`).
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "Ingress",
            Direction::Egress => "Egress",
        }
    }
}

/// What a WorkloadNetworkPolicy does with traffic its rules do not allow.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum PolicyMode {
    /// Record violations; block nothing.
    #[default]
    Monitor,
    /// Render the policy into the data plane so that it blocks; record what was blocked.
    Protect,
}

impl PolicyMode {
    /// The name as it appears in the API (`monitor`/`protect`), also the promote label value.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyMode::Monitor => "monitor",
            PolicyMode::Protect => "protect",
        }
    }
}

/// The kinds of workload a policy can target.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
    /// The unit for the Jobs a CronJob creates (learned per CronJob, not per run).
    CronJob,
    /// A Job no CronJob created.
    Job,
    /// A bare pod (no controller owner), its own unit.
    Pod,
}

impl WorkloadKind {
    /// Every kind, in declaration order.
    pub const ALL: [WorkloadKind; 6] = [
        WorkloadKind::Deployment,
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
        WorkloadKind::CronJob,
        WorkloadKind::Job,
        WorkloadKind::Pod,
    ];

    /// The Kubernetes kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
            WorkloadKind::CronJob => "CronJob",
            WorkloadKind::Job => "Job",
            WorkloadKind::Pod => "Pod",
        }
    }

    /// The kind named `name` (exact Kubernetes spelling), if it is one.
    pub fn from_kind(name: &str) -> Option<WorkloadKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// The workload, in the policy's namespace, whose pods the policy governs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[x_kube(validation = Rule::new(rules::TARGET_KIND).message(rules::TARGET_KIND_MSG))]
#[x_kube(validation = Rule::new(rules::TARGET_NAME).message(rules::TARGET_NAME_MSG))]
pub struct TargetRef {
    /// Kind of the workload: Deployment, StatefulSet, DaemonSet, CronJob (the unit for the Jobs it
    /// creates), Job (one no CronJob created) or Pod (a bare pod).
    pub kind: WorkloadKind,
    /// Name of the workload in the same namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// An Istio ambient L4 allow-list for the destination workload, rendered 1:1 into an
/// AuthorizationPolicy with `action: ALLOW`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
pub struct IstioPolicy {
    /// Pods the AuthorizationPolicy applies to: the target workload's own selector. Must not be empty.
    pub selector: LabelSelector,
    /// Allowed sources and ports; a connection is allowed when any rule matches it.
    #[serde(default)]
    pub rules: Vec<IstioRule>,
}

/// One allow rule: any of `from` and any of `to` must match.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct IstioRule {
    /// Allowed sources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<IstioFrom>,
    /// Allowed destination operations (ports).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<IstioTo>,
}

/// A source of an Istio rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct IstioFrom {
    /// The peer identities allowed.
    pub source: IstioSource,
}

/// Peer identities of an Istio rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct IstioSource {
    /// SPIFFE ids without the `spiffe://` scheme, e.g. `cluster.local/ns/shop/sa/frontend`; `*` means any peer.
    #[serde(default)]
    pub principals: Vec<String>,
}

/// A destination of an Istio rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct IstioTo {
    /// The operation allowed.
    pub operation: IstioOperation,
}

/// Destination ports of an Istio rule.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
pub struct IstioOperation {
    /// Destination (container) ports: a single port such as `"8080"` or a range such as `"8000-8099"`.
    #[serde(default)]
    pub ports: Vec<String>,
}

/// The allow-list of a WorkloadNetworkPolicy: which traffic of the target workload is expected.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "networkenforcer.kubewarden.io",
    version = "v1alpha1",
    kind = "WorkloadNetworkPolicy",
    plural = "workloadnetworkpolicies",
    shortname = "wnp",
    derive = "PartialEq",
    namespaced,
    status = "WorkloadNetworkPolicyStatus",
    doc = "An allow-list for one workload and direction, in monitor mode (violations recorded) or protect mode (enforced by a rendered NetworkPolicy or AuthorizationPolicy).",
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.mode",
        description = "monitor or protect"
    ),
    printcolumn(
        name = "Active Violations",
        type_ = "integer",
        json_path = ".status.activeViolationCount",
        description = "Violations neither cleared nor acknowledged"
    ),
    printcolumn(
        name = "Direction",
        type_ = "string",
        json_path = ".spec.direction",
        description = "Ingress or Egress"
    ),
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".spec.targetRef.name",
        description = "The target workload"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "Rendered and in sync"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(rules::REQUIRED).message(rules::REQUIRED_MSG))]
#[x_kube(validation = Rule::new(rules::ISTIO_INGRESS_ONLY).message(rules::ISTIO_INGRESS_ONLY_MSG))]
#[x_kube(validation = Rule::new(rules::POLICY_TYPES).message(rules::POLICY_TYPES_MSG))]
#[x_kube(validation = Rule::new(rules::ONE_PAYLOAD).message(rules::ONE_PAYLOAD_MSG))]
#[x_kube(validation = Rule::new(rules::POD_SELECTOR_NOT_EMPTY).message(rules::POD_SELECTOR_NOT_EMPTY_MSG))]
#[x_kube(validation = Rule::new(rules::ISTIO_SELECTOR_NOT_EMPTY).message(rules::ISTIO_SELECTOR_NOT_EMPTY_MSG))]
#[x_kube(validation = Rule::new(rules::EGRESS_NAMES_SCOPE).message(rules::EGRESS_NAMES_SCOPE_MSG))]
#[x_kube(validation = Rule::new(rules::EGRESS_NAMES_COUNT).message(rules::EGRESS_NAMES_COUNT_MSG))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadNetworkPolicySpec {
    /// The enforcing data plane: `kubernetes` (a NetworkPolicy, payload in `kubernetes`) or `istio`
    /// (an AuthorizationPolicy, payload in `istio`). Immutable.
    #[x_kube(validation = Rule::new(rules::BACKEND_IMMUTABLE).message(rules::BACKEND_IMMUTABLE_MSG))]
    pub backend: Backend,
    /// The NetworkPolicy spec to enforce, for the kubernetes backend. `policyTypes` must be `[direction]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<NetworkPolicySpec>,
    /// The AuthorizationPolicy rules to enforce, for the istio backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub istio: Option<IstioPolicy>,
    /// The workload this policy governs, in the same namespace.
    pub target_ref: TargetRef,
    /// The direction this policy governs: Ingress or Egress (istio: Ingress only).
    pub direction: Direction,
    /// `monitor` records violations without blocking; `protect` renders the policy so the data plane
    /// blocks what it does not allow.
    #[serde(default)]
    pub mode: PolicyMode,
    /// Outside services the workload may reach by name (direction Egress, backend kubernetes), in
    /// addition to `kubernetes`: a connection to an address outside the cluster is allowed when the
    /// pod resolved that address from one of the names (a DNS answer to its own query, within the
    /// answer's TTL plus a grace) and the port matches. Optional; without it nothing changes. At
    /// most 1000 entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_NAME_RULES))]
    pub egress_names: Vec<NameRule>,
}

/// What learning observed for one workload and direction; promote it with the label
/// `networkenforcer.kubewarden.io/promote=monitor|protect`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "networkenforcer.kubewarden.io",
    version = "v1alpha1",
    kind = "WorkloadNetworkPolicyProposal",
    plural = "workloadnetworkpolicyproposals",
    shortname = "wnpp",
    derive = "PartialEq",
    namespaced,
    status = "WorkloadNetworkPolicyProposalStatus",
    doc = "A learned allow-list for one workload and direction. Label it networkenforcer.kubewarden.io/promote=monitor|protect to turn it into a WorkloadNetworkPolicy.",
    printcolumn(
        name = "Direction",
        type_ = "string",
        json_path = ".spec.direction",
        description = "Ingress or Egress"
    ),
    printcolumn(
        name = "Target",
        type_ = "string",
        json_path = ".spec.targetRef.name",
        description = "The target workload"
    ),
    printcolumn(
        name = "Peers",
        type_ = "integer",
        json_path = ".status.peerCount",
        description = "Peers learned so far (one rule per peer)"
    ),
    printcolumn(
        name = "Last Learned",
        type_ = "date",
        json_path = ".status.lastLearnedTime",
        description = "When learning last added a peer or port"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new(rules::REQUIRED).message(rules::REQUIRED_MSG))]
#[x_kube(validation = Rule::new(rules::ISTIO_INGRESS_ONLY).message(rules::ISTIO_INGRESS_ONLY_MSG))]
#[x_kube(validation = Rule::new(rules::POLICY_TYPES).message(rules::POLICY_TYPES_MSG))]
#[x_kube(validation = Rule::new(rules::ONE_PAYLOAD).message(rules::ONE_PAYLOAD_MSG))]
#[x_kube(validation = Rule::new(rules::POD_SELECTOR_NOT_EMPTY).message(rules::POD_SELECTOR_NOT_EMPTY_MSG))]
#[x_kube(validation = Rule::new(rules::ISTIO_SELECTOR_NOT_EMPTY).message(rules::ISTIO_SELECTOR_NOT_EMPTY_MSG))]
#[x_kube(validation = Rule::new(rules::EGRESS_NAMES_SCOPE).message(rules::EGRESS_NAMES_SCOPE_MSG))]
#[x_kube(validation = Rule::new(rules::EGRESS_NAMES_COUNT).message(rules::EGRESS_NAMES_COUNT_MSG))]
#[serde(rename_all = "camelCase")]
pub struct WorkloadNetworkPolicyProposalSpec {
    /// The enforcing data plane the proposal is written for: `kubernetes` or `istio`. Immutable.
    #[x_kube(validation = Rule::new(rules::BACKEND_IMMUTABLE).message(rules::BACKEND_IMMUTABLE_MSG))]
    pub backend: Backend,
    /// The learned NetworkPolicy spec, for the kubernetes backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<NetworkPolicySpec>,
    /// The learned AuthorizationPolicy rules, for the istio backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub istio: Option<IstioPolicy>,
    /// The workload this proposal was learned for, in the same namespace.
    pub target_ref: TargetRef,
    /// The direction learned: Ingress or Egress (istio: Ingress only).
    pub direction: Direction,
    /// Outside services learned by the name the pods resolved them from (Egress; see
    /// `WorkloadNetworkPolicy.spec.egressNames`). Addresses no pod resolved from a name stay
    /// `ipBlock`s in `kubernetes`. At most 1000 entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_NAME_RULES))]
    pub egress_names: Vec<NameRule>,
}

/// Names of outside services and the ports they may be reached on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[x_kube(validation = Rule::new(rules::NAME_RULE_SIZE).message(rules::NAME_RULE_SIZE_MSG))]
#[x_kube(validation = Rule::new(rules::NAME_RULE_NAMES).message(rules::NAME_RULE_NAMES_MSG))]
#[x_kube(validation = Rule::new(rules::NAME_RULE_PORTS).message(rules::NAME_RULE_PORTS_MSG))]
#[serde(rename_all = "camelCase")]
pub struct NameRule {
    /// 1 to 20 host names (`api.example.com`, lower-case, no trailing dot), or wildcards of one
    /// leftmost `*` label followed by at least two labels (`*.example.com`: any name below
    /// example.com, not example.com itself).
    #[schemars(
        length(min = 1, max = MAX_NAMES_PER_RULE),
        inner(length(max = crate::dns_name::MAX_NAME_LEN))
    )]
    pub names: Vec<String>,
    /// At most 100 ports, as in a NetworkPolicy rule but by number only; empty: every port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "name_rule_ports")]
    pub ports: Vec<NetworkPolicyPort>,
}

/// The schema of [`NameRule::ports`]: NetworkPolicy ports, at most [`MAX_PORTS_PER_NAME_RULE`],
/// whose `port` is an integer, where a NetworkPolicy's is an int-or-string. A named port names a
/// pod's container port, and an outside service has none, so it could never match; and the CEL rules
/// could not refuse one: telling an int-or-string's two forms apart takes `type()`, which the
/// client-side evaluator the tests use lacks, and its string form has no length bound to keep
/// [`rules::NAME_RULE_PORTS`] within the API server's cost budget.
fn name_rule_ports(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<Vec<NetworkPolicyPort>>();
    schema.insert("maxItems".into(), MAX_PORTS_PER_NAME_RULE.into());
    if let Some(port) = schema.pointer_mut("/items/properties/port") {
        *port = serde_json::json!({
            "description": "The destination port number, 1 to 65535. A named port cannot be used: \
                it names a pod's container port, and an outside service has none.",
            "type": "integer",
            "format": "int32",
        });
    }
    schema
}

/// Transport protocol of a flow.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
pub enum Protocol {
    TCP,
    UDP,
    SCTP,
}

impl Protocol {
    /// The name as NetworkPolicies write it: `TCP`, `UDP`, `SCTP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::TCP => "TCP",
            Protocol::UDP => "UDP",
            Protocol::SCTP => "SCTP",
        }
    }

    /// The lower-case name, as the agent's flow records and its `--protocol` flag write it, and as
    /// nftables names the protocol: `tcp`, `udp`, `sctp`.
    pub fn as_lowercase_str(self) -> &'static str {
        match self {
            Protocol::TCP => "tcp",
            Protocol::UDP => "udp",
            Protocol::SCTP => "sctp",
        }
    }

    /// The inverse of [`Protocol::as_lowercase_str`]; `None` for any other text (`TCP` included).
    pub fn from_lowercase(value: &str) -> Option<Protocol> {
        [Protocol::TCP, Protocol::UDP, Protocol::SCTP]
            .into_iter()
            .find(|p| p.as_lowercase_str() == value)
    }

    /// A `protocol` field of the Kubernetes API (container ports, NetworkPolicy and Service ports):
    /// TCP when absent, as the API defaults it; `None` for a value the API does not define.
    pub fn from_kubernetes(value: Option<&str>) -> Option<Protocol> {
        match value {
            None | Some("TCP") => Some(Protocol::TCP),
            Some("UDP") => Some(Protocol::UDP),
            Some("SCTP") => Some(Protocol::SCTP),
            Some(_) => None,
        }
    }
}

/// The Kubernetes spelling, [`Protocol::as_str`].
impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One side of a violating flow.
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, KubeSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadRef {
    /// Namespace of the workload; empty for peers outside the cluster's pods.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Kind of the workload that owns the pod (Deployment, StatefulSet, DaemonSet, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner_kind: String,
    /// Name of the workload that owns the pod.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub owner_name: String,
    /// Istio principal of the workload (`cluster.local/ns/<ns>/sa/<serviceaccount>`), when known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub identity: String,
    /// The workload's pod selector, as `key=value` pairs joined by commas, when known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    /// The peer's IP address, for peers that are not pods of a known workload (hosts, the internet).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    /// For an outside address the source pod connected to: the DNS name the pod resolved `address`
    /// from (the agent saw the pod's query and its answer), as `spec.egressNames` would list it.
    /// Empty when the pod used the address without resolving it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dns_name: String,
}

/// A flow the policy does not allow.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ViolationRecord {
    /// Id of the record, unique within the policy; use it in `networkenforcer.kubewarden.io/acknowledge-<id>`.
    pub id: i64,
    /// When the flow was last seen.
    pub timestamp: Time,
    /// Where the flow came from.
    pub source: WorkloadRef,
    /// Where the flow went.
    pub dest: WorkloadRef,
    /// Transport protocol: TCP or UDP.
    pub protocol: Protocol,
    /// The destination container port, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 65535))]
    pub dst_port: Option<i32>,
    /// `monitor` (the flow went through) or `protect` (the flow was blocked).
    pub action: PolicyMode,
    /// Which side's policy the flow violated: Egress (source) or Ingress (destination).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<Direction>,
    /// Namespace of the policy that denies the flow.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub denying_policy_namespace: String,
    /// Name of the policy that denies the flow.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub denying_policy_name: String,
}

/// Hours kept in `status.violationHistory`: two days, enough to see yesterday's same hour.
pub const VIOLATION_HISTORY_HOURS: usize = 48;

/// The occurrences counted in one hour (`status.violationHistory[]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ViolationBucket {
    /// The hour's start, on the hour (UTC).
    pub start: Time,
    /// Occurrences counted in `violationCount` whose time lies in this hour.
    #[schemars(range(min = 0))]
    pub count: i64,
}

/// A violation a user acknowledged with the `networkenforcer.kubewarden.io/acknowledge-<id>` annotation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcknowledgedViolation {
    /// The record as it was when acknowledged.
    pub violation: ViolationRecord,
    /// The annotation's value.
    #[serde(default)]
    pub reason: String,
    /// When the controller consumed the annotation.
    pub acknowledged_at: Time,
}

/// What the controller observed for a WorkloadNetworkPolicy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadNetworkPolicyStatus {
    /// The generation last processed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Every violation observation ever merged into this policy, including re-observations and
    /// records later trimmed, cleared or acknowledged.
    #[serde(default)]
    pub violation_count: i64,
    /// Number of active records (`len(violations)`).
    #[serde(default)]
    pub active_violation_count: i64,
    /// The occurrences `violationCount` counted, per hour of their time, over the last
    /// 48 hours; oldest first, hours without any left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = VIOLATION_HISTORY_HOURS))]
    pub violation_history: Vec<ViolationBucket>,
    /// Active records, newest first by timestamp, at most 100.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub violations: Vec<ViolationRecord>,
    /// Acknowledged records, newest first by acknowledgedAt, at most 100.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acknowledged_violations: Vec<AcknowledgedViolation>,
    /// Ready, DuplicateTarget, SelectorOverlapsWorkload, UnusedRules and other standard conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Per rule of the spec: when it last allowed an observed flow and how many distinct peers it
    /// allowed (docs/api.md, "Rule usage"). Written with the violation fields; one entry per rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rule_usage: Vec<RuleUsage>,
}

/// How much one rule of a WorkloadNetworkPolicy is used by observed traffic.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuleUsage {
    /// The rule's list: `spec.kubernetes.ingress`/`egress` (`Ingress`/`Egress`); istio rules are Ingress.
    pub direction: Direction,
    /// `egressNames` when the rule is `spec.egressNames[rule]` (direction `Egress`); absent for the
    /// direction's own rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<RuleList>,
    /// The rule's index in its list when this entry was written.
    #[schemars(range(min = 0))]
    pub rule: i32,
    /// A short hash of the rule's content: usage follows the rule, not its position, when rules are
    /// reordered; an edited rule starts anew.
    pub fingerprint: String,
    /// When the rule last allowed an observed flow; absent: never since `since`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_matched: Option<Time>,
    /// Distinct peers the rule allowed, counted up to 1000 (the cap).
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub peers: i64,
    /// Since when the controller has watched this rule for traffic (the first pass that saw it).
    pub since: Time,
}

/// A list of a WorkloadNetworkPolicy's spec that holds rules besides the direction's own.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
pub enum RuleList {
    /// `spec.egressNames`: outside services by name.
    #[serde(rename = "egressNames")]
    EgressNames,
}

/// What the controller observed for a WorkloadNetworkPolicyProposal.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadNetworkPolicyProposalStatus {
    /// Number of peers learned so far; each peer is one rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_count: Option<i64>,
    /// When learning last added a peer or a port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_learned_time: Option<Time>,
    /// Learning progress and promotion problems (e.g. a policy of the same name already exists).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_protocol_fields_default_to_tcp_and_refuse_unknown_values() {
        for (value, want) in [
            (None, Some(Protocol::TCP)),
            (Some("TCP"), Some(Protocol::TCP)),
            (Some("UDP"), Some(Protocol::UDP)),
            (Some("SCTP"), Some(Protocol::SCTP)),
            (Some("tcp"), None),
            (Some("ICMP"), None),
            (Some(""), None),
        ] {
            assert_eq!(Protocol::from_kubernetes(value), want, "{value:?}");
        }
    }

    #[test]
    fn protocols_have_one_name_per_spelling() {
        for (p, upper, lower) in [
            (Protocol::TCP, "TCP", "tcp"),
            (Protocol::UDP, "UDP", "udp"),
            (Protocol::SCTP, "SCTP", "sctp"),
        ] {
            assert_eq!(p.as_str(), upper);
            assert_eq!(p.to_string(), upper);
            // Debug and serde spell it as Display does (tables printed Debug before).
            assert_eq!(format!("{p:?}"), upper);
            assert_eq!(serde_json::to_value(p).unwrap(), upper);
            assert_eq!(Protocol::from_kubernetes(Some(upper)), Some(p));
            assert_eq!(p.as_lowercase_str(), lower);
            assert_eq!(Protocol::from_lowercase(lower), Some(p));
            assert_eq!(Protocol::from_lowercase(upper), None);
        }
        assert_eq!(Protocol::from_lowercase("icmp"), None);
    }
}
