//! The web view at 1,000 workloads / 10,000 edges: how long the graph answer takes to build and encode,
//! and, in Debian's headless Chromium through chromedriver, how long the graph page takes to its first
//! render and to show a new violation (its 2 s poll included).
//!
//! A plain `harness = false` benchmark: it prints its figures and writes them to
//! `target/bench/ui.json` (`graph_build_ms_10k_edges`, `graph_json_kb_10k_edges`,
//! `graph_encode_ms_10k_edges`, `graph_build_ms_10k_edges_10k_observed` (every edge's flow observed,
//! with the tiers that decide it, as the leader answers), `first_render_ms_10k_edges`, `update_render_ms_10k_edges`), or to the
//! file `BENCH_FIGURES` names (`cargo xtask bench ui`). Without chromedriver the browser figures are
//! left out (`cargo xtask setup` installs it).

#[path = "../tests/support/webdriver.rs"]
mod webdriver;

use network_enforcer_api::{WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal, WorkloadRef};
use network_enforcer_controller::monitor::edge_history::HistoryEdge;
use network_enforcer_controller::monitor::evaluate::verdict::SideDecision;
use network_enforcer_controller::ui::graph_view::{self, GraphQuery};
use network_enforcer_controller::ui::{ObjectSource, PolicyObject, Snapshot, UiMetrics, UiState};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const WORKLOADS: usize = 1_000;
/// Peers per workload: 1,000 × 10 = 10,000 edges.
const PEERS: usize = 10;
/// Workloads whose egress is a monitor policy (the rest are proposals).
const GOVERNED: usize = 200;
const NAMESPACE: &str = "bench";

fn egress(i: usize) -> serde_json::Value {
    json!({
        "podSelector": {"matchLabels": {"app": format!("w{i}")}},
        "policyTypes": ["Egress"],
        "egress": (1..=PEERS).map(|k| json!({
            "to": [{"podSelector": {"matchLabels": {"app": format!("w{}", (i + k) % WORKLOADS)}}}],
            "ports": [{"protocol": "TCP", "port": 8000 + k}]
        })).collect::<Vec<_>>()
    })
}

fn snapshot(now_ms: i64) -> Snapshot {
    let mut snapshot = Snapshot {
        now_ms,
        ..Snapshot::default()
    };
    for i in 0..WORKLOADS {
        let name = format!("deployment-w{i}-egress");
        let spec = json!({
            "backend": "kubernetes",
            "direction": "Egress",
            "targetRef": {"kind": "Deployment", "name": format!("w{i}")},
            "kubernetes": egress(i),
        });
        if i < GOVERNED {
            let mut spec = spec;
            spec["mode"] = json!("monitor");
            let policy: WorkloadNetworkPolicy = serde_json::from_value(json!({
                "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
                "kind": "WorkloadNetworkPolicy",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": spec,
            }))
            .expect("policy");
            snapshot.policies.push(PolicyObject::new(policy));
        } else {
            let proposal: WorkloadNetworkPolicyProposal = serde_json::from_value(json!({
                "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
                "kind": "WorkloadNetworkPolicyProposal",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": spec,
            }))
            .expect("proposal");
            snapshot.proposals.push(proposal);
        }
    }
    snapshot
}

/// The snapshot, with one violation added once `violated` is set.
struct Source {
    snapshot: Snapshot,
    violated: AtomicBool,
}

impl ObjectSource for Source {
    fn snapshot(&self, _namespace: Option<&str>) -> Snapshot {
        let mut snapshot = self.snapshot.clone();
        if self.violated.load(Ordering::Relaxed) {
            let status = json!({
                "violationCount": 1, "activeViolationCount": 1,
                "violations": [{
                    "id": 1, "timestamp": k8s_openapi::jiff::Timestamp::now().to_string(),
                    "source": {"namespace": NAMESPACE, "ownerKind": "Deployment", "ownerName": "w0"},
                    "dest": {"namespace": NAMESPACE, "ownerKind": "Deployment", "ownerName": "w500"},
                    "protocol": "TCP", "dstPort": 5432, "action": "monitor"
                }]
            });
            snapshot.policies[0].policy.status =
                Some(serde_json::from_value(status).expect("status"));
        }
        snapshot
    }

    fn ready(&self) -> bool {
        true
    }
}

