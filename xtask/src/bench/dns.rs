//! `cargo xtask bench dns`: the agent reading its pods' DNS messages in user space (issue 41), measured
//! in one run of the agent's `dns` bench (`agent/benches/dns.rs`) in the release (bench) profile, on
//! one thread. The bench writes its figures as JSON to the file named by `BENCH_FIGURES`; this reads
//! them back and [`super::report`]s them to `target/bench/dns.json`.
//!
//! Input, built once up front with simple-dns as a resolver sends it (answers name-compressed,
//! NXDOMAIN with the zone's SOA): a node of 256 pods × 16 names each, and a stress of 10,000 pods × 4
//! names each, from 2,000 outside names, exchanges in no order; the answers a mix of A with 1-4
//! addresses (40 %), a CNAME chain of 2 then 1-2 A records (20 %), AAAA with 1-2 addresses (20 %) and
//! NXDOMAIN (20 %). Rates are per CPU-second of the bench's thread (so another process on the machine
//! does not lower them; the wall-clock rates are in the JSON as `*_wall`), the median of 3 rounds of
//! at least 1 s each after a warm-up.
//!
//! - `dns_answers_per_sec_per_core`: full exchanges through `Tracker::query` then `Tracker::answer`
//!   (both parse their message; matching the answer to the pending query of the same pod socket,
//!   server, transaction id and question; believing its addresses), 256 queries waiting at any time,
//!   with the tracker's maps warm (every exchange done twice before timing, so the timed answers
//!   resolve again what the tracker holds), on a full node: 256 pods (the kubelet's `--max-pods` is
//!   110 by default, managed clusters allow up to about 250) resolving 16 names each (~6,500
//!   resolutions held). The messages lie one after another in the order they are taken, as the
//!   agent's ring buffer hands them over (scattered over the heap, as before 2026-12-06, reading them
//!   cost cache misses the agent does not have). Goal (issue 41): >= 1,000,000 per second.
//! - `dns_answers_per_sec_10k_pods`: the same on 10,000 pods × 4 names (~64,000 resolutions held):
//!   more than any node runs, so the tracker's maps (about 9 MB) outgrow the CPU's caches and each
//!   answer's addresses cost cache misses; the difference with the above is what the maps' size costs.
//! - `dns_parse_per_sec`: `read_answer` alone on the same answers (the agent's reading in place with
//!   the `domain` crate: host-name checks, the CNAME chain, TTLs). For comparison only,
//!   `dns_answer_packet_parse_per_sec` and `dns_query_parse_per_sec` are simple-dns's full parse of
//!   the answers and of the queries (what the agent used before it read them in place, allocating a
//!   record list and label vectors per message).
//! - `name_lookups_per_sec`: `Tracker::name_of` on resolutions the tracker holds, in no order (what
//!   every flushed edge to an outside address asks).
//! - `agent_rss_mib_dns_10k_names`: what the resident memory (`VmRSS`) of the bench's process grows
//!   by while a fresh tracker takes in 10,000 pods' exchanges, one distinct name each with 1-2
//!   addresses (about 15,000 resolutions, within the default `Limits`): the tracker's own growth
//!   (its maps, the names it keeps; the pods' UIDs and the messages exist before), not the agent's
//!   RSS. `agent_rss_mib_dns_10k_names_trimmed` is the same after `malloc_trim` (what glibc keeps of
//!   the maps' earlier, smaller tables).
//!
//! Not in it: the kernel's copy of the messages and their ring buffer (`agent-ebpf/src/dns.rs`,
//! `kernel::dns_messages`: decoding a record), `Pipeline::take_dns`'s attribution of a message to a pod
//! and its resolutions kept for the next flush, the flush itself, and `Tracker::expire` (the bench never
//! lets a resolution end). `name_to_rendered_ipblock_p99_ms` (the NetworkPolicy-only path) is measured
//! by the cluster test `tests/tests/names.rs`, not here (it prints each rotation's lag).
//!
//! The DNS hold of the agent's enforcement (`agent/src/enforce/dns_hold`), with real packets: a pod,
//! a router and an outside network namespace (`agent/tests/support/dns_world.rs`; root needed, the
//! figures are absent without it), the pod's DNS exchange timed from its send to its receive:
//! - `dns_answer_added_latency_p99_us` (and `_p50_us`): p99 (p50) of exchanges through the hold whose
//!   answer brings nothing new (its addresses granted already: most answers), minus the same of
//!   exchanges over the same path that are not held (another address of the pod's namespace,
//!   isolated by the same egress rules but allowed no names: what the hold adds beyond enforcement),
//!   taken one for one in between, so both see the same machine; `_vs_unisolated_p99_us` the same
//!   against an address no policy selects (the baseline before 2026-12-06);
//!   `dns_hold_nothing_new_passed_at_once`: how many of those answers the hold's kernel check let
//!   through (the bench's own output also has the p50s and the queued count);
//! - `dns_answer_added_latency_new_address_p99_us`: the same for answers bringing a new address, which
//!   wait for the grant (written over netlink);
//! - `first_connect_after_rotation_success_ratio`: 200 names each resolved to a new address and called
//!   at once with a 600 ms connect timeout (TCP resends a dropped SYN after 1 s): the share that
//!   connected.

use anyhow::Result;

/// Runs the bench and reports its figures.
pub fn run() -> Result<()> {
    super::cargo_bench_figures(
        "dns",
        "network-enforcer-agent",
        "dns",
        &[
            (
                "dns_answers_per_sec_per_core",
                "query+answer exchanges/CPU-s (Tracker::query + answer, 256 pods x 16 names; goal >= 1,000,000)",
            ),
            (
                "dns_answers_per_sec_10k_pods",
                "exchanges/CPU-s (the same, 10,000 pods x 4 names: maps out of the caches)",
            ),
            ("dns_parse_per_sec", "answers/CPU-s (read_answer alone)"),
            (
                "dns_answer_packet_parse_per_sec",
                "answers/CPU-s (simple-dns parse, for comparison)",
            ),
            (
                "dns_query_parse_per_sec",
                "queries/CPU-s (simple-dns parse, for comparison)",
            ),
            (
                "name_lookups_per_sec",
                "lookups/CPU-s (Tracker::name_of, held resolutions)",
            ),
            (
                "agent_rss_mib_dns_10k_names",
                "MiB (the tracker's own RSS growth: 10k pods, 10k names, 1-2 addresses)",
            ),
            (
                "agent_rss_mib_dns_10k_names_trimmed",
                "MiB (the same after malloc_trim)",
            ),
            (
                "dns_answer_added_latency_p99_us",
                "us (DNS hold, answer with nothing new: p99 minus p99 of an isolated address without names; goal <= 50)",
            ),
            (
                "dns_answer_added_latency_new_address_p99_us",
                "us (DNS hold, answer with a new address: waits for its grant)",
            ),
            ("dns_answer_added_latency_p50_us", "us (the same at p50)"),
            (
                "dns_answer_added_latency_vs_unisolated_p99_us",
                "us (the same against an address no policy selects)",
            ),
            (
                "dns_hold_nothing_new_passed_at_once",
                "answers the kernel check let through without user space (of 2,000)",
            ),
            (
                "dns_exchange_p99_us_no_hold",
                "us (p99 exchange not held, interleaved with the held ones)",
            ),
            (
                "first_connect_after_rotation_success_ratio",
                "connected at once after a new address (200 names; goal 1.0)",
            ),
        ],
    )
}
