//! Kernel tests of the DNS hold (`agent/src/enforce/dns_hold`), with real packets through a real
//! enforcement table: a pod (network namespace) reaches a resolver and outside services (another
//! namespace) through a router namespace where the agent's table and hold run, as on a node.
//!
//! The pod asks for a name its policy allows and connects at once: the first SYN must go through (no
//! retransmission: the connect has less time than the 1 s SYN retry). A name the policy does not allow
//! and an address nobody resolved stay blocked; a grant ends at the TTL plus the grace.
//!
//! Needs root (CI runs as root). Nothing leaves the test's namespaces.

mod support;

use network_enforcer_agent::enforce::compile::{
    Allow, IsolatedPod, NameAllowance, Peers, PortRange, Ruleset, Side,
};
use network_enforcer_agent::enforce::dns_hold::Hold;
use network_enforcer_agent::enforce::watch::EnforcementMetrics;
use network_enforcer_api::Protocol;
use simple_dns::rdata::{A, RData};
use simple_dns::{CLASS, Name, Packet, QCLASS, QTYPE, Question, ResourceRecord, TYPE};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Netns, link, require_root, sh};

const ALLOWED: &str = "api.partner.test";
const OTHER: &str = "other.partner.test";
const TABLE: &str = "ne_hold_test";
const QUEUE: u16 = 8499;
/// Less than the first SYN retransmission (1 s): a connect that needs a retry fails.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(600);

/// Pod ↔ router ↔ outside (resolver and services).
struct World {
    pod: Netns,
    router: Netns,
    outside: Netns,
    pod_ip: Ipv4Addr,
    resolver: SocketAddr,
    /// What the names resolve to, and an address nobody resolves: all on `outside`.
    services: [Ipv4Addr; 3],
}

impl World {
    fn new(n: u8) -> Self {
        let (pod, router, outside) = (Netns::new(), Netns::new(), Netns::new());
        link(
            &pod,
            &router,
            &format!("10.214.{n}"),
            &format!("fd00:214:{n}:"),
        );
        link(
            &router,
            &outside,
            &format!("10.215.{n}"),
            &format!("fd00:215:{n}:"),
        );
        pod.ip(&["route", "add", "default", "via", &format!("10.214.{n}.2")]);
        outside.ip(&[
            "route",
            "add",
            &format!("10.214.{n}.0/24"),
            "via",
            &format!("10.215.{n}.1"),
        ]);
        router.ip(&[
            "route",
            "add",
            "198.51.100.0/24",
            "via",
            &format!("10.215.{n}.2"),
        ]);
        sh(
            "ip",
            &[
                "netns",
                "exec",
                &router.name,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ],
        );
        let services = [10, 11, 12].map(|h| Ipv4Addr::new(198, 51, 100, h));
        for s in services {
            outside.ip(&["addr", "add", &format!("{s}/32"), "dev", "lo"]);
        }
        World {
            pod,
            router,
            outside,
            pod_ip: format!("10.214.{n}.1").parse().unwrap(),
            resolver: format!("10.215.{n}.2:53").parse().unwrap(),
            services,
        }
    }

    /// The pod is isolated for egress: DNS to the resolver, and `ALLOWED` on TCP 8443 by name.
    fn ruleset(&self) -> Ruleset {
        Ruleset {
            pods: vec![IsolatedPod {
                namespace: "x".into(),
                name: "pod".into(),
                ips: vec![IpAddr::V4(self.pod_ip)],
                ingress: None,
                egress: Some(Side {
                    policies: vec!["x/p".into()],
                    allows: vec![Allow {
                        peers: Peers::Addresses(Arc::new([self.resolver.ip()].into())),
                        ports: Some(vec![PortRange {
                            protocol: Protocol::UDP,
                            first: 53,
                            last: 53,
                        }]),
                    }],
                    names: vec![Arc::new(NameAllowance {
                        names: vec![ALLOWED.into()],
                        ports: vec![PortRange {
                            protocol: Protocol::TCP,
                            first: 8443,
                            last: 8443,
                        }],
                    })],
                }),
            }],
            warnings: vec![],
        }
    }
}

/// A resolver answering `ALLOWED` with `services[0]` and `OTHER` with `services[1]`, TTL `ttl`.
fn serve_dns(world: &World, ttl: u32) {
    let at = world.resolver;
    let services = world.services;
    let socket = world.outside.run(move || UdpSocket::bind(at).unwrap());
    std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            let Ok(query) = Packet::parse(&buf[..n]) else {
                continue;
            };
            let Some(question) = query.questions.first() else {
                continue;
            };
            let name = question.qname.to_string();
            let address = if name == ALLOWED {
                services[0]
            } else {
                services[1]
            };
            let mut reply = Packet::new_reply(query.id());
            reply.questions.push(Question::new(
                Name::new_unchecked(&name).into_owned(),
                QTYPE::TYPE(TYPE::A),
                QCLASS::CLASS(CLASS::IN),
                false,
            ));
            reply.answers.push(ResourceRecord::new(
                Name::new_unchecked(&name).into_owned(),
                CLASS::IN,
                ttl,
                RData::A(A {
                    address: u32::from(address),
                }),
            ));
            let _ = socket.send_to(&reply.build_bytes_vec().unwrap(), from);
        }
    });
}

