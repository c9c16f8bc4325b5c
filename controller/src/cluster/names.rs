//! Which addresses the names of outside services have now, as the pods of each workload resolved them
//! (the agents' `OUTCOME_RESOLVED` records, docs/behaviour.md §4.4): what a protect policy's
//! `egressNames` renders into the NetworkPolicy as `ipBlock`s, since a NetworkPolicy has no names.
//!
//! Per workload, not per cluster: an address counts for a workload only when one of its own pods
//! resolved it, so a pod elsewhere that answers its own queries cannot open another workload's
//! policy. An address is kept for [`Settings::retention`] after it was last resolved (at least the
//! answer's TTL): clients cache answers beyond their TTL, and a rendering that follows every TTL would
//! churn. Bounded per workload and in all; past a bound the least recently resolved address goes,
//! counted ([`ResolvedNames::stats`]).

use network_enforcer_api::WorkloadKind;
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A workload: namespace, kind, name (as a WorkloadNetworkPolicy's `targetRef` names it).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKey {
    pub namespace: String,
    pub kind: WorkloadKind,
    pub name: String,
}

/// Bounds and times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// How long an address stays after it was last resolved.
    pub retention: Duration,
    /// Addresses per workload (over all its names).
    pub per_workload: usize,
    /// Addresses in all.
    pub total: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            retention: Duration::from_secs(600),
            per_workload: 1_024,
            total: 100_000,
        }
    }
}

/// What changed with one observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A new address of the name for the workload: renderings that allow the name must follow.
    NewAddress,
    /// Known already: its time was refreshed.
    Refreshed,
}

/// The store; shared by ingest (writes) and the policy reconciler (reads).
#[derive(Debug, Default)]
pub struct ResolvedNames {
    settings: Settings,
    state: Mutex<State>,
    /// Told the workload of each new address ([`ResolvedNames::with_changes`]); a full channel drops
    /// the notice (the reconciler's requeue catches up).
    changes: Option<tokio::sync::mpsc::Sender<WorkloadKey>>,
}

#[derive(Debug, Default)]
struct State {
    /// workload → (name, address) → last resolved, ms since the epoch.
    by_workload: HashMap<WorkloadKey, HashMap<(Arc<str>, IpAddr), i64>>,
    len: usize,
    evicted: u64,
}

impl ResolvedNames {
    pub fn new(settings: Settings) -> Self {
        Self {
            settings,
            state: Mutex::default(),
            changes: None,
        }
    }

    /// A store that tells the returned receiver which workload got a new address.
    pub fn with_changes(settings: Settings) -> (Self, tokio::sync::mpsc::Receiver<WorkloadKey>) {
        let (sender, receiver) = tokio::sync::mpsc::channel(1024);
        let names = Self {
            changes: Some(sender),
            ..Self::new(settings)
        };
        (names, receiver)
    }

    /// How long an address stays after it was last resolved.
    pub fn retention(&self) -> Duration {
        self.settings.retention
    }

    /// A pod of `workload` resolved `name` to `address` at `at_ms`.
    pub fn observe(
        &self,
        workload: WorkloadKey,
        name: &str,
        address: IpAddr,
        at_ms: i64,
    ) -> Change {
        let change = self.insert(workload.clone(), name, address, at_ms);
        if let (Change::NewAddress, Some(changes)) = (change, &self.changes) {
            let _ = changes.try_send(workload);
        }
        change
    }

    fn insert(&self, workload: WorkloadKey, name: &str, address: IpAddr, at_ms: i64) -> Change {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *state;
        let addresses = state.by_workload.entry(workload).or_default();
        if let Some(last) = addresses.get_mut(&(Arc::from(name), address)) {
            *last = (*last).max(at_ms);
            return Change::Refreshed;
        }
        if addresses.len() >= self.settings.per_workload.max(1) {
            evict_oldest(addresses);
            state.len -= 1;
            state.evicted += 1;
        }
        addresses.insert((name.into(), address), at_ms);
        state.len += 1;
        if state.len > self.settings.total.max(1) {
            // The least recently resolved of the largest workload goes: one busy workload cannot
            // take the room of the others.
            if let Some(largest) = state.by_workload.values_mut().max_by_key(|a| a.len()) {
                evict_oldest(largest);
                state.len -= 1;
                state.evicted += 1;
            }
        }
        Change::NewAddress
    }

