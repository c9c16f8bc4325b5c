//! OpenTelemetry log events of SPEC section 7: `policy_violation_observed` for every violation of
//! every provider, `policy_violation_acknowledged` once per record after the status patch that
//! acknowledged it succeeded.
//!
//! The controller talks to a [`ViolationSink`]; it never waits on it. [`Disabled`] is the sink when
//! no OTLP endpoint is configured: status is recorded regardless, nothing is exported.

use crate::violations::Observation;
use network_enforcer_api::crd::{AcknowledgedViolation, Backend};

/// Where violation events go. Implementations must return quickly and never fail: an exporter that
/// is slow or down drops events (and counts the drops), it does not hold up the status sync.
pub trait ViolationSink: Send + Sync {
    /// A violating flow was attributed to a policy of `backend` (emitted for every observation, in
    /// monitor and protect mode alike).
    fn observed(&self, backend: Backend, observation: &Observation);

    /// A record was acknowledged and the status patch that moved it succeeded. Call once per record.
    fn acknowledged(&self, acknowledged: &AcknowledgedViolation);
}

/// The sink when no OTLP endpoint is configured: drops every event.
#[derive(Clone, Copy, Debug, Default)]
pub struct Disabled;

impl ViolationSink for Disabled {
    fn observed(&self, _backend: Backend, _observation: &Observation) {}

    fn acknowledged(&self, _acknowledged: &AcknowledgedViolation) {}
}
