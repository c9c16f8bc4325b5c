//! Deny evidence: each connection attempt the enforcement table refused (read back from NFLOG by
//! [`crate::enforce::nflog`], first packet only) becomes a flow record with outcome denied, so protect
//! violations come from the enforcer itself: exact counts, and the policy named when one alone
//! isolates the pod (docs/behaviour.md §7.6).
//!
//! [`DenyIndex`] maps the addresses of the isolated pods to their names and isolating policies; it is
//! rebuilt with every installed ruleset. [`record`] is the pure translation.

use crate::enforce::compile::Ruleset;
use crate::enforce::metrics::{DirectionLabel, EnforcementMetrics};
use crate::enforce::nflog::{Denied, DenyDirection, Nflog, NflogCounters};
use crate::sources::RecordSink;
use network_enforcer_api::uplink::{self as proto, FlowRecord, LocalPod};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};

/// An isolated pod as deny records name it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Isolated {
    namespace: String,
    name: String,
    ingress_policies: Vec<String>,
    egress_policies: Vec<String>,
}

/// The isolated pods of the installed ruleset, by address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DenyIndex {
    by_ip: HashMap<IpAddr, Isolated>,
}

impl DenyIndex {
    pub fn new(ruleset: &Ruleset) -> Self {
        let mut by_ip = HashMap::new();
        for pod in &ruleset.pods {
            let isolated = Isolated {
                namespace: pod.namespace.clone(),
                name: pod.name.clone(),
                ingress_policies: pod
                    .ingress
                    .as_ref()
                    .map(|s| s.policies.clone())
                    .unwrap_or_default(),
                egress_policies: pod
                    .egress
                    .as_ref()
                    .map(|s| s.policies.clone())
                    .unwrap_or_default(),
            };
            for ip in &pod.ips {
                by_ip.insert(*ip, isolated.clone());
            }
        }
        Self { by_ip }
    }
}

/// The record of one denied attempt, seen at `now_ms`: on the destination pod (inbound) for an
/// ingress denial, on the source pod (outbound) for an egress one. `None` when the pod is no longer
/// isolated here (the ruleset changed since) or the protocol is neither TCP nor UDP.
pub fn record(denied: &Denied, index: &DenyIndex, now_ms: i64) -> Option<FlowRecord> {
    let protocol = match denied.protocol {
        6 => proto::Protocol::Tcp,
        17 => proto::Protocol::Udp,
        _ => return None,
    };
    let (local, peer, direction, policies) = match denied.direction {
        DenyDirection::Ingress => {
            let pod = index.by_ip.get(&denied.destination.ip())?;
            (
                pod,
                denied.source,
                proto::Direction::Inbound,
                &pod.ingress_policies,
            )
        }
        DenyDirection::Egress => {
            let pod = index.by_ip.get(&denied.source.ip())?;
            (
                pod,
                denied.destination,
                proto::Direction::Outbound,
                &pod.egress_policies,
            )
        }
    };
    Some(FlowRecord {
        local: Some(LocalPod {
            namespace: local.namespace.clone(),
            name: local.name.clone(),
            uid: String::new(),
        }),
        peer_ip: network_enforcer_api::uplink::ip_bytes(peer.ip()),
        // The service port: the destination's, whichever side was refused.
        port: u32::from(denied.destination.port()),
        protocol: protocol as i32,
        direction: direction as i32,
        outcome: proto::Outcome::Denied as i32,
        first_seen_ms: now_ms,
        last_seen_ms: now_ms,
        count: 1,
        source: proto::Source::Enforcement as i32,
        // Denied because nothing allowed it: one isolating policy is "the" policy; with several,
        // none of them alone denied it.
        policy: match policies.as_slice() {
            [one] => one.clone(),
            _ => String::new(),
        },
        ..FlowRecord::default()
    })
}

/// The index shared by the sync loop (writer, at each install) and [`forward`] (reader).
pub type SharedDenyIndex = Arc<RwLock<DenyIndex>>;

