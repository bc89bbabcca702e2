//! Release binary size: `cargo build --release -p ql-worker` with default features (the `demo`
//! command and its embedded loopback control plane) and with `--no-default-features` (what a
//! minimal host installs), both built by this run into the workspace's own target directory;
//! the stripped sizes too (the release profile keeps line tables for backtraces).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::table::Table;

const BUILD_TIMEOUT: Duration = Duration::from_secs(40 * 60);

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB ({bytes} B)", bytes as f64 / 1024.0 / 1024.0)
}

/// Variables `cargo bench` sets for this process (package metadata, manifest paths). Build
/// scripts watch some of them (`ring` reruns on `CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, …), so a
/// nested build that inherits them would rebuild the dependencies, and the next `cargo bench`
/// would rebuild them back. Cargo's own configuration variables are kept.
fn injected_by_cargo(name: &str) -> bool {
    const KEPT: [&str; 9] = [
        "CARGO_HOME",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_",
        "CARGO_PROFILE_",
        "CARGO_NET_",
        "CARGO_HTTP_",
        "CARGO_REGISTRIES_",
        "CARGO_TERM_",
        "CARGO_INCREMENTAL",
    ];
    name == "CARGO"
        || name == "OUT_DIR"
        || (name.starts_with("CARGO_") && !KEPT.iter().any(|k| name.starts_with(k)))
}

/// `cargo build --release --locked -p ql-worker --bin ql-worker <extra>`, bounded.
fn build(extra: &[&str]) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("no workspace")?;
    let mut command = Command::new(cargo);
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(injected_by_cargo) {
            command.env_remove(name);
        }
    }
    let mut child = command
        .args([
            "build",
            "--release",
            "--locked",
            "--quiet",
            "-p",
            "ql-worker",
        ])
        .args(["--bin", "ql-worker"])
        .args(extra)
        .current_dir(workspace)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cargo: {e}"))?;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return if status.success() {
                Ok(())
            } else {
                Err(format!("cargo build {extra:?} failed: {status}"))
            };
        }
        if start.elapsed() > BUILD_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "cargo build {extra:?} took longer than {BUILD_TIMEOUT:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Builds, copies the result aside, returns (bytes, stripped bytes).
fn measured(extra: &[&str], binary: &Path, keep: &Path) -> Result<(u64, Option<u64>), String> {
    build(extra)?;
    std::fs::copy(binary, keep).map_err(|e| format!("{}: {e}", binary.display()))?;
    let bytes = std::fs::metadata(keep).map_err(|e| e.to_string())?.len();
    let stripped = keep.with_extension("stripped");
    let stripped = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(keep)
        .status()
        .ok()
        .filter(std::process::ExitStatus::success)
        .and_then(|_| std::fs::metadata(&stripped).ok())
        .map(|m| m.len());
    Ok((bytes, stripped))
}

pub(crate) fn measure(table: &mut Table, scratch: &Path) {
    let binary: PathBuf = PathBuf::from(env!("CARGO_BIN_EXE_ql-worker"));
    let minimal = measured(
        &["--no-default-features"],
        &binary,
        &scratch.join("ql-worker-minimal"),
    );
    // Last, so the workspace's target/release/ql-worker is the default build again.
    let full = measured(&[], &binary, &scratch.join("ql-worker-default"));
    match (full, minimal) {
        (Ok((full, full_stripped)), Ok((minimal, minimal_stripped))) => {
            let stripped = |s: Option<u64>| s.map_or_else(|| String::from("n/a"), mib);
            table.push(
                "release binary, default features (`demo` included)",
                mib(full),
                format!("{} (--no-default-features)", mib(minimal)),
                Some(full as f64 / minimal as f64),
                format!(
                    "the demo's embedded control plane (rcgen, the loopback server); stripped: {}",
                    stripped(full_stripped)
                ),
            );
            table.push(
                "release binary, --no-default-features (minimal hosts)",
                mib(minimal),
                format!("{} (the same, stripped)", stripped(minimal_stripped)),
                minimal_stripped.map(|s| minimal as f64 / s as f64),
                "the release profile keeps line tables (debug = \"line-tables-only\") for backtraces",
            );
        }
        (full, minimal) => {
            let why = [full.err(), minimal.err()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join("; ");
            table.skipped("release binary size", &why);
        }
    }
}
