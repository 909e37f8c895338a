"""rms_norm_weight and cos_sin_cache in float32, bfloat16 or float16, every
combination: the same bytes as the reference, and as the call with both
tensors widened by torch's .to(float32) (what the seed's kernels read); the
type is not ignored; other types raise TypeError naming the argument. On a
GPU the device's bytes equal the CPU's for every combination."""

import itertools

import pytest
import torch

import dsv4_kvcache as dk
from dsv4_kvcache import _native

from cases import LAYOUTS, clone, compress_case, fused_case, insert_case, same_storage

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
OUTS = {
    "rope_quant_insert": ["kv_cache"],
    "fused_save_compress_norm": ["latent_out", "state_cache"],
    "fused_compress_insert": ["latent_out", "state_cache", "kv_cache"],
}


def full_precision_weight(seed):
    """A weight near 1 whose float32 values bfloat16 and float16 cannot hold."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(512, generator=g, dtype=torch.float32) + 0.5


def typed(case, w=None, cs=None):
    """The case with its weight and table (where it has them) as w and cs."""
    c = clone(case)
    if w is not None and "rms_norm_weight" in c:
        c["rms_norm_weight"] = full_precision_weight(3).to(w)
    if cs is not None and "cos_sin_cache" in c:
        c["cos_sin_cache"] = c["cos_sin_cache"].to(cs)
    return c


def widened(case):
    """The case with its weight and table widened to float32 by torch."""
    c = clone(case)
    for k in ("rms_norm_weight", "cos_sin_cache"):
        if k in c:
            c[k] = c[k].to(torch.float32)
    return c


def outputs_equal(name, a, b):
    return all(same_storage(a[o], b[o]) for o in OUTS[name] if a.get(o) is not None)


def run(name, case, device=None):
    """Runs our function on a copy (moved to device), returns it on the CPU."""
    c = clone(case)
    if device is not None:
        c = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in c.items()}
    getattr(dk, name)(**c)
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in c.items()}


def cases():
    yield "fused_save_compress_norm", "cr1", compress_case(1, seed=11)
    yield "fused_save_compress_norm", "cr2", compress_case(2, seed=12, prev=True)
    for layout, cr in itertools.product(LAYOUTS, [1, 2]):
        yield "rope_quant_insert", f"{layout} cr{cr}", insert_case(layout, cr, seed=13)
        yield "fused_compress_insert", f"{layout} cr{cr}", fused_case(layout, cr, seed=14)


CASES = list(cases())
COMBOS = list(itertools.product(FLOATS, FLOATS))


@pytest.mark.parametrize("name,label,case", CASES, ids=[f"{n} {l}" for n, l, _ in CASES])
@pytest.mark.parametrize("w,cs", COMBOS, ids=[f"w-{str(w)[6:]} cs-{str(c)[6:]}" for w, c in COMBOS])
def test_every_type_pair_matches_reference_and_widened_call(name, label, case, w, cs):
    c = typed(case, w, cs)
    ours, ref = clone(c), clone(c)
    dk.take_skip_counts("cpu")
    getattr(dk, name)(**ours)
    got = dk.take_skip_counts("cpu")
    want = _native._reference(name, **ref)
    assert outputs_equal(name, ours, ref), f"{name} {label}: differs from the reference"
    assert tuple(got) == tuple(want)
    assert outputs_equal(name, ours, run(name, widened(c))), f"{name} {label}: differs from the widened call"


@pytest.mark.parametrize("cr", [1, 2])
@pytest.mark.parametrize("w", [torch.float32, torch.float16])
def test_weight_type_is_not_ignored(cr, w):
    c = compress_case(cr, seed=21)
    full = run("fused_save_compress_norm", typed(c, w=w))
    rounded = typed(c, w=w)
    rounded["rms_norm_weight"] = rounded["rms_norm_weight"].to(torch.bfloat16)
    assert not same_storage(full["latent_out"], run("fused_save_compress_norm", rounded)["latent_out"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_table_type_is_not_ignored(layout):
    # NVFP4's 2-bit significands rarely move for a rounded table: some seed
    # of a few must show it.
    for seed in range(22, 30):
        c = insert_case(layout, 1, t=48, seed=seed)
        f16 = run("rope_quant_insert", typed(c, cs=torch.float16))
        f32 = run("rope_quant_insert", typed(c, cs=torch.float32))
        if not same_storage(f16["kv_cache"], f32["kv_cache"]):
            return
    pytest.fail(f"{layout}: a float16 table wrote the float32 table's bytes on every seed")


def rejects(fn, case, arg):
    before = clone(case)
    with pytest.raises(TypeError) as e:
        fn(**case)
    assert str(e.value).startswith(arg + ":"), str(e.value)
    for k, v in case.items():
        if isinstance(v, torch.Tensor):
            assert same_storage(v, before[k]), f"{k} was written by a rejected call"


@pytest.mark.parametrize("bad", [torch.float64, torch.int32, torch.uint8])
def test_other_types_raise_type_error_naming_the_argument(bad):
    c = compress_case(1, seed=23)
    c["rms_norm_weight"] = c["rms_norm_weight"].to(bad)
    rejects(dk.fused_save_compress_norm, c, "rms_norm_weight")
    c = insert_case("nvfp4", 2, seed=24)
    c["cos_sin_cache"] = c["cos_sin_cache"].to(bad)
    rejects(dk.rope_quant_insert, c, "cos_sin_cache")
    c = fused_case("v4", 1, seed=25)
    c["cos_sin_cache"] = c["cos_sin_cache"].to(bad)
    rejects(dk.fused_compress_insert, c, "cos_sin_cache")


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: torch.cuda.is_available() is False")


@gpu
@pytest.mark.parametrize("name,label,case", CASES, ids=[f"{n} {l}" for n, l, _ in CASES])
def test_device_matches_cpu_for_every_type_pair(name, label, case):
    for w, cs in COMBOS:
        c = typed(case, w, cs)
        assert outputs_equal(name, run(name, c, "cuda"), run(name, c)), f"{name} {label} w={w} cs={cs}"
