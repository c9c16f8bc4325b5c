//! The end-to-end scenario (docs/development.md), Kubernetes backend, driven through a CNI's flow
//! source (Cilium's Hubble, Calico's Goldmane): the scenario's steps and assertions, with every flow
//! reported by a [`DataPlane`] (the fake CNI) instead of sent between the pods. The assertions are the
//! eBPF scenario's (`super::super::scenario`): exact proposal specs, exact violation counts and fields.

use anyhow::{Context, Result, ensure};
use network_enforcer_api::{Direction, PolicyMode};
use std::path::Path;
use std::time::{Duration, Instant};

use super::super::poll;
use super::super::release::Release;
use super::super::scenario::{
    self, EGRESS, INGRESS, LEARN_TIMEOUT, STATUS_INTERVAL_SECONDS, STEP_TIMEOUT, Workload,
    check_udp_violation, expected_proposal_specs, proposal_specs, say, status_counts,
};
use super::{PodInfo, dns_pod, node_name};

/// The scenario's pods as the data plane sees them.
#[derive(Clone, Debug)]
pub struct Pods {
    /// The `http-client` pod.
    pub client: PodInfo,
    /// The `http-server` pod.
    pub server: PodInfo,
    /// The cluster DNS pod the client's lookups go to.
    pub dns: PodInfo,
    /// `http-service`'s ClusterIP.
    pub service_ip: String,
    /// The node everything runs on.
    pub node: String,
}

/// What happens on the wire in the scenario, as the CNI would see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The client resolves `http-service` (UDP 53 to the DNS pod), answered.
    Dns,
    /// The client connects to `http-service:18080` (TCP to the server pod's 18080), echoed.
    Tcp18080,
    /// The client sends a datagram to `http-service:18083` (UDP to the server pod's 18081), echoed.
    Udp18083,
    /// The same datagram dropped at the client by its egress NetworkPolicy (three attempts).
    Udp18083Denied,
}

/// A CNI's flow source: reports what the network saw.
pub trait DataPlane {
    /// Reports `event` between `pods`. `egress_policy` is the NetworkPolicy (namespace, name) that
    /// denies a dropped flow, for data planes that name it.
    fn report(&mut self, pods: &Pods, event: Event, egress_policy: (&str, &str)) -> Result<()>;

    /// Waits until everything reported so far has been delivered to the open streams (a data plane
    /// that aggregates, like Goldmane, pushes at its rollover).
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    /// What the fake saw of its client (requests, connections), for failure messages.
    fn describe(&self) -> String;
}

