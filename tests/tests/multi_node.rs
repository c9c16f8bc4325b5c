//! The multi-node suite, on the local cluster with a second node (`cargo xtask cluster up --nodes 2`,
//! docs/local-cluster.md "Several nodes"), our chart installed once with the agent enforcing
//! NetworkPolicies, one agent per node:
//!
//! 1. the end-to-end scenario with `http-client` on node 1 and `http-server` on node 2: each agent sees
//!    one end of every connection; the proposals must be exactly the scenario's, the monitor policies
//!    must count each violation once although both agents report it, and protect must block the denied
//!    flow on the client's node while allowed traffic crosses;
//!    New client pods on node 1 of a server protected on node 2: their first connection may lose SYNs
//!    until node 2's agent has their address from the API server (the window is measured and printed,
//!    and bounded: at most two SYNs sent again, the kernel's resends at 1 s and 3 s);
//! 2. node binding: node 2's agent's own token (read from its container), used to report a flow of
//!    node 1's client, is refused; the same token reporting node 2's server is accepted;
//! 3. node loss: the controller runs two replicas, one per node, and the leader is moved to node 2;
//!    node 2's daemons and pods are killed as by a power cut; the replica on node 1 takes over, node 1
//!    goes on learning (a workload on node 1 is learned exactly, its agent drops no batch) and the
//!    proposals learned before are unchanged; node 2 comes back, its agent resumes and learns a workload
//!    that runs only on node 2.
//!
//! One test function: the steps share one cluster start and one install (the suite's cost is mostly
//! pod start-ups on two cores). Node 2 is removed at the end, so later test binaries see one node.
//! Needs root, `cargo xtask setup` and the binaries (`cargo build --bins`).

use anyhow::{Context, Result, ensure};
use network_enforcer_agent::uplink::{self, UplinkConfig, UplinkCounters};
use network_enforcer_api::uplink::{Direction, Outcome, Protocol};
use network_enforcer_tests::cluster::{self, node::Node};
use network_enforcer_tests::e2e::poll;
use network_enforcer_tests::e2e::release::{self, Release};
use network_enforcer_tests::e2e::scenario::{self, Placement, Workload};
use network_enforcer_tests::e2e::workload::Protocol as Payload;
use network_enforcer_tests::{fixture, scenario_fixture};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The agents' metrics port (each agent listens on its node's address).
const METRICS_PORT: u16 = 29467;

/// A metric of the agent on `node`, read from its node address.
fn agent_metric(node: &Node, name: &str) -> Result<f64> {
    let text = release::http_get(&format!("{}:{METRICS_PORT}", node.ip()), "/metrics")?;
    Ok(release::metric(&text, name).unwrap_or(0.0))
}

/// Removes the extra nodes when the test ends, also when it fails.
struct ExtraNodes;

impl Drop for ExtraNodes {
    fn drop(&mut self) {
        if let Err(e) = cluster::remove_nodes_above(1) {
            eprintln!("warning: removing the extra nodes: {e:#}");
        }
    }
}

