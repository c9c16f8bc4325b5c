//! Services and their backends: selector-based (from pods) and selector-less (from their endpoints,
//! kept in `endpoints.rs`).

use super::*;

impl Index {
    /// Updates the Services of the pod `key`'s namespace after it changed from `before`: membership, and
    /// the per-port backends of every Service it joined, left or changed in.
    /// Also recomputes the Services without a selector whose Endpoints list one of its IPs, before or
    /// after (a pod taking, leaving or changing behind such an address), whatever their namespace.
    pub(super) fn update_backends_of(&mut self, key: &PodName, before: Option<&PodRecord>) {
        if !self.endpoint_addresses.is_empty() {
            let ips: Vec<IpAddr> = before
                .into_iter()
                .chain(self.pods.get(key))
                .flat_map(|p| p.ips.iter().copied())
                .collect();
            self.recompute_backends_at(ips);
        }
        let Some(names) = self.services_in_namespace.get(&key.0) else {
            return;
        };
        let pod = self.pods.get(key);
        let deleted = self.deleted.contains_key(key);
        // IPs too: a host-network backend is its address.
        let changed = before.map(|b| (&b.endpoint, &b.ports, &b.ips))
            != pod.map(|p| (&p.endpoint, &p.ports, &p.ips));
        let mut dirty = Vec::new();
        for name in names {
            let service_key = (key.0.clone(), name.clone());
            let Some(svc) = self.services.get(&service_key) else {
                continue;
            };
            let member = pod.is_some_and(|p| backs(svc, p, deleted));
            let backends = self.backends.entry(service_key.clone()).or_default();
            let was = backends.pods.contains(&key.1);
            if member && !was {
                backends.pods.insert(key.1.clone());
            } else if !member && was {
                backends.pods.remove(&key.1);
            }
            if member != was || (member && changed) {
                dirty.push(service_key);
            }
        }
        for service_key in dirty {
            self.recompute_backends(&service_key);
        }
    }

    /// Recomputes the per-port backends of a Service: from its backend pods, or for a Service without a
    /// selector from its Endpoints ([`Index::endpoints_by_port`]).
    pub(super) fn recompute_backends(&mut self, key: &ServiceKey) {
        let Some(svc) = self.services.get(key) else {
            self.backends.remove(key);
            return;
        };
        let Some(pods) = self.backends.get(key).map(|b| &b.pods) else {
            return;
        };
        if svc.selector.is_none() {
            let by_port = self.endpoints_by_port(key, svc);
            if let Some(backends) = self.backends.get_mut(key) {
                backends.by_port = by_port;
            }
            return;
        }
        // A host-network backend is reached at its node's address of the ClusterIP's family.
        let family = svc
            .ips
            .first()
            .copied()
            .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        let mut by_port = FastMap::default();
        for sp in &svc.ports {
            let mut found: BTreeSet<Backend> = BTreeSet::new();
            for name in pods {
                let Some(pod) = self.pods.get_str(&key.0, name) else {
                    continue;
                };
                let port = container_port(&sp.target, pod, sp.protocol);
                if let (Some(port), Some(endpoint)) = (port, self.pod_endpoint(pod, family)) {
                    found.insert((endpoint, port));
                }
            }
            if !found.is_empty() {
                by_port.insert(
                    (sp.port, sp.protocol),
                    Arc::new(found.into_iter().collect()),
                );
            }
        }
        if let Some(backends) = self.backends.get_mut(key) {
            backends.by_port = by_port;
        }
    }

    /// Recomputes the backends of every Service without a selector whose Endpoints list one of `ips`
    /// (the pod or node at one of them changed).
    ///
    /// The scheme: such Services are few (the `kubernetes` Service, Services in front of outside
    /// hosts) and so are their addresses, so [`Index::endpoint_addresses`] maps each address to its
    /// Services, and any change that can alter what an address is (a pod taking, leaving or changing
    /// behind it, a node gaining or losing it) recomputes those Services' backends in full; their
    /// Endpoints or the Service itself changing recomputes that one Service. Everything else costs one
    /// hash lookup per IP of the changed pod or node.
    pub(super) fn recompute_backends_at(&mut self, ips: impl IntoIterator<Item = IpAddr>) {
        let services: BTreeSet<ServiceKey> = ips
            .into_iter()
            .filter_map(|ip| self.endpoint_addresses.get(&ip))
            .flatten()
            .cloned()
            .collect();
        for key in services {
            self.recompute_backends(&key);
        }
    }

