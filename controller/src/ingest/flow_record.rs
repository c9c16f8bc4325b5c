//! Reading a [`FlowRecord`] against the index, once, for learning ([`crate::ingest`]) and violation
//! evidence ([`crate::monitor::violations::evidence`]) alike: [`decode`] checks its fields, finds the
//! local pod it belongs to and the address that stands for its peer, or says why it cannot
//! ([`BadRecord`]).
//!
//! **The peer.** Usually the record's address: a pod, a Service ClusterIP, a node, or the outside
//! world. Flow sources that see more than an address (Hubble, Goldmane, ztunnel) also name the peer:
//! `peer.namespace`/`peer.pod`, or the mesh identity `peer.principal`. When the address leads to no pod
//! or Service (a pod the index has already forgotten under that IP, an address rewritten on the way
//! such as SNAT to a node IP, a tunnel endpoint) but the source named a pod the index knows, that pod's
//! address is used instead, so the flow is learned and evaluated as the workload it was. A principal
//! (`<trust domain>/ns/<namespace>/sa/<service account>`) names a ServiceAccount, which several
//! workloads may share: it stands for a pod only when the pods of that ServiceAccount all belong to one
//! workload. Finding those pods walks the index's pods, which is acceptable because it happens only for
//! records whose address resolved to nothing (the index has no lookup by ServiceAccount).

use super::peer_names::PeerName;
use crate::cluster::index::{Connection, FlowEnd, Index, Opened, PodRecord, ResolvedRef};
use network_enforcer_api::Protocol;
use network_enforcer_api::uplink::{self, FlowRecord, LocalPod};
use std::net::IpAddr;
use std::sync::Arc;

/// The local pod a record names: by namespace/name when the agent watches pods, by uid alone (from the
/// pod's cgroup path) when it does not. `None` when the record names none or the index does not know it.
pub fn local_pod<'a>(record: &FlowRecord, index: &'a Index) -> Option<&'a Arc<PodRecord>> {
    let local = record.local.as_ref()?;
    if local.name.is_empty() {
        index.pod_by_uid(&local.uid)
    } else {
        index.pod(&local.namespace, &local.name)
    }
}

/// How a record names its local pod, for messages: `namespace/name` or `uid <uid>`. The parts come
/// from the agent: each is cut at `SHOWN_CHARS` and its control characters escaped, so a hostile
/// record can neither flood the logs and acknowledgements nor forge log lines.
pub fn describe_local(local: &LocalPod) -> String {
    if local.name.is_empty() {
        format!("uid {}", shown(&local.uid))
    } else {
        format!("{}/{}", shown(&local.namespace), shown(&local.name))
    }
}

/// The longest name Kubernetes allows (DNS-1123 subdomain): longer parts are cut for messages.
const SHOWN_CHARS: usize = 253;

/// `s` for a message: at most [`SHOWN_CHARS`] characters, escaped, `…` when cut.
fn shown(s: &str) -> String {
    let mut out: String = s
        .chars()
        .take(SHOWN_CHARS)
        .flat_map(char::escape_debug)
        .collect();
    if s.chars().nth(SHOWN_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// Why a record cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRecord {
    #[error("record has no local pod")]
    NoLocalPod,
    #[error("pod {0} is not known")]
    UnknownLocalPod(String),
    #[error("pod {0} is not known on node {1}")]
    NotOnNode(String, String),
    #[error("peer address has {0} bytes; expected 4 or 16")]
    BadAddress(usize),
    #[error("port {0} is out of range")]
    BadPort(u32),
    #[error("unknown protocol or direction")]
    BadEnum,
    #[error("record is not a valid FlowRecord: {0}")]
    Malformed(prost::DecodeError),
    #[error("a resolution without a host name as peer_name")]
    BadName,
}

impl BadRecord {
    /// The `reason` label of `records_rejected_total`.
    pub fn label(&self) -> &'static str {
        match self {
            BadRecord::NoLocalPod => "no_local_pod",
            BadRecord::UnknownLocalPod(_) => "unknown_local_pod",
            BadRecord::NotOnNode(..) => "not_on_node",
            BadRecord::BadAddress(_) => "bad_address",
            BadRecord::BadPort(_) => "bad_port",
            BadRecord::BadEnum => "bad_enum",
            BadRecord::Malformed(_) => "malformed",
            BadRecord::BadName => "bad_name",
        }
    }
}