#[test]
fn across_two_nodes_flows_are_learned_once_enforced_and_survive_a_node_loss() -> Result<()> {
    // Before anything else takes this process's shared lock on the cluster (starting a node waits for
    // every other user).
    cluster::up_with_nodes(2)?;
    let _nodes = ExtraNodes;
    let cluster = fixture::cluster_with_crds()?;
    let kubeconfig = &cluster.kubeconfig;
    let (one, two) = (Node::FIRST, Node::new(2)?);
    release::images_from_debug_build()?;

    let namespace = "ne-multi-system";
    let mut values = scenario::release_values(namespace);
    values.push(scenario::AGENT_ENFORCEMENT.to_string());
    values.push(format!("agent.metricsPort={METRICS_PORT}"));
    // Two controller replicas, one per node, electing a leader.
    values.extend(
        [
            "controller.replicas=2",
            "controller.tolerations[0].operator=Exists",
            "controller.tolerations[0].effect=NoSchedule",
            "controller.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey=kubernetes.io/hostname",
            "controller.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchLabels.app\\.kubernetes\\.io/component=controller",
        ]
        .map(String::from),
    );
    values.push(format!(
        "controller.tolerations[0].key={}",
        network_enforcer_tests::cluster::node::EXTRA_NODE_TAINT_KEY
    ));
    let release = Release::install(kubeconfig, "ne-multi", namespace, &values)?;
    let agents = [
        release.agent_pod_on(&one.name())?,
        release.agent_pod_on(&two.name())?,
    ];
    eprintln!("agents: {agents:?}");

    // 1. The scenario across nodes.
    let across = Placement {
        client: Some(one.name()),
        server: Some(two.name()),
    };
    let timings = scenario::run_on(
        kubeconfig,
        &release,
        &format!("multi-{}-across", std::process::id()),
        &across,
    )?;
    eprintln!(
        "across nodes: scenario {:.1}s, first packet to proposal {:?}",
        timings.scenario.as_secs_f64(),
        timings.first_packet_to_proposal
    );

    // Each agent sees every node's sockets (one kernel) but reports its own node's pods only: the
    // controller refused nothing from either.
    for node in [&one, &two] {
        let rejected = agent_metric(node, "network_enforcer_agent_uplink_records_rejected_total")?;
        let accepted = agent_metric(node, "network_enforcer_agent_uplink_records_accepted_total")?;
        eprintln!(
            "agent on {}: {accepted} records accepted, {rejected} refused",
            node.name()
        );
        ensure!(
            accepted > 0.0 && rejected == 0.0,
            "the agent on {} reported records the controller refused (another node's pods?): \
             {accepted} accepted, {rejected} refused",
            node.name()
        );
    }

    new_pods_across_nodes(kubeconfig, &one, &two)?;

    // A workload learned before the node loss, its client on node 1 and its server on node 2.
    let before = learn(
        kubeconfig,
        &format!("multi-{}-before", std::process::id()),
        &across,
    )?;

    // 2. Node binding, with the real token of node 2's agent. The accepted record is learned: the
    // server gets an egress proposal to the made-up peer; the refused one must not reach the client's.
    node_binding(&release, &two, &before)?;
    let learned_before = poll(
        "the accepted record's proposal (http-server's egress to 203.0.113.7:18445)",
        scenario::LEARN_TIMEOUT,
        Duration::from_millis(500),
        || {
            let specs = scenario::proposal_specs(&before)?;
            Ok(specs
                .get("deployment-http-server-egress")
                .is_some_and(|p| p.to_string().contains("18445"))
                .then_some(specs))
        },
        || format!("{:#?}", scenario::proposal_specs(&before)),
    )?;
    let client_egress = learned_before
        .get(scenario::EGRESS)
        .context("the client's egress proposal")?
        .to_string();
    ensure!(
        !client_egress.contains("18444") && !client_egress.contains("203.0.113.7"),
        "the refused record was learned: {client_egress}"
    );

    let (_, container_before) = agent_on(&release, &two.name())?
        .context("node 2's agent is not ready before the node loss")?;
    // 3. Node loss, with the controller's leader on the lost node. Move the leadership to node 2 first
    // when node 1's replica holds it.
    let (first_leader, node) = leader(&release)?;
    if node == one.name() {
        release.kubectl(&["delete", "pod", &first_leader, "--wait=false"])?;
        poll(
            "the replica on node 2 to take the leadership",
            Duration::from_secs(120),
            Duration::from_millis(500),
            || Ok(leader(&release).ok().filter(|(_, n)| *n == two.name())),
            || release.describe(),
        )?;
    }
    let (leader_before, _) = leader(&release)?;
    let dropped_before = agent_metric(&one, "network_enforcer_agent_uplink_batches_dropped_total")?;
    cluster::kill_node(&two)?;
    let lost = Instant::now();
    eprintln!(
        "node {} killed with the controller's leader {leader_before}",
        two.name()
    );
    let (leader_after, _) = poll(
        "the replica on node 1 to take over",
        Duration::from_secs(120),
        Duration::from_millis(250),
        || Ok(leader(&release).ok().filter(|(_, n)| *n == one.name())),
        || release.describe(),
    )?;
    let takeover = lost.elapsed();
    eprintln!(
        "{leader_after} on node 1 took over {:.1}s after node 2 was lost",
        takeover.as_secs_f64()
    );
    // Node 1 keeps learning while node 2 is gone.
    let during = learn(
        kubeconfig,
        &format!("multi-{}-during", std::process::id()),
        &Placement {
            client: Some(one.name()),
            server: Some(one.name()),
        },
    )?;
    eprintln!(
        "learned on node 1 {:.1}s after node 2 was lost",
        lost.elapsed().as_secs_f64()
    );
    let dropped = agent_metric(&one, "network_enforcer_agent_uplink_batches_dropped_total")?;
    ensure!(
        dropped == dropped_before,
        "node 1's agent dropped {} batches while the leader moved",
        dropped - dropped_before
    );
    ensure!(
        scenario::proposal_specs(&before)? == learned_before,
        "proposals learned before the node loss changed: {:#?}",
        scenario::proposal_specs(&before)
    );
    drop(during);

    cluster::restart_node(&two)?;
    let back = Instant::now();
    let agent = poll(
        "node 2's agent to run again",
        Duration::from_secs(180),
        Duration::from_secs(1),
        || {
            Ok(agent_on(&release, &two.name())?
                .filter(|(_, container)| *container != container_before)
                .map(|(pod, _)| pod))
        },
        || release.describe(),
    )?;
    eprintln!(
        "node 2 back; its agent {agent} ready after {:.1}s",
        back.elapsed().as_secs_f64()
    );
    // Only node 2's agent can learn this one: both pods run there.
    let after = learn(
        kubeconfig,
        &format!("multi-{}-after", std::process::id()),
        &Placement {
            client: Some(two.name()),
            server: Some(two.name()),
        },
    )?;
    eprintln!(
        "learned on node 2 {:.1}s after it came back",
        back.elapsed().as_secs_f64()
    );
    ensure!(
        scenario::proposal_specs(&before)? == learned_before,
        "proposals learned before the node loss changed after node 2 came back"
    );
    drop((before, after));
    release.uninstall()
}

