"""The context-parallel protocol of python/examples/context_parallel.py,
checked and timed over torch.distributed (docs/context_parallel.md).

Every rank's latents, ring and cache are compared exactly, after every
step, with one process that ran the same steps whole from the same bytes:

- latents: its local rows equal the single process's rows of the same
  tokens (written rows and untouched canary rows alike);
- ring: the rows it stored (owned rows, the tail row, every decode row)
  equal the single process's, and every other ring byte is unchanged;
- cache: the records it inserted equal the single process's, and every
  other byte is unchanged. Each record lives on exactly one rank; every
  byte the single process changed is covered by some rank's records.

test_context_parallel.py runs the scenarios (``ci_scenarios``) through
``launch``. ``--bench`` times one prefill step of a long request split
evenly across the ranks against one device doing the whole chunk. NCCL
runs keep NVLink multicast off (``NCCL_NVLS_ENABLE=0``).

Usage:
    python python/tests/context_parallel_check.py --world 3             # gloo, CPU backend
    torchrun --nproc-per-node 2 python/tests/context_parallel_check.py --device cuda [--bench]
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.distributed as dist

import dsv4_kvcache as dk

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))

from context_parallel import (  # noqa: E402
    CR,
    EPS,
    WIDTH,
    _ix,
    cp_prefill_step,
    decode_step,
    local_share,
    prepare_prefill,
    ring_store_tokens,
)

LATENT = 512

# (dtype, record width) per cache layout; the uint8 widths select the paged
# FlashMLA layouts, 512-wide rows the plain FlashInfer ones.
LAYOUTS = {
    "v4": (torch.uint8, 584),
    "mxfp8": (torch.uint8, 528),
    "nvfp4": (torch.uint8, 288),
    "bf16": (torch.bfloat16, 512),
    "fp8": (torch.float8_e4m3fn, 512),
}
# Paged layouts: (value bytes, scale bytes) of one record.
PAGED = {584: (576, 8), 528: (512, 16), 288: (256, 32)}


# ---------------------------------------------------------------------------
# Scenario: requests, steps and how each prefill chunk is split.


@dataclass
class Step:
    """One scheduler step: a chunk per request, and (prefill) its split.

    ``cuts[r]`` has ``world + 1`` entries from 0 to the chunk length; rank
    ``k`` holds chunk offsets ``cuts[r][k] .. cuts[r][k + 1]``. ``padding``
    lists ``(request, offset)`` tokens whose ring and cache slots are -1.
    """

    decode: bool
    starts: List[int]
    lengths: List[int]
    cuts: List[List[int]] = field(default_factory=list)
    padding: List[tuple] = field(default_factory=list)


@dataclass
class Scenario:
    name: str
    layout: str
    capacity: int
    steps: List[Step]
    seed: int = 0
    fused: bool = False
    idx_dtype: torch.dtype = torch.int64
    page_size: int = 4

    @property
    def num_requests(self):
        return len(self.steps[0].lengths)

    @property
    def max_position(self):
        return max(s + n for st in self.steps for s, n in zip(st.starts, st.lengths))


def make_cuts(start, length, world, mode, request, g):
    """Cut points of request ``request``'s chunk (positions ``start ..
    start + length``) over ``world`` ranks."""
    if mode == "even":
        return [length * k // world for k in range(world + 1)]
    if mode == "first":  # everything on rank 0
        return [0] + [length] * world
    if mode == "last":  # everything on the last rank
        return [0] * world + [length]
    if mode == "random":
        inner = torch.randint(0, length + 1, (world - 1,), generator=g).tolist()
    elif mode == "odd":  # slices start on odd positions where the chunk allows
        odd = [c for c in range(1, length) if (start + c) % 2]
        if not odd:
            return [length * k // world for k in range(world + 1)]
        inner = [odd[i] for i in torch.randint(0, len(odd), (world - 1,), generator=g).tolist()]
    elif mode == "one_empty":  # rank request % world gets nothing, the rest split evenly
        empty = request % world
        others = [length * k // (world - 1) for k in range(world)]
        return others[:empty + 1] + others[empty:]
    else:
        raise ValueError(f"split mode: {mode}")
    return [0] + sorted(inner) + [length]


def chunked_steps(world, mode, seed, lengths_per_step, first_starts, decode_steps, padding=()):
    """Prefill steps with the given chunk lengths (positions continue from
    ``first_starts``), each split by ``mode``, then decode steps."""
    g = torch.Generator().manual_seed(seed)
    steps = []
    pos = list(first_starts)
    for i, lengths in enumerate(lengths_per_step):
        cuts = [make_cuts(p, n, world, mode, r, g) for r, (p, n) in enumerate(zip(pos, lengths))]
        pad = [p for p in padding if p[0] == i]
        steps.append(Step(False, list(pos), list(lengths), cuts, [(r, o) for _, r, o in pad]))
        pos = [p + n for p, n in zip(pos, lengths)]
    for _ in range(decode_steps):
        steps.append(Step(True, list(pos), [1] * len(pos)))
        pos = [p + 1 for p in pos]
    return steps


SPLIT_MODES = ["even", "random", "odd", "first", "last", "one_empty"]


def ci_scenarios(world):
    """The scenarios the CI test runs: every layout, several splits, the
    two-call and fused paths, int32 and int64 indices, chunked prefill with
    odd chunk starts, short and empty chunks, padding tokens, decode."""
    out = []
    # Request 0 long; 1 shorter than any world; 2 one token; 3 starts empty;
    # chunk starts 0, 5 (odd: reads the ring), 3, 0, 1.
    lengths = [[13, 2, 1, 0, 7], [6, 9, 2, 3, 1]]
    starts = [0, 5, 3, 0, 1]
    # A padding token among the last ring rows of request 0 in step 1, and
    # request 4's first token in step 0 (then its chunk stores no ring rows).
    padding = [(1, 0, 4), (0, 4, 0)]
    i = 0
    for layout in LAYOUTS:
        for m, mode in enumerate(SPLIT_MODES):
            fused = (m % 2) == 1
            cap = 4 if m % 3 else 3
            steps = chunked_steps(world, mode, seed=100 * world + m, lengths_per_step=lengths, first_starts=starts,
                                  decode_steps=3, padding=padding if m in (1, 2) else ())
            out.append(Scenario(f"{layout}/{mode}/cap{cap}/{'fused' if fused else 'two-call'}", layout, cap, steps,
                                seed=i, fused=fused, idx_dtype=torch.int32 if i % 2 else torch.int64))
            i += 1
    return out


# ---------------------------------------------------------------------------
# Tensors of a scenario: identical on every rank (seeded).


def _canary(shape, dtype, g):
    n = 1
    for s in shape:
        n *= s
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape)


class World:
    """Ring, cache, weights and per-request block tables of a scenario."""

    def __init__(self, sc: Scenario, device):
        g = torch.Generator().manual_seed(sc.seed)
        self.sc = sc
        self.device = device
        r = sc.num_requests
        # One ring block per request plus an unused one; pages likewise.
        self.ring_blocks = torch.randperm(r + 1, generator=g)[:r].tolist()
        records = (sc.max_position + 1) // CR + 1
        pages_per_req = -(-records // sc.page_size)
        num_pages = r * pages_per_req + 2
        perm = torch.randperm(num_pages, generator=g).tolist()
        self.page_tables = [perm[i * pages_per_req:(i + 1) * pages_per_req] for i in range(r)]
        dtype, w = LAYOUTS[sc.layout]
        self.ring = (torch.randn(r + 1, sc.capacity, WIDTH, generator=g) * 2).to(device)
        self.cache = _canary((num_pages, sc.page_size, w), dtype, g).to(device)
        self.weight = (torch.rand(LATENT, generator=g) + 0.5).bfloat16().to(device)
        ang = torch.rand(sc.max_position + 2, 32, generator=g) * 6.3
        self.cos_sin = torch.cat([ang.cos(), ang.sin()], 1).to(device)
        self.fp8_scale = torch.tensor([0.75], device=device) if sc.layout == "fp8" else None
        self.gen = g

    def ring_slot(self, r, p):
        return self.ring_blocks[r] * self.sc.capacity + p % self.sc.capacity

    def cache_slot(self, r, p):
        c = p // CR
        return self.page_tables[r][c // self.sc.page_size] * self.sc.page_size + c % self.sc.page_size


@dataclass
class Batch:
    """A step's whole batch (what one process would see)."""

    kv: torch.Tensor
    positions: torch.Tensor
    ring_slots: torch.Tensor
    cache_slots: torch.Tensor
    qsl: List[int]
    ttr: torch.Tensor
    latent: torch.Tensor  # canary rows: unwritten rows must keep them
    capacity: int  # ring rows per request
    # Host copies of the metadata (the scheduler's view).
    positions_list: List[int]
    ring_slots_list: List[int]
    cache_slots_list: List[int]
    req_list: List[int]


