//! nf_tables batches over netlink, for the two things the hold writes without `nft`: the queue rule
//! (`nft` cannot write an xtables target) and name grants (one `nft` process costs milliseconds, and
//! the answer waits for it). A [`Batch`] is the kernel's transaction: begin, messages, end; all of it
//! applies or none.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

const NETLINK_NETFILTER: libc::c_int = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLA_F_NESTED: u16 = 0x8000;
/// How long the kernel may take to answer a batch before it counts as failed.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// `NLM_F_CREATE`: create what the message names.
pub const NLM_F_CREATE: u16 = 0x400;

/// Netfilter families.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Inet,
    Ipv4,
    Ipv6,
}

impl Family {
    fn nfproto(self) -> u8 {
        match self {
            Family::Inet => 1,
            Family::Ipv4 => 2,
            Family::Ipv6 => 10,
        }
    }
}

/// One transaction being written.
pub struct Batch {
    buf: Vec<u8>,
    /// Messages written (each asks for an acknowledgement).
    messages: u32,
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl Batch {
    pub fn new() -> Self {
        let mut batch = Batch {
            buf: Vec::with_capacity(512),
            messages: 0,
        };
        let start = batch.header(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES);
        batch.close(start);
        batch
    }

    /// Appends message `kind` (an `NFT_MSG_*`) for `family` with `flags`; `body` writes its
    /// attributes.
    pub fn message(&mut self, kind: u16, flags: u16, family: Family, body: impl FnOnce(&mut Self)) {
        self.messages += 1;
        let start = self.header(
            (NFNL_SUBSYS_NFTABLES << 8) | kind,
            NLM_F_REQUEST | NLM_F_ACK | flags,
            family.nfproto(),
            0,
        );
        body(self);
        self.close(start);
    }

    /// An attribute with `payload`, padded to 4 bytes.
    pub fn attr(&mut self, kind: u16, payload: &[u8]) {
        let len = 4 + payload.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(self.buf.len().next_multiple_of(4), 0);
    }

    /// A string attribute (NUL-terminated).
    pub fn attr_str(&mut self, kind: u16, text: &str) {
        let mut bytes = Vec::with_capacity(text.len() + 1);
        bytes.extend_from_slice(text.as_bytes());
        bytes.push(0);
        self.attr(kind, &bytes);
    }

    /// A nested attribute whose contents `body` writes.
    pub fn nested(&mut self, kind: u16, body: impl FnOnce(&mut Self)) {
        let start = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        body(self);
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// Ends the batch, sends it and waits for the kernel's answer to every message: the first
    /// refusal is the error (the kernel then applied none of it).
    pub fn send(mut self) -> io::Result<()> {
        let start = self.header(NFNL_MSG_BATCH_END, NLM_F_REQUEST, 0, NFNL_SUBSYS_NFTABLES);
        self.close(start);
        let socket = open()?;
        // SAFETY: `buf` is a valid buffer of its length; the socket is ours.
        let sent = unsafe {
            libc::send(
                socket.as_raw_fd(),
                self.buf.as_ptr().cast(),
                self.buf.len(),
                0,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        read_acks(&socket, self.messages)
    }

    /// `nlmsghdr` + `nfgenmsg`; the length is set by [`Batch::close`]. Sequence numbers count from 1.
    fn header(&mut self, kind: u16, flags: u16, family: u8, res_id: u16) -> usize {
        let start = self.buf.len();
        let seq = self.messages + 1;
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.push(family);
        self.buf.push(0); // NFNETLINK_V0
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        start
    }

    fn close(&mut self, start: usize) {
        let len = (self.buf.len() - start) as u32;
        self.buf[start..start + 4].copy_from_slice(&len.to_ne_bytes());
    }
}

fn open() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned by the returned value.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_NETFILTER,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let timeout = libc::timeval {
        tv_sec: ANSWER_TIMEOUT.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: setsockopt with a valid timeval of its size.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            std::ptr::from_ref(&timeout).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if set < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

/// Reads answers until `expected` acknowledgements came, or the first refusal.
fn read_acks(socket: &OwnedFd, expected: u32) -> io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    let mut acked = 0;
    while acked < expected {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut rest = &buf[..n as usize];
        while rest.len() >= 16 {
            let len = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            let kind = u16::from_ne_bytes([rest[4], rest[5]]);
            if len < 16 || len > rest.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a short netlink answer",
                ));
            }
            // NLMSG_ERROR carries an errno; 0 is the acknowledgement.
            if kind == libc::NLMSG_ERROR as u16 && len >= 20 {
                let errno = i32::from_ne_bytes([rest[16], rest[17], rest[18], rest[19]]);
                if errno != 0 {
                    return Err(io::Error::from_raw_os_error(-errno));
                }
                acked += 1;
            }
            rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        }
    }
    Ok(())
}
