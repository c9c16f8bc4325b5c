//! The one rule `nft` cannot write on kernels without `nft_queue`: a jump target that hands a packet to
//! an NFQUEUE, written over netlink as an `xt` target expression (the kernel's `nft_compat` runs the
//! xtables `NFQUEUE` target, as `iptables-nft -j NFQUEUE` does). Everything else of the hold table is
//! written by `nft` (see [`super`]).
//!
//! The rule's expressions: optionally `match bpf` revision 1 running the hold's kernel check
//! ([`super::check`]) by its program's descriptor (an answer with nothing new does not match and goes
//! on to the next rule); then `log` to the copies' group with [`FLUSH_PREFIX`] and a queue threshold
//! of 1, which sends the copies the kernel gathered (the queries among them) before the answer is
//! queued, so the reader notes a query before it judges its answer; then `target NFQUEUE` revision 3
//! with `queuenum`, one queue, and the bypass flag: when nobody listens on the queue (the agent is
//! gone), the packet passes instead of being dropped. The rule goes first in its chain, before the
//! rules `nft` wrote.

pub use super::netlink::Family;
use super::netlink::{Batch, NLM_F_CREATE};
use std::io;
use std::os::fd::RawFd;

const NFT_MSG_NEWRULE: u16 = 6;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_TARGET_NAME: u16 = 1;
const NFTA_TARGET_REV: u16 = 2;
const NFTA_TARGET_INFO: u16 = 3;
const NFTA_LOG_GROUP: u16 = 1;
const NFTA_LOG_PREFIX: u16 = 2;
const NFTA_LOG_SNAPLEN: u16 = 3;
const NFTA_LOG_QTHRESHOLD: u16 = 4;
/// The prefix of the copy that only flushes the gathered copies: the reader skips it.
pub const FLUSH_PREFIX: &str = "ne-hold-flush";
const NFTA_MATCH_NAME: u16 = 1;
const NFTA_MATCH_REV: u16 = 2;
const NFTA_MATCH_INFO: u16 = 3;
/// `XT_BPF_MODE_FD_ELF`: the match runs the loaded program whose descriptor it is given.
const XT_BPF_MODE_FD_ELF: u16 = 2;
/// `sizeof(struct xt_bpf_info_v1)`: mode, count, fd, a 512-byte union, the kernel's pointer.
const XT_BPF_INFO_V1_LEN: usize = 528;
/// `NFQ_FLAG_BYPASS`: accept the packet when no program listens on the queue.
const NFQ_FLAG_BYPASS: u16 = 0x1;

/// Puts `log group <copies> prefix FLUSH_PREFIX queue-threshold 1 queue num <queue> bypass` (the
/// queue as an xtables target) first in `family` `table` `chain`; with `check`, only for packets the
/// socket-filter program of that descriptor returns non-zero for.
pub fn insert(
    family: Family,
    table: &str,
    chain: &str,
    (queue, copies): (u16, u16),
    check: Option<RawFd>,
) -> io::Result<()> {
    let mut batch = Batch::new();
    // Without NLM_F_APPEND and a position, the kernel puts the rule first.
    batch.message(NFT_MSG_NEWRULE, NLM_F_CREATE, family, |b| {
        b.attr_str(NFTA_RULE_TABLE, table);
        b.attr_str(NFTA_RULE_CHAIN, chain);
        b.nested(NFTA_RULE_EXPRESSIONS, |b| {
            if let Some(fd) = check {
                b.nested(NFTA_LIST_ELEM, |b| {
                    b.attr_str(NFTA_EXPR_NAME, "match");
                    b.nested(NFTA_EXPR_DATA, |b| {
                        b.attr_str(NFTA_MATCH_NAME, "bpf");
                        b.attr(NFTA_MATCH_REV, &1u32.to_be_bytes());
                        b.attr(NFTA_MATCH_INFO, &bpf_match_info(fd));
                    });
                });
            }
            b.nested(NFTA_LIST_ELEM, |b| {
                b.attr_str(NFTA_EXPR_NAME, "log");
                b.nested(NFTA_EXPR_DATA, |b| {
                    b.attr(NFTA_LOG_GROUP, &copies.to_be_bytes());
                    b.attr_str(NFTA_LOG_PREFIX, FLUSH_PREFIX);
                    // The reader reads none of this copy.
                    b.attr(NFTA_LOG_SNAPLEN, &1u32.to_be_bytes());
                    b.attr(NFTA_LOG_QTHRESHOLD, &1u16.to_be_bytes());
                });
            });
            b.nested(NFTA_LIST_ELEM, |b| {
                b.attr_str(NFTA_EXPR_NAME, "target");
                b.nested(NFTA_EXPR_DATA, |b| {
                    b.attr_str(NFTA_TARGET_NAME, "NFQUEUE");
                    b.attr(NFTA_TARGET_REV, &3u32.to_be_bytes());
                    // struct xt_NFQ_info_v3 { u16 queuenum; u16 queues_total; u16 flags; },
                    // padded to 8 bytes (XT_ALIGN), in host byte order.
                    let mut info = [0u8; 8];
                    info[0..2].copy_from_slice(&queue.to_ne_bytes());
                    info[2..4].copy_from_slice(&1u16.to_ne_bytes());
                    info[4..6].copy_from_slice(&NFQ_FLAG_BYPASS.to_ne_bytes());
                    b.attr(NFTA_TARGET_INFO, &info);
                });
            });
        });
    });
    batch.send()
}

/// `struct xt_bpf_info_v1` for a program given by descriptor, in host byte order.
fn bpf_match_info(fd: RawFd) -> [u8; XT_BPF_INFO_V1_LEN] {
    let mut info = [0u8; XT_BPF_INFO_V1_LEN];
    info[0..2].copy_from_slice(&XT_BPF_MODE_FD_ELF.to_ne_bytes());
    info[4..8].copy_from_slice(&fd.to_ne_bytes());
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bpf_match_names_its_program_by_descriptor() {
        let info = bpf_match_info(7);
        assert_eq!(u16::from_ne_bytes([info[0], info[1]]), 2);
        assert_eq!(i32::from_ne_bytes([info[4], info[5], info[6], info[7]]), 7);
        assert!(info[8..].iter().all(|&b| b == 0));
    }
}
