#!/usr/bin/env bash
# tests/edge/build.sh [--test-hooks] TARGET — a static, stripped edge binary of ql-worker,
# without the demo.
#
# TARGET: x86_64-unknown-linux-musl | aarch64-unknown-linux-musl | armv7-unknown-linux-musleabihf
#
# --test-hooks builds `ql-worker-test-hooks` instead: the same code with the crash-test hooks
# (the `test-hooks` feature), which the smoke's restart tests need. Never ship it.
#
# Installs what it needs (the rustup target; Debian's C cross compiler for ring's C and assembly,
# or musl-tools for x86_64) non-interactively when run as root, and fails with a clear message
# when it cannot. Builds `ql-worker --no-default-features` with the `edge` cargo profile, checks
# the result (ELF machine, static, stripped, no demo or server code in the build graph or the
# bytes, at most 4 MiB) and prints the binary's absolute path as its last line.
#
# Environment: QL_EDGE_TOOLCHAIN forces a rustup toolchain (default: the project's default, or
# for armv7 the newest stable that still ships its standard library, see below).
set -euo pipefail
cd "$(dirname "$0")/../.."
here="$(pwd)"

readonly MAX_BYTES=$((4 * 1024 * 1024))
# The Rust project ships no prebuilt standard library for armv7-unknown-linux-musleabihf after
# 1.93.0 (the 1.94.0 and 1.95.0 channel manifests say `available = false`, so does nightly):
# build that target with 1.93.0 (>= the MSRV, 1.88) until a newer release ships it again.
readonly ARMV7_FALLBACK_TOOLCHAIN=1.93.0

die() {
  printf 'build.sh: %s\n' "$*" >&2
  exit 1
}
note() { printf 'build.sh: %s\n' "$*" >&2; }

usage="usage: tests/edge/build.sh [--test-hooks] x86_64-unknown-linux-musl|aarch64-unknown-linux-musl|armv7-unknown-linux-musleabihf"
binary=ql-worker
features=()
if [ "${1:-}" = --test-hooks ]; then
  binary=ql-worker-test-hooks
  features=(--features test-hooks)
  shift
fi
[ $# -eq 1 ] || die "$usage"
target="$1"
case "$target" in
  x86_64-unknown-linux-musl)
    cc=musl-gcc ar=ar linker="" pkg=musl-tools machine="Advanced Micro Devices X86-64"
    libc_header="" libc_pkg="" ;;
  aarch64-unknown-linux-musl)
    cc=aarch64-linux-gnu-gcc ar=aarch64-linux-gnu-ar linker=aarch64-linux-gnu-gcc
    pkg=gcc-aarch64-linux-gnu machine="AArch64"
    libc_header=/usr/aarch64-linux-gnu/include/stdint.h libc_pkg=libc6-dev-arm64-cross ;;
  armv7-unknown-linux-musleabihf)
    cc=arm-linux-gnueabihf-gcc ar=arm-linux-gnueabihf-ar linker=arm-linux-gnueabihf-gcc
    pkg=gcc-arm-linux-gnueabihf machine="ARM"
    libc_header=/usr/arm-linux-gnueabihf/include/stdint.h libc_pkg=libc6-dev-armhf-cross ;;
  *) die "unknown target '$target'; $usage" ;;
esac

command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust (rustup) first"
command -v rustup >/dev/null 2>&1 || die "rustup not found: the edge build adds targets with rustup"

# --- host tools: the C cross compiler (ring's C and assembly) and binutils' readelf -------------
need_pkgs=()
command -v "$cc" >/dev/null 2>&1 || need_pkgs+=("$pkg")
command -v readelf >/dev/null 2>&1 || need_pkgs+=(binutils)
# The cross compiler's C headers (ring's C includes <stdint.h>): a Recommends of the compiler
# package, which --no-install-recommends below leaves out on a fresh machine.
if [ -n "$libc_header" ] && [ ! -e "$libc_header" ]; then need_pkgs+=("$libc_pkg"); fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    die "missing ${need_pkgs[*]} (for $cc / readelf); install them (Debian: apt-get install ${need_pkgs[*]}) or run this script as root on Debian"
  fi
  note "installing ${need_pkgs[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null; then
    apt-get update -q >/dev/null || true
    apt-get install -y -q --no-install-recommends "${need_pkgs[@]}" >/dev/null ||
      die "apt-get could not install ${need_pkgs[*]}"
  fi
  command -v "$cc" >/dev/null 2>&1 || die "$pkg is installed but $cc is still not on PATH"
