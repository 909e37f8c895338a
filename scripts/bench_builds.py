#!/usr/bin/env python3
"""Builds against each other: the table of an interleaved bench run.

Reads the JSON files `dsv4-kvcache bench --out` wrote for several builds
over several rounds (scripts/bench_builds.sh runs them interleaved on one
GPU) and prints, per bench row, each build's best time over its rounds, its
change against the base build, and the noise: the largest spread between
one build's rounds (slowest / fastest - 1) among the builds. A change larger
than the noise is printed in bold; `--fail-slower` exits 1 if any build is
slower than the base by more than the noise on some row (docs/tuning.md's
rule: no row may get slower by more than its noise).

Usage:
    python3 scripts/bench_builds.py DIR [--base NAME] [--fail-slower]
    python3 scripts/bench_builds.py NAME=FILE[,FILE...] ... [--base NAME]

DIR holds files `b<round>-<NAME>.json` (what bench_builds.sh writes). The
base is the first build named (in DIR mode the first name in sort order)
unless --base says otherwise. Rows are the bench's `rows` (op, T: µs per
launch and % of the roofline of the best round) and its `fused` table
(case, layout, T: the fused kernel's µs).
"""
import glob
import json
import os
import re
import sys


def load_builds(args):
    """{name: [parsed JSON of each round]} in the order the builds were named."""
    builds = {}
    if len(args) == 1 and os.path.isdir(args[0]):
        pat = re.compile(r"b(\d+)-(.+)\.json$")
        found = []
        for path in glob.glob(os.path.join(args[0], "b*-*.json")):
            m = pat.search(os.path.basename(path))
            if m:
                found.append((m.group(2), int(m.group(1)), path))
        for name, _, path in sorted(found):
            builds.setdefault(name, []).append(json.load(open(path)))
    else:
        for arg in args:
            name, sep, files = arg.partition("=")
            if not sep or not files:
                sys.exit(f"bench_builds: `{arg}` is not NAME=FILE[,FILE...]")
            builds[name] = [json.load(open(f)) for f in files.split(",")]
    if not builds:
        sys.exit(f"bench_builds: no bench JSON in {' '.join(args)}")
    return builds


def samples(run):
    """{row key: (µs, fraction of the roofline or None)} of one bench run."""
    out = {}
    for r in run.get("rows", []):
        out[("row", r["op"], r["tokens"])] = (r["us_per_launch"], r.get("fraction_of_roofline"))
    for f in run.get("fused", []):
        out[("fused", f"fused {f['case']} {f['layout']}", f["tokens"])] = (f["fused_us"], None)
    return out


def table(builds, base):
    names = list(builds)
    per = {n: [samples(run) for run in runs] for n, runs in builds.items()}
    keys = []
    for n in names:
        for s in per[n]:
            for k in s:
                if k not in keys:
                    keys.append(k)
    largest = {}  # (kind, op) -> its largest T, where the % of the roofline is shown
    for kind, op, t in keys:
        largest[(kind, op)] = max(t, largest.get((kind, op), t))
    lines = []
    head = "| op | T | " + " | ".join(f"{n} µs" for n in names) + " | noise |"
    lines.append(head)
    lines.append("| --- | ---: |" + " ---: |" * len(names) + " ---: |")
    slower = []
    for key in keys:
        best, spread = {}, 0.0
        for n in names:
            times = [s[key] for s in per[n] if key in s]
            if not times:
                continue
            fastest = min(times, key=lambda v: v[0])
            best[n] = fastest
            spread = max(spread, max(t for t, _ in times) / fastest[0] - 1.0)
        cells = []
        for n in names:
            if n not in best:
                cells.append("—")
                continue
            us, frac = best[n]
            cell = f"{us:.2f}"
            if frac is not None and key[2] == largest[key[:2]]:
                cell += f" ({100 * frac:.1f} %)"
            if n != base and base in best:
                change = us / best[base][0] - 1.0
                text = f"{100 * change:+.1f} %"
                if abs(change) > spread:
                    text = f"**{text}**"
                    if change > 0:
                        slower.append((n, key, change, spread))
                cell += f", {text}"
            cells.append(cell)
        lines.append(f"| {key[1]} | {key[2]} | " + " | ".join(cells) + f" | {100 * spread:.1f} % |")
    rounds = ", ".join(f"{n}: {len(r)}" for n, r in builds.items())
    roof = [run.get("roofline_bytes_per_s") for runs in builds.values() for run in runs]
    roof = [r for r in roof if r]
    lines.append("")
    lines.append(f"base {base}; rounds {rounds}; best round per build and row; noise: the largest")
    lines.append("spread between one build's rounds; bold: a change beyond the noise; (%): of the")
    if roof:
        lines.append(f"roofline at the row's largest T (SM copy {min(roof) / 1e9:,.0f}-{max(roof) / 1e9:,.0f} GB/s)")
    else:
        lines.append("roofline at the row's largest T")
    for n, key, change, spread in slower:
        lines.append(f"SLOWER: {n} {key[1]} T = {key[2]}: {100 * change:+.1f} % (noise {100 * spread:.1f} %)")
    return lines, slower


def main(argv):
    base = None
    fail = False
    args = []
    it = iter(argv)
    for a in it:
        if a == "--base":
            base = next(it, None)
        elif a == "--fail-slower":
            fail = True
        elif a in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            args.append(a)
    if not args:
        sys.exit(__doc__)
    builds = load_builds(args)
    if base is None:
        base = next(iter(builds))
    if base not in builds:
        sys.exit(f"bench_builds: --base {base}: no such build (have {', '.join(builds)})")
    lines, slower = table(builds, base)
    print("\n".join(lines))
    return 1 if fail and slower else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
