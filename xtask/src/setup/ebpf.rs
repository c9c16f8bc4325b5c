//! The eBPF toolchain: Debian's Rust with the BPF `core`, LLVM, bpf-linker, and the rustup link aya-build uses.
//!
//! Why this combination (see docs/development.md, "eBPF toolchain"): the newest aya needs a newer Rust than any toolchain here, so the
//! workspace stays on aya 0.14 / aya-ebpf 0.2. Those programs are compiled for `bpfel-unknown-none` by
//! Debian's `rustc-web`, whose `libstd-rust-web-dev-bpf` ships a prebuilt `core` for that target (no
//! `-Z build-std`, no nightly). `bpf-linker` links them, built against Debian's LLVM 22. aya-build runs
//! `rustup run <toolchain> cargo build`, so Debian's `/usr` toolchain is linked into rustup under
//! [`TOOLCHAIN`]; the agent's build script names the same toolchain (via `.cargo/config.toml`).
//!
//! Every step checks first and skips what is already in place, so a second run takes seconds.

use crate::run;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Debian packages: the Rust toolchain with the BPF `core`, LLVM 22 for bpf-linker, and what the agent's
/// kernel tests use to build "pods" (network namespaces, veth pairs) and to block traffic (nftables).
const PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "iproute2",
    "nftables",
    // tcplife, the peer observer of `cargo xtask bench agent`.
    "libbpf-tools",
];

/// The bpf-linker release we build; pinned so every machine links the same way.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Where Debian installs LLVM 22 (`llvm-config-22` is not on PATH under the name bpf-linker's
/// build script looks for, so `LLVM_PREFIX` points it here).
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

/// The rustup name of Debian's toolchain; must match `AYA_BUILD_TOOLCHAIN` in `.cargo/config.toml`.
pub const TOOLCHAIN: &str = "debian-bpf";

/// Where Debian's toolchain lives (`/usr/bin/rustc`, `/usr/lib/rustlib/bpfel-unknown-none`).
const DEBIAN_TOOLCHAIN_ROOT: &str = "/usr";

/// Installs the eBPF toolchain when missing.
pub fn install() -> Result<()> {
    println!("--> eBPF toolchain");
    crate::setup::apt_install(PACKAGES).context("installing Debian's Rust and LLVM 22 packages")?;
    check_bpf_core()?;
    install_bpf_linker()?;
    link_rustup_toolchain()?;
    println!(
        "    eBPF toolchain ready (rustup toolchain `{TOOLCHAIN}`, bpf-linker {BPF_LINKER_VERSION})"
    );
    Ok(())
}

/// Fails clearly when Debian's BPF `core` is missing (the package list changed or the install broke).
fn check_bpf_core() -> Result<()> {
    let dir = Path::new(DEBIAN_TOOLCHAIN_ROOT).join("lib/rustlib/bpfel-unknown-none/lib");
    let has_core = std::fs::read_dir(&dir)
        .map(|entries| {
            entries.flatten().any(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                name.starts_with("libcore-") && name.ends_with(".rlib")
            })
        })
        .unwrap_or(false);
    if !has_core {
        bail!(
            "{} holds no libcore-*.rlib: the Debian package libstd-rust-web-dev-bpf should provide it",
            dir.display()
        );
    }
    Ok(())
}

/// `cargo install bpf-linker`, unless the pinned version is already on PATH or in `~/.cargo/bin`.
fn install_bpf_linker() -> Result<()> {
    if let Some(found) = installed_bpf_linker_version() {
        if found == BPF_LINKER_VERSION {
            println!("    bpf-linker {found}: already installed");
            return Ok(());
        }
        println!("    bpf-linker {found} found, want {BPF_LINKER_VERSION}: reinstalling");
    } else {
        println!(
            "    bpf-linker: building {BPF_LINKER_VERSION} against LLVM 22 (about 1-2 minutes)"
        );
    }
    let start = std::time::Instant::now();
    run::status(
        Command::new("cargo")
            .env("LLVM_PREFIX", LLVM_PREFIX)
            .args(["install", "--locked", "--force"])
            .arg(format!("bpf-linker@{BPF_LINKER_VERSION}"))
            .args(["--no-default-features", "--features", "llvm-22"]),
    )
    .context("building bpf-linker (needs Debian's llvm-22-dev)")?;
    println!(
        "    bpf-linker: installed in {:.0}s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The version `bpf-linker --version` reports (`bpf-linker 0.13.0`), or None when it is not installed.
fn installed_bpf_linker_version() -> Option<String> {
    let candidates = [
        Some(PathBuf::from("bpf-linker")),
        cargo_home().map(|h| h.join("bin/bpf-linker")),
    ];
    candidates.into_iter().flatten().find_map(|bin| {
        let out = Command::new(&bin).arg("--version").output().ok()?;
        if !out.status.success() {
            return None;
        }
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(1)
            .map(str::to_string)
    })
}

fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
}

/// `rustup toolchain link debian-bpf /usr`, unless rustup already knows it.
fn link_rustup_toolchain() -> Result<()> {
    let list = run::output(Command::new("rustup").args(["toolchain", "list"]))
        .context("rustup is required: aya-build runs the eBPF build through `rustup run`")?;
    if list
        .lines()
        .any(|l| l.split_whitespace().next() == Some(TOOLCHAIN))
    {
        println!("    rustup toolchain {TOOLCHAIN}: already linked");
        return Ok(());
    }
    println!("    rustup toolchain link {TOOLCHAIN} {DEBIAN_TOOLCHAIN_ROOT}");
    run::status(Command::new("rustup").args([
        "toolchain",
        "link",
        TOOLCHAIN,
        DEBIAN_TOOLCHAIN_ROOT,
    ]))
    .context("linking Debian's Rust toolchain into rustup")
}
