//! `cargo xtask bench socket_state`: per-socket state carried from `connect()` to the connection's
//! outcome in the kernel, three ways (issue 45.1; `agent/benches/socket_state.rs`, programs in
//! `agent-ebpf/src/socket_state.rs`). Root.
//!
//! - `lru_ns_per_conn`: the live TCP program's way (raw tracepoint, LRU hash keyed by the socket's
//!   address: insert at SYN_SENT, lookup and removal at the outcome), ns in the program per
//!   loopback connection, BPF statistics on, median of 3 rounds of 40,000 connections;
//! - `btf_lru_ns_per_conn`: the same from a BTF-enabled tracepoint (`tp_btf`): the hook's own cost;
//! - `sk_storage_ns_per_conn`: `tp_btf` with socket-local storage created at SYN_SENT and read at
//!   the outcome (the kernel's freeing of it with the socket is not counted).
//!
//! Every way must find the value for every connection, or the bench fails.
//!
//! - `empty_raw_tp_ns_per_run`, `empty_tp_btf_ns_per_run`, `empty_cgroup_skb_ns_per_run`: the floor
//!   of one run of an empty program on each kind of hook the agent uses, statistics on (their two
//!   clock reads included), median of 3 rounds.

use anyhow::Result;

pub fn run() -> Result<()> {
    super::cargo_bench_figures(
        "socket_state",
        "network-enforcer-agent",
        "socket_state",
        &[
            ("lru_ns_per_conn", "ns in the program per connection"),
            ("btf_lru_ns_per_conn", "ns in the program per connection"),
            ("sk_storage_ns_per_conn", "ns in the program per connection"),
            ("empty_raw_tp_ns_per_run", "ns per run of an empty program"),
            ("empty_tp_btf_ns_per_run", "ns per run of an empty program"),
            (
                "empty_cgroup_skb_ns_per_run",
                "ns per run of an empty program",
            ),
        ],
    )
}
