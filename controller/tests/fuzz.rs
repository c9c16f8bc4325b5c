//! Fuzzing the controller's readers of hostile input (docs/development.md, "Fuzzing"): Goldmane flows,
//! `check` scenarios and agent records, and the uplink's flow batches with the ingest's reading of their
//! records. Each target must not panic and must answer a value or an error that says something.
//! `NE_FUZZ_CASES` sets the cases per target; `cargo xtask fuzz` runs 100,000 in release.

mod hostile;

use hostile::{bytes, clear, json, mutated_bytes, mutated_json, run, text};
use k8s_openapi::api::core::v1::Pod;
use network_enforcer_api::goldmane::{
    Action, EndpointType, Flow, FlowKey, PolicyHit, PolicyKind, PolicyTrace, Reporter,
};
use network_enforcer_api::uplink::{self, FlowBatch, FlowRecord, LocalPod, Peer, encoded};
use network_enforcer_controller::cluster::index::Index;
use network_enforcer_controller::ingest::flow_record::{
    PeerFrom, describe_local, fields, local_pod, parse_principal, peer_address,
};
use network_enforcer_controller::sources::goldmane::{Dedupe, convert, resolve_name};
use network_enforcer_controller::tools::check::{Checker, parse_records, parse_scenario};
use proptest::prelude::*;
use proptest::sample::select;
use prost::Message;
use serde_json::{Value, json};

/// Pods of namespace `shop` (the first three with an address and a node), as the index holds them.
fn index() -> Index {
    let mut index = Index::default();
    for (name, node, ip, account) in [
        (
            "client-5f7d9c-abcde",
            Some("node-a"),
            Some("10.0.0.1"),
            "client",
        ),
        (
            "server-77f-xyz12",
            Some("node-b"),
            Some("fd00::2"),
            "server",
        ),
        (
            "server-77f-other",
            Some("node-b"),
            Some("10.0.0.3"),
            "server",
        ),
        ("pending", None, None, "client"),
        ("no-address", Some("node-a"), None, "server"),
    ] {
        // Made from a template, as Goldmane names them (`<generateName>*`), except `no-address`.
        let generate_name = match name {
            "no-address" => String::new(),
            "pending" => "pending-".into(),
            _ => format!(
                "{}-",
                name.rsplit_once('-').map_or(name, |(prefix, _)| prefix)
            ),
        };
        let mut pod = json!({
            "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                         "generateName": generate_name, "labels": {"app": name}},
            "spec": {"serviceAccountName": account, "containers": []},
            "status": {"phase": "Running"}
        });
        if let Some(node) = node {
            pod["spec"]["nodeName"] = json!(node);
        }
        if let Some(ip) = ip {
            pod["status"]["podIP"] = json!(ip);
        }
        let pod: Pod = serde_json::from_value(pod).expect("a pod");
        index.apply_pod(&pod, 1_000);
    }
    index
}

/// Integers at the edges of i64, and any.
fn int64() -> impl Strategy<Value = i64> {
    prop_oneof![
        select(
            &[
                0,
                1,
                -1,
                53,
                8080,
                65_535,
                65_536,
                i64::MAX,
                i64::MIN,
                1_700_000_000
            ][..]
        ),
        any::<i64>(),
    ]
}

/// An enum field: a known value or any number.
fn enumeration(known: &'static [i32]) -> impl Strategy<Value = i32> {
    prop_oneof![4 => select(known), 1 => any::<i32>()]
}

fn name_text(known: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(known).prop_map(str::to_string),
        1 => text(40),
    ]
}

const ENDPOINT_NAMES: &[&str] = &[
    "client-5f7d9c-*",
    "server-77f-*",
    "pending-*",
    "no-address",
    "server-77f-xyz12",
    "nobody-*",
    "*",
    "",
];

fn policy_hit() -> impl Strategy<Value = PolicyHit> {
    let hit = || {
        (
            enumeration(&[0, 1, 2, 6, 10, 11]),
            name_text(&["shop", "", "default"]),
            name_text(&["deny-all", "", "allow-web"]),
            enumeration(&[0, 1, 2, 3]),
        )
            .prop_map(|(kind, namespace, name, action)| PolicyHit {
                kind,
                namespace,
                name,
                action,
                ..PolicyHit::default()
            })
    };
    (hit(), proptest::option::of(hit())).prop_map(|(mut hit, trigger)| {
        hit.trigger = trigger.map(Box::new);
        hit
    })
}

