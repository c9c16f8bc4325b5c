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

/// What an agent may cost its node (`--agent-cpu-budget`, `--agent-memory-budget-mib`); 0: not
/// checked.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Budget {
    /// Cores: the agent process's CPU time (with its finished children's) and its eBPF programs'
    /// time per second.
    pub cpu_cores: f64,
    /// Bytes of resident memory of one agent process.
    pub memory_bytes: u64,
}

/// A node whose agent costs more than its [`Budget`].
#[derive(Clone, Debug, PartialEq)]
pub struct OverBudget {
    pub node: String,
    /// Cores its agent processes used per second from their base sample to their newest (`None`: no
    /// process has 10 s of samples yet).
    pub cpu_cores: Option<f64>,
    /// The largest resident memory of its agent processes, bytes.
    pub memory_bytes: u64,
    /// The newest of its processes' samples (the node's monotonic clock, ms): a node is judged
    /// again only on a newer one ([`confirmed_over`]).
    pub sampled_ms: i64,
}

/// A process's cost is judged over at least this span of its own samples: a burst of early flushes
/// (a backlog replayed, the start-up scan) is not a rate.
pub const MIN_COST_SPAN_MS: i64 = 10_000;

/// A process whose newest sample is older than this (on the controller's clock: when it last
/// changed), and older than three of its own intervals between samples, is not judged: it stopped
/// (a restart, the OOM killer) or is idle (a flush without records sends no batch), and its last
/// figures would otherwise stand for it forever.
pub const COST_SAMPLE_FRESH_MS: i64 = 60_000;

/// Each agent process's cost samples: the newest, and one at least [`MIN_COST_SPAN_MS`] older (on
/// the agent's clock; at most about twice that) to take the rate against.
#[derive(Debug, Default)]
pub struct CostSamples {
    processes: HashMap<(String, u64), Samples>,
}

#[derive(Debug, Clone, Copy)]
struct Samples {
    /// A sample older than `latest` by at least [`MIN_COST_SPAN_MS`], if any (the rate's start).
    base: Option<AgentHealth>,
    /// The oldest sample kept after `base`: the next base once far enough behind.
    pending: Option<AgentHealth>,
    /// When `base` and `pending` arrived, on the controller's clock (the agents' clocks start
    /// over when a node reboots: only the controller's compares two processes).
    base_arrived_ms: i64,
    pending_arrived_ms: i64,
    latest: AgentHealth,
    /// When `latest` arrived, on the controller's clock.
    changed_ms: i64,
    /// Between the last two samples, on the agent's clock (its flush interval, or longer when idle).
    interval_ms: i64,
}

/// The longest three sample intervals keep a process fresh: one idle for an hour before a batch is
/// not judged for three.
const MAX_FRESH_MS: i64 = 10 * 60_000;

impl Samples {
    /// Whether its newest sample stands for it at `now_ms` (see [`COST_SAMPLE_FRESH_MS`]).
    fn fresh(&self, now_ms: i64) -> bool {
        let fresh_for =
            COST_SAMPLE_FRESH_MS.max(self.interval_ms.saturating_mul(3).min(MAX_FRESH_MS));
        now_ms.saturating_sub(self.changed_ms) <= fresh_for
    }
}

impl CostSamples {
    /// Takes in the reports of a look at `now_ms` (a process gone from them is forgotten).
    pub fn advance(&mut self, now: &Reports, now_ms: i64) {
        self.processes.retain(|k, _| now.contains_key(k));
        for (k, health) in now.iter().filter(|(_, h)| h.cost_sampled_ms > 0) {
            let Some(p) = self.processes.get_mut(k) else {
                self.processes.insert(
                    k.clone(),
                    Samples {
                        base: None,
                        pending: None,
                        base_arrived_ms: 0,
                        pending_arrived_ms: 0,
                        latest: *health,
                        changed_ms: now_ms,
                        interval_ms: 0,
                    },
                );
                continue;
            };
            if health.cost_sampled_ms <= p.latest.cost_sampled_ms {
                continue;
            }
            // The base moves up to the newest sample far enough behind the new one: the previous
            // latest after a gap, else the oldest sample since the base once it is far enough.
            let far = |older: &AgentHealth| {
                health.cost_sampled_ms - older.cost_sampled_ms >= MIN_COST_SPAN_MS
            };
            if far(&p.latest) {
                p.base = Some(p.latest);
                p.base_arrived_ms = p.changed_ms;
                p.pending = None;
            } else if let Some(pending) = p.pending.filter(far) {
                p.base = Some(pending);
                p.base_arrived_ms = p.pending_arrived_ms;
                p.pending = Some(p.latest);
                p.pending_arrived_ms = p.changed_ms;
            } else if p.pending.is_none() {
                p.pending = Some(p.latest);
                p.pending_arrived_ms = p.changed_ms;
            }
            p.interval_ms = health.cost_sampled_ms - p.latest.cost_sampled_ms;
            p.latest = *health;
            p.changed_ms = now_ms;
        }
    }

