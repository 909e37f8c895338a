"""Input builders shared by the tests (random and adversarial)."""

import json
import struct

import torch

WIDTH = {"v4": (torch.uint8, 584), "mxfp8": (torch.uint8, 528), "nvfp4": (torch.uint8, 288),
         "bf16": (torch.bfloat16, 512), "fp8": (torch.float8_e4m3fn, 512)}
LAYOUTS = list(WIDTH)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def canary(shape, dtype, g):
    """A tensor of pseudo-random bytes (any dtype), so unwritten bytes show."""
    n = 1
    for s in shape:
        n *= s
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape).clone()


def latent_rows(t, g, adversarial=False):
    x = torch.randn(t, 512, generator=g) * torch.exp2(torch.randint(-6, 7, (t, 1), generator=g).float())
    if adversarial:
        x[0::7, :3] = float("nan")
        x[1::11, 5] = float("inf")
        x[2::13, 17] = float("-inf")
        x[3::5, :32] = 0.0
        x[4::9] = -0.0
        x[5::17] *= 1e-38
        x[6::19] *= 3e38
    return x.bfloat16()


def cos_sin(rows, g, dtype=torch.float32):
    ang = torch.rand(rows, 32, generator=g) * 6.3
    t = torch.cat([ang.cos(), ang.sin()], 1)
    return t.to(dtype)


def insert_case(layout, cr, t=37, seed=0, adversarial=False, idx=torch.int64, blocks=3, bs=16,
                cache_pad=0):
    g = gen(seed)
    lat = latent_rows(t, g, adversarial)
    pos = torch.randint(0, 40, (t,), generator=g)
    cs = cos_sin(48, g)
    cap = blocks * bs
    slots = torch.randperm(cap, generator=g)[:t] if t <= cap else torch.randint(0, cap, (t,), generator=g)
    if adversarial:
        slots[::6] = -1
        slots[1::10] = cap + 3  # out of range: skipped and counted
        pos[2::9] = 1001  # odd (a group end for CR 1 and 2), beyond the cos/sin table: skipped and counted
    dtype, w = WIDTH[layout]
    if cache_pad:
        # Blocks further apart than a page: a strided view into a bigger buffer.
        big = canary((blocks, bs * w + cache_pad), dtype, g)
        cache = big[:, : bs * w].view(blocks, bs, w)
    else:
        cache = canary((blocks, bs, w), dtype, g)
    scale = torch.tensor([0.75]) if layout == "fp8" else None
    return dict(latent=lat, positions=pos.to(idx), cos_sin_cache=cs, kv_cache=cache,
                slot_mapping=slots.to(idx), compress_ratio=cr, fp8_scale=scale)


def compress_case(cr, t=24, reqs=3, seed=0, adversarial=False, prev=False, idx=torch.int64):
    g = gen(seed)
    kv = torch.randn(t, 512 * cr, generator=g)
    if adversarial:
        kv[0::5, :4] = float("nan")
        kv[1::7, 9] = float("inf")
        kv[2::4] *= 1e-30
    # Requests: consecutive chunks; positions continue from a random start.
    cuts = sorted(torch.randperm(t - 1, generator=g)[: reqs - 1].add(1).tolist())
    qsl = torch.tensor([0] + cuts + [t])
    ttr = torch.zeros(t, dtype=torch.int64)
    pos = torch.zeros(t, dtype=torch.int64)
    cap = 4
    slots = torch.zeros(t, dtype=torch.int64)
    for r in range(reqs):
        s, e = int(qsl[r]), int(qsl[r + 1])
        start = int(torch.randint(0, 9, (1,), generator=g))
        ttr[s:e] = r
        pos[s:e] = torch.arange(start, start + e - s)
        slots[s:e] = r * cap + pos[s:e] % cap
    if adversarial:
        slots[3] = -1
        slots[t - 1] = 10_000  # ring block out of range
    weight = (torch.rand(512, generator=g) + 0.5).bfloat16()
    state = canary((reqs, cap, 1024), torch.float32, g).nan_to_num()
    latent_out = canary((t, 512), torch.bfloat16, g)
    d = dict(kv_score=kv, positions=pos.to(idx), state_cache=state if cr == 2 else None,
             slot_mapping=slots.to(idx), query_start_loc=qsl.to(idx) if cr == 2 else None,
             token_to_req_indices=ttr.to(idx) if cr == 2 else None, rms_norm_weight=weight,
             rms_norm_eps=1e-6, compress_ratio=cr, latent_out=latent_out)
    if prev and cr == 2:
        d["prev_rows"] = torch.randn(5, 1024, generator=g)
        d["prev_row_indices"] = torch.tensor([2, -1, 4][:reqs] + [0] * max(0, reqs - 3)).to(idx)
    return d


def ring_case(n=9, seed=0, adversarial=False):
    g = gen(seed)
    rows = torch.randn(n, 1024, generator=g)
    slots = torch.randperm(12, generator=g)[:n]
    if adversarial:
        slots[0] = -1
        slots[1] = 99
    return dict(rows=rows, slot_mapping=slots, state_cache=canary((3, 4, 1024), torch.float32, g))


def fused_case(layout, cr, seed=0, adversarial=False):
    c = compress_case(cr, seed=seed, adversarial=adversarial)
    i = insert_case(layout, cr, t=c["kv_score"].shape[0], seed=seed + 1, adversarial=adversarial)
    c.update(cos_sin_cache=i["cos_sin_cache"], kv_cache=i["kv_cache"], cache_slot_mapping=i["slot_mapping"],
             fp8_scale=i["fp8_scale"])
    # Positions must index the table: keep them small.
    c["positions"] = c["positions"].clamp(max=40)
    return c


def clone_t(t):
    """A copy with the same storage size, offset and strides (bytes between
    strided elements included)."""
    if t.is_meta:
        return t
    n = torch.empty(0, dtype=t.dtype)
    n.set_(t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())
    return n


def clone(d):
    return {k: (clone_t(v) if isinstance(v, torch.Tensor) else v) for k, v in d.items()}


def storage_bytes(t):
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def same_storage(a, b):
    """Every byte of the two tensors' storages is equal."""
    if a.is_meta:
        return True
    return torch.equal(storage_bytes(a), storage_bytes(b))


def same_bytes(a, b):
    """Byte equality of two tensors (NaN payloads included)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# safetensors dtype names of the vector files.
VECTOR_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "U8": torch.uint8, "I64": torch.int64,
          "I32": torch.int32, "F8_E4M3": torch.float8_e4m3fn}


def load_vectors(path):
    """A vector file (safetensors: 8-byte header length, JSON header, data):
    its metadata and its tensors by name."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = bytearray(raw[8 + n:])
    out = {}
    for name, h in header.items():
        a, b = h["data_offsets"]
        buf = torch.frombuffer(data[a:b], dtype=torch.uint8) if b > a else torch.empty(0, dtype=torch.uint8)
        out[name] = buf.view(VECTOR_DTYPES[h["dtype"]]).reshape(h["shape"]).clone()
    return meta, out
