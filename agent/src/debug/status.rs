//! `network-enforcer-agent status`: what the running agent costs this node and whether it works, for an
//! operator at the node (`kubectl exec ds/<agent> -- network-enforcer-agent status`).
//!
//! It reads the agent's own endpoint twice, a sample apart (`/readyz` and `/metrics`), and reports
//! rates over the sample: each eBPF program's runs and nanoseconds per run (the kernel keeps these only
//! while BPF statistics are on: the command turns them on for the sample when it may, as root or with
//! CAP_SYS_ADMIN, and says so when it may not), events read and lost, edges flushed, the uplink, DNS,
//! enforcement and the agent's memory. Pure parts ([`Samples`], [`Report::build`]) are table-tested;
//! the command itself is I/O.

use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

const PREFIX: &str = "network_enforcer_agent_";

/// `status`'s arguments.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The agent's metrics endpoint on this node (the agent also listens on 127.0.0.1).
    #[arg(long, default_value_t = 9464, env = "NE_METRICS_PORT")]
    metrics_port: u16,
    /// How long to sample rates and the programs' cost (e.g. `5s`, `1m`).
    #[arg(long, default_value = "5s", value_parser = super::flows::parse_duration)]
    sample: Duration,
    /// Output: a summary for people, or JSON.
    #[arg(short, long, value_enum, default_value_t = StatusFormat::Table)]
    output: StatusFormat,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusFormat {
    Table,
    Json,
}

/// One reading of the agent's `/metrics`: each sample's series (name with labels, without the
/// agent's prefix) and value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Samples(BTreeMap<String, f64>);

impl Samples {
    /// Reads the Prometheus text format; comments and unreadable lines are skipped.
    pub fn parse(text: &str) -> Self {
        Samples(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    let (series, value) = l.rsplit_once(' ')?;
                    let series = series.strip_prefix(PREFIX)?;
                    Some((series.to_string(), value.trim().parse().ok()?))
                })
                .collect(),
        )
    }

    fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }

    /// The values of `name{label="..."}`, by the label's value.
    fn by_label(&self, name: &str, label: &str) -> BTreeMap<String, f64> {
        let head = format!("{name}{{{label}=\"");
        self.0
            .iter()
            .filter_map(|(series, value)| {
                let rest = series.strip_prefix(&head)?;
                let (value_of_label, tail) = rest.split_once('"')?;
                (tail == "}").then(|| (value_of_label.to_string(), *value))
            })
            .collect()
    }
}

/// One eBPF program over the sample.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProgramRow {
    pub program: String,
    pub runs_per_sec: f64,
    /// `None` when it did not run (or the kernel kept no statistics).
    pub ns_per_run: Option<f64>,
    /// Share of one CPU the program took.
    pub cpu_percent: f64,
}

/// One of the programs' LRU maps, as the agent last sampled it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MapRow {
    pub map: String,
    pub entries: f64,
    pub capacity: f64,
    /// Evicted to make room since the agent started (estimated by the agent; see its metric's help:
    /// most are harmless).
    pub evictions: f64,
}

/// Whether the kernel kept BPF statistics during the sample.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelStats {
    /// This command turned them on for the sample.
    TurnedOn,
    /// They were on already, or could not be turned on: `why` says which (the programs' rows show
    /// runs only if something else turned them on, e.g. `sysctl kernel.bpf_stats_enabled=1`).
    NotTurnedOn { why: String },
}

