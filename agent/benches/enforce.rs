//! NetworkPolicy enforcement at scale (root; run by `cargo xtask bench enforce`, figures in
//! `target/bench/enforce.json`).
//!
//! The cluster: 100 namespaces × 100 pods over 10 nodes (this node, `node-0`, runs 1,000 of them) and
//! 1,000 NetworkPolicies, 10 per namespace: a default-deny, six per-app ingress policies (pods of a
//! neighbouring team's namespaces and of the same namespace on two ports, an `ipBlock` with an except on
//! a port list and a range), a monitoring allowance (a namespace selected by label, a named port), an
//! egress policy (DNS to one namespace, the internet minus private ranges, a named port) and a
//! same-team frontends policy (namespace and pod selector in one peer, named port, a block on a
//! range). The objects are built as the API server would send them and fed through
//! `Cluster::apply_*`, then compiled for `node-0`, rendered and installed with the agent's own code.
//!
//! Three network namespaces stand in for a pod → host → pod path: a client pod and a server pod
//! (both pods of the synthetic cluster on `node-0`) each behind a veth pair into a "node" namespace
//! that routes /32s between them (proxy ARP, `ip_forward`, as Calico-style CNIs do) and holds the
//! enforcement table. Figures:
//!
//! 1. connections/s (connect, 16-byte write, echo read, close) with the table vs without it,
//!    interleaved rounds; also a conntrack-only table, to tell the rules' cost from conntrack's, and
//!    the alternative without conntrack: verdicts in eBPF at tc on the server's veth
//!    (`agent-ebpf/src/verdict.rs`), judging only the first packet, or keeping a flow table of its own;
//! 2. policy change → `nft::apply` returned, for adds and modifications of one policy among 1,000;
//! 3. the resident memory of a child process holding the cluster, the ruleset and the script;
//! 4. the kernel cost of denying a first packet: raw SYNs to a denied port, CPU time per packet of
//!    the sending thread (which also runs the softirq that forwards and judges the packet) with the
//!    table minus with a bare `policy drop` forward hook.
//!
//! Every namespace is removed on exit (also on error; a run killed hard leaves `neenf*` namespaces,
//! removed by the next run). Figures go to the file `BENCH_FIGURES` names (JSON), else to
//! `target/bench/enforce.raw.json`.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use network_enforcer_agent::enforce::compile::{Peers, Ruleset, compile};
use network_enforcer_agent::enforce::model::Cluster;
use network_enforcer_agent::enforce::nft;
use network_enforcer_api::Protocol;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const NAMESPACES: usize = 100;
const PODS_PER_NAMESPACE: usize = 100;
const APPS_PER_NAMESPACE: usize = 10;
const NODES: usize = 10;
const NODE: &str = "node-0";
/// The agent's defaults (`--enforcement-table`, `--enforcement-log-group`).
const TABLE: &str = "network_enforcer";
const LOG_GROUP: u16 = 8410;
/// The test endpoints: `ns-01/app-1-10` serves, `ns-02/app-2-20` connects (both on `node-0`; the
/// policy `ns-01/app-1-ingress` allows team-2's app-2 pods on 8080).
const SERVER: (&str, &str) = ("ns-01", "app-1-10");
const CLIENT: (&str, &str) = ("ns-02", "app-2-20");
const ALLOWED_PORT: u16 = 8080;
const DENIED_PORT: u16 = 9999;

/// Connection rounds per arm, and how long each lasts.
const ROUNDS: usize = 4;
const ROUND: Duration = Duration::from_secs(4);
/// Pause and uncounted load after each table change.
const SETTLE: Duration = Duration::from_millis(500);
const CLIENT_THREADS: usize = 4;
const SERVER_THREADS: usize = 4;
/// Baseline rounds further apart than this (relative to their median) void the ratio.
const BASELINE_TOLERANCE: f64 = 0.10;
/// Policy changes timed.
const CHANGES: usize = 20;
/// Deny rounds per arm, and SYNs per round.
const DENY_ROUNDS: usize = 5;
const SYNS_PER_ROUND: u32 = 200_000;

const CHILD_ENV: &str = "NE_ENFORCE_BENCH_CHILD";

