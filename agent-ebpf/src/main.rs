//! The agent's kernel programs.
//!
//! - `inet_sock_set_state_btf` (BTF-enabled tracepoint on `sock/inet_sock_set_state`, reading the socket
//!   with plain loads) or, where the kernel refuses it, `inet_sock_set_state` (the raw tracepoint, a
//!   helper call per read) sees every TCP state change on the node, in every network namespace, and
//!   reports three transitions:
//!   SYN_SENT→ESTABLISHED (outbound connection), SYN_RECV→ESTABLISHED (inbound connection) and
//!   SYN_SENT→CLOSE (an outbound attempt that failed: refused, timed out, reset, dropped; the socket error
//!   tells which when the kernel set one).
//! - `udp_{connect,sendmsg,recvmsg}{4,6}` (cgroup `sock_addr` hooks, attached at the cgroup v2 root so
//!   they cover every pod) see UDP `connect()`, `sendto()`/`sendmsg()` with an address, and
//!   `recvfrom()`/`recvmsg()` asking for the sender's address. They always allow the operation.
//!
//! - `dns_queries` / `dns_answers` (cgroup `skb`, egress / ingress, in [`dns`]) copy the DNS messages
//!   pods send and receive to the `DNS_EVENTS` ring buffer, for the names of outside peers.
//!
//! Events go to the `EVENTS` ring buffer as `FlowEvent`s (see `network-enforcer-agent-common`). Two LRU maps
//! keep the event rate bounded: `EDGES` reports each edge (local pod, peer, port, protocol, direction,
//! outcome) at most once per dedupe window, carrying the number of suppressed occurrences in the next
//! report; `UDP_PEERS` remembers, per socket and peer, who sent first, so a UDP reply is counted on the
//! request's edge instead of looking like a new connection in the other direction.
//!
//! Attribution context:
//! - TCP: the network namespace and cgroup come from the socket itself (`sk->__sk_common.skc_net`,
//!   `sk->sk_cgrp_data.cgroup`), set when the socket was created (an accepted socket inherits the
//!   listener's), so they are right even though the ESTABLISHED/CLOSE transitions run in softirq context
//!   where the current task can be any unrelated process. The process id is only known inside
//!   `connect()`, so it is captured at CLOSE→SYN_SENT in `CONNECTING`, keyed by socket.
//! - UDP: also from the socket (the hooks run in the calling task's system call, but that task may have
//!   moved to another namespace or cgroup since it created the socket); the current task's namespace and
//!   cgroup are the fallback when the socket cannot be read.
//!
//! Kernel struct offsets come from user space (BTF) in `CONFIG`; Rust eBPF has no CO-RE.
//!
//! The crate is also checked and built for the host (`cargo clippy --workspace`, `cargo build --workspace`),
//! where it uses std and has a `main` that refuses to run: that keeps the real code linted with the rest of
//! the workspace. Only the BPF build (by the agent's build script) produces the programs.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod dns;

use aya_ebpf::{
    EbpfContext as _,
    bindings::bpf_sock_addr,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_socket_cookie, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{btf_tracepoint, cgroup_sock_addr, map, raw_tracepoint},
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, RawTracePointContext, SockAddrContext},
};
use network_enforcer_agent_common::{
    AF_INET, AF_INET6, CONNECTING_KEY_BYTES, CONNECTING_VALUE_BYTES, COUNTER_SLOTS, Config,
    Counter, DEFAULT_FLOW_MAP_ENTRIES, DEFAULT_RING_BUFFER_BYTES, Direction, EDGE_KEY_BYTES,
    EDGE_VALUE_BYTES, FlowEvent, IPPROTO_TCP, IPPROTO_UDP, KernelOffsets, Outcome, SWITCH_SLOTS,
    Switch, UDP_PEER_KEY_BYTES, UDP_PEER_VALUE_BYTES, tcp_state,
};

/// Connection events for user space. User space may resize it at load time.
#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BUFFER_BYTES, 0);

