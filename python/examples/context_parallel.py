"""Prefill context parallelism (PCP) for the CR2 compressor, over torch.distributed.

A request's chunk is split across the ranks of a process group; each rank
compresses its own slice, and the result is the same, bit for bit, as one
process compressing the whole chunk through the ring. This file is the
protocol (docs/context_parallel.md describes it step by step):
``local_share`` says what a rank holds and stores, ``prepare_prefill`` takes
its slice, ``cp_prefill_step`` runs steps 2 to 5, ``decode_step`` a decode.

The arguments are the step's metadata and tensors as a scheduler holds them:
``step`` (``lengths``, and ``cuts[r]``, the ``world + 1`` cut points of
request ``r``'s chunk), ``b`` (the whole batch: ``kv``, ``positions``,
``ring_slots``, ``cache_slots``, ``ttr``, ``latent``, ``qsl``, their host
copies and the ring capacity) and ``w`` (ring, cache, weights, and the
scenario's index dtype and two-call or fused path). The checker builds
them, compares every rank with one process and times a long step:

    python python/tests/context_parallel_check.py --world 3    # gloo, CPU
    torchrun --nproc-per-node 2 python/tests/context_parallel_check.py --device cuda [--bench]
"""

from dataclasses import dataclass
from typing import List

import torch
import torch.distributed as dist

import dsv4_kvcache as dk

CR = 2
EPS = 1e-6
WIDTH = 1024


def ring_store_tokens(b, r: int) -> List[int]:
    """Batch indices of the tokens whose rows one process stores to the ring
    for request ``r``: the chunk's last ``min(len, capacity)`` tokens with a
    ring slot ``>= 0``, none when the chunk is empty or its first slot < 0."""
    s, e = b.qsl[r], b.qsl[r + 1]
    rs = b.ring_slots_list
    if e == s or rs[s] < 0:
        return []
    return [t for t in range(max(s, e - b.capacity), e) if rs[t] >= 0]


@dataclass
class Local:
    """Rank ``k``'s share of a prefill step."""

    tokens: List[int]  # batch indices of its tokens, request by request
    qsl: List[int]
    prev_row_indices: List[int]
    ring_own: List[int]  # batch indices of the ring rows it owns
    ring_tail: List[tuple]  # (prev_rows row, ring slot) of tails it does not own


def local_share(step, b, rank: int, world: int) -> Local:
    """Rank ``rank``'s tokens and packed ``query_start_loc`` (protocol step
    1), its ``prev_row_indices`` (step 3) and the ring rows it stores (step 4)."""
    r_count = len(step.lengths)
    tokens, qsl, pri, own, tail = [], [0], [], [], []
    for r in range(r_count):
        cuts, s = step.cuts[r], b.qsl[r]
        a, e = cuts[rank], cuts[rank + 1]
        tokens.extend(range(s + a, s + e))
        qsl.append(qsl[-1] + e - a)
        earlier = [j for j in range(rank) if cuts[j + 1] > cuts[j]]
        # The token before the slice is the last row of the nearest earlier
        # rank with tokens; a slice that starts the chunk reads the ring.
        pri.append(earlier[-1] * r_count + r if a > 0 and e > a else -1)
        store = ring_store_tokens(b, r)
        own.extend(t for t in store if s + a <= t < s + e)
        last = b.qsl[r + 1] - 1
        if last in store and not (s + a <= last < s + e):
            holder = max(j for j in range(world) if cuts[j + 1] > cuts[j])
            tail.append((holder * r_count + r, b.ring_slots_list[last]))
    return Local(tokens, qsl, pri, own, tail)


def _ix(v, dtype, device):
    return torch.tensor(v, dtype=dtype).to(device)


