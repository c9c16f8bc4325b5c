//! What the controller knows about the cluster: the index of pods, Services, nodes and workloads
//! ([`index`]), the watches that feed it ([`watches`]), workload identities and label selectors.

pub mod index;
pub mod selector;
pub mod watches;
pub mod workload;
