#!/usr/bin/env bash
# Long libFuzzer runs on the stable toolchain, then the minimised corpora.
#
#   bash fuzz/long-run.sh [SECONDS] [TARGET ...]
#
# Builds every target twice (`cargo fuzz build -O`: ASan, with RUSTC_BOOTSTRAP=1 since
# cargo-fuzz passes -Z flags; and `--sanitizer none` for the machine targets, into its own target
# directory so the two builds do not overwrite each other), then runs each TARGET (default: all
# 16) for SECONDS (default 600) with its working corpus in $FUZZ_WORK/<target> (default
# /tmp/fz), seeded from fuzz/corpus/<target>. After each run it writes the set-cover merge of
# everything found into fuzz/corpus-min/<target>, which `core/tests/fuzz_corpus.rs` replays in
# every `cargo test`. One line per target: executions, exec/s, coverage, corpus, exit code.
# Two copies with different TARGET lists use both cores. Crashes land in fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")"
seconds=${1:-600}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^ql-worker-fuzz$')
fi
work=${FUZZ_WORK:-/tmp/fz}
none_dir=${FUZZ_NONE_TARGET_DIR:-target-none}
triple=$(rustc -vV | sed -n 's/^host: //p')

RUSTC_BOOTSTRAP=1 cargo fuzz build -O >&2
cargo fuzz build -O --sanitizer none --target-dir "$none_dir" >&2

for t in "${targets[@]}"; do
  case $t in
    machine_*) bin=$none_dir/$triple/release/$t; extra=(-max_len=512) ;;
    *) bin=target/$triple/release/$t; extra=() ;;
  esac
  mkdir -p "$work/$t" artifacts/"$t"
  log=$work/$t.log
  rc=0
  "$bin" "$work/$t" "corpus/$t" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix=artifacts/"$t"/ "${extra[@]}" >"$log" 2>&1 || rc=$?
  rm -rf "corpus-min/$t" && mkdir -p "corpus-min/$t"
  "$bin" -set_cover_merge=1 "${extra[@]}" "corpus-min/$t" "$work/$t" "corpus/$t" \
    >"$work/$t.merge.log" 2>&1
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -n 1 | sed 's/.*DONE *//' || true)
  echo "$t: ${execs:-?} executions, ${rate:-?} exec/s, ${done_line:-?}, exit $rc," \
    "corpus-min $(find "corpus-min/$t" -type f | wc -l) files"
done
