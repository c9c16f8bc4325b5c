//! Fuzzing the agent's readers of hostile input (docs/development.md, "Fuzzing"): ztunnel log lines,
//! Hubble flows, DNS responses, and the debug socket's protocol (the request a client sends the running agent, and
//! the lines `flows` reads back). Each target must not panic and must answer a value or an error that
//! says something. `NE_FUZZ_CASES` sets the cases per target; `cargo xtask fuzz` runs 100,000 in
//! release.

// The hostile-input strategies and the runner are shared with the controller's fuzz tests.
#[path = "../../controller/tests/hostile/mod.rs"]
mod hostile;

use hostile::{bytes, clear, json, mutated_bytes, mutated_json, run, text};
use network_enforcer_agent::debug::socket::{DebugServer, EdgeRecord, EventRecord, Line, Request};
use network_enforcer_agent::sources::hubble::{self, Resume};
use network_enforcer_agent::sources::ztunnel::{Correlator, parse_line};
use network_enforcer_agent::{ConnectionEvent, Direction, Outcome, Protocol};
use network_enforcer_api::hubble::{
    Endpoint, Flow, Ip, Layer4, Policy, Sctp, Tcp, TrafficDirection, Udp, Verdict, layer4,
};
use network_enforcer_api::uplink::FlowRecord;
use proptest::prelude::*;
use proptest::sample::select;
use proptest::test_runner::TestCaseError;
use prost::Message;
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// What every converted record must be: an address of 4 or 16 bytes, a port that fits.
fn sane(record: &FlowRecord) -> Result<(), TestCaseError> {
    prop_assert!(
        matches!(record.peer_ip.len(), 4 | 16),
        "peer_ip {:?}",
        record.peer_ip
    );
    prop_assert!(record.local.is_some(), "{record:?} names no local pod");
    Ok(())
}

const ZTUNNEL_WORDS: &[&str] = &[
    "level",
    "time",
    "scope",
    "message",
    "access",
    "ztunnel::state",
    "connection complete",
    "connection failed",
    "deny policy match",
    "dry-run: deny policy match",
    "dry-run: no allow policies match",
    "no allow policies matched",
    "dry-run deny policy match",
    "policy",
    "proxy",
    "wl",
    "inbound",
    "peer",
    "direction",
    "src.addr",
    "dst.addr",
    "dst.hbone_addr",
    "dst.namespace",
    "dst.workload",
    "src.namespace",
    "src.workload",
    "src.identity",
    "dst.identity",
    "error",
    "connection closed due to policy rejection: explicitly denied by: shop/deny",
    "connection closed due to policy rejection: ",
    "shop/catalog-5d4b8c7f9-q7r2m",
    "10.244.1.7:51240",
];

fn ztunnel_samples() -> Vec<&'static str> {
    [
        include_str!("data/ztunnel/access-and-authz.jsonl"),
        include_str!("data/ztunnel/connection-failed.jsonl"),
        include_str!("data/ztunnel/old-1.29.jsonl"),
    ]
    .iter()
    .flat_map(|file| file.lines())
    .filter(|line| !line.trim().is_empty())
    .collect()
}

/// ztunnel's JSON log lines, several per case through one correlator as the reader feeds them.
#[test]
fn ztunnel_lines() {
    let samples = ztunnel_samples();
    let values: Vec<Value> = samples
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON sample"))
        .collect();
    let line = prop_oneof![
        1 => text(300),
        1 => json(ZTUNNEL_WORDS).prop_map(|v| v.to_string()),
        4 => mutated_json(values, ZTUNNEL_WORDS).prop_map(|v| v.to_string()),
        2 => mutated_bytes(samples.iter().map(|l| l.as_bytes().to_vec()).collect())
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        1 => select(samples).prop_map(str::to_string),
    ];
    run("ztunnel", prop::collection::vec(line, 1..6), |lines| {
        let mut correlator = Correlator::default();
        for line in &lines {
            match parse_line(line) {
                Ok(event) => {
                    for record in correlator.push(event) {
                        sane(&record)?;
                    }
                }
                Err(e) => clear("line", &e.to_string())?,
            }
        }
        for record in correlator.expire(i64::MAX) {
            sane(&record)?;
        }
        prop_assert_eq!(correlator.pending(), 0);
        Ok(())
    });
}

fn endpoint() -> impl Strategy<Value = Option<Endpoint>> {
    let name = |known: &'static [&'static str]| prop_oneof![4 => select(known).prop_map(str::to_string), 1 => text(20)];
    proptest::option::of(
        (name(&["shop", ""]), name(&["web-1", "catalog-1", ""])).prop_map(
            |(namespace, pod_name)| Endpoint {
                namespace,
                pod_name,
                ..Endpoint::default()
            },
        ),
    )
}

