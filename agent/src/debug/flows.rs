//! The node-level `flows` view: filtering aggregated edges and printing them as a table (like
//! `hubble observe`) or as JSON lines.

use crate::aggregate::{Edge, EdgeKey};
use crate::clock::WallClock;
use crate::identity::attribution::Owner;
use crate::kernel::events::{Direction, Outcome, Protocol};
use crate::pipeline::Flushed;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Which edges to show; `None` matches anything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowFilter {
    /// The local pod's namespace.
    pub namespace: Option<String>,
    /// The local pod's name (`name`, or `namespace/name`).
    pub pod: Option<String>,
    /// The service port (peer port of outbound edges, local port of inbound ones).
    pub port: Option<u16>,
    /// TCP or UDP.
    pub protocol: Option<Protocol>,
    /// Outbound or inbound.
    pub direction: Option<Direction>,
    /// Established, failed or datagram.
    pub outcome: Option<Outcome>,
}

impl FlowFilter {
    /// Whether `key` passes every set criterion; `pod` is the local pod's label (`namespace/name`, or
    /// `uid:<UID>` when only the UID is known), if the local side is a pod.
    pub fn matches(&self, key: &EdgeKey, pod: Option<&str>) -> bool {
        let split = pod.and_then(|p| p.split_once('/'));
        self.namespace
            .as_deref()
            .is_none_or(|ns| split.is_some_and(|(n, _)| n == ns))
            && self
                .pod
                .as_deref()
                .is_none_or(|want| pod == Some(want) || split.is_some_and(|(_, name)| name == want))
            && self.port.is_none_or(|p| p == key.port)
            && self.protocol.is_none_or(|p| p == key.protocol)
            && self.direction.is_none_or(|d| d == key.direction)
            && self.outcome.is_none_or(|o| o == key.outcome)
    }
}

/// The local side of an edge without its peer: what names a pod.
pub type LocalKey = (Option<u32>, Option<u64>, IpAddr);

/// The local side of `key`.
pub fn local_key(key: &EdgeKey) -> LocalKey {
    (key.netns_ino, key.cgroup_id, key.local_ip)
}

/// Peer names `flows` keeps at most; later peers are shown as addresses (and counted).
pub const MAX_PEER_NAMES: usize = 65_536;

/// Pod labels of local sides and names of peer addresses, as the agent reported them (`flows` keeps
/// them beside the edges).
#[derive(Clone, Debug, Default)]
pub struct PodNames {
    pods: HashMap<LocalKey, Arc<str>>,
    peers: HashMap<IpAddr, Arc<str>>,
    peers_dropped: u64,
    /// The node's own network namespace (inode) and the node's name: its sockets are the host's.
    host: Option<(u32, Arc<str>)>,
}

/// The network namespace `flows` runs in, with the node's name (`NODE_NAME`, else the host name).
/// `flows` runs in the agent's container or on the node, and the agent uses the host network: this
/// namespace is the node's, so a socket in it that no pod owns is the host's own.
pub fn host_netns() -> Option<(u32, Arc<str>)> {
    use std::os::unix::fs::MetadataExt;
    let inode = u32::try_from(std::fs::metadata("/proc/self/ns/net").ok()?.ino()).ok()?;
    let node = std::env::var("NODE_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_default();
    Some((inode, node.into()))
}

impl PodNames {
    /// Sockets in network namespace `inode` that no pod owns are shown as the host `node`'s.
    pub fn set_host(&mut self, inode: u32, node: Arc<str>) {
        self.host = Some((inode, node));
    }

    /// The node's name when `key`'s local side is a socket of the host itself (no pod owns it).
    pub fn host(&self, key: &EdgeKey) -> Option<&str> {
        let (inode, node) = self.host.as_ref()?;
        (key.netns_ino == Some(*inode) && self.get(key).is_none()).then_some(&**node)
    }

    /// Remembers the pod label of `key`'s local side.
    pub fn insert(&mut self, key: &EdgeKey, label: Arc<str>) {
        self.pods.insert(local_key(key), label);
    }

    /// The pod label of `key`'s local side.
    pub fn get(&self, key: &EdgeKey) -> Option<&str> {
        self.pods.get(&local_key(key)).map(|l| &**l)
    }

    /// Remembers the name of a peer address (the latest wins: an address may change hands). Beyond
    /// [`MAX_PEER_NAMES`] addresses a new one is not kept but counted ([`PodNames::peers_dropped`]).
    pub fn insert_peer(&mut self, ip: IpAddr, name: Arc<str>) {
        if self.peers.len() >= MAX_PEER_NAMES && !self.peers.contains_key(&ip) {
            self.peers_dropped = self.peers_dropped.saturating_add(1);
            return;
        }
        self.peers.insert(ip, name);
    }

    /// The name of `key`'s peer address, if the agent knew one.
    pub fn peer(&self, key: &EdgeKey) -> Option<&str> {
        self.peers.get(&key.peer_ip).map(|l| &**l)
    }

    /// Peer names not kept because [`MAX_PEER_NAMES`] were held.
    pub fn peers_dropped(&self) -> u64 {
        self.peers_dropped
    }
}

/// Parses a duration like `90s`, `5m`, `1h30m`, `250ms`, `2d` (see
/// [`network_enforcer_api::duration`]) or a plain number of seconds, at most [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let seconds = text.trim().parse::<u64>().ok();
    let text = seconds.map_or_else(|| text.to_string(), |s| format!("{s}s"));
    network_enforcer_api::duration::parse_duration(&text, MAX_DURATION).map_err(|e| e.to_string())
}

