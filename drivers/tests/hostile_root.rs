//! Operator commands of the real binary against hostile or mistaken state roots (issue 19,
//! items 1, 2, 3, 5 and 7): `drain` never follows a link or writes outside a state root, `init`
//! refuses a directory holding foreign entries, `recover` says when a receipt cannot be read,
//! `recover --archive` creates nothing on a mistyped root, and every exit code is the documented
//! one (2 usage or configuration, 3 state root unusable, 1 output could not be written), never
//! a panic. Each refusal leaves the whole tree exactly as it was.

mod storage_support;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};

use ql_worker::journal::Journal;
use ql_worker::receipts;
use ql_worker_core::listing::Capacity;
use ql_worker_core::record::State;
use ql_worker_sim::testkit;
use storage_support::*;

const BIN: &str = env!("CARGO_BIN_EXE_ql-worker");

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn cli(args: &[&str]) -> Out {
    cli_to(args, Stdio::piped())
}

fn cli_to(args: &[&str], stdout: Stdio) -> Out {
    let out = Command::new(BIN)
        .args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(stdout)
        .output()
        .unwrap();
    let result = Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !result.stderr.contains("panicked"),
        "{args:?} panicked: {}",
        result.stderr
    );
    result
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
}

/// An initialised state root (`ql-worker init`).
fn state_root() -> Sandbox {
    let sb = sandbox();
    let out = cli(&["init", "--root", s(&sb.root)]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    sb
}

#[test]
fn drain_never_follows_a_link_or_truncates_what_is_at_its_name() {
    // A victim of root's the service user would like truncated, with content and a mode.
    let sb = state_root();
    let victim = sb.dir.path().join("victim");
    fs::write(&victim, b"precious\n").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o644)).unwrap();
    let private_victim = sb.dir.path().join("private-victim");
    fs::write(&private_victim, b"precious\n").unwrap();
    fs::set_permissions(&private_victim, fs::Permissions::from_mode(0o600)).unwrap();
    let drain = sb.root.join("drain");
    let dangling = sb.dir.path().join("created-through-the-link");
    type Plant<'a> = Box<dyn Fn() + 'a>;
    let plant: [(&str, Plant<'_>, &str); 5] = [
        (
            "a symlink to a file",
            Box::new(|| std::os::unix::fs::symlink(&victim, &drain).unwrap()),
            "symbolic link",
        ),
        (
            "a dangling symlink",
            Box::new(|| std::os::unix::fs::symlink(&dangling, &drain).unwrap()),
            "symbolic link",
        ),
        (
            "a hard link to a file",
            Box::new(|| fs::hard_link(&private_victim, &drain).unwrap()),
            "exactly one link",
        ),
        (
            "a directory",
            Box::new(|| fs::create_dir(&drain).unwrap()),
            "must be a regular file",
        ),
        (
            "a FIFO",
            Box::new(|| mkfifo(&drain)),
            "must be a regular file",
        ),
    ];
    for (class, make, rule) in plant {
        make();
        let before = snapshot(sb.dir.path());
        let out = cli(&["drain", "--root", s(&sb.root)]);
        assert_eq!(out.code, Some(3), "{class}: {}", out.stderr);
        assert!(
            out.stderr.contains(s(&drain)) && out.stderr.contains(rule),
            "{class}: {}",
            out.stderr
        );
        assert_eq!(snapshot(sb.dir.path()), before, "{class}: changed the tree");
        assert_eq!(fs::read(&victim).unwrap(), b"precious\n");
        assert_eq!(fs::read(&private_victim).unwrap(), b"precious\n");
        assert!(!dangling.exists());
        if fs::symlink_metadata(&drain).unwrap().is_dir() {
            fs::remove_dir(&drain).unwrap();
        } else {
            fs::remove_file(&drain).unwrap();
        }
    }
    // The control: a state root gets a private empty request file, once.
    let out = cli(&["drain", "--root", s(&sb.root)]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("drain requested"), "{}", out.stdout);
    let meta = fs::symlink_metadata(&drain).unwrap();
    assert!(meta.is_file() && meta.len() == 0);
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    let before = snapshot(sb.dir.path());
    let out = cli(&["drain", "--root", s(&sb.root)]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.contains("already requested"), "{}", out.stdout);
    assert_eq!(
        snapshot(sb.dir.path()),
        before,
        "a second request changes nothing"
    );
}