fn address() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(&["10.0.0.1", "10.0.0.2", "fd00::2", "", "10.0.0", "::ffff:1.2.3.4", "x"][..])
            .prop_map(str::to_string),
        1 => text(40),
    ]
}

fn enumeration(known: &'static [i32]) -> impl Strategy<Value = i32> {
    prop_oneof![4 => select(known), 1 => any::<i32>()]
}

/// A Hubble flow built field by field: verdicts, drop reasons and directions known and unknown,
/// addresses that parse and do not, missing parts, times at the edges.
fn hubble_flow() -> impl Strategy<Value = Flow> {
    let time = proptest::option::of(
        (
            prop_oneof![
                select(&[0i64, 1_700_000_000, i64::MAX, i64::MIN, -1][..]),
                any::<i64>()
            ],
            any::<i32>(),
        )
            .prop_map(|(seconds, nanos)| prost_types::Timestamp { seconds, nanos }),
    );
    let port = prop_oneof![
        select(&[0u32, 80, 65_535, 65_536, u32::MAX][..]),
        any::<u32>()
    ];
    let l4 = proptest::option::of(prop_oneof![
        (port.clone(), any::<u32>()).prop_map(|(destination_port, source_port)| {
            layer4::Protocol::Tcp(Tcp {
                source_port,
                destination_port,
                flags: None,
            })
        }),
        (port.clone(), any::<u32>()).prop_map(|(destination_port, source_port)| {
            layer4::Protocol::Udp(Udp {
                source_port,
                destination_port,
            })
        }),
        port.prop_map(|destination_port| layer4::Protocol::Sctp(Sctp {
            source_port: 0,
            destination_port,
        })),
    ])
    .prop_map(|protocol| Layer4 { protocol });
    let l4 = proptest::option::of(l4);
    let policies = prop::collection::vec(
        (text(10), text(10)).prop_map(|(namespace, name)| Policy {
            namespace,
            name,
            ..Policy::default()
        }),
        0..2,
    );
    (
        (
            time,
            enumeration(&[Verdict::Forwarded as i32, Verdict::Dropped as i32, 0, 3]),
            prop_oneof![select(&[0u32, 133, 181, 5][..]), any::<u32>()],
            enumeration(&[0, 133, 181, 5]),
        ),
        (
            proptest::option::of((address(), address()).prop_map(|(source, destination)| Ip {
                source,
                destination,
                ..Ip::default()
            })),
            endpoint(),
            endpoint(),
            enumeration(&[
                TrafficDirection::Ingress as i32,
                TrafficDirection::Egress as i32,
                0,
            ]),
        ),
        (
            l4,
            select(&["node-a", "cluster/node-a", "node-b", ""][..]),
            proptest::option::of(any::<bool>()),
            any::<bool>(),
            policies,
            text(8),
        ),
    )
        .prop_map(
            |(
                (time, verdict, drop_reason, drop_reason_desc),
                (ip, source, destination, traffic_direction),
                (l4, node, is_reply, reply, denied_by, uuid),
            )| Flow {
                time,
                verdict,
                drop_reason,
                drop_reason_desc,
                ip,
                source,
                destination,
                traffic_direction,
                l4,
                node_name: node.to_string(),
                is_reply,
                reply,
                egress_denied_by: denied_by.clone(),
                ingress_denied_by: denied_by,
                uuid,
                ..Flow::default()
            },
        )
}

fn valid_hubble_flows() -> Vec<Vec<u8>> {
    let flow = |verdict: Verdict, direction: TrafficDirection, udp: bool| Flow {
        time: Some(prost_types::Timestamp {
            seconds: 1_700_000_000,
            nanos: 5,
        }),
        uuid: "9b1c".into(),
        verdict: verdict as i32,
        drop_reason_desc: if verdict == Verdict::Dropped { 133 } else { 0 },
        ip: Some(Ip {
            source: "10.0.0.1".into(),
            destination: "fd00::2".into(),
            ..Ip::default()
        }),
        l4: Some(Layer4 {
            protocol: Some(if udp {
                layer4::Protocol::Udp(Udp {
                    source_port: 40_000,
                    destination_port: 53,
                })
            } else {
                layer4::Protocol::Tcp(Tcp {
                    source_port: 40_000,
                    destination_port: 8080,
                    flags: None,
                })
            }),
        }),
        source: Some(Endpoint {
            namespace: "shop".into(),
            pod_name: "web-1".into(),
            ..Endpoint::default()
        }),
        destination: Some(Endpoint {
            namespace: "shop".into(),
            pod_name: "catalog-1".into(),
            ..Endpoint::default()
        }),
        traffic_direction: direction as i32,
        node_name: "node-a".into(),
        ingress_denied_by: vec![Policy {
            namespace: "shop".into(),
            name: "deny".into(),
            ..Policy::default()
        }],
        ..Flow::default()
    };
    vec![
        flow(Verdict::Forwarded, TrafficDirection::Egress, false).encode_to_vec(),
        flow(Verdict::Dropped, TrafficDirection::Ingress, false).encode_to_vec(),
        flow(Verdict::Forwarded, TrafficDirection::Ingress, true).encode_to_vec(),
    ]
}

