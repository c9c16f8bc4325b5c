//! Workload kinds beyond the reference and the external fan-out cap, against the real API server: a bare
//! pod is its own unit (proposal `pod-<name>-<direction>`, selected by its labels, owned by the pod so the
//! real garbage collector removes it with the pod), and external addresses past the cap are left out of
//! the stored proposal with an `ExternalPeersCapped` Event on it.

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, PostParams};
use network_enforcer_api::{Backend, Protocol, WorkloadKind, WorkloadNetworkPolicyProposal};
use network_enforcer_controller::cluster::index::Index;
use network_enforcer_controller::learn::proposal_writer::ProposalWriter;
use network_enforcer_controller::learn::{Observation, Opened};
use network_enforcer_tests::fixture::TestNamespace;
use network_enforcer_tests::images::TEST_IMAGE;
use serde_json::json;
use std::collections::BTreeSet;
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

    let writer = ProposalWriter::new(ns.client.clone(), Backend::Kubernetes, BTreeSet::new())
        .with_max_external_peers(5);
    let to = |i: u8| Observation {
        local: (ns.name.clone(), "debug".into()),
        peer: IpAddr::from([198, 51, 100, i]),
        port: 443,
        protocol: Protocol::TCP,
        opened: Opened::Outbound,
        at_ms: now,
    };
    for i in 1..=5 {
        writer.observe(&ix, &to(i))?;
    }
    let report = writer.flush().await;
    assert_eq!(
        (report.created, report.capped, report.failed),
        (1, 0, 0),
        "{report:?}"
    );

    // Three more addresses on the same port: the stored proposal is at the cap.
    for i in 6..=8 {
        writer.observe(&ix, &to(i))?;
    }
    let report = writer.flush().await;
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
