//! A cluster proposal in monitor, through the status sync with a stand-in API server.

use super::super::tests::{
    FakeApi, TestWriters, fake_api, inbound_from, list, shop_app, shop_namespace, shop_pod,
};
use super::*;
use network_enforcer_api::uplink::Outcome;

/// `ne-isolate-shop` as learning writes it (Admin: Pass from shop, Deny every other namespace),
/// labelled `promote=<label>`.
fn isolate_shop(label: &str) -> ClusterNetworkPolicyProposal {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
        "kind": "ClusterNetworkPolicyProposal",
        "metadata": {"name": "ne-isolate-shop", "uid": "u-isolate", "generation": 1,
                     "resourceVersion": "7",
                     "labels": {"networkenforcer.kubewarden.io/promote": label}},
        "spec": {"policy": {"tier": "Admin", "priority": 900,
            "subject": {"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}}},
            "ingress": [
                {"name": "observed", "action": "Pass",
                 "from": [{"namespaces": {"matchLabels": {"kubernetes.io/metadata.name": "shop"}}}]},
                {"name": "isolate", "action": "Deny", "from": [{"namespaces": {}}]}]}}
    }))
    .unwrap()
}

/// Pod `bank/client` (10.0.1.3) and `shop/neighbour` (10.0.0.3) beside shop's web; every watch
/// listed, with `proposals`.
async fn two_namespaces(
    api: &FakeApi,
    proposals: Vec<ClusterNetworkPolicyProposal>,
) -> (crate::app::App, Arc<StatusSync>, TestWriters) {
    let (app, sync, mut writers, _) = shop_app(api.client.clone(), 0);
    {
        let mut index = app.index.index.write().unwrap();
        index.apply_pod(&shop_pod("neighbour", "neighbour", "10.0.0.3", false), 0);
        let mut client = shop_pod("client", "client", "10.0.1.3", false);
        client.metadata.namespace = Some("bank".into());
        index.apply_pod(&client, 0);
    }
    let bank: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "bank", "labels": {"kubernetes.io/metadata.name": "bank"}}
    }))
    .unwrap();
    list(&mut writers.policies, []);
    list(&mut writers.network_policies, []);
    list(&mut writers.namespaces, [shop_namespace(), bank]);
    list(&mut writers.cluster_proposals, proposals);
    sync.wait_ready().await;
    (app, sync, writers)
}

