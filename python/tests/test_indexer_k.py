"""indexer_k_norm_rope_store: the records decoded against a float64 model
of docs/numerics.md (within one quantization step), the page orders against
docs/layouts.md's formulas, which tokens write, skip counts, validation
errors naming the argument, and CUDA/ROCm byte-identical to the CPU in every
format and order."""

import pytest
import torch

import dsv4_kvcache as kv

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def case(n=24, fp4=False, blocks=4, bs=64, cr=1, seed=0, idx=torch.int64, cos_dtype=torch.float32,
         w_dtype=torch.float32, k_stride=128, adversarial=False):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, k_stride, generator=g) * torch.exp2(torch.randint(-6, 7, (n, 1), generator=g).float())
    if adversarial:
        k[0] = 0.0
        k[1, 5] = float("inf")
        k[2, 70] = float("nan")
        k[3] = 3.0e38
        k[4, :64] = 1e-30
    k_pre = k.to(torch.bfloat16)[:, :128]
    positions = torch.randint(0, 200, (n,), generator=g).to(idx)
    max_pos = 256
    ang = torch.rand(max_pos, 32, generator=g, dtype=torch.float64) * 6.3
    cos_sin = torch.cat([ang.cos(), ang.sin()], 1).to(cos_dtype)
    weight = (1.0 + 0.1 * torch.randn(128, generator=g)).to(w_dtype)
    slots = torch.randperm(blocks * bs, generator=g)[:n].to(idx)
    slots[n // 3] = -1
    width = 68 if fp4 else 132
    k_cache = torch.randint(0, 256, (blocks, bs, width), dtype=torch.uint8, generator=g)
    return dict(k_pre=k_pre, positions=positions, cos_sin_cache=cos_sin, rms_norm_weight=weight,
                rms_norm_eps=1e-6, k_cache=k_cache, kv_slot_mapping=slots, compress_ratio=cr,
                use_fp4_cache=fp4)


def clone(c):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in c.items()}


def model_key(c, t):
    """The rotated key in float64 (no intermediate rounding but the BF16
    ones the definition states)."""
    x = c["k_pre"][t].double()
    w = c["rms_norm_weight"].double()
    y = x / torch.sqrt((x * x).mean() + c["rms_norm_eps"]) * w
    y = y.to(torch.bfloat16).double()
    cr = c["compress_ratio"]
    base = int(c["positions"][t]) // cr * cr
    cs = c["cos_sin_cache"][base].double()
    e, o = y[0::2].clone(), y[1::2].clone()
    cos = torch.cat([torch.ones(32, dtype=torch.float64), cs[:32]])
    sin = torch.cat([torch.zeros(32, dtype=torch.float64), cs[32:64]])
    r = torch.empty(128, dtype=torch.float64)
    r[0::2] = e * cos - o * sin
    r[1::2] = o * cos + e * sin
    return r.to(torch.bfloat16).double()


def row_bytes(cache, slot, fp4):
    """Values and scale bytes of the record at `slot`, row-major order."""
    bs = cache.shape[1]
    b, r = divmod(slot, bs)
    page = cache[b].reshape(-1)
    w = 64 if fp4 else 128
    return page[r * w:(r + 1) * w], page[bs * w + 4 * r: bs * w + 4 * r + 4]


def decode(values, scales, fp4):
    if fp4:
        codes = torch.stack([values & 15, values >> 4], 1).reshape(-1).long()
        mag = E2M1[codes & 7].double() * torch.where(codes >= 8, -1.0, 1.0).double()
        s = torch.exp2(scales.double() - 127).repeat_interleave(32)
        return mag * s, s
    s = scales.view(torch.float32).double()
    return values.view(torch.float8_e4m3fn).double() * s, s.expand(128)


def boundary_tokens(c):
    cr = c["compress_ratio"]
    return [t for t in range(len(c["kv_slot_mapping"]))
            if int(c["kv_slot_mapping"][t]) >= 0 and (int(c["positions"][t]) + 1) % cr == 0]


