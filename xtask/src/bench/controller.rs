//! `cargo xtask bench controller`: the controller's ingest and learning figures, measured by
//! the controller's `controller` bench in the release (bench) profile: records merged per second on one
//! core, heap per pod (10k pods) and per pending edge (100k edges), and writes per proposal per flush
//! and API writes per second under a steady flow load against the local cluster's API server. The bench
//! writes its figures as JSON to the file named by `BENCH_FIGURES`; this reads them back and
//! [`super::report`]s them.

use anyhow::Result;

/// Runs the bench and reports `records_merged_per_sec_per_core` (target >= 200k),
/// `writes_per_proposal_per_flush` (target <= 1), `bytes_per_pod`, `bytes_per_edge` and
/// `api_writes_per_sec`.
pub fn run() -> Result<()> {
    super::cargo_bench_figures(
        "controller",
        "network-enforcer-controller",
        "controller",
        &[
            (
                "records_merged_per_sec_per_core",
                "records per CPU-second of the merging thread",
            ),
            (
                "records_merged_per_sec_wall",
                "records per wall-clock second (shared machine)",
            ),
            (
                "writes_per_proposal_per_flush",
                "spec writes per proposal per flush (20 proposals x 10 flushes)",
            ),
            (
                "bytes_per_pod",
                "heap bytes per pod in the index (10k pods)",
            ),
            ("bytes_per_edge", "heap bytes per pending edge (100k edges)"),
            ("bytes_per_10k_pods", "heap bytes for 10k pods in the index"),
            ("bytes_per_100k_edges", "heap bytes for 100k pending edges"),
            ("api_writes_per_sec", "spec writes/s under steady load"),
            ("load_average_1m", "1-min load average at start (2 cores)"),
        ],
    )
}
