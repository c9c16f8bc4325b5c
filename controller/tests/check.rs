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

/// `--explain`: each side names the rule that allowed it, the policies that isolate it, or that nothing
/// does; without `--explain` the output is unchanged (the exact JSON above).
#[test]
fn explain_names_the_rule_or_the_isolation_of_each_side() {
    let out = check_json(&["--scenario", &data("check-spec10.yaml"), "--explain"]);
    let results = out["results"].as_array().unwrap();
    let egress = &results[0]["egress"];
    assert_eq!(egress["decision"], "allowed", "{out:#}");
    assert_eq!(
        egress["rules"],
        json!([{"kind": "WorkloadNetworkPolicy", "namespace": "demo",
                "name": "deployment-http-client-egress", "mode": "monitor", "index": 0,
                "rule": "egress[0] to app=http-server ns=demo TCP/18080"}])
    );
    assert_eq!(
        results[0]["ingress"]["rules"][0]["rule"],
        "ingress[0] from app=http-client ns=demo TCP/18080"
    );
    // DNS: the second egress rule; kube-dns is not isolated.
    assert_eq!(results[2]["egress"]["rules"][0]["index"], 1);
    assert_eq!(results[2]["ingress"]["decision"], "not_isolated");
    assert_eq!(results[2]["ingress"].get("rules"), None);
    // UDP 18081: isolated on both sides, no rules.
    for side in ["egress", "ingress"] {
        assert_eq!(results[1][side]["decision"], "isolated", "{out:#}");
        assert_eq!(results[1][side].get("rules"), None, "{out:#}");
    }

    // Two policies isolate db for UDP and none matches; istio names its rule.
    let mixed = check_json(&["--scenario", &data("check-mixed.json"), "--explain"]);
    let ingress = &mixed["results"][5]["ingress"];
    assert_eq!(ingress["decision"], "isolated");
    assert_eq!(
        ingress["policies"],
        json!([
            np("shop", "db-ingress"),
            wnp("shop", "deployment-db-ingress", "monitor")
        ])
    );
    assert_eq!(
        mixed["results"][3]["ingress"]["rules"][0]["rule"],
        "rules[0] from cluster.local/ns/shop/sa/web TCP/9000"
    );
}