/// A Goldmane flow built field by field.
fn goldmane_flow() -> impl Strategy<Value = Flow> {
    const WORKLOAD: i32 = EndpointType::WorkloadEndpoint as i32;
    let key = (
        (
            name_text(ENDPOINT_NAMES),
            name_text(&["shop", "", "other"]),
            enumeration(&[WORKLOAD, WORKLOAD, 0, 2]),
        ),
        (
            name_text(ENDPOINT_NAMES),
            name_text(&["shop", "", "other"]),
            enumeration(&[WORKLOAD, WORKLOAD, 3]),
        ),
        int64(),
        name_text(&["tcp", "TCP", "6", "udp", "UDP", "17", "icmp", ""]),
        enumeration(&[Reporter::Src as i32, Reporter::Dst as i32, 0]),
        enumeration(&[
            Action::Allow as i32,
            Action::Deny as i32,
            Action::Pass as i32,
            0,
        ]),
        proptest::option::of(prop::collection::vec(policy_hit(), 0..3)),
    )
        .prop_map(
            |(source, dest, dest_port, proto, reporter, action, hits)| FlowKey {
                source_name: source.0,
                source_namespace: source.1,
                source_type: source.2,
                dest_name: dest.0,
                dest_namespace: dest.1,
                dest_type: dest.2,
                dest_port,
                proto,
                reporter,
                action,
                policies: hits.map(|enforced_policies| PolicyTrace {
                    enforced_policies,
                    pending_policies: Vec::new(),
                }),
                ..FlowKey::default()
            },
        );
    (proptest::option::of(key), int64(), int64(), int64()).prop_map(
        |(key, start_time, end_time, num_connections_started)| Flow {
            key,
            start_time,
            end_time,
            num_connections_started,
            ..Flow::default()
        },
    )
}

fn valid_goldmane_flows() -> Vec<Vec<u8>> {
    let flow = |action: Action, reporter: Reporter, proto: &str| Flow {
        key: Some(FlowKey {
            source_name: "client-5f7d9c-*".into(),
            source_namespace: "shop".into(),
            source_type: EndpointType::WorkloadEndpoint as i32,
            dest_name: "server-77f-*".into(),
            dest_namespace: "shop".into(),
            dest_type: EndpointType::WorkloadEndpoint as i32,
            dest_port: 8080,
            proto: proto.into(),
            reporter: reporter as i32,
            action: action as i32,
            policies: Some(PolicyTrace {
                enforced_policies: vec![PolicyHit {
                    kind: PolicyKind::EndOfTier as i32,
                    action: Action::Deny as i32,
                    trigger: Some(Box::new(PolicyHit {
                        kind: PolicyKind::NetworkPolicy as i32,
                        namespace: "shop".into(),
                        name: "deny-all".into(),
                        ..PolicyHit::default()
                    })),
                    ..PolicyHit::default()
                }],
                pending_policies: Vec::new(),
            }),
            ..FlowKey::default()
        }),
        start_time: 1_700_000_000,
        end_time: 1_700_000_015,
        num_connections_started: 3,
        ..Flow::default()
    };
    vec![
        flow(Action::Allow, Reporter::Dst, "tcp").encode_to_vec(),
        flow(Action::Deny, Reporter::Src, "udp").encode_to_vec(),
        flow(Action::Deny, Reporter::Dst, "6").encode_to_vec(),
    ]
}

/// Goldmane's stream, as the controller takes each flow: dedupe, then convert (names resolved against
/// the index). A converted record must read back through the ingest's own checks.
#[test]
fn goldmane_flows() {
    let index = index();
    let input = prop_oneof![
        1 => bytes(256),
        2 => goldmane_flow().prop_map(|f| f.encode_to_vec()),
        2 => mutated_bytes(valid_goldmane_flows()),
    ];
    run("goldmane", input, |data| {
        let flow = match Flow::decode(data.as_slice()) {
            Ok(flow) => flow,
            Err(e) => return clear("decode", &e.to_string()),
        };
        let mut dedupe = Dedupe::default();
        dedupe.admit(&flow);
        prop_assert!(!dedupe.admit(&flow), "a re-send of the same flow is new");
        dedupe.forget_before(flow.start_time);
        match convert(&flow, |ns, name| resolve_name(&index, ns, name)) {
            Ok((node, record)) => {
                prop_assert!(!node.is_empty());
                prop_assert!(record.last_seen_ms >= record.first_seen_ms);
                let read = fields(&record);
                prop_assert!(read.is_ok(), "{read:?} for {record:?}");
            }
            Err(skip) => clear("skip", &skip.to_string())?,
        }
        Ok(())
    });
}

