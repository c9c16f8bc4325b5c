//! One phase.

use super::*;

impl PhaseResult {
    pub(super) fn meets_goal(&self) -> bool {
        !self.drops()
            && self.min_agent_per_sec >= GOAL_RATE * SUSTAINED
            && self.p99_ms <= GOAL_P99_MS
            && self.rss_mib <= GOAL_RSS_MIB
    }

    pub(super) fn drops(&self) -> bool {
        self.refused_streams > 0
            || self.rejected > 0
            || self.unacked > 0
            || self.sustaining < self.agents
    }

    pub(super) fn print(&self) {
        println!(
            "    accepted {:.0} records/s of {:.0} offered (slowest agent {:.0}/s, {}/{} sustaining); \
             ack p50 {:.0} ms p99 {:.0} ms",
            self.records_per_sec,
            self.offered_per_sec,
            self.min_agent_per_sec,
            self.sustaining,
            self.agents,
            self.p50_ms,
            self.p99_ms
        );
        println!(
            "    controller {:.2} cores, peak RSS {:.0} MiB, {:.1} proposal writes/s; simulator {:.2} \
             cores; machine {:.2} cores busy",
            self.cpu_cores,
            self.rss_mib,
            self.writes_per_sec,
            self.simulator_cores,
            self.machine_cores
        );
        println!(
            "    connects: {:.1}s, {:.2} TokenReviews per first connect, {:.2} per reconnect; \
             refused streams {}, rejected records {}, evidence dropped {}, unacked batches {}",
            self.connect_seconds,
            self.reviews_first,
            self.reviews_reconnect,
            self.refused_streams,
            self.rejected,
            self.evidence_dropped,
            self.unacked
        );
        println!(
            "    API server GET p50 {:.0} ms p99 {:.0} ms; {} proposals, {:.0} KiB in all",
            self.api_get_p50_ms, self.api_get_p99_ms, self.proposals, self.proposal_kib
        );
        if let Some(e) = &self.first_error {
            println!("    first stream error: {e}");
        }
    }
}

/// Shared by the agents of one phase: when the measured window is (nanoseconds since `base`; 0:
/// not known yet) and when to stop sending.
pub(super) struct Window {
    base: Instant,
    start: AtomicU64,
    end: AtomicU64,
}

impl Window {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            start: AtomicU64::new(u64::MAX),
            end: AtomicU64::new(u64::MAX),
        }
    }

    fn at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.base).as_nanos() as u64
    }

    pub(super) fn contains(&self, t: Instant) -> bool {
        let t = self.at(t);
        t >= self.start.load(Ordering::Relaxed) && t < self.end.load(Ordering::Relaxed)
    }

    pub(super) fn over(&self, t: Instant) -> bool {
        self.at(t) >= self.end.load(Ordering::Relaxed)
    }
}

