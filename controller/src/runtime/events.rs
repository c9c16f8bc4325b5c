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
