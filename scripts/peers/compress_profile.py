"""Runs seed_bench.py's compressor ops (the package's and the Triton peer's,
on the same tensors) once each inside a CUDA profiler range, so that Nsight
Compute profiles exactly those launches side by side.

Usage:
    ncu --profile-from-start off --section SpeedOfLight --section LaunchStats \
        --section Occupancy --section WarpStateStats --csv --page details \
        python3 scripts/peers/compress_profile.py --tokens 16,1024 --match CR1

Every op is called twice before the range (Triton's compile, the package's
first launch), then once inside it, in seed_bench's order. Without ncu the
script only prints the labels it would profile (a dry run for the CPU)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import seed_bench  # noqa: E402
import seedlib  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed-doc", default=seedlib.DEFAULT_SEED_DOC)
    ap.add_argument("--tokens", default="16,1024")
    ap.add_argument("--match", default="CR1",
                    help="comma-separated substrings; an op is profiled if its label holds one")
    ap.add_argument("--warps", default="1,2,4,8", help="the peer's num_warps to profile")
    args = ap.parse_args()

    kernels, _ = seedlib.load_seed_kernels(args.seed_doc)
    seed_bench.KERNELS.update(kernels)
    dev = torch.device("cuda")
    wants = [m for m in args.match.split(",") if m]
    warps = {f"nw={w}" for w in args.warps.split(",") if w}
    for T in (int(x) for x in args.tokens.split(",") if x):
        ops = seed_bench.build_ops(T, dev, True, tune_warps=True, ours=True)
        chosen = [(label, fn) for label, (kind, fn) in ops.items()
                  if kind in ("own", "ours") and "compress" in label and any(m in label for m in wants)
                  and (kind == "ours" or label.rsplit(" ", 1)[-1] in warps)]
        for label, fn in chosen:
            fn()
            fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        for label, fn in chosen:
            print(f"T={T} {label}", flush=True)
            fn()
            torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        del ops
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
