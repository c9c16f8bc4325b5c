//! The DNS hold's kernel check (docs/design.md, "Names in the agent's enforcement"): run by the
//! xtables `bpf` match of the hold's queue rule on each UDP answer to a held pod, it says whether the
//! answer must wait for the agent. An answer whose every A/AAAA address the pod holds a grant for,
//! from the name it asked, and long enough that the agent would not extend it, brings nothing new:
//! it goes on at once (0) and never reaches the agent. Anything else, or anything this program does
//! not read to the end, is queued (1), as without this check.
//!
//! The agent mirrors its grants into `HOLD_GRANTS` (see `network-enforcer-agent-common::hold`);
//! entries of an older `HOLD_GENERATION` (the pods' allowances changed since) count as absent.
//!
//! Its own object, so that the hold loads none of the capture programs' maps. Reads go through
//! `bpf_skb_load_bytes` at a variable offset: the offset stays an imprecise scalar for the
//! verifier, so the walks over names stay cheap to verify.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_skb_load_bytes},
    macros::{map, socket_filter},
    maps::{Array, LruHashMap, PerCpuArray},
    programs::SkBuffContext,
};
use network_enforcer_agent_common::hold::{
    COUNTERS, Counter, FNV_OFFSET, GRANTS_MAX, GrantKey, GrantValue, MAX_ANSWERS, MAX_NAME_BYTES,
    MESSAGE_BYTES, hash_step,
};
use network_enforcer_agent_common::{AF_INET, AF_INET6, IPPROTO_UDP};

#[map(name = "HOLD_GRANTS")]
static HOLD_GRANTS: LruHashMap<GrantKey, GrantValue> = LruHashMap::with_max_entries(GRANTS_MAX, 0);

#[map(name = "HOLD_GENERATION")]
static HOLD_GENERATION: Array<u64> = Array::with_max_entries(1, 0);

#[map(name = "HOLD_COUNTERS")]
static HOLD_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTERS, 0);

/// One `u32` per CPU that [`forget`] passes an offset through.
#[map(name = "HOLD_SCRATCH")]
static HOLD_SCRATCH: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

const UDP_HEADER: usize = 8;
const DNS_HEADER: usize = 12;
const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
/// Labels of one owner name walked, at most, before a compression pointer or the root.
const MAX_LABELS: usize = 64;
/// Labels of the question's name, at most (a label is at least two bytes of the 255).
const MAX_QUESTION_LABELS: usize = 128;
const NAME_BUFFER: usize = 256;

/// Non-zero: queue the answer.
#[socket_filter]
pub fn dns_hold_needed(ctx: SkBuffContext) -> i64 {
    if nothing_new(&ctx) == Some(true) {
        count(Counter::Passed);
        0
    } else {
        count(Counter::Queued);
        1
    }
}

/// `value`, with everything the verifier knows about its range forgotten (map contents are not
/// tracked). Each record's owner name ends at a different offset; without this, the verifier would
/// walk the next record once per such offset range, over every record: more than it allows. (A run
/// preempting this one on the same CPU between the write and the read could hand it another
/// offset: the answer is then misread, which ends in queueing it, or at worst in letting it go on
/// without a grant the agent would have made.)
#[inline(always)]
fn forget(value: usize) -> Option<usize> {
    let slot = HOLD_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot of the array, written then read back by this program alone.
    unsafe {
        core::ptr::write_volatile(slot, value as u32);
        Some(core::ptr::read_volatile(slot) as usize)
    }
}

#[inline(always)]
fn count(counter: Counter) {
    if let Some(slot) = HOLD_COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: this CPU's slot; socket filters are not preempted by other programs on it.
        unsafe { *slot += 1 };
    }
}

