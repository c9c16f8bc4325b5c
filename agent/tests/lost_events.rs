//! Kernel test: when user space falls behind and the ring buffer is full, events are counted as lost
//! (per CPU, summed by the loader), never silently dropped. Needs root (CI runs as root).

mod support;

use network_enforcer_agent::LoadOptions;
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

#[tokio::test]
async fn a_full_ring_buffer_counts_lost_events() {
    // One page: room for 4096 / (8-byte record header + 72-byte event) = 51 events.
    const RING_BYTES: u32 = 4096;
    const CAPACITY: u64 = RING_BYTES as u64 / 80;
    const CONNECTIONS: u64 = 200;
    let (data_plane, mut reader) = support::load(&LoadOptions {
        ring_buffer_bytes: Some(RING_BYTES),
        dedupe_window: Duration::ZERO, // every connection is an event
        cgroup: None,
        dns: false,
        flow_map_entries: None,
        connection_pids: false,
        ..LoadOptions::default()
    });

    // Nothing reads the ring buffer while 200 loopback connections produce 400 events.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap();
    let accept = std::thread::spawn(move || {
        for _ in 0..CONNECTIONS {
            listener.accept().unwrap();
        }
    });
    for _ in 0..CONNECTIONS {
        TcpStream::connect(server).unwrap();
    }
    accept.join().unwrap();

    let lost = data_plane.counters().unwrap().ring_buffer_full;
    assert!(
        lost >= 2 * CONNECTIONS - CAPACITY,
        "{lost} events counted lost; at least {} cannot have fit",
        2 * CONNECTIONS - CAPACITY
    );

    // What did fit is still delivered.
    let mut batch = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), reader.read_batch(&mut batch))
        .await
        .expect("the events that fit are readable")
        .unwrap();
    assert!(
        !batch.is_empty() && batch.len() as u64 <= CAPACITY,
        "{} events read",
        batch.len()
    );
}

/// The agent sees how close it comes to losing: how full each LRU map is and what it evicted, and
/// the fullest the ring buffer was. One UDP socket sends to 300 ports nobody listens on (loopback):
/// 300 edges and 300 (socket, peer) entries into maps of 64, and 300 unread events. Other traffic of
/// the machine (a cluster runs beside the tests) only adds, so the bounds are lower ones, and the
/// counts stay within the capacity.
#[tokio::test]
async fn full_maps_count_their_evictions_and_the_ring_buffer_its_peak() {
    use network_enforcer_agent::FlowMap;
    const ENTRIES: u32 = 64;
    const PORTS: u16 = 300;
    const CONNECTIONS: u64 = 20;
    // 8-byte record header + 72-byte event.
    const RECORD_BYTES: u64 = 80;
    let (data_plane, mut reader) = support::load(&LoadOptions {
        flow_map_entries: Some(ENTRIES),
        dns: false,
        // The `connecting` map fills only while processes are named.
        connection_pids: true,
        ..LoadOptions::default()
    });
    let before = data_plane.counters().unwrap();

    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for port in 0..PORTS {
        // Unconnected: an ICMP port unreachable is not reported back to the sender.
        let _ = socket.send_to(b"x", ("127.0.0.1", 40_000 + port));
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let server = listener.local_addr().unwrap();
    let accept = std::thread::spawn(move || {
        for _ in 0..CONNECTIONS {
            listener.accept().unwrap();
        }
    });
    for _ in 0..CONNECTIONS {
        TcpStream::connect(server).unwrap();
    }
    accept.join().unwrap();

    let counters = data_plane.counters().unwrap();
    let fills = data_plane.maps().fill().unwrap();
    for map in [FlowMap::edges, FlowMap::udp_peers] {
        let fill = fills.iter().find(|f| f.map == map).unwrap();
        assert_eq!(fill.capacity, ENTRIES, "{fill:?}");
        assert!(
            fill.entries > 0 && fill.entries <= u64::from(ENTRIES),
            "{fill:?}"
        );
        assert!(
            fill.evicted() >= u64::from(PORTS - ENTRIES as u16),
            "at least {} of {PORTS} entries cannot have stayed: {fill:?}",
            PORTS - ENTRIES as u16
        );
    }
    assert!(
        counters.edges_inserted - before.edges_inserted >= u64::from(PORTS),
        "{counters:?}"
    );
    assert!(
        counters.udp_peers_inserted - before.udp_peers_inserted >= u64::from(PORTS),
        "{counters:?}"
    );
    // Each loopback connect goes into the connecting map and out again when it is established.
    assert!(
        counters.connecting_inserted - before.connecting_inserted >= CONNECTIONS
            && counters.connecting_removed - before.connecting_removed >= CONNECTIONS,
        "{counters:?}"
    );

    // Nothing read yet: the last of our events found the others unread (and counts itself).
    let peak = data_plane.take_ring_buffer_peak().unwrap();
    assert!(
        peak >= u64::from(PORTS) * RECORD_BYTES,
        "peak {peak} bytes; {PORTS} events were unread"
    );
    let mut batch = Vec::new();
    while reader.read_waiting(&mut batch) > 0 {}
    data_plane.take_ring_buffer_peak().unwrap();
    let after_reading = data_plane.take_ring_buffer_peak().unwrap();
    assert!(
        after_reading < peak / 2,
        "read and reset: {after_reading} bytes at the fullest since, was {peak}"
    );
}
