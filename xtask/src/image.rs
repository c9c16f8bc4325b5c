//! `cargo xtask image <name>`: local images for the local cluster (no container engine needed).

use anyhow::{Result, bail};

pub fn build(name: &str) -> Result<()> {
    bail!("image `{name}`: local image builds are not implemented yet")
}
