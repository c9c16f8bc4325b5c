//! DNS messages of the pods, copied to user space (docs/design.md, "Names of outside peers").
//!
//! Two cgroup `skb` programs at the node's cgroup (as the UDP hooks): `dns_queries` for egress copies
//! every UDP datagram a pod sends to port 53, `dns_answers` for ingress every one it receives from
//! port 53. Both only read and always let the packet through, so the pod's DNS path is unchanged
//! whatever server answers (the cluster DNS Service, a node-local cache, an outside resolver). The
//! ingress program runs when the datagram is delivered to the pod's socket, before it is queued there:
//! the answer is in the ring buffer before the pod can read it.
//!
//! What user space believes is its business (`agent/src/dns/`): it takes an answer only for a query
//! of the same socket, server, transaction id and question.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_skb_cgroup_id, bpf_skb_load_bytes},
    macros::{cgroup_skb, map},
    maps::RingBuf,
    programs::SkBuffContext,
};
use network_enforcer_agent_common::{
    AF_INET, AF_INET6, Counter, DNS_ANSWER, DNS_CAPTURE_BYTES, DNS_PORT, DNS_QUERY,
    DNS_RING_BUFFER_BYTES, DnsPacket, IPPROTO_UDP,
};

use crate::count;

/// Captured DNS messages for user space, apart from the connection events: a burst of DNS (a pod
/// querying random names) cannot take the connection events' room, nor the reverse.
#[map(name = "DNS_EVENTS")]
static DNS_EVENTS: RingBuf = RingBuf::with_byte_size(DNS_RING_BUFFER_BYTES, 0);

/// `bpf_ringbuf_submit` flags: do not notify the reader, or notify it now.
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
/// The UDP header's length.
const UDP_HEADER: usize = 8;
/// A DNS message's header: anything shorter is no DNS message.
const DNS_HEADER: usize = 12;

/// Copies DNS queries pods send. Attached for egress; always allows.
#[cgroup_skb]
pub fn dns_queries(ctx: SkBuffContext) -> i32 {
    capture(&ctx, DNS_QUERY);
    1
}

/// Copies DNS answers pods receive. Attached for ingress; always allows.
#[cgroup_skb]
pub fn dns_answers(ctx: SkBuffContext) -> i32 {
    capture(&ctx, DNS_ANSWER);
    1
}

/// Where a UDP datagram's header starts, its family and addresses (source, destination); `None` for
/// anything else, or for a fragment after the first (it carries no UDP header).
#[inline(always)]
fn udp_datagram(ctx: &SkBuffContext) -> Option<(usize, u16, [u8; 16], [u8; 16])> {
    // cgroup skb programs see the packet from its network header.
    let first: u8 = ctx.load(0).ok()?;
    let mut source = [0u8; 16];
    let mut destination = [0u8; 16];
    match first >> 4 {
        4 => {
            let header = usize::from(first & 0x0f) * 4;
            let protocol: u8 = ctx.load(9).ok()?;
            let fragment = u16::from_be(ctx.load::<u16>(6).ok()?);
            if header < 20 || protocol != IPPROTO_UDP || fragment & 0x1fff != 0 {
                return None;
            }
            let s: [u8; 4] = ctx.load(12).ok()?;
            let d: [u8; 4] = ctx.load(16).ok()?;
            source[..4].copy_from_slice(&s);
            destination[..4].copy_from_slice(&d);
            Some((header, AF_INET, source, destination))
        }
        6 => {
            // Only a UDP header right after the fixed header; extension headers are not walked.
            let next: u8 = ctx.load(6).ok()?;
            if next != IPPROTO_UDP {
                return None;
            }
            source = ctx.load(8).ok()?;
            destination = ctx.load(24).ok()?;
            Some((40, AF_INET6, source, destination))
        }
        _ => None,
    }
}

