//! What the controller knows about the cluster: the index of pods, Services, nodes and workloads
//! ([`index`]), the addresses pods resolved names of outside services to ([`names`]), the watches that
//! feed the index ([`watches`]), the one watch per kind of the policy objects every part reads
//! ([`shared_watch`]) and workload identities (label selectors: `network_enforcer_api::selector`).
//! How a record is resolved against it: docs/behaviour.md §1.3 and §3.2.

pub mod index;
pub mod names;
pub mod shared_watch;
pub mod watches;
pub mod workload;
