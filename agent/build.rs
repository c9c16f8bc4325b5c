//! Builds the kernel programs (`agent-ebpf`) for `bpfel-unknown-none` with aya-build and leaves the ELF in
//! `OUT_DIR`, where `src/kernel/loader.rs` (the live programs) and `src/kernel/existing.rs` (the start-up
//! scan) embed them.
//!
//! aya-build runs `rustup run <toolchain> cargo build` for the BPF target. The toolchain is Debian's Rust
//! (it ships a prebuilt `core` for the BPF target), linked into rustup by `cargo xtask setup` under the name
//! in `AYA_BUILD_TOOLCHAIN` (set in `.cargo/config.toml`).

use anyhow::{Context, Result};
use aya_build::{Package, Toolchain};
use std::path::Path;

const EBPF_PACKAGE: &str = "network-enforcer-agent-ebpf";

fn main() -> Result<()> {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir
        .parent()
        .context("the agent crate lives inside the workspace")?;
    let ebpf_dir = workspace.join("agent-ebpf");
    let common_dir = workspace.join("agent-common");
    // aya-build watches the eBPF crate; the shared records live in another crate and matter as much.
    println!("cargo:rerun-if-changed={}", common_dir.display());
    println!("cargo:rerun-if-env-changed=AYA_BUILD_TOOLCHAIN");

    // aya-build forwards the nested cargo's stderr as build-script warnings; keep only what matters
    // (compiler diagnostics and errors), not one "Compiling ..." warning per crate.
    // SAFETY: the build script is single-threaded; nothing reads the environment concurrently.
    unsafe { std::env::set_var("CARGO_TERM_QUIET", "true") };

    let toolchain = std::env::var("AYA_BUILD_TOOLCHAIN").unwrap_or_else(|_| "debian-bpf".into());
    let ebpf_dir = ebpf_dir
        .to_str()
        .context("the workspace path must be valid UTF-8")?;
    aya_build::build_ebpf(
        [Package {
            name: EBPF_PACKAGE,
            root_dir: ebpf_dir,
            no_default_features: false,
            features: &[],
        }],
        Toolchain::Custom(&toolchain),
    )
    .with_context(|| {
        format!(
            "building the eBPF programs with the rustup toolchain `{toolchain}` failed; \
             run `cargo xtask setup` to install the eBPF toolchain (Debian rustc-web, bpf-linker)"
        )
    })
}