fn median_ms(mut f: impl FnMut(), runs: usize) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let now_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    let snapshot = snapshot(now_ms);
    let query = GraphQuery {
        namespace: NAMESPACE.into(),
        ..GraphQuery::default()
    };
    let view = graph_view::build(&snapshot, &query, &[]);
    assert_eq!(view.nodes.len(), WORKLOADS, "one node per workload");
    assert_eq!(view.edges.len(), WORKLOADS * PEERS, "every edge");
    assert!(!view.truncated);
    let build_ms = median_ms(
        || {
            std::hint::black_box(graph_view::build(&snapshot, &query, &[]));
        },
        5,
    );
    // Every rule's flow observed once, judged: what the leader's graph places on the edges.
    let observed: Vec<HistoryEdge> = (0..WORKLOADS)
        .flat_map(|i| (1..=PEERS).map(move |k| (i, k)))
        .map(|(i, k)| {
            let workload = |n: usize| WorkloadRef {
                namespace: NAMESPACE.into(),
                owner_kind: "Deployment".into(),
                owner_name: format!("w{n}"),
                ..WorkloadRef::default()
            };
            let side = SideDecision {
                tier: netpol::cluster::Decider::NetworkPolicy,
                allowed: true,
                by: vec![format!("{NAMESPACE}/deployment-w{i}-egress")],
            };
            HistoryEdge {
                last_seen_ms: now_ms,
                count: 1,
                egress: Some(side.clone()),
                ingress: Some(side),
                ..HistoryEdge::flow(
                    workload(i),
                    workload((i + k) % WORKLOADS),
                    network_enforcer_api::Protocol::TCP,
                    8000 + k as u16,
                )
            }
        })
        .collect();
    let with_observed = graph_view::build(&snapshot, &query, &observed);
    assert_eq!(
        with_observed.edges.len(),
        WORKLOADS * PEERS,
        "every flow on its rule's edge"
    );
    assert!(with_observed.edges.iter().all(|e| e.decisions.len() == 1));
    let observed_ms = median_ms(
        || {
            std::hint::black_box(graph_view::build(&snapshot, &query, &observed));
        },
        5,
    );
    let mut encoded = String::new();
    let encode_ms = median_ms(|| encoded = serde_json::to_string(&view).expect("JSON"), 5);
    let mut figures = vec![
        ("graph_build_ms_10k_edges", build_ms),
        ("graph_json_kb_10k_edges", encoded.len() as f64 / 1024.0),
        ("graph_encode_ms_10k_edges", encode_ms),
        ("graph_build_ms_10k_edges_10k_observed", observed_ms),
    ];
    match browser_figures(snapshot) {
        Ok(more) => figures.extend(more),
        Err(e) => eprintln!("browser figures left out: {e:#}"),
    }
    for (key, value) in &figures {
        println!("{key:<32} {value:>10.1}");
    }
    let report: serde_json::Map<String, serde_json::Value> = figures
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let path = std::env::var_os("BENCH_FIGURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench/ui.json")
        });
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("JSON"))
        .expect("writing the figures");
}

/// Serves the snapshot and measures the page in headless Chromium.
fn browser_figures(snapshot: Snapshot) -> anyhow::Result<Vec<(&'static str, f64)>> {
    let runtime = tokio::runtime::Runtime::new()?;
    let source = Arc::new(Source {
        snapshot,
        violated: AtomicBool::new(false),
    });
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let port = listener.local_addr()?.port();
    runtime.spawn(network_enforcer_controller::ui::serve(
        listener,
        UiState::new(source.clone(), UiMetrics::default()),
    ));
    let profile = std::env::temp_dir().join(format!("ne-ui-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let browser = webdriver::Browser::start(&profile)?;
    let edges = WORKLOADS * PEERS;
    let started = Instant::now();
    browser.open(&format!("http://127.0.0.1:{port}/#/graph/{NAMESPACE}"))?;
    browser.wait_for(
        "the first render",
        Duration::from_secs(120),
        &format!("return document.querySelectorAll('#graph g.edge').length === {edges}"),
    )?;
    let first_ms = started.elapsed().as_secs_f64() * 1000.0;
    source.violated.store(true, Ordering::Relaxed);
    let updated = Instant::now();
    browser.wait_for(
        "the violation",
        Duration::from_secs(60),
        "return document.querySelector('#graph g.edge.violation') !== null",
    )?;
    let update_ms = updated.elapsed().as_secs_f64() * 1000.0;
    drop(browser);
    let _ = std::fs::remove_dir_all(&profile);
    Ok(vec![
        ("first_render_ms_10k_edges", first_ms),
        ("update_render_ms_10k_edges", update_ms),
    ])
}