fn main() {
    if std::env::var_os(CHILD_ENV).is_some() {
        rss_child();
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "the enforce bench creates network namespaces and nftables tables: run it as root"
        );
        std::process::exit(1);
    }
    if let Err(error) = run() {
        eprintln!("enforce bench failed: {error:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let started = Instant::now();
    let mut figures = serde_json::Map::new();
    let mut notes = serde_json::Map::new();

    println!("==> synthesize 100 namespaces x 100 pods, 1,000 NetworkPolicies; compile for {NODE}");
    let t = Instant::now();
    let mut cluster = synthesize();
    let synth_ms = ms(t.elapsed());
    let t = Instant::now();
    let ruleset = compile(&cluster, NODE);
    let compile_ms = ms(t.elapsed());
    let t = Instant::now();
    let script = nft::render(&ruleset, TABLE, Some(LOG_GROUP));
    let render_ms = ms(t.elapsed());
    let (ingress, egress) = ruleset.isolated();
    let rules = script
        .lines()
        .filter(|l| l.trim_end().ends_with("return"))
        .count();
    println!(
        "    {} pods, {} policies; {ingress} pods isolated for ingress, {egress} for egress, {rules} allow \
         rules, script {:.1} MiB; synthesize {synth_ms:.0} ms, compile {compile_ms:.0} ms, render \
         {render_ms:.0} ms",
        cluster.pods.len(),
        cluster.policies.len(),
        script.len() as f64 / (1 << 20) as f64
    );
    let server_ip = pod_ip(&cluster, SERVER)?;
    let client_ip = pod_ip(&cluster, CLIENT)?;
    check_endpoints(&ruleset, &script, server_ip, client_ip)?;
    figures.insert("pods".into(), json!(cluster.pods.len()));
    figures.insert("policies".into(), json!(cluster.policies.len()));
    figures.insert("isolated_pods_ingress".into(), json!(ingress));
    figures.insert("isolated_pods_egress".into(), json!(egress));
    figures.insert("allow_rules".into(), json!(rules));
    figures.insert("script_bytes".into(), json!(script.len()));
    figures.insert("compile_ms_full".into(), json!(round1(compile_ms)));
    figures.insert("render_ms_full".into(), json!(round1(render_ms)));

    let net = Topology::create(client_ip, server_ip)?;

    // 1. Connection rate, interleaved.
    let server = EchoServer::start(&net, server_ip)?;
    let target = SocketAddr::from((server_ip, ALLOWED_PORT));
    net.set_table(Arm::Off, &script)?;
    connections(&net, target, Duration::from_secs(1))?; // warm-up (ARP, caches)
    let mut installs = Vec::new();
    let arms = Arm::ALL;
    // The eBPF arms must enforce, or their rates mean nothing: the denied port's SYN is dropped
    // (a timeout; without a verdict the server's kernel refuses it at once), the allowed port works.
    for arm in [Arm::EbpfFirstPacket, Arm::EbpfFlows] {
        net.set_table(arm, &script)?;
        check_verdict(&net, server_ip, arm)?;
    }
    let mut rates: [Vec<f64>; 5] = Default::default();
    let mut per_cpu: [Vec<f64>; 5] = Default::default();
    let mut failures = 0u64;
    for round in 0..ROUNDS {
        for i in 0..arms.len() {
            // Rotate the order each round so no arm always follows the same one.
            let arm = arms[(i + round) % arms.len()];
            if let Some(took) = net.set_table(arm, &script)? {
                installs.push(ms(took));
            }
            // Let the kernel finish freeing the previous table, then warm up uncounted.
            std::thread::sleep(SETTLE);
            connections(&net, target, SETTLE)?;
            let r = connections(&net, target, ROUND)?;
            failures += r.failed;
            println!(
                "    round {}/{ROUNDS} {:<9} {:>8.0} conn/s ({} failed)",
                round + 1,
                arm.name(),
                r.rate(),
                r.failed
            );
            rates[arm as usize].push(r.rate());
            per_cpu[arm as usize].push(r.per_cpu_second());
        }
    }
    println!(
        "    installing the full table took {:.0} ms (median of {})",
        median(&installs),
        installs.len()
    );
    figures.insert("apply_ms_full".into(), json!(round1(median(&installs))));
    {
        let [off, ct, on, _, _] = &per_cpu;
        let ratios: Vec<f64> = on.iter().zip(off).map(|(on, off)| on / off).collect();
        let ct_ratios: Vec<f64> = ct.iter().zip(off).map(|(ct, off)| ct / off).collect();
        println!(
            "    per CPU-second: {:.0} conn without a table, {:.0} ct only, {:.0} enforced; ratio {:.3} \
             (spread {:.3}), ct only {:.3}; baseline rounds {:.1}% apart",
            median(off),
            median(ct),
            median(on),
            median(&ratios),
            max(&ratios) - min(&ratios),
            median(&ct_ratios),
            spread(off) * 100.0
        );
        figures.insert("conn_per_cpu_s_baseline".into(), json!(median(off).round()));
        figures.insert("conn_per_cpu_s_enforced".into(), json!(median(on).round()));
        figures.insert(
            "conn_per_cpu_s_ratio_enforced".into(),
            json!(round3(median(&ratios))),
        );
        figures.insert(
            "conn_per_cpu_s_ratio_enforced_spread".into(),
            json!(round3(max(&ratios) - min(&ratios))),
        );
        figures.insert(
            "conn_per_cpu_s_ratio_conntrack_only".into(),
            json!(round3(median(&ct_ratios))),
        );
        figures.insert(
            "conn_per_cpu_s_baseline_spread".into(),
            json!(round3(spread(off))),
        );
        notes.insert(
            "conn_per_cpu_s_ratio_enforced".into(),
            json!(
                "The same rounds as conn_rate_ratio_enforced, counted per CPU-second of this process \
                 (CLOCK_PROCESS_CPUTIME_ID: clients, servers, and the forwarding, conntrack and nftables \
                 work of the node namespace, which runs in their softirqs on veth): what a connection \
                 costs regardless of how much of the shared machine the bench got. Softirq work \
                 deferred to ksoftirqd is not in it"
            ),
        );
    }
    for (arm, key) in [
        (Arm::EbpfFirstPacket, "ebpf_first_packet"),
        (Arm::EbpfFlows, "ebpf_flows"),
    ] {
        let ratio = |values: &[Vec<f64>; 5]| -> f64 {
            let ratios: Vec<f64> = values[arm as usize]
                .iter()
                .zip(&values[Arm::Off as usize])
                .map(|(x, off)| x / off)
                .collect();
            median(&ratios)
        };
        println!(
            "    {}: {:.3} of the rate without a table, {:.3} per CPU-second",
            arm.name(),
            ratio(&rates),
            ratio(&per_cpu)
        );
        if spread(&rates[Arm::Off as usize]) <= BASELINE_TOLERANCE {
            figures.insert(
                format!("conn_rate_ratio_{key}"),
                json!(round3(ratio(&rates))),
            );
        } else {
            notes.insert(
                format!("conn_rate_ratio_{key}"),
                json!("refused: the baseline rounds disagree (see conn_rate_ratio_enforced)"),
            );
        }
        figures.insert(
            format!("conn_per_cpu_s_ratio_{key}"),
            json!(round3(ratio(&per_cpu))),
        );
    }
    // The eBPF verdicts' own time per connection, from the kernel's BPF statistics (on only for
    // this: they add two clock reads to every run).
    for (arm, key) in [
        (Arm::EbpfFirstPacket, "ebpf_first_packet"),
        (Arm::EbpfFlows, "ebpf_flows"),
    ] {
        net.set_table(arm, &script)?;
        // On while the descriptor is open: off again however this ends.
        let stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .context("turning BPF statistics on")?;
        let load = connections(&net, target, ROUND)?;
        let (runs, run_ns) = net.verdict_run_ns()?;
        drop(stats);
        let per_conn = run_ns as f64 / load.ok.max(1) as f64;
        println!(
            "    {}: {per_conn:.0} ns per connection in the verdict programs ({:.1} runs per \
             connection, {:.0} ns per run; statistics on)",
            arm.name(),
            runs as f64 / load.ok.max(1) as f64,
            run_ns as f64 / runs.max(1) as f64
        );
        figures.insert(format!("{key}_ns_per_conn"), json!(per_conn.round()));
    }
    notes.insert(
        "conn_rate_ratio_ebpf_first_packet".into(),
        json!(
            "The same rounds, with no table and instead eBPF verdicts at tc on the server's veth in the \
             node namespace (agent-ebpf/src/verdict.rs), the alternative without netfilter conntrack: \
             ebpf_first_packet judges each SYN by one hash lookup (10,001 allowances) and passes every \
             other packet; ebpf_flows also keeps a flow table (LRU hash: insert at the SYN, a lookup \
             per packet both ways, removal at the RST). Checked before the rounds: the denied port's \
             SYN is dropped, the allowed port connects"
        ),
    );
    let [off, ct, on, _, _] = &rates;
    let ratios: Vec<f64> = on.iter().zip(off).map(|(on, off)| on / off).collect();
    let ct_ratios: Vec<f64> = ct.iter().zip(off).map(|(ct, off)| ct / off).collect();
    let rule_ratios: Vec<f64> = on.iter().zip(ct).map(|(on, ct)| on / ct).collect();
    let baseline_spread = spread(off);
    figures.insert("conn_rate_baseline".into(), json!(median(off).round()));
    figures.insert("conn_rate_conntrack_only".into(), json!(median(ct).round()));
    figures.insert("conn_rate_enforced".into(), json!(median(on).round()));
    figures.insert(
        "conn_rate_baseline_spread".into(),
        json!(round3(baseline_spread)),
    );
    figures.insert("conn_failures".into(), json!(failures));
    figures.insert(
        "conn_rate_rounds".into(),
        json!({"off": round_all(off), "conntrack_only": round_all(ct), "enforced": round_all(on)}),
    );
    if baseline_spread > BASELINE_TOLERANCE {
        notes.insert(
            "conn_rate_ratio_enforced".into(),
            json!(format!(
                "refused: the baseline rounds disagree by {:.1}% (more than {:.0}%); the machine was too \
                 busy for a ratio",
                baseline_spread * 100.0,
                BASELINE_TOLERANCE * 100.0
            )),
        );
        println!(
            "    baseline rounds disagree by {:.1}%: no ratio",
            baseline_spread * 100.0
        );
    } else {
        figures.insert(
            "conn_rate_ratio_enforced".into(),
            json!(round3(median(&ratios))),
        );
        figures.insert(
            "conn_rate_ratio_enforced_spread".into(),
            json!(round3(max(&ratios) - min(&ratios))),
        );
        figures.insert(
            "conn_rate_ratio_conntrack_only".into(),
            json!(round3(median(&ct_ratios))),
        );
        figures.insert(
            "conn_rate_ratio_enforced_vs_conntrack".into(),
            json!(round3(median(&rule_ratios))),
        );
        notes.insert(
            "conn_rate_ratio_enforced".into(),
            json!(format!(
                "TCP connections/s (connect, 16-byte write, echo read, close with RST so no TIME_WAIT \
                 limits the run; {CLIENT_THREADS} client threads, {SERVER_THREADS} server threads) from \
                 client pod {}/{} to server pod {}/{} through a node network namespace (veth pairs, /32 \
                 routes, proxy ARP, ip_forward), with the rendered table of the whole cluster vs no table; \
                 {ROUNDS} rounds of {} s per arm (each after a 0.5 s pause and 0.5 s of uncounted load), interleaved and rotated; the median of the per-round \
                 ratios (spread = max - min). The server is isolated for ingress: each new connection \
                 takes the vmap lookups and walks its chain to the allowing rule. Without a table the \
                 node namespace does not run conntrack at all; conn_rate_ratio_conntrack_only is a table \
                 of just `ct state established,related accept` (what any node with kube-proxy pays \
                 already), conn_rate_ratio_enforced_vs_conntrack the rules' own share",
                CLIENT.0,
                CLIENT.1,
                SERVER.0,
                SERVER.1,
                ROUND.as_secs()
            )),
        );
    }

    // 2. Policy change → enforced.
    net.set_table(Arm::Enforced, &script)?;
    let mut current = (ruleset, script);
    println!("==> {CHANGES} policy changes (add / modify one of 1,000), compile + render + apply");
    let mut totals = Vec::new();
    let (mut compiles, mut renders, mut applies) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..CHANGES {
        let policy = changed_policy(i);
        let t = Instant::now();
        cluster.apply_policy(&policy);
        let ruleset = compile(&cluster, NODE);
        let t_compile = t.elapsed();
        let script = nft::render(&ruleset, TABLE, Some(LOG_GROUP));
        let t_render = t.elapsed();
        net.in_node(|| nft::apply(&script))?
            .context("installing a changed ruleset")?;
        let total = t.elapsed();
        totals.push(ms(total));
        compiles.push(ms(t_compile));
        renders.push(ms(t_render - t_compile));
        applies.push(ms(total - t_render));
        current = (ruleset, script);
    }
    println!(
        "    p50 {:.0} ms (compile {:.0}, render {:.0}, apply {:.0}), p99 {:.0} ms",
        percentile(&totals, 50.0),
        percentile(&compiles, 50.0),
        percentile(&renders, 50.0),
        percentile(&applies, 50.0),
        percentile(&totals, 99.0)
    );
    figures.insert(
        "policy_change_to_enforced_p50_ms".into(),
        json!(round1(percentile(&totals, 50.0))),
    );
    figures.insert(
        "policy_change_to_enforced_p99_ms".into(),
        json!(round1(percentile(&totals, 99.0))),
    );
    figures.insert(
        "policy_change_compile_p50_ms".into(),
        json!(round1(percentile(&compiles, 50.0))),
    );
    figures.insert(
        "policy_change_render_p50_ms".into(),
        json!(round1(percentile(&renders, 50.0))),
    );
    figures.insert(
        "policy_change_apply_p50_ms".into(),
        json!(round1(percentile(&applies, 50.0))),
    );
    figures.insert("policy_change_samples".into(), json!(totals.len()));
    notes.insert(
        "policy_change_to_enforced_p99_ms".into(),
        json!(format!(
            "{CHANGES} changes, alternately a new policy and a modified port of an existing one (each \
             selects pods of {NODE}), among 1,000 policies and 10,000 pods: from Cluster::apply_policy to \
             nft::apply having returned (full compile, full render, `nft -f -` replacing the table in the \
             node namespace); nearest-rank percentiles. The agent adds its 50 ms settle window and the \
             watch delivery on top"
        )),
    );

    // 2b. ClusterNetworkPolicy change → enforced, then back to NetworkPolicies only (the deny and
    // memory figures are the NetworkPolicy table's, as before).
    println!(
        "==> {CHANGES} ClusterNetworkPolicy changes (Admin and Baseline tiers over the same cluster), compile + render + apply"
    );
    let mut cluster_totals = Vec::new();
    let (mut cluster_compiles, mut cluster_renders) = (Vec::new(), Vec::new());
    let mut cluster_script = 0;
    for i in 0..CHANGES {
        let t = Instant::now();
        cluster.apply_cluster_policy(&changed_cluster_policy(i));
        let ruleset = compile(&cluster, NODE);
        let t_compile = t.elapsed();
        let script = nft::render(&ruleset, TABLE, Some(LOG_GROUP));
        let t_render = t.elapsed();
        net.in_node(|| nft::apply(&script))?
            .context("installing a ruleset with ClusterNetworkPolicies")?;
        cluster_totals.push(ms(t.elapsed()));
        cluster_compiles.push(ms(t_compile));
        cluster_renders.push(ms(t_render - t_compile));
        cluster_script = script.len();
    }
    println!(
        "    {} ClusterNetworkPolicies, script {:.1} MiB; p50 {:.0} ms (compile {:.0}, render {:.0}), p99 {:.0} ms",
        cluster.cluster_policies.len(),
        cluster_script as f64 / (1 << 20) as f64,
        percentile(&cluster_totals, 50.0),
        percentile(&cluster_compiles, 50.0),
        percentile(&cluster_renders, 50.0),
        percentile(&cluster_totals, 99.0)
    );
    figures.insert(
        "cluster_policy_change_compile_p50_ms".into(),
        json!(round1(percentile(&cluster_compiles, 50.0))),
    );
    figures.insert(
        "cluster_policy_change_render_p50_ms".into(),
        json!(round1(percentile(&cluster_renders, 50.0))),
    );
    figures.insert(
        "cluster_policies".into(),
        json!(cluster.cluster_policies.len()),
    );
    figures.insert(
        "cluster_policy_change_to_enforced_p50_ms".into(),
        json!(round1(percentile(&cluster_totals, 50.0))),
    );
    figures.insert(
        "cluster_policy_change_to_enforced_p99_ms".into(),
        json!(round1(percentile(&cluster_totals, 99.0))),
    );
    figures.insert(
        "script_bytes_with_cluster_policies".into(),
        json!(cluster_script),
    );
    notes.insert(
        "cluster_policy_change_to_enforced_p99_ms".into(),
        json!(format!(
            "{CHANGES} changes on top of the 1,000 NetworkPolicies: alternately a new Admin or Baseline \
             ClusterNetworkPolicy (subject: one team's ten namespaces; 25 rules of namespace, pod and \
             network peers with ports and named ports, Accept / Deny / Pass) and one of them with its \
             rules reversed; from Cluster::apply_cluster_policy to nft::apply having returned, as for \
             NetworkPolicies. The ClusterNetworkPolicies are removed afterwards"
        )),
    );
    cluster.cluster_policies.clear();
    net.in_node(|| nft::apply(&current.1))?
        .context("installing the NetworkPolicy table again")?;

    // 4. Denied first packets (before 3, which needs no namespaces).
    println!("==> denied SYNs: enforced table vs drops in front of it");
    let (ruleset, script) = &current;
    let server_chain = check_endpoints(ruleset, script, server_ip, client_ip)?;
    let deny = deny_cost(&net, client_ip, server_ip, &server_chain)?;
    let [bare, ct_drop, enforced] = &deny.cpu_ns;
    let full: Vec<f64> = enforced.iter().zip(bare).map(|(e, b)| e - b).collect();
    let rules_only: Vec<f64> = enforced.iter().zip(ct_drop).map(|(e, c)| e - c).collect();
    let conntrack: Vec<f64> = ct_drop.iter().zip(bare).map(|(c, b)| c - b).collect();
    let [wall_bare, _, wall_enforced] = &deny.wall_ns;
    let wall_full: Vec<f64> = wall_enforced
        .iter()
        .zip(wall_bare)
        .map(|(e, b)| e - b)
        .collect();
    figures.insert("deny_decision_ns_p50".into(), json!(round1(median(&full))));
    figures.insert(
        "deny_decision_ns_spread".into(),
        json!(round1(max(&full) - min(&full))),
    );
    figures.insert(
        "deny_decision_rules_ns_p50".into(),
        json!(round1(median(&rules_only))),
    );
    figures.insert(
        "deny_decision_conntrack_ns_p50".into(),
        json!(round1(median(&conntrack))),
    );
    figures.insert(
        "deny_decision_wall_ns_p50".into(),
        json!(round1(median(&wall_full))),
    );
    figures.insert(
        "deny_syn_cpu_ns_enforced".into(),
        json!(round1(median(enforced))),
    );
    figures.insert(
        "deny_syn_cpu_ns_bare_drop".into(),
        json!(round1(median(bare))),
    );
    figures.insert(
        "denied_syns_per_sec_one_core".into(),
        json!((1e9 / median(enforced)).round()),
    );
    figures.insert("deny_nflog_read".into(), json!(deny.nflog_read));
    notes.insert(
        "deny_decision_ns_p50".into(),
        json!(format!(
            "One thread in the client pod sends raw TCP SYNs (a new source port each, so each is a first \
             packet and a new conntrack entry) to the server pod's port {DENIED_PORT}, which no policy \
             allows. On veth the node namespace's forwarding, conntrack and nftables run in the softirq \
             of the sending thread, so its CPU time (CLOCK_THREAD_CPUTIME_ID; this kernel has no \
             IRQ-time accounting, so softirq time stays in it) covers the whole path, and other load on \
             the machine does not. Three arms, {DENY_ROUNDS} rotated rounds of {SYNS_PER_ROUND} SYNs \
             each, the enforced table installed throughout: (a) bare: `notrack` at prerouting and a \
             `policy drop` forward chain in front of the table (priority filter - 10): no conntrack, no \
             rules; (b) the same drop without notrack: conntrack creates the entry, the rules do not \
             run; (c) the table alone: conntrack entry, ct state, egress/ingress vmap lookups, the \
             server's chain of {} rules walked to its end, `log group {LOG_GROUP}` (the agent's NFLOG \
             reader bound and reading), counter, drop. deny_decision_ns_p50 = median over rounds of \
             (c) - (a) per packet: what enforcement adds to a denied first packet; \
             deny_decision_rules_ns_p50 = (c) - (b), the table's own share (a node running kube-proxy \
             pays conntrack anyway); deny_decision_conntrack_ns_p50 = (b) - (a). The chain's drop \
             counter confirms every SYN of (c) reached it. deny_decision_wall_ns_p50 is (c) - (a) in \
             wall time (includes waiting for the CPU on a shared machine)",
            deny.chain_rules
        )),
    );

    server.stop();
    drop(net);

    // 3. Memory of a process holding the enforcement state.
    println!("==> resident memory of a child holding cluster + ruleset + script");
    let (rss, hwm) = child_rss()?;
    println!("    VmRSS {rss:.1} MiB, VmHWM {hwm:.1} MiB");
    figures.insert("agent_rss_mib_enforcing".into(), json!(round1(rss)));
    figures.insert("agent_peak_rss_mib_enforcing".into(), json!(round1(hwm)));
    notes.insert(
        "agent_rss_mib_enforcing".into(),
        json!(
            "VmRSS (and VmHWM, the peak) from /proc/<pid>/status of a child process (this bench binary \
             re-run) that built the 10,000-pod / 1,000-policy Cluster from Kubernetes objects through \
             Cluster::apply_*, compiled it for node-0 and rendered the script, and holds all three while \
             the parent reads. It is the enforcement state plus a bare Rust process; the agent's other \
             state (tokio, kube watches, eBPF maps) is measured by `cargo xtask bench agent`"
        ),
    );

    let seconds = started.elapsed().as_secs_f64();
    figures.insert("bench_seconds".into(), json!(seconds.round()));
    figures.insert("notes".into(), Value::Object(notes));
    write_figures(&Value::Object(figures))?;
    println!("==> enforce bench done in {seconds:.0} s");
    Ok(())
}

fn write_figures(figures: &Value) -> Result<()> {
    let path = std::env::var_os("BENCH_FIGURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/bench/enforce.raw.json")
        });
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, serde_json::to_string_pretty(figures)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    println!("    figures -> {}", path.display());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The synthetic cluster.

