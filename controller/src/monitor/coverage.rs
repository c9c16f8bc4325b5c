//! Coverage (docs/behaviour.md §3.12): a node that runs pods while no agent of it streams to the
//! leader is a node whose flows nobody observes, so monitor records no violation there and learning
//! learns nothing: "no violations" would mean "no agent". After `--agent-silence-after` such a node
//! is reported: a Warning Event `AgentSilent` on the Node (a Normal `AgentReporting` when its agent
//! is back), the gauges `agent_silent_nodes` and `agent_silent_pods`, and the readiness detail of
//! the `agents` component (which never fails readiness).
//!
//! - [`silent_nodes`]: the decision, pure, over plain data (table tests below);
//! - [`dropping_nodes`]: the nodes whose agent said it lost flows since the last look (each batch
//!   carries the agent's cumulative losses, `FlowBatch.health`): a Warning Event `AgentDropping` on
//!   the Node, a Normal `AgentNotDropping` once it stops, the gauge `agent_dropping_nodes`;
//! - [`over_budget`]: the nodes whose agent costs more than its budget (CPU in the process and in its
//!   eBPF programs, resident memory; each batch carries the agent's cost): a Warning Event
//!   `AgentOverBudget` on the Node, a Normal `AgentWithinBudget` once it is back within, the gauge
//!   `agent_over_budget_nodes`;
//! - [`Coverage`]: the loop that reads the index and the ingest's [`Presence`] and reports changes.

use crate::cluster::watches::{SharedIndex, now_ms};
use crate::ingest::presence::{NodeSeen, Presence};
use crate::policy::rule_usage::short_duration;
use crate::runtime::events::publish_cluster_scoped;
use crate::runtime::http::Component;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Reporter;
use network_enforcer_api::uplink::AgentHealth;
use prometheus_client::metrics::gauge::Gauge;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// How often the loop looks, at most (a shorter threshold is looked at twice as often).
pub const EVERY: Duration = Duration::from_secs(15);

/// How long a dropping node's agent must report no new loss before its episode ends.
pub const QUIET: Duration = Duration::from_secs(300);

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

/// A node whose agent lost flows since the last look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dropping {
    pub node: String,
    /// What it lost since the last look.
    pub lost: AgentHealth,
}

/// What each agent process (node, instance) said so far: its losses and its last cost sample.
pub type Reports = HashMap<(String, u64), AgentHealth>;

/// The nodes whose agent processes said they lost more (`now`) than at the last look (`before`),
/// summed per node. A process first seen on a node this replica saw no process of is a baseline
/// (its counts may be old); one that appears beside or after a known process of its node is new and
/// counts from 0, so all it says is new.
pub fn dropping_nodes(before: &Reports, now: &Reports) -> Vec<Dropping> {
    let known: BTreeSet<&str> = before.keys().map(|(node, _)| node.as_str()).collect();
    let mut lost: BTreeMap<&str, AgentHealth> = BTreeMap::new();
    for ((node, instance), health) in now {
        let base = match before.get(&(node.clone(), *instance)) {
            Some(base) => *base,
            None if known.contains(node.as_str()) => AgentHealth::default(),
            None => continue,
        };
        let sum = lost.entry(node.as_str()).or_default();
        sum.events_lost += health.events_lost.saturating_sub(base.events_lost);
        sum.events_dropped += health.events_dropped.saturating_sub(base.events_dropped);
        sum.batches_dropped += health.batches_dropped.saturating_sub(base.batches_dropped);
        sum.dns_lost += health.dns_lost.saturating_sub(base.dns_lost);
    }
    lost.into_iter()
        .filter(|(_, l)| *l != AgentHealth::default())
        .map(|(node, lost)| Dropping {
            node: node.to_string(),
            lost,
        })
        .collect()
}

/// What an agent may cost its node (`--agent-cpu-budget`, `--agent-memory-budget`); 0: not checked.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Budget {
    /// Cores: the agent process's CPU time and its eBPF programs' time per second.
    pub cpu_cores: f64,
    /// Bytes of resident memory of one agent process.
    pub memory_bytes: u64,
}

/// A node whose agent costs more than its [`Budget`].
#[derive(Clone, Debug, PartialEq)]
pub struct OverBudget {
    pub node: String,
    /// Cores its agent processes used between their last two samples (`None`: not two samples yet).
    pub cpu_cores: Option<f64>,
    /// The largest resident memory of its agent processes, bytes.
    pub memory_bytes: u64,
}

