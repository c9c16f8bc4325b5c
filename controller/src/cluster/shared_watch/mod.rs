//! One watch per kind per process. The reconcilers, the status sync and the web view all read
//! WorkloadNetworkPolicies, their proposals and NetworkPolicies; each kind is watched once
//! ([`SharedWatch`]) into one store, and whoever needs its changes (a reconciler's triggers)
//! subscribes to that watch instead of opening another one. [`PolicyObjects`] holds the three.
//!
//! kube-runtime's own shared streams are not used: they pass no deletions on (kube-rs/kube#1590),
//! which the policy reconciler needs (a deleted NetworkPolicy it rendered is put back, a deleted
//! winner hands its target to a duplicate), and they take no subscriber after the watch started
//! (#1630), which the reconcilers are (they start when the replica becomes the leader; the web view
//! reads the same store on every replica from the start).
//!
//! A watch starts when its first consumer asks for it ([`SharedWatch::start`]), so a follower
//! watches only what its web view shows. A subscriber gets every object of the store when it
//! subscribes, then every change; a slow subscriber holds the watch back (its channel is bounded)
//! rather than losing a change, and a dropped one is forgotten at the next change.

use futures::{FutureExt as _, Stream, StreamExt as _};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource};
use network_enforcer_api::{WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Changes a subscriber may hold before the watch waits for it.
const SUBSCRIBER_BUFFER: usize = 1024;

/// The kinds more than one part of the controller reads, each watched once, in the controller's
/// watch scope (`--namespace`, or the whole cluster).
pub struct PolicyObjects {
    pub policies: SharedWatch<WorkloadNetworkPolicy>,
    pub proposals: SharedWatch<WorkloadNetworkPolicyProposal>,
    pub network_policies: SharedWatch<NetworkPolicy>,
}

impl PolicyObjects {
    /// The three watches over `namespace` (`None`: all namespaces), none started yet.
    pub fn new(client: &Client, namespace: Option<&str>) -> Self {
        Self {
            policies: SharedWatch::new(scoped(client, namespace)),
            proposals: SharedWatch::new(scoped(client, namespace)),
            network_policies: SharedWatch::new(scoped(client, namespace)),
        }
    }
}

fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// What a subscriber is told of an object.
#[derive(Clone, Debug)]
pub enum Change<K> {
    /// Created or changed (or seen again when the watch listed anew).
    Applied(Arc<K>),
    Deleted(Arc<K>),
}

/// One watch of kind `K` and its store. See the module docs.
pub struct SharedWatch<K: Resource<DynamicType = ()> + Clone + 'static> {
    api: Api<K>,
    store: Store<K>,
    /// Taken by the one start (or by a test that fills the store itself, which then never starts).
    writer: Mutex<Option<Writer<K>>>,
    subscribers: Arc<Mutex<Vec<mpsc::Sender<Change<K>>>>>,
}

impl<K> SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    /// A watch of `api`, not started.
    pub fn new(api: Api<K>) -> Self {
        let (store, writer) = reflector::store();
        Self {
            api,
            store,
            writer: Mutex::new(Some(writer)),
            subscribers: Arc::default(),
        }
    }

    /// The store: empty until the watch has started and listed (`Store::wait_until_ready`), then
    /// current.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Starts the watch on the current Tokio runtime, the first time; later calls do nothing.
    pub fn start(&self) {
        let Some(writer) = self.writer.lock().expect("writer lock").take() else {
            return;
        };
        tokio::spawn(run(self.api.clone(), writer, self.subscribers.clone()));
    }

    /// Takes the store's writer so that a test fills the store itself; the watch never starts then.
    /// `None` once started or taken.
    pub fn take_writer(&self) -> Option<Writer<K>> {
        self.writer.lock().expect("writer lock").take()
    }

    /// Subscribers now ([`SharedWatch::changes`]).
    pub fn subscribers(&self) -> usize {
        let mut subscribers = self.subscribers.lock().expect("subscribers lock");
        subscribers.retain(|s| !s.is_closed());
        subscribers.len()
    }

    /// Every object of the store now, then every change; starts the watch. The stream ends only if
    /// the watch's task does.
    pub fn changes(&self) -> impl Stream<Item = Change<K>> + Send + 'static {
        self.start();
        let (sender, receiver) = mpsc::channel(SUBSCRIBER_BUFFER);
        // Under the lock the watch applies its events under: a change is either in this snapshot
        // or sent to this subscriber, never neither.
        let now = {
            let mut subscribers = self.subscribers.lock().expect("subscribers lock");
            subscribers.push(sender);
            self.store.state()
        };
        futures::stream::iter(now.into_iter().map(Change::Applied))
            .chain(tokio_stream::wrappers::ReceiverStream::new(receiver))
    }

    /// The objects created or changed, as a kube-runtime controller's own watch would trigger it
    /// (`Controller::for_stream`); starts the watch.
    pub fn applied(&self) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        self.changes().filter_map(|change| async move {
            match change {
                Change::Applied(obj) => Some(Ok(obj.as_ref().clone())),
                Change::Deleted(_) => None,
            }
        })
    }

    /// The objects created, changed or deleted, as a controller's `owns` and `watches` triggers
    /// take them; starts the watch.
    pub fn touched(&self) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        self.changes().map(|change| match change {
            Change::Applied(obj) | Change::Deleted(obj) => Ok(obj.as_ref().clone()),
        })
    }
}

/// Whether `store`'s watch has completed its first list. A store whose writer is gone without
/// listing (its watch's task ended) has not: `wait_until_ready` fails then.
///
/// Polled, never awaited: the readiness is a oneshot with room for one waker, and a poll from
/// here would take the place of an awaiting task's.
pub fn has_listed<K>(store: &Store<K>) -> bool
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
}

/// The watch: applies each event to the store and passes it to every subscriber; retries with
/// backoff when it fails.
async fn run<K>(
    api: Api<K>,
    mut writer: Writer<K>,
    subscribers: Arc<Mutex<Vec<mpsc::Sender<Change<K>>>>>,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(kind = %K::kind(&()), %error, "watch failed; retrying with backoff");
                continue;
            }
        };
        let change = match &event {
            watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) => {
                Some(Change::Applied(Arc::new(obj.clone())))
            }
            watcher::Event::Delete(obj) => Some(Change::Deleted(Arc::new(obj.clone()))),
            watcher::Event::Init | watcher::Event::InitDone => None,
        };
        let receivers = {
            let mut subscribers = subscribers.lock().expect("subscribers lock");
            writer.apply_watcher_event(&event);
            subscribers.retain(|s| !s.is_closed());
            subscribers.clone()
        };
        let Some(change) = change else { continue };
        for receiver in receivers {
            // Closed: the subscriber is gone; removed at the next event.
            let _ = receiver.send(change.clone()).await;
        }
    }
}

#[cfg(test)]
mod tests;
