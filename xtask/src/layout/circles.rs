//! Circles between the controller's files (docs/development.md, "Stage order"): a file that uses a
//! second file, which uses the first again (directly or through others), cannot be read top-down and
//! cannot change alone. Read as the stage order is ([`super::stages`]): `crate::` paths outside
//! comments, strings and test modules, each resolved to the file of its longest module prefix.

use super::{code_outside_tests, sources, stages};
use anyhow::Result;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The module paths `code` names after `crate::`, groups expanded: `crate::a::{b::C, d as e}` gives
/// `a::b::C` and `a::d`.
pub fn paths_used(code: &str) -> Vec<Vec<String>> {
    let code = stages::without_strings_and_comments(code);
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let starts_a_path = code[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'));
        if starts_a_path {
            tree(&code[at + "crate::".len()..], Vec::new(), &mut out);
        }
    }
    out
}

/// Reads one path tree at the start of `s` below `prefix` into `out`; returns the bytes read.
fn tree(s: &str, mut path: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let b = s.as_bytes();
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    let mut i = 0;
    loop {
        i = skip_ws(i);
        if i < b.len() && b[i] == b'{' {
            i += 1;
            loop {
                i = skip_ws(i);
                if i >= b.len() {
                    return i;
                }
                if b[i] == b'}' {
                    return i + 1;
                }
                i += tree(&s[i..], path.clone(), out);
                // Past an alias (`as x`) to the next part or the group's end.
                while i < b.len() && b[i] != b',' && b[i] != b'}' && b[i] != b'{' {
                    i += 1;
                }
                if i < b.len() && b[i] == b',' {
                    i += 1;
                }
            }
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i > start && &s[start..i] != "self" {
            path.push(s[start..i].to_string());
        }
        if i > start && s[i..].starts_with("::") {
            i += 2;
            continue;
        }
        out.push(path);
        return i;
    }
}

/// The module path of the file at `relative` (under `src/`): `a/b.rs` and `a/b/mod.rs` are `a::b`.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .filter_map(|p| p.to_str())
        .map(|p| p.trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
        parts.pop();
    }
    parts
}

/// Every circle between the files under `src`: each a list of files that use one another, sorted.
pub fn check(src: &Path) -> Result<Vec<Vec<String>>> {
    let mut files = Vec::new();
    sources(src, &mut files)?;
    let mut modules: BTreeMap<Vec<String>, String> = BTreeMap::new();
    let mut codes = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(src).unwrap_or(path);
        modules.insert(module_of(relative), relative.display().to_string());
        codes.push((module_of(relative), std::fs::read_to_string(path)?));
    }
    let mut uses: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, text) in codes {
        let used = uses.entry(module.clone()).or_default();
        for path in paths_used(&code_outside_tests(&text)) {
            let file = (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|prefix| modules.contains_key(prefix));
            if let Some(file) = file.filter(|f| *f != module) {
                used.insert(file);
            }
        }
    }
    Ok(strongly_connected(&uses)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| c.iter().map(|m| modules[m].clone()).collect())
        .collect())
}

/// The strongly connected components of `graph` (Tarjan's algorithm), each sorted.
fn strongly_connected<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct State<'g, N> {
        graph: &'g BTreeMap<N, BTreeSet<N>>,
        index: BTreeMap<&'g N, (usize, usize)>,
        stack: Vec<&'g N>,
        on_stack: BTreeSet<&'g N>,
        next: usize,
        out: Vec<Vec<N>>,
    }
    fn visit<'g, N: Ord + Clone>(s: &mut State<'g, N>, n: &'g N) {
        s.index.insert(n, (s.next, s.next));
        s.next += 1;
        s.stack.push(n);
        s.on_stack.insert(n);
        for m in s.graph.get(n).into_iter().flatten() {
            let Some((m, _)) = s.graph.get_key_value(m) else {
                continue;
            };
            if !s.index.contains_key(m) {
                visit(s, m);
                let low = s.index[m].1.min(s.index[n].1);
                s.index.get_mut(n).expect("visited").1 = low;
            } else if s.on_stack.contains(m) {
                let low = s.index[m].0.min(s.index[n].1);
                s.index.get_mut(n).expect("visited").1 = low;
            }
        }
        if s.index[n].0 == s.index[n].1 {
            let mut component = Vec::new();
            while let Some(m) = s.stack.pop() {
                s.on_stack.remove(m);
                component.push(m.clone());
                if m == n {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for n in graph.keys() {
        if !s.index.contains_key(n) {
            visit(&mut s, n);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Vec<String> {
        s.split("::").map(String::from).collect()
    }

    #[test]
    fn paths_are_read_with_their_groups_and_aliases() {
        let code = "use crate::a::{b::C, d as e, f::{self, G}};\nlet x = crate::h::i(1);\n\
                    use other_crate::j::k;\nlet s = \"crate::l::m\";\nuse crate::FastMap;\n";
        assert_eq!(
            paths_used(code),
            [
                p("a::b::C"),
                p("a::d"),
                p("a::f"),
                p("a::f::G"),
                p("h::i"),
                p("FastMap")
            ]
        );
    }

    #[test]
    fn circles_are_the_components_of_more_than_one_file() {
        let graph: BTreeMap<u8, BTreeSet<u8>> = [
            (1, [2].into()),
            (2, [3].into()),
            (3, [1, 4].into()),
            (4, [].into()),
            (5, [5, 4].into()),
        ]
        .into();
        let mut found = strongly_connected(&graph);
        found.sort();
        assert_eq!(found, [vec![1, 2, 3], vec![4], vec![5]]);
    }
}
