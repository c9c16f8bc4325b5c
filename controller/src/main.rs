//! `network-enforcer-controller`: turns observed flows into policy proposals, promotes them, renders and
//! monitors policies. Run `network-enforcer-controller --help`.

//! Parses the command line and starts the command: [`app::run`] (the controller) or one of
//! [`commands`] (`check`, `graph`, `cleanup`).

use anyhow::Result;
use clap::{Parser, Subcommand};
use network_enforcer_controller::app::{self, RunArgs};
use network_enforcer_controller::tools::commands::{self, CheckArgs, CleanupArgs, GraphArgs};

#[derive(Parser)]
#[command(
    version,
    about = "network-enforcer controller: learn proposals from flows, promote them into policies, \
             record violations (monitor) and render NetworkPolicies / AuthorizationPolicies (protect)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the controller against the cluster of the in-cluster config or KUBECONFIG.
    Run(Box<RunArgs>),
    /// Stop the controller (scale its Deployment to 0 and wait until its pods are gone), then delete
    /// every NetworkPolicy and AuthorizationPolicy it rendered, so no enforcement outlives an uninstall
    /// (the chart's pre-delete hook runs this). Policies are kept.
    Cleanup(CleanupArgs),
    /// Print the CustomResourceDefinitions this controller serves, as YAML
    /// (e.g. `network-enforcer-controller crds | kubectl apply -f -`).
    Crds,
    /// Evaluate flows against policies ("what would protect block?"): a scenario file of namespaces,
    /// pods, NetworkPolicies / WorkloadNetworkPolicies and flows, JSON or YAML; or (--from-cluster)
    /// the cluster's objects and the traffic the controller observed.
    Check(CheckArgs),
    /// Draw the learned workload graph (proposals, policies and their modes, violations in red) as
    /// Graphviz DOT, or SVG through `dot`.
    Graph(GraphArgs),
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Crds => {
            for (_, yaml) in network_enforcer_api::crd_manifests() {
                print!("---\n{yaml}");
            }
            Ok(())
        }
        Command::Run(args) => app::run(*args).await,
        Command::Check(args) => commands::check(&args).await,
        Command::Graph(args) => commands::graph(&args).await,
        Command::Cleanup(args) => commands::cleanup(args).await,
    }
}
