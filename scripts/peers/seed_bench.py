#!/usr/bin/env python3
"""Time the seed's V4.1 insert kernels as performance anchors (anchors.md method).

GPU time per launch in microseconds: a CUDA graph of 20 launches, replayed 7
times (each replay timed with CUDA events), median replay / 20. Inputs: random
normal BF16 latents, positions 0..T-1, CR1, slots a random permutation of a
64-row-per-block paged cache sized to T, cos_sin a real RoPE table [T, 64].

Rows:
- seed MXFP8 / NVFP4 insert: the seed's own kernels, cut out of the seed
  document at run time (seedlib.py); NVFP4 uses this project's e2m1 helper.
- device-to-device copy of 1 GiB and 2 GiB, same timing, reported in TB/s
  counting bytes read plus bytes written (the roofline).
- "own Triton baseline written from the spec" (own_baselines.py; not seed
  code): V4 584 B insert, BF16-rows insert, FP8-rows insert, CR1
  save/compress/norm, and CR2 save/compress/norm (T one-token requests, T/2
  two-token requests and 4 requests of T/4, ring of 2 rows, the inputs of
  `dsv4-kvcache bench`; the pooling's exp is semantics.md's, not tl.exp; the
  seed docstring's grid: a program per request, then one per pair of tokens).
  Skip with --no-baselines; a failing baseline is reported and skipped, it
  never stops the seed rows.
- --ours: this package's fused_save_compress_norm on the peers' very tensors
  (rows "ours ..."), so the compressor comparison is made in one process on
  identical inputs; with --rounds R every op of a T is timed R times, the
  order reversed in every other round, and its best median kept (an
  interleaved comparison, neither side always first).

Usage:
GPU host:  python3 scripts/peers/seed_bench.py --seed-doc .carry/seed.txt --out $OUT/seed_bench.json
CPU smoke: TRITON_INTERPRET=1 python3 scripts/peers/seed_bench.py --device cpu --smoke
           (runs every op once at small T, no timing)
"""

import argparse
import json
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import triton  # noqa: E402

import own_baselines  # noqa: E402
from graph_timing import graph_times  # noqa: E402
import seedlib  # noqa: E402

TOKENS = (1, 16, 128, 1024, 8192, 65536)
LAUNCHES = 20
REPLAYS = 7
BLOCK_SIZE = 64


def time_graph(fn, launches=LAUNCHES, replays=REPLAYS):
    """Per-launch GPU time in microseconds: median over `replays` replays of a
    CUDA graph holding `launches` calls of fn, divided by `launches`
    (scripts/graph_timing.py), and every replay's."""
    fn()  # compile / warm up outside the graph
    torch.cuda.synchronize()
    per_launch = graph_times(fn, launches, replays)
    return statistics.median(per_launch), per_launch


def make_inputs(T, dev, gen_seed=1234):
    g = torch.Generator(device="cpu").manual_seed(gen_seed + T)
    latent = torch.randn(T, 512, generator=g).to(torch.bfloat16).to(dev)
    positions = torch.arange(T, dtype=torch.int64).to(dev)
    cos_sin = torch.from_numpy(seedlib.rope_table(max(T, 1))).to(dev)
    num_blocks = -(-T // BLOCK_SIZE)
    slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=g)[:T].to(torch.int64).to(dev)
    return latent, positions, cos_sin, slots, num_blocks, g