/// Reports one flow for `before`'s client (node 1) and one for its server (node 2) with node 2's
/// agent's token, TLS settings and node name, through the agent's own uplink: the first must be
/// refused, the second accepted.
/// New client pods on node 1 of a server on node 2 that only they may reach: each first connection,
/// made as the client's container starts, must get through; how many lost their first SYN (node 2
/// learns a pod of node 1 from the API server only) is printed, and at most two resends are allowed.
fn new_pods_across_nodes(kubeconfig: &std::path::Path, one: &Node, two: &Node) -> Result<()> {
    use network_enforcer_tests::e2e::workload::{self, Namespace};
    let ns = Namespace::create(kubeconfig, &format!("multi-{}-new", std::process::id()))?;
    ns.apply(&workload::on_node(
        &workload::deployment(
            "server",
            "default",
            &workload::echo_server_script(&[8080], &[]),
            &[(8080, "TCP")],
        ),
        &two.name(),
    )?)?;
    let (_, server_ip) = ns.wait_for_deployment("server")?.remove(0);
    ns.apply(&workload::allow_ingress(
        "server-ingress",
        "server",
        "starter",
        8080,
    ))?;
    ns.apply(&workload::on_node(
        &workload::deployment(
            "starter",
            "default",
            &workload::first_connection_script(&server_ip, 8080),
            &[],
        ),
        &one.name(),
    )?)?;
    let mut seen = Vec::new();
    let mut pods = workload::new_pods(&ns, "starter", &mut seen)?;
    ns.kubectl(&["scale", "deployment", "starter", "--replicas=4"])?;
    pods.extend(workload::new_pods(&ns, "starter", &mut seen)?);
    let mut resent = Vec::new();
    for pod in &pods {
        let first = workload::first_connection(&ns, pod)?;
        let (rc, retransmits) = (first.rc, first.syn_resends);
        ensure!(
            rc == 0,
            "pod {pod}'s first connection across nodes failed (socat {rc})"
        );
        // The server's node learns a new remote pod from the API server within 3 s: as many SYNs
        // sent again as this kernel sends in 3 s (2 before Linux 6.5; 3 with its linear timeouts).
        let allowed = workload::syn_resends_within(3, first.linear_timeouts);
        ensure!(
            retransmits <= allowed,
            "pod {pod}'s first connection across nodes sent {retransmits} SYNs again (at most \
             {allowed}, what this kernel sends in 3 s with tcp_syn_linear_timeouts {}: the server's \
             node learns a new remote pod from the API server within 3 s)",
            first.linear_timeouts
        );
        resent.push(retransmits);
    }
    eprintln!(
        "new pods across nodes: {} pods, SYNs sent again per first connection: {resent:?}",
        pods.len()
    );
    ns.delete_and_wait()
}