/// `bpf_ringbuf_query` flag: bytes not yet consumed (include/uapi/linux/bpf.h).
const BPF_RB_AVAIL_DATA: u64 = 0;
/// `bpf_ringbuf_submit` flags: do not notify the reader, or notify it now.
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
/// `bpf_map_update_elem` flags: only a new key, or only an existing one.
const BPF_NOEXIST: u64 = 1;
const BPF_EXIST: u64 = 2;
/// What one event takes in the ring buffer: its 8-byte record header and the event, 8-aligned.
const RECORD_BYTES: u64 = (8 + core::mem::size_of::<FlowEvent>() as u64).next_multiple_of(8);
/// Unread bytes (64 records) from which a submit wakes the reader.
const WAKEUP_BYTES: u64 = 64 * core::mem::size_of::<FlowEvent>() as u64;

/// Per-CPU event counters, indexed by `Counter` (per-CPU because BPF in Rust has no atomic add).
#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// What user space turned on, indexed by `Switch`.
#[map(name = "SWITCHES")]
static SWITCHES: Array<u32> = Array::with_max_entries(SWITCH_SLOTS, 0);

/// Sockets in SYN_SENT → the process that called `connect()` (while `Switch::ConnectionPids` is on). LRU so sockets whose CLOSE we never see
/// age out instead of filling the map.
#[map(name = "CONNECTING")]
static CONNECTING: LruHashMap<u64, u32> = LruHashMap::with_max_entries(DEFAULT_FLOW_MAP_ENTRIES, 0);

/// Edge → when it was last reported and how many occurrences were suppressed since (the dedupe).
#[map(name = "EDGES")]
static EDGES: LruHashMap<EdgeKey, EdgeState> =
    LruHashMap::with_max_entries(DEFAULT_FLOW_MAP_ENTRIES, 0);

/// (UDP socket, peer) → the direction of its first datagram, so replies join the request's edge.
#[map(name = "UDP_PEERS")]
static UDP_PEERS: LruHashMap<UdpPeerKey, u8> =
    LruHashMap::with_max_entries(DEFAULT_FLOW_MAP_ENTRIES, 0);

// User space walks these maps by their byte sizes (agent-common).
const _: () = assert!(core::mem::size_of::<u64>() == CONNECTING_KEY_BYTES);
const _: () = assert!(core::mem::size_of::<u32>() == CONNECTING_VALUE_BYTES);
const _: () = assert!(core::mem::size_of::<EdgeKey>() == EDGE_KEY_BYTES);
const _: () = assert!(core::mem::size_of::<EdgeState>() == EDGE_VALUE_BYTES);
const _: () = assert!(core::mem::size_of::<UdpPeerKey>() == UDP_PEER_KEY_BYTES);
const _: () = assert!(core::mem::size_of::<u8>() == UDP_PEER_VALUE_BYTES);

/// Patched by user space at load time (tracepoint layout, kernel offsets, dedupe window).
#[unsafe(no_mangle)]
static CONFIG: Config = Config::DEFAULT;

/// The identity of an edge for the dedupe. Every byte is initialised (explicit padding): the map hashes
/// the raw bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct EdgeKey {
    cgroup_id: u64,
    netns_ino: u32,
    /// The peer's port for outbound edges, the local port for inbound ones (the peer's ephemeral port
    /// changes with every connection and is not part of the edge).
    port: u16,
    family: u16,
    protocol: u8,
    direction: u8,
    outcome: u8,
    _pad: u8,
    peer: [u8; 16],
    _pad2: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct EdgeState {
    last_reported_ns: u64,
    suppressed: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UdpPeerKey {
    socket_cookie: u64,
    peer: [u8; 16],
    port: u16,
    family: u16,
    _pad: u32,
}

/// Reads the load-time configuration. The volatile read keeps the compiler from folding the default
/// values in: the real ones are only known when user space loads the program.
#[inline(always)]
fn config() -> Config {
    // SAFETY: CONFIG is a valid, aligned static; the read is by value.
    unsafe { core::ptr::read_volatile(&CONFIG) }
}

/// Whether user space turned `switch` on.
#[inline(always)]
fn switched_on(switch: Switch) -> bool {
    SWITCHES.get(switch as u32).is_some_and(|on| *on != 0)
}

/// Adds one to a per-CPU counter.
#[inline(always)]
fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: the pointer is to this CPU's slot of the array, and BPF programs are not preempted
        // by other programs on the same CPU in these contexts.
        unsafe { *slot += 1 };
    }
}

