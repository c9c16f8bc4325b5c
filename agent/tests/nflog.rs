//! Kernel test: packets dropped by an nftables rule that logs to an NFLOG group come back from
//! `enforce::nflog` as [`Denied`] records, once per attempt however often the sender retries.
//!
//! Needs root (CI runs as root) and nftables. NFLOG groups belong to a network namespace, so each test
//! installs its table and binds its group inside its own pair of namespaces: nothing on the machine
//! (or in a parallel test) can see or disturb its denials.

mod support;

use network_enforcer_agent::enforce::nflog::{self, Denied, DenyDirection, Nflog, NflogOptions};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;
use support::{Netns, PodPair, sh};

/// Any group works: groups are per network namespace and each test has its own.
const GROUP: u16 = 7;

/// Installs `table inet nflog_test` in `ns`, one chain on `hook` holding `rules`.
fn install_table(ns: &Netns, hook: &str, rules: &[String]) {
    let mut script = format!(
        "table inet nflog_test {{\n  chain {hook} {{\n    type filter hook {hook} priority 0; policy accept;\n"
    );
    for rule in rules {
        script.push_str(&format!("    {rule}\n"));
    }
    script.push_str("  }\n}\n");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), script).unwrap();
    sh(
        "ip",
        &[
            "netns",
            "exec",
            &ns.name,
            "nft",
            "-f",
            file.path().to_str().unwrap(),
        ],
    );
}

/// Binds the group in `ns`: the reader's socket is created on a thread inside it.
fn spawn_reader(ns: &Netns) -> Nflog {
    let runtime = tokio::runtime::Handle::current();
    ns.run(move || {
        let _entered = runtime.enter();
        nflog::spawn(GROUP, &NflogOptions::default())
    })
    .expect("binding the NFLOG group (needs root and nfnetlink_log)")
}

/// Every denial received until `until` ends plus a short grace period, so duplicates are caught too.
/// `until` yields the sender's source port.
async fn collect_until(
    nflog: &mut Nflog,
    until: tokio::task::JoinHandle<u16>,
) -> (Vec<Denied>, u16) {
    let mut seen = Vec::new();
    let mut until = Box::pin(until);
    let source = loop {
        tokio::select! {
            Some(denied) = nflog.denied.recv() => seen.push(denied),
            joined = &mut until => break joined.expect("the sender thread"),
        }
    };
    let grace = tokio::time::Instant::now() + Duration::from_millis(500);
    while let Ok(Some(denied)) = tokio::time::timeout_at(grace, nflog.denied.recv()).await {
        seen.push(denied);
    }
    (seen, source)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_tcp_connect_is_reported_once_despite_syn_retransmits() {
    support::require_root();
    let pods = PodPair::new();
    let port = 47_001;
    // Pod b refuses port `port` on ingress; another port is refused silently, as a control.
    install_table(
        &pods.b,
        "input",
        &[
            format!("tcp dport {port} log prefix \"ne-deny ingress\" group {GROUP} drop"),
            format!("tcp dport {} drop", port + 1),
        ],
    );
    let mut nflog = spawn_reader(&pods.b);

    let destination = SocketAddr::new(pods.v4(2), port);
    // The client in pod a: its SYN is retransmitted after 1 s and 3 s while the connect hangs.
    let client = pods.a.spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("0.0.0.0:0".parse().unwrap()).unwrap();
            let source = socket.local_addr().unwrap();
            let attempt =
                tokio::time::timeout(Duration::from_millis(3_500), socket.connect(destination))
                    .await;
            assert!(
                attempt.is_err(),
                "the connect must hang while its SYNs are dropped: {attempt:?}"
            );
            source.port()
        })
    });
    let client = tokio::task::spawn_blocking(move || client.join().unwrap());
    let (seen, source_port) = collect_until(&mut nflog, client).await;

    let expected = Denied {
        direction: DenyDirection::Ingress,
        protocol: 6,
        source: SocketAddr::new(pods.v4(1), source_port),
        destination,
    };
    assert_eq!(
        seen,
        vec![expected],
        "exactly one denial for the refused connection (the silent rule logs nothing)"
    );
    let repeats = nflog.counters.deduplicated.load(Ordering::Relaxed);
    assert!(
        repeats >= 1,
        "the retransmitted SYNs were logged by the kernel and suppressed as repeats: {repeats}"
    );
    assert_eq!(nflog.counters.malformed.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_udp_over_ipv6_is_reported_once_and_foreign_prefixes_are_ignored() {
    support::require_root();
    let pods = PodPair::new();
    let (port, foreign) = (47_101, 47_102);
    // Pod a refuses sending to `port` (egress); another rule logs to the same group with a prefix
    // that is not ours.
    install_table(
        &pods.a,
        "output",
        &[
            format!("udp dport {port} log prefix \"ne-deny egress\" group {GROUP} drop"),
            format!("udp dport {foreign} log prefix \"someone else\" group {GROUP} drop"),
        ],
    );
    let mut nflog = spawn_reader(&pods.a);

    let destination = SocketAddr::new(pods.v6(2), port);
    let other = SocketAddr::new(pods.v6(2), foreign);
    let sender = pods.a.spawn(move || {
        let socket = std::net::UdpSocket::bind("[::]:0").unwrap();
        for _ in 0..3 {
            // Dropped in the output hook: the send itself reports EPERM.
            let _ = socket.send_to(b"hello", destination);
            let _ = socket.send_to(b"hello", other);
            std::thread::sleep(Duration::from_millis(100));
        }
        socket.local_addr().unwrap().port()
    });
    let sender = tokio::task::spawn_blocking(move || sender.join().unwrap());
    let (seen, source_port) = collect_until(&mut nflog, sender).await;

    let expected = Denied {
        direction: DenyDirection::Egress,
        protocol: 17,
        source: SocketAddr::new(pods.v6(1), source_port),
        destination,
    };
    assert_eq!(seen, vec![expected], "one denial for three datagrams");
    let counters = &nflog.counters;
    // The kernel flushes its batches every 100 ms; give a loaded machine a little more.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while counters.other_prefix.load(Ordering::Relaxed) < 3 && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(counters.deduplicated.load(Ordering::Relaxed), 2);
    assert_eq!(counters.other_prefix.load(Ordering::Relaxed), 3);
    assert_eq!(counters.malformed.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_group_already_bound_is_refused_with_what_to_do_and_freed_on_drop() {
    support::require_root();
    let ns = Netns::new();
    let runtime = tokio::runtime::Handle::current();
    let (second, third) = ns.run(move || {
        let _entered = runtime.enter();
        let open = || nflog::NflogReader::open(GROUP, nflog::DEFAULT_COPY_RANGE);
        let first = open().expect("the first bind of the group");
        let second = open().map(drop);
        drop(first);
        // The kernel frees the group when it releases the socket, which may lag the close.
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        let third = loop {
            match open() {
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                result => break result.map(drop),
            }
        };
        (second, third)
    });
    let error = second
        .expect_err("a second socket on the same group")
        .to_string();
    assert!(
        error.contains(&format!("group {GROUP}")) && error.contains("another NFLOG group"),
        "{error}"
    );
    third.expect("the group is free again once its reader is dropped");
}
