//! The protect gate's edge history at 1M edges: live heap bytes per edge, how fast observations are
//! recorded (new edges, then repeats), and how long one policy's replay takes against the whole
//! history (10k pods, 1,000 workloads with 1,000 peer edges each); and persisting it for the next
//! leader: how many edges the default bound (8 ConfigMaps of 900 KiB) holds, bytes per edge, the time
//! to export the 1M edges (newest first) and to encode what fits, and to decode and restore it.
//!
//! A plain `harness = false` benchmark: it prints its figures and writes them to
//! `target/bench/edge_history.json` (`bytes_per_edge_1m`, `record_new_per_sec`,
//! `record_repeat_per_sec`, `replay_ms_1m`, `edges_in_ms_10k_of_1m` and `judge_ms_10k`: the web
//! view's edges of one namespace listed and judged), or to the file `BENCH_FIGURES` names
//! (`cargo xtask bench edge_history`).

#[path = "support/counting.rs"]
mod counting;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use network_enforcer_api::{Protocol, WorkloadKind, WorkloadNetworkPolicy, WorkloadRef};
use network_enforcer_controller::cluster::workload::Workload;
use network_enforcer_controller::monitor::edge_history::{Bounds, EdgeHistory};
use network_enforcer_controller::monitor::evaluate::attribution::{FlowSide, ObservedFlow};
use network_enforcer_controller::monitor::evaluate::{
    ClusterView, ContainerPort, Endpoint, Labels, PodInfo, PodKey,
};
use network_enforcer_controller::monitor::history_store::{self, Limits};
use serde_json::json;
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

const WORKLOADS: usize = 1_000;
const PODS_PER_WORKLOAD: usize = 10;
/// Edges per workload as the source: 100 peers × 10 ports.
const PEERS: usize = 100;
const PORTS: usize = 10;
const EDGES: usize = WORKLOADS * PEERS * PORTS;

fn namespace(w: usize) -> String {
    format!("ns-{}", w / 10)
}

fn side(w: usize) -> FlowSide {
    let ns = namespace(w);
    FlowSide {
        endpoint: Endpoint::Pod(PodKey::new(ns.clone(), format!("app-{w}-0"))),
        workload: WorkloadRef {
            identity: format!("cluster.local/ns/{ns}/sa/app-{w}"),
            namespace: ns,
            owner_kind: "Deployment".into(),
            owner_name: format!("app-{w}"),
            selector: format!("app=app-{w}"),
            ..WorkloadRef::default()
        }
        .into(),
    }
}

fn flow(source: usize, peer: usize, port: usize, at: i64) -> ObservedFlow {
    ObservedFlow {
        source: side(source),
        destination: side((source + 1 + peer) % WORKLOADS),
        protocol: Protocol::TCP,
        port: 8000 + port as u16,
        seen_at: Time(Timestamp::from_second(1_800_000_000 + at).unwrap()),
        peer_name: None,
    }
}

fn view() -> ClusterView {
    let mut view = ClusterView::new();
    for w in 0..WORKLOADS {
        for p in 0..PODS_PER_WORKLOAD {
            view.insert_pod(PodInfo {
                namespace: namespace(w),
                name: format!("app-{w}-{p}"),
                labels: Labels::from([("app".to_string(), format!("app-{w}"))]),
                ips: vec![format!("10.{}.{}.{p}", w / 250, w % 250).parse().unwrap()],
                ports: vec![ContainerPort {
                    name: Some("http".into()),
                    port: 8000,
                    protocol: Protocol::TCP,
                }],
                workload: Some(Workload {
                    kind: WorkloadKind::Deployment,
                    name: format!("app-{w}"),
                }),
            });
        }
    }
    view
}

/// Workload 0's egress: its first peer on its first port, as a learned proposal has it.
fn policy() -> WorkloadNetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "deployment-app-0-egress", "namespace": namespace(0), "uid": "u"},
        "spec": {"backend": "kubernetes", "direction": "Egress", "mode": "protect",
                 "targetRef": {"kind": "Deployment", "name": "app-0"},
                 "kubernetes": {"podSelector": {"matchLabels": {"app": "app-0"}},
                                "policyTypes": ["Egress"],
                                "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "app-1"}}}],
                                            "ports": [{"protocol": "TCP", "port": 8000}]}]}}
    }))
    .expect("a valid policy")
}

