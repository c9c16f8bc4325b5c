//! Settings of the status sync.

use super::*;

/// Settings of the status sync.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Watch only this namespace's policies and NetworkPolicies; `None` watches all.
    pub namespace: Option<String>,
    /// How often statuses are synced and patched (`--status-update-interval`).
    pub interval: Duration,
    /// How often queued evidence is attributed (the policy's mode at that moment is the action).
    pub evidence_interval: Duration,
    /// See [`REPEAT_WINDOW`].
    pub repeat_window: Duration,
    /// Whether ipBlocks match pod IPs (see [`ClusterView::set_ip_blocks_match_pods`]); false for Cilium.
    pub ip_blocks_match_pods: bool,
    /// The name Events are reported under.
    pub reporter: String,
    /// The instance reporting Events, usually the pod name.
    pub instance: Option<String>,
    /// Bounds of the edge history behind the protect gate (`--edge-history-*`).
    pub history: edge_history::Bounds,
    /// How long after it starts judging evidence the history counts as still being rebuilt
    /// (`--edge-history-warmup`): the gate then reports the flows it would block, but never that
    /// nothing would be (docs/behaviour.md §3.11).
    pub history_warmup: Duration,
    /// Where the history is persisted between leaders (`None`: it is not, and a new leader starts
    /// from the violation records only).
    pub history_store: Option<history_store::HistoryStore>,
    /// How often the leader persists the history (`--edge-history-persist-interval`).
    pub history_persist_every: Duration,
    /// Where the evidence claims are persisted between leaders (`None`: they are not, and a batch
    /// resent to a new leader is recognised only by the 60-second rule, docs/behaviour.md §3.6).
    pub claims_store: Option<crate::ingest::claims_store::ClaimsStore>,
    /// The policy reconciler's memory of backends (`reconcile::Settings::backends`): which policy of a
    /// target is in force depends on validity, judged as the reconciler judges it.
    pub backends: SharedBackends,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            namespace: None,
            interval: Duration::from_secs(30),
            evidence_interval: Duration::from_secs(1),
            repeat_window: REPEAT_WINDOW,
            ip_blocks_match_pods: true,
            reporter: "network-enforcer-controller".into(),
            instance: None,
            history: edge_history::Bounds::default(),
            history_warmup: Duration::ZERO,
            history_store: None,
            history_persist_every: Duration::from_secs(60),
            claims_store: None,
            backends: SharedBackends::default(),
        }
    }
}

/// [`parse_duration`], with zero allowed (a setting that `0s` turns off).
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, String> {
    // Far above any interval that makes sense here.
    const MAX: Duration = Duration::from_secs(366 * 86_400);
    network_enforcer_api::duration::parse_duration(text, MAX).map_err(|e| e.to_string())
}

/// Parses a duration as the chart writes it (`30s`, `1m30s`, `500ms`, `1.5h`, `7d`; see
/// [`network_enforcer_api::duration`]). Zero is refused: the sync would spin.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    match parse_duration_or_zero(text)? {
        d if d.is_zero() => Err(format!("duration {text:?} must be greater than zero")),
        d => Ok(d),
    }
}
