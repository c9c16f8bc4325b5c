//! The one rule `nft` cannot write on kernels without `nft_queue`: a jump target that hands a packet to
//! an NFQUEUE, written over netlink as an `xt` target expression (the kernel's `nft_compat` runs the
//! xtables `NFQUEUE` target, as `iptables-nft -j NFQUEUE` does). Everything else of the hold table is
//! written by `nft` (see [`super`]).
//!
//! The rule's only expression is `target NFQUEUE` revision 3 with `queuenum`, one queue, and the
//! bypass flag: when nobody listens on the queue (the agent is gone), the packet passes instead of
//! being dropped.

pub use super::netlink::Family;
use super::netlink::{Batch, NLM_F_APPEND, NLM_F_CREATE};
use std::io;

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
/// `NFQ_FLAG_BYPASS`: accept the packet when no program listens on the queue.
const NFQ_FLAG_BYPASS: u16 = 0x1;

/// Appends `queue num <queue> bypass` (as an xtables target) to `family` `table` `chain`.
pub fn append(family: Family, table: &str, chain: &str, queue: u16) -> io::Result<()> {
    let mut batch = Batch::new();
    batch.message(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, family, |b| {
        b.attr_str(NFTA_RULE_TABLE, table);
        b.attr_str(NFTA_RULE_CHAIN, chain);
        b.nested(NFTA_RULE_EXPRESSIONS, |b| {
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
