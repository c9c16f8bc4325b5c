use super::record::epoch_ms;
use super::*;
use crate::aggregate::{EdgeKey, EdgeStats};

fn records(n: usize) -> Vec<FlowRecord> {
    (0..n)
        .map(|i| FlowRecord {
            port: i as u32,
            ..FlowRecord::default()
        })
        .collect()
}

fn sequences(buffer: &ResendBuffer) -> Vec<u64> {
    buffer.pending().map(|b| b.sequence).collect()
}

#[test]
fn batches_are_numbered_from_one_and_carry_the_node() {
    let mut buffer = ResendBuffer::new(4);
    assert_eq!(
        buffer.push("node-a", records(2)),
        Pushed {
            sequence: 1,
            dropped: vec![]
        }
    );
    assert_eq!(buffer.push("node-a", records(1)).sequence, 2);
    let first = buffer.pending().next().unwrap();
    assert_eq!((first.node.as_str(), first.records.len()), ("node-a", 2));
    assert_eq!(buffer.len(), 2);
}

/// Every batch names the agent process that numbered it (the controller recognises a resend by
/// instance and sequence): one instance per buffer, never 0, another for another process.
#[test]
fn batches_carry_the_instance_of_their_agent_process() {
    let mut buffer = ResendBuffer::new(4);
    let instance = buffer.instance();
    assert_ne!(instance, 0);
    buffer.push("node-a", records(1));
    buffer.push("node-a", records(1));
    assert!(buffer.pending().all(|b| b.instance == instance));
    assert_ne!(
        ResendBuffer::new(4).instance(),
        instance,
        "a restart is another process"
    );
    assert_eq!(ResendBuffer::new(4).with_instance(0).instance(), 1);
}

#[test]
fn ack_removes_exactly_that_batch_and_ignores_unknown_sequences() {
    let mut buffer = ResendBuffer::new(8);
    for _ in 0..4 {
        buffer.push("n", records(1));
    }
    assert!(buffer.ack(2));
    assert_eq!(sequences(&buffer), [1, 3, 4]);
    assert!(
        !buffer.ack(2),
        "a duplicate ack (after a resend) is a no-op"
    );
    assert!(!buffer.ack(9), "never sent");
    assert!(buffer.ack(1) && buffer.ack(4) && buffer.ack(3));
    assert!(buffer.is_empty());
    assert_eq!(
        buffer.push("n", records(1)).sequence,
        5,
        "numbers are never reused"
    );
}

#[test]
fn a_full_buffer_drops_the_oldest_and_counts_it() {
    let mut buffer = ResendBuffer::new(3);
    for _ in 0..3 {
        assert_eq!(buffer.push("n", records(1)).dropped, [0u64; 0]);
    }
    assert_eq!(buffer.push("n", records(1)).dropped, [1]);
    assert_eq!(buffer.push("n", records(1)).dropped, [2]);
    assert_eq!(sequences(&buffer), [3, 4, 5]);
    assert_eq!(buffer.dropped(), 2);
    assert_eq!(buffer.len(), buffer.capacity());
}

#[test]
fn zero_capacity_still_keeps_the_newest_batch() {
    let mut buffer = ResendBuffer::new(0);
    buffer.push("n", records(1));
    assert_eq!(buffer.push("n", records(1)).dropped, [1]);
    assert_eq!(sequences(&buffer), [2]);
}

#[test]
fn the_record_limit_drops_as_many_old_batches_as_needed_and_acks_free_room() {
    let mut buffer = ResendBuffer::new(100).with_max_records(10);
    buffer.push("n", records(4));
    buffer.push("n", records(4));
    assert_eq!(buffer.records(), 8);
    assert_eq!(
        buffer.push("n", records(2)).dropped,
        [0u64; 0],
        "exactly full"
    );
    assert_eq!(buffer.push("n", records(7)).dropped, [1, 2]);
    assert_eq!(sequences(&buffer), [3, 4]);
    assert_eq!(buffer.records(), 9);
    assert!(buffer.ack(4));
    assert_eq!(buffer.records(), 2);
    assert_eq!(buffer.push("n", records(8)).dropped, [0u64; 0]);
    // A batch bigger than the limit replaces everything but is kept: the newest is never lost here.
    assert_eq!(buffer.push("n", records(30)).dropped, [3, 5]);
    assert_eq!((sequences(&buffer), buffer.records()), (vec![6], 30));
    assert_eq!(buffer.dropped(), 4);
}

