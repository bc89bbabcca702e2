#!/usr/bin/env bash
# tests/edge/smoke.sh TARGET — proves an edge binary under qemu-user emulation.
#
# TARGET: x86_64-unknown-linux-musl | aarch64-unknown-linux-musl | armv7-unknown-linux-musleabihf
#
# 1. Builds the binary with tests/edge/build.sh (or takes QL_EDGE_BIN), and its test-hooks twin
#    (`build.sh --test-hooks`: the same code with the crash-test hooks, which the restart tests
#    need to stop the Worker in a chosen state; or QL_EDGE_HOOKED_BIN).
# 2. Finds a qemu-user emulator for the target that can run the supervisor (qemu >= 9: Debian
#    bookworm's 7.2 answers EINVAL to PR_SET_CHILD_SUBREAPER), else fetches Debian's static
#    `qemu-user` from <codename>-backports (or <codename>) with apt-get into a private apt state
#    under target/edge/ and extracts that one emulator. Nothing is installed system-wide.
# 3. Registers a binfmt_misc entry that matches exactly each binary (its first 128 bytes: the
#    ELF header and program headers), flags P (keep argv[0]), O (hand the emulator the open
#    binary: the Worker executes its supervisor through /proc/self/fd/N, a close-on-exec
#    descriptor that is gone by the time the emulator would open the path) and F (the emulator
#    is opened now, so it works from any path later). Only this binary is affected, even for
#    x86_64 on an x86_64 host. Mounts binfmt_misc if needed. All of it is undone at exit.
# 4. Runs the core of the real-binary tests against the emulated binary, the host build serving
#    the loopback reference control plane: e2e_image (the Worker and its supervisor run under
#    the emulator, a Run completes), e2e_demo (the demo's five Runs end to end, drain),
#    e2e_restart (restart in every state; a restart never respawns), e2e_containment ([run_as],
#    policy, masking through the real Worker), e2e_handleless_stop (the held spawn: a Run whose
#    Worker died before `started` is stopped by the handle its supervisor published),
#    supervisor_launch, supervisor_worker_kill (the receipt survives a Worker kill),
#    supervisor_reaper.
# 5. Prints one result line last: "edge smoke TARGET: PASS ..." or "edge smoke TARGET: FAIL ...".
#
# Needs root (binfmt_misc). Environment: QL_EDGE_BIN / QL_EDGE_HOOKED_BIN (skip the builds), QL_EDGE_QEMU (an
# emulator to use), QL_EDGE_DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail
cd "$(dirname "$0")/../.."
here="$(pwd)"

readonly QEMU_MIN_MAJOR=9
readonly TESTS=(e2e_image e2e_demo e2e_restart e2e_containment e2e_handleless_stop supervisor_launch supervisor_worker_kill supervisor_reaper)
readonly BFM=/proc/sys/fs/binfmt_misc

target="${1:-}"
started=$(date +%s)

mounted_here=0
entries=()
qemu=""
bin=""
hooked=""
# Processes this smoke left behind if a test failed half-way: Workers of this binary and
# supervisors (`... /proc/self/fd/N ql-worker __supervise`) under this emulator, which lives in
# this tree's target/edge. Killed by pid; nothing else is touched.
kill_leftovers() {
  local p args
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/exe" 2>/dev/null)" = "$qemu" ] || continue
    args="$(tr '\0' '\n' <"$p/cmdline" 2>/dev/null)" || continue
    grep -qxF -e "$bin" -e "$hooked" -e __supervise <<<"$args" || continue
    note "killing leftover ${p#/proc/}: $(tr '\n' ' ' <<<"$args")"
    kill -KILL "${p#/proc/}" 2>/dev/null || true
  done
}
cleanup() {
  local entry
  [ ${#entries[@]} -eq 0 ] || kill_leftovers
  for entry in "${entries[@]}"; do
    if [ -e "$BFM/$entry" ]; then
      echo -1 >"$BFM/$entry" || note "could not remove binfmt_misc entry $entry"
    fi
  done
  entries=()
  # Unmount only what this script mounted, and only while no other entry uses it.
  if [ "$mounted_here" = 1 ]; then
    local other="" e
    for e in "$BFM"/*; do
      case "${e##*/}" in register | status) ;; *) other="$e" ;; esac
    done
    [ -n "$other" ] || umount "$BFM" || note "could not unmount $BFM"
    mounted_here=0
  fi
}
# The result line comes last: undo the set-up first (the EXIT trap covers other exits).
result() {
  cleanup
  trap - EXIT
  printf 'edge smoke %s: %s\n' "${target:-?}" "$*"
}
fail() {
  printf 'smoke.sh: %s\n' "$*" >&2
  result "FAIL ($*)"
  exit 1
}
note() { printf 'smoke.sh: %s\n' "$*" >&2; }

case "$target" in
  x86_64-unknown-linux-musl) qarch=x86_64 ;;
  aarch64-unknown-linux-musl) qarch=aarch64 ;;
  armv7-unknown-linux-musleabihf) qarch=arm ;;
  *) fail "usage: tests/edge/smoke.sh x86_64-unknown-linux-musl|aarch64-unknown-linux-musl|armv7-unknown-linux-musleabihf" ;;