fi

# --- the Rust toolchain and target ---------------------------------------------------------------
toolchain="${QL_EDGE_TOOLCHAIN:-}"
if [ -z "$toolchain" ]; then
  toolchain="$(rustup show active-toolchain | awk '{print $1; exit}')"
  [ -n "$toolchain" ] || die "rustup reports no active toolchain"
fi
if ! rustup target add --toolchain "$toolchain" "$target" >/dev/null 2>/tmp/ql-edge-rustup.$$; then
  if [ "$target" = armv7-unknown-linux-musleabihf ] && [ -z "${QL_EDGE_TOOLCHAIN:-}" ]; then
    note "toolchain $toolchain ships no standard library for $target; using $ARMV7_FALLBACK_TOOLCHAIN"
    toolchain="$ARMV7_FALLBACK_TOOLCHAIN"
    rustup toolchain install "$toolchain" --profile minimal --target "$target" >/dev/null 2>/tmp/ql-edge-rustup.$$ ||
      die "rustup could not install toolchain $toolchain with $target: $(tail -n 3 /tmp/ql-edge-rustup.$$)"
  else
    die "rustup could not add $target to $toolchain: $(tail -n 3 /tmp/ql-edge-rustup.$$)"
  fi
fi
rm -f /tmp/ql-edge-rustup.$$

# --- build ---------------------------------------------------------------------------------------
triple_env="$(printf '%s' "$target" | tr 'a-z-' 'A-Z_')"
triple_low="$(printf '%s' "$target" | tr '-' '_')"
export "CC_${triple_low}=$cc" "AR_${triple_low}=$ar"
[ -z "$linker" ] || export "CARGO_TARGET_${triple_env}_LINKER=$linker"

note "building $binary for $target with $toolchain (profile edge, --no-default-features ${features[*]})"
start=$(date +%s)
cargo "+$toolchain" build --locked --profile edge -p ql-worker --bin "$binary" \
  --no-default-features "${features[@]}" --target "$target" >&2
seconds=$(($(date +%s) - start))
bin="$here/target/$target/edge/$binary"
[ -x "$bin" ] || die "cargo finished but $bin is missing"

# --- checks --------------------------------------------------------------------------------------
header="$(readelf -hW "$bin")"
grep -q "Machine: *$machine\$" <<<"$header" ||
  die "$bin is not a $machine ELF: $(grep Machine: <<<"$header")"
if readelf -lW "$bin" | grep -q 'INTERP'; then
  die "$bin asks for a program interpreter: not statically linked"
fi
if readelf -dW "$bin" | grep -q '(NEEDED)'; then
  die "$bin needs shared libraries: $(readelf -dW "$bin" | grep '(NEEDED)' | tr -s ' ')"
fi
if readelf -SW "$bin" | grep -Eq '\.symtab|\.debug_'; then
  die "$bin still has a symbol table or debug sections: not stripped"
fi
for crate in ql-worker-tests rcgen tempfile; do
  if [ -n "$(cargo "+$toolchain" tree --locked -p ql-worker --no-default-features "${features[@]}" \
    --target "$target" -e normal,build -i "$crate" 2>/dev/null)" ]; then
    die "$crate is in the edge build graph: the demo or its server code would be linked"
  fi
done
# The demo's own text, present in every default build: a leak of the feature fails here.
if grep -Fq 'loopback control plane with fresh certificates' "$bin"; then
  die "$bin carries the demo's code"
fi
bytes=$(stat -c %s "$bin")
[ "$bytes" -le "$MAX_BYTES" ] || die "$bin is $bytes bytes, over the 4 MiB edge budget ($MAX_BYTES)"

printf 'build.sh: %s %s: %s bytes (%s KiB), static, stripped, no demo; built in %s s with %s\n' \
  "$binary" "$target" "$bytes" "$((bytes / 1024))" "$seconds" "$toolchain" >&2
printf '%s\n' "$bin"