def prepare_prefill(w, step, b, rank: int, world: int) -> dict:
    """Rank ``rank``'s slice of the step's batch and its metadata, on the
    device: what the rank holds and what the scheduler gives it."""
    dev, it = w.device, w.sc.idx_dtype
    loc = local_share(step, b, rank, world)
    tok = _ix(loc.tokens, torch.int64, dev)
    sizes = torch.tensor(loc.qsl).diff()
    local_of = {t: i for i, t in enumerate(loc.tokens)}
    write_slots = [b.ring_slots_list[t] for t in loc.ring_own] + [s for _, s in loc.ring_tail]
    return dict(
        share=loc, kv=b.kv.index_select(0, tok), latent=b.latent.index_select(0, tok),
        positions=b.positions.index_select(0, tok).to(it), ring_slots=b.ring_slots.index_select(0, tok).to(it),
        cache_slots=b.cache_slots.index_select(0, tok).to(it), qsl=_ix(loc.qsl, it, dev),
        ttr=torch.repeat_interleave(torch.arange(len(step.lengths)), sizes).to(it).to(dev),
        last_rows=(torch.tensor(loc.qsl[1:]) - 1).clamp(min=0).to(dev),  # each slice's last row (0: empty)
        nonempty=(sizes > 0).view(-1, 1).to(dev), prev_row_indices=_ix(loc.prev_row_indices, it, dev),
        ring_own=_ix([local_of[t] for t in loc.ring_own], torch.int64, dev),
        ring_tail=_ix([i for i, _ in loc.ring_tail], torch.int64, dev), ring_write_slots=_ix(write_slots, it, dev))


def cp_prefill_step(w, x: dict, world: int, ring, cache):
    """A rank's part of a context-parallel prefill step (steps 2 to 5 of the
    protocol) on ``x = prepare_prefill(...)``; writes ``x["latent"]``, the
    rank's ring and its cache."""
    kv, fused = x["kv"], w.sc.fused
    # Step 2: one boundary row per request (the slice's last row).
    if kv.shape[0]:
        boundary = torch.where(x["nonempty"], kv.index_select(0, x["last_rows"]), 0.0)
    else:
        boundary = torch.zeros(x["prev_row_indices"].numel(), WIDTH, device=kv.device)
    prev_rows = torch.empty(world * boundary.shape[0], WIDTH, dtype=boundary.dtype, device=boundary.device)
    dist.all_gather_into_tensor(prev_rows, boundary)
    # Step 3 (and 5 when fused).
    args = (kv, x["positions"], ring, x["ring_slots"], x["qsl"], x["ttr"], w.weight, EPS, CR, x["latent"])
    if fused:
        dk.fused_compress_insert(*args, w.cos_sin, cache, x["cache_slots"], w.fp8_scale, prev_rows,
                                 x["prev_row_indices"])
    else:
        dk.fused_save_compress_norm(*args, prev_rows, x["prev_row_indices"])
    # Step 4: owned ring rows, then the tails this rank does not hold.
    rows = torch.cat([kv.index_select(0, x["ring_own"]), prev_rows.index_select(0, x["ring_tail"])])
    dk.save_ring_rows(rows, x["ring_write_slots"], ring)
    # Step 5.
    if not fused:
        dk.rope_quant_insert(x["latent"], x["positions"], w.cos_sin, cache, x["cache_slots"], CR, w.fp8_scale)


def decode_step(w, b, rank: int, world: int, ring, cache):
    """Every rank runs the whole decode batch through the ring; only request
    ``r``'s decode owner (rank ``r % world``) inserts its records."""
    dev, it = w.device, w.sc.idx_dtype
    owner = torch.tensor([r % world == rank for r in range(len(b.qsl) - 1)], device=dev)
    cache_slots = torch.where(owner[b.ttr], b.cache_slots, torch.full_like(b.cache_slots, -1)).to(it)
    latent = b.latent.clone()
    args = (b.kv, b.positions.to(it), ring, b.ring_slots.to(it), _ix(b.qsl, it, dev), b.ttr.to(it), w.weight, EPS,
            CR, latent)
    if w.sc.fused:
        dk.fused_compress_insert(*args, w.cos_sin, cache, cache_slots, w.fp8_scale)
    else:
        dk.fused_save_compress_norm(*args)
        dk.rope_quant_insert(latent, b.positions.to(it), w.cos_sin, cache, cache_slots, CR, w.fp8_scale)
    return latent
