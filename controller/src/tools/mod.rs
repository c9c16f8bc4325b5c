//! Command-line tools built into the controller binary: `check`, `graph` and the uninstall cleanup
//! ([`commands`]: their arguments and the glue from files or the cluster to the tools).

pub mod check;
pub mod commands;
pub mod graph;
pub mod uninstall;
