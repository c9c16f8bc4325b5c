//! Running the sync: its watches, readiness, and the loop of evidence and status passes.

use super::*;

impl StatusSync {
    /// Runs the watches and the passes until the process stops.
    pub async fn run(self: Arc<Self>) {
        tokio::join!(self.clone().watches(), self.passes_forever());
    }

    /// Runs the watches this sync needs besides the index: it starts the shared ones of
    /// WorkloadNetworkPolicies and NetworkPolicies in scope ([`PolicyObjects`]) and watches
    /// namespaces and ClusterNetworkPolicies (when served) cluster-wide itself. Only the first call
    /// watches.
    pub async fn watches(self: Arc<Self>) {
        let Some(writers) = self.writers.lock().expect("writers lock").take() else {
            return;
        };
        self.objects.policies.start();
        self.objects.network_policies.start();
        tokio::join!(
            reflect(
                Api::<Namespace>::all(self.client.clone()),
                writers.namespaces
            ),
            self.watch_when_served(&self.cluster_policies_served, writers.cluster_policies),
            self.watch_when_served(&self.cluster_proposals_served, writers.cluster_proposals),
        );
    }

    /// Attributes evidence every `evidence_interval` and whenever the queue is half full, and syncs
    /// statuses every `interval`.
    pub async fn passes_forever(self: Arc<Self>) {
        // First: ingest takes no batch before the claims are read.
        self.restore_claims().await;
        self.restore_history().await;
        self.wait_ready().await;
        tracing::info!(interval = ?self.settings.interval, "status sync started");
        let mut evidence = tokio::time::interval(self.settings.evidence_interval);
        let mut status = tokio::time::interval(self.settings.interval);
        let mut persist = tokio::time::interval(self.settings.history_persist_every);
        // The first tick of an interval is at once; the history has just been read.
        persist.reset();
        for tick in [&mut evidence, &mut status, &mut persist] {
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        loop {
            tokio::select! {
                _ = evidence.tick() => {
                    self.attribute_evidence_off_runtime().await;
                }
                _ = self.queue.half_full() => {
                    self.attribute_evidence_off_runtime().await;
                    // The regular pass comes an interval after this one.
                    evidence.reset();
                }
                _ = persist.tick(), if self.settings.history_store.is_some() => {
                    self.persist_history().await;
                }
                _ = status.tick() => {
                    self.forget_stale_view();
                    self.attribute_evidence_off_runtime().await;
                    let report = self.sync_all().await;
                    if report.patched > 0 || report.failed > 0 {
                        tracing::info!(?report, "synced policy statuses");
                    }
                }
            }
        }
    }

    /// [`StatusSync::attribute_evidence`] on the blocking pool: a pass over a full queue is CPU work
    /// that would hold up one of the runtime's workers (and the streams and writes it runs).
    async fn attribute_evidence_off_runtime(self: &Arc<Self>) {
        let sync = self.clone();
        if let Err(error) = tokio::task::spawn_blocking(move || sync.attribute_evidence()).await {
            tracing::error!(%error, "an evidence pass failed");
        }
    }

    /// Completed [`StatusSync::sync_all`] passes.
    pub fn passes(&self) -> u64 {
        self.metrics.status_passes.get()
    }
}

pub(super) async fn reflect<K>(api: Api<K>, writer: Writer<K>)
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .for_each(|result| async move {
            if let Err(error) = result {
                tracing::warn!(kind = %K::kind(&()), %error, "watch failed; retrying with backoff");
            }
        })
        .await;
}