pub(super) async fn phase(
    n: usize,
    fleet: &Fleet,
    settings: &Settings,
    bin: &Path,
    kubeconfig: &Path,
    tls: &Pki,
) -> Result<PhaseResult> {
    // Start from no proposals, so every phase learns the same edges anew.
    fleet
        .apps_ns
        .api::<WorkloadNetworkPolicyProposal>()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("deleting the previous phase's proposals")?;
    let logs = run::workspace_root().join("target/bench");
    std::fs::create_dir_all(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let log = logs.join(format!("fleet-controller-{n}.log"));
    let mut controller = Controller::start(bin, kubeconfig, fleet, settings, tls, &log)?;
    controller
        .wait_ready()
        .await
        .with_context(|| format!("controller log: {}", log.display()))?;
    let endpoint = format!("https://127.0.0.1:{}", controller.ingest_port);
    let ca = Certificate::from_pem(&tls.ca);
    let agents = &fleet.agents[..n];

    // First connects: open a stream (the controller authenticates before answering) and drop it.
    let reviews0 = api_token_reviews(&fleet.client).await;
    let t = Instant::now();
    let firsts: Vec<Result<()>> = futures::stream::iter(agents.iter().map(|a| {
        let (endpoint, ca) = (endpoint.clone(), ca.clone());
        async move {
            let (_channel, tx, _acks) = open(&endpoint, ca, a).await?;
            drop(tx);
            Ok(())
        }
    }))
    .buffer_unordered(CONCURRENCY)
    .collect()
    .await;
    let connect_seconds = t.elapsed().as_secs_f64();
    let first_failures = firsts.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = firsts.into_iter().find(|r| r.is_err()) {
        println!("    {first_failures} first connects failed, e.g. {e:#}");
    }
    let reviews1 = api_token_reviews(&fleet.client).await;

    // Reconnects, kept: the streams of the phase.
    let window = Arc::new(Window::new());
    let interval = Duration::from_millis(settings.batch_ms);
    let per_batch = settings.records_per_batch();
    let opened: Vec<Result<_>> = futures::stream::iter(agents.iter().enumerate().map(|(i, a)| {
        let (endpoint, ca) = (endpoint.clone(), ca.clone());
        async move { open(&endpoint, ca, a).await.map(|s| (i, s)) }
    }))
    .buffer_unordered(CONCURRENCY)
    .collect()
    .await;
    let reviews2 = api_token_reviews(&fleet.client).await;
    let mut tasks = Vec::new();
    let mut open_failures = Vec::new();
    for r in opened {
        match r {
            Ok((i, (channel, tx, acks))) => {
                let mix = Mix::new(
                    &agents[i],
                    fleet.pod_ips.clone(),
                    fleet.services.clone(),
                    i as u64,
                    settings.profile,
                );
                let window = window.clone();
                let node = agents[i].node.clone();
                let new_edge_every = settings.new_edge_every;
                let new_edge_turn = if settings.new_edges_spread && new_edge_every > 0 {
                    i as u64 % new_edge_every
                } else {
                    0
                };
                // Spread the agents' batches over the interval, as real agents' timers are.
                let offset = interval.mul_f64((i as f64 * 0.618_034) % 1.0);
                tasks.push(tokio::spawn(async move {
                    let _channel = channel;
                    agent_loop(
                        node,
                        mix,
                        tx,
                        acks,
                        window,
                        interval,
                        offset,
                        per_batch,
                        (new_edge_every, new_edge_turn),
                    )
                    .await
                }));
            }
            Err(e) => open_failures.push(format!("{e:#}")),
        }
    }
    if !open_failures.is_empty() {
        println!(
            "    {} streams could not be opened, e.g. {}",
            open_failures.len(),
            open_failures[0]
        );
    }

    tokio::time::sleep(Duration::from_secs(settings.warmup)).await;
    let start = Instant::now();
    let metrics0 = controller.metrics().await;
    let proc0 = controller.proc();
    let self0 = ProcSample::of("/proc/self");
    let machine0 = machine_jiffies();
    window.start.store(window.at(start), Ordering::Relaxed);
    window.end.store(
        window.at(start + Duration::from_secs(settings.seconds)),
        Ordering::Relaxed,
    );
    // The API server's own latency meanwhile: a GET of a small object every 250 ms.
    let probe = {
        let api = Api::<k8s_openapi::api::core::v1::Namespace>::all(fleet.client.clone());
        let name = fleet.apps_ns.name.clone();
        let end = start + Duration::from_secs(settings.seconds);
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while Instant::now() < end {
                let t = Instant::now();
                if api.get(&name).await.is_ok() {
                    samples.push(t.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            samples
        })
    };
    tokio::time::sleep(Duration::from_secs(settings.seconds)).await;
    let elapsed = start.elapsed().as_secs_f64();
    let mut api_gets = probe.await.unwrap_or_default();
    api_gets.sort_unstable();
    let metrics1 = controller.metrics().await;
    let proc1 = controller.proc();
    let self1 = ProcSample::of("/proc/self");
    let machine1 = machine_jiffies();

    // The agents stop sending at the end of the window and wait for their last acks.
    let drain = Duration::from_secs(10 + 3 * settings.flush_seconds);
    let mut outcomes = Vec::new();
    for task in tasks {
        match tokio::time::timeout(drain, task).await {
            Ok(Ok(o)) => outcomes.push(o),
            Ok(Err(e)) => bail!("an agent task failed: {e}"),
            Err(_) => bail!("an agent did not finish within {drain:?} of the window's end"),
        }
    }
    let metrics2 = controller.metrics().await;
    let rss_mib = controller.proc().hwm_mib;
    controller.stop().await;
    let proposals = fleet
        .apps_ns
        .api::<WorkloadNetworkPolicyProposal>()
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let proposal_kib = proposals
        .iter()
        .map(|p| serde_json::to_vec(p).map_or(0, |v| v.len()))
        .sum::<usize>() as f64
        / 1024.0;

    let counter = |text: &str, name: &str, labels: &[&str]| {
        metric_sum(text, &format!("network_enforcer_controller_{name}"), labels)
    };
    let writes = |t: &str| {
        counter(t, "proposal_writes_total", &["result=\"created\""])
            + counter(t, "proposal_writes_total", &["result=\"updated\""])
    };
    let refused_streams = (counter(&metrics2, "batches_refused_total", &[])
        - counter(&metrics0, "batches_refused_total", &[])) as u64
        + open_failures.len() as u64
        + first_failures as u64;
    let mut latencies: Vec<Duration> = outcomes
        .iter()
        .flat_map(|o| o.latencies.iter().copied())
        .collect();
    latencies.sort_unstable();
    let pct = |p: f64| percentile_ms(&latencies, p);
    let secs = settings.seconds as f64;
    let per_agent: Vec<f64> = outcomes
        .iter()
        .map(|o| o.accepted_in_window as f64 / secs)
        .collect();
    let target = f64::from(settings.rate);
    let skipped: u64 = outcomes.iter().map(|o| o.skipped).sum();
    if skipped > 0 {
        println!("    {skipped} batches not sent on time (the stream was backed up)");
    }
    Ok(PhaseResult {
        agents: n,
        records_per_sec: outcomes
            .iter()
            .map(|o| o.accepted_in_window as f64)
            .sum::<f64>()
            / secs,
        offered_per_sec: outcomes
            .iter()
            .map(|o| o.offered_in_window as f64)
            .sum::<f64>()
            / secs,
        min_agent_per_sec: if per_agent.len() < n {
            0.0
        } else {
            per_agent.iter().copied().fold(f64::INFINITY, f64::min)
        },
        sustaining: per_agent
            .iter()
            .filter(|r| **r >= target * SUSTAINED)
            .count(),
        p50_ms: pct(50.0),
        p99_ms: pct(99.0),
        cpu_cores: (proc1.cpu_seconds - proc0.cpu_seconds) / elapsed,
        rss_mib,
        writes_per_sec: (writes(&metrics1) - writes(&metrics0)) / elapsed,
        write_ms: {
            let d = |name: &str| counter(&metrics1, name, &[]) - counter(&metrics0, name, &[]);
            let count = d("proposal_write_duration_seconds_count");
            if count > 0.0 {
                d("proposal_write_duration_seconds_sum") / count * 1000.0
            } else {
                0.0
            }
        },
        reviews_first: (reviews1 - reviews0) / n as f64,
        reviews_reconnect: (reviews2 - reviews1) / n as f64,
        connect_seconds,
        api_get_p50_ms: percentile_ms(&api_gets, 50.0),
        api_get_p99_ms: percentile_ms(&api_gets, 99.0),
        proposals: proposals.len(),
        proposal_kib,
        simulator_cores: (self1.cpu_seconds - self0.cpu_seconds) / elapsed,
        machine_cores: (machine1.0 - machine0.0) / (machine1.1 - machine0.1).max(1.0)
            * std::thread::available_parallelism().map_or(2.0, |n| n.get() as f64),
        refused_streams,
        rejected: outcomes.iter().map(|o| o.rejected).sum(),
        evidence_dropped: (counter(&metrics2, "evidence_records_dropped_total", &[])
            - counter(&metrics0, "evidence_records_dropped_total", &[]))
            as u64,
        unacked: outcomes.iter().map(|o| o.unacked).sum(),
        first_error: outcomes.iter().find_map(|o| o.error.clone()),
    })
}

/// The `p`th percentile of sorted `samples`, in milliseconds (NaN without samples).
fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    samples[i.clamp(1, samples.len()) - 1].as_secs_f64() * 1000.0
}
