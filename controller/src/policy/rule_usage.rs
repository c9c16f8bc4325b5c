//! Rule usage (docs/api.md, "Rule usage"): per rule of a WorkloadNetworkPolicy, when it last allowed an
//! observed flow and how many distinct peers it allowed, and the `UnusedRules` condition derived from it.
//!
//! - [`rules_of`]: the rules of a policy in force (its direction's rules, then its `egressNames`
//!   entries), each with a [`fingerprint`] of its content, so usage follows a rule when rules are
//!   reordered and an edited rule starts anew;
//! - [`UsageTracker`]: what the status sync saw since the process started, bounded per rule
//!   ([`MAX_PEERS`] peers of 8 bytes each);
//! - [`merge`]: the next `status.ruleUsage` from the current one and the tracker (a restart keeps
//!   what the status holds: max of `lastMatched`, max of `peers`);
//! - [`unused_rules`]: the `UnusedRules` condition, and when to look again;
//! - [`describe`]: "last matched 2h ago, 3 peers" / "never matched", for `check` and the graph.
//!
//! Pure: the clock comes in as arguments.

use crate::policy::conditions::{Desired, UNUSED_RULES};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use network_enforcer_api::{Backend, Direction, RuleList, RuleUsage, WorkloadNetworkPolicySpec};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::time::Duration;

/// Distinct peers are counted up to this many per rule; `peers` never exceeds it.
pub const MAX_PEERS: usize = 1000;

/// A newer `lastMatched` is written only once it is this much newer than the stored one (or when
/// anything else of the entry changes): a busy rule does not change the status at every sync interval,
/// and days-long thresholds do not need more precision.
pub const LAST_MATCHED_GRANULARITY: Duration = Duration::from_secs(5 * 60);

/// At most this many rules are named in the `UnusedRules` message (the count is always complete).
const MAX_NAMED: usize = 20;

/// One rule of a policy's spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleRef {
    pub direction: Direction,
    /// `Some` for a rule of another list than the direction's own (`spec.egressNames`).
    pub list: Option<RuleList>,
    /// Its index in `spec.kubernetes.ingress`/`egress`, in `spec.istio.rules`, or in `list`.
    pub index: usize,
    pub fingerprint: String,
}

impl RuleRef {
    /// `ingress[2]`, `egressNames[0]`: the rule as messages name it.
    pub fn name(&self) -> String {
        match self.list {
            None => rule_name(self.direction, self.index),
            Some(RuleList::EgressNames) => format!("egressNames[{}]", self.index),
        }
    }

    /// This rule's entry in a status's `ruleUsage`, found by content (list, direction, fingerprint),
    /// not by position.
    pub fn entry_in<'u>(&self, usage: &'u [RuleUsage]) -> Option<&'u RuleUsage> {
        usage.iter().find(|u| {
            u.direction == self.direction
                && u.list == self.list
                && u.fingerprint == self.fingerprint
        })
    }

    /// The key of this rule in a [`UsageTracker`].
    fn key(&self) -> RuleKey {
        (self.direction, self.list, self.fingerprint.clone())
    }
}

/// A rule as the [`UsageTracker`] keys it: by content, not position.
pub type RuleKey = (Direction, Option<RuleList>, String);

/// `ingress[2]` / `egress[0]`.
pub fn rule_name(direction: Direction, index: usize) -> String {
    format!("{}[{index}]", direction.as_str().to_lowercase())
}

