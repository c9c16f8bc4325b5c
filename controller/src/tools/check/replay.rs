//! Replaying recorded agent records (`flows -o json` lines) against the scenario's policies: what
//! went through and would now be denied, and what failed and would now pass.

use super::*;
use network_enforcer_api::dns_name::host_name;

impl Checker {
    /// Replays recorded agent records against the scenario's policies (see [`parse_records`]).
    /// Both ends of a record are mapped to the scenario's pods by IP; records of the same flow
    /// (the client's outbound and the server's inbound copy) are evaluated once. An outbound record
    /// whose peer the agent named by the name its pod resolved it from ([`AgentRecord::resolved_name`])
    /// is judged with that name, as monitor judges it (`spec.egressNames`).
    pub fn replay(&self, records: &[AgentRecord]) -> ReplayReport {
        let mut flows: BTreeMap<(IpAddr, IpAddr, Protocol, u16), ReplayedFlow> = BTreeMap::new();
        for record in records {
            let (source, destination) = match record.direction {
                RecordDirection::Outbound => (record.local_ip, record.peer_ip),
                RecordDirection::Inbound => (record.peer_ip, record.local_ip),
            };
            let entry = flows
                .entry((source, destination, record.protocol, record.port))
                .or_insert_with(|| ReplayedFlow {
                    from: self.peer_of(source),
                    to: self.peer_of(destination),
                    passed: 0,
                    failed: 0,
                });
            if entry.to.name.is_none() && entry.to.pod.is_none() {
                entry.to.name = record.resolved_name();
            }
            match record.outcome {
                // Counts come from a file: add without overflowing.
                RecordOutcome::Established | RecordOutcome::Datagram => {
                    entry.passed = entry.passed.saturating_add(record.count)
                }
                RecordOutcome::Failed => entry.failed = entry.failed.saturating_add(record.count),
            }
        }
        let mut report = ReplayReport {
            records: records.len(),
            flows: flows.len(),
            unchanged: 0,
            would_deny: Vec::new(),
            would_allow: Vec::new(),
        };
        for ((source, destination, protocol, port), flow) in flows {
            let (egress, ingress) = self.evaluate(
                &Flow {
                    source: self.address(source),
                    destination: self.address(destination),
                    protocol,
                    port,
                },
                flow.to.name.as_deref(),
                false,
            );
            let allowed = egress.allowed && ingress.allowed;
            let change = ReplayChange {
                from: flow.from,
                to: flow.to,
                protocol,
                port,
                passed: flow.passed,
                failed: flow.failed,
                egress,
                ingress,
            };
            if !allowed && change.passed > 0 {
                report.would_deny.push(change);
            } else if allowed && change.passed == 0 {
                report.would_allow.push(change);
            } else {
                report.unchanged += 1;
            }
        }
        report
    }

    fn peer_of(&self, ip: IpAddr) -> ScenarioPeer {
        match self.pods_by_ip.get(&ip) {
            Some(key) => ScenarioPeer {
                pod: Some(key.to_string()),
                ip: None,
                name: None,
            },
            None => ScenarioPeer {
                pod: None,
                ip: Some(ip),
                name: None,
            },
        }
    }
}

struct ReplayedFlow {
    from: ScenarioPeer,
    to: ScenarioPeer,
    passed: u64,
    failed: u64,
}

/// Direction of a recorded edge, as the agent's `flows -o json` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordDirection {
    /// The local pod opened the connection (or sent the datagram) to the peer.
    Outbound,
    /// The peer connected to the local pod.
    Inbound,
}

/// Outcome of a recorded edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordOutcome {
    Established,
    Failed,
    Datagram,
}

/// One agent record, as a line of `network-enforcer-agent flows -o json` (other fields ignored).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct AgentRecord {
    pub local_ip: IpAddr,
    pub peer_ip: IpAddr,
    /// The service port: the peer's port for outbound edges, the local one for inbound.
    pub port: u16,
    #[serde(deserialize_with = "lowercase_protocol")]
    pub protocol: Protocol,
    pub direction: RecordDirection,
    pub outcome: RecordOutcome,
    /// How many connections or datagrams the edge stands for.
    #[serde(default = "one")]
    pub count: u64,
    /// The peer as the agent named it: a Service, pod or node (`svc demo/db`, `demo/api-7d9c`,
    /// `node/worker-1`), or, for an outside address, the name the local pod resolved it from.
    #[serde(default)]
    pub peer: Option<String>,
}

impl AgentRecord {
    /// The name the local pod resolved the peer's address from, for an outbound record: a `peer`
    /// that is a host name (names of Services, pods and nodes hold a `/`, so they are none).
    pub fn resolved_name(&self) -> Option<String> {
        if self.direction != RecordDirection::Outbound {
            return None;
        }
        host_name(self.peer.as_deref()?).ok()
    }
}

fn one() -> u64 {
    1
}

fn lowercase_protocol<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Protocol, D::Error> {
    let name = String::deserialize(d)?;
    Protocol::from_lowercase(&name.to_ascii_lowercase()).ok_or_else(|| {
        serde::de::Error::custom(format!(
            "unknown protocol {name:?}: expected tcp, udp or sctp"
        ))
    })
}

/// Parses JSON lines of agent records; blank lines are skipped. Errors name the line and field
/// (`line 3: peer_ip: ...`).
pub fn parse_records(text: &str) -> Result<Vec<AgentRecord>, CheckError> {
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let field = format!("line {}", i + 1);
        let value: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| CheckError::new(&field, format!("invalid JSON: {e}")))?;
        records.push(from_value(&field, value)?);
    }
    Ok(records)
}

/// One replayed flow whose verdict differs from what the records show.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplayChange {
    pub from: ScenarioPeer,
    pub to: ScenarioPeer,
    pub protocol: Protocol,
    pub port: u16,
    /// Connections or datagrams recorded as gone through.
    pub passed: u64,
    /// Connection attempts recorded as failed.
    pub failed: u64,
    pub egress: Side,
    pub ingress: Side,
}

/// The would-deny diff of a replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// Records read.
    pub records: usize,
    /// Distinct flows (source, destination, protocol, port) among them.
    pub flows: usize,
    /// Flows whose verdict matches what was recorded.
    pub unchanged: usize,
    /// Flows that went through and the policies would deny.
    pub would_deny: Vec<ReplayChange>,
    /// Flows that only ever failed and the policies would allow (they may have failed for another
    /// reason than a policy).
    pub would_allow: Vec<ReplayChange>,
}

impl ReplayReport {
    /// The diff for people: `-` for flows the policies would deny, `+` for failed flows they would
    /// allow, then a summary line.
    pub fn render_table(&self) -> String {
        let mut rows = Vec::new();
        for (sign, changes) in [("-", &self.would_deny), ("+", &self.would_allow)] {
            for c in changes {
                rows.push(vec![
                    sign.to_string(),
                    peer_text(&c.from),
                    peer_text(&c.to),
                    c.protocol.to_string(),
                    c.port.to_string(),
                    c.passed.to_string(),
                    c.failed.to_string(),
                    side_text(&c.egress),
                    side_text(&c.ingress),
                ]);
            }
        }
        let mut out = table(
            &[
                "", "FROM", "TO", "PROTO", "PORT", "PASSED", "FAILED", "EGRESS", "INGRESS",
            ],
            &rows,
        );
        let _ = writeln!(
            out,
            "{} record(s), {} flow(s): {} would be denied, {} would be allowed, {} unchanged",
            self.records,
            self.flows,
            self.would_deny.len(),
            self.would_allow.len(),
            self.unchanged
        );
        out
    }
}
