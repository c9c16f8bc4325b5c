//! The ztunnel source end to end on real files: fixture lines (ztunnel 1.30's JSON log shapes) written
//! in the container runtime's CRI framing into a temp `/var/log/containers`-like directory, read by the
//! [`Reader`] (tailer → parser → correlator) as the agent runs it, through rotation mid-read,
//! truncation, malformed and pre-1.30 lines, and an agent restart with the saved positions: saved only
//! up to lines whose records were acknowledged (docs/flow-sources.md, "Read positions").

use network_enforcer_agent::sources::ztunnel::{
    FailureDirection, FailureLabels, FailureReason, Reader, ZtunnelConfig,
};
use network_enforcer_agent::sources::{SourceMetrics, SourceName};
use network_enforcer_api::uplink::{FlowRecord, Outcome};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ztunnel");

fn fixture(name: &str) -> Vec<String> {
    std::fs::read_to_string(Path::new(FIXTURES).join(name))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

/// One application line in CRI framing; long lines are split into a `P` part and an `F` part, as
/// containerd does past its buffer size.
fn cri(line: &str) -> String {
    let time = "2026-08-21T10:15:30.123456789Z";
    if line.len() > 200 {
        let mut cut = line.len() / 2;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        format!(
            "{time} stdout P {}\n{time} stdout F {}\n",
            &line[..cut],
            &line[cut..]
        )
    } else {
        format!("{time} stdout F {line}\n")
    }
}

fn append(path: &Path, lines: &[String]) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    for l in lines {
        f.write_all(cri(l).as_bytes()).unwrap();
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    logs: PathBuf,
    state: PathBuf,
    metrics: SourceMetrics,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let logs = dir.path().join("containers");
        std::fs::create_dir_all(&logs).unwrap();
        Self {
            state: dir.path().join("state/positions.json"),
            logs,
            _dir: dir,
            metrics: SourceMetrics::default(),
        }
    }

    fn reader(&self) -> Reader {
        Reader::new(
            ZtunnelConfig {
                glob: format!("{}/*ztunnel*.log", self.logs.display()),
                state_file: Some(self.state.clone()),
                poll: Duration::from_millis(50),
            },
            self.metrics.source(SourceName::ztunnel),
        )
    }

    fn log(&self) -> PathBuf {
        self.logs
            .join("ztunnel-x7k2p_istio-system_istio-proxy-0123456789abcdef.log")
    }
}

fn summary(records: &[FlowRecord]) -> Vec<(i32, u32, String, bool)> {
    let mut v: Vec<_> = records
        .iter()
        .map(|r| (r.outcome, r.port, r.policy.clone(), r.dry_run))
        .collect();
    v.sort();
    v
}

fn all_fixture_records() -> Vec<(i32, u32, String, bool)> {
    let est = Outcome::Established as i32;
    let denied = Outcome::Denied as i32;
    let mut v = vec![
        (est, 8080, String::new(), false),
        (est, 9090, String::new(), false),
        (denied, 9090, "shop/deny-legacy-dryrun".into(), true),
        (denied, 8080, "shop/deny-legacy".into(), false),
        (denied, 8080, String::new(), false),
    ];
    v.sort();
    v
}

#[test]
fn every_message_kind_of_the_fixture_gives_its_record_once() {
    let s = Setup::new();
    // A file that exists before the agent starts is read from its end: old history is not replayed.
    append(&s.log(), &fixture("access-and-authz.jsonl")[..1]);
    let mut reader = s.reader();
    assert!(reader.poll().is_empty(), "started at the end of the file");
    assert_eq!(reader.files(), 1);
    append(&s.log(), &fixture("access-and-authz.jsonl"));
    let records = reader.poll();
    assert_eq!(summary(&records), all_fixture_records());
    let learned = records
        .iter()
        .find(|r| r.outcome == Outcome::Established as i32 && r.port == 8080)
        .unwrap();
    let local = learned.local.as_ref().unwrap();
    assert_eq!(
        (local.namespace.as_str(), local.name.as_str()),
        ("shop", "catalog-5d4b8c7f9-q7r2m")
    );
    assert_eq!(
        learned.peer.as_ref().unwrap().principal,
        "cluster.local/ns/shop/sa/web-client"
    );
    assert!(reader.poll().is_empty(), "nothing is delivered twice");
}