/// Each agent process's last two distinct cost samples (a process gone from the reports is forgotten).
#[derive(Debug, Default)]
pub struct CostSamples {
    pub previous: Reports,
    pub latest: Reports,
}

impl CostSamples {
    /// Takes in the reports of a look: a process whose sample is new moves its latest to previous.
    pub fn advance(&mut self, now: &Reports) {
        self.latest.retain(|k, _| now.contains_key(k));
        self.previous.retain(|k, _| now.contains_key(k));
        for (k, health) in now {
            let newer = self
                .latest
                .get(k)
                .is_none_or(|l| l.cost_sampled_ms != health.cost_sampled_ms);
            if newer && let Some(old) = self.latest.insert(k.clone(), *health) {
                self.previous.insert(k.clone(), old);
            }
        }
    }
}

/// The nodes whose agents cost more than `budget`: the CPU their processes (and those processes'
/// eBPF programs, when the kernel keeps BPF statistics) used per second between their `before` and
/// `now` samples, summed per node, or the resident memory of one of them. A process without a cost
/// sample (an agent older than the field) is never over.
pub fn over_budget(before: &Reports, now: &Reports, budget: Budget) -> Vec<OverBudget> {
    let mut nodes: BTreeMap<&str, OverBudget> = BTreeMap::new();
    for ((node, instance), health) in now.iter().filter(|(_, h)| h.cost_sampled_ms > 0) {
        let entry = nodes.entry(node.as_str()).or_insert_with(|| OverBudget {
            node: node.clone(),
            cpu_cores: None,
            memory_bytes: 0,
        });
        entry.memory_bytes = entry.memory_bytes.max(health.rss_bytes);
        let Some(base) = before
            .get(&(node.clone(), *instance))
            .filter(|b| b.cost_sampled_ms > 0 && b.cost_sampled_ms < health.cost_sampled_ms)
        else {
            continue;
        };
        let elapsed_ms = (health.cost_sampled_ms - base.cost_sampled_ms) as f64;
        let used_ms = health.cpu_ms.saturating_sub(base.cpu_ms) as f64
            + health.kernel_ns.saturating_sub(base.kernel_ns) as f64 / 1e6;
        *entry.cpu_cores.get_or_insert(0.0) += used_ms / elapsed_ms;
    }
    nodes
        .into_values()
        .filter(|n| {
            (budget.cpu_cores > 0.0 && n.cpu_cores.is_some_and(|c| c > budget.cpu_cores))
                || (budget.memory_bytes > 0 && n.memory_bytes > budget.memory_bytes)
        })
        .collect()
}

