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
//! subscribes, then every change. A list (the first, or a relist after the watch was down) is passed
//! on once it is done and in the store: every object then, and a deletion for each object the store
//! held and the list no longer has (a reconciler looks objects up in the store: told of a listed
//! object before the store holds it, it would find nothing, or the copy from before). A slow
//! subscriber holds the watch back (its channel is bounded) rather than losing a change, and a
//! dropped one is forgotten at the next change.
//!
//! An object that does not decode is left out and reported ([`lenient`]), not a failed list: one
//! bad object must not blind every reader of its kind.
//!
//! Whether a watch has listed is a flag of its own ([`SharedWatch::listed`]), never a poll of the
//! store's readiness: a kube-runtime controller awaits that readiness before it reconciles, and it
//! keeps room for one waker only, which a poll from anywhere else would take.

mod lenient;

pub use lenient::Lenient;

use futures::{Stream, StreamExt as _};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, Resource};
use network_enforcer_api::{WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Objects the watches left out because they did not decode, by kind.
    pub undecodable: Undecodable,
}

impl PolicyObjects {
    /// The three watches over `namespace` (`None`: all namespaces), none started yet.
    pub fn new(client: &Client, namespace: Option<&str>) -> Self {
        let undecodable = Undecodable::default();
        Self {
            policies: SharedWatch::new(scoped(client, namespace), undecodable.clone()),
            proposals: SharedWatch::new(scoped(client, namespace), undecodable.clone()),
            network_policies: SharedWatch::new(scoped(client, namespace), undecodable.clone()),
            undecodable,
        }
    }
}

/// `watch_objects_undecodable_total{kind}`: objects a shared watch left out (see [`Lenient`]).
pub type Undecodable = Family<KindLabel, Counter>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

fn scoped<K>(client: &Client, namespace: Option<&str>) -> Api<Lenient<K>>
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
    api: Api<Lenient<K>>,
    undecodable: Undecodable,
    store: Store<K>,
    /// Taken by the one start (or by a test that fills the store itself, which then never starts).
    writer: Mutex<Option<Writer<K>>>,
    shared: Arc<Mutex<Shared<K>>>,
    listed: Listed,
}

/// What the watch and its subscribers share, under one lock.
struct Shared<K> {
    subscribers: Vec<mpsc::Sender<Change<K>>>,
}

impl<K> Default for Shared<K> {
    fn default() -> Self {
        Self {
            subscribers: Vec::new(),
        }
    }
}

/// Whether a watch has completed its first list; set by the watch (or a test's [`Feed`]).
#[derive(Clone, Debug, Default)]
pub struct Listed(Arc<AtomicBool>);

impl Listed {
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A store's writer for a test that fills a shared watch's store itself: the listed flag follows
/// the first `InitDone`, as with the watch.
pub struct Feed<K: Resource<DynamicType = ()> + Clone + 'static> {
    writer: Writer<K>,
    listed: Listed,
}

impl<K> Feed<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<K>) {
        self.writer.apply_watcher_event(event);
        if matches!(event, watcher::Event::InitDone) {
            self.listed.set();
        }
    }
}

impl<K> SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    /// A watch of `api`, not started; objects that do not decode are counted into `undecodable`.
    pub fn new(api: Api<Lenient<K>>, undecodable: Undecodable) -> Self {
        let (store, writer) = reflector::store();
        Self {
            api,
            undecodable,
            store,
            writer: Mutex::new(Some(writer)),
            shared: Arc::default(),
            listed: Listed::default(),
        }
    }

    /// The store: empty until the watch has started and listed ([`SharedWatch::listed`]), then
    /// current.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Whether the watch has completed its first list (its store is whole).
    pub fn listed(&self) -> bool {
        self.listed.get()
    }

    /// [`SharedWatch::listed`], as a handle to keep.
    pub fn listed_flag(&self) -> Listed {
        self.listed.clone()
    }

    /// Starts the watch on the current Tokio runtime, the first time; later calls do nothing.
    pub fn start(&self) {
        let Some(writer) = self.writer.lock().expect("writer lock").take() else {
            return;
        };
        tokio::spawn(run(
            self.api.clone(),
            self.undecodable.clone(),
            writer,
            self.shared.clone(),
            self.listed.clone(),
        ));
    }

    /// Starts the watch on `events` instead of the API server's (a test's own sequence of events).
    #[cfg(test)]
    fn start_on(
        &self,
        events: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
    ) {
        let writer = self
            .writer
            .lock()
            .expect("writer lock")
            .take()
            .expect("not started");
        tokio::spawn(apply_events(
            events,
            writer,
            self.shared.clone(),
            self.listed.clone(),
        ));
    }

    /// Takes the store's writer so that a test fills the store itself; the watch never starts then,
    /// and subscribers get what the store holds when they subscribe, nothing after. `None` once
    /// started or taken.
    pub fn take_writer(&self) -> Option<Feed<K>> {
        let writer = self.writer.lock().expect("writer lock").take()?;
        Some(Feed {
            writer,
            listed: self.listed.clone(),
        })
    }

    /// Subscribers now ([`SharedWatch::changes`]).
    pub fn subscribers(&self) -> usize {
        let mut shared = self.shared.lock().expect("shared lock");
        shared.subscribers.retain(|s| !s.is_closed());
        shared.subscribers.len()
    }

    /// Every object of the store now, then every change; starts the watch. The stream ends only if
    /// the watch's task does (it retries failures forever; only a panic ends it).
    pub fn changes(&self) -> impl Stream<Item = Change<K>> + Send + 'static {
        self.start();
        let (sender, receiver) = mpsc::channel(SUBSCRIBER_BUFFER);
        // Under the lock the watch applies its events under: a change is either in this snapshot
        // or sent to this subscriber, never neither.
        let now = {
            let mut shared = self.shared.lock().expect("shared lock");
            shared.subscribers.push(sender);
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

/// The watch: applies each event to the store and passes it to every subscriber; retries with
/// backoff when it fails.
async fn run<K>(
    api: Api<Lenient<K>>,
    undecodable: Undecodable,
    writer: Writer<K>,
    shared: Arc<Mutex<Shared<K>>>,
    listed: Listed,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let store = writer.as_reader();
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| std::future::ready(decoded(event, &undecodable, &store)));
    apply_events(events, writer, shared, listed).await
}

