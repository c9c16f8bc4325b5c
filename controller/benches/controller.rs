//! Controller ingest and learning figures:
//!
//! - `records_merged_per_sec_per_core`: agent records taken in by `Learning::take_in`, as a stream
//!   hands them over (decoding each record, validation, node check, resolution through the index,
//!   merge into pending proposal edges) on one thread, with the
//!   end-to-end scenario's mix (client → Service ClusterIP, client → pod IP, inbound from a pod,
//!   external peers), per second of that thread's CPU time (`/proc/thread-self/schedstat`): the machine
//!   is shared, and wall-clock time there measures the other tenants too. `records_merged_per_sec_wall`
//!   is the same count per wall-clock second.
//! - `bytes_per_pod`: heap held by the index per pod (10k pods, 1k Deployments, 100 Services), measured
//!   with a counting global allocator.
//! - `bytes_per_edge` / `bytes_per_100k_edges`: heap held by pending edges per distinct edge (100k
//!   external /32 edges of one workload, the fan-out cap lifted for the measurement; pending edges are a
//!   hash set per proposal).
//! - `bytes_per_10k_pods`: `bytes_per_pod` for 10k pods.
//! - `writes_per_proposal_per_flush` and `api_writes_per_sec`: a steady load against the real API server
//!   (the local cluster, CRDs installed by the test fixture): every flush interval, new edges for 20
//!   proposals arrive from many repeated records; writes are counted from the writer's metrics.
//!
//! - `load_average_1m`: the machine's 1-minute load average when the bench started (the machine is
//!   shared: figures taken under load are lower).
//! - `stage_ns_per_record`: CPU nanoseconds per record of each stage a record goes through, each
//!   measured alone on the merge's records (see `stages`; table in docs/operations.md), and
//!   `transport`: TLS, HTTP/2, gRPC framing and the acknowledgement of the same batches, served alone
//!   (`controller/transport.rs`).
//!
//! A plain `harness = false` bench: it prints its figures and writes them to the file `BENCH_FIGURES`
//! names (`cargo xtask bench controller`), or to `target/bench/controller.json`.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use network_enforcer_api::uplink::{self, FlowRecord, LocalPod, encoded};
use network_enforcer_api::{Backend, WorkloadNetworkPolicy};
use network_enforcer_controller::app::App;
use network_enforcer_controller::cluster::index::Index;
use network_enforcer_controller::cluster::watches::SharedIndex;
use network_enforcer_controller::learn::learner::Learner;
use network_enforcer_controller::runtime::metrics::ControllerMetrics;
use serde_json::json;
use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "support/counting.rs"]
mod counting;
use counting::live;

#[path = "controller/transport.rs"]
mod transport;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

const NAMESPACES: usize = 100;
const DEPLOYMENTS_PER_NAMESPACE: usize = 10;
const PODS_PER_DEPLOYMENT: usize = 10;
const NODE: &str = "node-1";

fn pod_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 1, (i / 250) as u8, (i % 250 + 1) as u8)
}

fn service_ip(ns: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 96, 0, (ns + 1) as u8)
}

/// 10k pods in 1k Deployments across 100 namespaces, one Service per namespace selecting workload 0.
fn objects() -> (Vec<Deployment>, Vec<Pod>, Vec<Service>) {
    let (mut deployments, mut pods, mut services) = (vec![], vec![], vec![]);
    let mut i = 0;
    for n in 0..NAMESPACES {
        let ns = format!("ns-{n}");
        for d in 0..DEPLOYMENTS_PER_NAMESPACE {
            let app = format!("app-{d}");
            deployments.push(
                serde_json::from_value(json!({
                    "metadata": {"name": app, "namespace": ns, "uid": format!("uid-{n}-{d}")},
                    "spec": {"selector": {"matchLabels": {"app": app}},
                             "template": {"metadata": {"labels": {"app": app}}, "spec": {"containers": []}}}
                }))
                .unwrap(),
            );
            for p in 0..PODS_PER_DEPLOYMENT {
                pods.push(serde_json::from_value(json!({
                    "metadata": {"name": format!("{app}-5d8f7c9b4-{p:05}"), "namespace": ns,
                                 "uid": format!("pod-uid-{i}"),
                                 "labels": {"app": app, "pod-template-hash": "5d8f7c9b4"},
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                     "name": format!("{app}-5d8f7c9b4"), "uid": "rs", "controller": true}]},
                    "spec": {"nodeName": NODE, "serviceAccountName": format!("{app}-sa"),
                             "containers": [{"name": "main", "ports": [{"name": "http", "containerPort": 8080}]}]},
                    "status": {"phase": "Running", "podIP": pod_ip(i).to_string(),
                               "podIPs": [{"ip": pod_ip(i).to_string()}]}
                }))
                .unwrap());
                i += 1;
            }
        }
        services.push(
            serde_json::from_value(json!({
                "metadata": {"name": "web", "namespace": ns},
                "spec": {"clusterIP": service_ip(n).to_string(), "selector": {"app": "app-0"},
                         "ports": [{"port": 80, "targetPort": "http"}]}
            }))
            .unwrap(),
        );
    }
    (deployments, pods, services)
}

