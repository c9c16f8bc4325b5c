//! `network-enforcer-agent flows`: the node's connections as aggregated flows, live from the running
//! agent's debug socket (or from a copy of the programs loaded here with `--local`).

use crate::aggregate::Aggregator;
use crate::app::{KernelArgs, shutdown_signal};
use crate::clock::WallClock;
use crate::debug::flows::{self, FlowFilter, PodNames};
use crate::debug::socket::{self, DebugClient};
use crate::kernel::events::EventReader;
use crate::{DataPlane, Direction, Outcome, Protocol};
use anyhow::{Context, Result};
use clap::ValueEnum;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct FlowsArgs {
    /// The running agent's debug socket. When no agent answers there, `flows` loads its own copy of
    /// the programs (which needs the same privileges as the agent).
    #[arg(long, default_value = socket::DEFAULT_SOCKET, env = "NE_DEBUG_SOCKET")]
    socket: PathBuf,
    /// Load the programs here even if an agent is running.
    #[arg(long)]
    local: bool,
    #[command(flatten)]
    kernel: KernelArgs,
    /// Keep printing new flows every interval until interrupted, instead of printing once.
    #[arg(short, long)]
    follow: bool,
    /// Seconds to collect before printing (each round, with --follow), 1 to 86400.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    interval: u64,
    /// First print the flows the running agent saw within this window (e.g. 30s, 5m, 1h) from its
    /// recent-records buffer, at once; with --follow, live rounds follow.
    #[arg(long, value_parser = flows::parse_duration)]
    since: Option<Duration>,
    /// Only flows of pods in this namespace.
    #[arg(long)]
    namespace: Option<String>,
    /// Only flows of this pod (`name` or `namespace/name`).
    #[arg(long)]
    pod: Option<String>,
    /// Only flows to this service port (the peer's port when outbound, the local port when inbound).
    #[arg(long)]
    port: Option<u16>,
    /// Only this protocol.
    #[arg(long, value_enum)]
    protocol: Option<ProtocolArg>,
    /// Only this direction.
    #[arg(long, value_enum)]
    direction: Option<DirectionArg>,
    /// Only this outcome.
    #[arg(long, value_enum)]
    outcome: Option<OutcomeArg>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Format::Table)]
    output: Format,
}

#[derive(Clone, Copy, ValueEnum)]
enum ProtocolArg {
    Tcp,
    Udp,
}

#[derive(Clone, Copy, ValueEnum)]
enum DirectionArg {
    Outbound,
    Inbound,
}

#[derive(Clone, Copy, ValueEnum)]
enum OutcomeArg {
    Established,
    Failed,
    Datagram,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// Columns like `hubble observe`: time, source, destination, port, protocol, outcome, count.
    Table,
    /// One JSON object per flow per line.
    Json,
}

impl FlowsArgs {
    fn filter(&self) -> FlowFilter {
        FlowFilter {
            namespace: self.namespace.clone(),
            pod: self.pod.clone(),
            port: self.port,
            protocol: self.protocol.map(|p| match p {
                ProtocolArg::Tcp => Protocol::Tcp,
                ProtocolArg::Udp => Protocol::Udp,
            }),
            direction: self.direction.map(|d| match d {
                DirectionArg::Outbound => Direction::Outbound,
                DirectionArg::Inbound => Direction::Inbound,
            }),
            outcome: self.outcome.map(|o| match o {
                OutcomeArg::Established => Outcome::Established,
                OutcomeArg::Failed => Outcome::Failed,
                OutcomeArg::Datagram => Outcome::Datagram,
            }),
        }
    }
}

/// Where `flows` gets its events: the running agent, or its own copy of the programs.
enum EventSource {
    Agent(DebugClient),
    /// The programs loaded here: no pod attribution, only the host's own sockets are named.
    Local(Box<DataPlane>, EventReader, PodNames),
}

