//! `network-enforcer-controller check`: the real binary on scenario files under tests/data.

use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Command, Output};

fn data(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn controller(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_network-enforcer-controller"))
        .args(args)
        .output()
        .expect("the controller binary runs")
}

/// Runs `check` and parses its JSON output; the run must succeed.
fn check_json(args: &[&str]) -> Value {
    let mut all = vec!["check"];
    all.extend_from_slice(args);
    let out = controller(&all);
    assert!(
        out.status.success(),
        "check failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("check prints JSON")
}

fn wnp(namespace: &str, name: &str, mode: &str) -> Value {
    json!({"kind": "WorkloadNetworkPolicy", "namespace": namespace, "name": name, "mode": mode})
}

fn np(namespace: &str, name: &str) -> Value {
    json!({"kind": "NetworkPolicy", "namespace": namespace, "name": name})
}

fn side(allowed: bool, policies: Vec<Value>) -> Value {
    json!({"allowed": allowed, "policies": policies})
}

const CLIENT: &str = "demo/http-client-6c7d9f8b5-x2x7k";
const SERVER: &str = "demo/http-server-5b9c8d7f6-q8w4r";

#[test]
fn spec10_scenario_denies_udp_18081_on_both_policies() {
    let out = check_json(&["--scenario", &data("check-spec10.yaml")]);
    let egress = || wnp("demo", "deployment-http-client-egress", "monitor");
    let ingress = || wnp("demo", "deployment-http-server-ingress", "protect");
    let expected = json!({"results": [
        {"from": {"pod": CLIENT}, "to": {"pod": SERVER}, "protocol": "TCP", "port": 18080,
         "allowed": true, "egress": side(true, vec![egress()]), "ingress": side(true, vec![ingress()])},
        {"from": {"pod": CLIENT}, "to": {"pod": SERVER}, "protocol": "UDP", "port": 18081,
         "allowed": false, "egress": side(false, vec![egress()]), "ingress": side(false, vec![ingress()])},
        {"from": {"pod": CLIENT}, "to": {"ip": "10.244.0.2"}, "protocol": "UDP", "port": 53,
         "allowed": true, "egress": side(true, vec![egress()]), "ingress": side(true, vec![])},
        {"from": {"ip": "10.244.0.10"}, "to": {"pod": SERVER}, "protocol": "TCP", "port": 18082,
         "allowed": false, "egress": side(false, vec![egress()]), "ingress": side(false, vec![ingress()])},
        {"from": {"pod": CLIENT}, "to": {"ip": "203.0.113.7"}, "protocol": "TCP", "port": 443,
         "allowed": false, "egress": side(false, vec![egress()]), "ingress": side(true, vec![])},
    ]});
    assert_eq!(
        out,
        expected,
        "{}",
        serde_json::to_string_pretty(&out).unwrap()
    );
}

#[test]
fn mixed_json_scenario_named_ports_ip_blocks_additive_allows_and_istio() {
    let out = check_json(&["--scenario", &data("check-mixed.json"), "-o", "json"]);
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), 6);
    let verdicts: Vec<(bool, Value, Value)> = results
        .iter()
        .map(|r| {
            (
                r["allowed"].as_bool().unwrap(),
                r["egress"].clone(),
                r["ingress"].clone(),
            )
        })
        .collect();
    let db_wnp = || wnp("shop", "deployment-db-ingress", "monitor");
    let api_wnp = || wnp("shop", "deployment-api-ingress", "protect");
    assert_eq!(
        verdicts,
        vec![
            // web → db 5432: the hand-written NetworkPolicy allows it by its named port.
            (
                true,
                side(true, vec![]),
                side(true, vec![np("shop", "db-ingress")])
            ),
            // probe → db: the ipBlock except denies egress; ingress allowed by the WNP (team=b).
            (
                false,
                side(false, vec![np("other", "probe-egress")]),
                side(true, vec![db_wnp()])
            ),
            // probe → web 8080: inside the CIDR and the endPort range; web is not isolated.
            (
                true,
                side(true, vec![np("other", "probe-egress")]),
                side(true, vec![])
            ),
            // web → api: web's identity is the allowed principal.
            (true, side(true, vec![]), side(true, vec![api_wnp()])),
            // probe → api: no identity, the AuthorizationPolicy denies.
            (
                false,
                side(true, vec![np("other", "probe-egress")]),
                side(false, vec![api_wnp()])
            ),
            // web → db UDP: neither the named TCP port nor the TCP 5432 rule matches.
            (
                false,
                side(true, vec![]),
                side(false, vec![np("shop", "db-ingress"), db_wnp()])
            ),
        ]
    );
    // Results come back in input order with the flow echoed.
    assert_eq!(results[1]["from"], json!({"pod": "other/probe-0"}));
    assert_eq!(results[5]["protocol"], "UDP");
}

