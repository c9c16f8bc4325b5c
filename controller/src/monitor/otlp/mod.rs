//! OpenTelemetry log events (docs/behaviour.md §6; set-up: docs/operations.md, "Telemetry"):
//! `policy_violation_observed` for every
//! violation of every provider, `policy_violation_acknowledged` once per record after the status patch
//! that acknowledged it succeeded.
//!
//! The controller talks to a [`ViolationSink`]; it never waits on it. [`Disabled`] is the sink when
//! no OTLP endpoint is configured: status is recorded regardless, nothing is exported. [`Otlp`]
//! exports over OTLP/gRPC or OTLP/HTTP (protobuf), configured by the standard
//! `OTEL_EXPORTER_OTLP_*` variables ([`OtlpConfig::from_env`]), through a bounded queue: when the
//! collector is slow or down, events are dropped and counted, the controller carries on.
//!
//! The events' content is decided by the pure [`observed_event`] and [`acknowledged_event`].

mod config;
mod export;

pub use config::{ConfigError, DEFAULT_SERVICE_NAME, OtlpConfig, OtlpProtocol};
pub use export::{ExportStats, Otlp, TelemetryError};

use crate::monitor::violations::Observation;
use network_enforcer_api::crd::{AcknowledgedViolation, Backend, WorkloadRef};

/// The instrumentation scope of every event.
pub const SCOPE_NAME: &str = "network-enforcer";
/// Event name (and body) of an observed violation.
pub const OBSERVED_EVENT: &str = "policy_violation_observed";
/// Event name (and body) of an acknowledged violation.
pub const ACKNOWLEDGED_EVENT: &str = "policy_violation_acknowledged";

/// Where violation events go. Implementations must return quickly and never fail: an exporter that
/// is slow or down drops events (and counts the drops), it does not hold up the status sync.
pub trait ViolationSink: Send + Sync {
    /// A violating flow was attributed to a policy of `backend` (emitted for every observation, in
    /// monitor and protect mode alike).
    fn observed(&self, backend: Backend, observation: &Observation);

    /// A record was acknowledged and the status patch that moved it succeeded. Call once per record.
    fn acknowledged(&self, acknowledged: &AcknowledgedViolation);

    /// Stops taking events and waits, at most `timeout`, for the queued ones to leave: the controller
    /// calls it on its way out so the last events are not lost with the process. Nothing to wait for
    /// by default.
    fn shutdown(
        &self,
        timeout: std::time::Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        let _ = timeout;
        Box::pin(async {})
    }
}

/// The sink when no OTLP endpoint is configured: drops every event.
#[derive(Clone, Copy, Debug, Default)]
pub struct Disabled;

impl ViolationSink for Disabled {
    fn observed(&self, _backend: Backend, _observation: &Observation) {}

    fn acknowledged(&self, _acknowledged: &AcknowledgedViolation) {}
}

/// How severe an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventSeverity {
    Info,
    Warn,
}

/// An attribute value: the events carry strings and integers only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttributeValue {
    String(String),
    Int(i64),
}

/// One log event, before it becomes an OTLP record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The event name, also the body.
    pub name: &'static str,
    pub severity: EventSeverity,
    /// In the order docs/operations.md lists them.
    pub attributes: Vec<(&'static str, AttributeValue)>,
}

fn backend_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Kubernetes => "kubernetes",
        Backend::Istio => "istio",
    }
}

