//! Keeps the [`Index`] current from watches of pods, Services, EndpointSlices (or Endpoints),
//! workloads, Jobs and nodes, cluster-wide.

use crate::cluster::index::Index;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Endpoints, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use network_enforcer_api::WorkloadKind;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// The kinds watched; the index is ready when each has listed once (Jobs too: a CronJob's run seen
/// before its Job would be learned as a Job of its own; endpoints too: a call to the `kubernetes`
/// Service before its endpoints are listed would resolve to no backend and be dropped).
const KINDS: usize = 8;

/// A shared index and whether every watch has completed its first list.
#[derive(Default)]
pub struct SharedIndex {
    pub index: Arc<RwLock<Index>>,
    synced: AtomicUsize,
}

impl SharedIndex {
    /// True once every kind has been listed: before that, a pod missing from the index may simply not
    /// have been listed yet, so ingest refuses streams instead of dropping their records.
    pub fn ready(&self) -> bool {
        self.synced.load(Ordering::Acquire) >= KINDS
    }

    /// An index that counts as fully listed from the start, for callers that fill it themselves instead
    /// of running the watches (tests of the ingest endpoint without a cluster, offline tools).
    pub fn listed(index: Index) -> Self {
        Self {
            index: Arc::new(RwLock::new(index)),
            synced: AtomicUsize::new(KINDS),
        }
    }
}

/// Wall-clock milliseconds since the epoch: the clock of index changes and agents' records.
pub fn now_ms() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_millisecond()
}

/// Where the endpoints of Services are read from: EndpointSlices where the API server serves
/// `discovery.k8s.io/v1` (v1.21 and later: what kube-proxy reads, and the only place for slices a
/// controller writes itself), else v1 Endpoints (deprecated since v1.33, still served everywhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndpointsSource {
    EndpointSlices,
    Endpoints,
}

impl EndpointsSource {
    /// Asks the API server's discovery which source it serves. An error other than "not served"
    /// (the API server unreachable, a forbidden discovery) is returned: guessing would silently pick
    /// the wrong source for the process's life.
    pub async fn discover(client: &Client) -> Result<Self, kube::Error> {
        match client.list_api_group_resources("discovery.k8s.io/v1").await {
            Ok(list) if list.resources.iter().any(|r| r.name == "endpointslices") => {
                Ok(Self::EndpointSlices)
            }
            Ok(_) => Ok(Self::Endpoints),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Self::Endpoints),
            Err(e) => Err(e),
        }
    }

    /// [`EndpointsSource::discover`], asked again with a backoff (1 s doubling to 30 s) until the API
    /// server answers: the index cannot be ready without it.
    pub async fn discover_until_answered(client: &Client) -> Self {
        let mut wait = std::time::Duration::from_secs(1);
        loop {
            match Self::discover(client).await {
                Ok(source) => {
                    tracing::info!(?source, "endpoints of Services are read from this source");
                    return source;
                }
                Err(error) => {
                    tracing::warn!(%error, retry_in = ?wait,
                        "cannot ask the API server whether it serves discovery.k8s.io/v1 EndpointSlices; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(std::time::Duration::from_secs(30));
                }
            }
        }
    }
}

/// The index built once from the cluster's current objects of every watched kind, as the watches
/// would build it: for tools and tests that need the cluster's state now rather than kept current.
pub async fn snapshot(client: &Client) -> Result<Index, kube::Error> {
    async fn list<K>(client: &Client) -> Result<Vec<K>, kube::Error>
    where
        K: kube::Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
    {
        Ok(Api::<K>::all(client.clone())
            .list(&kube::api::ListParams::default())
            .await?
            .items)
    }
    let mut ix = Index::default();
    // Owners before pods, so each pod finds its workload as it is applied.
    list::<Deployment>(client)
        .await?
        .iter()
        .for_each(|d| ix.apply_deployment(d));
    list::<StatefulSet>(client)
        .await?
        .iter()
        .for_each(|s| ix.apply_statefulset(s));
    list::<DaemonSet>(client)
        .await?
        .iter()
        .for_each(|d| ix.apply_daemonset(d));
    list::<Job>(client)
        .await?
        .iter()
        .for_each(|j| ix.apply_job(j));
    list::<Node>(client)
        .await?
        .iter()
        .for_each(|n| ix.apply_node(n));
    let now = now_ms();
    list::<Pod>(client)
        .await?
        .iter()
        .for_each(|p| ix.apply_pod(p, now));
    list::<Service>(client)
        .await?
        .iter()
        .for_each(|s| ix.apply_service(s));
    match EndpointsSource::discover(client).await? {
        EndpointsSource::EndpointSlices => list::<EndpointSlice>(client)
            .await?
            .iter()
            .for_each(|s| ix.apply_endpoint_slice(s)),
        EndpointsSource::Endpoints => list::<Endpoints>(client)
            .await?
            .iter()
            .for_each(|e| ix.apply_endpoints(e)),
    }
    Ok(ix)
}