@pytest.mark.parametrize("fp4", [False, True])
@pytest.mark.parametrize("cr", [1, 2])
def test_records_decode_to_the_model(fp4, cr):
    c = case(fp4=fp4, cr=cr, seed=cr)
    before = c["k_cache"].clone()
    kv.indexer_k_norm_rope_store(**c)
    written = set()
    for t in boundary_tokens(c):
        slot = int(c["kv_slot_mapping"][t])
        written.add(slot)
        vals, sc = row_bytes(c["k_cache"], slot, fp4)
        got, step = decode(vals, sc, fp4)
        want = model_key(c, t)
        # One quantization step of the record's grid (FP8: 1/8 relative, or
        # the subnormal step 2^-9 of the scale; e2m1: its step of 2 at 6).
        tol = (want.abs() / 8 + step * 2.0 ** -9) if not fp4 else step * 2.0
        assert bool(((got - want).abs() <= tol).all()), (t, (got - want).abs().max())
    bs, w = c["k_cache"].shape[1], c["k_cache"].shape[2]
    for slot in range(c["k_cache"].shape[0] * bs):
        if slot not in written:
            b, r = divmod(slot, bs)
            vw = 64 if fp4 else 128
            page, old = c["k_cache"][b].reshape(-1), before[b].reshape(-1)
            assert torch.equal(page[r * vw:(r + 1) * vw], old[r * vw:(r + 1) * vw]), slot
            s0 = bs * vw + 4 * r
            assert torch.equal(page[s0:s0 + 4], old[s0:s0 + 4]), slot
    assert w == (68 if fp4 else 132)


def test_fp8_scale_forms():
    c = case(seed=3)
    a, m = clone(c), clone(c)
    kv.indexer_k_norm_rope_store(**a)
    kv.indexer_k_norm_rope_store(**m, mx_scale=True)
    for t in boundary_tokens(c):
        slot = int(c["kv_slot_mapping"][t])
        va, sa = row_bytes(a["k_cache"], slot, False)
        vm, sm = row_bytes(m["k_cache"], slot, False)
        assert torch.equal(va, vm)
        f = sa.view(torch.float32)
        e = int(torch.log2(f).item())
        assert float(f) == 2.0 ** e
        assert sm.tolist() == [e + 127] * 4


