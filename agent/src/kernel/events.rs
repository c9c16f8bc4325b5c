//! Connection events: decoding the kernel's [`FlowEvent`] records and reading them from the ring buffer.

use crate::error::{Error, Result};
use aya::maps::{MapData, RingBuf};
use network_enforcer_agent_common::{AF_INET, AF_INET6, FlowEvent, IPPROTO_TCP, IPPROTO_UDP};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

pub use network_enforcer_agent_common::{Direction, Outcome};

/// The transport protocol of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl From<Protocol> for network_enforcer_api::Protocol {
    fn from(p: Protocol) -> Self {
        match p {
            Protocol::Tcp => network_enforcer_api::Protocol::TCP,
            Protocol::Udp => network_enforcer_api::Protocol::UDP,
        }
    }
}

/// One connection event as user space sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionEvent {
    /// When the kernel saw it, as CLOCK_MONOTONIC time (since boot, excluding suspend).
    pub monotonic: Duration,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// Who opened the connection, seen from the local socket.
    pub direction: Direction,
    /// What happened.
    pub outcome: Outcome,
    /// The local socket's address.
    pub local: SocketAddr,
    /// The peer's address.
    pub remote: SocketAddr,
    /// Inode of the local socket's network namespace; `None` when the kernel could not tell.
    pub netns_ino: Option<u32>,
    /// cgroup v2 id of the local socket; `None` when the kernel could not tell.
    pub cgroup_id: Option<u64>,
    /// The process that opened the connection; `None` when unknown (inbound TCP, for one; outbound
    /// TCP while [`crate::Switch::ConnectionPids`] is off).
    pub pid: Option<u32>,
    /// For a failed attempt: the socket error (errno) when the kernel set one.
    pub error: Option<u8>,
    /// How many occurrences this event stands for (1 + those the kernel's dedupe suppressed since the
    /// edge was last reported).
    pub count: u32,
}

/// Why a record from the kernel could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The record is not the size of a [`FlowEvent`] (user and kernel side built from different sources).
    #[error("record of {0} bytes, expected {expected}", expected = std::mem::size_of::<FlowEvent>())]
    Size(usize),
    /// A field holds a value this build does not know.
    #[error("unknown {field} value {value}")]
    Value {
        /// Which field.
        field: &'static str,
        /// Its raw value.
        value: u32,
    },
}

impl ConnectionEvent {
    /// Decodes the bytes of one ring-buffer record.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() != std::mem::size_of::<FlowEvent>() {
            return Err(DecodeError::Size(bytes.len()));
        }
        // SAFETY: the length matches, FlowEvent is plain old data (every bit pattern is valid), and
        // read_unaligned makes no alignment assumption about the ring buffer's bytes.
        let raw = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<FlowEvent>()) };
        Self::from_raw(&raw)
    }

    /// Converts the kernel's record into the user-space form.
    pub fn from_raw(raw: &FlowEvent) -> Result<Self, DecodeError> {
        let bad = |field, value: u32| DecodeError::Value { field, value };
        let protocol = match raw.protocol {
            IPPROTO_TCP => Protocol::Tcp,
            IPPROTO_UDP => Protocol::Udp,
            other => return Err(bad("protocol", other.into())),
        };
        let direction =
            Direction::from_raw(raw.direction).ok_or(bad("direction", raw.direction.into()))?;
        let outcome = Outcome::from_raw(raw.outcome).ok_or(bad("outcome", raw.outcome.into()))?;
        let (local_ip, remote_ip) = match raw.family {
            AF_INET => (ipv4(&raw.local_addr), ipv4(&raw.remote_addr)),
            // A dual-stack IPv6 socket talking to an IPv4 peer shows IPv4-mapped addresses
            // (::ffff:a.b.c.d); report them as the IPv4 addresses they are, so edges do not split.
            AF_INET6 => (
                IpAddr::V6(Ipv6Addr::from(raw.local_addr)).to_canonical(),
                IpAddr::V6(Ipv6Addr::from(raw.remote_addr)).to_canonical(),
            ),
            other => return Err(bad("family", other.into())),
        };
        Ok(Self {
            monotonic: Duration::from_nanos(raw.timestamp_ns),
            protocol,
            direction,
            outcome,
            local: SocketAddr::new(local_ip, raw.local_port),
            remote: SocketAddr::new(remote_ip, raw.remote_port),
            netns_ino: (raw.netns_ino != 0).then_some(raw.netns_ino),
            cgroup_id: (raw.cgroup_id != 0).then_some(raw.cgroup_id),
            pid: (raw.pid != 0).then_some(raw.pid),
            error: (raw.error != 0).then_some(raw.error),
            count: raw.count.max(1),
        })
    }
}

