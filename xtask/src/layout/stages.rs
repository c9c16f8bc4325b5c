//! The controller's stage order, checked (docs/development.md, "Stage order"): a module of one
//! stage imports only its own stage and the stages before it, so the code reads in the order the
//! data flows and a change to a later stage cannot break an earlier one. A stage that must hand
//! something on to a later one defines the trait it hands it to (ingest's `EvidenceSink`, learn's
//! `NamespaceGraph`) and the later stage implements it; the app wires them.
//!
//! Test files (`tests.rs`, inline test modules) build whole apps and may import anything; comments
//! (intra-doc links) are no imports.

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
/// other, and on one of these that is gone (so the list shrinks with the code).
pub const KNOWN: [(&str, &str, &str); 1] = [(
    "ingest",
    "learn",
    "ingest's Learning drives the learner and the flusher directly (issue 43.1: with one queue for \
     records that wait for the index, the learner takes records through a sink ingest defines)",
)];

fn rank(stage: &str) -> Option<u8> {
    CONTROLLER_STAGES
        .iter()
        .find(|(name, _)| *name == stage)
        .map(|(_, rank)| *rank)
}

/// The stages `code` names as `crate::<stage>` (an import or a path in code).
pub fn stages_used(code: &str) -> BTreeSet<&str> {
    code.match_indices("crate::")
        .filter(|(at, _)| {
            // `crate::` itself, not the end of `other_crate::`.
            code[..*at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
        })
        .map(|(at, _)| {
            let rest = &code[at + "crate::".len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|name| rank(name).is_some())
        .collect()
}

/// The imports of a file of `stage` against the order: the later stages it uses.
pub fn against_order<'a>(stage: &str, code: &'a str) -> Vec<&'a str> {
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
            found.insert((stage.clone(), later.to_string()));
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
}
