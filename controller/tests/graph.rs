//! `network-enforcer-controller graph`: the real binary on a file of policies and proposals.

use std::path::PathBuf;
use std::process::{Command, Output};

fn data(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn controller(args: &[&str], path: Option<&str>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_network-enforcer-controller"));
    command.args(args);
    if let Some(path) = path {
        command.env("PATH", path);
    }
    command.output().expect("the controller binary runs")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ne-graph-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

const CLIENT: &str = "\"w:demo/Deployment/http-client\"";
const SERVER: &str = "\"w:demo/Deployment/http-server\"";
const DB: &str = "\"w:demo/StatefulSet/db\"";

#[test]
fn dot_shows_workloads_modes_ports_and_violations() {
    let out = controller(&["graph", "--from-file", &data("graph-spec10.yaml")], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dot = String::from_utf8(out.stdout).unwrap();
    // One allowed edge for client → server, although both policies declare it.
    assert_eq!(
        dot.matches(&format!("{CLIENT} -> {SERVER} [label=\"TCP 18080\"];"))
            .count(),
        1,
        "{dot}"
    );
    // The proposal's bare podSelector resolves to the http-server workload of its namespace.
    assert!(
        dot.contains(&format!("{SERVER} -> {DB} [label=\"TCP 5432\"];")),
        "{dot}"
    );
    // Both violation records (monitor, then protect) on one red edge.
    assert!(
        dot.contains(&format!(
            "{CLIENT} -> {SERVER} [label=\"violation: UDP 18081 monitor\\nUDP 18081 protect\", color=red"
        )),
        "{dot}"
    );
    for expected in [
        "egress: protect (deployment-http-client-egress)\", color=blue",
        "ingress: monitor (deployment-http-server-ingress)\", color=orange",
        "ingress: learning (statefulset-db-ingress)\", color=black, style=\"rounded,dashed\"",
    ] {
        assert!(dot.contains(expected), "{expected} missing:\n{dot}");
    }
}

#[test]
fn svg_through_graphviz_to_a_file() {
    let out_file = scratch("graph.svg");
    let out = controller(
        &[
            "graph",
            "--from-file",
            &data("graph-spec10.yaml"),
            "--namespace",
            "demo",
            "-o",
            "svg",
            "--out",
            out_file.to_str().unwrap(),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty());
    let svg = std::fs::read_to_string(&out_file).unwrap();
    assert!(svg.contains("<svg"), "{svg}");
    assert!(
        svg.contains("http&#45;client") || svg.contains("http-client"),
        "{svg}"
    );
    assert!(
        svg.contains("stroke=\"red\""),
        "the violation edge is red:\n{svg}"
    );
}

#[test]
fn svg_without_graphviz_fails_clearly() {
    let empty = scratch("no-bin");
    std::fs::create_dir_all(&empty).unwrap();
    let out = controller(
        &[
            "graph",
            "--from-file",
            &data("graph-spec10.yaml"),
            "-o",
            "svg",
        ],
        Some(empty.to_str().unwrap()),
    );
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("Graphviz `dot` is not installed") && stderr.contains("-o dot"),
        "{stderr}"
    );
}

#[test]
fn other_objects_are_refused_naming_the_item() {
    let file = scratch("objects.yaml");
    std::fs::write(
        &file,
        "- {kind: WorkloadNetworkPolicyProposal, metadata: {name: p, namespace: a}, spec: {backend: kubernetes, direction: Ingress, targetRef: {kind: Deployment, name: x}}}\n- {kind: ConfigMap, metadata: {name: c}}\n",
    )
    .unwrap();
    let out = controller(&["graph", "--from-file", file.to_str().unwrap()], None);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("items[1].kind"), "{stderr}");
}

/// The same objects created in a namespace of the local cluster (status patched in), drawn by
/// `graph --namespace` through the kubeconfig.
#[tokio::test]
async fn reads_policies_proposals_and_violations_from_the_cluster() -> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams, PostParams};
    use network_enforcer_api::{WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
    use network_enforcer_tests::fixture::TestNamespace;

    let ns = TestNamespace::create_with_crds("graph").await?;
    let text = std::fs::read_to_string(data("graph-spec10.yaml"))?.replace(
        "namespace: demo, ownerKind",
        &format!("namespace: {}, ownerKind", ns.name),
    );
    let mut input = network_enforcer_controller::tools::graph::parse_objects(&text)?;
    let policies = ns.api::<WorkloadNetworkPolicy>();
    for policy in &mut input.policies {
        let status = policy.status.take();
        policy.metadata.namespace = Some(ns.name.clone());
        // The peers name namespace `demo`: point them at the test namespace.
        let spec =
            serde_json::to_string(&policy.spec)?.replace("\"demo\"", &format!("\"{}\"", ns.name));
        policy.spec = serde_json::from_str(&spec)?;
        let name = policy.metadata.name.clone().unwrap();
        policies.create(&PostParams::default(), policy).await?;
        if let Some(status) = status {
            policies
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({ "status": status })),
                )
                .await?;
        }
    }
    let proposals = ns.api::<WorkloadNetworkPolicyProposal>();
    for proposal in &mut input.proposals {
        proposal.metadata.namespace = Some(ns.name.clone());
        proposals.create(&PostParams::default(), proposal).await?;
    }

    let out = Command::new(env!("CARGO_BIN_EXE_network-enforcer-controller"))
        .args(["graph", "--namespace", &ns.name])
        .env("KUBECONFIG", ns.kubeconfig())
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dot = String::from_utf8(out.stdout)?;
    let n = &ns.name;
    let client = format!("\"w:{n}/Deployment/http-client\"");
    let server = format!("\"w:{n}/Deployment/http-server\"");
    let db = format!("\"w:{n}/StatefulSet/db\"");
    assert!(
        dot.contains(&format!("{client} -> {server} [label=\"TCP 18080\"];")),
        "{dot}"
    );
    assert!(
        dot.contains(&format!("{server} -> {db} [label=\"TCP 5432\"];")),
        "{dot}"
    );
    assert!(
        dot.contains(&format!(
            "{client} -> {server} [label=\"violation: UDP 18081 monitor\\nUDP 18081 protect\", color=red"
        )),
        "{dot}"
    );
    assert!(
        dot.contains("ingress: learning (statefulset-db-ingress)"),
        "{dot}"
    );
    assert!(
        dot.contains("egress: protect (deployment-http-client-egress)"),
        "{dot}"
    );
    Ok(())
}
