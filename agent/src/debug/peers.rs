//! Names for the far end of a flow, as `hubble observe` names it: `svc demo/db` for a Service's
//! ClusterIP, `demo/api-7d9c` for a pod's IP, `node/worker-1` for a node's address. Only the `flows`
//! view uses them (agent/README.md, "Debug API and `flows`"); records sent to the controller carry
//! addresses as before.
//!
//! The agent's own pod watch holds this node's pods only, and the enforcement watch exists only with
//! enforcement on, so [`spawn`] runs its own watches of every pod, Service and node. Objects are
//! decoded one at a time and only a name and addresses per object are kept, in one
//! [`PeerDirectory`] of at most [`MAX_ADDRESSES`] addresses (about 150 bytes each: under 8 MiB). Addresses beyond it are not named
//! (the flow shows the bare address) and counted in [`PeerDirectory::dropped`]. Watch errors are
//! logged and retried with backoff; a relist replaces that kind's addresses once complete, so objects
//! deleted while the watch was down lose their names.

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use network_enforcer_api::pod;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Addresses the directory names at most (pod IPs, ClusterIPs and node addresses together).
pub const MAX_ADDRESSES: usize = 50_000;

/// What an address belongs to; the most specific first when one address has several (a Service's
/// ClusterIP is never a pod's, a hostNetwork pod is not named: its address is its node's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerKind {
    Service,
    Pod,
    Node,
}

const KINDS: [PeerKind; 3] = [PeerKind::Service, PeerKind::Pod, PeerKind::Node];

/// The name `flows` shows for an object of `kind`: `svc <ns>/<name>`, `<ns>/<name>`, `node/<name>`.
pub fn peer_label(kind: PeerKind, namespace: &str, name: &str) -> String {
    match kind {
        PeerKind::Service => format!("svc {namespace}/{name}"),
        PeerKind::Pod => format!("{namespace}/{name}"),
        PeerKind::Node => format!("node/{name}"),
    }
}

/// One kind's addresses: by address, and by object (to forget an object's old addresses).
#[derive(Debug, Default)]
struct KindTable {
    by_ip: HashMap<IpAddr, Arc<str>>,
    by_object: HashMap<Arc<str>, Vec<IpAddr>>,
}

/// Bounded address → name table, filled by the watches of [`spawn`].
#[derive(Debug)]
pub struct PeerDirectory {
    tables: [KindTable; 3],
    capacity: usize,
    dropped: u64,
}

impl Default for PeerDirectory {
    fn default() -> Self {
        Self::new(MAX_ADDRESSES)
    }
}

/// The directory shared by the watches (writers) and the debug socket (reader).
pub type SharedPeers = Arc<Mutex<PeerDirectory>>;

impl PeerDirectory {
    /// An empty directory naming at most `capacity` addresses.
    pub fn new(capacity: usize) -> Self {
        Self {
            tables: Default::default(),
            capacity,
            dropped: 0,
        }
    }

    fn table(&mut self, kind: PeerKind) -> &mut KindTable {
        &mut self.tables[kind as usize]
    }

    /// Addresses named now.
    pub fn len(&self) -> usize {
        self.tables.iter().map(|t| t.by_ip.len()).sum()
    }

    /// Whether no address is named.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Addresses not named because the directory was full.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The name of `ip`: a Service's, else a pod's, else a node's; `None` for an address no watched
    /// object has (it is shown as the address).
    pub fn name(&self, ip: IpAddr) -> Option<Arc<str>> {
        KINDS
            .iter()
            .find_map(|k| self.tables[*k as usize].by_ip.get(&ip).cloned())
    }

    /// Sets the addresses of the object named `label` (replacing its earlier ones).
    pub fn apply(&mut self, kind: PeerKind, label: Arc<str>, ips: Vec<IpAddr>) {
        self.remove(kind, &label);
        let mut kept = Vec::with_capacity(ips.len());
        for ip in ips {
            let new = !self.table(kind).by_ip.contains_key(&ip);
            if new && self.len() >= self.capacity {
                self.dropped = self.dropped.saturating_add(1);
                if self.dropped == 1 {
                    tracing::warn!(
                        capacity = self.capacity,
                        "flows: too many cluster addresses to name; further ones are shown as addresses"
                    );
                }
                continue;
            }
            self.table(kind).by_ip.insert(ip, label.clone());
            kept.push(ip);
        }
        if !kept.is_empty() {
            self.table(kind).by_object.insert(label, kept);
        }
    }