/// Turns every denial read from NFLOG into a record for the next flush, and counts it. Runs until
/// the reader stops; a reader error is logged (enforcement itself goes on without evidence).
pub async fn forward(
    mut nflog: Nflog,
    index: SharedDenyIndex,
    sink: RecordSink,
    metrics: EnforcementMetrics,
) {
    let mut lost_before = 0;
    while let Some(denied) = nflog.denied.recv().await {
        let direction = match denied.direction {
            DenyDirection::Ingress => "ingress",
            DenyDirection::Egress => "egress",
        };
        metrics
            .denied
            .get_or_create(&DirectionLabel { direction })
            .inc();
        let record = {
            let index = index.read().unwrap_or_else(|p| p.into_inner());
            record(&denied, &index, crate::sources::now_ms())
        };
        tracing::debug!(?denied, "connection attempt denied by a NetworkPolicy");
        if let Some(record) = record
            && !sink.add(record)
        {
            metrics.deny_records_dropped.inc();
        }
        // The reader's own losses (kernel queue overflow, this loop falling behind).
        let c = &nflog.counters;
        let lost = NflogCounters::get(&c.kernel_dropped) + NflogCounters::get(&c.channel_full);
        metrics
            .deny_records_dropped
            .inc_by(lost.saturating_sub(lost_before));
        lost_before = lost;
    }
    match (&mut nflog.task).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::error!(error = %e, "reading denied packets failed; deny evidence stops")
        }
        Err(e) => tracing::error!(error = %e, "the NFLOG reader task failed; deny evidence stops"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::compile::{IsolatedPod, Side};

    fn index() -> DenyIndex {
        let side = |policies: &[&str]| {
            Some(Side {
                isolated: true,
                admin: vec![],
                baseline: vec![],
                policies: policies.iter().map(|p| p.to_string()).collect(),
                allows: vec![],
                names: vec![],
            })
        };
        DenyIndex::new(&Ruleset {
            pods: vec![
                IsolatedPod {
                    namespace: "x".into(),
                    name: "a".into(),
                    ips: vec!["10.0.0.1".parse().unwrap()],
                    ingress: side(&["x/deny-all"]),
                    egress: side(&["x/p1", "x/p2"]),
                },
                IsolatedPod {
                    namespace: "y".into(),
                    name: "b".into(),
                    ips: vec!["fd00::2".parse().unwrap()],
                    ingress: None,
                    egress: side(&["y/only"]),
                },
            ],
            warnings: vec![],
        })
    }

    fn denied(direction: DenyDirection, protocol: u8, from: &str, to: &str) -> Denied {
        Denied {
            direction,
            protocol,
            source: from.parse().unwrap(),
            destination: to.parse().unwrap(),
        }
    }

    #[test]
    fn denials_become_records_on_the_refusing_pod() {
        use DenyDirection::*;
        // (denial, expected (local pod, peer ip, port, direction, policy) or None)
        type Expected = Option<(&'static str, Vec<u8>, u32, proto::Direction, &'static str)>;
        let cases: Vec<(Denied, Expected)> = vec![
            (
                denied(Ingress, 6, "10.0.0.9:40000", "10.0.0.1:80"),
                Some((
                    "x/a",
                    vec![10, 0, 0, 9],
                    80,
                    proto::Direction::Inbound,
                    "x/deny-all",
                )),
            ),
            // Two policies isolate x/a's egress: neither alone is named.
            (
                denied(Egress, 17, "10.0.0.1:5000", "10.0.0.7:53"),
                Some(("x/a", vec![10, 0, 0, 7], 53, proto::Direction::Outbound, "")),
            ),
            (
                denied(Egress, 6, "[fd00::2]:4000", "[fd00::9]:443"),
                Some((
                    "y/b",
                    "fd00::9"
                        .parse::<std::net::Ipv6Addr>()
                        .unwrap()
                        .octets()
                        .to_vec(),
                    443,
                    proto::Direction::Outbound,
                    "y/only",
                )),
            ),
            // No longer isolated here, or not TCP/UDP: nothing.
            (denied(Ingress, 6, "10.0.0.1:1", "10.0.0.99:80"), None),
            (denied(Ingress, 1, "10.0.0.9:0", "10.0.0.1:0"), None),
        ];
        for (d, expected) in cases {
            let got = record(&d, &index(), 1_000).map(|r| {
                let local = r.local.clone().unwrap();
                assert_eq!(r.outcome, proto::Outcome::Denied as i32);
                assert_eq!(r.source, proto::Source::Enforcement as i32);
                assert_eq!(
                    (r.first_seen_ms, r.last_seen_ms, r.count),
                    (1_000, 1_000, 1)
                );
                (
                    format!("{}/{}", local.namespace, local.name),
                    r.peer_ip,
                    r.port,
                    proto::Direction::try_from(r.direction).unwrap(),
                    r.policy,
                )
            });
            let expected = expected.map(|(pod, ip, port, dir, policy)| {
                (pod.to_string(), ip, port, dir, policy.to_string())
            });
            assert_eq!(got, expected, "{d:?}");
        }
    }
}
