//! The hold's one netlink socket. The queries of held pods arrive as copies (an NFLOG group: a
//! query goes on at once and waits for nobody); the answers the kernel check does not let through
//! arrive queued (an NFQUEUE: an answer waits for its verdict). One socket for both, because the
//! kernel then hands them over in the order it sent them, and the queue rule sends the gathered
//! copies before it queues an answer: a query's copy is always read before its answer, and the
//! answer is judged against a noted query without the query ever waiting for user space.
//!
//! Reading order: [`messages`] (received bytes → [`Held`] messages, pure, never panics), then
//! [`HoldSocket`] (binding the queue and the group, receiving, verdicts).

use super::queue_rule::FLUSH_PREFIX;
use crate::enforce::nflog::{
    self, NFNL_SUBSYS_ULOG, NFULA_CFG_CMD, NFULA_CFG_MODE, NFULA_CFG_NLBUFSIZ, NFULA_CFG_QTHRESH,
    NFULA_CFG_TIMEOUT, NFULA_PAYLOAD, NFULA_PREFIX, NFULNL_CFG_CMD_BIND, NFULNL_COPY_PACKET,
    NFULNL_MSG_CONFIG, NFULNL_MSG_PACKET, NLM_F_REQUEST, NetlinkMessages, NflogError, ParseError,
};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
// nfnetlink_queue attributes.
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQA_PAYLOAD: u16 = 10;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
const NFQA_CFG_MASK: u16 = 4;
const NFQA_CFG_FLAGS: u16 = 5;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_PACKET: u8 = 2;
/// A queue full past its length lets packets through instead of dropping them.
const NFQA_CFG_F_FAIL_OPEN: u32 = 1;
const NF_ACCEPT: u32 = 1;
// nfnetlink_log's constants are the NFLOG reader's (`crate::enforce::nflog`).

/// Bytes of a message copied: a whole UDP DNS message (EDNS allows answers up to 64 KiB).
const COPY_RANGE: u32 = 0xffff;
/// The receive buffer: one datagram of the largest copy, with headers.
pub const RECEIVE_BYTES: usize = 128 * 1024;
/// Query copies the kernel gathers into one message before sending them: one send per batch instead
/// of one per query, on the pod's query path.
pub const COPIES_BATCH: u32 = 64;
/// The kernel's buffer for a batch of copies: room for 64 queries of ~200 bytes with their headers.
pub const COPIES_BUFFER_BYTES: u32 = 32 * 1024;
/// How long the kernel keeps a batch of copies (rules may ask for batches, queries do not), in
/// hundredths of a second.
pub const COPIES_FLUSH_CENTISECONDS: u32 = 10;
/// The socket's kernel-side queue: absorbs a burst of queries while an answer is judged.
const SOCKET_QUEUE_BYTES: libc::c_int = 4 * 1024 * 1024;

/// One message of the hold's socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held<'a> {
    /// A copy of a query a held pod sent (it went on already). The IP packet as at the hook.
    Copy(&'a [u8]),
    /// An answer waiting for its verdict (`id`). The IP packet as at the hook; empty when the
    /// kernel sent none (it still needs its verdict).
    Answer { id: u32, packet: &'a [u8] },
}

/// The hold's messages in one received datagram, in the kernel's order; anything else (an
/// acknowledgement, another subsystem's message) is skipped. A broken netlink header ends the
/// datagram with an error.
pub fn messages(datagram: &[u8]) -> impl Iterator<Item = Result<Held<'_>, ParseError>> {
    NetlinkMessages::new(datagram).filter_map(|message| {
        let message = match message {
            Ok(message) => message,
            Err(error) => return Some(Err(error)),
        };
        let query = message.kind == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET;
        let answer = message.kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET;
        if !query && !answer {
            return None;
        }
        let (mut id, mut payload, mut flush) = (None, None, false);
        for attribute in nflog::attributes(message.body) {
            let (kind, data) = match attribute {
                Ok(attribute) => attribute,
                Err(error) => return Some(Err(error)),
            };
            match kind {
                NFULA_PAYLOAD if query => payload = Some(data),
                // NUL-terminated.
                NFULA_PREFIX if query => {
                    flush = data.split(|&b| b == 0).next() == Some(FLUSH_PREFIX.as_bytes())
                }
                NFQA_PAYLOAD if answer => payload = Some(data),
                // struct nfqnl_msg_packet_hdr { __be32 packet_id; __be16 hw_protocol; __u8 hook; }
                NFQA_PACKET_HDR if answer => {
                    id = data
                        .get(..4)
                        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                }
                _ => {}
            }
        }
        if flush {
            return None;
        }
        Some(if query {
            payload.map(Held::Copy).ok_or(ParseError::NoPayload)
        } else {
            id.map(|id| Held::Answer {
                id,
                packet: payload.unwrap_or_default(),
            })
            .ok_or(ParseError::NoPacketId)
        })
    })
}

