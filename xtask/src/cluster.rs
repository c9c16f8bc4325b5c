//! The local single-node Kubernetes cluster (`cargo xtask cluster up|down|status`).

use anyhow::{Result, bail};
use clap::Subcommand;

/// What to do with the local cluster.
#[derive(Subcommand)]
pub enum Action {
    /// Start (or keep) the cluster and print the kubeconfig path.
    Up,
    /// Stop the cluster and remove everything it created.
    Down,
    /// Show what runs.
    Status,
}

pub fn run(_action: Action) -> Result<()> {
    bail!("the local cluster is not built yet")
}