/// A record read against the index ([`decode`]). Holds none of the agent's strings: what the
/// status sync queues of a record as violation evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The pod the record belongs to, shared with the index (so one deleted meanwhile is still known).
    pub local: Arc<PodRecord>,
    /// The address that stands for the peer ([`peer_address`]), and why.
    pub peer: IpAddr,
    pub peer_from: PeerFrom,
    pub port: u16,
    pub protocol: Protocol,
    pub opened: Opened,
    /// When the connection was last seen, ms since the epoch.
    pub at_ms: i64,
    /// The name the local pod resolved the peer from (outbound records only; interned).
    pub peer_name: PeerName,
}

impl Decoded {
    /// What the index resolves ([`Index::flows`]).
    pub fn connection(&self) -> Connection<'_> {
        Connection {
            local: &self.local,
            peer: self.peer,
            port: self.port,
            protocol: self.protocol,
            opened: self.opened,
            at_ms: self.at_ms,
        }
    }
}

/// Reads `record` against `index`: its fields, its local pod (which must run on `node`, when given:
/// an agent speaks only for its own node's pods), and the address standing for its peer.
///
/// With `node` given, a pod the index does not know, or knows without a node yet (its binding not
/// seen), is [`BadRecord::UnknownLocalPod`]: the index may still catch up
/// ([`crate::ingest::waiting`]). A pod known on another node is [`BadRecord::NotOnNode`].
pub fn decode(
    record: &FlowRecord,
    index: &Index,
    node: Option<&str>,
) -> Result<Decoded, BadRecord> {
    let fields = fields(record)?;
    let opened = match uplink::Direction::try_from(record.direction) {
        Ok(uplink::Direction::Outbound) => Opened::Outbound,
        Ok(uplink::Direction::Inbound) => Opened::Inbound,
        _ => return Err(BadRecord::BadEnum),
    };
    let local = local_on_node(record, index, node)?;
    let (peer, peer_from) = peer_address(index, record, &fields, record.last_seen_ms);
    Ok(Decoded {
        local: local.clone(),
        peer,
        peer_from,
        port: fields.port,
        protocol: fields.protocol,
        opened,
        at_ms: record.last_seen_ms,
        // An inbound record's peer name would be the peer's lookup, not the local pod's.
        peer_name: match opened {
            Opened::Outbound => PeerName::of(&record.peer_name),
            Opened::Inbound => PeerName::NONE,
        },
    })
}

/// The record's local pod, which must run on `node` when given (see [`decode`]).
fn local_on_node<'i>(
    record: &FlowRecord,
    index: &'i Index,
    node: Option<&str>,
) -> Result<&'i Arc<PodRecord>, BadRecord> {
    let named = record.local.as_ref().ok_or(BadRecord::NoLocalPod)?;
    // Either way of naming the pod, the index decides which pod it is and where it runs.
    let local = local_pod(record, index)
        .filter(|pod| node.is_none() || pod.node.is_some())
        .ok_or_else(|| BadRecord::UnknownLocalPod(describe_local(named)))?;
    if let Some(node) = node
        && local.node.as_deref() != Some(node)
    {
        return Err(BadRecord::NotOnNode(describe_local(named), node.into()));
    }
    Ok(local)
}

/// An `OUTCOME_RESOLVED` record: a name a pod resolved to an address.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolution {
    pub local: Arc<PodRecord>,
    pub name: String,
    pub address: IpAddr,
    pub at_ms: i64,
}

/// Whether `record` is a resolution, not a connection.
pub fn is_resolution(record: &FlowRecord) -> bool {
    record.outcome == uplink::Outcome::Resolved as i32
}

/// Reads a resolution record: its local pod (on `node`, as [`decode`]), its address and its name.
pub fn decode_resolution(
    record: &FlowRecord,
    index: &Index,
    node: Option<&str>,
) -> Result<Resolution, BadRecord> {
    let address = address(&record.peer_ip)?;
    let name = network_enforcer_api::dns_name::host_name(&record.peer_name)
        .map_err(|_| BadRecord::BadName)?;
    let local = local_on_node(record, index, node)?;
    Ok(Resolution {
        local: local.clone(),
        name,
        address,
        at_ms: record.last_seen_ms,
    })
}

fn address(bytes: &[u8]) -> Result<IpAddr, BadRecord> {
    match bytes.len() {
        4 => Ok(<[u8; 4]>::try_from(bytes).expect("4 bytes").into()),
        16 => Ok(<[u8; 16]>::try_from(bytes).expect("16 bytes").into()),
        n => Err(BadRecord::BadAddress(n)),
    }
}

/// The peer address, port and protocol of a record, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fields {
    pub peer: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
}

