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

/// Every tidy problem in the `.rs` files under `root` (recursively), as `file:line: rule` with
/// the file relative to `root`.
fn scan(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    sources(root, &mut files);
    files.sort();
    let mut problems = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).unwrap();
        let name = file.strip_prefix(root).unwrap().display().to_string();
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
            let next = lines.get(index + 1).copied().unwrap_or("");
            if !is_test_machinery(&name) && expect_without_invariant(line, next) {
                problems.push(format!(
                    "{at}: expect() whose message does not name the invariant \
                     (`.expect(\"invariant: …\")`)"
                ));
            }
        }
        problems.extend(long_functions(&name, &lines));
    }
    problems
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
    let problems = scan(&root);
    assert!(
        problems.is_empty(),
        "tidy found {} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The files issue 15 counts as "the machines, `io` and the record graph".
const MACHINE_FILES: [&str; 9] = [
    "worker.rs",
    "processor.rs",
    "supervision.rs",
    "pull.rs",
    "completion.rs",
    "session.rs",
    "claim.rs",
    "io.rs",
    "record.rs",
];
/// The ceiling on core's production code lines: the count when it was last lowered. Issue 15
/// asks for 7,000 (3,500 of them in [`MACHINE_FILES`]); until then the count may only fall. Lower
/// the ceiling with every change that lowers the count.
const PRODUCTION_LINE_CEILING: usize = 10_704;

/// Core's production code: non-blank lines that are not comments (`//`, `///`, `//!`), outside
/// the trailing `#[cfg(test)]` module, summed over `core/src` and over [`MACHINE_FILES`].
fn production_code_lines(root: &Path) -> (usize, usize) {
    let mut files = Vec::new();
    sources(root, &mut files);
    let (mut total, mut machines) = (0, 0);
    for path in files {
        let text = fs::read_to_string(&path).expect("a readable core source");
        let code = production_lines(&text)
            .iter()
            .filter(|line| {
                let line = line.trim();
                !line.is_empty() && !line.starts_with("//")
            })
            .count();
        total += code;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.parent() == Some(root) && MACHINE_FILES.contains(&name) {
            machines += code;
        }
    }
    (total, machines)
}

#[test]
fn core_production_code_stays_under_its_ceiling() {
    use std::io::Write as _;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (total, machines) = production_code_lines(&root);
    let _ = writeln!(
        std::io::stdout().lock(),
        "core production code: {total} lines, {machines} of them in the machines, io and the \
         record graph (issue 15 asks for 7000 and 3500; ceiling {PRODUCTION_LINE_CEILING})"
    );
    assert!(
        total <= PRODUCTION_LINE_CEILING,
        "core's production code grew to {total} lines, above its ceiling of \
         {PRODUCTION_LINE_CEILING} (core/tests/tidy.rs)"
    );
}

#[test]
fn the_line_count_skips_comments_blanks_and_tests() {
    let dir = std::env::temp_dir().join(format!("ql-tidy-count-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("wire")).expect("a temp dir");
    let file = "//! Module.\n\n/// Doc.\nfn a() {\n    // note\n    let _ = 1;\n}\n\n\
                #[cfg(test)]\nmod tests {\n    fn b() {}\n}\n";
    fs::write(dir.join("worker.rs"), file).expect("a planted file");
    fs::write(dir.join("wire").join("worker.rs"), file).expect("a planted file");
    fs::write(dir.join("other.rs"), "fn c() {}\n").expect("a planted file");
    // Three code lines per planted `worker.rs`; only the top-level one is a machine file.
    assert_eq!(production_code_lines(&dir), (7, 3));
    let _ = fs::remove_dir_all(&dir);
}

/// The test machinery still compiled into core (leaving it for its own crate): its `expect`s
/// name sample data, not protocol invariants.
fn is_test_machinery(name: &str) -> bool {
    name.starts_with("testkit/") || name.starts_with("fuzzing/") || name == "wire/fuzzing.rs"
}

/// Production code panics only on a broken invariant, and says which: an `.expect(` (outside
/// comments) must carry a literal message starting with `invariant` (on its line, or on the next
/// when rustfmt wraps it). A panic instead of `unwrap_or_default()` is the honest form: a
/// silently empty request body or digest preimage is worse.
fn expect_without_invariant(line: &str, next: &str) -> bool {
    let code = line.trim_start();
    if code.starts_with("//") {
        return false;
    }
    let Some((_, after)) = code.split_once(".expect(") else {
        return false;
    };
    let message = if after.trim().is_empty() {
        next.trim_start()
    } else {
        after.trim_start()
    };
    !message.starts_with("\"invariant")
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

/// A scratch directory under the system temp dir, removed on drop.
struct Planted(PathBuf);

impl Planted {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ql-tidy-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("nested")).unwrap();
        Self(dir)
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn tidy_catches_what_it_claims_to() {
    // The real scan, run over a planted tree: one offending line per rule at a known line, the
    // same offences after `#[cfg(test)]` (ignored), and a clean file (no finding).
    let planted = Planted::new("self-test");
    let mut bad: Vec<String> = FORBIDDEN
        .iter()
        .map(|(needle, _)| format!("const _: &str = \"{needle}\";"))
        .collect();
    let first_free = bad.len() + 1;
    bad.push(format!("// {}", "x".repeat(MAX_COLUMNS)));
    bad.push("    y.unwrap();".to_string());
    bad.push("// INVARIANT: the comment on the line before excuses the unwrap.".to_string());
    bad.push("    y.unwrap();".to_string());
    bad.push("    y.unwrap(); // INVARIANT: excused on the same line.".to_string());
    let expect_at = bad.len() + 1;
    bad.push("    let b = r.to_body().expect(\"body\");".to_string());
    bad.push("    let b = r.to_body().expect(\"invariant: a request body is small\");".to_string());
    let long_at = bad.len() + 1;
    bad.push("fn g() {".to_string());
    bad.extend((0..MAX_FUNCTION_LINES).map(|_| "    x();".to_string()));
    bad.push("}".to_string());
    bad.push("fn ok() {".to_string());
    bad.extend((0..MAX_FUNCTION_LINES - 1).map(|_| "    x();".to_string()));
    bad.push("}".to_string());
    bad.push("#[cfg(test)]".to_string());
    bad.push("mod tests { fn t() { std::fs::read(\"HashMap\").unwrap(); } }".to_string());
    fs::write(planted.0.join("nested/bad.rs"), bad.join("\n")).unwrap();
    fs::write(
        planted.0.join("nested/not_rust.txt"),
        "std::fs::read(x).unwrap()",
    )
    .unwrap();
    fs::write(planted.0.join("clean.rs"), "fn f() -> u8 {\n    1\n}\n").unwrap();

    let problems = scan(&planted.0);
    let file = Path::new("nested").join("bad.rs").display().to_string();
    let mut expected: Vec<String> = FORBIDDEN
        .iter()
        .enumerate()
        .map(|(i, (needle, why))| format!("{file}:{}: `{needle}`: {why}", i + 1))
        .collect();
    expected.push(format!(
        "{file}:{first_free}: longer than {MAX_COLUMNS} columns"
    ));
    expected.push(format!(
        "{file}:{}: unwrap() without an `// INVARIANT:` comment",
        first_free + 1
    ));
    expected.push(format!(
        "{file}:{expect_at}: expect() whose message does not name the invariant \
         (`.expect(\"invariant: …\")`)"
    ));
    expected.push(format!(
        "{file}:{long_at}: function is {} lines",
        MAX_FUNCTION_LINES + 1
    ));
    assert_eq!(problems, expected);
    // Every FORBIDDEN entry, the column, unwrap, expect and length rules each fired.
    assert_eq!(problems.len(), FORBIDDEN.len() + 4);
    // expect() must name its invariant, on its line or the next; comments are not code.
    assert!(expect_without_invariant(
        "    let b = r.to_body().expect(\"body\");",
        ""
    ));
    assert!(expect_without_invariant(
        "    x.expect(",
        "        \"too large\","
    ));
    assert!(expect_without_invariant("    x.expect(msg);", ""));
    assert!(!expect_without_invariant(
        "    x.expect(\"invariant: ids are short\");",
        ""
    ));
    assert!(!expect_without_invariant(
        "    x.expect(",
        "        \"invariant: ids are short\","
    ));
    assert!(!expect_without_invariant(
        "//! w.handle(now()).expect(\"driver bug\");",
        ""
    ));
    assert!(is_test_machinery("testkit/world/plane.rs") && !is_test_machinery("processor.rs"));
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
        // A proc-macro only (no_std with default features off): the error types' `Display`.
        "thiserror",
    ];
    for name in &names {
        assert!(allowed.contains(name), "core must not depend on `{name}`");
    }
    assert!(names.len() >= 5, "parsed {names:?}");
}