#[test]
fn table_output_has_one_row_per_flow() {
    let out = controller(&[
        "check",
        "--scenario",
        &data("check-spec10.yaml"),
        "-o",
        "table",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    assert!(lines[0].starts_with("FROM"), "{text}");
    assert!(
        lines[2].contains("UDP")
            && lines[2].contains("18081")
            && lines[2].contains("DENY")
            && lines[2].contains("wnp/demo/deployment-http-client-egress"),
        "{text}"
    );
    assert!(lines[1].contains("ALLOW"), "{text}");
}

/// Counts are read from a file: the two copies of one flow (client and server) with the largest count
/// add up without overflowing (this used to panic).
#[test]
fn replay_counts_saturate_instead_of_overflowing() {
    let records = std::fs::read_to_string(data("records-spec10.jsonl")).unwrap();
    let huge = records
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            v["count"] = json!(u64::MAX);
            v.to_string()
        })
        .collect::<Vec<_>>()
        .join("\n");
    let path = std::env::temp_dir().join(format!("ne-check-huge-{}.jsonl", std::process::id()));
    std::fs::write(&path, huge).unwrap();
    let out = check_json(&[
        "--scenario",
        &data("check-spec10.yaml"),
        "--flows-from",
        &path.to_string_lossy(),
    ]);
    let _ = std::fs::remove_file(&path);
    let deny = out["replay"]["would_deny"].as_array().unwrap();
    assert_eq!(deny.len(), 1, "{out:#}");
    assert_eq!(deny[0]["passed"], json!(u64::MAX));
}

#[test]
fn replay_prints_the_would_deny_diff() {
    let out = check_json(&[
        "--scenario",
        &data("check-spec10.yaml"),
        "--flows-from",
        &data("records-spec10.jsonl"),
    ]);
    let replay = &out["replay"];
    assert_eq!(replay["records"], 6);
    // The client's outbound and the server's inbound copy of TCP 18080 are one flow.
    assert_eq!(replay["flows"], 5);
    let deny = replay["would_deny"].as_array().unwrap();
    assert_eq!(deny.len(), 1, "{replay:#}");
    assert_eq!(deny[0]["from"], json!({"pod": CLIENT}));
    assert_eq!(deny[0]["to"], json!({"pod": SERVER}));
    assert_eq!(deny[0]["protocol"], "UDP");
    assert_eq!(deny[0]["port"], 18081);
    assert_eq!(deny[0]["passed"], 1);
    assert_eq!(deny[0]["egress"]["allowed"], false);
    assert_eq!(deny[0]["ingress"]["allowed"], false);
    // A connection that only failed and that the policies allow (the second server replica).
    let allow = replay["would_allow"].as_array().unwrap();
    assert_eq!(allow.len(), 1, "{replay:#}");
    assert_eq!(
        allow[0]["to"],
        json!({"pod": "demo/http-server-5b9c8d7f6-z9v2m"})
    );
    assert_eq!(allow[0]["failed"], 1);
    // TCP 18080, DNS, and the failed TCP 18082 (still denied) are unchanged.
    assert_eq!(replay["unchanged"], 3);

    let table = controller(&[
        "check",
        "--scenario",
        &data("check-spec10.yaml"),
        "--flows-from",
        &data("records-spec10.jsonl"),
        "-o",
        "table",
    ]);
    let text = String::from_utf8(table.stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with('-') && l.contains("18081") && l.contains("UDP")),
        "{text}"
    );
    assert!(
        text.contains("6 record(s), 5 flow(s): 1 would be denied, 1 would be allowed, 3 unchanged"),
        "{text}"
    );
}