/// Ends and returns the episodes (node → when it was last in trouble) quiet for [`QUIET`] at
/// `now_ms` whose node's agent still streams (one that stopped leaves its episode open:
/// `AgentSilent` covers it).
pub fn quiet_episodes(
    episodes: &mut BTreeMap<String, i64>,
    seen: &HashMap<String, NodeSeen>,
    now_ms: i64,
) -> Vec<String> {
    let quiet_ms = i64::try_from(QUIET.as_millis()).unwrap_or(i64::MAX);
    let quiet: Vec<String> = episodes
        .iter()
        .filter(|(node, last)| {
            now_ms.saturating_sub(**last) >= quiet_ms
                && seen.get(node.as_str()).is_some_and(|s| s.open > 0)
        })
        .map(|(node, _)| node.clone())
        .collect();
    for node in &quiet {
        episodes.remove(node);
    }
    quiet
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
    /// Nodes whose agent lost flows since the last look.
    pub dropping_nodes: Gauge,
    /// What an agent may cost.
    pub budget: Budget,
    /// Nodes whose agent costs more than [`Coverage::budget`].
    pub over_budget_nodes: Gauge,
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
        let mut reports_before = Reports::new();
        // Each process's last two cost samples: a look between two batches judges the same ones.
        let mut samples = CostSamples::default();
        // Nodes in a dropping episode, with when their losses last grew.
        let mut episodes: BTreeMap<String, i64> = BTreeMap::new();
        // Nodes in an over-budget episode, with when they were last over.
        let mut over_episodes: BTreeMap<String, i64> = BTreeMap::new();
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
            let seen = self.presence.seen();
            let silent = silent_nodes(&pods_per_node, &seen, watching_since, now, after_ms);
            let reports_now: Reports = seen
                .iter()
                .flat_map(|(node, s)| {
                    s.health
                        .iter()
                        .flatten()
                        .map(|(instance, h)| ((node.clone(), *instance), *h))
                })
                .collect();
            let dropping = dropping_nodes(&reports_before, &reports_now);
            samples.advance(&reports_now);
            let over = over_budget(&samples.previous, &samples.latest, self.budget);
            reports_before = reports_now;
            self.dropping_nodes.set(dropping.len() as i64);
            self.report_dropping(&dropping, &seen, now, &mut episodes)
                .await;
            self.over_budget_nodes.set(over.len() as i64);
            self.report_over_budget(&over, &seen, now, &mut over_episodes)
                .await;
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
    /// A Warning Event `AgentDropping` on each node that starts losing flows (once per episode), a
    /// Normal `AgentNotDropping` once its agent, still streaming, has reported no new loss for
    /// [`QUIET`]; an agent that stops streaming leaves its episode open (`AgentSilent` covers it).
    async fn report_dropping(
        &self,
        dropping: &[Dropping],
        seen: &HashMap<String, NodeSeen>,
        now_ms: i64,
        episodes: &mut BTreeMap<String, i64>,
    ) {
        for d in dropping {
            if episodes.insert(d.node.clone(), now_ms).is_some() {
                continue;
            }
            let l = d.lost;
            let note = format!(
                "the node's network-enforcer agent lost flows: {} connection events (its ring buffer \
                 was full), {} events of new edges (its edge caps), {} batches (its uplink buffer \
                 was full), {} DNS messages: flows of its pods are missing from learning and \
                 monitor; see the agent's metrics (network_enforcer_agent_events_lost_total, \
                 _events_dropped_total, _uplink_batches_dropped_total) and docs/operations.md",
                l.events_lost, l.events_dropped, l.batches_dropped, l.dns_lost
            );
            tracing::warn!(node = %d.node, lost = ?l, "agent dropping");
            self.publish(&d.node, "Warning", "AgentDropping", note)
                .await;
        }
        for node in quiet_episodes(episodes, seen, now_ms) {
            let note = format!(
                "the node's network-enforcer agent streams and has reported no new loss for {}",
                short_duration(QUIET)
            );
            self.publish(&node, "Normal", "AgentNotDropping", note)
                .await;
        }
    }

    /// A Warning Event `AgentOverBudget` on each node whose agent starts costing more than its
    /// budget (once per episode), a Normal `AgentWithinBudget` once its agent, still streaming, has
    /// been within it for [`QUIET`].
    async fn report_over_budget(
        &self,
        over: &[OverBudget],
        seen: &HashMap<String, NodeSeen>,
        now_ms: i64,
        episodes: &mut BTreeMap<String, i64>,
    ) {
        for o in over {
            if episodes.insert(o.node.clone(), now_ms).is_some() {
                continue;
            }
            let cpu = o.cpu_cores.map_or_else(
                || "not measured yet".to_string(),
                |c| format!("{c:.2} cores"),
            );
            let note = format!(
                "the node's network-enforcer agent costs more than its budget: CPU {cpu} (budget \
                 {:.2}; its process and its eBPF programs), resident memory {} MiB (budget {} MiB); \
                 see the agent's metrics (network_enforcer_agent_resident_memory_bytes, \
                 _ebpf_program_run_seconds_total) and docs/operations.md",
                self.budget.cpu_cores,
                o.memory_bytes >> 20,
                self.budget.memory_bytes >> 20,
            );
            tracing::warn!(node = %o.node, cpu_cores = ?o.cpu_cores, memory_bytes = o.memory_bytes, "agent over budget");
            self.publish(&o.node, "Warning", "AgentOverBudget", note)
                .await;
        }
        for node in quiet_episodes(episodes, seen, now_ms) {
            let note = format!(
                "the node's network-enforcer agent streams and has been within its budget for {}",
                short_duration(QUIET)
            );
            self.publish(&node, "Normal", "AgentWithinBudget", note)
                .await;
        }
    }

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
    fn dropping_nodes_table() {
        let h = |events_lost, batches_dropped| AgentHealth {
            events_lost,
            batches_dropped,
            ..AgentHealth::default()
        };
        let map = |entries: &[(&str, u64, AgentHealth)]| -> Reports {
            entries
                .iter()
                .map(|(node, instance, health)| ((node.to_string(), *instance), *health))
                .collect()
        };
        type Case = (
            &'static str,
            Reports,
            Reports,
            Vec<(&'static str, AgentHealth)>,
        );
        // (case, before, now, dropping: (node, what it lost since))
        let cases: Vec<Case> = vec![
            (
                "the same counts: nothing lost",
                map(&[("n1", 7, h(5, 0))]),
                map(&[("n1", 7, h(5, 0))]),
                vec![],
            ),
            (
                "grown counts: what was lost since",
                map(&[("n1", 7, h(5, 0)), ("n2", 9, h(0, 0))]),
                map(&[("n1", 7, h(8, 1)), ("n2", 9, h(0, 0))]),
                vec![("n1", h(3, 1))],
            ),
            (
                "first seen by this replica: a baseline, whatever it says",
                map(&[]),
                map(&[("n1", 7, h(50, 2))]),
                vec![],
            ),
            (
                "a new agent process counts from 0: all it says is new",
                map(&[("n1", 7, h(50, 2))]),
                map(&[("n1", 8, h(1, 0))]),
                vec![("n1", h(1, 0))],
            ),
            (
                "a new agent process that lost nothing",
                map(&[("n1", 7, h(50, 2))]),
                map(&[("n1", 8, h(0, 0))]),
                vec![],
            ),
            (
                "two processes of one node (a rolling update): each against its own counts",
                map(&[("n1", 7, h(50, 2)), ("n1", 8, h(1, 0))]),
                map(&[("n1", 7, h(50, 2)), ("n1", 8, h(1, 0))]),
                vec![],
            ),
            (
                "two processes, one losing: only its growth",
                map(&[("n1", 7, h(50, 2)), ("n1", 8, h(1, 0))]),
                map(&[("n1", 7, h(50, 2)), ("n1", 8, h(4, 0))]),
                vec![("n1", h(3, 0))],
            ),
        ];
        for (case, before, now, expected) in cases {
            let got: Vec<(String, AgentHealth)> = dropping_nodes(&before, &now)
                .into_iter()
                .map(|d| (d.node, d.lost))
                .collect();
            let expected: Vec<(String, AgentHealth)> = expected
                .into_iter()
                .map(|(n, l)| (n.to_string(), l))
                .collect();
            assert_eq!(got, expected, "{case}");
        }
    }

    #[test]
    fn an_episode_ends_once_quiet_while_the_agent_streams() {
        let streaming = |open| NodeSeen {
            open,
            since_ms: 0,
            health: Default::default(),
        };
        let quiet_ms = QUIET.as_millis() as i64;
        let mut episodes: BTreeMap<String, i64> =
            [("a".into(), 0), ("b".into(), 0), ("c".into(), quiet_ms)].into();
        let seen: HashMap<String, NodeSeen> = [
            ("a".into(), streaming(1)),
            ("b".into(), streaming(0)),
            ("c".into(), streaming(1)),
        ]
        .into();
        assert_eq!(quiet_episodes(&mut episodes, &seen, quiet_ms), ["a"]);
        assert_eq!(
            episodes.keys().collect::<Vec<_>>(),
            ["b", "c"],
            "b's agent stopped (left open), c is not quiet yet"
        );
    }

    #[test]
    fn cost_samples_keep_the_last_two_distinct_ones() {
        let c = |at| AgentHealth {
            cost_sampled_ms: at,
            ..AgentHealth::default()
        };
        let look = |entries: &[(u64, i64)]| -> Reports {
            entries
                .iter()
                .map(|(instance, at)| (("n1".to_string(), *instance), c(*at)))
                .collect()
        };
        let mut samples = CostSamples::default();
        samples.advance(&look(&[(7, 1_000)]));
        assert!(samples.previous.is_empty(), "one sample: no previous");
        samples.advance(&look(&[(7, 2_000)]));
        samples.advance(&look(&[(7, 2_000)]));
        let key = ("n1".to_string(), 7);
        assert_eq!(
            (
                samples.previous[&key].cost_sampled_ms,
                samples.latest[&key].cost_sampled_ms
            ),
            (1_000, 2_000),
            "a look without a new batch keeps the two samples"
        );
        samples.advance(&look(&[(8, 5_000)]));
        assert_eq!(
            (samples.previous.len(), samples.latest.len()),
            (0, 1),
            "a process gone is forgotten"
        );
    }

    #[test]
    fn over_budget_table() {
        const MIB: u64 = 1 << 20;
        // A cost sample at `at` ms: CPU ms, eBPF ns, RSS MiB.
        let c = |at, cpu_ms, kernel_ns, rss_mib| AgentHealth {
            cost_sampled_ms: at,
            cpu_ms,
            kernel_ns,
            rss_bytes: rss_mib * MIB,
            ..AgentHealth::default()
        };
        let map = |entries: &[(&str, u64, AgentHealth)]| -> Reports {
            entries
                .iter()
                .map(|(node, instance, health)| ((node.to_string(), *instance), *health))
                .collect()
        };
        let budget = Budget {
            cpu_cores: 0.5,
            memory_bytes: 200 * MIB,
        };
        // (case, before, now, budget, over: (node, cores, MiB))
        type Case = (
            &'static str,
            Reports,
            Reports,
            Budget,
            Vec<(&'static str, Option<f64>, u64)>,
        );
        let cases: Vec<Case> = vec![
            (
                "within: 0.1 cores, 50 MiB",
                map(&[("n1", 7, c(10_000, 1_000, 0, 40))]),
                map(&[("n1", 7, c(20_000, 2_000, 0, 50))]),
                budget,
                vec![],
            ),
            (
                "over on CPU: 0.8 cores in the process",
                map(&[("n1", 7, c(10_000, 1_000, 0, 40))]),
                map(&[("n1", 7, c(20_000, 9_000, 0, 50))]),
                budget,
                vec![("n1", Some(0.8), 50)],
            ),
            (
                "over on CPU with the eBPF programs' time: 0.3 + 0.3 cores",
                map(&[("n1", 7, c(10_000, 1_000, 1_000_000_000, 40))]),
                map(&[("n1", 7, c(20_000, 4_000, 4_000_000_000, 50))]),
                budget,
                vec![("n1", Some(0.6), 50)],
            ),
            (
                "over on memory, with one sample only (CPU not measured yet)",
                map(&[]),
                map(&[("n1", 7, c(20_000, 9_000, 0, 250))]),
                budget,
                vec![("n1", None, 250)],
            ),
            (
                "one sample only and little memory: nothing to say",
                map(&[]),
                map(&[("n1", 7, c(20_000, 9_000, 0, 50))]),
                budget,
                vec![],
            ),
            (
                "the same sample again (no new batch): no rate, not over",
                map(&[("n1", 7, c(20_000, 9_000, 0, 50))]),
                map(&[("n1", 7, c(20_000, 9_000, 0, 50))]),
                budget,
                vec![],
            ),
            (
                "an agent older than the cost fields is never over",
                map(&[("n1", 7, AgentHealth::default())]),
                map(&[("n1", 7, AgentHealth::default())]),
                budget,
                vec![],
            ),
            (
                "two processes of a node (a rolling update): their CPU sums, the larger memory",
                map(&[
                    ("n1", 7, c(10_000, 0, 0, 90)),
                    ("n1", 8, c(10_000, 0, 0, 10)),
                ]),
                map(&[
                    ("n1", 7, c(20_000, 3_000, 0, 90)),
                    ("n1", 8, c(20_000, 3_000, 0, 20)),
                ]),
                budget,
                vec![("n1", Some(0.6), 90)],
            ),
            (
                "budgets of 0 are not checked",
                map(&[("n1", 7, c(10_000, 0, 0, 900))]),
                map(&[("n1", 7, c(20_000, 10_000, 0, 900))]),
                Budget::default(),
                vec![],
            ),
        ];
        for (case, before, now, budget, expected) in cases {
            let got: Vec<(String, Option<f64>, u64)> = over_budget(&before, &now, budget)
                .into_iter()
                .map(|o| {
                    (
                        o.node,
                        o.cpu_cores.map(|c| (c * 1000.0).round() / 1000.0),
                        o.memory_bytes / MIB,
                    )
                })
                .collect();
            let expected: Vec<(String, Option<f64>, u64)> = expected
                .into_iter()
                .map(|(n, c, m)| (n.to_string(), c, m))
                .collect();
            assert_eq!(got, expected, "{case}");
        }
    }

    #[test]
    fn silent_nodes_table() {
        let open = |since_ms| NodeSeen {
            open: 1,
            since_ms,
            health: Default::default(),
        };
        let closed = |since_ms| NodeSeen {
            open: 0,
            since_ms,
            health: Default::default(),
        };
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
