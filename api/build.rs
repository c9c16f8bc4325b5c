//! Compiles the agent protocol and our subsets of the flow-source APIs (repo root `proto/`: Hubble,
//! Goldmane) with protox (no system protoc needed) and generates tonic code.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=../proto");
    let descriptors = protox::compile(["networkenforcer/agent/v1/uplink.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    // The controller's side of the same RPC, declared by hand: it receives `FlowBatch` as
    // `uplink::encoded::FlowBatch` (records left encoded until a merge slot decodes them), so a stream
    // waiting for the merge holds its batch at wire size.
    let encoded = tonic_prost_build::manual::Service::builder()
        .name("FlowUplink")
        .package("networkenforcer.agent.v1")
        .method(
            tonic_prost_build::manual::Method::builder()
                .name("stream")
                .route_name("Stream")
                .input_type("crate::uplink::encoded::FlowBatch")
                .output_type("crate::uplink::BatchAck")
                .codec_path("tonic_prost::ProstCodec")
                .client_streaming()
                .server_streaming()
                .build(),
        )
        .build();
    tonic_prost_build::manual::Builder::new()
        .build_client(false)
        .compile(&[encoded]);
    // Clients for the agent and the controller, servers for the in-process fakes of the tests.
    let sources = protox::compile(
        ["hubble/observer.proto", "goldmane/goldmane.proto"],
        ["../proto"],
    )?;
    tonic_prost_build::configure().compile_fds(sources)?;
    Ok(())
}
