//! Shared fixtures for end-to-end tests, and the local Kubernetes cluster they run on.
//!
//! - [`cluster`]: start, stop and inspect the cluster (synchronous; also behind `cargo xtask cluster`).
//! - [`images`]: the cluster's base images as docker-archive tars (no registry, no container engine).
//! - [`buildah`]: our images, built from the shipped Dockerfiles with buildah on a local Debian base.
//! - [`fixture`]: the async test fixture: one shared cluster, one namespace per test, clean-up on drop.
//! - [`scenario_fixture`]: the end-to-end scenario's workload and an agent's side of the uplink (tokens,
//!   records).
//! - [`e2e`]: our images and chart installed into the cluster, workloads and traffic for end-to-end tests.
//! - [`faults`]: the API server's writes refused or delayed for a while (fault-injection tests).
//! - [`stand_in_controller`]: a stand-in for the controller's uplink endpoint that records what it reads.
//! - [`wait`]: the one polling loop (blocking and async) every test waits with.
//! - [`netpol`]: the NetworkPolicy conformance harness (truth tables from real packets, `check` as a
//!   differential).

pub mod buildah;
pub mod cluster;
pub mod e2e;
pub mod faults;
pub mod fixture;
pub mod images;
pub mod netpol;
pub mod scenario_fixture;
pub mod stand_in_controller;
pub mod wait;
