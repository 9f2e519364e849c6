#!/usr/bin/env python3
"""The stages of a background op's start, from a system-wide `perf trace`
(fsync, rename, execve, writev) of `opkernel-bench --latency-only`; see
scripts/start-path.sh. Per sample, in order:

  A  the bench's request (its writev)
  K  the kernel's syncs up to the filing: the admission's commit, the exec
     claim's commit, the request file's own sync (SQLite: 3 of them)
  C  the request renamed into the launcher's inbox (the kernel's rename)
  D  the launcher's claim (its rename of the request)
  E  `opkernel-shim launch` executed (the launcher's child)
  F  the op's pid file in place (the shim's rename)
  G  the command executed (its execve returned)

and, within them, the kernel's three syncs' own time and the command's
PATH search (the execs of its name that failed before the one that ran).

Prints each stage's p50 and p90 in ms over the samples where all were seen.
"""

import math
import re
import statistics
import sys

LINE = re.compile(r"^\s*([\d.]+) \(\s*([\d.]*)\s*(?:ms)?\): (.*?)/(\d+) (.*)$")


def events(path):
    """(start, end, comm, tid, call, result) of each completed call."""
    out, pending = [], {}
    for line in open(path, encoding="utf-8", errors="replace"):
        m = LINE.match(line)
        if not m:
            continue
        t, dur, comm, tid, rest = m.groups()
        t, tid = float(t), int(tid)
        if "[continued]:" in rest:
            call = rest.split("[continued]:")[1].split("(")[0].strip()
            start = pending.pop((tid, call), t)
        else:
            call = rest.split("(")[0]
            if rest.rstrip().endswith("..."):
                pending[(tid, call)] = t
                continue
            start = t
        result = rest.rsplit("=", 1)[-1].strip() if "=" in rest else ""
        out.append((start, t + float(dur or 0), comm, tid, call, result))
    out.sort()
    return out


def request(e):
    """The bench's HTTP request (a writev of a few hundred bytes; the
    kernel's answer is over a thousand, Docker's API calls go by write)."""
    return e[5].isdigit() and 200 <= int(e[5]) < 1000 and e[2] != "fuse-overlayfs"


def first(evs, i, test):
    return next(((j, evs[j]) for j in range(i, len(evs)) if test(evs[j])), (None, None))


def last_before(evs, i, since, test):
    """The last event before index `i`, no earlier than `since`, passing `test`."""
    for j in range(i - 1, -1, -1):
        if evs[j][0] < since:
            return None
        if test(evs[j]):
            return evs[j]
    return None


def sample(evs, ci):
    """(the claim's index, the request's time, the stage times) of the op
    filed by the rename at `ci`, or None."""
    c = evs[ci]
    a = last_before(evs, ci, c[0] - 50, lambda e: e[4] == "writev" and request(e))
    if a is None:
        return None
    syncs = []
    for j in range(ci - 1, -1, -1):
        if evs[j][0] <= a[0]:
            break
        if evs[j][4] == "fsync" and evs[j][2] != "shim":
            syncs.insert(0, evs[j])
    di, d = first(evs, ci + 1, lambda e: e[4] == "rename" and e[2] == "shim")
    if d is None or d[1] - c[1] > 5:
        return None
    ei, e = first(evs, di + 1, lambda x: x[4] == "execve" and x[5] == "0" and x[3] != d[3])
    if e is None:
        return None
    fi, f = first(evs, ei + 1, lambda x: x[4] == "rename" and x[3] == e[3])
    if f is None:
        return None
    gi, g = first(evs, fi + 1, lambda x: x[4] == "execve" and x[5] == "0" and x[3] not in (d[3], e[3]))
    if g is None or g[1] - a[0] > 100:
        return None
    stages = {}
    if len(syncs) == 3:
        stages["request -> admission committed"] = syncs[0][1] - a[0]
        stages["-> exec claim committed"] = syncs[1][1] - syncs[0][1]
        stages["-> request filed (synced, renamed)"] = c[1] - syncs[1][1]
        stages["  (of these, the three syncs)"] = sum(x[1] - x[0] for x in syncs)
    else:
        stages["request -> request filed"] = c[1] - a[0]
    stages["-> launcher claimed it"] = d[1] - c[1]
    stages["-> shim launch executed"] = e[0] - d[1]
    stages["-> pid file in place"] = f[1] - e[0]
    stages["-> command executed"] = g[1] - f[1]
    # the command's PATH search: the execs of its name that failed
    missed = [x for x in evs[fi + 1 : gi] if x[4] == "execve" and x[3] == g[3] and x[5].startswith("-")]
    stages["  (of it, the PATH search's failed execs)"] = sum(x[1] - x[0] for x in missed)
    stages["request -> command executed"] = g[1] - a[0]
    return di, a[0], stages


ORDER = [
    "request -> admission committed",
    "-> exec claim committed",
    "-> request filed (synced, renamed)",
    "  (of these, the three syncs)",
    "request -> request filed",
    "-> launcher claimed it",
    "-> shim launch executed",
    "-> pid file in place",
    "-> command executed",
    "  (of it, the PATH search's failed execs)",
    "request -> command executed",
]


def main():
    evs = events(sys.argv[1])
    # the kernel's filing: a rename the launcher's claim (a rename by
    # `shim`) follows; of two such renames before one claim, the later
    by_claim = {}
    for ci, e in enumerate(evs):
        if e[4] == "rename" and e[2] != "shim":
            found = sample(evs, ci)
            if found:
                by_claim[found[0]] = found[1:]
    # the bench's first three rounds warm up and are not its figures
    samples = [stages for _, stages in sorted(by_claim.values(), key=lambda x: x[0])][3:]
    if not samples:
        sys.exit("start-path: no complete sample in the trace")
    for name in ORDER:
        v = sorted(st[name] for st in samples if name in st)
        if not v:
            continue
        p90 = v[max(0, math.ceil(0.9 * len(v)) - 1)]
        print(f"{name:42s} p50 {statistics.median(v):6.2f} ms  p90 {p90:6.2f} ms  n={len(v)}")


if __name__ == "__main__":
    main()