/// Keeps the most unread bytes this CPU saw in the events ring buffer (user space reads and resets it).
#[inline(always)]
fn note_ring_buffer_fill(unread: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(Counter::RingBufferPeakBytes as u32) {
        // SAFETY: as in `count`.
        unsafe {
            if unread > *slot {
                *slot = unread;
            }
        }
    }
}

/// Applies the dedupe, then sends the event to user space (or counts it as lost when the ring buffer
/// is full).
#[inline(always)]
fn report(event: &mut FlowEvent, window_ns: u64) {
    if window_ns != 0 {
        let inbound = event.direction == Direction::Inbound as u8;
        let key = EdgeKey {
            cgroup_id: event.cgroup_id,
            netns_ino: event.netns_ino,
            port: if inbound {
                event.local_port
            } else {
                event.remote_port
            },
            family: event.family,
            protocol: event.protocol,
            direction: event.direction,
            outcome: event.outcome,
            _pad: 0,
            peer: event.remote_addr,
            _pad2: 0,
        };
        match EDGES.get_ptr_mut(key) {
            Some(state) => {
                // SAFETY: the map value stays valid while the program runs. Two CPUs updating the same
                // edge at once can lose an increment; the count is a rate hint, not an invoice.
                let state = unsafe { &mut *state };
                if event.timestamp_ns.wrapping_sub(state.last_reported_ns) < window_ns {
                    state.suppressed = state.suppressed.saturating_add(1);
                    count(Counter::DedupeHit);
                    return;
                }
                event.count = state.suppressed.saturating_add(1);
                state.last_reported_ns = event.timestamp_ns;
                state.suppressed = 0;
            }
            None => {
                let state = EdgeState {
                    last_reported_ns: event.timestamp_ns,
                    suppressed: 0,
                    _pad: 0,
                };
                // A full LRU evicts its oldest edge, which is then simply reported again later.
                // Only a new key counts: another CPU may have put the same edge in meanwhile.
                if EDGES.insert(key, state, BPF_NOEXIST).is_ok() {
                    count(Counter::EdgesInserted);
                }
            }
        }
    }
    // Wake the reader only once a batch of records waits: a wakeup per record (a busy node
    // connects tens of thousands of times a second) costs more than reading the record. The reader
    // also drains the buffer on a short timer, which picks up a quiet node's few records.
    let waiting = EVENTS.query(BPF_RB_AVAIL_DATA);
    // With this event's record: a buffer this fills is full (and the next event lost).
    note_ring_buffer_fill(waiting + RECORD_BYTES);
    let wakeup = if waiting >= WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    match EVENTS.reserve::<FlowEvent>(0) {
        Some(mut entry) => {
            entry.write(*event);
            entry.submit(wakeup);
        }
        None => count(Counter::RingBufferFull),
    }
}

/// Reads a kernel value at `base + offset`, or `None` when the offset is unknown or the read faults.
#[inline(always)]
fn read_kernel<T>(base: u64, offset: u32) -> Option<T> {
    if base == 0 || offset == KernelOffsets::UNKNOWN {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel checks the address and fails instead of faulting.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T).ok() }
}

/// How a program reads kernel memory: a helper call per read (`PROBE`, any program), or a plain load
/// (`DIRECT`, only from a BTF-typed pointer such as a `tp_btf` argument). A plain load costs a few
/// instructions where the helper costs a call; the verifier allows it because the offsets, read from
/// the frozen, program-read-only `CONFIG`, are constants to it, and it checks each load against the
/// kernel's BTF (a field of that size at that offset). A fault reads zero instead of failing.
const PROBE: bool = false;
const DIRECT: bool = true;