/// The address of pod number `local` (0..1,000) of node `node`: each node has its own /16.
fn address(node: usize, local: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        10,
        100 + node as u8,
        (local / 250) as u8,
        (local % 250 + 2) as u8,
    )
}

fn namespace_name(n: usize) -> String {
    format!("ns-{n:02}")
}

fn synthesize() -> Cluster {
    let mut cluster = Cluster::default();
    for n in 0..NAMESPACES {
        let mut labels = json!({"team": format!("team-{}", n % 10),
                                "env": if n.is_multiple_of(2) { "prod" } else { "staging" }});
        if n == NAMESPACES - 1 {
            labels["purpose"] = json!("monitoring");
        }
        let ns: Namespace = serde_json::from_value(
            json!({"metadata": {"name": namespace_name(n), "labels": labels}}),
        )
        .expect("a namespace");
        cluster.apply_namespace(&ns);
    }
    let mut per_node = [0usize; NODES];
    for n in 0..NAMESPACES {
        for j in 0..PODS_PER_NAMESPACE {
            let node = (n * PODS_PER_NAMESPACE + j) % NODES;
            let ip = address(node, per_node[node]);
            per_node[node] += 1;
            let app = j / (PODS_PER_NAMESPACE / APPS_PER_NAMESPACE);
            let tier = ["frontend", "backend", "db"][app % 3];
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {
                    "namespace": namespace_name(n),
                    "name": format!("app-{app}-{j}"),
                    "labels": {"app": format!("app-{app}"), "tier": tier,
                               "pod-template-hash": format!("{:08x}", n * 31 + app)},
                },
                "spec": {"nodeName": format!("node-{node}"), "containers": [{"name": "main", "ports": [
                    {"name": "http", "containerPort": 8080},
                    {"name": "metrics", "containerPort": 9090},
                    {"name": "grpc", "containerPort": 50051},
                ]}]},
                "status": {"phase": "Running", "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}
            }))
            .expect("a pod");
            cluster.apply_pod(&pod);
        }
    }
    for n in 0..NAMESPACES {
        for (name, spec) in policies(n) {
            cluster.apply_policy(&policy(&namespace_name(n), &name, spec));
        }
    }
    cluster
}