#[test]
fn drain_writes_only_into_a_state_root() {
    let sb = sandbox();
    let top = sb.dir.path();
    let empty = top.join("empty");
    fs::create_dir(&empty).unwrap();
    fs::set_permissions(&empty, fs::Permissions::from_mode(0o700)).unwrap();
    let busy = top.join("busy");
    fs::create_dir(&busy).unwrap();
    fs::set_permissions(&busy, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(busy.join("notes.txt"), b"x").unwrap();
    let shared = top.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o755)).unwrap();
    let file = top.join("a-file");
    fs::write(&file, b"x").unwrap();
    let real = state_root();
    let link = top.join("link-to-root");
    std::os::unix::fs::symlink(&real.root, &link).unwrap();
    let missing = top.join("missing");
    let cases: [(&Path, &str); 6] = [
        (&empty, "not a ql-worker state root"),
        (&busy, "not a ql-worker state root"),
        (&shared, "no group/other permission bits"),
        (&file, "must be a real directory"),
        (&link, "symbolic link"),
        (&missing, "no state root"),
    ];
    for (root, says) in cases {
        let before = snapshot(top);
        let real_before = snapshot(real.dir.path());
        for args in [
            vec!["drain", "--root"],
            vec!["inbox", "list", "--root"],
            vec!["recover", "--root"],
            vec!["recover", "--archive", "offer-000001", "--root"],
        ] {
            let mut args = args.clone();
            args.push(s(root));
            let out = cli(&args);
            assert_eq!(out.code, Some(3), "{args:?}: {}", out.stderr);
            assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        }
        assert_eq!(
            snapshot(top),
            before,
            "{}: changed the tree",
            root.display()
        );
        assert_eq!(snapshot(real.dir.path()), real_before);
    }
    // Malformed paths are usage errors (2), refused before anything is opened.
    for bad in ["relative/root", "/tmp/../etc", "/tmp/./x", "/tmp/a\nb", "/"] {
        for args in [
            vec!["drain", "--root", bad],
            vec!["init", "--root", bad],
            vec!["inbox", "list", "--root", bad],
            vec!["recover", "--root", bad],
        ] {
            let out = cli(&args);
            assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
            assert!(out.stderr.contains("--root"), "{args:?}: {}", out.stderr);
        }
    }
    let out = Command::new(BIN)
        .args(["inbox", "list"])
        .env_clear()
        .env("QL_WORKER_ROOT", "")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("QL_WORKER_ROOT") && stderr.contains("empty"),
        "{stderr}"
    );
}

