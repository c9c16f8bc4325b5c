//! A controller restart in the middle of an agent's stream loses nothing and duplicates nothing: the
//! real agent uplink (resend buffer, reconnect with backoff) streams to the real ingest service,
//! which learns into proposals on the real API server through index watches of its own.
//!
//! The first controller receives a batch, and is killed (its runtime dropped with every connection,
//! as a crashed process) before its next flush. A batch it had already acknowledged would be gone
//! for good; because the controller acknowledges only what a flush has written, the agent still holds
//! it and resends it to the second controller on the same address. The proposals end up with exactly
//! the rules the flows teach, each once, although some records arrived twice.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use network_enforcer_agent::uplink::{self, UplinkConfig, UplinkCounters};
use network_enforcer_api::backoff::Backoff;
use network_enforcer_api::uplink::{Direction, FlowRecord, Outcome, Protocol};
use network_enforcer_api::{Backend, WorkloadNetworkPolicyProposal};
use network_enforcer_controller::app::App;
use network_enforcer_controller::cluster::watches::SharedIndex;
use network_enforcer_controller::ingest::{AgentIdentity, Authenticate};
use network_enforcer_controller::learn::flush_report::FlushReport;
use network_enforcer_controller::learn::flusher::Flusher;
use network_enforcer_tests::e2e::release::debug_binary;
use network_enforcer_tests::faults::{StatusFault, StatusWritesFault, Writes, free_port};
use network_enforcer_tests::fixture::{self, TestNamespace};
use network_enforcer_tests::scenario_fixture::{
    Workloads, cluster_ip, create_workloads, flow_record, learned_rules,
};
use network_enforcer_tests::wait;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Accepts any token as the agent on `node` (authentication has its own tests in `learning.rs`).
struct AgentOn(String);

#[tonic::async_trait]
impl Authenticate for AgentOn {
    async fn authenticate(&self, _token: &str) -> Result<AgentIdentity, tonic::Status> {
        Ok(AgentIdentity {
            node: self.0.clone(),
            pod: "network-enforcer/agent".into(),
        })
    }
}

/// One controller process: index watches, proposal writer, flush counter and ingest endpoint on a
/// runtime of its own, so that stopping it kills every task and connection at once.
struct Controller {
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
    index: Arc<SharedIndex>,
    flusher: Arc<Flusher>,
}

impl Controller {
    /// Starts on `addr` (port 0: any) as the agent on `node`'s controller; flushes every
    /// `flush_every`, or only when the test says so ([`Controller::flush`]) with `None`.
    async fn start(addr: SocketAddr, node: &str, flush_every: Option<Duration>) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let node = node.to_string();
        let (ready, started) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            let started = async {
                let client = fixture::client().await?;
                let app = App::builder(client, Backend::Kubernetes)
                    // Shared by every test on this cluster: learn nothing there.
                    .excluded_namespaces(["kube-system".to_string()])
                    .build();
                tokio::spawn(app.watch_cluster());
                let service = app.ingest(Arc::new(AgentOn(node)));
                // The killed controller's connections linger on this port.
                let listener = wait::listen_again(addr).await?;
                let bound = listener.local_addr()?;
                tokio::spawn(
                    tonic::transport::Server::builder()
                        .add_service(service.into_server())
                        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(
                            listener,
                        )),
                );
                if let Some(every) = flush_every {
                    let flusher = app.flusher.clone();
                    tokio::spawn(async move {
                        let mut tick = tokio::time::interval(every);
                        loop {
                            tick.tick().await;
                            flusher.flush().await;
                        }
                    });
                }
                anyhow::Ok((bound, app.index, app.flusher))
            };
            let _ = ready.send(started.await);
        });
        let (addr, index, flusher) = started.await.context("the controller starts")??;
        Ok(Self {
            runtime: Some(runtime),
            addr,
            index,
            flusher,
        })
    }

    /// One flush, on the controller's runtime (its client lives there).
    async fn flush(&self) -> Result<FlushReport> {
        let flusher = self.flusher.clone();
        let runtime = self.runtime.as_ref().context("stopped")?;
        Ok(runtime.spawn(async move { flusher.flush().await }).await?)
    }

    /// Records this controller has received.
    fn received(&self) -> u64 {
        self.flusher.learner().metrics().records_received.get()
    }

    /// Kills the controller: no final flush, no goodbye on the streams.
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits up to 90 s for `done`, failing with `state`.
async fn eventually(what: &str, done: impl Fn() -> bool, state: impl Fn() -> String) -> Result<()> {
    network_enforcer_tests::wait::until(
        what,
        Duration::from_secs(90),
        Duration::from_millis(20),
        done,
        state,
    )
    .await
}

fn agent_state(c: &UplinkCounters) -> String {
    format!(
        "sent {} acked {} dropped {} reconnects {} accepted {} rejected {} pending {}",
        c.batches_sent.get(),
        c.batches_acked.get(),
        c.batches_dropped.get(),
        c.reconnects.get(),
        c.records_accepted.get(),
        c.records_rejected.get(),
        c.pending_batches.get()
    )
}

/// Waits until `controller`'s index is listed and knows `pods` with their IPs.
async fn wait_for_index(
    ns: &TestNamespace,
    controller: &Controller,
    pods: &[String],
) -> Result<()> {
    ns.wait_for(
        "the controller's index to list this test's pods",
        Duration::from_secs(60),
        || async {
            let index = controller.index.index.read().unwrap();
            Ok((controller.index.ready()
                && pods
                    .iter()
                    .all(|p| index.pod(&ns.name, p).is_some_and(|p| !p.ips.is_empty())))
            .then_some(()))
        },
    )
    .await
}

