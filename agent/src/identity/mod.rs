//! Which pod an event belongs to: pod UIDs, IPs, network namespaces and cgroups, fed by the pod watch.
//! Attribution happens in [`attribution`] only ([`attribution::Attributor::resolve`]); the rest feeds it.

pub mod attribution;
pub mod pod_identity;
pub mod pod_watch;