#[test]
fn init_refuses_a_directory_holding_foreign_entries() {
    type Plant = Box<dyn Fn(&Path)>;
    let classes: Vec<(&str, Plant, &str)> = vec![
        (
            "a foreign file",
            Box::new(|d| fs::write(d.join("notes.txt"), b"x").unwrap()),
            "notes.txt",
        ),
        (
            "a foreign directory",
            Box::new(|d| fs::create_dir(d.join("backup")).unwrap()),
            "backup",
        ),
        (
            "a symlink named offers",
            Box::new(|d| std::os::unix::fs::symlink("/tmp", d.join("offers")).unwrap()),
            "symbolic link",
        ),
        (
            "a file named logs",
            Box::new(|d| fs::write(d.join("logs"), b"").unwrap()),
            "must be a real directory",
        ),
        (
            "a FIFO named session",
            Box::new(|d| mkfifo(&d.join("session"))),
            "must be a regular file",
        ),
        (
            "a symlink named .owner.lock",
            Box::new(|d| std::os::unix::fs::symlink("/etc/passwd", d.join(".owner.lock")).unwrap()),
            "symbolic link",
        ),
        (
            "a non-UTF-8 name",
            Box::new(|d| {
                use std::os::unix::ffi::OsStrExt as _;
                fs::write(d.join(std::ffi::OsStr::from_bytes(b"\xff\xfe")), b"").unwrap();
            }),
            "not an entry this storage writes",
        ),
    ];
    for (class, plant, says) in classes {
        let sb = sandbox();
        fs::create_dir(&sb.root).unwrap();
        fs::set_permissions(&sb.root, fs::Permissions::from_mode(0o700)).unwrap();
        plant(&sb.root);
        let before = snapshot(sb.dir.path());
        let out = cli(&["init", "--root", s(&sb.root)]);
        assert_eq!(out.code, Some(3), "{class}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{class}: {}", out.stderr);
        assert_eq!(snapshot(sb.dir.path()), before, "{class}: changed the tree");
    }
    // The controls: an empty private directory and an existing state root are fine.
    let sb = sandbox();
    fs::create_dir(&sb.root).unwrap();
    fs::set_permissions(&sb.root, fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(cli(&["init", "--root", s(&sb.root)]).code, Some(0));
    assert_eq!(cli(&["init", "--root", s(&sb.root)]).code, Some(0));
    assert!(sb.root.join(".owner.lock").is_file());
}

/// A `recovery_required(launch_outcome_unknown)` record for attempt-1 in a state root.
fn recovery_root() -> Sandbox {
    let sb = state_root();
    let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    let chain = to_recovery(1);
    journal.publish_record(&chain[0]).unwrap();
    journal
        .replace_record(&chain[1].offer.offer_id, &chain[1], chain[0].revision)
        .unwrap();
    sb
}

#[test]
fn recover_says_when_a_receipt_cannot_be_read_instead_of_calling_it_absent() {
    let sb = recovery_root();
    let root = s(&sb.root);
    let receipt_path = sb.root.join("receipts/at/attempt-1.rcpt");

    let out = cli(&["recover", "--root", root]);
    assert_eq!(out.code, Some(6), "{}", out.stderr);
    assert!(out.stdout.contains("receipt: absent"), "{}", out.stdout);

    receipts::publish(&sb.root, &receipt(1)).unwrap();
    let out = cli(&["recover", "--root", root]);
    assert!(out.stdout.contains("receipt: present"), "{}", out.stdout);
    assert!(
        out.stdout.contains("the receipt is there"),
        "{}",
        out.stdout
    );

    let good = fs::read(&receipt_path).unwrap();
    type Tamper = Box<dyn Fn(&Path)>;
    let classes: Vec<(&str, Tamper, &str)> = vec![
        (
            "corrupt",
            Box::new(|p| {
                fs::write(p, b"not a receipt envelope").unwrap();
                fs::set_permissions(p, fs::Permissions::from_mode(0o600)).unwrap();
            }),
            "corrupt file",
        ),
        (
            "readable by others",
            Box::new(|p| fs::set_permissions(p, fs::Permissions::from_mode(0o644)).unwrap()),
            "group/other permission bits",
        ),
        (
            "a symlink",
            Box::new(|p| {
                let elsewhere = p.with_file_name("elsewhere");
                fs::rename(p, &elsewhere).unwrap();
                std::os::unix::fs::symlink(&elsewhere, p).unwrap();
            }),
            "symbolic link",
        ),
        (
            "a shard that is a file",
            Box::new(|p| {
                let shard = p.parent().unwrap();
                fs::remove_dir_all(shard).unwrap();
                fs::write(shard, b"").unwrap();
            }),
            "must be a real directory",
        ),
        (
            "a receipts directory that is a symlink",
            Box::new(|p| {
                let receipts = p.parent().unwrap().parent().unwrap();
                let moved = receipts.parent().unwrap().with_file_name("receipts-moved");
                fs::rename(receipts, &moved).unwrap();
                std::os::unix::fs::symlink(&moved, receipts).unwrap();
            }),
            "symbolic link",
        ),
    ];
    for (class, tamper, says) in classes {
        let sb = recovery_root();
        receipts::publish(&sb.root, &receipt(1)).unwrap();
        let receipt_path = sb.root.join("receipts/at/attempt-1.rcpt");
        assert_eq!(fs::read(&receipt_path).unwrap(), good);
        tamper(&receipt_path);
        let before = snapshot(sb.dir.path());
        let out = cli(&["recover", "--root", s(&sb.root)]);
        if class == "a receipts directory that is a symlink" {
            // A symlink where the root's own receipts/ belongs makes the root unusable.
            assert_eq!(out.code, Some(3), "{class}: {}", out.stderr);
            assert!(out.stderr.contains(says), "{class}: {}", out.stderr);
            continue;
        }
        assert_eq!(out.code, Some(6), "{class}: {}", out.stderr);
        assert!(
            out.stdout.contains("receipt: unreadable") && out.stdout.contains(says),
            "{class}: {}",
            out.stdout
        );
        assert!(
            !out.stdout.contains("receipt: absent"),
            "{class}: {}",
            out.stdout
        );
        assert!(
            out.stdout.contains("never delete the receipt"),
            "{class}: {}",
            out.stdout
        );
        let json = cli(&["recover", "--json", "--root", s(&sb.root)]);
        assert_eq!(json.code, Some(6));
        let value: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
        let receipt = &value["recoveryRequired"][0]["receipt"];
        assert_eq!(receipt["state"], "unreadable", "{class}: {value}");
        assert!(
            receipt["error"].as_str().unwrap().contains(says),
            "{class}: {value}"
        );
        assert_eq!(value["failClosed"], true);
        assert_eq!(
            snapshot(sb.dir.path()),
            before,
            "{class}: recover is read-only"
        );
    }
}

#[test]
fn recover_archive_creates_nothing_and_refusals_are_usage_errors() {
    let sb = sandbox();
    let missing = sb.dir.path().join("mistyped");
    let before = snapshot(sb.dir.path());
    let out = cli(&[
        "recover",
        "--root",
        s(&missing),
        "--archive",
        "offer-000001",
    ]);
    assert_eq!(out.code, Some(3), "{}", out.stderr);
    assert!(out.stderr.contains("no state root"), "{}", out.stderr);
    assert_eq!(snapshot(sb.dir.path()), before, "no state root was created");

    // A settled record cannot be archived (retention removes it): a usage error, nothing moved.
    let sb = state_root();
    {
        let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
        let chain = to_completed(1, 500);
        journal.publish_record(&chain[0]).unwrap();
        for pair in chain.windows(2) {
            journal
                .replace_record(&pair[0].offer.offer_id, &pair[1], pair[0].revision)
                .unwrap();
        }
        assert_eq!(
            journal
                .read_record(&testkit::offer_id(1))
                .unwrap()
                .unwrap()
                .state,
            State::CompletionAcknowledged
        );
    }
    wait_lock_free(&sb.root);
    let before = snapshot(sb.dir.path());
    for (offer, says) in [
        ("offer-000001", "can be archived"),
        ("offer-000009", "no such record"),
    ] {
        let out = cli(&["recover", "--root", s(&sb.root), "--archive", offer]);
        assert_eq!(out.code, Some(2), "{offer}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{offer}: {}", out.stderr);
    }
    let out = cli(&["recover", "--root", s(&sb.root), "--archive", "../x"]);
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert_eq!(snapshot(sb.dir.path()), before, "refusals change nothing");
}

#[test]
fn a_failing_stdout_is_exit_1_with_a_message_never_a_panic() {
    let sb = recovery_root();
    let root = s(&sb.root);
    let full = || Stdio::from(fs::File::create("/dev/full").unwrap());
    let closed = || {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        Stdio::from(writer)
    };
    let commands: Vec<Vec<&str>> = vec![
        vec!["--help"],
        vec!["--version"],
        vec!["inbox", "--help"],
        vec!["inbox", "list", "--root", root],
        vec!["inbox", "list", "--json", "--root", root],
        vec!["inbox", "show", "--root", root, "offer-000001"],
        vec!["recover", "--root", root],
        vec!["recover", "--json", "--root", root],
        vec!["init", "--root", root],
    ];
    for args in &commands {
        for (how, stdout) in [("/dev/full", full()), ("a closed pipe", closed())] {
            let out = cli_to(args, stdout);
            assert_eq!(out.code, Some(1), "{args:?} > {how}: {}", out.stderr);
            assert!(
                out.stderr.contains("could not be written to stdout"),
                "{args:?} > {how}: {}",
                out.stderr
            );
        }
    }
    // What was done is said: the drain request stands.
    let out = cli_to(&["drain", "--root", root], full());
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("the drain was requested, but"),
        "{}",
        out.stderr
    );
    assert!(sb.root.join("drain").is_file());
    // The controls: the same commands with a working stdout.
    assert_eq!(cli(&["--help"]).code, Some(0));
    assert_eq!(cli(&["inbox", "list", "--root", root]).code, Some(0));
    assert_eq!(cli(&["recover", "--root", root]).code, Some(6));
    // A usage error from the parser is 2.
    assert_eq!(cli(&["inbox", "list", "--no-such-flag"]).code, Some(2));
}

#[test]
fn inbox_list_columns_line_up_whatever_the_id_lengths() {
    let sb = state_root();
    {
        let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
        journal.publish_record(&accepted(1)).unwrap();
        let mut long = accepted(2);
        long.offer.offer_id =
            ql_worker_core::ids::OfferId::new(format!("offer-{}", "x".repeat(60))).unwrap();
        journal.publish_record(&long).unwrap();
        let chain = to_recovery(3);
        journal.publish_record(&chain[0]).unwrap();
        journal
            .replace_record(&chain[1].offer.offer_id, &chain[1], chain[0].revision)
            .unwrap();
    }
    let out = cli(&["inbox", "list", "--root", s(&sb.root)]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", out.stdout);
    // Every column starts at the same character in every line.
    let starts = |line: &str, word: &str| line.find(word).unwrap();
    let header = lines[0];
    for column in ["STATE", "RUN", "ATTEMPT"] {
        let at = starts(header, column);
        for line in &lines[1..] {
            let before = &line[..at];
            assert!(
                before.ends_with("  ") && !line[at..].starts_with(' '),
                "{column} does not line up:\n{}",
                out.stdout
            );
        }
    }
    assert!(lines.iter().all(|l| !l.ends_with(' ')), "{}", out.stdout);
}