/// Reads the peer address (4 or 16 bytes), port and protocol (TCP or UDP) of `record`.
pub fn fields(record: &FlowRecord) -> Result<Fields, BadRecord> {
    let peer = address(&record.peer_ip)?;
    // Port 0 is no service (an agent that reported a UDP connect() to port 0, a resolver's
    // source-address probe, sent nothing).
    let port = u16::try_from(record.port)
        .ok()
        .filter(|&p| p != 0)
        .ok_or(BadRecord::BadPort(record.port))?;
    let protocol = match uplink::Protocol::try_from(record.protocol) {
        Ok(uplink::Protocol::Tcp) => Protocol::TCP,
        Ok(uplink::Protocol::Udp) => Protocol::UDP,
        _ => return Err(BadRecord::BadEnum),
    };
    Ok(Fields {
        peer,
        port,
        protocol,
    })
}

/// Which address stands for the peer, and why (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerFrom {
    /// The record's own address.
    Address,
    /// The address of the pod the source named (`peer.namespace`/`peer.pod`).
    NamedPod,
    /// The address of a pod of the only workload running as the source's principal.
    Principal,
    /// The address leads to no pod and the principal is shared by several workloads: the address
    /// stays, and the peer is learned as an address.
    AmbiguousPrincipal,
}

impl PeerFrom {
    /// The `outcome` label counted in `resolutions_total` when not [`PeerFrom::Address`].
    pub fn label(self) -> &'static str {
        match self {
            PeerFrom::Address => "peer_address",
            PeerFrom::NamedPod => "peer_named_by_source",
            PeerFrom::Principal => "peer_from_principal",
            PeerFrom::AmbiguousPrincipal => "peer_principal_ambiguous",
        }
    }
}

/// The address that stands for the peer of `record`, whose checked fields are `fields`, seen at `at_ms`.
pub fn peer_address(
    index: &Index,
    record: &FlowRecord,
    fields: &Fields,
    at_ms: i64,
) -> (IpAddr, PeerFrom) {
    let address = (fields.peer, PeerFrom::Address);
    let Some(named) = record.peer.as_ref() else {
        return address;
    };
    if index.pod_at(fields.peer, at_ms).is_some() {
        return address;
    }
    // Only addresses that lead nowhere in the cluster's pods: a Service is resolved to its backends.
    if !matches!(
        index.resolve_ref(fields.peer, fields.port, fields.protocol, at_ms),
        ResolvedRef::Address(FlowEnd::External(_) | FlowEnd::Node { .. }, _)
    ) {
        return address;
    }
    if !named.namespace.is_empty() && !named.pod.is_empty() {
        if let Some(ip) = index
            .pod(&named.namespace, &named.pod)
            .and_then(|p| p.ips.first())
        {
            return (*ip, PeerFrom::NamedPod);
        }
    }
    let Some((namespace, account)) = parse_principal(&named.principal) else {
        return address;
    };
    let mut found: Option<(&PodRecord, &crate::cluster::index::WorkloadEndpoint)> = None;
    for pod in index
        .pods()
        .filter(|p| p.namespace == namespace && p.service_account == account && !p.ips.is_empty())
    {
        let workload = index.endpoint_of(pod);
        match &found {
            Some((_, first)) if !same_workload(first, workload) => {
                return (fields.peer, PeerFrom::AmbiguousPrincipal);
            }
            // Any pod of the workload names it; the lowest address makes the choice independent of
            // the index's iteration order.
            Some((chosen, _)) if chosen.ips[0] <= pod.ips[0] => {}
            _ => found = Some((pod, workload)),
        }
    }
    match found {
        Some((pod, _)) => (pod.ips[0], PeerFrom::Principal),
        None => address,
    }
}

fn same_workload(
    a: &crate::cluster::index::WorkloadEndpoint,
    b: &crate::cluster::index::WorkloadEndpoint,
) -> bool {
    (&a.namespace, a.kind, &a.name) == (&b.namespace, b.kind, &b.name)
}

