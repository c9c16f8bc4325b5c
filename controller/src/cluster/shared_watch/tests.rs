use super::*;
use crate::cluster::watches::SharedIndex;
use crate::monitor::status_sync::{self, StatusSync};
use crate::reconcile::{self, Reconcilers};
use kube::ResourceExt as _;
use std::collections::HashMap;
use std::time::Duration;

/// How long a test waits for the stand-in API server's answers to reach a store.
const WAIT: Duration = Duration::from_secs(10);

/// A stand-in API server: lists answer what [`FakeApi::objects`] holds for the resource (the last
/// segment of the path), a watch stays open and streams what [`FakeApi::event`] sends; it counts the
/// watch requests per resource.
#[derive(Clone, Default)]
struct FakeApi {
    objects: Arc<Mutex<HashMap<String, Vec<serde_json::Value>>>>,
    watches: Arc<Mutex<Vec<OpenWatch>>>,
}

/// A watch request: its resource and where its events go.
type OpenWatch = (String, mpsc::UnboundedSender<bytes::Bytes>);

impl FakeApi {
    /// Serves on loopback; a client of it.
    async fn serve(&self) -> Client {
        let this = self.clone();
        let router = axum::Router::new().fallback(move |uri: http::Uri| {
            let this = this.clone();
            async move { this.answer(&uri) }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await });
        Client::try_from(kube::Config::new(
            format!("http://{address}").parse().unwrap(),
        ))
        .unwrap()
    }

    fn answer(&self, uri: &http::Uri) -> axum::response::Response {
        let resource = uri
            .path()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        let watch = uri
            .query()
            .unwrap_or_default()
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1");
        let json = [(http::header::CONTENT_TYPE, "application/json")];
        if watch {
            let (sender, receiver) = mpsc::unbounded_channel();
            self.watches.lock().unwrap().push((resource, sender));
            let body = tokio_stream::wrappers::UnboundedReceiverStream::new(receiver)
                .map(Ok::<_, std::convert::Infallible>);
            return (json, axum::body::Body::from_stream(body)).into_response();
        }
        let items = self
            .objects
            .lock()
            .unwrap()
            .get(&resource)
            .cloned()
            .unwrap_or_default();
        let list = serde_json::json!({
            "apiVersion": "v1", "kind": "List",
            "metadata": {"resourceVersion": "1"}, "items": items,
        });
        (json, list.to_string()).into_response()
    }

    /// Sends a watch event of `type_` with `object` to every open watch of `resource`.
    fn event(&self, resource: &str, type_: &str, object: &serde_json::Value) {
        let line = format!("{}\n", serde_json::json!({"type": type_, "object": object}));
        for (watched, sender) in self.watches.lock().unwrap().iter() {
            if watched == resource {
                let _ = sender.send(bytes::Bytes::from(line.clone()));
            }
        }
    }

    /// Watch requests per resource so far.
    fn watch_requests(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for (resource, _) in self.watches.lock().unwrap().iter() {
            *counts.entry(resource.clone()).or_default() += 1;
        }
        counts
    }
}

use axum::response::IntoResponse as _;

fn network_policy(name: &str, version: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": "shop", "resourceVersion": version},
        "spec": {"podSelector": {}},
    })
}

/// The name and kind of change of a subscriber's next change.
async fn next(changes: &mut (impl Stream<Item = Change<NetworkPolicy>> + Unpin)) -> (String, bool) {
    let change = tokio::time::timeout(WAIT, changes.next())
        .await
        .expect("a change within the wait")
        .expect("the subscription goes on");
    match change {
        Change::Applied(p) => (p.name_any(), false),
        Change::Deleted(p) => (p.name_any(), true),
    }
}

async fn wait_until(what: &str, condition: impl Fn() -> bool) {
    tokio::time::timeout(WAIT, async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what} within {WAIT:?}"));
}

