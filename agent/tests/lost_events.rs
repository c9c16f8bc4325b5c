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