#[test]
fn malformed_and_old_lines_are_counted_and_skipped_without_losing_the_good_ones() {
    let s = Setup::new();
    let mut reader = s.reader();
    reader.poll();
    let mut lines = fixture("malformed.txt");
    lines.extend(fixture("old-1.29.jsonl"));
    lines.extend(fixture("access-and-authz.jsonl"));
    append(&s.log(), &lines);
    // A line without CRI framing at all.
    std::fs::OpenOptions::new()
        .append(true)
        .open(s.log())
        .unwrap()
        .write_all(b"no framing here\n")
        .unwrap();
    let records = reader.poll();
    assert_eq!(summary(&records), all_fixture_records());
    let mut text = String::new();
    let mut registry = prometheus_client::registry::Registry::default();
    s.metrics.register(&mut registry);
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("source_errors_total{source=\"ztunnel\"} 5"),
        "4 malformed + 1 unframed:\n{text}"
    );
    assert!(text.contains("source_connected{source=\"ztunnel\"} 1"));
}

#[test]
fn rotation_mid_read_finishes_the_old_file_then_reads_the_new_one() {
    let s = Setup::new();
    let mut reader = s.reader();
    reader.poll();
    let lines = fixture("access-and-authz.jsonl");
    append(&s.log(), &lines[..4]);
    // Half a line at the end of the old file, not yet terminated.
    let partial = cri(&lines[4]);
    let (head, tail) = partial.split_at(partial.len() / 2);
    std::fs::OpenOptions::new()
        .append(true)
        .open(s.log())
        .unwrap()
        .write_all(head.as_bytes())
        .unwrap();
    let first = reader.poll();
    assert_eq!(first.len(), 3, "{first:?}");
    // The runtime finishes the line, then the kubelet renames the file and starts a new one; more
    // lines land in the old file after our read and before the rename.
    let mut old = std::fs::OpenOptions::new()
        .append(true)
        .open(s.log())
        .unwrap();
    old.write_all(tail.as_bytes()).unwrap();
    old.write_all(cri(&lines[5]).as_bytes()).unwrap();
    drop(old);
    std::fs::rename(s.log(), s.log().with_extension("log.20260821-101800")).unwrap();
    append(&s.log(), &lines[6..]);
    let second = reader.poll();
    let mut all = first;
    all.extend(second);
    assert_eq!(summary(&all), all_fixture_records());
}

#[test]
fn truncation_restarts_at_the_beginning() {
    let s = Setup::new();
    let mut reader = s.reader();
    reader.poll();
    let lines = fixture("access-and-authz.jsonl");
    append(&s.log(), &lines);
    assert_eq!(reader.poll().len(), 5);
    // copytruncate: the same file, emptied, then written again.
    std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(s.log())
        .unwrap();
    append(&s.log(), &lines[..1]);
    let again = reader.poll();
    assert_eq!(
        summary(&again),
        vec![(Outcome::Established as i32, 8080, String::new(), false)]
    );
}

/// What the agent does once the controller acknowledged the records of the polls so far.
fn acknowledge(reader: &mut Reader) {
    if let Some(receipt) = reader.take_receipt() {
        receipt.settle();
    }
}

#[test]
fn positions_survive_an_agent_restart() {
    let s = Setup::new();
    let lines = fixture("access-and-authz.jsonl");
    {
        let mut reader = s.reader();
        reader.poll();
        append(&s.log(), &lines[..1]);
        assert_eq!(reader.poll().len(), 1);
        acknowledge(&mut reader);
        // Positions are saved at the poll after the acknowledgement.
        assert!(reader.poll().is_empty());
    }
    assert!(s.state.exists(), "positions saved");
    // Written while the agent was down: read after the restart, and only that.
    append(&s.log(), &lines[1..4]);
    let mut restarted = s.reader();
    let records = restarted.poll();
    assert_eq!(
        summary(&records),
        vec![
            (Outcome::Established as i32, 9090, String::new(), false),
            (
                Outcome::Denied as i32,
                9090,
                "shop/deny-legacy-dryrun".into(),
                true
            ),
        ]
    );
}

