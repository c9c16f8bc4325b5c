use super::*;

const FIXTURE: &str = r#"
- apiVersion: networkenforcer.kubewarden.io/v1alpha1
  kind: WorkloadNetworkPolicy
  metadata: {name: deployment-http-client-egress, namespace: demo}
  spec:
    backend: kubernetes
    mode: protect
    direction: Egress
    targetRef: {kind: Deployment, name: http-client}
    kubernetes:
      podSelector: {matchLabels: {app: http-client}}
      policyTypes: [Egress]
      egress:
        - to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: demo}}, podSelector: {matchLabels: {app: http-server}}}]
          ports: [{protocol: TCP, port: 18080}]
        - to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}]
          ports: [{protocol: UDP, port: 53}]
  status:
    violationCount: 2
    activeViolationCount: 1
    violations:
      - id: 1
        timestamp: "2026-11-29T16:00:00Z"
        source: {namespace: demo, ownerKind: Deployment, ownerName: http-client}
        dest: {namespace: demo, ownerKind: Deployment, ownerName: http-server}
        protocol: UDP
        dstPort: 18081
        action: protect
        direction: Egress
- apiVersion: networkenforcer.kubewarden.io/v1alpha1
  kind: WorkloadNetworkPolicyProposal
  metadata: {name: deployment-http-server-ingress, namespace: demo}
  spec:
    backend: kubernetes
    direction: Ingress
    targetRef: {kind: Deployment, name: http-server}
    kubernetes:
      podSelector: {matchLabels: {app: http-server}}
      policyTypes: [Ingress]
      ingress:
        - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: demo}}, podSelector: {matchLabels: {app: http-client}}}]
          ports: [{protocol: TCP, port: 18080}]
        - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]
          ports: [{port: http}]
"#;

/// Rule usage from a policy's status (docs/api.md, "Rule usage") is shown under the ports of the
/// edges its rules allow; a policy without it draws as before.
#[test]
fn rule_usage_is_shown_under_the_edges_it_allows() {
    let mut input = parse_objects(FIXTURE).unwrap();
    let plain = render_dot(&input, None);
    assert!(!plain.contains("matched"), "{plain}");
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
    let at =
        |secs: i64| Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 - secs).unwrap());
    let policy = &mut input.policies[0];
    let rules = rule_usage::rules_of(&policy.spec);
    policy
        .status
        .get_or_insert_with(Default::default)
        .rule_usage = vec![
        RuleUsage {
            direction: Direction::Egress,
            list: None,
            rule: 0,
            fingerprint: rules[0].fingerprint.clone(),
            last_matched: Some(at(2 * 3600 + 5)),
            peers: 3,
            since: at(30 * 86_400),
        },
        RuleUsage {
            direction: Direction::Egress,
            list: None,
            rule: 1,
            fingerprint: rules[1].fingerprint.clone(),
            last_matched: None,
            peers: 0,
            since: at(30 * 86_400),
        },
    ];
    let dot = render_dot_at(&input, None, &now);
    assert!(
            dot.contains(
                "\"w:demo/Deployment/http-client\" -> \"w:demo/Deployment/http-server\" [label=\"TCP 18080\\ndeployment-http-client-egress egress[0]: last matched 2h ago, 3 peers\"];"
            ),
            "{dot}"
        );
    assert!(
        dot.contains(
            "[label=\"UDP 53\\ndeployment-http-client-egress egress[1]: never matched\"];"
        ),
        "{dot}"
    );
    to_svg(&dot).unwrap();
}

