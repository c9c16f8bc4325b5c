//! Hostile input for the fuzz tests (`controller/tests/fuzz.rs`, `agent/tests/fuzz.rs`; docs/development.md,
//! "Fuzzing"): random bytes, random JSON values, and valid samples mutated at random, run through
//! proptest with the number of cases from `NE_FUZZ_CASES`.
//!
//! Every target asserts that its code does not panic and answers either a value or an error that says
//! something. [`run`] reports cases and seconds per target on stderr, and as a JSON line appended to the
//! file `NE_FUZZ_REPORT` names (how `cargo xtask fuzz` collects `target/bench/fuzz.json`).

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Map, Value, json};
use std::fmt::Debug;
use std::io::Write as _;
use std::time::Instant;

/// Cases per target when `NE_FUZZ_CASES` is not set: small enough for a debug `cargo test`.
pub const DEFAULT_CASES: u32 = 2000;

/// Cases per target: `NE_FUZZ_CASES`, else [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    match std::env::var("NE_FUZZ_CASES") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("NE_FUZZ_CASES={text:?} is not a number of cases")),
        Err(_) => DEFAULT_CASES,
    }
}

/// Runs `test` on [`cases`] values of `strategy`; a panic or a failed check fails the test with the
/// smallest input proptest finds. Nothing is persisted: a failure found here becomes a table case next
/// to the code it breaks.
pub fn run<S: Strategy>(
    target: &str,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: Debug,
{
    let cases = cases();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let start = Instant::now();
    if let Err(e) = runner.run(&strategy, test) {
        panic!("fuzz target {target}: {e}");
    }
    let seconds = start.elapsed().as_secs_f64();
    eprintln!("fuzz {target}: {cases} cases in {seconds:.2} s");
    if let Ok(path) = std::env::var("NE_FUZZ_REPORT") {
        let line = json!({"target": target, "cases": cases, "seconds": seconds}).to_string() + "\n";
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("opening NE_FUZZ_REPORT {path}: {e}"));
        file.write_all(line.as_bytes())
            .unwrap_or_else(|e| panic!("writing NE_FUZZ_REPORT {path}: {e}"));
    }
}

/// Fails the case unless `message` (an error's text) says something.
pub fn clear(what: &str, message: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        !message.trim().is_empty(),
        "{what}: an error without a message"
    );
    Ok(())
}

/// Up to `max` random bytes.
pub fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> + Clone {
    prop::collection::vec(any::<u8>(), 0..=max)
}

/// Random text: arbitrary bytes read as UTF-8 (lossy), or arbitrary characters.
pub fn text(max: usize) -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        bytes(max).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        prop::collection::vec(any::<char>(), 0..=max).prop_map(|c| c.into_iter().collect()),
    ]
}

/// Strings parsers tend to trip on, and the vocabulary of a target (its field names and values).
fn string(vocabulary: &'static [&'static str]) -> impl Strategy<Value = String> + Clone {
    const EDGES: &[&str] = &[
        "",
        " ",
        "-",
        "*",
        "/",
        "//",
        "\\",
        "\"",
        "\0",
        "\n",
        "é",
        "\u{202e}",
        "0",
        "-1",
        "65536",
        "18446744073709551616",
        "1e999",
        "NaN",
        "10.0.0.1",
        "10.0.0.0/8",
        "::",
        "::ffff:10.0.0.1",
        "fe80::1%eth0",
        "[::1]:80",
        "10.0.0.1:80",
        "10.0.0.1:65536",
        "256.0.0.1",
        "a/b",
        "a/b/c",
        "ns/sa/x",
        "spiffe://cluster.local/ns/a/sa/b",
        "2026-08-21T10:15:30Z",
        "9999-12-31T23:59:59Z",
        "-009999-01-01T00:00:00Z",
        "tcp",
        "TCP",
        "udp",
        "SCTP",
    ];
    prop_oneof![
        3 => prop::sample::select(EDGES).prop_map(str::to_string),
        3 => prop::sample::select(vocabulary).prop_map(str::to_string),
        1 => "[a-z0-9./:*-]{0,12}",
        1 => text(24),
        1 => prop::sample::select(&[16usize, 64, 254, 70_000][..]).prop_map(|n| "a".repeat(n)),
    ]
}