#[test]
fn explain_table_has_an_egress_and_an_ingress_row_per_flow() {
    let out = controller(&[
        "check",
        "--scenario",
        &data("check-mixed.json"),
        "--explain",
        "-o",
        "table",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + 2 * 6, "{text}");
    assert!(lines[0].ends_with("VERDICT  SIDE     DECISION"), "{text}");
    assert!(
        lines[1].starts_with("shop/web-0") && lines[1].ends_with("egress   not isolated"),
        "{text}"
    );
    assert!(
        lines[2].ends_with(
            "ingress  allowed by np/shop/db-ingress ingress[0] from app=web ns=shop TCP/pg"
        ),
        "{text}"
    );
    assert!(
        lines[12].ends_with(
            "ingress  isolated by np/shop/db-ingress, wnp/shop/deployment-db-ingress; no rule matches"
        ),
        "{text}"
    );
}

/// `--diff-policies`: the flows whose decision changes, each side explained under the old and the new
/// policies; the results above stay those of the scenario's own policies.
#[test]
fn diff_policies_lists_the_flows_whose_decision_changes() {
    let args = [
        "--scenario",
        &data("check-spec10.yaml"),
        "--diff-policies",
        &data("check-spec10-new-policies.yaml"),
    ];
    let out = check_json(&args);
    assert_eq!(out["results"][1]["allowed"], false, "{out:#}");
    let diff = &out["diff"];
    assert_eq!(
        (diff["flows"].clone(), diff["unchanged"].clone()),
        (json!(5), json!(3))
    );
    let denied = diff["now_denied"].as_array().unwrap();
    assert_eq!(denied.len(), 1, "{diff:#}");
    assert_eq!(denied[0]["to"], json!({"ip": "10.244.0.2"}));
    assert_eq!(denied[0]["port"], 53);
    assert_eq!(
        denied[0]["old"]["egress"]["rules"][0]["rule"],
        "egress[1] to k8s-app=kube-dns ns=kube-system UDP/53"
    );
    assert_eq!(denied[0]["new"]["egress"]["decision"], "isolated");
    assert_eq!(denied[0]["new"]["allowed"], false);
    let allowed = diff["now_allowed"].as_array().unwrap();
    assert_eq!(allowed.len(), 1, "{diff:#}");
    assert_eq!(allowed[0]["protocol"], "UDP");
    assert_eq!(allowed[0]["port"], 18081);
    assert_eq!(allowed[0]["old"]["ingress"]["decision"], "isolated");
    assert_eq!(
        allowed[0]["new"]["ingress"]["rules"][0]["rule"],
        "ingress[1] from app=http-client ns=demo UDP/udp-echo"
    );

    let mut table_args = vec!["check"];
    table_args.extend_from_slice(&args);
    table_args.extend_from_slice(&["-o", "table"]);
    let out = controller(&table_args);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let diff_table: Vec<&str> = text.split("\n\n").nth(1).unwrap().lines().collect();
    assert_eq!(diff_table.len(), 1 + 2 * 4 + 1, "{text}");
    assert!(
        diff_table[1].starts_with('-') && diff_table[1].contains("10.244.0.2"),
        "{text}"
    );
    assert!(
        diff_table[2].ends_with(
            "new       isolated by wnp/demo/deployment-http-client-egress; no rule matches"
        ),
        "{text}"
    );
    assert!(diff_table[5].starts_with('+'), "{text}");
    assert_eq!(
        diff_table[9],
        "5 flow(s): 1 now denied, 1 now allowed, 3 unchanged"
    );
}

#[test]
fn invalid_diff_policies_fail_naming_the_file_and_the_field() {
    let dir = std::env::temp_dir().join(format!("ne-check-diff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = [
        (
            "bad-port.yaml",
            "- kind: NetworkPolicy\n  metadata: {name: n, namespace: demo}\n  spec: {ingress: [{ports: [{port: 0}]}]}\n",
            "policies[0].spec.ingress[0].ports[0].port",
        ),
        (
            "not-objects.yaml",
            "kind: List\nitems: 3\n",
            "document 1.items",
        ),
        (
            "kind.yaml",
            "{kind: Service, metadata: {name: s, namespace: demo}}",
            "policies[0].kind",
        ),
    ];
    for (name, content, field) in cases {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        let out = controller(&[
            "check",
            "--scenario",
            &data("check-spec10.yaml"),
            "--diff-policies",
            path.to_str().unwrap(),
        ]);
        assert!(!out.status.success(), "{name} was accepted");
        assert!(
            out.stdout.is_empty(),
            "{name}: nothing is printed on stdout"
        );
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(
            stderr.contains(&format!("invalid policies file {}", path.display()))
                && stderr.contains(field),
            "{name}: expected the file and {field:?} in:\n{stderr}"
        );
    }
    let out = controller(&["check", "--scenario", "-", "--diff-policies", "-"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("only one of --scenario"), "{stderr}");
}

/// Rule usage recorded in a policy's status (docs/api.md, "Rule usage") is shown per rule, in JSON and
/// as a table: when it last matched and how many peers, or that it never matched.
#[test]
fn rule_usage_from_the_status_is_shown_per_rule() {
    use network_enforcer_api::WorkloadNetworkPolicy;
    use network_enforcer_controller::policy::rule_usage::rules_of;
    let text = std::fs::read_to_string(data("check-spec10.yaml")).unwrap();
    let mut scenario: Value = serde_yaml::from_str(&text).unwrap();
    let egress = &mut scenario["policies"][0];
    let policy: WorkloadNetworkPolicy = serde_json::from_value(egress.clone()).unwrap();
    let rules = rules_of(&policy.spec);
    assert_eq!(rules.len(), 2, "TCP 18080 to the server, UDP 53 to DNS");
    let now = k8s_openapi::jiff::Timestamp::now();
    let two_hours_ago = now - k8s_openapi::jiff::SignedDuration::from_secs(2 * 3600 + 30);
    egress["status"] = json!({"ruleUsage": [
        {"direction": "Egress", "rule": 0, "fingerprint": rules[0].fingerprint,
         "lastMatched": two_hours_ago.to_string(), "peers": 3, "since": "2026-01-01T00:00:00Z"},
        {"direction": "Egress", "rule": 1, "fingerprint": rules[1].fingerprint,
         "peers": 0, "since": "2026-01-01T00:00:00Z"},
    ]});
    let file = std::env::temp_dir().join(format!("ne-check-usage-{}.json", std::process::id()));
    std::fs::write(&file, serde_json::to_string(&scenario).unwrap()).unwrap();
    let path = file.to_string_lossy().into_owned();

    let out = check_json(&["--scenario", &path]);
    let usage: Vec<(String, String, String, i64)> = out["ruleUsage"]
        .as_array()
        .expect("ruleUsage in the JSON")
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_string(),
                r["rule"].as_str().unwrap().to_string(),
                r["usage"].as_str().unwrap().to_string(),
                r["peers"].as_i64().unwrap(),
            )
        })
        .collect();
    let egress = "deployment-http-client-egress".to_string();
    assert_eq!(
        usage,
        [
            (
                egress.clone(),
                "egress[0]".into(),
                "last matched 2h ago, 3 peers".into(),
                3
            ),
            (egress, "egress[1]".into(), "never matched".into(), 0),
        ],
        "only the policy whose status has ruleUsage: {out:#}"
    );
    // The results are unchanged by it.
    assert_eq!(out["results"].as_array().unwrap().len(), 5);

    let out = controller(&["check", "--scenario", &path, "-o", "table"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let usage: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("POLICY"))
        .collect();
    assert_eq!(usage.len(), 3, "{text}");
    assert!(
        usage[1].contains("wnp/demo/deployment-http-client-egress")
            && usage[1].contains("egress[0]")
            && usage[1].contains("last matched 2h ago, 3 peers"),
        "{text}"
    );
    assert!(usage[2].ends_with("never matched"), "{text}");
    // Without ruleUsage in any status, nothing about usage is printed.
    let plain = check_json(&["--scenario", &data("check-spec10.yaml")]);
    assert!(plain.get("ruleUsage").is_none());
    let _ = std::fs::remove_file(file);
}