/// A verdict letting queued packet `id` of `queue` through (no acknowledgement asked: the answer
/// must not wait for one).
fn accept_message(queue: u16, id: u32) -> Vec<u8> {
    // struct nfqnl_msg_verdict_hdr { __be32 verdict; __be32 id; }
    let mut verdict = [0u8; 8];
    verdict[..4].copy_from_slice(&NF_ACCEPT.to_be_bytes());
    verdict[4..].copy_from_slice(&id.to_be_bytes());
    nflog::nfnl_message(
        (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_VERDICT,
        NLM_F_REQUEST,
        0,
        libc::AF_UNSPEC as u8,
        queue,
        &[(NFQA_VERDICT_HDR, &verdict)],
    )
}

/// Why the hold's socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error(transparent)]
    Open(#[from] NflogError),
    #[error("binding NFQUEUE {queue}: {source}; {hint}")]
    Queue {
        queue: u16,
        #[source]
        source: io::Error,
        hint: &'static str,
    },
    #[error("binding NFLOG group {group} for the held pods' queries: {source}; {hint}")]
    Group {
        group: u16,
        #[source]
        source: io::Error,
        hint: &'static str,
    },
}

/// The socket bound to the hold's queue and its query group, in the opening thread's network
/// namespace. Dropping it unbinds both (the queue rule's bypass then lets answers through).
#[derive(Debug)]
pub struct HoldSocket {
    fd: OwnedFd,
    queue: u16,
}

impl HoldSocket {
    /// Binds NFLOG group `query_group` (whole packets, each sent at once: the group's threshold is 1
    /// and a rule's can only lower it; [`COPIES_FLUSH_CENTISECONDS`] and [`COPIES_BUFFER_BYTES`]
    /// bound a batch should the threshold be raised), then NFQUEUE `queue` (whole packets, at most
    /// `max_len` waiting, fail-open past it).
    pub fn open(queue: u16, query_group: u16, max_len: u32) -> Result<Self, SocketError> {
        let fd = nflog::open_socket(SOCKET_QUEUE_BYTES)?;
        let mut buf = vec![0u8; 16 * 1024];
        let mut params = [0u8; 5];
        params[..4].copy_from_slice(&COPY_RANGE.to_be_bytes());
        params[4] = NFQNL_COPY_PACKET;
        let configure =
            |seq: u32, kind: u16, res_id: u16, attrs: &[(u16, &[u8])], buf: &mut [u8]| {
                let message = nflog::nfnl_message(
                    kind,
                    nflog::NLM_F_REQUEST | nflog::NLM_F_ACK,
                    seq,
                    libc::AF_UNSPEC as u8,
                    res_id,
                    attrs,
                );
                nflog::request(fd.as_raw_fd(), seq, &message, buf)
            };
        // The group first: once the queue is bound, answers may come (an earlier agent's rule), and
        // reading the group's acknowledgement would skip them without a verdict.
        let mut mode = [0u8; 6];
        mode[..4].copy_from_slice(&COPY_RANGE.to_be_bytes());
        mode[4] = NFULNL_COPY_PACKET;
        configure(
            1,
            (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG,
            query_group,
            &[
                (NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]),
                (NFULA_CFG_MODE, &mode),
                (NFULA_CFG_QTHRESH, &COPIES_BATCH.to_be_bytes()),
                (NFULA_CFG_TIMEOUT, &COPIES_FLUSH_CENTISECONDS.to_be_bytes()),
                (NFULA_CFG_NLBUFSIZ, &COPIES_BUFFER_BYTES.to_be_bytes()),
            ],
            &mut buf,
        )
        .map_err(|source| SocketError::Group {
            group: query_group,
            hint: nflog::config_hint(&source),
            source,
        })?;
        // struct nfqnl_msg_config_cmd { __u8 command; __u8 _pad; __be16 pf; }
        configure(
            2,
            (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_CONFIG,
            queue,
            &[
                (NFQA_CFG_CMD, &[NFQNL_CFG_CMD_BIND, 0, 0, 0]),
                (NFQA_CFG_PARAMS, &params),
                (NFQA_CFG_QUEUE_MAXLEN, &max_len.to_be_bytes()),
                (NFQA_CFG_MASK, &NFQA_CFG_F_FAIL_OPEN.to_be_bytes()),
                (NFQA_CFG_FLAGS, &NFQA_CFG_F_FAIL_OPEN.to_be_bytes()),
            ],
            &mut buf,
        )
        .map_err(|source| SocketError::Queue {
            queue,
            hint: queue_hint(&source),
            source,
        })?;
        Ok(HoldSocket { fd, queue })
    }

    /// Receives one datagram into `buf`: its length (cut to `buf`), 0 when nothing came for a
    /// while. `ENOBUFS` means the kernel dropped messages (query copies; answers pass unheld).
    pub fn receive(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: the pointer and length describe `buf`.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            let error = io::Error::last_os_error();
            return match error.raw_os_error() {
                // The socket's receive timeout (set for setup's acknowledgements) or a signal.
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(error),
            };
        }
        Ok((n as usize).min(buf.len()))
    }

    /// Lets queued answer `id` through.
    pub fn accept(&self, id: u32) -> io::Result<()> {
        let message = accept_message(self.queue, id);
        // SAFETY: the pointer and length describe `message`; an unconnected netlink socket sends
        // to the kernel.
        let sent = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                message.as_ptr().cast(),
                message.len(),
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// What to do about a refused queue bind.
fn queue_hint(error: &io::Error) -> &'static str {
    match error.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EBUSY) => {
            "another process (a second agent?) reads this queue: configure another \
             --enforcement-dns-hold-queue"
        }
        _ => {
            "the kernel needs nfnetlink_queue (CONFIG_NETFILTER_NETLINK_QUEUE) and the agent \
             CAP_NET_ADMIN"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A netlink message of `kind` with `attrs`, as the kernel sends it.
    fn message(kind: u16, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        nflog::nfnl_message(kind, 0, 0, libc::AF_INET as u8, 0, attrs)
    }

    fn packet_hdr(id: u32) -> Vec<u8> {
        let mut hdr = id.to_be_bytes().to_vec();
        hdr.extend_from_slice(&[0x08, 0x00, 1]);
        hdr
    }

    #[test]
    fn queries_and_answers_come_in_the_kernels_order_and_the_rest_is_skipped() {
        let hdr = packet_hdr(7);
        let mut datagram = message(0x0400, &[(NFULA_PAYLOAD, b"query")]);
        datagram.extend(message(
            0x0300,
            &[(NFQA_PACKET_HDR, &hdr), (NFQA_PAYLOAD, b"answer")],
        ));
        // An acknowledgement and another subsystem's message are not the hold's.
        datagram.extend(message(2, &[]));
        datagram.extend(message(0x0a00, &[(NFQA_PAYLOAD, b"nft")]));
        // The copy that only flushed the gathered ones.
        datagram.extend(message(
            0x0400,
            &[(NFULA_PREFIX, b"ne-hold-flush\0"), (NFULA_PAYLOAD, b"x")],
        ));
        datagram.extend(message(0x0300, &[(NFQA_PACKET_HDR, &packet_hdr(8))]));
        let read: Vec<_> = messages(&datagram).collect();
        assert_eq!(
            read,
            vec![
                Ok(Held::Copy(b"query")),
                Ok(Held::Answer {
                    id: 7,
                    packet: b"answer"
                }),
                // Without a payload it still needs its verdict.
                Ok(Held::Answer { id: 8, packet: b"" }),
            ]
        );
    }

    #[test]
    fn broken_messages_are_errors_never_panics() {
        let no_id = message(0x0300, &[(NFQA_PAYLOAD, b"answer")]);
        assert_eq!(
            messages(&no_id).collect::<Vec<_>>(),
            vec![Err(ParseError::NoPacketId)]
        );
        let no_payload = message(0x0400, &[]);
        assert_eq!(
            messages(&no_payload).collect::<Vec<_>>(),
            vec![Err(ParseError::NoPayload)]
        );
        let whole = message(
            0x0300,
            &[(NFQA_PACKET_HDR, &packet_hdr(9)), (NFQA_PAYLOAD, b"x")],
        );
        // Every cut of a valid message reads as an error or as less, never as a panic.
        for end in 0..whole.len() {
            let _ = messages(&whole[..end]).count();
        }
        let mut lying = whole.clone();
        lying[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(messages(&lying).all(|m| m.is_err()));
    }

    #[test]
    fn the_verdict_accepts_the_packet_of_its_queue() {
        let verdict = accept_message(8410, 0x01020304);
        assert_eq!(verdict.len(), 16 + 4 + 4 + 8);
        assert_eq!(u16::from_ne_bytes([verdict[4], verdict[5]]), 0x0301);
        assert_eq!(&verdict[18..20], &8410u16.to_be_bytes());
        assert_eq!(&verdict[24..28], &1u32.to_be_bytes());
        assert_eq!(&verdict[28..32], &[1, 2, 3, 4]);
    }
}