/// What `status` reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub sample_seconds: f64,
    pub ready: bool,
    /// Each component of `/readyz`: (name, ready, detail).
    pub components: Vec<(String, bool, String)>,
    pub kernel_stats: KernelStats,
    pub programs: Vec<ProgramRow>,
    /// Sum over the programs: the share of one CPU the agent's programs took in the kernel.
    pub kernel_cpu_percent: f64,
    pub events_per_sec: f64,
    /// Lost over the sample: the kernel's ring buffer was full (connections not seen).
    pub events_lost: f64,
    /// Dropped over the sample at the per-pod and per-node caps of new edges.
    pub events_dropped: f64,
    /// The fullest the events ring buffer was in the last minute (0 to 1).
    pub ring_buffer_peak_fill: f64,
    pub ring_buffer_bytes: f64,
    pub maps: Vec<MapRow>,
    pub edges_per_sec: f64,
    pub unattributed_edges_per_sec: f64,
    pub uplink_connected: bool,
    pub uplink_pending_batches: f64,
    /// Over the sample.
    pub uplink_batches_sent: f64,
    pub uplink_batches_acked: f64,
    pub uplink_batches_dropped: f64,
    pub uplink_records_rejected: f64,
    pub dns_messages_per_sec: f64,
    pub enforcement_in_sync: Option<bool>,
    pub enforcement_denied_per_sec: f64,
    pub resident_memory_bytes: f64,
}

