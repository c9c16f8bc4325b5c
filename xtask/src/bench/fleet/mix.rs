//! What the agents send.

use super::*;

/// One agent's traffic mix over the pods of its node.
pub(super) struct Mix {
    locals: Vec<(LocalPod, usize)>,
    pod_ips: Arc<Vec<(Ipv4Addr, usize)>>,
    services: Arc<Vec<Ipv4Addr>>,
    state: u64,
    next_local: usize,
    /// The steady profile: the agent's known edges, sent round-robin (`next_known`).
    known: Vec<FlowRecord>,
    next_known: usize,
}

impl Mix {
    pub(super) fn new(
        agent: &AgentSpec,
        pod_ips: Arc<Vec<(Ipv4Addr, usize)>>,
        services: Arc<Vec<Ipv4Addr>>,
        seed: u64,
        profile: Profile,
    ) -> Self {
        let mut mix = Self {
            locals: agent.pods.clone(),
            pod_ips,
            services,
            state: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
            next_local: 0,
            known: Vec::new(),
            next_known: 0,
        };
        if let Profile::Steady { edges } = profile {
            // Drawn from the storm's mix: the same shares of peers, ports and directions.
            mix.known = mix.drawn(edges, false);
            mix.next_known = seed as usize % edges.max(1);
        }
        mix
    }

    /// One batch: the storm's `n` records drawn afresh, or the steady profile's next `n` known
    /// edges (each sent once per round, the refresh's cadence) with the new edge learned for good.
    pub(super) fn records(&mut self, n: usize, new_edge: bool) -> Vec<FlowRecord> {
        if self.known.is_empty() {
            return self.drawn(n, new_edge);
        }
        let now = now_ms();
        let mut records = Vec::with_capacity(n + 1);
        for _ in 0..n.min(self.known.len()) {
            let mut record = self.known[self.next_known % self.known.len()].clone();
            self.next_known += 1;
            // What a refresh carries: the occurrences merged since the last one.
            record.first_seen_ms = now - STEADY_REFRESH.as_millis() as i64;
            record.last_seen_ms = now;
            records.push(record);
        }
        if new_edge {
            let fresh = self.drawn(1, true);
            self.known.extend(fresh.iter().cloned());
            records.extend(fresh);
        }
        records
    }

    /// xorshift64*.
    fn next(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// `n` records seen just now: 55% outbound to pods, 15% inbound from pods, 15% to Service
    /// ClusterIPs, 10% to external addresses ([`EXTERNAL_PEERS`] of them), 5% UDP to pods; with `new_edge`, the first
    /// goes to a pod on a port in 20000.. (a rule the fleet may not have learned yet).
    fn drawn(&mut self, n: usize, new_edge: bool) -> Vec<FlowRecord> {
        let now = now_ms();
        let mut records = Vec::with_capacity(n);
        for i in 0..n {
            let (local, local_app) = self.locals[self.next_local % self.locals.len()].clone();
            self.next_local += 1;
            let r = self.next();
            let kind = r % 100;
            let (peer_ip, peer_app) = self.pod_ips[(r >> 8) as usize % self.pod_ips.len()];
            use uplink::{Direction as D, Protocol as P};
            let (peer, port, protocol, direction) = if i == 0 && new_edge {
                (
                    peer_ip,
                    20_000 + (r >> 32) % NEW_EDGE_PORTS,
                    P::Tcp,
                    D::Outbound,
                )
            } else if kind < 55 {
                (peer_ip, 8000 + peer_app as u64, P::Tcp, D::Outbound)
            } else if kind < 70 {
                (peer_ip, 8000 + local_app as u64, P::Tcp, D::Inbound)
            } else if kind < 85 {
                let svc = self.services[(r >> 8) as usize % self.services.len()];
                (svc, 80, P::Tcp, D::Outbound)
            } else if kind < 95 {
                (
                    Ipv4Addr::new(203, 0, 113, ((r >> 8) % EXTERNAL_PEERS) as u8 + 1),
                    443,
                    P::Tcp,
                    D::Outbound,
                )
            } else {
                (peer_ip, 5353, P::Udp, D::Outbound)
            };
            let outcome = if protocol == P::Udp {
                uplink::Outcome::Datagram
            } else {
                uplink::Outcome::Established
            };
            records.push(FlowRecord {
                local: Some(local),
                peer_ip: peer.octets().to_vec(),
                port: port as u32,
                protocol: protocol as i32,
                direction: direction as i32,
                outcome: outcome as i32,
                first_seen_ms: now - 900,
                last_seen_ms: now,
                count: 1 + (r >> 40) % 8,
                source: uplink::Source::Ebpf as i32,
                ..FlowRecord::default()
            });
        }
        records
    }
}

/// Milliseconds since the epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
