//! `network-enforcer-agent`: the node agent binary. Run `network-enforcer-agent --help`.

//! Parses the command line and starts the command; the commands live in the library:
//! [`app::run`] (the agent), [`command::show_flows`] (`flows`) and [`status::show_status`] (`status`).

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use network_enforcer_agent::app::{self, DEFAULT_TABLE, RunArgs};
use network_enforcer_agent::debug::command::{self, FlowsArgs};
use network_enforcer_agent::debug::status::{self, StatusArgs};
use network_enforcer_agent::enforce::nft;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "network-enforcer-agent",
    version,
    about = "network-enforcer node agent: sees every TCP/UDP connection of the pods on this node with eBPF",
    long_about = "network-enforcer node agent.\n\n\
        It loads its own eBPF programs (needs root, or CAP_BPF + CAP_PERFMON + CAP_NET_ADMIN, and a kernel \
        with BTF), reports every TCP connection established or attempted and every UDP exchange on the \
        node, in every network namespace, and aggregates them into edges.\n\n\
        In a cluster: kubectl exec -n <namespace> ds/<agent-daemonset> -- network-enforcer-agent flows\n\n\
        Log level: RUST_LOG (default info), e.g. RUST_LOG=network_enforcer_agent=debug."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start
enum Command {
    /// Run the agent: load the eBPF programs, aggregate connections into edges, attribute them to the
    /// node's pods (by network namespace, or cgroup for hostNetwork pods), log each flushed batch and,
    /// with --controller-url, stream it to the controller, until SIGINT/SIGTERM. Needs the host's /proc, network namespace and cgroup tree.
    Run(RunArgs),
    /// Show the connections on this node as aggregated flows, live from the running agent's debug socket.
    Flows(FlowsArgs),
    /// What the running agent costs this node and whether it works: each eBPF program's runs and time
    /// (kernel BPF statistics turned on for the sample), events read and lost, the uplink, DNS,
    /// enforcement and memory, sampled from its metrics endpoint.
    Status(StatusArgs),
    /// Operate on the node's NetworkPolicy enforcement table.
    #[command(subcommand)]
    Enforcement(EnforcementCommand),
}

#[derive(Subcommand)]
enum EnforcementCommand {
    /// Remove the enforcement table from this node (pods are no longer isolated by the agent). The
    /// chart's uninstall does this; use it after removing the agent by other means.
    Clear {
        #[arg(long, default_value = DEFAULT_TABLE, env = "NE_ENFORCEMENT_TABLE", value_parser = nft::valid_table_name)]
        table: String,
    },
}

/// Tokio worker threads: the agent's hot path is one task (read, aggregate, flush); the others (metrics,
/// uplink, watches) are light. Not one per core: each thread costs a stack and allocator state.
const WORKER_THREADS: usize = 2;

fn main() -> Result<()> {
    network_enforcer_agent::memory::bound_malloc_arenas();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run())
}

async fn run() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Run(args) => app::run(args).await,
        Command::Flows(args) => command::show_flows(args).await,
        Command::Status(args) => status::show_status(args).await,
        Command::Enforcement(EnforcementCommand::Clear { table }) => {
            if nft::clear_all(&table).with_context(|| format!("removing table inet {table}"))? {
                println!("removed table inet {table}");
            } else {
                println!("no table inet {table} on this node");
            }
            Ok(())
        }
    }
}