    /// Forgets the object named `label`; an address it shared with a newer object keeps the newer name.
    pub fn remove(&mut self, kind: PeerKind, label: &str) {
        let table = self.table(kind);
        for ip in table.by_object.remove(label).unwrap_or_default() {
            if table.by_ip.get(&ip).is_some_and(|l| &**l == label) {
                table.by_ip.remove(&ip);
            }
        }
    }

    /// Replaces every object of `kind` (after a relist).
    pub fn replace(&mut self, kind: PeerKind, objects: Vec<(Arc<str>, Vec<IpAddr>)>) {
        *self.table(kind) = KindTable::default();
        for (label, ips) in objects {
            self.apply(kind, label, ips);
        }
    }
}

/// A pod's label and addresses; a hostNetwork pod, or one that has finished (its address may be
/// another pod's now), has none.
pub fn pod_addresses(pod: &Pod) -> Option<(Arc<str>, Vec<IpAddr>)> {
    let label = peer_label(
        PeerKind::Pod,
        pod.metadata.namespace.as_deref()?,
        pod.metadata.name.as_deref()?,
    );
    let host = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let ips = if host || pod::finished(pod) {
        Vec::new()
    } else {
        pod::ips(pod)
    };
    Some((label.into(), ips))
}

/// A Service's label and ClusterIPs (`None` and headless ones have none: flows reach their pods).
pub fn service_addresses(svc: &Service) -> Option<(Arc<str>, Vec<IpAddr>)> {
    let label = peer_label(
        PeerKind::Service,
        svc.metadata.namespace.as_deref()?,
        svc.metadata.name.as_deref()?,
    );
    let spec = svc.spec.as_ref();
    let ips = spec
        .and_then(|s| s.cluster_ips.clone())
        .or_else(|| spec.and_then(|s| s.cluster_ip.clone()).map(|ip| vec![ip]))
        .unwrap_or_default()
        .iter()
        .filter_map(|ip| ip.parse().ok())
        .collect();
    Some((label.into(), ips))
}

/// A node's label and addresses (InternalIP, ExternalIP; not hostnames).
pub fn node_addresses(node: &Node) -> Option<(Arc<str>, Vec<IpAddr>)> {
    let label = peer_label(PeerKind::Node, "", node.metadata.name.as_deref()?);
    let ips = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|a| a.address.parse().ok())
        .collect();
    Some((label.into(), ips))
}

/// Starts the watches of every pod, Service and node into `peers`; they run until the process ends.
pub fn spawn(client: Client, peers: SharedPeers) {
    spawn_watch(
        Api::<Service>::all(client.clone()),
        PeerKind::Service,
        service_addresses,
        peers.clone(),
    );
    spawn_watch(
        Api::<Pod>::all(client.clone()),
        PeerKind::Pod,
        pod_addresses,
        peers.clone(),
    );
    spawn_watch(
        Api::<Node>::all(client),
        PeerKind::Node,
        node_addresses,
        peers,
    );
}

type Addresses<K> = fn(&K) -> Option<(Arc<str>, Vec<IpAddr>)>;