def permuted(cache, fp4, order, n=0):
    """The row-major cache's bytes moved to `order`'s places (docs/layouts.md)."""
    blocks, bs, width = cache.shape
    w = 64 if fp4 else 128
    out = torch.empty_like(cache).reshape(blocks, -1)
    src = cache.reshape(blocks, -1)
    for r in range(bs):
        for j in range(w):
            if order == "tiled":
                o = (r // 16) * 16 * w + (j // 16) * 256 + (r % 16) * 16 + j % 16
            else:
                o = (r // n) * n * w + (j // 16) * n * 16 + (r % n) * 16 + j % 16
            out[:, o] = src[:, r * w + j]
        for s in range(4):
            if order == "tiled":
                o = bs * w + 4 * r + s
            else:
                lo = 64 // n
                hi = 4 // lo
                o = bs * w + (r // n) * n * 4 + (s % lo) * n * hi + (r % n) * hi + s // lo
            out[:, o] = src[:, bs * w + 4 * r + s]
    return out.reshape(blocks, bs, width)


@pytest.mark.parametrize("fp4,order,n", [(False, "tiled", 0), (True, "preshuffled", 16),
                                         (True, "preshuffled", 32), (True, "preshuffled", 64)])
def test_orders_move_the_row_major_bytes(fp4, order, n):
    c = case(fp4=fp4, seed=5, bs=64)
    c["k_cache"].zero_()
    rm, other = clone(c), clone(c)
    kv.indexer_k_norm_rope_store(**rm)
    kv.indexer_k_norm_rope_store(**other, mxfp4_n_per_tile=n, k_order=order)
    assert torch.equal(other["k_cache"], permuted(rm["k_cache"], fp4, order, n))


def test_out_of_range_indices_are_skipped_and_counted():
    c = case(n=6, seed=7)
    c["positions"][:] = torch.tensor([0, -3, 300, 5, 6, 7])
    c["kv_slot_mapping"][:] = torch.tensor([0, 1, 2, 4 * 64, 5, -1])
    kv.take_skip_counts("cpu")
    before = c["k_cache"].clone()
    kv.indexer_k_norm_rope_store(**c)
    s = kv.take_skip_counts("cpu")
    assert (s.slot_out_of_range, s.position_out_of_range) == (1, 2)
    changed = (c["k_cache"] != before).reshape(4, -1).any(1)
    assert bool(changed[0]) and not bool(changed[1:].any())


@pytest.mark.parametrize("change,arg,exc", [
    (lambda c: c.update(k_pre=c["k_pre"].float()), "k_pre", TypeError),
    (lambda c: c.update(k_pre=c["k_pre"][:, :64]), "k_pre", ValueError),
    (lambda c: c.update(use_fp4_cache=True), "k_cache", ValueError),
    (lambda c: c.update(k_cache=torch.zeros(2, 64, 100, dtype=torch.uint8)), "k_cache", ValueError),
    (lambda c: c.update(compress_ratio=4), "compress_ratio", ValueError),
    (lambda c: c.update(rms_norm_eps=float("nan")), "rms_norm_eps", ValueError),
    (lambda c: c.update(rms_norm_weight=torch.ones(64)), "rms_norm_weight", ValueError),
    (lambda c: c.update(positions=c["positions"][:3]), "positions", ValueError),
    (lambda c: c.update(kv_slot_mapping=c["kv_slot_mapping"].float()), "kv_slot_mapping", TypeError),
])
def test_bad_arguments_name_themselves(change, arg, exc):
    c = case()
    change(c)
    before = c["k_cache"].clone()
    with pytest.raises(exc, match=arg):
        kv.indexer_k_norm_rope_store(**c)
    assert torch.equal(c["k_cache"], before)


@pytest.mark.parametrize("kw,arg", [
    (dict(k_order="tiles"), "k_order"),
    (dict(k_order="preshuffled"), "k_order"),
    (dict(k_order="tiled", mx_scale=True, use_fp4_cache=True), "k_order"),
    (dict(mx_scale=True, use_fp4_cache=True), "mx_scale"),
    (dict(k_order="preshuffled", use_fp4_cache=True, mxfp4_n_per_tile=8), "mxfp4_n_per_tile"),
    (dict(k_order="preshuffled", use_fp4_cache=True, mxfp4_n_per_tile=0), "mxfp4_n_per_tile"),
])
def test_bad_orders_name_themselves(kw, arg):
    c = case(fp4=kw.get("use_fp4_cache", False), bs=48)
    c.update({k: v for k, v in kw.items() if k == "use_fp4_cache"})
    rest = {k: v for k, v in kw.items() if k != "use_fp4_cache"}
    if rest.get("k_order") == "tiled":
        c["k_cache"] = torch.zeros(4, 48, 68 if c["use_fp4_cache"] else 132, dtype=torch.uint8)
    with pytest.raises(ValueError, match=arg):
        kv.indexer_k_norm_rope_store(**c, **rest)


def test_tiled_needs_whole_tiles():
    c = case(bs=24, n=8)
    with pytest.raises(ValueError, match="k_cache.*16"):
        kv.indexer_k_norm_rope_store(**c, k_order="tiled")


def test_torch_op_matches_the_function():
    c = case(fp4=True, seed=11)
    a, b = clone(c), clone(c)
    kv.indexer_k_norm_rope_store(**a, mxfp4_n_per_tile=32, k_order="preshuffled")
    kv.ops.indexer_k_norm_rope_store(**b, mxfp4_n_per_tile=32, k_order="preshuffled")
    assert torch.equal(a["k_cache"], b["k_cache"])


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: torch.cuda.is_available() is False")

GPU_CASES = [
    dict(fp4=False), dict(fp4=False, order="tiled"), dict(fp4=False, mx=True),
    dict(fp4=True), dict(fp4=True, order="preshuffled", n=16), dict(fp4=True, order="preshuffled", n=32),
    dict(fp4=True, order="preshuffled", n=64),
]


@gpu
@pytest.mark.parametrize("cfg", GPU_CASES, ids=lambda d: "-".join(f"{k}{v}" for k, v in d.items()))
@pytest.mark.parametrize("cr", [1, 2])
@pytest.mark.parametrize("variant", ["plain", "adversarial", "i32-bf16-strided"])
def test_gpu_matches_cpu(cfg, cr, variant):
    extra = {}
    if variant == "adversarial":
        extra = dict(adversarial=True)
    elif variant == "i32-bf16-strided":
        extra = dict(idx=torch.int32, cos_dtype=torch.bfloat16, w_dtype=torch.float16, k_stride=131)
    c = case(n=300, fp4=cfg["fp4"], cr=cr, seed=cr + 17, blocks=8, **extra)
    kw = dict(k_order=cfg.get("order", "row_major"), mx_scale=cfg.get("mx", False),
              mxfp4_n_per_tile=cfg.get("n", 0))
    cpu = clone(c)
    kv.indexer_k_norm_rope_store(**cpu, **kw)
    dev = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    kv.indexer_k_norm_rope_store(**dev, **kw)
    assert torch.equal(dev["k_cache"].cpu(), cpu["k_cache"])