def make_batch(w: World, step: Step, device) -> Batch:
    pos, rs, cs, ttr, qsl = [], [], [], [], [0]
    pad = set(step.padding)
    for r, (s, n) in enumerate(zip(step.starts, step.lengths)):
        for o in range(n):
            p = s + o
            pos.append(p)
            ttr.append(r)
            skip = (r, o) in pad
            rs.append(-1 if skip else w.ring_slot(r, p))
            cs.append(-1 if skip else w.cache_slot(r, p))
        qsl.append(qsl[-1] + n)
    t = len(pos)
    g = w.gen
    kv = torch.randn(t, WIDTH, generator=g)
    # Scores of varied scale, so the pooling weights are not all near 1/2.
    kv[:, LATENT:] *= torch.exp2(torch.randint(-3, 4, (t, 1), generator=g).float())
    latent = _canary((t, LATENT), torch.bfloat16, g)

    def idx(v):
        return torch.tensor(v, dtype=torch.int64).to(device)

    return Batch(kv.to(device), idx(pos), idx(rs), idx(cs), qsl, idx(ttr), latent.to(device), w.sc.capacity,
                 pos, rs, cs, ttr)


def single_process_step(w: World, b: Batch, ring, cache):
    """The reference: the whole batch in one call through the ring."""
    latent = b.latent.clone()
    dk.fused_save_compress_norm(b.kv, b.positions, ring, b.ring_slots, _ix(b.qsl, torch.int64, w.device), b.ttr,
                                w.weight, EPS, CR, latent)
    dk.rope_quant_insert(latent, b.positions, w.cos_sin, cache, b.cache_slots, CR, w.fp8_scale)
    return latent