fn policy(namespace: &str, name: &str, spec: Value) -> NetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"namespace": namespace, "name": name},
        "spec": spec
    }))
    .expect("a NetworkPolicy")
}

/// The ten policies of namespace `n`.
fn policies(n: usize) -> Vec<(String, Value)> {
    let team = |t: usize| format!("team-{}", t % 10);
    let app = |a: usize| format!("app-{}", a % APPS_PER_NAMESPACE);
    let mut out = vec![(
        "default-deny-ingress".to_string(),
        json!({"podSelector": {}, "policyTypes": ["Ingress"]}),
    )];
    for a in 1..=6 {
        out.push((
            format!("app-{a}-ingress"),
            json!({
                "podSelector": {"matchLabels": {"app": app(a)}},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {"from": [
                        {"namespaceSelector": {"matchLabels": {"team": team(n + 1)}},
                         "podSelector": {"matchLabels": {"app": app(a + 1)}}},
                        {"podSelector": {"matchLabels": {"app": app(a + 9)}}}
                     ],
                     "ports": [{"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 9090}]},
                    {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.100.0.0/14", "10.104.0.0/14"]}}],
                     "ports": [{"port": 443}, {"port": 8443}, {"port": 30000, "endPort": 30100}]}
                ]
            }),
        ));
    }
    out.push((
        "allow-monitoring".to_string(),
        json!({
            "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["frontend", "backend"]}]},
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"purpose": "monitoring"}}}],
                         "ports": [{"port": "metrics"}]}]
        }),
    ));
    out.push((
        "app-8-egress".to_string(),
        json!({
            "podSelector": {"matchLabels": {"app": app(8)}},
            "policyTypes": ["Egress"],
            "egress": [
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ns-00"}},
                         "podSelector": {"matchLabels": {"app": "app-0"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0",
                                     "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]}}],
                 "ports": [{"port": 443}]},
                {"to": [{"podSelector": {"matchLabels": {"app": app(9)}}}], "ports": [{"port": "grpc"}]}
            ]
        }),
    ));
    out.push((
        "app-9-frontends".to_string(),
        json!({
            "podSelector": {"matchLabels": {"app": app(9)}},
            "ingress": [
                {"from": [{"namespaceSelector": {"matchLabels": {"team": team(n)}},
                           "podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["frontend"]}]}}],
                 "ports": [{"port": "http"}, {"port": "grpc"}]},
                {"from": [{"ipBlock": {"cidr": "192.168.0.0/16"}}], "ports": [{"port": 80, "endPort": 89}]}
            ]
        }),
    ));
    out
}

/// Change number `i`: even ones add a policy, odd ones modify the port of an existing one. Each
/// selects pods on `node-0` (every app has one there in every namespace).
/// The `i`-th ClusterNetworkPolicy change: even `i` adds policy `cnp-<i/2>` (Admin when `i/2` is
/// even, Baseline otherwise) for team `i/2`'s namespaces, odd `i` reverses the order of its rules.
fn changed_cluster_policy(
    i: usize,
) -> network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy {
    let k = i / 2;
    let actions = ["Accept", "Deny", "Pass"];
    let mut rules: Vec<Value> = (0..25)
        .map(|r| {
            let peer = match r % 3 {
                0 => json!({"namespaces": {"matchLabels": {"team": format!("team-{}", (k + r) % 10)}}}),
                1 => json!({"pods": {"namespaceSelector": {"matchLabels": {"env": "prod"}},
                                     "podSelector": {"matchLabels": {"app": format!("app-{}", r % APPS_PER_NAMESPACE)}}}}),
                _ => json!({"namespaces": {"matchLabels": {"purpose": "monitoring"}}}),
            };
            let protocols = match r % 4 {
                0 => json!([{"tcp": {"destinationPort": {"number": 8080 + r}}}]),
                1 => json!([{"destinationNamedPort": "metrics"}]),
                2 => json!([{"udp": {"destinationPort": {"range": {"start": 5000, "end": 5100}}}}]),
                _ => Value::Null,
            };
            let mut rule = json!({"name": format!("r{r}"), "action": actions[r % 3], "from": [peer]});
            if !protocols.is_null() {
                rule["protocols"] = protocols;
            }
            rule
        })
        .collect();
    if i % 2 == 1 {
        rules.reverse();
    }
    serde_json::from_value(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2",
        "kind": "ClusterNetworkPolicy",
        "metadata": {"name": format!("cnp-{k}")},
        "spec": {
            "tier": if k.is_multiple_of(2) { "Admin" } else { "Baseline" },
            "priority": 100 + k,
            "subject": {"namespaces": {"matchLabels": {"team": format!("team-{}", k % 10)}}},
            "ingress": rules,
        }
    }))
    .expect("a ClusterNetworkPolicy")
}

