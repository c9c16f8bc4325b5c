//! One DNS response read for what learning by name needs: the name the query asked, and the addresses
//! it resolved to, through CNAMEs, with their TTL. The wire format is parsed by `simple-dns`; this
//! module decides what of it to believe, and refuses what is outside the bounds (hostile answers).

use simple_dns::rdata::RData;
use simple_dns::{Name, Packet, PacketFlag, RCODE};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use network_enforcer_api::dns_name::MAX_NAME_LEN;
use network_enforcer_api::dns_name::check_label;
/// The most CNAMEs followed from the asked name; resolvers stop at about 8 (BIND), 16 (glibc).
pub const MAX_CHAIN: usize = 8;
/// The most answer records read in one response; more is refused whole (no legitimate answer to one
/// A/AAAA question carries that many, and reading them costs the agent, not the sender).
pub const MAX_RECORDS: usize = 64;

/// What a response says the pod's question resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The transaction id, which ties the response to its query.
    pub id: u16,
    /// The name the query asked, lower-case, without the trailing dot.
    pub name: String,
    /// The addresses the name resolves to, each with the smallest TTL (seconds) along its CNAME chain;
    /// empty for a negative answer (NXDOMAIN, no data).
    pub addresses: Vec<(IpAddr, u32)>,
}

/// Why a response is not read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    #[error("not a DNS message: {0}")]
    Malformed(String),
    #[error("a query, not a response")]
    NotAResponse,
    #[error("{0} questions: a response to exactly one question is expected")]
    Questions(usize),
    #[error("a name of {0} bytes: longer than {MAX_NAME_LEN}")]
    NameTooLong(usize),
    #[error("a name with a label that is not a host name (ASCII letters, digits, '-', '_')")]
    NotAHostName,
    #[error("{0} answer records: more than {MAX_RECORDS}")]
    TooManyRecords(usize),
    #[error("a CNAME chain longer than {MAX_CHAIN}")]
    ChainTooLong,
}

/// Reads the DNS response `payload` (a UDP datagram's payload, or a TCP message without its length
/// prefix).
pub fn read_answer(payload: &[u8]) -> Result<Answer, DnsError> {
    let packet = Packet::parse(payload).map_err(|e| DnsError::Malformed(e.to_string()))?;
    if !packet.has_flags(PacketFlag::RESPONSE) {
        return Err(DnsError::NotAResponse);
    }
    let [question] = packet.questions.as_slice() else {
        return Err(DnsError::Questions(packet.questions.len()));
    };
    if packet.answers.len() > MAX_RECORDS {
        return Err(DnsError::TooManyRecords(packet.answers.len()));
    }
    let name = host_name(&question.qname)?;
    let mut addresses = Vec::new();
    if packet.rcode() == RCODE::NoError {
        // Walk the chain from the asked name: each step is the name a CNAME of the current one points
        // to, carrying the smallest TTL so far. Records of names outside the chain are ignored.
        let mut current = name.clone();
        let mut ttl = u32::MAX;
        for step in 0..=MAX_CHAIN {
            for record in &packet.answers {
                if host_name(&record.name).ok().as_deref() != Some(current.as_str()) {
                    continue;
                }
                let address = match &record.rdata {
                    RData::A(a) => IpAddr::V4(Ipv4Addr::from(a.address)),
                    RData::AAAA(a) => IpAddr::V6(Ipv6Addr::from(a.address)),
                    _ => continue,
                };
                let ttl = ttl.min(record.ttl);
                if !addresses.iter().any(|(a, _)| *a == address) {
                    addresses.push((address, ttl));
                }
            }
            let next = packet
                .answers
                .iter()
                .find_map(|record| match &record.rdata {
                    RData::CNAME(target)
                        if host_name(&record.name).ok().as_deref() == Some(current.as_str()) =>
                    {
                        Some((host_name(&target.0), record.ttl))
                    }
                    _ => None,
                });
            let Some((target, cname_ttl)) = next else {
                break;
            };
            if step == MAX_CHAIN {
                return Err(DnsError::ChainTooLong);
            }
            current = target?;
            ttl = ttl.min(cname_ttl);
        }
    }
    Ok(Answer {
        id: packet.id(),
        name,
        addresses,
    })
}

/// A name's text form, lower-case, when every label is a host-name label
/// ([`network_enforcer_api::dns_name`]).
pub(super) fn host_name(name: &Name) -> Result<String, DnsError> {
    let mut text = String::new();
    for label in name.as_bytes() {
        check_label(label).map_err(|_| DnsError::NotAHostName)?;
        if !text.is_empty() {
            text.push('.');
        }
        text.extend(label.iter().map(|b| b.to_ascii_lowercase() as char));
        if text.len() > MAX_NAME_LEN {
            return Err(DnsError::NameTooLong(text.len()));
        }
    }
    Ok(text)
}