esac
[ "$(id -u)" -eq 0 ] || fail "needs root: registering a binfmt_misc emulator is a root operation"

# --- 1. the binary ---------------------------------------------------------------------------------
b0=$(date +%s)
if [ -n "${QL_EDGE_BIN:-}" ]; then
  bin="$(readlink -f "$QL_EDGE_BIN")"
else
  bin="$(tests/edge/build.sh "$target" | tail -n 1)" || fail "tests/edge/build.sh $target failed"
fi
if [ -n "${QL_EDGE_HOOKED_BIN:-}" ]; then
  hooked="$(readlink -f "$QL_EDGE_HOOKED_BIN")"
else
  hooked="$(tests/edge/build.sh --test-hooks "$target" | tail -n 1)" ||
    fail "tests/edge/build.sh --test-hooks $target failed"
fi
build_seconds=$(($(date +%s) - b0))
[ -x "$bin" ] || fail "no executable binary at '$bin'"
[ -x "$hooked" ] || fail "no executable test-hooks binary at '$hooked'"
bytes=$(stat -c %s "$bin")
sha="$(sha256sum "$bin" | cut -c1-16)"

# --- 2. the emulator -------------------------------------------------------------------------------
qemu_major() { "$1" --version 2>/dev/null | sed -n 's/.*version \([0-9][0-9]*\)\..*/\1/p' | head -n 1; }
qemu_ok() { [ -x "$1" ] && local m && m="$(qemu_major "$1")" && [ -n "$m" ] && [ "$m" -ge "$QEMU_MIN_MAJOR" ]; }

fetch_qemu() {
  command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 ||
    return 1
  local codename mirror state sources spec deb
  codename="$(. /etc/os-release 2>/dev/null && printf '%s' "${VERSION_CODENAME:-}")"
  [ -n "$codename" ] || return 1
  mirror="${QL_EDGE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  state="$here/target/edge/apt"
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/debs"
  sources="$state/sources.list"
  printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' \
    "$mirror" "$codename-backports" "$mirror" "$codename" >"$sources"
  local apt=(-o "Dir::Etc::SourceList=$sources" -o Dir::Etc::SourceParts=/nonexistent
    -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache" -o APT::Sandbox::User=root -q)
  note "fetching Debian's qemu-user (>= $QEMU_MIN_MAJOR) for $qarch with apt-get (private state in $state)"
  apt-get "${apt[@]}" update >/dev/null 2>&1 || return 1
  for spec in "qemu-user/$codename-backports" "qemu-user/$codename"; do
    rm -f "$state/debs"/*.deb
    (cd "$state/debs" && apt-get "${apt[@]}" download "$spec" >/dev/null 2>&1) || continue
    deb="$(ls "$state/debs"/*.deb 2>/dev/null | head -n 1)"
    [ -n "$deb" ] || continue
    local version dir
    version="$(dpkg-deb -f "$deb" Version | tr ':~+' '___')"
    dir="$here/target/edge/qemu/$version"
    mkdir -p "$dir.tmp"
    if dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$dir.tmp" "./usr/bin/qemu-$qarch" 2>/dev/null &&
      qemu_ok "$dir.tmp/usr/bin/qemu-$qarch"; then
      mkdir -p "$dir" && mv "$dir.tmp/usr/bin/qemu-$qarch" "$dir/qemu-$qarch"
      rm -rf "$dir.tmp" "$deb"
      return 0
    fi
    rm -rf "$dir.tmp" "$deb"
  done
  return 1
}

find_qemu() {
  local c
  for c in $(ls -d "$here"/target/edge/qemu/*/"qemu-$qarch" 2>/dev/null | sort -r) \
    "$(command -v "qemu-$qarch-static" || true)" "$(command -v "qemu-$qarch" || true)"; do
    if [ -n "$c" ] && qemu_ok "$c"; then
      readlink -f "$c"
      return 0
    fi
  done
  return 1
}

if [ -n "${QL_EDGE_QEMU:-}" ]; then
  qemu_ok "$QL_EDGE_QEMU" ||
    fail "QL_EDGE_QEMU=$QL_EDGE_QEMU is not a runnable qemu >= $QEMU_MIN_MAJOR (it says: $("$QL_EDGE_QEMU" --version 2>&1 | head -n 1))"
  qemu="$(readlink -f "$QL_EDGE_QEMU")"
elif ! qemu="$(find_qemu)"; then
  fetch_qemu || fail "no qemu-$qarch >= $QEMU_MIN_MAJOR here and none could be fetched with apt-get (name one with QL_EDGE_QEMU=/path/to/qemu-$qarch): emulation impossible"
  qemu="$(find_qemu)" || fail "the fetched qemu-$qarch does not run"
