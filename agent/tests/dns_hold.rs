//! Kernel tests of the DNS hold (`agent/src/enforce/dns_hold`), with real packets through a real
//! enforcement table: a pod (network namespace) reaches a resolver and outside services (another
//! namespace) through a router namespace where the agent's table and hold run, as on a node
//! ([`support::dns_world`]).
//!
//! The pod asks for a name its policy allows and connects at once: the first SYN must go through (no
//! retransmission: the connect has less time than the 1 s SYN retry). A name the policy does not allow
//! and an address nobody resolved stay blocked; a grant ends at the TTL plus the grace.
//!
//! Needs root (CI runs as root). Nothing leaves the test's namespaces.

mod support;

use std::time::Duration;
use support::dns_world::{ALLOWED, OTHER, QUEUE, World, connects, resolve, serve_dns, serve_tcp};
use support::require_root;

#[test]
fn an_allowed_names_address_is_reachable_at_once_and_until_the_ttl_plus_grace_only() {
    require_root();
    let world = World::new(1);
    serve_dns(&world, 1);
    serve_tcp(&world);
    // A grace of 3 s: the second answer below must come within it to find its grant settled, and a
    // loaded machine (a CI run failed so) can take more than a second between the two answers.
    let hold = world.hold(&[ALLOWED], Duration::from_secs(3));

    // Nothing resolved yet: the service is blocked.
    let [service, other, literal] = world.services;
    assert!(!connects(&world, service), "reachable before any answer");

    // Resolved from the allowed name: the very first SYN goes through.
    let (address, took) = resolve(&world, ALLOWED);
    assert_eq!(address, service);
    assert!(
        connects(&world, service),
        "first connection after the answer failed"
    );
    eprintln!("answer with a new grant took {took:?} end to end");
    // The same answer again, once the check's mirror has the grant (written just after the first
    // answer went on: a loaded CI machine once sent the second answer before that): nothing new to
    // install, so it does not wait for the agent (the kernel check finds every address granted),
    // and the grant still works.
    wait_for_mirror(&hold, 1);
    let before = hold
        .checked()
        .expect("the kernel check runs on this kernel");
    let (_, again) = resolve(&world, ALLOWED);
    eprintln!("answer with nothing new took {again:?} end to end");
    let after = hold.checked().unwrap();
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1, 0),
        "an answer with nothing new went on at once (passed, queued)"
    );
    assert!(connects(&world, service), "granted after the unheld answer");

    // A name the policy does not allow, and an address nobody resolved: blocked.
    assert_eq!(resolve(&world, OTHER).0, other);
    assert!(!connects(&world, other), "a name the policy does not allow");
    assert!(
        !connects(&world, literal),
        "an address literal nobody resolved"
    );

    // TTL 1 s plus grace 3 s: gone after that (the kernel's timeout, no agent action needed).
    std::thread::sleep(Duration::from_millis(4_500));
    assert!(
        !connects(&world, service),
        "still reachable after the TTL plus the grace"
    );
    // Resolved again after the grant ended: the answer must wait for a new grant (the kernel check
    // never lets an answer through on a grant that ended, whatever the grace).
    resolve(&world, ALLOWED);
    assert!(
        connects(&world, service),
        "the grant was not made anew after it ended"
    );
    drop(hold);
}

