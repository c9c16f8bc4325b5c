//! Running external commands with visible progress and clear failures.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The workspace root (the parent of `xtask/`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Runs `cmd`, inheriting stdio, and fails with the command line when it exits non-zero.
pub fn status(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let st = cmd
        .status()
        .with_context(|| format!("could not start {shown}"))?;
    if !st.success() {
        bail!("{shown} failed with {st}");
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout; fails with stderr when it exits non-zero.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd
        .output()
        .with_context(|| format!("could not start {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A `cargo` invocation in `dir` with extra environment.
pub fn cargo(dir: &Path, env: &[(String, String)], args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(dir).args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Runs one named step, printing its name and how long it took.
pub fn step(name: &str, mut cmd: Command) -> Result<()> {
    println!("==> {name}");
    let start = Instant::now();
    status(&mut cmd).with_context(|| format!("step `{name}` failed"))?;
    println!("==> {name}: ok in {:.1}s", start.elapsed().as_secs_f64());
    Ok(())
}
