//! What the process runs on: leader election ([`leader`]), the HTTP health/metrics endpoint ([`http`]),
//! the Prometheus metrics ([`metrics`]) and Kubernetes Events ([`events`]).

pub mod events;
pub mod http;
pub mod leader;
pub mod metrics;