# ---------------------------------------------------------------------------
# Checking.


def _bytes(t):
    return t.contiguous().view(-1).view(torch.uint8)


def _first_diff(a, b):
    d = (_bytes(a) != _bytes(b)).nonzero()
    return int(d[0]) if d.numel() else None


def record_mask(cache, slots) -> torch.Tensor:
    """Boolean mask over the cache's bytes ([pages, page bytes]) of the
    records at ``slots``."""
    pages, bs, w = cache.shape
    es = cache.element_size()
    page_bytes = bs * w * es
    m = torch.zeros(pages, page_bytes, dtype=torch.bool)
    for s in slots:
        page, row = divmod(int(s), bs)
        if w in PAGED and cache.dtype == torch.uint8:
            v, sb = PAGED[w]
            m[page, row * v:(row + 1) * v] = True
            m[page, bs * v + row * sb:bs * v + (row + 1) * sb] = True
        else:
            m[page, row * w * es:(row + 1) * w * es] = True
    return m


def ring_mask(ring, slots) -> torch.Tensor:
    blocks, cap, _ = ring.shape
    m = torch.zeros(blocks, cap, dtype=torch.bool)
    for s in slots:
        m[int(s) // cap, int(s) % cap] = True
    return m


def _record_slots(b: Batch, tokens) -> List[int]:
    cs, pos = b.cache_slots_list, b.positions_list
    return [cs[t] for t in tokens if cs[t] >= 0 and (pos[t] + 1) % CR == 0]


class Mismatch(AssertionError):
    pass


def _expect(cond, what):
    if not cond:
        raise Mismatch(what)


def run_scenario(sc: Scenario, rank: int, world: int, device) -> dict:
    """Runs the scenario's steps on this rank and in a single process (here,
    on its own buffers), comparing after every step. Returns counts."""
    w = World(sc, device)
    ring, cache = w.ring.clone(), w.cache.clone()
    ref_ring, ref_cache = w.ring.clone(), w.cache.clone()
    exp_ring, exp_cache = w.ring.cpu().clone(), w.cache.cpu().clone()
    stats = dict(steps=0, latents=0, records=0, ring_rows=0, prev_rows_reads=0, odd_slice_starts=0)
    dk.take_skip_counts(device)
    for si, step in enumerate(sc.steps):
        b = make_batch(w, step, device)
        where = f"{sc.name} step {si} ({'decode' if step.decode else 'prefill'}) rank {rank}/{world}"
        ref_ring_before, ref_cache_before = ref_ring.cpu().clone(), ref_cache.cpu().clone()
        ref_latent = single_process_step(w, b, ref_ring, ref_cache)
        r_count = len(step.lengths)
        everything = range(len(b.positions_list))
        if step.decode:
            latent = decode_step(w, b, rank, world, ring, cache)
            ref_rows = ref_latent
            stored = [b.ring_slots_list[t] for r in range(r_count) for t in ring_store_tokens(b, r)]
            per_rank_ring = [stored] * world
            per_rank_tokens = [[t for t in everything if b.req_list[t] % world == k] for k in range(world)]
            per_rank_records = [_record_slots(b, tokens) for tokens in per_rank_tokens]
        else:
            x = prepare_prefill(w, step, b, rank, world)
            cp_prefill_step(w, x, world, ring, cache)
            latent = x["latent"]
            loc = x["share"]
            ref_rows = ref_latent.index_select(0, _ix(loc.tokens, torch.int64, device))
            shares = [local_share(step, b, k, world) for k in range(world)]
            per_rank_ring = [[b.ring_slots_list[t] for t in s.ring_own] + [x for _, x in s.ring_tail] for s in shares]
            per_rank_tokens = [s.tokens for s in shares]
            per_rank_records = [_record_slots(b, s.tokens) for s in shares]
            stats["prev_rows_reads"] += sum(1 for i in loc.prev_row_indices if i >= 0)
            stats["odd_slice_starts"] += sum(
                1 for r in range(r_count)
                if step.cuts[r][rank + 1] > step.cuts[r][rank] > 0 and (step.starts[r] + step.cuts[r][rank]) % 2)
        counts = dk.take_skip_counts(device)
        _expect(tuple(counts) == (0, 0, 0), f"{where}: tokens skipped for out-of-range indices: {counts}")

        # Latents: every local row (written or canary) as in one process.
        d = _first_diff(latent, ref_rows)
        _expect(d is None, f"{where}: latent byte {d} differs from the single process")
        stats["latents"] += sum(1 for t in per_rank_tokens[rank]
                                if b.ring_slots_list[t] >= 0 and (b.positions_list[t] + 1) % CR == 0)

        # Ring: the rows this rank stored equal the single process's; the
        # rest is unchanged. Every row the single process changed has a rank.
        ref_ring_now = ref_ring.cpu()
        rm = ring_mask(exp_ring, per_rank_ring[rank])
        exp_ring[rm] = ref_ring_now[rm]
        d = _first_diff(ring.cpu(), exp_ring)
        _expect(d is None, f"{where}: ring byte {d} differs (rows stored here: {per_rank_ring[rank]})")
        changed = (ref_ring_now.view(torch.int32) != ref_ring_before.view(torch.int32)).any(-1)
        covered = torch.zeros_like(changed)
        for k in range(world):
            covered |= ring_mask(exp_ring, per_rank_ring[k])
        _expect(not bool((changed & ~covered).any()), f"{where}: the single process stored a ring row no rank stores")
        stats["ring_rows"] += len(per_rank_ring[rank])

        # Cache: this rank's records equal the single process's; the rest is
        # unchanged; records are partitioned over the ranks and cover every
        # byte the single process changed.
        ref_cache_now = ref_cache.cpu()
        cm = record_mask(exp_cache, per_rank_records[rank])
        eb, rb = _bytes(exp_cache).view(cm.shape), _bytes(ref_cache_now).view(cm.shape)
        eb[cm] = rb[cm]
        d = _first_diff(cache.cpu(), exp_cache)
        _expect(d is None, f"{where}: cache byte {d} differs (records here: {per_rank_records[rank]})")
        _expect(sorted(sum(per_rank_records, [])) == sorted(_record_slots(b, everything)),
                f"{where}: records are not partitioned over the ranks")
        union = torch.zeros_like(cm)
        for k in range(world):
            union |= record_mask(exp_cache, per_rank_records[k])
        changed = rb != _bytes(ref_cache_before).view(cm.shape)
        _expect(not bool((changed & ~union).any()), f"{where}: the single process wrote bytes outside every record")
        stats["records"] += len(per_rank_records[rank])
        stats["steps"] += 1
    return stats


# ---------------------------------------------------------------------------
# Timing: one prefill step of one long request.


def bench(rank, world, device, tokens, layout, iters, fused):
    """One prefill step of a ``tokens``-long request split evenly over the
    ranks (boundary all-gather, compress, ring rows, insert) against one
    device compressing the whole chunk through the ring. Checks the step's
    result like ``run_scenario`` first. Returns timings (rank 0)."""
    # Starting on position 1 puts the first token and, for an even split,
    # every slice boundary on an odd position: the ring and prev_rows paths.
    steps = [Step(False, [1], [tokens], [[tokens * k // world for k in range(world + 1)]])]
    sc = Scenario(f"bench/{layout}", layout, 4, steps, seed=7, fused=fused, page_size=64)
    check = run_scenario(sc, rank, world, device)
    w = World(sc, device)
    b = make_batch(w, steps[0], device)
    x = prepare_prefill(w, steps[0], b, rank, world)
    ring, cache = w.ring.clone(), w.cache.clone()
    qsl_all = _ix(b.qsl, torch.int64, device)

    def cp():
        cp_prefill_step(w, x, world, ring, cache)

    def whole():
        latent = b.latent
        if fused:
            dk.fused_compress_insert(b.kv, b.positions, ring, b.ring_slots, qsl_all, b.ttr, w.weight, EPS, CR, latent,
                                     w.cos_sin, cache, b.cache_slots, w.fp8_scale)
        else:
            dk.fused_save_compress_norm(b.kv, b.positions, ring, b.ring_slots, qsl_all, b.ttr, w.weight, EPS, CR,
                                        latent)
            dk.rope_quant_insert(latent, b.positions, w.cos_sin, cache, b.cache_slots, CR, w.fp8_scale)

    def timed(fn, n):
        """Microseconds per call, each started together after a barrier:
        CUDA events on a GPU, the host clock on the CPU (which only
        exercises this path: the CPU reference is not what a GPU run times)."""
        out = []
        for _ in range(n):
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                e.record()
                e.synchronize()
                out.append(a.elapsed_time(e) * 1000.0)
            else:
                t0 = time.perf_counter()
                fn()
                out.append((time.perf_counter() - t0) * 1e6)
        return out

    timed(cp, 3)
    cp_us = timed(cp, iters)
    # Every rank times the whole chunk on its own device at once; rank 0's
    # is the number reported (the others keep the barriers in step).
    timed(whole, 3)
    whole_us = timed(whole, iters)
    med = torch.tensor([statistics.median(cp_us), statistics.median(whole_us)], device=device)
    per_rank = _gather_small(med, world)
    return dict(tokens=tokens, world=world, layout=layout, fused=fused, iters=iters,
                cp_step_us_per_rank=[round(float(x[0]), 1) for x in per_rank],
                cp_step_us=round(float(per_rank[:, 0].max()), 1),
                one_device_us=round(float(per_rank[0, 1]), 1), check=check,
                device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")


def _gather_small(t, world):
    out = torch.empty(world, t.numel(), dtype=t.dtype, device=t.device)
    dist.all_gather_into_tensor(out, t.view(1, -1))
    return out.cpu()


# ---------------------------------------------------------------------------
# Process setup.


def _device_for(device_kind, local_rank):
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def worker(rank, world, cfg):
    """One rank: joins the group, runs the scenarios (or the timing), and
    rank 0 writes the summary to ``cfg['out']`` when given."""
    if cfg["backend"] == "nccl":
        os.environ["NCCL_NVLS_ENABLE"] = "0"
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if cfg["device"] == "cpu":
        # Ranks share the host's cores; intra-op threads would only contend.
        torch.set_num_threads(1)
    device = _device_for(cfg["device"], local_rank)
    kw = dict(backend=cfg["backend"], rank=rank, world_size=world, timeout=datetime.timedelta(seconds=cfg["timeout"]))
    if cfg.get("init_file"):
        kw["init_method"] = "file://" + cfg["init_file"]
    if cfg["backend"] == "nccl":
        kw["device_id"] = device
    dist.init_process_group(**kw)
    try:
        _run_rank(rank, world, device, cfg)
    except Exception as e:
        # The launcher reports the first process that exited, which may be
        # a peer that lost its connection; name the real failure here.
        print(f"rank {rank}/{world} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        raise
    finally:
        dist.destroy_process_group()


def _run_rank(rank, world, device, cfg):
    """The rank's work: the checked scenarios, or the timing."""
    if cfg["bench"]:
        summary = bench(rank, world, device, cfg["tokens"], cfg["layout"], cfg["iters"], cfg["fused"])
    else:
        totals = {}
        names = []
        for sc in ci_scenarios(world):
            if cfg["layout"] not in (None, "all", sc.layout):
                continue
            for k, v in run_scenario(sc, rank, world, device).items():
                totals[k] = totals.get(k, 0) + v
            names.append(sc.name)
        keys = sorted(totals)
        mine = torch.tensor([float(totals[k]) for k in keys], device=device)
        per_rank = [dict(zip(keys, (int(v) for v in row))) for row in _gather_small(mine, world).tolist()]
        summary = dict(world=world, backend=cfg["backend"], device=str(device.type), scenarios=len(names),
                       per_rank=per_rank)
    # Every rank got here without a mismatch.
    dist.barrier()
    if rank == 0:
        if cfg.get("out"):
            with open(cfg["out"], "w", encoding="utf-8") as f:
                json.dump(summary, f)
        print(("PASS " if not cfg["bench"] else "") + json.dumps(summary), flush=True)


def skip_reason(device_kind, backend, world) -> Optional[str]:
    """Why this configuration cannot run here, or None."""
    if world < 2:
        return f"context parallelism needs at least 2 ranks, got {world}"
    if not dist.is_available():
        return "torch.distributed is not available in this torch build"
    if backend == "nccl" and not dist.is_nccl_available():
        return "this torch build has no NCCL"
    if backend == "gloo" and not dist.is_gloo_available():
        return "this torch build has no gloo"
    if device_kind == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < world:
            return f"needs {world} GPUs (one process per GPU), found {n}"
    return None


def launch(world, cfg):
    """Starts ``world`` processes (file rendezvous in a temporary folder).
    CPU runs fork them from a server that imported torch and this module
    once (each fresh interpreter would import torch again, seconds on a
    small machine); GPU runs spawn fresh ones."""
    import multiprocessing

    import torch.multiprocessing as mp

    method = "spawn"
    if cfg["device"] == "cpu" and "forkserver" in multiprocessing.get_all_start_methods():
        method = "forkserver"
        multiprocessing.get_context(method).set_forkserver_preload(["torch", "dsv4_kvcache", __name__])
    with tempfile.TemporaryDirectory() as tmp:
        cfg = dict(cfg, init_file=os.path.join(tmp, "rendezvous"))
        mp.start_processes(worker, args=(world, cfg), nprocs=world, join=True, start_method=method)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--world", type=int, default=2, help="ranks to spawn (ignored under torchrun)")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default=None, help="default: nccl on cuda, gloo on cpu")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--layout", default=None, help="one layout (v4, mxfp8, nvfp4, bf16, fp8); default all "
                                                   "(checks), mxfp8 (--bench)")
    ap.add_argument("--bench", action="store_true", help="time one long prefill step against one device (on the "
                                                       "CPU it only exercises the path)")
    ap.add_argument("--tokens", type=int, default=65536, help="--bench: the request's chunk length")
    ap.add_argument("--iters", type=int, default=20, help="--bench: timed repetitions")
    ap.add_argument("--fused", action="store_true", help="--bench: fused_compress_insert instead of two calls")
    ap.add_argument("--out", default=None, help="write the summary JSON here (rank 0)")
    ap.add_argument("--timeout", type=int, default=300, help="collective timeout in seconds")
    a = ap.parse_args(argv)
    backend = a.backend or ("nccl" if a.device == "cuda" else "gloo")
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    world = int(os.environ["WORLD_SIZE"]) if under_torchrun else a.world
    reason = skip_reason(a.device, backend, world)
    if reason:
        print(f"SKIPPED: {reason}")
        return 0
    cfg = dict(backend=backend, device=a.device, bench=a.bench, tokens=a.tokens, iters=a.iters, fused=a.fused,
               layout=a.layout or ("mxfp8" if a.bench else None), out=a.out, timeout=a.timeout)
    if under_torchrun:
        worker(int(os.environ["RANK"]), world, cfg)
    else:
        launch(world, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