#[test]
fn lines_whose_records_were_never_acknowledged_are_read_again_after_a_restart() {
    let s = Setup::new();
    let lines = fixture("access-and-authz.jsonl");
    {
        let mut reader = s.reader();
        reader.poll();
        append(&s.log(), &lines[..1]);
        assert_eq!(reader.poll().len(), 1);
        // The records went to the uplink, but the agent is killed before the controller acknowledged
        // them (polls go on meanwhile).
        assert!(reader.poll().is_empty());
        assert!(reader.poll().is_empty());
    }
    append(&s.log(), &lines[1..4]);
    let mut restarted = s.reader();
    let est = Outcome::Established as i32;
    assert_eq!(
        summary(&restarted.poll()),
        vec![
            (est, 8080, String::new(), false),
            (est, 9090, String::new(), false),
            (
                Outcome::Denied as i32,
                9090,
                "shop/deny-legacy-dryrun".into(),
                true
            ),
        ],
        "the unacknowledged line is read again, then what came while the agent was down"
    );
}

#[test]
fn only_lines_up_to_the_oldest_unacknowledged_records_count_as_read() {
    let s = Setup::new();
    let lines = fixture("access-and-authz.jsonl");
    {
        let mut reader = s.reader();
        reader.poll();
        append(&s.log(), &lines[..1]);
        assert_eq!(reader.poll().len(), 1);
        let first = reader
            .take_receipt()
            .expect("a receipt for the first records");
        append(&s.log(), &lines[5..6]);
        assert_eq!(reader.poll().len(), 1);
        // The later records are acknowledged first: they may not move the position past the earlier,
        // unacknowledged ones.
        acknowledge(&mut reader);
        assert!(reader.poll().is_empty());
        drop(first);
    }
    let mut restarted = s.reader();
    assert_eq!(restarted.poll().len(), 2, "both lines read again");
}

#[test]
fn a_decision_waiting_for_its_access_line_is_read_again_after_a_restart() {
    let s = Setup::new();
    // Times ahead of the clock: a decision read now must not be taken for one whose access line never
    // came (the reader also expires decisions by wall-clock time).
    let lines: Vec<String> = fixture("access-and-authz.jsonl")
        .iter()
        .map(|l| l.replace("\"time\":\"2026-", "\"time\":\"2999-"))
        .collect();
    {
        let mut reader = s.reader();
        reader.poll();
        // A learned connection, then the dry-run decision of a connection whose access line comes later.
        append(&s.log(), &lines[..2]);
        assert_eq!(reader.poll().len(), 1);
        assert_eq!(reader.pending_decisions(), 1);
        acknowledge(&mut reader);
        assert!(reader.poll().is_empty());
    }
    append(&s.log(), &lines[2..4]);
    let mut restarted = s.reader();
    assert_eq!(
        summary(&restarted.poll()),
        vec![
            (Outcome::Established as i32, 9090, String::new(), false),
            (
                Outcome::Denied as i32,
                9090,
                "shop/deny-legacy-dryrun".into(),
                true
            ),
        ],
        "the decision joins its access line after the restart; the acknowledged line is not read again"
    );
}