/// [`read_kernel`] for `HOW`, `PROBE` or `DIRECT`. A direct read must be of one whole field (or a
/// part of one): the verifier refuses a load across two.
#[inline(always)]
fn read_field<T: Copy, const HOW: bool>(base: u64, offset: u32) -> Option<T> {
    if !HOW {
        return read_kernel(base, offset);
    }
    if base == 0 || offset == KernelOffsets::UNKNOWN {
        return None;
    }
    // SAFETY: `base` is a BTF-typed kernel pointer and `offset` a field of its type (user space took
    // both from BTF); the verifier checks the load and turns it into one that reads zero on a fault.
    Some(unsafe { core::ptr::read_volatile((base + offset as u64) as *const T) })
}

/// An IPv4 address in an event's 16-byte field: its 4 bytes, then zeros. Written as one 128-bit value:
/// filling the first 4 bytes of a zeroed array made the compiler zero the other 12 with a call to a
/// byte-by-byte `memset` subprogram, twice per event.
#[inline(always)]
fn v4_address(addr: [u8; 4]) -> [u8; 16] {
    u128::from(u32::from_le_bytes(addr)).to_le_bytes()
}

/// The inode number of a `struct net`.
#[inline(always)]
fn netns_inode<const HOW: bool>(net: u64, k: &KernelOffsets) -> u32 {
    read_field::<u32, HOW>(net, k.net_inum).unwrap_or(0)
}

/// The network namespace inode and cgroup v2 id recorded in a `struct sock`.
#[inline(always)]
fn socket_context<const HOW: bool>(sk: u64, k: &KernelOffsets) -> (u32, u64) {
    let netns = read_field::<u64, HOW>(sk, k.sock_net)
        .map(|net| netns_inode::<HOW>(net, k))
        .unwrap_or(0);
    let cgroup = read_field::<u64, HOW>(sk, k.sock_cgroup)
        .and_then(|cgrp| read_field::<u64, HOW>(cgrp, k.cgroup_kn))
        .and_then(|kn| read_field::<u64, HOW>(kn, k.kernfs_node_id))
        .unwrap_or(0);
    (netns, cgroup)
}

/// The start of `struct sock_common`, read with one probe read by the raw program and field by field
/// by the typed one (user space checks the layout in BTF:
/// it has not changed since Linux 2.6, but a kernel that differs is refused rather than misread).
#[repr(C)]
#[derive(Clone, Copy)]
struct SockHead {
    /// `skc_daddr` (network byte order).
    daddr: [u8; 4],
    /// `skc_rcv_saddr` (network byte order).
    rcv_saddr: [u8; 4],
    /// `skc_hash`.
    _hash: u32,
    /// `skc_dport` (network byte order).
    dport: u16,
    /// `skc_num`: the local port (host byte order).
    num: u16,
    /// `skc_family`.
    family: u16,
}

/// An IPv6 address (`struct in6_addr`) at `offset`: one probe read, or four 32-bit loads (the
/// elements of its `u6_addr32`; a byte array would compile to sixteen byte loads).
#[inline(always)]
fn v6_address<const HOW: bool>(sk: u64, offset: u32) -> Option<[u8; 16]> {
    if !HOW {
        return read_kernel::<[u8; 16]>(sk, offset);
    }
    let word = |i: u32| {
        offset
            .checked_add(4 * i)
            .and_then(|at| read_field::<u32, DIRECT>(sk, at))
    };
    let words = [word(0)?, word(1)?, word(2)?, word(3)?];
    Some(
        (u128::from(words[0])
            | u128::from(words[1]) << 32
            | u128::from(words[2]) << 64
            | u128::from(words[3]) << 96)
            .to_le_bytes(),
    )
}

/// The head of `struct sock_common` at `head`: one probe read, or one direct load per field (the
/// verifier checks each against one field).
#[inline(always)]
fn sock_head<const HOW: bool>(sk: u64, head: u32) -> Option<SockHead> {
    if !HOW {
        return read_kernel::<SockHead>(sk, head);
    }
    let field = |at: u32| head.checked_add(at).unwrap_or(KernelOffsets::UNKNOWN);
    Some(SockHead {
        daddr: read_field::<u32, DIRECT>(sk, field(0))?.to_ne_bytes(),
        rcv_saddr: read_field::<u32, DIRECT>(sk, field(4))?.to_ne_bytes(),
        _hash: 0,
        dport: read_field::<u16, DIRECT>(sk, field(12))?,
        num: read_field::<u16, DIRECT>(sk, field(14))?,
        family: read_field::<u16, DIRECT>(sk, field(16))?,
    })
}

