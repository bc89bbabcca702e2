#!/usr/bin/env bash
# tests/edge/package.sh TARGET — the release tarball of one edge target.
#
# Builds the binary with tests/edge/build.sh (or takes QL_EDGE_BIN) and writes
#   target/edge/dist/ql-worker-<version>-<TARGET>.tar.gz
#   target/edge/dist/ql-worker-<version>-<TARGET>.tar.gz.sha256
# The tarball holds one directory, ql-worker-<version>-<TARGET>/, with the binary, the example
# configuration (docs/ql-worker.example.toml), the hardened systemd unit
# (packaging/systemd/ql-worker.service, the unit docs/operations.md shows; a test keeps the two
# identical), the OpenWrt procd init script (packaging/openwrt/ql-worker.init), a short host
# README (packaging/README.host.md) and SHA256SUMS of every file beside it. The archive is
# reproducible: sorted names, fixed owner and times (the commit's time). Prints the tarball's
# path as its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."
here="$(pwd)"

die() {
  printf 'package.sh: %s\n' "$*" >&2
  exit 1
}
[ $# -eq 1 ] || die "usage: tests/edge/package.sh TARGET (see tests/edge/build.sh)"
target="$1"

if [ -n "${QL_EDGE_BIN:-}" ]; then
  bin="$(readlink -f "$QL_EDGE_BIN")"
else
  bin="$(tests/edge/build.sh "$target" | tail -n 1)" || die "tests/edge/build.sh $target failed"
fi
[ -x "$bin" ] || die "no executable binary at '$bin'"

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' drivers/Cargo.toml | head -n 1)"
[ -n "$version" ] || die "no version in drivers/Cargo.toml"
name="ql-worker-$version-$target"
dist="$here/target/edge/dist"
stage="$dist/$name"
rm -rf "$stage" "$dist/$name.tar.gz" "$dist/$name.tar.gz.sha256"
mkdir -p "$stage"

install -m 0755 "$bin" "$stage/ql-worker"
install -m 0644 docs/ql-worker.example.toml "$stage/ql-worker.example.toml"
install -m 0644 packaging/systemd/ql-worker.service "$stage/ql-worker.service"
install -m 0755 packaging/openwrt/ql-worker.init "$stage/ql-worker.init"
sed -e "s/@VERSION@/$version/g" -e "s/@TARGET@/$target/g" packaging/README.host.md >"$stage/README.md"
chmod 0644 "$stage/README.md"
(cd "$stage" && sha256sum ql-worker ql-worker.example.toml ql-worker.service ql-worker.init README.md >SHA256SUMS)
chmod 0644 "$stage/SHA256SUMS"
(cd "$stage" && sha256sum -c --quiet SHA256SUMS) || die "SHA256SUMS does not verify"

mtime="$(git log -1 --format=%ct 2>/dev/null || echo 0)"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" \
  -C "$dist" -cf - "$name" | gzip -n -9 >"$dist/$name.tar.gz"
(cd "$dist" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
rm -rf "$stage"

printf 'package.sh: %s: %s bytes; %s\n' "$name.tar.gz" "$(stat -c %s "$dist/$name.tar.gz")" \
  "$(cut -d' ' -f1 "$dist/$name.tar.gz.sha256")" >&2
printf '%s\n' "$dist/$name.tar.gz"