/// Runs the watches until the process stops.
pub async fn run(client: Client, shared: Arc<SharedIndex>) {
    let source = EndpointsSource::discover_until_answered(&client).await;
    tokio::join!(
        watch::<Pod>(
            &client,
            &shared,
            |ix, p| ix.apply_pod(p, now_ms()),
            |ix, p| { ix.delete_pod(&p.namespace().unwrap_or_default(), &p.name_any(), now_ms()) }
        ),
        watch::<Service>(&client, &shared, Index::apply_service, |ix, s| {
            ix.delete_service(&s.namespace().unwrap_or_default(), &s.name_any())
        }),
        // Every endpoints object streams through; only events that change what the index keeps take
        // the write lock (see `Index::endpoints_change`).
        async {
            match source {
                EndpointsSource::EndpointSlices => {
                    watch_changes::<EndpointSlice>(
                        &client,
                        &shared,
                        Index::apply_endpoint_slice,
                        |ix, s| {
                            ix.delete_endpoint_slice(
                                &s.namespace().unwrap_or_default(),
                                &s.name_any(),
                            )
                        },
                        Some(|ix, s, deleted| {
                            if deleted {
                                ix.holds_endpoint_slice(
                                    &s.namespace().unwrap_or_default(),
                                    &s.name_any(),
                                )
                            } else {
                                ix.endpoint_slice_change(s)
                            }
                        }),
                    )
                    .await
                }
                EndpointsSource::Endpoints => {
                    watch_changes::<Endpoints>(
                        &client,
                        &shared,
                        Index::apply_endpoints,
                        |ix, e| {
                            ix.delete_endpoints(&e.namespace().unwrap_or_default(), &e.name_any())
                        },
                        Some(|ix, e, deleted| {
                            if deleted {
                                ix.holds_endpoints(
                                    &e.namespace().unwrap_or_default(),
                                    &e.name_any(),
                                )
                            } else {
                                ix.endpoints_change(e)
                            }
                        }),
                    )
                    .await
                }
            }
        },
        watch::<Deployment>(&client, &shared, Index::apply_deployment, |ix, d| {
            ix.delete_workload(
                &d.namespace().unwrap_or_default(),
                WorkloadKind::Deployment,
                &d.name_any(),
            )
        }),
        watch::<StatefulSet>(&client, &shared, Index::apply_statefulset, |ix, s| {
            ix.delete_workload(
                &s.namespace().unwrap_or_default(),
                WorkloadKind::StatefulSet,
                &s.name_any(),
            )
        }),
        watch::<DaemonSet>(&client, &shared, Index::apply_daemonset, |ix, d| {
            ix.delete_workload(
                &d.namespace().unwrap_or_default(),
                WorkloadKind::DaemonSet,
                &d.name_any(),
            )
        }),
        watch::<Node>(&client, &shared, Index::apply_node, |ix, n| ix
            .delete_node(&n.name_any())),
        watch::<Job>(&client, &shared, Index::apply_job, |ix, j| ix
            .delete_job(&j.namespace().unwrap_or_default(), &j.name_any())),
    );
}