fn record(ns: usize, d: usize, p: usize, peer: Ipv4Addr, port: u32, inbound: bool) -> FlowRecord {
    FlowRecord {
        local: Some(LocalPod {
            namespace: format!("ns-{ns}"),
            name: format!("app-{d}-5d8f7c9b4-{p:05}"),
            uid: String::new(),
        }),
        peer_ip: peer.octets().to_vec(),
        port,
        protocol: uplink::Protocol::Tcp as i32,
        direction: if inbound {
            uplink::Direction::Inbound
        } else {
            uplink::Direction::Outbound
        } as i32,
        outcome: uplink::Outcome::Established as i32,
        last_seen_ms: 2_000,
        count: 1,
        ..FlowRecord::default()
    }
}

/// The end-to-end scenario's mix (docs/development.md): clients of every workload call their
/// namespace's Service and a pod of workload 1, workload 0's pods see them inbound, and a few external
/// peers.
/// Batches as they arrive on an agent's stream: records still encoded.
fn batches(count: usize, size: usize) -> Vec<encoded::FlowBatch> {
    let mut out = Vec::with_capacity(count);
    let mut k = 0usize;
    for b in 0..count {
        let mut records = Vec::with_capacity(size);
        for _ in 0..size {
            let ns = k % NAMESPACES;
            let d = 1 + (k / NAMESPACES) % (DEPLOYMENTS_PER_NAMESPACE - 1);
            let p = (k / 7) % PODS_PER_DEPLOYMENT;
            let r = match k % 4 {
                0 => record(ns, d, p, service_ip(ns), 80, false),
                1 => {
                    let target = ns * 100 + 10 + p; // a pod of workload 1 in the same namespace
                    record(ns, d, p, pod_ip(target), 8080, false)
                }
                2 => {
                    let client = ns * 100 + d * 10 + p;
                    record(ns, 0, p, pod_ip(client), 8080, true)
                }
                _ => record(
                    ns,
                    d,
                    p,
                    Ipv4Addr::new(203, 0, 113, (k % 16) as u8),
                    443,
                    false,
                ),
            };
            records.push(prost::Message::encode_to_vec(&r).into());
            k += 1;
        }
        out.push(encoded::FlowBatch {
            sequence: b as u64 + 1,
            node: NODE.into(),
            records,
            instance: 1,
            health: None,
        });
    }
    out
}

/// CPU time of the calling thread in seconds (Linux schedstat, nanoseconds), or 0 when unknown.
fn thread_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

/// The 1-minute load average (Linux), or -1 when unknown.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(-1.0)
}

