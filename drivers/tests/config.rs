//! The configuration file: the commented example parses; every rule names the file and field;
//! profile defaults; environment overrides; secret-file checks with real modes and owners.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use ql_worker::config::{Config, Environment, Profile, check_secret_file};

#[derive(Default)]
struct Env(BTreeMap<&'static str, &'static str>);

impl Environment for Env {
    fn var(&self, name: &str) -> Option<String> {
        self.0.get(name).map(|v| (*v).to_string())
    }
}

const MINIMAL: &str = r#"
profile = "node"
worker_id = "node-7"
root = "/var/lib/ql-worker"
[control_plane]
origin = "https://cp.example:8443"
trust_anchors = ["/etc/ql/ca.pem"]
client_certificate = "/etc/ql/client.pem"
client_key = "/etc/ql/client.key"
credential_file = "/etc/ql/credential"
"#;

fn parse(text: &str) -> Result<Config, String> {
    Config::parse(Path::new("/etc/ql/worker.toml"), text, &Env::default())
        .map_err(|e| e.to_string())
}

#[test]
fn the_commented_example_config_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ql-worker.example.toml");
    let config = Config::load(&path, &Env::default()).unwrap();
    assert_eq!(config.profile, Profile::Edge);
    assert_eq!(config.limits.cadence_ms, 2_000);
    assert_eq!(config.limits.max_concurrent_runs, 2);
    assert_eq!(config.limits.spool.maximum_attempt_bytes, 4 << 20);
}

#[test]
fn node_profile_defaults_follow_the_reference() {
    let config = parse(MINIMAL).unwrap();
    assert_eq!(config.limits.cadence_ms, 500);
    assert_eq!(config.limits.startup_page.get(), 16);
    assert_eq!(config.limits.supervision_page.get(), 32);
    assert_eq!(config.limits.inbox_capacity.get(), 256);
    assert_eq!(config.limits.drain_budget_ms, 300_000);
    assert_eq!(config.limits.spool.maximum_attempt_bytes, 64 << 20);
    assert_eq!(config.limits.spool.minimum_free_bytes, 256 << 20);
    assert_eq!(config.control_plane.timeout_ms, 15_000);
}

#[test]
fn errors_name_the_file_the_field_and_the_rule() {
    let bad = MINIMAL.replace(
        "[control_plane]",
        "[limits]\ncadence_ms = 50\n[control_plane]",
    );
    let e = parse(&bad).unwrap_err();
    assert!(
        e.contains("/etc/ql/worker.toml")
            && e.contains("limits.cadence_ms")
            && e.contains("100..=60000"),
        "{e}"
    );
    let e = parse(&MINIMAL.replace("node-7", "-bad")).unwrap_err();
    assert!(e.contains("worker_id"), "{e}");
    let e = parse(&MINIMAL.replace("/var/lib/ql-worker", "relative/root")).unwrap_err();
    assert!(e.contains("root") && e.contains("absolute"), "{e}");
    let e = parse(&format!("{MINIMAL}\nsurprise = 1\n")).unwrap_err();
    assert!(e.contains("surprise"), "{e}");
    let e = parse(&MINIMAL.replace(
        "[control_plane]",
        "[limits]\nlog_quota_bytes = 134217728\n[control_plane]",
    ))
    .unwrap_err();
    assert!(e.contains("limits.log_quota_bytes"), "{e}");
    let e = parse(&MINIMAL.replace(
        r#"trust_anchors = ["/etc/ql/ca.pem"]"#,
        "trust_anchors = []",
    ))
    .unwrap_err();
    assert!(e.contains("trust_anchors") && e.contains("1 to 8"), "{e}");
}

/// Retention frees a place only while the inbox holds more records than the high-water mark: a
/// mark at or above the capacity would leave a full inbox of settled records full (no work for
/// up to `max_settled_age_ms`), so it is refused, naming both fields.
#[test]
fn a_high_water_mark_that_could_never_free_a_place_is_refused() {
    let with = |limits: &str, retention: &str| {
        MINIMAL.replace(
            "[control_plane]",
            &format!("[limits]\n{limits}\n[retention]\n{retention}\n[control_plane]"),
        )
    };
    let e = parse(&with("inbox_capacity = 4", "high_water_records = 4")).unwrap_err();
    assert!(
        e.contains("/etc/ql/worker.toml")
            && e.contains("retention.high_water_records")
            && e.contains("below limits.inbox_capacity (4)")
            && e.contains("found 4"),
        "{e}"
    );
    assert!(parse(&with("inbox_capacity = 4", "high_water_records = 9")).is_err());
    let config = parse(&with("inbox_capacity = 4", "high_water_records = 3")).unwrap();
    assert_eq!(config.retention.high_water_records, 3);
    let config = parse(&with("inbox_capacity = 1", "")).unwrap();
    assert_eq!(config.retention.high_water_records, 0, "the default: half");
}

