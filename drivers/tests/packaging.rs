//! The release tarball's service files agree with the documentation and the binary
//! (`tests/edge/package.sh` ships them as they are here).
//!
//! * `packaging/systemd/ql-worker.service` is byte for byte the unit `docs/operations.md` shows
//!   under "## systemd" (one unit, two places: this test keeps them one).
//! * The unit and the OpenWrt init script run `ql-worker run --config
//!   /etc/ql-worker/ql-worker.toml`, and the unit's `RestartPreventExitStatus` names exactly the
//!   exit codes that need an operator (configuration, state root).

use std::path::{Path, PathBuf};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The body of the first fenced ```ini block after the `## systemd` heading.
fn documented_unit(operations: &str) -> String {
    let section = operations
        .split_once("\n## systemd\n")
        .expect("docs/operations.md has a `## systemd` section")
        .1;
    let body = section
        .split_once("```ini\n")
        .expect("the systemd section shows the unit in an ```ini block")
        .1;
    let (unit, _) = body.split_once("\n```").expect("the ini block is closed");
    format!("{unit}\n")
}

#[test]
fn the_shipped_systemd_unit_is_the_documented_one() {
    let documented = documented_unit(&read("docs/operations.md"));
    let shipped = read("packaging/systemd/ql-worker.service");
    assert_eq!(
        shipped, documented,
        "packaging/systemd/ql-worker.service differs from the unit in docs/operations.md: \
         change both"
    );
}

#[test]
fn the_documented_unit_extraction_sees_a_changed_line() {
    // The comparison above is only as good as the extraction: a doc with one changed line must
    // give a different unit.
    let operations = read("docs/operations.md");
    let changed = operations.replacen("TimeoutStopSec=90", "TimeoutStopSec=91", 1);
    assert_ne!(changed, operations, "the unit has TimeoutStopSec=90");
    assert_ne!(documented_unit(&changed), documented_unit(&operations));
}

#[test]
fn service_files_run_the_worker_and_stop_on_operator_exit_codes() {
    let unit = read("packaging/systemd/ql-worker.service");
    assert!(
        unit.lines().any(|l| l
            == "ExecStart=/usr/local/bin/ql-worker run --config /etc/ql-worker/ql-worker.toml"),
        "{unit}"
    );
    assert!(unit.lines().any(|l| l == "KillMode=process"), "{unit}");
    let prevent = unit
        .lines()
        .find_map(|l| l.strip_prefix("RestartPreventExitStatus="))
        .expect("RestartPreventExitStatus");
    let codes: Vec<u8> = prevent.split(' ').map(|c| c.parse().unwrap()).collect();
    assert_eq!(
        codes,
        vec![ql_worker::cli::EXIT_CONFIG, ql_worker::cli::EXIT_STORAGE]
    );

    let init = read("packaging/openwrt/ql-worker.init");
    assert!(init.starts_with("#!/bin/sh /etc/rc.common\n"), "{init}");
    for line in [
        "USE_PROCD=1",
        "PROG=/usr/bin/ql-worker",
        "CONFIG=/etc/ql-worker/ql-worker.toml",
        "\tprocd_set_param command \"$PROG\" run --config \"$CONFIG\"",
        // The Worker runs as root under procd: without [run_as] a Run would too.
        "\tif ! grep -q '^\\[run_as\\]' \"$CONFIG\"; then",
    ] {
        assert!(
            init.lines().any(|l| l == line),
            "missing {line:?} in:\n{init}"
        );
    }
}
