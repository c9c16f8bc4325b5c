//! Deny evidence: the packets the enforcement table drops, read from their NFLOG group.
//!
//! The table's deny rules end with `log prefix "ne-deny ingress"|"ne-deny egress" group G ... drop`:
//! the kernel (nfnetlink_log) sends the head of each such packet to the netlink socket bound to
//! group G of that network namespace. Reading order:
//! - [`parse_datagram`] / [`parse_packet`]: received bytes → [`Denied`] packets (pure, never panics
//!   on hostile input);
//! - [`Dedupe`]: one report per attempt rather than per retransmission (pure, bounded);
//! - [`NflogReader`]: the `NETLINK_NETFILTER` socket: group bind, copy mode, async receive;
//! - [`spawn`]: reader and dedupe as a task feeding a channel, with [`NflogCounters`] for `/metrics`.

use crate::enforce::nft::{DENY_PREFIX_EGRESS, DENY_PREFIX_INGRESS};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

// Netlink framing (linux/netlink.h). Header fields are in host byte order.
const NLMSG_HDRLEN: usize = 16;
const NLA_HDRLEN: usize = 4;
const NLA_TYPE_MASK: u16 = 0x3fff; // strips NLA_F_NESTED and NLA_F_NET_BYTEORDER
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;

// nfnetlink (linux/netfilter/nfnetlink.h): every message starts with a 4-byte nfgenmsg
// (family, version, big-endian resource id = the NFLOG group).
const NFGENMSG_LEN: usize = 4;
const NFNETLINK_V0: u8 = 0;
const NFNL_SUBSYS_ULOG: u16 = 4;

// nfnetlink_log (linux/netfilter/nfnetlink_log.h). Attribute payloads are big-endian.
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_PAYLOAD: u16 = 9;
const NFULA_PREFIX: u16 = 10;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULA_CFG_NLBUFSIZ: u16 = 3;
const NFULA_CFG_TIMEOUT: u16 = 4;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_CFG_CMD_PF_BIND: u8 = 3;
const NFULNL_CFG_CMD_PF_UNBIND: u8 = 4;
const NFULNL_COPY_PACKET: u8 = 2;

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_SCTP: u8 = 132;

/// Bytes of each denied packet the kernel copies by default: enough for an IPv6 header, a few
/// extension headers and the ports, small enough that a flood of drops stays cheap to read.
pub const DEFAULT_COPY_RANGE: u16 = 128;
/// How long a repeat of the same packet (SYN retransmits, a UDP sender retrying) is not reported
/// again, counted from its first report.
pub const DEFAULT_DEDUPE_WINDOW: Duration = Duration::from_secs(60);
/// How many distinct recent denials [`Dedupe`] remembers.
pub const DEFAULT_DEDUPE_CAPACITY: usize = 4096;

/// The kernel batches log messages up to this size (or the flush timeout) before sending them.
const KERNEL_BATCH_BYTES: u32 = 64 * 1024;
/// Flush timeout of the kernel's batches, in hundredths of a second: denials show up within 100 ms.
const KERNEL_FLUSH_CENTISECONDS: u32 = 10;
/// Our receive buffer: larger than any batch, so a datagram is never cut.
const RECEIVE_BUFFER_BYTES: usize = 2 * KERNEL_BATCH_BYTES as usize;
/// The socket's kernel-side queue: absorbs bursts of drops while the agent is busy.
const SOCKET_QUEUE_BYTES: libc::c_int = 8 * 1024 * 1024;
/// How long setup waits for the kernel to acknowledge a configuration message.
const ACK_TIMEOUT: Duration = Duration::from_secs(2);

/// Which side of the isolated pod refused the packet, from the log prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DenyDirection {
    /// The destination pod's ingress rules refused it.
    Ingress,
    /// The source pod's egress rules refused it.
    Egress,
}

impl DenyDirection {
    /// The direction of one of our log prefixes; `None` for anyone else's.
    pub fn from_prefix(prefix: &[u8]) -> Option<Self> {
        if prefix == DENY_PREFIX_INGRESS.as_bytes() {
            Some(Self::Ingress)
        } else if prefix == DENY_PREFIX_EGRESS.as_bytes() {
            Some(Self::Egress)
        } else {
            None
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }
}

/// One packet the enforcement table dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Denied {
    pub direction: DenyDirection,
    /// IP protocol number (6 TCP, 17 UDP, 132 SCTP, 1 ICMP, 58 ICMPv6...).
    pub protocol: u8,
    /// Ports are 0 for protocols without ports and for non-first fragments.
    pub source: SocketAddr,
    pub destination: SocketAddr,
}

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

/// One netlink message: type, sequence number and the bytes after its header.
struct NetlinkMessage<'a> {
    kind: u16,
    seq: u32,
    body: &'a [u8],
}