fn changed_policy(i: usize) -> NetworkPolicy {
    let ns = namespace_name((i * 37) % NAMESPACES);
    if i.is_multiple_of(2) {
        policy(
            &ns,
            &format!("bench-added-{i}"),
            json!({
                "podSelector": {"matchLabels": {"app": format!("app-{}", i % APPS_PER_NAMESPACE)}},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "app-0"}}}],
                             "ports": [{"port": 7000 + i}]}]
            }),
        )
    } else {
        let a = 1 + i % 6;
        policy(
            &ns,
            &format!("app-{a}-ingress"),
            json!({
                "podSelector": {"matchLabels": {"app": format!("app-{a}")}},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": format!("app-{}", (a + 9) % 10)}}}],
                             "ports": [{"protocol": "TCP", "port": 8080}, {"protocol": "TCP", "port": 7000 + i}]}]
            }),
        )
    }
}

fn pod_ip(cluster: &Cluster, (namespace, name): (&str, &str)) -> Result<Ipv4Addr> {
    let pod = cluster
        .pods
        .get(&(namespace.to_string(), name.to_string()))
        .with_context(|| format!("pod {namespace}/{name} not in the synthetic cluster"))?;
    ensure!(
        pod.node.as_deref() == Some(NODE),
        "{namespace}/{name} is not on {NODE}"
    );
    match pod.ips.first() {
        Some(IpAddr::V4(ip)) => Ok(*ip),
        _ => bail!("{namespace}/{name} has no IPv4 address"),
    }
}

/// Checks that the server is isolated for ingress, allows the client on the allowed port and not on
/// the denied one; returns the server's ingress chain name and rule count.
fn check_endpoints(
    ruleset: &Ruleset,
    script: &str,
    server: Ipv4Addr,
    client: Ipv4Addr,
) -> Result<(String, usize)> {
    let (k, pod) = ruleset
        .pods
        .iter()
        .enumerate()
        .find(|(_, p)| p.ips.contains(&IpAddr::V4(server)))
        .context("the server pod is not isolated")?;
    let side = pod
        .ingress
        .as_ref()
        .context("the server pod is not isolated for ingress")?;
    let allows = |port: u16| {
        side.allows.iter().any(|a| {
            let peer = match &a.peers {
                Peers::Any => true,
                Peers::Addresses(ips) => ips.contains(&IpAddr::V4(client)),
                Peers::Block { cidr, except } => {
                    cidr.contains(&IpAddr::V4(client))
                        && !except.iter().any(|e| e.contains(&IpAddr::V4(client)))
                }
            };
            let port = a.ports.as_ref().is_none_or(|ranges| {
                ranges
                    .iter()
                    .any(|r| r.protocol == Protocol::TCP && r.first <= port && port <= r.last)
            });
            peer && port
        })
    };
    ensure!(
        allows(ALLOWED_PORT),
        "the policies do not allow client → server:{ALLOWED_PORT}"
    );
    ensure!(
        !allows(DENIED_PORT),
        "the policies allow client → server:{DENIED_PORT}"
    );
    let chain = format!("in_{k}");
    let rules = script
        .split(&format!("chain {chain} {{"))
        .nth(1)
        .and_then(|rest| rest.split("\n  }").next())
        .context("the server's chain is not in the script")?
        .lines()
        .filter(|l| l.trim_end().ends_with("return"))
        .count();
    Ok((chain, rules))
}

// ---------------------------------------------------------------------------------------------
// Network namespaces.

/// What the node namespace holds during a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arm {
    Off = 0,
    Conntrack = 1,
    Enforced = 2,
    /// No table; eBPF judges each connection's SYN.
    EbpfFirstPacket = 3,
    /// No table; eBPF judges each SYN and keeps a flow table for every other packet.
    EbpfFlows = 4,
}

impl Arm {
    const ALL: [Arm; 5] = [
        Arm::Off,
        Arm::Conntrack,
        Arm::Enforced,
        Arm::EbpfFirstPacket,
        Arm::EbpfFlows,
    ];

    fn name(self) -> &'static str {
        match self {
            Arm::Off => "no table",
            Arm::Conntrack => "ct only",
            Arm::Enforced => "enforced",
            Arm::EbpfFirstPacket => "ebpf first",
            Arm::EbpfFlows => "ebpf flows",
        }
    }

    /// The eBPF verdict's `MODE`, for the eBPF arms.
    fn verdict_mode(self) -> Option<u32> {
        match self {
            Arm::EbpfFirstPacket => Some(0),
            Arm::EbpfFlows => Some(1),
            _ => None,
        }
    }
}

/// The eBPF verdict programs (`agent-ebpf/src/verdict.rs`), an object only this bench loads.
static VERDICT_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(
    env!("OUT_DIR"),
    "/network-enforcer-agent-ebpf-verdict"
));
/// The node-side veth of the server pod, where the eBPF arms attach.
const SERVER_VETH: &str = "vs";
/// Allowances besides the bench's own in the eBPF arms' map, so its lookup is not in a near-empty
/// table (the enforced table holds about this many allow rules).
const VERDICT_ALLOWANCES: u32 = 10_000;