/// A token file of its own, removed on drop.
struct TokenFile(PathBuf);

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn a_controller_killed_mid_stream_loses_and_duplicates_nothing() -> Result<()> {
    let ns = TestNamespace::create_with_crds("restart").await?;
    let Workloads { clients, server } = create_workloads(&ns, 2).await?;
    let n = ns.name.clone();
    let node = Api::<Pod>::namespaced(ns.client.clone(), &n)
        .get(&server)
        .await?
        .spec
        .and_then(|s| s.node_name)
        .context("the server pod is scheduled")?;
    let service = cluster_ip(&n, "http-service", &ns.client).await?;
    let dns = cluster_ip("kube-system", "kube-dns", &ns.client).await?;
    let mut pods: Vec<String> = clients.iter().map(|(name, _)| name.clone()).collect();
    pods.push(server.clone());
    let (c0, c1) = (&clients[0], &clients[1]);
    let out = |pod: &str, peer: IpAddr, port: u32, protocol: Protocol| {
        flow_record(
            &n,
            pod,
            peer,
            port,
            protocol,
            Direction::Outbound,
            Outcome::Established,
        )
    };
    let into_server = |peer: IpAddr, port: u32| {
        flow_record(
            &n,
            &server,
            peer,
            port,
            Protocol::Tcp,
            Direction::Inbound,
            Outcome::Established,
        )
    };
    // Written before the kill.
    let first: Vec<FlowRecord> = vec![
        out(&c0.0, service, 18080, Protocol::Tcp),
        into_server(c0.1, 18080),
    ];
    // Received by the first controller but not yet written when it dies.
    let second: Vec<FlowRecord> = vec![
        out(&c0.0, dns, 53, Protocol::Udp),
        out(&c0.0, service, 18082, Protocol::Tcp),
        into_server(c0.1, 18082),
    ];
    // Sent to the second controller: the same flows from the other replica, and one new edge.
    let third: Vec<FlowRecord> = vec![
        out(&c1.0, service, 18080, Protocol::Tcp),
        out(&c1.0, service, 18082, Protocol::Tcp),
        into_server(c1.1, 18080),
        out(&server, dns, 53, Protocol::Udp),
    ];

    let mut a = Controller::start("127.0.0.1:0".parse()?, &node, None).await?;
    wait_for_index(&ns, &a, &pods).await?;
    let token = TokenFile(
        std::env::temp_dir().join(format!("ne-restart-{}-{n}.token", std::process::id())),
    );
    std::fs::write(&token.0, "agent-token")?;
    let counters = UplinkCounters::default();
    let (agent, uplink_task) = uplink::spawn(
        UplinkConfig {
            backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(500),
            },
            ..UplinkConfig::new(format!("http://{}", a.addr), &token.0, &node).insecure()
        },
        counters.clone(),
    )?;
    let state = || format!("agent: {}", agent_state(&counters));

    // The first batch is merged, held unacknowledged until a flush writes it, then acknowledged.
    assert!(agent.send(first.clone()));
    eventually("the first batch to arrive", || a.received() == 2, state).await?;
    assert_eq!(
        counters.batches_acked.get(),
        0,
        "not acknowledged before it is written"
    );
    let report = a.flush().await?;
    assert_eq!((report.written, report.failed), (2, 0), "{report:?}");
    eventually(
        "the written batch to be acknowledged",
        || counters.batches_acked.get() == 1 && counters.pending_batches.get() == 0,
        state,
    )
    .await?;
    // A repeat of what is written waits for no flush.
    assert!(agent.send(first.clone()));
    eventually(
        "the repeat to be acknowledged without a flush",
        || counters.batches_acked.get() == 2 && counters.pending_batches.get() == 0,
        state,
    )
    .await?;

    // The second batch arrives, is merged, and the controller dies before its next flush.
    assert!(agent.send(second.clone()));
    eventually("the second batch to arrive", || a.received() == 7, state).await?;
    assert_eq!(
        (counters.batches_acked.get(), counters.pending_batches.get()),
        (2, 1),
        "the agent still holds the unwritten batch: {}",
        state()
    );
    assert_eq!(counters.connected.get(), 1, "{}", state());
    let addr = a.addr;
    a.kill();
    eventually(
        "the agent to see the stream gone",
        || counters.connected.get() == 0,
        state,
    )
    .await?;

    // A new controller on the same address: the agent reconnects and resends; new flows keep coming.
    let b = Controller::start(addr, &node, Some(Duration::from_millis(300))).await?;
    wait_for_index(&ns, &b, &pods).await?;
    assert!(agent.send(third.clone()));
    eventually(
        "every batch to be written and acknowledged",
        || counters.batches_acked.get() == 4 && counters.pending_batches.get() == 0,
        || format!("{}; second controller received {}", state(), b.received()),
    )
    .await?;
    assert_eq!(counters.connected.get(), 1, "{}", state());
    assert!(
        counters.reconnects.get() >= 1,
        "the agent reconnected: {}",
        state()
    );
    assert_eq!(
        b.received(),
        (second.len() + third.len()) as u64,
        "the unacknowledged batch was resent, the acknowledged one was not"
    );
    assert_eq!(counters.batches_dropped.get(), 0, "{}", state());

    let want = |proposal: &str, direction: &str, peer: &str, port: &str| {
        format!("deployment-{proposal} {direction} {peer} {port}")
    };
    let server_pods = format!("{n}/app=http-server");
    let client_pods = format!("{n}/app=http-client");
    let kube_dns = "kube-system/k8s-app=kube-dns";
    let mut expected = vec![
        want("http-client-egress", "egress", &server_pods, "TCP/18080"),
        want("http-client-egress", "egress", &server_pods, "TCP/18082"),
        want("http-client-egress", "egress", kube_dns, "UDP/53"),
        want("http-server-ingress", "ingress", &client_pods, "TCP/18080"),
        want("http-server-ingress", "ingress", &client_pods, "TCP/18082"),
        want("http-server-egress", "egress", kube_dns, "UDP/53"),
    ];
    expected.sort();
    assert_eq!(learned_rules(&ns).await?, expected);

    drop(agent);
    uplink_task.abort();
    Ok(())
}

/// A child process killed when dropped (a failed test leaves no controller behind).
struct Running(Option<std::process::Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `GET path` on `127.0.0.1:port`: the body, or `None` while nothing answers.
async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
}

/// The real controller binary for one test namespace, with an agent pod's token on disk and the real
/// agent uplink streaming to it.
struct BinaryController {
    process: Running,
    ingest: u16,
    metrics: u16,
    settings: Settings,
    /// The node the agent pod (and the test's workloads) run on.
    node: String,
    _token: TokenFile,
    agent: uplink::UplinkSender,
    uplink_task: tokio::task::JoinHandle<()>,
    counters: UplinkCounters,
}

impl BinaryController {
    /// Starts the controller binary with `flush_interval` and `status_interval` (Go-style durations are
    /// what the chart passes for the latter), plus an agent pod on the test's node.
    async fn start(ns: &TestNamespace, flush_seconds: &str, status_interval: &str) -> Result<Self> {
        Self::start_with(ns, flush_seconds, status_interval, &[]).await
    }

