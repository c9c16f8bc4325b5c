//! The records shared by the agent's eBPF programs (`agent-ebpf`, kernel side) and the agent (user side).
//!
//! Everything here is `#[repr(C)]` with explicit padding: the kernel writes these bytes into maps and the
//! ring buffer, and user space reads them back with the same layout. The crate is `no_std` so the eBPF
//! crate can use it; the `user` feature adds the `aya::Pod` impls user space needs.
#![no_std]

pub mod hold;
pub mod scan;

/// `AF_INET`, as the kernel reports it in `family`.
pub const AF_INET: u16 = 2;
/// `AF_INET6`, as the kernel reports it in `family`.
pub const AF_INET6: u16 = 10;
/// `IPPROTO_TCP`.
pub const IPPROTO_TCP: u8 = 6;
/// `IPPROTO_UDP`.
pub const IPPROTO_UDP: u8 = 17;

/// Name of the ring buffer map carrying [`FlowEvent`]s.
pub const EVENTS_MAP: &str = "EVENTS";
/// Name of the per-CPU `u64` array of [`Counter`]s.
pub const COUNTERS_MAP: &str = "COUNTERS";
/// Name of the global holding the [`Config`] patched in at load time.
pub const CONFIG_GLOBAL: &str = "CONFIG";
/// Name of the TCP state-change program as a raw tracepoint on `sock/inet_sock_set_state`: the
/// fallback where the kernel refuses [`TCP_STATE_BTF_PROGRAM`].
pub const TCP_STATE_PROGRAM: &str = "inet_sock_set_state";
/// The same program on the BTF-enabled tracepoint (`tp_btf`), reading the socket with plain loads.
pub const TCP_STATE_BTF_PROGRAM: &str = "inet_sock_set_state_btf";
/// Names of the UDP cgroup `sock_addr` programs, attached at the cgroup v2 root.
pub const UDP_PROGRAMS: [&str; 6] = [
    "udp_connect4",
    "udp_connect6",
    "udp_sendmsg4",
    "udp_sendmsg6",
    "udp_recvmsg4",
    "udp_recvmsg6",
];

/// The programs' LRU hash maps, whose fill the agent reports (a full one evicts its oldest entry):
/// sockets inside `connect()`, the dedupe's edges, UDP sockets' peers.
pub const CONNECTING_MAP: &str = "CONNECTING";
pub const EDGES_MAP: &str = "EDGES";
pub const UDP_PEERS_MAP: &str = "UDP_PEERS";
/// Bytes of those maps' keys and values, for user space to walk them (checked in the eBPF crate).
pub const CONNECTING_KEY_BYTES: usize = 8;
pub const CONNECTING_VALUE_BYTES: usize = 4;
pub const EDGE_KEY_BYTES: usize = 40;
pub const EDGE_VALUE_BYTES: usize = 16;
pub const UDP_PEER_KEY_BYTES: usize = 32;
pub const UDP_PEER_VALUE_BYTES: usize = 1;
/// Default capacity of each of those maps (user space may change it at load time).
pub const DEFAULT_FLOW_MAP_ENTRIES: u32 = 65_536;

/// Default size of the events ring buffer in bytes (a power of two, a multiple of the page size).
pub const DEFAULT_RING_BUFFER_BYTES: u32 = 1 << 22;

/// Name of the ring buffer map carrying [`DnsPacket`]s.
pub const DNS_EVENTS_MAP: &str = "DNS_EVENTS";
/// Size of the DNS ring buffer: about 800 captured messages waiting.
pub const DNS_RING_BUFFER_BYTES: u32 = 1 << 20;
/// The cgroup `skb` program that copies the DNS queries pods send (UDP to port 53), attached for egress.
pub const DNS_QUERY_PROGRAM: &str = "dns_queries";
/// The cgroup `skb` program that copies the DNS answers pods receive (UDP from port 53), attached for
/// ingress: it runs before the datagram is queued to the pod's socket, so before the pod can read it.
pub const DNS_ANSWER_PROGRAM: &str = "dns_answers";
/// The most bytes of one DNS message copied to user space: the EDNS buffer size resolvers advertise
/// since DNS Flag Day 2020 (larger answers come truncated, and then over TCP).
pub const DNS_CAPTURE_BYTES: usize = 1232;
/// The DNS server port.
pub const DNS_PORT: u16 = 53;
/// [`DnsPacket::kind`] of a query a pod sent.
pub const DNS_QUERY: u8 = 1;
/// [`DnsPacket::kind`] of an answer a pod received.
pub const DNS_ANSWER: u8 = 2;

