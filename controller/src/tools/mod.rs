//! Command-line tools built into the controller binary: `check`, `graph` and the uninstall cleanup
//! ([`commands`]: their arguments and the glue from files or the cluster to the tools).

pub mod check;
pub mod commands;
/// The graph model lives below the tools and the web view, which both draw it.
pub use crate::graph;
pub mod uninstall;
