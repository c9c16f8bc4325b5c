//! Shared fixtures for end-to-end tests, and the local single-node Kubernetes cluster they run on.
//!
//! - [`cluster`]: start, stop and inspect the cluster (synchronous; also behind `cargo xtask cluster`).
//! - [`images`]: local container images as docker-archive tars (no registry, no container engine).
//! - [`fixture`]: the async test fixture: one shared cluster, one namespace per test, clean-up on drop.
//! - [`section10`]: the SPEC section 10 workload and an agent's side of the uplink (tokens, records).

pub mod cluster;
pub mod fixture;
pub mod images;
pub mod section10;
