//! DNS messages the pods sent and received, as the kernel copied them (`agent-ebpf/src/dns.rs`):
//! decoding the [`DnsPacket`] records and reading them from their ring buffer.

use crate::error::{Error, Result};
use aya::maps::{MapData, RingBuf};
use network_enforcer_agent_common::{AF_INET, AF_INET6, DNS_ANSWER, DNS_QUERY, DnsPacket};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A query the pod sent, or an answer it received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DnsKind {
    Query,
    Answer,
}

/// One DNS message as user space sees it; `payload` borrows the ring buffer's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DnsMessage<'a> {
    /// When the kernel saw it (CLOCK_MONOTONIC, as [`crate::kernel::events::ConnectionEvent`]s).
    pub monotonic: Duration,
    pub kind: DnsKind,
    /// cgroup v2 id of the pod's socket; `None` when the kernel could not tell.
    pub cgroup_id: Option<u64>,
    /// The pod's socket.
    pub local: SocketAddr,
    /// The DNS server.
    pub server: SocketAddr,
    /// The DNS message, or its first bytes when `truncated`.
    pub payload: &'a [u8],
    /// The message was longer than what the kernel copies.
    pub truncated: bool,
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsDecodeError {
    #[error("DNS record of {0} bytes, expected {expected}", expected = std::mem::size_of::<DnsPacket>())]
    Size(usize),
    #[error("unknown {field} value {value} in a DNS record")]
    Value { field: &'static str, value: u32 },
}

impl<'a> DnsMessage<'a> {
    /// Decodes the bytes of one ring-buffer record.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, DnsDecodeError> {
        if bytes.len() != std::mem::size_of::<DnsPacket>() {
            return Err(DnsDecodeError::Size(bytes.len()));
        }
        // The fixed fields are read by value; the payload is borrowed in place.
        // SAFETY: the length matches, DnsPacket is plain old data (every bit pattern is valid), and
        // read_unaligned makes no alignment assumption.
        let raw = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<DnsPacket>()) };
        let bad = |field, value: u32| DnsDecodeError::Value { field, value };
        let kind = match raw.kind {
            DNS_QUERY => DnsKind::Query,
            DNS_ANSWER => DnsKind::Answer,
            other => return Err(bad("kind", other.into())),
        };
        let (local, server) = match raw.family {
            AF_INET => (v4(&raw.local_addr), v4(&raw.remote_addr)),
            AF_INET6 => (
                IpAddr::V6(Ipv6Addr::from(raw.local_addr)).to_canonical(),
                IpAddr::V6(Ipv6Addr::from(raw.remote_addr)).to_canonical(),
            ),
            other => return Err(bad("family", other.into())),
        };
        let start = std::mem::offset_of!(DnsPacket, payload);
        let captured = (raw.captured as usize).min(raw.payload.len());
        Ok(Self {
            monotonic: Duration::from_nanos(raw.timestamp_ns),
            kind,
            cgroup_id: (raw.cgroup_id != 0).then_some(raw.cgroup_id),
            local: SocketAddr::new(local, raw.local_port),
            server: SocketAddr::new(server, raw.remote_port),
            payload: &bytes[start..start + captured],
            truncated: raw.wire_len as usize > captured,
        })
    }
}

fn v4(addr: &[u8; 16]) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]))
}

/// Reads the DNS ring buffer. The caller drains it before each batch of connection events (an answer
/// is copied before the pod can read it, so before the pod's connection's event), and whenever the
/// kernel wakes it ([`DnsReader::readable`]: every answer does).
pub struct DnsReader {
    ring: AsyncFd<RingBuf<MapData>>,
    decode_errors: u64,
}

impl DnsReader {
    pub(crate) fn new(ring: RingBuf<MapData>) -> Result<Self> {
        // SAFETY: the ring buffer owns its map's file descriptor, open and unchanged until the RingBuf
        // (owned by this AsyncFd) is dropped.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|err| Error::Poll(err.into()))?;
        Ok(Self {
            ring,
            decode_errors: 0,
        })
    }

    /// Waits until the kernel signals new messages; then drain with [`DnsReader::drain`]. Readiness is
    /// cleared before the drain, so a message copied meanwhile wakes the next wait.
    pub async fn readable(&mut self) -> Result<()> {
        let mut guard = self.ring.readable_mut().await.map_err(Error::Poll)?;
        guard.clear_ready();
        Ok(())
    }

    /// Hands every message waiting now to `each`; returns how many records there were.
    pub fn drain(&mut self, mut each: impl FnMut(&DnsMessage<'_>)) -> usize {
        let mut records = 0;
        let ring = self.ring.get_mut();
        while let Some(item) = ring.next() {
            records += 1;
            match DnsMessage::decode(&item) {
                Ok(message) => each(&message),
                Err(err) => {
                    self.decode_errors += 1;
                    tracing::warn!(%err, "skipping an undecodable DNS record");
                }
            }
        }
        records
    }

    /// Records that could not be decoded so far.
    pub fn decode_errors(&self) -> u64 {
        self.decode_errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(raw: &DnsPacket) -> Vec<u8> {
        // SAFETY: DnsPacket is repr(C) plain data without implicit padding.
        unsafe {
            std::slice::from_raw_parts(
                (raw as *const DnsPacket).cast::<u8>(),
                std::mem::size_of::<DnsPacket>(),
            )
        }
        .to_vec()
    }

    fn answer() -> DnsPacket {
        let mut payload = [0u8; network_enforcer_agent_common::DNS_CAPTURE_BYTES];
        payload[..3].copy_from_slice(b"abc");
        let mut local = [0u8; 16];
        local[..4].copy_from_slice(&[10, 244, 0, 7]);
        let mut remote = [0u8; 16];
        remote[..4].copy_from_slice(&[10, 96, 0, 10]);
        DnsPacket {
            timestamp_ns: 2_000_000_000,
            cgroup_id: 77,
            local_addr: local,
            remote_addr: remote,
            local_port: 40_000,
            remote_port: 53,
            family: AF_INET,
            kind: DNS_ANSWER,
            _pad: 0,
            wire_len: 3,
            captured: 3,
            payload,
        }
    }

    #[test]
    fn decodes_an_answer_and_borrows_only_the_captured_bytes() {
        let bytes = bytes_of(&answer());
        let message = DnsMessage::decode(&bytes).unwrap();
        assert_eq!(message.kind, DnsKind::Answer);
        assert_eq!(message.local, "10.244.0.7:40000".parse().unwrap());
        assert_eq!(message.server, "10.96.0.10:53".parse().unwrap());
        assert_eq!(message.payload, b"abc");
        assert_eq!(message.cgroup_id, Some(77));
        assert_eq!(message.monotonic, Duration::from_secs(2));
        assert!(!message.truncated);
    }

    #[test]
    fn a_message_longer_than_the_copy_is_truncated_and_a_bad_count_stays_in_bounds() {
        let mut raw = answer();
        raw.wire_len = 5000;
        raw.captured = 99_999;
        let bytes = bytes_of(&raw);
        let message = DnsMessage::decode(&bytes).unwrap();
        assert!(message.truncated);
        assert_eq!(message.payload.len(), raw.payload.len());
    }

    #[test]
    fn refuses_wrong_sizes_and_unknown_values() {
        assert_eq!(DnsMessage::decode(&[0; 4]), Err(DnsDecodeError::Size(4)));
        let mut raw = answer();
        raw.kind = 9;
        assert!(DnsMessage::decode(&bytes_of(&raw)).is_err());
        let mut raw = answer();
        raw.family = 1;
        assert!(DnsMessage::decode(&bytes_of(&raw)).is_err());
    }
}
