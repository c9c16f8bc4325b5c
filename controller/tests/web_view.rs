//! The web view (docs/ui.md) in a real browser: the controller binary against the local cluster's API
//! server, the end-to-end scenario's proposals and policy (docs/development.md) created in a test
//! namespace, and Debian's headless Chromium driven through chromedriver's WebDriver HTTP API (plain
//! JSON over HTTP). Asserts that the graph shows the scenario's edges with their states, that a
//! violation written into the policy's status is highlighted within 5 s, that clicking an edge
//! explains it (against pods of the scenario's workloads), that the workload page
//! shows the promote command, and that the diff page renders; writes a screenshot of each page to
//! `target/ui/*.png`. Needs `cargo xtask setup` (chromium, chromium-driver) and the local cluster.

#[path = "support/webdriver.rs"]
mod webdriver;

use anyhow::{Result, bail, ensure};
use kube::api::{Patch, PatchParams, PostParams};
use network_enforcer_api::cluster_proposal::ClusterNetworkPolicyProposal;
use network_enforcer_api::{WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::wait;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use webdriver::{Browser, Running, free_port, http};

/// The scenario's learned proposals, shared with the web view's unit tests: http-client calls
/// http-server on TCP 18080 and the cluster DNS, and outside addresses call http-server too.
const PROPOSALS: &str = include_str!("data/scenario-proposals.yaml");

/// The client's egress proposal promoted into a monitor policy (the controller then deletes that
/// proposal, as after a real promotion).
const POLICY: &str = r#"
apiVersion: networkenforcer.kubewarden.io/v1alpha1
kind: WorkloadNetworkPolicy
metadata:
  name: deployment-http-client-egress
  labels: {networkenforcer.kubewarden.io/promoted-from: deployment-http-client-egress}
spec:
  backend: kubernetes
  direction: Egress
  mode: monitor
  targetRef: {kind: Deployment, name: http-client}
  kubernetes:
    podSelector: {matchLabels: {app: http-client}}
    policyTypes: [Egress]
    egress:
      - to: [{podSelector: {matchLabels: {app: http-server}}}]
        ports: [{protocol: TCP, port: 18080}]
      - to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}]
        ports: [{protocol: UDP, port: 53}]
"#;

/// `graphProblems(svg)`: what makes a drawn graph unreadable (overlapping nodes or labels, an edge
/// through a node it does not connect, an edge drawn twice or without its label).
const GRAPH_PROBLEMS: &str = include_str!("data/graph_problems.js");

/// The demo's graph (`cargo xtask demo`: frontend → api → db, the frontend's direct call to db both
/// recorded in monitor and blocked in protect, everyone's DNS) with a long name, a self edge and an
/// outside caller on eight ports: laid out by the page's own code beside the live graph.
const DEMO_GRAPH: &str = include_str!("data/demo-graph.json");

/// What is wrong with the graph `selector` finds, laid out as the page lays it out.
fn graph_problems(browser: &Browser, selector: &str) -> Result<Vec<String>> {
    let problems = browser.run(&format!(
        "{GRAPH_PROBLEMS}\nreturn graphProblems(document.querySelector({}))",
        json!(selector)
    ))?;
    Ok(serde_json::from_value(problems)?)
}

/// The graph's edges as `state from>to ports` lines, sorted.
const EDGES_SCRIPT: &str = "return Array.from(document.querySelectorAll('#graph g.edge')).map(e => \
    `${e.dataset.state} ${e.dataset.from}>${e.dataset.to} ${e.dataset.ports}`).sort().join('\\n')";

