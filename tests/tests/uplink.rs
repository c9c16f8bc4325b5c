//! The uplink against the controller's real ingest service on loopback (no cluster, no root): batches
//! are delivered and acknowledged, a batch sent while the controller is down arrives once it is back, a
//! wrong token is retried (with the token file re-read) without the task ending, batches stay within the
//! controller's limits, and the sender never blocks. A stand-in server that reads but does not acknowledge
//! shows batches in flight when a stream dies being resent on the next.
//!
//! The controller's index is empty, so it refuses every record as "not on the node": that refusal, counted
//! in the acks, is the proof that the controller really read the records.

use network_enforcer_agent::uplink::{self, UplinkConfig, UplinkCounters};
use network_enforcer_api::backoff::Backoff;
use network_enforcer_api::uplink::flow_uplink_server::FlowUplinkServer;
use network_enforcer_api::uplink::{FlowRecord, LocalPod};
use network_enforcer_controller::app::{Acknowledge, App};
use network_enforcer_controller::cluster::index::Index;
use network_enforcer_controller::cluster::watches::SharedIndex;
use network_enforcer_controller::ingest::tls::{self, TlsServerConfig};
use network_enforcer_controller::ingest::{AgentIdentity, Authenticate, Limits};
use network_enforcer_tests::stand_in_controller::Recorder;
use network_enforcer_tests::wait;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Status;

const TOKEN: &str = "agent-token";
const NODE: &str = "node-1";

/// Accepts exactly [`TOKEN`], as the agent on [`NODE`].
struct FixedToken;

#[tonic::async_trait]
impl Authenticate for FixedToken {
    async fn authenticate(&self, token: &str) -> Result<AgentIdentity, Status> {
        if token == TOKEN {
            Ok(AgentIdentity {
                node: NODE.into(),
                pod: "network-enforcer/agent-x".into(),
            })
        } else {
            Err(Status::unauthenticated("unknown token"))
        }
    }
}

/// The controller's ingest endpoint on a runtime of its own, so that stopping it drops every
/// connection at once, as a crashed controller process would (a graceful shutdown would wait forever
/// for the agent's long-lived stream).
struct Controller {
    runtime: Option<tokio::runtime::Runtime>,
    addr: SocketAddr,
}

impl Controller {
    /// Starts on `addr` (port 0: any) with generous limits.
    async fn start(addr: SocketAddr) -> Self {
        Self::start_with(
            addr,
            Limits {
                max_records_per_batch: 100,
                max_batches_per_second: 1000,
            },
        )
        .await
    }

    /// Starts the real ingest service on `addr` with `limits`.
    async fn start_with(addr: SocketAddr, limits: Limits) -> Self {
        Self::start_serving(addr, limits, None).await
    }

    /// Starts the real ingest service over TLS, as the controller serves it with certificate files.
    async fn start_tls(tls: Arc<TlsServerConfig>) -> Self {
        Self::start_serving(
            "127.0.0.1:0".parse().unwrap(),
            Limits {
                max_records_per_batch: 100,
                max_batches_per_second: 1000,
            },
            Some(tls),
        )
        .await
    }

    async fn start_serving(
        addr: SocketAddr,
        limits: Limits,
        tls: Option<Arc<TlsServerConfig>>,
    ) -> Self {
        Self::serve(addr, tls, move || {
            // Nothing reaches the writer (every record is refused first); it needs a client all the same.
            App::builder(
                network_enforcer_tests::fixture::offline_client(),
                network_enforcer_api::Backend::Kubernetes,
            )
            .index(Arc::new(SharedIndex::listed(Index::default())))
            .ingest_limits(limits)
            .acknowledge(Acknowledge::OnceMerged)
            .build()
            .ingest(Arc::new(FixedToken))
            .into_server()
        })
        .await
    }

    /// Serves what `service` makes (inside the server's runtime) on `addr`, retrying while the
    /// previous listener on that port closes.
    async fn serve<S>(
        addr: SocketAddr,
        tls: Option<Arc<TlsServerConfig>>,
        service: impl FnOnce() -> S + Send + 'static,
    ) -> Self
    where
        S: tonic::server::NamedService
            + tonic::codegen::Service<
                tonic::codegen::http::Request<tonic::body::Body>,
                Response = tonic::codegen::http::Response<tonic::body::Body>,
                Error = std::convert::Infallible,
            > + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the controller");
        let (ready, bound) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            // The old server's connections linger on this port.
            let listener = wait::listen_again(addr).await.expect("listening again");
            ready.send(listener.local_addr().unwrap()).unwrap();
            let router = tonic::transport::Server::builder().add_service(service());
            match tls {
                Some(tls) => router
                    .serve_with_incoming(tls::incoming(listener, tls, || {}))
                    .await
                    .unwrap(),
                None => router
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                    .await
                    .unwrap(),
            }
        });
        let addr = bound.await.expect("the controller binds");
        Self {
            runtime: Some(runtime),
            addr,
        }
    }

    /// Kills the server and every connection it holds.
    fn stop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A token file of its own for each test, removed on drop.