/// Runs the Kubernetes-backend scenario in a new namespace `name` against `release` (installed with
/// `controller.watchNamespace=<name>` and the provider of `plane`), every flow reported by `plane`.
/// Returns the scenario's duration.
pub fn run(
    kubeconfig: &Path,
    release: &Release,
    agent_metrics_port: u16,
    name: &str,
    plane: &mut dyn DataPlane,
) -> Result<Duration> {
    let started = Instant::now();
    say("creating the workload (http-client, http-server, http-service)");
    let w = scenario::create_workload(kubeconfig, name)?;
    let n = w.ns.name.clone();
    let pods = Pods {
        client: PodInfo::get(kubeconfig, &n, &w.client.0)?,
        server: PodInfo::get(kubeconfig, &n, &w.server.0)?,
        dns: dns_pod(kubeconfig)?,
        service_ip: w.service_ip.clone(),
        node: node_name(kubeconfig)?,
    };
    let describe = |w: &Workload, plane_text: String| {
        format!(
            "proposals: {:#?}\npolicies: {:#?}\n--- data plane ---\n{plane_text}\n{}\n{}\n{}",
            proposal_specs(w),
            w.policies(),
            w.ns.describe(),
            release.describe(),
            super::diagnostics(release, agent_metrics_port)
        )
    };
    let egress_policy = (n.as_str(), EGRESS);

    // Step 1: TCP to 18080 works (as the CNI reports it, with the DNS lookup before it).
    say("step 1: the data plane reports the client's DNS lookup and TCP http-service:18080");
    plane.report(&pods, Event::Dns, egress_policy)?;
    plane.report(&pods, Event::Tcp18080, egress_policy)?;

    // Step 2: within 2 minutes exactly the two proposals, as the reference's scenario states them.
    say("step 2: waiting for the two proposals");
    let expected = expected_proposal_specs(&n);
    let learned = poll(
        "exactly the two proposals of step 2",
        LEARN_TIMEOUT,
        Duration::from_millis(250),
        || {
            let specs = proposal_specs(&w)?;
            Ok((specs == expected).then_some(specs))
        },
        || {
            format!(
                "expected: {expected:#?}\n{}",
                describe(&w, plane.describe())
            )
        },
    )?;
    say("step 2: proposals learned through the source");

    // Step 3: promote both to monitor.
    let promoted_specs =
        scenario::promote_both_to_monitor(&w, &learned, || describe(&w, plane.describe()))?;

    // Step 4: UDP 18083 still echoes; one monitor violation on each policy.
    say("step 4: the data plane reports UDP http-service:18083 forwarded");
    plane.report(&pods, Event::Udp18083, egress_policy)?;
    scenario::one_monitor_violation_on_each(&w, || describe(&w, plane.describe()))?;
    // Proposals are not re-created, specs unchanged: an allowed flow again, then one agent flush and
    // a few controller flushes.
    plane.report(&pods, Event::Tcp18080, egress_policy)?;
    plane.flush()?;
    for (name, policy) in scenario::no_proposal_and_specs_unchanged(&w, &promoted_specs)? {
        ensure!(
            status_counts(&policy) == (1, 1),
            "{name}: the allowed TCP 18080 connection added a violation: {:#?}",
            policy.status
        );
    }

    // Step 5: protect.
    say("step 5: mode protect on both policies");
    for name in [EGRESS, INGRESS] {
        w.set_mode(name, "protect")?;
    }
    for name in [EGRESS, INGRESS] {
        scenario::check_network_policy(&w, release, name)?;
    }
    say("step 5: the data plane reports UDP http-service:18083 dropped by the egress policy");
    plane.report(&pods, Event::Udp18083Denied, egress_policy)?;
    poll(
        &format!("the protect violation on {EGRESS}"),
        STEP_TIMEOUT,
        Duration::from_millis(250),
        || {
            let p = w.policies()?.remove(EGRESS);
            Ok(p.filter(|p| status_counts(p).0 >= 2))
        },
        || describe(&w, plane.describe()),
    )?;
    // TCP 18080 keeps working: an allowed connection, which records nothing.
    plane.report(&pods, Event::Tcp18080, egress_policy)?;
    plane.flush()?;
    // Two more status intervals (after an agent flush): whatever else would be recorded is in by then.
    std::thread::sleep(Duration::from_secs(2 * STATUS_INTERVAL_SECONDS + 3));
    let policies = w.policies()?;
    let egress = policies.get(EGRESS).context("egress policy gone")?;
    let s = egress.status.clone().unwrap_or_default();
    ensure!(
        (s.violation_count, s.active_violation_count) == (2, 2),
        "{EGRESS}: expected the monitor and the protect violation: {s:#?}"
    );
    check_udp_violation(
        &s.violations[0],
        &n,
        EGRESS,
        PolicyMode::Protect,
        Direction::Egress,
    )
    .context("the newest egress violation is not the blocked UDP flow")?;
    let ingress = status_counts(policies.get(INGRESS).context("ingress gone")?);
    ensure!(
        ingress == (1, 1),
        "{INGRESS}: the blocked flow never reached the server, yet: {ingress:?}"
    );
    say("step 5: egress policy 2 violations, ingress 1, TCP 18080 records nothing");
    let took = started.elapsed();
    say(&format!("done in {:.1}s", took.as_secs_f64()));
    w.ns.delete_and_wait()?;
    Ok(took)
}
