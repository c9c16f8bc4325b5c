//! `cargo xtask bench <name>`: load harnesses and criterion runs whose figures land in
//! `target/bench/<name>.json` (keys named by the issues) and in a table on stdout.
//!
//! Each benchmark lives in its own module and ends with [`report`]; add a module and an arm to
//! [`run()`] for a new one.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::run;

mod agent;
mod controller;
mod dns;
mod e2e;
mod edge_history;
mod enforce;
mod evaluate;
mod fleet;
mod socket_state;
mod ui;

/// The benchmarks (`cargo xtask bench <name>`; clap lists them in `--help` and refuses others).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Name {
    Agent,
    Controller,
    Dns,
    E2e,
    #[value(name = "edge_history")]
    EdgeHistory,
    Enforce,
    Evaluate,
    Fleet,
    #[value(name = "socket_state")]
    SocketState,
    Ui,
}

/// Runs the named benchmark.
pub fn run(name: Name) -> Result<()> {
    match name {
        Name::Agent => agent::run(),
        Name::Controller => controller::run(),
        Name::Dns => dns::run(),
        Name::E2e => e2e::run(),
        Name::EdgeHistory => edge_history::run(),
        Name::Enforce => enforce::run(),
        Name::Evaluate => evaluate::run(),
        Name::Fleet => fleet::run(),
        Name::SocketState => socket_state::run(),
        Name::Ui => ui::run(),
    }
}

/// One measured figure: a key from the issue, its value, and a unit for the table.
pub struct Figure {
    pub key: &'static str,
    pub value: f64,
    pub unit: &'static str,
}

impl Figure {
    pub fn new(key: &'static str, value: f64, unit: &'static str) -> Self {
        Self { key, value, unit }
    }
}

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

/// Runs `cargo bench -p <package> --bench <bench>` in the release (bench) profile with
/// `BENCH_FIGURES` naming a file the bench writes its figures to as a JSON object, then [`report`]s
/// the figures named by `keys` (`(key, unit)`) under `name`.
pub fn cargo_bench_figures(
    name: &str,
    package: &str,
    bench: &str,
    keys: &[(&'static str, &'static str)],
) -> Result<()> {
    let root = run::workspace_root();
    let raw = root
        .join("target")
        .join("bench")
        .join(format!("{name}.raw.json"));
    let _ = std::fs::remove_file(&raw);
    run::step(
        &format!("cargo bench --bench {bench} (release)"),
        run::cargo(
            &root,
            &[("BENCH_FIGURES".into(), raw.display().to_string())],
            &["bench", "--locked", "-p", package, "--bench", bench],
        ),
    )?;
    let text = std::fs::read_to_string(&raw)
        .with_context(|| format!("the bench wrote no figures to {}", raw.display()))?;
    let values: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", raw.display()))?;
    let figures = keys
        .iter()
        .map(|&(key, unit)| {
            let value = values[key]
                .as_f64()
                .with_context(|| format!("{} has no number `{key}`", raw.display()))?;
            Ok(Figure::new(key, value, unit))
        })
        .collect::<Result<Vec<_>>>()?;
    report(name, &figures)?;
    std::fs::remove_file(&raw).ok();
    Ok(())
}
