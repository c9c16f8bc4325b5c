//! `network-enforcer-agent`: the node agent binary. Run `network-enforcer-agent --help`.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use network_enforcer_agent::{DataPlane, LoadOptions};
use std::time::Duration;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "network-enforcer-agent",
    version,
    about = "network-enforcer node agent: sees every TCP/UDP connection of the pods on this node with eBPF",
    long_about = "network-enforcer node agent.\n\n\
        It loads its own eBPF programs (needs root, or CAP_BPF + CAP_PERFMON + CAP_NET_ADMIN, and a kernel \
        with BTF), reports every TCP connection established or attempted and every UDP exchange, attributes \
        them to local pods and aggregates them into edges.\n\n\
        Log level: RUST_LOG (e.g. RUST_LOG=network_enforcer_agent=debug)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load the eBPF programs and report connections until interrupted (Ctrl-C / SIGTERM).
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Size of the kernel's events ring buffer in bytes (a power of two, a multiple of the page size).
    #[arg(long, env = "NE_RING_BUFFER_BYTES")]
    ring_buffer_bytes: Option<u32>,
    /// The kernel reports the same edge at most once per this many seconds.
    #[arg(long, default_value_t = 5, env = "NE_DEDUPE_SECONDS")]
    dedupe_seconds: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    match Cli::parse().command {
        Command::Run(args) => run(args).await,
    }
}

async fn run(args: RunArgs) -> Result<()> {
    let options = LoadOptions {
        ring_buffer_bytes: args.ring_buffer_bytes,
        dedupe_window: Duration::from_secs(args.dedupe_seconds),
    };
    let mut data_plane = DataPlane::load(&options).context("starting the eBPF data plane")?;
    let mut reader = data_plane.events()?;
    let mut batch = Vec::new();
    loop {
        tokio::select! {
            read = reader.read_batch(&mut batch) => read?,
            _ = tokio::signal::ctrl_c() => break,
        }
        for event in batch.drain(..) {
            tracing::info!(
                protocol = ?event.protocol,
                direction = ?event.direction,
                outcome = ?event.outcome,
                local = %event.local,
                remote = %event.remote,
                pid = event.pid,
                "connection"
            );
        }
    }
    let counters = data_plane.counters()?;
    tracing::info!(?counters, "stopped");
    Ok(())
}
