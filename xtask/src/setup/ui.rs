//! The web view's graph layout library: dagre (`@dagrejs/dagre`) from the npm registry, installed
//! under the cache with the machine's Node.js and npm. The controller's build script embeds its
//! browser bundle (`controller/build.rs`): nothing is fetched at run time, and no CDN is involved.

use crate::run;
use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use std::process::Command;

/// The pinned package (`controller/build.rs` refuses another version); a new version is a reviewed change (the web view's browser test lays out
/// the demo's and the scenario's graphs with it and fails on any overlap).
pub const DAGRE: &str = "@dagrejs/dagre";
pub const DAGRE_VERSION: &str = "3.1.3";

/// The files of `node_modules` that `controller/build.rs` embeds.
pub const EMBEDDED: [&str; 4] = [
    "@dagrejs/dagre/package.json",
    "@dagrejs/dagre/dist/dagre.min.js",
    "@dagrejs/dagre/dist/dagre.min.js.LEGAL.txt",
    "@dagrejs/graphlib/LICENSE",
];

/// Where npm installs it (`node_modules` below).
pub fn dir() -> Result<PathBuf> {
    Ok(super::cache_dir()?.join("ui"))
}

/// Installs the pinned dagre when it is missing or another version.
pub fn install() -> Result<()> {
    let dir = dir()?;
    let modules = dir.join("node_modules");
    let manifest = modules.join(DAGRE).join("package.json");
    // Every file the controller's build script reads, not only the version: a cut-off install is
    // installed again.
    let complete = EMBEDDED.iter().all(|file| modules.join(file).is_file());
    if complete && installed_version(&manifest).as_deref() == Some(DAGRE_VERSION) {
        return Ok(());
    }
    if !Command::new("npm")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        super::apt_install(&["nodejs", "npm"])?;
    }
    println!("    {DAGRE}@{DAGRE_VERSION}: installing from the npm registry");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    run::status(
        Command::new("npm")
            // No package scripts (none is needed, and setup runs as root); the exact version saved.
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                "--save-exact",
                "--prefix",
            ])
            .arg(&dir)
            .arg(format!("{DAGRE}@{DAGRE_VERSION}")),
    )
    .with_context(|| format!("installing {DAGRE}@{DAGRE_VERSION} with npm"))?;
    if let Some(missing) = EMBEDDED.iter().find(|file| !modules.join(file).is_file()) {
        bail!(
            "npm installed {DAGRE} without {missing} (in {})",
            modules.display()
        );
    }
    match installed_version(&manifest) {
        Some(v) if v == DAGRE_VERSION => Ok(()),
        other => bail!(
            "npm installed {DAGRE} {other:?}, not {DAGRE_VERSION} ({})",
            manifest.display()
        ),
    }
}

fn installed_version(manifest: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(manifest).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    Some(value.get("version")?.as_str()?.to_string())
}
