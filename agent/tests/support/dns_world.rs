//! A pod, a router and the outside, as network namespaces, for the DNS hold's kernel tests and bench:
//! the pod (`10.214.<n>.1`) reaches a resolver and TCP services on the outside namespace through the
//! router, where the agent's enforcement table and DNS hold run, as on a node. Nothing leaves the
//! namespaces.

use super::{Netns, dns_answer, dns_query, link, sh};
use network_enforcer_agent::enforce::compile::{
    Allow, IsolatedPod, NameAllowance, Peers, PortRange, Ruleset, Side,
};
use network_enforcer_agent::enforce::dns_hold::Hold;
use network_enforcer_agent::enforce::metrics::EnforcementMetrics;
use network_enforcer_api::Protocol;
use simple_dns::Packet;
use simple_dns::rdata::RData;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const ALLOWED: &str = "api.partner.test";
pub const OTHER: &str = "other.partner.test";
pub const TABLE: &str = "ne_hold_test";
pub const QUEUE: u16 = 8499;
/// The hold's query group.
pub const QUERY_GROUP: u16 = 8499;
/// Less than the first SYN retransmission (1 s): a connect that needs a retry fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(600);

/// Pod ↔ router ↔ outside (resolver and services).
pub struct World {
    pub pod: Netns,
    pub router: Netns,
    pub outside: Netns,
    pub pod_ip: Ipv4Addr,
    /// A second address of the pod's namespace that no policy selects: its DNS is not held, over the
    /// same path (for comparing with and without the hold in one run).
    pub unheld_ip: Ipv4Addr,
    /// A third address, isolated for egress as the pod is (DNS to the resolver) but allowed no
    /// names: its DNS is not held either (what the hold adds beyond enforcement, in one run).
    pub isolated_ip: Ipv4Addr,
    pub resolver: SocketAddr,
    /// What the names resolve to, and an address nobody resolves: all on `outside`.
    pub services: [Ipv4Addr; 3],
}

impl World {
    pub fn new(n: u8) -> Self {
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
        pod.ip(&["addr", "add", &format!("10.214.{n}.3/32"), "dev", "lo"]);
        pod.ip(&["addr", "add", &format!("10.214.{n}.4/32"), "dev", "lo"]);
        let services = [10, 11, 12].map(|h| Ipv4Addr::new(198, 51, 100, h));
        for s in services {
            outside.ip(&["addr", "add", &format!("{s}/32"), "dev", "lo"]);
        }
        // The addresses of the rotating names (`r<k>.rot.partner.test`), routed to the outside.
        outside.ip(&["addr", "add", "198.51.101.0/24", "dev", "lo"]);
        router.ip(&[
            "route",
            "add",
            "198.51.101.0/24",
            "via",
            &format!("10.215.{n}.2"),
        ]);
        World {
            pod,
            router,
            outside,
            pod_ip: format!("10.214.{n}.1").parse().unwrap(),
            unheld_ip: format!("10.214.{n}.3").parse().unwrap(),
            isolated_ip: format!("10.214.{n}.4").parse().unwrap(),
            resolver: format!("10.215.{n}.2:53").parse().unwrap(),
            services,
        }
    }

    /// Starts the DNS hold on the router with the pod isolated as [`World::ruleset`] says, grants
    /// lasting the TTL plus `grace`.
    pub fn hold(&self, names: &[&str], grace: Duration) -> Arc<Hold> {
        let ruleset = self.ruleset(names);
        self.router.run(move || {
            let hold = Hold::start(
                TABLE,
                QUEUE,
                QUERY_GROUP,
                grace,
                EnforcementMetrics::default(),
            )
            .expect("starting the hold");
            hold.install(&ruleset, None).expect("installing the table");
            hold
        })
    }

    /// The pod is isolated for egress: DNS to the resolver, and `names` on TCP 8443; its address
    /// [`World::isolated_ip`] the same without names.
    pub fn ruleset(&self, names: &[&str]) -> Ruleset {
        let pod = |name: &str, ip: Ipv4Addr, names: Vec<Arc<NameAllowance>>| IsolatedPod {
            namespace: "x".into(),
            name: name.into(),
            ips: vec![IpAddr::V4(ip)],
            ingress: None,
            egress: Some(Side {
                isolated: true,
                admin: vec![],
                baseline: vec![],
                policies: vec!["x/p".into()],
                allows: vec![Allow {
                    peers: Peers::Addresses(Arc::new([self.resolver.ip()].into())),
                    ports: Some(vec![PortRange {
                        protocol: Protocol::UDP,
                        first: 53,
                        last: 53,
                    }]),
                }],
                names,
            }),
        };
        let allowed = Arc::new(NameAllowance {
            names: names.iter().map(|n| n.to_string()).collect(),
            ports: vec![PortRange {
                protocol: Protocol::TCP,
                first: 8443,
                last: 8443,
            }],
        });
        Ruleset {
            pods: vec![
                pod("pod", self.pod_ip, vec![allowed]),
                pod("isolated", self.isolated_ip, vec![]),
            ],
            warnings: vec![],
        }
    }
}

/// A name standing for a service that moved to a new address: `r<k>.rot.partner.test`, `k` < 250.
pub fn rotating_name(k: u8) -> String {
    format!("r{k}.rot.partner.test")
}

/// The address [`rotating_name`] `k` resolves to: `198.51.101.<k + 1>`.
pub fn rotated(name: &str) -> Option<Ipv4Addr> {
    let k: u8 = name
        .strip_prefix('r')?
        .strip_suffix(".rot.partner.test")?
        .parse()
        .ok()?;
    Some(Ipv4Addr::new(198, 51, 101, k.checked_add(1)?))
}

/// A resolver answering `ALLOWED` with `services[0]`, a [`rotating_name`] with its [`rotated`] address and
/// any other name with `services[1]`, TTL `ttl`.
pub fn serve_dns(world: &World, ttl: u32) {
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
            let address = match name.as_str() {
                ALLOWED => services[0],
                _ => rotated(&name).unwrap_or(services[1]),
            };
            let _ = socket.send_to(&dns_answer(query.id(), &name, &[address], ttl), from);
        }
    });
}

/// A service on TCP 8443 of every outside address, accepting forever.
pub fn serve_tcp(world: &World) {
    let listener = world
        .outside
        .run(move || TcpListener::bind((Ipv4Addr::UNSPECIFIED, 8443)).unwrap());
    std::thread::spawn(move || for _ in listener.incoming() {});
}

/// The pod resolves `name` (one UDP exchange) and returns the address and how long it took.
pub fn resolve(world: &World, name: &str) -> (Ipv4Addr, Duration) {
    resolve_from(world, world.pod_ip, name)
}

/// [`resolve`] from the pod's address `pod_ip` ([`World::pod_ip`], [`World::unheld_ip`] or
/// [`World::isolated_ip`]).
pub fn resolve_from(world: &World, pod_ip: Ipv4Addr, name: &str) -> (Ipv4Addr, Duration) {
    let name = name.to_string();
    let resolver = world.resolver;
    world.pod.run(move || {
        let socket = UdpSocket::bind((pod_ip, 0)).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let query = dns_query(0x5151, &name);
        let started = Instant::now();
        socket.send_to(&query, resolver).unwrap();
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
pub fn connects(world: &World, address: Ipv4Addr) -> bool {
    world.pod.run(move || {
        TcpStream::connect_timeout(&SocketAddr::from((address, 8443)), CONNECT_TIMEOUT).is_ok()
    })
}
