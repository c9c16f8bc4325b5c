//! The edge history behind the protect gate and the UI.

use super::*;

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

    /// Notes whether the gate holds `policy` in monitor (its evidence then counts as monitor's).
    pub fn hold(&self, policy: &WorkloadNetworkPolicy, held: bool) {
        let mut set = self.held.lock().expect("held lock");
        if held {
            set.insert(policy_key(policy));
        } else {
            set.remove(&policy_key(policy));
        }
    }

    /// Edges the protect gate's history holds now.
    pub fn history_len(&self) -> usize {
        self.history.lock().expect("history lock").len()
    }
}

impl StatusSync {
    /// The observed edges with an end in `namespace`, newest first, at most `limit`, and whether more
    /// were left out; `None` until the history is complete (the web view's edges, `check
    /// --from-cluster`).
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
        Some(
            self.history
                .lock()
                .expect("history lock")
                .edges_in(namespace, limit),
        )
    }
}

impl protect_gate::History for StatusSync {
    fn replay(&self, policy: &WorkloadNetworkPolicy) -> Option<GateReport> {
        StatusSync::replay(self, policy)
    }

    fn hold(&self, policy: &WorkloadNetworkPolicy, held: bool) {
        StatusSync::hold(self, policy, held)
    }
}