    /// [`BinaryController::start`] with more environment for the binary (`(name, value)`, set last).
    async fn start_with(
        ns: &TestNamespace,
        flush_seconds: &str,
        status_interval: &str,
        env: &[(&str, &str)],
    ) -> Result<Self> {
        use network_enforcer_tests::scenario_fixture::{
            AGENT_SA, agent_token, pod_json, scheduled_pod, service_account_with_token,
        };
        let n = ns.name.clone();
        service_account_with_token(ns, AGENT_SA).await?;
        let (agent_pod, node) = scheduled_pod(ns, &pod_json("agent", AGENT_SA, None)?).await?;
        let token = TokenFile(
            std::env::temp_dir().join(format!("ne-binary-{}-{n}.token", std::process::id())),
        );
        std::fs::write(&token.0, agent_token(ns, AGENT_SA, &agent_pod).await?)?;
        let (ingest, metrics) = (free_port()?, free_port()?);
        let settings = Settings {
            ingest,
            metrics,
            flush_seconds: flush_seconds.to_string(),
            status_interval: status_interval.to_string(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let process = Running(Some(spawn_controller(ns, &settings)?));
        let counters = UplinkCounters::default();
        let (agent, uplink_task) = spawn_agent(ingest, &token.0, &node, &counters)?;
        Ok(Self {
            process,
            ingest,
            metrics,
            settings,
            node,
            _token: token,
            agent,
            uplink_task,
            counters,
        })
    }

    /// Starts the binary again, on the same ports, after [`BinaryController::exit`]: a new leader,
    /// which the agent reconnects to.
    fn restart(&mut self, ns: &TestNamespace) -> Result<()> {
        anyhow::ensure!(self.process.0.is_none(), "the controller still runs");
        self.process = Running(Some(spawn_controller(ns, &self.settings)?));
        Ok(())
    }

    /// Opens a stream of its own with the agent's token, as the agent pod would after a restart of its
    /// connection: the controller closes the agent's stream (replaced), whose held acknowledgements go
    /// with it; the agent reconnects (replacing this stream in turn) and resends what is unacknowledged.
    async fn replace_agent_stream(&self) -> Result<()> {
        use network_enforcer_api::uplink::flow_uplink_client::FlowUplinkClient;
        let token = std::fs::read_to_string(&self._token.0)?;
        let mut client =
            FlowUplinkClient::connect(format!("http://127.0.0.1:{}", self.ingest)).await?;
        let mut request = tonic::Request::new(tokio_stream::pending::<
            network_enforcer_api::uplink::FlowBatch,
        >());
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {}", token.trim()).parse()?);
        let (sent, reconnects) = (
            self.counters.batches_sent.get(),
            self.counters.reconnects.get(),
        );
        let replacing = client.stream(request).await?;
        // Reconnected, and what is unacknowledged is resent. A batch pending when the stream was
        // replaced may have been acknowledged on the old stream just before it closed (a status pass
        // wrote its violation): then nothing is left to resend (a CI run failed waiting for one).
        let c = &self.counters;
        wait::until(
            &format!(
                "the agent to reconnect and resend (before: sent {sent}, reconnects {reconnects})"
            ),
            Duration::from_secs(60),
            Duration::from_millis(50),
            || {
                c.reconnects.get() != reconnects
                    && (c.pending_batches.get() == 0 || c.batches_sent.get() != sent)
            },
            || agent_state(c),
        )
        .await?;
        drop(replacing);
        Ok(())
    }

    /// Stops the agent (its uplink, as a killed agent process) once every batch it sent is
    /// acknowledged, and starts a new one on the same node: a new agent process (`instance`), which
    /// numbers its batches from the start again. Returns the batches the old one had acknowledged.
    async fn restart_agent(&mut self, ns: &TestNamespace) -> Result<u64> {
        ns.wait_for(
            "the agent's batches to be acknowledged before it is killed",
            Duration::from_secs(60),
            || async { Ok((self.counters.pending_batches.get() == 0).then_some(())) },
        )
        .await
        .with_context(|| agent_state(&self.counters))?;
        self.uplink_task.abort();
        let acked = self.counters.batches_acked.get();
        self.counters = UplinkCounters::default();
        (self.agent, self.uplink_task) =
            spawn_agent(self.ingest, &self._token.0, &self.node, &self.counters)?;
        Ok(acked)
    }

    /// Whether `/metrics` has the line `line`.
    async fn metric_line(&self, line: &str) -> bool {
        let text = http_get(self.metrics, "/metrics").await.unwrap_or_default();
        text.lines().any(|l| l == line)
    }

    /// The value of the metric named `name` (without labels) in `/metrics`.
    async fn metric(&self, name: &str) -> Result<u64> {
        let text = http_get(self.metrics, "/metrics")
            .await
            .context("reading /metrics")?;
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .with_context(|| format!("{name} is not in /metrics"))
    }

    /// Waits until `/metrics` has the line `line`.
    async fn wait_for_metric(&self, ns: &TestNamespace, what: &str, line: &str) -> Result<()> {
        ns.wait_for(what, Duration::from_secs(90), || async {
            Ok(self.metric_line(line).await.then_some(()))
        })
        .await
    }

    /// Sends SIGTERM and waits for the exit; returns the exit status's success and the logs.
    async fn terminate(&mut self) -> Result<(bool, String)> {
        let pid = self.process.0.as_ref().context("the controller runs")?.id();
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        anyhow::ensure!(killed.success(), "kill -TERM {pid}");
        self.exit().await
    }

    /// Kills the process (SIGKILL): no last write, no goodbye on the streams, the Lease kept.
    fn kill(&mut self) -> Result<()> {
        let mut child = self.process.0.take().context("the controller runs")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// Waits (up to a minute) for the process to exit; returns its success and its logs.
    async fn exit(&mut self) -> Result<(bool, String)> {
        let child = self.process.0.take().context("the controller runs")?;
        let waiting = tokio::task::spawn_blocking(move || child.wait_with_output());
        let output = tokio::time::timeout(Duration::from_secs(60), waiting)
            .await
            .context("the controller exits after SIGTERM")???;
        Ok((
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        ))
    }
}

/// The real agent uplink of the test's agent pod, streaming to the controller on `ingest`.
fn spawn_agent(
    ingest: u16,
    token: &std::path::Path,
    node: &str,
    counters: &UplinkCounters,
) -> Result<(uplink::UplinkSender, tokio::task::JoinHandle<()>)> {
    Ok(uplink::spawn(
        UplinkConfig {
            backoff: Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_millis(1000),
            },
            ..UplinkConfig::new(format!("http://127.0.0.1:{ingest}"), token, node).insecure()
        },
        counters.clone(),
    )?)
}

/// How [`BinaryController`] runs the binary.
struct Settings {
    ingest: u16,
    metrics: u16,
    flush_seconds: String,
    status_interval: String,
    /// More environment, set after the rest (so it may override it).
    env: Vec<(String, String)>,
}

/// The controller binary for test namespace `ns`, watching only it.
fn spawn_controller(ns: &TestNamespace, settings: &Settings) -> Result<std::process::Child> {
    use network_enforcer_tests::scenario_fixture::AGENT_SA;
    let n = &ns.name;
    Ok(std::process::Command::new(debug_binary("controller"))
        .arg("run")
        .env("KUBECONFIG", ns.kubeconfig())
        .env("WATCH_NAMESPACE", n)
        .env("POD_NAMESPACE", n)
        .env("POD_NAME", "controller-0")
        .env("AGENT_SERVICE_ACCOUNT", format!("{n}/{AGENT_SA}"))
        .env("CONTROLLER_PROVIDER", "ebpf")
        .env("EXCLUDE_NAMESPACES", "kube-system")
        .env("INGEST_ADDRESS", format!("127.0.0.1:{}", settings.ingest))
        .env("INGEST_INSECURE", "true")
        .env("METRICS_ADDRESS", format!("127.0.0.1:{}", settings.metrics))
        // Off: the view's default port is one for the whole machine, and tests run at once.
        .env("UI_ADDRESS", "")
        .env("FLUSH_INTERVAL_SECONDS", &settings.flush_seconds)
        .env("WNP_STATUS_UPDATE_INTERVAL", &settings.status_interval)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .envs(settings.env.iter().map(|(k, v)| (k, v)))
        .stdout(std::process::Stdio::piped())
        .spawn()?)
}

impl Drop for BinaryController {
    fn drop(&mut self) {
        self.uplink_task.abort();
    }
}

/// The real controller binary, stopped with SIGTERM while an agent's batch waits for the next flush
/// (an hour away): it writes the proposals on its way out, exits cleanly and releases its Lease.
#[tokio::test]
async fn on_sigterm_the_controller_writes_what_is_pending_and_releases_its_lease() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    let ns = TestNamespace::create_with_crds("sigterm").await?;
    let Workloads { clients, server } = create_workloads(&ns, 1).await?;
    let n = ns.name.clone();
    let mut controller = BinaryController::start(&ns, "3600", "30s").await?;
    let service = cluster_ip(&n, "http-service", &ns.client).await?;
    assert!(controller.agent.send(vec![
        flow_record(
            &n,
            &clients[0].0,
            service,
            18080,
            Protocol::Tcp,
            Direction::Outbound,
            Outcome::Established,
        ),
        flow_record(
            &n,
            &server,
            clients[0].1,
            18080,
            Protocol::Tcp,
            Direction::Inbound,
            Outcome::Established,
        ),
    ]));
    // Merged and waiting for a flush: its acknowledgement is held.
    controller
        .wait_for_metric(
            &ns,
            "the controller to hold the batch's acknowledgement",
            "network_enforcer_controller_acks_waiting 1",
        )
        .await?;
    assert_eq!(
        controller.counters.batches_acked.get(),
        0,
        "{}",
        agent_state(&controller.counters)
    );

    let (success, logs) = controller.terminate().await?;
    assert!(success, "{logs}");
    let last = logs
        .lines()
        .find(|l| l.contains("last flush before exit"))
        .with_context(|| format!("no last flush in:\n{logs}"))?;
    assert!(last.contains("written: 2"), "{last}");

    let server_pods = format!("{n}/app=http-server");
    let client_pods = format!("{n}/app=http-client");
    assert_eq!(
        learned_rules(&ns).await?,
        [
            format!("deployment-http-client-egress egress {server_pods} TCP/18080"),
            format!("deployment-http-server-ingress ingress {client_pods} TCP/18080"),
        ]
    );
    let lease = Api::<Lease>::namespaced(ns.client.clone(), &n)
        .get("network-enforcer-controller")
        .await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "released on the way out"
    );
    Ok(())
}

/// The real controller binary, with a monitor-mode policy that denies the server's ingress: an agent's
/// batch carrying a violation is not acknowledged when its edge is written, only once the violation is
/// in the policy's status (a controller stopping before that is sent the batch again). Here the status
/// interval is an hour, so the acknowledgement is still held seconds after the proposal was written;
/// on SIGTERM the last status sync writes the violation.
#[tokio::test]
async fn evidence_is_acknowledged_only_once_its_violation_is_in_a_status() -> Result<()> {
    let (ns, mut controller, _) = violation_held("evidence-ack").await?;
    let (success, logs) = controller.terminate().await?;
    assert!(success, "{logs}");
    assert_violation_written(&ns, &logs).await
}

/// The agent's stream is closed while its batch's acknowledgement is held for the violation it
/// carries: the agent resends the batch on its next stream, and the controller learns from it again
/// but counts its violation once (docs/behaviour.md §3.8): `violationCount` is 1 after the last
/// status write, not 2.
#[tokio::test]
async fn a_batch_resent_while_its_violation_is_held_counts_once() -> Result<()> {
    let (ns, mut controller, _) = violation_held("resent-once").await?;
    controller.replace_agent_stream().await?;
    // The resent batch's acknowledgement is held again, by the agent's new stream.
    controller
        .wait_for_metric(
            &ns,
            "the resent batch's acknowledgement to be held",
            "network_enforcer_controller_acks_waiting 1",
        )
        .await?;
    assert_eq!(controller.counters.batches_acked.get(), 0);
    let (success, logs) = controller.terminate().await?;
    assert!(success, "{logs}");
    assert_violation_written(&ns, &logs).await
}

