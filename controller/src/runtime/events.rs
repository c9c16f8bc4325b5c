//! Kubernetes Events, published by every stage the same way: a failure to publish is logged,
//! never fatal (an Event is a courtesy to the user; the state it reports is in conditions, status and
//! metrics too).

use kube::runtime::events::Recorder;

/// Publishes an Event about the object `regarding` with `recorder`; failures to publish are logged.
pub async fn publish_with(
    recorder: &Recorder,
    regarding: &k8s_openapi::api::core::v1::ObjectReference,
    type_: kube::runtime::events::EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = kube::runtime::events::Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, regarding).await {
        tracing::warn!(error = %e, reason, "could not publish event");
    }
}

/// Where Events about cluster-scoped objects are filed (see [`publish_cluster_scoped`]).
pub const CLUSTER_SCOPED_EVENT_NAMESPACE: &str = "kube-system";

/// Publishes an Event about the cluster-scoped object `regarding` (a Node, a
/// ClusterNetworkPolicyProposal). Not through kube's `Recorder`: it files an Event of a
/// cluster-scoped object in `default`, which API servers before v1.22 refuse for `events.k8s.io`
/// Events ("involvedObject.namespace does not match event.namespace"); `kube-system` is accepted by
/// every version. Failures are logged, never fatal.
pub async fn publish_cluster_scoped(
    client: &kube::Client,
    reporter: &kube::runtime::events::Reporter,
    regarding: k8s_openapi::api::core::v1::ObjectReference,
    type_: &str,
    reason: &str,
    action: &str,
    note: String,
) {
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    let now = k8s_openapi::jiff::Timestamp::now();
    let name = regarding.name.clone().unwrap_or_default();
    let event = Event {
        metadata: ObjectMeta {
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            namespace: Some(CLUSTER_SCOPED_EVENT_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        event_time: Some(MicroTime(now)),
        action: Some(action.into()),
        reason: Some(reason.into()),
        note: Some(note),
        type_: Some(type_.into()),
        regarding: Some(regarding),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        ..Event::default()
    };
    let events = kube::Api::<Event>::namespaced(client.clone(), CLUSTER_SCOPED_EVENT_NAMESPACE);
    if let Err(e) = events.create(&Default::default(), &event).await {
        tracing::warn!(error = %e, reason, object = %name, "could not publish event");
    }
}