#[tokio::test(flavor = "multi_thread")]
async fn the_web_view_shows_the_graph_a_new_violation_and_the_promote_command() -> Result<()> {
    let ns = TestNamespace::create_with_crds("web-view").await?;
    let n = ns.name.clone();
    let proposals: Vec<Value> = serde_yaml::from_str(PROPOSALS)?;
    for mut value in proposals {
        value["metadata"]["namespace"] = json!(n);
        ns.api::<WorkloadNetworkPolicyProposal>()
            .create(&PostParams::default(), &serde_json::from_value(value)?)
            .await?;
    }
    // A cluster proposal (cluster-scoped: removed by the guard, not with the namespace), promoted and
    // in force as the leader would report it, for the cluster guardrails page.
    let isolate = format!("ne-isolate-{n}");
    // And a ClusterNetworkPolicy written by hand, for the page's list of policies.
    let by_hand = format!("ne-test-ui-{n}");
    struct Remove(PathBuf, String, String);
    impl Drop for Remove {
        fn drop(&mut self) {
            for (kind, name) in [
                ("clusternetworkpolicyproposals", &self.1),
                ("clusternetworkpolicies", &self.2),
            ] {
                let _ = network_enforcer_tests::cluster::components::kubectl(
                    &self.0,
                    &["delete", kind, name, "--ignore-not-found", "--wait=false"],
                );
            }
        }
    }
    let _remove = Remove(
        ns.kubeconfig().to_path_buf(),
        isolate.clone(),
        by_hand.clone(),
    );
    kube::Api::<network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy>::all(
        ns.client.clone(),
    )
    .create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "policy.networking.k8s.io/v1alpha2", "kind": "ClusterNetworkPolicy",
            "metadata": {"name": by_hand},
            "spec": {"tier": "Admin", "priority": 20,
                "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": n}}},
                "ingress": [{"name": "probes", "action": "Accept", "from": [{"namespaces": {}}],
                             "protocols": [{"tcp": {"destinationPort": {"number": 9100}}}]}]}
        }))?,
    )
    .await?;
    let cluster_proposals = kube::Api::<ClusterNetworkPolicyProposal>::all(ns.client.clone());
    cluster_proposals
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
                "kind": "ClusterNetworkPolicyProposal",
                "metadata": {"name": isolate, "labels": {"networkenforcer.kubewarden.io/promote": "protect"}},
                "spec": {"policy": {"tier": "Admin", "priority": 900,
                    "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": n}}},
                    "ingress": [
                        {"name": "observed", "action": "Pass", "from": [{"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": n}}}]},
                        {"name": "isolate", "action": "Deny", "from": [{"namespaces": {}}]}]}}
            }))?,
        )
        .await?;
    cluster_proposals
        .patch_status(
            &isolate,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "lastLearnedTime": k8s_openapi::jiff::Timestamp::now().to_string(),
                "conditions": [{"type": "Rendered", "status": "True", "reason": "Rendered",
                    "message": "in force", "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string()}]}})),
        )
        .await?;
    let mut policy: Value = serde_yaml::from_str(POLICY)?;
    policy["metadata"]["namespace"] = json!(n);
    ns.api::<WorkloadNetworkPolicy>()
        .create(&PostParams::default(), &serde_json::from_value(policy)?)
        .await?;
    let (ui, metrics, ingest) = (free_port()?, free_port()?, free_port()?);
    let _controller = Running(
        std::process::Command::new(env!("CARGO_BIN_EXE_network-enforcer-controller"))
            .arg("run")
            .env("KUBECONFIG", ns.kubeconfig())
            .env("WATCH_NAMESPACE", &n)
            .env("POD_NAMESPACE", &n)
            .env("POD_NAME", "controller-0")
            .env("LEADER_ELECT", "false")
            .env("CONTROLLER_PROVIDER", "ebpf")
            .env("INGEST_ADDRESS", format!("127.0.0.1:{ingest}"))
            .env("INGEST_INSECURE", "true")
            .env("METRICS_ADDRESS", format!("127.0.0.1:{metrics}"))
            .env("UI_ADDRESS", format!("127.0.0.1:{ui}"))
            // The status pass writes each rule's usage entry (`since`) the page shows in words.
            .env("WNP_STATUS_UPDATE_INTERVAL", "2s")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdout(std::process::Stdio::null())
            .spawn()?,
    );
    let client = format!("w:{n}/Deployment/http-client");
    let server = format!("w:{n}/Deployment/http-server");
    let dns = "s:kube-system/{k8s-app=kube-dns}";

    // The JSON API first: the graph the page will draw.
    let graph_path = format!("/api/v1/namespaces/{n}/graph");
    let graph: Value = wait::eventually(
        &format!("the web view's API to answer the graph of {n}"),
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let Ok((200, body)) = http(ui, "GET", &graph_path, None) else {
                return Ok(None);
            };
            let graph: Value = serde_json::from_str(&body)?;
            Ok(graph["edges"]
                .as_array()
                .is_some_and(|e| e.len() >= 3)
                .then_some(graph))
        },
        String::new,
    )
    .await?;
    let mut states: Vec<String> = graph["edges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            format!(
                "{} {}>{}",
                e["state"].as_str().unwrap_or("?"),
                e["from"],
                e["to"]
            )
        })
        .collect();
    states.sort();
    assert_eq!(
        states,
        [
            format!("allowed \"{client}\">\"{dns}\""),
            format!("allowed \"{client}\">\"{server}\""),
            format!("learned \"x:*\">\"{server}\""),
        ],
        "the client's policy allows both of its rules; the outside caller is only learned"
    );

    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ui");
    std::fs::create_dir_all(&out)?;
    let profile = std::env::temp_dir().join(format!("ne-web-view-chromium-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let browser = Browser::start(&profile)?;
    let base = format!("http://127.0.0.1:{ui}/");

    // The graph page shows the scenario's edges, coloured by state.
    browser.open(&format!("{base}#/graph/{n}"))?;
    let expected = [
        format!("allowed {client}>{dns} UDP 53"),
        format!("allowed {client}>{server} TCP 18080"),
        format!("learned x:*>{server} TCP 18080"),
    ]
    .join("\n");
    let shown = browser.wait_for(
        "the graph's edges",
        Duration::from_secs(20),
        &format!(
            "const s = (function() {{ {EDGES_SCRIPT} }})(); return s === {} ? s : null",
            json!(expected)
        ),
    );
    if shown.is_err() {
        let now = browser.run(EDGES_SCRIPT)?;
        bail!("the graph shows\n{now}\nnot\n{expected}");
    }
    browser.screenshot(&out.join("graph.png"))?;
    let problems = graph_problems(&browser, "#graph svg")?;
    ensure!(problems.is_empty(), "the scenario's graph: {problems:#?}");

    // The demo's graph, drawn by the page's own layout over the page (the poll redraws only #graph);
    // what the page remembers of its own graph (edges seen, the view) is put back after.
    browser.run(&format!(
        "const saved = [seenEdges, view, moved]; \
         const box = document.createElement('div'); box.id = 'demo-graph'; \
         box.style.cssText = 'position:fixed;inset:0;background:#f6f7f9;z-index:10'; \
         document.body.append(box); const svg = renderGraph({DEMO_GRAPH}, null); \
         svg.style.cssText = 'width:100%;height:100%'; box.append(svg); \
         [seenEdges, view, moved] = saved; return true"
    ))?;
    browser.screenshot(&out.join("graph-demo.png"))?;
    let problems = graph_problems(&browser, "#demo-graph svg")?;
    ensure!(problems.is_empty(), "the demo's graph: {problems:#?}");
    let drawn = browser.run(
        "return [document.querySelector('#demo-graph svg').dataset.layout, \
         document.querySelectorAll('#demo-graph g.edge').length, \
         document.querySelector('#demo-graph g.edge-label[data-id=\"x:*>w:demo/Deployment/frontend\"]\
         [data-state=learned] text').textContent, \
         document.querySelector('#demo-graph g.edge-label[data-state=observed] text').textContent, \
         document.querySelector('#demo-graph g.edge-label[data-id=\"w:demo/Deployment/frontend>w:demo/Deployment/api\"] text').textContent]",
    )?;
    ensure!(
        drawn
            == json!([
                "layered",
                15,
                "TCP 80, TCP 443, TCP 8080, TCP 8443, TCP 9090, TCP 9091 +2",
                "Admin · TCP 9100",
                "NP · TCP 8080"
            ]),
        "the demo's graph is laid out in layers, draws each of its 15 edges once, ports bundled, \
         the tiers deciding observed flows first: {drawn}"
    );
    browser.run("document.getElementById('demo-graph').remove(); return true")?;

    // Clicking an edge explains it (docs/ui.md, "Explain"): `check --explain` against the cluster as
    // it is now, between a current pod of each workload, with the command that reproduces it.
    network_enforcer_tests::scenario_fixture::create_workloads(&ns, 1).await?;
    browser.run(&format!(
        "document.querySelector('#graph g.edge[data-from={}][data-to={}]')\
         .dispatchEvent(new MouseEvent('click', {{bubbles: true}})); return true",
        json!(client),
        json!(server)
    ))?;
    let explained = browser.wait_for(
        "the edge's explanation",
        Duration::from_secs(20),
        "const r = document.querySelector('#explain .explained[data-port=\"TCP 18080\"]'); \
         return r && (r.dataset.allowed || r.dataset.error) ? \
         [r.dataset.allowed || 'error', r.textContent].join('|') : null",
    )?;
    let explained = explained.as_str().unwrap_or_default().to_string();
    ensure!(
        explained.starts_with("true|")
            && explained.contains("deployment-http-client-egress")
            && explained.contains("check --scenario scenario.json --explain"),
        "the explanation of {client} -> {server} TCP 18080: {explained}"
    );
    browser.screenshot(&out.join("explain.png"))?;
    browser.run("document.querySelector('#explain button.close').click(); return true")?;

    // A violation written into the status appears highlighted (red, pulsing) within 5 s. Written
    // after the controller's first status pass (its rule usage is there), which it then keeps.
    let policies = ns.api::<WorkloadNetworkPolicy>();
    wait::eventually(
        "the controller to write rule usage",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let policy = policies.get_status("deployment-http-client-egress").await?;
            Ok(policy
                .status
                .is_some_and(|s| !s.rule_usage.is_empty())
                .then_some(()))
        },
        String::new,
    )
    .await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    // The hourly history the workload page plots: 4 occurrences three hours ago, 1 this hour.
    let hour = |back: i64| {
        k8s_openapi::jiff::Timestamp::from_second((now.as_second() / 3600 - back) * 3600)
            .map(|t| t.to_string())
    };
    let (this_hour, three_hours_ago) = (hour(0)?, hour(3)?);
    let now = now.to_string();
    let status = json!({"status": {
        "violationCount": 5,
        "activeViolationCount": 1,
        "violationHistory": [{"start": three_hours_ago, "count": 4}, {"start": this_hour, "count": 1}],
        "violations": [{
            "id": 1, "timestamp": now,
            "source": {"namespace": n, "ownerKind": "Deployment", "ownerName": "http-client"},
            "dest": {"namespace": n, "ownerKind": "Deployment", "ownerName": "db"},
            "protocol": "TCP", "dstPort": 5432, "action": "monitor", "direction": "Egress",
            "denyingPolicyNamespace": n, "denyingPolicyName": "deployment-http-client-egress"
        }]
    }});
    policies
        .patch_status(
            "deployment-http-client-egress",
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
    let updated = Instant::now();
    let db = format!("w:{n}/Deployment/db");
    browser.wait_for(
        "the violation edge, highlighted",
        Duration::from_secs(5),
        &format!(
            "const e = document.querySelector('#graph g.edge.violation.highlight[data-to={}]'); \
             return e ? getComputedStyle(e.querySelector('path')).stroke : null",
            json!(db)
        ),
    )?;
    let latency = updated.elapsed();
    eprintln!("violation highlighted {latency:?} after the status update");
    assert!(latency < Duration::from_secs(5), "{latency:?}");
    let stroke = browser.run(&format!(
        "return getComputedStyle(document.querySelector('#graph g.edge.violation[data-to={}] path')).stroke",
        json!(db)
    ))?;
    assert_eq!(stroke, json!("rgb(211, 47, 47)"), "violations are red");
    browser.screenshot(&out.join("graph-violation.png"))?;
    let problems = graph_problems(&browser, "#graph svg")?;
    ensure!(
        problems.is_empty(),
        "the graph with its violation: {problems:#?}"
    );

    // The cluster overview: the client's row (its egress in monitor, its violation counted) links to
    // its page; the server, with a proposal only, is learning.
    browser.open(&format!("{base}#/"))?;
    let row = |workload: &str| {
        format!(
            "const a = document.querySelector('a[data-workload={}]'); return a ? Array.from(a.closest('tr').cells).map(c => c.textContent) : null",
            json!(format!("{n}/{workload}"))
        )
    };
    let client_row = browser.wait_for(
        "the client's overview row",
        Duration::from_secs(10),
        &row("http-client"),
    )?;
    assert_eq!(
        client_row,
        json!([
            n,
            "Deployment/http-client",
            "monitor",
            "monitor",
            "—",
            "1",
            "—"
        ]),
        "namespace, workload, state, egress, ingress, active violations, warnings"
    );
    let server_row = browser.wait_for(
        "the server's overview row",
        Duration::from_secs(10),
        &row("http-server"),
    )?;
    assert_eq!(server_row[2], json!("learning"));
    browser.screenshot(&out.join("overview.png"))?;

    // The client's page: the acknowledge command of its violation.
    browser.open(&format!("{base}#/workload/{n}/http-client"))?;
    browser.wait_for(
        "the acknowledge command",
        Duration::from_secs(10),
        &format!(
            "return Array.from(document.querySelectorAll('code.command.acknowledge')).some(c => c.textContent.includes({}))",
            json!("networkenforcer.kubewarden.io/acknowledge-1=")
        ),
    )?;
    // Rule usage in words, the absolute times on hover (the status pass wrote `since`; no flow
    // matched a rule here).
    let usage = browser.wait_for(
        "the rule usage in words",
        Duration::from_secs(30),
        "const u = document.querySelector('section.policy span.usage'); return u ? [u.textContent, u.title] : null",
    )?;
    let (text, title) = (
        usage[0].as_str().unwrap_or(""),
        usage[1].as_str().unwrap_or(""),
    );
    ensure!(
        text.starts_with("never matched · 0 peers · watched since ") && text.ends_with(" ago"),
        "rule usage as words: {text:?}"
    );
    ensure!(
        title.starts_with("watched since 20") && !text.contains('{'),
        "absolute time on hover: {title:?}"
    );
    // The violations per hour, as bars in their hours: the busier hour drawn taller.
    let bars = browser.wait_for(
        "the violations plot",
        Duration::from_secs(10),
        "const rs = Array.from(document.querySelectorAll('section.policy figure.violation-plot rect')); \
         return rs.length ? [rs.map(r => [r.dataset.start, Number(r.dataset.count), Number(r.getAttribute('height')), Number(r.getAttribute('x'))]), \
         document.querySelector('section.policy figure.violation-plot figcaption').textContent] : null",
    )?;
    // [start, count, height, x]: bars 6 px apart per hour (x is left out: an hour may have turned
    // since, moving both bars left).
    let expected = json!([
        [three_hours_ago.replace('Z', ".000Z"), 4, 36],
        [this_hour.replace('Z', ".000Z"), 1, 9]
    ]);
    let x = |i: usize| bars[0][i][3].as_i64().unwrap_or_default();
    let drawn: Vec<_> = (0..2)
        .map(|i| json!(bars[0][i].as_array().map(|b| b[..3].to_vec())))
        .collect();
    ensure!(
        json!(drawn) == expected
            && x(1) - x(0) == 3 * 6
            && x(1) >= 46 * 6
            && bars[1]
                .as_str()
                .is_some_and(|c| c.starts_with("5 in the last 48 h")),
        "the violations plot: {bars}, expected bars {expected} 18 px apart, the newest at the right"
    );
    // Conditions say what they mean in words.
    browser.wait_for(
        "the Ready condition's meaning",
        Duration::from_secs(10),
        "return Array.from(document.querySelectorAll('section.policy td')).some(td => td.textContent === 'the policy is in force as its mode says')",
    )?;
    browser.screenshot(&out.join("workload-violation.png"))?;
    // Its "why": the violation's flow explained now. Its destination (Deployment db) has no pod, so
    // the route says exactly that.
    browser.run("document.querySelector('button.why').click(); return true")?;
    let why = browser.wait_for(
        "the violation's explanation",
        Duration::from_secs(20),
        "const r = document.querySelector('.explained[data-violation=\"1\"]'); \
         return r && (r.dataset.allowed || r.dataset.error) ? r.textContent : null",
    )?;
    let why = why.as_str().unwrap_or_default().to_string();
    ensure!(
        why.starts_with("TCP 5432") && why.contains(&format!("Deployment {n}/db has no pod now")),
        "the violation's explanation: {why}"
    );

    // The server's page: the exact command that promotes its proposal.
    browser.open(&format!("{base}#/workload/{n}/http-server"))?;
    let promote = format!(
        "kubectl label wnpp -n {n} deployment-http-server-ingress networkenforcer.kubewarden.io/promote=monitor --overwrite"
    );
    browser.wait_for(
        "the promote command",
        Duration::from_secs(10),
        &format!(
            "return Array.from(document.querySelectorAll('code.command.promote')).some(c => c.textContent === {})",
            json!(promote)
        ),
    )?;
    browser.screenshot(&out.join("workload.png"))?;

    // The cluster guardrails page: the proposal, in force, and the command that takes it back.
    browser.open(&format!("{base}#/cluster"))?;
    let unpromote = format!("kubectl label cnpp {isolate} networkenforcer.kubewarden.io/promote-");
    browser.wait_for(
        "the cluster proposal's row",
        Duration::from_secs(20),
        &format!(
            "const r = document.querySelector('[data-proposal={}]'); \
             return r && Array.from(document.querySelectorAll('#cluster-proposals td')).some(td => td.textContent === 'in force') \
             && Array.from(document.querySelectorAll('code.command')).some(c => c.textContent === {}) ? true : null",
            json!(isolate),
            json!(unpromote)
        ),
    )?;
    // Below, every ClusterNetworkPolicy in the order the tiers consult them, with where it came from.
    let policy_row = browser.wait_for(
        "the hand-written ClusterNetworkPolicy's row",
        Duration::from_secs(20),
        &format!(
            "const r = document.querySelector('[data-policy={}]'); \
             return r ? Array.from(r.closest('tr').cells).map(c => c.textContent).slice(1).join('|') : null",
            json!(by_hand)
        ),
    )?;
    assert_eq!(
        policy_row,
        json!(format!(
            "{by_hand}|Admin|20|namespaces {{kubernetes.io/metadata.name={n}}}|Accept (probes)|—|written by hand|yes"
        )),
        "the policy's row"
    );
    browser.screenshot(&out.join("cluster.png"))?;

    // The proposal diff page: the three learned peers (the client and two outside ranges) would be
    // newly allowed.
    browser.open(&format!("{base}#/diff/{n}/deployment-http-server-ingress"))?;
    let rows = browser.wait_for(
        "the diff table",
        Duration::from_secs(10),
        "const t = document.querySelector('table#diff'); return t ? t.rows.length : null",
    )?;
    // Header and the three learned peers.
    assert_eq!(rows, json!(4), "diff rows");
    browser.screenshot(&out.join("diff.png"))?;
    drop(browser);
    let _ = std::fs::remove_dir_all(&profile);
    Ok(())
}
