//! `cargo xtask setup`: installs, from the registries this project may use (Debian, crates.io, PyPI,
//! npm),
//! everything that builds and tests need. Every step checks first and does nothing when its result is
//! already there, so a second run takes seconds. Caches live under `~/.cache/network-enforcer`.

mod debian;
pub mod ebpf;
pub mod kubernetes;
pub mod tools;
pub mod ui;

use anyhow::{Context, Result};
use std::path::PathBuf;

pub use debian::apt_install;

/// Runs every setup step in order.
pub fn run() -> Result<()> {
    println!("==> setup");
    let start = std::time::Instant::now();
    ebpf::install().context("installing the eBPF toolchain")?;
    tools::install().context("installing test tools (helm, kubernetes-validate, chromium)")?;
    ui::install().context("installing the web view's graph layout library (npm)")?;
    kubernetes::install().context("installing the local Kubernetes cluster parts")?;
    println!("==> setup: ok in {:.1}s", start.elapsed().as_secs_f64());
    Ok(())
}

/// Environment variables that builds and tests need to find what setup installed
/// (PATH with the tool directories first).
pub fn tool_env() -> Result<Vec<(String, String)>> {
    let mut path: Vec<PathBuf> = vec![tools::bin_dir()?];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let path = std::env::join_paths(path).context("building PATH")?;
    Ok(vec![(
        "PATH".to_string(),
        path.to_string_lossy().into_owned(),
    )])
}

/// `~/.cache/network-enforcer`, created on demand.
pub fn cache_dir() -> Result<PathBuf> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let dir = PathBuf::from(home).join(".cache/network-enforcer");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}