struct TokenFile(PathBuf);

impl TokenFile {
    fn new(test: &str, token: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("ne-uplink-{test}-{}.token", std::process::id()));
        std::fs::write(&path, token).unwrap();
        Self(path)
    }

    fn write(&self, token: &str) {
        std::fs::write(&self.0, token).unwrap();
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn config(addr: SocketAddr, token: &TokenFile) -> UplinkConfig {
    UplinkConfig {
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(300),
        },
        ..UplinkConfig::new(format!("http://{addr}"), &token.0, NODE).insecure()
    }
}

fn records(n: usize) -> Vec<FlowRecord> {
    (0..n)
        .map(|i| FlowRecord {
            local: Some(LocalPod {
                namespace: "shop".into(),
                name: format!("client-{i}"),
                uid: String::new(),
            }),
            peer_ip: vec![10, 0, 0, 2],
            port: 8080,
            protocol: 1,
            direction: 1,
            outcome: 1,
            count: 1,
            source: 1,
            ..FlowRecord::default()
        })
        .collect()
}

fn snapshot(c: &UplinkCounters) -> String {
    format!(
        "sent {} acked {} dropped {} reconnects {} accepted {} rejected {} pending {}",
        c.batches_sent.get(),
        c.batches_acked.get(),
        c.batches_dropped.get(),
        c.reconnects.get(),
        c.records_accepted.get(),
        c.records_rejected.get(),
        c.pending_batches.get()
    )
}