/// The netlink messages of a datagram; yields an error once and stops on a broken header.
struct NetlinkMessages<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for NetlinkMessages<'a> {
    type Item = Result<NetlinkMessage<'a>, ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let available = self.rest.len();
        let Some(header) = self.rest.get(..NLMSG_HDRLEN) else {
            self.rest = &[];
            return Some(Err(ParseError::TruncatedNetlinkHeader { available }));
        };
        let length = u32::from_ne_bytes([header[0], header[1], header[2], header[3]]);
        let kind = u16::from_ne_bytes([header[4], header[5]]);
        let seq = u32::from_ne_bytes([header[8], header[9], header[10], header[11]]);
        let len = length as usize;
        if len < NLMSG_HDRLEN || len > available {
            self.rest = &[];
            return Some(Err(ParseError::BadNetlinkLength { length, available }));
        }
        let body = &self.rest[NLMSG_HDRLEN..len];
        // Messages are padded to 4 bytes; the last one may come without its padding.
        self.rest = self.rest.get(align4(len)..).unwrap_or(&[]);
        Some(Ok(NetlinkMessage { kind, seq, body }))
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Reads one datagram from the log socket: every NFULNL_MSG_PACKET in it with one of our prefixes
/// becomes a [`Denied`]. Never fails: what cannot be read is counted in [`Parsed::malformed`].
pub fn parse_datagram(bytes: &[u8]) -> Parsed {
    let mut parsed = Parsed::default();
    for message in (NetlinkMessages { rest: bytes }) {
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
    let Some(mut attributes) = body.get(NFGENMSG_LEN..) else {
        return Err(ParseError::TruncatedNfgenmsg { length: body.len() });
    };
    let mut offset = NFGENMSG_LEN;
    let mut prefix = None;
    let mut payload = None;
    while !attributes.is_empty() {
        let available = attributes.len();
        let Some(header) = attributes.get(..NLA_HDRLEN) else {
            return Err(ParseError::TruncatedAttribute { offset, available });
        };
        let length = u16::from_ne_bytes([header[0], header[1]]);
        let kind = u16::from_ne_bytes([header[2], header[3]]) & NLA_TYPE_MASK;
        let len = usize::from(length);
        if len < NLA_HDRLEN || len > available {
            return Err(ParseError::BadAttributeLength {
                kind,
                offset,
                length,
                available,
            });
        }
        let data = &attributes[NLA_HDRLEN..len];
        match kind {
            NFULA_PREFIX => prefix = Some(data),
            NFULA_PAYLOAD => payload = Some(data),
            _ => {}
        }
        let next = align4(len).min(available);
        attributes = &attributes[next..];
        offset += next;
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

/// Reports each denied attempt once: a refused TCP SYN is retransmitted (after 1 s, 3 s, 7 s...)
/// and a UDP sender may retry, all with the same addresses and ports, while a new connection
/// attempt has a new source port. A denial is suppressed while an identical one was reported less
/// than `window` ago; at most `capacity` are remembered, the oldest evicted first (and counted).
#[derive(Debug)]
pub struct Dedupe {
    capacity: usize,
    window: Duration,
    reported: HashMap<Denied, Instant>,
    /// Report order, which is also expiry order.
    order: VecDeque<(Denied, Instant)>,
    suppressed: u64,
    evicted: u64,
}

impl Dedupe {
    pub fn new(capacity: usize, window: Duration) -> Self {
        let capacity = capacity.max(1);
        Self {
            capacity,
            window,
            reported: HashMap::with_capacity(capacity.min(DEFAULT_DEDUPE_CAPACITY)),
            order: VecDeque::new(),
            suppressed: 0,
            evicted: 0,
        }
    }

    /// Whether `denied`, seen at `now`, is to be reported (the first of its kind in the window).
    pub fn admit(&mut self, denied: &Denied, now: Instant) -> bool {
        while let Some(&(oldest, at)) = self.order.front() {
            if now.saturating_duration_since(at) < self.window {
                break;
            }
            self.order.pop_front();
            self.reported.remove(&oldest);
        }
        if self.reported.contains_key(denied) {
            self.suppressed += 1;
            return false;
        }
        if self.reported.len() >= self.capacity
            && let Some((oldest, _)) = self.order.pop_front()
        {
            self.reported.remove(&oldest);
            self.evicted += 1;
        }
        self.reported.insert(*denied, now);
        self.order.push_back((*denied, now));
        true
    }

    /// Repeats not reported so far.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }

    /// Denials forgotten before their window ended because `capacity` was reached (their repeats
    /// are reported again).
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Denials currently remembered.
    pub fn len(&self) -> usize {
        self.reported.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reported.is_empty()
    }
}

/// What went wrong with the log socket, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum NflogError {
    #[error(
        "could not open a NETLINK_NETFILTER socket ({step}): {source}; the kernel needs nfnetlink \
         (CONFIG_NETFILTER_NETLINK) and the agent CAP_NET_ADMIN"
    )]
    Socket {
        step: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("binding NFLOG group {group} ({step}) failed: {source}; {hint}")]
    Config {
        group: u16,
        step: &'static str,
        #[source]
        source: io::Error,
        hint: &'static str,
    },
    #[error(
        "could not register the NFLOG socket with the tokio reactor: {0}; the reader must be \
         opened inside a tokio runtime with I/O enabled"
    )]
    Reactor(#[source] io::Error),
    #[error("receiving from NFLOG group {group} failed: {source}")]
    Receive {
        group: u16,
        #[source]
        source: io::Error,
    },
}