/// The longest `--since`/`--interval` accepted: far beyond any buffer the agent keeps, and small
/// enough that adding it to a clock reading cannot overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 86_400);

/// Lower-case name of a protocol, as shown and as accepted by `--protocol`.
pub fn protocol_name(p: Protocol) -> &'static str {
    network_enforcer_api::Protocol::from(p).as_lowercase_str()
}

/// Lower-case name of a direction.
pub fn direction_name(d: Direction) -> &'static str {
    match d {
        Direction::Outbound => "outbound",
        Direction::Inbound => "inbound",
    }
}

/// Lower-case name of an outcome.
pub fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Established => "established",
        Outcome::Failed => "failed",
        Outcome::Datagram => "datagram",
    }
}

/// The errno names a failed connection usually ends with.
fn error_name(errno: u8) -> String {
    match i32::from(errno) {
        libc::ECONNREFUSED => "refused".into(),
        libc::ETIMEDOUT => "timed out".into(),
        libc::EHOSTUNREACH => "host unreachable".into(),
        libc::ENETUNREACH => "network unreachable".into(),
        libc::ECONNRESET => "reset".into(),
        other => format!("errno {other}"),
    }
}

/// The local side as text: its pod, or `host <node>` for the node's own sockets, or its network
/// namespace, with its address; an unconnected UDP socket has none (the kernel reports `0.0.0.0`/`::`),
/// so none is shown.
fn local_side(key: &EdgeKey, names: &PodNames) -> String {
    let address = (!key.local_ip.is_unspecified()).then_some(key.local_ip);
    let host = names.host(key).map(|node| match node {
        "" => "host".to_string(),
        node => format!("host {node}"),
    });
    match (
        names.get(key).map(str::to_string).or(host),
        key.netns_ino,
        address,
    ) {
        (Some(who), _, Some(ip)) => format!("{who} ({ip})"),
        (Some(who), _, None) => who,
        (None, Some(ns), Some(ip)) => format!("{ip} [netns {ns}]"),
        (None, Some(ns), None) => format!("[netns {ns}]"),
        (None, None, Some(ip)) => ip.to_string(),
        (None, None, None) => "-".to_string(),
    }
}

/// The peer as text: its name (`svc demo/db`, `demo/api-7d9c`, `node/worker-1`) as `hubble observe`
/// shows it, else its address (JSON keeps the address in `peer_ip` either way).
pub fn peer_side(key: &EdgeKey, names: &PodNames) -> String {
    names
        .peer(key)
        .map_or_else(|| key.peer_ip.to_string(), str::to_string)
}

/// (source, destination) from the connection opener's point of view.
fn ends(key: &EdgeKey, names: &PodNames) -> (String, String) {
    match key.direction {
        Direction::Outbound => (local_side(key, names), peer_side(key, names)),
        Direction::Inbound => (peer_side(key, names), local_side(key, names)),
    }
}

fn outcome_text(edge: &Edge) -> String {
    match (edge.key.outcome, edge.stats.last_error) {
        (Outcome::Failed, Some(err)) => format!("failed ({})", error_name(err)),
        (o, _) => outcome_name(o).to_string(),
    }
}

