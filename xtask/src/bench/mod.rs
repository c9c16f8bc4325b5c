//! `cargo xtask bench <name>`: load harnesses and criterion runs whose figures land in
//! `target/bench/<name>.json` (keys named by the issues) and in a table on stdout.
//!
//! Each benchmark lives in its own module and ends with [`report`]; add a module and an arm to
//! [`run`] for a new one.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

use crate::run;

mod agent;
mod controller;
mod e2e;
mod evaluate;

/// Names accepted by [`run`].
const KNOWN: &[&str] = &["agent", "controller", "evaluate", "e2e"];

/// Runs the named benchmark.
pub fn run(name: &str) -> Result<()> {
    match name {
        "agent" => agent::run(),
        "controller" => controller::run(),
        "e2e" => e2e::run(),
        "evaluate" => evaluate::run(),
        other => bail!("unknown benchmark `{other}`; known: {}", KNOWN.join(", ")),
    }
}

#[allow(dead_code)] // used by the benchmark modules as they land
/// One measured figure: a key from the issue, its value, and a unit for the table.
pub struct Figure {
    pub key: &'static str,
    pub value: f64,
    pub unit: &'static str,
}

#[allow(dead_code)]
impl Figure {
    pub fn new(key: &'static str, value: f64, unit: &'static str) -> Self {
        Self { key, value, unit }
    }
}

#[allow(dead_code)]
/// Writes `target/bench/<name>.json` (a flat object of the figures) and prints them as a table.
pub fn report(name: &str, figures: &[Figure]) -> Result<PathBuf> {
    let dir = run::workspace_root().join("target").join("bench");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{name}.json"));
    let object: serde_json::Map<String, serde_json::Value> = figures
        .iter()
        .map(|f| (f.key.to_string(), serde_json::json!(f.value)))
        .collect();
    std::fs::write(&path, serde_json::to_string_pretty(&object)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;

    let width = figures.iter().map(|f| f.key.len()).max().unwrap_or(0);
    println!("\nbench {name}");
    for f in figures {
        println!("  {:<width$}  {:>14.3}  {}", f.key, f.value, f.unit);
    }
    println!("  -> {}", path.display());
    Ok(path)
}