/// Writes `content` to a fresh file and runs `check` on it; the run must fail.
fn check_fails(name: &str, content: &str, extra: &[&str]) -> String {
    let dir = std::env::temp_dir().join(format!("ne-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    let mut args = vec!["check", "--scenario", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = controller(&args);
    assert!(!out.status.success(), "{name} was accepted");
    assert!(
        out.stdout.is_empty(),
        "{name}: nothing is printed on stdout"
    );
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn invalid_scenarios_fail_naming_the_field() {
    let pods = "pods:\n- {namespace: a, name: p, ip: 10.0.0.1}\n";
    let cases: &[(&str, String, &str)] = &[
        (
            "port-type.yaml",
            format!("{pods}flows:\n- from: {{pod: a/p}}\n  to: {{ip: 10.0.0.9}}\n  port: http\n"),
            "flows[0].port",
        ),
        (
            "port-zero.yaml",
            format!("{pods}flows:\n- from: {{pod: a/p}}\n  to: {{ip: 10.0.0.9}}\n  port: 0\n"),
            "flows[0].port: must be between 1 and 65535",
        ),
        (
            "unknown-pod.yaml",
            format!("{pods}flows:\n- from: {{pod: a/p}}\n  to: {{pod: a/q}}\n  port: 80\n"),
            "flows[0].to.pod: no pod a/q in `pods`",
        ),
        (
            "both.yaml",
            format!(
                "{pods}flows:\n- from: {{pod: a/p, ip: 10.0.0.1}}\n  to: {{ip: 10.0.0.9}}\n  port: 80\n"
            ),
            "flows[0].from: exactly one of `pod` or `ip`",
        ),
        (
            "protocol.yaml",
            format!(
                "{pods}flows:\n- from: {{pod: a/p}}\n  to: {{ip: 10.0.0.9}}\n  protocol: ICMP\n  port: 80\n"
            ),
            "flows[0].protocol",
        ),
        (
            "bad-ip.yaml",
            "pods:\n- {namespace: a, name: p, ip: 10.0.0.300}\n".to_string(),
            "pods[0].ip",
        ),
        (
            "unknown-field.yaml",
            "pods:\n- {namespace: a, name: p, lables: {app: x}}\n".to_string(),
            "pods[0].lables: unknown field `lables`",
        ),
        (
            "kind.yaml",
            "policies:\n- {kind: Service, metadata: {name: s, namespace: a}}\n".to_string(),
            "policies[0].kind",
        ),
        (
            "payload.yaml",
            "policies:\n- kind: WorkloadNetworkPolicy\n  metadata: {name: w, namespace: a}\n  spec: {backend: kubernetes, direction: Egress, targetRef: {kind: Deployment, name: x}}\n".to_string(),
            "policies[0].spec.kubernetes: required for backend kubernetes",
        ),
        (
            "np-port.yaml",
            "policies:\n- kind: NetworkPolicy\n  metadata: {name: n, namespace: a}\n  spec:\n    ingress: [{ports: [{port: [1]}]}]\n".to_string(),
            "policies[0].spec.ingress[0].ports[0].port",
        ),
        (
            "namespace.yaml",
            "policies:\n- kind: NetworkPolicy\n  metadata: {name: n}\n".to_string(),
            "policies[0].metadata.namespace: must not be empty",
        ),
        (
            "duplicate.yaml",
            "pods:\n- {namespace: a, name: p}\n- {namespace: a, name: p}\n".to_string(),
            "pods[1].name: pod a/p is listed twice",
        ),
        ("syntax.yaml", "pods: [\n".to_string(), "invalid YAML"),
        ("syntax.json", "{\"pods\": [}".to_string(), "invalid JSON"),
    ];
    for (name, content, expected) in cases {
        let stderr = check_fails(name, content, &[]);
        assert!(
            stderr.contains(expected),
            "{name}: expected {expected:?} in:\n{stderr}"
        );
        assert!(
            stderr.contains(name),
            "{name}: the file is named:\n{stderr}"
        );
    }
}

#[test]
fn invalid_records_fail_naming_the_line() {
    let dir = std::env::temp_dir().join(format!("ne-check-records-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("records.jsonl");
    std::fs::write(
        &path,
        "{\"local_ip\":\"10.0.0.1\",\"peer_ip\":\"10.0.0.2\",\"port\":80,\"protocol\":\"tcp\",\"direction\":\"outbound\",\"outcome\":\"established\"}\n\
         {\"local_ip\":\"10.0.0.1\",\"peer_ip\":\"10.0.0.2\",\"port\":80,\"protocol\":\"tcp\",\"direction\":\"sideways\",\"outcome\":\"established\"}\n",
    )
    .unwrap();
    let out = controller(&[
        "check",
        "--scenario",
        &data("check-spec10.yaml"),
        "--flows-from",
        path.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("line 2.direction"), "{stderr}");
}
