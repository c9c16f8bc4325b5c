//! The local single-node Kubernetes cluster (`cargo xtask cluster up|down|status`). The cluster itself
//! is a library in the tests crate (`network_enforcer_tests::cluster`), shared with the test fixture.

use anyhow::Result;
use clap::Subcommand;
use network_enforcer_tests::cluster;

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

/// Runs one cluster action.
pub fn run(action: Action) -> Result<()> {
    match action {
        Action::Up => {
            let info = cluster::up()?;
            let kubectl = cluster::layout::kubernetes_bin("kubectl");
            println!(
                "The local cluster is up ({server}).\n\
                 \n    export KUBECONFIG={kubeconfig}\n    {kubectl} get nodes\n\n\
                 kubectl v1.20 from setup matches the server; a newer kubectl works for most commands.\n\
                 Pods must use `imagePullPolicy: Never` with local images (`cargo xtask image <name>`).\n\
                 `cargo xtask cluster down` removes everything.",
                server = info.server,
                kubeconfig = info.kubeconfig.display(),
                kubectl = kubectl.display(),
            );
        }
        Action::Down => {
            cluster::down()?;
            println!("The local cluster is down; everything it created is removed.");
        }
        Action::Status => print!("{}", cluster::status()?),
    }
    Ok(())
}