/// RFC 3339 UTC time with milliseconds, e.g. `2026-11-29T13:05:09.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    use k8s_openapi::jiff::Timestamp;
    Timestamp::try_from(t)
        .unwrap_or(Timestamp::UNIX_EPOCH)
        .strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// A table: TIME (last seen), SOURCE, DESTINATION, PORT, PROTOCOL, OUTCOME, COUNT.
pub fn render_table(edges: &[Edge], clock: &WallClock, names: &PodNames, header: bool) -> String {
    let rows: Vec<[String; 7]> = edges
        .iter()
        .map(|e| {
            let (src, dst) = ends(&e.key, names);
            [
                rfc3339(clock.at(e.stats.last_seen)),
                src,
                dst,
                e.key.port.to_string(),
                protocol_name(e.key.protocol).to_string(),
                outcome_text(e),
                e.stats.count.to_string(),
            ]
        })
        .collect();
    let titles = [
        "TIME",
        "SOURCE",
        "DESTINATION",
        "PORT",
        "PROTOCOL",
        "OUTCOME",
        "COUNT",
    ];
    let mut widths = titles.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let text: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", text.join("  ").trim_end());
    };
    if header {
        line(&titles);
    }
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    out
}

/// One JSON object per edge, one per line (`pod`: the local pod's label, or null; `host`: the node's
/// name for the host's own sockets, or null; `peer`: the peer's name, or null, beside its address
/// `peer_ip`). Addresses are as the kernel reported them (`0.0.0.0` for an unconnected UDP socket).
pub fn render_json(edges: &[Edge], clock: &WallClock, names: &PodNames) -> String {
    let mut out = String::new();
    for e in edges {
        let value = serde_json::json!({
            "first_seen": rfc3339(clock.at(e.stats.first_seen)),
            "last_seen": rfc3339(clock.at(e.stats.last_seen)),
            "pod": names.get(&e.key),
            "host": names.host(&e.key),
            "netns_ino": e.key.netns_ino,
            "cgroup_id": e.key.cgroup_id,
            "local_ip": e.key.local_ip.to_string(),
            "peer_ip": e.key.peer_ip.to_string(),
            "peer": names.peer(&e.key),
            "port": e.key.port,
            "protocol": protocol_name(e.key.protocol),
            "direction": direction_name(e.key.direction),
            "outcome": outcome_name(e.key.outcome),
            "error": e.stats.last_error,
            "count": e.stats.count,
        });
        let _ = writeln!(out, "{value}");
    }
    out
}

