//! Keeps the node's enforcement table current: watches of every pod, namespace, NetworkPolicy and
//! (where the cluster serves them) ClusterNetworkPolicy feed one [`Cluster`]; after each change (coalesced for [`SETTLE`]) the ruleset is compiled again and, when
//! it differs from what the kernel has, installed in one transaction.
//!
//! The table outlives the process on purpose. At start nothing is removed: the previous agent's table
//! keeps enforcing until every watch has listed once and the new ruleset replaces it. On SIGTERM the
//! table stays too (a rollout must not open isolated pods), unless the agent's own DaemonSet is gone
//! or being deleted, which is what `helm uninstall` does; then the table is removed
//! ([`stop`]). `network-enforcer-agent enforcement clear` removes it by hand.
//!
//! When the ruleset cannot be built or installed for [`STARTUP_DEADLINE`] (API server unreachable,
//! `nft` refusing), `fail_open` decides: remove the table (traffic flows unpoliced) or keep the last
//! one (default; pods that start meanwhile are not isolated yet). Either way the agent keeps trying,
//! reports not ready, and logs why.

use crate::enforce::compile::{Ruleset, compile};
use crate::enforce::deny::{self, DenyIndex, SharedDenyIndex};
use crate::enforce::dns_hold::Hold;
use crate::enforce::metrics::{DirectionLabel, EnforcementMetrics};
use crate::enforce::model::Cluster;
use crate::enforce::nflog::{self, NflogOptions};
use crate::enforce::nft;
use crate::enforce::sandbox;
use crate::sources::RecordSink;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use network_enforcer_api::cluster_network_policy::ClusterNetworkPolicy;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Changes arriving within this window are installed together (a Deployment rollout changes many
/// pods at once; one `nft` run each would only add latency).
pub const SETTLE: Duration = Duration::from_millis(50);
/// How long the ruleset may stay unbuilt or uninstalled before `fail_open` applies.
pub const STARTUP_DEADLINE: Duration = Duration::from_secs(60);
/// Pause between attempts after `nft` refused a ruleset.
const RETRY: Duration = Duration::from_secs(1);

/// Enforcement settings (the agent's `--enforcement*` flags).
#[derive(Clone, Debug)]
pub struct Config {
    /// This node: only its pods are isolated here.
    pub node: String,
    /// The nftables table (`inet` family) this agent owns.
    pub table: String,
    /// Remove the table when the ruleset cannot be kept current (see the module docs).
    pub fail_open: bool,
    /// NFLOG group denied packets are copied to (the deny evidence); `None`: not logged.
    pub log_group: Option<u16>,
    /// The agent's DaemonSet as `(namespace, name)`: its deletion means uninstall (see [`stop`]).
    pub daemonset: Option<(String, String)>,
    /// Where this node's pod cgroups are: a new pod's addresses are read there before the API server
    /// reports them ([`crate::enforce::sandbox`]); `None`: from the API server only.
    pub pods_cgroup: Option<std::path::PathBuf>,
    /// The NFQUEUE and the query NFLOG group of the DNS hold ([`crate::enforce::dns_hold`]); `None`:
    /// no hold, names are enforced from the addresses the controller renders only.
    pub dns_hold: Option<(u16, u16)>,
}

/// How often the pods of this node that have no address yet are looked for on the node (only while
/// there are such pods).
pub const SANDBOX_POLL: Duration = Duration::from_millis(10);
/// How long a pod is looked for every [`SANDBOX_POLL`]; after that (a sandbox the runtime keeps failing
/// to create, a CNI that is down) only every [`SANDBOX_POLL_SLOW`], so a stuck pod costs no steady scans.
pub const SANDBOX_FAST_FOR: Duration = Duration::from_secs(10);
/// See [`SANDBOX_FAST_FOR`].
pub const SANDBOX_POLL_SLOW: Duration = Duration::from_secs(1);

/// The model shared by the watches (writers) and the sync loop (reader).
#[derive(Default)]
struct Shared {
    cluster: Mutex<Cluster>,
    changed: Notify,
    /// Wakes the look for new pods' addresses on the node ([`probe_sandboxes`]).
    pods_changed: Notify,
    /// When the oldest change not yet installed arrived.
    dirty_since: Mutex<Option<Instant>>,
    pods_listed: AtomicBool,
    namespaces_listed: AtomicBool,
    policies_listed: AtomicBool,
    /// Listed, or the cluster serves no ClusterNetworkPolicy kind ([`spawn_cluster_policies`]).
    cluster_policies_listed: AtomicBool,
}

impl Shared {
    fn touch(&self) {
        self.dirty_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(Instant::now);
        self.changed.notify_one();
        self.pods_changed.notify_one();
    }

    fn listed(&self) -> bool {
        self.pods_listed.load(Ordering::Acquire)
            && self.namespaces_listed.load(Ordering::Acquire)
            && self.policies_listed.load(Ordering::Acquire)
            && self.cluster_policies_listed.load(Ordering::Acquire)
    }
}

/// What [`stop`] needs of the running enforcement.
#[derive(Clone, Debug, Default)]
pub struct Handle {
    /// Set once the agent's DaemonSet was seen deleted or being deleted.
    uninstalling: Arc<AtomicBool>,
}

/// Starts the watches and the sync loop, and with a log group the deny evidence into `records`; runs
/// until the process ends.
pub fn spawn(
    client: Client,
    config: Config,
    metrics: EnforcementMetrics,
    records: RecordSink,
) -> Handle {
    let handle = Handle::default();
    if let Some((namespace, name)) = &config.daemonset {
        spawn_daemonset_watch(
            Api::namespaced(client.clone(), namespace),
            name.clone(),
            handle.uninstalling.clone(),
        );
    }
    let shared = Arc::new(Shared::default());
    let deny_index = SharedDenyIndex::default();
    let hold = config.dns_hold.and_then(|(queue, query_group)| {
        let grace = crate::dns::tracker::Limits::default().grace;
        match Hold::start(&config.table, queue, query_group, grace, metrics.clone()) {
            Ok(hold) => {
                tracing::info!(queue, query_group, table = %nft::dns_hold_table(&config.table),
                    "DNS hold on: a pod reaches what it resolved from an allowed name once it reads the answer");
                Some(hold)
            }
            Err(error) => {
                tracing::warn!(%error, "no DNS hold: names are enforced from the addresses the controller renders (a first connection after a new address may need a retry)");
                None
            }
        }
    });
    if let Some(group) = config.log_group {
        match nflog::spawn(group, &NflogOptions::default()) {
            Ok(reader) => {
                tracing::info!(group, "deny evidence on (NFLOG group {group})");
                tokio::spawn(deny::forward(
                    reader,
                    deny_index.clone(),
                    records,
                    metrics.clone(),
                ));
            }
            // Enforcement does not depend on the evidence: go on without it.
            Err(e) => tracing::error!(error = %e, group,
                "cannot read denied packets: enforcement goes on without deny evidence"),
        }
    }
    spawn_watch::<Pod>(
        Api::all(client.clone()),
        shared.clone(),
        metrics.clone(),
        |s| &s.pods_listed,
        |c, p| c.apply_pod(p),
        |c, p| c.delete_pod(p),
        |c| c.pods.clear(),
    );
    spawn_watch::<Namespace>(
        Api::all(client.clone()),
        shared.clone(),
        metrics.clone(),
        |s| &s.namespaces_listed,
        |c, n| c.apply_namespace(n),
        |c, n| c.delete_namespace(n),
        |c| c.namespaces.clear(),
    );
    let client_for_cluster_policies = client.clone();
    spawn_watch::<NetworkPolicy>(
        Api::all(client),
        shared.clone(),
        metrics.clone(),
        |s| &s.policies_listed,
        |c, p| c.apply_policy(p),
        |c, p| c.delete_policy(p),
        |c| {
            c.policies.clear();
            c.name_rules.clear();
        },
    );
    tokio::spawn(spawn_cluster_policies(
        client_for_cluster_policies,
        shared.clone(),
        metrics.clone(),
    ));
    if let Some(pods_cgroup) = config.pods_cgroup.clone() {
        tokio::spawn(probe_sandboxes(
            shared.clone(),
            config.node.clone(),
            pods_cgroup,
            metrics.clone(),
        ));
    }
    tokio::spawn(sync_loop(shared, config, metrics, deny_index, hold));
    handle
}

/// How often a cluster without the ClusterNetworkPolicy kind (or without our permission to list it)
/// is looked at again.
const CLUSTER_POLICIES_LOOK_AGAIN: Duration = Duration::from_secs(60);

/// Watches ClusterNetworkPolicies (`policy.networking.k8s.io/v1alpha2`) once the API server serves
/// them and the agent may list them; until then they count as listed (there are none), so a cluster
/// without the CRD enforces as before, and one that installs it later is picked up within
/// [`CLUSTER_POLICIES_LOOK_AGAIN`].
async fn spawn_cluster_policies(client: Client, shared: Arc<Shared>, metrics: EnforcementMetrics) {
    let api = Api::<ClusterNetworkPolicy>::all(client);
    loop {
        match api.list(&kube::api::ListParams::default().limit(1)).await {
            Ok(_) => {
                tracing::info!(
                    "enforcing ClusterNetworkPolicies (policy.networking.k8s.io/v1alpha2)"
                );
                // Not listed until its watch has: the tiers must not be installed half known.
                shared
                    .cluster_policies_listed
                    .store(false, Ordering::Release);
                spawn_watch::<ClusterNetworkPolicy>(
                    api,
                    shared,
                    metrics,
                    |s| &s.cluster_policies_listed,
                    |c, p| c.apply_cluster_policy(p),
                    |c, p| c.delete_cluster_policy(p),
                    |c| c.cluster_policies.clear(),
                );
                return;
            }
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 403 => {
                if status.code == 403 {
                    tracing::warn!(
                        "ClusterNetworkPolicies are served but the agent may not list them (ClusterRole): they are not enforced"
                    );
                }
                if !shared.cluster_policies_listed.swap(true, Ordering::AcqRel) {
                    shared.touch();
                }
            }
            Err(error) => {
                tracing::warn!(%error, "looking for ClusterNetworkPolicies failed; looking again");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        }
        tokio::time::sleep(CLUSTER_POLICIES_LOOK_AGAIN).await;
    }
}

/// Reads the addresses of this node's new pods on the node ([`sandbox::sandbox_addresses`]) while
/// the API server has not reported them, every [`SANDBOX_POLL`] while there are such pods (every
/// [`SANDBOX_POLL_SLOW`] once all have waited [`SANDBOX_FAST_FOR`]), and puts
/// them in the model: the table then knows a new pod before its containers send. The API server's
/// addresses replace them when they come.
async fn probe_sandboxes(
    shared: Arc<Shared>,
    node: String,
    pods_cgroup: std::path::PathBuf,
    metrics: EnforcementMetrics,
) {
    let proc_root = std::path::Path::new("/proc");
    // When each waiting pod (by uid) was first seen without an address.
    let mut waiting_since: std::collections::HashMap<String, Instant> = Default::default();
    loop {
        let waiting: Vec<(crate::enforce::model::Key, String)> = {
            let cluster = shared.cluster.lock().unwrap_or_else(|p| p.into_inner());
            cluster
                .waiting_for_address(&node)
                .map(|(key, uid)| (key.clone(), uid.to_string()))
                .collect()
        };
        waiting_since.retain(|uid, _| waiting.iter().any(|(_, u)| u == uid));
        if waiting.is_empty() {
            shared.pods_changed.notified().await;
            continue;
        }
        let now = Instant::now();
        for (_, uid) in &waiting {
            waiting_since.entry(uid.clone()).or_insert(now);
        }
        let dir = pods_cgroup.clone();
        let found = tokio::task::spawn_blocking(move || {
            waiting
                .into_iter()
                .filter_map(|(key, uid)| {
                    let ips = sandbox::sandbox_addresses(proc_root, &dir, &uid)?;
                    Some((key, uid, ips))
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        if !found.is_empty() {
            let mut changed = false;
            {
                let mut cluster = shared.cluster.lock().unwrap_or_else(|p| p.into_inner());
                for (key, uid, ips) in found {
                    if cluster.set_address_from_node(&key, &uid, ips.clone()) {
                        changed = true;
                        metrics.addresses_from_node.inc();
                        let waited = waiting_since.get(&uid).map(Instant::elapsed);
                        if let Some(waited) = waited {
                            metrics
                                .address_from_node_seconds
                                .observe(waited.as_secs_f64());
                        }
                        tracing::info!(namespace = %key.0, pod = %key.1, ?ips, ?waited,
                            "new pod's addresses read on the node, before the API server reported them");
                    }
                }
            }
            if changed {
                shared.touch();
            }
        }
        let youngest = waiting_since.values().map(Instant::elapsed).min();
        let pause = if youngest.is_some_and(|waited| waited < SANDBOX_FAST_FOR) {
            SANDBOX_POLL
        } else {
            SANDBOX_POLL_SLOW
        };
        // A new pod wakes the look at once whatever the pause.
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = shared.pods_changed.notified() => {}
        }
    }
}

/// Watches the agent's own DaemonSet for its deletion. It has to be seen while it happens: an
/// uninstall deletes the agent's RBAC right after the DaemonSet, so by the time the pod gets SIGTERM
/// the agent may no longer ask.
fn spawn_daemonset_watch(api: Api<DaemonSet>, name: String, uninstalling: Arc<AtomicBool>) {
    tokio::spawn(async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let mut events = watcher::watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            let deleting = match event {
                Ok(Event::Delete(_)) => true,
                Ok(Event::Apply(ds) | Event::InitApply(ds)) => {
                    ds.metadata.deletion_timestamp.is_some()
                }
                Ok(Event::Init | Event::InitDone) => false,
                Err(e) => {
                    tracing::debug!(error = %e, "watching the agent's DaemonSet failed; retrying");
                    false
                }
            };
            if deleting && !uninstalling.swap(true, Ordering::AcqRel) {
                tracing::info!(daemonset = %name,
                    "the agent's DaemonSet is being deleted: the enforcement table goes when this agent stops");
            }
        }
    });
}

type Flag = fn(&Shared) -> &AtomicBool;

/// One kind's watch: a relist replaces that kind's part of the model once complete, so objects
/// deleted while the watch was down disappear.
#[allow(clippy::too_many_arguments)]
fn spawn_watch<K>(
    api: Api<K>,
    shared: Arc<Shared>,
    metrics: EnforcementMetrics,
    listed: Flag,
    apply: fn(&mut Cluster, &K),
    delete: fn(&mut Cluster, &K),
    clear: fn(&mut Cluster),
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let mut relist: Vec<K> = Vec::new();
        let mut events = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init) => relist.clear(),
                Ok(Event::InitApply(object)) => relist.push(object),
                Ok(Event::InitDone) => {
                    {
                        let mut cluster = shared.cluster.lock().unwrap_or_else(|p| p.into_inner());
                        clear(&mut cluster);
                        for object in relist.drain(..) {
                            apply(&mut cluster, &object);
                        }
                    }
                    listed(&shared).store(true, Ordering::Release);
                    shared.touch();
                }
                Ok(Event::Apply(object)) => {
                    apply(
                        &mut shared.cluster.lock().unwrap_or_else(|p| p.into_inner()),
                        &object,
                    );
                    shared.touch();
                }
                Ok(Event::Delete(object)) => {
                    delete(
                        &mut shared.cluster.lock().unwrap_or_else(|p| p.into_inner()),
                        &object,
                    );
                    shared.touch();
                }
                Err(e) => {
                    metrics.watch_errors.inc();
                    tracing::warn!(error = %e, kind = %K::kind(&()),
                        "enforcement watch failed; retrying with backoff");
                }
            }
        }
    });
}

