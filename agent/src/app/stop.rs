//! The way out of the agent's loop: the pod watch and the enforcement stopped, the uplink given 5 s
//! to deliver what is queued, then the sources told, so that the ztunnel reader saves the read
//! positions, and the Hubble client its resume point, of what the controller acknowledged (its last
//! flush's among them).

use crate::enforce;
use crate::sources::SourcesStop;
use crate::uplink::UplinkSender;
use std::time::Duration;

/// Stops what runs besides the loop, after its last flush.
pub async fn stop(
    pod_watch: Option<tokio::task::JoinHandle<()>>,
    enforcement_client: Option<(kube::Client, enforce::watch::Config, enforce::watch::Handle)>,
    uplink: Option<(UplinkSender, tokio::task::JoinHandle<()>)>,
    sources: SourcesStop,
) {
    if let Some(watch) = pod_watch {
        watch.abort();
    }
    if let Some((client, config, handle)) = &enforcement_client {
        enforce::watch::stop(client.clone(), config, handle).await;
    }
    if let Some((sender, task)) = uplink {
        // Without senders the task still sends what is queued (the last flush's batch among it) and
        // ends once everything is acknowledged. It gets 5 s (a debug build on a busy 2-core node took
        // 1.6 s), well within the pod's termination grace (the chart keeps Kubernetes' 30 s): an
        // unreachable controller must not hold up the stop.
        drop(sender);
        let abort = task.abort_handle();
        if tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .is_err()
        {
            abort.abort();
            tracing::warn!("stopped with unacknowledged uplink batches");
        }
    }
    sources.stop().await;
}