/// A named port is text from the cluster: a backslash or quote in it must stay inside the label
/// (unescaped, `x\` ended the label early and broke `graph -o svg`).
#[test]
fn port_names_are_escaped_in_edge_labels() {
    let fixture = FIXTURE.replace("ports: [{port: http}]", r#"ports: [{port: 'ht\tp"x\'}]"#);
    let input = parse_objects(&fixture).unwrap();
    let dot = render_dot(&input, None);
    assert!(dot.contains(r#"[label="TCP ht\\tp\"x\\"];"#), "{dot}");
    to_svg(&dot).unwrap();
}

/// The DOT text outside quoted strings (where attributes are), or `None` when a string is left
/// open. Reads strings as Graphviz does: `\"` is a quote inside the string, `\\` a backslash.
fn outside_strings(dot: &str) -> Option<String> {
    let mut outside = String::new();
    let mut chars = dot.chars();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        match (in_string, c) {
            (true, '\\') => {
                chars.next();
            }
            (_, '"') => in_string = !in_string,
            (true, _) => {}
            (false, c) => outside.push(c),
        }
    }
    (!in_string).then_some(outside)
}

/// Every text of the objects that reaches a label or an id: a quote, a backslash before the
/// closing quote, or a line break must neither end the string early (`graph -o svg` failed) nor
/// let the text add attributes of its own.
#[test]
fn every_text_from_the_objects_is_escaped() {
    // Unescaped, the quote ends the string (the rest becomes an attribute) and the backslash
    // escapes the closing quote.
    const HOSTILE: &str = r#"x" evil=1 [\"#;
    let quoted = format!("'{HOSTILE}'");
    let mesh = "
- apiVersion: networkenforcer.kubewarden.io/v1alpha1
  kind: WorkloadNetworkPolicy
  metadata: {name: mesh, namespace: demo}
  spec:
    backend: istio
    mode: monitor
    direction: Ingress
    targetRef: {kind: Deployment, name: mesh}
    istio:
      selector: {matchLabels: {app: mesh}}
      rules: [{from: [{source: {principals: [PRINCIPAL]}}], to: [{operation: {ports: [PORT]}}]}]
";
    let fixture = format!("{FIXTURE}{mesh}");
    let cases = [
        ("policy name", "name: deployment-http-client-egress,"),
        ("proposal name", "name: deployment-http-server-ingress,"),
        (
            "namespace",
            "namespace: demo}\n  spec:\n    backend: kubernetes\n    mode",
        ),
        (
            "target name",
            "targetRef: {kind: Deployment, name: http-server}",
        ),
        ("selector value", "{k8s-app: kube-dns}"),
        ("selector key", "{k8s-app: kube-dns}"),
        ("cidr", "cidr: 10.0.0.0/8"),
        ("except", "except: [10.1.0.0/16]"),
        ("named port", "ports: [{port: http}]"),
        (
            "violation owner kind",
            "ownerKind: Deployment, ownerName: http-client}",
        ),
        ("violation owner name", "ownerName: http-server}"),
        (
            "violation address",
            "dest: {namespace: demo, ownerKind: Deployment, ownerName: http-server}",
        ),
        (
            "violation identity",
            "dest: {namespace: demo, ownerKind: Deployment, ownerName: http-server}",
        ),
        ("istio principal", "PRINCIPAL"),
        ("istio port", "PORT"),
    ];
    for (what, from) in cases {
        let to = match what {
            "policy name" | "proposal name" => format!("name: {quoted},"),
            "namespace" => from.replace("demo", &quoted),
            "target name" => format!("targetRef: {{kind: Deployment, name: {quoted}}}"),
            "selector value" => format!("{{k8s-app: {quoted}}}"),
            "selector key" => format!("{{{quoted}: kube-dns}}"),
            "cidr" => format!("cidr: {quoted}"),
            "except" => format!("except: [{quoted}]"),
            "named port" => format!("ports: [{{port: {quoted}}}]"),
            "violation owner kind" => format!("ownerKind: {quoted}, ownerName: http-client}}"),
            "violation owner name" => format!("ownerName: {quoted}}}"),
            "violation address" => format!("dest: {{address: {quoted}}}"),
            "violation identity" => format!("dest: {{identity: {quoted}}}"),
            _ => quoted.clone(),
        };
        assert_eq!(
            fixture.matches(from).count(),
            1,
            "{what}: {from:?} is not unique"
        );
        let text = fixture
            .replace(from, &to)
            .replace("PRINCIPAL", "p")
            .replace("PORT", "'80'");
        let input = parse_objects(&text).unwrap_or_else(|e| panic!("{what}: {e}"));
        let dot = render_dot(&input, None);
        assert!(
            dot.contains("evil=1"),
            "{what}: the text reaches the graph:\n{dot}"
        );
        let outside = outside_strings(&dot)
            .unwrap_or_else(|| panic!("{what}: a string is left open:\n{dot}"));
        assert!(
            !outside.contains("evil"),
            "{what}: the text escaped its string:\n{dot}"
        );
        to_svg(&dot).unwrap_or_else(|e| panic!("{what}: dot refuses the graph: {e}\n{dot}"));
    }
}

#[test]
fn renders_workloads_modes_edges_and_violations() {
    let input = parse_objects(FIXTURE).unwrap();
    assert_eq!((input.policies.len(), input.proposals.len()), (1, 1));
    let dot = render_dot(&input, None);
    let client = "\"w:demo/Deployment/http-client\"";
    let server = "\"w:demo/Deployment/http-server\"";
    // Both rules for client → server merge into one edge with its port.
    assert!(
        dot.contains(&format!("{client} -> {server} [label=\"TCP 18080\"];")),
        "{dot}"
    );
    assert_eq!(
        dot.matches(&format!("{client} -> {server} [label=\"TCP"))
            .count(),
        1
    );
    assert!(
            dot.contains(
                "\"w:demo/Deployment/http-client\" -> \"s:kube-system/{k8s-app=kube-dns}\" [label=\"UDP 53\"];"
            ),
            "{dot}"
        );
    assert!(
            dot.contains("\"x:10.0.0.0/8 except 10.1.0.0/16\" -> \"w:demo/Deployment/http-server\" [label=\"TCP http\"];"),
            "{dot}"
        );
    // Modes on the nodes.
    assert!(
            dot.contains("label=\"Deployment\\nhttp-client\\negress: protect (deployment-http-client-egress)\", color=blue, style=\"rounded,bold\""),
            "{dot}"
        );
    assert!(
            dot.contains("label=\"Deployment\\nhttp-server\\ningress: learning (deployment-http-server-ingress)\", color=black, style=\"rounded,dashed\""),
            "{dot}"
        );
    // The violation in red.
    assert!(
        dot.contains(&format!(
            "{client} -> {server} [label=\"violation: UDP 18081 protect\", color=red"
        )),
        "{dot}"
    );
    // Namespaces are clusters.
    assert!(dot.contains("label=\"namespace demo\""), "{dot}");
    assert!(dot.contains("label=\"namespace kube-system\""), "{dot}");
    assert!(dot.starts_with("digraph workloads {") && dot.ends_with("}\n"));
}

/// The usage of an `egressNames` entry shows under the edges to its names.
#[test]
fn rule_usage_of_a_name_entry_is_shown_under_its_names() {
    let mut input = parse_objects(FIXTURE).unwrap();
    let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap());
    let policy = &mut input.policies[0];
    policy.spec.egress_names = serde_json::from_value(serde_json::json!([
        {"names": ["api.example.test"], "ports": [{"protocol": "TCP", "port": 443}]}
    ]))
    .unwrap();
    let rules = rule_usage::rules_of(&policy.spec);
    let name_rule = rules.last().unwrap();
    assert_eq!(name_rule.name(), "egressNames[0]");
    policy
        .status
        .get_or_insert_with(Default::default)
        .rule_usage = vec![RuleUsage {
        direction: Direction::Egress,
        list: name_rule.list,
        rule: 0,
        fingerprint: name_rule.fingerprint.clone(),
        last_matched: Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 - 120).unwrap(),
        )),
        peers: 2,
        since: now.clone(),
    }];
    let dot = render_dot_at(&input, None, &now);
    assert!(
            dot.contains(
                "\"w:demo/Deployment/http-client\" -> \"n:api.example.test\" [label=\"TCP 443\\ndeployment-http-client-egress egressNames[0]: last matched 2m ago, 2 peers\"];"
            ),
            "{dot}"
        );
}

