//! The agent's kernel programs.
//!
//! - `inet_sock_set_state` (tracepoint `sock/inet_sock_set_state`) sees every TCP state change on the node,
//!   in every network namespace, and reports three transitions:
//!   SYN_SENT→ESTABLISHED (outbound connection), SYN_RECV→ESTABLISHED (inbound connection) and
//!   SYN_SENT→CLOSE (an outbound attempt that failed: refused, timed out, reset, dropped).
//!
//! Events go to the `EVENTS` ring buffer as `FlowEvent`s (see `network-enforcer-agent-common`). When the ring
//! buffer is full the event is counted in the per-CPU `COUNTERS` array, never silently lost.
//!
//! Why a map keyed by socket: the connecting task is only current when the socket enters SYN_SENT (inside
//! `connect()`); the ESTABLISHED or CLOSE transition happens later in softirq context, where the current task
//! can be any unrelated process. So the process id is captured at CLOSE→SYN_SENT and picked up later.
//!
//! The crate is also checked and built for the host (`cargo clippy --workspace`, `cargo build --workspace`),
//! where it uses std and has a `main` that refuses to run: that keeps the real code linted with the rest of
//! the workspace. Only the BPF build (by the agent's build script) produces the programs.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{LruHashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use network_enforcer_agent_common::{
    AF_INET, AF_INET6, COUNTER_SLOTS, Config, Counter, DEFAULT_RING_BUFFER_BYTES, Direction,
    FlowEvent, IPPROTO_TCP, Outcome, tcp_state,
};

/// Connection events for user space. User space may resize it at load time.
#[map(name = "EVENTS")]
static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BUFFER_BYTES, 0);

/// Per-CPU event counters, indexed by `Counter` (per-CPU because BPF in Rust has no atomic add).
#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(COUNTER_SLOTS, 0);

/// Sockets in SYN_SENT → the process that called `connect()`. LRU so sockets whose CLOSE we never see
/// (should not happen, but a leak here would be silent) age out instead of filling the map.
#[map(name = "CONNECTING")]
static CONNECTING: LruHashMap<u64, u32> = LruHashMap::with_max_entries(65_536, 0);

/// Patched by user space at load time (tracepoint layout, kernel offsets, dedupe window).
#[unsafe(no_mangle)]
static CONFIG: Config = Config::DEFAULT;

/// Reads the load-time configuration. The volatile read keeps the compiler from folding the default
/// values in: the real ones are only known when user space loads the program.
#[inline(always)]
fn config() -> Config {
    // SAFETY: CONFIG is a valid, aligned static; the read is by value.
    unsafe { core::ptr::read_volatile(&CONFIG) }
}

/// Adds one to a per-CPU counter.
#[inline(always)]
fn count(counter: Counter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: the pointer is to this CPU's slot of the array; no other program runs on this CPU
        // concurrently with us in this context.
        unsafe { *slot += 1 };
    }
}

/// Sends an event to user space, or counts it as lost when the ring buffer is full.
#[inline(always)]
fn emit(event: &FlowEvent) {
    match EVENTS.reserve::<FlowEvent>(0) {
        Some(mut entry) => {
            entry.write(*event);
            entry.submit(0);
        }
        None => count(Counter::RingBufferFull),
    }
}

#[tracepoint]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    // Errors here are failed reads of the tracepoint record, which the verifier-checked helper reports;
    // there is nothing better to do than skip the event.
    let _ = on_tcp_state_change(&ctx);
    0
}

fn on_tcp_state_change(ctx: &TracePointContext) -> Result<(), i32> {
    let cfg = config();
    let layout = cfg.tcp_tracepoint;
    // SAFETY: the offsets come from the tracepoint's format file; read_at uses bpf_probe_read.
    let (protocol, oldstate, newstate, skaddr) = unsafe {
        (
            ctx.read_at::<u16>(layout.protocol as usize)?,
            ctx.read_at::<i32>(layout.oldstate as usize)?,
            ctx.read_at::<i32>(layout.newstate as usize)?,
            ctx.read_at::<u64>(layout.skaddr as usize)?,
        )
    };
    if protocol != IPPROTO_TCP as u16 {
        return Ok(()); // the same tracepoint also fires for SCTP and MPTCP
    }

    let (direction, outcome) = match (oldstate, newstate) {
        (tcp_state::CLOSE, tcp_state::SYN_SENT) => {
            // Inside connect(): remember who is connecting. A full LRU evicts the oldest entry.
            let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
            let _ = CONNECTING.insert(skaddr, pid, 0);
            return Ok(());
        }
        (tcp_state::SYN_SENT, tcp_state::ESTABLISHED) => {
            (Direction::Outbound, Outcome::Established)
        }
        (tcp_state::SYN_SENT, tcp_state::CLOSE) => (Direction::Outbound, Outcome::Failed),
        (tcp_state::SYN_RECV, tcp_state::ESTABLISHED) => (Direction::Inbound, Outcome::Established),
        _ => return Ok(()),
    };

    let mut event = FlowEvent::zeroed();
    // SAFETY: helper call without preconditions.
    event.timestamp_ns = unsafe { bpf_ktime_get_ns() };
    event.protocol = IPPROTO_TCP;
    event.direction = direction as u8;
    event.outcome = outcome as u8;
    if direction == Direction::Outbound {
        // SAFETY: lookup of a plain u32 value; copied out immediately.
        if let Some(pid) = unsafe { CONNECTING.get(skaddr) } {
            event.pid = *pid;
        }
        let _ = CONNECTING.remove(skaddr);
    }

    // SAFETY: offsets from the format file, sizes as declared there.
    unsafe {
        event.family = ctx.read_at::<u16>(layout.family as usize)?;
        event.local_port = ctx.read_at::<u16>(layout.sport as usize)?;
        event.remote_port = ctx.read_at::<u16>(layout.dport as usize)?;
        match event.family {
            AF_INET => {
                let local = ctx.read_at::<[u8; 4]>(layout.saddr as usize)?;
                let remote = ctx.read_at::<[u8; 4]>(layout.daddr as usize)?;
                event.local_addr[..4].copy_from_slice(&local);
                event.remote_addr[..4].copy_from_slice(&remote);
            }
            AF_INET6 => {
                event.local_addr = ctx.read_at::<[u8; 16]>(layout.saddr_v6 as usize)?;
                event.remote_addr = ctx.read_at::<[u8; 16]>(layout.daddr_v6 as usize)?;
            }
            _ => {
                count(Counter::UnknownFamily);
                return Ok(());
            }
        }
    }
    emit(&event);
    Ok(())
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
