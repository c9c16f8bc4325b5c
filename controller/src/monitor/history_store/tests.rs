//! Encoding and decoding the persisted history: round trips, shards within their bounds, the
//! oldest edges cut first, and damaged shards refused with the shard named.

use super::*;

fn workload(namespace: &str, name: &str) -> WorkloadRef {
    WorkloadRef {
        namespace: namespace.into(),
        owner_kind: "Deployment".into(),
        owner_name: name.into(),
        ..WorkloadRef::default()
    }
}

/// `n` edges, most recently seen first, among 50 workloads, a tenth to an outside name; each
/// workload named by one shared allocation, as the history hands them out.
fn edges(n: usize) -> Vec<StoredEdge> {
    let clients: Vec<Arc<WorkloadRef>> = (0..50)
        .map(|c| Arc::new(workload("shop", &format!("client-{c}"))))
        .collect();
    let db = Arc::new(workload("db", "postgres"));
    let outside_names: Vec<Arc<WorkloadRef>> = (0..250)
        .map(|a| {
            Arc::new(WorkloadRef {
                address: format!("203.0.113.{a}"),
                dns_name: "api.partner.test".into(),
                ..WorkloadRef::default()
            })
        })
        .collect();
    (0..n)
        .map(|i| {
            let outside = i % 10 == 0;
            StoredEdge {
                source: Arc::clone(&clients[i % 50]),
                source_ip: None,
                destination: if outside {
                    Arc::clone(&outside_names[i % 250])
                } else {
                    Arc::clone(&db)
                },
                destination_ip: outside.then(|| format!("203.0.113.{}", i % 250).parse().unwrap()),
                protocol: if i % 3 == 0 {
                    Protocol::UDP
                } else {
                    Protocol::TCP
                },
                port: 1000 + (i % 5000) as u16,
                peer_name: outside.then(|| "api.partner.test".to_string()),
                stats: EdgeStats {
                    first_seen_ms: 1_000,
                    last_seen_ms: 10_000_000 - i as i64,
                    count: i as u64 + 1,
                    to_api_server: i == 7,
                },
            }
        })
        .collect()
}

fn decode_all(encoded: &Encoded) -> Vec<StoredEdge> {
    encoded
        .shards
        .iter()
        .enumerate()
        .flat_map(|(i, bytes)| decode(i, bytes).unwrap())
        .collect()
}

#[test]
fn what_is_encoded_decodes_to_the_same_edges() {
    for n in [0, 1, 1_000] {
        let edges = edges(n);
        let encoded = encode(&edges, Limits::default());
        assert_eq!((encoded.edges, encoded.cut), (n, 0), "{n} edges");
        assert_eq!(encoded.shards.len(), usize::from(n > 0), "{n} edges");
        assert_eq!(decode_all(&encoded), edges, "{n} edges");
    }
}

#[test]
fn shards_stay_within_their_bytes_and_the_oldest_edges_are_cut_past_the_last_shard() {
    let edges = edges(20_000);
    let limits = Limits {
        shard_bytes: 16 * 1024,
        max_shards: 4,
    };
    let encoded = encode(&edges, limits);
    assert_eq!(encoded.shards.len(), 4);
    assert!(
        encoded.shards.iter().all(|s| s.len() <= limits.shard_bytes),
        "{:?}",
        encoded.shards.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(encoded.cut > 0 && encoded.edges + encoded.cut == edges.len());
    // What is kept is the newest, in order.
    assert_eq!(decode_all(&encoded), edges[..encoded.edges]);

    // Enough shards: nothing is cut.
    let wide = encode(
        &edges,
        Limits {
            max_shards: 1_000,
            ..limits
        },
    );
    assert_eq!((wide.edges, wide.cut), (edges.len(), 0));
    assert_eq!(decode_all(&wide), edges);
}

#[test]
fn a_limit_no_edge_fits_writes_nothing_and_cuts_everything() {
    let encoded = encode(
        &edges(3),
        Limits {
            shard_bytes: 10,
            max_shards: 8,
        },
    );
    assert_eq!(
        (encoded.shards.len(), encoded.edges, encoded.cut),
        (0, 0, 3)
    );
}

#[test]
fn a_damaged_shard_is_refused_with_its_number_and_what_is_wrong() {
    let gzip = |json: &str| crate::runtime::gzip::compress(json.as_bytes(), 8);
    let cases: [(&str, Vec<u8>, &str); 5] = [
        ("not gzip", b"{\"format\":1}".to_vec(), "not gzip"),
        (
            "truncated",
            gzip("{\"format\":1,")[..10].to_vec(),
            "not gzip",
        ),
        ("not a shard", gzip("[1,2,3]"), "not a shard"),
        (
            "another format",
            gzip("{\"format\":2,\"workloads\":[],\"edges\":[]}"),
            "format 2",
        ),
        (
            "a workload not in the table",
            gzip(
                "{\"format\":1,\"workloads\":[],\"edges\":[[0,null,0,null,\"TCP\",80,null,1,2,3,false]]}",
            ),
            "workload 0 is not in the shard's table",
        ),
    ];
    for (name, bytes, expected) in cases {
        let error = decode(3, &bytes).expect_err(name).to_string();
        assert!(
            error.contains("shard 3") && error.contains(expected),
            "{name}: {error}"
        );
    }
}
