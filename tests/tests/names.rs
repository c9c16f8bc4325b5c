//! Outside services by name (issue 41), on the local cluster with real pods, real DNS and real packets:
//! a made-up zone (`api-<pid>.partner.test`) served to the pods by the cluster DNS, whose answer rotates among
//! addresses of a network namespace this test creates outside the pod range (nothing leaves the
//! machine). A client that calls the name is learned by name (its proposal's `egressNames`); promoted
//! to monitor, a connection to the name's next address is no violation, while an address literal the
//! pod never resolved is one. Switched to protect with the agent enforcing, the rendered
//! NetworkPolicy allows the addresses the client resolved the name to, and follows the name to new
//! addresses (the time from the pod's call to the address in the NetworkPolicy is printed); the
//! agent's DNS hold lets the client's first SYN to a new address through (no resend), while the
//! literal and a name the policy does not list are blocked.
//!
//! Needs root, `cargo xtask setup` and the binaries (`cargo test --workspace` builds them).

use anyhow::{Context, Result, ensure};
use network_enforcer_api::{WorkloadNetworkPolicy, WorkloadNetworkPolicyProposal};
use network_enforcer_tests::cluster::layout::State;
use network_enforcer_tests::e2e::poll;
use network_enforcer_tests::e2e::release::{self, Release, http_get};
use network_enforcer_tests::e2e::scenario::{self, list};
use network_enforcer_tests::e2e::workload::{self, Namespace, Protocol, send};
use network_enforcer_tests::fixture;
use std::process::{Child, Command};
use std::time::Duration;

/// The name the client calls, `api-<pid>.partner.test`: per run, so answers a cluster DNS still holds
/// from an earlier run (dnsmasq keeps the entries of a hosts file that was removed) cannot allow its
/// new addresses early.
fn name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| format!("api-{}.partner.test", std::process::id()))
}
/// The addresses the name rotates through in monitor, then in protect.
const ROTATION: [&str; 3] = ["203.0.113.10", "203.0.113.11", "203.0.113.12"];
const PROTECT_ROTATION: [&str; 3] = ["203.0.113.13", "203.0.113.14", "203.0.113.15"];
/// An address no DNS answer ever gives.
const LITERAL: &str = "203.0.113.20";
/// A name the policy does not list, and its address.
const OTHER: (&str, &str) = ("other.partner.test", "203.0.113.21");
const PORT: u16 = 443;
/// Not the agent's default (9464): agents of other test binaries may hold that port on the host.
const METRICS_PORT: u16 = 29474;

/// A network namespace standing for the internet: holds [`ROTATION`] and [`LITERAL`] behind a veth
/// from the node, routed there, and echoes TCP on [`PORT`]. Removed on drop.
struct Outside {
    netns: String,
    host_link: String,
    echo: Child,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Inserts (`-I`) or deletes (`-D`) the guard's exception for `link`.
fn iptables(op: &str, link: &str) -> Result<()> {
    let status = Command::new("iptables")
        .args(["-w", op, "NE-CLUSTER-GUARD", "-o", link, "-j", "RETURN"])
        .status()
        .context("running iptables")?;
    ensure!(
        status.success(),
        "iptables {op} NE-CLUSTER-GUARD -o {link}: {status}"
    );
    Ok(())
}

impl Outside {
    fn create() -> Result<Self> {
        let id = std::process::id() % 100_000;
        let netns = format!("ne-outside-{id}");
        let (host_link, inner) = (format!("neoh{id}"), format!("neon{id}"));
        ip(&["netns", "add", &netns])?;
        let mut outside = Outside {
            netns: netns.clone(),
            host_link: host_link.clone(),
            echo: Command::new("true").spawn()?,
        };
        ip(&[
            "link", "add", &host_link, "type", "veth", "peer", "name", &inner, "netns", &netns,
        ])?;
        ip(&["addr", "add", "169.254.203.1/30", "dev", &host_link])?;
        ip(&["link", "set", &host_link, "up"])?;
        let inside = |args: &[&str]| {
            let mut all = vec!["-n", netns.as_str()];
            all.extend_from_slice(args);
            ip(&all)
        };
        inside(&["addr", "add", "169.254.203.2/30", "dev", &inner])?;
        for address in ROTATION
            .iter()
            .chain(&PROTECT_ROTATION)
            .chain([&LITERAL, &OTHER.1])
        {
            inside(&["addr", "add", &format!("{address}/32"), "dev", &inner])?;
        }
        inside(&["link", "set", &inner, "up"])?;
        inside(&["link", "set", "lo", "up"])?;
        inside(&["route", "add", "default", "via", "169.254.203.1"])?;
        ip(&["route", "replace", "203.0.113.0/24", "via", "169.254.203.2"])?;
        // The cluster's guard lets pod traffic leave only towards nodes: open it for this link,
        // which leads to a namespace of this machine.
        iptables("-I", &host_link)?;
        outside.echo = Command::new("ip")
            .args(["netns", "exec", &netns, "socat"])
            .arg(format!("TCP-LISTEN:{PORT},fork,reuseaddr"))
            .arg("EXEC:cat")
            .spawn()
            .context("starting socat in the outside namespace")?;
        Ok(outside)
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.echo.kill();
        let _ = self.echo.wait();
        let _ = iptables("-D", &self.host_link);
        let _ = ip(&["route", "del", "203.0.113.0/24"]);
        let _ = ip(&["link", "del", &self.host_link]);
        let _ = ip(&["netns", "del", &self.netns]);
    }
}

/// A file of the cluster DNS's hosts directory naming [`name`]; removed on drop.
struct Zone(std::path::PathBuf);

impl Zone {
    fn create() -> Result<Self> {
        let path = State::new()
            .dns()
            .join("hosts")
            .join(format!("partner-{}", std::process::id()));
        Ok(Zone(path))
    }