/// A raw tracepoint (not the classic one): the kernel hands over the tracepoint's arguments as they
/// are, instead of first building the trace record (perf buffer, every field copied) for each of the
/// several state changes of every connection, most of which the program then ignores.
#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn inet_sock_set_state(ctx: RawTracePointContext) -> i32 {
    // TP_PROTO(const struct sock *sk, const int oldstate, const int newstate)
    let sk: u64 = ctx.arg(0);
    let oldstate = ctx.arg::<u64>(1) as i32;
    let newstate = ctx.arg::<u64>(2) as i32;
    on_tcp_state_change::<PROBE>(sk, oldstate, newstate);
    0
}

/// The same tracepoint, BTF-enabled (`tp_btf`): the socket is a typed pointer, so the program reads
/// it with plain loads instead of a helper call per field. The agent loads this one and falls back to
/// [`inet_sock_set_state`] where the kernel refuses it (docs/design.md, "Capture").
#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn inet_sock_set_state_btf(ctx: BtfTracePointContext) -> i32 {
    let sk: *const u8 = ctx.arg(0);
    on_tcp_state_change::<DIRECT>(sk as u64, ctx.arg(1), ctx.arg(2));
    0
}

#[inline(always)]
fn on_tcp_state_change<const HOW: bool>(sk: u64, oldstate: i32, newstate: i32) {
    // Decided on the arguments alone: most state changes (closing, the listener's SYN_RECV child being
    // created) end here without a single read of kernel memory.
    let (direction, outcome) = match (oldstate, newstate) {
        // Only to note the process, which costs a map insert and a removal per connection.
        (tcp_state::CLOSE, tcp_state::SYN_SENT) if switched_on(Switch::ConnectionPids) => {
            (Direction::Outbound, None)
        }
        (tcp_state::SYN_SENT, tcp_state::ESTABLISHED) => {
            (Direction::Outbound, Some(Outcome::Established))
        }
        (tcp_state::SYN_SENT, tcp_state::CLOSE) => (Direction::Outbound, Some(Outcome::Failed)),
        (tcp_state::SYN_RECV, tcp_state::ESTABLISHED) => {
            (Direction::Inbound, Some(Outcome::Established))
        }
        _ => return,
    };
    let cfg = config();
    let k = &cfg.kernel;
    // The same tracepoint also fires for SCTP and MPTCP sockets.
    if read_field::<u16, HOW>(sk, k.sock_protocol) != Some(IPPROTO_TCP as u16) {
        return;
    }
    let Some(outcome) = outcome else {
        // Inside connect(): remember who is connecting. A full LRU evicts the oldest entry.
        let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
        // Counted only as a new key (the evictions are estimated from it); a socket address
        // reused before its entry left gets the new process.
        if CONNECTING.insert(sk, pid, BPF_NOEXIST).is_ok() {
            count(Counter::ConnectingInserted);
        } else {
            let _ = CONNECTING.insert(sk, pid, BPF_EXIST);
        }
        return;
    };

    let mut event = FlowEvent::zeroed();
    // SAFETY: helper call without preconditions.
    event.timestamp_ns = unsafe { bpf_ktime_get_ns() };
    event.protocol = IPPROTO_TCP;
    event.direction = direction as u8;
    event.outcome = outcome as u8;
    // Looked up whether the switch is on or not: an entry noted before it went off is taken out at
    // its connection's outcome (it names this very socket's process), so none stays behind for a
    // later socket at the same address. A miss in a near-empty map is cheap.
    if direction == Direction::Outbound {
        // SAFETY: lookup of a plain u32 value, copied out immediately.
        if let Some(pid) = unsafe { CONNECTING.get(sk) } {
            event.pid = *pid;
            if CONNECTING.remove(sk).is_ok() {
                count(Counter::ConnectingRemoved);
            }
        }
    }
    (event.netns_ino, event.cgroup_id) = socket_context::<HOW>(sk, k);
    if outcome == Outcome::Failed {
        // tcp_reset()/tcp_write_err() set sk_err before tcp_done() moves the socket to CLOSE.
        let err = read_field::<i32, HOW>(sk, k.sock_err).unwrap_or(0);
        event.error = if (0..=255).contains(&err) {
            err as u8
        } else {
            0
        };
    }
    let Some(head) = sock_head::<HOW>(sk, k.sock_head) else {
        return;
    };
    event.family = head.family;
    event.local_port = if outcome == Outcome::Failed {
        // The failed socket gave its port back (skc_num is 0 now); inet_sport still holds it. A
        // probe read either way: `inet_sock` lies beyond the `struct sock` the BTF pointer types.
        read_kernel::<u16>(sk, k.inet_sport).map_or(0, u16::from_be)
    } else {
        head.num
    };
    event.remote_port = u16::from_be(head.dport);
    match head.family {
        AF_INET => {
            event.local_addr = v4_address(head.rcv_saddr);
            event.remote_addr = v4_address(head.daddr);
        }
        AF_INET6 => {
            let (Some(local), Some(remote)) = (
                v6_address::<HOW>(sk, k.sock_v6_rcv_saddr),
                v6_address::<HOW>(sk, k.sock_v6_daddr),
            ) else {
                return;
            };
            event.local_addr = local;
            event.remote_addr = remote;
        }
        _ => {
            count(Counter::UnknownFamily);
            return;
        }
    }
    report(&mut event, cfg.dedupe_window_ns);
}