/// Issue 46 item 4: with no WorkloadNetworkPolicy at all, a call from another namespace into shop,
/// which the monitored isolation would deny, is recorded in the proposal's status (ingress,
/// monitor, the proposal's name, no namespace: the field is left out), and its batch is acknowledged only once it is
/// written; a call from inside shop is no violation; an acknowledgement annotation moves the record.
#[tokio::test]
async fn a_cluster_proposal_in_monitor_records_what_it_would_deny() {
    let proposal = isolate_shop("monitor");
    let api = fake_api(&proposal).await;
    let (app, sync, mut writers) = two_namespaces(&api, vec![proposal.clone()]).await;
    let now = crate::cluster::watches::now_ms();
    let evidence = sync.evidence();
    for (peer, at) in [([10, 0, 1, 3], now - 1_000), ([10, 0, 0, 3], now - 900)] {
        let (ack, _) = app
            .learning
            .take_in("node-a", &inbound_from(peer, Outcome::Established, at));
        assert_eq!((ack.accepted, ack.rejected), (1, 0), "{}", ack.reason);
    }
    // What the batches' acknowledgements wait for (their proposals aside: learning's part).
    let mark = evidence.hold().expect("held for the proposal's evidence");
    assert_eq!(sync.attribute_evidence(), 1, "only the call from bank");
    assert!(
        !evidence.settled_after(mark),
        "settled before the proposal's status holds its violation"
    );
    let report = sync.sync_all().await;
    assert_eq!((report.patched, report.failed), (1, 0), "{report:?}");
    assert!(evidence.settled_after(mark));
    let patch = api.status_patches.lock().unwrap()[0].clone();
    let status = &patch["status"];
    let record = &status["violations"][0];
    assert_eq!(
        (
            record["denyingPolicyName"].as_str(),
            record["denyingPolicyNamespace"].as_str(),
            record["direction"].as_str(),
            record["action"].as_str(),
            record["source"]["namespace"].as_str(),
            record["dest"]["ownerName"].as_str(),
        ),
        (
            Some("ne-isolate-shop"),
            None,
            Some("Ingress"),
            Some("monitor"),
            Some("bank"),
            Some("web")
        ),
        "{patch}"
    );
    assert_eq!(
        (
            status["violationCount"].as_i64(),
            status["activeViolationCount"].as_i64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(patch["metadata"]["resourceVersion"], "7", "{patch}");
    assert!(
        status.get("conditions").is_none(),
        "conditions are the render loop's"
    );

    // Acknowledged: the record moves, as on a WorkloadNetworkPolicy.
    let mut written = proposal.clone();
    written.status = Some(serde_json::from_value(status.clone()).unwrap());
    written.metadata.annotations.get_or_insert_default().insert(
        "networkenforcer.kubewarden.io/acknowledge-0".into(),
        "expected".into(),
    );
    writers
        .cluster_proposals
        .apply_watcher_event(&watcher::Event::Apply(written));
    let report = sync.sync_all().await;
    assert_eq!((report.patched, report.acknowledged), (1, 1), "{report:?}");
    let patch = api.status_patches.lock().unwrap()[1].clone();
    assert_eq!(patch["status"]["activeViolationCount"], 0, "{patch}");
    assert_eq!(
        patch["status"]["acknowledgedViolations"][0]["reason"], "expected",
        "{patch}"
    );
}

/// A proposal labelled `protect`, or not labelled, records nothing, and with none in monitor (and
/// no policies) batches are not held for evidence.
#[tokio::test]
async fn only_a_proposal_in_monitor_records_violations() {
    for label in ["protect", "none"] {
        let proposal = isolate_shop(label);
        let api = fake_api(&proposal).await;
        let (app, sync, _writers) = two_namespaces(&api, vec![proposal]).await;
        let now = crate::cluster::watches::now_ms();
        let evidence = sync.evidence();
        app.learning.take_in(
            "node-a",
            &inbound_from([10, 0, 1, 3], Outcome::Established, now - 1_000),
        );
        assert_eq!(
            evidence.hold(),
            None,
            "{label}: held without anything that records"
        );
        assert_eq!(sync.attribute_evidence(), 0, "{label}");
        assert_eq!(sync.sync_all().await.patched, 0, "{label}");
        assert!(api.status_patches.lock().unwrap().is_empty(), "{label}");
    }
}

/// Review fix: until the proposals' watch has listed, any proposal may be in monitor, so batches
/// are held although no policy exists (a new leader's first seconds: its agents resend what the
/// last one did not acknowledge).
#[tokio::test]
async fn batches_are_held_until_the_proposals_have_listed() {
    let proposal = isolate_shop("monitor");
    let api = fake_api(&proposal).await;
    let (app, sync, mut writers, _) = shop_app(api.client.clone(), 0);
    sync.cluster_proposals_served.set_watched();
    list(&mut writers.policies, []);
    list(&mut writers.network_policies, []);
    list(&mut writers.namespaces, [shop_namespace()]);
    let evidence = sync.evidence();
    let now = crate::cluster::watches::now_ms();
    app.learning.take_in(
        "node-a",
        &inbound_from([10, 0, 0, 3], Outcome::Established, now - 1_000),
    );
    assert!(
        evidence.hold().is_some(),
        "not held before the proposals listed"
    );
    list(&mut writers.cluster_proposals, []);
    assert_eq!(evidence.hold(), None, "listed, none in monitor");
}

/// Review fix: what a proposal recorded while in monitor is written although it left monitor
/// (promoted to protect) before the status pass, not dropped as a deleted policy's; and the
/// records it holds are not cleared then.
#[tokio::test]
async fn what_was_recorded_in_monitor_is_written_after_the_proposal_left_monitor() {
    let proposal = isolate_shop("monitor");
    let api = fake_api(&proposal).await;
    let (app, sync, mut writers) = two_namespaces(&api, vec![proposal.clone()]).await;
    let now = crate::cluster::watches::now_ms();
    app.learning.take_in(
        "node-a",
        &inbound_from([10, 0, 1, 3], Outcome::Established, now - 1_000),
    );
    assert_eq!(sync.attribute_evidence(), 1);
    let mut protected = proposal.clone();
    protected.metadata.labels = Some(
        [(PROMOTE_LABEL.to_string(), "protect".to_string())]
            .into_iter()
            .collect(),
    );
    writers
        .cluster_proposals
        .apply_watcher_event(&watcher::Event::Apply(protected));
    let report = sync.sync_all().await;
    assert_eq!((report.patched, report.observations), (1, 1), "{report:?}");
    let patch = api.status_patches.lock().unwrap()[0].clone();
    assert_eq!(patch["status"]["activeViolationCount"], 1, "{patch}");
    assert_eq!(
        sync.sync_all().await.policies,
        0,
        "nothing pending: not written again"
    );
}
