//! What the controller knows about the cluster: the index of pods, Services, nodes and workloads
//! ([`index`]), the watches that feed it ([`watches`]) and workload identities (label selectors: `network_enforcer_api::selector`).

pub mod index;
pub mod watches;
pub mod workload;