    /// The backends of `svc`, a Service without a selector, per service port: every ready address of
    /// its endpoints that serves the port of the same name and protocol (how kube-proxy pairs them), or,
    /// when the port has no ready address, every serving terminating one (kube-proxy's fallback), as
    /// the endpoint that address is now ([`Index::address_endpoint`]), on the Endpoints' port: what the
    /// connection reaches after DNAT.
    ///
    /// Computed on change, so an address resolves by who holds it now, not by a record's time as
    /// [`Index::pod_at`] would (a record arriving after the pod at an address was replaced resolves to
    /// the new one): the same as the backends of a Service with a selector, its current pods.
    pub(super) fn endpoints_by_port(
        &self,
        key: &ServiceKey,
        svc: &ServiceInfo,
    ) -> FastMap<(u16, Protocol), Arc<Vec<Backend>>> {
        let mut by_port = FastMap::default();
        let Some(parts) = self.endpoints.get(key) else {
            return by_port;
        };
        for (i, sp) in svc.ports.iter().enumerate() {
            // The first port of that number and protocol is the one a record resolves by.
            let same = |p: &ServicePort| p.port == sp.port && p.protocol == sp.protocol;
            if svc.ports[..i].iter().any(same) {
                continue;
            }
            let serving = |terminating: bool| {
                let mut found: BTreeSet<Backend> = BTreeSet::new();
                for subset in parts.values().flatten() {
                    let addresses = if terminating {
                        &subset.terminating
                    } else {
                        &subset.addresses
                    };
                    for (_, target, _) in subset
                        .ports
                        .iter()
                        .filter(|(name, _, pr)| *name == sp.name && *pr == sp.protocol)
                    {
                        for ip in addresses {
                            // `i64::MAX`: whoever holds the address now.
                            found.insert((self.address_endpoint(*ip, i64::MAX), *target));
                        }
                    }
                }
                found
            };
            let mut found = serving(false);
            if found.is_empty() {
                found = serving(true);
            }
            if !found.is_empty() {
                by_port.insert(
                    (sp.port, sp.protocol),
                    Arc::new(found.into_iter().collect()),
                );
            }
        }
        by_port
    }

    /// Adds or updates a Service (by its ClusterIPs; headless Services have none and resolve as pods).
    pub fn apply_service(&mut self, svc: &Service) {
        let namespace = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let key = (namespace.clone(), name.clone());
        let routed_before = self.routed_addresses(&key);
        self.remove_service(&key);
        let Some(spec) = svc.spec.as_ref() else {
            self.reindex_endpoint_addresses(&key, routed_before);
            return;
        };
        let ips: Vec<IpAddr> = spec
            .cluster_ips
            .iter()
            .flatten()
            .chain(spec.cluster_ip.iter())
            .filter_map(|ip| ip.parse::<IpAddr>().ok())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let info = ServiceInfo {
            namespace: namespace.clone(),
            name: name.clone(),
            selector: spec.selector.clone().filter(|s| !s.is_empty()),
            ports: spec
                .ports
                .iter()
                .flatten()
                .filter_map(|p| {
                    Some(ServicePort {
                        port: u16::try_from(p.port).ok()?,
                        protocol: protocol(p.protocol.as_deref()),
                        target: p.target_port.clone().unwrap_or(IntOrString::Int(p.port)),
                        name: p.name.clone().unwrap_or_default(),
                    })
                })
                .collect(),
            ips,
        };
        for ip in &info.ips {
            self.service_ips.insert(*ip, key.clone());
        }
        let members: BTreeSet<String> = self
            .pods_in_namespace
            .get(&namespace)
            .into_iter()
            .flatten()
            .filter(|pod| {
                let pod_key = (namespace.clone(), (*pod).clone());
                self.pods
                    .get(&pod_key)
                    .is_some_and(|p| backs(&info, p, self.deleted.contains_key(&pod_key)))
            })
            .cloned()
            .collect();
        self.services_in_namespace
            .entry(namespace)
            .or_default()
            .insert(name);
        self.services.insert(key.clone(), info);
        self.backends.insert(
            key.clone(),
            Backends {
                pods: members,
                by_port: FastMap::default(),
            },
        );
        // A selector added or removed moves the Service between its pods and its endpoints, both
        // already held: resolved again now.
        self.reindex_endpoint_addresses(&key, routed_before);
        self.recompute_backends(&key);
    }

    /// Removes a Service. Its endpoints stay (as for a Service not indexed yet) until their objects go.
    pub fn delete_service(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        let routed_before = self.routed_addresses(&key);
        self.remove_service(&key);
        self.reindex_endpoint_addresses(&key, routed_before);
    }

    /// Forgets the Service `key` and its backends.
    fn remove_service(&mut self, key: &ServiceKey) {
        let name = key.1.as_str();
        if let Some(old) = self.services.remove(key) {
            for ip in &old.ips {
                if self.service_ips.get(ip) == Some(key) {
                    self.service_ips.remove(ip);
                }
            }
        }
        self.backends.remove(key);
        remove_from(&mut self.services_in_namespace, &key.0, name);
    }
}