/// What to do about a refused configuration step.
fn config_hint(error: &io::Error) -> &'static str {
    match error.raw_os_error() {
        // The kernel refuses a group another socket has bound with EPERM too.
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "the agent needs CAP_NET_ADMIN in the network namespace of the enforcement table, and no \
             other process (ulogd, a second agent?) may read this group: stop it or configure another \
             NFLOG group"
        }
        Some(libc::EBUSY) => "this group is already bound: configure another NFLOG group",
        Some(libc::EINVAL)
        | Some(libc::ENOENT)
        | Some(libc::EOPNOTSUPP)
        | Some(libc::EPROTONOSUPPORT) => {
            "the kernel needs nfnetlink_log (`modprobe nfnetlink_log`, CONFIG_NETFILTER_NETLINK_LOG)"
        }
        Some(libc::ETIMEDOUT) => "the kernel did not answer; is nfnetlink_log loaded?",
        _ => "check that nfnetlink_log is available and the agent has CAP_NET_ADMIN",
    }
}

/// Counters of the reader and its task, for `/metrics`. Shared with the task: read them any time.
#[derive(Debug, Default)]
pub struct NflogCounters {
    /// Log messages with one of our prefixes, before dedupe.
    pub logged: AtomicU64,
    /// Log messages with another prefix (ignored).
    pub other_prefix: AtomicU64,
    /// Messages that could not be parsed.
    pub malformed: AtomicU64,
    /// Times the kernel reported it dropped log messages because our socket queue was full
    /// (ENOBUFS); each time may stand for many messages.
    pub kernel_dropped: AtomicU64,
    /// Datagrams larger than our buffer (their tail is lost).
    pub truncated: AtomicU64,
    /// Repeats suppressed by [`Dedupe`].
    pub deduplicated: AtomicU64,
    /// Dedupe entries evicted early because its capacity was reached.
    pub dedupe_evicted: AtomicU64,
    /// Denials dropped because the channel's consumer was behind.
    pub channel_full: AtomicU64,
}

impl NflogCounters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// A socket bound to one NFLOG group in the network namespace of the thread that opened it.
pub struct NflogReader {
    fd: AsyncFd<OwnedFd>,
    group: u16,
    buf: Vec<u8>,
    pending: VecDeque<Denied>,
    counters: Arc<NflogCounters>,
}