#[test]
fn next_from_walks_the_pending_batches_for_a_resend() {
    let mut buffer = ResendBuffer::new(8);
    for _ in 0..5 {
        buffer.push("n", records(1));
    }
    buffer.ack(1);
    buffer.ack(3);
    // A new stream starts at 0 and resends 2, 4, 5 in order.
    let mut next = 0;
    let mut resent = Vec::new();
    while let Some(batch) = buffer.next_from(next) {
        resent.push(batch.sequence);
        next = batch.sequence + 1;
    }
    assert_eq!(resent, [2, 4, 5]);
    assert!(buffer.next_from(6).is_none());
    assert_eq!(buffer.next_from(3).map(|b| b.sequence), Some(4));
}

fn task(capacity: usize, max_records_per_batch: usize) -> Task {
    let (_, queue) = mpsc::channel(1);
    Task {
        config: UplinkConfig {
            max_records_per_batch,
            ..UplinkConfig::new("http://127.0.0.1:9", "/nonexistent", "n")
        },
        buffer: ResendBuffer::new(capacity),
        queue,
        queue_open: true,
        counters: UplinkCounters::default(),
        waiting: VecDeque::new(),
    }
}

fn ack(sequence: u64) -> BatchAck {
    BatchAck {
        sequence,
        ..BatchAck::default()
    }
}

/// A large send is split into batches that each hold their own records only: the resend buffer
/// keeps them until acknowledged, and a batch split off with the capacity of the rest made that
/// memory grow with the square of the send (a spray's flush).
#[test]
fn a_large_send_is_split_into_batches_of_their_own_size() {
    let mut task = task(16, 5);
    task.take(Some(Outgoing {
        records: records(23),
        receipts: vec![],
        health: None,
    }));
    let sizes: Vec<(usize, usize)> = task
        .buffer
        .pending()
        .map(|b| (b.records.len(), b.records.capacity()))
        .collect();
    assert_eq!(sizes, [(5, 5), (5, 5), (5, 5), (5, 5), (3, 3)]);
}

#[test]
fn a_receipt_is_settled_once_every_batch_of_its_send_is_acknowledged() {
    let mut task = task(8, 2);
    let (first, first_watch) = receipt();
    let (second, second_watch) = receipt();
    // Split into batches 1 and 2.
    task.take(Some(Outgoing {
        records: records(3),
        receipts: vec![first],
        health: None,
    }));
    task.take(Some(Outgoing {
        records: records(1),
        receipts: vec![second],
        health: None,
    }));
    task.acknowledge(&ack(1));
    task.acknowledge(&ack(3));
    assert!(
        !first_watch.settled(),
        "batch 2 of the first send is not acknowledged"
    );
    assert!(second_watch.settled(), "sends are settled independently");
    task.acknowledge(&ack(1));
    assert!(!first_watch.settled(), "a duplicate ack settles nothing");
    task.acknowledge(&ack(2));
    assert!(first_watch.settled());
    assert!(task.waiting.is_empty());
}

#[test]
fn a_receipt_is_settled_when_its_batches_are_dropped_or_there_were_none() {
    let mut task = task(1, 10);
    let (old, old_watch) = receipt();
    task.take(Some(Outgoing {
        records: records(1),
        receipts: vec![old],
        health: None,
    }));
    assert!(!old_watch.settled());
    // The buffer holds one batch: the next send drops the old one, whose records are gone.
    task.take(Some(Outgoing {
        records: records(1),
        receipts: vec![],
        health: None,
    }));
    assert!(old_watch.settled());
    assert_eq!(task.counters.batches_dropped.get(), 1);

    let (queue, _rx) = mpsc::channel(1);
    let sender = UplinkSender {
        queue,
        counters: UplinkCounters::default(),
    };
    let (empty, empty_watch) = receipt();
    assert!(sender.send_with_receipts(Vec::new(), vec![empty]));
    assert!(empty_watch.settled(), "nothing to acknowledge");
    let (queued, queued_watch) = receipt();
    assert!(sender.send_with_receipts(records(1), vec![queued]));
    assert!(!queued_watch.settled(), "waits in the queue");
    let (full, full_watch) = receipt();
    assert!(!sender.send_with_receipts(records(1), vec![full]));
    assert!(full_watch.settled(), "dropped and counted: gone either way");
    assert_eq!(sender.counters.batches_dropped.get(), 1);
}

