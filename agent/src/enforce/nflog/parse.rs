//! Received bytes to denied packets: the log messages of a datagram, and the IP and transport
//! headers of each packet. Pure, never panics on hostile input.

use super::*;

/// Why received bytes could not be read as log messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("netlink header truncated: {available} bytes left, a header needs {NLMSG_HDRLEN}")]
    TruncatedNetlinkHeader { available: usize },
    #[error(
        "netlink message claims {length} bytes, {available} are left (and at least {NLMSG_HDRLEN} are needed)"
    )]
    BadNetlinkLength { length: u32, available: usize },
    #[error(
        "nfnetlink message of {length} bytes has no room for its {NFGENMSG_LEN}-byte nfgenmsg header"
    )]
    TruncatedNfgenmsg { length: usize },
    #[error("attribute header truncated at offset {offset}: {available} bytes left")]
    TruncatedAttribute { offset: usize, available: usize },
    #[error("attribute {kind} at offset {offset} claims {length} bytes, {available} are left")]
    BadAttributeLength {
        kind: u16,
        offset: usize,
        length: u16,
        available: usize,
    },
    #[error("log message has no prefix attribute")]
    NoPrefix,
    #[error("log message has no payload attribute (is the group's copy mode `packet`?)")]
    NoPayload,
    #[error("queued message has no packet header (no id to give its verdict)")]
    NoPacketId,
    #[error("payload of {length} bytes is too short for an IPv{version} header")]
    TruncatedIpHeader { version: u8, length: usize },
    #[error("payload is neither IPv4 nor IPv6 (version {0})")]
    UnknownIpVersion(u8),
    #[error("IPv6 extension headers run past the {length} copied bytes (raise the copy range)")]
    TruncatedExtensionHeader { length: usize },
    #[error(
        "protocol {protocol} header truncated: {available} bytes after the IP header, the ports need 4 (raise the copy range)"
    )]
    TruncatedTransportHeader { protocol: u8, available: usize },
}

/// What one received datagram held.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// Our denied packets, in the order the kernel logged them.
    pub denied: Vec<Denied>,
    /// Log messages with someone else's prefix (another rule logging to the same group): ignored.
    pub other_prefix: u64,
    /// Messages that could not be read; a broken netlink header also ends the datagram.
    pub malformed: u64,
    /// The first reason something could not be read, for the log.
    pub first_error: Option<ParseError>,
}

impl Parsed {
    fn malformed(&mut self, error: ParseError) {
        self.malformed += 1;
        self.first_error.get_or_insert(error);
    }
}

