//! `cargo xtask bench enforce`: the agent's NetworkPolicy enforcement at 10,000 pods and 1,000
//! NetworkPolicies (root: network namespaces and nftables), measured by the agent's `enforce` bench
//! (`agent/benches/enforce.rs`, release profile), which says how each figure is taken:
//!
//! - `conn_rate_ratio_enforced`: TCP connections/s from a client pod to a server pod through a node
//!   network namespace holding the rendered table, over the same without it (interleaved rounds;
//!   refused when the baseline rounds disagree by more than 10%);
//! - `policy_change_to_enforced_p99_ms`: one policy added or modified → compile + render + `nft -f`
//!   returned;
//! - `agent_rss_mib_enforcing`: resident memory of a child process holding the cluster, the ruleset and
//!   the script;
//! - `deny_decision_ns_p50`: kernel CPU time a denied first packet costs.
//!
//! The bench writes its figures and notes as JSON to the file named by `BENCH_FIGURES`; this reads them
//! back, [`super::report`]s them, and adds the goals, the notes and the per-round rates to
//! `target/bench/enforce.json`.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::{Figure, report};
use crate::run;

/// The figures reported, in order, with their units.
const KEYS: &[(&str, &str)] = &[
    ("conn_rate_ratio_enforced", "of the rate without a table"),
    ("conn_rate_ratio_enforced_spread", "max - min of the ratios"),
    ("conn_rate_ratio_conntrack_only", "ct-only table vs none"),
    (
        "conn_rate_ratio_enforced_vs_conntrack",
        "enforced vs ct-only",
    ),
    (
        "conn_rate_ratio_ebpf_first_packet",
        "eBPF SYN verdict, no table, vs none",
    ),
    (
        "conn_rate_ratio_ebpf_flows",
        "eBPF verdict + own flow table vs none",
    ),
    (
        "ebpf_first_packet_ns_per_conn",
        "ns in the eBPF SYN verdict",
    ),
    (
        "ebpf_flows_ns_per_conn",
        "ns in the eBPF verdict + flow table",
    ),
    ("conn_rate_baseline", "conn/s without a table"),
    ("conn_rate_enforced", "conn/s with the table"),
    ("conn_rate_baseline_spread", "(max - min) / median"),
    ("conn_failures", "failed connections"),
    (
        "conn_per_cpu_s_ratio_enforced",
        "conn per CPU-second, enforced vs none",
    ),
    ("conn_per_cpu_s_ratio_enforced_spread", "max - min"),
    ("conn_per_cpu_s_ratio_conntrack_only", "ct-only vs none"),
    (
        "conn_per_cpu_s_ratio_ebpf_first_packet",
        "eBPF SYN verdict vs none",
    ),
    ("conn_per_cpu_s_ratio_ebpf_flows", "eBPF flow table vs none"),
    ("conn_per_cpu_s_baseline", "conn per CPU-second"),
    ("conn_per_cpu_s_baseline_spread", "(max - min) / median"),
    ("policy_change_to_enforced_p50_ms", "ms"),
    ("policy_change_to_enforced_p99_ms", "ms"),
    ("policy_change_compile_p50_ms", "ms"),
    ("policy_change_render_p50_ms", "ms"),
    ("policy_change_apply_p50_ms", "ms (nft -f)"),
    ("policy_change_samples", "changes"),
    (
        "cluster_policy_change_to_enforced_p50_ms",
        "ms (ClusterNetworkPolicies)",
    ),
    (
        "cluster_policy_change_to_enforced_p99_ms",
        "ms (ClusterNetworkPolicies)",
    ),
    ("cluster_policy_change_compile_p50_ms", "ms"),
    ("cluster_policy_change_render_p50_ms", "ms"),
    ("cluster_policies", "ClusterNetworkPolicies"),
    ("script_bytes_with_cluster_policies", "bytes"),
    ("apply_ms_full", "ms (nft -f, fresh table)"),
    ("agent_rss_mib_enforcing", "MiB (VmRSS of the child)"),
    ("agent_peak_rss_mib_enforcing", "MiB (VmHWM)"),
    ("deny_decision_ns_p50", "ns CPU per denied SYN"),
    ("deny_decision_ns_spread", "ns (max - min)"),
    ("deny_decision_rules_ns_p50", "ns (table's share)"),
    ("deny_decision_conntrack_ns_p50", "ns (conntrack's share)"),
    ("deny_decision_wall_ns_p50", "ns wall"),
    ("denied_syns_per_sec_one_core", "SYNs/s"),
    ("isolated_pods_ingress", "pods of the node"),
    ("isolated_pods_egress", "pods of the node"),
    ("allow_rules", "rules"),
    ("script_bytes", "bytes"),
    ("pods", "pods"),
    ("policies", "NetworkPolicies"),
    ("bench_seconds", "s"),
];

/// `(key, comparison, goal)`.
const GOALS: &[(&str, &str, f64)] = &[
    ("conn_rate_ratio_enforced", ">=", 0.95),
    ("policy_change_to_enforced_p99_ms", "<=", 1000.0),
    ("cluster_policy_change_to_enforced_p99_ms", "<=", 1000.0),
    ("agent_rss_mib_enforcing", "<=", 64.0),
];

/// Runs the bench and reports.
pub fn run() -> Result<()> {
    let root = run::workspace_root();
    let raw = root.join("target").join("bench").join("enforce.raw.json");
    let _ = std::fs::remove_file(&raw);
    run::step(
        "cargo bench --bench enforce (release; root)",
        run::cargo(
            &root,
            &[("BENCH_FIGURES".into(), raw.display().to_string())],
            &[
                "bench",
                "--locked",
                "-p",
                "network-enforcer-agent",
                "--bench",
                "enforce",
            ],
        ),
    )?;
    let text = std::fs::read_to_string(&raw)
        .with_context(|| format!("the bench wrote no figures to {}", raw.display()))?;
    let values: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", raw.display()))?;
    // The ratio is absent when the baseline was too noisy; everything else must be there.
    let figures = KEYS
        .iter()
        .filter_map(|&(key, unit)| match values[key].as_f64() {
            Some(value) => Some(Ok(Figure::new(key, value, unit))),
            None if key.starts_with("conn_rate_ratio") => None,
            None => Some(Err(anyhow::anyhow!(
                "{} has no number `{key}`",
                raw.display()
            ))),
        })
        .collect::<Result<Vec<_>>>()?;
    let path = report("enforce", &figures)?;

    let mut goals = serde_json::Map::new();
    println!("  goals:");
    for &(key, comparison, goal) in GOALS {
        let value = values[key].as_f64();
        let met = value.map(|v| match comparison {
            ">=" => v >= goal,
            _ => v <= goal,
        });
        let verdict = match met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "not measured",
        };
        println!("    {key} {comparison} {goal}: {verdict}");
        goals.insert(
            key.to_string(),
            json!({"goal": format!("{comparison} {goal}"), "value": value, "met": met}),
        );
    }
    let mut written: serde_json::Map<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?,
    )?;
    written.insert("goals".into(), Value::Object(goals));
    for extra in ["conn_rate_rounds", "notes"] {
        written.insert(extra.into(), values[extra].clone());
    }
    std::fs::write(&path, serde_json::to_string_pretty(&written)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    std::fs::remove_file(&raw).ok();

    if values["conn_rate_ratio_enforced"].as_f64().is_none() {
        bail!(
            "conn_rate_ratio_enforced: {}",
            values["notes"]["conn_rate_ratio_enforced"]
                .as_str()
                .unwrap_or("not measured")
        );
    }
    Ok(())
}