/// `Some(true)` when every address of the answer is granted for long enough; `None` when the
/// answer could not be read to its end (then it is queued).
#[inline(always)]
fn nothing_new(ctx: &SkBuffContext) -> Option<bool> {
    let mut key = GrantKey {
        pod: [0; 16],
        address: [0; 16],
        name: FNV_OFFSET,
        family: 0,
        _pad: [0; 6],
    };
    // A coalesced packet (UDP GRO on forwarding) holds several messages; only the first would be
    // read here, and the queue splits it anyway.
    // SAFETY: a read of the context, which the verifier checks.
    if unsafe { (*ctx.skb.skb).gso_segs } > 1 {
        return None;
    }
    // The match sees the packet from its network header.
    let first: u8 = ctx.load(0).ok()?;
    let udp = match first >> 4 {
        4 => {
            let header = usize::from(first & 0x0f) * 4;
            let protocol: u8 = ctx.load(9).ok()?;
            let fragment = u16::from_be(ctx.load::<u16>(6).ok()?);
            if header < 20 || protocol != IPPROTO_UDP || fragment & 0x3fff != 0 {
                return None;
            }
            let pod: [u8; 4] = ctx.load(16).ok()?;
            key.pod[..4].copy_from_slice(&pod);
            key.family = AF_INET;
            header
        }
        6 => {
            let next: u8 = ctx.load(6).ok()?;
            if next != IPPROTO_UDP {
                return None;
            }
            key.pod = ctx.load(24).ok()?;
            key.family = AF_INET6;
            40
        }
        _ => return None,
    };
    let dns = udp + UDP_HEADER;
    let length = usize::from(u16::from_be(ctx.load::<u16>(udp + 4).ok()?));
    let end = (udp + length).min(ctx.len() as usize);
    if end < dns + DNS_HEADER || end - dns > MESSAGE_BYTES {
        return None;
    }
    let header: [u8; DNS_HEADER] = ctx.load(dns).ok()?;
    // A response (QR), a standard query (opcode 0), not truncated (TC), NOERROR.
    if header[2] & 0x80 == 0 || header[2] & 0x7a != 0 || header[3] & 0x0f != 0 {
        return None;
    }
    let questions = u16::from_be_bytes([header[4], header[5]]);
    let answers = usize::from(u16::from_be_bytes([header[6], header[7]]));
    if questions != 1 || answers == 0 || answers > MAX_ANSWERS {
        return None;
    }

    // The question's name: its length (walking its labels), then its bytes, hashed as the agent
    // hashes the names it grants. In two steps, so that the verifier sees one hashing loop over a
    // buffer, not one per way the labels can fall.
    let question = dns + DNS_HEADER;
    let mut length = 0usize;
    let mut ended = false;
    for _ in 0..MAX_QUESTION_LABELS {
        if question + length >= end {
            return None;
        }
        let label: u8 = ctx.load(question + length).ok()?;
        length += 1 + usize::from(label);
        if label == 0 {
            ended = true;
            break;
        }
        // A compression pointer (or a reserved label type): not in a question.
        if label > 63 || length > MAX_NAME_BYTES {
            return None;
        }
    }
    if !ended {
        return None;
    }
    // Every way out of the walk continues with the same state. The walk kept the length within
    // bounds; the verifier needs to see it right before the copy (clamped, then the lower bound).
    let length = forget(length)?.min(MAX_NAME_BYTES);
    // On the stack, not in a per-CPU map: at the output hook another run may preempt this one on
    // the same CPU.
    let mut name = [0u8; NAME_BUFFER];
    // SAFETY: a buffer of NAME_BUFFER bytes; the length is in [1, MAX_NAME_BYTES].
    if length < 1
        || unsafe {
            bpf_skb_load_bytes(
                ctx.skb.skb.cast(),
                question as u32,
                name.as_mut_ptr().cast(),
                length as u32,
            )
        } != 0
    {
        return None;
    }
    for (i, &byte) in name.iter().enumerate().take(MAX_NAME_BYTES) {
        if i >= length {
            break;
        }
        key.name = hash_step(key.name, byte);
    }
    let mut at = question + length;
    at += 4; // QTYPE, QCLASS

    let generation = *HOLD_GENERATION.get(0)?;
    // SAFETY: bpf_ktime_get_ns has no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let mut any = false;
    for record in 0..MAX_ANSWERS {
        if record >= answers {
            break;
        }
        at = forget(at)?;
        // The owner name: labels up to a compression pointer or the root.
        let mut skipped = false;
        for _ in 0..MAX_LABELS {
            if at >= end {
                return None;
            }
            let label: u8 = ctx.load(at).ok()?;
            if label == 0 {
                at += 1;
                skipped = true;
                break;
            }
            if label & 0xc0 == 0xc0 {
                at += 2;
                skipped = true;
                break;
            }
            if label > 63 {
                return None;
            }
            at += 1 + usize::from(label);
        }
        if !skipped || at + 10 > end {
            return None;
        }
        let fixed: [u8; 10] = ctx.load(at).ok()?;
        at += 10;
        let kind = u16::from_be_bytes([fixed[0], fixed[1]]);
        let class = u16::from_be_bytes([fixed[2], fixed[3]]);
        let ttl = u32::from_be_bytes([fixed[4], fixed[5], fixed[6], fixed[7]]);
        let data = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        if at + data > end {
            return None;
        }
        let address_of_pod = class == CLASS_IN
            && ((kind == TYPE_A && data == 4 && key.family == AF_INET)
                || (kind == TYPE_AAAA && data == 16 && key.family == AF_INET6));
        if address_of_pod {
            key.address = [0; 16];
            if data == 4 {
                let address: [u8; 4] = ctx.load(at).ok()?;
                key.address[..4].copy_from_slice(&address);
            } else {
                key.address = ctx.load(at).ok()?;
            }
            // SAFETY: the value is copied out at once; an update racing with it only makes this
            // answer wait (or not) one time more.
            let granted = unsafe { HOLD_GRANTS.get(key) }.copied()?;
            let ends = now + u64::from(ttl) * 1_000_000_000;
            if granted.generation != generation || ends >= granted.settled_until_ns {
                return Some(false);
            }
            any = true;
        } else if kind == TYPE_A || kind == TYPE_AAAA {
            // An address of the other family: the agent may grant it to the pod's other address.
            return Some(false);
        }
        at += data;
    }
    Some(any)
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects programs that can reach this, so it is never called.
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!(
        "network-enforcer-agent-ebpf-hold holds a kernel program: it is built for bpfel-unknown-none by \
         the agent's build script and loaded by network-enforcer-agent, not run on the host"
    );
    std::process::exit(2);
}

/// A socket filter may call `bpf_skb_load_bytes` under any license; the agent's objects share one.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
