//! The endpoints of Services, from EndpointSlices (`discovery.k8s.io/v1`) or v1 Endpoints: what each
//! object publishes, kept per Service and object, and which addresses route to which Service.

use super::*;

impl Index {
    /// Adds or updates an Endpoints object (the fallback source, where EndpointSlices are not served).
    pub fn apply_endpoints(&mut self, endpoints: &Endpoints) {
        let key = endpoints_key(endpoints);
        let name = key.1.clone();
        self.set_endpoint_part(&key, &name, endpoints_subsets(endpoints));
    }

    /// Whether [`Index::apply_endpoints`] would change the index: the watch checks this under the read
    /// lock and takes the write lock only when it would (leader-election records without addresses
    /// are updated every few seconds). Skipping an event that changes nothing is the same as applying
    /// it then.
    pub fn endpoints_change(&self, endpoints: &Endpoints) -> bool {
        let key = endpoints_key(endpoints);
        self.endpoint_part(&key, &key.1) != endpoints_subsets(endpoints).as_ref()
    }

    /// Whether the index keeps the Endpoints `namespace`/`name` ([`Index::delete_endpoints`] changes
    /// nothing otherwise).
    pub fn holds_endpoints(&self, namespace: &str, name: &str) -> bool {
        let key = (namespace.to_string(), name.to_string());
        self.endpoint_part(&key, name).is_some()
    }

    /// Removes an Endpoints object.
    pub fn delete_endpoints(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        self.set_endpoint_part(&key, name, None);
    }

    /// Adds or updates an EndpointSlice. A slice without the `kubernetes.io/service-name` label
    /// belongs to no Service (kube-proxy ignores it too): it is forgotten.
    pub fn apply_endpoint_slice(&mut self, slice: &EndpointSlice) {
        let at = slice_name(slice);
        let service = slice_service(slice);
        // The slice moved to another Service (its label changed): it leaves the first.
        if let Some(before) = self.slice_services.get(&at).cloned() {
            if Some(&before) != service.as_ref() {
                self.set_endpoint_part(&before, &at.1, None);
                self.slice_services.remove(&at);
            }
        }
        let Some(service) = service else {
            return;
        };
        let subsets = slice_subsets(slice);
        if subsets.is_some() {
            self.slice_services.insert(at.clone(), service.clone());
        } else {
            self.slice_services.remove(&at);
        }
        self.set_endpoint_part(&service, &at.1, subsets);
    }

    /// Whether [`Index::apply_endpoint_slice`] would change the index (see
    /// [`Index::endpoints_change`]).
    pub fn endpoint_slice_change(&self, slice: &EndpointSlice) -> bool {
        let at = slice_name(slice);
        let subsets = slice_subsets(slice);
        match (self.slice_services.get(&at), slice_service(slice)) {
            // Not held: held from now on if it belongs to a Service and publishes something.
            (None, service) => service.is_some() && subsets.is_some(),
            (Some(held), Some(service)) if *held == service => {
                self.endpoint_part(held, &at.1) != subsets.as_ref()
            }
            // Held for another Service, or for none any more.
            (Some(_), _) => true,
        }
    }

    /// Whether the index keeps the EndpointSlice `namespace`/`name`.
    pub fn holds_endpoint_slice(&self, namespace: &str, name: &str) -> bool {
        self.slice_services
            .contains_key(&(namespace.to_string(), name.to_string()))
    }

    /// Removes an EndpointSlice.
    pub fn delete_endpoint_slice(&mut self, namespace: &str, name: &str) {
        if let Some(service) = self
            .slice_services
            .remove(&(namespace.to_string(), name.to_string()))
        {
            self.set_endpoint_part(&service, name, None);
        }
    }

    /// What the object `object` publishes for the Service `key`, if the index keeps it.
    fn endpoint_part(&self, key: &ServiceKey, object: &str) -> Option<&Vec<EndpointSubset>> {
        self.endpoints.get(key)?.get(object)
    }

    /// Sets (or with `None` removes) what the object `object` publishes for the Service `key`, and
    /// when that Service is resolved through its endpoints, its backends and routed addresses.
    fn set_endpoint_part(
        &mut self,
        key: &ServiceKey,
        object: &str,
        subsets: Option<Vec<EndpointSubset>>,
    ) {
        if self.endpoint_part(key, object) == subsets.as_ref() {
            return;
        }
        let routed_before = self.routed_addresses(key);
        match subsets {
            Some(subsets) => {
                self.endpoints
                    .entry(key.clone())
                    .or_default()
                    .insert(object.to_string(), subsets);
            }
            None => {
                if let Some(parts) = self.endpoints.get_mut(key) {
                    parts.remove(object);
                    if parts.is_empty() {
                        self.endpoints.remove(key);
                    }
                }
            }
        }
        if self.reindex_endpoint_addresses(key, routed_before) || self.routed(key) {
            self.recompute_backends(key);
        }
    }

