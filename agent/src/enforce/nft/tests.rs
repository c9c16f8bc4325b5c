use super::*;
use crate::enforce::compile::{IsolatedPod, TierRule};

fn ruleset() -> Ruleset {
    let range = |protocol, first, last| PortRange {
        protocol,
        first,
        last,
    };
    Ruleset {
        pods: vec![
            IsolatedPod {
                namespace: "x".into(),
                name: "a".into(),
                ips: vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()],
                ingress: Some(Side {
                    isolated: true,
                    admin: vec![],
                    baseline: vec![],
                    policies: vec!["x/p".into()],
                    names: vec![],
                    allows: vec![
                        Allow {
                            peers: Peers::Addresses(std::sync::Arc::new(
                                ["10.0.0.2", "fd00::2"]
                                    .iter()
                                    .map(|i| i.parse().unwrap())
                                    .collect(),
                            )),
                            ports: Some(vec![
                                range(Protocol::TCP, 80, 80),
                                range(Protocol::TCP, 9000, 9010),
                                range(Protocol::UDP, 0, u16::MAX),
                            ]),
                        },
                        Allow {
                            peers: Peers::Block {
                                cidr: "10.0.0.0/16".parse().unwrap(),
                                except: vec![
                                    "10.0.1.0/24".parse().unwrap(),
                                    "fd00::/8".parse().unwrap(),
                                ],
                            },
                            ports: None,
                        },
                        Allow {
                            peers: Peers::Block {
                                cidr: "10.0.0.0/8".parse().unwrap(),
                                except: vec![
                                    "10.1.0.0/16".parse().unwrap(),
                                    "10.2.0.0/16".parse().unwrap(),
                                ],
                            },
                            ports: Some(vec![range(Protocol::TCP, 443, 443)]),
                        },
                    ],
                }),
                egress: Some(Side {
                    isolated: true,
                    ..Side::default()
                }),
            },
            IsolatedPod {
                namespace: "x".into(),
                name: "b".into(),
                ips: vec!["10.0.0.3".parse().unwrap()],
                ingress: None,
                egress: Some(Side {
                    isolated: true,
                    admin: vec![],
                    baseline: vec![],
                    policies: vec!["x/q".into()],
                    names: vec![std::sync::Arc::new(
                        crate::enforce::compile::NameAllowance {
                            names: vec!["api.partner.test".into()],
                            ports: vec![PortRange {
                                protocol: Protocol::TCP,
                                first: 443,
                                last: 443,
                            }],
                        },
                    )],
                    allows: vec![Allow {
                        peers: Peers::Any,
                        ports: None,
                    }],
                }),
            },
            tiered_pod(),
        ],
        warnings: vec![],
    }
}

/// x/c: ClusterNetworkPolicies around it. Ingress (no NetworkPolicy isolates it): the Admin
/// tier denies 10.0.1.1, passes 10.0.0.0/24 on TCP 80, accepts UDP 53; the Baseline tier
/// denies the rest. Egress (a NetworkPolicy isolates it, allowing nothing): the Admin tier
/// accepts 192.0.2.0/24.
fn tiered_pod() -> IsolatedPod {
    let rule = |name: &str, action, peers, ports| TierRule {
        name: name.into(),
        action,
        matches: vec![Allow { peers, ports }],
    };
    let port = |protocol, n| {
        Some(vec![PortRange {
            protocol,
            first: n,
            last: n,
        }])
    };
    IsolatedPod {
        namespace: "x".into(),
        name: "c".into(),
        ips: vec!["10.0.0.4".parse().unwrap()],
        ingress: Some(Side {
            policies: vec!["cnp/tenants".into(), "cnp/floor".into()],
            admin: vec![
                rule(
                    "tenants ingress[0]",
                    Action::Deny,
                    Peers::Addresses(std::sync::Arc::new(["10.0.1.1".parse().unwrap()].into())),
                    None,
                ),
                rule(
                    "tenants ingress[1]",
                    Action::Pass,
                    Peers::Block {
                        cidr: "10.0.0.0/24".parse().unwrap(),
                        except: vec![],
                    },
                    port(Protocol::TCP, 80),
                ),
                rule(
                    "tenants ingress[2]",
                    Action::Accept,
                    Peers::Any,
                    port(Protocol::UDP, 53),
                ),
            ],
            baseline: vec![rule("floor ingress[0]", Action::Deny, Peers::Any, None)],
            ..Side::default()
        }),
        egress: Some(Side {
            isolated: true,
            policies: vec!["x/deny-egress".into(), "cnp/tenants".into()],
            admin: vec![rule(
                "tenants egress[0]",
                Action::Accept,
                Peers::Block {
                    cidr: "192.0.2.0/24".parse().unwrap(),
                    except: vec![],
                },
                None,
            )],
            ..Side::default()
        }),
    }
}

