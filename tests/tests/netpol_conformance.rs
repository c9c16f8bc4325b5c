//! NetworkPolicy conformance with real packets: the agent's enforcement (`agent.enforcement.mode:
//! networkpolicy`) against the cases of Kubernetes' own "Netpol" e2e suite, re-written here from its
//! descriptions, and `network-enforcer-controller check` as a differential on every probe.
//!
//! Namespaces x, y, z with pods a, b, c each serving TCP and UDP on ports 80 and 81; every case applies
//! its policies, then the whole truth table (every pod to every other pod, each port and protocol, 288
//! real connection attempts) is probed until it equals the case's expectation (bounded), `check` must
//! predict the same verdict as the kernel gave on every probe, and the case is undone. A few cases run
//! a second time with every probe to the destination's Service ClusterIP. The harness is in
//! `network_enforcer_tests::netpol`. Needs root, `cargo xtask setup` and the debug binaries (`cargo
//! test --workspace` builds them). About 4 minutes on the 2-core test machine, uninstall included.
//!
//! Undoing a case (policies deleted, labels restored) is seen to take effect: by the next case's own
//! table when it differs from this case's last one, by an explicit all-allowed table otherwise, after
//! a failed case and after the last case.
//!
//! Knobs for iterating: `NE_NETPOL_CASES=word,word` runs only the cases whose name contains one of the
//! words; `NE_NETPOL_WAIT_SECONDS` (default 30) bounds each step; `NE_NETPOL_MAX_FAILED_CASES`
//! (default 5) stops early when enforcement is plainly missing (each failing step costs the whole
//! wait); `NE_NETPOL_ENFORCEMENT=none` installs with the chart's default (no enforcement), to see the
//! suite fail; `NE_NETPOL_DRY=1` probes nothing and compares `check` with the cases' expectations only
//! (for writing cases; never a pass).

use anyhow::{Context, Result, bail};
use network_enforcer_tests::e2e::release::{self, Release};
use network_enforcer_tests::fixture;
use network_enforcer_tests::netpol::table::Protocol::{Tcp, Udp};
use network_enforcer_tests::netpol::table::{Probe, Table};
use network_enforcer_tests::netpol::{Action, Case, NAME_LABEL, Pods, Runner, Step, Via};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The agent serves metrics on the node (host network): a port no other test's release uses.
const METRICS_PORT: u16 = 19_470;

#[test]
fn networkpolicies_are_enforced_on_real_packets_as_upstream_conformance_and_check_predict()
-> Result<()> {
    let total = Instant::now();
    let cluster = fixture::cluster_with_crds()?;
    release::images_from_debug_build()?;
    let mut values = vec![format!("agent.metricsPort={METRICS_PORT}")];
    match std::env::var("NE_NETPOL_ENFORCEMENT").as_deref() {
        Ok("none") => {
            eprintln!("[netpol] NE_NETPOL_ENFORCEMENT=none: installing without enforcement")
        }
        Ok(mode) => values.push(format!("agent.enforcement.mode={mode}")),
        Err(_) => values.push("agent.enforcement.mode=networkpolicy".into()),
    }
    let release = Release::install(
        &cluster.kubeconfig,
        "ne-netpol",
        "ne-netpol-system",
        &values,
    )?;
    let installed = total.elapsed();
    let mut pods = Pods::create(&cluster.kubeconfig, &release::debug_binary("controller"))?;
    let end_port_kept = api_server_keeps_end_port(&pods)?;
    let cases = selected(cases(&pods, end_port_kept))?;
    let setup = total.elapsed();
    eprintln!(
        "[netpol] release installed in {:.1}s, pods running after {:.1}s; {} cases",
        installed.as_secs_f64(),
        setup.as_secs_f64(),
        cases.len()
    );

    let wait = Duration::from_secs(env_number("NE_NETPOL_WAIT_SECONDS", 30)?);
    let max_failed = env_number("NE_NETPOL_MAX_FAILED_CASES", 5)? as usize;
    let mut runner = Runner::new(&mut pods, wait);
    let dry = std::env::var("NE_NETPOL_DRY").is_ok_and(|v| v == "1");
    runner.dry = dry;
    // Every server answers before any policy exists: a blocked probe later means a policy.
    runner
        .wait_for_all_allowed("before the first case")
        .map_err(|e| e.context(release.describe()))?;
    let mut outcomes = Vec::new();
    // Run into a block so that a harness error (the undoing of a case not taking effect, kubectl
    // failing for good) still prints the cases so far.
    let ran = (|| -> Result<()> {
        for (i, case) in cases.iter().enumerate() {
            eprintln!("[netpol] case {}/{}: {}", i + 1, cases.len(), case.name);
            let outcome = runner.run(case, cases.get(i + 1))?;
            eprintln!(
                "[netpol]   {} in {:.1}s",
                if outcome.failures.is_empty() {
                    "passed"
                } else {
                    "FAILED"
                },
                outcome.elapsed.as_secs_f64()
            );
            for failure in &outcome.failures {
                eprintln!("{failure}");
            }
            outcomes.push(outcome);
            if outcomes.iter().filter(|o| !o.failures.is_empty()).count() >= max_failed {
                eprintln!("[netpol] {max_failed} cases failed: stopping here");
                break;
            }
        }
        // The last case's undoing, checked like every other.
        runner.wait_for_all_allowed("after the last case")
    })();
    drop(runner);

    let failed: Vec<_> = outcomes.iter().filter(|o| !o.failures.is_empty()).collect();
    eprintln!("[netpol] time per case:");
    for o in &outcomes {
        eprintln!(
            "  {:>5.1}s {} {}",
            o.elapsed.as_secs_f64(),
            if o.failures.is_empty() {
                "pass"
            } else {
                "FAIL"
            },
            o.name
        );
    }
    let cases_time: Duration = outcomes.iter().map(|o| o.elapsed).sum();
    eprintln!(
        "[netpol] {} of {} cases run, {} failed; setup {:.1}s, cases {:.1}s, total {:.1}s",
        outcomes.len(),
        cases.len(),
        failed.len(),
        setup.as_secs_f64(),
        cases_time.as_secs_f64(),
        total.elapsed().as_secs_f64()
    );
    ran.map_err(|e| e.context(release.describe()))?;
    if !failed.is_empty() {
        // The tables were printed as each case failed; this is the summary CI shows last.
        let report: Vec<String> = failed
            .iter()
            .map(|o| {
                let first_lines: Vec<&str> =
                    o.failures.iter().flat_map(|f| f.lines().take(1)).collect();
                format!("  {}: {}", o.name, first_lines.join("; "))
            })
            .collect();
        bail!(
            "{} of {} cases failed (truth tables above):\n{}\n{}",
            failed.len(),
            outcomes.len(),
            report.join("\n"),
            release.describe()
        );
    }
    if dry {
        bail!(
            "NE_NETPOL_DRY=1: check agrees with every expectation, but nothing was probed: not a pass"
        );
    }
    if outcomes.len() < cases.len() {
        bail!("only {} of {} cases ran", outcomes.len(), cases.len());
    }
    drop(pods);
    release.uninstall()
}

