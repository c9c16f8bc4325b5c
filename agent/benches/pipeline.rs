//! The agent's user-space pipeline alone, on one core: ring-buffer record bytes → decode (as the
//! ring-buffer reader does) → [`Pipeline::take_in`] (attribution of each new edge, aggregation, the
//! debug API's recent-records buffer through a bound [`DebugServer`]) → [`Pipeline::flush`] with the
//! uplink records every 100 000 events. The same `Pipeline` value `run` drives.
//!
//! A release-mode harness rather than criterion (no new dependency; `cargo xtask bench agent` runs it
//! and reads its last lines): it prints `pipeline_events_per_sec_per_core=<median of 5 runs>`, events
//! per CPU-second of this thread (so another process on the machine does not lower it), and
//! `pipeline_events_per_sec_wall=<median>`.
//!
//! Input: 1 000 000 records from 50 pods (their own network namespaces) to 10 peers on 4 ports,
//! TCP and UDP, both directions, ephemeral ports varying: at most 8 000 distinct edges (a busy node's
//! worth; the ephemeral port is not part of an edge). Set `NE_BENCH_PEERS` for more peers (each adds
//! 800 edges): with every event a new edge the recent-records buffer evicts and names constantly.

use network_enforcer_agent::clock::WallClock;
use network_enforcer_agent::debug::socket::{DebugServer, RECENT_EDGES};
use network_enforcer_agent::identity::attribution::{Attributor, PodInfo};
use network_enforcer_agent::kernel::events::ConnectionEvent;
use network_enforcer_agent::pipeline::{EdgeCaps, Pipeline};
use network_enforcer_agent_common::{AF_INET, FlowEvent, IPPROTO_TCP, IPPROTO_UDP};
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const EVENTS: usize = 1_000_000;
const PODS: u32 = 50;
const FLUSH_EVERY: usize = 100_000;

fn records() -> Vec<u8> {
    let peers: u64 = std::env::var("NE_BENCH_PEERS")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(10)
        .max(1);
    let size = std::mem::size_of::<FlowEvent>();
    let mut out = Vec::with_capacity(EVENTS * size);
    // A small xorshift, so the input is the same every run.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..EVENTS {
        let r = next();
        let pod = (r % u64::from(PODS)) as u32;
        let mut raw = FlowEvent::zeroed();
        raw.timestamp_ns = 1_000_000_000 + i as u64 * 1_000;
        raw.family = AF_INET;
        raw.protocol = if r & (1 << 20) == 0 {
            IPPROTO_TCP
        } else {
            IPPROTO_UDP
        };
        raw.direction = 1 + ((r >> 21) & 1) as u8;
        raw.outcome = if raw.protocol == IPPROTO_UDP { 3 } else { 1 };
        raw.netns_ino = 4_026_532_000 + pod;
        raw.cgroup_id = 10_000 + u64::from(pod);
        raw.local_addr[..4].copy_from_slice(&[10, 244, 0, 10 + pod as u8]);
        let peer = (r >> 24) % peers;
        raw.remote_addr[..4].copy_from_slice(&[10, 96, (peer >> 8) as u8, peer as u8]);
        let service = [80, 443, 53, 8080][((r >> 40) % 4) as usize];
        let ephemeral = 32_768 + ((r >> 44) % 28_000) as u16;
        (raw.local_port, raw.remote_port) = if raw.direction == 1 {
            (ephemeral, service)
        } else {
            (service, ephemeral)
        };
        raw.pid = 1000 + pod;
        raw.count = 1;
        // SAFETY: FlowEvent is repr(C) plain data without padding.
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts((&raw as *const FlowEvent).cast::<u8>(), size)
        });
    }
    out
}

fn attributor() -> Attributor {
    let mut at = Attributor::default();
    let uids: Vec<String> = (0..PODS)
        .map(|p| format!("{p:08x}-0000-4000-8000-000000000000"))
        .collect();
    for (p, uid) in uids.iter().enumerate() {
        at.apply(
            PodInfo {
                uid: uid.clone(),
                namespace: "bench".into(),
                name: format!("pod-{p}"),
                ips: vec![format!("10.244.0.{}", 10 + p).parse().unwrap()],
                host_network: false,
            },
            Duration::ZERO,
        );
    }
    at.observe_scan(
        1,
        uids.iter()
            .enumerate()
            .map(|(p, uid)| (4_026_532_000 + p as u32, uid.as_str())),
        uids.iter()
            .enumerate()
            .map(|(p, uid)| (10_000 + p as u64, uid.as_str())),
        Duration::ZERO,
    );
    at
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the valid timespec; the clock always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

struct Run {
    wall: Duration,
    cpu: Duration,
    edges: usize,
    records: usize,
}

fn run(bytes: &[u8], socket: &std::path::Path) -> Run {
    let size = std::mem::size_of::<FlowEvent>();
    let debug = DebugServer::bind(socket, RECENT_EDGES).expect("binding the debug socket");
    let mut pipeline = Pipeline::new(Arc::new(Mutex::new(attributor())), EdgeCaps::default())
        .with_tap(Arc::new(debug));
    let clock = WallClock::now();
    let mut batch = Vec::with_capacity(1024);
    let (mut edges, mut records) = (0, 0);
    let (start, cpu_start) = (Instant::now(), thread_cpu());
    for (i, record) in bytes.chunks_exact(size).enumerate() {
        if let Ok(event) = ConnectionEvent::decode(record) {
            batch.push(event);
        }
        if batch.len() == batch.capacity() || i + 1 == EVENTS {
            pipeline.take_in(&batch).expect("no scanner, no I/O");
            batch.clear();
        }
        if (i + 1) % FLUSH_EVERY == 0 {
            let flushed = pipeline.flush().expect("no scanner, no I/O");
            records += black_box(flushed.records(&clock)).len();
            edges += flushed.edges.len();
        }
    }
    Run {
        wall: start.elapsed(),
        cpu: thread_cpu() - cpu_start,
        edges,
        records,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let bytes = records();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let socket = dir.path().join("agent.sock");
    // The debug server accepts clients on the runtime; the pipeline itself runs on this thread.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let _guard = runtime.enter();
    let (mut per_cpu, mut per_wall) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let r = run(&bytes, &socket);
        let cpu_rate = EVENTS as f64 / r.cpu.as_secs_f64();
        let wall_rate = EVENTS as f64 / r.wall.as_secs_f64();
        eprintln!(
            "{EVENTS} events in {:?} wall, {:?} CPU ({cpu_rate:.0}/CPU-s, {wall_rate:.0}/s), {} edges and {} records flushed",
            r.wall, r.cpu, r.edges, r.records
        );
        per_cpu.push(cpu_rate);
        per_wall.push(wall_rate);
    }
    println!("pipeline_events_per_sec_wall={:.0}", median(per_wall));
    println!("pipeline_events_per_sec_per_core={:.0}", median(per_cpu));
}
