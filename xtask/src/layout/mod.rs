//! `cargo xtask layout`: the layout rule of docs/development.md, checked. Every source file under a
//! crate's `src/` (test files aside: `tests.rs`, `tests/`) has at most [`MAX_CODE_LINES`] lines of
//! code, and an inline test module of at most [`MAX_INLINE_TEST_LINES`] lines of code; beyond
//! either, the file becomes a folder. Lines of code: neither blank nor only a comment (the inline
//! `#[cfg(test)] mod tests { … }` counted apart). Prints the largest files, so the figure is one
//! command away. Then the controller's stage order ([`stages`]).

use anyhow::{Result, bail};
use std::path::{Path, PathBuf};

mod circles;
mod stages;

/// Code lines a source file may have.
pub const MAX_CODE_LINES: usize = 800;
/// Lines an inline test module may have.
pub const MAX_INLINE_TEST_LINES: usize = 300;
/// The crates whose sources are checked.
const CRATES: [&str; 8] = [
    "agent",
    "agent-common",
    "agent-ebpf",
    "api",
    "controller",
    "netpol",
    "tests",
    "xtask",
];

/// One file's figures.
#[derive(Debug, PartialEq, Eq)]
pub struct Counted {
    pub code: usize,
    pub inline_tests: usize,
}

/// Counts `text` (see the module docs).
pub fn count(text: &str) -> Counted {
    let (code, tests) = split_tests(text);
    Counted {
        code: code.iter().filter(|l| is_code(l)).count(),
        inline_tests: tests.iter().filter(|l| is_code(l)).count(),
    }
}

/// The lines of code of `text` outside its inline test module, comments left out.
pub fn code_outside_tests(text: &str) -> String {
    let (code, _) = split_tests(text);
    let code: Vec<&str> = code.into_iter().filter(|l| is_code(l)).collect();
    code.join("\n")
}

/// `text`'s lines outside its inline test modules, and those inside.
fn split_tests(text: &str) -> (Vec<&str>, Vec<&str>) {
    let lines: Vec<&str> = text.lines().collect();
    let (mut code, mut tests) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        // `#[cfg(test)]` on an inline module of any name.
        let opens_tests = line == "#[cfg(test)]"
            && lines.get(i + 1).is_some_and(|next| {
                let next = next.trim();
                next.starts_with("mod ") && next.ends_with(" {")
            });
        if opens_tests {
            // Up to the closing brace at the module's own indentation.
            let indent = lines[i + 1].len() - lines[i + 1].trim_start().len();
            let close = format!("{}}}", " ".repeat(indent));
            let end = lines[i + 2..]
                .iter()
                .position(|l| *l == close)
                .map_or(lines.len(), |p| i + 2 + p);
            tests.extend_from_slice(&lines[i..=end.min(lines.len() - 1)]);
            i = end + 1;
            continue;
        }
        code.push(line);
        i += 1;
    }
    (code, tests)
}

/// Neither blank nor only a comment.
fn is_code(line: &str) -> bool {
    let line = line.trim();
    !line.is_empty() && !line.starts_with("//")
}

/// The source files of `dir`, test files aside.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if name != "tests" {
                sources(&path, out)?;
            }
        } else if path.is_file() && name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
    Ok(())
}

/// Checks the workspace at `root`; prints the largest files.
pub fn check(root: &Path) -> Result<()> {
    let mut files = Vec::new();
    for krate in CRATES {
        let src = root.join(krate).join("src");
        if src.is_dir() {
            sources(&src, &mut files)?;
        }
    }
    let mut counted = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path)?;
        let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        counted.push((count(&text), relative));
    }
    counted.sort_by_key(|(c, _)| std::cmp::Reverse(c.code));
    println!(
        "{} source files; the largest (code lines, inline test lines):",
        counted.len()
    );
    for (c, path) in counted.iter().take(5) {
        println!("  {:>5} {:>4}  {}", c.code, c.inline_tests, path.display());
    }
    let largest_tests = counted
        .iter()
        .map(|(c, _)| c.inline_tests)
        .max()
        .unwrap_or(0);
    println!("  largest inline test module: {largest_tests} lines");
    let over: Vec<String> = counted
        .iter()
        .filter(|(c, _)| c.code > MAX_CODE_LINES || c.inline_tests > MAX_INLINE_TEST_LINES)
        .map(|(c, p)| {
            format!(
                "{} ({} code, {} inline test lines)",
                p.display(),
                c.code,
                c.inline_tests
            )
        })
        .collect();
    let mut circles = Vec::new();
    for krate in CRATES {
        let src = root.join(krate).join("src");
        if src.is_dir() {
            for circle in circles::check(&src)? {
                circles.push(format!("{krate}/src: {}", circle.join(" ↔ ")));
            }
        }
    }
    println!("  circles between files: {}", circles.len());
    if !circles.is_empty() {
        bail!(
            "files that use one another (docs/development.md, \"Stage order\"; move what both need \
             into one of them or below both): {}",
            circles.join("; ")
        );
    }
    let (against, gone) = stages::check(&root.join("controller").join("src"))?;
    let known: Vec<String> = stages::KNOWN
        .iter()
        .map(|(stage, later, _)| format!("{stage} → {later}"))
        .collect();
    println!(
        "  controller imports against the stage order: {}{}",
        against.len(),
        if known.is_empty() {
            String::new()
        } else {
            format!(" beyond the {} known ({})", known.len(), known.join(", "))
        }
    );
    if !against.is_empty() || !gone.is_empty() {
        bail!(
            "the controller's stage order (docs/development.md, \"Stage order\"): imports against it: \
             {}; known ones no longer found (remove them from KNOWN in xtask/src/layout/stages.rs): {}",
            if against.is_empty() {
                "none".to_string()
            } else {
                against.join("; ")
            },
            if gone.is_empty() {
                "none".to_string()
            } else {
                gone.join(", ")
            }
        );
    }
    if !over.is_empty() {
        bail!(
            "over the layout rule (docs/development.md: more than {MAX_CODE_LINES} code lines or an \
             inline test module over {MAX_INLINE_TEST_LINES} lines makes a folder): {}",
            over.join("; ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_lines_leave_out_blanks_comments_and_the_inline_test_module() {
        let text = "//! docs\nuse a;\n\n/// item docs\nfn f() {\n    // why\n    g();\n}\n\n#[cfg(test)]\nmod tests {\n    use super::*;\n    #[test]\n    fn t() {}\n}\n";
        assert_eq!(
            count(text),
            Counted {
                code: 4,
                inline_tests: 6
            }
        );
        // A nested module's closing brace at another indentation does not end it early.
        let nested = "#[cfg(test)]\nmod differences {\n    mod inner {\n    }\n}\nfn after() {}\n";
        assert_eq!(
            count(nested),
            Counted {
                code: 1,
                inline_tests: 5
            }
        );
    }
}
