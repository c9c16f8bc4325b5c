//! The end-to-end scenario (docs/development.md) through each CNI/mesh flow source: our chart
//! installed per provider into the local cluster, the scenario's real pods, and a wire-faithful fake of
//! the data plane that does not exist here (Hubble on a unix socket the agent mounts; ztunnel's JSON
//! logs written by the container runtime; Goldmane over mutual TLS behind a Service). Learn, promote to
//! monitor, violations, protect, with exact proposals and violation counts. The helpers are in
//! `network_enforcer_tests::e2e::sources`. Needs root, `cargo xtask setup` and the binaries
//! (`cargo build --bins`). Each test installs its own release (own names, namespaces, agent metrics
//! port, host paths), so they could run in parallel; they take turns ([`one_at_a_time`]) because three
//! releases at once on a 2-core machine once left the istio variant's proposal unwritten within its
//! timeout (cause not found; a flaky CI run costs more than the ~2 minutes taking turns costs).

use anyhow::Result;
use network_enforcer_tests::cluster::ClusterInfo;
use network_enforcer_tests::e2e::release::{self, Release};
use network_enforcer_tests::e2e::scenario::say;
use network_enforcer_tests::e2e::sources::goldmane::{self, FakeGoldmane, GoldmaneDataPlane, Pki};
use network_enforcer_tests::e2e::sources::hubble::{FakeHubble, HubbleDataPlane};
use network_enforcer_tests::e2e::sources::{common_values, kubernetes, ztunnel};
use network_enforcer_tests::e2e::workload::Namespace;
use network_enforcer_tests::fixture;
use std::path::Path;
use std::sync::Mutex;

/// Held for the whole of a test: the variants take turns (see the module docs).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The cluster, with our images built from the debug binaries and imported once at a time (the tests
/// of this file run in parallel and share the image tars).
fn cluster() -> Result<&'static ClusterInfo> {
    static IMAGES: Mutex<()> = Mutex::new(());
    let cluster = fixture::cluster_with_crds()?;
    let _one_at_a_time = IMAGES.lock().unwrap_or_else(|e| e.into_inner());
    release::images_from_debug_build()?;
    Ok(cluster)
}

#[test]
fn kubernetes_backend_through_cilium_hubble() -> Result<()> {
    let _turn = one_at_a_time();
    let cluster = cluster()?;
    let pid = std::process::id();
    let namespace = "ne-src-cilium-system";
    let scenario_ns = format!("src-cilium-{pid}");
    // A host directory of this test: the chart mounts the socket's directory into the agent.
    let socket = format!("/run/ne-src-cilium-{pid}/hubble.sock");
    let hubble = FakeHubble::start(Path::new(&socket))?;
    let agent_port = 19_464;
    let mut values = common_values(namespace, &scenario_ns, agent_port);
    values.extend([
        "controller.provider.name=cilium".to_string(),
        "agent.hubble.source=socket".to_string(),
        format!("agent.hubble.socketPath={socket}"),
        // The Hubble resume point of this release only.
        format!("agent.stateDir=/var/lib/ne-src-cilium-{pid}"),
    ]);
    // Removed when the test ends, passed or not (after the release, declared before it).
    let _state_dir = RemoveOnDrop(format!("/var/lib/ne-src-cilium-{pid}").into());
    let release = Release::install(&cluster.kubeconfig, "ne-src-cilium", namespace, &values)?;
    let mut plane = HubbleDataPlane::new(hubble);
    // Hubble restarts before step 4's datagram: its monitor violations need the agent's resume.
    plane.restart_before = Some(kubernetes::Event::Udp18083);
    let took = kubernetes::run(
        &cluster.kubeconfig,
        &release,
        agent_port,
        &scenario_ns,
        &mut plane,
    )?;
    let requests = plane.hubble.requests();
    anyhow::ensure!(
        requests.iter().all(|r| r.follow),
        "the agent asked Hubble without follow: {requests:?}"
    );
    say(&format!("cilium: scenario {:.1}s", took.as_secs_f64()));
    release.uninstall()
}

