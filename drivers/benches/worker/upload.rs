//! 64 MiB log upload: the Worker's own path (`spool::open_reader` → `HttpsClient::post_artifact`,
//! hashing as it streams) from a real spool file to a loopback mTLS server that hashes what it
//! receives. Peak RSS of the uploading process (a fresh child process, method of
//! `tests/benches/upload.rs`) and throughput against `sha256sum` of the same file, timed in the
//! same run.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use ql_worker::https::{HttpsClient, Origin, RequestTimeout, TlsMaterial, TlsMaterialPaths};
use ql_worker::journal::Journal;
use ql_worker::spool::{self, SpoolPolicy};
use ql_worker_core::ids::LogArtifactId;
use ql_worker_core::listing::Capacity;
use ql_worker_tests::https_server::{ArtifactSinkHandler, HttpsServer, ServerOptions, ServerTls};
use ql_worker_tests::pki::TestPki;

use crate::procfs::status_kib;
use crate::table::{Table, median_f64, mib_from_kib};
use crate::world::scratch;

pub(crate) const CHILD_ARG: &str = "__upload-child";
const MIB: u64 = 1024 * 1024;
const SIZE: u64 = 64 * MIB;
const RUNS: usize = 3;
const PATH: &str = "/api/v3/worker-ingress/workers/bench/sessions/s/artifacts";
const AUTH: &str = "Worker ql3w_bench_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
const HEADER: &[u8] = br#"{"schema":"qinglong/remote-worker-artifact-upload@v1"}"#;
const LOG_ID: &str = "wlog-5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