fn env_number(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}={v:?}")),
        Err(_) => Ok(default),
    }
}

/// The cases `NE_NETPOL_CASES` names (all without it).
fn selected(cases: Vec<Case>) -> Result<Vec<Case>> {
    let Ok(filter) = std::env::var("NE_NETPOL_CASES") else {
        return Ok(cases);
    };
    let words: Vec<&str> = filter.split(',').filter(|w| !w.is_empty()).collect();
    let chosen: Vec<Case> = cases
        .into_iter()
        .filter(|c| words.iter().any(|w| c.name.contains(w)))
        .collect();
    if chosen.is_empty() {
        bail!("NE_NETPOL_CASES={filter:?} selects no case");
    }
    Ok(chosen)
}

/// Whether the API server stores a port range's `endPort`: v1.20 (the local cluster) predates the field
/// and drops it silently, so the policy in force covers the start port only, and that is what the
/// endPort case must then see enforced.
fn api_server_keeps_end_port(pods: &Pods) -> Result<bool> {
    let probe = policy(
        "end-port-probe",
        json!({"podSelector": {}, "ingress": [{"ports": [{"port": 80, "endPort": 81}]}]}),
    );
    let stored = pods.dry_run_apply("x", &probe)?;
    let kept = stored["spec"]["ingress"][0]["ports"][0]["endPort"] == json!(81);
    eprintln!(
        "[netpol] the API server {} endPort",
        if kept { "keeps" } else { "drops" }
    );
    Ok(kept)
}

// ---- the cases ----------------------------------------------------------------------------------

