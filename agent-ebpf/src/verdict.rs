//! A measurement, not a part of the agent (`cargo xtask bench enforce`, issue 45.2): NetworkPolicy
//! verdicts taken in eBPF at tc, without netfilter's conntrack, to weigh against the agent's nftables
//! table (docs/design.md, "Enforcement by the agent"). Attached in the bench's node namespace to the
//! server pod's veth, two ways (`MODE`):
//!
//! - **first packet** (`MODE` 0): a TCP SYN (without ACK) towards the pod is judged by one hash lookup of
//!   (source, destination, port) in `ALLOWED`; every other packet passes. The cheapest verdict there
//!   is, and what it misses is why nobody ships it: any packet that is not a SYN passes (ACK scans,
//!   data into a connection that was never allowed, all of UDP).
//! - **flow table** (`MODE` 1): an allowed SYN puts its flow in `FLOWS` (an LRU hash), an RST takes it
//!   out; any other packet towards the pod passes only when its flow is there, and packets from the
//!   pod (`verdict_from_pod`, on the veth's ingress) only when the reverse flow is. A connection table
//!   of our own, as an eBPF enforcer without conntrack must keep (still without UDP, ICMP errors, FIN
//!   handling or TCP state checks, all of which conntrack does).
//!
//! IPv4 without options only, headers in the packet's linear data: the bench sends nothing else
//! (anything else passes unjudged). A flow leaves `FLOWS` at its RST (the bench closes every
//! connection with one); a FIN-closed flow would stay until the LRU evicts it.
//! The bench mirrors `Allowed` and the `MODE` values (`agent/benches/enforce.rs`).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::{classifier, map},
    maps::{Array, HashMap, LruHashMap},
    programs::TcContext,
};

/// An allowance: this source may open connections to this destination and port.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Allowed {
    pub source: u32,
    pub destination: u32,
    pub port: u16,
    pub _pad: u16,
}

/// One direction of a TCP connection.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Flow {
    pub source: u32,
    pub destination: u32,
    pub source_port: u16,
    pub destination_port: u16,
}

#[map(name = "ALLOWED")]
static ALLOWED: HashMap<Allowed, u8> = HashMap::with_max_entries(65_536, 0);

#[map(name = "FLOWS")]
static FLOWS: LruHashMap<Flow, u8> = LruHashMap::with_max_entries(65_536, 0);

/// 0: first packet, 1: flow table.
#[map(name = "MODE")]
static MODE: Array<u32> = Array::with_max_entries(1, 0);

const ETH_HEADER: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const IPPROTO_TCP: u8 = 6;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;

/// What the verdict reads of a TCP segment.
struct Segment {
    flow: Flow,
    flags: u8,
}

/// The segment's addresses, ports and flags, read directly from the packet; `None` for anything but
/// IPv4 without options carrying TCP.
#[inline(always)]
fn segment(ctx: &TcContext) -> Option<Segment> {
    let (data, end) = (ctx.data(), ctx.data_end());
    // Ethernet, an IPv4 header without options, the TCP header up to its flags.
    if data + ETH_HEADER + 20 + 14 > end {
        return None;
    }
    let byte = |at: usize| -> u8 {
        // SAFETY: every offset passed is inside the window checked above.
        unsafe { *((data + at) as *const u8) }
    };
    let ip = ETH_HEADER;
    if u16::from_be_bytes([byte(12), byte(13)]) != ETH_P_IP
        || byte(ip) != 0x45
        || byte(ip + 9) != IPPROTO_TCP
    {
        return None;
    }
    let address =
        |at: usize| u32::from_ne_bytes([byte(at), byte(at + 1), byte(at + 2), byte(at + 3)]);
    let tcp = ip + 20;
    Some(Segment {
        flow: Flow {
            source: address(ip + 12),
            destination: address(ip + 16),
            source_port: u16::from_be_bytes([byte(tcp), byte(tcp + 1)]),
            destination_port: u16::from_be_bytes([byte(tcp + 2), byte(tcp + 3)]),
        },
        flags: byte(tcp + 13),
    })
}

#[inline(always)]
fn flow_table() -> bool {
    MODE.get(0).is_some_and(|mode| *mode == 1)
}

/// Packets towards the pod (the node-side veth's egress).
#[classifier]
pub fn verdict_to_pod(ctx: TcContext) -> i32 {
    let Some(segment) = segment(&ctx) else {
        return TC_ACT_OK;
    };
    let flow = segment.flow;
    let tracked = flow_table();
    if segment.flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
        let allowance = Allowed {
            source: flow.source,
            destination: flow.destination,
            port: flow.destination_port,
            _pad: 0,
        };
        // SAFETY: a lookup whose value is not read.
        if unsafe { ALLOWED.get(allowance) }.is_none() {
            return TC_ACT_SHOT;
        }
        if tracked {
            let _ = FLOWS.insert(flow, 1, 0);
        }
        return TC_ACT_OK;
    }
    if !tracked {
        return TC_ACT_OK;
    }
    // SAFETY: as above.
    if unsafe { FLOWS.get(flow) }.is_none() {
        return TC_ACT_SHOT;
    }
    if segment.flags & TCP_RST != 0 {
        let _ = FLOWS.remove(flow);
    }
    TC_ACT_OK
}

/// Packets from the pod (the node-side veth's ingress), flow table only: a reply passes when its
/// connection was allowed.
#[classifier]
pub fn verdict_from_pod(ctx: TcContext) -> i32 {
    let Some(segment) = segment(&ctx) else {
        return TC_ACT_OK;
    };
    let reply = Flow {
        source: segment.flow.destination,
        destination: segment.flow.source,
        source_port: segment.flow.destination_port,
        destination_port: segment.flow.source_port,
    };
    // SAFETY: as above.
    if unsafe { FLOWS.get(reply) }.is_none() {
        return TC_ACT_SHOT;
    }
    if segment.flags & TCP_RST != 0 {
        let _ = FLOWS.remove(reply);
    }
    TC_ACT_OK
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
        "network-enforcer-agent-ebpf-verdict holds kernel programs for a bench: it is built for \
         bpfel-unknown-none by the agent's build script and loaded by `cargo xtask bench enforce`"
    );
    std::process::exit(2);
}

/// GPL-compatible, as the agent's other objects.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
