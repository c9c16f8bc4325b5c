//! `cargo xtask bench agent`: the agent under a connection storm (root).
//!
//! Two network namespaces joined by a veth pair stand in for pods. A server thread pool in one accepts
//! TCP connections and reads UDP datagrams; client threads in the other open short-lived TCP connections
//! (closed with RST, so no TIME_WAIT runs out the ports) and, every 8th connection, send a UDP datagram
//! from a fresh unconnected socket. Each phase runs [`PHASE`] with the same load:
//!
//! 1. no observer (the baseline connection rate);
//! 2. our agent (`network-enforcer-agent run --dedupe-seconds 0`, release build: every connection is two
//!    kernel events, the worst case), with its CPU time, peak RSS and its lost-event counter;
//! 3. libbpf-tools `tcplife` (Debian `libbpf-tools`, from `cargo xtask setup`), output to /dev/null.
//!
//! The three run interleaved, `NE_AGENT_BENCH_ROUNDS` times (default 3: ABC ABC ABC), and each rate is
//! the median of its rounds with its spread. When the baseline rounds disagree by more than 10 % the
//! machine's speed drifted and no ratio is reported.
//!
//! Then the kernel's time in each of our programs (BPF statistics on: runs, ns per run, ns per
//! connection), and the user-space pipeline alone (`agent/benches/pipeline.rs`, release) for events/s
//! on one core. Figures go to `target/bench/agent.json`. `NE_AGENT_BENCH_KERNEL_ONLY=1` runs only the
//! kernel-time phases (about 30 s, `target/bench/agent_kernel.json`), for comparing builds of the
//! programs.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{Figure, report};
use crate::run;

/// How long each phase generates load.
const PHASE: Duration = Duration::from_secs(10);
/// The agent's shipped `--dedupe-seconds` (the chart's `agent.dedupeSeconds`).
const DEFAULT_DEDUPE_SECONDS: u64 = 5;
/// Client threads (the machine has two cores; more threads only queue).
const CLIENTS: usize = 2;
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 203, 0, 2);
const TCP_PORT: u16 = 8080;
const UDP_PORT: u16 = 5353;
/// Every this many TCP connections, a client also sends one UDP datagram.
const UDP_EVERY: u64 = 8;

unsafe extern "C" {
    fn setns(fd: i32, nstype: i32) -> i32;
    fn setsockopt(fd: i32, level: i32, name: i32, value: *const std::ffi::c_void, len: u32) -> i32;
    fn geteuid() -> u32;
    fn listen(fd: i32, backlog: i32) -> i32;
    fn poll(fds: *mut PollFd, nfds: u64, timeout_ms: i32) -> i32;
}

/// `struct pollfd`.
#[repr(C)]
struct PollFd {
    fd: i32,
    events: i16,
    revents: i16,
}
const POLLIN: i16 = 1;
const CLONE_NEWNET: i32 = 0x4000_0000;
const SOL_SOCKET: i32 = 1;
const SO_LINGER: i32 = 13;