    /// The addresses of the names `matches` accepts that pods of `workload` resolved within the
    /// retention before `now_ms`, sorted.
    pub fn addresses(
        &self,
        workload: &WorkloadKey,
        matches: impl Fn(&str) -> bool,
        now_ms: i64,
    ) -> BTreeSet<IpAddr> {
        let since = now_ms.saturating_sub(retention_ms(&self.settings));
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .by_workload
            .get(workload)
            .into_iter()
            .flatten()
            .filter(|((name, _), last)| **last >= since && matches(name))
            .map(|((_, address), _)| *address)
            .collect()
    }

    /// Forgets what was last resolved more than the retention before `now_ms`.
    pub fn expire(&self, now_ms: i64) {
        let since = now_ms.saturating_sub(retention_ms(&self.settings));
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let state = &mut *state;
        for addresses in state.by_workload.values_mut() {
            let before = addresses.len();
            addresses.retain(|_, last| *last >= since);
            state.len -= before - addresses.len();
        }
        state.by_workload.retain(|_, a| !a.is_empty());
    }

    /// (addresses held, addresses evicted by the bounds so far).
    pub fn stats(&self) -> (usize, u64) {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        (state.len, state.evicted)
    }
}

fn retention_ms(settings: &Settings) -> i64 {
    i64::try_from(settings.retention.as_millis()).unwrap_or(i64::MAX)
}

fn evict_oldest(addresses: &mut HashMap<(Arc<str>, IpAddr), i64>) {
    if let Some(oldest) = addresses
        .iter()
        .min_by_key(|(_, last)| **last)
        .map(|(k, _)| k.clone())
    {
        addresses.remove(&oldest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> WorkloadKey {
        WorkloadKey {
            namespace: "shop".into(),
            kind: WorkloadKind::Deployment,
            name: "client".into(),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_are_per_workload_by_name_and_age_out_after_the_retention() {
        let names = ResolvedNames::new(Settings {
            retention: Duration::from_secs(60),
            ..Settings::default()
        });
        let api = |n: &str| n == "api.partner.test";
        assert_eq!(
            names.observe(client(), "api.partner.test", ip("203.0.113.10"), 1_000),
            Change::NewAddress
        );
        assert_eq!(
            names.observe(client(), "api.partner.test", ip("203.0.113.10"), 2_000),
            Change::Refreshed
        );
        names.observe(client(), "api.partner.test", ip("203.0.113.11"), 30_000);
        names.observe(client(), "other.partner.test", ip("203.0.113.99"), 30_000);
        let mut elsewhere = client();
        elsewhere.name = "server".into();
        names.observe(
            elsewhere.clone(),
            "api.partner.test",
            ip("198.51.100.1"),
            30_000,
        );
        let got: Vec<IpAddr> = names
            .addresses(&client(), api, 40_000)
            .into_iter()
            .collect();
        assert_eq!(got, [ip("203.0.113.10"), ip("203.0.113.11")]);
        // .10 was last resolved at 2 s: gone a minute later, .11 stays.
        let got: Vec<IpAddr> = names
            .addresses(&client(), api, 62_001)
            .into_iter()
            .collect();
        assert_eq!(got, [ip("203.0.113.11")]);
        names.expire(62_001);
        assert_eq!(names.stats(), (3, 0));
        assert!(
            names
                .addresses(&elsewhere, |_| true, 40_000)
                .contains(&ip("198.51.100.1"))
        );
    }

    #[test]
    fn the_bounds_evict_the_least_recently_resolved_and_count_them() {
        let names = ResolvedNames::new(Settings {
            per_workload: 3,
            total: 5,
            ..Settings::default()
        });
        for i in 0..4u8 {
            names.observe(
                client(),
                "a.test",
                IpAddr::from([203, 0, 113, i]),
                i64::from(i),
            );
        }
        let all = names.addresses(&client(), |_| true, 10);
        assert_eq!(all.len(), 3);
        assert!(!all.contains(&ip("203.0.113.0")), "the oldest went");
        let mut other = client();
        other.name = "other".into();
        for i in 0..3u8 {
            names.observe(
                other.clone(),
                "b.test",
                IpAddr::from([198, 51, 100, i]),
                100,
            );
        }
        assert_eq!(names.stats(), (5, 2));
    }
}