    /// Answers [`name`] with `address` from now on, and [`OTHER`] (dnsmasq reads the file again
    /// when it is replaced).
    fn point_at(&self, address: &str) -> Result<()> {
        let tmp = self.0.with_extension("tmp");
        std::fs::write(
            &tmp,
            format!("{address} {}\n{} {}\n", name(), OTHER.1, OTHER.0),
        )?;
        std::fs::rename(&tmp, &self.0)?;
        Ok(())
    }
}

impl Drop for Zone {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Calls [`name`] from `client` until the echo comes from `address` (the DNS answer follows the zone
/// file within a moment).
fn call_until_answered_by(ns: &Namespace, client: &str, address: &str) -> Result<()> {
    poll(
        &format!("{} to resolve to {address} in the pod and answer", name()),
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            let resolved = ns.exec(
                client,
                &format!("nslookup {} 2>/dev/null | grep Address", name()),
            )?;
            if !resolved.contains(address) {
                return Ok(None);
            }
            Ok(send(ns, client, Protocol::Tcp, name(), PORT, "hello")?.then_some(()))
        },
        || ns.describe(),
    )
}

#[test]
fn an_outside_service_is_learned_by_name_and_its_next_address_is_no_violation() -> Result<()> {
    let cluster = fixture::cluster_with_crds()?;
    release::images_from_debug_build()?;
    let release_namespace = "ne-names-system";
    let mut values = scenario::release_values(release_namespace);
    values.push(scenario::AGENT_ENFORCEMENT.into());
    values.push(format!("agent.metricsPort={METRICS_PORT}"));
    let release = Release::install(&cluster.kubeconfig, "ne-names", release_namespace, &values)?;
    let outside = Outside::create()?;
    let zone = Zone::create()?;
    zone.point_at(ROTATION[0])?;
    let ns = Namespace::create(
        &cluster.kubeconfig,
        &format!("names-{}", std::process::id()),
    )?;
    ns.apply(&workload::deployment(
        "client",
        "default",
        "exec sleep 100000",
        &[],
    ))?;
    // Looks the name up without calling it, to know when the cluster DNS serves a new address: not
    // selected by the client's policy, so its lookups grant nothing.
    ns.apply(&workload::deployment(
        "checker",
        "default",
        "exec sleep 100000",
        &[],
    ))?;
    let (client, _) = ns.wait_for_deployment("client")?.remove(0);
    let (checker, _) = ns.wait_for_deployment("checker")?.remove(0);
    call_until_answered_by(&ns, &client, ROTATION[0])?;

    // Learned by name: egressNames holds the name on its port.
    let proposal = "deployment-client-egress";
    let learned = poll(
        &format!("{proposal} to learn {}", name()),
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let proposals: std::collections::BTreeMap<String, WorkloadNetworkPolicyProposal> =
                list(&ns, "workloadnetworkpolicyproposals")?;
            Ok(proposals
                .get(proposal)
                .filter(|p| !p.spec.egress_names.is_empty())
                .cloned())
        },
        || {
            format!(
                "{}\n{}",
                ns.describe(),
                release.logs("agent").unwrap_or_default()
            )
        },
    )?;
    let names: Vec<(Vec<String>, Vec<String>)> = learned
        .spec
        .egress_names
        .iter()
        .map(|r| {
            let ports = r
                .ports
                .iter()
                .map(|p| serde_json::to_string(p).unwrap_or_default())
                .collect();
            (r.names.clone(), ports)
        })
        .collect();
    ensure!(
        names
            == [(
                vec![name().to_string()],
                vec![r#"{"port":443,"protocol":"TCP"}"#.to_string()]
            )],
        "learned names: {names:?}"
    );

    // Monitor: the name's next addresses are allowed by name; a literal nobody resolved is not.
    ns.kubectl(&[
        "label",
        "workloadnetworkpolicyproposal",
        proposal,
        "networkenforcer.kubewarden.io/promote=monitor",
    ])?;
    poll(
        "the policy to exist",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            let policies: std::collections::BTreeMap<String, WorkloadNetworkPolicy> =
                list(&ns, "workloadnetworkpolicies")?;
            Ok(policies.contains_key(proposal).then_some(()))
        },
        || ns.describe(),
    )?;
    for address in &ROTATION[1..] {
        zone.point_at(address)?;
        call_until_answered_by(&ns, &client, address)?;
    }
    ensure!(
        send(&ns, &client, Protocol::Tcp, LITERAL, PORT, "literal")?,
        "the literal address must answer (monitor blocks nothing)"
    );
    let policy = poll(
        "the literal's violation to be recorded",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || {
            let policies: std::collections::BTreeMap<String, WorkloadNetworkPolicy> =
                list(&ns, "workloadnetworkpolicies")?;
            Ok(policies.get(proposal).cloned().filter(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.violations.iter().any(|v| v.dest.address == LITERAL))
            }))
        },
        || {
            format!(
                "{}\n{}",
                ns.describe(),
                release.logs("controller").unwrap_or_default()
            )
        },
    )?;
    // Two more status passes, for a late violation of a rotated address to show.
    release.wait_for_status_passes(2, Duration::from_secs(60))?;
    let policies: std::collections::BTreeMap<String, WorkloadNetworkPolicy> =
        list(&ns, "workloadnetworkpolicies")?;
    let status = policies
        .get(proposal)
        .and_then(|p| p.status.clone())
        .unwrap_or_default();
    let violated: Vec<&str> = status
        .violations
        .iter()
        .map(|v| v.dest.address.as_str())
        .collect();
    ensure!(
        violated == [LITERAL],
        "only the literal is a violation, not the name's rotated addresses: {violated:?} ({:?})",
        policy.status
    );
    // The name's entry allowed the rotated calls: its rule usage says so (docs/api.md, "Rule usage").
    let by_name = status
        .rule_usage
        .iter()
        .find(|u| u.list == Some(network_enforcer_api::RuleList::EgressNames))
        .with_context(|| {
            format!(
                "no usage entry of spec.egressNames: {:?}",
                status.rule_usage
            )
        })?;
    ensure!(
        by_name.last_matched.is_some() && by_name.peers >= 1,
        "the egressNames entry allowed the rotated calls: {by_name:?}"
    );

    // Protect, with the agent enforcing the rendered NetworkPolicy.
    ns.kubectl(&[
        "patch",
        "workloadnetworkpolicy",
        proposal,
        "--type=merge",
        "-p",
        r#"{"spec":{"mode":"protect"}}"#,
    ])?;
    wait_for_rendered(&ns, proposal, ROTATION[2])?;
    ensure!(
        !send(&ns, &client, Protocol::Tcp, LITERAL, PORT, "literal")?,
        "the literal must be blocked in protect"
    );
    ensure!(
        !send(&ns, &client, Protocol::Tcp, OTHER.0, PORT, "other")?,
        "a name the policy does not list must be blocked"
    );
    let (mut lags, mut resends) = (Vec::new(), Vec::new());
    for address in PROTECT_ROTATION {
        zone.point_at(address)?;
        // Once the cluster DNS serves the new address, the client looks it up and connects at once,
        // as a client does: the agent's DNS hold makes the address reachable before the client reads
        // the answer, so the first SYN goes through (a dropped one would be resent after 1 s).
        wait_until_resolved(&ns, &checker, address)?;
        // The premise: nothing allows the new address before the client's own lookup (the checker's
        // lookups count for its own workload only).
        let before = rendered(&ns, proposal)?;
        ensure!(
            !before.contains(&format!("\"{address}/32\"")),
            "the NetworkPolicy allows {address} before the client looked it up:\n{before}"
        );
        let called = std::time::Instant::now();
        let (answered, resent) = call_counting_syn_resends(&ns, &client)?;
        ensure!(
            answered,
            "the first call after the rotation to {address} failed\n{}",
            rendered(&ns, proposal).unwrap_or_default()
        );
        resends.push(resent);
        wait_for_rendered(&ns, proposal, address)?;
        lags.push(called.elapsed());
    }
    eprintln!(
        "names: 3 rotations in protect, 0 failed calls, SYNs resent per first call {resends:?}; \
         lookup to address in the NetworkPolicy (upper bound, polled every 100 ms): {lags:?}"
    );
    // Calls to the address the client holds a grant for: their answers bring nothing new, and the
    // kernel check in the agent's queue rule lets them through without the agent (its counter; the
    // agent adds it to its metrics once a second at most).
    let (passed, metrics) = poll(
        "the DNS hold's kernel check to let an answer with nothing new through",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            ensure!(
                send(&ns, &client, Protocol::Tcp, name(), PORT, "again")?,
                "a call to the granted address failed"
            );
            let metrics = http_get(&format!("127.0.0.1:{METRICS_PORT}"), "/metrics")?;
            let passed = release::metric(
                &metrics,
                "network_enforcer_agent_enforcement_dns_hold_checked_answers_total{outcome=\"passed\"}",
            )
            .unwrap_or(0.0);
            Ok((passed > 0.0).then_some((passed, metrics)))
        },
        || release.logs("agent").unwrap_or_default(),
    )?;
    eprintln!("names: {passed} answers let through by the kernel check");
    // The hold's tracker reports what it did not keep, and on this calm node no bound was reached
    // (a pending query replaced by a newer one of the pod is its normal way of forgetting).
    for (outcome, bound) in [
        ("pending_full", true),
        ("pending_replaced", false),
        ("names_full", true),
    ] {
        let dropped = release::metric(
            &metrics,
            &format!(
                "network_enforcer_agent_enforcement_dns_hold_tracker_dropped_total{{outcome=\"{outcome}\"}}"
            ),
        );
        ensure!(
            dropped.is_some_and(|n| !bound || n == 0.0),
            "the DNS hold's tracker dropped {outcome}: {dropped:?}"
        );
    }
    ensure!(
        resends.iter().all(|r| *r == 0),
        "a first call after a rotation needed a SYN resend: {resends:?} (the DNS hold did not let \
         the address through before the answer)\n{}",
        release.logs("agent").unwrap_or_default()
    );
    drop(outside);
    ns.delete_and_wait()?;
    release.uninstall()
}

