//! Kernel tests of the DNS capture (`agent-ebpf/src/dns.rs`): a pod (network namespace) asks a DNS server
//! in another one over real UDP; the programs copy the query and the answer, the pod still gets its
//! answer unchanged, and the tracker believes the answer for that pod only. A spoofed answer (wrong
//! transaction id) reaches the pod too, but is not believed.
//!
//! Needs root (CI runs as root). The programs see every DNS message on the machine; the test keeps only
//! those of its own addresses.

mod support;

use network_enforcer_agent::dns::tracker::{Limits, Pod, Refused, Tracker};
use network_enforcer_agent::kernel::dns_messages::{DnsKind, DnsReader};
use network_enforcer_agent::{DataPlane, LoadOptions};
use simple_dns::rdata::{A, RData};
use simple_dns::{CLASS, Name, Packet, QCLASS, QTYPE, Question, ResourceRecord, TYPE};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;
use support::{PodPair, require_root};

const NAME: &str = "api.partner.test";

/// The programs of every loaded data plane see every DNS message on the machine: the burst would fill
/// the other test's ring. One test at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn query(id: u16) -> Vec<u8> {
    let mut packet = Packet::new_query(id);
    packet.questions.push(Question::new(
        Name::new_unchecked(NAME),
        QTYPE::TYPE(TYPE::A),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    packet.build_bytes_vec().unwrap()
}

fn answer(id: u16, addresses: &[&str]) -> Vec<u8> {
    let mut packet = Packet::new_reply(id);
    packet.questions.push(Question::new(
        Name::new_unchecked(NAME),
        QTYPE::TYPE(TYPE::A),
        QCLASS::CLASS(CLASS::IN),
        false,
    ));
    for address in addresses {
        let ip: std::net::Ipv4Addr = address.parse().unwrap();
        packet.answers.push(ResourceRecord::new(
            Name::new_unchecked(NAME),
            CLASS::IN,
            30,
            RData::A(A {
                address: u32::from(ip),
            }),
        ));
    }
    packet.build_bytes_vec().unwrap()
}

/// Drains the DNS ring until `wanted` messages of `pod_ip` were handed to `each`; fails after 10 s.
fn read(
    reader: &mut DnsReader,
    pod_ip: IpAddr,
    wanted: usize,
    mut each: impl FnMut(DnsKind, SocketAddr, SocketAddr, &[u8], Duration),
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = 0;
    while seen < wanted {
        assert!(
            std::time::Instant::now() < deadline,
            "saw {seen} of {wanted} DNS messages of {pod_ip}"
        );
        reader.drain(|m| {
            if m.local.ip() == pod_ip {
                seen += 1;
                assert!(!m.truncated);
                each(m.kind, m.local, m.server, m.payload, m.monotonic);
            }
        });
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn a_pods_query_and_its_answer_are_copied_and_only_the_matching_answer_is_believed() {
    require_root();
    let _alone = ONE_AT_A_TIME.lock().await;
    let mut data_plane = DataPlane::load(&LoadOptions::default()).expect("loading the programs");
    let mut reader = data_plane
        .dns_messages()
        .expect("the DNS ring")
        .expect("DNS capture is on by default");
    let pods = PodPair::new();
    let (client_ip, server_ip) = (pods.v4(1), pods.v4(2));
    let server_at: SocketAddr = (server_ip, 53).into();
    let server = pods.b.run(move || UdpSocket::bind(server_at).unwrap());
    let client = pods.a.run(move || UdpSocket::bind((client_ip, 0)).unwrap());
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let client_at = client.local_addr().unwrap();

    // A spoofed answer first (an id nobody asked), then the real exchange.
    client.send_to(&query(0x4242), server_at).unwrap();
    let mut buf = [0u8; 1500];
    let (n, from) = server.recv_from(&mut buf).unwrap();
    assert_eq!((n, from), (query(0x4242).len(), client_at));
    let spoofed = answer(0x1111, &["198.51.100.66"]);
    server.send_to(&spoofed, client_at).unwrap();
    let real = answer(0x4242, &["198.51.100.7", "198.51.100.8"]);
    server.send_to(&real, client_at).unwrap();
    // The pod's DNS path is unchanged: both datagrams arrive as sent.
    for sent in [&spoofed, &real] {
        let n = client.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], sent.as_slice());
    }

    let pod: Pod = "pod-a".into();
    let mut tracker = Tracker::new(Limits::default());
    let mut results = Vec::new();
    read(
        &mut reader,
        client_ip,
        3,
        |kind, local, server, payload, at| {
            assert_eq!((local, server), (client_at, server_at));
            match kind {
                DnsKind::Query => tracker.query(&pod, local, server, payload, at),
                DnsKind::Answer => results.push(tracker.answer(&pod, local, server, payload, at)),
            }
        },
    );
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[0], Err(Refused::Unsolicited), "the spoofed answer");
    let believed: Vec<IpAddr> = results[1]
        .as_ref()
        .expect("the real answer")
        .iter()
        .map(|(ip, _)| *ip)
        .collect();
    assert_eq!(
        believed,
        [
            "198.51.100.7".parse::<IpAddr>().unwrap(),
            "198.51.100.8".parse().unwrap()
        ]
    );
    let now = network_enforcer_agent::aggregate::monotonic_now();
    assert_eq!(
        tracker.name_of(&pod, "198.51.100.7".parse().unwrap(), now),
        Some(NAME)
    );
    assert_eq!(
        tracker.name_of(&pod, "198.51.100.66".parse().unwrap(), now),
        None
    );
    assert_eq!(tracker.counters().unsolicited, 1);
    let counters = data_plane.counters().unwrap();
    assert_eq!(counters.dns_truncated, 0);
}