/// The Admin tier's rules come first, in order, with Accept as `return`, Deny as the deny and
/// Pass as a `goto` to the chain of the next tier, which the Admin chain also ends in.
#[test]
fn tiers_render_admin_rules_before_the_section_they_pass_to() {
    let text = render(
        &Ruleset {
            pods: vec![tiered_pod()],
            warnings: vec![],
        },
        "t",
        Some(7),
    );
    let chain = |name: &str| -> Vec<String> {
        let start = text
            .find(&format!("chain {name} {{"))
            .unwrap_or_else(|| panic!("no chain {name}:\n{text}"));
        text[start..]
            .lines()
            .skip(1)
            .take_while(|l| l.trim() != "}")
            .filter(|l| !l.trim().starts_with('#'))
            .map(|l| l.trim().to_string())
            .collect()
    };
    // Ingress: the section (Baseline, no NetworkPolicy) is in_0, the Admin chain in_1.
    assert_eq!(
        chain("in_0"),
        ["log prefix \"ne-deny ingress\" group 7 counter drop"]
    );
    let admin = chain("in_1");
    assert_eq!(admin.len(), 4, "{text}");
    assert!(
        admin[0].starts_with("ip saddr @a4_")
            && admin[0].ends_with("log prefix \"ne-deny ingress\" group 7 counter drop"),
        "{text}"
    );
    assert_eq!(admin[1], "ip saddr 10.0.0.0/24 tcp dport 80 goto in_0");
    assert_eq!(admin[2], "udp dport 53 return");
    assert_eq!(admin[3], "goto in_0");
    assert!(text.contains("10.0.0.4 : jump in_1"), "{text}");
    // Egress: the NetworkPolicy section allows nothing; the Admin tier accepts a block first.
    assert_eq!(
        chain("eg_0"),
        ["log prefix \"ne-deny egress\" group 7 counter drop"]
    );
    assert_eq!(chain("eg_1"), ["ip daddr 192.0.2.0/24 return", "goto eg_0"]);
}

#[test]
fn allowances_render_as_rules_ending_in_return() {
    let text = render(&ruleset(), "t", Some(7));
    for expected in [
        "10.0.0.1 : jump in_0",
        "fd00::1 : jump in_0",
        "10.0.0.1 : jump eg_0",
        "10.0.0.3 : jump eg_1",
        "ip6 saddr @a6_1 tcp dport @p_2 return",
        "set a4_0 {\n    type ipv4_addr\n    elements = { 10.0.0.2 }",
        "set a6_1 {\n    type ipv6_addr\n    elements = { fd00::2 }",
        "set p_2 {\n    type inet_service\n    flags interval\n    auto-merge\n    elements = { 80, 9000-9010 }",
        "ip saddr @a4_0 tcp dport @p_2 return",
        "ip6 saddr @a6_1 meta l4proto udp return",
        "ip saddr 10.0.0.0/16 ip saddr != 10.0.1.0/24 return",
        "log prefix \"ne-deny ingress\" group 7 counter drop",
        "log prefix \"ne-deny egress\" group 7 counter drop",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from\n{text}");
    }
    // Two excepts go into an interval set.
    assert!(
        text.contains("ip saddr 10.0.0.0/8 ip saddr != @a4_3 tcp dport 443 return")
            && text.contains("elements = { 10.1.0.0/16, 10.2.0.0/16 }"),
        "{text}"
    );
    // A pod isolated exactly like another shares its chain.
    let mut twins = ruleset();
    let mut twin = twins.pods[0].clone();
    twin.name = "twin".into();
    twin.ips = vec!["10.0.0.9".parse().unwrap()];
    twins.pods.push(twin);
    let text_twins = render(&twins, "t", Some(7));
    assert!(text_twins.contains("10.0.0.9 : jump in_0"), "{text_twins}");
    assert_eq!(
        text_twins.matches("chain in_").count(),
        text.matches("chain in_").count()
    );
    // x/b's egress allows everything: one bare return.
    let eg_1 = text.split("chain eg_1 {").nth(1).unwrap();
    assert!(
        eg_1.trim_start().lines().nth(1).unwrap().trim() == "return",
        "{eg_1}"
    );
    assert!(!render(&ruleset(), "t", None).contains("log "));
    // x/b may reach names: its chain looks the name sets up, which are declared (empty).
    assert!(
        eg_1.contains(
            "ip saddr . ip daddr . meta l4proto . th dport @names4 return\n    \
                 ip6 saddr . ip6 daddr . meta l4proto . th dport @names6 return"
        ),
        "{eg_1}"
    );
    assert!(text.contains(
            "set names4 {\n    type ipv4_addr . ipv4_addr . inet_proto . inet_service\n    flags interval,timeout\n  }"
        ));
    assert!(!render(&Ruleset::default(), "t", None).contains("names4"));
}

