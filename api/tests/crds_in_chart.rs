//! The chart's CRD manifests must be exactly what the Rust types generate.

use std::path::Path;

#[test]
fn chart_crds_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/network-enforcer/crds");
    for (file, generated) in network_enforcer_api::crd_manifests() {
        let path = dir.join(file);
        let checked_in = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run `cargo xtask gen`", path.display()));
        assert!(
            checked_in == generated,
            "{} is out of date with api/src/crd.rs; run `cargo xtask gen` and commit the result",
            path.display()
        );
    }
}

#[test]
fn crds_carry_the_keep_policy_names_and_columns() {
    for (file, yaml) in network_enforcer_api::crd_manifests() {
        let crd: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{file}"
        );
        let version = &crd["spec"]["versions"][0];
        assert_eq!(version["name"], "v1alpha1");
        assert_eq!(version["storage"], true);
        assert!(version["subresources"]["status"].is_object(), "{file}");
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        let short = crd["spec"]["names"]["shortNames"][0].as_str().unwrap();
        match file {
            "workloadnetworkpolicies.yaml" => {
                assert_eq!(short, "wnp");
                for c in [
                    "Mode",
                    "Active Violations",
                    "Direction",
                    "Target",
                    "Ready",
                    "Age",
                ] {
                    assert!(columns.contains(&c), "{c} missing from {columns:?}");
                }
                let mode = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                    ["mode"];
                assert_eq!(mode["default"], "monitor");
                assert_eq!(mode["enum"], serde_json::json!(["monitor", "protect"]));
            }
            "workloadnetworkpolicyproposals.yaml" => {
                assert_eq!(short, "wnpp");
                for c in ["Direction", "Target", "Peers", "Last Learned", "Age"] {
                    assert!(columns.contains(&c), "{c} missing from {columns:?}");
                }
            }
            "clusternetworkpolicyproposals.yaml" => {
                assert_eq!(short, "cnpp");
                assert_eq!(crd["spec"]["scope"], "Cluster");
                for c in ["Tier", "Priority", "Promote", "Rendered", "Age"] {
                    assert!(columns.contains(&c), "{c} missing from {columns:?}");
                }
                let policy = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
                    ["policy"]["properties"];
                for field in ["tier", "priority", "subject", "ingress", "egress"] {
                    assert!(policy[field].is_object(), "spec.policy lacks {field}");
                }
            }
            other => panic!("unexpected CRD file {other}"),
        }
        let status = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
        if file == "workloadnetworkpolicies.yaml" {
            let record = &status["violations"]["items"]["properties"];
            for field in [
                "id",
                "timestamp",
                "source",
                "dest",
                "protocol",
                "dstPort",
                "action",
                "direction",
                "denyingPolicyNamespace",
                "denyingPolicyName",
            ] {
                assert!(record[field].is_object(), "violation record lacks {field}");
            }
            assert!(status["violationCount"].is_object());
            assert!(status["activeViolationCount"].is_object());
            assert!(
                status["acknowledgedViolations"]["items"]["properties"]["acknowledgedAt"]
                    .is_object()
            );
        }
    }
}