/// Waits until the kernel check's mirror holds `entries` grants: it is written just after an answer
/// went on, so an answer sent right behind may still be queued once.
fn wait_for_mirror(hold: &network_enforcer_agent::enforce::dns_hold::Hold, entries: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while hold.mirrored() < Some(entries) {
        assert!(
            std::time::Instant::now() < deadline,
            "the kernel check's mirror never got {entries} grants"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_answer_waits_again_once_the_pods_allowances_change() {
    require_root();
    let world = World::new(5);
    serve_dns(&world, 60);
    serve_tcp(&world);
    let hold = world.hold(&[ALLOWED], Duration::from_secs(30));
    let service = world.services[0];
    let checked = || {
        hold.checked()
            .expect("the kernel check runs on this kernel")
    };
    let install = |ruleset| {
        let hold = hold.clone();
        world
            .router
            .run(move || hold.install(&ruleset, None))
            .expect("installing the table");
    };
    assert_eq!(resolve(&world, ALLOWED).0, service);
    let granted = checked();
    // As above: the next answer only once the check's mirror has the grant (a loaded CI machine sent
    // it before, and it was queued).
    wait_for_mirror(&hold, 1);
    resolve(&world, ALLOWED);
    assert_eq!(
        checked(),
        (granted.0 + 1, granted.1),
        "nothing new: at once"
    );

    // The same allowances installed again (pods come and go on a node): still nothing new.
    install(world.ruleset(&[ALLOWED]));
    resolve(&world, ALLOWED);
    assert_eq!(
        checked(),
        (granted.0 + 2, granted.1),
        "same allowances: at once"
    );

    // The allowance now names another port: the answer may grant more, so it waits for the agent
    // once, and the next goes on at once again.
    let mut wider = world.ruleset(&[ALLOWED]);
    let egress = wider.pods[0].egress.as_mut().unwrap();
    let mut allowance = (*egress.names[0]).clone();
    let mut other = allowance.ports[0];
    (other.first, other.last) = (9443, 9443);
    allowance.ports.push(other);
    egress.names[0] = std::sync::Arc::new(allowance);
    install(wider);
    resolve(&world, ALLOWED);
    assert_eq!(
        checked(),
        (granted.0 + 2, granted.1 + 1),
        "wider allowance: queued"
    );
    // The new allowances emptied the check's mirror; the queued answer's grant refills it.
    wait_for_mirror(&hold, 1);
    resolve(&world, ALLOWED);
    assert_eq!(
        checked(),
        (granted.0 + 3, granted.1 + 1),
        "then at once again"
    );
    assert!(connects(&world, service));
}

/// A second entry allowing the name on a range that starts at the first entry's port: one grant of
/// the merged range, and the first SYN goes through. The kernel refuses a set element that shares a
/// first or last port with another of the same pod and address; before the merge that failed the
/// answer's whole write, and the pod waited for the controller's rendering.
#[test]
fn entries_whose_ports_share_a_first_port_grant_the_name_at_once() {
    require_root();
    let world = World::new(6);
    serve_dns(&world, 60);
    serve_tcp(&world);
    let hold = world.hold(&[ALLOWED], Duration::from_secs(30));
    let mut ruleset = world.ruleset(&[ALLOWED]);
    let egress = ruleset.pods[0].egress.as_mut().unwrap();
    let mut second = (*egress.names[0]).clone();
    second.ports.iter_mut().for_each(|p| p.last = p.first + 1);
    egress.names.push(std::sync::Arc::new(second));
    let installed = hold.clone();
    world
        .router
        .run(move || installed.install(&ruleset, None))
        .expect("installing the table");
    let service = world.services[0];
    assert_eq!(resolve(&world, ALLOWED).0, service);
    assert!(
        connects(&world, service),
        "first connection after the answer failed"
    );
}

#[test]
fn without_a_reader_the_queue_rule_lets_dns_through() {
    require_root();
    use network_enforcer_agent::enforce::dns_hold::queue_rule::{self, Family};
    let world = World::new(2);
    serve_dns(&world, 30);
    // The rule, with nobody reading its queue (an agent that stopped).
    let script = "table inet t {\n chain hold {\n }\n chain forward {\n  type filter hook forward priority filter; policy accept;\n  udp sport 53 jump hold\n }\n}\n";
    let mut nft = std::process::Command::new("ip")
        .args(["netns", "exec", &world.router.name, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut nft.stdin.take().unwrap(), script.as_bytes()).unwrap();
    assert!(nft.wait().unwrap().success());
    world
        .router
        .run(|| queue_rule::insert(Family::Inet, "t", "hold", (QUEUE, QUEUE), None))
        .expect("the queue rule");
    let (address, took) = resolve(&world, ALLOWED);
    assert_eq!(address, world.services[0]);
    assert!(took < Duration::from_secs(1), "{took:?}");
}

/// Grants written over netlink are the elements `nft` would write: a new one with its timeout, an
/// extended one with its new timeout, IPv4 and IPv6, single ports and ranges.
#[test]
fn grants_written_over_netlink_are_the_elements_nft_lists() {
    require_root();
    use network_enforcer_agent::enforce::compile::{PortRange, Ruleset};
    use network_enforcer_agent::enforce::dns_hold::grants::Grant;
    use network_enforcer_agent::enforce::dns_hold::set_elements;
    use network_enforcer_agent::enforce::nft;
    use network_enforcer_api::Protocol;
    let world = World::new(4);
    let mut ruleset: Ruleset = world.ruleset(&[ALLOWED]);
    ruleset.pods[0].ips.push("fd00:214:4::1".parse().unwrap());
    let script = nft::render(&ruleset, "t", None);
    let ns = world.router.name.clone();
    let apply = |script: String| {
        let mut child = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), script.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success());
    };
    apply(script);
    let grant = |pod: &str, address: &str, protocol, first, last| Grant {
        pod: pod.parse().unwrap(),
        address: address.parse().unwrap(),
        ports: PortRange {
            protocol,
            first,
            last,
        },
    };
    let v4 = grant("10.214.4.1", "198.51.100.10", Protocol::TCP, 443, 443);
    let range = grant("10.214.4.1", "198.51.100.11", Protocol::UDP, 9000, 9010);
    let v6 = grant("fd00:214:4::1", "2001:db8::7", Protocol::TCP, 8443, 8443);
    let s = Duration::from_secs;
    world
        .router
        .run(move || set_elements::write("t", &[(v4, s(30)), (range, s(40)), (v6, s(50))], &[]))
        .expect("writing grants");
    // Extended: the same element, a later end.
    world
        .router
        .run(move || set_elements::write("t", &[], &[(v4, s(300))]))
        .expect("extending a grant");
    let listed = |set: &str| {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "nft", "list", "set", "inet", "t", set])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let (four, six) = (listed("names4"), listed("names6"));
    for (text, expected) in [
        (&four, "10.214.4.1 . 198.51.100.10 . tcp . 443 timeout 5m"),
        (
            &four,
            "10.214.4.1 . 198.51.100.11 . udp . 9000-9010 timeout 40s",
        ),
        (&six, "fd00:214:4::1 . 2001:db8::7 . tcp . 8443 timeout 50s"),
    ] {
        assert!(text.contains(expected), "{expected} not in\n{text}");
    }
    assert_eq!(four.matches(" . tcp . 443 ").count(), 1, "{four}");
    // A grant the set cannot hold (no such table) is refused, not ignored.
    assert!(
        world
            .router
            .run(move || set_elements::write("missing", &[(v4, s(30))], &[]))
            .is_err()
    );
}
