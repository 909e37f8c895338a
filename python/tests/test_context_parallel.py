"""Prefill context parallelism across processes (python/examples/context_parallel.py,
checked by context_parallel_check.py):
each rank's latents, ring rows and records equal one process running the
same steps whole, for every layout, several splits, and decode steps."""

import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import context_parallel_check as cp  # noqa: E402


def _run(world, backend, device, tmp_path, **extra):
    reason = cp.skip_reason(device, backend, world)
    if reason:
        pytest.skip(reason)
    out = tmp_path / "summary.json"
    cfg = dict(backend=backend, device=device, bench=False, tokens=0, iters=0, fused=False, layout=None,
               out=str(out), timeout=120)
    cfg.update(extra)
    cp.launch(world, cfg)
    with open(out, encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_cpu_equals_one_process(world, tmp_path):
    s = _run(world, "gloo", "cpu", tmp_path)
    scenarios = cp.ci_scenarios(world)
    assert s["scenarios"] == len(scenarios) == len(cp.LAYOUTS) * len(cp.SPLIT_MODES)
    ranks = s["per_rank"]
    assert len(ranks) == world
    for k, r in enumerate(ranks):
        assert r["steps"] == sum(len(sc.steps) for sc in scenarios), k
        # Every rank computed latents, stored ring rows and wrote records.
        assert r["latents"] > 0 and r["records"] > 0 and r["ring_rows"] > 0, (k, r)
    # Rank 0 never has an earlier rank; every later rank pooled across its
    # slice's first boundary (prev_rows) and started slices on odd positions.
    assert ranks[0]["prev_rows_reads"] == 0
    for r in ranks[1:]:
        assert r["prev_rows_reads"] > 0 and r["odd_slice_starts"] > 0, r


def test_split_modes_cover_the_edges():
    """The splits the scenarios use include uneven slices, slices on odd
    positions, requests shorter than the group, and empty slices."""
    for world in (2, 3):
        short, empty_rank, uneven = False, False, False
        for sc in cp.ci_scenarios(world):
            for step in sc.steps:
                for n, cuts in zip(step.lengths, step.cuts):
                    assert cuts[0] == 0 and cuts[-1] == n and cuts == sorted(cuts) and len(cuts) == world + 1
                    sizes = [b - a for a, b in zip(cuts, cuts[1:])]
                    short |= 0 < n < world
                    empty_rank |= n > 0 and 0 in sizes
                    uneven |= max(sizes) - min(sizes) > 1
        assert short and empty_rank and uneven


@pytest.mark.parametrize("world", [2])
def test_nccl_cuda_equals_one_process(world, tmp_path):
    """The same check, one process per GPU over NCCL (skipped without 2 GPUs)."""
    s = _run(world, "nccl", "cuda", tmp_path)
    assert s["steps"] == sum(len(sc.steps) for sc in cp.ci_scenarios(world))


def test_bench_mode_runs_on_cpu(tmp_path):
    """The timing mode's path (checked step, then timed steps), small, on
    the CPU backend: the GPU run uses the same code."""
    s = _run(2, "gloo", "cpu", tmp_path, bench=True, tokens=1024, iters=2, layout="mxfp8")
    assert s["tokens"] == 1024 and len(s["cp_step_us_per_rank"]) == 2
    assert s["cp_step_us"] > 0 and s["one_device_us"] > 0
    assert s["check"]["steps"] == 1 and s["check"]["records"] > 0


@pytest.mark.parametrize("layout", list(cp.LAYOUTS))
def test_a_rank_without_tokens_calls_every_function(layout):
    """A rank that holds no token of the step still makes every call (with
    zero rows, as the seed allows) and changes nothing."""
    import dsv4_kvcache as dk

    e = torch.empty(0, dtype=torch.int64)
    kv = torch.randn(3, 1024).index_select(0, e)
    latent = torch.empty(0, 512, dtype=torch.bfloat16)
    ring = torch.randn(2, 4, 1024)
    dtype, width = cp.LAYOUTS[layout]
    cache = torch.randint(0, 256, (2, 4, width * torch.empty((), dtype=dtype).element_size()),
                          dtype=torch.uint8).view(dtype)
    ring0, cache0 = ring.clone(), cache.clone()
    weight = torch.ones(512, dtype=torch.bfloat16)
    cos_sin = torch.zeros(8, 64)
    scale = torch.tensor([0.5]) if layout == "fp8" else None
    qsl = torch.zeros(3, dtype=torch.int64)
    prev_rows, pri = torch.randn(4, 1024), torch.tensor([-1, 1])
    dk.fused_save_compress_norm(kv, e, ring, e, qsl, e, weight, 1e-6, 2, latent, prev_rows, pri)
    dk.save_ring_rows(kv, e, ring)
    dk.rope_quant_insert(latent, e, cos_sin, cache, e, 2, scale)
    dk.fused_compress_insert(kv, e, ring, e, qsl, e, weight, 1e-6, 2, latent, cos_sin, cache, e, scale, prev_rows, pri)
    dk.fused_save_compress_norm(kv, e, ring, e, qsl, e, weight, 1e-6, 2, latent)
    assert torch.equal(ring.view(torch.int32), ring0.view(torch.int32))
    assert torch.equal(cache.view(torch.uint8), cache0.view(torch.uint8))
    assert tuple(dk.take_skip_counts("cpu")) == (0, 0, 0)


def test_skip_reasons():
    assert cp.skip_reason("cpu", "gloo", 1) is not None
    if torch.cuda.device_count() < 2:
        assert cp.skip_reason("cuda", "nccl", 2) is not None