/// The controller writes a held violation on its way out (SIGTERM) and the next leader, whose memory
/// of counted occurrences starts empty, is sent the same occurrence again (what a batch resent after
/// a crash between the status write and its acknowledgement brings: the same record). The next
/// leader learns from it again, and its status write leaves `violationCount` at 1: the status already
/// counted that occurrence (docs/behaviour.md §3.6).
#[tokio::test]
async fn an_occurrence_sent_again_to_a_new_leader_counts_once() -> Result<()> {
    let (ns, mut controller, record) = violation_held("new-leader-once").await?;
    let (success, logs) = controller.terminate().await?;
    assert!(success, "{logs}");
    assert_violation_written(&ns, &logs).await?;
    controller.restart(&ns)?;
    assert!(controller.agent.send(vec![record]));
    // Taken in by the new leader, whose last status write (on SIGTERM) records what it holds.
    controller
        .wait_for_metric(
            &ns,
            "the new leader to take the record in",
            "network_enforcer_controller_records_received_total 1",
        )
        .await?;
    let (success, logs) = controller.terminate().await?;
    assert!(success, "{logs}");
    assert_violation_written(&ns, &logs).await
}

/// Issue 42, item 2: batches resent to a new leader count once even when the 60-second rule cannot
/// tell (docs/behaviour.md §1.10, §3.6). Two batches carry one connection of the same client to the
/// server, 61 s apart: two occurrences. A status pass writes them (`violationCount` 2) and then the
/// claims of both batches; their acknowledgements are still held by their proposal, whose writes
/// the API server refuses (a webhook that is down). The leader is killed (SIGKILL) and the agent resends what is unacknowledged to
/// the next leader. The earlier occurrence lies 61 s from the record's last one, so the 60-second
/// rule cannot tell it was counted: it would count again (3) without the claims the next leader
/// reads before it takes any batch. Checked to fail with the claims turned off (`EVIDENCE_CLAIMS_CONFIGMAP=""`: 3).
#[tokio::test]
async fn batches_resent_to_a_new_leader_count_once_even_61_s_apart() -> Result<()> {
    let (ns, mut controller, server, client) = guarded("claims-leader", "1s").await?;
    // The learned edge's proposal cannot be written: the acknowledgements wait for it.
    let refusal = StatusWritesFault::start_on(&ns, Writes::Proposals, StatusFault::Refuse).await?;
    let n = ns.name.clone();
    let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    for (i, at) in [now - 61_000, now].into_iter().enumerate() {
        let record = FlowRecord {
            first_seen_ms: at,
            last_seen_ms: at,
            ..flow_record(
                &n,
                &server,
                client,
                18080,
                Protocol::Tcp,
                Direction::Inbound,
                Outcome::Established,
            )
        };
        assert!(controller.agent.send(vec![record]));
        // One batch each: the next is sent once this one is.
        let c = &controller.counters;
        wait::until(
            "the batch to be sent",
            Duration::from_secs(30),
            Duration::from_millis(20),
            || c.batches_sent.get() > i as u64,
            || agent_state(c),
        )
        .await?;
    }
    let policies = ns.api::<network_enforcer_api::WorkloadNetworkPolicy>();
    let count = || async {
        Ok::<_, kube::Error>(
            policies
                .get("guard")
                .await?
                .status
                .map_or(0, |s| s.violation_count),
        )
    };
    ns.wait_for(
        "both occurrences in the status",
        Duration::from_secs(60),
        || async { Ok((count().await? == 2).then_some(())) },
    )
    .await?;
    // Both batches (sequences 1 and 2: the uplink makes a batch only of records) are in the
    // persisted claims (the ConfigMap the binary's default names, in its namespace).
    let maps = ns.api::<k8s_openapi::api::core::v1::ConfigMap>();
    ns.wait_for(
        "the claims of both batches persisted",
        Duration::from_secs(60),
        || async {
            use network_enforcer_controller::ingest::claims_store;
            let Some(map) = maps.get_opt("network-enforcer-evidence-claims").await? else {
                return Ok(None);
            };
            let Some(bytes) = map
                .binary_data
                .as_ref()
                .and_then(|d| d.get(claims_store::DATA_KEY))
            else {
                return Ok(None);
            };
            let claims = claims_store::decode("claims", &bytes.0)?.claims;
            let held = |sequence| claims.iter().any(|c| c.ranges.contains(sequence));
            Ok([1, 2].into_iter().all(held).then_some(()))
        },
    )
    .await?;
    controller.kill()?;
    // Their acknowledgements wait for the proposal: nothing was acknowledged (the later batch, which
    // taught nothing new, may have been once its occurrence and claim were written).
    let resent = controller.counters.pending_batches.get();
    anyhow::ensure!(
        resent >= 1,
        "acknowledged before the kill (nothing would be resent): {}",
        agent_state(&controller.counters)
    );
    refusal.end().await?;
    controller.restart(&ns)?;
    controller
        .wait_for_metric(
            &ns,
            "the next leader to take the resent batches in",
            &format!("network_enforcer_controller_records_received_total {resent}"),
        )
        .await?;
    let restored = controller
        .metric("network_enforcer_controller_evidence_claims_restored_processes")
        .await?;
    // Its last status write records whatever it counted.
    let (success, logs) = controller.terminate().await?;
    assert!(success, "{logs}");
    assert_eq!(
        count().await?,
        2,
        "two occurrences, each counted once (claims restored for {restored} agent process(es))\n{logs}"
    );
    Ok(())
}

/// Fault injection against a ground truth (docs/behaviour.md §1.10, §3.6, §3.7): the real agent
/// uplink sends one violating occurrence per batch (inbound to the server on its own port each time,
/// so each is a violation of `guard` and an edge to learn), while the test closes the agent's stream
/// (the agent resends), kills the agent once its batches are acknowledged and starts a new one (a new
/// agent process, numbering its batches from the start again: none is taken for a resend), kills the
/// controller with SIGKILL and starts it again (a new leader, resends of what was written but not
/// acknowledged), stops it with SIGTERM and starts it again, and has the
/// API server refuse every status write of the namespace for longer than the
/// `FAILED_PASSES_BEFORE_PARKED` passes (an admission webhook that is down; the policy is parked,
/// `status_writes_failing`), then delay each by 2 s (a webhook that hangs and fails open). Status
/// writes run every second throughout. Ground truth under the
/// counting rule: every port is learned, every occurrence is one violation counted once, and the
/// agent ends with every batch acknowledged (nothing lost on its side either).
#[tokio::test]
async fn faults_lose_no_occurrence_and_count_none_twice() -> Result<()> {
    const OCCURRENCES: u32 = 14;
    const FIRST_PORT: u32 = 18100;
    let (ns, mut controller, server, client) = guarded("faults-once", "1s").await?;
    let n = ns.name.clone();
    let mut faults = Vec::new();
    let mut refusal = None;
    let mut delay = None;
    // Batches acknowledged to agent processes killed on the way.
    let mut acked_before = 0;
    for i in 0..OCCURRENCES {
        let record = flow_record(
            &n,
            &server,
            client,
            FIRST_PORT + i,
            Protocol::Tcp,
            Direction::Inbound,
            Outcome::Established,
        );
        assert!(controller.agent.send(vec![record]));
        tokio::time::sleep(Duration::from_millis(300)).await;
        match i {
            2 | 9 => {
                controller.replace_agent_stream().await?;
                faults.push("stream closed");
                if i == 9 {
                    // Refused from before the next occurrence: it waits in a status nobody can
                    // write.
                    refusal =
                        Some(StatusWritesFault::start(&ns, "guard", StatusFault::Refuse).await?);
                    faults.push("status writes refused");
                }
            }
            3 | 8 => {
                acked_before += controller.restart_agent(&ns).await?;
                faults.push("agent killed + restarted");
            }
            5 => {
                controller.kill()?;
                controller.restart(&ns)?;
                faults.push("SIGKILL + restart");
            }
            7 => {
                let (success, logs) = controller.terminate().await?;
                assert!(success, "{logs}");
                controller.restart(&ns)?;
                faults.push("SIGTERM + restart");
            }
            11 => {
                // Refused for FAILED_PASSES_BEFORE_PARKED passes in a row, with observations
                // pending: the policy is parked (its observations no longer hold back acks).
                controller
                    .wait_for_metric(
                        &ns,
                        "the refused policy to be parked",
                        "network_enforcer_controller_status_writes_failing 1",
                    )
                    .await?;
                if let Some(refusal) = refusal.take() {
                    refusal.end().await?;
                }
                faults.push("status writes accepted again");
                // Then each write delayed: the next occurrences wait in slow status passes.
                delay = Some(StatusWritesFault::start(&ns, "guard", StatusFault::Delay).await?);
                faults.push("status writes delayed");
            }
            13 => {
                if let Some(delay) = delay.take() {
                    delay.end().await?;
                }
                faults.push("status writes prompt again");
            }
            _ => {}
        }
    }
    ns.wait_for(
        "every batch to be acknowledged",
        Duration::from_secs(90),
        || async {
            let c = &controller.counters;
            Ok(
                (acked_before + c.batches_acked.get() >= u64::from(OCCURRENCES)
                    && c.pending_batches.get() == 0)
                    .then_some(()),
            )
        },
    )
    .await
    .with_context(|| agent_state(&controller.counters))?;
    let (success, logs) = controller.terminate().await?;
    assert!(success, "{logs}");
    // The refusal lasted past FAILED_PASSES_BEFORE_PARKED: the policy's observations stopped
    // holding back acknowledgements, and were still written once the API server took them.
    assert!(logs.contains("status writes failing"), "{logs}");

    let status = ns
        .api::<network_enforcer_api::WorkloadNetworkPolicy>()
        .get("guard")
        .await?
        .status
        .unwrap_or_default();
    let mut ports: Vec<i32> = status
        .violations
        .iter()
        .filter_map(|v| v.dst_port)
        .collect();
    ports.sort();
    let expected: Vec<i32> = (0..OCCURRENCES).map(|i| (FIRST_PORT + i) as i32).collect();
    eprintln!(
        "faults: {faults:?}; occurrences sent {OCCURRENCES}, violations {}, violationCount {}; \
         agent: {}",
        status.violations.len(),
        status.violation_count,
        agent_state(&controller.counters)
    );
    assert_eq!(ports, expected, "lost none: {status:?}");
    assert_eq!(
        status.violation_count,
        i64::from(OCCURRENCES),
        "counted none twice: {status:?}"
    );
    let per_hour: i64 = status.violation_history.iter().map(|b| b.count).sum();
    assert_eq!(
        per_hour, status.violation_count,
        "the hourly history counts what violationCount counts: {status:?}"
    );
    let learned = learned_rules(&ns).await?;
    for port in &expected {
        let rule = format!("deployment-http-server-ingress ingress {n}/app=http-client TCP/{port}");
        assert!(learned.contains(&rule), "{rule} not learned: {learned:?}");
    }
    Ok(())
}

