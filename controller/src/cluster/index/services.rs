//! Services and their backends: selector-based (from pods) and selector-less (from Endpoints).

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
                by_port.insert((sp.port, sp.protocol), found.into_iter().collect());
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
    /// its Endpoints that serves the port of the same name and protocol (how kube-proxy pairs them), as
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
    ) -> FastMap<(u16, Protocol), Vec<Backend>> {
        let mut by_port = FastMap::default();
        let Some(subsets) = self.endpoints.get(key) else {
            return by_port;
        };
        for (i, sp) in svc.ports.iter().enumerate() {
            // The first port of that number and protocol is the one a record resolves by.
            let same = |p: &ServicePort| p.port == sp.port && p.protocol == sp.protocol;
            if svc.ports[..i].iter().any(same) {
                continue;
            }
            let mut found: BTreeSet<Backend> = BTreeSet::new();
            for subset in subsets {
                for (_, target, _) in subset
                    .ports
                    .iter()
                    .filter(|(name, _, pr)| *name == sp.name && *pr == sp.protocol)
                {
                    for ip in &subset.addresses {
                        // `i64::MAX`: whoever holds the address now.
                        found.insert((self.address_endpoint(*ip, i64::MAX), *target));
                    }
                }
            }
            if !found.is_empty() {
                by_port.insert((sp.port, sp.protocol), found.into_iter().collect());
            }
        }
        by_port
    }

    /// Adds or updates a Service (by its ClusterIPs; headless Services have none and resolve as pods).
    pub fn apply_service(&mut self, svc: &Service) {
        let namespace = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        self.delete_service(&namespace, &name);
        let Some(spec) = svc.spec.as_ref() else {
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
        let key = (namespace.clone(), name.clone());
        let has_selector = info.selector.is_some();
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
        if has_selector {
            // Resolved through its pods: its Endpoints are not needed.
            self.store_endpoints(key.clone(), None);
        }
        self.recompute_backends(&key);
    }

    /// Removes a Service.
    pub fn delete_service(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        if let Some(old) = self.services.remove(&key) {
            for ip in &old.ips {
                if self.service_ips.get(ip) == Some(&key) {
                    self.service_ips.remove(ip);
                }
            }
        }
        self.backends.remove(&key);
        remove_from(&mut self.services_in_namespace, &key.0, name);
    }

    /// Adds or updates an Endpoints object. Kept only when its Service has no selector or is not indexed
    /// yet (the watches list in any order); a Service with a selector is resolved through its pods.
    pub fn apply_endpoints(&mut self, endpoints: &Endpoints) {
        let key = endpoints_key(endpoints);
        let kept = self.endpoints_kept(&key, endpoints);
        self.set_endpoints(key, kept);
    }

    /// Whether [`Index::apply_endpoints`] would change the index: the watch checks this under the read
    /// lock and takes the write lock only when it would (most Endpoints are of Services with a selector,
    /// or are leader-election records without addresses, updated every few seconds). Skipping an event
    /// that changes nothing is the same as applying it then, so a Service arriving later still finds
    /// what it would have.
    pub fn endpoints_change(&self, endpoints: &Endpoints) -> bool {
        let key = endpoints_key(endpoints);
        self.endpoints.get(&key) != self.endpoints_kept(&key, endpoints).as_ref()
    }

    /// Whether the index keeps the Endpoints `namespace`/`name` ([`Index::delete_endpoints`] changes
    /// nothing otherwise).
    pub fn holds_endpoints(&self, namespace: &str, name: &str) -> bool {
        self.endpoints
            .contains_key(&(namespace.to_string(), name.to_string()))
    }

    /// Removes an Endpoints object.
    pub fn delete_endpoints(&mut self, namespace: &str, name: &str) {
        self.set_endpoints((namespace.to_string(), name.to_string()), None);
    }

    /// What the index keeps of `endpoints` (of the Service `key`): its ready addresses and their ports,
    /// `None` when there are none or the Service has a selector.
    pub(super) fn endpoints_kept(
        &self,
        key: &ServiceKey,
        endpoints: &Endpoints,
    ) -> Option<Vec<EndpointSubset>> {
        if self
            .services
            .get(key)
            .is_some_and(|svc| svc.selector.is_some())
        {
            return None;
        }
        let subsets: Vec<EndpointSubset> = endpoints
            .subsets
            .iter()
            .flatten()
            .map(|subset| EndpointSubset {
                // Not-ready addresses receive no traffic from kube-proxy.
                addresses: subset
                    .addresses
                    .iter()
                    .flatten()
                    .filter_map(|a| a.ip.parse().ok())
                    .collect(),
                ports: subset
                    .ports
                    .iter()
                    .flatten()
                    .filter_map(|p| {
                        Some((
                            p.name.clone().unwrap_or_default(),
                            u16::try_from(p.port).ok()?,
                            protocol(p.protocol.as_deref()),
                        ))
                    })
                    .collect(),
            })
            .filter(|subset| !subset.addresses.is_empty() && !subset.ports.is_empty())
            .collect();
        Some(subsets).filter(|s| !s.is_empty())
    }

    /// Sets (or with `None` removes) the kept Endpoints of the Service `key` and recomputes the
    /// Service's backends if they changed.
    pub(super) fn set_endpoints(&mut self, key: ServiceKey, subsets: Option<Vec<EndpointSubset>>) {
        if self.store_endpoints(key.clone(), subsets) {
            self.recompute_backends(&key);
        }
    }

    /// Sets (or with `None` removes) the kept Endpoints of the Service `key`, keeping
    /// [`Index::endpoint_addresses`] in step; whether they changed.
    pub(super) fn store_endpoints(
        &mut self,
        key: ServiceKey,
        subsets: Option<Vec<EndpointSubset>>,
    ) -> bool {
        if self.endpoints.get(&key) == subsets.as_ref() {
            return false;
        }
        let old = match subsets {
            Some(subsets) => {
                for ip in subsets.iter().flat_map(|s| &s.addresses) {
                    self.endpoint_addresses
                        .entry(*ip)
                        .or_default()
                        .insert(key.clone());
                }
                self.endpoints.insert(key.clone(), subsets)
            }
            None => self.endpoints.remove(&key),
        };
        for ip in old.iter().flatten().flat_map(|s| &s.addresses) {
            let listed = self
                .endpoints
                .get(&key)
                .is_some_and(|now| now.iter().any(|s| s.addresses.contains(ip)));
            if !listed {
                if let Some(services) = self.endpoint_addresses.get_mut(ip) {
                    services.remove(&key);
                    if services.is_empty() {
                        self.endpoint_addresses.remove(ip);
                    }
                }
            }
        }
        true
    }
}
