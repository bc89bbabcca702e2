//! The machine the figures were taken on, printed first.

use std::process::Command;

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or("").trim().to_owned()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

pub(crate) fn describe() -> Vec<String> {
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| String::from("unknown"));
    let mem_kib: u64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| String::from("rustc"));
    let rustc = Command::new(rustc)
        .arg("--version")
        .output()
        .map(|o| first_line(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_else(|_| String::from("unknown"));
    vec![
        format!("nproc: {cores} ({cpu})"),
        format!("memory: {:.1} GiB", mem_kib as f64 / 1024.0 / 1024.0),
        format!(
            "kernel: {}",
            first_line(&read("/proc/sys/kernel/osrelease"))
        ),
        format!("rustc: {rustc}"),
        format!(
            "load average at start: {}",
            first_line(&read("/proc/loadavg"))
        ),
    ]
}