/// One DNS message a pod's socket sent or received, as the kernel writes it into the
/// [`DNS_EVENTS_MAP`] ring buffer. Addresses in network byte order (IPv4 in the first 4 bytes), ports
/// in host byte order; "local" is the pod's socket, "remote" the DNS server.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DnsPacket {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the kernel saw the message.
    pub timestamp_ns: u64,
    /// cgroup v2 id of the pod socket's cgroup; 0 when unknown.
    pub cgroup_id: u64,
    pub local_addr: [u8; 16],
    pub remote_addr: [u8; 16],
    pub local_port: u16,
    pub remote_port: u16,
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u16,
    /// [`DNS_QUERY`] or [`DNS_ANSWER`].
    pub kind: u8,
    /// Explicit padding, always zero.
    pub _pad: u8,
    /// The message's length on the wire (the UDP payload).
    pub wire_len: u32,
    /// How many of its bytes are in `payload` (at most [`DNS_CAPTURE_BYTES`]).
    pub captured: u32,
    pub payload: [u8; DNS_CAPTURE_BYTES],
}

/// Which side opened the connection, seen from the local socket.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// The local socket connected to (or sent to) the remote address.
    Outbound = 1,
    /// The remote address connected to (or sent to) the local socket.
    Inbound = 2,
}

impl Direction {
    /// Decodes the byte the kernel wrote; `None` for an unknown value.
    pub fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            1 => Some(Self::Outbound),
            2 => Some(Self::Inbound),
            _ => None,
        }
    }
}

/// What happened to the connection.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// The TCP handshake completed.
    Established = 1,
    /// An outbound TCP attempt ended before it was established (refused, timed out, reset, blocked).
    /// [`FlowEvent::error`] holds the socket error when the kernel set one.
    Failed = 2,
    /// A UDP datagram was sent or received (UDP has no handshake).
    Datagram = 3,
}

impl Outcome {
    /// Decodes the byte the kernel wrote; `None` for an unknown value.
    pub fn from_raw(raw: u8) -> Option<Self> {
        match raw {
            1 => Some(Self::Established),
            2 => Some(Self::Failed),
            3 => Some(Self::Datagram),
            _ => None,
        }
    }
}

/// One connection event, as the kernel writes it into the [`EVENTS_MAP`] ring buffer.
///
/// Addresses are in network byte order; an IPv4 address occupies the first 4 bytes (the rest are zero).
/// Ports are in host byte order. "Local" is the socket the event is about, "remote" its peer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowEvent {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) when the kernel saw the event.
    pub timestamp_ns: u64,
    /// cgroup v2 id of the socket's cgroup; 0 when unknown.
    pub cgroup_id: u64,
    /// Inode number of the socket's network namespace (as in `/proc/PID/ns/net`); 0 when unknown.
    pub netns_ino: u32,
    /// Process (thread group) id of the task that opened the connection; 0 when unknown (e.g. an inbound
    /// TCP connection is established in softirq context, before any task accepts it).
    pub pid: u32,
    /// Local address (network byte order).
    pub local_addr: [u8; 16],
    /// Remote address (network byte order).
    pub remote_addr: [u8; 16],
    /// Local port (host byte order).
    pub local_port: u16,
    /// Remote port (host byte order).
    pub remote_port: u16,
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u16,
    /// [`IPPROTO_TCP`] or [`IPPROTO_UDP`].
    pub protocol: u8,
    /// A [`Direction`] as `u8`.
    pub direction: u8,
    /// An [`Outcome`] as `u8`.
    pub outcome: u8,
    /// For [`Outcome::Failed`]: the socket error (errno, e.g. 111 ECONNREFUSED, 110 ETIMEDOUT); else 0.
    pub error: u8,
    /// Explicit padding, always zero.
    pub _pad: [u8; 2],
    /// How many occurrences of this edge the event stands for: 1, plus the ones the kernel's dedupe
    /// suppressed since it last reported the edge.
    pub count: u32,
}

