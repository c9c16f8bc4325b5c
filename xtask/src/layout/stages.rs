//! The controller's stage order, checked (docs/development.md, "Stage order"): a module of one
//! stage imports only its own stage and the stages before it, so the code reads in the order the
//! data flows and a change to a later stage cannot break an earlier one. A stage that must hand
//! something on to a later one defines the trait it hands it to (ingest's `EvidenceSink`, learn's
//! `NamespaceGraph`) and the later stage implements it; the app wires them.
//!
//! Test files (`tests.rs`, inline test modules) build whole apps and may import anything; comments
//! (intra-doc links) and string literals are no imports. Read are `crate::` paths, grouped or not;
//! not read: `super::` paths out of a stage's root module, macros used without a path, and items
//! the crate root re-exports (`lib.rs` re-exports none of a stage's).

use super::{code_outside_tests, sources};
use anyhow::Result;
use std::collections::BTreeSet;
use std::path::Path;

/// The controller's top-level modules in stage order (a smaller rank comes first); equal ranks may
/// import each other. `runtime` and `cluster` are below every stage; Goldmane (`sources`) hands
/// records to ingest as the agents' streams do; `app` assembles everything.
pub const CONTROLLER_STAGES: [(&str, u8); 12] = [
    ("runtime", 0),
    ("cluster", 0),
    ("ingest", 1),
    ("sources", 1),
    ("learn", 2),
    ("policy", 3),
    ("reconcile", 3),
    ("monitor", 4),
    ("graph", 5),
    ("ui", 6),
    ("tools", 6),
    ("app", 7),
];

/// Imports against the order still in the tree, each with why it is left: the check fails on any
/// other, and on one of these that is gone (so the list shrinks with the code). Empty now: ingest
/// hands what records teach to the learner through its `ObservationSink` (issue 43.1).
pub const KNOWN: [(&str, &str, &str); 0] = [];

fn rank(stage: &str) -> Option<u8> {
    CONTROLLER_STAGES
        .iter()
        .find(|(name, _)| *name == stage)
        .map(|(_, rank)| *rank)
}

/// The stages `code` names as `crate::<stage>` (an import, grouped or not, or a path in code),
/// string literals and end-of-line comments left out.
pub fn stages_used(code: &str) -> BTreeSet<String> {
    let code = without_strings_and_comments(code);
    let mut used = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        // `crate::` itself, not the end of `other_crate::`.
        let starts_a_path = code[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        if !starts_a_path {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        let firsts = match rest.strip_prefix('{') {
            // `crate::{monitor::X, ingest::{Y, Z}}`: the first name of each top-level part.
            Some(group) => top_level_parts(group),
            None => vec![rest],
        };
        for part in firsts {
            let part = part.trim_start();
            let end = part
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(part.len());
            if rank(&part[..end]).is_some() {
                used.insert(part[..end].to_string());
            }
        }
    }
    used
}

/// The comma-separated parts of a `{ … }` group whose opening brace `group` follows, up to its
/// closing brace (nested groups stay whole).
fn top_level_parts(group: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                parts.push(&group[start..i]);
                return parts;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&group[start..]);
    parts
}

/// `code` with the contents of string literals and the comments after code on a line removed
/// (`"crate::monitor"` in a message is no import). Raw strings and block comments are not
/// parsed: the tree uses neither around stage paths.
pub fn without_strings_and_comments(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    for line in code.lines() {
        let (mut in_string, mut escaped) = (false, false);
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            if in_string {
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => {
                        in_string = false;
                        out.push('"');
                    }
                    _ => {}
                }
                continue;
            }
            if c == '/' && chars.peek() == Some(&'/') {
                break;
            }
            if c == '"' {
                in_string = true;
            }
            out.push(c);
        }
        out.push('\n');
    }
    out
}

/// The imports of a file of `stage` against the order: the later stages it uses.
pub fn against_order(stage: &str, code: &str) -> Vec<String> {
    let Some(own) = rank(stage) else {
        return Vec::new();
    };
    stages_used(code)
        .into_iter()
        .filter(|used| rank(used).is_some_and(|r| r > own))
        .collect()
}

/// Every import against the order under `controller_src`, as (stage, later stage, file); the
/// ones not in [`KNOWN`] and the known ones no longer found.
pub fn check(controller_src: &Path) -> Result<(Vec<String>, Vec<String>)> {
    let mut files = Vec::new();
    sources(controller_src, &mut files)?;
    let mut found: BTreeSet<(String, String)> = BTreeSet::new();
    let mut unknown = Vec::new();
    for path in files {
        let relative = path.strip_prefix(controller_src).unwrap_or(&path);
        let Some(stage) = relative
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .map(|s| s.trim_end_matches(".rs").to_string())
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path)?;
        let code = code_outside_tests(&text);
        for later in against_order(&stage, &code) {
            found.insert((stage.clone(), later.clone()));
            if !KNOWN.iter().any(|(s, l, _)| *s == stage && *l == later) {
                unknown.push(format!("{} uses {later}", relative.display()));
            }
        }
    }
    let gone = KNOWN
        .iter()
        .filter(|(s, l, _)| !found.contains(&(s.to_string(), l.to_string())))
        .map(|(s, l, _)| format!("{s} → {l}"))
        .collect();
    Ok((unknown, gone))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_may_use_itself_earlier_stages_and_the_ones_below_all() {
        let code = "use crate::learn::Learner;\nuse crate::ingest::x;\nuse crate::runtime::m;\n\
                    use crate::monitor::StatusSync;\nlet a = crate::ui::view();\n\
                    use other_crate::monitor::y;\nuse crate::FastMap;\n";
        assert_eq!(against_order("learn", code), ["monitor", "ui"]);
        assert_eq!(against_order("ui", code), Vec::<&str>::new());
        assert_eq!(against_order("policy", code), ["monitor", "ui"]);
        assert_eq!(
            against_order("reconcile", "use crate::policy::render;\n"),
            Vec::<&str>::new(),
            "one rank"
        );
        assert_eq!(
            against_order("lib", code),
            Vec::<&str>::new(),
            "not a stage"
        );
    }

    #[test]
    fn grouped_imports_count_and_strings_and_comments_do_not() {
        let grouped = "use crate::{FastMap, monitor::{status_sync::X, Y}, ingest::Z};\n";
        assert_eq!(against_order("learn", grouped), ["monitor"]);
        let quoted = "let m = \"see crate::monitor \\\" and crate::ui\"; // crate::ui::x\n";
        assert_eq!(against_order("learn", quoted), Vec::<&str>::new());
        let after = "let u = \"a\"; let v = crate::ui::view();\n";
        assert_eq!(against_order("learn", after), ["ui"]);
    }
}
