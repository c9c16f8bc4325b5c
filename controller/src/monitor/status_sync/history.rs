//! The edge history behind the protect gate and the UI.

use super::*;
use crate::learn::cluster_policies::{NamespaceEdge, NamespaceGraph};

impl StatusSync {
    /// Replays the edge history against `policy` (the protect gate, [`EdgeHistory::replay`]) with the
    /// cluster as it is now. Evidence queued before this call is attributed first, so the replay sees
    /// every flow ingest accepted. `None` until every watch evidence is judged against has listed
    /// ([`StatusSync::listed`]): the evidence waits, so the history is not complete yet (the gate
    /// says so and checks again later).
    pub fn replay(&self, policy: &WorkloadNetworkPolicy) -> Option<GateReport> {
        if !self.is_ready() {
            return None;
        }
        self.attribute_evidence();
        let view = self.current_view();
        let mut report = self
            .history
            .lock()
            .expect("history lock")
            .replay(&view, policy);
        report.warming_up = self
            .started
            .get()
            .is_none_or(|at| at.elapsed() < self.settings.history_warmup);
        Some(report)
    }

    /// Seeds the history, once, when this sync starts judging evidence: the flows the policies'
    /// violation records name (active and acknowledged), which a controller that has just become the
    /// leader would otherwise know only once its agents report them again; rare flows, such as a
    /// nightly job's, would be missing from the protect gate's replay for a day (§3.11).
    pub(super) fn seed_history(&self) {
        let mut history = self.history.lock().expect("history lock");
        if self.started.set(std::time::Instant::now()).is_err() {
            return;
        }
        let mut seeded = 0;
        for policy in self.policies.state() {
            let Some(status) = &policy.status else {
                continue;
            };
            let acknowledged = status.acknowledged_violations.iter().map(|a| &a.violation);
            for record in status.violations.iter().chain(acknowledged) {
                seeded += usize::from(history.seed(record));
            }
        }
        self.metrics.history_edges.set(history.len() as i64);
        tracing::info!(
            flows = seeded,
            warmup_s = self.settings.history_warmup.as_secs(),
            "the protect gate's history starts from the policies' violation records"
        );
    }