/// Hubble's `GetFlows` responses as the source decodes and converts them (local socket and Relay),
/// and the resume point kept across reconnects.
#[test]
fn hubble_flows() {
    let input = prop_oneof![
        1 => bytes(512),
        2 => hubble_flow().prop_map(|f| f.encode_to_vec()),
        2 => mutated_bytes(valid_hubble_flows()),
    ];
    run("hubble", input, |data| {
        let flow = match Flow::decode(data.as_slice()) {
            Ok(flow) => flow,
            Err(e) => return clear("decode", &e.to_string()),
        };
        for node in [None, Some("node-a")] {
            match hubble::convert(&flow, node) {
                Ok(record) => sane(&record)?,
                Err(skip) => clear("skip", &skip.to_string())?,
            }
        }
        let mut resume = Resume::default();
        resume.take(&flow);
        prop_assert!(
            flow.time.is_none() || !resume.take(&flow),
            "a flow taken twice"
        );
        Ok(())
    });
}

fn event() -> ConnectionEvent {
    ConnectionEvent {
        monotonic: Duration::from_secs(1),
        protocol: Protocol::Tcp,
        direction: Direction::Outbound,
        outcome: Outcome::Established,
        local: "10.0.0.1:40000".parse().unwrap(),
        remote: "10.0.0.2:8080".parse().unwrap(),
        netns_ino: Some(4026532178),
        cgroup_id: Some(7),
        pid: Some(42),
        error: None,
        count: 1,
    }
}

/// A line the agent sends, as JSON values to mutate.
fn line_samples() -> Vec<Value> {
    let mut record = EventRecord::from(&event());
    record.pod = Some("shop/web-1".into());
    let lines = [
        Line::Event(record.clone()),
        Line::Edge(EdgeRecord {
            edge: record,
            first_seen_ns: 5,
            total: 3,
        }),
        Line::HistoryEnd { incomplete: true },
        Line::Lagged(4),
    ];
    lines
        .iter()
        .map(|l| serde_json::to_value(l).expect("a line serializes"))
        .collect()
}

const SOCKET_WORDS: &[&str] = &[
    "since_ns",
    "event",
    "edge",
    "history_end",
    "incomplete",
    "lagged",
    "monotonic_ns",
    "protocol",
    "direction",
    "outcome",
    "local",
    "remote",
    "first_seen_ns",
    "total",
    "count",
    "pod",
    "tcp",
    "udp",
    "outbound",
    "inbound",
    "established",
    "failed",
    "datagram",
    "10.0.0.1:40000",
    "[fd00::1]:53",
];

/// One connection to the running debug socket: sends `request` as the first line, then reads until
/// the first live event (publishing until the server has subscribed this client). The connection ends
/// early when the server's task for it died.
async fn exchange(
    server: &DebugServer,
    path: &std::path::Path,
    request: &str,
) -> Result<(), String> {
    let stream = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (read, mut write) = stream.into_split();
    // Written while the answer is read: the server stops reading a request past its 4 KiB, so the
    // rest of a longer one never leaves this side (and waiting for it would wait forever).
    let line = format!("{request}\n");
    let send = async move {
        match write.write_all(line.as_bytes()).await {
            Ok(()) => std::future::pending().await,
            Err(e) => e,
        }
    };
    tokio::pin!(send);
    let mut lines = BufReader::new(read).lines();
    let event = event();
    loop {
        server.publish(&[event], |_| {
            network_enforcer_agent::debug::socket::Attributed::default()
        });
        tokio::select! {
            biased;
            e = &mut send => return Err(format!("write: {e}")),
            line = lines.next_line() => match line {
                Ok(Some(text)) => match serde_json::from_str::<Line>(&text) {
                    Ok(Line::Event(_)) => return Ok(()),
                    Ok(_) => {}
                    Err(e) => return Err(format!("the agent sent an unreadable line {text:?}: {e}")),
                },
                Ok(None) => return Err("the agent closed the connection".into()),
                Err(e) => return Err(format!("read: {e}")),
            },
            // Lets the server accept, read the request and subscribe.
            () = tokio::task::yield_now() => {}
        }
    }
}