/// A subscriber gets what the store holds when it subscribes, then every change, deletions included
/// (the policy reconciler puts back a NetworkPolicy it rendered when it is deleted); one watch
/// serves the store and every subscriber, however late it came.
#[tokio::test]
async fn a_subscriber_gets_the_store_then_every_change_deletions_included() {
    let fake = FakeApi::default();
    fake.objects
        .lock()
        .unwrap()
        .insert("networkpolicies".into(), vec![network_policy("a", "1")]);
    let client = fake.serve().await;
    let watch = SharedWatch::<NetworkPolicy>::new(Api::all(client), Undecodable::default());
    let mut early = Box::pin(watch.changes());
    assert_eq!(next(&mut early).await, ("a".into(), false), "the list");
    let store = watch.store();
    wait_until("the first list", || watch.listed()).await;
    let mut late = Box::pin(watch.changes());
    assert_eq!(
        next(&mut late).await,
        ("a".into(), false),
        "what the store holds"
    );
    wait_until("the watch request", || {
        fake.watch_requests().get("networkpolicies") == Some(&1)
    })
    .await;

    fake.event("networkpolicies", "ADDED", &network_policy("b", "2"));
    fake.event("networkpolicies", "DELETED", &network_policy("a", "3"));
    for changes in [&mut early, &mut late] {
        assert_eq!(next(changes).await, ("b".into(), false));
        assert_eq!(next(changes).await, ("a".into(), true), "the deletion");
    }
    let names: Vec<_> = store.state().iter().map(|p| p.name_any()).collect();
    assert_eq!(names, ["b"]);
    assert_eq!(watch.subscribers(), 2);
    drop(early);
    fake.event("networkpolicies", "ADDED", &network_policy("c", "4"));
    assert_eq!(next(&mut late).await, ("c".into(), false));
    assert_eq!(watch.subscribers(), 1, "a dropped subscriber is forgotten");
    assert_eq!(
        fake.watch_requests().get("networkpolicies"),
        Some(&1),
        "one watch for the store and both subscribers"
    );
}

/// One object that does not decode (here a mode a newer release might write, after a rollback) is
/// left out and counted; the others are listed and every later change passes. A typed watch fails
/// the whole list on it: every reader of the kind would wait for a list that never comes.
#[tokio::test]
async fn an_object_that_does_not_decode_is_left_out_not_the_whole_list() {
    use network_enforcer_api::WorkloadNetworkPolicy;
    let policy = |name: &str, mode: &str, version: &str| {
        serde_json::json!({
            "apiVersion": "networkenforcer.kubewarden.io/v1alpha1",
            "kind": "WorkloadNetworkPolicy",
            "metadata": {"name": name, "namespace": "shop", "resourceVersion": version},
            "spec": {"backend": "kubernetes", "direction": "Ingress", "mode": mode,
                     "targetRef": {"kind": "Deployment", "name": name},
                     "kubernetes": {"podSelector": {}, "policyTypes": ["Ingress"]}}
        })
    };
    let fake = FakeApi::default();
    fake.objects.lock().unwrap().insert(
        "workloadnetworkpolicies".into(),
        vec![
            policy("a", "monitor", "1"),
            policy("newer", "enforce-later", "2"),
        ],
    );
    let client = fake.serve().await;
    // What a typed watch would have listed: nothing at all.
    let typed = Api::<WorkloadNetworkPolicy>::all(client.clone())
        .list(&Default::default())
        .await;
    assert!(typed.is_err(), "the typed list fails on the one object");

    let undecodable = Undecodable::default();
    let watch = SharedWatch::<WorkloadNetworkPolicy>::new(Api::all(client), undecodable.clone());
    watch.start();
    wait_until("the first list", || watch.listed()).await;
    let count = || {
        undecodable
            .get_or_create(&KindLabel {
                kind: "WorkloadNetworkPolicy".into(),
            })
            .get()
    };
    let names = || {
        let mut names: Vec<_> = watch.store().state().iter().map(|p| p.name_any()).collect();
        names.sort();
        names
    };
    assert_eq!(names(), ["a"]);
    assert_eq!(count(), 1);
    wait_until("the watch request", || {
        fake.watch_requests().get("workloadnetworkpolicies") == Some(&1)
    })
    .await;
    fake.event(
        "workloadnetworkpolicies",
        "MODIFIED",
        &policy("a", "bogus", "3"),
    );
    fake.event(
        "workloadnetworkpolicies",
        "ADDED",
        &policy("b", "protect", "4"),
    );
    wait_until("the next good change", || names() == ["a", "b"]).await;
    assert_eq!(
        count(),
        2,
        "the bad change is counted, the store keeps a's last good copy"
    );
    // Deleted as it is now (it does not decode): the copy kept from before goes with it.
    fake.event(
        "workloadnetworkpolicies",
        "DELETED",
        &policy("a", "bogus", "5"),
    );
    wait_until("the deletion of the kept copy", || names() == ["b"]).await;
}

