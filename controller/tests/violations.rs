//! Violations against the real local API server (docs/design.md, "Violations"; the end-to-end
//! scenario's Kubernetes backend from promotion on): records go through a real gRPC stream with a real
//! pod-bound token into the real ingest service; the index is fed by real watches; the reconcilers
//! promote and render; the status sync runs with a 1 s interval and patches the real status
//! subresource.

#[path = "support/in_process.rs"]
mod in_process;

use anyhow::{Result, ensure};
use in_process::InProcess;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{ListParams, Patch, PatchParams};
use network_enforcer_api::crd::{AcknowledgedViolation, Backend};
use network_enforcer_api::keys::ACKNOWLEDGE_ANNOTATION_PREFIX;
use network_enforcer_api::uplink;
use network_enforcer_api::{
    Direction, PolicyMode, Protocol, WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal,
    WorkloadNetworkPolicyStatus,
};
use network_enforcer_controller::monitor::otlp::ViolationSink;
use network_enforcer_controller::monitor::status_sync::SyncError;
use network_enforcer_controller::monitor::violations::Observation;
use network_enforcer_controller::runtime::metrics::Reason;
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const EGRESS: &str = "deployment-http-client-egress";
const INGRESS: &str = "deployment-http-server-ingress";
const WAIT: Duration = Duration::from_secs(90);

/// A telemetry sink that remembers every event (observed / acknowledged, as exported over OTLP).
#[derive(Default)]
struct Recorded {
    observed: Mutex<Vec<(Backend, Observation)>>,
    acknowledged: Mutex<Vec<AcknowledgedViolation>>,
}

impl ViolationSink for Recorded {
    fn observed(&self, backend: Backend, observation: &Observation) {
        self.observed
            .lock()
            .unwrap()
            .push((backend, observation.clone()));
    }

    fn acknowledged(&self, acknowledged: &AcknowledgedViolation) {
        self.acknowledged.lock().unwrap().push(acknowledged.clone());
    }
}

fn status(policy: &WorkloadNetworkPolicy) -> WorkloadNetworkPolicyStatus {
    policy.status.clone().unwrap_or_default()
}

fn acknowledge_annotations(policy: &WorkloadNetworkPolicy) -> Vec<String> {
    policy
        .annotations()
        .keys()
        .filter(|k| k.starts_with(ACKNOWLEDGE_ANNOTATION_PREFIX))
        .cloned()
        .collect()
}

