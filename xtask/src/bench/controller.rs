//! `cargo xtask bench controller`: the controller's ingest and learning figures (issue 5), measured by
//! the controller's `controller` bench in the release (bench) profile: records merged per second on one
//! core, heap per pod (10k pods) and per pending edge (100k edges), and writes per proposal per flush
//! and API writes per second under a steady flow load against the local cluster's API server. The bench
//! writes its figures as JSON to the file named by `BENCH_FIGURES`; this reads them back and
//! [`report`]s them.

use super::{Figure, report};
use crate::run;
use anyhow::{Context, Result};

/// Runs the bench and reports `records_merged_per_sec_per_core` (target >= 200k),
/// `writes_per_proposal_per_flush` (target <= 1), `bytes_per_pod`, `bytes_per_edge` and
/// `api_writes_per_sec`.
pub fn run() -> Result<()> {
    let root = run::workspace_root();
    let raw = root
        .join("target")
        .join("bench")
        .join("controller.raw.json");
    let _ = std::fs::remove_file(&raw);
    run::step(
        "cargo bench --bench controller (release)",
        run::cargo(
            &root,
            &[("BENCH_FIGURES".into(), raw.display().to_string())],
            &[
                "bench",
                "--locked",
                "-p",
                "network-enforcer-controller",
                "--bench",
                "controller",
            ],
        ),
    )?;
    let text = std::fs::read_to_string(&raw)
        .with_context(|| format!("the bench wrote no figures to {}", raw.display()))?;
    let figures: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", raw.display()))?;
    let figure = |key: &'static str, unit: &'static str| -> Result<Figure> {
        let value = figures[key]
            .as_f64()
            .with_context(|| format!("{} has no number `{key}`", raw.display()))?;
        Ok(Figure::new(key, value, unit))
    };
    report(
        "controller",
        &[
            figure("records_merged_per_sec_per_core", "records/s (one thread)")?,
            figure(
                "writes_per_proposal_per_flush",
                "spec writes per proposal per flush (20 proposals x 10 flushes)",
            )?,
            figure(
                "bytes_per_pod",
                "heap bytes per pod in the index (10k pods)",
            )?,
            figure("bytes_per_edge", "heap bytes per pending edge (10k edges)")?,
            figure("api_writes_per_sec", "spec writes/s under steady load")?,
        ],
    )?;
    std::fs::remove_file(&raw).ok();
    Ok(())
}
