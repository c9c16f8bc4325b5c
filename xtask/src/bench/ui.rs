//! `cargo xtask bench ui`: the web view at 1,000 workloads / 10,000 edges, measured by the
//! controller's `ui` bench in the release (bench) profile: the graph answer's build, size and encoding,
//! and in Debian's headless Chromium (through chromedriver) the page's first render and the time a new
//! violation takes to show. The bench writes its figures as JSON to the file named by `BENCH_FIGURES`;
//! this reads them back and [`super::report`]s them.

use anyhow::Result;

/// Runs the bench and reports its figures.
pub fn run() -> Result<()> {
    super::cargo_bench_figures(
        "ui",
        "network-enforcer-controller",
        "ui",
        &[
            (
                "graph_build_ms_10k_edges",
                "ms (graph answer from 1k proposals/policies)",
            ),
            ("graph_json_kb_10k_edges", "KiB (the graph answer's JSON)"),
            ("graph_encode_ms_10k_edges", "ms (JSON encoding)"),
            (
                "graph_build_ms_10k_edges_10k_observed",
                "ms (the same with every edge's flow observed and judged)",
            ),
            (
                "first_render_ms_10k_edges",
                "ms (headless Chromium: open to every edge drawn)",
            ),
            (
                "update_render_ms_10k_edges",
                "ms (violation in the status to highlighted, 2 s poll included)",
            ),
        ],
    )
}