const CT_TABLE: &str = "ne_bench_ct";
const DROP_TABLE: &str = "ne_bench_drop";

/// Client, node and server namespaces; removed on drop.
struct Topology {
    client: String,
    node: String,
    server: String,
    /// Whether the enforcement table is in the node namespace (asking nft costs a second with it).
    enforced: AtomicBool,
    /// The eBPF verdict programs while an eBPF arm runs (dropping them detaches them).
    verdict: std::sync::Mutex<Option<aya::Ebpf>>,
    client_ip: Ipv4Addr,
    server_ip: Ipv4Addr,
}

impl Topology {
    fn create(client_ip: Ipv4Addr, server_ip: Ipv4Addr) -> Result<Self> {
        remove_stale();
        let tag = std::process::id();
        let net = Self {
            client: format!("neenf{tag}c"),
            node: format!("neenf{tag}n"),
            server: format!("neenf{tag}s"),
            enforced: AtomicBool::new(false),
            verdict: std::sync::Mutex::new(None),
            client_ip,
            server_ip,
        };
        let (c, n, s) = (&net.client, &net.node, &net.server);
        for ns in [c, n, s] {
            sh("ip", &["netns", "add", ns])?;
            sh("ip", &["-n", ns, "link", "set", "lo", "up"])?;
        }
        for (pod, ip, veth) in [(c, client_ip, "vc"), (s, server_ip, "vs")] {
            sh(
                "ip",
                &[
                    "link", "add", "name", veth, "netns", n, "type", "veth", "peer", "name",
                    "eth0", "netns", pod,
                ],
            )?;
            sh(
                "ip",
                &["-n", pod, "addr", "add", &format!("{ip}/32"), "dev", "eth0"],
            )?;
            sh("ip", &["-n", pod, "link", "set", "eth0", "up"])?;
            sh(
                "ip",
                &[
                    "-n", pod, "route", "add", "default", "dev", "eth0", "scope", "link",
                ],
            )?;
            sh("ip", &["-n", n, "link", "set", veth, "up"])?;
            sh(
                "ip",
                &["-n", n, "route", "add", &format!("{ip}/32"), "dev", veth],
            )?;
            sh(
                "ip",
                &[
                    "netns",
                    "exec",
                    n,
                    "sysctl",
                    "-qw",
                    &format!("net.ipv4.conf.{veth}.proxy_arp=1"),
                ],
            )?;
        }
        sh(
            "ip",
            &["-n", n, "addr", "add", "10.255.0.1/32", "dev", "lo"],
        )?;
        sh(
            "ip",
            &["netns", "exec", n, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
        )?;
        // A deep accept queue: the clients outrun the server in bursts.
        sh(
            "ip",
            &[
                "netns",
                "exec",
                s,
                "sysctl",
                "-qw",
                "net.core.somaxconn=4096",
            ],
        )?;
        Ok(net)
    }

    /// Runs `f` on a thread inside the node namespace (children it starts, `nft`, live there too).
    fn in_node<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    enter(&self.node)?;
                    Ok(f())
                })
                .join()
                .map_err(|_| anyhow::anyhow!("a node-namespace thread panicked"))?
        })
    }

    /// Leaves the node namespace with exactly the tables of `arm` (the enforced table, when kept,
    /// is assumed to be `script`); returns how long installing the enforced table took, if it was.
    fn set_table(&self, arm: Arm, script: &str) -> Result<Option<Duration>> {
        let installed = self.enforced.load(Ordering::Relaxed);
        // Detached whatever the arm; an eBPF arm loads its own below. Dropped in the node
        // namespace: before Linux 6.6 a tc program is detached by interface index, which means
        // something only there.
        let old = self
            .verdict
            .lock()
            .map_err(|_| anyhow::anyhow!("the verdict lock"))?
            .take();
        if let Some(old) = old {
            self.in_node(move || drop(old))?;
        }
        let took = self.in_node(|| -> Result<Option<Duration>> {
            remove_table(DROP_TABLE)?;
            if arm != Arm::Enforced && installed {
                remove_table(TABLE)?;
            }
            match arm {
                Arm::Off | Arm::EbpfFirstPacket | Arm::EbpfFlows => {
                    remove_table(CT_TABLE)?;
                    Ok(None)
                }
                Arm::Conntrack => {
                    nft::apply(&format!(
                        "table inet {CT_TABLE} {{}}\ndelete table inet {CT_TABLE}\n\
                         table inet {CT_TABLE} {{\n  chain forward {{\n    type filter hook forward \
                         priority filter; policy accept;\n    ct state established,related accept\n  \
                         }}\n}}\n"
                    ))?;
                    Ok(None)
                }
                Arm::Enforced => {
                    remove_table(CT_TABLE)?;
                    if installed {
                        return Ok(None);
                    }
                    let t = Instant::now();
                    nft::apply(script)?;
                    Ok(Some(t.elapsed()))
                }
            }
        })??;
        self.enforced.store(arm == Arm::Enforced, Ordering::Relaxed);
        if let Some(mode) = arm.verdict_mode() {
            let ebpf = self.attach_verdict(mode)?;
            *self
                .verdict
                .lock()
                .map_err(|_| anyhow::anyhow!("the verdict lock"))? = Some(ebpf);
        }
        Ok(took)
    }

    /// Runs and ns in the attached verdict programs so far (BPF statistics).
    fn verdict_run_ns(&self) -> Result<(u64, u64)> {
        let guard = self
            .verdict
            .lock()
            .map_err(|_| anyhow::anyhow!("the verdict lock"))?;
        let ebpf = guard.as_ref().context("no verdict attached")?;
        let (mut runs, mut ns) = (0, 0);
        for (_, program) in ebpf.programs() {
            // A program not loaded in this mode has no info.
            if let Ok(info) = program.info() {
                runs += info.run_count();
                ns += u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
            }
        }
        Ok((runs, ns))
    }

    /// Loads the eBPF verdict in `mode`, allows client → server:[`ALLOWED_PORT`] (among
    /// [`VERDICT_ALLOWANCES`] others) and attaches it to the server's veth in the node namespace.
    fn attach_verdict(&self, mode: u32) -> Result<aya::Ebpf> {
        use aya::maps::{Array as BpfArray, HashMap as BpfHashMap};
        use aya::programs::{SchedClassifier, TcAttachType};
        /// `Allowed` of verdict.rs.
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Allowed {
            source: u32,
            destination: u32,
            port: u16,
            _pad: u16,
        }
        // SAFETY: plain data, every byte initialised.
        unsafe impl aya::Pod for Allowed {}
        // The same layout as the program's key (12 bytes, no padding of its own).
        const _: () = assert!(std::mem::size_of::<Allowed>() == 12);
        let mut ebpf = aya::EbpfLoader::new()
            .load(VERDICT_OBJECT)
            .context("loading the verdict object")?;
        BpfArray::<_, u32>::try_from(ebpf.map_mut("MODE").context("MODE")?)?.set(0, mode, 0)?;
        let mut allowed =
            BpfHashMap::<_, Allowed, u8>::try_from(ebpf.map_mut("ALLOWED").context("ALLOWED")?)?;
        let allowance = |source: Ipv4Addr, port: u16| Allowed {
            source: u32::from_ne_bytes(source.octets()),
            destination: u32::from_ne_bytes(self.server_ip.octets()),
            port,
            _pad: 0,
        };
        allowed.insert(allowance(self.client_ip, ALLOWED_PORT), 1, 0)?;
        for i in 0..VERDICT_ALLOWANCES {
            // Other sources on the allowed port: none of them is the client.
            let other = Ipv4Addr::from(0x0b00_0000 + i);
            allowed.insert(allowance(other, ALLOWED_PORT), 1, 0)?;
        }
        let mut programs = vec![("verdict_to_pod", TcAttachType::Egress)];
        if mode == 1 {
            programs.push(("verdict_from_pod", TcAttachType::Ingress));
        }
        for (name, _) in &programs {
            let program: &mut SchedClassifier = ebpf
                .program_mut(name)
                .context("the verdict program")?
                .try_into()?;
            program.load()?;
        }
        // Attached from the node namespace: the veth's name means something only there.
        self.in_node(|| -> Result<()> {
            // Kernels before 6.6 attach through a clsact qdisc (already there is fine).
            let _ = aya::programs::tc::qdisc_add_clsact(SERVER_VETH);
            for (name, attach) in programs {
                let program: &mut SchedClassifier = ebpf
                    .program_mut(name)
                    .context("the verdict program")?
                    .try_into()?;
                program
                    .attach(SERVER_VETH, attach)
                    .with_context(|| format!("attaching {name} to {SERVER_VETH}"))?;
            }
            Ok(())
        })??;
        Ok(ebpf)
    }

    /// A drop in front of the enforcement table (see `deny_cost`), or none.
    fn set_drop(&self, drop: Option<DropArm>) -> Result<()> {
        self.in_node(|| -> Result<()> {
            let Some(drop) = drop else {
                return remove_table(DROP_TABLE);
            };
            let notrack = match drop {
                DropArm::Bare => {
                    "  chain raw {\n    type filter hook prerouting priority raw; policy accept;\n    \
                     notrack\n  }\n"
                }
                DropArm::AfterConntrack => "",
            };
            nft::apply(&format!(
                "table inet {DROP_TABLE} {{}}\ndelete table inet {DROP_TABLE}\n\
                 table inet {DROP_TABLE} {{\n{notrack}  chain forward {{\n    type filter hook forward \
                 priority filter - 10; policy drop;\n  }}\n}}\n"
            ))?;
            Ok(())
        })?
    }
}