#[test]
fn live_name_grants_are_rendered_with_the_time_they_have_left() {
    let grant = |pod: &str, ports: (u16, u16)| Grant {
        pod: pod.parse().unwrap(),
        address: if pod.contains(':') {
            "2001:db8::7"
        } else {
            "203.0.113.10"
        }
        .parse()
        .unwrap(),
        ports: PortRange {
            protocol: Protocol::TCP,
            first: ports.0,
            last: ports.1,
        },
    };
    let text = render_with(
        &ruleset(),
        "t",
        None,
        &[
            (grant("10.0.0.3", (443, 443)), Duration::from_millis(29_500)),
            (grant("fd00::3", (8000, 8099)), Duration::from_secs(30)),
        ],
    );
    assert!(
        text.contains("elements = { 10.0.0.3 . 203.0.113.10 . tcp . 443 timeout 29500ms }"),
        "{text}"
    );
    assert!(
        text.contains("elements = { fd00::3 . 2001:db8::7 . tcp . 8000-8099 timeout 30000ms }"),
        "{text}"
    );
}

/// The kernel accepts what [`render`] writes: installed into a throwaway network namespace (needs
/// root and nft, as the agent does).
#[test]
fn the_kernel_accepts_the_rendered_table() {
    let grants = [(
        Grant {
            pod: "10.0.0.3".parse().unwrap(),
            address: "203.0.113.10".parse().unwrap(),
            ports: PortRange {
                protocol: Protocol::TCP,
                first: 443,
                last: 443,
            },
        },
        Duration::from_secs(30),
    )];
    for ruleset in [Ruleset::default(), ruleset()] {
        let out = Command::new("unshare")
            .args(["--net", "sh", "-c", "nft -f - && nft list table inet t"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(render_with(&ruleset, "t", Some(7), &grants).as_bytes())?;
                child.wait_with_output()
            })
            .expect("running unshare and nft (root needed)");
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            render(&ruleset, "t", Some(7))
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("chain forward"));
    }
}

#[test]
fn table_names_are_checked() {
    assert!(valid_table_name("network_enforcer").is_ok());
    assert!(valid_table_name("ne_release1").is_ok());
    for bad in ["", "1abc", "a-b", "a b", &"a".repeat(65)] {
        assert!(valid_table_name(bad).is_err(), "{bad}");
    }
}

/// nft that exits before reading its input (a syntax error on the first line, a crash) broke the
/// pipe under our write: the agent returned "broken pipe" and left the child unreaped, one zombie
/// per failed sync for the agent's lifetime.
#[test]
fn an_nft_that_exits_before_reading_its_input_is_reaped_and_its_complaint_reported() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pid");
    // More than a pipe holds, so the write cannot finish before the stand-in exits.
    let script = "x".repeat(1 << 20);
    let stand_in = format!(
        "echo $$ > {}; echo 'Error: syntax error, unexpected x' >&2; exit 1",
        pid_file.display()
    );
    let err = run_program("sh", &["-c", &stand_in], Some(&script), "-f").unwrap_err();
    match &err {
        NftError::Refused { action, stderr } => {
            assert_eq!(action, "-f");
            assert_eq!(stderr, "Error: syntax error, unexpected x");
        }
        other => panic!("nft's complaint was lost: {other}"),
    }
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let proc_entry = format!("/proc/{}", pid.trim());
    assert!(
        !std::path::Path::new(&proc_entry).exists(),
        "the exited nft (pid {}) was left a zombie",
        pid.trim()
    );
}

#[test]
fn nft_gets_its_whole_input_and_success_is_ok() {
    let dir = tempfile::tempdir().unwrap();
    let got = dir.path().join("got");
    let stand_in = format!("cat > {}", got.display());
    let script = "table inet t {}\n".repeat(10_000);
    run_program("sh", &["-c", &stand_in], Some(&script), "-f").unwrap();
    assert_eq!(std::fs::read_to_string(&got).unwrap(), script);
}