/// Waits up to 20 s for `done`, failing with the counters.
async fn eventually(what: &str, counters: &UplinkCounters, done: impl Fn(&UplinkCounters) -> bool) {
    network_enforcer_tests::wait::until(
        what,
        Duration::from_secs(20),
        Duration::from_millis(10),
        || done(counters),
        || snapshot(counters),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn batches_are_delivered_and_acknowledged() {
    let controller = Controller::start("127.0.0.1:0".parse().unwrap()).await;
    let token = TokenFile::new("delivered", TOKEN);
    let counters = UplinkCounters::default();
    let (sender, task) = uplink::spawn(config(controller.addr, &token), counters.clone()).unwrap();
    for n in [1, 2, 3] {
        assert!(sender.send(records(n)));
    }
    eventually("three acks", &counters, |c| c.batches_acked.get() == 3).await;
    assert_eq!(
        counters.records_rejected.get(),
        6,
        "the controller read all 6 records (and refused them: its index is empty)"
    );
    assert_eq!(counters.records_accepted.get(), 0);
    assert_eq!(counters.batches_sent.get(), 3);
    assert_eq!(counters.batches_dropped.get(), 0);
    assert_eq!(counters.reconnects.get(), 0);
    assert_eq!(counters.pending_batches.get(), 0);
    // With every sender gone and everything acknowledged, the task ends by itself.
    drop(sender);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the uplink task ends once everything is acknowledged")
        .unwrap();
}

#[tokio::test]
async fn a_batch_sent_while_the_controller_is_down_is_delivered_after_it_returns() {
    let mut controller = Controller::start("127.0.0.1:0".parse().unwrap()).await;
    let addr = controller.addr;
    let token = TokenFile::new("down", TOKEN);
    let counters = UplinkCounters::default();
    let (sender, task) = uplink::spawn(config(addr, &token), counters.clone()).unwrap();
    assert!(sender.send(records(1)));
    eventually("the first ack", &counters, |c| c.batches_acked.get() == 1).await;

    controller.stop();
    eventually("the uplink to notice", &counters, |c| {
        c.reconnects.get() >= 1
    })
    .await;
    assert!(
        sender.send(records(2)),
        "the sender never waits for the controller"
    );
    eventually("the batch to be held", &counters, |c| {
        c.pending_batches.get() == 1
    })
    .await;
    // Another attempt to reach the stopped controller, and the batch is still held.
    let reconnects = counters.reconnects.get();
    eventually("another reconnect attempt", &counters, |c| {
        c.reconnects.get() > reconnects
    })
    .await;
    assert_eq!(counters.batches_acked.get(), 1, "{}", snapshot(&counters));
    assert!(!task.is_finished());

    let _controller = Controller::start(addr).await;
    eventually("the held batch's ack", &counters, |c| {
        c.batches_acked.get() == 2
    })
    .await;
    assert_eq!(
        counters.records_rejected.get(),
        3,
        "the held batch's 2 records reached the restarted controller"
    );
    assert_eq!(counters.pending_batches.get(), 0);
    assert_eq!(counters.batches_dropped.get(), 0);
    drop(sender);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the uplink task ends")
        .unwrap();
}

#[tokio::test]
async fn a_wrong_token_is_retried_and_the_file_is_read_again_at_each_connect() {
    let controller = Controller::start("127.0.0.1:0".parse().unwrap()).await;
    let token = TokenFile::new("wrong", "not-the-token\n");
    let counters = UplinkCounters::default();
    let (sender, task) = uplink::spawn(config(controller.addr, &token), counters.clone()).unwrap();
    assert!(sender.send(records(1)));
    eventually("several refused attempts", &counters, |c| {
        c.reconnects.get() >= 3
    })
    .await;
    assert_eq!(counters.batches_acked.get(), 0);
    assert_eq!(counters.pending_batches.get(), 1, "the batch is kept");
    assert!(
        !task.is_finished(),
        "a refused token does not end the uplink"
    );

    // The kubelet rotates the projected token: the next connect reads the new one.
    token.write(TOKEN);
    eventually("the ack after the token changed", &counters, |c| {
        c.batches_acked.get() == 1
    })
    .await;
    assert_eq!(counters.records_rejected.get(), 1);
    task.abort();
}

#[tokio::test]
async fn the_sender_never_blocks_and_every_batch_is_either_held_or_counted_as_dropped() {
    // A port nothing listens on: the uplink can never deliver.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let token = TokenFile::new("blocked", TOKEN);
    let counters = UplinkCounters::default();
    let config = UplinkConfig {
        max_pending_batches: 5,
        queue_batches: 2,
        ..config(closed, &token)
    };
    let (sender, task) = uplink::spawn(config, counters.clone()).unwrap();
    // Rounds of sends, with pauses in which the task empties the queue into its resend buffer.
    let (rounds, per_round) = (10, 100);
    let sent = rounds * per_round;
    let mut accepted = 0;
    for _ in 0..rounds {
        let started = Instant::now();
        accepted += (0..per_round).filter(|_| sender.send(records(1))).count();
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "{per_round} sends took {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(accepted < sent, "a queue of 2 cannot take {sent} batches");
    assert!(
        accepted > 5,
        "the queue was emptied between rounds ({accepted} taken), so the buffer overflowed"
    );
    // Once the task has drained the queue, each batch is either held for resending or counted as lost.
    eventually("the queue to drain", &counters, |c| {
        c.pending_batches.get() as u64 + c.batches_dropped.get() == sent as u64
    })
    .await;
    assert_eq!(counters.pending_batches.get(), 5, "the buffer is full");
    assert_eq!(counters.batches_acked.get(), 0);
    assert!(!task.is_finished());
    task.abort();
}

#[tokio::test]
async fn batches_are_split_and_paced_to_stay_within_the_controllers_limits() {
    // Breaking a limit ends the stream, and resending the same batch would break it again forever.
    let controller = Controller::start_with(
        "127.0.0.1:0".parse().unwrap(),
        Limits {
            max_records_per_batch: 100,
            max_batches_per_second: 5,
        },
    )
    .await;
    let token = TokenFile::new("limits", TOKEN);
    let counters = UplinkCounters::default();
    let config = UplinkConfig {
        max_records_per_batch: 100,
        max_batches_per_second: 4,
        ..config(controller.addr, &token)
    };
    let (sender, task) = uplink::spawn(config, counters.clone()).unwrap();
    let started = Instant::now();
    assert!(sender.send(records(250)), "split into 100 + 100 + 50");
    for _ in 0..5 {
        assert!(sender.send(records(1)));
    }
    eventually("eight acks", &counters, |c| c.batches_acked.get() == 8).await;
    assert_eq!(counters.records_rejected.get(), 255, "every record arrived");
    assert_eq!(
        counters.reconnects.get(),
        0,
        "the controller never cut the stream: {}",
        snapshot(&counters)
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1700),
        "8 batches at 4/s take at least 7 intervals of 250 ms, took {:?}",
        started.elapsed()
    );
    drop(sender);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the uplink task ends")
        .unwrap();
}

#[tokio::test]
async fn a_batch_in_flight_when_the_stream_died_is_resent_on_the_next_one() {
    let silent_seen = Arc::new(Mutex::new(Vec::new()));
    let seen = silent_seen.clone();
    let mut silent = Controller::serve("127.0.0.1:0".parse().unwrap(), None, move || {
        FlowUplinkServer::new(Recorder { seen, acks: false })
    })
    .await;
    let addr = silent.addr;
    let token = TokenFile::new("in-flight", TOKEN);
    let counters = UplinkCounters::default();
    let (sender, task) = uplink::spawn(config(addr, &token), counters.clone()).unwrap();
    assert!(sender.send(records(1)));
    assert!(sender.send(records(1)));
    wait::until(
        "the controller to read both batches",
        Duration::from_secs(20),
        Duration::from_millis(10),
        || silent_seen.lock().unwrap().len() >= 2,
        || snapshot(&counters),
    )
    .await
    .unwrap();
    // The controller read both batches and dies before acknowledging them.
    silent.stop();
    assert_eq!(*silent_seen.lock().unwrap(), [1, 2]);

    let acking_seen = Arc::new(Mutex::new(Vec::new()));
    let seen = acking_seen.clone();
    let _acking = Controller::serve(addr, None, move || {
        FlowUplinkServer::new(Recorder { seen, acks: true })
    })
    .await;
    eventually("both acks", &counters, |c| c.batches_acked.get() == 2).await;
    assert_eq!(
        *acking_seen.lock().unwrap(),
        [1, 2],
        "the same batches again, same sequence numbers, in order"
    );
    assert_eq!(counters.batches_sent.get(), 4, "{}", snapshot(&counters));
    assert_eq!(counters.pending_batches.get(), 0);
    drop(sender);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the uplink task ends")
        .unwrap();
}

/// A CA and a controller certificate it signed for `name`, as PEM files in a directory of their own.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ne-uplink-tls-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// Writes `<prefix>ca.crt`, and `tls.crt` / `tls.key` for `name` signed by that CA.
    fn issue(&self, prefix: &str, name: &str) {
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{prefix}test CA"));
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        std::fs::write(self.path(&format!("{prefix}ca.crt")), ca.pem()).unwrap();
        // Key first: a reload between the two writes sees a mismatched pair and keeps the old one.
        std::fs::write(self.path("tls.key"), key.serialize_pem()).unwrap();
        std::fs::write(self.path("tls.crt"), cert.pem()).unwrap();
    }

    /// The controller's TLS configuration from `tls.crt` / `tls.key`, reloaded when they change.
    fn server(&self) -> Arc<TlsServerConfig> {
        let cert =
            tls::ReloadingCert::new(self.path("tls.crt"), self.path("tls.key"), |_| {}).unwrap();
        tls::server_config(Arc::new(cert)).unwrap()
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The name in the controller's certificate: the Service's DNS name, not the address dialled.
const SERVER_NAME: &str = "network-enforcer-controller.network-enforcer.svc";

fn tls_config(addr: SocketAddr, token: &TokenFile, ca: PathBuf) -> UplinkConfig {
    UplinkConfig {
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(300),
        },
        ..UplinkConfig::new(format!("https://{addr}"), &token.0, NODE)
            .tls(ca, Some(SERVER_NAME.into()))
    }
}

#[tokio::test]
async fn over_tls_batches_are_delivered_and_acknowledged() {
    let pki = Pki::new("delivered");
    pki.issue("", SERVER_NAME);
    let controller = Controller::start_tls(pki.server()).await;
    let token = TokenFile::new("tls-delivered", TOKEN);
    let counters = UplinkCounters::default();
    let config = tls_config(controller.addr, &token, pki.path("ca.crt"));
    let (sender, task) = uplink::spawn(config, counters.clone()).unwrap();
    for n in [1, 2] {
        assert!(sender.send(records(n)));
    }
    eventually("two acks over TLS", &counters, |c| {
        c.batches_acked.get() == 2
    })
    .await;
    assert_eq!(
        counters.records_rejected.get(),
        3,
        "the controller read the records"
    );
    assert_eq!(counters.reconnects.get(), 0);
    drop(sender);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the uplink task ends once everything is acknowledged")
        .unwrap();
}

#[tokio::test]
async fn a_controller_certificate_from_another_ca_is_refused_with_a_clear_error() {
    let pki = Pki::new("wrong-ca");
    pki.issue("other-", "somewhere-else");
    pki.issue("", SERVER_NAME);
    let controller = Controller::start_tls(pki.server()).await;
    let token = TokenFile::new("tls-wrong-ca", TOKEN);
    let wrong = tls_config(controller.addr, &token, pki.path("other-ca.crt"));
    let error = uplink::connect(&wrong).await.unwrap_err().to_string();
    assert!(
        error.contains("invalid peer certificate") && error.contains("UnknownIssuer"),
        "{error}"
    );
    // The right CA but a name the certificate does not carry: refused too.
    let mut wrong_name = tls_config(controller.addr, &token, pki.path("ca.crt"));
    wrong_name.server_name = Some("impostor.example".into());
    let error = uplink::connect(&wrong_name).await.unwrap_err().to_string();
    assert!(error.contains("invalid peer certificate"), "{error}");
    // The uplink keeps retrying and delivers nothing.
    let counters = UplinkCounters::default();
    let (sender, task) = uplink::spawn(wrong, counters.clone()).unwrap();
    assert!(sender.send(records(1)));
    eventually("two failed connects", &counters, |c| {
        c.reconnects.get() >= 2
    })
    .await;
    assert_eq!(counters.batches_acked.get(), 0);
    assert_eq!(
        counters.batches_sent.get(),
        0,
        "nothing crossed an untrusted connection"
    );
    task.abort();
    // The right CA connects.
    let right = tls_config(controller.addr, &token, pki.path("ca.crt"));
    uplink::connect(&right).await.unwrap();
}

#[tokio::test]
async fn plaintext_is_refused_without_the_insecure_flag_and_does_not_reach_a_tls_controller() {
    let pki = Pki::new("plaintext");
    pki.issue("", SERVER_NAME);
    let controller = Controller::start_tls(pki.server()).await;
    let token = TokenFile::new("tls-plaintext", TOKEN);
    let url = format!("http://{}", controller.addr);
    let refused = uplink::spawn(
        UplinkConfig::new(url.clone(), &token.0, NODE),
        UplinkCounters::default(),
    )
    .unwrap_err();
    assert!(
        matches!(refused, uplink::UplinkError::Plaintext(_)),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("--controller-insecure"),
        "{refused}"
    );
    // Even when allowed, plaintext gets nowhere with a TLS controller.
    let insecure = UplinkConfig::new(url, &token.0, NODE).insecure();
    let counters = UplinkCounters::default();
    let (sender, task) = uplink::spawn(insecure, counters.clone()).unwrap();
    assert!(sender.send(records(1)));
    eventually("two failed attempts", &counters, |c| {
        c.reconnects.get() >= 2
    })
    .await;
    assert_eq!(counters.batches_acked.get(), 0);
    task.abort();
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_restarting_the_listener() {
    let pki = Pki::new("rotated");
    pki.issue("first-", SERVER_NAME);
    let controller = Controller::start_tls(pki.server()).await;
    let token = TokenFile::new("tls-rotated", TOKEN);
    let first = tls_config(controller.addr, &token, pki.path("first-ca.crt"));
    // A stream opened before the rotation...
    let counters = UplinkCounters::default();
    let (sender, task) = uplink::spawn(first.clone(), counters.clone()).unwrap();
    assert!(sender.send(records(1)));
    eventually("the first ack", &counters, |c| c.batches_acked.get() == 1).await;
    // ...cert-manager rotates to a certificate of a new CA.
    pki.issue("second-", SERVER_NAME);
    let second = tls_config(controller.addr, &token, pki.path("second-ca.crt"));
    wait::eventually(
        "the new certificate to be served",
        Duration::from_secs(20),
        Duration::from_millis(100),
        || async { uplink::connect(&second).await.map(Some).map_err(Into::into) },
        String::new,
    )
    .await
    .unwrap();
    // New connections present the new certificate only; the old stream still works.
    assert!(uplink::connect(&first).await.is_err());
    assert!(sender.send(records(1)));
    eventually("the second ack on the old stream", &counters, |c| {
        c.batches_acked.get() == 2
    })
    .await;
    assert_eq!(counters.reconnects.get(), 0);
    task.abort();
}