const SCENARIO_WORDS: &[&str] = &[
    "namespaces",
    "pods",
    "policies",
    "flows",
    "name",
    "namespace",
    "labels",
    "ip",
    "ports",
    "containerPort",
    "protocol",
    "serviceAccount",
    "from",
    "to",
    "pod",
    "port",
    "endPort",
    "kind",
    "metadata",
    "spec",
    "podSelector",
    "namespaceSelector",
    "matchLabels",
    "matchExpressions",
    "key",
    "operator",
    "values",
    "ingress",
    "egress",
    "ipBlock",
    "cidr",
    "except",
    "policyTypes",
    "backend",
    "mode",
    "direction",
    "targetRef",
    "kubernetes",
    "istio",
    "selector",
    "rules",
    "source",
    "principals",
    "operation",
    "NetworkPolicy",
    "WorkloadNetworkPolicy",
    "Ingress",
    "Egress",
    "In",
    "NotIn",
    "Exists",
    "DoesNotExist",
    "monitor",
    "protect",
    "Deployment",
    "http",
    "demo",
    "shop",
    "demo/http-client-6c7d9f8b5-x2x7k",
];

fn scenario_samples() -> Vec<Value> {
    let yaml: Value = serde_yaml::from_str(include_str!("data/check-spec10.yaml")).unwrap();
    let json: Value = serde_json::from_str(include_str!("data/check-mixed.json")).unwrap();
    vec![yaml, json]
}

/// A document as `check --scenario` reads it: JSON, or YAML.
fn document(value: &Value, as_yaml: bool) -> String {
    if as_yaml {
        serde_yaml::to_string(value).unwrap_or_default()
    } else {
        value.to_string()
    }
}

/// `check --scenario`: parse, validate (the API server's rules for policies), evaluate every flow.
#[test]
fn check_scenarios() {
    let input = prop_oneof![
        1 => text(512),
        1 => (json(SCENARIO_WORDS), any::<bool>()).prop_map(|(v, yaml)| document(&v, yaml)),
        3 => (mutated_json(scenario_samples(), SCENARIO_WORDS), any::<bool>())
            .prop_map(|(v, yaml)| document(&v, yaml)),
    ];
    run("check_scenario", input, |text| {
        let checker = match parse_scenario(&text).and_then(Checker::new) {
            Ok(checker) => checker,
            Err(e) => {
                clear("field", &e.field)?;
                return clear("message", &e.message);
            }
        };
        let report = checker.run();
        report.render_table();
        prop_assert!(serde_json::to_string(&report).is_ok());
        Ok(())
    });
}

const RECORD_WORDS: &[&str] = &[
    "local_ip",
    "peer_ip",
    "port",
    "protocol",
    "direction",
    "outcome",
    "count",
    "first_seen",
    "last_seen",
    "outbound",
    "inbound",
    "established",
    "failed",
    "datagram",
    "10.244.0.10",
    "10.244.0.11",
];