def build_ops(T, dev, baselines, tune_warps=False, ours=False):
    """{label: (kind, zero-arg callable)}; kind is 'seed', 'own' or 'ours'."""
    latent, positions, cos_sin, slots, nb, g = make_inputs(T, dev)
    pkg = _ours() if ours else None
    ops = {}
    for layout in ("mxfp8", "nvfp4"):
        cache = torch.zeros(nb, BLOCK_SIZE, seedlib.RECORD_WIDTH[layout], dtype=torch.uint8, device=dev)
        kern = KERNELS[seedlib.KERNEL_FOR_LAYOUT[layout]]
        label = f"seed insert {layout.upper()} ({seedlib.RECORD_WIDTH[layout]} B)"
        ops[label] = ("seed", lambda k=kern, c=cache: seedlib.launch_seed(
            k, latent, positions, cos_sin, c, slots, 1, False))
    if baselines:
        v4 = torch.zeros(nb, BLOCK_SIZE, 584, dtype=torch.uint8, device=dev)
        ops["own insert V4 (584 B)"] = ("own", lambda: own_baselines.v4_insert(
            latent, positions, cos_sin, v4, slots, 1))
        bf = torch.zeros(nb, BLOCK_SIZE, 512, dtype=torch.bfloat16, device=dev)
        ops["own insert BF16 rows"] = ("own", lambda: own_baselines.rows_insert(
            latent, positions, cos_sin, bf, slots, 1))
        f8 = torch.zeros(nb, BLOCK_SIZE, 512, dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
        scale = torch.tensor([0.0625], dtype=torch.float32, device=dev)
        ops["own insert FP8 rows"] = ("own", lambda: own_baselines.rows_insert(
            latent, positions, cos_sin, f8, slots, 1, scale))
        kv = torch.randn(T, 512, generator=g).to(dev)
        w = (1.0 + 0.1 * torch.randn(512, generator=g)).to(torch.bfloat16).to(dev)
        out = torch.zeros(T, 512, dtype=torch.bfloat16, device=dev)
        # With --tune-warps every launch width is a row of its own ("... nw=N");
        # the peer's figure is the best of them (see TUNED below).
        widths = own_baselines.TUNE_WARPS if tune_warps else (4,)
        sfx = (lambda nw: f" nw={nw}") if tune_warps else (lambda nw: "")
        for nw in widths:
            ops["own save/compress/norm CR1" + sfx(nw)] = ("own", lambda nw=nw: own_baselines.norm_cr1(
                kv, slots, w, 1e-6, out, num_warps=nw))
        if ours:
            ops["ours save/compress/norm CR1"] = ("ours", lambda: pkg.fused_save_compress_norm(
                kv, positions, None, slots, None, None, w, 1e-6, 1, out))
        for label, reqs in (("T one-token requests", T), ("T/2 two-token requests", max(T // 2, 1)),
                            ("4 requests of T/4", 4)):
            a = cr2_inputs(T, reqs, g, dev)
            for nw in widths:
                ops[f"own save/compress/norm CR2, {label}" + sfx(nw)] = (
                    "own", lambda a=a, nw=nw: own_baselines.compress_cr2(*a, w, 1e-6, out, num_warps=nw))
            if ours:
                kv2, pos2, slots2, qsl, ttr, ring = a
                ops[f"ours save/compress/norm CR2, {label}"] = ("ours", lambda kv2=kv2, pos2=pos2, slots2=slots2,
                                                                qsl=qsl, ttr=ttr, ring=ring: pkg.fused_save_compress_norm(
                    kv2, pos2, ring, slots2, qsl, ttr, w, 1e-6, 2, out))
    return ops


def _ours():
    """This package (dsv4_kvcache), imported on first use."""
    import dsv4_kvcache

    return dsv4_kvcache


def cr2_inputs(T, reqs, g, dev, cap=2):
    """The CR2 inputs of `dsv4-kvcache bench` (testkit::make_case):
    positions 0..T, T tokens split into `reqs` near-equal chunks, request r's
    ring rows r * cap .. r * cap + cap, slot = r * cap + p % cap."""
    sizes = [T // reqs + (1 if i < T % reqs else 0) for i in range(reqs)]
    qsl = [0]
    ttr, slots = [], []
    for r, n in enumerate(sizes):
        start = qsl[-1]
        for p in range(start, start + n):
            ttr.append(r)
            slots.append(r * cap + p % cap)
        qsl.append(start + n)
    kv = torch.randn(T, 1024, generator=g).to(dev)
    positions = torch.arange(T, dtype=torch.int64).to(dev)
    ring = torch.randn(reqs, cap, 1024, generator=g).to(dev)
    as_dev = lambda v: torch.tensor(v, dtype=torch.int64).to(dev)  # noqa: E731
    return kv, positions, as_dev(slots), as_dev(qsl), as_dev(ttr), ring


KERNELS = {}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed-doc", default=seedlib.DEFAULT_SEED_DOC)
    ap.add_argument("--out", default=None, help="JSON results file")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--copy-gib", default="1,2")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="run each op once, no timing (CPU/interpreter)")
    ap.add_argument("--ours", action="store_true",
                    help="time this package's compressor on the peers' tensors too (rows 'ours ...')")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time every op of a T this many times, reversing the order each round; keep the best")
    ap.add_argument("--tune-warps", action="store_true",
                    help="time the compressor peers at every num_warps of own_baselines.TUNE_WARPS and report the best")
    args = ap.parse_args()

    t_start = time.time()
    kernels, hashes = seedlib.load_seed_kernels(args.seed_doc)
    KERNELS.update(kernels)
    dev = torch.device(args.device)
    tokens = [int(x) for x in args.tokens.split(",") if x]
    if args.smoke:
        tokens = [t for t in tokens if t <= 128] or [16]

    info = {
        "method": f"CUDA graph of {LAUNCHES} launches, median of {REPLAYS} replays, GPU time per launch (us)",
        "inputs": "random normal BF16 latents, positions 0..T-1, CR1, sanitize off, slots a random "
                  "permutation of a 64-row-per-block paged cache sized to T, real RoPE table",
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "triton": triton.__version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "seed_kernel_sha256": hashes,
        "own_baselines": "own Triton baseline written from the spec (scripts/peers/own_baselines.py), not seed code",
    }
    results = {}  # label -> {T: us}
    kinds = {}
    errors = {}
    for T in tokens:
        ops = build_ops(T, dev, not args.no_baselines, args.tune_warps, args.ours)
        order = list(ops.items())
        for rnd in range(max(args.rounds, 1)):
            for label, (kind, fn) in order if rnd % 2 == 0 else order[::-1]:
                kinds[label] = kind
                if label in errors:
                    continue
                try:
                    if args.smoke:
                        fn()
                        us = float("nan")
                    else:
                        us, _ = time_graph(fn)
                except Exception as e:  # a failing op is reported, the others still run
                    if kind == "seed":
                        raise
                    errors.setdefault(label, f"T={T}: {e!r}")
                    traceback.print_exc()
                    continue
                best = results.setdefault(label, {}).get(T)
                results[label][T] = us if best is None or not us >= best else best
                print(f"  {label:40s} T={T:6d}  {us:9.2f} us (round {rnd})", flush=True)
        del ops
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    copies = {}
    if dev.type == "cuda" and not args.smoke:
        for gib in [float(x) for x in args.copy_gib.split(",") if x]:
            n = int(gib * (1 << 30))
            src = torch.empty(n, dtype=torch.uint8, device=dev)
            src.fill_(0x5A)
            dst = torch.empty_like(src)
            us, _ = time_graph(lambda: dst.copy_(src))
            tbps = 2 * n / (us * 1e-6) / 1e12
            copies[f"{gib:g} GiB"] = {"us": us, "TB_per_s_read_plus_write": tbps}
            print(f"  copy {gib:g} GiB: {us:.1f} us per copy, {tbps:.3f} TB/s (read+write)", flush=True)
            del src, dst
            torch.cuda.empty_cache()

    # The tuned peers: per op and T, the best launch width.
    tuned = {}
    for label, row in results.items():
        if " nw=" in label:
            base, nw = label.rsplit(" nw=", 1)
            for t, us in row.items():
                best = tuned.setdefault(base + " (best num_warps)", {}).get(t)
                if best is None or us < best[0]:
                    tuned[base + " (best num_warps)"][t] = (us, int(nw))
    for label, row in tuned.items():
        kinds[label] = "own"
        results[label] = {t: v[0] for t, v in row.items()}
        print(f"  {label}: " + ", ".join(f"T={t} {v[0]:.2f} us (nw={v[1]})" for t, v in row.items()), flush=True)

    lines = []
    lines.append(f"Device: {info['device']}; Triton {info['triton']}, PyTorch {info['torch']}, CUDA {info['cuda']}")
    lines.append(f"Method: {info['method']}. Inputs: {info['inputs']}.")
    lines.append("")
    lines.append("| op \\ tokens T | " + " | ".join(str(t) for t in tokens) + " |")
    lines.append("| --- |" + " --- |" * len(tokens))
    for label, row in results.items():
        name = label if kinds[label] in ("seed", "ours") else label + " [own Triton baseline written from the spec]"
        cells = [("%.2f" % row[t]) if t in row else "-" for t in tokens]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for k, v in copies.items():
        lines.append(f"- device-to-device copy {k}: {v['us']:.1f} us, {v['TB_per_s_read_plus_write']:.3f} TB/s "
                     "(bytes read + bytes written)")
    for k, v in errors.items():
        lines.append(f"- {k}: FAILED ({v})")
    table = "\n".join(lines)
    print()
    print(table)

    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"info": info, "tokens": tokens,
                       "us_per_launch": {k: {str(t): v for t, v in r.items()} for k, r in results.items()},
                       "kind": kinds, "copy": copies, "errors": errors, "markdown": table,
                       "wall_s": time.time() - t_start}, f, indent=1)
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
