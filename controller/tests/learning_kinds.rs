//! Workload kinds beyond the reference and the external fan-out cap, against the real API server: a bare
//! pod is its own unit (proposal `pod-<name>-<direction>`, selected by its labels, owned by the pod so the
//! real garbage collector removes it with the pod), and external addresses past the cap are left out of
//! the stored proposal with an `ExternalPeersCapped` Event on it. A CronJob's manual run
//! (`kubectl create job --from=cronjob/...`) is learned as the CronJob, never by its per-run labels.

use anyhow::{Context, Result};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use network_enforcer_api::{Backend, Protocol, WorkloadKind, WorkloadNetworkPolicyProposal};
use network_enforcer_controller::app::App;
use network_enforcer_controller::cluster::index::Index;
use network_enforcer_controller::cluster::index::Opened;
use network_enforcer_controller::learn::ReportedConnection;
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::images::TEST_IMAGE;
use network_enforcer_tests::scenario_fixture::pod_json;
use serde_json::json;
use std::net::IpAddr;
use std::time::Duration;

#[tokio::test]
async fn a_bare_pod_is_its_own_unit_and_external_fan_out_is_capped() -> Result<()> {
    let ns = TestNamespace::create_with_crds("learn-kinds").await?;
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "debug", "labels": {"run": "debug"}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
            "name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}
    }))?;
    let pod = ns.api::<Pod>().create(&PostParams::default(), &pod).await?;
    let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    let mut ix = Index::default();
    ix.apply_pod(&pod, now);

    let app = App::builder(ns.client.clone(), Backend::Kubernetes)
        .configure_learner(|l| l.with_max_external_peers(5))
        .build();
    let to = |i: u8| ReportedConnection {
        local: ix.pod(&ns.name, "debug").expect("indexed").clone(),
        peer: IpAddr::from([198, 51, 100, i]),
        port: 443,
        protocol: Protocol::TCP,
        opened: Opened::Outbound,
        at_ms: now,
        reporter: network_enforcer_controller::learn::Reporter::Node,
        peer_name: Default::default(),
    };
    for i in 1..=5 {
        app.learner.observe(&ix, &to(i))?;
    }
    let report = app.flush().await;
    assert_eq!(
        (report.created, report.capped, report.failed),
        (1, 0, 0),
        "{report:?}"
    );

    // Three more addresses on the same port: the stored proposal is at the cap.
    for i in 6..=8 {
        app.learner.observe(&ix, &to(i))?;
    }
    let report = app.flush().await;
    assert_eq!(
        (report.written, report.unchanged, report.capped),
        (0, 1, 3),
        "{report:?}"
    );

    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    let proposal = proposals.get("pod-debug-egress").await?;
    assert_eq!(proposal.spec.target_ref.kind, WorkloadKind::Pod);
    let np = proposal.spec.kubernetes.clone().unwrap();
    assert_eq!(
        serde_json::to_value(&np.pod_selector)?,
        json!({"matchLabels": {"run": "debug"}})
    );
    let cidrs: Vec<String> = np
        .egress
        .unwrap_or_default()
        .iter()
        .map(|r| {
            r.to.as_ref().unwrap()[0]
                .ip_block
                .as_ref()
                .unwrap()
                .cidr
                .clone()
        })
        .collect();
    assert_eq!(
        cidrs,
        (1..=5)
            .map(|i| format!("198.51.100.{i}/32"))
            .collect::<Vec<_>>()
    );
    let owner = &proposal.owner_references()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            Some(owner.uid.clone()),
            owner.controller
        ),
        ("v1", "Pod", "debug", pod.uid(), Some(true))
    );

    let events = ns.api::<Event>();
    let note = ns
        .wait_for(
            "the ExternalPeersCapped Event",
            Duration::from_secs(30),
            || async {
                Ok(events
                    .list(&ListParams::default())
                    .await?
                    .items
                    .into_iter()
                    .find(|e| {
                        e.reason.as_deref() == Some("ExternalPeersCapped")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                == Some("pod-debug-egress")
                    })
                    .and_then(|e| e.note))
            },
        )
        .await?;
    assert!(note.contains("3 on TCP/443"), "{note}");

    // Deleting the pod garbage-collects its proposal (real GC through the ownerReference).
    ns.api::<Pod>()
        .delete("debug", &DeleteParams::foreground())
        .await?;
    ns.wait_for(
        "GC of the bare pod's proposal",
        Duration::from_secs(90),
        || async {
            Ok(proposals
                .get_opt("pod-debug-egress")
                .await?
                .is_none()
                .then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// The running pod of Job `job` (selected by the `job-name` label the Job controller sets): its IP.
async fn running_pod_of_job(ns: &TestNamespace, job: &str) -> Result<(String, IpAddr)> {
    ns.wait_for(
        &format!("the pod of Job {job} to run with an IP"),
        Duration::from_secs(120),
        || async {
            Ok(ns
                .pods(&format!("job-name={job}"))
                .await?
                .into_iter()
                .find_map(|p| {
                    let status = p.status.as_ref()?;
                    (status.phase.as_deref() == Some("Running")).then_some(())?;
                    Some((p.name_any(), status.pod_ip.as_ref()?.parse().ok()?))
                }))
        },
    )
    .await
}

/// Regression: `kubectl create job --from=cronjob/report report-run-1` (v1.20 kubectl: the Job's
/// CronJob ownerReference is not marked `controller`) was learned as a Job of its own
/// (`job-report-run-1-egress`) and as a peer `{controller-uid: <uid>}` in the callee's ingress. It is a
/// run of the CronJob: `cronjob-report-egress`, and the peer is what every run carries.
#[tokio::test]
async fn a_manual_run_of_a_cronjob_is_learned_as_the_cronjob() -> Result<()> {
    let ns = TestNamespace::create_with_crds("learn-cron").await?;
    // v1.20 serves CronJob only as batch/v1beta1 (k8s-openapi has batch/v1): a dynamic object.
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("batch", "v1beta1", "CronJob"),
        "cronjobs",
    );
    let cronjobs: kube::Api<DynamicObject> =
        kube::Api::namespaced_with(ns.client.clone(), &ns.name, &resource);
    // Suspended: only the manual run runs.
    let cronjob: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "batch/v1beta1", "kind": "CronJob",
        "metadata": {"name": "report"},
        "spec": {"schedule": "0 0 1 1 *", "suspend": true,
                 "jobTemplate": {"spec": {"template": {
                     "metadata": {"labels": {"app": "report"}},
                     "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                              "containers": [{"name": "main", "image": TEST_IMAGE,
                                              "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}}}}}
    }))?;
    let cronjob = cronjobs.create(&PostParams::default(), &cronjob).await?;
    ns.api::<Pod>()
        .create(
            &PostParams::default(),
            &pod_json("server", "default", None)?,
        )
        .await?;
    ns.kubectl(&["create", "job", "--from=cronjob/report", "report-run-1"])?;

    // The premise: the manual run's reference to its CronJob is not marked controller.
    let run = ns.api::<Job>().get("report-run-1").await?;
    let reference = run
        .owner_references()
        .iter()
        .find(|o| o.kind == "CronJob")
        .context("the manual run names its CronJob")?
        .clone();
    assert_eq!(
        (reference.uid.as_str(), reference.controller),
        (cronjob.uid().unwrap_or_default().as_str(), None)
    );
    let (run_pod, run_ip) = running_pod_of_job(&ns, "report-run-1").await?;
    let server_ip: IpAddr = ns
        .wait_for(
            "the server to run with an IP",
            Duration::from_secs(120),
            || async {
                let pod = ns.api::<Pod>().get("server").await?;
                Ok(pod
                    .status
                    .and_then(|s| s.pod_ip)
                    .and_then(|ip| ip.parse().ok()))
            },
        )
        .await?;

    // The index as the watches build it: Jobs, then pods (the watches list every kind before ingest).
    let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    let mut ix = Index::default();
    for job in ns.api::<Job>().list(&ListParams::default()).await? {
        ix.apply_job(&job);
    }
    for pod in ns.api::<Pod>().list(&ListParams::default()).await? {
        ix.apply_pod(&pod, now);
    }
    let app = App::builder(ns.client.clone(), Backend::Kubernetes).build();
    // Both ends' agents report the run's call to the server.
    for (local, peer, opened) in [
        (run_pod.as_str(), server_ip, Opened::Outbound),
        ("server", run_ip, Opened::Inbound),
    ] {
        app.learner.observe(
            &ix,
            &ReportedConnection {
                local: ix.pod(&ns.name, local).expect("indexed").clone(),
                peer,
                port: 8080,
                protocol: Protocol::TCP,
                opened,
                at_ms: now,
                reporter: network_enforcer_controller::learn::Reporter::Node,
                peer_name: Default::default(),
            },
        )?;
    }
    let report = app.flush().await;
    assert_eq!((report.created, report.failed), (2, 0), "{report:?}");

    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    let names: Vec<String> = proposals
        .list(&ListParams::default())
        .await?
        .iter()
        .map(|p| p.name_any())
        .collect();
    assert_eq!(names, ["cronjob-report-egress", "pod-server-ingress"]);
    let egress = proposals.get("cronjob-report-egress").await?;
    assert_eq!(
        (
            egress.spec.target_ref.kind,
            egress.spec.target_ref.name.as_str()
        ),
        (WorkloadKind::CronJob, "report")
    );
    let owner = &egress.owner_references()[0];
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            Some(owner.uid.clone())
        ),
        ("batch/v1beta1", "CronJob", "report", cronjob.uid())
    );
    let report_pods = json!({"matchLabels": {"app": "report"}});
    assert_eq!(
        serde_json::to_value(&egress.spec.kubernetes.as_ref().unwrap().pod_selector)?,
        report_pods
    );
    let ingress = proposals.get("pod-server-ingress").await?;
    assert_eq!(
        serde_json::to_value(&ingress.spec.kubernetes.as_ref().unwrap().ingress)?,
        json!([{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name}},
                          "podSelector": report_pods}],
                "ports": [{"protocol": "TCP", "port": 8080}]}]),
        "the peer is every run of the CronJob, not this run's controller-uid"
    );
    Ok(())
}
