//! The network-enforcer node agent library.
//!
//! The agent sees every TCP and UDP connection of the pods on its node with its own eBPF programs
//! (`agent-ebpf`), whatever the CNI. Reading order:
//! - [`kernel::loader`]: checks the host, loads and attaches the kernel programs ([`kernel::loader::DataPlane`]);
//! - [`kernel::events`]: the events they report ([`kernel::events::ConnectionEvent`]) and the async ring-buffer reader;
//! - [`app`]: `run`, the agent as the binary starts it: every part started, then the event loop;
//! - [`pipeline`]: the path of every event in `run`: attribute → aggregate → flush into uplink records;
//! - [`aggregate`]: identical events folded into edges with first/last seen and a count;
//! - [`refresh`]: edges the controller holds already go up once per refresh interval, not per flush;
//! - [`clock`]: the kernel's monotonic clock (event times) and wall-clock time derived from it;
//! - [`debug::flows`]: the node-level `flows` view of those edges (filters, table, JSON);
//! - [`debug::socket`]: the local unix socket streaming events to `flows`;
//! - [`metrics`]: Prometheus counters on `/metrics`;
//! - [`identity::pod_identity`]: which pod an event belongs to, from its network namespace and cgroup;
//! - [`identity::attribution`] and [`identity::pod_watch`]: pod UIDs, IPs and scans → namespace/name (pure state + the watch);
//! - [`uplink`]: records to the controller over a gRPC stream (resend buffer, reconnects, token rotation);
//! - [`kernel::host`] and [`kernel::btf`]: what the loader needs to know about the running kernel;
//! - [`enforce`]: NetworkPolicy enforcement on the node (off unless `--enforcement networkpolicy`);
//! - [`memory`]: the allocator settings that keep the agent's resident memory bounded;
//! - [`cost`]: what the agent process costs its node (CPU time, resident memory), for the controller;
//! - [`error`]: what can go wrong, with what to do about it.

pub mod aggregate;
pub mod app;
pub mod clock;
pub mod cost;
pub mod debug;
pub mod dns;
pub mod enforce;
pub mod error;
pub mod identity;
pub mod kernel;
pub mod memory;
pub mod metrics;
pub mod pipeline;
pub mod refresh;
pub mod sources;
pub mod uplink;

pub use error::{Error, Result};
pub use kernel::events::{ConnectionEvent, Direction, EventReader, Outcome, Protocol};
pub use kernel::loader::{
    DataPlane, FlowMap, KernelCounters, LoadOptions, MapFill, Switches, TcpHook,
};
pub use network_enforcer_agent_common::Switch;
