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
