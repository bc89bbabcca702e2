//! The result table: one row per measure, printed as Markdown so it can go straight into
//! `docs/performance.md`.

use std::time::Duration;

pub(crate) struct Row {
    pub(crate) measure: String,
    pub(crate) ours: String,
    pub(crate) baseline: String,
    pub(crate) ratio: String,
    pub(crate) note: String,
}

#[derive(Default)]
pub(crate) struct Table {
    rows: Vec<Row>,
}

impl Table {
    pub(crate) fn push(
        &mut self,
        measure: impl Into<String>,
        ours: impl Into<String>,
        baseline: impl Into<String>,
        ratio: Option<f64>,
        note: impl Into<String>,
    ) {
        let row = Row {
            measure: measure.into(),
            ours: ours.into(),
            baseline: baseline.into(),
            ratio: ratio.map_or_else(|| String::from("—"), |r| format!("{r:.2}")),
            note: note.into(),
        };
        eprintln!(
            "  → {} | {} | {} | {} | {}",
            row.measure, row.ours, row.baseline, row.ratio, row.note
        );
        self.rows.push(row);
    }

    /// A measure that could not run here, with the reason.
    pub(crate) fn skipped(&mut self, measure: &str, why: &str) {
        self.push(measure, "n/a", "n/a", None, why);
    }

    pub(crate) fn print(&self) {
        println!("| measure | ours | baseline | ratio | note |");
        println!("|---|---|---|---|---|");
        for r in &self.rows {
            println!(
                "| {} | {} | {} | {} | {} |",
                r.measure, r.ours, r.baseline, r.ratio, r.note
            );
        }
    }
}

/// `1.23 ms`, `456 µs`, `1.20 s`.
pub(crate) fn dur(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.0} µs", s * 1e6)
    }
}

/// `12.3 MiB` from KiB.
pub(crate) fn mib_from_kib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Median of a non-empty set.
pub(crate) fn median(v: &[Duration]) -> Duration {
    percentile(v, 50)
}

/// Nearest-rank percentile of a non-empty set.
pub(crate) fn percentile(v: &[Duration], p: usize) -> Duration {
    let mut sorted = v.to_vec();
    sorted.sort_unstable();
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

pub(crate) fn median_f64(v: &[f64]) -> f64 {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
