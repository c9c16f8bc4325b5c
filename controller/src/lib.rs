//! The network-enforcer controller library.
//!
//! Pure decisions (what a promotion does, what a policy renders into, which policy wins a target)
//! are plain functions over plain data in their own modules; [`reconcile`] is the thin Kubernetes
//! layer that feeds them and writes their results.

pub mod app;
pub mod cluster;
pub mod graph;
pub mod ingest;
pub mod learn;
pub mod monitor;
pub mod policy;
pub mod reconcile;
pub mod runtime;
pub mod sources;
pub mod tools;
pub mod ui;

/// Hash maps for keys the API server gives (pods, Services, namespaces, their addresses): foldhash,
/// randomly seeded, several times faster than the standard SipHash on the short strings and addresses
/// every flow record is looked up by. It is only minimally resistant to crafted collisions, so maps keyed
/// by what agents send (learned edges, violation history) keep the standard hasher.
pub(crate) type FastMap<K, V> = foldhash::HashMap<K, V>;
/// The set form of [`FastMap`].
pub(crate) type FastSet<T> = foldhash::HashSet<T>;