impl EventSource {
    async fn open(args: &FlowsArgs) -> Result<Self> {
        if !args.local {
            match DebugClient::connect(&args.socket, args.since).await {
                Ok(mut client) => {
                    if let Some((inode, node)) = flows::host_netns() {
                        client.names_mut().set_host(inode, node);
                    }
                    return Ok(Self::Agent(client));
                }
                Err(err) if args.since.is_some() => {
                    anyhow::bail!(
                        "--since needs the running agent's recent-records buffer, and no agent answers on {}: {err}",
                        args.socket.display()
                    )
                }
                Err(err) => eprintln!("no running agent ({err}); loading the eBPF programs here"),
            }
        } else if args.since.is_some() {
            anyhow::bail!(
                "--since needs the running agent's recent-records buffer; it cannot be used with --local"
            );
        }
        let mut data_plane =
            DataPlane::load(&args.kernel.load_options()).context("starting the eBPF data plane")?;
        let reader = data_plane.events()?;
        let mut names = PodNames::default();
        if let Some((inode, node)) = flows::host_netns() {
            names.set_host(inode, node);
        }
        Ok(Self::Local(Box::new(data_plane), reader, names))
    }

    async fn read_batch(&mut self, out: &mut Vec<crate::ConnectionEvent>) -> Result<()> {
        match self {
            Self::Agent(client) => client
                .read_batch(out)
                .await
                .context("reading from the agent")?,
            Self::Local(_, reader, _) => reader.read_batch(out).await?,
        }
        Ok(())
    }

    /// The pod labels the agent sent (none when the programs run here: no attribution then).
    fn names(&self) -> &PodNames {
        match self {
            Self::Agent(client) => client.names(),
            Self::Local(_, _, names) => names,
        }
    }

    /// Reports events that were lost on the way, if any.
    fn warn_about_losses(&self) -> Result<()> {
        let lost = match self {
            Self::Agent(client) => client.lagged(),
            Self::Local(data_plane, _, _) => data_plane.counters()?.ring_buffer_full,
        };
        if lost > 0 {
            tracing::warn!(lost, "events were lost (this view fell behind)");
        }
        Ok(())
    }
}

pub async fn show_flows(args: FlowsArgs) -> Result<()> {
    let filter = args.filter();
    let mut source = EventSource::open(&args).await?;
    let clock = WallClock::now();
    let mut aggregator = Aggregator::new();
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let mut first = true;
    let print = |edges: &[crate::aggregate::Edge], names: &PodNames, header: bool| {
        let text = match args.output {
            Format::Table => flows::render_table(edges, &clock, names, header),
            Format::Json => flows::render_json(edges, &clock, names),
        };
        print!("{text}");
    };
    if let (Some(window), EventSource::Agent(client)) = (args.since, &mut source) {
        let history = client
            .read_history()
            .await
            .context("reading the agent's recent flows")?;
        if !history.complete {
            tracing::warn!(
                ?window,
                "the agent's recent-records buffer no longer holds all flows of this window (raise --recent-edges)"
            );
        }
        for (key, stats) in history.edges {
            if filter.matches(&key, client.names().get(&key)) {
                aggregator.add_edge(key, stats);
            }
        }
        print(&aggregator.drain(), client.names(), true);
        first = false;
        if !args.follow {
            return source.warn_about_losses();
        }
    }
    loop {
        let until = tokio::time::Instant::now() + Duration::from_secs(args.interval.max(1));
        let mut batch = Vec::new();
        let mut stop = false;
        loop {
            tokio::select! {
                read = source.read_batch(&mut batch) => {
                    read?;
                    let names = source.names();
                    batch
                        .drain(..)
                        .filter(|e| {
                            let key = crate::aggregate::EdgeKey::of(e);
                            filter.matches(&key, names.get(&key))
                        })
                        .for_each(|e| {
                            aggregator.add(&e);
                        });
                }
                _ = tokio::time::sleep_until(until) => break,
                r = &mut shutdown => { r?; stop = true; break; }
            }
        }
        print(&aggregator.drain(), source.names(), first);
        first = false;
        if stop || !args.follow {
            break;
        }
    }
    source.warn_about_losses()
}