/// `SOCK_DGRAM`.
const SOCK_DGRAM: u32 = 2;
/// What a `sock_addr` program returns to let the system call proceed. Returning 0 would fail it with
/// EPERM: these programs observe, they never block.
const ALLOW: i32 = 1;

#[cgroup_sock_addr(connect4)]
pub fn udp_connect4(ctx: SockAddrContext) -> i32 {
    on_udp(&ctx, AF_INET, Direction::Outbound);
    ALLOW
}

#[cgroup_sock_addr(connect6)]
pub fn udp_connect6(ctx: SockAddrContext) -> i32 {
    on_udp(&ctx, AF_INET6, Direction::Outbound);
    ALLOW
}

#[cgroup_sock_addr(sendmsg4)]
pub fn udp_sendmsg4(ctx: SockAddrContext) -> i32 {
    on_udp(&ctx, AF_INET, Direction::Outbound);
    ALLOW
}

#[cgroup_sock_addr(sendmsg6)]
pub fn udp_sendmsg6(ctx: SockAddrContext) -> i32 {
    on_udp(&ctx, AF_INET6, Direction::Outbound);
    ALLOW
}

#[cgroup_sock_addr(recvmsg4)]
pub fn udp_recvmsg4(ctx: SockAddrContext) -> i32 {
    on_udp(&ctx, AF_INET, Direction::Inbound);
    ALLOW
}

#[cgroup_sock_addr(recvmsg6)]
pub fn udp_recvmsg6(ctx: SockAddrContext) -> i32 {
    on_udp(&ctx, AF_INET6, Direction::Inbound);
    ALLOW
}

