use super::*;

#[test]
fn errors_name_the_field() {
    let err = parse_scenario("flows:\n- from: {pod: a/b}\n  to: {ip: 10.0.0.1}\n  port: x\n")
        .unwrap_err();
    assert_eq!(err.field, "flows[0].port", "{err}");
    // Found by the fuzz tests: an empty key left the field empty.
    let err = parse_scenario(r#"{"": null}"#).unwrap_err();
    assert_eq!(err.field, ".", "{err}");
    let err = parse_records(r#"{"": null}"#).unwrap_err();
    assert_eq!(err.field, "line 1", "{err}");
    let err = parse_scenario("{\"\\n\": null}").unwrap_err();
    assert_eq!(err.field, r#""\n""#, "{err}");
    let scenario = parse_scenario(
        "pods: [{namespace: a, name: b}]\nflows:\n- from: {pod: a/c}\n  to: {ip: 10.0.0.1}\n  port: 80\n",
    )
    .unwrap();
    let err = Checker::new(scenario).err().unwrap();
    assert_eq!(err.field, "flows[0].from.pod", "{err}");
    let scenario = parse_scenario(
        "policies:\n- kind: NetworkPolicy\n  metadata: {name: x, namespace: a}\n  spec:\n    ingress: [{ports: [{port: {}}]}]\n",
    )
    .unwrap();
    let err = Checker::new(scenario).err().unwrap();
    assert_eq!(
        err.field, "policies[0].spec.ingress[0].ports[0].port",
        "{err}"
    );
}

/// Policies the API server would refuse are refused, not evaluated (the rules themselves are
/// tabled in `validate`): NetworkPolicies, the NetworkPolicy a WorkloadNetworkPolicy renders, and
/// the CRDs' own rules.
#[test]
fn policies_the_api_server_refuses_are_refused_naming_the_field() {
    let wnp = |kubernetes: &str| {
        format!(
            "- kind: WorkloadNetworkPolicy\n  metadata: {{name: w, namespace: a}}\n  spec:\n    backend: kubernetes\n    direction: Ingress\n    targetRef: {{kind: Deployment, name: x}}\n    kubernetes: {kubernetes}\n"
        )
    };
    let np = |name: &str, spec: &str| {
        format!(
            "- kind: NetworkPolicy\n  metadata: {{name: {name}, namespace: a}}\n  spec: {spec}\n"
        )
    };
    let valid = np("ok", "{podSelector: {}}");
    let cases = [
        (
            format!(
                "{valid}{valid_2}{bad}",
                valid_2 = np("ok2", "{ingress: [{ports: [{port: 80}]}]}"),
                bad = np(
                    "bad",
                    "{ingress: [{ports: [{port: 80}, {port: 90, endPort: 89}]}]}"
                )
            ),
            "policies[2].spec.ingress[0].ports[1].endPort",
        ),
        (np("Bad", "{}"), "policies[0].metadata.name"),
        (
            np(
                "n",
                "{egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]}",
            ),
            "policies[0].spec.egress[0].to[0].ipBlock.except[0]",
        ),
        (
            wnp(
                "{podSelector: {matchLabels: {app: x}}, policyTypes: [Ingress], ingress: [{ports: [{port: \"HTTP\"}]}]}",
            ),
            "policies[0].spec.kubernetes.ingress[0].ports[0].port",
        ),
        (
            wnp("{podSelector: {}, policyTypes: [Ingress]}"),
            "policies[0].spec",
        ),
    ];
    for (policies, field) in cases {
        let scenario = parse_scenario(&format!("policies:\n{policies}")).unwrap();
        let err = Checker::new(scenario).err().expect(field);
        assert_eq!(err.field, field, "{err}");
    }
    let scenario = parse_scenario(&format!("policies:\n{valid}")).unwrap();
    assert!(Checker::new(scenario).is_ok());
}

/// `--explain`, side by side: the rule that allows (egress and ingress, every matching rule of
/// every allowing policy), the policies that isolate without a matching rule, or no isolation.
#[test]
fn explain_names_the_rule_the_isolation_or_none() {
    let pods = "pods:\n\
            - {namespace: shop, name: web, labels: {app: web}, serviceAccount: web}\n\
            - {namespace: shop, name: db, labels: {app: db}, ports: [{name: pg, containerPort: 5432}]}\n\
            - {namespace: shop, name: api, labels: {app: api}}\n";
    let np = |name: &str, spec: &str| {
        format!(
            "- {{kind: NetworkPolicy, metadata: {{name: {name}, namespace: shop}}, spec: {spec}}}\n"
        )
    };
    let db_ingress = np(
        "db-ingress",
        "{podSelector: {matchLabels: {app: db}}, ingress: [{from: [{podSelector: {matchLabels: {app: api}}}]}, {from: [{podSelector: {matchLabels: {app: web}}}], ports: [{port: pg}]}]}",
    );
    let deny_all = np("deny-all", "{podSelector: {}}");
    let web_egress = np(
        "web-egress",
        "{podSelector: {matchLabels: {app: web}}, policyTypes: [Egress], egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8}}], ports: [{port: 443}]}, {ports: [{protocol: UDP, port: 53}]}]}",
    );
    let web_egress_wnp = "- kind: WorkloadNetworkPolicy\n  metadata: {name: web-egress, namespace: shop}\n  spec:\n    backend: kubernetes\n    mode: monitor\n    direction: Egress\n    targetRef: {kind: Deployment, name: web}\n    kubernetes: {podSelector: {matchLabels: {app: web}}, policyTypes: [Egress], egress: [{to: [{podSelector: {matchLabels: {app: db}}}], ports: [{port: 5432}]}]}\n";
    let api_istio = "- kind: WorkloadNetworkPolicy\n  metadata: {name: api-istio, namespace: shop}\n  spec:\n    backend: istio\n    direction: Ingress\n    targetRef: {kind: Deployment, name: api}\n    istio: {selector: {matchLabels: {app: api}}, rules: [{from: [{source: {principals: [cluster.local/ns/shop/sa/db]}}]}, {from: [{source: {principals: [cluster.local/ns/shop/*]}}], to: [{operation: {ports: ['80']}}]}]}\n";
    let flow =
        |from: &str, to: &str, port: u16| format!("- {{from: {from}, to: {to}, port: {port}}}\n");
    let web_to_db = flow("{pod: shop/web}", "{pod: shop/db}", 5432);
    // Name, policies, flow, and the expected egress and ingress explanations.
    type Case = (
        &'static str,
        String,
        String,
        (Decision, &'static str),
        (Decision, &'static str),
    );
    let cases: Vec<Case> = vec![
        (
            "no policy: neither side is isolated",
            String::new(),
            web_to_db.clone(),
            (Decision::NotIsolated, "not isolated"),
            (Decision::NotIsolated, "not isolated"),
        ),
        (
            "ingress allowed by the second rule, by its named port",
            db_ingress.clone(),
            web_to_db.clone(),
            (Decision::NotIsolated, "not isolated"),
            (
                Decision::Allowed,
                "allowed by np/shop/db-ingress ingress[1] from app=web ns=shop TCP/pg",
            ),
        ),
        (
            "ingress denied: two policies isolate, no rule matches",
            format!("{db_ingress}{deny_all}"),
            flow("{pod: shop/web}", "{pod: shop/db}", 5433),
            (Decision::NotIsolated, "not isolated"),
            (
                Decision::Isolated,
                "isolated by np/shop/db-ingress, np/shop/deny-all; no rule matches",
            ),
        ),
        (
            "egress allowed by an ipBlock rule; the address is no pod",
            web_egress.clone(),
            flow("{pod: shop/web}", "{ip: 10.9.9.9}", 443),
            (
                Decision::Allowed,
                "allowed by np/shop/web-egress egress[0] to 10.0.0.0/8 TCP/443",
            ),
            (Decision::NotIsolated, "not isolated"),
        ),
        (
            "egress denied, ingress allowed by every rule that matches",
            format!(
                "{web_egress}{}",
                np(
                    "db-open",
                    "{podSelector: {}, ingress: [{}, {ports: [{port: 5432}]}]}"
                )
            ),
            web_to_db.clone(),
            (
                Decision::Isolated,
                "isolated by np/shop/web-egress; no rule matches",
            ),
            (
                Decision::Allowed,
                "allowed by np/shop/db-open ingress[0] from anywhere all ports; np/shop/db-open ingress[1] from anywhere TCP/5432",
            ),
        ),
        (
            "a kubernetes WorkloadNetworkPolicy is named as one",
            web_egress_wnp.to_string(),
            web_to_db.clone(),
            (
                Decision::Allowed,
                "allowed by wnp/shop/web-egress egress[0] to app=db ns=shop TCP/5432",
            ),
            (Decision::NotIsolated, "not isolated"),
        ),
        (
            "istio: the AuthorizationPolicy allows by its second rule",
            api_istio.to_string(),
            flow("{pod: shop/web}", "{pod: shop/api}", 80),
            (Decision::NotIsolated, "not isolated"),
            (
                Decision::Allowed,
                "allowed by wnp/shop/api-istio rules[1] from cluster.local/ns/shop/* TCP/80",
            ),
        ),
        (
            "istio denies what no NetworkPolicy isolates",
            api_istio.to_string(),
            flow("{ip: 192.0.2.1}", "{pod: shop/api}", 80),
            (Decision::NotIsolated, "not isolated"),
            (
                Decision::Isolated,
                "isolated by wnp/shop/api-istio; no rule matches",
            ),
        ),
        (
            "istio denies what a NetworkPolicy allows: only the denying policy is named",
            format!(
                "{api_istio}{}",
                np(
                    "api-open",
                    "{podSelector: {matchLabels: {app: api}}, ingress: [{}]}"
                )
            ),
            flow("{ip: 192.0.2.1}", "{pod: shop/api}", 80),
            (Decision::NotIsolated, "not isolated"),
            (
                Decision::Isolated,
                "isolated by wnp/shop/api-istio; no rule matches",
            ),
        ),
    ];
    for (name, policies, flow, egress, ingress) in cases {
        let policies = if policies.is_empty() {
            "policies: []\n".to_string()
        } else {
            format!("policies:\n{policies}")
        };
        let scenario = parse_scenario(&format!("{pods}{policies}flows:\n{flow}"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let checker = Checker::new(scenario).unwrap_or_else(|e| panic!("{name}: {e}"));
        let explained = checker.explain();
        let result = &explained.results[0];
        for (side, (decision, text)) in [(&result.egress, egress), (&result.ingress, ingress)] {
            assert_eq!(side.decision, Some(decision), "{name}");
            assert_eq!(explain::explanation_text(side), text, "{name}");
            // Rules are listed only for an allowed side (the JSON must not show stale ones).
            assert_eq!(
                side.rules.is_empty(),
                decision != Decision::Allowed,
                "{name}"
            );
        }
        // Without --explain the verdicts are the same and nothing is added.
        let plain = &checker.run().results[0];
        for (plain, explained) in [
            (&plain.egress, &result.egress),
            (&plain.ingress, &result.ingress),
        ] {
            assert_eq!(
                (plain.allowed, &plain.policies),
                (explained.allowed, &explained.policies),
                "{name}"
            );
            assert_eq!((&plain.decision, plain.rules.len()), (&None, 0), "{name}");
        }
    }
}

#[test]
fn with_policies_keeps_the_pods_and_flows() {
    let scenario = parse_scenario(
        "pods: [{namespace: a, name: p}, {namespace: a, name: q}]\nflows:\n- {from: {pod: a/p}, to: {pod: a/q}, port: 80}\n",
    )
    .unwrap();
    let old = Checker::new(scenario).unwrap();
    let deny = parse_policies(
        "kind: NetworkPolicy\nmetadata: {name: deny, namespace: a}\nspec: {podSelector: {}}\n",
    )
    .unwrap();
    let new = old.with_policies(deny).unwrap();
    let report = diff(&old.explain(), &new.explain());
    assert_eq!(
        (report.flows, report.now_denied.len(), report.unchanged),
        (1, 1, 0)
    );
    let change = &report.now_denied[0];
    assert_eq!(change.new.ingress.decision, Some(Decision::Isolated));
    assert_eq!(change.old.ingress.decision, Some(Decision::NotIsolated));
    let bad =
        parse_policies("- {kind: NetworkPolicy, metadata: {name: Bad, namespace: a}}\n").unwrap();
    let err = old.with_policies(bad).err().unwrap();
    assert_eq!(err.field, "policies[0].metadata.name", "{err}");
}

#[test]
fn records_parse_from_agent_json_lines() {
    let line = r#"{"first_seen":"2026-12-06T13:05:09.123Z","last_seen":"2026-12-06T13:05:10.000Z","netns_ino":1,"cgroup_id":2,"local_ip":"10.0.0.1","peer_ip":"10.0.0.2","port":53,"protocol":"udp","direction":"outbound","outcome":"datagram","error":null,"count":4}"#;
    let records = parse_records(&format!("{line}\n\n{line}\n")).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].protocol, Protocol::UDP);
    assert_eq!(records[0].count, 4);
    let err = parse_records(&line.replace("udp", "icmp")).unwrap_err();
    assert_eq!(err.field, "line 1.protocol", "{err}");
}

/// Replayed records judge an outside address by the name the agent says its pod resolved it from
/// (`peer`, a host name), as monitor does; a record without a name, an inbound record or a peer
/// named as a Service is judged by address.
#[test]
fn replayed_records_are_judged_by_the_name_their_pod_resolved() {
    let policies = web_egress_with_names("[{names: [api.example.test], ports: [{port: 443}]}]");
    let scenario = parse_scenario(&format!(
        "pods:\n- {{namespace: shop, name: web, labels: {{app: web}}, ip: 10.0.0.1}}\npolicies:\n{policies}"
    ))
    .unwrap();
    let checker = Checker::new(scenario).unwrap();
    let line = |peer_ip: &str, peer: &str| {
        format!(
            r#"{{"local_ip":"10.0.0.1","peer_ip":"{peer_ip}","port":443,"protocol":"tcp","direction":"outbound","outcome":"established","peer":{peer}}}"#
        )
    };
    // (peer_ip, peer) → would be denied
    let cases = [
        ("203.0.113.10", r#""api.example.test""#, false),
        ("203.0.113.11", r#""API.example.test.""#, false),
        ("203.0.113.12", r#""other.example.test""#, true),
        ("203.0.113.13", "null", true),
        ("203.0.113.14", r#""svc shop/api""#, true),
    ];
    for (ip, peer, denied) in cases {
        let records = parse_records(&line(ip, peer)).unwrap();
        let report = checker.replay(&records);
        assert_eq!(report.would_deny.len(), usize::from(denied), "{ip} {peer}");
        if !denied {
            assert_eq!(report.unchanged, 1, "{ip} {peer}");
        }
    }
    // The table names the peer by its name and address.
    let records = parse_records(&line("203.0.113.12", r#""other.example.test""#)).unwrap();
    let table = checker.replay(&records).render_table();
    assert!(
        table.contains("other.example.test (203.0.113.12)"),
        "{table}"
    );
    // An inbound record's peer is the remote client: never a name the local pod resolved.
    let inbound = line("203.0.113.10", r#""api.example.test""#).replace("outbound", "inbound");
    assert_eq!(parse_records(&inbound).unwrap()[0].resolved_name(), None);
}

/// A kubernetes WorkloadNetworkPolicy of `shop/web` egress: DNS only in its payload, and the given
/// `egressNames`.
fn web_egress_with_names(names: &str) -> String {
    format!(
        "- kind: WorkloadNetworkPolicy\n  metadata: {{name: web-egress, namespace: shop}}\n  spec:\n    backend: kubernetes\n    mode: monitor\n    direction: Egress\n    targetRef: {{kind: Deployment, name: web}}\n    kubernetes: {{podSelector: {{matchLabels: {{app: web}}}}, policyTypes: [Egress], egress: [{{ports: [{{protocol: UDP, port: 53}}]}}]}}\n    egressNames: {names}\n"
    )
}

/// `to.name`: the name the source pod resolved an outside address from. The egress side is allowed
/// by a `spec.egressNames` entry listing it (or a wildcard above it) on the port, as monitor does
/// (docs/behaviour.md §3.4); `--explain` names the entry, the table shows the name with the address.
#[test]
fn a_flow_to_an_address_resolved_from_a_listed_name_is_allowed_by_name() {
    let policies = web_egress_with_names(
        "[{names: [api.example.test], ports: [{port: 443}]}, {names: ['*.storage.example.test']}]",
    );
    let flow =
        |to: &str, port: u16| format!("- {{from: {{pod: shop/web}}, to: {to}, port: {port}}}\n");
    // (to, port) → (allowed, the egress explanation)
    let cases = [
        (
            "{ip: 203.0.113.10, name: api.example.test}",
            443,
            true,
            "allowed by wnp/shop/web-egress by name api.example.test (spec.egressNames[0])",
        ),
        (
            "{ip: 203.0.113.11, name: eu.storage.example.test}",
            8443,
            true,
            "allowed by wnp/shop/web-egress by name eu.storage.example.test (spec.egressNames[1]: *.storage.example.test)",
        ),
        // Not on the entry's port, another name, the literal: as without names.
        (
            "{ip: 203.0.113.10, name: api.example.test}",
            80,
            false,
            "isolated by wnp/shop/web-egress; no rule matches",
        ),
        (
            "{ip: 203.0.113.10, name: api.other.test}",
            443,
            false,
            "isolated by wnp/shop/web-egress; no rule matches",
        ),
        (
            "{ip: 203.0.113.10}",
            443,
            false,
            "isolated by wnp/shop/web-egress; no rule matches",
        ),
        // Names never allow a pod, whatever name the address came with.
        (
            "{ip: 10.0.0.2, name: api.example.test}",
            443,
            false,
            "isolated by wnp/shop/web-egress; no rule matches",
        ),
    ];
    for (to, port, allowed, explanation) in cases {
        let scenario = parse_scenario(&format!(
            "pods:\n- {{namespace: shop, name: web, labels: {{app: web}}, ip: 10.0.0.1}}\n- {{namespace: shop, name: db, labels: {{app: db}}, ip: 10.0.0.2}}\npolicies:\n{policies}flows:\n{}",
            flow(to, port)
        ))
        .unwrap();
        let checker = Checker::new(scenario).unwrap();
        let result = &checker.explain().results[0];
        assert_eq!(result.allowed, allowed, "{to}:{port}");
        assert_eq!(
            explain::explanation_text(&result.egress),
            explanation,
            "{to}:{port}"
        );
        // Without --explain, the same verdict and the deciding policy.
        let plain = &checker.run().results[0];
        assert_eq!(
            (plain.allowed, &plain.egress.policies),
            (result.allowed, &result.egress.policies),
            "{to}:{port}"
        );
    }
    let scenario = parse_scenario(&format!(
        "pods: [{{namespace: shop, name: web, labels: {{app: web}}}}]\npolicies:\n{policies}flows:\n{}",
        flow("{ip: 203.0.113.10, name: api.example.test}", 443)
    ))
    .unwrap();
    let table = Checker::new(scenario).unwrap().run().render_table();
    assert!(
        table.contains("shop/web  api.example.test (203.0.113.10)  TCP    443   ALLOW"),
        "{table}"
    );
}

#[test]
fn a_name_goes_with_the_address_of_a_flow_destination() {
    let cases = [
        (
            "{from: {ip: 203.0.113.1, name: a.example.test}, to: {pod: a/p}, port: 80}",
            "flows[0].from.name",
        ),
        (
            "{from: {pod: a/p}, to: {pod: a/p, name: a.example.test}, port: 80}",
            "flows[0].to.name",
        ),
        (
            "{from: {pod: a/p}, to: {ip: 203.0.113.1, name: A.example.test}, port: 80}",
            "flows[0].to.name",
        ),
        (
            "{from: {pod: a/p}, to: {ip: 203.0.113.1, name: 'a.example.test.'}, port: 80}",
            "flows[0].to.name",
        ),
        (
            "{from: {pod: a/p}, to: {ip: 203.0.113.1, name: '*.example.test'}, port: 80}",
            "flows[0].to.name",
        ),
    ];
    for (flow, field) in cases {
        let scenario = parse_scenario(&format!(
            "pods: [{{namespace: a, name: p}}]\nflows:\n- {flow}\n"
        ))
        .unwrap();
        let err = Checker::new(scenario).err().expect(flow);
        assert_eq!(err.field, field, "{flow}: {err}");
    }
}

/// `--diff-policies`: adding the name to `egressNames` is a change from denied to allowed, shown
/// with the name.
#[test]
fn adding_a_name_shows_in_the_diff_by_name() {
    let scenario = parse_scenario(&format!(
        "pods: [{{namespace: shop, name: web, labels: {{app: web}}}}]\npolicies:\n{}flows:\n- {{from: {{pod: shop/web}}, to: {{ip: 203.0.113.10, name: api.example.test}}, port: 443}}\n",
        web_egress_with_names("[{names: [other.example.test]}]")
    ))
    .unwrap();
    let old = Checker::new(scenario).unwrap();
    let new = old
        .with_policies(
            parse_policies(&web_egress_with_names(
                "[{names: [other.example.test]}, {names: [api.example.test]}]",
            ))
            .unwrap(),
        )
        .unwrap();
    let report = diff(&old.explain(), &new.explain());
    assert_eq!((report.now_allowed.len(), report.now_denied.len()), (1, 0));
    let change = &report.now_allowed[0];
    assert_eq!(change.to.name.as_deref(), Some("api.example.test"));
    assert_eq!(
        explain::explanation_text(&change.new.egress),
        "allowed by wnp/shop/web-egress by name api.example.test (spec.egressNames[1])"
    );
    let text = report.render_table();
    assert!(text.contains("api.example.test (203.0.113.10)"), "{text}");
}

/// ClusterNetworkPolicies in a scenario: `--explain` shows the trail through the tiers, the table
/// names the deciding rule, and what the CRD refuses is refused naming the field.
#[test]
fn cluster_policies_show_the_trail_through_the_tiers() {
    let scenario = "namespaces:\n\
        - {name: shop, labels: {env: prod}}\n\
        - {name: dev, labels: {env: dev}}\n\
        pods:\n\
        - {namespace: shop, name: web, labels: {app: web}}\n\
        - {namespace: shop, name: db, labels: {app: db}}\n\
        - {namespace: dev, name: tool, labels: {app: tool}}\n\
        policies:\n\
        - kind: ClusterNetworkPolicy\n  metadata: {name: tenants}\n  spec:\n    tier: Admin\n    priority: 10\n    subject: {namespaces: {}}\n    ingress:\n    - {name: no-dev, action: Deny, from: [{namespaces: {matchLabels: {env: dev}}}]}\n    - {action: Pass, from: [{namespaces: {matchLabels: {env: prod}}}]}\n\
        - kind: ClusterNetworkPolicy\n  metadata: {name: floor}\n  spec:\n    tier: Baseline\n    priority: 0\n    subject: {namespaces: {}}\n    ingress:\n    - {action: Deny, from: [{namespaces: {}}], protocols: [{tcp: {destinationPort: {number: 22}}}]}\n\
        - {kind: NetworkPolicy, metadata: {name: db-ingress, namespace: shop}, spec: {podSelector: {matchLabels: {app: db}}, ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]}}\n\
        flows:\n\
        - {from: {pod: dev/tool}, to: {pod: shop/db}, port: 5432}\n\
        - {from: {pod: shop/web}, to: {pod: shop/db}, port: 5432}\n\
        - {from: {pod: shop/db}, to: {pod: shop/web}, port: 22}\n\
        - {from: {pod: shop/db}, to: {pod: shop/web}, port: 80}\n";
    let checker = Checker::new(parse_scenario(scenario).unwrap()).unwrap();
    let explained = checker.explain();
    let ingress: Vec<(bool, Decision, String)> = explained
        .results
        .iter()
        .map(|r| {
            (
                r.ingress.allowed,
                r.ingress.decision.unwrap(),
                explain::explanation_text(&r.ingress),
            )
        })
        .collect();
    assert_eq!(
        ingress,
        vec![
            (
                false,
                Decision::ClusterPolicy,
                "[Admin] cnp/tenants rule 0 (no-dev) Deny".to_string()
            ),
            (
                true,
                Decision::Allowed,
                "[Admin] cnp/tenants rule 1 Pass → [NetworkPolicy] allowed by np/shop/db-ingress \
                 ingress[0] from app=web ns=shop all ports"
                    .to_string()
            ),
            (
                false,
                Decision::ClusterPolicy,
                "[Admin] cnp/tenants rule 1 Pass → [Baseline] cnp/floor rule 0 Deny".to_string()
            ),
            (
                true,
                Decision::NotIsolated,
                "[Admin] cnp/tenants rule 1 Pass → [NetworkPolicy] not isolated".to_string()
            ),
        ]
    );
    let table = checker.run().render_table();
    assert!(table.contains("deny (cnp/tenants Admin rule 0)"), "{table}");
    assert!(
        table.contains("deny (cnp/floor Baseline rule 0)"),
        "{table}"
    );

    let refused = |spec: &str| {
        let s = format!(
            "policies:\n- kind: ClusterNetworkPolicy\n  metadata: {{name: p}}\n  spec: {spec}\n"
        );
        Checker::new(parse_scenario(&s).unwrap())
            .err()
            .map(|e| e.field)
    };
    assert_eq!(
        refused("{tier: Platform, priority: 1, subject: {namespaces: {}}}").as_deref(),
        Some("policies[0].spec.tier")
    );
    assert_eq!(
        refused("{tier: Admin, priority: 1001, subject: {namespaces: {}}}").as_deref(),
        Some("policies[0].spec.priority")
    );
    assert_eq!(
        refused("{tier: Admin, priority: 1, subject: {}}").as_deref(),
        Some("policies[0].spec.subject")
    );
    assert_eq!(
        refused("{tier: Admin, priority: 1, subject: {namespaces: {}}, egress: [{action: Deny, to: [{networks: [bad]}]}]}").as_deref(),
        Some("policies[0].spec.egress[0]")
    );
    // The experimental peers are accepted (and fail closed).
    assert_eq!(
        refused(
            "{tier: Admin, priority: 1, subject: {namespaces: {}}, egress: [{action: Accept, to: [{domainNames: [example.com]}]}]}"
        ),
        None
    );
}

/// The proposed ClusterNetworkPolicies, in force, allow every observed flow and deny the
/// cross-namespace and outside flows nobody was seen making.
#[test]
fn proposed_cluster_policies_allow_what_was_observed() {
    let pods = "pods:\n\
        - {namespace: shop, name: api, labels: {app: api}, ip: 10.0.0.1}\n\
        - {namespace: shop, name: db, labels: {app: db}, ip: 10.0.0.2}\n\
        - {namespace: web, name: front, labels: {app: front}, ip: 10.0.1.1}\n\
        - {namespace: other, name: x, labels: {app: x}, ip: 10.0.2.1}\n\
        - {namespace: kube-system, name: dns, labels: {k8s-app: kube-dns}, ip: 10.0.3.1}\n";
    let observed = "- {from: {pod: web/front}, to: {pod: shop/api}, port: 8080}\n\
        - {from: {pod: shop/api}, to: {ip: 10.0.0.2}, port: 5432}\n\
        - {from: {pod: shop/api}, to: {ip: 203.0.113.7}, port: 443}\n\
        - {from: {pod: shop/api}, to: {pod: kube-system/dns}, protocol: UDP, port: 53}\n";
    let scenario = parse_scenario(&format!("{pods}flows:\n{observed}")).unwrap();
    let proposed = propose_cluster_policies(&scenario).unwrap();
    let names: Vec<&str> = proposed
        .policies
        .iter()
        .map(|p| p.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "ne-isolate-shop",
            "ne-isolate-web",
            "ne-floor-shop",
            "ne-floor-web"
        ]
    );
    let unobserved = "- {from: {pod: other/x}, to: {pod: shop/api}, port: 8080}\n\
        - {from: {pod: shop/api}, to: {pod: other/x}, port: 80}\n\
        - {from: {pod: web/front}, to: {pod: other/x}, port: 80}\n\
        - {from: {pod: shop/api}, to: {ip: 198.51.100.1}, port: 443}\n\
        - {from: {pod: web/front}, to: {pod: kube-system/dns}, protocol: UDP, port: 53}\n";
    let mut with = parse_scenario(&format!("{pods}flows:\n{observed}{unobserved}")).unwrap();
    for policy in &proposed.policies {
        with.policies.push(serde_json::to_value(policy).unwrap());
    }
    let verdicts: Vec<bool> = Checker::new(with)
        .unwrap()
        .run()
        .results
        .iter()
        .map(|r| r.allowed)
        .collect();
    assert_eq!(
        verdicts,
        [true, true, true, true, false, false, false, false, true],
        "observed flows allowed; unobserved ones denied; every namespace keeps the cluster DNS"
    );
}
