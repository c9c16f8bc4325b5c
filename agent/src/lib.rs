//! The network-enforcer node agent library.
//!
//! The agent sees every TCP and UDP connection of the pods on its node with its own eBPF programs
//! (`agent-ebpf`), whatever the CNI. Reading order:
//! - [`loader`]: checks the host, loads and attaches the kernel programs ([`loader::DataPlane`]);
//! - [`events`]: the events they report ([`events::ConnectionEvent`]) and the async ring-buffer reader;
//! - [`aggregate`]: identical events folded into edges with first/last seen and a count;
//! - [`flows`]: the node-level `flows` view of those edges (filters, table, JSON);
//! - [`debug_api`]: the local unix socket streaming events to `flows`;
//! - [`metrics`]: Prometheus counters on `/metrics`;
//! - [`pod_identity`]: which pod an event belongs to, from its network namespace and cgroup;
//! - [`attribution`] and [`pod_watch`]: pod UIDs, IPs and scans → namespace/name (pure state + the watch);
//! - [`uplink`]: records to the controller over a gRPC stream (resend buffer, reconnects, token rotation);
//! - [`host`], [`btf`] and [`tracepoint_format`]: what the loader needs to know about the running kernel;
//! - [`error`]: what can go wrong, with what to do about it.

pub mod aggregate;
pub mod attribution;
pub mod btf;
pub mod debug_api;
pub mod error;
pub mod events;
pub mod flows;
pub mod host;
pub mod loader;
pub mod metrics;
pub mod pod_identity;
pub mod pod_watch;
pub mod sources;
pub mod tracepoint_format;
pub mod uplink;

pub use error::{Error, Result};
pub use events::{ConnectionEvent, Direction, EventReader, Outcome, Protocol};
pub use loader::{DataPlane, KernelCounters, LoadOptions};