    /// (bases, latest samples) of the processes whose sample is fresh at `now_ms`, for
    /// [`over_budget`]. A process of a node whose successor has a base after its newest sample
    /// (a rolling update: the successor has run for 10 s since it last reported) is not judged:
    /// the node's cost is its successor's.
    pub fn fresh(&self, now_ms: i64) -> (Reports, Reports) {
        let mut bases = Reports::new();
        let mut latest = Reports::new();
        for (k, p) in &self.processes {
            if !p.fresh(now_ms) {
                continue;
            }
            let replaced = self.processes.iter().any(|(other, o)| {
                other.0 == k.0
                    && other.1 != k.1
                    && o.fresh(now_ms)
                    && o.base.is_some()
                    && o.base_arrived_ms > p.changed_ms
            });
            if replaced {
                continue;
            }
            latest.insert(k.clone(), p.latest);
            if let Some(base) = p.base {
                bases.insert(k.clone(), base);
            }
        }
        (bases, latest)
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
            sampled_ms: 0,
        });
        entry.memory_bytes = entry.memory_bytes.max(health.rss_bytes);
        entry.sampled_ms = entry.sampled_ms.max(health.cost_sampled_ms);
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

/// Where a node over its budget stands: its newest sample judged over, and whether an older one was
/// over too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OverRun {
    sampled_ms: i64,
    confirmed: bool,
}

/// The nodes of `over` over on two samples in a row (`last` keeps each node's run; a node not over
/// at this look starts over): a single window over budget is a burst, not a cost. A look without
/// a newer sample of the node (agents flush every 10 s or more, the loop looks every 15 s) judges
/// nothing new, so it neither confirms nor breaks the run.
pub fn confirmed_over(
    over: Vec<OverBudget>,
    last: &mut BTreeMap<String, OverRun>,
) -> Vec<OverBudget> {
    let mut runs = BTreeMap::new();
    let mut confirmed = Vec::new();
    for o in over {
        let run = match last.get(&o.node) {
            // Any other time is a new sample: a restarted node's agents count from 0 again.
            Some(run) if run.sampled_ms == o.sampled_ms => *run,
            Some(_) => OverRun {
                sampled_ms: o.sampled_ms,
                confirmed: true,
            },
            None => OverRun {
                sampled_ms: o.sampled_ms,
                confirmed: false,
            },
        };
        runs.insert(o.node.clone(), run);
        if run.confirmed {
            confirmed.push(o);
        }
    }
    *last = runs;
    confirmed
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
    /// Nodes whose agent costs more than [`Coverage::budget`] (on two samples in a row).
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
        // Each process's cost samples: a look between two batches judges the same ones.
        let mut samples = CostSamples::default();
        // Nodes in a dropping episode, with when their losses last grew.
        let mut episodes: BTreeMap<String, i64> = BTreeMap::new();
        // Nodes in an over-budget episode, with when they were last over; nodes over at the last look.
        let mut over_episodes: BTreeMap<String, i64> = BTreeMap::new();
        let mut over_last_look = BTreeMap::new();
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
            samples.advance(&reports_now, now);
            let (bases, latest) = samples.fresh(now);
            let over = confirmed_over(
                over_budget(&bases, &latest, self.budget),
                &mut over_last_look,
            );
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
            let cpu_budget = match self.budget.cpu_cores {
                c if c > 0.0 => format!("{c:.2}"),
                _ => "off".to_string(),
            };
            let memory_budget = match self.budget.memory_bytes >> 20 {
                0 => "off".to_string(),
                mib => format!("{mib} MiB"),
            };
            let note = format!(
                "the node's network-enforcer agent costs more than its budget: CPU {cpu} (budget \
                 {cpu_budget}; its process, its children and its eBPF programs), resident memory \
                 {} MiB (budget {memory_budget}); see the agent's metrics \
                 (network_enforcer_agent_resident_memory_bytes, _ebpf_program_run_seconds_total) \
                 and docs/operations.md",
                o.memory_bytes >> 20,
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
        publish_cluster_scoped(
            &self.client,
            &self.reporter,
            regarding,
            type_,
            reason,
            "Observe",
            note,
        )
        .await;
    }
}

#[cfg(test)]
mod tests;