fn policy() -> SpoolPolicy {
    SpoolPolicy::custom(SIZE, 0, MIB).expect("policy")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn self_kib(field: &str) -> u64 {
    status_kib(std::process::id(), field).expect("/proc/self/status")
}

/// Child: one upload. Prints `secs rss_before_kib hwm_after_kib sha256 control_kib hash_secs`.
pub(crate) fn child(args: &[String]) {
    let [origin, pki, root] = args else {
        panic!("usage: {CHILD_ARG} <origin> <pki dir> <state root>");
    };
    let pki = Path::new(pki);
    let root = Path::new(root);
    let log_id = LogArtifactId::new(LOG_ID).expect("log id");
    let material = TlsMaterial::load(&TlsMaterialPaths {
        cert_chain: pki.join("client.pem"),
        private_key: pki.join("client-key.pem"),
        trust_anchors: vec![pki.join("ca.pem")],
    })
    .expect("material");
    let client = HttpsClient::new(
        Origin::parse(origin).expect("origin"),
        material,
        RequestTimeout::from_millis(60_000).expect("timeout"),
    )
    .expect("client");
    // Warm-up: TLS session, buffers, the pooled connection.
    let warm = vec![7_u8; 64 * 1024];
    client
        .post_artifact(PATH, AUTH, HEADER, &mut warm.as_slice(), 64 * 1024, 4096)
        .expect("warm-up upload");

    let rss_before = self_kib("VmRSS:");
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let started = Instant::now();
    let mut reader = spool::open_reader(root, &log_id, policy()).expect("open the log");
    let len = reader.len();
    let (_, report) = client
        .post_artifact(PATH, AUTH, HEADER, &mut reader, len, 4096)
        .expect("upload");
    let secs = started.elapsed().as_secs_f64();
    let hwm_after = self_kib("VmHWM:");
    assert_eq!(report.bytes_sent, SIZE);
    assert_eq!(reader.finish().sha256.to_hex(), report.sha256_hex());

    // Control for the method: touching 8 MiB more must read as ~8 MiB of peak growth.
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let control_before = self_kib("VmRSS:");
    let touched = std::hint::black_box(vec![1_u8; 8 * 1024 * 1024]);
    let control = self_kib("VmHWM:").saturating_sub(control_before);
    drop(touched);

    // The hashing read alone (no network): the same reader, read to the end.
    let started = Instant::now();
    let mut reader = spool::open_reader(root, &log_id, policy()).expect("open the log");
    let mut buf = vec![0_u8; spool::READ_CHUNK_BYTES];
    while reader.read(&mut buf).expect("read") > 0 {}
    let digest = reader.finish();
    let hash_secs = started.elapsed().as_secs_f64();
    assert_eq!(digest.byte_length, SIZE);

    println!(
        "{secs} {rss_before} {hwm_after} {} {control} {hash_secs}",
        report.sha256_hex()
    );
}

/// A 64 MiB log in a real spool: allocated by the spool, written through the capture open.
fn write_log(root: &Path) -> std::path::PathBuf {
    drop(Journal::open(root, Capacity::DEFAULT).expect("state root"));
    let log_id = LogArtifactId::new(LOG_ID).expect("log id");
    spool::allocate(root, &log_id, policy()).expect("allocate");
    let mut capture = spool::open_for_capture(root, &log_id, SIZE).expect("capture");
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut block = vec![0_u8; 64 * 1024];
    for _ in 0..SIZE / block.len() as u64 {
        for b in &mut block {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        capture.file.write_all(&block).expect("write");
    }
    capture.file.sync_all().expect("fsync");
    capture.path
}

struct Sample {
    secs: f64,
    rss_before: u64,
    hwm_after: u64,
    sha256: String,
    control: u64,
    hash_secs: f64,
}

fn run_child(origin: &str, pki: &Path, root: &Path) -> Sample {
    let out = Command::new(std::env::current_exe().expect("bench path"))
        .arg(CHILD_ARG)
        .arg(origin)
        .arg(pki)
        .arg(root)
        .output()
        .expect("spawn the upload child");
    assert!(
        out.status.success(),
        "upload child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).expect("utf-8");
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.len(), 6, "child output: {line}");
    Sample {
        secs: f[0].parse().expect("secs"),
        rss_before: f[1].parse().expect("rss"),
        hwm_after: f[2].parse().expect("hwm"),
        sha256: f[3].to_owned(),
        control: f[4].parse().expect("control"),
        hash_secs: f[5].parse().expect("hash secs"),
    }
}

/// `sha256sum <file>`: wall time, digest and (when `/usr/bin/time` is there) its peak RSS in
/// KiB, or why it could not run.
fn sha256sum(path: &Path) -> Result<(f64, String, Option<u64>), String> {
    let timed = Path::new("/usr/bin/time").exists();
    let mut command = if timed {
        let mut c = Command::new("/usr/bin/time");
        c.args(["-f", "%M", "sha256sum"]);
        c
    } else {
        Command::new("sha256sum")
    };
    let started = Instant::now();
    let out = command
        .arg(path)
        .output()
        .map_err(|e| format!("sha256sum: {e}"))?;
    let secs = started.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(String::from("sha256sum failed"));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let digest = text.split_whitespace().next().unwrap_or("").to_owned();
    let rss = timed
        .then(|| {
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .and_then(|l| l.trim().parse().ok())
        })
        .flatten();
    Ok((secs, digest, rss))
}

/// The fallback baseline when `sha256sum` is missing: `sha2` over plain `std::fs` reads.
fn sha2_plain(path: &Path) -> (f64, String, Option<u64>) {
    use sha2::Digest as _;
    let started = Instant::now();
    let mut file = std::fs::File::open(path).expect("open");
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let digest = hex(hasher.finalize().as_slice());
    (started.elapsed().as_secs_f64(), digest, None)
}

pub(crate) fn measure(table: &mut Table) {
    let dir = scratch("ql-bench-upload-");
    let root = dir.path().join("state");
    let log = write_log(&root);
    let pki_dir = dir.path().join("pki");
    let pki = TestPki::generate(&pki_dir).expect("pki");
    let tls = ServerTls::from_pem_files(&pki.server.cert, &pki.server.key, &[&pki.ca.cert])
        .expect("server tls");
    let server = HttpsServer::start(
        ServerOptions {
            recorded_body_max_bytes: 0,
            ..ServerOptions::default()
        },
        &tls,
        Arc::new(ArtifactSinkHandler),
    )
    .expect("server");
    let origin = server.origin();

    let have_sha256sum = sha256sum(&log).is_ok();
    let mut ours = Vec::new();
    let mut base = Vec::new();
    let mut digests = Vec::new();
    let mut base_rss = Vec::new();
    for round in 0..RUNS {
        // Alternate which side goes first.
        let baseline = || {
            if have_sha256sum {
                sha256sum(&log).expect("sha256sum")
            } else {
                sha2_plain(&log)
            }
        };
        let (sample, (secs, digest, rss)) = if round % 2 == 0 {
            let s = run_child(&origin, &pki_dir, &root);
            (s, baseline())
        } else {
            let b = baseline();
            (run_child(&origin, &pki_dir, &root), b)
        };
        digests.push((sample.sha256.clone(), digest));
        base_rss.extend(rss);
        base.push(secs);
        ours.push(sample);
    }
    assert!(
        digests.iter().all(|(a, b)| a == b),
        "our digest equals the baseline's: {digests:?}"
    );
    let records = server.records();
    assert!(
        records
            .iter()
            .all(|r| r.body_complete && r.response_status == Some(200)),
        "the server received every body whole"
    );
    let mib = (SIZE / MIB) as f64;
    let rate = |secs: &[f64]| mib / median_f64(secs);
    let upload_rate = rate(&ours.iter().map(|s| s.secs).collect::<Vec<_>>());
    let hash_rate = rate(&ours.iter().map(|s| s.hash_secs).collect::<Vec<_>>());
    let base_rate = rate(&base);
    let baseline_name = if have_sha256sum {
        "sha256sum"
    } else {
        "sha2 over std reads (sha256sum not installed)"
    };
    let growth: Vec<u64> = ours
        .iter()
        .map(|s| s.hwm_after.saturating_sub(s.rss_before))
        .collect();
    let before = ours.iter().map(|s| s.rss_before).max().unwrap_or(0);
    let peak = ours.iter().map(|s| s.hwm_after).max().unwrap_or(0);
    let control: Vec<u64> = ours.iter().map(|s| s.control).collect();
    let base_peak = base_rss.iter().max().copied();
    table.push(
        "64 MiB upload: peak RSS of the uploading process",
        mib_from_kib(peak),
        base_peak.map_or_else(
            || String::from("n/a (no /usr/bin/time)"),
            |kib| format!("{} (sha256sum of the file)", mib_from_kib(kib)),
        ),
        base_peak.map(|kib| peak as f64 / kib.max(1) as f64),
        format!(
            "a TLS client against a bare hasher; what matters is the growth during the upload: {growth:?} KiB for a 65536 KiB artifact (RSS before {}; {RUNS} fresh child processes, VmHWM reset with clear_refs after a 64 KiB warm-up; method control: 8 MiB touched reads {control:?} KiB)",
            mib_from_kib(before)
        ),
    );
    table.push(
        "64 MiB upload throughput: spool log → mTLS → server SHA-256",
        format!("{upload_rate:.0} MiB/s"),
        format!("{base_rate:.0} MiB/s ({baseline_name})"),
        Some(upload_rate / base_rate),
        "median of 3; the client hashes while it streams, the server (same 2 cores) decrypts and hashes again; digests equal. sha2 uses the CPU's SHA extensions, Debian's sha256sum does not",
    );
    table.push(
        "64 MiB log read + SHA-256 through `spool::LogReader` (no network)",
        format!("{hash_rate:.0} MiB/s"),
        format!("{base_rate:.0} MiB/s ({baseline_name})"),
        Some(hash_rate / base_rate),
        "the upload's hashing read path alone, 64 KiB reads, page cache warm for both",
    );
}
