//! Artifact upload over loopback mTLS: throughput and client peak-RSS growth for a 4 MiB and
//! a 64 MiB artifact in the same run.
//!
//! Run: `cargo bench -p ql-worker-tests --bench upload`
//!
//! Method:
//! - The parent process generates a PKI and runs the reference server with
//!   `ArtifactSinkHandler` (it parses the frame and streams the content into a SHA-256,
//!   storing nothing).
//! - Each upload runs in a fresh child process (this binary re-executed), so the client's
//!   memory is measured alone. The child builds the client, does a 64 KiB warm-up upload
//!   (TLS session, buffers, pool), reads `VmRSS`, resets the peak with
//!   `echo 5 > /proc/self/clear_refs` (Linux: sets `VmHWM` to the current RSS), uploads the
//!   artifact from a reader that synthesises the bytes on the fly, then reads `VmHWM`. The
//!   growth is `VmHWM - VmRSS(before)`: what the upload itself added at its peak. As a
//!   control for the method, the child then resets the peak again, touches an 8 MiB
//!   buffer and reports that growth too (it must read about 8192 KiB).
//! - Throughput is content bytes / wall time of the `post_artifact` call, median of
//!   `RUNS` children per size.

use std::io::{self, Read};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use ql_worker::https::{HttpsClient, Origin, RequestTimeout, TlsMaterial, TlsMaterialPaths};
use ql_worker_tests::https_server::{ArtifactSinkHandler, HttpsServer, ServerOptions, ServerTls};
use ql_worker_tests::pki::TestPki;
use sha2::{Digest, Sha256};

const MIB: u64 = 1024 * 1024;
const SIZES: [u64; 2] = [4 * MIB, 64 * MIB];
const RUNS: usize = 3;
const PATH: &str = "/api/v3/worker-ingress/workers/bench/sessions/s/artifacts";
const AUTH: &str = "Worker ql3w_bench_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
const HEADER: &[u8] = br#"{"schema":"qinglong/remote-worker-artifact-upload@v1"}"#;

/// Produces `remaining` deterministic bytes without holding them: a 64 KiB block, each
/// pass XORed with a counter so the stream does not repeat.
struct Synth {
    block: Vec<u8>,
    pos: usize,
    pass: u8,
    remaining: u64,
}

impl Synth {
    fn new(len: u64) -> Self {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let block = (0..64 * 1024)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        Self {
            block,
            pos: 0,
            pass: 0,
            remaining: len,
        }
    }
}

impl Read for Synth {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf
            .len()
            .min(self.block.len() - self.pos)
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        for (out, b) in buf[..n].iter_mut().zip(&self.block[self.pos..self.pos + n]) {
            *out = b ^ self.pass;
        }
        self.pos += n;
        if self.pos == self.block.len() {
            self.pos = 0;
            self.pass = self.pass.wrapping_add(1);
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} not in /proc/self/status"))
}

/// Child: upload one artifact, print `bytes secs rss_before_kib hwm_after_kib sha256`.
fn child(origin: &str, pki_dir: &str, bytes: u64) {
    let dir = PathBuf::from(pki_dir);
    let material = TlsMaterial::load(&TlsMaterialPaths {
        cert_chain: dir.join("client.pem"),
        private_key: dir.join("client-key.pem"),
        trust_anchors: vec![dir.join("ca.pem")],
    })
    .expect("material");
    let client = HttpsClient::new(
        Origin::parse(origin).expect("origin"),
        material,
        RequestTimeout::from_millis(60_000).expect("timeout"),
    )
    .expect("client");
    let mut warm = Synth::new(64 * 1024);
    client
        .post_artifact(PATH, AUTH, HEADER, &mut warm, 64 * 1024, 4096)
        .expect("warm-up upload");

    let rss_before = proc_status_kib("VmRSS:");
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let mut content = Synth::new(bytes);
    let started = Instant::now();
    let (_, report) = client
        .post_artifact(PATH, AUTH, HEADER, &mut content, bytes, 4096)
        .expect("upload");
    let secs = started.elapsed().as_secs_f64();
    let hwm_after = proc_status_kib("VmHWM:");
    assert_eq!(report.bytes_sent, bytes);

    // Control for the method: touching 8 MiB more must show up as ~8 MiB of peak growth.
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let control_before = proc_status_kib("VmRSS:");
    let touched = std::hint::black_box(vec![1_u8; 8 * 1024 * 1024]);
    let control_growth = proc_status_kib("VmHWM:").saturating_sub(control_before);
    drop(touched);

    println!(
        "{bytes} {secs} {rss_before} {hwm_after} {} {control_growth}",
        report.sha256_hex()
    );
}

struct Sample {
    secs: f64,
    rss_before_kib: u64,
    growth_kib: u64,
    control_growth_kib: u64,
}

fn run_child(origin: &str, pki_dir: &str, bytes: u64) -> Sample {
    let exe = std::env::current_exe().expect("current exe");
    let out = Command::new(exe)
        .args(["child", origin, pki_dir, &bytes.to_string()])
        .output()
        .expect("spawn child");
    assert!(
        out.status.success(),
        "child failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).expect("utf-8");
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(fields.len(), 6, "child output: {line}");
    // The server's digest of what it received must equal the client's.
    let expected = {
        let mut h = Sha256::new();
        let mut s = Synth::new(bytes);
        let mut buf = vec![0_u8; 64 * 1024];
        loop {
            let n = s.read(&mut buf).expect("synth");
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        h.finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    assert_eq!(fields[4], expected, "client digest matches the content");
    let rss_before_kib: u64 = fields[2].parse().expect("rss");
    let hwm_after_kib: u64 = fields[3].parse().expect("hwm");
    Sample {
        secs: fields[1].parse().expect("secs"),
        rss_before_kib,
        growth_kib: hwm_after_kib.saturating_sub(rss_before_kib),
        control_growth_kib: fields[5].parse().expect("control"),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        let bytes = args[4].parse().expect("bytes");
        child(&args[2], &args[3], bytes);
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        println!("upload benchmark: run it with `cargo bench -p ql-worker-tests --bench upload`");
        return;
    }

    let tmp = tempfile::tempdir().expect("tempdir");
    let pki_dir = tmp.path().join("pki");
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
    let pki_dir = pki_dir.to_str().expect("utf-8 path");

    println!("artifact upload over loopback mTLS (TLS 1.3), {RUNS} child runs per size");
    let mut rates = Vec::new();
    for bytes in SIZES {
        let samples: Vec<Sample> = (0..RUNS)
            .map(|_| run_child(&origin, pki_dir, bytes))
            .collect();
        let rate = median(
            samples
                .iter()
                .map(|s| bytes as f64 / MIB as f64 / s.secs)
                .collect(),
        );
        let growth: Vec<u64> = samples.iter().map(|s| s.growth_kib).collect();
        let rss: Vec<u64> = samples.iter().map(|s| s.rss_before_kib).collect();
        let control: Vec<u64> = samples.iter().map(|s| s.control_growth_kib).collect();
        println!(
            "{:>3} MiB: {rate:8.1} MiB/s (median), peak RSS growth {growth:?} KiB, \
             RSS before {rss:?} KiB, control (8 MiB touched) {control:?} KiB",
            bytes / MIB
        );
        rates.push(rate);
    }
    println!(
        "throughput ratio 64 MiB / 4 MiB: {:.2}",
        rates[1] / rates[0]
    );
    let records = server.records();
    assert!(
        records
            .iter()
            .all(|r| r.body_complete && r.response_status == Some(200))
    );
    println!("server requests served: {}", records.len());
}