/// `event` with its object decoded; `None` for an object that did not decode, reported (a warning
/// naming it and why, the counter). Such an object is left out of the store: a copy decoded before
/// it changed stays as it was (until the next list), and its deletion deletes that copy (from
/// `store`).
fn decoded<K>(
    event: watcher::Result<watcher::Event<Lenient<K>>>,
    undecodable: &Undecodable,
    store: &Store<K>,
) -> Option<watcher::Result<watcher::Event<K>>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let object = |lenient: Lenient<K>| match lenient {
        Lenient::Decoded(object) => Some(object),
        Lenient::Undecodable { metadata, error } => {
            let kind = K::kind(&()).to_string();
            tracing::warn!(
                %kind,
                namespace = metadata.namespace.as_deref().unwrap_or_default(),
                name = metadata.name.as_deref().unwrap_or_default(),
                %error,
                "an object that does not decode is left out (written by a newer release, or \
                 where no schema checks it); fix or delete it"
            );
            undecodable.get_or_create(&KindLabel { kind }).inc();
            None
        }
    };
    Some(match event {
        Err(error) => Err(error),
        Ok(watcher::Event::Apply(o)) => Ok(watcher::Event::Apply(object(o)?)),
        Ok(watcher::Event::Delete(Lenient::Undecodable { metadata, .. })) => {
            let name = metadata.name.as_deref()?;
            let mut key = reflector::ObjectRef::<K>::new(name);
            if let Some(ns) = metadata.namespace.as_deref() {
                key = key.within(ns);
            }
            Ok(watcher::Event::Delete(store.get(&key)?.as_ref().clone()))
        }
        Ok(watcher::Event::Delete(o)) => Ok(watcher::Event::Delete(object(o)?)),
        Ok(watcher::Event::InitApply(o)) => Ok(watcher::Event::InitApply(object(o)?)),
        Ok(watcher::Event::Init) => Ok(watcher::Event::Init),
        Ok(watcher::Event::InitDone) => Ok(watcher::Event::InitDone),
    })
}

/// [`run`]'s loop over the watch's `events`.
async fn apply_events<K>(
    events: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
    mut writer: Writer<K>,
    shared: Arc<Mutex<Shared<K>>>,
    listed: Listed,
) where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
{
    // Should the task end (a panic), the subscribers' streams end with it, and so do the controllers
    // that read them: the process then stops rather than reconciling from a store that no longer moves.
    let _ends = EndsSubscriptions(shared.clone());
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(kind = %K::kind(&()), %error, "watch failed; retrying with backoff");
                continue;
            }
        };
        let (receivers, changes) = {
            let mut shared = shared.lock().expect("shared lock");
            let changes = match &event {
                watcher::Event::Apply(obj) => {
                    writer.apply_watcher_event(&event);
                    vec![Change::Applied(Arc::new(obj.clone()))]
                }
                watcher::Event::Delete(obj) => {
                    writer.apply_watcher_event(&event);
                    vec![Change::Deleted(Arc::new(obj.clone()))]
                }
                // Into the writer's buffer: nothing is in the store before the list is done.
                watcher::Event::Init | watcher::Event::InitApply(_) => {
                    writer.apply_watcher_event(&event);
                    Vec::new()
                }
                watcher::Event::InitDone => {
                    let before = writer.as_reader().state();
                    writer.apply_watcher_event(&event);
                    listed.set();
                    listed_changes(before, writer.as_reader().state())
                }
            };
            shared.subscribers.retain(|s| !s.is_closed());
            (shared.subscribers.clone(), changes)
        };
        for change in changes {
            for receiver in &receivers {
                // Closed: the subscriber is gone; removed at the next event.
                let _ = receiver.send(change.clone()).await;
            }
        }
    }
}

/// What a list changed: every object listed (`after`), and a deletion for each object of `before`
/// the list no longer has (deleted while the watch was down).
fn listed_changes<K>(before: Vec<Arc<K>>, after: Vec<Arc<K>>) -> Vec<Change<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let listed: std::collections::HashSet<_> = after
        .iter()
        .map(|obj| reflector::ObjectRef::from_obj(obj.as_ref()))
        .collect();
    let gone = before
        .into_iter()
        .filter(|obj| !listed.contains(&reflector::ObjectRef::from_obj(obj.as_ref())))
        .map(Change::Deleted);
    after.into_iter().map(Change::Applied).chain(gone).collect()
}

/// Ends every subscription when dropped (see [`apply_events`]).
struct EndsSubscriptions<K>(Arc<Mutex<Shared<K>>>);

impl<K> Drop for EndsSubscriptions<K> {
    fn drop(&mut self) {
        tracing::error!("a shared watch's task ended; its readers stop");
        let mut shared = self.0.lock().unwrap_or_else(|p| p.into_inner());
        shared.subscribers.clear();
    }
}

#[cfg(test)]
mod tests;