fn ipv4(addr: &[u8; 16]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]))
}

/// How often the reader drains the ring buffer without a wakeup from the kernel.
pub const DRAIN_INTERVAL: Duration = Duration::from_millis(50);

/// Appends every record waiting in `ring` to `out`; returns how many there were.
fn drain(ring: &mut RingBuf<MapData>, out: &mut Vec<ConnectionEvent>, errors: &mut u64) -> usize {
    let mut records = 0usize;
    while let Some(item) = ring.next() {
        records += 1;
        match ConnectionEvent::decode(&item) {
            Ok(event) => out.push(event),
            Err(err) => {
                *errors += 1;
                tracing::warn!(%err, "skipping an undecodable eBPF record");
            }
        }
    }
    records
}

/// Reads [`ConnectionEvent`]s from the kernel's ring buffer without blocking the runtime: it waits on the
/// ring buffer's file descriptor, which the kernel makes readable when records arrive.
pub struct EventReader {
    ring: AsyncFd<RingBuf<MapData>>,
    decode_errors: u64,
}

impl EventReader {
    pub(crate) fn new(ring: RingBuf<MapData>) -> Result<Self> {
        // SAFETY: the ring buffer owns its map's file descriptor, which stays open and unchanged until the
        // RingBuf (owned by this AsyncFd) is dropped.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|err| Error::Poll(err.into()))?;
        Ok(Self {
            ring,
            decode_errors: 0,
        })
    }

    /// Waits until at least one record is available, then appends every available event to `out`.
    /// Records that do not decode are counted ([`EventReader::decode_errors`]) and skipped.
    ///
    /// The kernel wakes the reader only once a batch of records waits, so this also drains the buffer
    /// every [`DRAIN_INTERVAL`]: a lone record waits at most that long.
    pub async fn read_batch(&mut self, out: &mut Vec<ConnectionEvent>) -> Result<()> {
        loop {
            let records = tokio::select! {
                guard = self.ring.readable_mut() => {
                    let mut guard = guard.map_err(Error::Poll)?;
                    let records = drain(guard.get_inner_mut(), out, &mut self.decode_errors);
                    // Only clear readiness after draining: records that arrive later re-arm it.
                    guard.clear_ready();
                    records
                }
                () = tokio::time::sleep(DRAIN_INTERVAL) => {
                    drain(self.ring.get_mut(), out, &mut self.decode_errors)
                }
            };
            if records > 0 {
                return Ok(());
            }
        }
    }

    /// Appends every event waiting in the ring buffer now to `out`, without waiting: the last read
    /// before the agent's final flush (a record the kernel has not woken the reader for yet, or one
    /// whose wakeup lost the race with SIGTERM, would otherwise be lost with the process). How many
    /// records were read.
    pub fn read_waiting(&mut self, out: &mut Vec<ConnectionEvent>) -> usize {
        drain(self.ring.get_mut(), out, &mut self.decode_errors)
    }

