//! The kernel side: host checks, loading and attaching our eBPF programs, and reading their events.

pub mod btf;
pub mod dns_messages;
pub mod events;
pub mod existing;
pub mod host;
pub mod loader;