/// The real controller binary, with a violation held as in the test above, loses its Lease to another
/// replica: it exits, and on its way out still writes the violation into the status (the new leader
/// would never learn it: the agent's batch was merged here, and a resent one would be a repeat).
#[tokio::test]
async fn a_replica_that_loses_its_lease_still_writes_the_violations_it_holds() -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    let (ns, mut controller, _) = violation_held("lease-lost").await?;
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let stolen = serde_json::json!({"spec": {
        "holderIdentity": "another-replica",
        "leaseDurationSeconds": 3600,
        "renewTime": now,
    }});
    Api::<Lease>::namespaced(ns.client.clone(), &ns.name)
        .patch(
            "network-enforcer-controller",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&stolen),
        )
        .await?;
    let (success, logs) = controller.exit().await?;
    assert!(!success, "losing the Lease is an error exit\n{logs}");
    assert!(logs.contains("last flush before exit"), "{logs}");
    assert_violation_written(&ns, &logs).await
}

/// Coverage (docs/behaviour.md §3.12): an agent whose batches say it lost more events is reported
/// (a Warning Event `AgentDropping` on the Node), and one whose batches say it uses more CPU than its
/// budget (`AgentOverBudget`); while the node's agent streams, the node is covered; once no
/// stream of it has been open for `AGENT_SILENCE_AFTER`, the node is reported silent (the gauge, a
/// Warning Event `AgentSilent` on the Node), and reporting again once its agent reconnects (a Normal
/// Event `AgentReporting`).
#[tokio::test]
async fn a_node_whose_agent_stops_streaming_is_reported_silent_and_then_back() -> Result<()> {
    use k8s_openapi::api::events::v1::Event;
    use network_enforcer_api::uplink::AgentHealth;
    let ns = TestNamespace::create_with_crds("coverage").await?;
    // Its own reporting instance: the Events of other tests' controllers are not this one's.
    let instance = format!("coverage-{}", ns.name);
    let mut controller = BinaryController::start_with(
        &ns,
        "1",
        "30s",
        &[("AGENT_SILENCE_AFTER", "2s"), ("POD_NAME", &instance)],
    )
    .await?;
    let started = k8s_openapi::jiff::Timestamp::now();
    ns.wait_for(
        "the node to be judged covered",
        Duration::from_secs(60),
        || async {
            let ready = http_get(controller.metrics, "/readyz")
                .await
                .unwrap_or_default();
            Ok(ready
                .contains("every node that runs pods has an agent streaming")
                .then_some(()))
        },
    )
    .await?;
    // Events of cluster-scoped objects: in kube-system (docs/behaviour.md §3.12).
    let events = kube::Api::<Event>::namespaced(ns.client.clone(), "kube-system");
    let node = controller.node.clone();
    let of_ours = |reason: &'static str| {
        let (events, node, instance) = (events.clone(), node.clone(), instance.clone());
        async move {
            let list = events.list(&Default::default()).await?;
            anyhow::Ok(list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.reporting_instance.as_deref() == Some(instance.as_str())
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(node.as_str())
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Node")
            }))
        }
    };
    anyhow::ensure!(
        of_ours("AgentSilent").await?.is_none(),
        "silent while the agent streams"
    );
    // The agent says, batch after batch, that it lost more and more events (its ring buffer was
    // full): a Warning Event `AgentDropping` on the Node says what was lost. (The first report this
    // controller sees is its baseline; the batches keep coming until a look sees growth.)
    // Sends a batch a second with the health `health(i)` says, until a Warning Event `reason`.
    let until_event = |reason: &'static str, health: &dyn Fn(u64) -> AgentHealth| {
        let sender = controller.agent.clone();
        let of_ours = &of_ours;
        let health: Vec<AgentHealth> = (0..30).map(health).collect();
        async move {
            for health in health {
                let record = network_enforcer_api::uplink::FlowRecord::default();
                sender.send_with_health(vec![record], Vec::new(), Some(health));
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Some(event) = of_ours(reason).await? {
                    anyhow::ensure!(event.type_.as_deref() == Some("Warning"), "{event:?}");
                    return Ok(event.note.unwrap_or_default());
                }
            }
            anyhow::bail!("no {reason} Event within 30 s")
        }
    };
    let note = until_event("AgentDropping", &|i| AgentHealth {
        events_lost: 5 * i,
        ..Default::default()
    })
    .await?;
    anyhow::ensure!(
        note.contains("connection events (its ring buffer was full)"),
        "the Event says what was lost: {note}"
    );
    // The agent's process then uses 2 cores (its CPU time grows by 2 s each second; the default
    // budget is 1): a Warning Event `AgentOverBudget` on the Node gives the figure.
    let start_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    let note = until_event("AgentOverBudget", &|i| AgentHealth {
        cost_sampled_ms: start_ms + 1_000 * i as i64,
        cpu_ms: 2_000 * i,
        rss_bytes: 50 << 20,
        ..Default::default()
    })
    .await?;
    anyhow::ensure!(
        note.contains("CPU 2.00 cores (budget 1.00"),
        "the Event gives the figure and the budget: {note}"
    );
    controller
        .wait_for_metric(
            &ns,
            "the over-budget gauge",
            "network_enforcer_controller_agent_over_budget_nodes 1",
        )
        .await?;
    // The agent stops: its stream closes.
    controller.uplink_task.abort();
    controller
        .wait_for_metric(
            &ns,
            "the node reported silent",
            "network_enforcer_controller_agent_silent_nodes 1",
        )
        .await?;
    let silent = match ns
        .wait_for("the AgentSilent Event", Duration::from_secs(30), || {
            of_ours("AgentSilent")
        })
        .await
    {
        Ok(event) => event,
        Err(e) => {
            let (_, logs) = controller.terminate().await?;
            anyhow::bail!("{e:#}\nthe controller's log:\n{logs}");
        }
    };
    let note = silent.note.unwrap_or_default();
    anyhow::ensure!(
        silent.type_.as_deref() == Some("Warning") && note.contains("not observed"),
        "the Event says what is missing: {note}"
    );
    anyhow::ensure!(
        silent.event_time.as_ref().is_some_and(|t| t.0 >= started),
        "an Event of this run"
    );
    // It comes back.
    let (agent, task) = spawn_agent(
        controller.ingest,
        &controller._token.0,
        &node,
        &controller.counters,
    )?;
    (controller.agent, controller.uplink_task) = (agent, task);
    controller
        .wait_for_metric(
            &ns,
            "the node covered again",
            "network_enforcer_controller_agent_silent_nodes 0",
        )
        .await?;
    ns.wait_for("the AgentReporting Event", Duration::from_secs(30), || {
        of_ours("AgentReporting")
    })
    .await?;
    let (ok, _) = controller.terminate().await?;
    anyhow::ensure!(ok, "the controller exits cleanly");
    Ok(())
}

