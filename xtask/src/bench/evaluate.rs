//! `cargo xtask bench evaluate`: flow evaluation against 1k WorkloadNetworkPolicies / 10k pods and
//! the status sync of 1k policies × 100 violations (issue 7), measured by the controller's
//! `evaluate` bench in the release (bench) profile. The bench writes its figures as JSON to the file
//! named by `BENCH_FIGURES`; this reads them back and [`report`]s them.

use super::{Figure, report};
use crate::run;
use anyhow::{Context, Result};

/// Runs the bench and reports `evaluations_per_sec`, `status_sync_ms_1k_policies` and
/// `view_build_ms_10k_pods`.
pub fn run() -> Result<()> {
    let root = run::workspace_root();
    let raw = root.join("target").join("bench").join("evaluate.raw.json");
    let _ = std::fs::remove_file(&raw);
    run::step(
        "cargo bench --bench evaluate (release)",
        run::cargo(
            &root,
            &[("BENCH_FIGURES".into(), raw.display().to_string())],
            &[
                "bench",
                "--locked",
                "-p",
                "network-enforcer-controller",
                "--bench",
                "evaluate",
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
        "evaluate",
        &[
            figure("evaluations_per_sec", "flows/s (1k policies, 10k pods)")?,
            figure(
                "status_sync_ms_1k_policies",
                "ms (1k policies x 100 violations)",
            )?,
            figure(
                "view_build_ms_10k_pods",
                "ms (evaluator view from the index)",
            )?,
        ],
    )?;
    std::fs::remove_file(&raw).ok();
    Ok(())
}
