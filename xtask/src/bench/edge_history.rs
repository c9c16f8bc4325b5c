//! `cargo xtask bench edge_history`: the protect gate's edge history at 1M edges (1,000 workloads ×
//! 100 peers × 10 ports, 10k pods), measured by the controller's `edge_history` bench in the release
//! (bench) profile: live heap bytes per edge, observations recorded per second, one policy's replay.

use anyhow::Result;

/// Runs the bench and reports its figures.
pub fn run() -> Result<()> {
    super::cargo_bench_figures(
        "edge_history",
        "network-enforcer-controller",
        "edge_history",
        &[
            ("bytes_per_edge_1m", "bytes of heap per edge (1M edges)"),
            ("record_new_per_sec", "new edges recorded per second"),
            ("record_repeat_per_sec", "repeats merged per second"),
            ("replay_ms_1m", "ms (one policy's replay against 1M edges)"),
            (
                "edges_in_ms_10k_of_1m",
                "ms (the web view's 10,000 newest edges of a namespace, of 1M)",
            ),
            (
                "judge_ms_10k",
                "ms (which tier decides each of those 10,000 edges)",
            ),
            (
                "persist_edges_default_bound",
                "edges persisted within the default bound (8 x 900 KiB)",
            ),
            (
                "persist_bytes_per_edge",
                "compressed bytes per persisted edge",
            ),
            (
                "persist_export_ms_1m",
                "ms to export the 1M-edge history, newest first",
            ),
            (
                "persist_encode_ms",
                "ms to encode what fits the default bound",
            ),
            (
                "persist_restore_ms",
                "ms to decode and restore what was persisted",
            ),
        ],
    )
}
