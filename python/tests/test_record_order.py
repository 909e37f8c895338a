"""The two orders of the V4.1 records (528 and 288 B): ``record_order=
"planar"`` (the seed's: a page's values, then its scales) and
``"per_token"`` (vLLM 0.34.0's: each record's scales right after its own
values). The same record bytes, at other places of the page; the reader
reads each back; a bad order is a ValueError naming the argument."""

import pytest
import torch

import dsv4_kvcache as dk
from dsv4_kvcache import _native

from cases import clone, fused_case, insert_case, same_storage

V41 = {"mxfp8": (512, 16), "nvfp4": (256, 32)}


def to_per_token(cache, layout):
    """The page-planar cache's bytes moved to the per-token order (each
    page's values and scales regrouped by record)."""
    v, s = V41[layout]
    blocks, bs, w = cache.shape
    pages = cache.reshape(blocks, bs * w)
    values = pages[:, : bs * v].reshape(blocks, bs, v)
    scales = pages[:, bs * v:].reshape(blocks, bs, s)
    return torch.cat([values, scales], dim=2).contiguous()


def vllm_offsets(slot, bs, w, v):
    """vLLM 0.34.0's addresses of a record (its kernels' words):
    ``values = page + (slot % CACHE_BLOCK) * W; scales = values + V``."""
    page = (slot // bs) * bs * w
    values = page + (slot % bs) * w
    return values, values + v


@pytest.mark.parametrize("layout", list(V41))
@pytest.mark.parametrize("cr", [1, 2])
@pytest.mark.parametrize("adversarial", [False, True])
def test_insert_per_token_is_the_planar_record_moved(layout, cr, adversarial):
    case = insert_case(layout, cr, seed=3, adversarial=adversarial)
    planar = clone(case)
    per_token = clone(case)
    per_token["kv_cache"] = to_per_token(case["kv_cache"], layout)
    dk.rope_quant_insert(**planar)
    dk.rope_quant_insert(**per_token, record_order="per_token")
    assert torch.equal(to_per_token(planar["kv_cache"], layout), per_token["kv_cache"])
    # Something was written, and the reference agrees.
    assert not torch.equal(planar["kv_cache"], case["kv_cache"])
    ref = clone(per_token)
    ref["kv_cache"] = to_per_token(case["kv_cache"], layout)
    _native._reference("rope_quant_insert", **ref, record_order="per_token")
    assert same_storage(ref["kv_cache"], per_token["kv_cache"])


@pytest.mark.parametrize("layout", list(V41))
def test_per_token_records_sit_where_vllm_reads_them(layout):
    """Each written token's 528/288 bytes, at vLLM 0.34.0's addresses, are
    the record the page-planar call wrote for it."""
    v, s = V41[layout]
    case = insert_case(layout, 1, seed=9)
    planar, per_token = clone(case), clone(case)
    dk.rope_quant_insert(**planar)
    dk.rope_quant_insert(**per_token, record_order="per_token")
    blocks, bs, w = case["kv_cache"].shape
    flat_planar = planar["kv_cache"].reshape(-1)
    flat = per_token["kv_cache"].reshape(-1)
    checked = 0
    for slot in case["slot_mapping"].tolist():
        if slot < 0 or slot >= blocks * bs:
            continue
        values, scales = vllm_offsets(slot, bs, w, v)
        page, row = (slot // bs) * bs * w, slot % bs
        assert torch.equal(flat[values:values + v], flat_planar[page + row * v: page + row * v + v])
        assert torch.equal(flat[scales:scales + s],
                           flat_planar[page + bs * v + row * s: page + bs * v + row * s + s])
        checked += 1
    assert checked > 10


@pytest.mark.parametrize("layout", list(V41))
@pytest.mark.parametrize("cr", [1, 2])
def test_fused_per_token(layout, cr):
    case = fused_case(layout, cr, seed=4, adversarial=True)
    planar, per_token = clone(case), clone(case)
    per_token["kv_cache"] = to_per_token(case["kv_cache"], layout)
    dk.fused_compress_insert(**planar)
    dk.fused_compress_insert(**per_token, record_order="per_token")
    assert torch.equal(to_per_token(planar["kv_cache"], layout), per_token["kv_cache"])
    assert torch.equal(planar["latent_out"].view(torch.int16), per_token["latent_out"].view(torch.int16))


@pytest.mark.parametrize("layout", list(V41))
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_gather_reads_each_order(layout, out_dtype):
    case = insert_case(layout, 1, seed=5)
    planar, per_token = clone(case), clone(case)
    dk.rope_quant_insert(**planar)
    dk.rope_quant_insert(**per_token, record_order="per_token")
    slots = case["slot_mapping"][case["slot_mapping"] >= 0]
    slots = slots[slots < case["kv_cache"].shape[0] * case["kv_cache"].shape[1]]
    a = torch.zeros(slots.numel(), 512, dtype=out_dtype)
    b = torch.full_like(a, 7.0)
    dk.gather_dequant(planar["kv_cache"], a, slots)
    dk.gather_dequant(per_token["kv_cache"], b, slots, record_order="per_token")
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    # Read in the wrong order, the same cache gives other values: the
    # order matters and nothing detects it but the caller's argument.
    c = torch.zeros_like(a)
    dk.gather_dequant(per_token["kv_cache"], c, slots)
    assert not torch.equal(a.view(torch.uint8), c.view(torch.uint8))


def test_row_layouts_ignore_the_order():
    for layout in ("bf16", "fp8"):
        case = insert_case(layout, 2, seed=6)
        a, b = clone(case), clone(case)
        dk.rope_quant_insert(**a)
        dk.rope_quant_insert(**b, record_order="per_token")
        assert same_storage(a["kv_cache"], b["kv_cache"])


def test_bad_orders_are_value_errors_naming_the_argument():
    case = insert_case("mxfp8", 1, seed=7)
    before = clone(case)
    for bad in ("interleaved", "", "PLANAR"):
        with pytest.raises(ValueError, match="record_order"):
            dk.rope_quant_insert(**case, record_order=bad)
    with pytest.raises(TypeError):
        dk.rope_quant_insert(**case, record_order=1)
    # The 584 B V4 record is page-planar only.
    v4 = insert_case("v4", 1, seed=7)
    v4_before = clone(v4)
    with pytest.raises(ValueError, match="record_order.*584"):
        dk.rope_quant_insert(**v4, record_order="per_token")
    with pytest.raises(ValueError, match="record_order"):
        dk.gather_dequant(v4["kv_cache"], torch.zeros(2, 512, dtype=torch.bfloat16),
                          torch.tensor([0, 1]), record_order="per_token")
    # Nothing was written by the refused calls.
    assert same_storage(case["kv_cache"], before["kv_cache"])
    assert same_storage(v4["kv_cache"], v4_before["kv_cache"])


def test_torch_operators_take_the_order():
    case = insert_case("nvfp4", 2, seed=8)
    a, b = clone(case), clone(case)
    dk.rope_quant_insert(**a, record_order="per_token")
    torch.ops.dsv4_kvcache.rope_quant_insert(**b, record_order="per_token")
    assert same_storage(a["kv_cache"], b["kv_cache"])
    assert 'str record_order="planar"' in str(torch.ops.dsv4_kvcache.rope_quant_insert.default._schema)
    assert 'str record_order="planar"' in str(torch.ops.dsv4_kvcache.gather_dequant.default._schema)
    assert 'str record_order="planar"' in str(torch.ops.dsv4_kvcache.fused_compress_insert.default._schema)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: torch.cuda.is_available() is False")


@gpu
@pytest.mark.parametrize("layout", list(V41))
@pytest.mark.parametrize("order", ["planar", "per_token"])
def test_gpu_matches_the_reference_in_each_order(layout, order):
    for cr in (1, 2):
        case = insert_case(layout, cr, seed=10 + cr, adversarial=True)
        if order == "per_token":
            case["kv_cache"] = to_per_token(case["kv_cache"], layout)
        ref = clone(case)
        _native._reference("rope_quant_insert", **ref, record_order=order)
        dev = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
        dk.rope_quant_insert(**dev, record_order=order, sanitize=False)
        torch.cuda.synchronize()
        assert torch.equal(dev["kv_cache"].cpu(), ref["kv_cache"])
        f = fused_case(layout, cr, seed=20 + cr, adversarial=True)
        if order == "per_token":
            f["kv_cache"] = to_per_token(f["kv_cache"], layout)
        fref = clone(f)
        _native._reference("fused_compress_insert", **fref, record_order=order)
        fdev = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in f.items()}
        dk.fused_compress_insert(**fdev, record_order=order, sanitize=False)
        torch.cuda.synchronize()
        assert torch.equal(fdev["kv_cache"].cpu(), fref["kv_cache"])
        slots = torch.arange(case["kv_cache"].shape[0] * case["kv_cache"].shape[1])
        out = torch.zeros(slots.numel(), 512, dtype=torch.float32)
        _native._reference("gather_dequant", ref["kv_cache"], out, slots, record_order=order)
        dout = torch.zeros_like(out).cuda()
        dk.gather_dequant(dev["kv_cache"], dout, slots.cuda(), record_order=order)
        torch.cuda.synchronize()
        assert torch.equal(dout.cpu().view(torch.uint8), out.view(torch.uint8))