/// Reports one UDP exchange seen by a `sock_addr` hook. `direction` is what this hook means on its own
/// (send: outbound, receive: inbound); a reply to an earlier datagram takes the earlier one's direction.
#[inline(always)]
fn on_udp(ctx: &SockAddrContext, family: u16, hook_direction: Direction) {
    let addr: *const bpf_sock_addr = ctx.sock_addr;
    // SAFETY: ctx fields are read with loads the verifier rewrites to the kernel's `struct sock_addr`.
    let (sock_type, user_port) = unsafe { ((*addr).type_, (*addr).user_port) };
    if sock_type != SOCK_DGRAM {
        return; // connect4/6 also fire for TCP, which the tracepoint covers
    }
    // user_port holds the port in network byte order in its low 16 bits. Port 0 is no destination:
    // a UDP connect() to port 0 is how resolvers (glibc's getaddrinfo, RFC 6724 sorting) ask the
    // kernel which source address a destination would get; nothing is sent.
    let remote_port = u16::from_be(user_port as u16);
    if remote_port == 0 {
        return;
    }
    let cfg = config();
    let mut event = FlowEvent::zeroed();
    // SAFETY: helpers without preconditions.
    unsafe {
        event.timestamp_ns = bpf_ktime_get_ns();
        event.cgroup_id = bpf_get_current_cgroup_id();
    }
    event.pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    event.family = family;
    event.protocol = IPPROTO_UDP;
    event.outcome = Outcome::Datagram as u8;
    event.remote_port = remote_port;
    // SAFETY: as above; `sk` is the kernel's socket (never null in sock_addr programs).
    unsafe {
        let sk = (*addr).__bindgen_anon_1.sk;
        event.local_port = (*sk).src_port as u16; // host byte order already
        if family == AF_INET {
            event.remote_addr = v4_address((*addr).user_ip4.to_ne_bytes());
            event.local_addr = v4_address((*sk).src_ip4.to_ne_bytes());
        } else {
            for i in 0..4 {
                let remote = (*addr).user_ip6[i].to_ne_bytes();
                let local = (*sk).src_ip6[i].to_ne_bytes();
                event.remote_addr[4 * i..4 * i + 4].copy_from_slice(&remote);
                event.local_addr[4 * i..4 * i + 4].copy_from_slice(&local);
            }
        }
    }
    // The socket's network namespace and cgroup, as for TCP: the task may have entered another
    // namespace (setns) or cgroup since it created the socket. The real context is the kernel's
    // `struct bpf_sock_addr_kern`, whose first member is the `struct sock *` (checked against BTF in
    // user space); reading it gives the socket address for probe reads.
    let k = &cfg.kernel;
    let sk = if k.sock_addr_kern_sk == 0 {
        // SAFETY: bpf_probe_read_kernel checks the address; ctx points at bpf_sock_addr_kern.
        unsafe { bpf_probe_read_kernel(ctx.as_ptr() as *const u64).unwrap_or(0) }
    } else {
        0
    };
    let (netns, cgroup) = socket_context::<PROBE>(sk, k);
    if netns != 0 {
        event.netns_ino = netns;
    } else {
        // Fallback: the task's namespace, task->nsproxy->net_ns.
        // SAFETY: helper without preconditions; the result is only used as an address for probe reads.
        let task = unsafe { bpf_get_current_task() };
        event.netns_ino = read_kernel::<u64>(task, k.task_nsproxy)
            .and_then(|nsproxy| read_kernel::<u64>(nsproxy, k.nsproxy_net_ns))
            .map(|net| netns_inode::<PROBE>(net, k))
            .unwrap_or(0);
    }
    if cgroup != 0 {
        event.cgroup_id = cgroup;
    }

    // Who sent first on this socket to/from this peer decides the direction.
    let peer_key = UdpPeerKey {
        // SAFETY: helper valid for sock_addr programs.
        socket_cookie: unsafe { bpf_get_socket_cookie(ctx.as_ptr()) },
        peer: event.remote_addr,
        port: event.remote_port,
        family,
        _pad: 0,
    };
    // SAFETY: lookup of a plain u8 value, copied out immediately.
    event.direction = match unsafe { UDP_PEERS.get(peer_key) } {
        Some(first) => *first,
        None => {
            if UDP_PEERS
                .insert(peer_key, hook_direction as u8, BPF_NOEXIST)
                .is_ok()
            {
                count(Counter::UdpPeersInserted);
            }
            hook_direction as u8
        }
    };
    report(&mut event, cfg.dedupe_window_ns);
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
        "network-enforcer-agent-ebpf holds kernel programs: it is built for bpfel-unknown-none by the \
         agent's build script and loaded by network-enforcer-agent, not run on the host"
    );
    std::process::exit(2);
}

/// The kernel only lets GPL-compatible programs call some helpers (e.g. `bpf_probe_read_kernel`).
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