fn main() {
    let view = view();
    let policy = policy();
    let before = counting::live();
    let mut history = EdgeHistory::new(Bounds {
        max_edges: EDGES,
        retention: Duration::from_secs(7 * 86_400),
    });
    let started = Instant::now();
    for w in 0..WORKLOADS {
        for peer in 0..PEERS {
            for port in 0..PORTS {
                // Seen over a day, as a real history is (its persisted form compresses less).
                let at = ((w * PEERS + peer) * PORTS + port) as i64 % 86_400;
                history.record(&flow(w, peer, port, at), false);
            }
        }
    }
    let new_per_sec = EDGES as f64 / started.elapsed().as_secs_f64();
    assert_eq!(history.len(), EDGES);
    assert_eq!(history.evicted(), 0);
    let bytes_per_edge = (counting::live() - before) as f64 / EDGES as f64;
    let repeats = 200_000;
    let started = Instant::now();
    for i in 0..repeats {
        history.record(&flow(i % WORKLOADS, i % PEERS, i % PORTS, 86_400), false);
    }
    let repeat_per_sec = repeats as f64 / started.elapsed().as_secs_f64();
    assert_eq!(history.len(), EDGES);

    let mut times = Vec::new();
    let mut report = None;
    for _ in 0..5 {
        let started = Instant::now();
        report = Some(std::hint::black_box(history.replay(&view, &policy)));
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    let replay_ms = times[times.len() / 2];
    let report = report.expect("a replay");
    // Workload 0's 1,000 edges, all but the one its policy allows.
    assert_eq!(
        (report.considered, report.would_block),
        (PEERS * PORTS, PEERS * PORTS - 1),
        "{report:?}"
    );

    // The web view's answer for one namespace (about 20,000 of the edges have an end in it): the
    // 10,000 newest listed, then each judged (which tier decides it) against the 10k pods.
    let (mut list_times, mut judge_times) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let started = Instant::now();
        let (listed, truncated) = history.edges_in(&namespace(0), 10_000);
        list_times.push(started.elapsed().as_secs_f64() * 1000.0);
        assert!(truncated && listed.len() == 10_000);
        let started = Instant::now();
        let judged: Vec<_> = listed.into_iter().map(|e| e.judged(&view)).collect();
        judge_times.push(started.elapsed().as_secs_f64() * 1000.0);
        assert!(
            judged
                .iter()
                .all(|e| e.egress.is_some() && e.ingress.is_some())
        );
    }
    list_times.sort_by(f64::total_cmp);
    judge_times.sort_by(f64::total_cmp);
    let (list_ms, judge_ms) = (list_times[2], judge_times[2]);

    // Persisting it for the next leader (docs/behaviour.md §3.11), within the default bound.
    let started = Instant::now();
    let exported = history.export();
    let persist_export_ms = started.elapsed().as_secs_f64() * 1000.0;
    let started = Instant::now();
    let encoded = history_store::encode(&exported, Limits::default());
    let persist_encode_ms = started.elapsed().as_secs_f64() * 1000.0;
    let persisted_bytes: usize = encoded.shards.iter().map(Vec::len).sum();
    let started = Instant::now();
    let mut restored = EdgeHistory::new(Bounds {
        max_edges: EDGES,
        retention: Duration::from_secs(7 * 86_400),
    });
    for (i, shard) in encoded.shards.iter().enumerate() {
        restored.restore(history_store::decode(i, shard).expect("a shard just encoded"));
    }
    let restore_ms = started.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(restored.len(), encoded.edges);

    let figures = json!({
        "persist_edges_default_bound": encoded.edges,
        "persist_bytes_per_edge": (persisted_bytes as f64 / encoded.edges.max(1) as f64 * 10.0).round() / 10.0,
        "persist_export_ms_1m": (persist_export_ms * 10.0).round() / 10.0,
        "persist_encode_ms": (persist_encode_ms * 10.0).round() / 10.0,
        "persist_restore_ms": (restore_ms * 10.0).round() / 10.0,
        "bytes_per_edge_1m": bytes_per_edge.round(),
        "record_new_per_sec": new_per_sec.round(),
        "record_repeat_per_sec": repeat_per_sec.round(),
        "replay_ms_1m": (replay_ms * 10.0).round() / 10.0,
        "edges_in_ms_10k_of_1m": (list_ms * 10.0).round() / 10.0,
        "judge_ms_10k": (judge_ms * 10.0).round() / 10.0,
    });
    println!("{}", serde_json::to_string_pretty(&figures).expect("JSON"));
    let path = std::env::var_os("BENCH_FIGURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/bench/edge_history.json")
        });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create the figures' directory");
    }
    std::fs::write(&path, figures.to_string()).expect("writing the figures");
}
