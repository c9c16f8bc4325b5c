//! Kernel tests of the DNS hold (`agent/src/enforce/dns_hold`).

mod support;

use network_enforcer_agent::enforce::dns_hold::queue_rule::{self, Family};
use std::net::UdpSocket;
use std::time::{Duration, Instant};
use support::{PodPair, require_root, sh};

#[test]
fn an_answer_queued_by_the_xt_rule_waits_for_the_verdict() {
    require_root();
    let pods = PodPair::new();
    let (client_ip, server_ip) = (pods.v4(1), pods.v4(2));
    let script = "table inet hold_t {\n chain hold {\n }\n chain output {\n  type filter hook output priority filter; policy accept;\n  udp sport 53 jump hold\n }\n}\n";
    let ns = pods.b.name.clone();
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", &ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
    pods.b
        .run(|| queue_rule::append(Family::Inet, "hold_t", "hold", 8411))
        .expect("the xt NFQUEUE rule");
    sh("ip", &["netns", "exec", &ns, "nft", "list", "ruleset"]);
    let reader = pods.b.spawn(|| {
        let mut q = nfq::Queue::open().unwrap();
        q.bind(8411).unwrap();
        let mut msg = q.recv().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        msg.set_verdict(nfq::Verdict::Accept);
        q.verdict(msg).unwrap();
    });
    std::thread::sleep(Duration::from_millis(200));
    let client = pods.a.run(move || UdpSocket::bind((client_ip, 0)).unwrap());
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let client_at = client.local_addr().unwrap();
    let start = Instant::now();
    pods.b.run(move || {
        let s = UdpSocket::bind((server_ip, 53)).unwrap();
        s.send_to(b"answer", client_at).unwrap();
    });
    let mut buf = [0u8; 64];
    let n = client.recv(&mut buf).unwrap();
    let waited = start.elapsed();
    assert_eq!(&buf[..n], b"answer");
    reader.join().unwrap();
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    eprintln!("held for {waited:?}");
}