    /// Whether the Service `key` is resolved through its endpoints: it has no selector, or is not
    /// indexed yet (the watches list in any order).
    pub(super) fn routed(&self, key: &ServiceKey) -> bool {
        self.services
            .get(key)
            .is_none_or(|svc| svc.selector.is_none())
    }

    /// The addresses of the endpoints of the Service `key` if it is resolved through them, else none.
    pub(super) fn routed_addresses(&self, key: &ServiceKey) -> BTreeSet<IpAddr> {
        if !self.routed(key) {
            return BTreeSet::new();
        }
        self.endpoints
            .get(key)
            .into_iter()
            .flat_map(|parts| parts.values().flatten())
            .flat_map(|s| s.addresses.iter().chain(&s.terminating))
            .copied()
            .collect()
    }

    /// Brings [`Index::endpoint_addresses`] in step for the Service `key`, whose routed addresses were
    /// `before`; whether they changed.
    pub(super) fn reindex_endpoint_addresses(
        &mut self,
        key: &ServiceKey,
        before: BTreeSet<IpAddr>,
    ) -> bool {
        let after = self.routed_addresses(key);
        if after == before {
            return false;
        }
        for ip in before.difference(&after) {
            if let Some(services) = self.endpoint_addresses.get_mut(ip) {
                services.remove(key);
                if services.is_empty() {
                    self.endpoint_addresses.remove(ip);
                }
            }
        }
        for ip in after.difference(&before) {
            self.endpoint_addresses
                .entry(*ip)
                .or_default()
                .insert(key.clone());
        }
        true
    }
}

/// The Service an Endpoints object belongs to (same namespace and name).
fn endpoints_key(endpoints: &Endpoints) -> ServiceKey {
    (
        endpoints.namespace().unwrap_or_default(),
        endpoints.name_any(),
    )
}

/// What an Endpoints object publishes: per subset, its ready addresses (kube-proxy sends nothing to
/// not-ready ones) and ports; `None` when no subset has both.
fn endpoints_subsets(endpoints: &Endpoints) -> Option<Vec<EndpointSubset>> {
    let subsets: Vec<EndpointSubset> = endpoints
        .subsets
        .iter()
        .flatten()
        .map(|subset| EndpointSubset {
            addresses: subset
                .addresses
                .iter()
                .flatten()
                .filter_map(|a| a.ip.parse().ok())
                .collect(),
            terminating: Vec::new(),
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

/// An EndpointSlice's (namespace, name).
fn slice_name(slice: &EndpointSlice) -> (String, String) {
    (slice.namespace().unwrap_or_default(), slice.name_any())
}

/// The Service an EndpointSlice belongs to: its `kubernetes.io/service-name` label, in its namespace.
fn slice_service(slice: &EndpointSlice) -> Option<ServiceKey> {
    let name = slice.labels().get(SERVICE_NAME_LABEL)?;
    Some((slice.namespace().unwrap_or_default(), name.clone()))
}

/// The label that ties an EndpointSlice to its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What an EndpointSlice publishes, read as kube-proxy reads it: an endpoint is ready unless its
/// `ready` condition is false (a terminating one is not ready), and serving unless `serving` is false;
/// one not ready but serving and terminating is kept apart for the fallback. Addresses that are no IP (an
/// `FQDN` slice) and ports without a number are skipped. `None` when nothing is left.
fn slice_subsets(slice: &EndpointSlice) -> Option<Vec<EndpointSubset>> {
    let mut addresses = Vec::new();
    let mut terminating = Vec::new();
    for endpoint in slice.endpoints.iter().flatten() {
        let conditions = endpoint.conditions.as_ref();
        let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
        let serving = conditions.and_then(|c| c.serving).unwrap_or(true);
        let ending = conditions.and_then(|c| c.terminating).unwrap_or(false);
        let ips = endpoint
            .addresses
            .iter()
            .filter_map(|a| a.parse::<IpAddr>().ok());
        if ready {
            addresses.extend(ips);
        } else if serving && ending {
            terminating.extend(ips);
        }
    }
    let ports: Vec<(String, u16, Protocol)> = slice
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p.name.clone().unwrap_or_default(),
                u16::try_from(p.port?).ok()?,
                protocol(p.protocol.as_deref()),
            ))
        })
        .collect();
    if ports.is_empty() || (addresses.is_empty() && terminating.is_empty()) {
        return None;
    }
    Some(vec![EndpointSubset {
        addresses,
        terminating,
        ports,
    }])
}