fn main() {
    let load_average_1m = load_average();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let _guard = runtime.enter();

    // Memory per pod: the index's heap for 10k pods (objects built outside the measurement).
    let (deployments, pods, services) = objects();
    let before = live();
    let mut ix = Index::default();
    for d in &deployments {
        ix.apply_deployment(d);
    }
    for p in &pods {
        ix.apply_pod(p, 1_000);
    }
    for s in &services {
        ix.apply_service(s);
    }
    let bytes_per_pod = (live() - before) as f64 / pods.len() as f64;
    drop((deployments, pods, services));

    // Merge throughput on one thread.
    let app = App::builder(
        network_enforcer_tests::fixture::offline_client(),
        Backend::Kubernetes,
    )
    .index(Arc::new(SharedIndex::listed(ix)))
    .build();
    let (learner, learning) = (&app.learner, &app.learning);
    let input = batches(40, 5_000);
    let per_pass: usize = input.iter().map(|b| b.records.len()).sum();
    // Warm up (the first pass creates the pending entries; steady state repeats known edges).
    for b in input.iter().take(4) {
        learning.take_in(NODE, b);
    }
    let passes = 5;
    let cpu_started = thread_cpu_seconds();
    let started = Instant::now();
    let mut accepted = 0u64;
    for _ in 0..passes {
        for b in &input {
            accepted += u64::from(learning.take_in(NODE, b).0.accepted);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = thread_cpu_seconds() - cpu_started;
    let total = per_pass * passes;
    assert_eq!(accepted as usize, total, "every record is accepted");
    let records_per_sec_wall = total as f64 / elapsed;
    // Without schedstat, fall back to wall-clock time.
    let records_per_sec = if cpu > 0.0 {
        total as f64 / cpu
    } else {
        records_per_sec_wall
    };
    eprintln!(
        "merged {total} records in {elapsed:.3}s ({cpu:.3}s on the CPU) into {} proposals",
        learner.pending_proposals()
    );

    // Where a record's CPU goes, stage by stage, on the same records (docs/operations.md).
    let mut stage_ns = stages(learning, &input);
    // The transport, with the merge's batches (5,000 records) and with an agent's small ones.
    stage_ns["transport"] = json!(transport::ns_per_record(&runtime, &input, 5_000, 5));
    stage_ns["transport_batches_of_100"] =
        json!(transport::ns_per_record(&runtime, &input, 100, 2));
    eprintln!(
        "transport: {} / {} CPU ns per record (batches of 5,000 / 100)",
        stage_ns["transport"], stage_ns["transport_batches_of_100"]
    );

    // Memory per edge: 100k distinct external /32 peers of one workload (no fan-out cap here: this
    // measures what an edge costs, not the cap).
    let edges_learner =
        Learner::new(Backend::Kubernetes, BTreeSet::new()).with_max_external_peers(usize::MAX);
    let ix = learning.index.index.read().unwrap();
    let before = live();
    let n_edges = 100_000usize;
    let local = ix
        .pod("ns-0", "app-1-5d8f7c9b4-00000")
        .expect("the bench's pod is indexed")
        .clone();
    for e in 0..n_edges {
        let obs = network_enforcer_controller::learn::ReportedConnection {
            local: local.clone(),
            peer: Ipv4Addr::new(100, 64 + (e >> 16) as u8, (e >> 8) as u8, e as u8).into(),
            port: 443,
            protocol: network_enforcer_api::Protocol::TCP,
            opened: network_enforcer_controller::cluster::index::Opened::Outbound,
            at_ms: 2_000,
            reporter: network_enforcer_controller::learn::Reporter::Node,
            peer_name: Default::default(),
        };
        edges_learner.observe(&ix, &obs).unwrap();
    }
    let bytes_per_edge = (live() - before) as f64 / n_edges as f64;
    drop(ix);

    // Steady load against the API server.
    let (writes_per_proposal_per_flush, api_writes_per_sec) = runtime.block_on(steady_load());

    let figures = json!({
        "records_merged_per_sec_per_core": records_per_sec,
        "records_merged_per_sec_wall": records_per_sec_wall,
        "writes_per_proposal_per_flush": writes_per_proposal_per_flush,
        "bytes_per_pod": bytes_per_pod,
        "bytes_per_edge": bytes_per_edge,
        "bytes_per_10k_pods": bytes_per_pod * 10_000.0,
        "bytes_per_100k_edges": bytes_per_edge * 100_000.0,
        "api_writes_per_sec": api_writes_per_sec,
        "load_average_1m": load_average_1m,
        "stage_ns_per_record": stage_ns,
    });
    println!("{}", serde_json::to_string_pretty(&figures).unwrap());
    let path = std::env::var("BENCH_FIGURES").unwrap_or_else(|_| {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/bench");
        std::fs::create_dir_all(dir).unwrap();
        format!("{dir}/controller.json")
    });
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&figures).unwrap() + "\n",
    )
    .unwrap();
}