pub fn run() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { geteuid() } != 0 {
        bail!("the agent bench loads eBPF programs and creates network namespaces: run it as root");
    }
    let root = run::workspace_root();
    run::step(
        "build the agent (release)",
        run::cargo(
            &root,
            &[],
            &[
                "build",
                "--release",
                "--locked",
                "-p",
                "network-enforcer-agent",
            ],
        ),
    )?;
    let agent_bin = root.join("target/release/network-enforcer-agent");

    let rounds: usize = std::env::var("NE_AGENT_BENCH_ROUNDS")
        .ok()
        .map(|v| v.parse().context("NE_AGENT_BENCH_ROUNDS must be a number"))
        .transpose()?
        .unwrap_or(3)
        .max(1);
    if std::env::var_os("NE_AGENT_BENCH_KERNEL_ONLY").is_some() {
        // Only the kernel-time phases (about 30 s): for comparing builds of the programs.
        let pods = Pods::create()?;
        let kernel = kernel_phases(&agent_bin, &pods)?;
        drop(pods);
        report("agent_kernel", &kernel_figures(&kernel))?;
        return Ok(());
    }
    let tcplife_bin = which("tcplife")
        .context("tcplife not found: install Debian's libbpf-tools (`cargo xtask setup` does)")?;
    let pods = Pods::create()?;
    let (mut baseline, mut agent, mut tcplife) = (Vec::new(), Vec::new(), Vec::new());
    let mut agent_default = Vec::new();
    let (mut cpu, mut events_read, mut lost, mut rss) = (0.0, 0u64, 0u64, 0.0f64);
    let mut agent_storms = Vec::new();
    for round in 1..=rounds {
        // Interleaved (ABCD ABCD ...): a drift of the machine's speed shows in every phase alike,
        // and in the spread of the baseline, instead of favouring whichever phase ran first.
        println!(
            "==> round {round}/{rounds}: no observer ({}s)",
            PHASE.as_secs()
        );
        let b = storm(&pods)?;
        println!("    {b}");
        baseline.push(b.rate());

        println!(
            "==> round {round}/{rounds}: our agent, every event reported (--dedupe-seconds 0)"
        );
        let running = Agent::start(&agent_bin, 0)?;
        let phase = running.phase(&pods)?;
        println!("    {phase}");
        agent.push(phase.storm.rate());
        cpu += phase.cpu_s;
        events_read += phase.events;
        lost += phase.lost;
        rss = rss.max(phase.rss_mib);
        agent_storms.push(phase.storm);

        println!("==> round {round}/{rounds}: tcplife");
        let observer = Observer::start(Command::new(&tcplife_bin))?;
        let t = storm(&pods)?;
        drop(observer);
        println!("    {t}");
        tcplife.push(t.rate());

        println!(
            "==> round {round}/{rounds}: our agent, shipped settings (--dedupe-seconds {DEFAULT_DEDUPE_SECONDS})"
        );
        let phase = Agent::start(&agent_bin, DEFAULT_DEDUPE_SECONDS)?.phase(&pods)?;
        println!("    {phase}");
        agent_default.push(phase.storm.rate());
        lost += phase.lost;
    }

    let kernel = kernel_phases(&agent_bin, &pods)?;
    drop(pods);

    println!("==> pipeline alone (release, one core)");
    let pipeline = pipeline_rate(&root)?;

    let (base, base_spread) = median_spread(&baseline);
    let (with_agent, agent_spread) = median_spread(&agent);
    let (with_tcplife, tcplife_spread) = median_spread(&tcplife);
    let (with_agent_default, agent_default_spread) = median_spread(&agent_default);
    let tcp: u64 = agent_storms.iter().map(|s| s.tcp).sum();
    let udp: u64 = agent_storms.iter().map(|s| s.udp).sum();
    // Every TCP connection is an outbound and an inbound event; every datagram a send and a receive.
    let expected = 2 * (tcp + udp);
    let mut figures = vec![
        Figure::new("rounds", rounds as f64, "ABCD rounds"),
        Figure::new("conn_rate_baseline", base, "conn/s (median)"),
        Figure::new("conn_rate_baseline_spread", base_spread, "(max-min)/median"),
        Figure::new("conn_rate_agent", with_agent, "conn/s (median)"),
        Figure::new("conn_rate_agent_spread", agent_spread, "(max-min)/median"),
        Figure::new(
            "conn_rate_agent_default",
            with_agent_default,
            "conn/s (median)",
        ),
        Figure::new(
            "conn_rate_agent_default_spread",
            agent_default_spread,
            "(max-min)/median",
        ),
        Figure::new("conn_rate_tcplife", with_tcplife, "conn/s (median)"),
        Figure::new(
            "conn_rate_tcplife_spread",
            tcplife_spread,
            "(max-min)/median",
        ),
    ];
    if base_spread > MAX_BASELINE_SPREAD {
        println!(
            "\nNO RATIO: the baseline phases disagree by {:.0} % (more than {:.0} %): the machine's speed drifted \
             during the run; rerun on a quiet machine or with more rounds (NE_AGENT_BENCH_ROUNDS)",
            base_spread * 100.0,
            MAX_BASELINE_SPREAD * 100.0
        );
    } else {
        figures.extend([
            Figure::new("conn_rate_ratio_agent", with_agent / base, "of baseline"),
            Figure::new(
                "conn_rate_ratio_agent_default",
                with_agent_default / base,
                "of baseline",
            ),
            Figure::new(
                "conn_rate_ratio_tcplife",
                with_tcplife / base,
                "of baseline",
            ),
        ]);
    }
    figures.extend([
        Figure::new("events_expected", expected as f64, "events"),
        Figure::new(
            "events_read",
            events_read as f64,
            "events (incl. other node traffic)",
        ),
        Figure::new("events_lost", lost as f64, "events"),
        Figure::new("cpu_s_per_million_conn", cpu / (tcp as f64 / 1e6), "CPU s"),
        Figure::new("pipeline_events_per_sec_per_core", pipeline, "events/CPU-s"),
        Figure::new("agent_peak_rss_mib", rss, "MiB"),
    ]);
    figures.extend(kernel_figures(&kernel));
    report("agent", &figures)?;
    Ok(())
}

