//! Compiles the agent protocol and our subsets of the flow-source APIs (repo root `proto/`: Hubble,
//! Goldmane) with protox (no system protoc needed) and generates tonic code.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=../proto");
    let descriptors = protox::compile(["networkenforcer/agent/v1/uplink.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    // Clients for the agent and the controller, servers for the in-process fakes of the tests.
    let sources = protox::compile(
        ["hubble/observer.proto", "goldmane/goldmane.proto"],
        ["../proto"],
    )?;
    tonic_prost_build::configure().compile_fds(sources)?;
    Ok(())
}