/// `(namespace, service account)` of `<trust domain>/ns/<namespace>/sa/<service account>` (an
/// optional `spiffe://` prefix is accepted).
pub fn parse_principal(principal: &str) -> Option<(&str, &str)> {
    let rest = principal.strip_prefix("spiffe://").unwrap_or(principal);
    let mut parts = rest.split('/');
    let (_domain, ns_key, namespace, sa_key, account) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    );
    (ns_key == "ns"
        && sa_key == "sa"
        && !namespace.is_empty()
        && !account.is_empty()
        && parts.next().is_none())
    .then_some((namespace, account))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use network_enforcer_api::uplink::Peer;
    use serde_json::json;

    /// Pods `web-<n>` of Deployment web (ServiceAccount web), `job` of ServiceAccount shared with
    /// `cron`, a bare pod.
    fn index() -> Index {
        let mut index = Index::default();
        let pod = |name: &str, sa: &str, ip: &str, owner: Option<&str>| {
            let mut meta = json!({"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                                  "labels": {"app": name}});
            if let Some(rs) = owner {
                meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": rs, "uid": format!("uid-{rs}"), "controller": true}]);
                meta["labels"] = json!({"app": "web", "pod-template-hash": "abc"});
            }
            serde_json::from_value::<Pod>(json!({
                "metadata": meta,
                "spec": {"nodeName": "node-a", "serviceAccountName": sa, "containers": []},
                "status": {"phase": "Running", "podIP": ip}
            }))
            .unwrap()
        };
        index.apply_pod(&pod("web-1", "web", "10.0.0.1", Some("web-abc")), 1_000);
        index.apply_pod(&pod("web-2", "web", "10.0.0.2", Some("web-abc")), 1_000);
        index.apply_pod(&pod("job", "shared", "10.0.0.3", None), 1_000);
        index.apply_pod(&pod("cron", "shared", "10.0.0.4", None), 1_000);
        index
    }

    fn record(peer_ip: [u8; 4], peer: Option<Peer>) -> FlowRecord {
        FlowRecord {
            local: Some(LocalPod {
                namespace: "shop".into(),
                name: "web-1".into(),
                uid: String::new(),
            }),
            peer_ip: peer_ip.to_vec(),
            port: 8080,
            protocol: uplink::Protocol::Tcp as i32,
            direction: uplink::Direction::Inbound as i32,
            peer,
            ..FlowRecord::default()
        }
    }

    fn peer_of(index: &Index, r: &FlowRecord) -> (IpAddr, PeerFrom) {
        peer_address(index, r, &fields(r).unwrap(), 2_000)
    }

    #[test]
    fn a_pod_address_wins_over_what_the_source_names() {
        let index = index();
        let named = Peer {
            namespace: "shop".into(),
            pod: "job".into(),
            principal: String::new(),
        };
        let r = record([10, 0, 0, 2], Some(named));
        assert_eq!(
            peer_of(&index, &r),
            ("10.0.0.2".parse().unwrap(), PeerFrom::Address)
        );
    }

    #[test]
    fn an_unknown_address_falls_back_to_the_named_pod_then_the_principal() {
        let index = index();
        let named = |pod: &str, principal: &str| Peer {
            namespace: "shop".into(),
            pod: pod.into(),
            principal: principal.into(),
        };
        let outside = [192, 0, 2, 9];
        assert_eq!(
            peer_of(&index, &record(outside, Some(named("job", "")))),
            ("10.0.0.3".parse().unwrap(), PeerFrom::NamedPod)
        );
        // A pod the index does not know: the principal decides; both web pods are one workload.
        assert_eq!(
            peer_of(
                &index,
                &record(outside, Some(named("gone", "cluster.local/ns/shop/sa/web")))
            ),
            ("10.0.0.1".parse().unwrap(), PeerFrom::Principal)
        );
        assert_eq!(
            peer_of(
                &index,
                &record(outside, Some(named("", "spiffe://td/ns/shop/sa/web")))
            )
            .1,
            PeerFrom::Principal
        );
        // Two workloads share the ServiceAccount: no guess.
        assert_eq!(
            peer_of(
                &index,
                &record(outside, Some(named("", "cluster.local/ns/shop/sa/shared")))
            ),
            ("192.0.2.9".parse().unwrap(), PeerFrom::AmbiguousPrincipal)
        );
        // Nobody runs as it, or nothing is named: the address stays.
        for r in [
            record(outside, Some(named("", "cluster.local/ns/shop/sa/nobody"))),
            record(outside, Some(named("", "not a principal"))),
            record(outside, None),
        ] {
            assert_eq!(
                peer_of(&index, &r),
                ("192.0.2.9".parse().unwrap(), PeerFrom::Address)
            );
        }
    }

    #[test]
    fn principals_parse_only_in_their_exact_shape() {
        assert_eq!(
            parse_principal("cluster.local/ns/shop/sa/web"),
            Some(("shop", "web"))
        );
        assert_eq!(
            parse_principal("spiffe://cluster.local/ns/shop/sa/web"),
            Some(("shop", "web"))
        );
        for bad in [
            "",
            "cluster.local/ns/shop",
            "cluster.local/ns//sa/web",
            "cluster.local/sa/shop/ns/web",
            "cluster.local/ns/shop/sa/web/extra",
        ] {
            assert_eq!(parse_principal(bad), None, "{bad}");
        }
    }

    #[test]
    fn decode_checks_the_fields_then_the_local_pod_and_its_node() {
        let index = index();
        let ok = record([10, 0, 0, 9], None);
        let with = |f: &dyn Fn(&mut FlowRecord)| {
            let mut r = ok.clone();
            f(&mut r);
            r
        };
        let unknown = with(&|r| r.local.as_mut().unwrap().name = "gone".into());
        let bad_port = with(&|r| r.port = 70_000);
        let no_local = with(&|r| r.local = None);
        let bad_direction = with(&|r| r.direction = 99);
        let not_on = |node: &str| BadRecord::NotOnNode("shop/web-1".into(), node.into());
        // (record, node the agent speaks for, expected error)
        let cases: [(&FlowRecord, Option<&str>, BadRecord); 7] = [
            (&no_local, Some("node-a"), BadRecord::NoLocalPod),
            (
                &unknown,
                None,
                BadRecord::UnknownLocalPod("shop/gone".into()),
            ),
            (
                &unknown,
                Some("node-a"),
                BadRecord::UnknownLocalPod("shop/gone".into()),
            ),
            (&ok, Some("node-b"), not_on("node-b")),
            (&bad_port, Some("node-b"), BadRecord::BadPort(70_000)),
            (&bad_port, None, BadRecord::BadPort(70_000)),
            (&bad_direction, Some("node-a"), BadRecord::BadEnum),
        ];
        for (record, node, expected) in cases {
            assert_eq!(
                decode(record, &index, node).err(),
                Some(expected.clone()),
                "{node:?} {expected}"
            );
        }
        let decoded = decode(&ok, &index, Some("node-a")).unwrap();
        assert_eq!(
            (
                decoded.local.name.as_str(),
                decoded.peer,
                decoded.port,
                decoded.opened
            ),
            ("web-1", "10.0.0.9".parse().unwrap(), 8080, Opened::Inbound)
        );
        assert_eq!(decode(&ok, &index, None).unwrap(), decoded);
    }

    #[test]
    fn fields_are_checked() {
        let mut r = record([10, 0, 0, 1], None);
        assert_eq!(
            fields(&r).unwrap(),
            Fields {
                peer: "10.0.0.1".parse().unwrap(),
                port: 8080,
                protocol: Protocol::TCP
            }
        );
        r.peer_ip = vec![1, 2, 3];
        assert_eq!(fields(&r), Err(BadRecord::BadAddress(3)));
        r.peer_ip = vec![0; 16];
        r.port = 70_000;
        assert_eq!(fields(&r), Err(BadRecord::BadPort(70_000)));
        r.port = 0;
        assert_eq!(
            fields(&r),
            Err(BadRecord::BadPort(0)),
            "port 0 is no service"
        );
        r.port = 1;
        r.protocol = 99;
        assert_eq!(fields(&r), Err(BadRecord::BadEnum));
    }

    #[test]
    fn local_pods_by_name_or_uid() {
        let index = index();
        let mut r = record([10, 0, 0, 9], None);
        assert_eq!(
            local_pod(&r, &index).map(|p| p.name.as_str()),
            Some("web-1")
        );
        r.local = Some(LocalPod {
            uid: "uid-job".into(),
            ..LocalPod::default()
        });
        assert_eq!(local_pod(&r, &index).map(|p| p.name.as_str()), Some("job"));
        assert_eq!(describe_local(r.local.as_ref().unwrap()), "uid uid-job");
        r.local = None;
        assert!(local_pod(&r, &index).is_none());
    }

    #[test]
    fn hostile_pod_names_are_cut_and_escaped_in_messages() {
        let pod = |namespace: &str, name: &str, uid: &str| LocalPod {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        };
        let long = "a".repeat(1_000_000);
        let cases = [
            (pod("shop", "web-1", ""), "shop/web-1".to_string()),
            (pod("", "", "u-1"), "uid u-1".to_string()),
            (
                pod("shop", "x\nlevel=ERROR forged", ""),
                "shop/x\\nlevel=ERROR forged".to_string(),
            ),
            (pod("shop", &long, ""), format!("shop/{}…", "a".repeat(253))),
            (pod("", "", &long), format!("uid {}…", "a".repeat(253))),
            (
                pod("é", &"é".repeat(253), ""),
                format!("é/{}", "é".repeat(253)),
            ),
        ];
        for (local, want) in cases {
            assert_eq!(describe_local(&local), want);
        }
    }
}