/// The storm with the agent at `--dedupe-seconds 0` and at the shipped setting, with the kernel's
/// BPF statistics on: (ns in our programs per connection, CPU-s in them per second) for each.
fn kernel_phases(agent_bin: &Path, pods: &Pods) -> Result<Vec<(f64, f64)>> {
    let mut kernel = Vec::new();
    // What the agent costs inside the kernel, from the kernel's own BPF statistics: kept only for
    // these phases, because keeping them adds two clock reads to every program run.
    for dedupe in [0, DEFAULT_DEDUPE_SECONDS] {
        println!("==> kernel time of our programs (--dedupe-seconds {dedupe}, BPF statistics on)");
        let stats = BpfStats::enable()?;
        let phase = Agent::start(agent_bin, dedupe)?.phase(pods)?;
        drop(stats);
        let connections = (phase.storm.tcp + phase.storm.udp).max(1) as f64;
        let kernel_s = phase.kernel_s();
        println!(
            "    {phase}; {kernel_s:.3} s in the kernel's runs of our programs, {:.0} ns per connection",
            kernel_s * 1e9 / connections
        );
        // Runs per connection and time per run tell a hook that fires often from one that works
        // hard when it fires (issue: which hook set costs least per connection).
        for (program, s) in &phase.kernel_by_program {
            let runs = phase.runs_by_program.get(program).copied().unwrap_or(0.0);
            println!(
                "      {program}: {:.0} ns per connection ({:.2} runs per connection, {:.0} ns per run)",
                s * 1e9 / connections,
                runs / connections,
                if runs > 0.0 { s * 1e9 / runs } else { 0.0 }
            );
        }
        kernel.push((kernel_s * 1e9 / connections, kernel_s / phase.storm.secs));
    }
    Ok(kernel)
}

/// The figures of [`kernel_phases`].
fn kernel_figures(kernel: &[(f64, f64)]) -> Vec<Figure> {
    vec![
        Figure::new("kernel_ns_per_conn", kernel[0].0, "ns in our programs"),
        Figure::new(
            "kernel_cpu_share",
            kernel[0].1,
            "CPU-s in our programs per second",
        ),
        Figure::new(
            "kernel_ns_per_conn_default",
            kernel[1].0,
            "ns in our programs",
        ),
        Figure::new(
            "kernel_cpu_share_default",
            kernel[1].1,
            "CPU-s in our programs per second",
        ),
    ]
}

