//! `docs/operations.md` matches the code (issue 18): every event the source emits is in
//! `events::EVENTS` and in the schema table with the same level, and nothing else is; every
//! metric family the registry renders is in the metrics table with its type, and nothing else
//! is; the exit-code table lists exactly the codes `cli` defines, as `--help` does; the
//! documented unit's `TimeoutStopSec` covers each profile's drain budget.

mod e2e_common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use e2e_common::World;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn operations() -> String {
    std::fs::read_to_string(repo().join("docs/operations.md")).unwrap()
}

/// The text of the section that starts with the heading `heading` (up to the next heading of
/// the same or a higher level; `#` lines inside code blocks are not headings).
fn section(doc: &str, heading: &str) -> String {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut lines = doc.lines();
    assert!(
        lines.any(|l| l == heading),
        "docs/operations.md has a {heading:?} section"
    );
    let mut out = String::new();
    let mut fenced = false;
    for line in lines {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !fenced && hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
            break;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The cells of every table row of `text` whose first cell is a backquoted name.
fn named_rows(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut rows = BTreeMap::new();
    for line in text.lines() {
        let Some(inner) = line.strip_prefix("| `") else {
            continue;
        };
        let cells: Vec<String> = inner.split(" | ").map(|c| c.trim().to_owned()).collect();
        let name = cells[0].trim_end_matches('`').to_owned();
        assert!(
            rows.insert(name.clone(), cells[1..].to_vec()).is_none(),
            "{name} is documented twice"
        );
    }
    rows
}

/// Every event name the driver's source passes to `Event::error/warn/info/debug/new`.
fn emitted_events() -> BTreeMap<String, PathBuf> {
    fn walk(dir: &Path, out: &mut BTreeMap<String, PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                for call in [
                    "Event::error(\"",
                    "Event::warn(\"",
                    "Event::info(\"",
                    "Event::debug(\"",
                ] {
                    for (at, _) in text.match_indices(call) {
                        let rest = &text[at + call.len()..];
                        let name = &rest[..rest.find('"').unwrap()];
                        out.insert(name.to_owned(), path.clone());
                    }
                }
                assert!(
                    !text.contains("Event::new(") || path.ends_with("events.rs"),
                    "{}: name events with Event::error/warn/info/debug so this test sees them",
                    path.display()
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(&repo().join("drivers/src"), &mut out);
    out
}

#[test]
fn every_event_is_documented_with_its_level_and_emitted() {
    let doc = operations();
    let table = named_rows(&section(&doc, "### Event schema"));
    let code: BTreeMap<&str, String> = ql_worker::events::EVENTS
        .iter()
        .map(|(name, level, _)| (*name, level.as_str().to_ascii_lowercase()))
        .collect();
    for (name, level) in &code {
        let row = table
            .get(*name)
            .unwrap_or_else(|| panic!("event {name} is missing from docs/operations.md"));
        assert!(
            row[0].starts_with(level.as_str()),
            "{name}: the docs say {:?}, the code {level}",
            row[0]
        );
    }
    for name in table.keys() {
        assert!(
            code.contains_key(name.as_str()),
            "docs/operations.md documents {name}, which the code does not define"
        );
    }
    let emitted = emitted_events();
    for (name, file) in &emitted {
        assert!(
            code.contains_key(name.as_str()),
            "{} emits {name}, which EVENTS does not define",
            file.display()
        );
    }
    for name in code.keys() {
        // `library` is the name the logger gives other crates' records.
        assert!(
            *name == "library" || emitted.contains_key(*name),
            "EVENTS defines {name}, which nothing emits"
        );
    }
    println!(
        "docs: {} events documented, {} emitted by name",
        table.len(),
        emitted.len()
    );
}

#[test]
fn every_metric_is_documented_with_its_type() {
    let doc = operations();
    let table = named_rows(&section(&doc, "## Metrics"));
    let metrics = ql_worker::metrics::Metrics::new(0);
    let text = metrics.render(0);
    let mut families = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            families.insert(name.to_owned(), kind.to_owned());
        }
    }
    assert!(families.len() >= 20, "{text}");
    for (name, kind) in &families {
        let row = table
            .get(name)
            .unwrap_or_else(|| panic!("metric {name} is missing from docs/operations.md"));
        assert_eq!(&row[0], kind, "{name}");
    }
    for name in table.keys() {
        assert!(
            families.contains_key(name),
            "docs/operations.md documents {name}, which the registry does not render"
        );
    }
}

#[test]
fn the_exit_code_table_lists_exactly_the_codes_of_the_cli() {
    let doc = operations();
    let codes: Vec<u8> = section(&doc, "### Exit codes")
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .collect();
    use ql_worker::cli::*;
    let defined = [
        EXIT_OK,
        EXIT_OUTPUT,
        EXIT_CONFIG,
        EXIT_STORAGE,
        EXIT_UNSETTLED,
        EXIT_HALTED,
        EXIT_RECOVERY,
        EXIT_DEMO_FAILED,
    ];
    assert_eq!(codes, defined);
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_ql-worker"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for code in defined {
        assert!(
            help.lines().any(|l| l.starts_with(&format!("  {code}  "))),
            "--help lists exit code {code}:\n{help}"
        );
    }
}

/// The unit's `TimeoutStopSec` is at least each profile's drain budget plus 30 s, and the
/// profile table says so with the budgets the configuration really applies.
#[test]
fn timeout_stop_sec_covers_each_profile_drain_budget() {
    let doc = operations();
    let profiles = section(&doc, "## Edge or node");
    let row = |label: &str| -> Vec<u64> {
        let line = profiles
            .lines()
            .find(|l| l.starts_with(&format!("| {label}")))
            .unwrap_or_else(|| panic!("a {label:?} row"));
        line.split('|')
            .skip(2)
            .filter(|c| !c.trim().is_empty())
            .map(|c| c.trim().trim_end_matches(" s").parse().unwrap())
            .collect()
    };
    let budgets = row("drain budget");
    let stops = row("systemd `TimeoutStopSec`");
    let mut world = World::new();
    world.edit_config("drain_budget_ms = 20000\n", "");
    let node = world.config.limits.drain_budget_ms / 1000;
    world.edit_config("profile = \"node\"", "profile = \"edge\"");
    let edge = world.config.limits.drain_budget_ms / 1000;
    assert_eq!(
        budgets,
        [edge, node],
        "the documented budgets are the code's"
    );
    for (budget, stop) in budgets.iter().zip(&stops) {
        assert!(
            *stop >= budget + 30,
            "TimeoutStopSec {stop} < budget {budget} + 30"
        );
    }
    let unit = section(&doc, "## systemd");
    let in_unit: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .expect("the unit sets TimeoutStopSec")
        .parse()
        .unwrap();
    assert_eq!(
        in_unit, stops[0],
        "the unit as written is the edge profile's"
    );
    assert!(unit.contains(&format!("TimeoutStopSec={}", stops[1])));
    assert!(unit.contains("Type=notify") && unit.contains("WatchdogSec="));
}
