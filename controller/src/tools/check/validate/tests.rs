use super::*;
use serde_json::{Value, json};

/// A valid policy with every kind of field, to change one at a time.
fn base() -> Value {
    json!({
        "metadata": {"name": "web.v1", "namespace": "demo", "labels": {"app.kubernetes.io/name": "web"}},
        "spec": {
            "podSelector": {"matchLabels": {"app": "web"},
                            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{
                "from": [{"podSelector": {}}, {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                "ports": [{"port": 80}, {"protocol": "UDP", "port": 8000, "endPort": 8100}, {"port": "http"}]
            }],
            "egress": [{"to": [{"namespaceSelector": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}],
                        "ports": [{"protocol": "SCTP"}]}]
        }
    })
}

fn run(policy: &Value) -> Checked {
    let np: k8s_openapi::api::networking::v1::NetworkPolicy =
        serde_json::from_value(policy.clone()).expect("the case deserializes");
    metadata("p.metadata", &np.metadata)?;
    spec("p.spec", &np.spec.unwrap_or_default())
}

/// `base()` with the value at `pointer` replaced (`None`: removed).
fn with(pointer: &str, value: Option<Value>) -> Value {
    let mut policy = base();
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    let target = policy.pointer_mut(parent).expect("the parent exists");
    match (target, value) {
        (Value::Object(map), Some(v)) => {
            map.insert(key.to_string(), v);
        }
        (Value::Object(map), None) => {
            map.remove(key);
        }
        (Value::Array(items), Some(v)) => items[key.parse::<usize>().unwrap()] = v,
        (other, _) => panic!("cannot set {pointer} in {other}"),
    }
    policy
}

/// What a case is, where it changes `base()`, the new value (`None`: removed), and Ok or the field
/// with a piece of the message.
type Case = (
    &'static str,
    String,
    Option<Value>,
    Result<(), (&'static str, &'static str)>,
);

#[test]
fn every_rule_accepts_the_valid_and_refuses_the_invalid_naming_the_field() {
    assert_eq!(run(&base()), Ok(()));
    let ingress = "/spec/ingress/0";
    let port0 = "/spec/ingress/0/ports/0";
    let peer1 = "/spec/ingress/0/from/1";
    let expr = "/spec/podSelector/matchExpressions/0";
    let cases: Vec<Case> = vec![
        // metadata
        (
            "name at 253",
            "/metadata/name".into(),
            Some(json!("a".repeat(253))),
            Ok(()),
        ),
        (
            "name too long",
            "/metadata/name".into(),
            Some(json!("a".repeat(254))),
            Err(("p.metadata.name", "RFC 1123 subdomain")),
        ),
        (
            "name uppercase",
            "/metadata/name".into(),
            Some(json!("Web")),
            Err(("p.metadata.name", "RFC 1123 subdomain")),
        ),
        (
            "name underscore",
            "/metadata/name".into(),
            Some(json!("a_b")),
            Err(("p.metadata.name", "RFC 1123")),
        ),
        (
            "name missing",
            "/metadata/name".into(),
            None,
            Err(("p.metadata.name", "must not be empty")),
        ),
        (
            "namespace missing",
            "/metadata/namespace".into(),
            None,
            Err(("p.metadata.namespace", "must not be empty")),
        ),
        (
            "namespace with a dot",
            "/metadata/namespace".into(),
            Some(json!("a.b")),
            Err(("p.metadata.namespace", "RFC 1123 label")),
        ),
        (
            "namespace at 63",
            "/metadata/namespace".into(),
            Some(json!("n".repeat(63))),
            Ok(()),
        ),
        (
            "namespace at 64",
            "/metadata/namespace".into(),
            Some(json!("n".repeat(64))),
            Err(("p.metadata.namespace", "RFC 1123 label")),
        ),
        (
            "metadata label value",
            "/metadata/labels".into(),
            Some(json!({"a": "-x"})),
            Err(("p.metadata.labels", "value \"-x\"")),
        ),
        // label keys and values
        (
            "key with prefix",
            format!("{expr}/key"),
            Some(json!("example.com/tier")),
            Ok(()),
        ),
        (
            "key empty prefix",
            format!("{expr}/key"),
            Some(json!("/tier")),
            Err(("p.spec.podSelector.matchExpressions[0].key", "empty prefix")),
        ),
        (
            "key bad prefix",
            format!("{expr}/key"),
            Some(json!("Example.com/tier")),
            Err(("p.spec.podSelector.matchExpressions[0].key", "prefix")),
        ),
        (
            "key two slashes",
            format!("{expr}/key"),
            Some(json!("a/b/c")),
            Err(("p.spec.podSelector.matchExpressions[0].key", "name part")),
        ),
        (
            "key empty",
            format!("{expr}/key"),
            Some(json!("")),
            Err((
                "p.spec.podSelector.matchExpressions[0].key",
                "empty name part",
            )),
        ),
        (
            "key name 63",
            format!("{expr}/key"),
            Some(json!("k".repeat(63))),
            Ok(()),
        ),
        (
            "key name 64",
            format!("{expr}/key"),
            Some(json!("k".repeat(64))),
            Err(("p.spec.podSelector.matchExpressions[0].key", "at most 63")),
        ),
        (
            "key space",
            "/spec/podSelector/matchLabels".into(),
            Some(json!({"a b": "x"})),
            Err(("p.spec.podSelector.matchLabels", "key \"a b\"")),
        ),
        (
            "value empty",
            "/spec/podSelector/matchLabels".into(),
            Some(json!({"a": ""})),
            Ok(()),
        ),
        (
            "value underscore dot",
            "/spec/podSelector/matchLabels".into(),
            Some(json!({"a": "x_y.z"})),
            Ok(()),
        ),
        (
            "value trailing dash",
            "/spec/podSelector/matchLabels".into(),
            Some(json!({"a": "x-"})),
            Err(("p.spec.podSelector.matchLabels", "value \"x-\"")),
        ),
        (
            "value 64",
            "/spec/podSelector/matchLabels".into(),
            Some(json!({"a": "v".repeat(64)})),
            Err(("p.spec.podSelector.matchLabels", "at most 63")),
        ),
        (
            "expression value",
            format!("{expr}/values"),
            Some(json!(["ok", "not ok"])),
            Err((
                "p.spec.podSelector.matchExpressions[0].values[1]",
                "\"not ok\"",
            )),
        ),
        // selector operators
        (
            "operator unknown",
            format!("{expr}/operator"),
            Some(json!("Like")),
            Err((
                "p.spec.podSelector.matchExpressions[0].operator",
                "not a valid selector operator",
            )),
        ),
        (
            "operator lowercase",
            format!("{expr}/operator"),
            Some(json!("in")),
            Err(("p.spec.podSelector.matchExpressions[0].operator", "\"in\"")),
        ),
        (
            "In without values",
            format!("{expr}/values"),
            None,
            Err((
                "p.spec.podSelector.matchExpressions[0].values",
                "must be specified",
            )),
        ),
        (
            "NotIn with empty values",
            expr.to_string(),
            Some(json!({"key": "a", "operator": "NotIn", "values": []})),
            Err((
                "p.spec.podSelector.matchExpressions[0].values",
                "must be specified",
            )),
        ),
        (
            "Exists with values",
            expr.to_string(),
            Some(json!({"key": "a", "operator": "Exists", "values": ["x"]})),
            Err((
                "p.spec.podSelector.matchExpressions[0].values",
                "may not be specified",
            )),
        ),
        (
            "DoesNotExist",
            expr.to_string(),
            Some(json!({"key": "a", "operator": "DoesNotExist"})),
            Ok(()),
        ),
        (
            "peer selector",
            "/spec/egress/0/to/0/namespaceSelector/matchExpressions/0/operator".into(),
            Some(json!("Gt")),
            Err((
                "p.spec.egress[0].to[0].namespaceSelector.matchExpressions[0].operator",
                "\"Gt\"",
            )),
        ),
        // ports
        (
            "port 65535",
            format!("{port0}/port"),
            Some(json!(65535)),
            Ok(()),
        ),
        (
            "port 0",
            format!("{port0}/port"),
            Some(json!(0)),
            Err(("p.spec.ingress[0].ports[0].port", "between 1 and 65535")),
        ),
        (
            "port 65536",
            format!("{port0}/port"),
            Some(json!(65536)),
            Err(("p.spec.ingress[0].ports[0].port", "between 1 and 65535")),
        ),
        (
            "port negative",
            format!("{port0}/port"),
            Some(json!(-1)),
            Err(("p.spec.ingress[0].ports[0].port", "between 1 and 65535")),
        ),
        (
            "endPort = port",
            port0.to_string(),
            Some(json!({"port": 80, "endPort": 80})),
            Ok(()),
        ),
        (
            "endPort < port",
            format!("{ingress}/ports/1/endPort"),
            Some(json!(7999)),
            Err((
                "p.spec.ingress[0].ports[1].endPort",
                "greater than or equal to `port` (8000)",
            )),
        ),
        (
            "endPort 65536",
            format!("{ingress}/ports/1/endPort"),
            Some(json!(65536)),
            Err(("p.spec.ingress[0].ports[1].endPort", "between 1 and 65535")),
        ),
        (
            "endPort without port",
            port0.to_string(),
            Some(json!({"endPort": 90})),
            Err((
                "p.spec.ingress[0].ports[0].endPort",
                "`port` is not specified",
            )),
        ),
        (
            "endPort with named port",
            port0.to_string(),
            Some(json!({"port": "http", "endPort": 90})),
            Err(("p.spec.ingress[0].ports[0].endPort", "non-numeric")),
        ),
        (
            "protocol lowercase",
            format!("{port0}/protocol"),
            Some(json!("tcp")),
            Err((
                "p.spec.ingress[0].ports[0].protocol",
                "\"tcp\" is not supported",
            )),
        ),
        (
            "protocol ICMP",
            format!("{port0}/protocol"),
            Some(json!("ICMP")),
            Err((
                "p.spec.ingress[0].ports[0].protocol",
                "expected TCP, UDP or SCTP",
            )),
        ),
        // named ports
        (
            "name 15",
            format!("{port0}/port"),
            Some(json!("abcdefghij-1234")),
            Ok(()),
        ),
        (
            "name 16",
            format!("{port0}/port"),
            Some(json!("abcdefghij-12345")),
            Err(("p.spec.ingress[0].ports[0].port", "15 characters")),
        ),
        (
            "name uppercase",
            format!("{port0}/port"),
            Some(json!("HTTP")),
            Err(("p.spec.ingress[0].ports[0].port", "lowercase alphanumeric")),
        ),
        (
            "name empty",
            format!("{port0}/port"),
            Some(json!("")),
            Err(("p.spec.ingress[0].ports[0].port", "lowercase alphanumeric")),
        ),
        (
            "name backslash",
            format!("{port0}/port"),
            Some(json!("ht\\tp")),
            Err(("p.spec.ingress[0].ports[0].port", "lowercase alphanumeric")),
        ),
        (
            "name digits only",
            format!("{port0}/port"),
            Some(json!("8080")),
            Err(("p.spec.ingress[0].ports[0].port", "at least one letter")),
        ),
        (
            "name double hyphen",
            format!("{port0}/port"),
            Some(json!("a--b")),
            Err(("p.spec.ingress[0].ports[0].port", "consecutive hyphens")),
        ),
        (
            "name leading hyphen",
            format!("{port0}/port"),
            Some(json!("-ab")),
            Err((
                "p.spec.ingress[0].ports[0].port",
                "begin or end with a hyphen",
            )),
        ),
        (
            "name trailing hyphen",
            format!("{port0}/port"),
            Some(json!("ab-")),
            Err((
                "p.spec.ingress[0].ports[0].port",
                "begin or end with a hyphen",
            )),
        ),
        (
            "name with digits",
            format!("{port0}/port"),
            Some(json!("h2c-8080")),
            Ok(()),
        ),
        // peers and ipBlocks
        (
            "empty peer",
            format!("{ingress}/from/0"),
            Some(json!({})),
            Err(("p.spec.ingress[0].from[0]", "must specify a peer")),
        ),
        (
            "ipBlock and podSelector",
            peer1.to_string(),
            Some(json!({"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}})),
            Err(("p.spec.ingress[0].from[1]", "both ipBlock and another peer")),
        ),
        (
            "ipBlock and namespaceSelector",
            peer1.to_string(),
            Some(json!({"ipBlock": {"cidr": "10.0.0.0/8"}, "namespaceSelector": {}})),
            Err(("p.spec.ingress[0].from[1]", "both ipBlock and another peer")),
        ),
        (
            "both selectors",
            peer1.to_string(),
            Some(json!({"podSelector": {}, "namespaceSelector": {}})),
            Ok(()),
        ),
        (
            "cidr empty",
            format!("{peer1}/ipBlock/cidr"),
            Some(json!("")),
            Err((
                "p.spec.ingress[0].from[1].ipBlock.cidr",
                "must not be empty",
            )),
        ),
        (
            "cidr no prefix",
            format!("{peer1}/ipBlock"),
            Some(json!({"cidr": "10.0.0.1"})),
            Err(("p.spec.ingress[0].from[1].ipBlock.cidr", "valid CIDR")),
        ),
        (
            "cidr prefix 33",
            format!("{peer1}/ipBlock"),
            Some(json!({"cidr": "10.0.0.0/33"})),
            Err(("p.spec.ingress[0].from[1].ipBlock.cidr", "valid CIDR")),
        ),
        (
            "cidr octet 256",
            format!("{peer1}/ipBlock"),
            Some(json!({"cidr": "10.0.0.256/32"})),
            Err(("p.spec.ingress[0].from[1].ipBlock.cidr", "valid CIDR")),
        ),
        (
            "cidr leading zero",
            format!("{peer1}/ipBlock"),
            Some(json!({"cidr": "010.0.0.0/8"})),
            Ok(()),
        ),
        (
            "cidr host bits",
            format!("{peer1}/ipBlock"),
            Some(json!({"cidr": "10.0.0.1/8"})),
            Ok(()),
        ),
        (
            "cidr ipv6",
            format!("{peer1}/ipBlock"),
            Some(json!({"cidr": "fd00::/8", "except": ["fd00:1::/32"]})),
            Ok(()),
        ),
        (
            "except invalid",
            format!("{peer1}/ipBlock/except"),
            Some(json!(["10.1.0.0/16", "x"])),
            Err(("p.spec.ingress[0].from[1].ipBlock.except[1]", "valid CIDR")),
        ),
        (
            "except equal",
            format!("{peer1}/ipBlock/except"),
            Some(json!(["10.0.0.0/8"])),
            Err((
                "p.spec.ingress[0].from[1].ipBlock.except[0]",
                "strict subset",
            )),
        ),
        (
            "except wider",
            format!("{peer1}/ipBlock/except"),
            Some(json!(["10.0.0.0/7"])),
            Err((
                "p.spec.ingress[0].from[1].ipBlock.except[0]",
                "strict subset",
            )),
        ),
        (
            "except outside",
            format!("{peer1}/ipBlock/except"),
            Some(json!(["11.0.0.0/16"])),
            Err((
                "p.spec.ingress[0].from[1].ipBlock.except[0]",
                "strict subset",
            )),
        ),
        (
            "except other family",
            format!("{peer1}/ipBlock/except"),
            Some(json!(["::/128"])),
            Err((
                "p.spec.ingress[0].from[1].ipBlock.except[0]",
                "strict subset",
            )),
        ),
        (
            "ipv4 except in ipv6",
            format!("{peer1}/ipBlock"),
            Some(json!({"cidr": "::/0", "except": ["10.0.0.0/8"]})),
            Err((
                "p.spec.ingress[0].from[1].ipBlock.except[0]",
                "strict subset",
            )),
        ),
        (
            "except host bits inside",
            format!("{peer1}/ipBlock/except"),
            Some(json!(["10.1.2.3/16"])),
            Ok(()),
        ),
        (
            "egress cidr",
            "/spec/egress/0/to/0".into(),
            Some(json!({"ipBlock": {"cidr": "nope"}})),
            Err(("p.spec.egress[0].to[0].ipBlock.cidr", "valid CIDR")),
        ),
        // policyTypes
        (
            "policyTypes Egress",
            "/spec/policyTypes".into(),
            Some(json!(["Egress"])),
            Ok(()),
        ),
        (
            "policyTypes lowercase",
            "/spec/policyTypes".into(),
            Some(json!(["Ingress", "egress"])),
            Err(("p.spec.policyTypes[1]", "\"egress\" is not supported")),
        ),
        (
            "policyTypes three",
            "/spec/policyTypes".into(),
            Some(json!(["Ingress", "Egress", "Ingress"])),
            Err(("p.spec.policyTypes", "more than two")),
        ),
    ];
    let mut failures = Vec::new();
    for (what, pointer, value, expected) in cases {
        let got = run(&with(&pointer, value));
        let ok = match (&got, expected) {
            (Ok(()), Ok(())) => true,
            (Err(e), Err((field, message))) => e.field == field && e.message.contains(message),
            _ => false,
        };
        if !ok {
            failures.push(format!("{what}: expected {expected:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_first_problem_in_upstream_order_is_reported() {
    let mut policy = with("/spec/policyTypes", Some(json!(["nope"])));
    policy["spec"]["ingress"][0]["ports"][0]["port"] = json!(0);
    policy["metadata"]["name"] = json!("Bad");
    assert_eq!(run(&policy).unwrap_err().field, "p.metadata.name");
    policy["metadata"]["name"] = json!("good");
    assert_eq!(
        run(&policy).unwrap_err().field,
        "p.spec.ingress[0].ports[0].port"
    );
}