fn spawn_watch<K>(api: Api<K>, kind: PeerKind, addresses: Addresses<K>, peers: SharedPeers)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    tokio::spawn(async move {
        // Only labels and addresses are staged during a relist, not whole objects.
        let mut relist: Vec<(Arc<str>, Vec<IpAddr>)> = Vec::new();
        let mut events = watcher::watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            // A poisoned lock means a panic elsewhere already; the table is still usable.
            let lock = || peers.lock().unwrap_or_else(|p| p.into_inner());
            match event {
                Ok(Event::Init) => relist.clear(),
                Ok(Event::InitApply(object)) => {
                    // Bounded like the directory: beyond it nothing would be kept anyway.
                    if relist.len() < MAX_ADDRESSES {
                        relist.extend(addresses(&object));
                    }
                }
                Ok(Event::InitDone) => lock().replace(kind, std::mem::take(&mut relist)),
                Ok(Event::Apply(object)) => {
                    if let Some((label, ips)) = addresses(&object) {
                        lock().apply(kind, label, ips);
                    }
                }
                Ok(Event::Delete(object)) => {
                    if let Some((label, _)) = addresses(&object) {
                        lock().remove(kind, &label);
                    }
                }
                Err(error) => tracing::warn!(%error, kind = %K::kind(&()),
                    "flows name watch failed (check the agent's RBAC: list/watch pods, services, nodes); retrying with backoff"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn directory() -> PeerDirectory {
        let mut d = PeerDirectory::new(10);
        d.apply(
            PeerKind::Service,
            "svc demo/db".into(),
            vec![ip("10.96.125.79")],
        );
        d.apply(
            PeerKind::Pod,
            "demo/api-7d9c".into(),
            vec![ip("10.244.0.13"), ip("fd00::13")],
        );
        d.apply(
            PeerKind::Node,
            "node/worker-1".into(),
            vec![ip("172.18.0.2")],
        );
        d
    }

    #[test]
    fn names_services_pods_and_nodes_and_leaves_other_addresses() {
        let d = directory();
        for (address, want) in [
            ("10.96.125.79", Some("svc demo/db")),
            ("10.244.0.13", Some("demo/api-7d9c")),
            ("fd00::13", Some("demo/api-7d9c")),
            ("172.18.0.2", Some("node/worker-1")),
            ("10.244.0.99", None),
            ("8.8.8.8", None),
        ] {
            assert_eq!(d.name(ip(address)).as_deref(), want, "{address}");
        }
        assert_eq!(peer_label(PeerKind::Service, "demo", "db"), "svc demo/db");
        assert_eq!(peer_label(PeerKind::Node, "", "w"), "node/w");
    }

    #[test]
    fn a_service_wins_over_a_node_on_the_same_address() {
        let mut d = directory();
        d.apply(PeerKind::Node, "node/odd".into(), vec![ip("10.96.125.79")]);
        assert_eq!(d.name(ip("10.96.125.79")).as_deref(), Some("svc demo/db"));
    }

    #[test]
    fn moved_and_deleted_objects_lose_their_old_addresses() {
        let mut d = directory();
        d.apply(
            PeerKind::Pod,
            "demo/api-7d9c".into(),
            vec![ip("10.244.0.14")],
        );
        assert_eq!(d.name(ip("10.244.0.13")), None);
        assert_eq!(d.name(ip("10.244.0.14")).as_deref(), Some("demo/api-7d9c"));
        // The address went to a new pod before the old one's deletion arrived: the new name stays.
        d.apply(PeerKind::Pod, "demo/web-1".into(), vec![ip("10.244.0.14")]);
        d.remove(PeerKind::Pod, "demo/api-7d9c");
        assert_eq!(d.name(ip("10.244.0.14")).as_deref(), Some("demo/web-1"));
        d.replace(PeerKind::Pod, Vec::new());
        assert_eq!(d.name(ip("10.244.0.14")), None);
        assert_eq!(d.name(ip("10.96.125.79")).as_deref(), Some("svc demo/db"));
    }

    #[test]
    fn the_directory_is_bounded_and_counts_what_it_drops() {
        let mut d = PeerDirectory::new(2);
        d.apply(
            PeerKind::Pod,
            "a/p".into(),
            vec![ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3")],
        );
        assert_eq!((d.len(), d.dropped()), (2, 1));
        assert_eq!(d.name(ip("10.0.0.3")), None);
        d.remove(PeerKind::Pod, "a/p");
        assert!(d.is_empty());
    }

    #[test]
    fn objects_name_their_addresses() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "demo", "name": "api-1"},
            "status": {"podIP": "10.244.0.13", "podIPs": [{"ip": "10.244.0.13"}]}
        }))
        .unwrap();
        let (label, ips) = pod_addresses(&pod).unwrap();
        assert_eq!((&*label, ips), ("demo/api-1", vec![ip("10.244.0.13")]));
        let host: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "kube-system", "name": "proxy"},
            "spec": {"hostNetwork": true, "containers": []},
            "status": {"podIP": "172.18.0.2", "podIPs": [{"ip": "172.18.0.2"}]}
        }))
        .unwrap();
        assert_eq!(pod_addresses(&host).unwrap().1, Vec::<IpAddr>::new());
        let svc: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "demo", "name": "db"},
            "spec": {"clusterIP": "10.96.125.79", "clusterIPs": ["10.96.125.79"]}
        }))
        .unwrap();
        let (label, ips) = service_addresses(&svc).unwrap();
        assert_eq!((&*label, ips), ("svc demo/db", vec![ip("10.96.125.79")]));
        let headless: Service = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "demo", "name": "h"},
            "spec": {"clusterIP": "None"}
        }))
        .unwrap();
        assert!(service_addresses(&headless).unwrap().1.is_empty());
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "worker-1"},
            "status": {"addresses": [
                {"type": "InternalIP", "address": "172.18.0.2"},
                {"type": "Hostname", "address": "worker-1"}
            ]}
        }))
        .unwrap();
        let (label, ips) = node_addresses(&node).unwrap();
        assert_eq!((&*label, ips), ("node/worker-1", vec![ip("172.18.0.2")]));
    }
}