impl std::fmt::Debug for NflogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NflogReader")
            .field("fd", &self.fd.get_ref().as_raw_fd())
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl NflogReader {
    /// Binds `group` with packet copy mode (`copy_range` bytes of each packet). Must be called
    /// inside a tokio runtime; the socket stays in the calling thread's network namespace.
    /// Dropping the reader unbinds the group (the kernel may take a moment to free it).
    pub fn open(group: u16, copy_range: u16) -> Result<Self, NflogError> {
        // Registration below panics outside a runtime; an error says more, and before the bind.
        tokio::runtime::Handle::try_current()
            .map_err(|error| NflogError::Reactor(io::Error::other(error)))?;
        let fd = open_socket()?;
        let raw = fd.as_raw_fd();
        let mut buf = vec![0u8; RECEIVE_BUFFER_BYTES];
        let mut seq = 0u32;
        let mut configure =
            |step: &'static str, family: u8, res_id: u16, attrs: &[(u16, &[u8])]| {
                seq += 1;
                let message = config_message(seq, family, res_id, attrs);
                request(raw, seq, &message, &mut buf).map_err(|source| NflogError::Config {
                    group,
                    step,
                    hint: config_hint(&source),
                    source,
                })
            };
        // Kernels since 3.17 ignore the per-family commands; older ones need nfnetlink_log bound as
        // the family's logger. Their failure is not fatal: the group bind below tells what is wrong.
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            for (step, command) in [
                ("unbinding the address family", NFULNL_CFG_CMD_PF_UNBIND),
                ("binding the address family", NFULNL_CFG_CMD_PF_BIND),
            ] {
                if let Err(error) = configure(step, family, 0, &[(NFULA_CFG_CMD, &[command])]) {
                    tracing::debug!(%error, "NFLOG per-family command refused (ignored)");
                }
            }
        }
        let mut mode = [0u8; 6];
        mode[..4].copy_from_slice(&u32::from(copy_range).to_be_bytes());
        mode[4] = NFULNL_COPY_PACKET;
        // One message: the group starts logging with the right mode, never with the defaults.
        configure(
            "bind, copy mode, batch size and flush timeout",
            libc::AF_UNSPEC as u8,
            group,
            &[
                (NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]),
                (NFULA_CFG_MODE, &mode),
                (NFULA_CFG_NLBUFSIZ, &KERNEL_BATCH_BYTES.to_be_bytes()),
                (NFULA_CFG_TIMEOUT, &KERNEL_FLUSH_CENTISECONDS.to_be_bytes()),
            ],
        )?;
        set_nonblocking(raw).map_err(|source| NflogError::Socket {
            step: "O_NONBLOCK",
            source,
        })?;
        // SAFETY: the OwnedFd, owned by the AsyncFd from here on, keeps its descriptor open and
        // unchanged until the AsyncFd is dropped.
        let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|error| NflogError::Reactor(error.into()))?;
        Ok(Self {
            fd,
            group,
            buf,
            pending: VecDeque::new(),
            counters: Arc::default(),
        })
    }

    pub fn group(&self) -> u16 {
        self.group
    }

    pub fn counters(&self) -> Arc<NflogCounters> {
        Arc::clone(&self.counters)
    }

    /// The next denied packet (not deduplicated). Kernel drops (ENOBUFS) and unreadable messages
    /// are counted and skipped; an error is returned only when the socket itself fails.
    pub async fn next(&mut self) -> Result<Denied, NflogError> {
        loop {
            if let Some(denied) = self.pending.pop_front() {
                return Ok(denied);
            }
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|source| NflogError::Receive {
                    group: self.group,
                    source,
                })?;
            let buf = &mut self.buf;
            let received = guard.try_io(|fd| {
                // MSG_TRUNC: the datagram's real length, so a cut datagram is noticed.
                // SAFETY: the pointer and length describe `buf`, which outlives the call.
                let n = unsafe {
                    libc::recv(
                        fd.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_TRUNC,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match received {
                Err(_would_block) => continue,
                Ok(Ok(n)) => self.absorb(n),
                Ok(Err(error)) if error.raw_os_error() == Some(libc::ENOBUFS) => {
                    let before = self.counters.kernel_dropped.fetch_add(1, Ordering::Relaxed);
                    if before == 0 {
                        tracing::warn!(
                            group = self.group,
                            "the kernel dropped NFLOG messages: the agent reads denials slower than \
                             they happen (counted in the kernel-dropped counter; later drops are \
                             logged at debug level)"
                        );
                    } else {
                        tracing::debug!(group = self.group, "the kernel dropped NFLOG messages");
                    }
                }
                Ok(Err(error)) if error.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(source)) => {
                    return Err(NflogError::Receive {
                        group: self.group,
                        source,
                    });
                }
            }
        }
    }

    fn absorb(&mut self, n: usize) {
        let c = &self.counters;
        if n > self.buf.len() {
            NflogCounters::add(&c.truncated, 1);
        }
        let parsed = parse_datagram(&self.buf[..n.min(self.buf.len())]);
        NflogCounters::add(&c.logged, parsed.denied.len() as u64);
        NflogCounters::add(&c.other_prefix, parsed.other_prefix);
        NflogCounters::add(&c.malformed, parsed.malformed);
        if let Some(error) = parsed.first_error {
            tracing::debug!(group = self.group, %error, "unreadable NFLOG message skipped");
        }
        self.pending.extend(parsed.denied);
    }
}

/// Settings of [`spawn`].
#[derive(Debug, Clone)]
pub struct NflogOptions {
    pub copy_range: u16,
    /// Denials queued for the consumer; more are dropped (and counted) rather than blocking the
    /// socket, whose own queue would overflow.
    pub channel_capacity: usize,
    pub dedupe_capacity: usize,
    pub dedupe_window: Duration,
}

impl Default for NflogOptions {
    fn default() -> Self {
        Self {
            copy_range: DEFAULT_COPY_RANGE,
            channel_capacity: 1024,
            dedupe_capacity: DEFAULT_DEDUPE_CAPACITY,
            dedupe_window: DEFAULT_DEDUPE_WINDOW,
        }
    }
}

/// A running reader task.
#[derive(Debug)]
pub struct Nflog {
    /// Deduplicated denials. The task ends (and the group is unbound) when this is dropped.
    pub denied: mpsc::Receiver<Denied>,
    pub counters: Arc<NflogCounters>,
    /// Ends with the socket error that stopped the reader, or `Ok` once `denied` is dropped.
    pub task: tokio::task::JoinHandle<Result<(), NflogError>>,
}

/// Binds `group` (see [`NflogReader::open`]; the socket lives in the calling thread's network
/// namespace) and spawns a task sending each denied attempt once on [`Nflog::denied`].
pub fn spawn(group: u16, options: &NflogOptions) -> Result<Nflog, NflogError> {
    let mut reader = NflogReader::open(group, options.copy_range)?;
    let counters = reader.counters();
    let (sender, denied) = mpsc::channel(options.channel_capacity.max(1));
    let mut dedupe = Dedupe::new(options.dedupe_capacity, options.dedupe_window);
    let task_counters = Arc::clone(&counters);
    let task = tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                next = reader.next() => next?,
                () = sender.closed() => return Ok(()),
            };
            let admitted = dedupe.admit(&next, Instant::now());
            task_counters
                .deduplicated
                .store(dedupe.suppressed(), Ordering::Relaxed);
            task_counters
                .dedupe_evicted
                .store(dedupe.evicted(), Ordering::Relaxed);
            if !admitted {
                continue;
            }
            match sender.try_send(next) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    NflogCounters::add(&task_counters.channel_full, 1);
                }
                Err(mpsc::error::TrySendError::Closed(_)) => return Ok(()),
            }
        }
    });
    Ok(Nflog {
        denied,
        counters,
        task,
    })
}

