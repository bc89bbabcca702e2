//! `ql-worker run` refuses a bad configuration before it creates or writes anything, and says
//! why (issue 19, items 3, 4 and 8), with the real binary.
//!
//! Every class of bad input (origin, credential, client key and certificate, trust anchors, the
//! configuration file itself, environment overrides) is tried against a state root that does
//! not exist yet and against an initialised one; the whole directory tree (paths, types, modes,
//! owners, inodes, content hashes) must be the same before and after, and the message must name
//! the file, the field or environment variable, and the rule, without a debug dump or a secret.

mod e2e_common;
mod storage_support;

use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use e2e_common::{KillOnDrop, PRODUCTION_BINARY, World, init_root, sigterm, wait_exit};
use storage_support::snapshot;

fn write_file(path: &Path, bytes: &[u8], mode: u32) {
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .unwrap();
    file.write_all(bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Runs `ql-worker run --config <config>` with `env`, which must exit on its own.
fn run(config: &Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    command(&["run", "--config"], config, env)
}

/// `ql-worker <args> <last>`, which must exit on its own within 20 s (a `run` that starts by
/// mistake is killed and fails the test instead of hanging it).
fn bounded(args: &[&str], last: &Path) -> (Option<i32>, String) {
    command(args, last, &[])
}

fn command(args: &[&str], last: &Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let mut command = Command::new(PRODUCTION_BINARY);
    command
        .args(args)
        .arg(last)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command.spawn().unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(20));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

/// A message must read as prose: no Rust debug dump of a library error.
fn assert_no_debug(message: &str) {
    for dump in [
        "Other(",
        "OtherError",
        "Kind(",
        "Os {",
        "{ code",
        "Error {",
        "\\\"",
    ] {
        assert!(
            !message.contains(dump),
            "debug formatting ({dump}) in: {message}"
        );
    }
}

/// Edits the configuration text and may create files in the world's directory.
type Edit = Box<dyn Fn(&World, &str) -> String>;

/// One class of bad input: how to make it, and what the message must say.
struct Case {
    name: &'static str,
    edit: Edit,
    env: Vec<(&'static str, String)>,
    /// Every one of these is in the message.
    says: Vec<String>,
}

fn settings(world: &World) -> &ql_worker_tests::control_plane::WorkerSettings {
    world.cp.worker_settings()
}

fn path_text(path: &Path) -> String {
    path.display().to_string()
}

/// `text` with the line starting `key =` replaced by `key = value`.
fn set(text: &str, key: &str, value: &str) -> String {
    let mut found = false;
    let out: Vec<String> = text
        .lines()
        .map(|l| {
            if l.starts_with(&format!("{key} =")) {
                found = true;
                format!("{key} = {value}")
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(found, "no {key} in {text}");
    out.join("\n") + "\n"
}

/// A copy of `from` in the world's directory, with `mode`, optionally chowned.
fn copy_in(world: &World, from: &Path, name: &str, mode: u32, uid: Option<u32>) -> PathBuf {
    let to = world.dir.path().join(name);
    write_file(&to, &std::fs::read(from).unwrap(), mode);
    if let Some(uid) = uid {
        std::os::unix::fs::chown(&to, Some(uid), None).unwrap();
    }
    to
}

/// A DER TLV: (tag, header length, total length).
fn tlv(der: &[u8]) -> (u8, usize, usize) {
    let tag = der[0];
    let first = der[1];
    if first < 0x80 {
        (tag, 2, 2 + usize::from(first))
    } else {
        let n = usize::from(first & 0x7f);
        let len = der[2..2 + n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (tag, 2 + n, 2 + n + len)
    }
}

fn der_len(len: usize) -> Vec<u8> {
    if len < 0x80 {
        return vec![u8::try_from(len).unwrap()];
    }
    let bytes: Vec<u8> = len
        .to_be_bytes()
        .into_iter()
        .skip_while(|b| *b == 0)
        .collect();
    let mut out = vec![0x80 | u8::try_from(bytes.len()).unwrap()];
    out.extend(bytes);
    out
}

/// The certificate of `pem` re-encoded as X.509 v1: the `[0] version` field removed from the
/// TBSCertificate (the signature no longer matches, which a parser refusing v1 never reaches).
fn as_x509_v1(pem: &str) -> String {
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let (_, outer_header, outer_total) = tlv(&der);
    let body = &der[outer_header..outer_total];
    let (_, tbs_header, tbs_total) = tlv(body);
    let tbs = &body[tbs_header..tbs_total];
    let (version_tag, _, version_total) = tlv(tbs);
    assert_eq!(
        version_tag, 0xa0,
        "a v3 certificate starts with [0] version"
    );
    let tbs_v1 = &tbs[version_total..];
    let mut new_tbs = vec![0x30];
    new_tbs.extend(der_len(tbs_v1.len()));
    new_tbs.extend(tbs_v1);
    let mut new_body = new_tbs;
    new_body.extend(&body[tbs_total..]);
    let mut new_der = vec![0x30];
    new_der.extend(der_len(new_body.len()));
    new_der.extend(new_body);
    let b64 = base64::engine::general_purpose::STANDARD.encode(new_der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).unwrap());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

fn cases(world: &World, config: &Path) -> Vec<Case> {
    let s = settings(world);
    let config = path_text(config);
    let credential = std::fs::read_to_string(&s.credential_file).unwrap();
    let mut cases = vec![
        Case {
            name: "plain-http origin",
            edit: Box::new(|w, t| {
                set(
                    t,
                    "origin",
                    &format!("\"{}\"", w.cp.origin().replace("https", "http")),
                )
            }),
            env: vec![],
            says: vec![
                config.clone(),
                "control_plane.origin".into(),
                "https".into(),
            ],
        },
        Case {
            name: "origin with userinfo",
            edit: Box::new(|w, t| {
                let origin = w.cp.origin().replace("https://", "https://user:hunter2@");
                set(t, "origin", &format!("\"{origin}\""))
            }),
            env: vec![],
            says: vec!["control_plane.origin".into(), "userinfo".into()],
        },
        Case {
            name: "missing credential file",
            edit: Box::new(|w, t| {
                let missing = w.dir.path().join("no-such-credential");
                set(t, "credential_file", &format!("\"{}\"", missing.display()))
            }),
            env: vec![],
            says: vec![
                "control_plane.credential_file".into(),
                "no-such-credential".into(),
                "cannot be read".into(),
            ],
        },
    ];
    let two_lines = format!("{credential}\n{credential}\n");
    cases.push(Case {
        name: "two-line credential",
        edit: Box::new(move |w, t| {
            let path = w.dir.path().join("credential-2");
            write_file(&path, two_lines.as_bytes(), 0o600);
            set(t, "credential_file", &format!("\"{}\"", path.display()))
        }),
        env: vec![],
        says: vec!["control_plane.credential_file".into(), "2 lines".into()],
    });
    let credential_source = s.credential_file.clone();
    cases.push(Case {
        name: "credential readable by group",
        edit: Box::new(move |w, t| {
            let path = copy_in(w, &credential_source, "credential-640", 0o640, None);
            set(t, "credential_file", &format!("\"{}\"", path.display()))
        }),
        env: vec![],
        says: vec![
            "control_plane.credential_file".into(),
            "0640".into(),
            "0600".into(),
        ],
    });
    let key = s.client_key.clone();
    cases.push(Case {
        name: "client key readable by others",
        edit: Box::new(move |w, t| {
            let path = copy_in(w, &key, "client-644.key", 0o644, None);
            set(t, "client_key", &format!("\"{}\"", path.display()))
        }),
        env: vec![],
        says: vec!["control_plane.client_key".into(), "0644".into()],
    });
    let cert = s.client_cert.clone();
    cases.push(Case {
        name: "a certificate given as the client key",
        edit: Box::new(move |w, t| {
            let path = copy_in(w, &cert, "cert-as-key.pem", 0o600, None);
            set(t, "client_key", &format!("\"{}\"", path.display()))
        }),
        env: vec![],
        says: vec![
            "control_plane.client_key".into(),
            "CERTIFICATE section".into(),
            "private key".into(),
        ],
    });
    let key = s.client_key.clone();
    cases.push(Case {
        name: "a private key given as the client certificate",
        edit: Box::new(move |w, t| {
            let path = copy_in(w, &key, "key-as-cert.pem", 0o600, None);
            set(t, "client_certificate", &format!("\"{}\"", path.display()))
        }),
        env: vec![],
        says: vec![
            "control_plane.client_certificate".into(),
            "PRIVATE KEY".into(),
            "only CERTIFICATE sections".into(),
        ],
    });
    let key = s.client_key.clone();
    cases.push(Case {
        name: "a private key given as a trust anchor",
        edit: Box::new(move |w, t| {
            let path = copy_in(w, &key, "key-as-ca.pem", 0o600, None);
            set(t, "trust_anchors", &format!("[\"{}\"]", path.display()))
        }),
        env: vec![],
        says: vec![
            "control_plane.trust_anchors[0]".into(),
            "PRIVATE KEY".into(),
            "only CERTIFICATE sections".into(),
        ],
    });
    let ca = s.ca_cert.clone();
    cases.push(Case {
        name: "trust anchor writable by everyone",
        edit: Box::new(move |w, t| {
            let path = copy_in(w, &ca, "ca-666.pem", 0o666, None);
            set(t, "trust_anchors", &format!("[\"{}\"]", path.display()))
        }),
        env: vec![],
        says: vec![
            "control_plane.trust_anchors[0]".into(),
            "ca-666.pem".into(),
            "writable by group or other".into(),
            "0666".into(),
        ],
    });
    let ca = s.ca_cert.clone();
    cases.push(Case {
        name: "trust anchor owned by another user",
        edit: Box::new(move |w, t| {
            let path = copy_in(w, &ca, "ca-nobody.pem", 0o644, Some(65534));
            set(t, "trust_anchors", &format!("[\"{}\"]", path.display()))
        }),
        env: vec![],
        says: vec![
            "control_plane.trust_anchors[0]".into(),
            "owned by uid 65534".into(),
            "or root".into(),
        ],
    });
    let ca = s.ca_cert.clone();
    cases.push(Case {
        name: "trust anchor that is a symlink (to a root-owned CA file)",
        edit: Box::new(move |w, t| {
            let link = w.dir.path().join("ca-link.pem");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&ca, &link).unwrap();
            let second = copy_in(w, &ca, "ca-second.pem", 0o644, None);
            set(
                t,
                "trust_anchors",
                &format!("[\"{}\", \"{}\"]", second.display(), link.display()),
            )
        }),
        env: vec![],
        says: vec![
            "control_plane.trust_anchors[1]".into(),
            "ca-link.pem".into(),
            "symbolic link".into(),
        ],
    });
    let other_key = world.cp.pki().other_client.key.clone();
    cases.push(Case {
        name: "a client key of another certificate",
        edit: Box::new(move |w, t| {
            let path = copy_in(w, &other_key, "other.key", 0o600, None);
            set(t, "client_key", &format!("\"{}\"", path.display()))
        }),
        env: vec![],
        says: vec![
            "control_plane.client_certificate".into(),
            "does not belong to the client certificate".into(),
        ],
    });
    let v1 = as_x509_v1(&std::fs::read_to_string(&s.client_cert).unwrap());
    cases.push(Case {
        name: "an X.509 v1 client certificate",
        edit: Box::new(move |w, t| {
            let path = w.dir.path().join("client-v1.pem");
            write_file(&path, v1.as_bytes(), 0o644);
            set(t, "client_certificate", &format!("\"{}\"", path.display()))
        }),
        env: vec![],
        says: vec![
            "control_plane.client_certificate".into(),
            "X.509 v1".into(),
            "v3".into(),
        ],
    });
    cases.push(Case {
        name: "a relative client key from the environment",
        edit: Box::new(|_, t| t.to_string()),
        env: vec![("QL_WORKER_CLIENT_KEY", String::from("keys/client.key"))],
        says: vec![
            "QL_WORKER_CLIENT_KEY (environment, overrides control_plane.client_key of".into(),
            config.clone(),
            "absolute".into(),
        ],
    });
    cases.push(Case {
        name: "a missing credential file from the environment",
        edit: Box::new(|_, t| t.to_string()),
        env: vec![(
            "QL_WORKER_CREDENTIAL_FILE",
            String::from("/nonexistent/credential"),
        )],
        says: vec![
            "QL_WORKER_CREDENTIAL_FILE (/nonexistent/credential; environment, overrides \
             control_plane.credential_file of"
                .into(),
            "cannot be read".into(),
        ],
    });
    cases.push(Case {
        name: "an empty root from the environment",
        edit: Box::new(|_, t| t.to_string()),
        env: vec![("QL_WORKER_ROOT", String::new())],
        says: vec![
            "QL_WORKER_ROOT (environment, overrides root of".into(),
            "empty".into(),
        ],
    });
    cases.push(Case {
        name: "a dotted root",
        edit: Box::new(|w, t| {
            let root = format!("{}/../state", w.dir.path().join("x").display());
            set(t, "root", &format!("\"{root}\""))
        }),
        env: vec![],
        says: vec![config.clone(), "root".into(), "'..'".into()],
    });
    cases.push(Case {
        name: "a bad log_reserve_bytes",
        edit: Box::new(|_, t| set(t, "log_reserve_bytes", "9999999999999999")),
        env: vec![],
        says: vec![
            "limits.log_reserve_bytes".into(),
            "must be within 0..=".into(),
        ],
    });
    cases.push(Case {
        name: "a worker_id typo",
        edit: Box::new(|_, t| set(t, "worker_id", "\"wrker 1\"")),
        env: vec![],
        says: vec![
            "worker_id".into(),
            "A-Z a-z 0-9".into(),
            "character 6".into(),
        ],
    });
    cases
}

#[test]
fn every_configuration_check_runs_before_anything_is_created_or_written() {
    let world = World::new();
    let good = std::fs::read_to_string(&world.config_path).unwrap();
    let bad_config = world.dir.path().join("bad.toml");
    for initialised in [false, true] {
        if initialised {
            init_root(world.root());
        }
        for case in cases(&world, &bad_config) {
            let text = (case.edit)(&world, &good);
            write_file(&bad_config, text.as_bytes(), 0o600);
            let env: Vec<(&str, &str)> = case.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let before = snapshot(world.dir.path());
            let (code, stderr) = run(&bad_config, &env);
            let what = format!("{} (root initialised: {initialised})", case.name);
            assert_eq!(code, Some(2), "{what}: {stderr}");
            assert_eq!(
                snapshot(world.dir.path()),
                before,
                "{what}: a refused start changed the tree: {stderr}"
            );
            assert_eq!(world.root().exists(), initialised, "{what}");
            assert!(
                !world.root().join("session").exists(),
                "{what}: no session file"
            );
            for needle in &case.says {
                assert!(
                    stderr.contains(needle.as_str()),
                    "{what}: no {needle:?} in {stderr}"
                );
            }
            assert_no_debug(&stderr);
            assert!(!stderr.contains("hunter2"), "{what}: {stderr}");
        }
    }
}

/// The reported case: a `worker_id` typo together with a bad origin used to bind the session
/// file to the typo before the origin was checked; once the configuration was fixed, `run`
/// failed with `session: belongs to worker wrker-1` for ever.
#[test]
fn a_typo_with_a_bad_origin_leaves_no_session_behind_and_the_fixed_config_starts() {
    let world = World::new();
    let good = std::fs::read_to_string(&world.config_path).unwrap();
    let worker_id = settings(&world).worker_id.to_string();
    let typo = good
        .replace(&format!("\"{worker_id}\""), "\"wrker-1\"")
        .replace("https://", "http://");
    let bad = world.dir.path().join("typo.toml");
    write_file(&bad, typo.as_bytes(), 0o600);
    let (code, stderr) = run(&bad, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("control_plane.origin"), "{stderr}");
    assert!(!world.root().exists(), "nothing created: {stderr}");

    let mut worker = KillOnDrop(world.spawn_worker(&[]));
    world.wait_for("the Session registered", Duration::from_secs(30), |w| {
        w.cp.session(w.cp.worker_id()).is_some()
    });
    sigterm(&worker);
    assert_eq!(
        wait_exit(&mut worker, Duration::from_secs(30)).code(),
        Some(0)
    );
}

#[test]
fn the_configuration_file_itself_must_be_a_private_enough_regular_file() {
    let world = World::new();
    let good = std::fs::read_to_string(&world.config_path).unwrap();
    let target = world.dir.path().join("real.toml");
    write_file(&target, good.as_bytes(), 0o600);
    let link = world.dir.path().join("link.toml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let writable = world.dir.path().join("writable.toml");
    write_file(&writable, good.as_bytes(), 0o666);
    let group = world.dir.path().join("group.toml");
    write_file(&group, good.as_bytes(), 0o620);
    let foreign = world.dir.path().join("foreign.toml");
    write_file(&foreign, good.as_bytes(), 0o644);
    std::os::unix::fs::chown(&foreign, Some(65534), None).unwrap();
    let dir = world.dir.path().join("dir.toml");
    std::fs::create_dir(&dir).unwrap();
    let cases: [(&Path, &str); 5] = [
        (&link, "symbolic link"),
        (&writable, "has 0666"),
        (&group, "has 0620"),
        (&foreign, "owned by uid 65534"),
        (&dir, "must be a regular file"),
    ];
    for (path, rule) in cases {
        let before = snapshot(world.dir.path());
        for args in [
            vec!["run", "--config"],
            vec!["drain", "--config"],
            vec!["inbox", "list", "--config"],
            vec!["recover", "--config"],
        ] {
            let (code, stderr) = bounded(&args, path);
            assert_eq!(code, Some(2), "{args:?} {}: {stderr}", path.display());
            assert!(
                stderr.contains(&path.display().to_string())
                    && stderr.contains("configuration file")
                    && stderr.contains(rule),
                "{args:?}: {stderr}"
            );
        }
        assert_eq!(snapshot(world.dir.path()), before, "{}", path.display());
    }
    // The same content as a regular 0644 file of root's (the Worker's user here) is accepted.
    let ok = world.dir.path().join("ok.toml");
    write_file(&ok, good.as_bytes(), 0o644);
    let out = Command::new(PRODUCTION_BINARY)
        .args(["inbox", "list", "--config"])
        .arg(&ok)
        .output()
        .unwrap();
    // No state root yet: that is the next check, after the configuration was accepted.
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no state root"),
        "{out:?}"
    );
}

#[test]
fn a_credential_pasted_into_the_configuration_is_never_echoed() {
    let world = World::new();
    let good = std::fs::read_to_string(&world.config_path).unwrap();
    let credential = std::fs::read_to_string(&settings(&world).credential_file).unwrap();
    let secret = &credential[credential.len() - 43..];
    let pasted = [
        format!("{good}\n{credential}\n"),
        format!("{good}\ncredential = \"{credential}\"\n"),
        good.replace(
            "timeout_ms = 5000",
            &format!("timeout_ms = \"{credential}\""),
        ),
        format!("{credential} = 1\n{good}"),
        good.replace("worker_id = ", &format!("worker_id = {credential}\n#")),
        good.replace("[limits]", &format!("[limits]\n\"{credential}\" = 5")),
    ];
    let path = world.dir.path().join("pasted.toml");
    for (i, text) in pasted.iter().enumerate() {
        write_file(&path, text.as_bytes(), 0o600);
        for args in [vec!["run", "--config"], vec!["inbox", "list", "--config"]] {
            let (code, stderr) = bounded(&args, &path);
            assert_eq!(code, Some(2), "paste {i}: {stderr}");
            assert!(
                stderr.contains(&path.display().to_string()),
                "paste {i}: {stderr}"
            );
            assert!(
                stderr.contains("line "),
                "paste {i} names the line: {stderr}"
            );
            assert!(
                !stderr.contains(secret) && !stderr.contains("ql3w_"),
                "paste {i}: the credential was echoed: {stderr}"
            );
        }
    }
}

/// A Worker running as another user (`nobody`) accepts a configuration file and a trust anchor
/// owned by root (0644) and its own files, and refuses a trust anchor owned by a third user.
#[test]
fn another_user_may_use_root_owned_configuration_and_trust_anchors() {
    if rustix::process::geteuid().as_raw() != 0 {
        println!("skipped: needs root to run the Worker as another user (CI runs as root)");
        return;
    }
    const NOBODY: u32 = 65534;
    let probe = Command::new(PRODUCTION_BINARY)
        .arg("--version")
        .uid(NOBODY)
        .gid(NOBODY)
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        println!(
            "skipped: uid {NOBODY} cannot execute {PRODUCTION_BINARY} here ({probe:?}); the \
             checkout must be readable by other users for this test"
        );
        return;
    }
    let world = World::new();
    let s = settings(&world);
    let dir = world.dir.path();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let own = |from: &Path, name: &str, mode: u32| copy_in(&world, from, name, mode, Some(NOBODY));
    let ca = copy_in(&world, &s.ca_cert, "root-ca.pem", 0o644, None);
    let cert = own(&s.client_cert, "nobody-client.pem", 0o644);
    let key = own(&s.client_key, "nobody-client.key", 0o600);
    let credential = own(&s.credential_file, "nobody-credential", 0o600);
    let state = dir.join("nobody-state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&state, Some(NOBODY), Some(NOBODY)).unwrap();
    let mut text = std::fs::read_to_string(&world.config_path).unwrap();
    text = set(&text, "root", &format!("\"{}\"", state.display()));
    text = set(&text, "trust_anchors", &format!("[\"{}\"]", ca.display()));
    text = set(
        &text,
        "client_certificate",
        &format!("\"{}\"", cert.display()),
    );
    text = set(&text, "client_key", &format!("\"{}\"", key.display()));
    text = set(
        &text,
        "credential_file",
        &format!("\"{}\"", credential.display()),
    );
    let config = dir.join("root-owned.toml");
    write_file(&config, text.as_bytes(), 0o644);
    let spawn = |config: &Path| {
        Command::new(PRODUCTION_BINARY)
            .args(["run", "--config"])
            .arg(config)
            .uid(NOBODY)
            .gid(NOBODY)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut worker = KillOnDrop(spawn(&config));
    world.wait_for("the Session registered", Duration::from_secs(30), |w| {
        w.cp.session(w.cp.worker_id()).is_some()
    });
    sigterm(&worker);
    assert_eq!(
        wait_exit(&mut worker, Duration::from_secs(30)).code(),
        Some(0),
        "root-owned configuration and trust anchor, the Worker's own key and credential"
    );

    // A trust anchor of a third user is refused, before anything is written.
    let foreign = copy_in(
        &world,
        &s.ca_cert,
        "foreign-ca.pem",
        0o644,
        Some(NOBODY - 1),
    );
    let text = set(
        &text,
        "trust_anchors",
        &format!("[\"{}\"]", foreign.display()),
    );
    let config = dir.join("foreign-ca.toml");
    write_file(&config, text.as_bytes(), 0o644);
    let before = snapshot(dir);
    let mut child = spawn(&config);
    let status = wait_exit(&mut child, Duration::from_secs(20));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("foreign-ca.pem")
            && stderr.contains(&format!(
                "owned by uid {NOBODY} (the Worker's user) or root"
            ))
            && stderr.contains(&format!("is owned by uid {}", NOBODY - 1)),
        "{stderr}"
    );
    assert_eq!(snapshot(dir), before);
}