/// `policy_violation_observed` (WARN): `enforcement.provider`, `action`,
/// `source.workload.{name,namespace,kind,identity}`, `destination.workload.{...}`, `source.address`
/// (a source that is no workload: its IP), `destination.address` (a destination that is no workload:
/// the DNS name its source resolved it from when known, else its IP, as OpenTelemetry's semantic
/// conventions define the attribute), `network.transport`, `destination.port` (an int, always present: 0 when unknown),
/// `policy.ref.namespace`, `policy.ref.name`; string attributes that are empty are left out.
pub fn observed_event(backend: Backend, o: &Observation) -> Event {
    let mut attributes = Vec::new();
    let mut text = |key: &'static str, value: &str| {
        if !value.is_empty() {
            attributes.push((key, AttributeValue::String(value.to_string())));
        }
    };
    text("enforcement.provider", backend_name(backend));
    text("action", o.action.as_str());
    let workload = |prefix: [&'static str; 4], w: &WorkloadRef| {
        [
            (prefix[0], w.owner_name.clone()),
            (prefix[1], w.namespace.clone()),
            (prefix[2], w.owner_kind.clone()),
            (prefix[3], w.identity.clone()),
        ]
    };
    for (key, value) in workload(
        [
            "source.workload.name",
            "source.workload.namespace",
            "source.workload.kind",
            "source.workload.identity",
        ],
        &o.source,
    ) {
        text(key, &value);
    }
    for (key, value) in workload(
        [
            "destination.workload.name",
            "destination.workload.namespace",
            "destination.workload.kind",
            "destination.workload.identity",
        ],
        &o.dest,
    ) {
        text(key, &value);
    }
    text("source.address", &o.source.address);
    let destination = Some(o.dest.dns_name.as_str()).filter(|n| !n.is_empty());
    text(
        "destination.address",
        destination.unwrap_or(o.dest.address.as_str()),
    );
    text("network.transport", o.protocol.as_str());
    attributes.push((
        "destination.port",
        AttributeValue::Int(i64::from(o.dst_port.unwrap_or(0))),
    ));
    let mut text = |key: &'static str, value: &str| {
        if !value.is_empty() {
            attributes.push((key, AttributeValue::String(value.to_string())));
        }
    };
    text("policy.ref.namespace", &o.denying_policy_namespace);
    text("policy.ref.name", &o.denying_policy_name);
    Event {
        name: OBSERVED_EVENT,
        severity: EventSeverity::Warn,
        attributes,
    }
}

/// `policy_violation_acknowledged` (INFO): every attribute present, also when empty: `id`,
/// `timestamp` (the record's, RFC 3339 UTC), `reason`, `source.namespace`,
/// `source.workload.{kind,name,identity}`, `dest.namespace`, `dest.workload.{kind,name,identity}`,
/// `protocol`, `dstPort` (0 when unknown), `action`, `denyingPolicy.namespace`, `denyingPolicy.name`.
pub fn acknowledged_event(a: &AcknowledgedViolation) -> Event {
    let v = &a.violation;
    let s = |value: &str| AttributeValue::String(value.to_string());
    let timestamp = serde_json::to_value(&v.timestamp)
        .ok()
        .and_then(|t| t.as_str().map(str::to_string))
        .unwrap_or_default();
    Event {
        name: ACKNOWLEDGED_EVENT,
        severity: EventSeverity::Info,
        attributes: vec![
            ("id", AttributeValue::Int(v.id)),
            ("timestamp", AttributeValue::String(timestamp)),
            ("reason", s(&a.reason)),
            ("source.namespace", s(&v.source.namespace)),
            ("source.workload.kind", s(&v.source.owner_kind)),
            ("source.workload.name", s(&v.source.owner_name)),
            ("source.workload.identity", s(&v.source.identity)),
            ("dest.namespace", s(&v.dest.namespace)),
            ("dest.workload.kind", s(&v.dest.owner_kind)),
            ("dest.workload.name", s(&v.dest.owner_name)),
            ("dest.workload.identity", s(&v.dest.identity)),
            ("protocol", s(v.protocol.as_str())),
            (
                "dstPort",
                AttributeValue::Int(i64::from(v.dst_port.unwrap_or(0))),
            ),
            ("action", s(v.action.as_str())),
            ("denyingPolicy.namespace", s(&v.denying_policy_namespace)),
            ("denyingPolicy.name", s(&v.denying_policy_name)),
        ],
    }
}

/// The sink the process environment configures: [`Otlp`] when an OTLP endpoint is set (its
/// counters registered on `metrics`), else [`Disabled`]. Must run inside a Tokio runtime (the
/// exporter is a task). A bad variable or an unreadable certificate is an error, not a silent "off".
pub fn from_env(
    metrics: &crate::runtime::metrics::ControllerMetrics,
) -> Result<std::sync::Arc<dyn ViolationSink>, TelemetryError> {
    match OtlpConfig::from_env(|name| std::env::var(name).ok())? {
        Some(config) => {
            let sink = Otlp::start(config)?;
            sink.stats().register(metrics);
            Ok(std::sync::Arc::new(sink))
        }
        None => {
            tracing::info!("no OTEL_EXPORTER_OTLP_ENDPOINT: violation events are not exported");
            Ok(std::sync::Arc::new(Disabled))
        }
    }
}
