//! From an aggregated edge to the record the controller takes in.

use super::*;

/// Converts an aggregated edge of a pod on this node into the record the controller takes in.
/// Kernel times become milliseconds since the Unix epoch through `clock`.
pub fn flow_record(edge: &Edge, local: LocalPod, clock: &WallClock) -> FlowRecord {
    let key = &edge.key;
    FlowRecord {
        local: Some(local),
        peer_ip: network_enforcer_api::uplink::ip_bytes(key.peer_ip),
        port: u32::from(key.port),
        protocol: match key.protocol {
            Protocol::Tcp => proto::Protocol::Tcp,
            Protocol::Udp => proto::Protocol::Udp,
        } as i32,
        direction: match key.direction {
            Direction::Outbound => proto::Direction::Outbound,
            Direction::Inbound => proto::Direction::Inbound,
        } as i32,
        outcome: match key.outcome {
            Outcome::Established => proto::Outcome::Established,
            Outcome::Failed => proto::Outcome::Failed,
            Outcome::Datagram => proto::Outcome::Datagram,
        } as i32,
        first_seen_ms: epoch_ms(clock.at(edge.stats.first_seen)),
        last_seen_ms: epoch_ms(clock.at(edge.stats.last_seen)),
        count: edge.stats.count,
        source: proto::Source::Ebpf as i32,
        ..FlowRecord::default()
    }
}

/// Milliseconds since the Unix epoch (0 for times before it, which only a wrong clock produces).
pub fn epoch_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