/// A test namespace with the client and server workloads, a monitor-mode policy `guard` denying
/// every ingress of the server, and the controller binary (flush every second, status sync every
/// `status_interval`) leading, its watches listed and its first status pass done. Returns the
/// server pod's name and a client pod's address.
async fn guarded(
    name: &str,
    status_interval: &str,
) -> Result<(TestNamespace, BinaryController, String, IpAddr)> {
    use network_enforcer_api::WorkloadNetworkPolicy;
    let ns = TestNamespace::create_with_crds(name).await?;
    let Workloads { clients, server } = create_workloads(&ns, 1).await?;
    let n = ns.name.clone();
    let guard: WorkloadNetworkPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": "guard", "namespace": n},
        "spec": {"backend": "kubernetes", "direction": "Ingress", "mode": "monitor",
                 "targetRef": {"kind": "Deployment", "name": "http-server"},
                 "kubernetes": {"podSelector": {"matchLabels": {"app": "http-server"}},
                                "policyTypes": ["Ingress"]}}
    }))?;
    let policies = ns.api::<WorkloadNetworkPolicy>();
    policies
        .create(&kube::api::PostParams::default(), &guard)
        .await?;
    let controller = BinaryController::start(&ns, "1", status_interval).await?;
    // Leading, and its evidence passes (which start once the status sync's watches have listed)
    // evaluate the policy.
    controller
        .wait_for_metric(
            &ns,
            "the controller to lead",
            "network_enforcer_controller_leader 1",
        )
        .await?;
    controller
        .wait_for_metric(
            &ns,
            "the evidence passes to know the policy",
            "network_enforcer_controller_evidence_policies 1",
        )
        .await?;
    // The first status pass runs as soon as the watches have listed, the next an interval later: a
    // record sent before the first has ended could be written by it (a test failed so in CI).
    controller
        .wait_for_metric(
            &ns,
            "the first status pass",
            "network_enforcer_controller_status_passes_total 1",
        )
        .await?;
    Ok((ns, controller, server, clients[0].1))
}

/// A test namespace with a monitor-mode policy denying the server's ingress, the controller binary
/// (flush every second, status sync hourly) and one agent batch carrying a violation of it, merged and
/// written into the proposal but held: its violation is not in a status yet.
async fn violation_held(name: &str) -> Result<(TestNamespace, BinaryController, FlowRecord)> {
    let (ns, controller, server, client) = guarded(name, "1h").await?;
    let n = ns.name.clone();
    let record = flow_record(
        &n,
        &server,
        client,
        18080,
        Protocol::Tcp,
        Direction::Inbound,
        Outcome::Established,
    );
    assert!(controller.agent.send(vec![record.clone()]));
    let server_rule =
        format!("deployment-http-server-ingress ingress {n}/app=http-client TCP/18080");
    ns.wait_for(
        "the edge to be written",
        Duration::from_secs(60),
        || async {
            Ok(learned_rules(&ns)
                .await?
                .contains(&server_rule)
                .then_some(()))
        },
    )
    .await?;
    // Written, flushed again and again (every second), yet held: the violation is not in a status.
    let flushes = controller
        .metric("network_enforcer_controller_proposal_flushes_total")
        .await?;
    controller
        .wait_for_metric(
            &ns,
            "three more flushes",
            &format!(
                "network_enforcer_controller_proposal_flushes_total {}",
                flushes + 3
            ),
        )
        .await?;
    assert_eq!(
        controller.counters.batches_acked.get(),
        0,
        "acknowledged before the violation was written; {}",
        agent_state(&controller.counters)
    );
    assert!(
        controller
            .metric_line("network_enforcer_controller_acks_waiting 1")
            .await
    );

    Ok((ns, controller, record))
}

/// The policy `guard` holds exactly one violation, counted once.
async fn assert_violation_written(ns: &TestNamespace, logs: &str) -> Result<()> {
    let status = ns
        .api::<network_enforcer_api::WorkloadNetworkPolicy>()
        .get("guard")
        .await?
        .status
        .unwrap_or_default();
    assert_eq!(
        status.violations.len(),
        1,
        "the last status sync writes the held violation: {status:?}\n{logs}"
    );
    assert_eq!(
        status.violation_count, 1,
        "one occurrence counts once: {status:?}\n{logs}"
    );
    Ok(())
}

/// A test namespace with a monitor-mode policy `name` on the server's ingress with `ingress` rules,
/// and the controller binary persisting the protect gate's history every second (warm-up 1 s),
/// leading and past its first status pass; returns the server's name and the client's address too.
async fn with_gate_history(
    namespace: &str,
    name: &str,
    ingress: serde_json::Value,
) -> Result<(TestNamespace, BinaryController, String, IpAddr)> {
    use network_enforcer_api::WorkloadNetworkPolicy;
    let ns = TestNamespace::create_with_crds(namespace).await?;
    let Workloads { clients, server } = create_workloads(&ns, 1).await?;
    let policy: WorkloadNetworkPolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "WorkloadNetworkPolicy",
        "metadata": {"name": name, "namespace": ns.name},
        "spec": {"backend": "kubernetes", "direction": "Ingress", "mode": "monitor",
                 "targetRef": {"kind": "Deployment", "name": "http-server"},
                 "kubernetes": {"podSelector": {"matchLabels": {"app": "http-server"}},
                                "policyTypes": ["Ingress"], "ingress": ingress}}
    }))?;
    ns.api::<WorkloadNetworkPolicy>()
        .create(&kube::api::PostParams::default(), &policy)
        .await?;
    let env = [
        ("EDGE_HISTORY_PERSIST_INTERVAL", "1s"),
        ("EDGE_HISTORY_WARMUP", "1s"),
    ];
    let controller = BinaryController::start_with(&ns, "1", "1s", &env).await?;
    for (what, line) in [
        (
            "the controller to lead",
            "network_enforcer_controller_leader 1",
        ),
        (
            "the first status pass",
            "network_enforcer_controller_status_passes_total 1",
        ),
    ] {
        controller.wait_for_metric(&ns, what, line).await?;
    }
    Ok((ns, controller, server, clients[0].1))
}

/// The protect gate answers after a restart from the history the last leader persisted
/// (docs/behaviour.md §3.11), not only from violation records. A flow the policy allows (so no
/// violation record names it) is observed; the leader persists its history and is killed (SIGKILL:
/// no last write); the new leader reads the history back. Once its warm-up is over, the policy is
/// switched to protect without the rule that allowed the flow: the gate must say the observed flow
/// would be blocked. A new leader that knew only the violation records would say nothing is.
#[tokio::test]
async fn the_protect_gate_knows_an_allowed_flow_after_the_leader_is_killed() -> Result<()> {
    use network_enforcer_api::WorkloadNetworkPolicy;
    let allows_the_client = serde_json::json!([{
        "from": [{"podSelector": {"matchLabels": {"app": "http-client"}}}],
        "ports": [{"protocol": "TCP", "port": 18080}]
    }]);
    let (ns, mut controller, server, client) =
        with_gate_history("gate-restart", "server-in", allows_the_client).await?;
    let n = ns.name.clone();
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let record = flow_record(
        &n,
        &server,
        client,
        18080,
        Protocol::Tcp,
        Direction::Inbound,
        Outcome::Established,
    );
    assert!(controller.agent.send(vec![record]));
    for (what, line) in [
        (
            "the flow in the gate's history",
            "network_enforcer_controller_edge_history_edges 1",
        ),
        (
            "the history persisted",
            "network_enforcer_controller_edge_history_persisted_edges 1",
        ),
    ] {
        controller.wait_for_metric(&ns, what, line).await?;
    }
    let status = policies.get("server-in").await?.status.unwrap_or_default();
    assert!(
        status.violations.is_empty(),
        "the flow is allowed: no violation record may carry it over: {status:?}"
    );

    controller.kill()?;
    controller.restart(&ns)?;
    for (what, line) in [
        ("the new leader", "network_enforcer_controller_leader 1"),
        (
            "the new leader's first status pass",
            "network_enforcer_controller_status_passes_total 1",
        ),
    ] {
        controller.wait_for_metric(&ns, what, line).await?;
    }
    // Past the new leader's warm-up (1 s), the gate answers from its history alone.
    tokio::time::sleep(Duration::from_secs(2)).await;
    policies
        .patch(
            "server-in",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "spec": {"mode": "protect", "kubernetes": {"ingress": []}}
            })),
        )
        .await?;
    let condition = ns
        .wait_for(
            "the gate's verdict on the protect policy",
            Duration::from_secs(60),
            || async {
                let policy = policies.get("server-in").await?;
                Ok(policy
                    .status
                    .unwrap_or_default()
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == "WouldBlock" && c.status == "True"))
            },
        )
        .await;
    let Ok(condition) = condition else {
        let conditions = policies
            .get("server-in")
            .await?
            .status
            .unwrap_or_default()
            .conditions;
        anyhow::bail!(
            "the new leader's gate does not know the flow the last leader saw: {conditions:?}"
        );
    };
    assert_eq!(condition.reason, "WouldBlockObservedFlows", "{condition:?}");
    assert!(
        condition.message.contains("http-client") && condition.message.contains("18080"),
        "{condition:?}"
    );
    Ok(())
}

