//! SPEC section 10, Kubernetes backend, eBPF-only provider, end to end (issue 10): our chart installed
//! into the local cluster with our images, real `http-client` / `http-server` pods, real socat traffic
//! from inside the client pod, every flow seen by our agent's eBPF programs; learn, promote to monitor,
//! violations, protect with the blocked flow dropped on the node (no CNI here enforces NetworkPolicy).
//! The steps and assertions are in `network_enforcer_tests::e2e::scenario`. Needs root, `cargo xtask
//! setup` and the binaries (`cargo build --bins`; `cargo test --workspace` builds them).

use anyhow::{Result, ensure};
use network_enforcer_tests::e2e::release::{self, Release};
use network_enforcer_tests::e2e::scenario;
use network_enforcer_tests::fixture;

#[test]
fn spec_section_10_kubernetes_backend_with_the_ebpf_provider_learns_monitors_and_protects()
-> Result<()> {
    let cluster = fixture::cluster_with_crds()?;
    release::images_from_debug_build()?;
    let namespace = "ne-e2e-system";
    let release = Release::install(
        &cluster.kubeconfig,
        "ne-e2e",
        namespace,
        &scenario::release_values(namespace),
    )?;
    let timings = scenario::run(
        &cluster.kubeconfig,
        &release,
        &format!("e2e-{}", std::process::id()),
    )?;
    ensure!(timings.first_packet_to_proposal.len() == 2, "{timings:?}");
    eprintln!(
        "scenario {:.1}s, first packet to proposal {:?}",
        timings.scenario.as_secs_f64(),
        timings.first_packet_to_proposal
    );
    release.uninstall()
}