    /// Reads the history the previous leader persisted ([`history_store`]) into this one, before
    /// any evidence is judged (evidence waits for it: [`listed::Watch::edge_history`]). A store that
    /// cannot be read after a few tries is given up: the history then starts from the violation
    /// records, as without a store, and the failure is logged and counted.
    pub async fn restore_history(&self) {
        let Some(store) = &self.settings.history_store else {
            return;
        };
        if self.history_restored.load(Ordering::Acquire) {
            return;
        }
        let mut wait = Duration::from_secs(1);
        let edges = loop {
            match store.load().await {
                // A shard the API server would not give (as opposed to one that is damaged) is a
                // failed read: retried, and never overwritten with a partial history.
                Ok((_, damaged))
                    if wait <= Duration::from_secs(4)
                        && damaged
                            .iter()
                            .any(|e| matches!(e, history_store::StoreError::Api { .. })) =>
                {
                    self.metrics.history_store_failures.inc();
                    tracing::warn!(retry_in = ?wait, "reading a shard of the persisted edge history failed");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Ok((edges, damaged)) => {
                    let unread = damaged
                        .iter()
                        .any(|e| matches!(e, history_store::StoreError::Api { .. }));
                    for error in &damaged {
                        self.metrics.history_store_failures.inc();
                        tracing::warn!(%error, "a shard of the persisted edge history is left out");
                    }
                    self.history_read.store(!unread, Ordering::Release);
                    break edges;
                }
                Err(error) if wait <= Duration::from_secs(4) => {
                    self.metrics.history_store_failures.inc();
                    tracing::warn!(%error, retry_in = ?wait, "reading the persisted edge history failed");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                Err(error) => {
                    self.metrics.history_store_failures.inc();
                    tracing::warn!(%error, "reading the persisted edge history failed; the protect \
                        gate's history starts from the policies' violation records, and this \
                        controller does not overwrite what the last leader persisted");
                    self.history_read.store(false, Ordering::Release);
                    break Vec::new();
                }
            }
        };
        let now = crate::cluster::watches::now_ms();
        let restored = {
            let mut history = self.history.lock().expect("history lock");
            let added = history.restore(edges);
            history.forget_expired(now);
            self.metrics.history_edges.set(history.len() as i64);
            added
        };
        self.metrics.history_restored.set(restored as i64);
        tracing::info!(
            edges = restored,
            "the protect gate's history starts from what the previous leader persisted"
        );
        self.history_restored.store(true, Ordering::Release);
    }

    /// Writes the history to its store ([`history_store`]) when it changed since the last write;
    /// failures are logged and counted, and the next interval tries again.
    pub async fn persist_history(&self) {
        let Some(store) = &self.settings.history_store else {
            return;
        };
        // Not before the previous leader's history is in, and never when it could not be read: a
        // partial one would overwrite it.
        if !self.history_restored.load(Ordering::Acquire)
            || !self.history_read.load(Ordering::Acquire)
        {
            return;
        }
        let edges = self.history.lock().expect("history lock").export();
        let limits = store.limits;
        let encoded = match tokio::task::spawn_blocking(move || {
            history_store::encode(&edges, limits)
        })
        .await
        {
            Ok(encoded) => encoded,
            Err(error) => {
                tracing::error!(%error, "encoding the edge history failed");
                return;
            }
        };
        let mut written = self.history_written.lock().await;
        if written.as_ref() == Some(&encoded) {
            return;
        }
        match store.save(&encoded).await {
            Ok(()) => {
                self.metrics.history_persisted.set(encoded.edges as i64);
                self.metrics.history_persist_cut.set(encoded.cut as i64);
                if encoded.cut > 0 {
                    tracing::warn!(
                        kept = encoded.edges,
                        cut = encoded.cut,
                        "the persisted edge history is full: the least recently seen edges are left out"
                    );
                }
                tracing::debug!(
                    edges = encoded.edges,
                    shards = encoded.shards.len(),
                    "edge history persisted"
                );
                *written = Some(encoded);
            }
            Err(error) => {
                self.metrics.history_store_failures.inc();
                tracing::warn!(%error, "persisting the edge history failed; trying again next interval");
            }
        }
    }

    /// Notes whether the gate holds `policy` in monitor (its evidence then counts as monitor's).
    pub fn hold(&self, policy: &WorkloadNetworkPolicy, held: bool) {
        let mut set = self.held.lock().expect("held lock");
        if held {
            set.insert(policy_key(policy));
        } else {
            set.remove(&policy_key(policy));
        }
    }

    /// Every edge of the history, newest first; `None` until the history is complete (the watches
    /// evidence is judged against have listed and the persisted history is read): the cluster
    /// proposals are learned from it.
    pub fn export_history(&self) -> Option<Vec<edge_history::StoredEdge>> {
        // Not while the history is being rebuilt after a start (the warm-up), nor when the last
        // leader's history could not be read: a partial graph would propose to deny what was seen.
        let warming = self
            .started
            .get()
            .is_none_or(|at| at.elapsed() < self.settings.history_warmup);
        if !self.is_ready() || warming || !self.history_read.load(Ordering::Acquire) {
            return None;
        }
        Some(self.history.lock().expect("history lock").export())
    }

    /// Edges the protect gate's history holds now.
    pub fn history_len(&self) -> usize {
        self.history.lock().expect("history lock").len()
    }
}

impl NamespaceGraph for StatusSync {
    fn namespace_edges(&self) -> Option<Vec<NamespaceEdge>> {
        Some(edge_history::namespace_edges(&self.export_history()?))
    }

    fn namespaces(&self) -> std::collections::BTreeSet<String> {
        self.namespaces
            .state()
            .iter()
            .map(|n| n.name_any())
            .collect()
    }
}

impl StatusSync {
    /// The observed edges with an end in `namespace`, newest first, at most `limit`, each with the
    /// tiers that decide it now, and whether more were left out; `None` until the history is
    /// complete (the web view's edges and graph, `check --from-cluster`).
    pub fn edges_in(
        &self,
        namespace: &str,
        limit: usize,
    ) -> Option<(Vec<edge_history::HistoryEdge>, bool)> {
        // Before the watches have listed, the evidence that makes the history waits in the queue
        // (and on a follower nothing runs): an empty answer would read as "no traffic".
        if !self.is_ready() {
            return None;
        }
        let (listed, truncated) = self
            .history
            .lock()
            .expect("history lock")
            .edges_in(namespace, limit);
        // Judged without the history's lock: the evidence pass waits for it.
        let view = self.recent_view();
        let edges = listed.into_iter().map(|e| e.judged(&view)).collect();
        Some((edges, truncated))
    }

    /// The evaluator's view for the web view, built again once it is [`VIEW_REUSED_FOR`] old: every
    /// open graph page asks every 2 s, and a view copies every pod of the index.
    fn recent_view(&self) -> Arc<ClusterView> {
        // Only a cache: one poisoned by a panic is used as it is.
        let mut cached = self
            .recent_view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*cached {
            Some((at, view)) if at.elapsed() < VIEW_REUSED_FOR => view.clone(),
            _ => {
                let view = Arc::new(self.current_view());
                *cached = Some((std::time::Instant::now(), view.clone()));
                view
            }
        }
    }

    /// Frees the web view's view of the cluster once it is stale (a copy of every pod: not kept
    /// for a page nobody has open). Called at every status pass.
    pub(super) fn forget_stale_view(&self) {
        let mut cached = self
            .recent_view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if cached
            .as_ref()
            .is_some_and(|(at, _)| at.elapsed() >= VIEW_REUSED_FOR)
        {
            *cached = None;
        }
    }
}

/// How long the web view's answers reuse one view of the cluster (their tiers are this stale at
/// most).
const VIEW_REUSED_FOR: Duration = Duration::from_secs(5);

impl protect_gate::History for StatusSync {
    fn replay(&self, policy: &WorkloadNetworkPolicy) -> Option<GateReport> {
        StatusSync::replay(self, policy)
    }

    fn hold(&self, policy: &WorkloadNetworkPolicy, held: bool) {
        StatusSync::hold(self, policy, held)
    }
}
