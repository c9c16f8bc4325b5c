//! Lets the eBPF crate be checked for the host (clippy) as well as built for the BPF target: aya-ebpf's
//! bindings are chosen by the `bpf_target_arch` cfg, which this sets when it is not given.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    aya_build::emit_bpf_target_arch_cfg()?;
    Ok(())
}