/// Events for [`SharedWatch::start_on`], sent one at a time.
fn events() -> (
    mpsc::UnboundedSender<watcher::Event<NetworkPolicy>>,
    impl Stream<Item = watcher::Result<watcher::Event<NetworkPolicy>>> + Send + 'static,
) {
    let (sender, receiver) = mpsc::unbounded_channel();
    (
        sender,
        tokio_stream::wrappers::UnboundedReceiverStream::new(receiver).map(Ok),
    )
}

fn object(name: &str) -> NetworkPolicy {
    serde_json::from_value(network_policy(name, "1")).unwrap()
}

/// A subscription's stream, boxed.
type Changes = std::pin::Pin<Box<dyn Stream<Item = Change<NetworkPolicy>> + Send>>;

/// The next change, checked against `store` at that moment: an object told applied is in it, one
/// told deleted is not.
async fn next_checked(
    store: &kube::runtime::reflector::Store<NetworkPolicy>,
    changes: &mut Changes,
) -> (String, bool) {
    use kube::runtime::reflector::ObjectRef;
    let change = tokio::time::timeout(WAIT, changes.next())
        .await
        .expect("a change within the wait")
        .expect("the subscription goes on");
    let (deleted, obj) = match change {
        Change::Applied(p) => (false, p),
        Change::Deleted(p) => (true, p),
    };
    let name = obj.name_any();
    let held = store.get(&ObjectRef::from_obj(obj.as_ref())).is_some();
    assert_eq!(held, !deleted, "{name}: told before the store has it");
    (name, deleted)
}

/// A list is passed on once it is done and in the store, to a subscriber that was there before it
/// and to one that came during it alike: every object listed, and a deletion for each object the
/// store held and the list no longer has. Told earlier (as each object is listed), a reconciler
/// would look the object up in a store that does not hold it yet, or holds the copy from before:
/// the reconcilers subscribe when the replica becomes the leader, and a watch relists after it was
/// down.
#[tokio::test]
async fn a_list_is_passed_on_once_it_is_in_the_store() {
    let watch = SharedWatch::<NetworkPolicy>::new(
        Api::all(network_enforcer_tests::fixture::offline_client()),
        Undecodable::default(),
    );
    let (send, stream) = events();
    watch.start_on(stream);
    let store = watch.store();
    let mut early: Changes = Box::pin(watch.changes());
    send.send(watcher::Event::Init).unwrap();
    send.send(watcher::Event::InitApply(object("a"))).unwrap();
    let mut late: Changes = Box::pin(watch.changes());
    send.send(watcher::Event::InitApply(object("b"))).unwrap();
    send.send(watcher::Event::InitDone).unwrap();
    for changes in [&mut early, &mut late] {
        let mut seen = vec![
            next_checked(&store, changes).await,
            next_checked(&store, changes).await,
        ];
        seen.sort();
        assert_eq!(seen, [("a".into(), false), ("b".into(), false)]);
    }
    assert!(watch.listed());
    // A relist after the watch was down: "a" was deleted meanwhile, "c" created.
    send.send(watcher::Event::Init).unwrap();
    send.send(watcher::Event::InitApply(object("b"))).unwrap();
    send.send(watcher::Event::InitApply(object("c"))).unwrap();
    send.send(watcher::Event::InitDone).unwrap();
    for changes in [&mut early, &mut late] {
        let mut seen = vec![
            next_checked(&store, changes).await,
            next_checked(&store, changes).await,
            next_checked(&store, changes).await,
        ];
        seen.sort();
        assert_eq!(
            seen,
            [("a".into(), true), ("b".into(), false), ("c".into(), false)]
        );
    }
    send.send(watcher::Event::Apply(object("d"))).unwrap();
    assert_eq!(next_checked(&store, &mut early).await, ("d".into(), false));
    assert_eq!(next_checked(&store, &mut late).await, ("d".into(), false));
}