/// Runs `stage` over `items` again and again for at least 0.3 s of the calling thread's CPU time (the
/// kernel updates it per scheduler tick, so shorter runs would carry ~10% of error), three times, and
/// returns the CPU nanoseconds per item of the fastest (the machine is shared). Without schedstat,
/// wall-clock time.
fn ns_per_item<T>(items: &[T], mut stage: impl FnMut(&T)) -> f64 {
    let wall = Instant::now();
    let clock = || {
        let cpu = thread_cpu_seconds();
        if cpu > 0.0 {
            cpu
        } else {
            wall.elapsed().as_secs_f64()
        }
    };
    (0..3)
        .map(|_| {
            let started = clock();
            let mut runs = 0usize;
            while runs == 0 || clock() - started < 0.3 {
                for item in items {
                    stage(item);
                }
                runs += 1;
            }
            (clock() - started) * 1e9 / (items.len() * runs) as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// One egress policy in monitor per namespace and client workload (1..9): TCP 8080 to workload 1
/// of its namespace. The bench's Service calls (workload 0) and outside peers are violations.
fn monitor_policies() -> Vec<WorkloadNetworkPolicy> {
    let mut out = Vec::new();
    for n in 0..NAMESPACES {
        for d in 1..DEPLOYMENTS_PER_NAMESPACE {
            out.push(
                serde_json::from_value(json!({
                    "metadata": {"name": format!("deployment-app-{d}-egress"), "namespace": format!("ns-{n}"),
                                 "uid": format!("wnp-{n}-{d}"), "generation": 1},
                    "spec": {"backend": "kubernetes", "direction": "Egress", "mode": "monitor",
                             "targetRef": {"kind": "Deployment", "name": format!("app-{d}")},
                             "kubernetes": {"podSelector": {"matchLabels": {"app": format!("app-{d}")}},
                                            "policyTypes": ["Egress"],
                                            "egress": [{"to": [{"podSelector": {"matchLabels": {"app": "app-1"}}}],
                                                        "ports": [{"protocol": "TCP", "port": 8080}]}]}}
                }))
                .expect("a valid policy"),
            );
        }
    }
    out
}

/// CPU nanoseconds per record of each stage a record goes through in the controller, each measured
/// alone on the same records: `protobuf` (the record's bytes to a `FlowRecord`), `decode` (checks,
/// the local pod on the agent's node, the peer address), `resolve_learning` (the peer through the
/// index into workload flows), `learn` (resolution and the merge into pending edges: `observe`),
/// `resolve_evidence` (the same record into evaluable flows), `evaluate` (each flow against 900
/// monitor policies, with rule usage), `edge_history` (each flow into the gate's history), and
/// `take_in` (what a stream's batch costs per record: protobuf, decode, learn, bookkeeping). The
/// transport (TLS, HTTP/2, gRPC framing) is not here: `cargo xtask bench fleet` measures the whole
/// process.
fn stages(
    learning: &network_enforcer_controller::ingest::Learning,
    input: &[encoded::FlowBatch],
) -> serde_json::Value {
    use network_enforcer_controller::ingest::flow_record;
    use network_enforcer_controller::learn::{self, ReportedConnection, Reporter};
    use network_enforcer_controller::monitor::edge_history::EdgeHistory;
    use network_enforcer_controller::monitor::evaluate::ClusterView;
    use network_enforcer_controller::monitor::evaluate::attribution::{
        PolicySet, attribute_with_usage,
    };
    use network_enforcer_controller::monitor::violations::evidence::{
        WorkloadNames, observed_flows,
    };
    use std::hint::black_box;

    let bytes: Vec<_> = input
        .iter()
        .take(40)
        .flat_map(|b| b.records.iter().cloned())
        .collect();
    let protobuf = ns_per_item(&bytes, |b| {
        black_box(<FlowRecord as prost::Message>::decode(b.clone()).unwrap());
    });
    let records: Vec<FlowRecord> = bytes
        .iter()
        .map(|b| prost::Message::decode(b.clone()).unwrap())
        .collect();
    let ix = learning.index.index.read().unwrap();
    let decode = ns_per_item(&records, |r| {
        black_box(flow_record::decode(r, &ix, Some(NODE)).unwrap());
    });
    let decoded: Vec<_> = records
        .iter()
        .map(|r| flow_record::decode(r, &ix, Some(NODE)).unwrap())
        .collect();
    let observations: Vec<ReportedConnection> = decoded
        .iter()
        .map(|d| ReportedConnection::of(d, Reporter::Node))
        .collect();
    // The part of a resolution that reads the address history (once per record).
    let place = ns_per_item(&decoded, |d| {
        black_box(ix.place(&d.connection()));
    });
    let resolve_learning = ns_per_item(&observations, |o| {
        black_box(learn::flows(&ix, o).unwrap());
    });
    let learner = Learner::new(Backend::Kubernetes, BTreeSet::new());
    let learn = ns_per_item(&observations, |o| {
        black_box(learner.observe(&ix, o).unwrap());
    });
    let view = ClusterView::from_index(
        &ix,
        (0..NAMESPACES).map(|n| (format!("ns-{n}"), Default::default())),
        [],
    );
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let mut names = WorkloadNames::default();
    let resolve_evidence = ns_per_item(&decoded, |d| {
        black_box(observed_flows(&ix, &view, &mut names, d, &now).unwrap());
    });
    let flows: Vec<_> = decoded
        .iter()
        .flat_map(|d| observed_flows(&ix, &view, &mut names, d, &now).unwrap())
        .collect();
    let per_record = |ns_per_flow: f64| ns_per_flow * flows.len() as f64 / decoded.len() as f64;
    let policies = monitor_policies();
    let set = PolicySet::judged(&policies, |_| true);
    let mut matches = Vec::new();
    let mut violations = 0usize;
    let evaluate = per_record(ns_per_item(&flows, |f| {
        matches.clear();
        violations += attribute_with_usage(&view, &set, f, Some(&mut matches))
            .unwrap()
            .len();
    }));
    assert!(violations > 0, "the bench's mix has violations to record");
    let mut history = EdgeHistory::default();
    let edge_history = per_record(ns_per_item(&flows, |f| history.record(f, false)));
    drop(ix);
    let take_in = ns_per_item(input, |b| {
        black_box(learning.take_in(NODE, b));
    }) / (input.iter().map(|b| b.records.len()).sum::<usize>() / input.len()) as f64;
    let figures = json!({
        "protobuf": protobuf,
        "decode": decode,
        "place": place,
        "resolve_learning": resolve_learning,
        "learn": learn,
        "resolve_evidence": resolve_evidence,
        "evaluate": evaluate,
        "edge_history": edge_history,
        "take_in": take_in,
        "flows_per_record": flows.len() as f64 / decoded.len() as f64,
    });
    eprintln!("CPU ns per record by stage: {figures}");
    figures
}

/// 20 workloads in a real namespace; every flush interval each gets a new external peer, reported by
/// 1,000 records (repeats, as many agents and windows send them). Returns (writes per proposal per
/// flush, API writes per second).
async fn steady_load() -> (f64, f64) {
    use network_enforcer_tests::fixture::TestNamespace;
    let ns = TestNamespace::create_with_crds("bench-ctl")
        .await
        .expect("the local cluster (cargo xtask cluster up)");
    let workloads = 20usize;
    let mut ix = Index::default();
    for w in 0..workloads {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("w{w}-5d8f7c9b4-00000"), "namespace": ns.name, "uid": format!("u{w}"),
                         "labels": {"app": format!("w{w}"), "pod-template-hash": "5d8f7c9b4"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                             "name": format!("w{w}-5d8f7c9b4"), "uid": "rs", "controller": true}]},
            "spec": {"nodeName": NODE, "containers": []},
            "status": {"phase": "Running", "podIP": format!("10.2.0.{}", w + 1)}
        }))
        .unwrap();
        ix.apply_pod(&pod, 1_000);
    }
    let metrics = ControllerMetrics::new();
    let app = App::builder(ns.client.clone(), Backend::Kubernetes)
        .metrics(metrics.clone())
        .build();
    let flushes = 10usize;
    let interval = Duration::from_secs(1);
    let started = Instant::now();
    for f in 0..flushes {
        let tick = Instant::now();
        for w in 0..workloads {
            let local = ix
                .pod(&ns.name, &format!("w{w}-5d8f7c9b4-00000"))
                .expect("the bench's pod is indexed")
                .clone();
            for _ in 0..1_000 {
                let obs = network_enforcer_controller::learn::ReportedConnection {
                    local: local.clone(),
                    peer: Ipv4Addr::new(198, 51, 100, f as u8 + 1).into(),
                    port: 443,
                    protocol: network_enforcer_api::Protocol::TCP,
                    opened: network_enforcer_controller::cluster::index::Opened::Outbound,
                    at_ms: 2_000,
                    reporter: network_enforcer_controller::learn::Reporter::Node,
                    peer_name: Default::default(),
                };
                app.learner.observe(&ix, &obs).unwrap();
            }
        }
        let report = app.flush().await;
        assert_eq!(report.failed, 0, "{report:?}");
        if let Some(rest) = interval.checked_sub(tick.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let writes =
        metrics.count("proposal_writes", "created") + metrics.count("proposal_writes", "updated");
    let per_proposal_per_flush = writes as f64 / (workloads * flushes) as f64;
    eprintln!("{writes} writes for {workloads} proposals x {flushes} flushes in {elapsed:.1}s");
    (per_proposal_per_flush, writes as f64 / elapsed)
}