impl FlowEvent {
    /// An all-zero event, the starting point the kernel fills in.
    pub const fn zeroed() -> Self {
        Self {
            timestamp_ns: 0,
            cgroup_id: 0,
            netns_ino: 0,
            pid: 0,
            local_addr: [0; 16],
            remote_addr: [0; 16],
            local_port: 0,
            remote_port: 0,
            family: 0,
            protocol: 0,
            direction: 0,
            outcome: 0,
            error: 0,
            _pad: [0; 2],
            count: 1,
        }
    }
}

/// Indexes into the per-CPU [`COUNTERS_MAP`]; the user side sums the per-CPU values.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// An event was dropped because the ring buffer had no room (user space is behind).
    RingBufferFull = 0,
    /// An event was not sent because the same edge was reported within the dedupe window.
    DedupeHit = 1,
    /// A TCP state change was seen for a family other than IPv4/IPv6 (should stay 0).
    UnknownFamily = 2,
    /// A DNS message was not copied because the DNS ring buffer had no room.
    DnsRingBufferFull = 3,
    /// A DNS message longer than [`DNS_CAPTURE_BYTES`] was copied cut (user space cannot read it).
    DnsTruncated = 4,
    /// A new entry went into [`EDGES_MAP`].
    EdgesInserted = 5,
    /// A new entry went into [`CONNECTING_MAP`].
    ConnectingInserted = 6,
    /// An entry was taken out of [`CONNECTING_MAP`] (its socket left `connect()`).
    ConnectingRemoved = 7,
    /// A new entry went into [`UDP_PEERS_MAP`].
    UdpPeersInserted = 8,
    /// Not a count: the most unread bytes the events ring buffer held when a program wrote to it,
    /// per CPU. User space takes the largest over the CPUs and sets it back to 0 after reading.
    RingBufferPeakBytes = 9,
}

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; COUNTER_SLOTS as usize] = [
        Counter::RingBufferFull,
        Counter::DedupeHit,
        Counter::UnknownFamily,
        Counter::DnsRingBufferFull,
        Counter::DnsTruncated,
        Counter::EdgesInserted,
        Counter::ConnectingInserted,
        Counter::ConnectingRemoved,
        Counter::UdpPeersInserted,
        Counter::RingBufferPeakBytes,
    ];
}

/// Number of slots in [`COUNTERS_MAP`].
pub const COUNTER_SLOTS: u32 = 10;

/// Name of the `u32` array of [`Switch`]es user space turns on and off while the programs run.
pub const SWITCHES_MAP: &str = "SWITCHES";

/// Indexes into [`SWITCHES_MAP`]: what the programs do only while user space asks (non-zero).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switch {
    /// Note the process inside `connect()` ([`CONNECTING_MAP`]) so the TCP outbound event names it.
    /// It is a quarter of the TCP program's time, and only the debug socket's raw events show it:
    /// the agent turns it on while a client there asks for processes.
    ConnectionPids = 0,
}

/// Number of slots in [`SWITCHES_MAP`].
pub const SWITCH_SLOTS: u32 = 1;

/// Offsets of kernel struct fields the programs read (with `bpf_probe_read_kernel`, or with plain loads
/// from the BTF-enabled TCP tracepoint, where the verifier sees them as constants). Rust eBPF has no CO-RE,
/// so user space computes them from `/sys/kernel/btf/vmlinux` and patches them in at load time.
/// An offset of [`KernelOffsets::UNKNOWN`] means "not available on this kernel": the program then reports 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `struct sock` → `__sk_common.skc_net` (`possible_net_t`, a `struct net *`).
    pub sock_net: u32,
    /// `struct net` → `ns.inum` (the namespace inode number).
    pub net_inum: u32,
    /// `struct sock` → `sk_cgrp_data.cgroup` (`struct cgroup *`, cgroup v2).
    pub sock_cgroup: u32,
    /// `struct cgroup` → `kn` (`struct kernfs_node *`).
    pub cgroup_kn: u32,
    /// `struct kernfs_node` → `id` (u64: the cgroup id).
    pub kernfs_node_id: u32,
    /// `struct sock` → `sk_err` (int).
    pub sock_err: u32,
    /// `struct task_struct` → `nsproxy` (`struct nsproxy *`).
    pub task_nsproxy: u32,
    /// `struct nsproxy` → `net_ns` (`struct net *`).
    pub nsproxy_net_ns: u32,
    /// `struct bpf_sock_addr_kern` (the real context of `sock_addr` programs) → `sk` (`struct sock *`).
    /// The programs only use it when it is 0 (as in every kernel so far): they then read the socket
    /// pointer from the start of their context.
    pub sock_addr_kern_sk: u32,
    /// `struct sock` → `sk_protocol` (u16).
    pub sock_protocol: u32,
    /// `struct sock` → `__sk_common.skc_daddr`, where `skc_daddr`, `skc_rcv_saddr`, `skc_hash`,
    /// `skc_dport`, `skc_num` and `skc_family` follow each other (4, 4, 4, 2, 2, 2 bytes): the raw TCP
    /// program reads them at once, the typed one field by field. User space checks that order in BTF.
    pub sock_head: u32,
    /// `struct sock` → `__sk_common.skc_v6_daddr` (16 bytes).
    pub sock_v6_daddr: u32,
    /// `struct sock` → `__sk_common.skc_v6_rcv_saddr` (16 bytes).
    pub sock_v6_rcv_saddr: u32,
    /// `struct inet_sock` (which starts with the `struct sock`) → `inet_sport` (network byte order): the
    /// local port of a failed connect, whose `skc_num` the kernel has cleared by then.
    pub inet_sport: u32,
}