fi
qemu_version="$("$qemu" --version | sed -n 's/.*version \([^ ]*\).*/\1/p' | head -n 1)"
note "emulator: $qemu ($qemu_version)"

# --- 3. binfmt_misc --------------------------------------------------------------------------------
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ ! -e "$BFM/register" ]; then
  mount -t binfmt_misc binfmt_misc "$BFM" 2>/dev/null ||
    fail "cannot mount binfmt_misc on $BFM (kernel without CONFIG_BINFMT_MISC, or a container without the privilege): emulation impossible"
  mounted_here=1
fi
[ "$(cat "$BFM/status")" = enabled ] ||
  fail "binfmt_misc is disabled on this host ($BFM/status): emulation impossible"

# register NAME BINARY: an entry for exactly BINARY (matched on its first 128 bytes).
register() {
  local entry="ql-edge-$qarch-$1-$$" magic
  magic="$(od -An -v -tx1 -N128 "$2" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//; s/ /\\x/g; s/^/\\x/')"
  printf ':%s:M:0:%s::%s:POF' "$entry" "$magic" "$qemu" >"$BFM/register" 2>/dev/null ||
    fail "the kernel refused the binfmt_misc entry for $2: emulation impossible"
  entries+=("$entry")
  grep -qx 'flags: POF' "$BFM/$entry" || fail "binfmt_misc entry $entry lacks the P, O and F flags"
  "$2" --version >/dev/null 2>&1 ||
    fail "the kernel does not hand $2 to $qemu (binfmt_misc entry $entry): emulation impossible"
}
register bin "$bin"
cmp -s -n 128 "$bin" "$hooked" || register hooked "$hooked"

# --- 4. the binary's own face, emulated ------------------------------------------------------------
help="$("$bin" --help)" || fail "$bin --help failed under emulation"
grep -q 'This build has no `demo` verb' <<<"$help" || fail "--help does not say that this build has no demo"
if grep -Eq '^  demo |7  `demo`' <<<"$help"; then fail "--help offers a demo this build does not have"; fi
set +e
demo_out="$("$bin" demo 2>&1)"
demo_rc=$?
set -e
if [ "$demo_rc" -ne 2 ] || ! grep -q 'built without the `demo` feature' <<<"$demo_out"; then
  fail "'ql-worker demo' on an edge build must exit 2 and say why (got $demo_rc: $demo_out)"
fi

# --- 5. the real-binary tests against the emulated binary ------------------------------------------
t0=$(date +%s)
log="$here/target/edge/smoke-$target.log"
mkdir -p "$(dirname "$log")"
# `--workspace`: the same feature resolution as `cargo test --workspace --release`, so CI's test
# step has built these test binaries already (`-p ql-worker` would rebuild four crates).
test_args=()
for t in "${TESTS[@]}"; do test_args+=(--test "$t"); done
note "running ${TESTS[*]} against $bin under $qemu (log: $log)"
set +e
QL_WORKER_BIN_UNDER_TEST="$bin" QL_WORKER_HOOKED_BIN_UNDER_TEST="$hooked" QL_WORKER_EMULATOR="$qemu" \
  cargo test --workspace --release --locked "${test_args[@]}" >"$log" 2>&1
rc=$?
set -e
test_seconds=$(($(date +%s) - t0))
# One summary per test binary: the last `test result:` of each `Running` block (a failing
# clean re-execution prints its own inner summary inside the block).
summaries="$(awk '/^ *Running /{if(r!="")print r; r=""} /^test result: /{r=$0} END{if(r!="")print r}' "$log")"
passed=$(awk '{for(i=1;i<NF;i++)if($(i+1)~/^passed;/)p+=$i} END{print p+0}' <<<"$summaries")
failed=$(awk '{for(i=1;i<NF;i++)if($(i+1)~/^failed;/)f+=$i} END{print f+0}' <<<"$summaries")
binaries=$(grep -c '^test result: ' <<<"$summaries" || true)
if [ "$rc" -ne 0 ] || [ "${failed:-1}" -ne 0 ] || [ "$binaries" -ne "${#TESTS[@]}" ] || [ "${passed:-0}" -eq 0 ]; then
  grep -E '^test .* FAILED|panicked at|^error' "$log" | head -n 20 >&2 || true
  fail "tests against the emulated binary: exit $rc, ${passed:-?} passed, ${failed:-?} failed in $binaries of ${#TESTS[@]} test binaries (log: $log)"
fi

total=$(($(date +%s) - started))
result "PASS ($passed tests in ${#TESTS[@]} binaries, 0 failed, under qemu-$qarch $qemu_version via binfmt_misc; binary $bytes bytes, sha256 $sha…; build ${build_seconds} s, tests ${test_seconds} s, total ${total} s)"
