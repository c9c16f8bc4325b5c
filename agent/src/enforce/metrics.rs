//! The enforcement's metrics (registered by [`crate::metrics::AgentMetrics`]), shared by the
//! watch that keeps the table current ([`super::watch`]), the deny evidence ([`super::deny`]) and the
//! DNS hold ([`super::dns_hold`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of the per-direction metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: &'static str,
}

/// Labels of the DNS hold's outcomes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// Enforcement metrics, registered by [`crate::metrics::AgentMetrics`].
#[derive(Clone, Debug)]
pub struct EnforcementMetrics {
    /// NetworkPolicies known (all namespaces).
    pub policies: Gauge,
    /// ClusterNetworkPolicies known (0 where the cluster does not serve the kind).
    pub cluster_policies: Gauge,
    /// Pods of this node isolated, per direction.
    pub isolated_pods: Family<DirectionLabel, Gauge>,
    /// Rules in the installed table.
    pub rules: Gauge,
    /// Rulesets installed.
    pub syncs: Counter,
    /// `nft` runs that failed (each retried).
    pub sync_errors: Counter,
    /// From the first change of a batch to the kernel having it.
    pub sync_seconds: Histogram,
    /// Watch or list errors (each retried with backoff).
    pub watch_errors: Counter,
    /// 1 while the installed table matches the cluster as last seen.
    pub in_sync: Gauge,
    /// Denied connection attempts (first packet of each), per direction.
    pub denied: Family<DirectionLabel, Counter>,
    /// Deny records lost: the flush's record buffer was full, or the NFLOG reader fell behind.
    pub deny_records_dropped: Counter,
    /// Pods of this node whose addresses were read on the node before the API server reported them.
    pub addresses_from_node: Counter,
    /// From a pod of this node being seen without an address to its address read on the node.
    pub address_from_node_seconds: Histogram,
    /// DNS messages the hold read, by outcome ([`crate::enforce::dns_hold`]).
    pub dns_hold: Family<OutcomeLabel, Counter>,
    /// How long the hold kept a DNS message (from reading it to letting it through).
    pub dns_hold_seconds: Histogram,
    /// Answers the hold's kernel check let through at once (`passed`) or queued (`queued`).
    pub dns_hold_checked: Family<OutcomeLabel, Counter>,
    /// What the hold's own DNS tracker did not keep, by outcome: queries over its pending bound
    /// (`pending_full`), pending queries forgotten for newer ones (`pending_replaced`), resolutions
    /// over its names bound (`names_full`).
    pub dns_hold_tracker_dropped: Family<OutcomeLabel, Counter>,
    /// Name grants held on the node.
    pub name_grants: Gauge,
}

impl Default for EnforcementMetrics {
    fn default() -> Self {
        Self {
            policies: Gauge::default(),
            cluster_policies: Gauge::default(),
            isolated_pods: Family::default(),
            rules: Gauge::default(),
            syncs: Counter::default(),
            sync_errors: Counter::default(),
            sync_seconds: Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
            watch_errors: Counter::default(),
            in_sync: Gauge::default(),
            denied: Family::default(),
            deny_records_dropped: Counter::default(),
            addresses_from_node: Counter::default(),
            address_from_node_seconds: Histogram::new([
                0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            dns_hold: Family::default(),
            dns_hold_seconds: Histogram::new([
                0.000_025, 0.000_05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05,
            ]),
            dns_hold_checked: Family::default(),
            dns_hold_tracker_dropped: Family::default(),
            name_grants: Gauge::default(),
        }
    }
}

impl EnforcementMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("enforcement");
        r.register("policies", "NetworkPolicies known", self.policies.clone());
        r.register(
            "cluster_policies",
            "ClusterNetworkPolicies known (0 where the cluster does not serve the kind)",
            self.cluster_policies.clone(),
        );
        r.register(
            "isolated_pods",
            "Pods of this node isolated by a NetworkPolicy, per direction",
            self.isolated_pods.clone(),
        );
        r.register(
            "rules",
            "Rules in the installed nftables table",
            self.rules.clone(),
        );
        r.register("syncs", "Rulesets installed", self.syncs.clone());
        r.register(
            "sync_errors",
            "Ruleset installs that failed (each retried)",
            self.sync_errors.clone(),
        );
        r.register(
            "sync_seconds",
            "From a pod, namespace or policy change to the kernel enforcing it",
            self.sync_seconds.clone(),
        );
        r.register(
            "watch_errors",
            "Pod, namespace or NetworkPolicy watch errors (each retried with backoff)",
            self.watch_errors.clone(),
        );
        r.register(
            "in_sync",
            "1 while the installed table matches the cluster as last seen",
            self.in_sync.clone(),
        );
        r.register(
            "denied",
            "Connection attempts denied by a NetworkPolicy (first packet of each), per direction",
            self.denied.clone(),
        );
        r.register(
            "deny_records_dropped",
            "Deny records lost (the record buffer was full or the NFLOG reader fell behind)",
            self.deny_records_dropped.clone(),
        );
        r.register(
            "addresses_from_node",
            "Pods of this node whose addresses were read on the node before the API server reported them",
            self.addresses_from_node.clone(),
        );
        r.register(
            "address_from_node_seconds",
            "From a pod of this node seen without an address to its address read on the node",
            self.address_from_node_seconds.clone(),
        );
        r.register(
            "dns_hold_messages",
            "DNS messages of pods allowed names, read by the hold, by outcome (granted: the answer waited for new grants)",
            self.dns_hold.clone(),
        );
        r.register(
            "dns_hold_seconds",
            "How long the hold kept a DNS message before letting it through",
            self.dns_hold_seconds.clone(),
        );
        r.register(
            "dns_hold_checked_answers",
            "Answers to pods allowed names that the hold's kernel check let through at once (passed: nothing new) or queued",
            self.dns_hold_checked.clone(),
        );
        r.register(
            "dns_hold_tracker_dropped",
            "What the hold's DNS tracker did not keep: queries over its pending bound (pending_full), \
             pending queries forgotten for newer ones (pending_replaced), resolutions over its names \
             bound (names_full); their answers wait for the controller's rendering",
            self.dns_hold_tracker_dropped.clone(),
        );
        r.register(
            "name_grants",
            "Addresses pods of this node may reach because they resolved them from an allowed name",
            self.name_grants.clone(),
        );
    }
}
