//! `cargo xtask bench evaluate`: flow evaluation against 1k WorkloadNetworkPolicies / 10k pods and
//! the status sync of 1k policies × 100 violations (the scale we aim at), measured by the controller's
//! `evaluate` bench in the release (bench) profile. The bench writes its figures as JSON to the file
//! named by `BENCH_FIGURES`; this reads them back and [`super::report`]s them.

use anyhow::Result;

/// Runs the bench and reports `evaluations_per_sec`, `status_sync_ms_1k_policies`,
/// `view_build_ms_10k_pods` and `index_build_ms_10k_pods`.
pub fn run() -> Result<()> {
    super::cargo_bench_figures(
        "evaluate",
        "network-enforcer-controller",
        "evaluate",
        &[
            (
                "evaluations_per_sec",
                "flows/s (1k policies, 10k pods; goal >= 1,000,000)",
            ),
            (
                "status_sync_ms_1k_policies",
                "ms (1k policies x 100 violations; goal <= 200)",
            ),
            (
                "view_build_ms_10k_pods",
                "ms (evaluator view from the index)",
            ),
            (
                "index_build_ms_10k_pods",
                "ms (the view's policy index, per pass)",
            ),
        ],
    )
}