/// Cluster proposals (docs/behaviour.md §1.11, §4.9), with the real controller binary learning every
/// second from what the real uplink reports: traffic inside the namespace and to an outside address
/// becomes `ne-isolate-<ns>` (Admin: Pass from the namespace itself, Deny the rest) and
/// `ne-floor-<ns>` (Baseline: the namespace, the address, DNS, Deny the rest). Labelled
/// `promote=monitor`, the isolation records a call from another namespace (a kube-dns pod into the
/// server) in the proposal's status, creating nothing. Labelled `promote=protect`, it becomes a
/// ClusterNetworkPolicy owned by its proposal; edited by hand it is brought back; unlabelled it is
/// deleted.
#[tokio::test]
async fn cluster_proposals_are_learned_from_the_namespace_graph_and_promoted() -> Result<()> {
    use network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy;
    use network_enforcer_api::cluster_proposal::ClusterNetworkPolicyProposal;
    let ns = TestNamespace::create_with_crds("cnp-learn").await?;
    let Workloads { clients, server } = create_workloads(&ns, 1).await?;
    let n = ns.name.clone();
    let (isolate, floor) = (format!("ne-isolate-{n}"), format!("ne-floor-{n}"));
    // Cluster-scoped: the namespace's deletion does not take them.
    struct Leftovers(PathBuf, Vec<String>);
    impl Drop for Leftovers {
        fn drop(&mut self) {
            for kind in ["clusternetworkpolicies", "clusternetworkpolicyproposals"] {
                let mut args = vec!["delete", kind, "--ignore-not-found", "--wait=false"];
                args.extend(self.1.iter().map(String::as_str));
                let _ = network_enforcer_tests::cluster::components::kubectl(&self.0, &args);
            }
        }
    }
    let _leftovers = Leftovers(
        ns.kubeconfig().to_path_buf(),
        vec![isolate.clone(), floor.clone()],
    );

    // Signed as the chart's controller signs: promotion checks the signature of the spec read back
    // from the API server.
    let key =
        TokenFile(std::env::temp_dir().join(format!("ne-cnp-key-{}-{n}", std::process::id())));
    std::fs::write(&key.0, "k".repeat(48))?;
    let key_path = key.0.display().to_string();
    let env = [
        ("CLUSTER_PROPOSALS_INTERVAL", "1s"),
        // Learning waits for the history's warm-up (2m by default).
        ("EDGE_HISTORY_WARMUP", "1s"),
        ("PROPOSAL_SIGNING_KEY_FILE", key_path.as_str()),
    ];
    let controller = BinaryController::start_with(&ns, "1", "1s", &env).await?;
    controller
        .wait_for_metric(
            &ns,
            "the controller to lead",
            "network_enforcer_controller_leader 1",
        )
        .await?;
    let inside = flow_record(
        &n,
        &server,
        clients[0].1,
        18080,
        Protocol::Tcp,
        Direction::Inbound,
        Outcome::Established,
    );
    let outside = flow_record(
        &n,
        &clients[0].0,
        "203.0.113.7".parse()?,
        443,
        Protocol::Tcp,
        Direction::Outbound,
        Outcome::Established,
    );
    assert!(controller.agent.send(vec![inside, outside]));

    let proposals = kube::Api::<ClusterNetworkPolicyProposal>::all(ns.client.clone());
    let (isolation, baseline) = ns
        .wait_for("both proposals", Duration::from_secs(60), || async {
            let (a, b) = (
                proposals.get_opt(&isolate).await?,
                proposals.get_opt(&floor).await?,
            );
            // The floor has the outside address once the record that names it is learned.
            Ok(a.zip(b).filter(|(_, b)| {
                serde_json::to_string(&b.spec)
                    .unwrap_or_default()
                    .contains("203.0.113.7/32")
            }))
        })
        .await?;
    let spec = serde_json::to_value(&isolation.spec.policy)?;
    assert_eq!(spec["tier"], "Admin", "{spec}");
    assert_eq!(
        spec["subject"]["namespaces"]["matchLabels"]["kubernetes.io/metadata.name"], n,
        "{spec}"
    );
    let actions: Vec<&str> = spec["ingress"]
        .as_array()
        .context("ingress rules")?
        .iter()
        .filter_map(|r| r["action"].as_str())
        .collect();
    assert_eq!(actions, ["Pass", "Deny"], "{spec}");
    assert_eq!(baseline.spec.policy.tier, "Baseline");
    assert!(
        isolation
            .annotations()
            .contains_key("networkenforcer.kubewarden.io/learned-digest"),
        "learning signs what it writes"
    );
    assert!(
        isolation.status.and_then(|s| s.last_learned_time).is_some(),
        "learning says when"
    );

    // Monitor (issue 46 item 4): nothing created; a call into the namespace from kube-system, which
    // the isolation would deny, is recorded in the proposal's status.
    proposals
        .patch(
            &isolate,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {
                "networkenforcer.kubewarden.io/promote": "monitor"}}})),
        )
        .await?;
    let dns_pod = Api::<Pod>::namespaced(ns.client.clone(), "kube-system")
        .list(&ListParams::default().labels("k8s-app=kube-dns"))
        .await?
        .items
        .into_iter()
        .find_map(|p| p.status?.pod_ip)
        .context("a kube-dns pod with an address")?;
    let from_kube_system = flow_record(
        &n,
        &server,
        dns_pod.parse()?,
        18080,
        Protocol::Tcp,
        Direction::Inbound,
        Outcome::Established,
    );
    let recorded = ns
        .wait_for(
            "the cross-namespace call recorded on the proposal",
            Duration::from_secs(60),
            || async {
                // Sent again until recorded: the status sync must have seen the label first.
                controller.agent.send(vec![from_kube_system.clone()]);
                let status = proposals.get(&isolate).await?.status.unwrap_or_default();
                Ok(status
                    .violations
                    .into_iter()
                    .find(|v| v.source.namespace == "kube-system"))
            },
        )
        .await?;
    assert_eq!(
        (
            recorded.denying_policy_name.as_str(),
            recorded.direction,
            recorded.action,
            recorded.dest.namespace.as_str(),
        ),
        (
            isolate.as_str(),
            Some(network_enforcer_api::Direction::Ingress),
            network_enforcer_api::PolicyMode::Monitor,
            n.as_str()
        )
    );
    // The render loop's pass (every 10 s) says so in the condition.
    ns.wait_for(
        "Rendered=False, Monitored on the proposal",
        Duration::from_secs(30),
        || async {
            let p = proposals.get(&isolate).await?;
            Ok(p.status
                .unwrap_or_default()
                .conditions
                .iter()
                .any(|c| c.type_ == "Rendered" && c.status == "False" && c.reason == "Monitored")
                .then_some(()))
        },
    )
    .await?;
    assert!(
        kube::Api::<ClusterNetworkPolicy>::all(ns.client.clone())
            .get_opt(&isolate)
            .await?
            .is_none(),
        "monitor creates no ClusterNetworkPolicy"
    );

    // Promoted: the ClusterNetworkPolicy of the same name, owned by the proposal.
    proposals
        .patch(
            &isolate,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {
                "networkenforcer.kubewarden.io/promote": "protect"}}})),
        )
        .await?;
    let policies = kube::Api::<ClusterNetworkPolicy>::all(ns.client.clone());
    let created = ns
        .wait_for(
            "the promoted ClusterNetworkPolicy",
            Duration::from_secs(60),
            || async { Ok(policies.get_opt(&isolate).await?) },
        )
        .await?;
    assert_eq!(created.spec, isolation.spec.policy);
    let owner = &created
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default()[0];
    assert_eq!(
        (owner.kind.as_str(), Some(owner.uid.clone())),
        (
            "ClusterNetworkPolicyProposal",
            isolation.metadata.uid.clone()
        )
    );
    ns.wait_for(
        "Rendered=True on the proposal",
        Duration::from_secs(30),
        || async {
            let p = proposals.get(&isolate).await?;
            Ok(p.status
                .unwrap_or_default()
                .conditions
                .iter()
                .any(|c| c.type_ == "Rendered" && c.status == "True")
                .then_some(()))
        },
    )
    .await?;

    controller
        .wait_for_metric(
            &ns,
            "the gauge of cluster policies in force",
            "network_enforcer_controller_cluster_proposals_in_force 1",
        )
        .await?;
    assert!(
        controller
            .metric("network_enforcer_controller_cluster_proposals_learned_total")
            .await?
            >= 2
    );

    // Edited by hand: brought back within the render interval (10 s).
    policies
        .patch(
            &isolate,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"priority": 5}})),
        )
        .await?;
    ns.wait_for("the drift repaired", Duration::from_secs(30), || async {
        let p = policies.get(&isolate).await?;
        Ok((p.spec == isolation.spec.policy).then_some(()))
    })
    .await?;

    // Unlabelled: deleted.
    proposals
        .patch(
            &isolate,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {
                "networkenforcer.kubewarden.io/promote": null}}})),
        )
        .await?;
    ns.wait_for(
        "the ClusterNetworkPolicy deleted",
        Duration::from_secs(30),
        || async { Ok(policies.get_opt(&isolate).await?.is_none().then_some(())) },
    )
    .await?;
    Ok(())
}

