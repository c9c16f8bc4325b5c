//! The ztunnel source through the uplink, as the agent wires them (reader → record sink → flush →
//! uplink), against a stand-in controller on loopback: read positions are saved only once the
//! controller acknowledged the records made from those lines (docs/flow-sources.md, "Read positions").
//! A controller that reads batches but never acknowledges them stands for an agent killed between
//! sending and the acknowledgement: after the restart the lines are read again.

use network_enforcer_agent::sources::ztunnel::{self, Reader, ZtunnelConfig};
use network_enforcer_agent::sources::{RecordSink, SourceMetrics, SourceName, SourcesStop};
use network_enforcer_agent::uplink::{self, UplinkConfig, UplinkCounters, UplinkSender};
use network_enforcer_api::backoff::Backoff;
use network_enforcer_api::uplink::FlowRecord;
use network_enforcer_tests::stand_in_controller::serve_recorder;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

const NODE: &str = "node-1";

/// A temp directory with the logs, the state file and the token.
struct Node {
    dir: tempfile::TempDir,
    metrics: SourceMetrics,
}

impl Node {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("containers")).unwrap();
        std::fs::write(dir.path().join("token"), "agent-token").unwrap();
        Self {
            dir,
            metrics: SourceMetrics::default(),
        }
    }

    fn log(&self) -> PathBuf {
        self.dir
            .path()
            .join("containers/ztunnel-x7k2p_istio-system_istio-proxy-0123456789abcdef.log")
    }

    /// The reader's settings as the agent has them: the same glob and state file at every (re)start.
    fn config(&self, poll: Duration) -> ZtunnelConfig {
        ZtunnelConfig {
            glob: format!("{}/containers/*ztunnel*.log", self.dir.path().display()),
            state_file: Some(self.dir.path().join("state/positions.json")),
            poll,
        }
    }

    /// A reader as the agent starts one.
    fn reader(&self) -> Reader {
        Reader::new(
            self.config(Duration::from_millis(50)),
            self.metrics.source(SourceName::ztunnel),
        )
    }

    fn uplink(
        &self,
        addr: SocketAddr,
    ) -> (UplinkSender, tokio::task::JoinHandle<()>, UplinkCounters) {
        let config = UplinkConfig {
            backoff: Backoff {
                initial: Duration::from_millis(20),
                max: Duration::from_millis(300),
            },
            ..UplinkConfig::new(
                format!("http://{addr}"),
                self.dir.path().join("token"),
                NODE,
            )
            .insecure()
        };
        let counters = UplinkCounters::default();
        let (sender, task) = uplink::spawn(config, counters.clone()).unwrap();
        (sender, task, counters)
    }
}

/// One access line the reader turns into one learning record, in CRI framing.
fn append_learned_connection(path: &Path) {
    let line = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/ztunnel/access-and-authz.jsonl"
    ))
    .unwrap()
    .lines()
    .next()
    .unwrap()
    .to_string();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    writeln!(f, "2026-08-21T10:15:30.123456789Z stdout F {line}").unwrap();
}

/// One poll of the source and one flush of the agent, as `ztunnel::run` and the agent's loop do them.
fn poll_and_flush(reader: &mut Reader, sink: &RecordSink, sender: &UplinkSender) -> usize {
    let records = reader.poll();
    sink.add_with_receipt(records, reader.take_receipt());
    let (records, receipts) = sink.drain_with_receipts();
    let n = records.len();
    sender.send_with_receipts(records, receipts);
    n
}

async fn wait_for(what: &str, done: impl Fn() -> bool) {
    network_enforcer_tests::wait::until(
        what,
        Duration::from_secs(20),
        Duration::from_millis(10),
        done,
        String::new,
    )
    .await
    .unwrap();
}

/// Reads a learned connection, ships it, and "kills" the agent once the controller has read the batch
/// (and, with `acks`, acknowledged it) and the source polled again; returns what a restarted reader
/// reads first.
async fn restart_after_shipping(acks: bool) -> Vec<FlowRecord> {
    let node = Node::new();
    let (addr, seen) = serve_recorder(acks).await;
    let (sender, task, counters) = node.uplink(addr);
    let sink = RecordSink::default();
    let mut reader = node.reader();
    assert_eq!(poll_and_flush(&mut reader, &sink, &sender), 0);
    append_learned_connection(&node.log());
    assert_eq!(poll_and_flush(&mut reader, &sink, &sender), 1);
    wait_for("the controller to read the batch", || {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    if acks {
        wait_for("the acknowledgement", || counters.batches_acked.get() == 1).await;
    } else {
        // Long enough for an acknowledgement to arrive, had there been one.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(counters.batches_acked.get(), 0);
    }
    // The agent polls on (a poll saves what is acknowledged by then), then dies.
    assert_eq!(poll_and_flush(&mut reader, &sink, &sender), 0);
    task.abort();
    drop(reader);

    let mut restarted = node.reader();
    restarted.poll()
}

#[tokio::test]
async fn lines_sent_but_never_acknowledged_are_read_again_after_a_restart() {
    let records = restart_after_shipping(false).await;
    assert_eq!(
        records.len(),
        1,
        "the line whose record the controller never acknowledged is read again: {records:?}"
    );
    assert_eq!(records[0].port, 8080);
}

#[tokio::test]
async fn acknowledged_lines_are_not_read_again_after_a_restart() {
    let records = restart_after_shipping(true).await;
    assert!(records.is_empty(), "read twice: {records:?}");
}

/// A rolling update (SIGTERM): the agent's last flush is acknowledged after the reader's last poll,
/// and no poll comes after it (here the reader task polls once an hour). The agent's stop tells the
/// reader, which saves what was acknowledged: the restarted agent does not read those lines again
/// (before the stop saved, it did, and the controller took them as new batches of a new agent process).
#[tokio::test]
async fn a_stopping_agent_saves_what_was_acknowledged_after_the_last_poll() {
    let node = Node::new();
    // A first run opened the (empty) log and saved where it begins.
    std::fs::write(node.log(), "").unwrap();
    assert!(node.reader().poll().is_empty());
    append_learned_connection(&node.log());

    let (addr, seen) = serve_recorder(true).await;
    let (sender, uplink_task, counters) = node.uplink(addr);
    let sink = RecordSink::default();
    let (tell, told) = tokio::sync::oneshot::channel();
    let reader_task = tokio::spawn(ztunnel::run(
        node.config(Duration::from_secs(3600)),
        sink.clone(),
        node.metrics.source(SourceName::ztunnel),
        told,
    ));
    // The task's first poll (at once) read the line; the agent's last flush ships it.
    let shipped = std::cell::Cell::new(0);
    wait_for("the reader's first poll", || {
        let (records, receipts) = sink.drain_with_receipts();
        shipped.set(shipped.get() + records.len());
        if !records.is_empty() {
            sender.send_with_receipts(records, receipts);
        }
        shipped.get() == 1
    })
    .await;
    wait_for("the acknowledgement", || counters.batches_acked.get() == 1).await;
    assert_eq!(seen.lock().unwrap().len(), 1);
    drop(sender);
    uplink_task.await.unwrap();
    let mut stop = SourcesStop::default();
    stop.push("ztunnel", tell, reader_task);
    stop.stop().await;

    let records = node.reader().poll();
    assert!(
        records.is_empty(),
        "read again after the restart: {records:?}"
    );
}
