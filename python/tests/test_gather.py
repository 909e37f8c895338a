"""gather_dequant: the slot and block-table forms on the CPU against a
decoder written here from docs/layouts.md and docs/numerics.md (MXFP8 and
BF16 rows, F32 output), CUDA/ROCm byte-identical to the CPU for every
layout, and validation errors naming the argument."""

import pytest
import torch

import dsv4_kvcache as kv

W = {"v4": 584, "mxfp8": 528, "nvfp4": 288}


def _cache(layout, blocks=3, bs=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    if layout in W:
        return torch.randint(0, 256, (blocks, bs, W[layout]), dtype=torch.uint8, generator=g)
    if layout == "bf16":
        return torch.randn(blocks, bs, 512, generator=g).to(torch.bfloat16)
    return torch.randint(0, 256, (blocks, bs, 512), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)


def _mxfp8_row(cache, slot):
    bs = cache.shape[1]
    b, r = divmod(slot, bs)
    page = cache[b].reshape(-1)
    codes = page[r * 512:(r + 1) * 512].view(torch.float8_e4m3fn).to(torch.float32)
    scales = page[bs * 512 + r * 16: bs * 512 + (r + 1) * 16].to(torch.int64)
    s = torch.where(scales == 255, torch.tensor(float("nan")),
                    torch.pow(2.0, (scales - 127).to(torch.float64)).to(torch.float32))
    return codes * s.repeat_interleave(32)


def _canon(x):
    bits = x.contiguous().view(torch.int32).clone()
    bits[torch.isnan(x)] = 0x7FC00000
    return bits


def test_slot_form_matches_the_layout_description():
    cache = _cache("mxfp8")
    slots = torch.randperm(cache.shape[0] * cache.shape[1])[:20]
    out = torch.zeros(20, 512, dtype=torch.float32)
    kv.gather_dequant(cache, out, slots)
    want = torch.stack([_mxfp8_row(cache, int(s)) for s in slots])
    assert torch.equal(_canon(out), _canon(want))


def test_block_table_form_reads_each_requests_tokens():
    cache = _cache("bf16", blocks=4, bs=4)
    table = torch.tensor([[2, 0, 3], [1, 3, 0]], dtype=torch.int32)
    cu = torch.tensor([0, 5, 7], dtype=torch.int32)
    starts = torch.tensor([2, 0], dtype=torch.int32)
    out = torch.zeros(7, 512, dtype=torch.bfloat16)
    kv.gather_dequant(cache, out, block_table=table, cu_seq_lens=cu, seq_starts=starts)
    for o in range(7):
        r = 0 if o < 5 else 1
        p = int(starts[r]) + o - int(cu[r])
        b = int(table[r, p // 4])
        assert torch.equal(out[o].view(torch.int16), cache[b, p % 4].view(torch.int16)), o


def test_negative_slots_leave_rows_and_wild_slots_are_counted():
    cache = _cache("nvfp4")
    kv.take_skip_counts("cpu")
    out = torch.full((3, 512), 7.0, dtype=torch.bfloat16)
    kv.gather_dequant(cache, out, torch.tensor([-1, 10**6, 0]))
    assert torch.all(out[0] == 7.0) and torch.all(out[1] == 7.0)
    assert kv.take_skip_counts("cpu").slot_out_of_range == 1


@pytest.mark.parametrize("op", [kv.gather_dequant, kv.ops.gather_dequant])
def test_validation_names_the_argument(op):
    cache = _cache("mxfp8")
    out = torch.zeros(4, 512, dtype=torch.bfloat16)
    with pytest.raises(Exception, match="out"):
        op(cache, torch.zeros(4, 512, dtype=torch.float16), torch.zeros(4, dtype=torch.int64))
    with pytest.raises(Exception, match="slot_mapping"):
        op(cache, out)
    with pytest.raises(Exception, match="fp8_scale"):
        op(cache, out, torch.zeros(4, dtype=torch.int64), fp8_scale=torch.ones(1))
    with pytest.raises(Exception, match="cu_seq_lens"):
        op(cache, out, block_table=torch.zeros(1, 1, dtype=torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA/ROCm device")
@pytest.mark.parametrize("layout", ["v4", "mxfp8", "nvfp4", "bf16", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_is_byte_identical_to_cpu(layout, dtype):
    cache = _cache(layout, blocks=8, bs=64, seed=3)
    scale = torch.tensor([0.0125]) if layout == "fp8" else None
    n = 1000
    slots = torch.randint(-2, 8 * 64 + 3, (n,))
    outs = []
    for dev in ["cpu", "cuda"]:
        out = torch.full((n, 512), 3.0, dtype=dtype, device=dev)
        kv.gather_dequant(cache.to(dev), out, slots.to(dev),
                          fp8_scale=None if scale is None else scale.to(dev))
        outs.append(out.cpu())
    assert torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8))