fn open_socket() -> Result<OwnedFd, NflogError> {
    fn socket_error(step: &'static str) -> impl FnOnce(io::Error) -> NflogError {
        move |source| NflogError::Socket { step, source }
    }
    // SAFETY: plain socket(2) call; the result is checked before use.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_NETFILTER,
        )
    };
    if raw < 0 {
        return Err(socket_error("socket")(io::Error::last_os_error()));
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero sockaddr_nl is valid; nl_pid 0 lets the kernel pick our port id.
    let mut address: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    address.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: the pointer and length describe `address`.
    let rc = unsafe {
        libc::bind(
            raw,
            (&raw const address).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(socket_error("bind")(io::Error::last_os_error()));
    }
    // A deep queue: SO_RCVBUFFORCE passes rmem_max with CAP_NET_ADMIN, SO_RCVBUF is the fallback.
    if setsockopt_int(raw, libc::SO_RCVBUFFORCE, SOCKET_QUEUE_BYTES).is_err() {
        let _ = setsockopt_int(raw, libc::SO_RCVBUF, SOCKET_QUEUE_BYTES);
    }
    // Setup waits for acknowledgements on the still blocking socket; this bounds the wait.
    let timeout = libc::timeval {
        tv_sec: ACK_TIMEOUT.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: the pointer and length describe `timeout`.
    let rc = unsafe {
        libc::setsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(socket_error("SO_RCVTIMEO")(io::Error::last_os_error()));
    }
    Ok(fd)
}

fn setsockopt_int(fd: RawFd, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An NFULNL_MSG_CONFIG request asking for an acknowledgement.
fn config_message(seq: u32, family: u8, res_id: u16, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut message = vec![0u8; NLMSG_HDRLEN];
    message.extend_from_slice(&[family, NFNETLINK_V0]);
    message.extend_from_slice(&res_id.to_be_bytes());
    for (kind, data) in attrs {
        let length = (NLA_HDRLEN + data.len()) as u16;
        message.extend_from_slice(&length.to_ne_bytes());
        message.extend_from_slice(&kind.to_ne_bytes());
        message.extend_from_slice(data);
        message.resize(align4(message.len()), 0);
    }
    let total = message.len() as u32;
    message[0..4].copy_from_slice(&total.to_ne_bytes());
    let kind = (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG;
    message[4..6].copy_from_slice(&kind.to_ne_bytes());
    message[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    message[8..12].copy_from_slice(&seq.to_ne_bytes());
    message
}

/// Sends `message` to the kernel and waits for the acknowledgement of `seq` (blocking socket).
fn request(fd: RawFd, seq: u32, message: &[u8], buf: &mut [u8]) -> io::Result<()> {
    // SAFETY: the pointer and length describe `message`. An unconnected netlink socket sends to
    // the kernel.
    let sent = unsafe { libc::send(fd, message.as_ptr().cast(), message.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let deadline = Instant::now() + ACK_TIMEOUT;
    loop {
        if Instant::now() >= deadline {
            return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
        }
        // SAFETY: the pointer and length describe `buf`.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                Some(libc::EINTR) | Some(libc::ENOBUFS) => continue,
                Some(libc::EAGAIN) => return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT)),
                _ => return Err(error),
            }
        }
        let received = &buf[..(n as usize).min(buf.len())];
        for message in (NetlinkMessages { rest: received }).flatten() {
            if message.kind != NLMSG_ERROR || message.seq != seq {
                continue;
            }
            let Some(code) = message.body.get(..4) else {
                return Err(io::Error::from_raw_os_error(libc::EPROTO));
            };
            let code = i32::from_ne_bytes([code[0], code[1], code[2], code[3]]);
            return match code {
                0 => Ok(()),
                _ => Err(io::Error::from_raw_os_error(code.saturating_neg())),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A netlink message of `kind` around `body`.
    fn netlink(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&0u16.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(body);
        m.resize(align4(m.len()), 0);
        m
    }

    fn attribute(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((NLA_HDRLEN + data.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(data);
        a.resize(align4(a.len()), 0);
        a
    }

    /// The body of a packet message as the kernel builds it: nfgenmsg, packet header, prefix
    /// (NUL-terminated), payload.
    fn packet_body(prefix: &str, payload: &[u8]) -> Vec<u8> {
        let mut body = vec![libc::AF_INET as u8, NFNETLINK_V0, 0, 7];
        body.extend(attribute(1, &[0x08, 0x00, 1, 0])); // NFULA_PACKET_HDR
        let mut prefix = prefix.as_bytes().to_vec();
        prefix.push(0);
        body.extend(attribute(NFULA_PREFIX, &prefix));
        body.extend(attribute(NFULA_PAYLOAD, payload));
        body
    }

    fn packet_message(prefix: &str, payload: &[u8]) -> Vec<u8> {
        netlink(NFNL_SUBSYS_ULOG << 8, &packet_body(prefix, payload))
    }

    fn ipv4(protocol: u8, src: [u8; 4], dst: [u8; 4], transport: &[u8]) -> Vec<u8> {
        let mut p = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, protocol, 0, 0];
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.extend_from_slice(transport);
        p
    }

    fn ipv6(next: u8, src: Ipv6Addr, dst: Ipv6Addr, rest: &[u8]) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0, 0, 0, next, 64];
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(rest);
        p
    }

    /// The first bytes of a TCP or UDP header with these ports.
    fn l4(sport: u16, dport: u16) -> Vec<u8> {
        let mut t = sport.to_be_bytes().to_vec();
        t.extend_from_slice(&dport.to_be_bytes());
        t.extend_from_slice(&[0; 16]);
        t
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn tcp4_syn() -> Vec<u8> {
        ipv4(6, [10, 0, 0, 1], [10, 0, 0, 2], &l4(40000, 80))
    }

    #[test]
    fn packet_table() {
        let v6a: Ipv6Addr = "fd00::1".parse().unwrap();
        let v6b: Ipv6Addr = "fd00::2".parse().unwrap();
        let denied = |direction, protocol, source: &str, destination: &str| {
            Ok(Some(Denied {
                direction,
                protocol,
                source: addr(source),
                destination: addr(destination),
            }))
        };
        use DenyDirection::{Egress, Ingress};
        let mut fragment = tcp4_syn();
        fragment[6] = 0x00;
        fragment[7] = 0x10; // offset 16 * 8 bytes: no transport header
        let mut v4_options = ipv4(17, [10, 0, 0, 1], [10, 0, 0, 2], &[]);
        v4_options[0] = 0x46; // one word of options before the UDP header
        v4_options.extend_from_slice(&[1, 1, 1, 1]);
        v4_options.extend(l4(53, 5353));
        let mut hop_by_hop = vec![17, 0, 0, 0, 0, 0, 0, 0];
        hop_by_hop.extend(l4(1000, 2000));
        let later_fragment = [17u8, 0, 0, 0x08, 0, 0, 0, 1]; // offset 1
        let first_fragment = {
            let mut f = vec![6u8, 0, 0, 0x01, 0, 0, 0, 1]; // offset 0, more fragments
            f.extend(l4(3, 4));
            f
        };
        // (name, message body, expected)
        type Case = (&'static str, Vec<u8>, Result<Option<Denied>, ParseError>);
        let cases: Vec<Case> = vec![
            (
                "IPv4 TCP ingress",
                packet_body("ne-deny ingress", &tcp4_syn()),
                denied(Ingress, 6, "10.0.0.1:40000", "10.0.0.2:80"),
            ),
            (
                "IPv6 UDP egress",
                packet_body("ne-deny egress", &ipv6(17, v6a, v6b, &l4(5000, 53))),
                denied(Egress, 17, "[fd00::1]:5000", "[fd00::2]:53"),
            ),
            (
                "IPv4 with options",
                packet_body("ne-deny egress", &v4_options),
                denied(Egress, 17, "10.0.0.1:53", "10.0.0.2:5353"),
            ),
            (
                "IPv6 hop-by-hop then UDP",
                packet_body("ne-deny ingress", &ipv6(0, v6a, v6b, &hop_by_hop)),
                denied(Ingress, 17, "[fd00::1]:1000", "[fd00::2]:2000"),
            ),
            (
                "IPv6 first fragment has ports",
                packet_body("ne-deny ingress", &ipv6(44, v6a, v6b, &first_fragment)),
                denied(Ingress, 6, "[fd00::1]:3", "[fd00::2]:4"),
            ),
            (
                "IPv6 later fragment has none",
                packet_body("ne-deny ingress", &ipv6(44, v6a, v6b, &later_fragment)),
                denied(Ingress, 17, "[fd00::1]:0", "[fd00::2]:0"),
            ),
            (
                "IPv4 later fragment has none",
                packet_body("ne-deny ingress", &fragment),
                denied(Ingress, 6, "10.0.0.1:0", "10.0.0.2:0"),
            ),
            (
                "ICMP has no ports",
                packet_body(
                    "ne-deny ingress",
                    &ipv4(1, [10, 0, 0, 1], [10, 0, 0, 2], &[8, 0]),
                ),
                denied(Ingress, 1, "10.0.0.1:0", "10.0.0.2:0"),
            ),
            (
                "another prefix",
                packet_body("someone else", &tcp4_syn()),
                Ok(None),
            ),
            (
                "our prefix as a mere start",
                packet_body("ne-deny ingress2", &tcp4_syn()),
                Ok(None),
            ),
            (
                "no prefix",
                {
                    let mut b = vec![2, 0, 0, 7];
                    b.extend(attribute(NFULA_PAYLOAD, &tcp4_syn()));
                    b
                },
                Err(ParseError::NoPrefix),
            ),
            (
                "no payload (copy mode meta)",
                {
                    let mut b = vec![2, 0, 0, 7];
                    b.extend(attribute(NFULA_PREFIX, b"ne-deny ingress\0"));
                    b
                },
                Err(ParseError::NoPayload),
            ),
            (
                "IPv4 header truncated",
                packet_body("ne-deny ingress", &tcp4_syn()[..19]),
                Err(ParseError::TruncatedIpHeader {
                    version: 4,
                    length: 19,
                }),
            ),
            (
                "IPv4 header length beyond the payload",
                packet_body("ne-deny ingress", &{
                    let mut p = ipv4(6, [10, 0, 0, 1], [10, 0, 0, 2], &[]);
                    p[0] = 0x4f;
                    p
                }),
                Err(ParseError::TruncatedIpHeader {
                    version: 4,
                    length: 20,
                }),
            ),
            (
                "IPv6 header truncated",
                packet_body("ne-deny ingress", &ipv6(17, v6a, v6b, &[])[..39]),
                Err(ParseError::TruncatedIpHeader {
                    version: 6,
                    length: 39,
                }),
            ),
            (
                "TCP ports cut by the copy range",
                packet_body(
                    "ne-deny ingress",
                    &ipv4(6, [10, 0, 0, 1], [10, 0, 0, 2], &[0, 80]),
                ),
                Err(ParseError::TruncatedTransportHeader {
                    protocol: 6,
                    available: 2,
                }),
            ),
            (
                "IPv6 extension header cut",
                packet_body("ne-deny ingress", &ipv6(0, v6a, v6b, &[17])),
                Err(ParseError::TruncatedExtensionHeader { length: 41 }),
            ),
            (
                "not IP",
                packet_body("ne-deny ingress", &[0x20; 40]),
                Err(ParseError::UnknownIpVersion(2)),
            ),
            (
                "empty payload",
                packet_body("ne-deny ingress", &[]),
                Err(ParseError::TruncatedIpHeader {
                    version: 0,
                    length: 0,
                }),
            ),
            (
                "no nfgenmsg",
                vec![2, 0],
                Err(ParseError::TruncatedNfgenmsg { length: 2 }),
            ),
            (
                "attribute longer than the message",
                {
                    let mut b = vec![2, 0, 0, 7];
                    b.extend_from_slice(&200u16.to_ne_bytes());
                    b.extend_from_slice(&NFULA_PREFIX.to_ne_bytes());
                    b.extend_from_slice(b"ne-d");
                    b
                },
                Err(ParseError::BadAttributeLength {
                    kind: NFULA_PREFIX,
                    offset: 4,
                    length: 200,
                    available: 8,
                }),
            ),
            (
                "attribute shorter than its header",
                {
                    let mut b = vec![2, 0, 0, 7];
                    b.extend_from_slice(&2u16.to_ne_bytes());
                    b.extend_from_slice(&NFULA_PAYLOAD.to_ne_bytes());
                    b
                },
                Err(ParseError::BadAttributeLength {
                    kind: NFULA_PAYLOAD,
                    offset: 4,
                    length: 2,
                    available: 4,
                }),
            ),
            (
                "attribute header cut",
                vec![2, 0, 0, 7, 8, 0],
                Err(ParseError::TruncatedAttribute {
                    offset: 4,
                    available: 2,
                }),
            ),
        ];
        for (name, body, expected) in cases {
            assert_eq!(parse_packet(&body), expected, "{name}");
        }
    }

    #[test]
    fn several_messages_in_one_datagram() {
        let mut datagram = packet_message("ne-deny ingress", &tcp4_syn());
        datagram.extend(packet_message("someone else", &tcp4_syn()));
        datagram.extend(netlink(NLMSG_ERROR, &[0; 20])); // an acknowledgement: not evidence
        datagram.extend(packet_message("ne-deny ingress", &[0x45])); // malformed, skipped
        datagram.extend(packet_message(
            "ne-deny egress",
            &ipv4(17, [10, 0, 0, 3], [10, 0, 0, 4], &l4(1, 2)),
        ));
        let parsed = parse_datagram(&datagram);
        assert_eq!(
            parsed.denied,
            vec![
                Denied {
                    direction: DenyDirection::Ingress,
                    protocol: 6,
                    source: addr("10.0.0.1:40000"),
                    destination: addr("10.0.0.2:80"),
                },
                Denied {
                    direction: DenyDirection::Egress,
                    protocol: 17,
                    source: addr("10.0.0.3:1"),
                    destination: addr("10.0.0.4:2"),
                },
            ]
        );
        assert_eq!(parsed.other_prefix, 1);
        assert_eq!(parsed.malformed, 1);
        assert_eq!(
            parsed.first_error,
            Some(ParseError::TruncatedIpHeader {
                version: 4,
                length: 1
            })
        );
    }

    #[test]
    fn datagram_framing_table() {
        let good = packet_message("ne-deny ingress", &tcp4_syn());
        // Messages whose last attribute, and the datagram's last message, lack their padding.
        let mut odd_body = packet_body(
            "ne-deny ingress",
            &ipv4(1, [10, 0, 0, 1], [10, 0, 0, 2], &[8]),
        );
        odd_body.truncate(odd_body.len() - 3);
        let odd = netlink(NFNL_SUBSYS_ULOG << 8, &odd_body);
        let mut unpadded_last = odd.clone();
        unpadded_last.extend_from_slice(&odd[..NLMSG_HDRLEN + odd_body.len()]);
        let mut too_long = good.clone();
        too_long[0..4].copy_from_slice(&10_000u32.to_ne_bytes());
        let mut too_short = good.clone();
        too_short[0..4].copy_from_slice(&8u32.to_ne_bytes());
        let mut good_then_cut = good.clone();
        good_then_cut.extend_from_slice(&good[..10]);
        // (name, bytes, denied, malformed, first error)
        type Case = (&'static str, Vec<u8>, usize, u64, Option<ParseError>);
        let cases: Vec<Case> = vec![
            ("empty", vec![], 0, 0, None),
            ("one good", good.clone(), 1, 0, None),
            ("last without padding", unpadded_last, 2, 0, None),
            (
                "header cut",
                good[..10].to_vec(),
                0,
                1,
                Some(ParseError::TruncatedNetlinkHeader { available: 10 }),
            ),
            (
                "length beyond the datagram",
                too_long,
                0,
                1,
                Some(ParseError::BadNetlinkLength {
                    length: 10_000,
                    available: good.len(),
                }),
            ),
            (
                "length shorter than a header",
                too_short,
                0,
                1,
                Some(ParseError::BadNetlinkLength {
                    length: 8,
                    available: good.len(),
                }),
            ),
            (
                "good then cut",
                good_then_cut,
                1,
                1,
                Some(ParseError::TruncatedNetlinkHeader { available: 10 }),
            ),
        ];
        for (name, bytes, denied, malformed, first_error) in cases {
            let parsed = parse_datagram(&bytes);
            assert_eq!(parsed.denied.len(), denied, "{name}");
            assert_eq!(parsed.malformed, malformed, "{name}");
            assert_eq!(parsed.first_error, first_error, "{name}");
        }
    }

    #[test]
    fn config_message_layout() {
        let m = config_message(
            7,
            libc::AF_UNSPEC as u8,
            0x1234,
            &[
                (NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]),
                (NFULA_CFG_MODE, &[0, 0, 0, 128, 2, 0]),
            ],
        );
        // header 16 + nfgenmsg 4 + cmd (5 → 8) + mode (10 → 12)
        assert_eq!(m.len(), 40);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 40);
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 0x0401);
        assert_eq!(u16::from_ne_bytes(m[6..8].try_into().unwrap()), 0x5);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        assert_eq!(&m[16..20], &[0, 0, 0x12, 0x34]);
        assert_eq!(&m[20..22], &5u16.to_ne_bytes());
        assert_eq!(&m[22..24], &NFULA_CFG_CMD.to_ne_bytes());
        assert_eq!(m[24], NFULNL_CFG_CMD_BIND);
        assert_eq!(u16::from_ne_bytes(m[28..30].try_into().unwrap()), 10);
        assert_eq!(&m[32..38], &[0, 0, 0, 128, 2, 0]);
    }

    fn denial(sport: u16) -> Denied {
        Denied {
            direction: DenyDirection::Ingress,
            protocol: 6,
            source: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), sport),
            destination: addr("10.0.0.2:80"),
        }
    }

    #[test]
    fn dedupe_table() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let egress = Denied {
            direction: DenyDirection::Egress,
            ..denial(1)
        };
        let udp = Denied {
            protocol: 17,
            ..denial(1)
        };
        // (name, capacity, window, [(denial, seconds after t0, reported?)], suppressed, evicted)
        type Step = (Denied, u64, bool);
        type Case = (&'static str, usize, u64, Vec<Step>, u64, u64);
        let cases: Vec<Case> = vec![
            (
                "SYN retransmits reported once",
                16,
                60,
                vec![
                    (denial(1), 0, true),
                    (denial(1), 1, false),
                    (denial(1), 3, false),
                    (denial(1), 7, false),
                ],
                3,
                0,
            ),
            (
                "a new attempt has a new source port",
                16,
                60,
                vec![
                    (denial(1), 0, true),
                    (denial(2), 1, true),
                    (denial(1), 2, false),
                ],
                1,
                0,
            ),
            (
                "direction and protocol are part of the key",
                16,
                60,
                vec![
                    (denial(1), 0, true),
                    (egress, 0, true),
                    (udp, 0, true),
                    (udp, 1, false),
                ],
                1,
                0,
            ),
            (
                "reported again once the window has passed",
                16,
                60,
                vec![
                    (denial(1), 0, true),
                    (denial(1), 59, false),
                    (denial(1), 60, true),
                    (denial(1), 61, false),
                ],
                2,
                0,
            ),
            (
                "overflow evicts the oldest",
                2,
                60,
                vec![
                    (denial(1), 0, true),
                    (denial(2), 1, true),
                    (denial(3), 2, true), // evicts 1
                    (denial(2), 3, false),
                    (denial(1), 4, true), // forgotten: reported again, evicts 2
                    (denial(3), 5, false),
                ],
                2,
                2,
            ),
            (
                "expired entries make room without eviction",
                1,
                10,
                vec![
                    (denial(1), 0, true),
                    (denial(2), 10, true),
                    (denial(2), 11, false),
                ],
                1,
                0,
            ),
            (
                "capacity 0 acts as 1",
                0,
                60,
                vec![(denial(1), 0, true), (denial(1), 1, false)],
                1,
                0,
            ),
        ];
        for (name, capacity, window, steps, suppressed, evicted) in cases {
            let mut dedupe = Dedupe::new(capacity, s(window));
            for (i, (d, at, reported)) in steps.iter().enumerate() {
                assert_eq!(dedupe.admit(d, t0 + s(*at)), *reported, "{name}: step {i}");
                assert!(dedupe.len() <= capacity.max(1), "{name}: bounded");
            }
            assert_eq!(dedupe.suppressed(), suppressed, "{name}: suppressed");
            assert_eq!(dedupe.evicted(), evicted, "{name}: evicted");
        }
    }

    #[test]
    fn errors_say_what_to_do() {
        let eperm = io::Error::from_raw_os_error(libc::EPERM);
        assert!(config_hint(&eperm).contains("CAP_NET_ADMIN"));
        assert!(config_hint(&eperm).contains("another NFLOG group"));
        let einval = io::Error::from_raw_os_error(libc::EINVAL);
        assert!(config_hint(&einval).contains("nfnetlink_log"));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_datagram(&bytes);
            let _ = parse_packet(&bytes);
        }

        /// Damage to a well-formed datagram (cuts, overwritten bytes) reaches deeper code paths than
        /// random bytes do.
        #[test]
        fn damaged_datagrams_never_panic(
            v6 in any::<bool>(),
            cut in 0usize..400,
            damage in proptest::collection::vec((0usize..400, any::<u8>()), 0..8),
        ) {
            let payload = if v6 {
                let a: Ipv6Addr = "fd00::1".parse().unwrap();
                let mut ext = vec![44u8, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0];
                ext.extend(l4(1, 2));
                ipv6(0, a, a, &ext)
            } else {
                tcp4_syn()
            };
            let mut bytes = packet_message("ne-deny ingress", &payload);
            bytes.extend(packet_message("ne-deny egress", &payload));
            for (at, value) in damage {
                if let Some(b) = bytes.get_mut(at) {
                    *b = value;
                }
            }
            bytes.truncate(cut);
            let parsed = parse_datagram(&bytes);
            prop_assert!(parsed.denied.len() <= 2);
        }
    }
}
