//! One DNS response read for what learning by name needs: the name the query asked, and the addresses
//! it resolved to, through CNAMEs, with their TTL. The wire format is read in place with the `domain`
//! crate ([`super::wire`]); this module decides what of it to believe, and refuses what is outside the bounds (hostile
//! answers).

use super::wire::{self, Data, Message, Name};
use smallvec::SmallVec;
use std::net::IpAddr;

pub use network_enforcer_api::dns_name::MAX_NAME_LEN;
use network_enforcer_api::dns_name::check_label;
/// The most CNAMEs followed from the asked name; resolvers stop at about 8 (BIND), 16 (glibc).
pub const MAX_CHAIN: usize = 8;
pub use super::wire::MAX_RECORDS;

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
    let response = read_response(payload)?;
    Ok(Answer {
        id: response.id,
        name: host_name(&response.question)?,
        addresses: response.addresses.into_vec(),
    })
}

/// Addresses of a response: most carry a few, kept inline.
pub(super) type Addresses = SmallVec<[(IpAddr, u32); 8]>;

/// [`Answer`] without copying the name out of the message.
pub(super) struct Response<'a> {
    pub id: u16,
    /// The asked name (a host name).
    pub question: Name<'a>,
    pub addresses: Addresses,
}

/// [`read_answer`], allocating nothing unless a response carries more than 4 address and CNAME
/// records, or more than 8 addresses.
pub(super) fn read_response(payload: &[u8]) -> Result<Response<'_>, DnsError> {
    let response = read_response_unchecked(payload)?;
    check_host_name(&response.question)?;
    Ok(response)
}

/// [`read_response`] without checking that the question is a host name: for a caller that compares
/// it with a host name it holds (and checks it only when it is not that one).
pub(super) fn read_response_unchecked(payload: &[u8]) -> Result<Response<'_>, DnsError> {
    let message = Message::parse(payload).map_err(|e| DnsError::Malformed(e.to_string()))?;
    if !message.is_response() {
        return Err(DnsError::NotAResponse);
    }
    let (1, Some(question)) = (message.questions, message.question()) else {
        return Err(DnsError::Questions(usize::from(message.questions)));
    };
    if usize::from(message.answers) > MAX_RECORDS {
        return Err(DnsError::TooManyRecords(usize::from(message.answers)));
    }
    let mut addresses = Addresses::new();
    if message.rcode() == 0 {
        // Walk the chain from the asked name: each step is the name a CNAME of the current one points
        // to, carrying the smallest TTL so far. Records of names outside the chain are ignored.
        let records = message.answer_records();
        let mut current = question;
        let mut ttl = u32::MAX;
        for step in 0..=MAX_CHAIN {
            let mut next = None;
            for record in records.iter().filter(|r| r.owner == current) {
                match record.data {
                    Data::Address(address) => {
                        let ttl = ttl.min(record.ttl);
                        if !addresses.iter().any(|(a, _)| *a == address) {
                            addresses.push((address, ttl));
                        }
                    }
                    Data::Cname(target) => {
                        next.get_or_insert((target, record.ttl));
                    }
                }
            }
            let Some((target, cname_ttl)) = next else {
                break;
            };
            if step == MAX_CHAIN {
                return Err(DnsError::ChainTooLong);
            }
            current = target;
            check_host_name(&current)?;
            ttl = ttl.min(cname_ttl);
        }
    }
    Ok(Response {
        id: message.id,
        question,
        addresses,
    })
}

/// Checks that every label of `name` is a host-name label ([`network_enforcer_api::dns_name`]) and
/// that its text form is at most [`MAX_NAME_LEN`] bytes; that length.
pub(super) fn check_host_name(name: &Name<'_>) -> Result<usize, DnsError> {
    let mut len = 0;
    for label in wire::labels(name) {
        check_label(label).map_err(|_| DnsError::NotAHostName)?;
        len += usize::from(len > 0) + label.len();
        if len > MAX_NAME_LEN {
            return Err(DnsError::NameTooLong(len));
        }
    }
    Ok(len)
}

/// The host name `name`: its text form, lower-case, without the trailing dot ([`check_host_name`]).
pub(super) fn host_name(name: &Name<'_>) -> Result<String, DnsError> {
    let mut text = [0u8; MAX_NAME_LEN];
    lower_host_name(name, &mut text).map(String::from)
}

/// [`host_name`], written into `text`: [`check_host_name`] and the copy in one walk over the labels.
pub(super) fn lower_host_name<'t>(
    name: &Name<'_>,
    text: &'t mut [u8; MAX_NAME_LEN],
) -> Result<&'t str, DnsError> {
    let mut len = 0;
    for label in wire::labels(name) {
        check_label(label).map_err(|_| DnsError::NotAHostName)?;
        let dot = usize::from(len > 0);
        let end = len + dot + label.len();
        let Some(out) = text.get_mut(len..end) else {
            return Err(DnsError::NameTooLong(end));
        };
        let (sep, rest) = out.split_at_mut(dot);
        sep.fill(b'.');
        for (o, b) in rest.iter_mut().zip(label) {
            *o = b.to_ascii_lowercase();
        }
        len = end;
    }
    // Host-name labels are ASCII.
    std::str::from_utf8(&text[..len]).map_err(|_| DnsError::NotAHostName)
}
