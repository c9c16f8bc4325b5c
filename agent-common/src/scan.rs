//! The records of the start-up socket scan: the `iter/task_file` program (`agent-ebpf/src/scan.rs`)
//! writes one [`SocketRecord`] per TCP or UDP socket any process on the node holds, and the agent
//! (`agent/src/kernel/existing.rs`) turns them into connection events for the connections that were
//! open before it started. Layouts are `#[repr(C)]` with explicit padding, like the rest of this crate.

use crate::KernelOffsets;

/// Name of the iterator program in the scan object.
pub const SCAN_PROGRAM: &str = "existing_sockets";
/// Name of the global holding the [`ScanOffsets`] patched in at load time.
pub const SCAN_CONFIG_GLOBAL: &str = "SCAN_CONFIG";

/// `TCP_LISTEN` (`include/net/tcp_states.h`).
pub const TCP_LISTEN: u8 = 10;
/// `TCP_ESTABLISHED`; also the state of a connected UDP socket.
pub const TCP_ESTABLISHED: u8 = 1;

/// One socket as the scan program reports it. Addresses are in network byte order (IPv4 in the first
/// 4 bytes), ports in host byte order; "local" is the socket, "remote" its peer (zero when none).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketRecord {
    /// cgroup v2 id recorded in the socket (the creator's cgroup); 0 when unknown.
    pub cgroup_id: u64,
    /// Inode number of the socket's network namespace; 0 when unknown.
    pub netns_ino: u32,
    /// Thread group id of a process holding the socket.
    pub pid: u32,
    /// Local address (`skc_rcv_saddr` / `skc_v6_rcv_saddr`).
    pub local_addr: [u8; 16],
    /// Remote address (`skc_daddr` / `skc_v6_daddr`).
    pub remote_addr: [u8; 16],
    /// Local port (`skc_num`).
    pub local_port: u16,
    /// Remote port (`skc_dport`, converted to host byte order).
    pub remote_port: u16,
    /// [`crate::AF_INET`] or [`crate::AF_INET6`].
    pub family: u16,
    /// [`crate::IPPROTO_TCP`] or [`crate::IPPROTO_UDP`].
    pub protocol: u8,
    /// `skc_state`: a TCP state; for UDP [`TCP_ESTABLISHED`] when connected.
    pub state: u8,
}

impl SocketRecord {
    /// An all-zero record.
    pub const fn zeroed() -> Self {
        Self {
            cgroup_id: 0,
            netns_ino: 0,
            pid: 0,
            local_addr: [0; 16],
            remote_addr: [0; 16],
            local_port: 0,
            remote_port: 0,
            family: 0,
            protocol: 0,
            state: 0,
        }
    }
}

/// Kernel struct offsets the scan program reads with `bpf_probe_read_kernel`, from the running
/// kernel's BTF. [`KernelOffsets::UNKNOWN`] marks one this kernel lacks: the program then skips what
/// depends on it (a socket whose family, protocol, state or ports cannot be read is not reported).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanOffsets {
    /// The offsets the live programs use for the socket's network namespace and cgroup.
    pub kernel: KernelOffsets,
    /// `struct socket` → `sk`.
    pub socket_sk: u32,
    /// `struct sock` → `__sk_common.skc_family` (u16).
    pub sk_family: u32,
    /// `struct sock` → `__sk_common.skc_state` (u8).
    pub sk_state: u32,
    /// `struct sock` → `__sk_common.skc_num` (u16, host byte order).
    pub sk_num: u32,
    /// `struct sock` → `__sk_common.skc_dport` (u16, network byte order).
    pub sk_dport: u32,
    /// `struct sock` → `__sk_common.skc_rcv_saddr` (IPv4).
    pub sk_rcv_saddr: u32,
    /// `struct sock` → `__sk_common.skc_daddr` (IPv4).
    pub sk_daddr: u32,
    /// `struct sock` → `__sk_common.skc_v6_rcv_saddr` (16 bytes).
    pub sk_v6_rcv_saddr: u32,
    /// `struct sock` → `__sk_common.skc_v6_daddr` (16 bytes).
    pub sk_v6_daddr: u32,
    /// `struct sock` → `sk_protocol` (u16 since Linux 5.6).
    pub sk_protocol: u32,
    /// `struct task_struct` → `tgid`.
    pub task_tgid: u32,
    /// Explicit padding, always zero.
    pub _pad: u32,
}

impl ScanOffsets {
    /// Everything unknown: the program reports nothing until user space patches the real values in.
    pub const NONE: Self = Self {
        kernel: KernelOffsets::NONE,
        socket_sk: KernelOffsets::UNKNOWN,
        sk_family: KernelOffsets::UNKNOWN,
        sk_state: KernelOffsets::UNKNOWN,
        sk_num: KernelOffsets::UNKNOWN,
        sk_dport: KernelOffsets::UNKNOWN,
        sk_rcv_saddr: KernelOffsets::UNKNOWN,
        sk_daddr: KernelOffsets::UNKNOWN,
        sk_v6_rcv_saddr: KernelOffsets::UNKNOWN,
        sk_v6_daddr: KernelOffsets::UNKNOWN,
        sk_protocol: KernelOffsets::UNKNOWN,
        task_tgid: KernelOffsets::UNKNOWN,
        _pad: 0,
    };
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: `#[repr(C)]`, `Copy`, only integers and byte arrays, explicit padding: every bit pattern is
    // valid and there are no uninitialised bytes.
    unsafe impl aya::Pod for super::ScanOffsets {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<SocketRecord>(), 56);
        assert_eq!(size_of::<ScanOffsets>(), 104);
    }
}