/// The debug socket: hostile request lines to the real server (it must keep serving them live
/// events), and hostile agent lines read the way `flows` reads them.
#[test]
fn debug_socket() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("agent.sock");
    let server = runtime
        .block_on(async { DebugServer::bind(&path, 64) })
        .expect("the debug socket binds");
    let valid_requests = vec![
        serde_json::to_value(Request {
            since_ns: Some(1_000_000_000),
            pids: true,
        })
        .unwrap(),
        serde_json::to_value(Request::default()).unwrap(),
    ];
    let request = prop_oneof![
        1 => text(200),
        1 => json(SOCKET_WORDS).prop_map(|v| v.to_string()),
        2 => mutated_json(valid_requests, SOCKET_WORDS).prop_map(|v| v.to_string()),
    ]
    .prop_map(|r| r.replace('\n', " "));
    let reply = prop_oneof![
        1 => text(200),
        1 => json(SOCKET_WORDS).prop_map(|v| v.to_string()),
        4 => mutated_json(line_samples(), SOCKET_WORDS).prop_map(|v| v.to_string()),
    ];
    run("debug_socket", (request, reply), |(request, reply)| {
        let answered = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), exchange(&server, &path, &request)).await
        });
        match answered {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(TestCaseError::fail(format!("request {request:?}: {e}"))),
            Err(_) => {
                return Err(TestCaseError::fail(format!(
                    "request {request:?}: no event within 10 s"
                )));
            }
        }
        // As `flows` reads the agent's lines: unreadable lines and unknown values are skipped.
        match serde_json::from_str::<Line>(&reply) {
            Ok(Line::Edge(record)) => {
                if let Err(e) = record.into_edge() {
                    clear("edge", &e)?;
                }
            }
            Ok(Line::Event(record)) => {
                if let Err(e) = ConnectionEvent::try_from(record) {
                    clear("event", &e)?;
                }
            }
            Ok(Line::HistoryEnd { .. } | Line::Lagged(_)) => {}
            Err(e) => clear("line", &e.to_string())?,
        }
        Ok(())
    });
}

/// DNS responses as the pods receive them, some truncated or spliced: a CNAME chain, A and AAAA
/// records, a negative answer.
fn valid_dns_responses() -> Vec<Vec<u8>> {
    use simple_dns::rdata::{A, AAAA, CNAME, RData};
    use simple_dns::{CLASS, Name, Packet, QCLASS, QTYPE, Question, ResourceRecord, TYPE};
    let response = |id: u16, name: &'static str, records: Vec<(&'static str, RData<'static>)>| {
        let mut packet = Packet::new_reply(id);
        packet.questions.push(Question::new(
            Name::new_unchecked(name),
            QTYPE::TYPE(TYPE::A),
            QCLASS::CLASS(CLASS::IN),
            false,
        ));
        for (owner, data) in records {
            packet.answers.push(ResourceRecord::new(
                Name::new_unchecked(owner),
                CLASS::IN,
                30,
                data,
            ));
        }
        packet.build_bytes_vec_compressed().unwrap()
    };
    vec![
        response(
            1,
            "api.example.com",
            vec![
                (
                    "api.example.com",
                    RData::CNAME(CNAME(Name::new_unchecked("edge.example.net"))),
                ),
                (
                    "edge.example.net",
                    RData::A(A {
                        address: 0xc000_020a,
                    }),
                ),
                (
                    "edge.example.net",
                    RData::AAAA(AAAA {
                        address: 0x2001_0db8 << 96,
                    }),
                ),
            ],
        ),
        response(2, "gone.example.com", vec![]),
    ]
}

/// DNS responses the agent reads from pods' sockets, alone and against the query tracker.
#[test]
fn dns_responses() {
    use network_enforcer_agent::dns::answer::read_answer;
    use network_enforcer_agent::dns::tracker::{Limits, Tracker};
    let input = prop_oneof![
        1 => bytes(600),
        3 => mutated_bytes(valid_dns_responses()),
    ];
    run("dns", input, |data| {
        match read_answer(&data) {
            Ok(answer) => {
                prop_assert!(answer.name.len() <= 253);
                prop_assert!(answer.addresses.len() <= 64 * 9);
            }
            Err(e) => clear("answer", &e.to_string())?,
        }
        // As a query and then as its own answer: no panic, and nothing believed beyond the bounds.
        let mut tracker = Tracker::new(Limits::default());
        let (pod, client, server) = (
            "pod".into(),
            "10.244.0.5:4000".parse().unwrap(),
            "10.96.0.10:53".parse().unwrap(),
        );
        let now = network_enforcer_agent::clock::monotonic_now();
        tracker.query(&pod, client, server, &data, now);
        if let Err(e) = tracker.answer(&pod, client, server, &data, now) {
            clear("tracker", &e.to_string())?;
        }
        Ok(())
    });
}
