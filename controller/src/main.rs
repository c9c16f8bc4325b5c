//! `network-enforcer-controller`: turns observed flows into policy proposals, promotes them, renders and
//! monitors policies. Run `network-enforcer-controller --help`.

//! Parses the command line and starts the command: [`app::run`] (the controller) or one of
//! [`commands`] (`check`, `graph`, `cleanup`).

use anyhow::{Context, Result};
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

fn main() -> Result<()> {
    // Before the runtime starts its threads (network_enforcer_api::memory): one malloc arena per core
    // instead of glibc's 8. Streams' buffers are allocated on the runtime's workers and freed on the
    // merge pool; more arenas kept more of them (at 1,000 busy agents, 700 MiB instead of 635).
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    network_enforcer_api::memory::bound_malloc_arenas(
        i32::try_from(cores.max(2)).unwrap_or(i32::MAX),
    );
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run())
}

async fn run() -> Result<()> {
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
