#!/usr/bin/env python3
"""Comparison table for docs/benchmarks.md: ours and the peers on one GPU.

Reads the JSON of `dsv4-kvcache bench --backend cuda --out bench.json` and of
`scripts/peers/seed_bench.py --out seed_bench.json` (run on the same GPU, one
after the other) and prints, per op and T, "ours / Triton = speed-up" in µs per
launch, plus each op's share of the SM copy roofline at the largest T.

Usage:
    python3 scripts/bench_compare.py bench.json seed_bench.json
"""
import json
import sys

# bench op name -> seed_bench op name, and what the Triton side is.
PAIRS = [
    ("insert mxfp8", "seed insert MXFP8 (528 B)", "seed kernel"),
    ("insert nvfp4", "seed insert NVFP4 (288 B)", "seed kernel"),
    ("insert v4", "own insert V4 (584 B)", "own, from the spec"),
    ("insert bf16", "own insert BF16 rows", "own, from the spec"),
    ("insert fp8", "own insert FP8 rows", "own, from the spec"),
    ("compress CR1", "own save/compress/norm CR1", "own, from the spec"),
    ("compress CR2, T one-token requests", "own save/compress/norm CR2, T one-token requests",
     "own, from the spec"),
    ("compress CR2, T/2 two-token requests", "own save/compress/norm CR2, T/2 two-token requests",
     "own, from the spec"),
    ("compress CR2, 4 requests of T/4", "own save/compress/norm CR2, 4 requests of T/4",
     "own, from the spec"),
]


def main(ours_path, seed_path):
    ours = json.load(open(ours_path))
    seed = json.load(open(seed_path))
    us = {(r["op"], r["tokens"]): r["us_per_launch"] for r in ours["rows"]}
    frac = {(r["op"], r["tokens"]): r["fraction_of_roofline"] for r in ours["rows"]}
    tokens = [int(t) for t in seed["tokens"]]
    print("| op | Triton baseline | " + " | ".join(f"T = {t}" for t in tokens) + " |")
    print("| --- | --- |" + " ---: |" * len(tokens))
    for op, sop, kind in PAIRS:
        cells = []
        for t in tokens:
            a = us.get((op, t))
            b = seed["us_per_launch"].get(sop, {}).get(str(t))
            if a is None or b is None:
                cells.append("—")
            else:
                cells.append(f"{a:.2f} / {b:.2f} = **{b / a:.2f}x**")
        print(f"| {op} | {kind} | " + " | ".join(cells) + " |")
    roof = ours["roofline_bytes_per_s"] / 1e12
    engine = ours["copy_engine_bytes_per_s"] / 1e12
    seed_copy = max(v["TB_per_s_read_plus_write"] for v in seed["copy"].values())
    big = max(tokens)
    print()
    print(
        f"roofline: SM copy {roof:.3f} TB/s; copy engine {engine:.3f} TB/s (ours), "
        f"{seed_copy:.3f} TB/s (PyTorch graph copy)"
    )
    for op, _, _ in PAIRS:
        if (op, big) in frac:
            print(f"  {op} at T = {big}: {100 * frac[(op, big)]:.1f} % of roofline")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