#[test]
fn an_edge_becomes_a_record_with_enums_bytes_and_epoch_milliseconds() {
    let clock = WallClock::now();
    let edge = Edge {
        key: EdgeKey {
            netns_ino: Some(1),
            cgroup_id: Some(2),
            local_ip: "10.0.0.1".parse().unwrap(),
            peer_ip: "10.0.0.2".parse().unwrap(),
            port: 8080,
            protocol: Protocol::Tcp,
            direction: Direction::Outbound,
            outcome: Outcome::Failed,
        },
        stats: EdgeStats {
            first_seen: Duration::from_secs(100),
            last_seen: Duration::from_millis(102_500),
            count: 7,
            last_error: Some(111),
        },
    };
    let pod = LocalPod {
        namespace: "shop".into(),
        name: "client-1".into(),
        uid: "0b0e2f6a-1111-2222-3333-444455556666".into(),
    };
    let record = flow_record(&edge, pod.clone(), &clock);
    assert_eq!(record.local, Some(pod));
    assert_eq!(record.peer_ip, [10, 0, 0, 2]);
    assert_eq!(record.port, 8080);
    assert_eq!(record.protocol, proto::Protocol::Tcp as i32);
    assert_eq!(record.direction, proto::Direction::Outbound as i32);
    assert_eq!(record.outcome, proto::Outcome::Failed as i32);
    assert_eq!(record.source, proto::Source::Ebpf as i32);
    assert_eq!(record.count, 7);
    assert_eq!(record.last_seen_ms - record.first_seen_ms, 2500);
    assert_eq!(
        record.first_seen_ms,
        epoch_ms(clock.at(Duration::from_secs(100)))
    );

    let mut v6 = edge;
    v6.key.peer_ip = "fd00::2".parse().unwrap();
    v6.key.protocol = Protocol::Udp;
    v6.key.direction = Direction::Inbound;
    v6.key.outcome = Outcome::Datagram;
    let record = flow_record(&v6, LocalPod::default(), &clock);
    assert_eq!(record.peer_ip.len(), 16);
    assert_eq!(record.peer_ip[0], 0xfd);
    assert_eq!(record.peer_ip[15], 2);
    assert_eq!(record.protocol, proto::Protocol::Udp as i32);
    assert_eq!(record.direction, proto::Direction::Inbound as i32);
    assert_eq!(record.outcome, proto::Outcome::Datagram as i32);
}

#[test]
fn epoch_milliseconds_of_a_known_time() {
    assert_eq!(epoch_ms(UNIX_EPOCH + Duration::from_millis(1_700)), 1_700);
    assert_eq!(epoch_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
}

#[test]
fn plaintext_needs_the_insecure_flag_and_tls_needs_a_ca() {
    let config = |url: &str| UplinkConfig::new(url, "/nonexistent", "n");
    assert!(endpoint(&config("http://127.0.0.1:9443").insecure()).is_ok());
    let plaintext = endpoint(&config("http://127.0.0.1:9443")).unwrap_err();
    assert!(matches!(plaintext, UplinkError::Plaintext(_)));
    assert!(
        plaintext
            .to_string()
            .contains("NE_CONTROLLER_INSECURE=true")
    );
    assert!(matches!(
        endpoint(&config("https://controller:9443")),
        Err(UplinkError::NoCa(_))
    ));
    assert!(matches!(
        endpoint(&config("https://controller:9443").tls("/nonexistent/ca.crt", None)),
        Err(UplinkError::Ca { .. })
    ));
    assert!(matches!(
        endpoint(&config("ftp://controller:9443").insecure()),
        Err(UplinkError::Scheme(_))
    ));
    assert!(matches!(
        endpoint(&config("not a url")),
        Err(UplinkError::Endpoint { .. })
    ));
}

#[test]
fn the_token_is_read_trimmed_and_an_empty_file_is_an_error() {
    let dir = std::env::temp_dir().join(format!("ne-uplink-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("token");
    std::fs::write(&path, "abc.def\n").unwrap();
    assert_eq!(read_token(&path).unwrap(), "abc.def");
    std::fs::write(&path, " \n").unwrap();
    assert!(matches!(read_token(&path), Err(UplinkError::EmptyToken(_))));
    assert!(matches!(
        read_token(&dir.join("missing")),
        Err(UplinkError::Token { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn each_batch_carries_what_the_agent_lost_with_the_uplinks_own_drops() {
    let mut task = task(1, 10);
    let lost = AgentHealth {
        events_lost: 7,
        events_dropped: 3,
        dns_lost: 1,
        ..AgentHealth::default()
    };
    for _ in 0..3 {
        task.take(Some(Outgoing {
            records: records(1),
            receipts: vec![],
            health: Some(lost),
        }));
    }
    // The buffer holds one batch: each send dropped the one before; the last carries the drops
    // known when it was made (the first one's).
    let batch = task.buffer.pending().next().unwrap();
    assert_eq!(
        batch.health,
        Some(AgentHealth {
            batches_dropped: 1,
            ..lost
        })
    );
    // An agent that reports nothing (no data path counts) sends no health.
    task.take(Some(Outgoing {
        records: records(1),
        receipts: vec![],
        health: None,
    }));
    assert_eq!(task.buffer.pending().next().unwrap().health, None);
}
