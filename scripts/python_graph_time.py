#!/usr/bin/env python3
"""GPU time per launch through the Python package against the Rust bench,
on identical inputs.

For each row, `dsv4-kvcache capture` writes the inputs the bench builds for
that row (same case generator, same seed: `0xbe4c + T`, two ring rows, four
requests; gathers in the slot form from random bytes, the bench's
"gather L, random bytes" rows), this script loads them into CUDA tensors,
captures 20 calls of the package's function in a CUDA graph and times
replays (median of 7, per launch), and runs the bench's row in the same
process tree right after. Both outputs are checked against the file's CPU
reference first. With --marginal, both sides are also timed at 40 launches
per graph, and the marginal launch ((time of 40 - time of 20) / 20) is
printed beside them: the per-replay cost of each harness drops out.

Usage:
    PYTHONPATH=SITE python3 scripts/python_graph_time.py --bin path/to/dsv4-kvcache [--tokens 1,1024,8192,65536]
"""

import argparse
import os
import subprocess
import sys
import tempfile

import torch

import dsv4_kvcache as dk

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python", "tests"))
from cases import load_vectors as load  # noqa: E402
from graph_timing import graph_us  # noqa: E402

LAUNCHES, REPLAYS = 20, 7


def bench_us(binary, label, t, launches=LAUNCHES):
    out = subprocess.run([binary, "bench", "--backend", "cuda", "--only", label, "--tokens", str(t), "--copy-mib", "64",
                          "--launches", str(launches)],
                         check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 2 and cells[0] == label and cells[1] == str(t):
            return float(cells[2])
    raise RuntimeError(f"no bench row {label!r} at T = {t}:\n{out}")


def same(a, b):
    return torch.equal(a.cpu().contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--tokens", default="1,1024,8192,65536")
    ap.add_argument("--marginal", action="store_true", help="also the marginal launch of both (20 and 40 per graph)")
    a = ap.parse_args()
    print("backend:", dk.init("cuda"))
    extra_head = " package, marginal µs | bench, marginal µs |" if a.marginal else ""
    print("| op | T | package, graph replay µs | Rust bench µs | package / bench |" + extra_head)
    print("| --- | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if a.marginal else ""))
    tmp = tempfile.mkdtemp()
    for t in [int(x) for x in a.tokens.split(",")]:
        seed = 0xBE4C + t
        for op, layout in [("rope_quant_insert", l) for l in ["mxfp8", "nvfp4", "v4", "bf16", "fp8"]] + \
                          [("gather_dequant", l) for l in ["mxfp8", "nvfp4", "v4", "bf16", "fp8"]]:
            path = os.path.join(tmp, f"{op}_{layout}_{t}.safetensors")
            extra = ["--requests", "0"] if op == "gather_dequant" else ["--requests", "4"]
            subprocess.run([a.bin, "capture", "--op", op, "--layout", layout, "--tokens", str(t),
                            "--seed", str(seed), "--ring-capacity", "2", "--out", path] + extra,
                           check=True, capture_output=True)
            meta, f = load(path)
            d = {k[3:]: v.cuda() for k, v in f.items() if k.startswith("in.")}
            if op == "rope_quant_insert":
                out_name, want = "kv_cache", f["out.kv_cache"]
                def call():
                    dk.rope_quant_insert(d["latent"], d["positions"], d["cos_sin"], d["kv_cache"],
                                         d["slot_mapping"], int(meta["compress_ratio"]),
                                         fp8_scale=d.get("fp8_scale"), sanitize=False)
                label = f"insert {layout}"
            else:
                out_name, want = "out", f["out.out"]
                def call():
                    dk.gather_dequant(d["kv_cache"], d["out"], d["slot_mapping"], fp8_scale=d.get("fp8_scale"))
                label = f"gather {layout}, random bytes"
            call()
            torch.cuda.synchronize()
            ok = same(d[out_name], want)
            us = graph_us(call, LAUNCHES, REPLAYS)
            rust = bench_us(a.bin, label, t)
            row = f"| {label} | {t} | {us:.2f} | {rust:.2f} | {us / rust:.3f}{'' if ok else ' (OUTPUT DIFFERS)'} |"
            if a.marginal:
                us40, rust40 = graph_us(call, 2 * LAUNCHES, REPLAYS), bench_us(a.bin, label, t, 2 * LAUNCHES)
                row += f" {2 * us40 - us:.2f} | {2 * rust40 - rust:.2f} |"
            print(row)


if __name__ == "__main__":
    main()
