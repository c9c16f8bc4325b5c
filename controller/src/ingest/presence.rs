//! Which nodes' agents stream to this controller now, and since when: what tells "no violation" from
//! "no agent" ([`crate::monitor::coverage`], docs/behaviour.md §3.12).

use network_enforcer_api::uplink::AgentHealth;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A node's agent streams, as the ingest saw them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeSeen {
    /// Streams open now (an agent that replaces its stream has two for a moment).
    pub open: u32,
    /// When `open` last went from 0 to 1 or back to 0, ms since the epoch.
    pub since_ms: i64,
    /// What the node's agent processes said they lost so far (`FlowBatch.health`; nothing from an
    /// agent that does not say): per process (`instance`), the newest first, at most
    /// [`INSTANCES_PER_NODE`].
    pub health: [Option<(u64, AgentHealth)>; INSTANCES_PER_NODE],
}

/// Agent processes whose losses are kept per node: a rolling update runs two for a while.
pub const INSTANCES_PER_NODE: usize = 4;

/// The agents connected to this process, per node. One entry per node whose agent ever connected
/// (authenticated: the node is the one its token's pod runs on), so bounded by the cluster's nodes;
/// nodes gone from the cluster are forgotten with [`Presence::retain`].
#[derive(Debug, Default)]
pub struct Presence {
    nodes: Mutex<HashMap<String, NodeSeen>>,
}

impl Presence {
    /// An agent of `node` streams from `now_ms` until the returned guard is dropped.
    pub fn connected(self: &Arc<Self>, node: &str, now_ms: i64) -> Connected {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let seen = nodes.entry(node.to_string()).or_default();
        if seen.open == 0 {
            seen.since_ms = now_ms;
        }
        seen.open += 1;
        Connected {
            presence: self.clone(),
            node: node.to_string(),
        }
    }

    /// Every node's streams now.
    pub fn seen(&self) -> HashMap<String, NodeSeen> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Forgets the nodes without an open stream that `keep` refuses (deleted from the cluster).
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        self.nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|node, seen| seen.open > 0 || keep(node));
    }

    fn disconnected(&self, node: &str, now_ms: i64) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(seen) = nodes.get_mut(node) {
            seen.open = seen.open.saturating_sub(1);
            if seen.open == 0 {
                seen.since_ms = now_ms;
            }
        }
    }
}

/// `kept` with `instance`'s report: its loss counts the larger of each, its cost the newer sample's,
/// the process first; a new process pushes out the oldest.
pub fn with_report(
    kept: [Option<(u64, AgentHealth)>; INSTANCES_PER_NODE],
    instance: u64,
    health: AgentHealth,
) -> [Option<(u64, AgentHealth)>; INSTANCES_PER_NODE] {
    let merged = match kept.iter().flatten().find(|(i, _)| *i == instance) {
        Some((_, old)) => {
            // A resent batch carries an older sample of the cost.
            let cost = if health.cost_sampled_ms >= old.cost_sampled_ms {
                &health
            } else {
                old
            };
            AgentHealth {
                events_lost: old.events_lost.max(health.events_lost),
                events_dropped: old.events_dropped.max(health.events_dropped),
                batches_dropped: old.batches_dropped.max(health.batches_dropped),
                dns_lost: old.dns_lost.max(health.dns_lost),
                cost_sampled_ms: cost.cost_sampled_ms,
                cpu_ms: cost.cpu_ms,
                kernel_ns: cost.kernel_ns,
                rss_bytes: cost.rss_bytes,
            }
        }
        None => health,
    };
    let mut out = [None; INSTANCES_PER_NODE];
    out[0] = Some((instance, merged));
    let others = kept.into_iter().flatten().filter(|(i, _)| *i != instance);
    for (slot, other) in out.iter_mut().skip(1).zip(others) {
        *slot = Some(other);
    }
    out
}

/// An open agent stream of one node ([`Presence::connected`]); closing it is noted when dropped.
pub struct Connected {
    presence: Arc<Presence>,
    node: String,
}

impl Connected {
    /// The node's agent process `instance` said, with a batch, what it lost so far. Counts only
    /// grow within a process: a resent batch carries older ones, which change nothing.
    pub fn reported(&self, instance: u64, health: AgentHealth) {
        let mut nodes = self
            .presence
            .nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(seen) = nodes.get_mut(&self.node) {
            seen.health = with_report(seen.health, instance, health);
        }
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.presence
            .disconnected(&self.node, crate::cluster::watches::now_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resent_batch_lowers_no_count_and_processes_are_kept_apart() {
        let h = |events_lost, batches_dropped| AgentHealth {
            events_lost,
            batches_dropped,
            ..AgentHealth::default()
        };
        let kept = with_report(Default::default(), 7, h(5, 1));
        // A resent batch of the same process carries older counts: the newer stay.
        let kept = with_report(kept, 7, h(3, 0));
        assert_eq!(kept[0], Some((7, h(5, 1))));
        // A second process (a rolling update) is kept beside it, newest first.
        let kept = with_report(kept, 8, h(0, 0));
        assert_eq!(kept[..2], [Some((8, h(0, 0))), Some((7, h(5, 1)))]);
        // The cost is the newest sample's, not the largest figures: memory goes down too.
        let sample = |at, cpu_ms, rss_bytes| AgentHealth {
            cost_sampled_ms: at,
            cpu_ms,
            rss_bytes,
            ..h(5, 1)
        };
        let costs = with_report(kept, 7, sample(2_000, 900, 50));
        let costs = with_report(costs, 7, sample(1_000, 500, 80));
        assert_eq!(
            costs[0],
            Some((7, sample(2_000, 900, 50))),
            "an older sample"
        );
        let costs = with_report(costs, 7, sample(3_000, 950, 40));
        assert_eq!(
            costs[0],
            Some((7, sample(3_000, 950, 40))),
            "a newer sample"
        );
        // Beyond the bound, the oldest process goes.
        let kept = (9..12).fold(kept, |k, i| with_report(k, i, h(0, 0)));
        let instances: Vec<u64> = kept.iter().flatten().map(|(i, _)| *i).collect();
        assert_eq!(instances, [11, 10, 9, 8]);
    }

    #[test]
    fn a_node_is_present_while_any_of_its_streams_is_open() {
        let presence = Arc::new(Presence::default());
        let first = presence.connected("n1", 1_000);
        // The agent replaces its stream: the node never looks gone.
        let second = presence.connected("n1", 2_000);
        drop(first);
        assert_eq!(
            presence.seen()["n1"],
            NodeSeen {
                open: 1,
                since_ms: 1_000,
                health: Default::default(),
            }
        );
        drop(second);
        let seen = presence.seen()["n1"];
        assert_eq!(seen.open, 0);
        assert!(seen.since_ms > 2_000, "closed now, not at the last open");
        // A node deleted from the cluster is forgotten once no stream is open.
        let open = presence.connected("n2", 3_000);
        presence.retain(|_| false);
        assert_eq!(presence.seen().keys().collect::<Vec<_>>(), ["n2"]);
        drop(open);
        presence.retain(|_| false);
        assert!(presence.seen().is_empty());
    }
}