fn node_binding(release: &Release, two: &Node, before: &Workload) -> Result<()> {
    let agent = AgentProcess::find(release, &two.name())?;
    let env = |key: &str| agent.env.get(key).cloned().unwrap_or_default();
    let url = env("NE_CONTROLLER_URL");
    let port = url
        .rsplit_once(':')
        .and_then(|(_, p)| p.trim_end_matches('/').parse::<u16>().ok())
        .with_context(|| format!("no port in NE_CONTROLLER_URL {url:?}"))?;
    let host = url
        .trim_start_matches("https://")
        .split(':')
        .next()
        .unwrap_or_default()
        .to_string();
    // The URL names the Service's DNS name, which the host cannot resolve: go to its ClusterIP and
    // check the certificate against the name.
    let service = host.split('.').next().unwrap_or_default();
    let cluster_ip = release.kubectl(&[
        "get",
        "service",
        service,
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])?;
    let server_name = Some(env("NE_CONTROLLER_SERVER_NAME"))
        .filter(|s| !s.is_empty())
        .unwrap_or(host);
    let dir = std::env::temp_dir().join(format!("ne-multi-binding-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let token = dir.join("token");
    std::fs::copy(
        agent.file("/var/run/secrets/network-enforcer/token"),
        &token,
    )
    .context("reading node 2's agent token")?;
    let ca = dir.join("ca.crt");
    std::fs::copy(agent.file(&env("NE_CONTROLLER_CA_FILE")), &ca)
        .context("reading node 2's agent CA bundle")?;

    let record = |pod: &str, port: u32| {
        scenario_fixture::flow_record(
            &before.ns.name,
            pod,
            std::net::IpAddr::from([203, 0, 113, 7]),
            port,
            Protocol::Tcp,
            Direction::Outbound,
            Outcome::Established,
        )
    };
    let runtime = tokio::runtime::Runtime::new()?;
    let (accepted, rejected) = runtime.block_on(async {
        let config = UplinkConfig::new(
            format!("https://{}:{port}", cluster_ip.trim()),
            &token,
            two.name(),
        )
        .tls(&ca, Some(server_name));
        let counters = UplinkCounters::default();
        let (sender, task) = uplink::spawn(config, counters.clone())?;
        // Node 1's client: not node 2's to report.
        ensure!(
            sender.send(vec![record(&before.client.0, 18444)]),
            "queue full"
        );
        // Node 2's server: node 2's own.
        ensure!(
            sender.send(vec![record(&before.server.0, 18445)]),
            "queue full"
        );
        network_enforcer_tests::wait::until(
            "the controller's acknowledgements",
            Duration::from_secs(60),
            Duration::from_millis(100),
            || counters.batches_acked.get() >= 2,
            || {
                format!(
                    "{} sent, {} reconnects",
                    counters.batches_sent.get(),
                    counters.reconnects.get()
                )
            },
        )
        .await?;
        task.abort();
        anyhow::Ok((
            counters.records_accepted.get(),
            counters.records_rejected.get(),
        ))
    })?;
    let _ = std::fs::remove_dir_all(&dir);
    ensure!(
        (accepted, rejected) == (1, 1),
        "node 2's token: expected node 1's client refused and node 2's server accepted, got \
         {accepted} accepted, {rejected} refused"
    );
    eprintln!("node binding: node 2's token reporting node 1's pod refused, its own pod accepted");
    Ok(())
}

/// The agent process of a node, seen from the host: its environment and files (through
/// `/proc/<pid>/root`, which also reaches into the node's mount namespace).
struct AgentProcess {
    pid: u32,
    env: BTreeMap<String, String>,
}

impl AgentProcess {
    fn find(release: &Release, node: &str) -> Result<Self> {
        let pod = release.agent_pod_on(node)?;
        let pid = release.host_pid(&pod, "network-enforcer-agent")?;
        let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
        let env = environ
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                kv.split_once('=')
                    .map(|(k, v)| (k.to_string(), v.to_string()))
            })
            .collect();
        Ok(Self { pid, env })
    }

    /// `path` inside the container, as a host path. Symlinks are followed inside the container's root:
    /// through `/proc/<pid>/root`, an absolute link (Debian's `/var/run` → `/run`) would lead to the
    /// host's file system instead.
    fn file(&self, path: &str) -> std::path::PathBuf {
        let root = std::path::PathBuf::from(format!("/proc/{}/root", self.pid));
        let mut pending: Vec<String> = path
            .split('/')
            .filter(|p| !p.is_empty())
            .rev()
            .map(String::from)
            .collect();
        let mut inside = std::path::PathBuf::from("/");
        // A bound on links followed, as the kernel has.
        for _ in 0..256 {
            let Some(part) = pending.pop() else { break };
            let candidate = inside.join(&part);
            let host = root.join(candidate.strip_prefix("/").unwrap_or(&candidate));
            match std::fs::read_link(&host) {
                Ok(target) => {
                    if target.is_absolute() {
                        inside = "/".into();
                    }
                    pending.extend(
                        target
                            .to_string_lossy()
                            .split('/')
                            .filter(|p| !p.is_empty())
                            .rev()
                            .map(String::from),
                    );
                }
                Err(_) if part == ".." => {
                    inside.pop();
                }
                Err(_) => inside = candidate,
            }
        }
        root.join(inside.strip_prefix("/").unwrap_or(&inside))
    }
}