/// Compiles and installs after every change; see the module docs for failures.
async fn sync_loop(
    shared: Arc<Shared>,
    config: Config,
    metrics: EnforcementMetrics,
    deny_index: SharedDenyIndex,
    hold: Option<Arc<Hold>>,
) {
    let started = Instant::now();
    let mut installed: Option<String> = None;
    let mut failing_since: Option<Instant> = None;
    let mut opened = false;
    loop {
        if !shared.listed() {
            // Listing: the previous table (if any) keeps enforcing meanwhile.
            if started.elapsed() > STARTUP_DEADLINE {
                fail(
                    &config,
                    &mut opened,
                    "the pods, namespaces and NetworkPolicies could not be listed",
                );
            }
            tokio::select! {
                _ = shared.changed.notified() => {}
                _ = tokio::time::sleep(RETRY) => {}
            }
            continue;
        }
        tokio::time::sleep(SETTLE).await;
        let since = shared
            .dirty_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let (ruleset, policies) = {
            let cluster = shared.cluster.lock().unwrap_or_else(|p| p.into_inner());
            let known = (cluster.policies.len(), cluster.cluster_policies.len());
            (compile(&cluster, &config.node), known)
        };
        // What the table looks like without the name grants (they change by themselves): installed
        // again only when this changes.
        let script = nft::render(&ruleset, &config.table, config.log_group);
        if installed.as_deref() != Some(script.as_str()) || opened {
            let text = script.clone();
            let (hold, compiled, log_group) = (hold.clone(), ruleset.clone(), config.log_group);
            let result = tokio::task::spawn_blocking(move || match hold {
                Some(hold) => hold.install(&compiled, log_group),
                None => nft::apply(&text),
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
            match result {
                Ok(_) => {
                    report(&ruleset, policies, &script, &metrics);
                    for warning in &ruleset.warnings {
                        tracing::warn!(warning, "part of a policy is not enforced as written");
                    }
                    if let Some(since) = since {
                        metrics.sync_seconds.observe(since.elapsed().as_secs_f64());
                    }
                    tracing::info!(
                        table = %config.table,
                        policies = policies.0,
                        cluster_policies = policies.1,
                        isolated_ingress = ruleset.isolated().0,
                        isolated_egress = ruleset.isolated().1,
                        "enforcement table installed"
                    );
                    *deny_index.write().unwrap_or_else(|p| p.into_inner()) =
                        DenyIndex::new(&ruleset);
                    installed = Some(script);
                    failing_since = None;
                    opened = false;
                    metrics.in_sync.set(1);
                }
                Err(error) => {
                    metrics.sync_errors.inc();
                    metrics.in_sync.set(0);
                    tracing::error!(%error, table = %config.table, "installing the enforcement table failed; retrying");
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > STARTUP_DEADLINE {
                        fail(&config, &mut opened, &error);
                    }
                    // Try again even without a new change.
                    shared.touch();
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
        }
        shared.changed.notified().await;
    }
}

/// What `fail_open` says to do once the table cannot be kept current.
fn fail(config: &Config, opened: &mut bool, why: &str) {
    if !config.fail_open {
        tracing::error!(why, table = %config.table,
            "enforcement cannot be kept current; the last installed table stays (failOpen is false)");
        return;
    }
    if *opened {
        return;
    }
    match nft::clear(&config.table) {
        Ok(_) => {
            *opened = true;
            tracing::error!(why, table = %config.table,
                "enforcement cannot be kept current; table removed, pods are NOT isolated (failOpen is true)");
        }
        Err(e) => tracing::error!(why, error = %e, "removing the enforcement table failed"),
    }
}

fn report(
    ruleset: &Ruleset,
    (policies, cluster_policies): (usize, usize),
    script: &str,
    metrics: &EnforcementMetrics,
) {
    let (ingress, egress) = ruleset.isolated();
    metrics.policies.set(policies as i64);
    metrics.cluster_policies.set(cluster_policies as i64);
    metrics
        .isolated_pods
        .get_or_create(&DirectionLabel {
            direction: "ingress",
        })
        .set(ingress as i64);
    metrics
        .isolated_pods
        .get_or_create(&DirectionLabel {
            direction: "egress",
        })
        .set(egress as i64);
    let rules = script
        .lines()
        .filter(|l| l.trim_end().ends_with("return") || l.trim_end().ends_with("drop"))
        .count();
    metrics.rules.set(rules as i64);
    metrics.syncs.inc();
}

/// At SIGTERM: removes the table when the agent's DaemonSet was seen deleted, or is gone or being
/// deleted now (uninstall); keeps it otherwise (restart, rollout). Returns whether it removed it.
pub async fn stop(client: Client, config: &Config, handle: &Handle) -> bool {
    let Some((namespace, name)) = &config.daemonset else {
        return false;
    };
    let uninstall = handle.uninstalling.load(Ordering::Acquire)
        || {
            let api: Api<DaemonSet> = Api::namespaced(client, namespace);
            match api.get_opt(name).await {
                Ok(None) => true,
                Ok(Some(ds)) => ds.metadata.deletion_timestamp.is_some(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot tell whether the agent is being uninstalled; the enforcement table stays");
                    false
                }
            }
        };
    if !uninstall {
        tracing::info!(table = %config.table, "stopping; the enforcement table stays until the next agent replaces it");
        return false;
    }
    let table = config.table.clone();
    match tokio::task::spawn_blocking(move || nft::clear_all(&table)).await {
        Ok(Ok(_)) => {
            tracing::info!(table = %config.table, "the agent's DaemonSet is gone: enforcement table removed");
            true
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "removing the enforcement table at uninstall failed");
            false
        }
        Err(e) => {
            tracing::error!(error = %e, "removing the enforcement table at uninstall failed");
            false
        }
    }
}