/// Whether the packet is surely no DNS message of `kind`, read directly from its linear data: the
/// programs run for every packet of every pod, and most are not DNS. `false` when the headers are
/// not in the linear part (then the helper path decides). Only IPv4 without options and IPv6 without
/// extension headers are read here; the rest takes the helper path.
#[inline(always)]
fn surely_not_dns(ctx: &SkBuffContext, kind: u8) -> bool {
    /// An IPv4 header without options and the UDP ports; an IPv6 header and the UDP ports.
    const V4: usize = 24;
    const V6: usize = 44;
    // SAFETY: reads of the context's data pointers, which the verifier rewrites; every packet byte
    // read below is within a window bounds-checked against data_end first.
    let (data, end) = unsafe {
        (
            (*ctx.skb.skb).data as usize,
            (*ctx.skb.skb).data_end as usize,
        )
    };
    if data + V4 > end {
        return false;
    }
    let byte = |at: usize| -> u8 {
        // SAFETY: callers pass offsets inside a checked window.
        unsafe { *((data + at) as *const u8) }
    };
    let (protocol, udp) = match byte(0) {
        0x45 => (byte(9), 20),
        first if first >> 4 == 6 => {
            if data + V6 > end {
                return false;
            }
            (byte(6), 40)
        }
        first if first >> 4 == 4 => return false, // IPv4 with options: the helper path
        _ => return true,
    };
    if protocol != IPPROTO_UDP {
        return true;
    }
    // The source port for an answer, the destination port for a query.
    let at = if kind == DNS_QUERY { udp + 2 } else { udp };
    u16::from_be_bytes([byte(at), byte(at + 1)]) != DNS_PORT
}

#[inline(always)]
fn capture(ctx: &SkBuffContext, kind: u8) {
    if surely_not_dns(ctx, kind) {
        return;
    }
    let Some((udp, family, source, destination)) = udp_datagram(ctx) else {
        return;
    };
    let Ok(ports) = ctx.load::<[u8; 4]>(udp) else {
        return;
    };
    let source_port = u16::from_be_bytes([ports[0], ports[1]]);
    let destination_port = u16::from_be_bytes([ports[2], ports[3]]);
    let query = kind == DNS_QUERY;
    let (server_port, local_port) = if query {
        (destination_port, source_port)
    } else {
        (source_port, destination_port)
    };
    if server_port != DNS_PORT {
        return;
    }
    let offset = udp + UDP_HEADER;
    let wire_len = (ctx.len() as usize).saturating_sub(offset);
    if wire_len < DNS_HEADER {
        return;
    }
    let Some(mut entry) = DNS_EVENTS.reserve::<DnsPacket>(0) else {
        count(Counter::DnsRingBufferFull);
        return;
    };
    let packet = entry.as_mut_ptr();
    // SAFETY: `packet` points at a reserved, writable DnsPacket in the ring buffer; every field but
    // the payload is written here, the payload up to `captured` below (user space reads no further).
    unsafe {
        (*packet).timestamp_ns = bpf_ktime_get_ns();
        (*packet).cgroup_id = bpf_skb_cgroup_id(ctx.skb.skb);
        (*packet).family = family;
        (*packet).kind = kind;
        (*packet)._pad = 0;
        (*packet).local_port = local_port;
        (*packet).remote_port = server_port;
        (*packet).wire_len = wire_len as u32;
        if query {
            (*packet).local_addr = source;
            (*packet).remote_addr = destination;
        } else {
            (*packet).local_addr = destination;
            (*packet).remote_addr = source;
        }
        // The copy's length must be provably in [1, DNS_CAPTURE_BYTES] for the verifier: clamp it
        // and check the lower bound right before the call, on the same value.
        let captured = wire_len.min(DNS_CAPTURE_BYTES);
        if captured < DNS_HEADER
            || bpf_skb_load_bytes(
                ctx.skb.skb.cast(),
                offset as u32,
                (*packet).payload.as_mut_ptr().cast(),
                captured as u32,
            ) != 0
        {
            entry.discard(0);
            return;
        }
        (*packet).captured = captured as u32;
    }
    if wire_len > DNS_CAPTURE_BYTES {
        count(Counter::DnsTruncated);
    }
    // An answer wakes the reader at once (names are needed before the pod connects); a query waits
    // for its answer's wakeup.
    entry.submit(if query {
        BPF_RB_NO_WAKEUP
    } else {
        BPF_RB_FORCE_WAKEUP
    });
}
