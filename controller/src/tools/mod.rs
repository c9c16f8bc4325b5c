//! Command-line tools built into the controller binary: `check`, `graph` and the uninstall cleanup.

pub mod check;
pub mod graph;
pub mod uninstall;