impl KernelOffsets {
    /// Marks an offset the kernel's BTF did not provide.
    pub const UNKNOWN: u32 = u32::MAX;

    /// Every offset unknown: the programs run but report no netns, cgroup or error.
    pub const NONE: Self = Self {
        sock_net: Self::UNKNOWN,
        net_inum: Self::UNKNOWN,
        sock_cgroup: Self::UNKNOWN,
        cgroup_kn: Self::UNKNOWN,
        kernfs_node_id: Self::UNKNOWN,
        sock_err: Self::UNKNOWN,
        task_nsproxy: Self::UNKNOWN,
        nsproxy_net_ns: Self::UNKNOWN,
        sock_addr_kern_sk: Self::UNKNOWN,
        sock_protocol: Self::UNKNOWN,
        sock_head: Self::UNKNOWN,
        sock_v6_daddr: Self::UNKNOWN,
        sock_v6_rcv_saddr: Self::UNKNOWN,
        inet_sport: Self::UNKNOWN,
    };
}

/// Everything user space patches into the programs at load time (the [`CONFIG_GLOBAL`] global).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Where the kernel struct fields are.
    pub kernel: KernelOffsets,
    /// An edge already reported within this many nanoseconds is not reported again (0: report everything).
    pub dedupe_window_ns: u64,
}

impl Config {
    /// The values compiled into the programs before user space patches them.
    pub const DEFAULT: Self = Self {
        kernel: KernelOffsets::NONE,
        dedupe_window_ns: 0,
    };
}

/// Linux TCP states (`include/net/tcp_states.h`) the programs look at.
pub mod tcp_state {
    /// `TCP_ESTABLISHED`.
    pub const ESTABLISHED: i32 = 1;
    /// `TCP_SYN_SENT`.
    pub const SYN_SENT: i32 = 2;
    /// `TCP_SYN_RECV`.
    pub const SYN_RECV: i32 = 3;
    /// `TCP_CLOSE`.
    pub const CLOSE: i32 = 7;
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: these are `#[repr(C)]`, `Copy`, made only of integers and byte arrays, with explicit
    // padding fields, so every bit pattern is valid and there are no uninitialised bytes.
    unsafe impl aya::Pod for super::FlowEvent {}
    unsafe impl aya::Pod for super::DnsPacket {}
    unsafe impl aya::Pod for super::Config {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<FlowEvent>(), 72);
        assert_eq!(size_of::<KernelOffsets>(), 56);
        assert_eq!(size_of::<Config>(), 64);
    }

    #[test]
    fn enums_round_trip_through_their_raw_bytes() {
        for d in [Direction::Outbound, Direction::Inbound] {
            assert_eq!(Direction::from_raw(d as u8), Some(d));
        }
        for o in [Outcome::Established, Outcome::Failed, Outcome::Datagram] {
            assert_eq!(Outcome::from_raw(o as u8), Some(o));
        }
        assert_eq!(Direction::from_raw(0), None);
        assert_eq!(Outcome::from_raw(9), None);
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }
}
