//! The one rule `nft` cannot write on kernels without `nft_queue`: a jump target that hands a packet to
//! an NFQUEUE, written over netlink as an `xt` target expression (the kernel's `nft_compat` runs the
//! xtables `NFQUEUE` target, as `iptables-nft -j NFQUEUE` does). Everything else of the hold table is
//! written by `nft` (see [`super`]).
//!
//! The message is a netfilter batch (begin, `NFT_MSG_NEWRULE`, end) appending to `table`/`chain` of
//! `family` a rule whose only expression is `target NFQUEUE` revision 3 with `queuenum`, one queue, and
//! the bypass flag: when nobody listens on the queue (the agent is gone), the packet passes instead of
//! being dropped.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Netfilter families of the tables the rule goes into.
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

const NETLINK_NETFILTER: libc::c_int = 12;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 16;
const NFNL_MSG_BATCH_END: u16 = 17;
const NFT_MSG_NEWRULE: u16 = 6;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_TARGET_NAME: u16 = 1;
const NFTA_TARGET_REV: u16 = 2;
const NFTA_TARGET_INFO: u16 = 3;
/// `NFQ_FLAG_BYPASS`: accept the packet when no program listens on the queue.
const NFQ_FLAG_BYPASS: u16 = 0x1;

/// Appends `queue num <queue> bypass` (as an xtables target) to `family` `table` `chain`.
pub fn append(family: Family, table: &str, chain: &str, queue: u16) -> io::Result<()> {
    let socket = open()?;
    let batch = message(family, table, chain, queue);
    // SAFETY: `batch` is a valid buffer of its length; the socket is ours.
    let sent = unsafe { libc::send(socket.as_raw_fd(), batch.as_ptr().cast(), batch.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    read_ack(&socket)
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
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads the kernel's answers until the acknowledgement of the rule (sequence 2): an error answer is
/// the refusal.
fn read_ack(socket: &OwnedFd) -> io::Result<()> {
    let mut buf = vec![0u8; 8192];
    loop {
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut rest = &buf[..n as usize];
        while rest.len() >= 16 {
            let len = u32::from_ne_bytes(rest[0..4].try_into().unwrap_or_default()) as usize;
            let kind = u16::from_ne_bytes([rest[4], rest[5]]);
            if len < 16 || len > rest.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "short netlink answer",
                ));
            }
            // NLMSG_ERROR carries an errno (0: the acknowledgement).
            if kind == libc::NLMSG_ERROR as u16 && len >= 20 {
                let errno = i32::from_ne_bytes(rest[16..20].try_into().unwrap_or_default());
                return if errno == 0 {
                    Ok(())
                } else {
                    Err(io::Error::from_raw_os_error(-errno))
                };
            }
            rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        }
    }
}

/// The whole batch: begin, the rule, end.
fn message(family: Family, table: &str, chain: &str, queue: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    header(
        &mut out,
        NFNL_MSG_BATCH_BEGIN,
        NLM_F_REQUEST,
        1,
        0,
        NFNL_SUBSYS_NFTABLES,
    );
    close_message(&mut out, 0);
    let rule = out.len();
    header(
        &mut out,
        (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND,
        2,
        family.nfproto(),
        0,
    );
    attr(&mut out, NFTA_RULE_TABLE, &c_string(table));
    attr(&mut out, NFTA_RULE_CHAIN, &c_string(chain));
    let expressions = open_nested(&mut out, NFTA_RULE_EXPRESSIONS);
    let element = open_nested(&mut out, NFTA_LIST_ELEM);
    attr(&mut out, NFTA_EXPR_NAME, b"target\0");
    let data = open_nested(&mut out, NFTA_EXPR_DATA);
    attr(&mut out, NFTA_TARGET_NAME, b"NFQUEUE\0");
    attr(&mut out, NFTA_TARGET_REV, &3u32.to_be_bytes());
    // struct xt_NFQ_info_v3 { u16 queuenum; u16 queues_total; u16 flags; }, padded to 8 bytes
    // (XT_ALIGN), in host byte order.
    let mut info = [0u8; 8];
    info[0..2].copy_from_slice(&queue.to_ne_bytes());
    info[2..4].copy_from_slice(&1u16.to_ne_bytes());
    info[4..6].copy_from_slice(&NFQ_FLAG_BYPASS.to_ne_bytes());
    attr(&mut out, NFTA_TARGET_INFO, &info);
    close_nested(&mut out, data);
    close_nested(&mut out, element);
    close_nested(&mut out, expressions);
    close_message(&mut out, rule);
    let end = out.len();
    header(
        &mut out,
        NFNL_MSG_BATCH_END,
        NLM_F_REQUEST,
        3,
        0,
        NFNL_SUBSYS_NFTABLES,
    );
    close_message(&mut out, end);
    out
}

fn c_string(text: &str) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    bytes.push(0);
    bytes
}

/// `nlmsghdr` + `nfgenmsg`, length filled in by [`close_message`].
fn header(out: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, family: u8, res_id: u16) {
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.push(family);
    out.push(0); // NFNETLINK_V0
    out.extend_from_slice(&res_id.to_be_bytes());
}

/// Sets the length of the message starting at `start` to the end of `out`.
fn close_message(out: &mut [u8], start: usize) {
    let len = out.len() - start;
    out[start..start + 4].copy_from_slice(&(len as u32).to_ne_bytes());
}

fn attr(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len().next_multiple_of(4), 0);
}

fn open_nested(out: &mut Vec<u8>, kind: u16) -> usize {
    let start = out.len();
    out.extend_from_slice(&0u16.to_ne_bytes());
    out.extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
    start
}

fn close_nested(out: &mut [u8], start: usize) {
    let len = (out.len() - start) as u16;
    out[start..start + 2].copy_from_slice(&len.to_ne_bytes());
}