/// Creates the scenario's workload in `name` on `placement`, sends TCP 18080 and waits until exactly
/// the scenario's two proposals are learned.
fn learn(kubeconfig: &std::path::Path, name: &str, placement: &Placement) -> Result<Workload> {
    let w = scenario::create_workload_on(kubeconfig, name, placement)?;
    w.send_until_echoed(Payload::Tcp, 18080, Duration::from_secs(60))?;
    let expected = scenario::expected_proposal_specs(name);
    let mut last: BTreeMap<String, Value> = BTreeMap::new();
    poll(
        &format!("exactly the scenario's two proposals in {name}"),
        scenario::LEARN_TIMEOUT,
        Duration::from_millis(500),
        || {
            last = scenario::proposal_specs(&w)?;
            Ok((last == expected).then_some(()))
        },
        || format!("expected {expected:#?}\n{}", w.ns.describe()),
    )
    .with_context(|| format!("placement {placement:?}"))?;
    Ok(w)
}

/// The controller replica holding the leader Lease, and its node.
fn leader(release: &Release) -> Result<(String, String)> {
    let holder = release.kubectl(&[
        "get",
        "lease",
        &release.object_name("controller"),
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])?;
    let holder = holder.trim().to_string();
    ensure!(!holder.is_empty(), "the controller Lease has no holder");
    let node = release.kubectl(&["get", "pod", &holder, "-o", "jsonpath={.spec.nodeName}"])?;
    Ok((holder, node.trim().to_string()))
}

/// The agent pod on `node` and its container's ID, when the pod is Ready. A container started after a
/// node loss has a new ID (the pod's status from before the loss stays Ready until the node controller
/// notices).
fn agent_on(release: &Release, node: &str) -> Result<Option<(String, String)>> {
    let Ok(pod) = release.agent_pod_on(node) else {
        return Ok(None);
    };
    let status = release.kubectl(&[
        "get",
        "pod",
        &pod,
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.status.containerStatuses[0].containerID}",
    ])?;
    Ok(
        match status.split_whitespace().collect::<Vec<_>>().as_slice() {
            ["True", container] => Some((pod, container.to_string())),
            _ => None,
        },
    )
}