/// Applies the events of kind `K` to the index, each under the write lock.
async fn watch<K>(
    client: &Client,
    shared: &SharedIndex,
    apply: impl Fn(&mut Index, &K),
    delete: impl Fn(&mut Index, &K),
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + Debug
        + Default
        + DeserializeOwned
        + Send
        + 'static,
{
    watch_changes(client, shared, apply, delete, None).await
}

/// [`watch`], with `changes` (given the object and whether it was deleted): the write lock, which
/// blocks ingest, is then taken only for events that `changes` finds, under the read lock, would change
/// the index. The check and the write are not atomic, but only events that change nothing are skipped,
/// which is the same as applying them at the check (a Service arriving in between finds what it would
/// have); the write re-decides everything under its lock.
async fn watch_changes<K>(
    client: &Client,
    shared: &SharedIndex,
    apply: impl Fn(&mut Index, &K),
    delete: impl Fn(&mut Index, &K),
    changes: Option<fn(&Index, &K, bool) -> bool>,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + Debug
        + Default
        + DeserializeOwned
        + Send
        + 'static,
{
    let mut events = watcher::watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listed = false;
    let mut seen = Seen::default();
    while let Some(event) = events.next().await {
        let changes = |obj: &K, deleted: bool| {
            changes.is_none_or(|changes| {
                changes(&shared.index.read().expect("index lock"), obj, deleted)
            })
        };
        match event {
            Ok(Event::Init) => seen.relist(),
            Ok(Event::Apply(obj) | Event::InitApply(obj)) => {
                seen.applied(key_of(&obj));
                if changes(&obj, false) {
                    apply(&mut shared.index.write().expect("index lock"), &obj)
                }
            }
            Ok(Event::Delete(obj)) => {
                seen.deleted(&key_of(&obj));
                if changes(&obj, true) {
                    delete(&mut shared.index.write().expect("index lock"), &obj)
                }
            }
            Ok(Event::InitDone) => {
                let gone = seen.relisted();
                if !gone.is_empty() {
                    tracing::info!(kind = %K::kind(&()), deleted = gone.len(),
                        "objects deleted while the watch was down are removed from the index");
                }
                for (namespace, name) in gone {
                    // The delete functions read only the name and namespace.
                    let mut stub = K::default();
                    let meta = stub.meta_mut();
                    meta.namespace = namespace;
                    meta.name = Some(name);
                    if changes(&stub, true) {
                        delete(&mut shared.index.write().expect("index lock"), &stub)
                    }
                }
                if !listed {
                    listed = true;
                    shared.synced.fetch_add(1, Ordering::AcqRel);
                }
            }
            Err(error) => {
                tracing::warn!(kind = %K::kind(&()), %error, "watch failed; retrying with backoff")
            }
        }
    }
}

/// An object's (namespace, name).
pub(crate) type Key = (Option<String>, String);

pub(crate) fn key_of<K: kube::Resource>(obj: &K) -> Key {
    (obj.meta().namespace.clone(), obj.name_any())
}

/// The objects one watch has reported, so that a re-list (after the watch fell behind or its
/// connection broke) can tell which were deleted while nobody watched: the API server sends no delete
/// event for those, and without this they would stay in the index for ever.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    known: std::collections::HashSet<Key>,
    /// What the re-list in progress has listed so far.
    relisting: Option<std::collections::HashSet<Key>>,
}

impl Seen {
    /// A (re-)list starts.
    pub(crate) fn relist(&mut self) {
        self.relisting = Some(Default::default());
    }

    pub(crate) fn applied(&mut self, key: Key) {
        if let Some(listed) = &mut self.relisting {
            listed.insert(key.clone());
        }
        self.known.insert(key);
    }

    pub(crate) fn deleted(&mut self, key: &Key) {
        self.known.remove(key);
    }

    /// The (re-)list is complete: the objects known before it that it did not list, which are gone.
    pub(crate) fn relisted(&mut self) -> Vec<Key> {
        let Some(listed) = self.relisting.take() else {
            return Vec::new();
        };
        let gone: Vec<Key> = self.known.difference(&listed).cloned().collect();
        for key in &gone {
            self.known.remove(key);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        (Some("ns".into()), name.into())
    }

    #[test]
    fn a_relist_finds_what_was_deleted_while_nobody_watched() {
        let mut seen = Seen::default();
        // The first list.
        seen.relist();
        seen.applied(key("a"));
        seen.applied(key("b"));
        assert_eq!(seen.relisted(), Vec::<Key>::new());
        // Watched: c added, a deleted.
        seen.applied(key("c"));
        seen.deleted(&key("a"));
        // The watch breaks; b and c are deleted meanwhile, d created; the re-list sees only d.
        seen.relist();
        seen.applied(key("d"));
        let mut gone = seen.relisted();
        gone.sort();
        assert_eq!(gone, vec![key("b"), key("c")]);
        // Known from now on: d only; another re-list that lists d finds nothing gone.
        seen.relist();
        seen.applied(key("d"));
        assert_eq!(seen.relisted(), Vec::<Key>::new());
        // An InitDone without an Init in progress (never sent by kube, but harmless) finds nothing.
        assert_eq!(seen.relisted(), Vec::<Key>::new());
    }
}