#[test]
fn istio_backend_through_ztunnel_logs() -> Result<()> {
    let _turn = one_at_a_time();
    let cluster = cluster()?;
    ztunnel::ensure_authorization_policy_crd(&cluster.kubeconfig)?;
    let pid = std::process::id();
    let namespace = "ne-src-istio-system";
    let scenario_ns = format!("src-istio-{pid}");
    // The fake ztunnel pod's namespace: its container logs are what the agent tails.
    let ztunnel_ns = format!("src-ztunnel-{pid}");
    let agent_port = 19_465;
    let mut values = common_values(namespace, &scenario_ns, agent_port);
    values.extend([
        "controller.provider.name=istio".to_string(),
        format!("agent.ztunnel.logGlob={}", ztunnel::log_glob(&ztunnel_ns)),
        // Read positions of this release only.
        format!("agent.stateDir=/var/lib/ne-src-istio-{pid}"),
    ]);
    // Removed when the test ends, passed or not (after the release, declared before it).
    let _state_dir = RemoveOnDrop(format!("/var/lib/ne-src-istio-{pid}").into());
    let release = Release::install(&cluster.kubeconfig, "ne-src-istio", namespace, &values)?;
    let ztunnel_namespace = Namespace::create(&cluster.kubeconfig, &ztunnel_ns)?;
    let took = ztunnel::run(
        &cluster.kubeconfig,
        &release,
        agent_port,
        &scenario_ns,
        &ztunnel_namespace,
    )?;
    say(&format!("istio: scenario {:.1}s", took.as_secs_f64()));
    ztunnel_namespace.delete_and_wait()?;
    release.uninstall()
}

/// A host directory of a test, removed on drop.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn kubernetes_backend_through_calico_goldmane() -> Result<()> {
    let _turn = one_at_a_time();
    let cluster = cluster()?;
    let pid = std::process::id();
    let namespace = "ne-src-calico-system";
    let scenario_ns = format!("src-calico-{pid}");
    // Where the operator's objects would be (calico-system): Service goldmane, its key pair and CA.
    let goldmane_ns = Namespace::create(&cluster.kubeconfig, &format!("src-goldmane-{pid}"))?;
    let pki = Pki::new(&goldmane_ns.name)?;
    let server = FakeGoldmane::start(&pki)?;
    goldmane::publish(
        &goldmane_ns,
        &pki,
        &goldmane::node_ip(&cluster.kubeconfig)?,
        server.port,
    )?;
    let agent_port = 19_466;
    let mut values = common_values(namespace, &scenario_ns, agent_port);
    let tls = "controller.provider.calico.tls";
    values.extend([
        "controller.provider.name=calico".to_string(),
        format!(
            "controller.provider.calico.endpoint=goldmane.{}.svc:{}",
            goldmane_ns.name,
            goldmane::SERVICE_PORT
        ),
        format!("{tls}.mode=existingSecret"),
        format!("{tls}.existingSecret.namespace={}", goldmane_ns.name),
        format!("{tls}.existingSecret.name={}", goldmane::SECRET),
        format!(
            "{tls}.existingSecret.caBundleConfigMap={}",
            goldmane::CA_CONFIGMAP
        ),
        format!("{tls}.existingSecret.caBundleKey={}", goldmane::CA_KEY),
    ]);
    let release = Release::install(&cluster.kubeconfig, "ne-src-calico", namespace, &values)?;
    let mut plane = GoldmaneDataPlane::new(server);
    let took = kubernetes::run(
        &cluster.kubeconfig,
        &release,
        agent_port,
        &scenario_ns,
        &mut plane,
    )?;
    let requests = plane.goldmane.requests();
    anyhow::ensure!(
        !requests.is_empty() && plane.goldmane.open_streams() >= 1,
        "the controller never kept a Goldmane stream open: {}",
        plane.goldmane.describe()
    );
    say(&format!("calico: scenario {:.1}s", took.as_secs_f64()));
    release.uninstall()?;
    goldmane_ns.delete_and_wait()
}
