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

mod dedupe;
mod parse;
mod reader;
mod task;

pub use dedupe::Dedupe;
pub(crate) use parse::attributes;
pub use parse::{ParseError, Parsed, parse_datagram, parse_packet};
pub use reader::NflogReader;
pub(crate) use reader::{config_hint, nfnl_message, open_socket, request};
pub use task::{Nflog, NflogOptions, spawn};

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
pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;

// nfnetlink (linux/netfilter/nfnetlink.h): every message starts with a 4-byte nfgenmsg
// (family, version, big-endian resource id = the NFLOG group).
const NFGENMSG_LEN: usize = 4;
const NFNETLINK_V0: u8 = 0;
pub(crate) const NFNL_SUBSYS_ULOG: u16 = 4;

// nfnetlink_log (linux/netfilter/nfnetlink_log.h). Attribute payloads are big-endian.
pub(crate) const NFULNL_MSG_PACKET: u16 = 0;
pub(crate) const NFULNL_MSG_CONFIG: u16 = 1;
pub(crate) const NFULA_PAYLOAD: u16 = 9;
pub(crate) const NFULA_PREFIX: u16 = 10;
pub(crate) const NFULA_CFG_CMD: u16 = 1;
pub(crate) const NFULA_CFG_MODE: u16 = 2;
pub(crate) const NFULA_CFG_NLBUFSIZ: u16 = 3;
pub(crate) const NFULA_CFG_TIMEOUT: u16 = 4;
pub(crate) const NFULA_CFG_QTHRESH: u16 = 5;
pub(crate) const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_CFG_CMD_PF_BIND: u8 = 3;
const NFULNL_CFG_CMD_PF_UNBIND: u8 = 4;
pub(crate) const NFULNL_COPY_PACKET: u8 = 2;

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

/// One netlink message: type, sequence number and the bytes after its header.
pub(crate) struct NetlinkMessage<'a> {
    pub(crate) kind: u16,
    pub(crate) seq: u32,
    pub(crate) body: &'a [u8],
}

/// The netlink messages of a datagram; yields an error once and stops on a broken header.
pub(crate) struct NetlinkMessages<'a> {
    rest: &'a [u8],
}

impl<'a> NetlinkMessages<'a> {
    pub(crate) fn new(datagram: &'a [u8]) -> Self {
        NetlinkMessages { rest: datagram }
    }
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

#[cfg(test)]
mod tests;