#[test]
fn environment_overrides_the_paths() {
    let env = Env(BTreeMap::from([
        ("QL_WORKER_ROOT", "/srv/ql"),
        (
            "QL_WORKER_CREDENTIAL_FILE",
            "/run/credentials/ql/credential",
        ),
    ]));
    let config = Config::parse(Path::new("w.toml"), MINIMAL, &env).unwrap();
    assert_eq!(config.root, Path::new("/srv/ql"));
    assert_eq!(
        config.control_plane.credential_file,
        Path::new("/run/credentials/ql/credential")
    );
}

#[test]
fn secret_files_must_be_private_regular_files_owned_by_us() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("credential");
    std::fs::write(&file, "ql3w_x").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(check_secret_file(&file, "credential file"), Ok(()));
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let e = check_secret_file(&file, "credential file").unwrap_err();
    assert!(e.contains("mode 0600") && e.contains("0640"), "{e}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&file, Some(65534), None).unwrap();
    let e = check_secret_file(&file, "credential file").unwrap_err();
    assert!(e.contains("owned by uid"), "{e}");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    let e = check_secret_file(&link, "credential file").unwrap_err();
    assert!(e.contains("regular file"), "{e}");
}

#[test]
fn the_commented_example_shows_run_as_the_run_limits_and_cgroups() {
    use ql_worker::containment::RlimitKind;
    use ql_worker::containment::settings::{Principal, RunUser};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/ql-worker.example.toml");
    let config = Config::load(&path, &Env::default()).unwrap();
    let c = &config.containment;
    let run_as = c.run_as.as_ref().expect("[run_as]");
    assert_eq!(run_as.user, RunUser::User(Principal::Name("ql-run".into())));
    assert_eq!(run_as.runs_dir, Path::new("/var/lib/ql-worker-runs"));
    for limit in [
        (RlimitKind::Core, 0),
        (RlimitKind::Nofile, 1024),
        (RlimitKind::Nproc, 256),
        (RlimitKind::AddressSpace, 2 << 30),
    ] {
        assert!(c.rlimits.contains(&limit), "{limit:?} in {:?}", c.rlimits);
    }
    assert_eq!(c.cgroup.memory_max, Some(512 << 20));
    assert_eq!(c.cgroup.pids_max, Some(256));
    assert!(c.no_new_privileges && c.policy.shell && !c.mask_secrets);
}

#[test]
fn capabilities_metrics_and_certificate_settings_are_validated_naming_the_field() {
    let with = |extra: &str| parse(&format!("{MINIMAL}{extra}"));
    let good = with(
        "give_up_after_ms = 60000\ncertificate_warning_days = 30\n[capabilities]\n\
         operating_system = \"linux\"\nlabels = { zone = \"eu-1\" }\n\
         runtimes = [{ name = \"python\", version = \"3.11.2\" }]\nfeatures = [\"docker\"]\n\
         cpu_cores = 4\nmemory_bytes = 8589934592\n",
    )
    .unwrap();
    assert_eq!(good.control_plane.give_up_after_ms, 60_000);
    assert_eq!(good.control_plane.certificate_warning_ms, 30 * 86_400_000);
    let json = good.capabilities.canonical_json().unwrap();
    assert!(
        json.contains("\"zone\":\"eu-1\"") && json.contains("\"python\""),
        "{json}"
    );
    for (extra, field) in [
        (
            "[capabilities]\nlabels = { \"\" = \"x\" }\n",
            "capabilities.labels",
        ),
        (
            "[capabilities]\nruntimes = [{ name = \"\", version = \"1\" }]\n",
            "capabilities.runtimes",
        ),
        ("[capabilities]\nsurprise = 1\n", "surprise"),
        (
            "[metrics]\ntextfile = \"/tmp/ql-worker.txt\"\n",
            "metrics.textfile",
        ),
        ("[metrics]\nlisten = \"0.0.0.0:9464\"\n", "metrics.listen"),
        ("[metrics]\ninterval_ms = 10\n", "metrics.interval_ms"),
        ("give_up_after_ms = 10\n", "control_plane.give_up_after_ms"),
        (
            "certificate_warning_days = 400\n",
            "control_plane.certificate_warning_days",
        ),
    ] {
        let e = with(extra).unwrap_err();
        assert!(
            e.contains("/etc/ql/worker.toml") && e.contains(field),
            "{extra}: {e}"
        );
    }
}
