//! What the process runs on: leader election ([`leader`]), the HTTP health/metrics endpoint ([`http`])
//! and the Prometheus metrics ([`metrics`]).

pub mod http;
pub mod leader;
pub mod metrics;