#[tokio::test]
async fn the_scenario_in_monitor_and_protect_with_acknowledgements_and_failed_patches() -> Result<()>
{
    // The controller, in process: index watches, reconcilers, status sync (1 s), ingest on loopback.
    let telemetry = Arc::new(Recorded::default());
    let c = InProcess::start("violations", telemetry.clone(), false).await?;
    let ns = &c.ns;
    let n = ns.name.clone();
    let (client_pod, client_ip, server_pod) =
        (c.client_pod.clone(), c.client_ip, c.server_pod.clone());
    let (service_ip, dns) = (c.service_ip, c.dns);
    let (sync, agent) = (c.sync.clone(), &c);
    use uplink::Direction::{Inbound, Outbound};
    use uplink::Outcome::{Datagram, Established, Failed};
    use uplink::Protocol::{Tcp, Udp};
    let record = |pod: &str, peer, port, protocol, direction, outcome| {
        c.record(pod, peer, port, protocol, direction, outcome)
    };
    // TCP 18080 through the Service, seen by both ends, and the client's DNS lookup: allowed.
    let allowed = vec![
        record(&client_pod, service_ip, 18080, Tcp, Outbound, Established),
        record(&client_pod, dns, 53, Udp, Outbound, Datagram),
        record(&server_pod, client_ip, 18080, Tcp, Inbound, Established),
    ];

    // Step 2 (learning) and 3 (promotion to monitor).
    agent.send(allowed.clone()).await?;
    let report = c.app.flush().await;
    ensure!(report.written == 2, "{report:?}");
    for name in [EGRESS, INGRESS] {
        c.promote(name, "monitor").await?;
    }
    let policies = ns.api::<WorkloadNetworkPolicy>();
    ns.wait_for("both policies in monitor mode", WAIT, || async {
        let list = policies.list(&ListParams::default()).await?;
        let names: BTreeSet<String> = list
            .items
            .iter()
            .filter(|p| p.spec.mode == PolicyMode::Monitor)
            .map(|p| p.name_any())
            .collect();
        Ok((names.len() == 2).then_some(()))
    })
    .await?;

    // Step 4: UDP to 18083 echoes; both agents see the datagram. Allowed flows keep flowing.
    let udp = vec![
        record(&client_pod, service_ip, 18083, Udp, Outbound, Datagram),
        record(&server_pod, client_ip, 18081, Udp, Inbound, Datagram),
    ];
    agent.send([allowed.clone(), udp.clone()].concat()).await?;
    for name in [EGRESS, INGRESS] {
        let policy = ns
            .wait_for(&format!("a violation on {name}"), WAIT, || async {
                let p = policies.get(name).await?;
                Ok((status(&p).violation_count > 0).then_some(p))
            })
            .await?;
        let s = status(&policy);
        assert_eq!(
            (s.violation_count, s.active_violation_count),
            (1, 1),
            "{name}: one nc is one observation, whichever agents report it: {s:#?}"
        );
        let v = &s.violations[0];
        let direction = if name == EGRESS {
            Direction::Egress
        } else {
            Direction::Ingress
        };
        network_enforcer_tests::e2e::scenario::check_udp_violation(
            v,
            &n,
            name,
            PolicyMode::Monitor,
            direction,
        )?;
        assert_eq!(
            v.source.identity,
            format!("cluster.local/ns/{n}/sa/http-client-sa")
        );
        assert_eq!(s.observed_generation, policy.metadata.generation);
    }
    // Proposals are not re-created by what the policies now govern.
    c.app.flush().await;
    assert!(
        ns.api::<WorkloadNetworkPolicyProposal>()
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );

    // Step 5: protect. The egress policy denies the UDP send: recorded there only.
    for name in [EGRESS, INGRESS] {
        policies
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"mode": "protect"}})),
            )
            .await?;
    }
    let network_policies = ns.api::<NetworkPolicy>();
    for name in [EGRESS, INGRESS] {
        ns.wait_for(
            &format!("NetworkPolicy {name}, and the sync seeing protect"),
            WAIT,
            || async {
                let p = policies.get(name).await?;
                let synced = status(&p).observed_generation == p.metadata.generation;
                Ok((synced && network_policies.get_opt(name).await?.is_some()).then_some(()))
            },
        )
        .await?;
    }
    agent
        .send(vec![
            record(&client_pod, service_ip, 18083, Udp, Outbound, Datagram),
            record(&client_pod, service_ip, 18080, Tcp, Outbound, Established),
            record(&server_pod, client_ip, 18080, Tcp, Inbound, Established),
        ])
        .await?;
    let egress = ns
        .wait_for("the protect violation on egress", WAIT, || async {
            let p = policies.get(EGRESS).await?;
            Ok((status(&p).violation_count >= 2).then_some(p))
        })
        .await?;
    // Two more complete passes: anything the ingress policy would record is in by then.
    let seen = sync.passes();
    ns.wait_for("two more status passes", WAIT, || async {
        Ok((sync.passes() >= seen + 2).then_some(()))
    })
    .await?;
    let s = status(&egress);
    assert_eq!(
        (s.violation_count, s.active_violation_count),
        (2, 2),
        "{s:#?}"
    );
    let actions: Vec<_> = s.violations.iter().map(|v| (v.action, v.id)).collect();
    assert_eq!(
        actions,
        [(PolicyMode::Protect, 1), (PolicyMode::Monitor, 0)],
        "newest first"
    );
    assert_eq!(s.violations[0].dst_port, Some(18081));
    let s = status(&policies.get(INGRESS).await?);
    assert_eq!(
        (s.violation_count, s.active_violation_count),
        (1, 1),
        "the blocked flow never reached the server: {s:#?}"
    );
    {
        let observed = telemetry.observed.lock().unwrap();
        let summary: Vec<_> = observed
            .iter()
            .map(|(b, o)| (*b, o.denying_policy_name.as_str(), o.action))
            .collect();
        assert_eq!(summary.len(), 3, "{summary:?}");
        for expected in [
            (Backend::Kubernetes, EGRESS, PolicyMode::Monitor),
            (Backend::Kubernetes, INGRESS, PolicyMode::Monitor),
            (Backend::Kubernetes, EGRESS, PolicyMode::Protect),
        ] {
            assert!(summary.contains(&expected), "{summary:?}");
        }
    }

    // Acknowledge the monitor record, and an id that does not exist.
    let ack = format!("{ACKNOWLEDGE_ANNOTATION_PREFIX}0");
    let unknown = format!("{ACKNOWLEDGE_ANNOTATION_PREFIX}999");
    policies
        .patch(
            EGRESS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                &ack: "expected during the rollout", &unknown: "typo"}}})),
        )
        .await?;
    let egress = ns
        .wait_for("the annotations consumed", WAIT, || async {
            let p = policies.get(EGRESS).await?;
            Ok(acknowledge_annotations(&p).is_empty().then_some(p))
        })
        .await?;
    let s = status(&egress);
    assert_eq!(s.acknowledged_violations.len(), 1, "{s:#?}");
    let acknowledged = &s.acknowledged_violations[0];
    assert_eq!(
        (
            acknowledged.violation.id,
            acknowledged.violation.action,
            acknowledged.reason.as_str()
        ),
        (0, PolicyMode::Monitor, "expected during the rollout")
    );
    assert_eq!(
        (
            s.violation_count,
            s.active_violation_count,
            s.violations.len()
        ),
        (2, 1, 1)
    );
    assert_eq!(s.violations[0].id, 1);
    let events = ns.api::<Event>();
    let reasons = || async {
        let list = events.list(&ListParams::default()).await?;
        Ok::<_, anyhow::Error>(
            list.items
                .into_iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(EGRESS))
                .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
                .collect::<Vec<_>>(),
        )
    };
    let found = ns
        .wait_for("the acknowledgement Events", WAIT, || async {
            let found = reasons().await?;
            let has = |r: &str| found.iter().any(|(reason, _)| reason == r);
            Ok(
                (has("ViolationAcknowledged") && has("UnknownViolationAcknowledgement"))
                    .then_some(found),
            )
        })
        .await?;
    // A few more passes: nothing is acknowledged or reported twice.
    let seen = sync.passes();
    ns.wait_for("three more status passes", WAIT, || async {
        Ok((sync.passes() >= seen + 3).then_some(()))
    })
    .await?;
    let count = |found: &[(String, String)], reason: &str| {
        found.iter().filter(|(r, _)| r == reason).count()
    };
    let found_later = reasons().await?;
    for found in [&found, &found_later] {
        assert_eq!(count(found, "ViolationAcknowledged"), 1, "{found:?}");
        assert_eq!(
            count(found, "UnknownViolationAcknowledgement"),
            1,
            "{found:?}"
        );
    }
    let unknown_note = &found
        .iter()
        .find(|(r, _)| r == "UnknownViolationAcknowledgement")
        .unwrap()
        .1;
    assert!(unknown_note.contains("acknowledge-999"), "{unknown_note}");
    {
        let acknowledged = telemetry.acknowledged.lock().unwrap();
        assert_eq!(acknowledged.len(), 1, "acknowledged once: {acknowledged:?}");
        assert_eq!(acknowledged[0].violation.id, 0);
    }
    assert_eq!(
        status(&policies.get(EGRESS).await?),
        s,
        "nothing changed since"
    );

    // A failed status patch loses nothing. Stop the passes and drive them by hand; the egress policy
    // is copied, then changed on the server, so a patch computed from the copy is refused (409) by
    // its resourceVersion precondition — an honest API-side failure.
    c.stop_passes().await;
    let stale = policies.get(EGRESS).await?;
    policies
        .patch(
            EGRESS,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await?;
    // A TCP attempt to 18082 that never establishes: protect evidence the egress policy denies.
    agent
        .send(vec![record(
            &client_pod,
            service_ip,
            18082,
            Tcp,
            Outbound,
            Failed,
        )])
        .await?;
    assert_eq!(sync.attribute_evidence(), 1);
    assert_eq!(sync.pending(&n, EGRESS), 1);
    let refused = sync.sync_policy(&stale, &sync.current_view()).await;
    match &refused {
        Err(SyncError::Patch(kube::Error::Api(e))) if e.code == 409 => {}
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(sync.pending(&n, EGRESS), 1, "kept for the retry");
    assert_eq!(status(&policies.get(EGRESS).await?).violation_count, 2);
    // The passes retry a conflict at once from a fresh read (the watch may not have delivered the
    // change yet), and count it.
    let conflicts = || {
        sync.metrics()
            .patch_failures
            .get_or_create(&Reason {
                reason: "conflict".into(),
            })
            .get()
    };
    let conflicts_before = conflicts();
    let done = sync
        .sync_policy_or_reread(&stale, &sync.current_view())
        .await?;
    assert_eq!((done.patched, done.observations), (true, 1), "{done:?}");
    assert_eq!(conflicts() - conflicts_before, 1);
    let egress = policies.get(EGRESS).await?;
    let s = status(&egress);
    assert_eq!(
        (s.violation_count, s.active_violation_count),
        (3, 2),
        "{s:#?}"
    );
    assert_eq!(
        (
            s.violations[0].id,
            s.violations[0].protocol,
            s.violations[0].dst_port,
            s.violations[0].action
        ),
        (2, Protocol::TCP, Some(18082), PolicyMode::Protect)
    );
    assert_eq!(sync.pending(&n, EGRESS), 0);
    sync.sync_all().await;
    assert_eq!(status(&policies.get(EGRESS).await?).violation_count, 3);

    Ok(())
}

/// A clock-skewed (or lying) agent: a record dated an hour ahead is dated now when it is taken in, so
/// its violation carries the controller's time and a real violation seen after it is the newest (it
/// was the other way round before the ingest clamped future times).
#[tokio::test]
async fn a_clock_skewed_agent_does_not_date_violations_ahead() -> Result<()> {
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    use uplink::Direction::{Inbound, Outbound};
    use uplink::Outcome::{Datagram, Established};
    use uplink::Protocol::{Tcp, Udp};
    let c = InProcess::start("clock-skew", Arc::new(Recorded::default()), false).await?;
    let ns = &c.ns;
    let (client_pod, service_ip) = (c.client_pod.as_str(), c.service_ip);
    c.send(vec![
        c.record(client_pod, service_ip, 18080, Tcp, Outbound, Established),
        c.record(client_pod, c.dns, 53, Udp, Outbound, Datagram),
        c.record(&c.server_pod, c.client_ip, 18080, Tcp, Inbound, Established),
    ])
    .await?;
    let report = c.app.flush().await;
    ensure!(report.written == 2, "{report:?}");
    c.promote(EGRESS, "monitor").await?;
    let policies = ns.api::<WorkloadNetworkPolicy>();
    ns.wait_for("the egress policy", WAIT, || async {
        Ok(policies.get_opt(EGRESS).await?)
    })
    .await?;

    // The skewed agent's UDP datagram to 18083 (the server's 18081), an hour ahead of the clock.
    let sent = Timestamp::now();
    let mut skewed = c.record(client_pod, service_ip, 18083, Udp, Outbound, Datagram);
    skewed.first_seen_ms += 3_600_000;
    skewed.last_seen_ms += 3_600_000;
    c.send(vec![skewed]).await?;
    let egress = ns
        .wait_for("the skewed record's violation", WAIT, || async {
            let p = policies.get(EGRESS).await?;
            Ok((status(&p).violation_count > 0).then_some(p))
        })
        .await?;
    let v = status(&egress).violations[0].clone();
    assert_eq!(v.dst_port, Some(18081));
    let at = v.timestamp.0;
    assert!(
        at >= sent - SignedDuration::from_secs(5) && at <= Timestamp::now(),
        "dated {at}, sent at {sent}"
    );

    // A real violation afterwards is the newest.
    c.send(vec![c.record(
        client_pod,
        service_ip,
        18082,
        Tcp,
        Outbound,
        Established,
    )])
    .await?;
    let egress = ns
        .wait_for("the second violation", WAIT, || async {
            let p = policies.get(EGRESS).await?;
            Ok((status(&p).violation_count > 1).then_some(p))
        })
        .await?;
    let ports: Vec<Option<i32>> = status(&egress)
        .violations
        .iter()
        .map(|v| v.dst_port)
        .collect();
    assert_eq!(ports, [Some(18082), Some(18081)], "newest first");
    Ok(())
}