/// Issue 42 item 6, a restart during a promotion to protect: the real controller binary learns the
/// server's ingress proposal from the real uplink; the test labels it `promote=protect` and kills the
/// controller (SIGKILL) at once, when the promotion has at best begun. The API server refuses every
/// delete of a proposal (a webhook that fails closed), so the next leader creates the policy and
/// renders it but cannot take the proposal away; it is killed there, half way, the refusal ends, and
/// the third leader finishes from what is in the API: exactly one policy, in protect, promoted from
/// the proposal, with the learned rule; the proposal gone; the NetworkPolicy rendered and owned by
/// the policy.
#[tokio::test]
async fn a_promotion_to_protect_is_finished_by_the_next_leader_whenever_the_last_dies() -> Result<()>
{
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    use network_enforcer_api::keys::PROMOTED_FROM_LABEL;
    use network_enforcer_api::{PolicyMode, WorkloadNetworkPolicy};
    const NAME: &str = "deployment-http-server-ingress";
    let ns = TestNamespace::create_with_crds("promote-kill").await?;
    let Workloads { clients, server } = create_workloads(&ns, 1).await?;
    let n = ns.name.clone();
    let mut controller = BinaryController::start(&ns, "1", "1s").await?;
    controller
        .wait_for_metric(
            &ns,
            "the controller to lead",
            "network_enforcer_controller_leader 1",
        )
        .await?;
    let record = flow_record(
        &n,
        &server,
        clients[0].1,
        18080,
        Protocol::Tcp,
        Direction::Inbound,
        Outcome::Established,
    );
    assert!(controller.agent.send(vec![record]));
    let learned = format!("{NAME} ingress {n}/app=http-client TCP/18080");
    ns.wait_for("the learned proposal", Duration::from_secs(60), || async {
        Ok(learned_rules(&ns).await?.contains(&learned).then_some(()))
    })
    .await?;

    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let network_policies = ns.api::<NetworkPolicy>();
    let rendered = || async {
        Ok::<_, kube::Error>(network_policies.get_opt(NAME).await?.is_some_and(|np| {
            np.owner_references()
                .iter()
                .any(|o| o.kind == "WorkloadNetworkPolicy" && o.name == NAME)
        }))
    };
    let refusal =
        StatusWritesFault::start_on(&ns, Writes::ProposalDeletes, StatusFault::Refuse).await?;
    proposals
        .patch(
            NAME,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "metadata": {"labels": {"networkenforcer.kubewarden.io/promote": "protect"}}
            })),
        )
        .await?;
    controller.kill()?;
    controller.restart(&ns)?;
    ns.wait_for(
        "the policy created and rendered, the proposal's delete refused",
        Duration::from_secs(60),
        || async {
            let created = policies.get_opt(NAME).await?.is_some();
            Ok((created && rendered().await?).then_some(()))
        },
    )
    .await?;
    anyhow::ensure!(
        proposals.get_opt(NAME).await?.is_some(),
        "the refusal did not hold the proposal"
    );
    controller.kill()?;
    refusal.end().await?;
    controller.restart(&ns)?;
    ns.wait_for(
        "the next leader to finish the promotion",
        Duration::from_secs(60),
        || async {
            let proposal_gone = proposals.get_opt(NAME).await?.is_none();
            Ok((proposal_gone && rendered().await?).then_some(()))
        },
    )
    .await?;
    let all = policies.list(&ListParams::default()).await?.items;
    assert_eq!(all.len(), 1, "one policy: {all:#?}");
    let policy = &all[0];
    assert_eq!(policy.spec.mode, PolicyMode::Protect, "{policy:#?}");
    assert_eq!(
        policy.labels().get(PROMOTED_FROM_LABEL),
        Some(&network_enforcer_api::naming::promoted_from_value(NAME)),
        "{policy:#?}"
    );
    let ingress = serde_json::to_value(&policy.spec)?["kubernetes"]["ingress"].clone();
    assert!(
        ingress.to_string().contains("18080") && ingress.to_string().contains("http-client"),
        "the learned rule: {ingress}"
    );
    let (success, logs) = controller.terminate().await?;
    assert!(success, "{logs}");
    Ok(())
}

/// Issue 42 items 4 and 6: the protect gate's verdict on a policy is the same before and after the
/// leader is killed (SIGKILL), for the same observed traffic, once the history was persisted (the
/// documented bound: one persist interval, 1 s here). In between the condition may say `NoHistory`,
/// never `NoObservedFlowBlocked`.
#[tokio::test]
async fn the_gate_gives_the_same_verdict_after_the_leader_is_killed() -> Result<()> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use network_enforcer_api::WorkloadNetworkPolicy;
    let (ns, mut controller, server, client) =
        with_gate_history("gate-verdict", "guard", serde_json::json!([])).await?;
    let n = ns.name.clone();
    let policies = ns.api::<WorkloadNetworkPolicy>();
    let records = (0..3)
        .map(|i| {
            flow_record(
                &n,
                &server,
                client,
                18100 + i,
                Protocol::Tcp,
                Direction::Inbound,
                Outcome::Established,
            )
        })
        .collect();
    assert!(controller.agent.send(records));
    let would_block = || async {
        let policy = policies.get("guard").await?;
        Ok::<Option<Condition>, kube::Error>(
            policy
                .status
                .unwrap_or_default()
                .conditions
                .into_iter()
                .find(|c| c.type_ == "WouldBlock"),
        )
    };
    let before = ns
        .wait_for(
            "the gate's verdict on all three flows",
            Duration::from_secs(60),
            || async {
                Ok(would_block().await?.filter(|c| {
                    c.status == "True"
                        && c.message
                            .starts_with("3 of 3 observed flows would be blocked")
                }))
            },
        )
        .await?;
    controller
        .wait_for_metric(
            &ns,
            "the history persisted",
            "network_enforcer_controller_edge_history_persisted_edges 3",
        )
        .await?;

    controller.kill()?;
    controller.restart(&ns)?;
    controller
        .wait_for_metric(
            &ns,
            "the new leader to read the history back",
            "network_enforcer_controller_edge_history_restored_edges 3",
        )
        .await?;
    // Past its warm-up (1 s), through several status passes and reconciles (1 s each), every
    // verdict the new leader writes is the old one; `NoHistory` only before it can answer.
    let verdict = |c: &Condition| (c.status.clone(), c.reason.clone(), c.message.clone());
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        let now = would_block()
            .await?
            .context("the WouldBlock condition is gone")?;
        if now.reason != "NoHistory" && !seen.contains(&verdict(&now)) {
            seen.push(verdict(&now));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        seen,
        vec![verdict(&before)],
        "the same verdict after the restart, and no other on the way"
    );
    let (success, logs) = controller.terminate().await?;
    assert!(success, "{logs}");
    Ok(())
}
