//! The controller's encoded view of `FlowBatch` reads what agents send, and its records decode back.

use network_enforcer_api::uplink::{AgentHealth, FlowBatch, FlowRecord, LocalPod, Peer, encoded};
use prost::Message;

#[test]
fn an_encoded_batch_reads_a_flow_batch_and_its_records_decode_back() {
    let records: Vec<FlowRecord> = (0..3u32)
        .map(|i| FlowRecord {
            local: Some(LocalPod {
                namespace: "shop".into(),
                name: format!("web-{i}"),
                uid: format!("uid-{i}"),
            }),
            peer_ip: vec![10, 0, 0, i as u8],
            port: 8080 + i,
            count: u64::from(i),
            peer: (i == 1).then(|| Peer {
                namespace: "shop".into(),
                pod: "db-0".into(),
                principal: String::new(),
            }),
            ..FlowRecord::default()
        })
        .collect();
    let sent = FlowBatch {
        sequence: 42,
        node: "node-a".into(),
        records: records.clone(),
        instance: 7,
        health: Some(AgentHealth {
            events_lost: 3,
            batches_dropped: 1,
            cost_sampled_ms: 1_787_307_330_123,
            cpu_ms: 4_200,
            kernel_ns: 9_000_000,
            rss_bytes: 52 << 20,
            ..AgentHealth::default()
        }),
    };
    let wire = sent.encode_to_vec();
    let view = encoded::FlowBatch::decode(wire.as_slice()).unwrap();
    assert_eq!(
        (
            view.sequence,
            view.node.as_str(),
            view.instance,
            view.health
        ),
        (42, "node-a", 7, sent.health)
    );
    // An older agent's batch has no health: read as none.
    let older = FlowBatch {
        health: None,
        ..sent.clone()
    };
    let view_of_older = encoded::FlowBatch::decode(older.encode_to_vec().as_slice()).unwrap();
    assert_eq!(view_of_older.health, None);
    let decoded: Vec<FlowRecord> = view
        .records
        .iter()
        .map(|b| FlowRecord::decode(b.clone()).unwrap())
        .collect();
    assert_eq!(decoded, records);
    // And the other way: what the view encodes is the batch.
    assert_eq!(
        FlowBatch::decode(view.encode_to_vec().as_slice()).unwrap(),
        sent
    );
}
