//! Coverage (docs/behaviour.md §3.12): a node that runs pods while no agent of it streams to the
//! leader is a node whose flows nobody observes, so monitor records no violation there and learning
//! learns nothing: "no violations" would mean "no agent". After `--agent-silence-after` such a node
//! is reported: a Warning Event `AgentSilent` on the Node (a Normal `AgentReporting` when its agent
//! is back), the gauges `agent_silent_nodes` and `agent_silent_pods`, and the readiness detail of
//! the `agents` component (which never fails readiness).
//!
//! - [`silent_nodes`]: the decision, pure, over plain data (table tests below);
//! - [`Coverage`]: the loop that reads the index and the ingest's [`Presence`] and reports changes.

use crate::cluster::watches::{SharedIndex, now_ms};
use crate::ingest::presence::{NodeSeen, Presence};
use crate::policy::rule_usage::short_duration;
use crate::runtime::events::publish_cluster_scoped;
use crate::runtime::http::Component;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Reporter;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// How often the loop looks, at most (a shorter threshold is looked at twice as often).
pub const EVERY: Duration = Duration::from_secs(15);

/// At most this many nodes are named in the readiness detail and the log line (the gauges count all).
const MAX_NAMED: usize = 10;

/// A node whose pods nobody observes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Silent {
    pub node: String,
    /// Its pods that run now.
    pub pods: usize,
    /// Since when no agent of it has streamed (or since this replica watches, when none ever did),
    /// ms since the epoch.
    pub since_ms: i64,
}

/// The nodes of `pods_per_node` that run pods and have had no open agent stream for `after_ms` at
/// `now_ms`, counted from the stream's close or, for a node never seen, from `watching_since_ms` (when
/// this replica started to lead: agents stream to the leader only).
pub fn silent_nodes(
    pods_per_node: &BTreeMap<String, usize>,
    seen: &HashMap<String, NodeSeen>,
    watching_since_ms: i64,
    now_ms: i64,
    after_ms: i64,
) -> Vec<Silent> {
    pods_per_node
        .iter()
        .filter(|(_, pods)| **pods > 0)
        .filter_map(|(node, pods)| {
            let since_ms = match seen.get(node) {
                Some(seen) if seen.open > 0 => return None,
                Some(seen) => seen.since_ms.max(watching_since_ms),
                None => watching_since_ms,
            };
            (now_ms.saturating_sub(since_ms) >= after_ms).then(|| Silent {
                node: node.clone(),
                pods: *pods,
                since_ms,
            })
        })
        .collect()
}

/// The coverage loop's parts ([`Coverage::run`]); it runs on the leader only (agents stream to the
/// leader), from when it starts to lead.
pub struct Coverage {
    pub index: Arc<SharedIndex>,
    pub presence: Arc<Presence>,
    pub client: kube::Client,
    pub reporter: Reporter,
    pub after: Duration,
    pub silent_nodes: Gauge,
    pub silent_pods: Gauge,
    pub health: Component,
}

impl Coverage {
    /// Looks every [`EVERY`] (or half the threshold) once the index has listed; reports what changed. Runs until dropped.
    pub async fn run(self) {
        let after_ms = i64::try_from(self.after.as_millis()).unwrap_or(i64::MAX);
        let every = EVERY.min(self.after / 2).max(Duration::from_secs(1));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let watching_since = now_ms();
        let mut reported: BTreeSet<String> = BTreeSet::new();
        self.health.ready("listing the cluster");
        loop {
            tick.tick().await;
            if !self.index.ready() {
                continue;
            }
            let now = now_ms();
            let pods_per_node = {
                let index = self.index.index.read().unwrap_or_else(|p| p.into_inner());
                index.running_pods_per_node()
            };
            self.presence
                .retain(|node| pods_per_node.contains_key(node));
            let silent = silent_nodes(
                &pods_per_node,
                &self.presence.seen(),
                watching_since,
                now,
                after_ms,
            );
            self.silent_nodes.set(silent.len() as i64);
            self.silent_pods
                .set(silent.iter().map(|s| s.pods as i64).sum());
            self.report(&silent, &mut reported).await;
        }
    }