/// The first 12 hex digits of the SHA-256 of the rule's JSON: stable across controller versions as
/// long as the rule's fields serialize the same.
pub fn fingerprint<T: Serialize>(rule: &T) -> String {
    // A rule of the API types always serializes; an empty input would still hash to something stable.
    let json = serde_json::to_vec(rule).unwrap_or_default();
    let digest = ring::digest::digest(&ring::digest::SHA256, &json);
    digest.as_ref()[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The rules of `spec` that are in force: the list of its direction (the kubernetes payload's
/// `policyTypes` is exactly `[direction]`), or the istio rules (Ingress); then, for an Egress policy of
/// the kubernetes backend, its `egressNames` entries.
pub fn rules_of(spec: &WorkloadNetworkPolicySpec) -> Vec<RuleRef> {
    let direction = spec.direction;
    let fingerprints: Vec<String> = match spec.backend {
        Backend::Kubernetes => match (direction, spec.kubernetes.as_ref()) {
            (Direction::Ingress, Some(k)) => k.ingress.iter().flatten().map(fingerprint).collect(),
            (Direction::Egress, Some(k)) => k.egress.iter().flatten().map(fingerprint).collect(),
            (_, None) => Vec::new(),
        },
        Backend::Istio => spec
            .istio
            .iter()
            .flat_map(|i| &i.rules)
            .map(fingerprint)
            .collect(),
    };
    let names = match (spec.backend, direction) {
        (Backend::Kubernetes, Direction::Egress) => spec.egress_names.as_slice(),
        _ => &[],
    };
    let own = fingerprints
        .into_iter()
        .enumerate()
        .map(|(index, fingerprint)| RuleRef {
            direction,
            list: None,
            index,
            fingerprint,
        });
    let by_name = names.iter().enumerate().map(|(index, rule)| RuleRef {
        direction,
        list: Some(RuleList::EgressNames),
        index,
        fingerprint: fingerprint(rule),
    });
    own.chain(by_name).collect()
}

/// What the process saw of one rule: the newest match and the distinct peers (hashes), at most
/// [`MAX_PEERS`] of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Milliseconds since the epoch.
    pub last_ms: i64,
    peers: HashSet<u64>,
}

impl Seen {
    /// Distinct peers seen, at most [`MAX_PEERS`].
    pub fn peers(&self) -> usize {
        self.peers.len()
    }
}

/// Rule matches seen since the process started, per policy and rule (direction, fingerprint). Memory:
/// per rule that matched, one [`Seen`] of at most [`MAX_PEERS`] × 8 bytes of peer hashes (plus the
/// hash set's overhead), so at most ~16 KiB per rule; rules of deleted policies are forgotten at each
/// sync pass ([`UsageTracker::retain_policies`]).
#[derive(Clone, Debug)]
pub struct UsageTracker<K> {
    policies: HashMap<K, HashMap<RuleKey, Seen>>,
}

impl<K> Default for UsageTracker<K> {
    fn default() -> Self {
        UsageTracker {
            policies: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash + Clone> UsageTracker<K> {
    /// Rule `rule` of `policy` allowed a flow with `peer` at `at_ms`.
    pub fn record(&mut self, policy: &K, rule: &RuleRef, peer: &str, at_ms: i64) {
        let rules = match self.policies.get_mut(policy) {
            Some(rules) => rules,
            None => self.policies.entry(policy.clone()).or_default(),
        };
        let seen = rules.entry(rule.key()).or_default();
        seen.last_ms = seen.last_ms.max(at_ms);
        if seen.peers.len() < MAX_PEERS {
            let mut hasher = std::hash::DefaultHasher::new();
            peer.hash(&mut hasher);
            seen.peers.insert(hasher.finish());
        }
    }

    /// What was seen of `policy`'s rules.
    pub fn of(&self, policy: &K) -> Option<&HashMap<RuleKey, Seen>> {
        self.policies.get(policy)
    }

    /// Forgets the policies `keep` refuses; returns how many.
    pub fn retain_policies(&mut self, mut keep: impl FnMut(&K) -> bool) -> usize {
        let before = self.policies.len();
        self.policies.retain(|k, _| keep(k));
        before - self.policies.len()
    }

    /// Rules tracked, over all policies.
    pub fn len(&self) -> usize {
        self.policies.values().map(HashMap::len).sum()
    }

    /// Whether nothing is tracked.
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }
}

fn time_ms(ms: i64) -> Time {
    Time(Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn ms(t: &Time) -> i64 {
    t.0.as_millisecond()
}

/// The next `status.ruleUsage`: one entry per rule of `rules`, in order. An entry of `current` with the
/// same direction and fingerprint is kept (re-indexed); a new rule gets `since = now`. What `seen` holds
/// raises `lastMatched` (at most to `now`, at least [`LAST_MATCHED_GRANULARITY`] at a time) and `peers`
/// (max of both, at most [`MAX_PEERS`]). Entries of rules no longer in the spec are dropped.
pub fn merge(
    current: &[RuleUsage],
    rules: &[RuleRef],
    seen: Option<&HashMap<RuleKey, Seen>>,
    now: &Time,
) -> Vec<RuleUsage> {
    let now_ms = ms(now);
    rules
        .iter()
        .map(|rule| {
            let mut entry = rule
                .entry_in(current)
                .cloned()
                .unwrap_or_else(|| RuleUsage {
                    direction: rule.direction,
                    list: rule.list,
                    rule: 0,
                    fingerprint: rule.fingerprint.clone(),
                    last_matched: None,
                    peers: 0,
                    since: now.clone(),
                });
            entry.rule = i32::try_from(rule.index).unwrap_or(i32::MAX);
            if let Some(seen) = seen.and_then(|s| s.get(&rule.key())) {
                // An agent's clock ahead of ours must not put a match in the future.
                let last = seen.last_ms.min(now_ms);
                let granularity = LAST_MATCHED_GRANULARITY.as_millis() as i64;
                let newer = match &entry.last_matched {
                    None => true,
                    Some(stored) => last >= ms(stored).saturating_add(granularity),
                };
                if newer {
                    entry.last_matched = Some(time_ms(last));
                }
                let peers = i64::try_from(seen.peers().min(MAX_PEERS)).unwrap_or(0);
                entry.peers = entry.peers.max(peers).min(MAX_PEERS as i64);
            }
            entry
        })
        .collect()
}

/// The `UnusedRules` condition of a policy, and after how long it may change with no new usage (the
/// next rule to reach `after` unused).
///
/// A rule is unused when neither it allowed an observed flow within `after` of `now`: counted from its
/// `lastMatched`, else from its entry's `since` (when the controller started watching it), else, for a
/// rule without an entry, from the policy's creation (promotion) when the spec was never edited
/// (`generation` 1); an edited rule the status sync has not seen yet is not judged.
pub fn unused_rules(
    spec: &WorkloadNetworkPolicySpec,
    usage: &[RuleUsage],
    created: Option<&Time>,
    generation: Option<i64>,
    now: &Time,
    after: Duration,
) -> (Desired, Option<Duration>) {
    let rules = rules_of(spec);
    let after_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
    let now_ms = ms(now);
    let mut unused = Vec::new();
    let mut next: Option<i64> = None;
    for rule in &rules {
        let entry = rule.entry_in(usage);
        let from = match entry {
            Some(e) => Some(e.last_matched.as_ref().map_or_else(|| ms(&e.since), ms)),
            None if generation.is_none_or(|g| g <= 1) => created.map(ms),
            None => None,
        };
        let Some(from) = from else { continue };
        let due = from.saturating_add(after_ms);
        if due <= now_ms {
            unused.push((rule, entry.and_then(|e| e.last_matched.clone())));
        } else {
            let wait = due - now_ms;
            next = Some(next.map_or(wait, |n| n.min(wait)));
        }
    }
    let recheck = next.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
    let window = short_duration(after);
    let desired = if rules.is_empty() {
        Desired::new(UNUSED_RULES, false, "NoRules", "the policy has no rules")
    } else if unused.is_empty() {
        Desired::new(
            UNUSED_RULES,
            false,
            "RulesUsed",
            format!(
                "every rule allowed an observed flow within {window} (or is watched for less than {window})"
            ),
        )
    } else {
        let mut named: Vec<String> = unused
            .iter()
            .take(MAX_NAMED)
            .map(|(rule, last)| match last {
                Some(t) => format!("{} (last matched {})", rule.name(), t.0),
                None => format!("{} (never matched)", rule.name()),
            })
            .collect();
        if unused.len() > MAX_NAMED {
            named.push(format!("and {} more", unused.len() - MAX_NAMED));
        }
        Desired::new(
            UNUSED_RULES,
            true,
            "RulesUnused",
            format!(
                "{} of {} rules allowed no observed flow within {window}: {}",
                unused.len(),
                rules.len(),
                named.join(", ")
            ),
        )
    };
    (desired, recheck)
}

/// A duration in its largest whole units: `7d`, `1d12h`, `90m` → `1h30m`, `45s`.
pub fn short_duration(d: Duration) -> String {
    let mut secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    let mut out = String::new();
    for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
        if secs >= size {
            out.push_str(&format!("{}{unit}", secs / size));
            secs %= size;
        }
    }
    out
}

/// How long ago, in the largest whole unit: `45s ago`, `5m ago`, `2h ago`, `3d ago`.
fn ago(then_ms: i64, now_ms: i64) -> String {
    let secs = (now_ms.saturating_sub(then_ms) / 1000).max(0);
    let (n, unit) = match secs {
        s if s >= 86_400 => (s / 86_400, "d"),
        s if s >= 3600 => (s / 3600, "h"),
        s if s >= 60 => (s / 60, "m"),
        s => (s, "s"),
    };
    format!("{n}{unit} ago")
}

/// The usage of `rule` in words: `last matched 2h ago, 3 peers`, `never matched`, or `usage unknown`
/// when `usage` has no entry for it.
pub fn describe(rule: &RuleRef, usage: &[RuleUsage], now: &Time) -> String {
    let Some(entry) = rule.entry_in(usage) else {
        return "usage unknown".to_string();
    };
    match &entry.last_matched {
        None => "never matched".to_string(),
        Some(t) => {
            let cap = if entry.peers >= MAX_PEERS as i64 {
                "+"
            } else {
                ""
            };
            let plural = if entry.peers == 1 { "" } else { "s" };
            format!(
                "last matched {}, {}{cap} peer{plural}",
                ago(ms(t), ms(now)),
                entry.peers
            )
        }
    }
}

#[cfg(test)]
mod tests;
