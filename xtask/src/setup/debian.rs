//! Debian packages, installed only when missing.

use crate::run;
use anyhow::Result;
use std::process::Command;
use std::sync::Once;

static APT_UPDATE: Once = Once::new();

/// Installs the Debian packages that are not installed yet (`apt-get update` first, once per run).
pub fn apt_install(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !is_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("    apt: installing {}", missing.join(" "));
    let mut update = Ok(());
    APT_UPDATE.call_once(|| {
        update = run::status(Command::new("apt-get").args(["update", "-qq"]));
    });
    update?;
    run::status(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing),
    )
}

fn is_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}
