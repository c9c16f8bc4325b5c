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
#[test]
fn unused_rule_after_takes_durations_with_days() {
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--leader-elect=false"];
        args.extend_from_slice(extra);
        let out = Command::new(env!("CARGO_BIN_EXE_network-enforcer-controller"))
            .args(&args)
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("UNUSED_RULE_AFTER")
            .output()
            .expect("the controller binary runs");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
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