/// Asking whether the watch has listed never takes the wake-up of a task that awaits the store's
/// readiness: a kube-runtime controller holds its reconciles until its store is ready, and the
/// readiness has room for one waker (the web view, the status sync and every agent batch ask).
#[tokio::test]
async fn asking_whether_it_listed_leaves_the_stores_readiness_to_its_waiter() {
    let watch = SharedWatch::<NetworkPolicy>::new(
        Api::all(network_enforcer_tests::fixture::offline_client()),
        Undecodable::default(),
    );
    let (send, stream) = events();
    watch.start_on(stream);
    send.send(watcher::Event::Init).unwrap();
    let store = watch.store();
    let waiter = tokio::spawn(async move { store.wait_until_ready().await.is_ok() });
    // The waiter is parked on the readiness; then others ask, as they do all the time.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 0..10 {
        assert!(!watch.listed());
        tokio::task::yield_now().await;
    }
    send.send(watcher::Event::InitDone).unwrap();
    let ready = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the store's waiter was woken")
        .unwrap();
    assert!(ready);
    assert!(watch.listed());
}

/// Issue 43, item 4: the status sync, the proposal writer, both reconcilers and the web view read
/// WorkloadNetworkPolicies, proposals and NetworkPolicies from one watch per kind (the policies were
/// watched five times, proposals and NetworkPolicies twice).
#[tokio::test]
async fn every_part_of_the_controller_shares_one_watch_per_kind() {
    let fake = FakeApi::default();
    let client = fake.serve().await;
    // Wired as `run` wires them.
    let app = crate::app::App::builder(client.clone(), network_enforcer_api::Backend::Kubernetes)
        .index(Arc::new(SharedIndex::listed(
            crate::cluster::index::Index::default(),
        )))
        .status_sync(
            status_sync::Settings::default(),
            Arc::new(crate::monitor::otlp::Disabled),
        )
        .build();
    let sync: Arc<StatusSync> = app.status_sync.clone().expect("a status sync");
    let reconcilers =
        Reconcilers::new(&client, app.objects.clone(), reconcile::Settings::default());
    let ui = crate::ui::Reflected::start(client.clone(), &app.objects);
    let tasks = [
        tokio::spawn(reconcilers.run()),
        tokio::spawn(sync.clone().watches()),
    ];
    let objects = app.objects.clone();
    // The policy controller's own trigger and its siblings' trigger, the proposal controller's.
    wait_until("the reconcilers' subscriptions", || {
        objects.policies.subscribers() == 3
            && objects.proposals.subscribers() == 1
            && objects.network_policies.subscribers() == 1
    })
    .await;
    wait_until("every store listed", || {
        crate::ui::ObjectSource::ready(ui.as_ref()) && objects.network_policies.listed()
    })
    .await;
    let requests = fake.watch_requests();
    for resource in [
        "workloadnetworkpolicies",
        "workloadnetworkpolicyproposals",
        "networkpolicies",
    ] {
        assert_eq!(requests.get(resource), Some(&1), "{resource}: {requests:?}");
    }
    for task in tasks {
        task.abort();
    }
}
