//! The uplink against the controller's real ingest service on loopback (no cluster, no root): batches
//! are delivered and acknowledged, a batch sent while the controller is down arrives once it is back, a
//! wrong token is retried (with the token file re-read) without the task ending, batches stay within the
//! controller's limits, and the sender never blocks. A stand-in server that reads but does not acknowledge
//! shows batches in flight when a stream dies being resent on the next.
//!
//! The controller's index is empty, so it refuses every record as "not on the node": that refusal, counted
//! in the acks, is the proof that the controller really read the records.

use network_enforcer_agent::uplink::{self, Backoff, UplinkConfig, UplinkCounters};
use network_enforcer_api::uplink::flow_uplink_server::{FlowUplink, FlowUplinkServer};
use network_enforcer_api::uplink::{BatchAck, FlowBatch, FlowRecord, LocalPod};
use network_enforcer_controller::index_feed::SharedIndex;
use network_enforcer_controller::ingest::{
    AgentIdentity, Authenticate, IngestService, Learning, Limits,
};
use network_enforcer_controller::proposals::ProposalWriter;
use network_enforcer_controller::resolve::Index;
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

/// A stand-in controller that records the sequence numbers it reads and acknowledges them only when
/// `acks` is set: to lose acknowledgements on purpose, which the real one never does.
struct Recorder {
    seen: Arc<Mutex<Vec<u64>>>,
    acks: bool,
}

#[tonic::async_trait]
impl FlowUplink for Recorder {
    type StreamStream =
        std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<BatchAck, Status>> + Send>>;

    async fn stream(
        &self,
        request: tonic::Request<tonic::Streaming<FlowBatch>>,
    ) -> Result<tonic::Response<Self::StreamStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let (seen, acks) = (self.seen.clone(), self.acks);
        tokio::spawn(async move {
            while let Ok(Some(batch)) = inbound.message().await {
                seen.lock().unwrap().push(batch.sequence);
                let ack = BatchAck {
                    sequence: batch.sequence,
                    ..BatchAck::default()
                };
                if acks && tx.send(Ok(ack)).await.is_err() {
                    break;
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
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
        Self::serve(addr, move || {
            // Nothing reaches the writer (every record is refused first); it needs a client all the same.
            let client =
                kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                    .unwrap();
            IngestService {
                authenticator: Arc::new(FixedToken),
                learning: Arc::new(Learning {
                    index: Arc::new(SharedIndex::listed(Index::default())),
                    evidence: None,
                    writer: Arc::new(ProposalWriter::new(
                        client,
                        network_enforcer_api::Backend::Kubernetes,
                        Default::default(),
                    )),
                }),
                limits,
            }
        })
        .await
    }

    /// Serves what `service` makes (inside the server's runtime) on `addr`, retrying while the
    /// previous listener on that port closes.
    async fn serve<S: FlowUplink>(
        addr: SocketAddr,
        service: impl FnOnce() -> S + Send + 'static,
    ) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the controller");
        let (ready, bound) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            let listener = loop {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                // The old server's connections linger in TIME_WAIT on this port.
                socket.set_reuseaddr(true).unwrap();
                match socket.bind(addr).and_then(|()| socket.listen(64)) {
                    Ok(listener) => break listener,
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("binding {addr}: {e}; retrying");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!("binding {addr}: {e}"),
                }
            };
            ready.send(listener.local_addr().unwrap()).unwrap();
            tonic::transport::Server::builder()
                .add_service(FlowUplinkServer::new(service()))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
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
        ..UplinkConfig::new(format!("http://{addr}"), &token.0, NODE)
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
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(counters) {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {}",
            snapshot(counters)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
    tokio::time::sleep(Duration::from_millis(500)).await;
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
    let mut silent = Controller::serve("127.0.0.1:0".parse().unwrap(), move || Recorder {
        seen,
        acks: false,
    })
    .await;
    let addr = silent.addr;
    let token = TokenFile::new("in-flight", TOKEN);
    let counters = UplinkCounters::default();
    let (sender, task) = uplink::spawn(config(addr, &token), counters.clone()).unwrap();
    assert!(sender.send(records(1)));
    assert!(sender.send(records(1)));
    let deadline = Instant::now() + Duration::from_secs(20);
    while silent_seen.lock().unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "{}", snapshot(&counters));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The controller read both batches and dies before acknowledging them.
    silent.stop();
    assert_eq!(*silent_seen.lock().unwrap(), [1, 2]);

    let acking_seen = Arc::new(Mutex::new(Vec::new()));
    let seen = acking_seen.clone();
    let _acking = Controller::serve(addr, move || Recorder { seen, acks: true }).await;
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
