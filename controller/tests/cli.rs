//! The controller binary's command line.

use std::process::Command;

fn controller(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_network-enforcer-controller"))
        .args(args)
        .output()
        .expect("the controller binary runs")
}

#[test]
fn help_lists_the_subcommands() {
    let out = controller(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("crds"), "{text}");
}

#[test]
fn crds_prints_both_definitions() {
    let out = controller(&["crds"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for name in [
        "workloadnetworkpolicies.networkenforcer.kubewarden.io",
        "workloadnetworkpolicyproposals.networkenforcer.kubewarden.io",
    ] {
        assert!(text.contains(&format!("name: {name}")), "{name} missing");
    }
}

/// `--unused-rule-after` (docs/api.md, "Rule usage") takes the chart's durations: its default `7d`
/// parses (the run gets as far as connecting), a bad value is refused naming the flag.
/// `run` with `extra` flags and no cluster to reach: it fails, at the flags or at connecting; stderr.
fn run_without_cluster(extra: &[&str]) -> String {
    let mut args = vec!["run", "--leader-elect=false"];
    args.extend_from_slice(extra);
    let out = Command::new(env!("CARGO_BIN_EXE_network-enforcer-controller"))
        .args(&args)
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("UNUSED_RULE_AFTER")
        .env_remove("EDGE_HISTORY_RETENTION")
        .env_remove("EDGE_HISTORY_MAX_EDGES")
        .output()
        .expect("the controller binary runs");
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn unused_rule_after_takes_durations_with_days() {
    let run = run_without_cluster;
    for ok in [&[][..], &["--unused-rule-after", "36h"]] {
        let stderr = run(ok);
        assert!(
            stderr.contains("connecting to Kubernetes") && !stderr.contains("unused-rule-after"),
            "{ok:?}: {stderr}"
        );
    }
    let stderr = run(&["--unused-rule-after", "7x"]);
    assert!(
        stderr.contains("--unused-rule-after") && stderr.contains("unknown unit"),
        "{stderr}"
    );
    let help = controller(&["run", "--help"]);
    let text = String::from_utf8(help.stdout).unwrap();
    assert!(
        text.contains("--unused-rule-after")
            && text.contains("UNUSED_RULE_AFTER")
            && text.contains("[default: 7d]"),
        "{text}"
    );
}

/// The protect gate's history bounds (docs/api.md, "Protect gate"): defaults listed with their
/// variables, a zero bound and a bad duration refused naming the flag.
#[test]
fn edge_history_bounds_are_checked() {
    let stderr = run_without_cluster(&[
        "--edge-history-retention",
        "2d",
        "--edge-history-max-edges",
        "10",
    ]);
    assert!(stderr.contains("connecting to Kubernetes"), "{stderr}");
    let stderr = run_without_cluster(&["--edge-history-max-edges", "0"]);
    assert!(stderr.contains("--edge-history-max-edges"), "{stderr}");
    let stderr = run_without_cluster(&["--edge-history-retention", "0s"]);
    assert!(
        stderr.contains("--edge-history-retention") && stderr.contains("greater than zero"),
        "{stderr}"
    );
    let help = controller(&["run", "--help"]);
    let text = String::from_utf8(help.stdout).unwrap();
    assert!(
        text.contains("EDGE_HISTORY_RETENTION")
            && text.contains("EDGE_HISTORY_MAX_EDGES")
            && text.contains("[default: 200000]"),
        "{text}"
    );
}