impl Report {
    /// The report over a sample of `seconds` between `before` and `after`, with `/readyz`'s JSON.
    pub fn build(
        before: &Samples,
        after: &Samples,
        seconds: f64,
        readiness: &serde_json::Value,
        kernel_stats: KernelStats,
    ) -> Self {
        let seconds = seconds.max(0.001);
        let delta = |series: &str| (after.get(series) - before.get(series)).max(0.0);
        let rate = |series: &str| delta(series) / seconds;
        let runs_after = after.by_label("ebpf_program_runs_total", "program");
        let runs_before = before.by_label("ebpf_program_runs_total", "program");
        let secs_after = after.by_label("ebpf_program_run_seconds_total", "program");
        let secs_before = before.by_label("ebpf_program_run_seconds_total", "program");
        let programs: Vec<ProgramRow> = runs_after
            .iter()
            .map(|(program, runs)| {
                let runs = (runs - runs_before.get(program).copied().unwrap_or(0.0)).max(0.0);
                let busy = (secs_after.get(program).copied().unwrap_or(0.0)
                    - secs_before.get(program).copied().unwrap_or(0.0))
                .max(0.0);
                ProgramRow {
                    program: program.clone(),
                    runs_per_sec: runs / seconds,
                    ns_per_run: (runs > 0.0).then(|| busy * 1e9 / runs),
                    cpu_percent: busy / seconds * 100.0,
                }
            })
            .collect();
        let components = readiness["components"]
            .as_object()
            .map(|c| {
                c.iter()
                    .map(|(name, state)| {
                        (
                            name.clone(),
                            state["ready"].as_bool().unwrap_or(false),
                            state["detail"].as_str().unwrap_or_default().to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        // A family's growth over the sample, summed over its label's values.
        let family = |name: &str, label: &str| {
            let sum = |samples: &Samples| samples.by_label(name, label).values().sum::<f64>();
            (sum(after) - sum(before)).max(0.0)
        };
        let dropped = family("events_dropped_total", "reason");
        let evictions = after.by_label("ebpf_map_evictions_total", "map");
        let capacity = after.by_label("ebpf_map_capacity", "map");
        let maps = after
            .by_label("ebpf_map_entries", "map")
            .into_iter()
            .map(|(map, entries)| MapRow {
                capacity: capacity.get(&map).copied().unwrap_or(0.0),
                evictions: evictions.get(&map).copied().unwrap_or(0.0),
                map,
                entries,
            })
            .collect();
        let dns_messages = family("dns_messages_total", "outcome") / seconds;
        let denied = family("enforcement_denied_total", "direction") / seconds;
        Report {
            sample_seconds: seconds,
            ready: readiness["ready"].as_bool().unwrap_or(false),
            components,
            kernel_stats,
            kernel_cpu_percent: programs.iter().map(|p| p.cpu_percent).sum(),
            programs,
            events_per_sec: rate("events_total"),
            events_lost: delta("events_lost_total"),
            events_dropped: dropped,
            ring_buffer_peak_fill: after.get("ring_buffer_peak_fill_ratio"),
            ring_buffer_bytes: after.get("ring_buffer_capacity_bytes"),
            maps,
            edges_per_sec: rate("edges_total"),
            unattributed_edges_per_sec: rate("unattributed_edges_total"),
            uplink_connected: after.get("uplink_connected") == 1.0,
            uplink_pending_batches: after.get("uplink_pending_batches"),
            uplink_batches_sent: delta("uplink_batches_sent_total"),
            uplink_batches_acked: delta("uplink_batches_acked_total"),
            uplink_batches_dropped: delta("uplink_batches_dropped_total"),
            uplink_records_rejected: delta("uplink_records_rejected_total"),
            dns_messages_per_sec: dns_messages,
            enforcement_in_sync: after
                .0
                .contains_key("enforcement_in_sync")
                .then(|| after.get("enforcement_in_sync") == 1.0),
            enforcement_denied_per_sec: denied,
            resident_memory_bytes: after.get("resident_memory_bytes"),
        }
    }

    /// The summary for people.
    pub fn render_table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "agent: {} (sampled {:.1} s)",
            if self.ready { "ready" } else { "NOT READY" },
            self.sample_seconds
        );
        for (name, ready, detail) in &self.components {
            let mark = if *ready { "ok " } else { "-- " };
            let _ = writeln!(out, "  {mark}{name}: {detail}");
        }
        match &self.kernel_stats {
            KernelStats::TurnedOn => {
                let _ = writeln!(out, "kernel cost (BPF statistics on for the sample):");
            }
            KernelStats::NotTurnedOn { why } => {
                let _ = writeln!(
                    out,
                    "kernel cost: BPF statistics not turned on by this command ({why}):"
                );
            }
        }
        let _ = writeln!(
            out,
            "  {:<28} {:>10} {:>9} {:>7}",
            "PROGRAM", "RUNS/S", "NS/RUN", "CPU %"
        );
        for p in &self.programs {
            let ns = p
                .ns_per_run
                .map_or_else(|| "-".to_string(), |ns| format!("{ns:.0}"));
            let _ = writeln!(
                out,
                "  {:<28} {:>10.1} {:>9} {:>7.3}",
                p.program, p.runs_per_sec, ns, p.cpu_percent
            );
        }
        let _ = writeln!(
            out,
            "  {:<28} {:>10} {:>9} {:>7.3}",
            "all programs", "", "", self.kernel_cpu_percent
        );
        let _ = writeln!(
            out,
            "events: {:.1}/s read, {} lost (ring buffer full), {} dropped at the edge caps",
            self.events_per_sec, self.events_lost, self.events_dropped
        );
        let _ = writeln!(
            out,
            "ring buffer: {:.0}% full at its fullest in the last minute, of {:.0} KiB",
            self.ring_buffer_peak_fill * 100.0,
            self.ring_buffer_bytes / 1024.0
        );
        for m in &self.maps {
            let _ = writeln!(
                out,
                "map {}: {} of {} entries ({:.0}%), {} evicted since the agent started",
                m.map,
                m.entries,
                m.capacity,
                m.entries / m.capacity.max(1.0) * 100.0,
                m.evictions
            );
        }
        let _ = writeln!(
            out,
            "edges: {:.2}/s flushed, {:.2}/s of no known pod",
            self.edges_per_sec, self.unattributed_edges_per_sec
        );
        let _ = writeln!(
            out,
            "uplink: {}, {} batches sent, {} acknowledged, {} pending, {} dropped, {} records rejected",
            if self.uplink_connected {
                "connected"
            } else {
                "not connected"
            },
            self.uplink_batches_sent,
            self.uplink_batches_acked,
            self.uplink_pending_batches,
            self.uplink_batches_dropped,
            self.uplink_records_rejected
        );
        let _ = writeln!(out, "dns: {:.1} messages/s read", self.dns_messages_per_sec);
        match self.enforcement_in_sync {
            None => {
                let _ = writeln!(out, "enforcement: off");
            }
            Some(in_sync) => {
                let _ = writeln!(
                    out,
                    "enforcement: {}, {:.2} denied/s",
                    if in_sync { "in sync" } else { "NOT in sync" },
                    self.enforcement_denied_per_sec
                );
            }
        }
        let _ = writeln!(
            out,
            "memory: {:.1} MiB resident",
            self.resident_memory_bytes / (1024.0 * 1024.0)
        );
        out
    }
}

/// `GET http://<address><path>` (HTTP/1.0): the status code and the body.
async fn http_get(address: &str, path: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::net::TcpStream::connect(address),
    )
    .await
    .with_context(|| format!("connecting to the agent at {address}: timed out"))?
    .with_context(|| {
        format!(
            "connecting to the agent at {address} (is it running? --metrics-port / NE_METRICS_PORT)"
        )
    })?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .await?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .context("reading the agent's answer: timed out")??;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("the agent's answer has no header end")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("the agent's answer has no status code")?;
    Ok((code, body.to_string()))
}

/// Runs `status`.
pub async fn show_status(args: StatusArgs) -> Result<()> {
    let address = format!("127.0.0.1:{}", args.metrics_port);
    let (_, readiness) = http_get(&address, "/readyz").await?;
    let readiness: serde_json::Value =
        serde_json::from_str(&readiness).context("the agent's /readyz is not JSON")?;
    // Statistics stay on while the descriptor is open, for every program of the host: only for the
    // sample, since they cost a little on every run.
    let (stats, kernel_stats) = match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => (Some(fd), KernelStats::TurnedOn),
        Err(e) => (
            None,
            KernelStats::NotTurnedOn {
                why: format!("{e}; needs CAP_SYS_ADMIN, or sysctl kernel.bpf_stats_enabled=1"),
            },
        ),
    };
    let started = std::time::Instant::now();
    let (_, before) = http_get(&address, "/metrics").await?;
    tokio::time::sleep(args.sample).await;
    let (_, after) = http_get(&address, "/metrics").await?;
    let seconds = started.elapsed().as_secs_f64();
    drop(stats);
    let report = Report::build(
        &Samples::parse(&before),
        &Samples::parse(&after),
        seconds,
        &readiness,
        kernel_stats,
    );
    match args.output {
        StatusFormat::Table => print!("{}", report.render_table()),
        StatusFormat::Json => println!("{}", serde_json::to_string(&report)?),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# HELP network_enforcer_agent_events Connection events read from the kernel
# TYPE network_enforcer_agent_events counter
network_enforcer_agent_events_total 1000
network_enforcer_agent_events_lost_total 2
network_enforcer_agent_ebpf_program_runs_total{program="inet_sock_set_state"} 5000
network_enforcer_agent_ebpf_program_run_seconds_total{program="inet_sock_set_state"} 0.002
network_enforcer_agent_ebpf_program_runs_total{program="udp_sendmsg4"} 10
network_enforcer_agent_ebpf_program_run_seconds_total{program="udp_sendmsg4"} 0.00001
network_enforcer_agent_events_dropped_total{reason="pod_cap"} 1
network_enforcer_agent_uplink_connected 1
network_enforcer_agent_uplink_batches_sent_total 7
network_enforcer_agent_enforcement_in_sync 1
network_enforcer_agent_resident_memory_bytes 1048576
network_enforcer_agent_ring_buffer_peak_fill_ratio 0.5
network_enforcer_agent_ring_buffer_capacity_bytes 4194304
network_enforcer_agent_ebpf_map_entries{map="edges"} 65536
network_enforcer_agent_ebpf_map_capacity{map="edges"} 65536
network_enforcer_agent_ebpf_map_evictions_total{map="edges"} 100
network_enforcer_agent_ebpf_map_entries{map="connecting"} 12
network_enforcer_agent_ebpf_map_capacity{map="connecting"} 65536
network_enforcer_agent_ebpf_map_evictions_total{map="connecting"} 0
other_metric 5
"#;

    fn after() -> String {
        BEFORE
            .replace("events_total 1000", "events_total 1500")
            .replace("events_lost_total 2", "events_lost_total 3")
            .replace(
                "runs_total{program=\"inet_sock_set_state\"} 5000",
                "runs_total{program=\"inet_sock_set_state\"} 10000",
            )
            .replace(
                "seconds_total{program=\"inet_sock_set_state\"} 0.002",
                "seconds_total{program=\"inet_sock_set_state\"} 0.004",
            )
            .replace("{reason=\"pod_cap\"} 1", "{reason=\"pod_cap\"} 4")
            .replace("batches_sent_total 7", "batches_sent_total 9")
            .replace(
                "evictions_total{map=\"edges\"} 100",
                "evictions_total{map=\"edges\"} 350",
            )
            .replace(
                "resident_memory_bytes 1048576",
                "resident_memory_bytes 47185920",
            )
    }

    #[test]
    fn the_report_is_the_rates_over_the_sample() {
        let readiness = serde_json::json!({"ready": true, "components": {
            "ebpf": {"ready": true, "required": true, "detail": "programs attached"},
            "uplink": {"ready": false, "required": false, "detail": "connecting"}}});
        let report = Report::build(
            &Samples::parse(BEFORE),
            &Samples::parse(&after()),
            5.0,
            &readiness,
            KernelStats::TurnedOn,
        );
        assert_eq!(report.events_per_sec, 100.0);
        assert_eq!(report.events_lost, 1.0);
        assert_eq!(report.events_dropped, 3.0);
        assert_eq!(report.uplink_batches_sent, 2.0);
        assert!(report.uplink_connected);
        assert_eq!(report.enforcement_in_sync, Some(true));
        assert_eq!(report.resident_memory_bytes, 47185920.0);
        assert_eq!(report.ring_buffer_peak_fill, 0.5);
        let edges = report.maps.iter().find(|m| m.map == "edges").unwrap();
        assert_eq!(
            (edges.entries, edges.capacity, edges.evictions),
            (65536.0, 65536.0, 350.0)
        );
        let tcp = &report.programs[0];
        assert_eq!(tcp.program, "inet_sock_set_state");
        assert_eq!(tcp.runs_per_sec, 1000.0);
        // 2 ms over 5,000 runs.
        assert!((tcp.ns_per_run.unwrap() - 400.0).abs() < 1e-6, "{tcp:?}");
        assert!((tcp.cpu_percent - 0.04).abs() < 1e-9, "{tcp:?}");
        // A program that did not run in the sample has no cost per run.
        assert_eq!(report.programs[1].ns_per_run, None);
        assert_eq!(
            report.components[1],
            ("uplink".to_string(), false, "connecting".to_string())
        );
        let table = report.render_table();
        for line in [
            "agent: ready (sampled 5.0 s)",
            "  -- uplink: connecting",
            "inet_sock_set_state",
            "events: 100.0/s read, 1 lost (ring buffer full), 3 dropped at the edge caps",
            "enforcement: in sync",
            "memory: 45.0 MiB resident",
            "ring buffer: 50% full at its fullest in the last minute, of 4096 KiB",
            "map connecting: 12 of 65536 entries (0%), 0 evicted since the agent started\n",
            "map edges: 65536 of 65536 entries (100%), 350 evicted since the agent started",
        ] {
            assert!(table.contains(line), "{line:?} in\n{table}");
        }
    }

    #[test]
    fn counters_that_went_back_count_nothing_and_missing_ones_are_zero() {
        // The agent restarted between the readings: its counters start over.
        let report = Report::build(
            &Samples::parse(&after()),
            &Samples::parse(BEFORE),
            1.0,
            &serde_json::Value::Null,
            KernelStats::NotTurnedOn {
                why: "EPERM".into(),
            },
        );
        assert_eq!(report.events_per_sec, 0.0);
        assert!(report.programs.iter().all(|p| p.runs_per_sec == 0.0));
        assert!(!report.ready && report.components.is_empty());
        let empty = Report::build(
            &Samples::default(),
            &Samples::parse("garbage\nnetwork_enforcer_agent_events_total not-a-number\n"),
            1.0,
            &serde_json::Value::Null,
            KernelStats::TurnedOn,
        );
        assert_eq!(empty.events_per_sec, 0.0);
        assert_eq!(empty.enforcement_in_sync, None, "enforcement off");
        assert!(empty.render_table().contains("enforcement: off"));
        assert!(
            report
                .render_table()
                .contains("BPF statistics not turned on by this command (EPERM")
        );
    }
}
