//! What the process runs on: leader election ([`leader`]), the HTTP health/metrics endpoint ([`http`]),
//! the Prometheus metrics ([`metrics`]), Kubernetes Events ([`events`]) and the compressed JSON the
//! leader persists in ConfigMaps ([`gzip`]).

pub mod events;
pub mod gzip;
pub mod http;
pub mod leader;
pub mod metrics;