/// Names of outside services: an `egressNames` entry is an edge to each of its names, and a
/// violation to an address the pod resolved from a name goes to that name, its addresses under it.
#[test]
fn outside_services_are_drawn_by_name_with_their_addresses() {
    let mut input = parse_objects(FIXTURE).unwrap();
    let policy = &mut input.policies[0];
    policy.spec.egress_names = serde_json::from_value(serde_json::json!([
        {"names": ["api.example.test", "*.storage.example.test"],
         "ports": [{"protocol": "TCP", "port": 443}]}
    ]))
    .unwrap();
    let status = policy.status.as_mut().unwrap();
    let violation = status.violations[0].clone();
    for (i, (address, name)) in [
        ("203.0.113.10", "other.example.test"),
        ("203.0.113.11", "other.example.test"),
        ("198.51.100.1", ""),
    ]
    .into_iter()
    .enumerate()
    {
        let mut v = violation.clone();
        v.id = 2 + i as i64;
        v.protocol = Protocol::TCP;
        v.dst_port = Some(443);
        v.dest = WorkloadRef {
            address: address.into(),
            dns_name: name.into(),
            ..WorkloadRef::default()
        };
        status.violations.push(v);
    }
    let dot = render_dot(&input, None);
    let client = "\"w:demo/Deployment/http-client\"";
    for name in ["api.example.test", "*.storage.example.test"] {
        assert!(
            dot.contains(&format!("{client} -> \"n:{name}\" [label=\"TCP 443\"];")),
            "{name}: {dot}"
        );
    }
    assert!(
        dot.contains(&format!(
            "{client} -> \"n:other.example.test\" [label=\"violation: TCP 443 protect\", color=red"
        )),
        "{dot}"
    );
    assert!(
            dot.contains("\"n:other.example.test\" [label=\"other.example.test\\n(203.0.113.10, 203.0.113.11)\", shape=ellipse"),
            "{dot}"
        );
    // An address no pod resolved stays an address.
    assert!(
        dot.contains(&format!(
            "{client} -> \"x:198.51.100.1\" [label=\"violation"
        )),
        "{dot}"
    );
    to_svg(&dot).unwrap_or_else(|e| panic!("dot refuses the graph: {e}\n{dot}"));
    let model = model(&input, None);
    let node = model
        .nodes
        .iter()
        .find(|n| n.id == "n:other.example.test")
        .unwrap();
    assert_eq!(
        (node.kind, node.name.as_str(), node.addresses.as_slice()),
        (
            "name",
            "other.example.test",
            &["203.0.113.10".to_string(), "203.0.113.11".to_string()][..]
        )
    );
    let named = model
        .edges
        .iter()
        .find(|e| e.to == "n:api.example.test")
        .unwrap();
    assert_eq!(
        named.allowed_by,
        [("deployment-http-client-egress".to_string(), "protect")]
    );
}

#[test]
fn namespace_filter_and_promoted_proposals() {
    let input = parse_objects(FIXTURE).unwrap();
    assert!(!render_dot(&input, Some("other")).contains("->"));
    // A proposal of the same target and direction as a policy is hidden behind it.
    let mut input = input;
    let mut promoted = input.proposals[0].clone();
    promoted.spec.target_ref.name = "http-client".into();
    promoted.spec.direction = Direction::Egress;
    promoted.metadata.name = Some("stale".into());
    input.proposals.push(promoted);
    let dot = render_dot(&input, Some("demo"));
    assert!(!dot.contains("stale"), "{dot}");
}

#[test]
fn other_kinds_are_refused_with_the_item() {
    let err = parse_objects("- {kind: Service, metadata: {name: x}}\n").unwrap_err();
    assert_eq!(err.field, "items[0].kind");
    let err = parse_objects("kind: List\nitems:\n- kind: WorkloadNetworkPolicy\n  metadata: {name: x}\n  spec: {backend: nope}\n").unwrap_err();
    assert!(err.field.starts_with("items[0].spec"), "{err}");
}