/// Services on TCP 8443 of every outside address, accepting forever.
fn serve_tcp(world: &World) {
    for address in world.services {
        let listener = world
            .outside
            .run(move || TcpListener::bind((address, 8443)).unwrap());
        std::thread::spawn(move || for _ in listener.incoming() {});
    }
}

/// The pod resolves `name` (one UDP exchange) and returns the address and how long it took.
fn resolve(world: &World, name: &'static str) -> (Ipv4Addr, Duration) {
    let (pod_ip, resolver) = (world.pod_ip, world.resolver);
    world.pod.run(move || {
        let socket = UdpSocket::bind((pod_ip, 0)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let mut query = Packet::new_query(0x5151);
        query.questions.push(Question::new(
            Name::new_unchecked(name),
            QTYPE::TYPE(TYPE::A),
            QCLASS::CLASS(CLASS::IN),
            false,
        ));
        let started = Instant::now();
        socket
            .send_to(&query.build_bytes_vec().unwrap(), resolver)
            .unwrap();
        let mut buf = [0u8; 1500];
        let n = socket.recv(&mut buf).expect("the answer");
        let took = started.elapsed();
        let answer = Packet::parse(&buf[..n]).unwrap();
        match &answer.answers[0].rdata {
            RData::A(a) => (Ipv4Addr::from(a.address), took),
            other => panic!("{other:?}"),
        }
    })
}

/// Whether the pod connects to `address`:8443 within [`CONNECT_TIMEOUT`].
fn connects(world: &World, address: Ipv4Addr) -> bool {
    world.pod.run(move || {
        TcpStream::connect_timeout(&SocketAddr::from((address, 8443)), CONNECT_TIMEOUT).is_ok()
    })
}

#[test]
fn an_allowed_names_address_is_reachable_at_once_and_until_the_ttl_plus_grace_only() {
    require_root();
    let world = World::new(1);
    serve_dns(&world, 1);
    serve_tcp(&world);
    let ruleset = world.ruleset();
    let hold = world.router.run(move || {
        let hold = Hold::start(
            TABLE,
            QUEUE,
            Duration::from_secs(1),
            EnforcementMetrics::default(),
        )
        .expect("starting the hold");
        hold.install(&ruleset, None).expect("installing the table");
        hold
    });

    // Nothing resolved yet: the service is blocked.
    let [service, other, literal] = world.services;
    assert!(!connects(&world, service), "reachable before any answer");

    // Resolved from the allowed name: the very first SYN goes through.
    let (address, took) = resolve(&world, ALLOWED);
    assert_eq!(address, service);
    assert!(
        connects(&world, service),
        "first connection after the answer failed"
    );
    eprintln!("answer with a new grant took {took:?} end to end");
    // The same answer again: nothing new to install.
    let (_, again) = resolve(&world, ALLOWED);
    eprintln!("answer with nothing new took {again:?} end to end");

    // A name the policy does not allow, and an address nobody resolved: blocked.
    assert_eq!(resolve(&world, OTHER).0, other);
    assert!(!connects(&world, other), "a name the policy does not allow");
    assert!(
        !connects(&world, literal),
        "an address literal nobody resolved"
    );

    // TTL 1 s plus grace 1 s: gone after that (the kernel's timeout, no agent action needed).
    std::thread::sleep(Duration::from_millis(2_500));
    assert!(
        !connects(&world, service),
        "still reachable after the TTL plus the grace"
    );
    drop(hold);
}

#[test]
fn without_a_reader_the_queue_rule_lets_dns_through() {
    require_root();
    use network_enforcer_agent::enforce::dns_hold::queue_rule::{self, Family};
    let world = World::new(2);
    serve_dns(&world, 30);
    // The rule, with nobody reading its queue (an agent that stopped).
    let script = "table inet t {\n chain hold {\n }\n chain forward {\n  type filter hook forward priority filter; policy accept;\n  udp sport 53 jump hold\n }\n}\n";
    let mut nft = std::process::Command::new("ip")
        .args(["netns", "exec", &world.router.name, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut nft.stdin.take().unwrap(), script.as_bytes()).unwrap();
    assert!(nft.wait().unwrap().success());
    world
        .router
        .run(|| queue_rule::append(Family::Inet, "t", "hold", QUEUE))
        .expect("the queue rule");
    let (address, took) = resolve(&world, ALLOWED);
    assert_eq!(address, world.services[0]);
    assert!(took < Duration::from_secs(1), "{took:?}");
}
