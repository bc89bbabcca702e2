#!/usr/bin/env python3
"""Counts how often functions of a ql-worker binary run, in every process that executes that
file (the Worker and each supervisor it starts from its own image), while a command runs.

    tests/perf/count-calls.py TAG BINARY -- COMMAND...

One uprobe per function (Linux tracefs, root), placed at the function's entry found with `nm`
and `readelf`; the counts come from `uprobe_profile`. Functions are chosen with
QLCOUNT_SYMS="label=mangled-name-fragment,..." (default: the revision digest and
normalization). The probes are removed at the end. See docs/performance.md, "Revision digests
per Run".
"""
import os
import subprocess
import sys

TRACE = "/sys/kernel/tracing"
DEFAULT = "digest=ExecutionRevision14compute_digest,normalize=ExecutionRevision9normalize"


def symbols(binary, pairs):
    found = {}
    out = subprocess.run(["nm", binary], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        for label, fragment in pairs:
            if fragment in line and (" T " in line or " t " in line) and "closure" not in line:
                found.setdefault(label, int(line.split()[0], 16))
    missing = [label for label, _ in pairs if label not in found]
    if missing:
        sys.exit(f"not in {binary}: {missing} (inlined or renamed?)")
    return found


def file_offset(binary, address):
    out = subprocess.run(["readelf", "-lW", binary], capture_output=True, text=True, check=True)
    for line in out.stdout.splitlines():
        f = line.split()
        if f and f[0] == "LOAD":
            offset, vaddr, size = int(f[1], 16), int(f[2], 16), int(f[4], 16)
            if vaddr <= address < vaddr + size:
                return address - vaddr + offset
    sys.exit(f"address {address:#x} is in no LOAD segment of {binary}")


def event(line):
    fd = os.open(f"{TRACE}/uprobe_events", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main():
    if len(sys.argv) < 5 or "--" not in sys.argv:
        sys.exit(__doc__)
    tag, binary = sys.argv[1], os.path.realpath(sys.argv[2])
    command = sys.argv[sys.argv.index("--") + 1:]
    pairs = [p.split("=", 1) for p in os.environ.get("QLCOUNT_SYMS", DEFAULT).split(",")]
    if not os.path.exists(f"{TRACE}/uprobe_events"):
        sys.exit(f"no {TRACE}/uprobe_events: mount tracefs there (root)")
    names = []
    try:
        for label, address in symbols(binary, pairs).items():
            name = f"{tag}_{label}"
            event(f"p:qlcount/{name} {binary}:{file_offset(binary, address):#x}")
            names.append(name)
            with open(f"{TRACE}/events/qlcount/{name}/enable", "w") as f:
                f.write("1")
        code = subprocess.run(command).returncode
        for name in names:
            with open(f"{TRACE}/events/qlcount/{name}/enable", "w") as f:
                f.write("0")
        with open(f"{TRACE}/uprobe_profile") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[1].startswith(f"{tag}_"):
                    print(f"{parts[1][len(tag) + 1:]:24} {parts[2]:>8}")
    finally:
        for name in names:
            event(f"-:qlcount/{name}")
        with open(f"{TRACE}/trace", "w") as f:
            f.write("")
    sys.exit(code)


if __name__ == "__main__":
    main()
