//! `cargo xtask gen`: writes the CRD manifests generated from the Rust types into the chart.

use anyhow::{Context, Result};

/// Writes every CRD manifest into `charts/network-enforcer/crds/`.
pub fn write() -> Result<()> {
    let dir = crate::run::workspace_root().join("charts/network-enforcer/crds");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (file, yaml) in network_enforcer_api::crd_manifests() {
        let path = dir.join(file);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