/// Reads one datagram from the log socket: every NFULNL_MSG_PACKET in it with one of our prefixes
/// becomes a [`Denied`]. Never fails: what cannot be read is counted in [`Parsed::malformed`].
pub fn parse_datagram(bytes: &[u8]) -> Parsed {
    let mut parsed = Parsed::default();
    for message in NetlinkMessages::new(bytes) {
        let message = match message {
            Ok(message) => message,
            Err(error) => {
                parsed.malformed(error);
                break;
            }
        };
        // Acknowledgements and anything else that is not a logged packet are not evidence.
        if message.kind != (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET {
            continue;
        }
        match parse_packet(message.body) {
            Ok(Some(denied)) => parsed.denied.push(denied),
            Ok(None) => parsed.other_prefix += 1,
            Err(error) => parsed.malformed(error),
        }
    }
    parsed
}

/// Reads the body of one NFULNL_MSG_PACKET message (nfgenmsg and attributes, after the netlink
/// header). `Ok(None)` when the prefix is not one of ours.
pub fn parse_packet(body: &[u8]) -> Result<Option<Denied>, ParseError> {
    let mut prefix = None;
    let mut payload = None;
    for attribute in attributes(body) {
        let (kind, data) = attribute?;
        match kind {
            NFULA_PREFIX => prefix = Some(data),
            NFULA_PAYLOAD => payload = Some(data),
            _ => {}
        }
    }
    let prefix = prefix.ok_or(ParseError::NoPrefix)?;
    // The kernel sends the prefix NUL-terminated.
    let prefix = prefix.split(|&b| b == 0).next().unwrap_or_default();
    let Some(direction) = DenyDirection::from_prefix(prefix) else {
        return Ok(None);
    };
    let payload = payload.ok_or(ParseError::NoPayload)?;
    let (protocol, source, destination) = parse_ip(payload)?;
    Ok(Some(Denied {
        direction,
        protocol,
        source,
        destination,
    }))
}

/// The attributes (kind, data) of an nfnetlink message's body (nfgenmsg, then attributes); yields an
/// error once and stops at the first broken one.
pub(crate) fn attributes(body: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), ParseError>> {
    let mut rest = body.get(NFGENMSG_LEN..);
    let mut offset = NFGENMSG_LEN;
    std::iter::from_fn(move || {
        let Some(attributes) = rest else {
            rest = Some(&[]);
            return Some(Err(ParseError::TruncatedNfgenmsg { length: body.len() }));
        };
        if attributes.is_empty() {
            return None;
        }
        let available = attributes.len();
        rest = Some(&[]);
        let Some(header) = attributes.get(..NLA_HDRLEN) else {
            return Some(Err(ParseError::TruncatedAttribute { offset, available }));
        };
        let length = u16::from_ne_bytes([header[0], header[1]]);
        let kind = u16::from_ne_bytes([header[2], header[3]]) & NLA_TYPE_MASK;
        let len = usize::from(length);
        if len < NLA_HDRLEN || len > available {
            return Some(Err(ParseError::BadAttributeLength {
                kind,
                offset,
                length,
                available,
            }));
        }
        let next = align4(len).min(available);
        rest = Some(&attributes[next..]);
        offset += next;
        Some(Ok((kind, &attributes[NLA_HDRLEN..len])))
    })
}

/// Protocol and addresses of an IP packet's head (the NFLOG payload starts at the IP header).
fn parse_ip(packet: &[u8]) -> Result<(u8, SocketAddr, SocketAddr), ParseError> {
    let Some(&first) = packet.first() else {
        return Err(ParseError::TruncatedIpHeader {
            version: 0,
            length: 0,
        });
    };
    let length = packet.len();
    match first >> 4 {
        4 => {
            let header_len = usize::from(first & 0x0f) * 4;
            if length < 20 || header_len < 20 || header_len > length {
                return Err(ParseError::TruncatedIpHeader { version: 4, length });
            }
            let protocol = packet[9];
            let source = Ipv4Addr::new(packet[12], packet[13], packet[14], packet[15]);
            let destination = Ipv4Addr::new(packet[16], packet[17], packet[18], packet[19]);
            // Later fragments carry no transport header.
            let fragment_offset = u16::from_be_bytes([packet[6], packet[7]]) & 0x1fff;
            let (sport, dport) = if fragment_offset == 0 {
                ports(protocol, &packet[header_len..])?
            } else {
                (0, 0)
            };
            Ok((
                protocol,
                SocketAddr::new(IpAddr::V4(source), sport),
                SocketAddr::new(IpAddr::V4(destination), dport),
            ))
        }
        6 => {
            if length < 40 {
                return Err(ParseError::TruncatedIpHeader { version: 6, length });
            }
            let address = |at: usize| {
                let mut octets = [0u8; 16];
                octets.copy_from_slice(&packet[at..at + 16]);
                Ipv6Addr::from(octets)
            };
            let (source, destination) = (address(8), address(24));
            let (protocol, transport, first_fragment) = skip_ipv6_extensions(packet)?;
            let (sport, dport) = if first_fragment {
                ports(protocol, transport)?
            } else {
                (0, 0)
            };
            Ok((
                protocol,
                SocketAddr::new(IpAddr::V6(source), sport),
                SocketAddr::new(IpAddr::V6(destination), dport),
            ))
        }
        version => Err(ParseError::UnknownIpVersion(version)),
    }
}

/// Follows an IPv6 packet's extension headers to the upper-layer protocol: (protocol, its bytes,
/// whether they start a transport header, i.e. this is not a later fragment).
fn skip_ipv6_extensions(packet: &[u8]) -> Result<(u8, &[u8], bool), ParseError> {
    const HOP_BY_HOP: u8 = 0;
    const ROUTING: u8 = 43;
    const FRAGMENT: u8 = 44;
    const AUTHENTICATION: u8 = 51;
    const DESTINATION_OPTIONS: u8 = 60;
    let truncated = ParseError::TruncatedExtensionHeader {
        length: packet.len(),
    };
    let mut next = packet[6];
    let mut offset = 40;
    let mut first_fragment = true;
    // Real packets have a handful; the bound keeps hostile chains cheap.
    for _ in 0..16 {
        let header_len = match next {
            HOP_BY_HOP | ROUTING | DESTINATION_OPTIONS => {
                let length = packet.get(offset + 1).ok_or(truncated.clone())?;
                (usize::from(*length) + 1) * 8
            }
            AUTHENTICATION => {
                let length = packet.get(offset + 1).ok_or(truncated.clone())?;
                (usize::from(*length) + 2) * 4
            }
            FRAGMENT => {
                let field = packet
                    .get(offset + 2..offset + 4)
                    .ok_or(truncated.clone())?;
                if u16::from_be_bytes([field[0], field[1]]) >> 3 != 0 {
                    first_fragment = false;
                }
                8
            }
            _ => return Ok((next, packet.get(offset..).unwrap_or(&[]), first_fragment)),
        };
        next = *packet.get(offset).ok_or(truncated.clone())?;
        offset += header_len;
    }
    Err(truncated)
}

/// Source and destination ports of protocols that have them at the start of their header.
fn ports(protocol: u8, transport: &[u8]) -> Result<(u16, u16), ParseError> {
    match protocol {
        IPPROTO_TCP | IPPROTO_UDP | IPPROTO_SCTP => match transport.get(..4) {
            Some(p) => Ok((
                u16::from_be_bytes([p[0], p[1]]),
                u16::from_be_bytes([p[2], p[3]]),
            )),
            None => Err(ParseError::TruncatedTransportHeader {
                protocol,
                available: transport.len(),
            }),
        },
        _ => Ok((0, 0)),
    }
}
