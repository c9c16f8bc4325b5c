//! The local Kubernetes cluster (`cargo xtask cluster up [--nodes N]|down|status`). The cluster itself
//! is a library in the tests crate (`network_enforcer_tests::cluster`), shared with the test fixture.

use anyhow::Result;
use clap::Subcommand;
use network_enforcer_tests::cluster;

/// What to do with the local cluster.
#[derive(Subcommand)]
pub enum Action {
    /// Start (or keep) the cluster and print the kubeconfig path.
    Up {
        /// How many nodes: node 1 is this machine; nodes 2 and up are simulated in their own network
        /// and mount namespaces with their own containerd, kubelet and kube-proxy, tainted so that only
        /// pods asking for them run there (docs/local-cluster.md, "Several nodes"). Nodes above N that
        /// an earlier `up` started are removed.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
        nodes: u8,
    },
    /// Stop the cluster and remove everything it created.
    Down,
    /// Show what runs.
    Status,
}

/// Runs one cluster action.
pub fn run(action: Action) -> Result<()> {
    match action {
        Action::Up { nodes } => {
            let info = cluster::up_with_nodes(nodes)?;
            cluster::remove_nodes_above(nodes)?;
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