#[test]
fn a_file_rotated_while_the_agent_was_away_is_read_from_its_start() {
    let s = Setup::new();
    let lines = fixture("access-and-authz.jsonl");
    {
        let mut reader = s.reader();
        reader.poll();
        append(&s.log(), &lines[..1]);
        assert_eq!(reader.poll().len(), 1);
        acknowledge(&mut reader);
        assert!(reader.poll().is_empty());
    }
    std::fs::rename(s.log(), s.log().with_extension("log.20260821-101800")).unwrap();
    append(&s.log(), &lines[5..6]);
    let mut restarted = s.reader();
    assert_eq!(
        summary(&restarted.poll()),
        vec![(
            Outcome::Denied as i32,
            8080,
            "shop/deny-legacy".into(),
            false
        )],
        "every line of the new file came after the saved position"
    );
}

#[test]
fn a_new_file_appearing_later_is_read_from_its_start() {
    let s = Setup::new();
    let mut reader = s.reader();
    assert!(reader.poll().is_empty());
    assert_eq!(reader.files(), 0, "nothing matches yet");
    // Unrelated containers' logs are not read.
    append(
        &s.logs.join("web-abc_shop_web-1.log"),
        &fixture("access-and-authz.jsonl"),
    );
    append(&s.log(), &fixture("access-and-authz.jsonl"));
    assert_eq!(summary(&reader.poll()), all_fixture_records());
    assert_eq!(reader.files(), 1);
}

/// Property tests (the fuzz target of the ztunnel line parser, the CRI framing and the record
/// conversion): arbitrary input never panics, and what comes out is always well-formed.
mod properties {
    use network_enforcer_agent::sources::tail::Assembler;
    use network_enforcer_agent::sources::ztunnel::{Correlator, Event, parse_line};
    use network_enforcer_api::uplink::{Direction, Outcome, Protocol, Source};
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    const KEYS: &[&str] = &[
        "level",
        "time",
        "scope",
        "message",
        "src.addr",
        "src.workload",
        "src.namespace",
        "src.identity",
        "dst.addr",
        "dst.hbone_addr",
        "dst.workload",
        "dst.namespace",
        "dst.identity",
        "direction",
        "error",
        "policy",
        "proxy",
        "inbound",
    ];

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(json!("access")),
            Just(json!("ztunnel::state")),
            Just(json!("connection complete")),
            Just(json!("deny policy match")),
            Just(json!("dry-run: deny policy match")),
            Just(json!("dry-run: no allow policies match")),
            Just(json!("no allow policies matched")),
            Just(json!("dry-run deny policy match")),
            Just(json!("inbound")),
            Just(json!("outbound")),
            Just(json!("10.0.0.1:8080")),
            Just(json!("[fd00::1]:15008")),
            Just(json!("shop/catalog-1")),
            Just(json!("spiffe://cluster.local/ns/shop/sa/web")),
            Just(json!(
                "connection closed due to policy rejection: explicitly denied by: a/b"
            )),
            Just(json!({"wl": "shop/catalog-1", "peer": "10.0.0.9:5000"})),
            Just(json!({"wl": 7})),
            Just(json!("2026-08-21T10:15:30.123456Z")),
            any::<i64>().prop_map(Value::from),
            ".{0,20}".prop_map(Value::from),
            Just(Value::Null),
        ]
    }

    fn line() -> impl Strategy<Value = String> {
        prop::collection::vec((prop::sample::select(KEYS), value()), 0..14).prop_map(|kvs| {
            let mut m = Map::new();
            for (k, v) in kvs {
                // The span objects under both their span keys.
                m.insert(k.to_string(), v);
            }
            Value::Object(m).to_string()
        })
    }

    proptest! {
        #[test]
        fn any_text_parses_or_fails_cleanly(s in ".{0,300}") {
            let _ = parse_line(&s);
        }

        #[test]
        fn records_from_any_line_sequence_are_well_formed(lines in prop::collection::vec(line(), 0..40)) {
            let mut c = Correlator::default();
            let mut records = Vec::new();
            let mut decisions = 0usize;
            let mut accesses = 0usize;
            for l in &lines {
                if let Ok(event) = parse_line(l) {
                    match &event {
                        Event::Decision(_) => decisions += 1,
                        Event::Access(_) => accesses += 1,
                        _ => {}
                    }
                    records.extend(c.push(event));
                }
            }
            records.extend(c.expire(i64::MAX));
            prop_assert_eq!(c.pending(), 0);
            // Each decision gives at most one record, each access line at most one of its own.
            prop_assert!(records.len() <= decisions + accesses);
            for r in &records {
                let local = r.local.as_ref().expect("a local pod");
                prop_assert!(!local.namespace.is_empty() && !local.name.is_empty());
                prop_assert!(r.peer_ip.len() == 4 || r.peer_ip.len() == 16);
                prop_assert!(r.port <= u32::from(u16::MAX));
                prop_assert_eq!(r.source, Source::Ztunnel as i32);
                prop_assert_eq!(r.protocol, Protocol::Tcp as i32);
                prop_assert_eq!(r.direction, Direction::Inbound as i32);
                prop_assert!(r.outcome == Outcome::Established as i32 || r.outcome == Outcome::Denied as i32);
                prop_assert!(!r.dry_run || r.outcome == Outcome::Denied as i32);
                if r.outcome == Outcome::Established as i32 {
                    prop_assert!(r.policy.is_empty());
                    prop_assert!(!r.peer.as_ref().expect("learned records name the peer").principal.is_empty());
                }
            }
        }

        #[test]
        fn cri_partial_lines_reassemble_to_the_original(content in "[^\n]{0,400}", cuts in prop::collection::vec(0usize..400, 0..5)) {
            let mut points: Vec<usize> = cuts
                .into_iter()
                .map(|c| c.min(content.len()))
                .filter(|c| *c < content.len() && content.is_char_boundary(*c))
                .collect();
            points.sort();
            points.dedup();
            let mut a = Assembler::default();
            let mut last = 0;
            let mut out = None;
            for p in points.iter().chain(std::iter::once(&content.len())) {
                let tag = if *p == content.len() { "F" } else { "P" };
                let got = a.push(&format!("2026-08-21T10:15:30Z stdout {tag} {}", &content[last..*p])).unwrap();
                if tag == "P" {
                    prop_assert!(got.is_none());
                } else {
                    out = got;
                }
                last = *p;
            }
            prop_assert_eq!(out, Some(content));
        }
    }
}