const EDGE_NUMBERS: &[i64] = &[
    0,
    1,
    -1,
    53,
    80,
    65_535,
    65_536,
    i32::MAX as i64,
    i32::MIN as i64,
    u32::MAX as i64,
    i64::MAX,
    i64::MIN,
    1_700_000_000,
    1_700_000_000_000,
];

/// Numbers at the edges of every integer type, and floats.
fn number() -> impl Strategy<Value = Value> + Clone {
    prop_oneof![
        prop::sample::select(EDGE_NUMBERS).prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
    ]
}

/// A random JSON value whose keys and strings come partly from `vocabulary`, nested a few levels.
pub fn json(vocabulary: &'static [&'static str]) -> impl Strategy<Value = Value> + Clone {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        string(vocabulary).prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((string(vocabulary), inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// One edit of a JSON document.
#[derive(Clone, Debug)]
enum Edit {
    /// Replace the node with a random value.
    Replace(Value),
    /// Remove the node from its object or array.
    Remove,
    /// Add a key (a node that is an object) or an element (an array).
    Insert(String, Value),
}

/// `samples` (valid documents) with 1 to 4 random edits, each at a random node.
pub fn mutated_json(
    samples: Vec<Value>,
    vocabulary: &'static [&'static str],
) -> impl Strategy<Value = Value> + Clone {
    let edit = prop_oneof![
        2 => json(vocabulary).prop_map(Edit::Replace),
        1 => Just(Edit::Remove),
        1 => (string(vocabulary), json(vocabulary)).prop_map(|(k, v)| Edit::Insert(k, v)),
    ];
    (
        prop::sample::select(samples),
        prop::collection::vec((any::<Index>(), edit), 1..=4),
    )
        .prop_map(|(mut doc, edits)| {
            for (at, edit) in edits {
                let mut pointers = Vec::new();
                pointers_of(&doc, String::new(), &mut pointers);
                let pointer = &pointers[at.index(pointers.len())];
                apply(&mut doc, pointer, edit);
            }
            doc
        })
}

/// The JSON pointer of every node of `value` (the root is `""`).
fn pointers_of(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = k.replace('~', "~0").replace('/', "~1");
                pointers_of(v, format!("{at}/{key}"), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                pointers_of(v, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

fn apply(doc: &mut Value, pointer: &str, edit: Edit) {
    match edit {
        Edit::Replace(v) => {
            if let Some(node) = doc.pointer_mut(pointer) {
                *node = v;
            }
        }
        Edit::Insert(k, v) => match doc.pointer_mut(pointer) {
            Some(Value::Object(map)) => {
                map.insert(k, v);
            }
            Some(Value::Array(items)) => items.push(v),
            Some(node) => *node = v,
            None => {}
        },
        Edit::Remove => {
            let Some((parent, last)) = pointer.rsplit_once('/') else {
                *doc = Value::Null;
                return;
            };
            let key = last.replace("~1", "/").replace("~0", "~");
            match doc.pointer_mut(parent) {
                Some(Value::Object(map)) => {
                    map.remove(&key);
                }
                Some(Value::Array(items)) => {
                    if let Ok(i) = key.parse::<usize>() {
                        if i < items.len() {
                            items.remove(i);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// `samples` (valid encodings) with 1 to 8 byte edits: flips, insertions, deletions, a cut, a copy of
/// a slice of itself (repeated fields, nested lengths).
pub fn mutated_bytes(samples: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> + Clone {
    let edit = (0u8..5, any::<Index>(), any::<Index>(), any::<u8>());
    (
        prop::sample::select(samples),
        prop::collection::vec(edit, 1..=8),
    )
        .prop_map(|(mut data, edits)| {
            for (kind, at, other, byte) in edits {
                if data.is_empty() {
                    data.push(byte);
                    continue;
                }
                let i = at.index(data.len());
                match kind {
                    0 => data[i] ^= byte.max(1),
                    1 => data.insert(i, byte),
                    2 => {
                        data.remove(i);
                    }
                    3 => data.truncate(i),
                    _ => {
                        let j = other.index(data.len());
                        let (from, to) = (i.min(j), i.max(j));
                        let copy = data[from..to].to_vec();
                        data.splice(i..i, copy);
                    }
                }
            }
            data
        })
}