    /// How many records could not be decoded so far.
    pub fn decode_errors(&self) -> u64 {
        self.decode_errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw_v4() -> FlowEvent {
        let mut raw = FlowEvent::zeroed();
        raw.timestamp_ns = 1_500_000_000;
        raw.family = AF_INET;
        raw.protocol = IPPROTO_TCP;
        raw.direction = Direction::Outbound as u8;
        raw.outcome = Outcome::Established as u8;
        raw.local_addr[..4].copy_from_slice(&[10, 0, 0, 1]);
        raw.remote_addr[..4].copy_from_slice(&[10, 0, 0, 2]);
        raw.local_port = 40_000;
        raw.remote_port = 80;
        raw.pid = 42;
        raw
    }

    fn bytes_of(raw: &FlowEvent) -> Vec<u8> {
        // SAFETY: FlowEvent is repr(C) plain data without implicit padding.
        unsafe {
            std::slice::from_raw_parts(
                (raw as *const FlowEvent).cast::<u8>(),
                std::mem::size_of::<FlowEvent>(),
            )
        }
        .to_vec()
    }

    #[test]
    fn decodes_an_ipv4_record() {
        let event = ConnectionEvent::decode(&bytes_of(&raw_v4())).unwrap();
        assert_eq!(event.local, "10.0.0.1:40000".parse().unwrap());
        assert_eq!(event.remote, "10.0.0.2:80".parse().unwrap());
        assert_eq!(event.protocol, Protocol::Tcp);
        assert_eq!(event.direction, Direction::Outbound);
        assert_eq!(event.outcome, Outcome::Established);
        assert_eq!(event.monotonic, Duration::from_millis(1500));
        assert_eq!(event.pid, Some(42));
        assert_eq!(
            (event.netns_ino, event.cgroup_id, event.error),
            (None, None, None)
        );
    }

    #[test]
    fn decodes_an_ipv6_record() {
        let mut raw = raw_v4();
        raw.family = AF_INET6;
        raw.protocol = IPPROTO_UDP;
        raw.local_addr = "fd00::1".parse::<Ipv6Addr>().unwrap().octets();
        raw.remote_addr = "fd00::2".parse::<Ipv6Addr>().unwrap().octets();
        raw.direction = Direction::Inbound as u8;
        raw.outcome = Outcome::Datagram as u8;
        raw.netns_ino = 4026531840;
        let event = ConnectionEvent::from_raw(&raw).unwrap();
        assert_eq!(event.local, "[fd00::1]:40000".parse().unwrap());
        assert_eq!(event.remote, "[fd00::2]:80".parse().unwrap());
        assert_eq!(event.protocol, Protocol::Udp);
        assert_eq!(event.direction, Direction::Inbound);
        assert_eq!(event.netns_ino, Some(4026531840));
    }

    #[test]
    fn reports_ipv4_mapped_addresses_as_ipv4() {
        let mut raw = raw_v4();
        raw.family = AF_INET6;
        raw.local_addr = "::ffff:10.0.0.1".parse::<Ipv6Addr>().unwrap().octets();
        raw.remote_addr = "::ffff:10.0.0.2".parse::<Ipv6Addr>().unwrap().octets();
        let event = ConnectionEvent::from_raw(&raw).unwrap();
        assert_eq!(event.local, "10.0.0.1:40000".parse().unwrap());
        assert_eq!(event.remote, "10.0.0.2:80".parse().unwrap());
    }

    #[test]
    fn rejects_records_of_the_wrong_size_or_with_unknown_values() {
        assert_eq!(
            ConnectionEvent::decode(&[0u8; 10]),
            Err(DecodeError::Size(10))
        );
        let mut raw = raw_v4();
        raw.family = 99;
        assert_eq!(
            ConnectionEvent::from_raw(&raw),
            Err(DecodeError::Value {
                field: "family",
                value: 99
            })
        );
        let mut raw = raw_v4();
        raw.outcome = 0;
        assert!(ConnectionEvent::from_raw(&raw).is_err());
    }
}