    async fn report(&self, silent: &[Silent], reported: &mut BTreeSet<String>) {
        let now: BTreeSet<String> = silent.iter().map(|s| s.node.clone()).collect();
        let silence = short_duration(self.after);
        for s in silent.iter().filter(|s| !reported.contains(&s.node)) {
            let note = format!(
                "no network-enforcer agent of this node has streamed to the controller for {silence} \
                 or more: the flows of its {} running pods are not observed (no learning, no \
                 violations recorded for them); check the agent DaemonSet's pod on this node",
                s.pods
            );
            tracing::warn!(node = %s.node, pods = s.pods, "agent silent");
            self.publish(&s.node, "Warning", "AgentSilent", note).await;
        }
        for node in reported.difference(&now) {
            tracing::info!(%node, "agent reporting again");
            let note = "the node's network-enforcer agent streams to the controller again";
            self.publish(node, "Normal", "AgentReporting", note.to_string())
                .await;
        }
        *reported = now;
        if silent.is_empty() {
            self.health
                .ready("every node that runs pods has an agent streaming".to_string());
        } else {
            let mut named: Vec<&str> = silent
                .iter()
                .take(MAX_NAMED)
                .map(|s| s.node.as_str())
                .collect();
            let more = silent.len().saturating_sub(MAX_NAMED);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            named.sort_unstable();
            // An optional component: reported, never failing readiness (the controller works).
            self.health.not_ready(format!(
                "{} node(s) without an agent streaming for {silence}: {}{more}",
                silent.len(),
                named.join(", ")
            ));
        }
    }
}

impl Coverage {
    /// An Event about Node `node` ([`publish_cluster_scoped`]).
    async fn publish(&self, node: &str, type_: &str, reason: &str, note: String) {
        // The uid is the node's name, as the kubelet writes it for its own Events of the node: what
        // `kubectl describe node` selects them by.
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            uid: Some(node.into()),
            ..ObjectReference::default()
        };
        publish_cluster_scoped(&self.client, &self.reporter, regarding, type_, reason, note).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    #[test]
    fn silent_nodes_table() {
        let open = |since_ms| NodeSeen { open: 1, since_ms };
        let closed = |since_ms| NodeSeen { open: 0, since_ms };
        struct Case {
            name: &'static str,
            pods: &'static [(&'static str, usize)],
            seen: Vec<(&'static str, NodeSeen)>,
            watching_since: i64,
            now: i64,
            want: Vec<(&'static str, usize, i64)>,
        }
        let cases = [
            Case {
                name: "a node whose agent streams is covered",
                pods: &[("a", 3)],
                seen: vec![("a", open(0))],
                watching_since: 0,
                now: 10 * MIN,
                want: vec![],
            },
            Case {
                name: "never seen: silent once the leader has watched for the threshold",
                pods: &[("a", 3)],
                seen: vec![],
                watching_since: 0,
                now: 2 * MIN,
                want: vec![("a", 3, 0)],
            },
            Case {
                name: "never seen, but the leader started watching only just now",
                pods: &[("a", 3)],
                seen: vec![],
                watching_since: 9 * MIN,
                now: 10 * MIN,
                want: vec![],
            },
            Case {
                name: "closed a minute ago: not yet; closed 3 minutes ago: silent",
                pods: &[("a", 1), ("b", 2)],
                seen: vec![("a", closed(9 * MIN)), ("b", closed(7 * MIN))],
                watching_since: 0,
                now: 10 * MIN,
                want: vec![("b", 2, 7 * MIN)],
            },
            Case {
                name: "closed before this replica led: counted from when it leads",
                pods: &[("a", 1)],
                seen: vec![("a", closed(MIN))],
                watching_since: 9 * MIN,
                now: 10 * MIN,
                want: vec![],
            },
            Case {
                name: "a node without running pods is never silent",
                pods: &[("a", 0)],
                seen: vec![],
                watching_since: 0,
                now: 10 * MIN,
                want: vec![],
            },
        ];
        for case in cases {
            let pods: BTreeMap<String, usize> =
                case.pods.iter().map(|(n, p)| (n.to_string(), *p)).collect();
            let seen: HashMap<String, NodeSeen> = case
                .seen
                .into_iter()
                .map(|(n, s)| (n.to_string(), s))
                .collect();
            let got: Vec<(String, usize, i64)> =
                silent_nodes(&pods, &seen, case.watching_since, case.now, 2 * MIN)
                    .into_iter()
                    .map(|s| (s.node, s.pods, s.since_ms))
                    .collect();
            let want: Vec<(String, usize, i64)> = case
                .want
                .into_iter()
                .map(|(n, p, s)| (n.to_string(), p, s))
                .collect();
            assert_eq!(got, want, "{}", case.name);
        }
    }
}