fn record_samples() -> Vec<Value> {
    include_str!("data/records-spec10.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `check --flows-from`: agent records (JSON lines), replayed against the end-to-end scenario.
#[test]
fn check_records() {
    let scenario = parse_scenario(include_str!("data/check-spec10.yaml")).unwrap();
    let checker = Checker::new(scenario).unwrap();
    let line = prop_oneof![
        1 => json(RECORD_WORDS).prop_map(|v| v.to_string()),
        4 => mutated_json(record_samples(), RECORD_WORDS).prop_map(|v| v.to_string()),
        1 => select(record_samples()).prop_map(|v| v.to_string()),
    ];
    let input = prop_oneof![
        1 => text(512),
        4 => prop::collection::vec(line, 0..6).prop_map(|lines| lines.join("\n")),
    ];
    run("check_records", input, |text| {
        match parse_records(&text) {
            Ok(records) => {
                let report = checker.replay(&records);
                prop_assert_eq!(report.records, records.len());
                report.render_table();
            }
            Err(e) => {
                clear("field", &e.field)?;
                clear("message", &e.message)?;
            }
        }
        Ok(())
    });
}

/// A flow record built field by field: addresses of every length, ports and enums out of range,
/// names known, unknown and absurd.
fn flow_record() -> impl Strategy<Value = FlowRecord> {
    let address = prop_oneof![
        Just(vec![10, 0, 0, 1]),
        Just(vec![10, 0, 0, 3]),
        Just(
            "fd00::2"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
                .to_vec()
        ),
        bytes(20),
    ];
    let local = proptest::option::of(
        (
            name_text(&["shop", "", "other"]),
            name_text(&["client-5f7d9c-abcde", "server-77f-xyz12", "pending", ""]),
            name_text(&["uid-client-5f7d9c-abcde", "uid-pending", ""]),
        )
            .prop_map(|(namespace, name, uid)| LocalPod {
                namespace,
                name,
                uid,
            }),
    );
    let peer = proptest::option::of(
        (
            name_text(&["shop", "", "other"]),
            name_text(&["server-77f-xyz12", "no-address", "pending", ""]),
            name_text(&[
                "cluster.local/ns/shop/sa/server",
                "spiffe://cluster.local/ns/shop/sa/client",
                "cluster.local/ns/shop/sa/nobody",
                "td/ns//sa/x",
                "",
            ]),
        )
            .prop_map(|(namespace, pod, principal)| Peer {
                namespace,
                pod,
                principal,
            }),
    );
    let peer_name = name_text(&[
        "api.partner.test",
        "API.Partner.Test.",
        "*.partner.test",
        "a..b",
        "bücher.example",
        "",
    ]);
    (
        (local, address, peer, peer_name),
        (
            prop_oneof![
                select(&[0u32, 80, 65_535, 65_536, u32::MAX][..]),
                any::<u32>()
            ],
            enumeration(&[0, 1, 2]),
            enumeration(&[0, 1, 2]),
            enumeration(&[0, 1, 2, 3, 4]),
        ),
        (
            int64(),
            int64(),
            any::<u64>(),
            enumeration(&[0, 1, 2, 3, 4]),
        ),
    )
        .prop_map(
            |(
                (local, peer_ip, peer, peer_name),
                (port, protocol, direction, outcome),
                (first_seen_ms, last_seen_ms, count, source),
            )| FlowRecord {
                local,
                peer_ip,
                port,
                protocol,
                direction,
                outcome,
                first_seen_ms,
                last_seen_ms,
                count,
                source,
                peer,
                policy: String::new(),
                dry_run: false,
                peer_name,
            },
        )
}

fn valid_batches() -> Vec<Vec<u8>> {
    let record = FlowRecord {
        local: Some(LocalPod {
            namespace: "shop".into(),
            name: "client-5f7d9c-abcde".into(),
            uid: "uid-client-5f7d9c-abcde".into(),
        }),
        peer_ip: vec![10, 0, 0, 9],
        port: 8080,
        protocol: uplink::Protocol::Tcp as i32,
        direction: uplink::Direction::Outbound as i32,
        outcome: uplink::Outcome::Established as i32,
        first_seen_ms: 1_700_000_000_000,
        last_seen_ms: 1_700_000_001_000,
        count: 2,
        source: uplink::Source::Hubble as i32,
        peer: Some(Peer {
            namespace: "shop".into(),
            pod: "server-77f-xyz12".into(),
            principal: "cluster.local/ns/shop/sa/server".into(),
        }),
        policy: "shop/deny-all".into(),
        dry_run: true,
        peer_name: "api.partner.test".into(),
    };
    let batch = |records: Vec<FlowRecord>| FlowBatch {
        sequence: 7,
        node: "node-a".into(),
        records,
        instance: 0,
        health: None,
    };
    vec![
        batch(vec![record.clone()]).encode_to_vec(),
        batch(vec![record.clone(), FlowRecord::default(), record]).encode_to_vec(),
    ]
}

/// The uplink: a `FlowBatch` as the controller decodes it from an agent's stream (its records left
/// encoded), and each record decoded and read as the ingest reads it (fields, local pod, the address
/// standing for the peer).
#[test]
fn uplink_batches() {
    let index = index();
    let input = prop_oneof![
        1 => bytes(512),
        2 => (any::<u64>(), text(16), prop::collection::vec(flow_record(), 0..4))
            .prop_map(|(sequence, node, records)| FlowBatch { sequence, node, records, instance: 0, health: None }.encode_to_vec()),
        2 => mutated_bytes(valid_batches()),
    ];
    run("uplink_batch", input, |data| {
        let batch = match encoded::FlowBatch::decode(data.as_slice()) {
            Ok(batch) => batch,
            Err(e) => return clear("decode", &e.to_string()),
        };
        for bytes in &batch.records {
            let record = match FlowRecord::decode(bytes.clone()) {
                Ok(record) => record,
                Err(e) => {
                    clear("record", &e.to_string())?;
                    continue;
                }
            };
            let record = &record;
            if let Some(local) = &record.local {
                // Each part is cut at 253 characters of at most 10 escaped characters each.
                let shown = describe_local(local).chars().count();
                prop_assert!(shown <= 2 * (253 * 10 + 1) + 4, "{shown} characters");
            }
            local_pod(record, &index);
            if let Some(peer) = &record.peer {
                parse_principal(&peer.principal);
            }
            match fields(record) {
                Ok(read) => {
                    let (address, from) = peer_address(&index, record, &read, record.last_seen_ms);
                    prop_assert!(from != PeerFrom::Address || address == read.peer);
                    prop_assert!(!from.label().is_empty());
                }
                Err(e) => clear("field", &e.to_string())?,
            }
        }
        Ok(())
    });
}