/// The drops of the deny measurement's reference arms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DropArm {
    /// `notrack` and drop: no conntrack, no rules.
    Bare,
    /// Drop after conntrack made its entry, before the rules.
    AfterConntrack,
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in [&self.client, &self.node, &self.server] {
            let _ = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Removes table `name` of the calling thread's namespace, if there (`nft::clear` asks `nft list
/// tables` first, which lists the whole ruleset: a second with the enforcement table).
fn remove_table(name: &str) -> Result<()> {
    nft::apply(&format!(
        "table inet {name} {{}}\ndelete table inet {name}\n"
    ))?;
    Ok(())
}

/// Removes `neenf<pid>?` namespaces whose bench process is gone (a run killed hard).
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name
            .strip_prefix("neenf")
            .and_then(|rest| rest.strip_suffix(['c', 'n', 's']))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

fn sh(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    ensure!(
        out.status.success(),
        "`{program} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Moves the calling thread into the named network namespace.
fn enter(netns: &str) -> Result<()> {
    let file = std::fs::File::open(format!("/run/netns/{netns}"))
        .with_context(|| format!("opening network namespace {netns}"))?;
    // SAFETY: a valid namespace file descriptor; setns only affects this thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error()).context("setns");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 1. Connections.

/// An echo server in the server pod: accept, read, write it back, close.
struct EchoServer {
    listener: Arc<TcpListener>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    fn start(net: &Topology, ip: Ipv4Addr) -> Result<Self> {
        let server = net.server.clone();
        let listener = std::thread::spawn(move || -> Result<TcpListener> {
            enter(&server)?;
            Ok(TcpListener::bind(SocketAddr::from((ip, ALLOWED_PORT)))?)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("binding the echo server panicked"))??;
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..SERVER_THREADS)
            .map(|_| {
                let (listener, stop) = (listener.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while !stop.load(Ordering::Relaxed) {
                        let Ok((mut stream, _)) = listener.accept() else {
                            continue;
                        };
                        if let Ok(n) = stream.read(&mut buf)
                            && n > 0
                        {
                            let _ = stream.write_all(&buf[..n]);
                        }
                    }
                })
            })
            .collect();
        Ok(Self {
            listener,
            stop,
            threads,
        })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes every thread blocked in accept (EINVAL on a shut-down listener).
        // SAFETY: a valid socket owned by `listener`.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        for t in self.threads {
            let _ = t.join();
        }
    }
}

struct Load {
    ok: u64,
    failed: u64,
    secs: f64,
    /// CPU time of this process (clients, servers, and the forwarding softirqs they ran).
    cpu_secs: f64,
}

impl Load {
    fn rate(&self) -> f64 {
        self.ok as f64 / self.secs
    }

    fn per_cpu_second(&self) -> f64 {
        self.ok as f64 / self.cpu_secs
    }
}

/// [`CLIENT_THREADS`] clients in the client pod for `length`.
fn connections(net: &Topology, target: SocketAddr, length: Duration) -> Result<Load> {
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    let threads: Vec<_> = (0..CLIENT_THREADS)
        .map(|_| {
            let (client, stop, ok, failed, ready) = (
                net.client.clone(),
                stop.clone(),
                ok.clone(),
                failed.clone(),
                ready_tx.clone(),
            );
            std::thread::spawn(move || {
                if let Err(e) = enter(&client) {
                    let _ = ready.send(Err(e));
                    return;
                }
                let _ = ready.send(Ok(()));
                let mut buf = [0u8; 16];
                while !stop.load(Ordering::Relaxed) {
                    match one_connection(target, &mut buf) {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect();
    for _ in 0..CLIENT_THREADS {
        ready_rx.recv().context("a client thread died")??;
    }
    let started = Instant::now();
    let cpu = process_cpu_ns();
    std::thread::sleep(length);
    stop.store(true, Ordering::Relaxed);
    let secs = started.elapsed().as_secs_f64();
    for t in threads {
        let _ = t.join();
    }
    Ok(Load {
        ok: ok.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        secs,
        cpu_secs: (process_cpu_ns() - cpu) / 1e9,
    })
}

/// Fails unless `arm`'s verdict drops a SYN to [`DENIED_PORT`] and lets the allowed port connect.
fn check_verdict(net: &Topology, server: Ipv4Addr, arm: Arm) -> Result<()> {
    let client = net.client.clone();
    std::thread::scope(|scope| {
        scope
            .spawn(|| -> Result<()> {
                enter(&client)?;
                let denied = SocketAddr::from((server, DENIED_PORT));
                match TcpStream::connect_timeout(&denied, Duration::from_millis(300)) {
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                    other => bail!(
                        "{}: a SYN to the denied port was not dropped: {other:?}",
                        arm.name()
                    ),
                }
                one_connection(SocketAddr::from((server, ALLOWED_PORT)), &mut [0u8; 16])
                    .with_context(|| format!("{}: the allowed port", arm.name()))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the verdict check panicked"))?
    })
}

fn one_connection(target: SocketAddr, buf: &mut [u8; 16]) -> std::io::Result<()> {
    let mut stream = TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.write_all(b"network-enforcer")?;
    stream.read_exact(buf)?;
    // Close with RST: neither end keeps the connection in TIME_WAIT (the ports would run out).
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a `struct linger`.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 4. Denied SYNs.

struct DenyCost {
    /// CPU ns per SYN of the sending thread, per round, for the arms bare, after conntrack, enforced.
    cpu_ns: [Vec<f64>; 3],
    /// Wall ns per SYN, likewise.
    wall_ns: [Vec<f64>; 3],
    chain_rules: usize,
    nflog_read: u64,
}

fn deny_cost(
    net: &Topology,
    client: Ipv4Addr,
    server: Ipv4Addr,
    (chain, chain_rules): &(String, usize),
) -> Result<DenyCost> {
    // The agent's NFLOG reader, bound in the node namespace for the whole measurement.
    let reader_stop = Arc::new(AtomicBool::new(false));
    let read = Arc::new(AtomicU64::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    let reader = {
        let (node, stop, read) = (net.node.clone(), reader_stop.clone(), read.clone());
        std::thread::spawn(move || {
            let run = || -> Result<()> {
                enter(&node)?;
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async {
                    let mut nflog = network_enforcer_agent::enforce::nflog::spawn(
                        LOG_GROUP,
                        &Default::default(),
                    )?;
                    let _ = ready_tx.send(Ok(()));
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(Some(_)) =
                            tokio::time::timeout(Duration::from_millis(50), nflog.denied.recv())
                                .await
                        {
                            read.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok::<_, anyhow::Error>(())
                })
            };
            if let Err(e) = run() {
                let _ = ready_tx.send(Err(e));
            }
        })
    };
    ready_rx.recv().context("the NFLOG reader died")??;

    let mut cost = DenyCost {
        cpu_ns: Default::default(),
        wall_ns: Default::default(),
        chain_rules: *chain_rules,
        nflog_read: 0,
    };
    let arms = [Some(DropArm::Bare), Some(DropArm::AfterConntrack), None];
    let mut sport_base = 0u32;
    // Only the enforced arm's SYNs may reach the chain's drop, and (nearly) all of them must.
    let before = net.in_node(|| chain_drops(chain))??;
    let result = (|| -> Result<()> {
        for round in 0..DENY_ROUNDS {
            for i in 0..arms.len() {
                let k = (i + round) % arms.len();
                net.set_drop(arms[k])?;
                let (cpu, wall) = send_syns(net, client, server, sport_base)?;
                sport_base = sport_base.wrapping_add(SYNS_PER_ROUND);
                let n = f64::from(SYNS_PER_ROUND);
                cost.cpu_ns[k].push(cpu / n);
                cost.wall_ns[k].push(wall / n);
            }
            println!(
                "    round {}/{DENY_ROUNDS}: CPU per SYN {:.0} ns enforced, {:.0} ns dropped after \
                 conntrack, {:.0} ns bare drop",
                round + 1,
                cost.cpu_ns[2][round],
                cost.cpu_ns[1][round],
                cost.cpu_ns[0][round]
            );
        }
        net.set_drop(None)?;
        let counted = net.in_node(|| chain_drops(chain))?? - before;
        let sent = u64::from(SYNS_PER_ROUND) * DENY_ROUNDS as u64;
        ensure!(
            counted >= sent * 99 / 100 && counted <= sent,
            "{counted} SYNs reached {chain}'s drop; the enforced arm sent {sent}"
        );
        Ok(())
    })();
    reader_stop.store(true, Ordering::Relaxed);
    let _ = reader.join();
    result?;
    cost.nflog_read = read.load(Ordering::Relaxed);
    println!("    the NFLOG reader got {} denials", cost.nflog_read);
    Ok(cost)
}

/// The packets counted by the drop rule of `chain` (in the node namespace).
fn chain_drops(chain: &str) -> Result<u64> {
    let out = Command::new("nft")
        .args(["list", "chain", "inet", TABLE, chain])
        .output()?;
    ensure!(out.status.success(), "nft list chain {chain} failed");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter(|l| l.contains("drop"))
        .find_map(|l| {
            l.split("counter packets ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .context("no counter on the chain's drop rule")
}

/// Sends [`SYNS_PER_ROUND`] SYNs from the client pod to the denied port of the server pod; returns
/// the sending thread's CPU time and the wall time, in ns.
fn send_syns(
    net: &Topology,
    client: Ipv4Addr,
    server: Ipv4Addr,
    sport_base: u32,
) -> Result<(f64, f64)> {
    let ns = net.client.clone();
    std::thread::spawn(move || -> Result<(f64, f64)> {
        enter(&ns)?;
        // SAFETY: plain socket call; the descriptor is owned right away.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_TCP) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context("raw socket");
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(server).to_be(),
            },
            sin_zero: [0; 8],
        };
        let mut packet = [0u8; 20];
        let send = |packet: &[u8; 20]| {
            // SAFETY: valid buffer, address and lengths.
            unsafe {
                libc::sendto(
                    fd.as_raw_fd(),
                    packet.as_ptr().cast(),
                    packet.len(),
                    0,
                    (&to as *const libc::sockaddr_in).cast(),
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                )
            }
        };
        let cpu0 = thread_cpu_ns();
        let wall0 = Instant::now();
        for i in 0..SYNS_PER_ROUND {
            let sport = 1024 + ((sport_base.wrapping_add(i)) % 64_000) as u16;
            syn(&mut packet, client, server, sport, DENIED_PORT, i);
            if send(&packet) < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::ENOBUFS) {
                    return Err(e).context("sending a SYN");
                }
            }
        }
        let wall = wall0.elapsed().as_nanos() as f64;
        let cpu = thread_cpu_ns() - cpu0;
        Ok((cpu, wall))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the SYN sender panicked"))?
}

/// A TCP SYN header (no options) with its checksum.
fn syn(out: &mut [u8; 20], src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, seq: u32) {
    out.fill(0);
    out[0..2].copy_from_slice(&sport.to_be_bytes());
    out[2..4].copy_from_slice(&dport.to_be_bytes());
    out[4..8].copy_from_slice(&seq.wrapping_mul(2_654_435_761).to_be_bytes());
    out[12] = 5 << 4; // data offset: 5 words
    out[13] = 0x02; // SYN
    out[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    let mut sum: u32 = 0;
    for chunk in src.octets().chunks(2).chain(dst.octets().chunks(2)) {
        sum += u32::from(u16::from_be_bytes([chunk[0], chunk[1]]));
    }
    sum += u32::from(libc::IPPROTO_TCP as u16) + 20;
    for chunk in out.chunks(2) {
        sum += u32::from(u16::from_be_bytes([chunk[0], chunk[1]]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    out[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

fn process_cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

fn thread_cpu_ns() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 * 1e9 + ts.tv_nsec as f64
}

// ---------------------------------------------------------------------------------------------
// 3. Memory.

/// The child: builds and holds the enforcement state, says `ready`, waits for stdin to close.
fn rss_child() {
    let cluster = synthesize();
    let ruleset = compile(&cluster, NODE);
    let script = nft::render(&ruleset, TABLE, Some(LOG_GROUP));
    // For a look at what the node gets: `NE_ENFORCE_BENCH_SCRIPT=<file>` keeps a copy.
    if let Some(path) = std::env::var_os("NE_ENFORCE_BENCH_SCRIPT") {
        let _ = std::fs::write(path, &script);
    }
    println!(
        "ready {} {} {}",
        cluster.pods.len(),
        ruleset.pods.len(),
        script.len()
    );
    let _ = std::io::stdout().flush();
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
    std::hint::black_box((&cluster, &ruleset, &script));
}

/// `(VmRSS, VmHWM)` in MiB of the child while it holds the state.
fn child_rss() -> Result<(f64, f64)> {
    let mut child = Command::new(std::env::current_exe()?)
        .env(CHILD_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the memory child")?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().context("child stdout")?).read_line(&mut line)?;
    ensure!(line.starts_with("ready"), "the memory child said {line:?}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()))?;
    drop(child.stdin.take());
    let _ = child.wait();
    let field = |name: &str| -> Result<f64> {
        let kib: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .with_context(|| format!("no {name} in /proc/<pid>/status"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()?;
        Ok(kib / 1024.0)
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

// ---------------------------------------------------------------------------------------------
// Statistics.

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

fn median(values: &[f64]) -> f64 {
    percentile(values, 50.0)
}

/// Nearest-rank percentile.
fn percentile(values: &[f64], p: f64) -> f64 {
    let v = sorted(values);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn min(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// (max - min) / median.
fn spread(values: &[f64]) -> f64 {
    (max(values) - min(values)) / median(values)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn round_all(values: &[f64]) -> Vec<f64> {
    values.iter().map(|v| v.round()).collect()
}
