//! Crate hygiene (CONVENTIONS C10, TigerBeetle's `tidy`): the core stays sans-IO, deterministic
//! and readable. The test reads `core/src` and fails on any forbidden construct.

use std::fs;
use std::path::{Path, PathBuf};

/// Substrings that must not appear in core source (code or comments): I/O, clocks, randomness,
/// iteration-order-unstable collections, and test machinery.
const FORBIDDEN: &[(&str, &str)] = &[
    ("std::", "the core is no_std: use core:: or alloc::"),
    (
        "Instant::now",
        "the core has no clock: time arrives in inputs",
    ),
    (
        "SystemTime",
        "the core has no clock: time arrives in inputs",
    ),
    ("fs::", "no file system in the core"),
    ("net::", "no network in the core"),
    ("process::", "no processes in the core"),
    ("env::", "no environment access in the core"),
    ("thread", "no threads in the core"),
    ("rand::", "no RNG in the core: entropy arrives in inputs"),
    ("getrandom", "no RNG in the core: entropy arrives in inputs"),
    (
        "HashMap",
        "iteration order must not reach outputs: use BTreeMap",
    ),
    (
        "HashSet",
        "iteration order must not reach outputs: use BTreeSet",
    ),
    (
        "mod testkit",
        "test machinery lives in ql-worker-sim (sim/), not in the core",
    ),
    (
        "mod fuzzing",
        "fuzz harnesses live in ql-worker-sim (sim/), not in the core",
    ),
    (
        "doc(hidden)",
        "no hidden public API: explorer hooks go behind the `sim-hooks` feature",
    ),
];

/// Longest function body outside tests, ratcheted down as code is split (TigerBeetle uses 70).
const MAX_FUNCTION_LINES: usize = 90;
const MAX_COLUMNS: usize = 100;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The lines of a file before its trailing `#[cfg(test)]` module (tests are last, C15).
fn production_lines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim() == "#[cfg(test)]" {
            break;
        }
        lines.push(line);
    }
    lines
}

#[test]
fn core_source_is_sans_io_deterministic_and_tidy() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() >= 10,
        "expected the core sources under {}",
        root.display()
    );
    let mut problems = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        let lines = production_lines(&text);
        for (index, line) in lines.iter().enumerate() {
            let at = format!("{name}:{}", index + 1);
            for (needle, why) in FORBIDDEN {
                if line.contains(needle) {
                    problems.push(format!("{at}: `{needle}`: {why}"));
                }
            }
            if line.chars().count() > MAX_COLUMNS {
                problems.push(format!("{at}: longer than {MAX_COLUMNS} columns"));
            }
            if line.contains(".unwrap()") {
                let previous = if index > 0 { lines[index - 1] } else { "" };
                if !line.contains("// INVARIANT:") && !previous.contains("// INVARIANT:") {
                    problems.push(format!("{at}: unwrap() without an `// INVARIANT:` comment"));
                }
            }
        }
        problems.extend(long_functions(&name, &lines));
    }
    assert!(
        problems.is_empty(),
        "tidy found {} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Functions whose body spans more than [`MAX_FUNCTION_LINES`] lines, found by indentation:
/// a line starting a `fn` at indent `n` runs to the first later line that is `}` at indent `n`.
fn long_functions(name: &str, lines: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let is_fn = [
            "fn ",
            "pub fn ",
            "pub(crate) fn ",
            "const fn ",
            "pub const fn ",
        ]
        .iter()
        .any(|p| trimmed.starts_with(p));
        if !is_fn || trimmed.ends_with(';') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        if let Some(length) = lines[start..].iter().position(|l| *l == close)
            && length > MAX_FUNCTION_LINES
        {
            found.push(format!("{name}:{}: function is {length} lines", start + 1));
        }
    }
    found
}

#[test]
fn tidy_catches_what_it_claims_to() {
    // The checker itself must be able to fail.
    let bad = "fn f() {\n    let x = std::time::SystemTime::now();\n    y.unwrap();\n}\n";
    let lines = production_lines(bad);
    assert!(lines.iter().any(|l| l.contains("std::")));
    assert!(lines.iter().any(|l| l.contains(".unwrap()")));
    let long: Vec<String> = std::iter::once("fn g() {".to_string())
        .chain((0..MAX_FUNCTION_LINES + 1).map(|_| "    x();".to_string()))
        .chain(std::iter::once("}".to_string()))
        .collect();
    let refs: Vec<&str> = long.iter().map(String::as_str).collect();
    assert_eq!(long_functions("g.rs", &refs).len(), 1);
    assert!(production_lines("a\n#[cfg(test)]\nmod tests {}\n").len() == 1);
}

#[test]
fn core_depends_only_on_the_allowed_crates() {
    let manifest =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .unwrap();
    let names: Vec<&str> = deps
        .lines()
        .filter_map(|l| l.split(['.', '=', ' ']).next())
        .filter(|n| !n.is_empty() && !n.starts_with('#'))
        .collect();
    let allowed = [
        "serde",
        "serde_json",
        "postcard",
        "sha2",
        "subtle",
        "zeroize",
        "base64",
    ];
    for name in &names {
        assert!(allowed.contains(name), "core must not depend on `{name}`");
    }
    assert!(names.len() >= 5, "parsed {names:?}");
}
