//! The network-enforcer controller library.
//!
//! Pure decisions (what a promotion does, what a policy renders into, which policy wins a target)
//! are plain functions over plain data in their own modules; [`reconcile`] is the thin Kubernetes
//! layer that feeds them and writes their results.

pub mod authorization_policy;
pub mod check;
pub mod conditions;
pub mod evaluate;
pub mod flow_record;
pub mod graph;
pub mod http;
pub mod index_feed;
pub mod ingest;
pub mod ingest_tls;
pub mod leader;
pub mod learn;
pub mod metrics;
pub mod promote;
pub mod proposals;
pub mod reconcile;
pub mod render;
pub mod resolve;
pub mod selector;
pub mod settle;
pub mod sources;
pub mod status_sync;
pub mod telemetry;
pub mod uninstall;
pub mod uniqueness;
pub mod violations;
pub mod workload;