/// A NetworkPolicy named `name` with `spec`.
fn policy(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// `podSelector: {matchLabels: {pod: <pod>}}`.
fn pod(pod: &str) -> Value {
    json!({"matchLabels": {"pod": pod}})
}

/// `namespaceSelector: {matchLabels: {ns: <ns>}}` (the logical name label every namespace has).
fn ns(ns: &str) -> Value {
    json!({"matchLabels": {"ns": ns}})
}

fn apply(namespace: &'static str, policy: Value) -> Action {
    Action::Apply(namespace, policy)
}

fn step(what: &str, actions: Vec<Action>, expect: Table) -> Step {
    Step {
        what: what.into(),
        actions,
        expect,
    }
}

/// A case of one step: these policies, this table.
fn case(name: &str, actions: Vec<Action>, expect: Table) -> Case {
    Case {
        name: name.into(),
        steps: vec![step("apply", actions, expect)],
        via: Via::PodIp,
    }
}

fn steps(name: &str, steps: Vec<Step>) -> Case {
    Case {
        name: name.into(),
        steps,
        via: Via::PodIp,
    }
}

fn all() -> Table {
    Table::all(true)
}

/// Traffic into pod `to` (`"x/a"`).
fn into(to: &'static str) -> impl Fn(&Probe) -> bool {
    move |p| p.to.is(to)
}

/// Traffic out of pod `from`.
fn out_of(from: &'static str) -> impl Fn(&Probe) -> bool {
    move |p| p.from.is(from)
}

/// The /24 around the pods (they all get addresses of the node's bridge network).
fn pod_network(ip: &str) -> String {
    let (net, _) = ip.rsplit_once('.').expect("an IPv4 address");
    format!("{net}.0/24")
}

/// These cases again with every probe to the destination's Service ClusterIP: the verdicts must not
/// change (policies apply to the backend pod after kube-proxy's DNAT, ipBlocks included).
const VIA_SERVICES: [&str; 6] = [
    "default-deny-ingress in x",
    "allow traffic only from a different namespace, based on NamespaceSelector",
    "ports: allow from namespace y on port 81 only (TCP by default)",
    "deny egress from all pods in a namespace",
    "egress to a namespace on one named UDP port",
    "egress to a server in a CIDR block",
];

/// The upstream suite's cases, then [`VIA_SERVICES`] through Services, then the
/// ClusterNetworkPolicy cases.
fn cases(pods: &Pods, end_port_kept: bool) -> Vec<Case> {
    let mut cases = pod_ip_cases(pods, end_port_kept);
    for name in VIA_SERVICES {
        let mut case = cases
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no case {name:?} to run through Services"))
            .clone();
        case.name += " (via Services)";
        case.via = Via::Service;
        cases.push(case);
    }
    cases.extend(cluster_cases(pods));
    cases
}

// ---- ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2) --------------------------------
//
// Written from the API reference (network-policy-api v0.2.0): the Admin tier before NetworkPolicies,
// the Baseline tier after them, rules in order, priorities, Accept / Deny / Pass, peers by namespace,
// pod and network, protocols with ports and named ports. Subjects and peers name our namespaces by
// their unique names: the cluster is shared.

/// Our namespaces `logical` (`x`, `y`, `z`) as a namespace selector, by their unique names.
fn ours(pods: &Pods, logical: &[&str]) -> Value {
    let names: Vec<&str> = logical.iter().map(|ns| pods.ns_name(ns)).collect();
    json!({"matchExpressions": [{"key": NAME_LABEL, "operator": "In", "values": names}]})
}

/// A ClusterNetworkPolicy `name` (unique to this run) of `tier` at `priority`, applying to the pods
/// of our namespaces `subject`, with `rules` (`ingress` and/or `egress`).
fn cnp(
    pods: &Pods,
    name: &str,
    tier: &str,
    priority: i32,
    subject: &[&str],
    rules: Value,
) -> Action {
    let mut spec = json!({"tier": tier, "priority": priority,
                          "subject": {"namespaces": ours(pods, subject)}});
    for (key, value) in rules.as_object().expect("ingress and/or egress") {
        spec[key] = value.clone();
    }
    Action::ApplyCluster(json!({
        "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
        "metadata": {"name": format!("{name}-{}", std::process::id())},
        "spec": spec,
    }))
}

fn cluster_cases(pods: &Pods) -> Vec<Case> {
    let from = |logical: &[&str]| json!([{"namespaces": ours(pods, logical)}]);
    let all_ours = ["x", "y", "z"];
    let y_b = json!([{"pods": {"namespaceSelector": ours(pods, &["y"]), "podSelector": pod("b")}}]);
    let net = pod_network(pods.ip("x/a"));
    let y_a = format!("{}/32", pods.ip("y/a"));
    // One Admin policy of x whose ingress rules a case rewrites step by step.
    let x_order = |rules: Value| {
        cnp(
            pods,
            "x-order",
            "Admin",
            10,
            &["x"],
            json!({"ingress": rules}),
        )
    };
    vec![
        case(
            "cnp: an Admin Deny from y into x overrides a NetworkPolicy that allows everything",
            vec![
                apply(
                    "x",
                    policy("allow-all", json!({"podSelector": {}, "ingress": [{}]})),
                ),
                cnp(
                    pods,
                    "deny-y",
                    "Admin",
                    10,
                    &["x"],
                    json!({"ingress": [{"action": "Deny", "from": from(&["y"])}]}),
                ),
            ],
            all().deny(|p| p.from.ns == "y" && p.to.ns == "x"),
        ),
        case(
            "cnp: an Admin Pass skips the tier's later Deny; no NetworkPolicy, so allowed",
            vec![
                cnp(
                    pods,
                    "pass-y-b",
                    "Admin",
                    10,
                    &["x"],
                    json!({"ingress": [{"action": "Pass", "from": y_b}]}),
                ),
                cnp(
                    pods,
                    "deny-ours",
                    "Admin",
                    20,
                    &["x"],
                    json!({"ingress": [{"action": "Deny", "from": from(&all_ours)}]}),
                ),
            ],
            all().deny(|p| p.to.ns == "x" && !p.from.is("y/b")),
        ),
        case(
            "cnp: a Baseline Deny holds where no NetworkPolicy isolates the pod",
            vec![
                apply(
                    "z",
                    policy("allow-a", json!({"podSelector": pod("a"), "ingress": [{}]})),
                ),
                cnp(
                    pods,
                    "floor-z",
                    "Baseline",
                    0,
                    &["z"],
                    json!({"ingress": [{"action": "Deny", "from": from(&all_ours)}]}),
                ),
            ],
            all().deny(|p| p.to.ns == "z" && !p.to.is("z/a")),
        ),
        case(
            "cnp: egress rules in order; networks match pod addresses",
            vec![cnp(
                pods,
                "x-out",
                "Admin",
                10,
                &["x"],
                json!({"egress": [
                    {"action": "Accept", "to": [{"networks": [y_a]}]},
                    {"action": "Deny", "to": [{"networks": [net]}]}
                ]}),
            )],
            all().deny(|p| p.from.ns == "x" && !p.to.is("y/a")),
        ),
        case(
            "cnp: protocols: a Deny on UDP 81 and on the named port serve-80-tcp",
            vec![cnp(
                pods,
                "z-ports",
                "Admin",
                10,
                &["z"],
                json!({"ingress": [{"action": "Deny", "from": from(&all_ours), "protocols": [
                    {"udp": {"destinationPort": {"number": 81}}},
                    {"destinationNamedPort": "serve-80-tcp"}
                ]}]}),
            )],
            all().deny(|p| p.to.ns == "z" && (p.on(Udp, 81) || p.on(Tcp, 80))),
        ),
        steps(
            "cnp: rules reordered and actions changed on the fly",
            vec![
                step(
                    "accept y, then deny ours",
                    vec![x_order(json!([
                        {"action": "Accept", "from": from(&["y"])},
                        {"action": "Deny", "from": from(&all_ours)}
                    ]))],
                    all().deny(|p| p.to.ns == "x" && p.from.ns != "y"),
                ),
                step(
                    "deny ours first",
                    vec![x_order(json!([
                        {"action": "Deny", "from": from(&all_ours)},
                        {"action": "Accept", "from": from(&["y"])}
                    ]))],
                    all().deny(|p| p.to.ns == "x"),
                ),
                step(
                    "pass instead of deny",
                    vec![x_order(
                        json!([{"action": "Pass", "from": from(&all_ours)}]),
                    )],
                    all(),
                ),
            ],
        ),
    ]
}

/// The upstream suite's cases, by its descriptions; the server is x/a unless a case says otherwise.
fn pod_ip_cases(pods: &Pods, end_port_kept: bool) -> Vec<Case> {
    let ip = |p: &str| format!("{}/32", pods.ip(p));
    let net = pod_network(pods.ip("x/a"));
    for other in pods.ips() {
        assert_eq!(pod_network(other), net, "pods outside one /24");
    }
    let y_name = pods.ns_name("y").to_string();
    let ingress = json!(["Ingress"]);
    let egress = json!(["Egress"]);
    let both = json!(["Ingress", "Egress"]);
    let deny_x_a = || {
        apply(
            "x",
            policy(
                "deny-x-a",
                json!({"podSelector": pod("a"), "policyTypes": ingress}),
            ),
        )
    };

    vec![
        case(
            "default-deny-ingress in x",
            vec![apply(
                "x",
                policy(
                    "deny-ingress",
                    json!({"podSelector": {}, "policyTypes": ingress}),
                ),
            )],
            all().deny(|p| p.to.ns == "x"),
        ),
        case(
            "default-deny-all (ingress and egress) in x",
            vec![apply(
                "x",
                policy("deny-all", json!({"podSelector": {}, "policyTypes": both})),
            )],
            all().deny(|p| p.to.ns == "x" || p.from.ns == "x"),
        ),
        case(
            "allow traffic from pods within the server namespace based on PodSelector",
            vec![apply(
                "x",
                policy(
                    "allow-x-b",
                    json!({"podSelector": pod("a"), "policyTypes": ingress,
                           "ingress": [{"from": [{"podSelector": pod("b")}]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && p.from.is("x/b")),
        ),
        case(
            "allow all ingress to a target in a default-deny namespace",
            vec![
                apply(
                    "x",
                    policy(
                        "deny-ingress",
                        json!({"podSelector": {}, "policyTypes": ingress}),
                    ),
                ),
                apply(
                    "x",
                    policy(
                        "allow-all-to-a",
                        json!({"podSelector": pod("a"), "ingress": [{}]}),
                    ),
                ),
            ],
            all().deny(|p| p.to.ns == "x" && !p.to.is("x/a")),
        ),
        steps(
            "allow ingress from pods in all namespaces",
            vec![
                step("deny x/a", vec![deny_x_a()], all().deny(into("x/a"))),
                step(
                    "allow from every namespace",
                    vec![apply(
                        "x",
                        policy(
                            "allow-all-namespaces",
                            json!({"podSelector": pod("a"),
                                   "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
                        ),
                    )],
                    all(),
                ),
            ],
        ),
        case(
            "allow ingress only from the same namespace (empty podSelector peer)",
            vec![apply(
                "x",
                policy(
                    "allow-same-namespace",
                    json!({"podSelector": pod("a"),
                           "ingress": [{"from": [{"podSelector": {}}]}]}),
                ),
            )],
            all().deny(|p| p.to.is("x/a") && p.from.ns != "x"),
        ),
        case(
            "deny ingress from pods in other namespaces (whole namespace)",
            vec![apply(
                "x",
                policy(
                    "deny-other-namespaces",
                    json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {}}]}]}),
                ),
            )],
            all().deny(|p| p.to.ns == "x" && p.from.ns != "x"),
        ),
        case(
            "allow traffic only from a different namespace, based on NamespaceSelector",
            vec![apply(
                "x",
                policy(
                    "allow-ns-y",
                    json!({"podSelector": pod("a"),
                           "ingress": [{"from": [{"namespaceSelector": ns("y")}]}]}),
                ),
            )],
            all().deny(|p| p.to.is("x/a") && p.from.ns != "y"),
        ),
        case(
            "PodSelector with MatchExpressions",
            vec![apply(
                "x",
                policy(
                    "pod-expressions",
                    json!({"podSelector": pod("a"), "ingress": [{"from": [{"podSelector":
                        {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b"]}]}}]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && p.from.is("x/b")),
        ),
        case(
            "NamespaceSelector with MatchExpressions",
            vec![apply(
                "x",
                policy(
                    "ns-expressions",
                    json!({"podSelector": pod("a"), "ingress": [{"from": [{"namespaceSelector":
                        {"matchExpressions": [{"key": "ns", "operator": "In", "values": ["y"]}]}}]}]}),
                ),
            )],
            all().deny(|p| p.to.is("x/a") && p.from.ns != "y"),
        ),
        case(
            "PodSelector or NamespaceSelector (separate peers are a union)",
            vec![apply(
                "x",
                policy(
                    "pod-or-ns",
                    json!({"podSelector": pod("a"), "ingress": [{"from": [
                        {"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]}},
                        {"podSelector": pod("b")},
                    ]}]}),
                ),
            )],
            all().deny(|p| p.to.is("x/a") && p.from.ns == "x" && !p.from.is("x/b")),
        ),
        case(
            "PodSelector and NamespaceSelector (one peer is an intersection)",
            vec![apply(
                "x",
                policy(
                    "pod-and-ns",
                    json!({"podSelector": pod("a"), "ingress": [{"from": [
                        {"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]},
                         "podSelector": pod("b")},
                    ]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && p.from.ns != "x" && p.from.pod == "b"),
        ),
        case(
            "multiple PodSelectors and NamespaceSelectors in one peer",
            vec![apply(
                "x",
                policy(
                    "pods-and-namespaces",
                    json!({"podSelector": pod("a"), "ingress": [{"from": [
                        {"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x"]}]},
                         "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["b", "c"]}]}},
                    ]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && p.from.ns != "x" && p.from.pod != "a"),
        ),
        case(
            "any of several PodSelectors",
            vec![apply(
                "x",
                policy(
                    "any-pods",
                    json!({"podSelector": pod("a"), "ingress": [{"from": [
                        {"podSelector": pod("b")}, {"podSelector": pod("c")},
                    ]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && (p.from.is("x/b") || p.from.is("x/c"))),
        ),
        case(
            "allow only from one pod of a different namespace (PodSelector and NamespaceSelector)",
            vec![apply(
                "x",
                policy(
                    "allow-y-a",
                    json!({"podSelector": pod("a"), "ingress": [{"from": [
                        {"namespaceSelector": ns("y"), "podSelector": pod("a")},
                    ]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && p.from.is("y/a")),
        ),
        case(
            "NamespaceSelector with the default namespace name label",
            vec![apply(
                "x",
                policy(
                    "allow-ns-y-by-name",
                    json!({"podSelector": pod("a"), "ingress": [{"from": [
                        {"namespaceSelector": {"matchLabels": {NAME_LABEL: y_name}}},
                    ]}]}),
                ),
            )],
            all().deny(|p| p.to.is("x/a") && p.from.ns != "y"),
        ),
        case(
            "NamespaceSelector MatchExpressions on the default name label",
            vec![apply(
                "x",
                policy(
                    "not-ns-y-by-name",
                    json!({"podSelector": pod("a"), "ingress": [{"from": [
                        {"namespaceSelector": {"matchExpressions": [
                            {"key": NAME_LABEL, "operator": "NotIn", "values": [y_name]}]}},
                    ]}]}),
                ),
            )],
            all().deny(|p| p.to.is("x/a") && p.from.ns == "y"),
        ),
        case(
            "ports: allow from namespace y on port 81 only (TCP by default)",
            vec![apply(
                "x",
                policy(
                    "allow-y-81",
                    json!({"podSelector": pod("a"), "ingress": [{
                        "from": [{"namespaceSelector": ns("y")}], "ports": [{"port": 81}]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && p.from.ns == "y" && p.on(Tcp, 81)),
        ),
        steps(
            "multiple stacked policies with overlapping podSelectors",
            vec![
                step(
                    "port 80 from y",
                    vec![apply(
                        "x",
                        policy(
                            "allow-y-80",
                            json!({"podSelector": pod("a"), "ingress": [{
                                "from": [{"namespaceSelector": ns("y")}], "ports": [{"port": 80}]}]}),
                        ),
                    )],
                    all()
                        .deny(into("x/a"))
                        .allow(|p| p.to.is("x/a") && p.from.ns == "y" && p.on(Tcp, 80)),
                ),
                step(
                    "and port 81 from y, by a second policy",
                    vec![apply(
                        "x",
                        policy(
                            "allow-y-81",
                            json!({"podSelector": {"matchExpressions": [
                                    {"key": "pod", "operator": "In", "values": ["a", "b"]}]},
                                   "ingress": [{"from": [{"namespaceSelector": ns("y")}],
                                                "ports": [{"port": 81}]}]}),
                        ),
                    )],
                    all()
                        .deny(|p| p.to.is("x/a") || p.to.is("x/b"))
                        .allow(|p| p.to.is("x/a") && p.from.ns == "y" && p.protocol == Tcp)
                        .allow(|p| p.to.is("x/b") && p.from.ns == "y" && p.on(Tcp, 81)),
                ),
            ],
        ),
        steps(
            "allow-all ingress in a namespace that also has default-deny",
            vec![
                step(
                    "default-deny-ingress",
                    vec![apply(
                        "x",
                        policy(
                            "deny-ingress",
                            json!({"podSelector": {}, "policyTypes": ingress}),
                        ),
                    )],
                    all().deny(|p| p.to.ns == "x"),
                ),
                step(
                    "add allow-all",
                    vec![apply(
                        "x",
                        policy("allow-all", json!({"podSelector": {}, "ingress": [{}]})),
                    )],
                    all(),
                ),
            ],
        ),
        case(
            "allow ingress on one named port",
            vec![apply(
                "x",
                policy(
                    "named-port",
                    json!({"podSelector": pod("a"), "ingress": [{"ports": [{"port": "serve-80-tcp"}]}]}),
                ),
            )],
            all().deny(|p| p.to.is("x/a") && !p.on(Tcp, 80)),
        ),
        case(
            "allow ingress on one named UDP port",
            vec![apply(
                "x",
                policy(
                    "named-udp-port",
                    json!({"podSelector": pod("a"), "ingress": [{
                        "ports": [{"port": "serve-81-udp", "protocol": "UDP"}]}]}),
                ),
            )],
            all().deny(|p| p.to.is("x/a") && !p.on(Udp, 81)),
        ),
        case(
            "allow ingress from a namespace on one named port",
            vec![apply(
                "x",
                policy(
                    "ns-named-port",
                    json!({"podSelector": pod("a"), "ingress": [{
                        "from": [{"namespaceSelector": ns("y")}],
                        "ports": [{"port": "serve-80-tcp"}]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && p.from.ns == "y" && p.on(Tcp, 80)),
        ),
        case(
            "allow egress on one named port",
            vec![apply(
                "x",
                policy(
                    "egress-named-port",
                    json!({"podSelector": pod("a"), "policyTypes": egress,
                           "egress": [{"ports": [{"port": "serve-81-tcp"}]}]}),
                ),
            )],
            all().deny(|p| p.from.is("x/a") && !p.on(Tcp, 81)),
        ),
        case(
            "a named port that no destination pod declares matches nothing",
            vec![apply(
                "x",
                policy(
                    "unknown-named-port",
                    json!({"podSelector": pod("a"), "ingress": [{"ports": [{"port": "serve-99-tcp"}]}]}),
                ),
            )],
            all().deny(into("x/a")),
        ),
        steps(
            "updated policy selects another pod: the old target opens, the new one is isolated",
            vec![
                step(
                    "isolate x/a",
                    vec![apply(
                        "x",
                        policy(
                            "isolate",
                            json!({"podSelector": pod("a"), "policyTypes": ingress}),
                        ),
                    )],
                    all().deny(into("x/a")),
                ),
                step(
                    "the same policy now selects x/c",
                    vec![apply(
                        "x",
                        policy(
                            "isolate",
                            json!({"podSelector": pod("c"), "policyTypes": ingress}),
                        ),
                    )],
                    all().deny(into("x/c")),
                ),
            ],
        ),
        steps(
            "PodSelector DoesNotExist follows a label change on the peer",
            vec![
                step(
                    "peers without a pod2 label, in x",
                    vec![apply(
                        "x",
                        policy(
                            "no-pod2",
                            json!({"podSelector": pod("a"), "ingress": [{"from": [{"podSelector":
                                {"matchExpressions": [{"key": "pod2", "operator": "DoesNotExist"}]}}]}]}),
                        ),
                    )],
                    all().deny(|p| p.to.is("x/a") && p.from.ns != "x"),
                ),
                step(
                    "label x/b pod2=set",
                    vec![Action::LabelPod(
                        "x/b".into(),
                        "pod2".into(),
                        Some("set".into()),
                    )],
                    all().deny(|p| p.to.is("x/a") && !p.from.is("x/c")),
                ),
            ],
        ),
        case(
            "NamespaceSelector Exists selects every namespace with the label",
            vec![
                deny_x_a(),
                apply(
                    "x",
                    policy(
                        "ns-exists",
                        json!({"podSelector": pod("a"), "ingress": [{"from": [{"namespaceSelector":
                            {"matchExpressions": [{"key": "ns", "operator": "Exists"}]},
                            "podSelector": pod("c")}]}]}),
                    ),
                ),
            ],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && p.from.pod == "c"),
        ),
        steps(
            "updated policy: the old rule stops, the new one starts",
            vec![
                step(
                    "allow from y",
                    vec![apply(
                        "x",
                        policy(
                            "allow-from",
                            json!({"podSelector": pod("a"),
                                   "ingress": [{"from": [{"namespaceSelector": ns("y")}]}]}),
                        ),
                    )],
                    all().deny(|p| p.to.is("x/a") && p.from.ns != "y"),
                ),
                step(
                    "same policy updated to allow from z",
                    vec![apply(
                        "x",
                        policy(
                            "allow-from",
                            json!({"podSelector": pod("a"),
                                   "ingress": [{"from": [{"namespaceSelector": ns("z")}]}]}),
                        ),
                    )],
                    all().deny(|p| p.to.is("x/a") && p.from.ns != "z"),
                ),
                step(
                    "updated again to port 81 only",
                    vec![apply(
                        "x",
                        policy(
                            "allow-from",
                            json!({"podSelector": pod("a"),
                                   "ingress": [{"from": [{"namespaceSelector": ns("z")}],
                                                "ports": [{"port": 81, "protocol": "UDP"}]}]}),
                        ),
                    )],
                    all()
                        .deny(into("x/a"))
                        .allow(|p| p.to.is("x/a") && p.from.ns == "z" && p.on(Udp, 81)),
                ),
            ],
        ),
        steps(
            "allow ingress from an updated namespace (namespace label change)",
            vec![
                step(
                    "nobody has the label",
                    vec![apply(
                        "x",
                        policy(
                            "allow-ns-updated",
                            json!({"podSelector": pod("a"), "ingress": [{"from": [
                                {"namespaceSelector": {"matchLabels": {"ns2": "updated"}}}]}]}),
                        ),
                    )],
                    all().deny(into("x/a")),
                ),
                step(
                    "label y ns2=updated",
                    vec![Action::LabelNamespace(
                        "y",
                        "ns2".into(),
                        Some("updated".into()),
                    )],
                    all().deny(|p| p.to.is("x/a") && p.from.ns != "y"),
                ),
                step(
                    "remove the label again",
                    vec![Action::LabelNamespace("y", "ns2".into(), None)],
                    all().deny(into("x/a")),
                ),
            ],
        ),
        steps(
            "allow ingress from an updated pod (pod label change)",
            vec![
                step(
                    "nobody has the label",
                    vec![apply(
                        "x",
                        policy(
                            "allow-pod-updated",
                            json!({"podSelector": pod("a"), "ingress": [{"from": [
                                {"namespaceSelector": {},
                                 "podSelector": {"matchLabels": {"pod2": "updated"}}}]}]}),
                        ),
                    )],
                    all().deny(into("x/a")),
                ),
                step(
                    "label z/b pod2=updated",
                    vec![Action::LabelPod(
                        "z/b".into(),
                        "pod2".into(),
                        Some("updated".into()),
                    )],
                    all()
                        .deny(into("x/a"))
                        .allow(|p| p.to.is("x/a") && p.from.is("z/b")),
                ),
                step(
                    "remove the label again",
                    vec![Action::LabelPod("z/b".into(), "pod2".into(), None)],
                    all().deny(into("x/a")),
                ),
            ],
        ),
        steps(
            "deny ingress to an updated pod (the target's label changes)",
            vec![
                step(
                    "no pod selected yet",
                    vec![apply(
                        "x",
                        policy(
                            "deny-isolated",
                            json!({"podSelector": {"matchLabels": {"target": "isolated"}},
                                   "policyTypes": ingress}),
                        ),
                    )],
                    all(),
                ),
                step(
                    "label x/a target=isolated",
                    vec![Action::LabelPod(
                        "x/a".into(),
                        "target".into(),
                        Some("isolated".into()),
                    )],
                    all().deny(into("x/a")),
                ),
            ],
        ),
        case(
            "deny egress from a pod based on PodSelector",
            vec![apply(
                "x",
                policy(
                    "deny-egress-a",
                    json!({"podSelector": pod("a"), "policyTypes": egress}),
                ),
            )],
            all().deny(out_of("x/a")),
        ),
        case(
            "deny egress from all pods in a namespace",
            vec![apply(
                "x",
                policy(
                    "deny-egress",
                    json!({"podSelector": {}, "policyTypes": egress}),
                ),
            )],
            all().deny(|p| p.from.ns == "x"),
        ),
        case(
            "Ingress and Egress specified together",
            vec![apply(
                "x",
                policy(
                    "in-and-out",
                    json!({"podSelector": pod("a"), "policyTypes": both,
                           "ingress": [{"from": [{"podSelector": pod("b")}]}],
                           "egress": [{"to": [{"namespaceSelector": ns("y")}]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && p.from.is("x/b"))
                .deny(|p| p.from.is("x/a") && p.to.ns != "y"),
        ),
        case(
            "egress denied on the client side even when the server allows it",
            vec![
                apply(
                    "x",
                    policy(
                        "deny-egress-a",
                        json!({"podSelector": pod("a"), "policyTypes": egress}),
                    ),
                ),
                apply(
                    "y",
                    policy(
                        "allow-all-ingress",
                        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}]}),
                    ),
                ),
            ],
            all().deny(out_of("x/a")),
        ),
        case(
            "a flow needs its egress side and its ingress side",
            vec![
                apply(
                    "x",
                    policy(
                        "a-from-b",
                        json!({"podSelector": pod("a"),
                               "ingress": [{"from": [{"podSelector": pod("b")}]}]}),
                    ),
                ),
                apply(
                    "x",
                    policy(
                        "b-to-y",
                        json!({"podSelector": pod("b"), "policyTypes": egress,
                               "egress": [{"to": [{"namespaceSelector": ns("y")}]}]}),
                    ),
                ),
            ],
            all()
                .deny(into("x/a"))
                .deny(|p| p.from.is("x/b") && p.to.ns != "y"),
        ),
        case(
            "egress to a server in a different namespace (PodSelector and NamespaceSelector)",
            vec![apply(
                "x",
                policy(
                    "to-y-a",
                    json!({"podSelector": pod("a"), "policyTypes": egress,
                           "egress": [{"to": [{"namespaceSelector": ns("y"), "podSelector": pod("a")}]}]}),
                ),
            )],
            all().deny(|p| p.from.is("x/a") && !p.to.is("y/a")),
        ),
        case(
            "egress to a namespace on one named UDP port",
            vec![apply(
                "x",
                policy(
                    "to-z-udp-80",
                    json!({"podSelector": pod("a"), "policyTypes": egress,
                           "egress": [{"to": [{"namespaceSelector": ns("z")}],
                                       "ports": [{"port": "serve-80-udp", "protocol": "UDP"}]}]}),
                ),
            )],
            all().deny(|p| p.from.is("x/a") && !(p.to.ns == "z" && p.on(Udp, 80))),
        ),
        case(
            "ingress allowing any port on a specific protocol",
            vec![apply(
                "x",
                policy(
                    "udp-only",
                    json!({"podSelector": pod("a"), "ingress": [{"ports": [{"protocol": "UDP"}]}]}),
                ),
            )],
            all().deny(|p| p.to.is("x/a") && p.protocol == Tcp),
        ),
        case(
            "a policy allowing only SCTP is not taken for TCP or UDP (the pod stays isolated)",
            vec![apply(
                "x",
                policy(
                    "sctp-80",
                    json!({"podSelector": pod("a"),
                           "ingress": [{"ports": [{"port": 80, "protocol": "SCTP"}]}]}),
                ),
            )],
            all().deny(into("x/a")),
        ),
        case(
            "TCP is not allowed by a policy that names UDP only",
            vec![apply(
                "x",
                policy(
                    "udp-81",
                    json!({"podSelector": pod("a"),
                           "ingress": [{"ports": [{"port": 81, "protocol": "UDP"}]}]}),
                ),
            )],
            all().deny(|p| p.to.is("x/a") && !p.on(Udp, 81)),
        ),
        case(
            "UDP: allow from a pod of a different namespace on UDP port 81",
            vec![apply(
                "x",
                policy(
                    "udp-from-y-b",
                    json!({"podSelector": pod("a"), "ingress": [{
                        "from": [{"namespaceSelector": ns("y"), "podSelector": pod("b")}],
                        "ports": [{"port": 81, "protocol": "UDP"}]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && p.from.is("y/b") && p.on(Udp, 81)),
        ),
        case(
            if end_port_kept {
                "endPort: a TCP port range 80-81"
            } else {
                "endPort: a TCP port range 80-81 (this API server drops endPort: port 80 only)"
            },
            vec![apply(
                "x",
                policy(
                    "port-range",
                    json!({"podSelector": pod("a"), "ingress": [{
                        "from": [{"namespaceSelector": ns("y")}],
                        "ports": [{"port": 80, "endPort": 81, "protocol": "TCP"}]}]}),
                ),
            )],
            all().deny(into("x/a")).allow(|p| {
                p.to.is("x/a")
                    && p.from.ns == "y"
                    && p.protocol == Tcp
                    && (end_port_kept || p.port == 80)
            }),
        ),
        steps(
            "multiple ingress policies: allow-all takes precedence",
            vec![
                step(
                    "x/b on port 80",
                    vec![apply(
                        "x",
                        policy(
                            "b-80",
                            json!({"podSelector": pod("a"), "ingress": [{
                                "from": [{"podSelector": pod("b")}], "ports": [{"port": 80}]}]}),
                        ),
                    )],
                    all()
                        .deny(into("x/a"))
                        .allow(|p| p.to.is("x/a") && p.from.is("x/b") && p.on(Tcp, 80)),
                ),
                step(
                    "add allow-all ingress",
                    vec![apply(
                        "x",
                        policy(
                            "allow-all",
                            json!({"podSelector": pod("a"), "ingress": [{}]}),
                        ),
                    )],
                    all(),
                ),
            ],
        ),
        steps(
            "multiple egress policies: allow-all takes precedence",
            vec![
                step(
                    "x/a to x/b on port 80",
                    vec![apply(
                        "x",
                        policy(
                            "to-b-80",
                            json!({"podSelector": pod("a"), "policyTypes": egress, "egress": [{
                                "to": [{"podSelector": pod("b")}], "ports": [{"port": 80}]}]}),
                        ),
                    )],
                    all().deny(|p| p.from.is("x/a") && !(p.to.is("x/b") && p.on(Tcp, 80))),
                ),
                step(
                    "add allow-all egress",
                    vec![apply(
                        "x",
                        policy(
                            "egress-all",
                            json!({"podSelector": pod("a"), "policyTypes": egress, "egress": [{}]}),
                        ),
                    )],
                    all(),
                ),
            ],
        ),
        steps(
            "policies stop being enforced once deleted",
            vec![
                step(
                    "default-deny-all in x",
                    vec![apply(
                        "x",
                        policy("deny-all", json!({"podSelector": {}, "policyTypes": both})),
                    )],
                    all().deny(|p| p.to.ns == "x" || p.from.ns == "x"),
                ),
                step("delete it", vec![Action::Delete("x", "deny-all")], all()),
            ],
        ),
        steps(
            "deleting one of two policies keeps the other",
            vec![
                step(
                    "deny ingress to x/a, allow y/* by a second policy",
                    vec![
                        deny_x_a(),
                        apply(
                            "x",
                            policy(
                                "allow-y",
                                json!({"podSelector": pod("a"),
                                       "ingress": [{"from": [{"namespaceSelector": ns("y")}]}]}),
                            ),
                        ),
                    ],
                    all().deny(|p| p.to.is("x/a") && p.from.ns != "y"),
                ),
                step(
                    "delete the allowing one",
                    vec![Action::Delete("x", "allow-y")],
                    all().deny(into("x/a")),
                ),
            ],
        ),
        case(
            "egress to a server in a CIDR block",
            vec![apply(
                "x",
                policy(
                    "to-cidr",
                    json!({"podSelector": pod("a"), "policyTypes": egress,
                           "egress": [{"to": [{"ipBlock": {"cidr": ip("y/a")}}]}]}),
                ),
            )],
            all().deny(|p| p.from.is("x/a") && !p.to.is("y/a")),
        ),
        case(
            "egress CIDR block with an except clause",
            vec![apply(
                "x",
                policy(
                    "to-cidr-except",
                    json!({"podSelector": pod("a"), "policyTypes": egress,
                           "egress": [{"to": [{"ipBlock": {"cidr": net, "except": [ip("y/a")]}}]}]}),
                ),
            )],
            all().deny(|p| p.from.is("x/a") && p.to.is("y/a")),
        ),
        steps(
            "an IP in both a CIDR's except and another policy's CIDR is allowed",
            vec![
                step(
                    "CIDR except y/a",
                    vec![apply(
                        "x",
                        policy(
                            "to-cidr-except",
                            json!({"podSelector": pod("a"), "policyTypes": egress,
                                   "egress": [{"to": [{"ipBlock": {"cidr": net, "except": [ip("y/a")]}}]}]}),
                        ),
                    )],
                    all().deny(|p| p.from.is("x/a") && p.to.is("y/a")),
                ),
                step(
                    "a second policy allows y/a's /32",
                    vec![apply(
                        "x",
                        policy(
                            "to-y-a",
                            json!({"podSelector": pod("a"), "policyTypes": egress,
                                   "egress": [{"to": [{"ipBlock": {"cidr": ip("y/a")}}]}]}),
                        ),
                    )],
                    all(),
                ),
            ],
        ),
        case(
            "ingress from a CIDR block with an except clause",
            vec![apply(
                "x",
                policy(
                    "from-cidr-except",
                    json!({"podSelector": pod("a"),
                           "ingress": [{"from": [{"ipBlock": {"cidr": net, "except": [ip("x/b")]}}]}]}),
                ),
            )],
            all().deny(|p| p.to.is("x/a") && p.from.is("x/b")),
        ),
        case(
            "ingress from a single-address CIDR block on UDP",
            vec![apply(
                "x",
                policy(
                    "from-z-c",
                    json!({"podSelector": pod("a"), "ingress": [{
                        "from": [{"ipBlock": {"cidr": ip("z/c")}}],
                        "ports": [{"protocol": "UDP", "port": 80}]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .allow(|p| p.to.is("x/a") && p.from.is("z/c") && p.on(Udp, 80)),
        ),
        case(
            "ingress and egress are controlled independently",
            vec![
                apply(
                    "x",
                    policy(
                        "a-egress-only",
                        json!({"podSelector": pod("a"), "policyTypes": egress, "egress": [{}]}),
                    ),
                ),
                apply(
                    "x",
                    policy(
                        "b-ingress-from-a",
                        json!({"podSelector": pod("b"), "policyTypes": ingress,
                               "ingress": [{"from": [{"podSelector": pod("a")}]}]}),
                    ),
                ),
            ],
            all().deny(|p| p.to.is("x/b") && !p.from.is("x/a")),
        ),
        case(
            "policyTypes default: egress rules alone also isolate ingress",
            vec![apply(
                "x",
                policy(
                    "egress-rules-only",
                    json!({"podSelector": pod("a"),
                           "egress": [{"to": [{"podSelector": pod("b")}]}]}),
                ),
            )],
            all()
                .deny(into("x/a"))
                .deny(|p| p.from.is("x/a") && !p.to.is("x/b")),
        ),
        case(
            "policyTypes Egress only: ingress rules are ignored",
            vec![apply(
                "x",
                policy(
                    "egress-type-with-ingress-rules",
                    json!({"podSelector": pod("a"), "policyTypes": egress,
                           "ingress": [{"from": [{"podSelector": pod("b")}]}],
                           "egress": [{"to": [{"namespaceSelector": ns("y")}]}]}),
                ),
            )],
            all().deny(|p| p.from.is("x/a") && p.to.ns != "y"),
        ),
        case(
            "a policy selects pods of its own namespace only",
            vec![apply(
                "y",
                policy(
                    "deny-y-a",
                    json!({"podSelector": pod("a"), "policyTypes": ingress}),
                ),
            )],
            all().deny(into("y/a")),
        ),
        case(
            "an empty ingress rule list in Ingress+Egress denies both ways for one pod only",
            vec![apply(
                "z",
                policy(
                    "isolate-z-c",
                    json!({"podSelector": pod("c"), "policyTypes": both,
                           "ingress": [], "egress": []}),
                ),
            )],
            all().deny(|p| p.to.is("z/c") || p.from.is("z/c")),
        ),
    ]
}
