"""Every function against the library's CPU reference, byte for byte."""

import pytest
import torch

import dsv4_kvcache as dk
from dsv4_kvcache import _native

from cases import LAYOUTS, clone, compress_case, fused_case, insert_case, ring_case, same_storage

OUTS = {
    "rope_quant_insert": ["kv_cache"],
    "fused_save_compress_norm": ["latent_out", "state_cache"],
    "save_ring_rows": ["state_cache"],
    "fused_compress_insert": ["latent_out", "state_cache", "kv_cache"],
}


def run_both(name, case, **kw):
    """Our plain function on one copy, the reference (safe API on its own
    buffers) on another; every byte of every output storage must match,
    and so must the skip counts."""
    ours, ref = clone(case), clone(case)
    dk.take_skip_counts("cpu")
    getattr(dk, name)(**ours, **kw)
    got = dk.take_skip_counts("cpu")
    want = _native._reference(name, **ref, **kw)
    for out in OUTS[name]:
        if ours.get(out) is not None:
            assert same_storage(ours[out], ref[out]), f"{name}: {out} differs"
    assert tuple(got) == tuple(want)
    return ours, got


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cr", [1, 2])
@pytest.mark.parametrize("adversarial", [False, True])
def test_insert(layout, cr, adversarial):
    for seed in range(3):
        case = insert_case(layout, cr, seed=seed, adversarial=adversarial)
        ours, counts = run_both("rope_quant_insert", case)
        if adversarial:
            assert counts.slot_out_of_range > 0 and counts.position_out_of_range > 0
        # The call wrote something (the canary changed).
        assert not same_storage(ours["kv_cache"], case["kv_cache"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_insert_sanitize_and_views(layout):
    case = insert_case(layout, 1, seed=5, adversarial=True, idx=torch.int32, cache_pad=32 * 16)
    run_both("rope_quant_insert", case, sanitize=True)
    run_both("rope_quant_insert", case, sanitize=False)
    # A latent that is a row slice of a bigger tensor (non-zero storage offset).
    big = torch.cat([torch.zeros(3, 512, dtype=torch.bfloat16), case["latent"]])
    case["latent"] = big[3:]
    run_both("rope_quant_insert", case)


def test_sanitize_changes_nan_records():
    case = insert_case("mxfp8", 1, seed=1, adversarial=True)
    a, b = clone(case), clone(case)
    dk.rope_quant_insert(**a, sanitize=True)
    dk.rope_quant_insert(**b, sanitize=False)
    assert not same_storage(a["kv_cache"], b["kv_cache"])
    c = clone(case)
    dk.rope_quant_insert(**c)  # auto on the CPU: off (unless DSV4_KVCACHE_SANITIZE=on)
    assert same_storage(b["kv_cache"], c["kv_cache"])


@pytest.mark.parametrize("cr", [1, 2])
@pytest.mark.parametrize("adversarial", [False, True])
@pytest.mark.parametrize("prev", [False, True])
def test_compress(cr, adversarial, prev):
    for seed in range(3):
        case = compress_case(cr, seed=seed, adversarial=adversarial, prev=prev)
        ours, counts = run_both("fused_save_compress_norm", case)
        assert not same_storage(ours["latent_out"], case["latent_out"])
        if adversarial and cr == 2 and not prev:
            assert counts.slot_out_of_range > 0


def test_compress_int32_indices():
    run_both("fused_save_compress_norm", compress_case(2, seed=4, idx=torch.int32))


@pytest.mark.parametrize("adversarial", [False, True])
def test_ring(adversarial):
    ours, counts = run_both("save_ring_rows", ring_case(seed=3, adversarial=adversarial))
    assert counts.slot_out_of_range == (1 if adversarial else 0)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cr", [1, 2])
@pytest.mark.parametrize("adversarial", [False, True])
def test_fused(layout, cr, adversarial):
    case = fused_case(layout, cr, seed=7, adversarial=adversarial)
    run_both("fused_compress_insert", case)
    run_both("fused_compress_insert", case, skip_latent_out=True)


def test_empty_calls_write_nothing():
    case = insert_case("nvfp4", 1)
    case["slot_mapping"] = case["slot_mapping"][:0]
    ours = clone(case)
    dk.rope_quant_insert(**ours)
    assert same_storage(ours["kv_cache"], case["kv_cache"])
