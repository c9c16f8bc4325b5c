//! A measurement, not a part of the agent (`cargo xtask bench socket_state`, issue 45.1): three ways
//! to carry a value from a TCP socket's `connect()` to its connection's outcome, the state the live
//! TCP program keeps (the connecting process, `CONNECTING`) and the state socket-local storage would
//! keep once per socket instead of reading it per event (docs/design.md, "Capture"):
//!
//! - `state_lru`: the live program's way, a raw tracepoint with an LRU hash keyed by the socket's
//!   address (insert at SYN_SENT, lookup and removal at the outcome);
//! - `state_btf_lru`: the same from a BTF-enabled raw tracepoint (`tp_btf`), separating the hook's
//!   cost from the map's;
//! - `state_sk_storage`: `tp_btf` with socket-local storage (`BPF_MAP_TYPE_SK_STORAGE`, a BTF-defined
//!   map), created at SYN_SENT and read at the outcome; the kernel frees it with the socket.
//!
//! Each counts in `STATE_SEEN` what it stored, found, and found with the process `STATE_PID` names,
//! so the bench checks the three did the same work. Its own object, loaded only by the bench.
//!
//! And three empty programs, the floor of a run on each of the agent's kinds of hook with the
//! statistics on (the hook's call and the statistics' two clock reads): `empty_raw_tp` and
//! `empty_tp_btf` on the same tracepoint, `empty_skb` as the DNS programs (cgroup skb, egress).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    btf_maps::SkStorage,
    helpers::{bpf_get_current_pid_tgid, bpf_sk_storage_get},
    macros::{btf_map, btf_tracepoint, cgroup_skb, map, raw_tracepoint},
    maps::{Array, LruHashMap},
    programs::{BtfTracePointContext, RawTracePointContext, SkBuffContext},
};
use core::ffi::c_void;
use network_enforcer_agent_common::tcp_state;

/// What socket-local storage holds per socket.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Stored {
    pid: u32,
    _pad: u32,
}

#[btf_map]
static STATE_STORAGE: SkStorage<Stored> = SkStorage::new();

#[map(name = "STATE_LRU")]
static STATE_LRU: LruHashMap<u64, u32> = LruHashMap::with_max_entries(65_536, 0);

/// Indexed by `Seen`.
#[map(name = "STATE_SEEN")]
static STATE_SEEN: Array<u64> = Array::with_max_entries(3, 0);

/// The process whose connections the bench makes.
#[map(name = "STATE_PID")]
static STATE_PID: Array<u32> = Array::with_max_entries(1, 0);

#[repr(u32)]
#[derive(Clone, Copy)]
enum Seen {
    Stored = 0,
    Found = 1,
    Ours = 2,
}

/// `bpf_sk_storage_get` flag: create the socket's storage when it has none.
const BPF_SK_STORAGE_GET_F_CREATE: u64 = 1;
/// `bpf_map_update_elem` flag: only a new key.
const BPF_NOEXIST: u64 = 1;

#[inline(always)]
fn count(seen: Seen) {
    if let Some(slot) = STATE_SEEN.get_ptr_mut(seen as u32) {
        // SAFETY: a valid array slot; only these programs write it, one CPU at a time is enough here.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
fn found(pid: u32) {
    count(Seen::Found);
    if STATE_PID.get(0).is_some_and(|ours| *ours == pid) {
        count(Seen::Ours);
    }
}

#[inline(always)]
fn connecting(old: i32, new: i32) -> bool {
    old == tcp_state::CLOSE && new == tcp_state::SYN_SENT
}

#[inline(always)]
fn outcome(old: i32, new: i32) -> bool {
    old == tcp_state::SYN_SENT && (new == tcp_state::ESTABLISHED || new == tcp_state::CLOSE)
}

#[inline(always)]
fn with_lru(sk: u64, old: i32, new: i32) {
    if connecting(old, new) {
        let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
        if STATE_LRU.insert(sk, pid, BPF_NOEXIST).is_ok() {
            count(Seen::Stored);
        }
    } else if outcome(old, new) {
        // SAFETY: a plain u32 value, copied out at once.
        if let Some(pid) = unsafe { STATE_LRU.get(sk) }.copied() {
            let _ = STATE_LRU.remove(sk);
            found(pid);
        }
    }
}

#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn state_lru(ctx: RawTracePointContext) -> i32 {
    with_lru(
        ctx.arg(0),
        ctx.arg::<u64>(1) as i32,
        ctx.arg::<u64>(2) as i32,
    );
    0
}

#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn state_btf_lru(ctx: BtfTracePointContext) -> i32 {
    let sk: *mut c_void = ctx.arg(0);
    with_lru(sk as u64, ctx.arg(1), ctx.arg(2));
    0
}

#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn state_sk_storage(ctx: BtfTracePointContext) -> i32 {
    let sk: *mut c_void = ctx.arg(0);
    let (old, new): (i32, i32) = (ctx.arg(1), ctx.arg(2));
    // aya-ebpf's SkStorage methods take a sock_addr context only: the helper is called directly,
    // with the map's address as aya-ebpf passes it.
    let map = core::ptr::from_ref(&STATE_STORAGE)
        .cast_mut()
        .cast::<c_void>();
    if connecting(old, new) {
        let mut value = Stored {
            pid: (bpf_get_current_pid_tgid() >> 32) as u32,
            _pad: 0,
        };
        // SAFETY: `sk` is the tracepoint's trusted socket; the kernel checks the call.
        let stored = unsafe {
            bpf_sk_storage_get(
                map,
                sk,
                core::ptr::from_mut(&mut value).cast(),
                BPF_SK_STORAGE_GET_F_CREATE,
            )
        };
        if !stored.is_null() {
            count(Seen::Stored);
        }
    } else if outcome(old, new) {
        // SAFETY: as above; a null result is checked before the read.
        let stored = unsafe { bpf_sk_storage_get(map, sk, core::ptr::null_mut(), 0) };
        if !stored.is_null() {
            // SAFETY: the kernel's storage for this socket, of this map's value type.
            found(unsafe { (*stored.cast::<Stored>()).pid });
        }
    }
    0
}

#[raw_tracepoint(tracepoint = "inet_sock_set_state")]
pub fn empty_raw_tp(_ctx: RawTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn empty_tp_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

/// Lets every packet through.
#[cgroup_skb]
pub fn empty_skb(_ctx: SkBuffContext) -> i32 {
    1
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
        "network-enforcer-agent-ebpf-socket-state holds kernel programs for a bench: it is built for \
         bpfel-unknown-none by the agent's build script and loaded by `cargo xtask bench socket_state`"
    );
    std::process::exit(2);
}

/// Tracing programs must carry a GPL-compatible license.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
