//! The network-enforcer controller library.
//!
//! Pure decisions (what a promotion does, what a policy renders into, which policy wins a target)
//! are plain functions over plain data in their own modules; [`reconcile`] is the thin Kubernetes
//! layer that feeds them and writes their results.

pub mod app;
pub mod cluster;
pub mod ingest;
pub mod learn;
pub mod monitor;
pub mod policy;
pub mod reconcile;
pub mod runtime;
pub mod sources;
pub mod tools;
pub mod ui;