#[tokio::test]
async fn with_dns_names_off_no_dns_program_is_attached() {
    require_root();
    let mut data_plane = DataPlane::load(&LoadOptions {
        dns: false,
        ..LoadOptions::default()
    })
    .expect("loading the programs");
    assert!(data_plane.dns_messages().unwrap().is_none());
}

/// 5,000 exchanges with nobody reading the ring: every answer ran the program, and each message was
/// either copied (and read later) or counted as dropped, nothing else. With kernel BPF statistics on,
/// prints what the programs cost per message (what a pod's DNS waits extra), e.g.
/// `sudo cargo test -p network-enforcer-agent --test dns_capture -- --nocapture`.
#[tokio::test]
async fn a_burst_is_copied_or_counted_and_its_cost_is_printed() {
    require_root();
    let _alone = ONE_AT_A_TIME.lock().await;
    const EXCHANGES: u16 = 5_000;
    let stats = "/proc/sys/kernel/bpf_stats_enabled";
    let before = std::fs::read_to_string(stats).unwrap_or_default();
    let _ = std::fs::write(stats, "1");
    let mut data_plane = DataPlane::load(&LoadOptions::default()).expect("loading the programs");
    let mut reader = data_plane.dns_messages().unwrap().unwrap();
    let pods = PodPair::new();
    let (client_ip, server_ip) = (pods.v4(1), pods.v4(2));
    let server_at: SocketAddr = (server_ip, 53).into();
    let server = pods.b.run(move || UdpSocket::bind(server_at).unwrap());
    let client = pods.a.run(move || UdpSocket::bind((client_ip, 0)).unwrap());
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let client_at = client.local_addr().unwrap();
    let mut buf = [0u8; 1500];
    for id in 0..EXCHANGES {
        client.send_to(&query(id), server_at).unwrap();
        server.recv_from(&mut buf).unwrap();
        server
            .send_to(&answer(id, &["198.51.100.7"]), client_at)
            .unwrap();
        client.recv(&mut buf).unwrap();
    }
    let mut ours = 0u64;
    reader.drain(|m| {
        if m.local.ip() == client_ip {
            ours += 1;
        }
    });
    let counters = data_plane.counters().unwrap();
    let _ = std::fs::write(stats, before.trim());
    // Other DNS on the machine may share the ring: ours read plus all dropped covers ours sent.
    assert!(
        ours + counters.dns_ring_buffer_full >= 2 * u64::from(EXCHANGES),
        "read {ours}, dropped {}",
        counters.dns_ring_buffer_full
    );
    assert!(
        ours > 0 && counters.dns_ring_buffer_full > 0,
        "a 1 MiB ring holds ~800 messages"
    );
    for program in ["dns_queries", "dns_answers"] {
        let cost = counters.programs.get(program).copied().unwrap_or_default();
        if cost.runs > 0 {
            eprintln!(
                "{program}: {} runs, {:.0} ns per run (kernel BPF statistics)",
                cost.runs,
                cost.run_ns as f64 / cost.runs as f64
            );
        }
    }
}
