//! The eBPF toolchain: Debian's Rust with the BPF `core`, LLVM, bpf-linker, and the rustup link aya-build uses.

use anyhow::Result;

/// Installs the eBPF toolchain when missing.
pub fn install() -> Result<()> {
    Ok(())
}