/// `client` looks [`name`] up and calls it once; whether it answered, and how many SYNs the pod
/// resent meanwhile (its namespace's `TCPSynRetrans`, read before and after).
fn call_counting_syn_resends(ns: &Namespace, client: &str) -> Result<(bool, u64)> {
    let script = format!(
        "grep ^TcpExt: /proc/net/netstat; \
         echo reply:$(echo rotated | socat -t 3 - TCP:{}:{PORT},connect-timeout=3 2>/dev/null); \
         grep ^TcpExt: /proc/net/netstat",
        name()
    );
    let out = ns.exec(client, &script)?;
    let lines: Vec<&str> = out.lines().collect();
    let resent = |names: &str, values: &str| -> Option<u64> {
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(name, _)| *name == "TCPSynRetrans")
            .and_then(|(_, v)| v.parse().ok())
    };
    match lines.as_slice() {
        [n1, v1, reply, n2, v2] => {
            let (before, after) = resent(n1, v1)
                .zip(resent(n2, v2))
                .with_context(|| format!("no TCPSynRetrans in {out:?}"))?;
            Ok((
                reply.trim() == "reply:rotated",
                after.saturating_sub(before),
            ))
        }
        _ => anyhow::bail!("unexpected output of the call: {out:?}"),
    }
}

/// The rendered NetworkPolicy `name`, as JSON text.
fn rendered(ns: &Namespace, name: &str) -> Result<String> {
    ns.kubectl(&["get", "networkpolicy", name, "-o", "json"])
}

/// Waits until the rendered NetworkPolicy allows `address`.
fn wait_for_rendered(ns: &Namespace, name: &str, address: &str) -> Result<()> {
    poll(
        &format!("the NetworkPolicy {name} to allow {address}"),
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            Ok(rendered(ns, name)
                .unwrap_or_default()
                .contains(&format!("\"{address}/32\""))
                .then_some(()))
        },
        || rendered(ns, name).unwrap_or_default(),
    )
}

/// Waits until [`name`] resolves to `address` in `client`.
fn wait_until_resolved(ns: &Namespace, client: &str, address: &str) -> Result<()> {
    poll(
        &format!("{} to resolve to {address} in the pod", name()),
        Duration::from_secs(30),
        Duration::from_millis(200),
        || {
            let resolved = ns.exec(
                client,
                &format!("nslookup {} 2>/dev/null | grep Address", name()),
            )?;
            Ok(resolved.contains(address).then_some(()))
        },
        || ns.describe(),
    )
}
