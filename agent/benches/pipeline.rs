//! The agent's user-space pipeline alone, on one core: ring-buffer record bytes → decode → the debug
//! API's recent-records buffer (which names each new edge's pod through the attribution state) →
//! aggregation, with a flush (drain + attribution of every edge) every 100 000 events, as `run` does.
//!
//! A release-mode harness rather than criterion (no new dependency; `cargo xtask bench agent` runs it
//! and reads its last line): it prints `pipeline_events_per_sec_per_core=<median of 5 runs>`.
//!
//! Input: 1 000 000 records from 50 pods (their own network namespaces) to 10 peers on 4 ports,
//! TCP and UDP, both directions, ephemeral ports varying: at most 8 000 distinct edges (a busy node's
//! worth; the ephemeral port is not part of an edge). Set `NE_BENCH_PEERS` for more peers (each adds
//! 800 edges): with every event a new edge the recent-records buffer evicts and names constantly.

use network_enforcer_agent::aggregate::Aggregator;
use network_enforcer_agent::debug::socket::{RECENT_EDGES, RecentEdges};
use network_enforcer_agent::identity::attribution::{Attributor, Owner, PodInfo};
use network_enforcer_agent::kernel::events::ConnectionEvent;
use network_enforcer_agent_common::{AF_INET, FlowEvent, IPPROTO_TCP, IPPROTO_UDP};
use std::hint::black_box;
use std::sync::Arc;
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

fn run(bytes: &[u8], at: &Attributor) -> (Duration, usize) {
    let size = std::mem::size_of::<FlowEvent>();
    let mut recent = RecentEdges::new(RECENT_EDGES);
    let mut aggregator = Aggregator::new();
    let mut batch = Vec::with_capacity(1024);
    let mut edges = 0;
    let start = Instant::now();
    for (i, record) in bytes.chunks_exact(size).enumerate() {
        if let Ok(event) = ConnectionEvent::decode(record) {
            batch.push(event);
        }
        if batch.len() == batch.capacity() || i + 1 == EVENTS {
            for e in &batch {
                recent.add(e, || {
                    match at.resolve(e.netns_ino, e.cgroup_id, e.local.ip(), e.monotonic) {
                        Owner::Pod(p) => Some(Arc::from(p.label())),
                        _ => None,
                    }
                });
                aggregator.add(e);
            }
            batch.clear();
        }
        if (i + 1) % FLUSH_EVERY == 0 {
            let drained = aggregator.drain();
            for e in &drained {
                black_box(at.resolve(
                    e.key.netns_ino,
                    e.key.cgroup_id,
                    e.key.local_ip,
                    e.stats.first_seen,
                ));
            }
            edges += drained.len();
        }
    }
    (start.elapsed(), edges)
}

fn main() {
    let bytes = records();
    let at = attributor();
    let mut rates: Vec<f64> = (0..5)
        .map(|_| {
            let (elapsed, edges) = run(&bytes, &at);
            let rate = EVENTS as f64 / elapsed.as_secs_f64();
            eprintln!("{EVENTS} events in {elapsed:?} ({rate:.0}/s), {edges} edges flushed");
            rate
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    println!("pipeline_events_per_sec_per_core={:.0}", rates[2]);
}
