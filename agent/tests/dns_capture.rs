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
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;
use support::{PodPair, dns_answer, dns_query, require_root};

const NAME: &str = "api.partner.test";

/// The programs of every loaded data plane see every DNS message on the machine: the burst would fill
/// the other test's ring. One test at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn query(id: u16) -> Vec<u8> {
    dns_query(id, NAME)
}

fn answer(id: u16, addresses: &[&str]) -> Vec<u8> {
    let addresses: Vec<Ipv4Addr> = addresses.iter().map(|a| a.parse().unwrap()).collect();
    dns_answer(id, NAME, &addresses, 30)
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
    let now = network_enforcer_agent::clock::monotonic_now();
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

/// A pod querying 100,000 random subdomains (each answered) while another pod resolves a name once:
/// the spraying pod fills only its own room in the tracker (bounded, the rest counted), the kernel's
/// ring drops what it cannot hold (counted), nothing panics, and the other pod's answer is believed.
#[tokio::test]
async fn a_pod_spraying_random_subdomains_is_bounded_and_the_others_learning_goes_on() {
    require_root();
    let _alone = ONE_AT_A_TIME.lock().await;
    const SPRAY: u32 = 100_000;
    let mut data_plane = DataPlane::load(&LoadOptions::default()).expect("loading the programs");
    let mut reader = data_plane.dns_messages().unwrap().unwrap();
    let pods = PodPair::new();
    let (sprayer_ip, server_ip) = (pods.v4(1), pods.v4(2));
    let server_at: SocketAddr = (server_ip, 53).into();
    let server = pods.b.run(move || UdpSocket::bind(server_at).unwrap());
    let sprayer = pods
        .a
        .run(move || UdpSocket::bind((sprayer_ip, 0)).unwrap());
    // The well-behaved pod: another socket of another "pod" address on the same side.
    pods.a.ip(&[
        "addr",
        "add",
        &format!("10.201.{}.3/32", pods.subnet),
        "dev",
        "lo",
    ]);
    let quiet_ip: IpAddr = format!("10.201.{}.3", pods.subnet).parse().unwrap();
    let quiet = pods.a.run(move || UdpSocket::bind((quiet_ip, 0)).unwrap());
    for s in [&sprayer, &quiet, &server] {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    }
    let (sprayer_at, quiet_at) = (sprayer.local_addr().unwrap(), quiet.local_addr().unwrap());

    let limits = Limits::default();
    let mut tracker = Tracker::new(limits.clone());
    let (sprayer_pod, quiet_pod): (Pod, Pod) = ("sprayer".into(), "quiet".into());
    let mut read_ours = 0u64;
    let mut drain = |reader: &mut DnsReader, tracker: &mut Tracker| {
        reader.drain(|m| {
            let pod = match m.local.ip() {
                ip if ip == sprayer_ip => &sprayer_pod,
                ip if ip == quiet_ip => &quiet_pod,
                _ => return,
            };
            read_ours += 1;
            match m.kind {
                DnsKind::Query => tracker.query(pod, m.local, m.server, m.payload, m.monotonic),
                DnsKind::Answer => {
                    let _ = tracker.answer(pod, m.local, m.server, m.payload, m.monotonic);
                }
            }
        });
    };
    let mut buf = [0u8; 1500];
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for i in 0..SPRAY {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let name = format!("{rng:016x}.spray.test");
        let id = i as u16;
        sprayer.send_to(&dns_query(id, &name), server_at).unwrap();
        server.recv_from(&mut buf).unwrap();
        let address = Ipv4Addr::new(198, 18, ((i >> 8) & 0xff) as u8, (i & 0xff) as u8);
        server
            .send_to(&dns_answer(id, &name, &[address], 30), sprayer_at)
            .unwrap();
        sprayer.recv(&mut buf).unwrap();
        if i == SPRAY / 2 {
            // Halfway through the spray, the quiet pod resolves its name once.
            quiet.send_to(&query(0x0707), server_at).unwrap();
            server.recv_from(&mut buf).unwrap();
            server
                .send_to(&answer(0x0707, &["198.51.100.9"]), quiet_at)
                .unwrap();
            quiet.recv(&mut buf).unwrap();
        }
        if i % 200 == 199 {
            drain(&mut reader, &mut tracker);
        }
    }
    // Until the quiet pod's two messages were read (the ring may still hold some).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let at = network_enforcer_agent::clock::monotonic_now();
    while tracker
        .name_of(&quiet_pod, "198.51.100.9".parse().unwrap(), at)
        .is_none()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the quiet pod's answer was not believed during the spray: {:?}",
            tracker.counters()
        );
        drain(&mut reader, &mut tracker);
        std::thread::sleep(Duration::from_millis(20));
    }
    let counters = tracker.counters().clone();
    let dropped = data_plane.counters().unwrap().dns_ring_buffer_full;
    eprintln!(
        "spray of {SPRAY} exchanges: {read_ours} messages read, {dropped} dropped by the ring, \
         tracker {counters:?}, {} resolutions held",
        tracker.resolved()
    );
    // Bounded: the sprayer holds at most its own room, the quiet pod its one address.
    assert!(
        tracker.resolved() <= limits.names_per_pod + 1,
        "{} resolutions held",
        tracker.resolved()
    );
    assert!(
        counters.names_full > 0,
        "the sprayer's excess is counted: {counters:?}"
    );
    // Everything the sprayer sent was read or counted as dropped by the ring.
    assert!(
        read_ours + dropped >= 2 * u64::from(SPRAY),
        "read {read_ours}, dropped {dropped}"
    );
}
