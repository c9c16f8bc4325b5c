//! `cargo xtask fuzz`: the fuzz tests (`agent/tests/fuzz.rs`, `controller/tests/fuzz.rs`; docs/development.md,
//! "Fuzzing") in release, 100,000 cases per target unless `NE_FUZZ_CASES` says otherwise, one test at a
//! time so each target's seconds are its own. Cases and seconds per target go to `target/bench/fuzz.json`
//! and a table on stdout.

use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;

use crate::run;

/// Cases per target when `NE_FUZZ_CASES` is not set.
const CASES: &str = "100000";

/// The packages whose `tests/fuzz.rs` runs.
const PACKAGES: &[&str] = &["network-enforcer-agent", "network-enforcer-controller"];

pub fn run() -> Result<()> {
    let root = run::workspace_root();
    let dir = root.join("target").join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    // Each target appends a line {"target", "cases", "seconds"} here (controller/tests/hostile).
    let lines = dir.join("fuzz-targets.jsonl");
    match std::fs::remove_file(&lines) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", lines.display())),
    }
    let cases = std::env::var("NE_FUZZ_CASES").unwrap_or_else(|_| CASES.to_string());
    for package in PACKAGES {
        let mut cmd = run::cargo(
            &root,
            &[],
            &[
                "test",
                "--release",
                "--locked",
                "-p",
                package,
                "--test",
                "fuzz",
                "--",
                "--test-threads=1",
            ],
        );
        cmd.env("NE_FUZZ_CASES", &cases)
            .env("NE_FUZZ_REPORT", &lines);
        run::step(&format!("fuzz {package} ({cases} cases per target)"), cmd)?;
    }

    let text = std::fs::read_to_string(&lines)
        .with_context(|| format!("reading {} (written by the fuzz tests)", lines.display()))?;
    let mut targets = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let entry: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("a line of {}: {line:?}", lines.display()))?;
        let (Some(target), Some(cases), Some(seconds)) = (
            entry["target"].as_str(),
            entry["cases"].as_u64(),
            entry["seconds"].as_f64(),
        ) else {
            bail!(
                "{}: {line:?} lacks target, cases or seconds",
                lines.display()
            );
        };
        targets.insert(
            target.to_string(),
            serde_json::json!({"cases": cases, "seconds": (seconds * 1000.0).round() / 1000.0}),
        );
    }
    if targets.is_empty() {
        bail!("the fuzz tests reported no target in {}", lines.display());
    }
    let path = dir.join("fuzz.json");
    std::fs::write(&path, serde_json::to_string_pretty(&targets)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;

    let width = targets.keys().map(String::len).max().unwrap_or(0);
    println!("\nfuzz");
    for (target, figures) in &targets {
        println!(
            "  {target:<width$}  {:>9} cases  {:>8.2} s",
            figures["cases"].as_u64().unwrap_or_default(),
            figures["seconds"].as_f64().unwrap_or_default()
        );
    }
    println!("  -> {}", path.display());
    Ok(())
}