/// Baseline phases further apart than this (relative to their median) make a ratio meaningless.
const MAX_BASELINE_SPREAD: f64 = 0.10;

/// The median of `values` and their spread, (max − min) / median.
fn median_spread(values: &[f64]) -> (f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let median = if v.is_empty() {
        0.0
    } else if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    let spread = match (v.first(), v.last()) {
        (Some(min), Some(max)) if median > 0.0 => (max - min) / median,
        _ => 0.0,
    };
    (median, spread)
}

fn which(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

/// Two namespaces joined by a veth pair; removed on drop.
struct Pods {
    server: String,
    client: String,
}

impl Pods {
    fn create() -> Result<Self> {
        let tag = std::process::id() % 100_000;
        let pods = Self {
            server: format!("nebench-s{tag}"),
            client: format!("nebench-c{tag}"),
        };
        let (s, c) = (&pods.server, &pods.client);
        let veth_s = format!("nbs{tag}");
        let veth_c = format!("nbc{tag}");
        let sip = format!("{SERVER_IP}/24");
        let cip = format!("{CLIENT_IP}/24");
        for args in [
            vec!["netns", "add", s],
            vec!["netns", "add", c],
            vec![
                "link", "add", &veth_s, "type", "veth", "peer", "name", &veth_c,
            ],
            vec!["link", "set", &veth_s, "netns", s],
            vec!["link", "set", &veth_c, "netns", c],
            vec!["-n", s, "addr", "add", &sip, "dev", &veth_s],
            vec!["-n", c, "addr", "add", &cip, "dev", &veth_c],
            vec!["-n", s, "link", "set", &veth_s, "up"],
            vec!["-n", c, "link", "set", &veth_c, "up"],
            vec!["-n", s, "link", "set", "lo", "up"],
            vec!["-n", c, "link", "set", "lo", "up"],
        ] {
            run::output(Command::new("ip").args(&args))?;
        }
        // A deep accept queue: the clients outrun the server in bursts.
        run::output(Command::new("ip").args([
            "netns",
            "exec",
            s,
            "sysctl",
            "-qw",
            "net.core.somaxconn=65535",
        ]))?;
        Ok(pods)
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        for ns in [&self.server, &self.client] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Moves the calling thread into the named network namespace.
fn enter(netns: &str) -> std::io::Result<()> {
    let file = std::fs::File::open(format!("/run/netns/{netns}"))?;
    // SAFETY: a valid namespace file descriptor; setns only affects this thread.
    if unsafe { setns(file.as_raw_fd(), CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Closes with RST instead of FIN, so neither end keeps the connection in TIME_WAIT.
fn linger_zero(fd: i32) {
    let linger: [i32; 2] = [1, 0];
    // SAFETY: a valid socket and a `struct linger` of the right size.
    unsafe {
        setsockopt(
            fd,
            SOL_SOCKET,
            SO_LINGER,
            linger.as_ptr().cast(),
            std::mem::size_of_val(&linger) as u32,
        )
    };
}

struct Storm {
    tcp: u64,
    udp: u64,
    failed: u64,
    secs: f64,
}

impl Storm {
    fn rate(&self) -> f64 {
        self.tcp as f64 / self.secs
    }
}

impl std::fmt::Display for Storm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} TCP connections ({:.0}/s), {} UDP datagrams, {} failed connects in {:.1} s",
            self.tcp,
            self.rate(),
            self.udp,
            self.failed,
            self.secs
        )
    }
}

/// One phase of load: servers and clients for [`PHASE`].
fn storm(pods: &Pods) -> Result<Storm> {
    let stop = Arc::new(AtomicBool::new(false));
    let (tcp, udp, failed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<std::io::Result<()>>();
    let mut threads = Vec::new();
    {
        let (server, stop, ready) = (pods.server.clone(), stop.clone(), ready_tx.clone());
        threads.push(std::thread::spawn(move || {
            let listener = enter(&server)
                .and_then(|()| TcpListener::bind(SocketAddr::from((SERVER_IP, TCP_PORT))))
                .and_then(|l| {
                    // The namespace allows a deep accept queue; ask for it (std asks for less).
                    // SAFETY: a listening socket; listen again only changes its backlog.
                    unsafe { listen(l.as_raw_fd(), 65535) };
                    l.set_nonblocking(true).map(|()| l)
                });
            let listener = match listener {
                Ok(l) => {
                    let _ = ready.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            // Woken as soon as a connection waits (no sleep that would let the queue fill in
            // bursts and make clients wait a SYN retransmission), then drains the queue.
            while !stop.load(Ordering::Relaxed) {
                let mut waiting = PollFd {
                    fd: listener.as_raw_fd(),
                    events: POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; a timeout so that `stop` is seen.
                unsafe { poll(&mut waiting, 1, 50) };
                while let Ok((stream, _)) = listener.accept() {
                    linger_zero(stream.as_raw_fd());
                }
            }
        }));
    }
    {
        let (server, stop, ready) = (pods.server.clone(), stop.clone(), ready_tx.clone());
        threads.push(std::thread::spawn(move || {
            let socket = enter(&server)
                .and_then(|()| UdpSocket::bind(SocketAddr::from((SERVER_IP, UDP_PORT))))
                .and_then(|s| {
                    s.set_read_timeout(Some(Duration::from_millis(100)))
                        .map(|()| s)
                });
            let socket = match socket {
                Ok(s) => {
                    let _ = ready.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            let mut buf = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                // recv_from asks for the sender's address: the agent's recvmsg hook sees it.
                let _ = socket.recv_from(&mut buf);
            }
        }));
    }
    for _ in 0..2 {
        ready_rx
            .recv()
            .context("a server thread died")?
            .context("starting the bench servers")?;
    }
    let started = Instant::now();
    for _ in 0..CLIENTS {
        let (client, stop) = (pods.client.clone(), stop.clone());
        let (tcp, udp, failed) = (tcp.clone(), udp.clone(), failed.clone());
        threads.push(std::thread::spawn(move || {
            if enter(&client).is_err() {
                return;
            }
            let target = SocketAddr::from((SERVER_IP, TCP_PORT));
            let udp_target = SocketAddr::from((SERVER_IP, UDP_PORT));
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match TcpStream::connect(target) {
                    Ok(stream) => {
                        linger_zero(stream.as_raw_fd());
                        tcp.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                n += 1;
                if n.is_multiple_of(UDP_EVERY) {
                    if let Ok(socket) = UdpSocket::bind(SocketAddr::from((CLIENT_IP, 0))) {
                        if socket.send_to(b"bench", udp_target).is_ok() {
                            udp.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }));
    }
    std::thread::sleep(PHASE);
    stop.store(true, Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64();
    for t in threads {
        let _ = t.join();
    }
    Ok(Storm {
        tcp: tcp.load(Ordering::Relaxed),
        udp: udp.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        secs,
    })
}

/// Our agent, running for one phase; stopped (SIGTERM) on drop.
struct Agent {
    child: Child,
    metrics: SocketAddr,
    socket_dir: PathBuf,
}

impl Agent {
    fn start(bin: &Path, dedupe_seconds: u64) -> Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let socket_dir = std::env::temp_dir().join(format!("ne-bench-{}", std::process::id()));
        let child = Command::new(bin)
            .env("RUST_LOG", "warn")
            .env_remove("NODE_NAME")
            .args(["run", "--flush-seconds", "1", "--dedupe-seconds"])
            .arg(dedupe_seconds.to_string())
            .arg("--metrics-address")
            .arg(metrics.to_string())
            .arg("--debug-socket")
            .arg(socket_dir.join("agent.sock"))
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let agent = Self {
            child,
            metrics,
            socket_dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while agent.metric("network_enforcer_agent_events_total").is_err() {
            if Instant::now() > deadline {
                bail!("the agent did not serve metrics within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(agent)
    }

    fn proc_file(&self, name: &str) -> Result<String> {
        let path = format!("/proc/{}/{name}", self.child.id());
        std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))
    }

    /// utime + stime of the agent process, in seconds.
    fn cpu_seconds(&self) -> Result<f64> {
        let stat = self.proc_file("stat")?;
        // Fields after the command name (which may contain spaces) start at ") ".
        let rest = stat
            .rsplit_once(") ")
            .context("unexpected /proc/PID/stat")?
            .1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
        Ok(ticks / 100.0) // USER_HZ is 100 on Linux
    }

    /// Peak resident set size (VmHWM) in MiB.
    fn peak_rss_mib(&self) -> Result<f64> {
        let status = self.proc_file("status")?;
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .context("no VmHWM")?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()?;
        Ok(kib / 1024.0)
    }

    /// One storm with the agent running, and what the agent did meanwhile; stops the agent.
    fn phase(self, pods: &Pods) -> Result<AgentPhase> {
        let cpu_before = self.cpu_seconds()?;
        let events_before = self.metric("network_enforcer_agent_events_total")?;
        let kernel_before = self.series(KERNEL_SECONDS)?;
        let runs_before = self.series(KERNEL_RUNS)?;
        let storm = storm(pods)?;
        // Let the agent drain its ring buffer and fold in the kernel counters (it flushes every second).
        std::thread::sleep(Duration::from_secs(3));
        Ok(AgentPhase {
            cpu_s: self.cpu_seconds()? - cpu_before,
            events: (self.metric("network_enforcer_agent_events_total")? - events_before) as u64,
            lost: self.metric("network_enforcer_agent_events_lost_total")? as u64,
            rss_mib: self.peak_rss_mib()?,
            kernel_by_program: self
                .series(KERNEL_SECONDS)?
                .into_iter()
                .map(|(program, s)| {
                    let before = kernel_before.get(&program).copied().unwrap_or(0.0);
                    (program, s - before)
                })
                .collect(),
            runs_by_program: self
                .series(KERNEL_RUNS)?
                .into_iter()
                .map(|(program, runs)| {
                    let before = runs_before.get(&program).copied().unwrap_or(0.0);
                    (program, runs - before)
                })
                .collect(),
            storm,
        })
    }

    /// Every series of a metric family from the agent's /metrics, by its labels (`{program="x"}`,
    /// or empty for a metric without labels).
    fn series(&self, name: &str) -> Result<std::collections::BTreeMap<String, f64>> {
        let text = self.metrics_text()?;
        text.lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(name)?;
                let (labels, value) = match rest.strip_prefix('{') {
                    Some(labelled) => labelled.split_once("} ")?,
                    None => ("", rest.strip_prefix(' ')?),
                };
                Some((labels, value))
            })
            .map(|(labels, value)| {
                let value = value.trim().parse::<f64>().context("parsing a metric")?;
                Ok((labels.to_string(), value))
            })
            .collect()
    }

    /// A counter from the agent's /metrics.
    fn metric(&self, name: &str) -> Result<f64> {
        self.metrics_text()?
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .context(format!("{name} not in /metrics"))?
            .trim()
            .parse::<f64>()
            .context("parsing a metric")
    }

    /// The agent's /metrics.
    fn metrics_text(&self) -> Result<String> {
        let mut stream = TcpStream::connect_timeout(&self.metrics, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            stream,
            "GET /metrics HTTP/1.0\r\nHost: {}\r\n\r\n",
            self.metrics
        )?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        Ok(text)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.socket_dir);
    }
}

/// What one storm with our agent running measured.
struct AgentPhase {
    storm: Storm,
    /// The agent process's CPU time.
    cpu_s: f64,
    events: u64,
    lost: u64,
    rss_mib: f64,
    /// Time the kernel spent in each of our programs (0 unless [`BpfStats`] are on), by the metric's
    /// labels (`program="..."`).
    kernel_by_program: std::collections::BTreeMap<String, f64>,
    /// Runs of each of our programs (counted only while [`BpfStats`] are on), by the same labels.
    runs_by_program: std::collections::BTreeMap<String, f64>,
}

impl AgentPhase {
    /// Time the kernel spent in our programs.
    fn kernel_s(&self) -> f64 {
        self.kernel_by_program.values().sum()
    }
}

/// The agent's metric of the time the kernel spent in its programs, per program.
const KERNEL_SECONDS: &str = "network_enforcer_agent_ebpf_program_run_seconds_total";
/// The agent's metric of its programs' runs, per program.
const KERNEL_RUNS: &str = "network_enforcer_agent_ebpf_program_runs_total";

impl std::fmt::Display for AgentPhase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}; agent {:.2} s CPU, {} events read, {} lost, peak RSS {:.1} MiB",
            self.storm, self.cpu_s, self.events, self.lost, self.rss_mib
        )
    }
}

/// The kernel's BPF run-time statistics, on while this lives (`kernel.bpf_stats_enabled`).
struct BpfStats {
    before: String,
}

impl BpfStats {
    const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

    fn enable() -> Result<Self> {
        let before = std::fs::read_to_string(Self::SYSCTL)
            .with_context(|| format!("reading {}", Self::SYSCTL))?;
        std::fs::write(Self::SYSCTL, "1").with_context(|| format!("writing {}", Self::SYSCTL))?;
        Ok(Self { before })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::SYSCTL, self.before.trim());
    }
}

/// A peer observer running for one phase; stopped on drop.
/// A running observer and the file its complaints go to.
struct Observer(Child, PathBuf);

impl Observer {
    fn start(mut cmd: Command) -> Result<Self> {
        // tcplife attaches to the classic tracepoint, found through tracefs (the agent's raw
        // tracepoint needs none): a machine booted without it mounted has the directory empty.
        let tracefs = Path::new("/sys/kernel/tracing");
        if !tracefs.join("events").exists() {
            let mounted = Command::new("mount")
                .args(["-t", "tracefs", "nodev"])
                .arg(tracefs)
                .status()
                .context("mounting tracefs for the observer")?;
            if !mounted.success() {
                bail!(
                    "tracefs is not mounted at {} and mounting it failed",
                    tracefs.display()
                );
            }
        }
        // Its complaints to a file: a pipe nobody reads while it runs could fill and stall it.
        let errors =
            std::env::temp_dir().join(format!("ne-bench-observer-{}.err", std::process::id()));
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&errors).context("creating the observer's error file")?)
            .spawn()
            .context("starting the observer")?;
        // Its programs take a moment to load and attach.
        std::thread::sleep(Duration::from_secs(3));
        // One that could not attach has exited by now: its rate would be the baseline's, passed
        // off as an observer's.
        if let Some(status) = child.try_wait()? {
            let stderr = std::fs::read_to_string(&errors).unwrap_or_default();
            let _ = std::fs::remove_file(&errors);
            bail!("the observer exited at start ({status}): {}", stderr.trim());
        }
        Ok(Self(child, errors))
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
        let _ = std::fs::remove_file(&self.1);
    }
}

/// Runs `agent/benches/pipeline.rs` in release mode and reads its figure.
fn pipeline_rate(root: &Path) -> Result<f64> {
    let out = run::output(&mut run::cargo(
        root,
        &[],
        &[
            "bench",
            "--locked",
            "-p",
            "network-enforcer-agent",
            "--bench",
            "pipeline",
        ],
    ))?;
    out.lines()
        .find_map(|l| l.strip_prefix("pipeline_events_per_sec_per_core="))
        .context("the pipeline bench printed no figure")?
        .trim()
        .parse()
        .context("parsing the pipeline figure")
}