/// `connection failed` (ztunnel's early deny) names no workload: each line is counted by
/// direction and reason, none becomes a record, a malformed one is an error, and the good lines around
/// them still give their records.
#[test]
fn early_denies_are_counted_by_direction_and_reason_without_records() {
    let s = Setup::new();
    let mut reader = s.reader();
    reader.poll();
    let mut lines = fixture("connection-failed.jsonl");
    lines.extend(fixture("access-and-authz.jsonl"));
    append(&s.log(), &lines);
    let records = reader.poll();
    assert_eq!(
        summary(&records),
        all_fixture_records(),
        "nothing more, nothing lost"
    );
    let counted: Vec<(FailureLabels, u64)> = reader
        .connections_failed()
        .iter()
        .map(|(labels, n)| (*labels, *n))
        .collect();
    assert_eq!(
        counted,
        [
            (
                FailureLabels {
                    direction: FailureDirection::inbound,
                    reason: FailureReason::policy_rejection
                },
                2
            ),
            (
                FailureLabels {
                    direction: FailureDirection::outbound,
                    reason: FailureReason::other
                },
                1
            )
        ]
    );
    // Through the agent's registry (the family is process-wide: at least this reader's counts).
    let text = network_enforcer_agent::metrics::AgentMetrics::new().encode();
    let inbound = text
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "network_enforcer_agent_source_ztunnel_connections_failed_total{direction=\"inbound\",reason=\"policy_rejection\"} ",
            )
        })
        .unwrap_or_else(|| panic!("no early-deny metric in:\n{text}"));
    assert!(inbound.parse::<u64>().unwrap() >= 2, "{inbound}");
    let mut registry = prometheus_client::registry::Registry::default();
    s.metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("source_errors_total{source=\"ztunnel\"} 1"),
        "the line without src.addr:\n{text}"
    );
}
