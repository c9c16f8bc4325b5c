//! Kernel test: 50 TCP connections from 5 client pods to one server pod, aggregated in user space into
//! exactly one outbound edge per client and one inbound edge per client at the server, each counted 10
//! times. Needs root (CI runs as root).

mod support;

use network_enforcer_agent::aggregate::{Aggregator, EdgeKey};
use network_enforcer_agent::{Direction, LoadOptions, Outcome, Protocol};
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;
use support::{Netns, collect, link, load};

const CLIENTS: u8 = 5;
const PER_CLIENT: u64 = 10;

#[tokio::test]
async fn fifty_connections_from_five_pods_aggregate_into_ten_edges() {
    // No kernel dedupe: every connection is an event, so the counts come from user-space aggregation.
    let (_data_plane, mut reader) = load(&LoadOptions {
        dedupe_window: Duration::ZERO,
        ..LoadOptions::default()
    });
    let server_pod = Netns::new();
    let clients: Vec<Netns> = (0..CLIENTS).map(|_| Netns::new()).collect();
    for (i, client) in clients.iter().enumerate() {
        // client i is 10.202.i.1, the server's address on that link 10.202.i.2
        link(
            client,
            &server_pod,
            &format!("10.202.{i}"),
            &format!("fd00:202:{i}:"),
        );
    }
    let listener = server_pod.run(|| TcpListener::bind("0.0.0.0:8080").unwrap());
    let accept = std::thread::spawn(move || {
        for _ in 0..u64::from(CLIENTS) * PER_CLIENT {
            listener.accept().unwrap();
        }
    });
    for (i, client) in clients.iter().enumerate() {
        let server: SocketAddr = (format!("10.202.{i}.2").parse::<IpAddr>().unwrap(), 8080).into();
        client.run(move || {
            for _ in 0..PER_CLIENT {
                TcpStream::connect(server).unwrap();
            }
        });
    }
    accept.join().unwrap();

    let server_ns = server_pod.inode();
    let client_ns: Vec<u32> = clients.iter().map(Netns::inode).collect();
    let ours =
        |ns: Option<u32>| ns == Some(server_ns) || ns.is_some_and(|n| client_ns.contains(&n));
    let expected_events = 2 * usize::from(CLIENTS) * PER_CLIENT as usize;
    let events = collect(&mut reader, expected_events, |e| ours(e.netns_ino)).await;

    let mut aggregator = Aggregator::new();
    for e in &events {
        aggregator.add(e);
    }
    let edges: BTreeMap<EdgeKey, u64> = aggregator
        .drain()
        .into_iter()
        .map(|e| (e.key, e.stats.count))
        .collect();

    let mut expected = BTreeMap::new();
    for (i, ns) in client_ns.iter().enumerate() {
        let client: IpAddr = format!("10.202.{i}.1").parse().unwrap();
        let server: IpAddr = format!("10.202.{i}.2").parse().unwrap();
        let key = |netns, local_ip, peer_ip, direction| EdgeKey {
            netns_ino: Some(netns),
            cgroup_id: Some(support::own_cgroup_id()),
            local_ip,
            peer_ip,
            port: 8080,
            protocol: Protocol::Tcp,
            direction,
            outcome: Outcome::Established,
        };
        expected.insert(key(*ns, client, server, Direction::Outbound), PER_CLIENT);
        expected.insert(
            key(server_ns, server, client, Direction::Inbound),
            PER_CLIENT,
        );
    }
    assert_eq!(edges, expected);
}
