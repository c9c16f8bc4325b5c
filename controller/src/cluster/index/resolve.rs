//! Resolution of an address (and port) to what is there: a pod, a Service backend, a node, the outside.

use super::*;

impl Index {
    /// Whether `ip:port` is an API server: a backend of the `default/kubernetes` Service (its
    /// Endpoints name the API servers), or that Service's ClusterIP itself.
    pub fn is_api_server(&self, ip: IpAddr, port: u16) -> bool {
        // Called per evaluated flow: the key is built once.
        static KUBERNETES: std::sync::LazyLock<ServiceKey> =
            std::sync::LazyLock::new(|| ("default".to_string(), "kubernetes".to_string()));
        let key = &*KUBERNETES;
        if self.service_ips.get(&ip) == Some(key) {
            return true;
        }
        self.backends.get(key).is_some_and(|b| {
            b.by_port
                .values()
                .flat_map(|v| v.iter())
                .any(|(endpoint, p)| {
                    *p == port
                        && match endpoint {
                            FlowEnd::Node { ip: at, .. }
                            | FlowEnd::External(at)
                            | FlowEnd::HostNetwork { ip: at, .. } => *at == ip,
                            FlowEnd::Workload(_) => false,
                        }
                })
        })
    }

    /// The pod that held `ip` at `at_ms` (or holds it now, for records newer than the last change).
    pub fn pod_at(&self, ip: IpAddr, at_ms: i64) -> Option<&Arc<PodRecord>> {
        let leases = self.leases.get(&ip)?;
        let lease = leases
            .iter()
            .rev()
            .find(|l| l.since <= at_ms && l.until.is_none_or(|u| at_ms < u))
            .or_else(|| leases.iter().rev().find(|l| l.until.is_none()))?;
        Some(&lease.record)
    }

    /// A pod by namespace and name (also one deleted within [`IP_HISTORY_MS`]).
    pub fn pod(&self, namespace: &str, name: &str) -> Option<&Arc<PodRecord>> {
        self.pods.get_str(namespace, name)
    }

    /// The live pods of `namespace` whose generateName is `generate_name`, in name order.
    pub fn pods_generated_as<'a>(
        &'a self,
        namespace: &str,
        generate_name: &str,
    ) -> impl Iterator<Item = &'a Arc<PodRecord>> + 'a {
        self.pods_generated_as
            .get_key_value(&(namespace.to_string(), generate_name.to_string()))
            .into_iter()
            .flat_map(|((namespace, _), names)| names.iter().map(move |name| (namespace, name)))
            .filter(|(namespace, name)| self.pod_exists(namespace, name))
            .filter_map(|(namespace, name)| self.pod(namespace, name))
    }

    /// Whether workload `w` has a pod (live or recently deleted) on `node`.
    pub fn has_pod_on(&self, w: &WorkloadEndpoint, node: &str) -> bool {
        let on_node = |name: &str| {
            self.pod(&w.namespace, name)
                .is_some_and(|p| p.node.as_deref() == Some(node))
        };
        match w.kind {
            None => on_node(&w.name),
            Some(kind) => self
                .nodes_of_workload
                .contains(&w.namespace, kind, &w.name, node),
        }
    }

    /// Whether pod `namespace/name` exists (held, and not deleted).
    pub fn pod_exists(&self, namespace: &str, name: &str) -> bool {
        self.pod(namespace, name).is_some()
            && !self
                .deleted
                .contains_key(&(namespace.to_string(), name.to_string()))
    }

    /// The workload endpoint of a pod (borrowed: the evidence pass names both ends of every record).
    pub fn endpoint_of<'a>(&self, pod: &'a PodRecord) -> &'a WorkloadEndpoint {
        &pod.endpoint
    }

    /// Resolves a peer address and port as seen by a socket at `at_ms`: a pod IP, a Service ClusterIP
    /// (to its backends and the port each is reached on after DNAT: a selector's workloads and their
    /// container port, or the addresses of its Endpoints), a node IP, or external.
    pub fn resolve(&self, ip: IpAddr, port: u16, proto: Protocol, at_ms: i64) -> Resolved {
        self.resolve_ref(ip, port, proto, at_ms).to_owned()
    }

    /// [`Index::resolve`], borrowing from the index (no copies: the learning hot path).
    pub fn resolve_ref(
        &self,
        ip: IpAddr,
        port: u16,
        proto: Protocol,
        at_ms: i64,
    ) -> ResolvedRef<'_> {
        if let Some(pod) = self.pod_at(ip, at_ms) {
            return ResolvedRef::Pod(pod, port);
        }
        if let Some((key, svc)) = self
            .service_ips
            .get(&ip)
            .and_then(|k| Some((k, self.services.get(k)?)))
        {
            let backends = self
                .backends
                .get(key)
                .and_then(|b| b.by_port.get(&(port, proto)));
            return match backends {
                Some(b) if !b.is_empty() => ResolvedRef::Backends(b.as_slice()),
                _ => ResolvedRef::ServiceWithoutBackends(svc),
            };
        }
        ResolvedRef::Address(self.address_endpoint(ip, at_ms), port)
    }

    /// `pod` as one end of a flow whose other end is `peer`: its workload, or for a host-network pod
    /// [`FlowEnd::HostNetwork`] at its address of `peer`'s family (a host-network pod's IPs are its
    /// node's; its node's addresses stand in until the kubelet has reported them). `None` for a
    /// host-network pod with no address of that family yet.
    pub fn pod_endpoint(&self, pod: &PodRecord, peer: IpAddr) -> Option<FlowEnd> {
        if !pod.host_network {
            return Some(FlowEnd::Workload(pod.endpoint.clone()));
        }
        let node = pod.node.clone().unwrap_or_default();
        let same_family = |ip: &&IpAddr| ip.is_ipv4() == peer.is_ipv4();
        let ip = pod.ips.iter().find(same_family).copied().or_else(|| {
            // Few nodes, and only until the pod's IPs are known: a scan is fine.
            self.nodes
                .iter()
                .filter(|(_, name)| **name == node)
                .map(|(ip, _)| ip)
                .filter(same_family)
                .min()
                .copied()
        })?;
        Some(FlowEnd::HostNetwork {
            workload: pod.endpoint.clone(),
            ip,
            node,
        })
    }

    /// What an address that is no Service ClusterIP is at `at_ms`: the workload of the pod that held it,
    /// a node, or an outside address.
    pub(super) fn address_endpoint(&self, ip: IpAddr, at_ms: i64) -> FlowEnd {
        if let Some(pod) = self.pod_at(ip, at_ms) {
            return FlowEnd::Workload(pod.endpoint.clone());
        }
        match self.nodes.get(&ip) {
            Some(node) => FlowEnd::Node {
                ip,
                name: node.clone(),
            },
            None => FlowEnd::External(ip),
        }
    }
}
