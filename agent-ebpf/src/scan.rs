//! The start-up socket scan: an `iter/task_file` BPF iterator that writes one `SocketRecord` per TCP or
//! UDP socket held by any process on the node, so the agent can report connections that were open
//! before it started (their handshake is over, so the live programs never see them).
//!
//! Why `task_file` and not `iter/tcp` / `iter/udp`: those walk only the network namespace of the
//! process that creates the iterator, so the agent would have to enter every pod's namespace (which
//! needs CAP_SYS_ADMIN and ptrace access to the pod's processes, neither of which the agent has). Every
//! open file of every task is visible from the host's PID namespace whatever its network namespace, and
//! a socket names its own namespace and cgroup, read exactly as the live programs read them.
//!
//! Which sockets: IPv4/IPv6 TCP in ESTABLISHED or LISTEN, and UDP bound to a port. The agent decides
//! client or server side from the listening ones (see `agent/src/kernel/existing.rs`).
//!
//! This is its own object (not a program in `main.rs`) so that loading it for one scan creates none of
//! the live programs' maps, and its offsets global is patched independently of theirs.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    bindings::{file, seq_file},
    cty::c_void,
    helpers::{bpf_probe_read_kernel, bpf_seq_write, bpf_sock_from_file},
};
use network_enforcer_agent_common::scan::{ScanOffsets, SocketRecord, TCP_ESTABLISHED, TCP_LISTEN};
use network_enforcer_agent_common::{AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP, KernelOffsets};

/// Patched by user space at load time.
#[unsafe(no_mangle)]
static SCAN_CONFIG: ScanOffsets = ScanOffsets::NONE;

/// Reads the load-time offsets; volatile so the compiler does not fold in the defaults.
#[inline(always)]
fn config() -> ScanOffsets {
    // SAFETY: SCAN_CONFIG is a valid, aligned static; the read is by value.
    unsafe { core::ptr::read_volatile(&SCAN_CONFIG) }
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

/// The context of `iter/task_file` programs (`struct bpf_iter__task_file`): one 8-byte slot per
/// argument of the kernel's `bpf_iter_task_file(meta, task, fd, file)`, a fixed layout the verifier
/// checks loads against. `meta` and `file` are read with plain loads (not probe reads) because the
/// helpers need the verifier's typed pointers.
#[repr(C)]
struct TaskFileContext {
    meta: *const IterMeta,
    task: u64,
    fd: u64,
    file: *mut file,
}

/// `struct bpf_iter_meta`: the seq_file to write into comes first.
#[repr(C)]
struct IterMeta {
    seq: *mut seq_file,
}

/// `iter/task_file`: called once per open file of every task (threads sharing a file table once), and
/// once more at the end with no file.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task_file")]
pub fn existing_sockets(ctx: *mut c_void) -> i32 {
    let ctx = ctx as *const TaskFileContext;
    // SAFETY: the kernel passes a valid `bpf_iter__task_file`; the loads are checked by the verifier.
    let file = unsafe { core::ptr::read_volatile(&(*ctx).file) };
    if file.is_null() {
        return 0;
    }
    // SAFETY: `file` is the iterator's non-null file; the helper returns null for non-sockets.
    let socket = unsafe { bpf_sock_from_file(file) };
    if socket.is_null() {
        return 0;
    }
    let Some(record) = read_socket(socket as u64, unsafe { (*ctx).task }) else {
        return 0;
    };
    // SAFETY: as above; `meta` is never null for this iterator.
    unsafe {
        let meta = core::ptr::read_volatile(&(*ctx).meta);
        let seq = core::ptr::read_volatile(&(*meta).seq);
        // A full seq buffer makes the kernel call us again for this file after the reader drained it.
        let _ = bpf_seq_write(
            seq,
            (&record as *const SocketRecord).cast(),
            core::mem::size_of::<SocketRecord>() as u32,
        );
    }
    0
}

/// The record of one socket, or `None` for one the agent does not want (another family or protocol, a
/// TCP socket neither established nor listening, an unbound UDP socket) or cannot read.
#[inline(always)]
fn read_socket(socket: u64, task: u64) -> Option<SocketRecord> {
    let o = config();
    let sk = read_kernel::<u64>(socket, o.socket_sk)?;
    let family = read_kernel::<u16>(sk, o.sk_family)?;
    if family != AF_INET && family != AF_INET6 {
        return None;
    }
    let protocol = read_kernel::<u16>(sk, o.sk_protocol)?;
    let state = read_kernel::<u8>(sk, o.sk_state)?;
    let local_port = read_kernel::<u16>(sk, o.sk_num)?;
    let wanted = match protocol {
        p if p == IPPROTO_TCP as u16 => state == TCP_ESTABLISHED || state == TCP_LISTEN,
        p if p == IPPROTO_UDP as u16 => local_port != 0,
        _ => false,
    };
    if !wanted {
        return None;
    }
    let mut r = SocketRecord::zeroed();
    r.family = family;
    r.protocol = protocol as u8;
    r.state = state;
    r.local_port = local_port;
    r.remote_port = u16::from_be(read_kernel::<u16>(sk, o.sk_dport)?);
    if family == AF_INET {
        r.local_addr[..4].copy_from_slice(&read_kernel::<[u8; 4]>(sk, o.sk_rcv_saddr)?);
        r.remote_addr[..4].copy_from_slice(&read_kernel::<[u8; 4]>(sk, o.sk_daddr)?);
    } else {
        r.local_addr = read_kernel::<[u8; 16]>(sk, o.sk_v6_rcv_saddr)?;
        r.remote_addr = read_kernel::<[u8; 16]>(sk, o.sk_v6_daddr)?;
    }
    // The namespace and cgroup recorded in the socket, read as the live programs read them (an
    // accepted socket carries its listener's), so attribution cannot differ from theirs.
    let k = &o.kernel;
    r.netns_ino = read_kernel::<u64>(sk, k.sock_net)
        .and_then(|net| read_kernel::<u32>(net, k.net_inum))
        .unwrap_or(0);
    r.cgroup_id = read_kernel::<u64>(sk, k.sock_cgroup)
        .and_then(|cgrp| read_kernel::<u64>(cgrp, k.cgroup_kn))
        .and_then(|kn| read_kernel::<u64>(kn, k.kernfs_node_id))
        .unwrap_or(0);
    r.pid = read_kernel::<u32>(task, o.task_tgid).unwrap_or(0);
    Some(r)
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
        "network-enforcer-agent-ebpf-scan holds a kernel program: it is built for bpfel-unknown-none by \
         the agent's build script and loaded by network-enforcer-agent, not run on the host"
    );
    std::process::exit(2);
}

/// `bpf_probe_read_kernel` and `bpf_seq_write` are only offered to GPL-compatible programs.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
