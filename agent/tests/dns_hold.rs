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
    let hold = world.hold(&[ALLOWED], Duration::from_secs(1));

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
    // The same answer again: nothing new to install.
    let (_, again) = resolve(&world, ALLOWED);
    eprintln!("answer with nothing new took {again:?} end to end");

    // A name the policy does not allow, and an address nobody resolved: blocked.
    assert_eq!(resolve(&world, OTHER).0, other);
    assert!(!connects(&world, other), "a name the policy does not allow");
    assert!(
        !connects(&world, literal),
        "an address literal nobody resolved"
    );

    // TTL 1 s plus grace 1 s: gone after that (the kernel's timeout, no agent action needed).
    std::thread::sleep(Duration::from_millis(2_500));
    assert!(
        !connects(&world, service),
        "still reachable after the TTL plus the grace"
    );
    drop(hold);
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
        .run(|| queue_rule::append(Family::Inet, "t", "hold", QUEUE))
        .expect("the queue rule");
    let (address, took) = resolve(&world, ALLOWED);
    assert_eq!(address, world.services[0]);
    assert!(took < Duration::from_secs(1), "{took:?}");
}