/// Logs every edge at debug level (as `flows -o json` prints it); nothing is rendered otherwise.
pub fn log_edges(flushed: &Flushed, clock: &WallClock) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    let mut names = PodNames::default();
    for (edge, owner) in &flushed.edges {
        if let Owner::Pod(pod) = owner {
            names.insert(&edge.key, pod.label().into());
        }
    }
    let edges: Vec<Edge> = flushed.edges.iter().map(|(e, _)| *e).collect();
    for line in render_json(&edges, clock, &names).lines() {
        tracing::debug!(edge = line, "edge");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::EdgeStats;
    use std::time::UNIX_EPOCH;

    fn edge(direction: Direction, outcome: Outcome, error: Option<u8>) -> Edge {
        Edge {
            key: EdgeKey {
                netns_ino: Some(4026532178),
                cgroup_id: Some(1),
                local_ip: "10.0.0.1".parse().unwrap(),
                peer_ip: "10.0.0.2".parse().unwrap(),
                port: 80,
                protocol: Protocol::Tcp,
                direction,
                outcome,
            },
            stats: EdgeStats {
                first_seen: Duration::from_secs(1),
                last_seen: Duration::from_secs(2),
                count: 3,
                last_error: error,
            },
        }
    }

    #[test]
    fn formats_rfc3339_utc() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_562_309_123);
        assert_eq!(rfc3339(t), "2026-12-06T13:05:09.123Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
    }

    #[test]
    fn filters_on_every_criterion() {
        let e = edge(Direction::Outbound, Outcome::Established, None);
        assert!(FlowFilter::default().matches(&e.key, None));
        assert!(
            FlowFilter {
                port: Some(80),
                protocol: Some(Protocol::Tcp),
                ..Default::default()
            }
            .matches(&e.key, None)
        );
        assert!(
            !FlowFilter {
                port: Some(81),
                ..Default::default()
            }
            .matches(&e.key, None)
        );
        assert!(
            !FlowFilter {
                protocol: Some(Protocol::Udp),
                ..Default::default()
            }
            .matches(&e.key, None)
        );
        assert!(
            !FlowFilter {
                direction: Some(Direction::Inbound),
                ..Default::default()
            }
            .matches(&e.key, None)
        );
        assert!(
            !FlowFilter {
                outcome: Some(Outcome::Failed),
                ..Default::default()
            }
            .matches(&e.key, None)
        );
    }

    #[test]
    fn parses_durations() {
        let d = |s| parse_duration(s);
        assert_eq!(d("90"), Ok(Duration::from_secs(90)));
        assert_eq!(d("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(d("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(d("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(d("250ms"), Ok(Duration::from_millis(250)));
        assert!(d("").is_err());
        assert!(d("m").is_err());
        assert!(d("5x").is_err());
        assert!(d("-5m").is_err());
        // Too long to add to a clock reading: refused with the limit named, never a panic.
        assert_eq!(d("366d"), Ok(MAX_DURATION));
        for huge in [
            "367d",
            "18446744073709551615",
            "18446744073709551615d",
            "9999999999999999h9999999999999999h",
        ] {
            let err = d(huge).unwrap_err();
            assert!(err.contains("longer than 366 days"), "{huge}: {err}");
        }
    }

    #[test]
    fn filters_on_the_local_pod() {
        let e = edge(Direction::Outbound, Outcome::Established, None);
        let ns = |n: &str| FlowFilter {
            namespace: Some(n.into()),
            ..Default::default()
        };
        let pod = |p: &str| FlowFilter {
            pod: Some(p.into()),
            ..Default::default()
        };
        assert!(ns("shop").matches(&e.key, Some("shop/web")));
        assert!(!ns("shop").matches(&e.key, Some("bank/web")));
        assert!(!ns("shop").matches(&e.key, None), "not a pod: no namespace");
        assert!(!ns("shop").matches(&e.key, Some("uid:1234")));
        assert!(pod("web").matches(&e.key, Some("shop/web")));
        assert!(pod("shop/web").matches(&e.key, Some("shop/web")));
        assert!(!pod("bank/web").matches(&e.key, Some("shop/web")));
        assert!(!pod("web").matches(&e.key, None));
        assert!(pod("uid:1234").matches(&e.key, Some("uid:1234")));
    }

    #[test]
    fn named_pods_replace_the_namespace_inode() {
        let e = edge(Direction::Outbound, Outcome::Established, None);
        let mut names = PodNames::default();
        names.insert(&e.key, "shop/web".into());
        let clock = WallClock::now();
        let table = render_table(&[e], &clock, &names, false);
        assert!(table.contains("shop/web (10.0.0.1)"), "{table}");
        let json: serde_json::Value =
            serde_json::from_str(render_json(&[e], &clock, &names).trim()).unwrap();
        assert_eq!(json["pod"], "shop/web");
    }

    /// The local side: a pod, the host's own sockets (by the node's name, when no pod owns the
    /// namespace), another namespace; an unconnected UDP socket's `0.0.0.0` is not shown as an address.
    #[test]
    fn the_local_side_is_a_pod_the_host_or_a_namespace_without_a_fake_address() {
        const HOST: u32 = 4026531833;
        let table: [(Option<&str>, Option<u32>, &str, &str); 8] = [
            (Some("shop/web"), Some(7), "10.0.0.1", "shop/web (10.0.0.1)"),
            (Some("shop/web"), Some(7), "0.0.0.0", "shop/web"),
            (None, Some(HOST), "172.18.0.2", "host worker-1 (172.18.0.2)"),
            (None, Some(HOST), "0.0.0.0", "host worker-1"),
            (None, Some(HOST), "::", "host worker-1"),
            // A pod label wins over the host's namespace (a hostNetwork pod the agent named).
            (
                Some("kube-system/dns"),
                Some(HOST),
                "172.18.0.2",
                "kube-system/dns (172.18.0.2)",
            ),
            (None, Some(9), "10.0.0.9", "10.0.0.9 [netns 9]"),
            (None, Some(9), "0.0.0.0", "[netns 9]"),
        ];
        let clock = WallClock::now();
        for (pod, netns, ip, want) in table {
            let mut e = edge(Direction::Outbound, Outcome::Datagram, None);
            e.key.netns_ino = netns;
            e.key.local_ip = ip.parse().unwrap();
            let mut names = PodNames::default();
            names.set_host(HOST, "worker-1".into());
            if let Some(pod) = pod {
                names.insert(&e.key, pod.into());
            }
            assert_eq!(local_side(&e.key, &names), want, "{pod:?} {netns:?} {ip}");
            let json: serde_json::Value =
                serde_json::from_str(render_json(&[e], &clock, &names).trim()).unwrap();
            assert_eq!(json["local_ip"], ip, "JSON keeps the raw address");
            let host = (pod.is_none() && netns == Some(HOST)).then_some("worker-1");
            assert_eq!(
                json["host"],
                host.map_or(serde_json::Value::Null, Into::into)
            );
        }
        // Without a host namespace known (the programs loaded by `flows --local`): as before.
        let mut e = edge(Direction::Outbound, Outcome::Datagram, None);
        e.key.netns_ino = Some(HOST);
        assert_eq!(
            local_side(&e.key, &PodNames::default()),
            format!("10.0.0.1 [netns {HOST}]")
        );
    }

    /// Both directions, the peer named as `hubble observe` names it: a Service, a pod, a node, or
    /// the bare address when the agent knew no name; JSON keeps the address beside the name.
    #[test]
    fn peers_are_named_and_keep_their_address_in_json() {
        let clock = WallClock::now();
        for (peer_ip, name) in [
            ("10.96.125.79", Some("svc demo/db")),
            ("10.244.0.13", Some("demo/api-7d9c")),
            ("172.18.0.2", Some("node/worker-1")),
            ("10.244.0.99", None),
        ] {
            for direction in [Direction::Outbound, Direction::Inbound] {
                let mut e = edge(direction, Outcome::Established, None);
                e.key.peer_ip = peer_ip.parse().unwrap();
                let mut names = PodNames::default();
                if let Some(name) = name {
                    names.insert_peer(e.key.peer_ip, name.into());
                }
                // Another address's name must not leak onto this one.
                names.insert_peer("10.0.0.250".parse().unwrap(), "svc other/x".into());
                let shown = name.unwrap_or(peer_ip);
                let (src, dst) = ends(&e.key, &names);
                let peer_cell = if direction == Direction::Outbound {
                    dst
                } else {
                    src
                };
                assert_eq!(peer_cell, shown, "{peer_ip} {direction:?}");
                let table = render_table(&[e], &clock, &names, false);
                assert!(table.contains(shown), "{table}");
                let json: serde_json::Value =
                    serde_json::from_str(render_json(&[e], &clock, &names).trim()).unwrap();
                assert_eq!(json["peer_ip"], peer_ip);
                assert_eq!(
                    json["peer"],
                    name.map_or(serde_json::Value::Null, Into::into)
                );
            }
        }
    }

    #[test]
    fn peer_names_are_bounded_and_counted() {
        let mut names = PodNames::default();
        for i in 0..=MAX_PEER_NAMES as u32 {
            names.insert_peer(IpAddr::from(i.to_be_bytes()), "x".into());
        }
        assert_eq!(names.peers_dropped(), 1);
        // A known address may still be renamed when full.
        names.insert_peer(IpAddr::from(0u32.to_be_bytes()), "y".into());
        assert_eq!(names.peers_dropped(), 1);
    }

    #[test]
    fn table_puts_the_opener_first_and_names_the_failure() {
        let clock = WallClock::now();
        let out = render_table(
            &[
                edge(
                    Direction::Outbound,
                    Outcome::Failed,
                    Some(libc::ECONNREFUSED as u8),
                ),
                edge(Direction::Inbound, Outcome::Established, None),
            ],
            &clock,
            &PodNames::default(),
            true,
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("TIME"));
        let cells = |l: &str| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            &cells(lines[1])[1..],
            [
                "10.0.0.1 [netns 4026532178]",
                "10.0.0.2",
                "80",
                "tcp",
                "failed (refused)",
                "3"
            ]
        );
        assert_eq!(
            &cells(lines[2])[1..],
            [
                "10.0.0.2",
                "10.0.0.1 [netns 4026532178]",
                "80",
                "tcp",
                "established",
                "3"
            ]
        );
    }

    #[test]
    fn json_lines_carry_every_field() {
        let clock = WallClock::now();
        let out = render_json(
            &[edge(Direction::Outbound, Outcome::Failed, Some(111))],
            &clock,
            &PodNames::default(),
        );
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["peer_ip"], "10.0.0.2");
        assert_eq!(v["port"], 80);
        assert_eq!(v["direction"], "outbound");
        assert_eq!(v["outcome"], "failed");
        assert_eq!(v["error"], 111);
        assert_eq!(v["count"], 3);
        assert_eq!(v["netns_ino"], 4026532178u64);
    }
}
