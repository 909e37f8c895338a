"""The plugin's byte self-check: vLLM's function and dsv4_kvcache's on the
same small deterministic inputs, on one device, every output byte compared.

Imported only once the plugin is switched on and has a module to check (it
imports torch and dsv4_kvcache). Each function this package can stand in
for has a :class:`Spec` in :data:`SPECS`: its cases (every record layout and
mode the function accepts, random and adversarial values), how ours is
called in a given record order, and how the replacement is bound once the
check has passed. A name added to :data:`SPECS` (and to its module's names
in ``dsv4_kvcache_vllm.FUNCTIONS``) joins the same mechanism. A spec whose
cases and dispatch depend on what vLLM's function reads at run time (the
indexer key store: the platform, its MX scale switch, its parameters) is
first made for that function by :func:`prepare`.

The inputs stay inside vLLM's own contract (every slot in range or -1,
every position inside the cos/sin table), because vLLM's kernels do not
check bounds and a case outside it would write outside its buffers.
"""

from __future__ import annotations

import inspect
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import torch

import dsv4_kvcache as dk

# The record orders this package writes, in order of preference when a
# check cannot tell them apart.
ORDERS = ("planar", "per_token")

# Binding keys of the insert's layouts: the paged record widths, then the
# plain rows (which have no scales, so no record order).
PAGED = ("584", "528", "288")
ROWS = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
_LAYOUT_DTYPE = {"584": (torch.uint8, 584), "528": (torch.uint8, 528), "288": (torch.uint8, 288),
                 "bf16": (torch.bfloat16, 512), "fp8": (torch.float8_e4m3fn, 512)}
LAYOUT_NAMES = {"584": "584 B", "528": "528 B", "288": "288 B", "bf16": "bf16 rows",
                "fp8": "fp8 rows", "": ""}


class Case(NamedTuple):
    """One call: ``values`` (CPU tensors and scalars) passed as ``positional``
    names in order, then ``keywords`` by name, as vLLM's compressor passes
    them; ``layout`` is the binding key the case decides."""

    name: str
    layout: str
    values: Dict[str, Any]
    positional: Tuple[str, ...]
    keywords: Tuple[str, ...]


class Mismatch(NamedTuple):
    """The first byte where ours differs from vLLM's in a case (offset -1:
    ours raised, ``detail`` says what)."""

    case: str
    tensor: str
    offset: int
    theirs: int
    ours: int
    detail: str

    def describe(self) -> str:
        if self.offset < 0:
            return f"case '{self.case}': {self.detail}"
        return (f"case '{self.case}': first differing byte at offset {self.offset} of {self.tensor}"
                f" (vLLM 0x{self.theirs:02x}, ours 0x{self.ours:02x})")


class Result(NamedTuple):
    """A function's check: the order bound per layout (None for a layout
    without orders), or why it is kept; cases run and not comparable."""

    bound: Dict[str, Optional[str]]
    refused: Optional[str]
    cases: int
    not_comparable: Dict[str, List[str]]
    seconds: float


class Spec(NamedTuple):
    """What the plugin knows about one of vLLM's functions."""

    name: str
    # The cases for an original with these parameter names (None: unknown).
    cases: Callable[[Optional[Sequence[str]]], List[Case]]
    # Ours for one record order (None: the layout has none) and sanitize setting.
    ours: Callable[[Optional[str], Optional[bool]], Callable[..., Any]]
    # The replacement: vLLM's original, the order bound per layout, sanitize.
    bind: Callable[[Callable[..., Any], Dict[str, Optional[str]], Optional[bool]], Callable[..., Any]]
    # The spec for one original of vLLM's (None: this one serves every original).
    specialize: Optional[Callable[[Callable[..., Any]], "Spec"]] = None
    # What the specialized spec read from vLLM (for status()), or None.
    facts: Optional[Dict[str, Any]] = None


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _canary(shape: Tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    """Pseudo-random bytes of any dtype, so that a byte nobody should write shows."""
    n = 1
    for s in shape:
        n *= s
    size = n * torch.empty((), dtype=dtype).element_size()
    return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=g).view(dtype).reshape(shape)


def _f32_bits(bits: int) -> float:
    return torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32).item()


def _latent(t: int, g: torch.Generator, adversarial: bool) -> torch.Tensor:
    """BF16 latent rows; adversarial: NaN, infinities, huge, tiny and zero
    rows, blocks whose amax sits on or just above a power-of-two scale
    boundary (MXFP8/V4 blocks of 32 and 64, NVFP4 tiles of 16), e2m1 ties."""
    x = torch.randn(t, 512, generator=g) * torch.exp2(torch.randint(-6, 7, (t, 1), generator=g).float())
    if not adversarial:
        return x.bfloat16()
    x[0, :3] = float("nan")
    x[0, 450] = float("nan")
    x[1, 5], x[1, 17], x[1, 460] = float("inf"), float("-inf"), float("inf")
    x[2, ::3] = 3.0e38
    x[2, 1::3] = -3.0e38
    x[3] = torch.randn(512, generator=g) * 1e-39
    x[4] = 0.0
    x[4, 1::2] = -0.0
    small = torch.rand(512, generator=g) * 0.5
    for j in range(16):
        # MXFP8 block j's amax exactly 448 * 2^(j-8): its exponent is exact.
        x[5, 32 * j: 32 * j + 32] = small[32 * j: 32 * j + 32] * 2.0 ** (j - 8)
        x[5, 32 * j] = 448.0 * 2.0 ** (j - 8)
        # One BF16 step above the boundary: the exponent rounds up.
        x[6, 32 * j: 32 * j + 32] = -small[32 * j: 32 * j + 32] * 2.0 ** (j - 8)
        x[6, 32 * j + 7] = -448.0 * 2.0 ** (j - 8) * (1 + 2.0 ** -7)
    for j in range(32):
        # NVFP4 tile j's amax 6 * 2^(j-12): e4m3 scales from below 2^-9 to past 448.
        x[7, 16 * j: 16 * j + 16] = small[16 * j: 16 * j + 16] * 2.0 ** (j - 12)
        x[7, 16 * j + 3] = 6.0 * 2.0 ** (j - 12)
    # Scale 1 (amax 6) and every e2m1 midpoint, both signs.
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x[8] = torch.cat([ties, -ties]).repeat(32)
    x[9] = torch.where(torch.rand(512, generator=g) < 0.5, -1.0, 1.0) * 2.0 ** 7
    return x.bfloat16()


def _rope_cases(params: Optional[Sequence[str]]) -> List[Case]:
    del params  # every rope_quant_insert so far takes the same arguments
    cases = []
    seed = 1000
    for layout in ("584", "528", "288", "bf16", "fp8"):
        dtype, width = _LAYOUT_DTYPE[layout]
        for cr in (1, 2):
            for kind in ("random", "adversarial"):
                seed += 1
                g = _gen(seed)
                adversarial = kind == "adversarial"
                t, blocks, block = 16, 3, 8
                latent = _latent(t, g, adversarial)
                positions = torch.randint(0, 32, (t,), generator=g)
                slots = torch.randperm(blocks * block, generator=g)[:t]
                if adversarial:
                    # Every special row at an odd position: a group end for CR 1 and 2.
                    positions[:10] = torch.arange(10) * 2 + 1
                    slots[10], slots[13] = -1, -1
                else:
                    slots[3], slots[11] = -1, -1
                ang = torch.rand(32, 32, generator=g) * 6.3
                cos_sin = torch.cat([ang.cos(), ang.sin()], 1)
                if adversarial:
                    cos_sin = cos_sin.bfloat16()
                values = dict(
                    latent=latent, positions=positions, cos_sin_cache=cos_sin,
                    kv_cache=_canary((blocks, block, width), dtype, g), slot_mapping=slots,
                    compress_ratio=cr,
                    fp8_scale=(torch.tensor([0.125 if adversarial else 0.75]) if layout == "fp8" else None),
                )
                cases.append(Case(f"{LAYOUT_NAMES[layout]} cr{cr} {kind}", layout, values,
                                  ("latent", "positions", "cos_sin_cache", "kv_cache", "slot_mapping",
                                   "compress_ratio"), ("fp8_scale",)))
    return cases


def _compress_case(cr: int, adversarial: bool, prev: bool, seed: int,
                   lengths: Sequence[int] = (5, 1, 0, 6, 2),
                   starts: Sequence[int] = (4, 7, 3, 9, 2)) -> Dict[str, Any]:
    """A step of five requests (by default chunks of 5, 1, 0, 6 and 2
    tokens; the last without a ring block, so its slots are -1), ring
    capacity 8."""
    g = _gen(seed)
    t = sum(lengths)
    kv = torch.randn(t, 512 * cr, generator=g) * torch.exp2(torch.randint(-4, 5, (t, 1), generator=g).float())
    if adversarial:
        kv[0, :4] = float("nan")
        kv[2, 7] = float("inf")
        kv[3, 9] = float("-inf")
        kv[5] *= 1e-30
        kv[7] *= 1e20
        kv[9, 3] = 1e-45
        if cr == 2:
            kv[4, 512:] = 1e30
            kv[8, 512 + 11] = float("inf")
            kv[10, 512 + 12] = float("-inf")
            kv[11, 512:] = -1e30
    cap, reqs = 8, len(lengths)
    qsl, ttr, pos, slots = [0], [], [], []
    for r, (n, s) in enumerate(zip(lengths, starts)):
        qsl.append(qsl[-1] + n)
        for k in range(n):
            ttr.append(r)
            pos.append(s + k)
            slots.append(-1 if r == reqs - 1 else (r + 1) * cap + (s + k) % cap)
    state = torch.randn(reqs + 1, cap, 1024, generator=g)
    if adversarial:
        state[2, 6, :3] = float("nan")  # request 1's predecessor row
        state[4, 0, 512] = float("inf")  # request 3's predecessor score
    d: Dict[str, Any] = dict(
        kv_score=kv, positions=torch.tensor(pos), state_cache=state if cr == 2 else None,
        slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor(qsl, dtype=torch.int32) if cr == 2 else None,
        token_to_req_indices=torch.tensor(ttr, dtype=torch.int32) if cr == 2 else None,
        rms_norm_weight=(torch.rand(512, generator=g) + 0.5).bfloat16(), rms_norm_eps=1e-6,
        compress_ratio=cr, latent_out=_canary((t, 512), torch.bfloat16, g))
    if cr == 1:
        # Ratio 1 has no ring: slots only mark valid tokens.
        d["slot_mapping"] = torch.where(torch.arange(t) % 4 == 3, -1, torch.arange(t) + 100)
    if prev:
        rows = torch.randn(6, 1024, generator=g)
        if adversarial:
            rows[2, 1] = float("nan")
        d["prev_rows"] = rows
        d["prev_row_indices"] = torch.tensor([5, 2, -1, 4, 0])
    return d


_COMPRESS_ARGS = ("kv_score", "positions", "state_cache", "slot_mapping", "query_start_loc",
                  "token_to_req_indices", "rms_norm_weight", "rms_norm_eps", "compress_ratio",
                  "latent_out")


def _compress_cases(params: Optional[Sequence[str]]) -> List[Case]:
    with_prev = params is not None and "prev_rows" in params and "prev_row_indices" in params
    modes = [(1, False), (2, False)] + ([(2, True)] if with_prev else [])
    cases = []
    seed = 2000
    for cr, prev in modes:
        for kind in ("random", "adversarial"):
            seed += 1
            values = _compress_case(cr, kind == "adversarial", prev, seed)
            mode = "cr1" if cr == 1 else ("cr2 ring prev_rows" if prev else "cr2 ring")
            cases.append(Case(f"{mode} {kind}", "", values, _COMPRESS_ARGS,
                              ("prev_rows", "prev_row_indices") if prev else ()))
    # Many latents (a prefill step of 512 tokens) per ratio, so that a build
    # of vLLM's kernel with approximate instructions shows: NVIDIA's Triton
    # takes rsqrt and exp as rsqrt.approx and ex2.approx, and on an H100 one
    # BF16 latent element in about 25,000 differed from this package's by
    # one unit in the last place (docs/numerics.md).
    for cr in (1, 2):
        seed += 1
        values = _compress_case(cr, False, False, seed, lengths=(160, 96, 1, 130, 125),
                                starts=(0, 33, 7, 190, 2))
        cases.append(Case(f"{'cr1' if cr == 1 else 'cr2 ring'} bulk", "", values, _COMPRESS_ARGS, ()))
    return cases


def _ring_cases(params: Optional[Sequence[str]]) -> List[Case]:
    del params
    cases = []
    for i, kind in enumerate(("random", "adversarial")):
        g = _gen(3000 + i)
        rows = torch.randn(7, 1024, generator=g)
        if kind == "adversarial":
            # NaN payloads (quiet, signalling, negative), infinities, -0 and a denormal.
            bits = rows.view(torch.int32)
            bits[0, :4] = torch.tensor([0x7FC00001, 0x7F800001, 0xFFC12345 - (1 << 32), 0x7FFFFFFF],
                                       dtype=torch.int32)
            rows[1, 0], rows[1, 1], rows[1, 2] = float("inf"), float("-inf"), -0.0
            rows[2, 5] = _f32_bits(1)
        slots = torch.tensor([9, -1, 3, 17, 8, -1, 22])
        values = dict(rows=rows, slot_mapping=slots, state_cache=_canary((3, 8, 1024), torch.float32, g))
        cases.append(Case(kind, "", values, ("rows", "slot_mapping", "state_cache"), ()))
    return cases


def _order_kwargs(order: Optional[str], sanitize: Optional[bool]) -> Dict[str, Any]:
    """Keywords for ours: the seed's order is the default, so it is not passed."""
    kw: Dict[str, Any] = {"sanitize": sanitize}
    if order is not None and order != "planar":
        kw["record_order"] = order
    return kw


def _rope_ours(order: Optional[str], sanitize: Optional[bool]) -> Callable[..., Any]:
    fn = dk.rope_quant_insert
    kw = _order_kwargs(order, sanitize)

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs, **kw)

    return call


def _rope_bind(original: Callable[..., Any], bound: Dict[str, Optional[str]],
               sanitize: Optional[bool]) -> Callable[..., Any]:
    """The insert that writes the checked layouts with ours, each in the
    order bound to its width, and hands every other layout to vLLM's."""
    ours = dk.rope_quant_insert
    uint8 = torch.uint8
    paged = {int(k): _order_kwargs(o, sanitize) for k, o in bound.items() if k in PAGED}
    rows = {ROWS[k]: _order_kwargs(None, sanitize) for k in bound if k in ROWS}

    def rope_quant_insert(*args: Any, **kwargs: Any) -> Any:
        kv_cache = args[3] if len(args) > 3 else kwargs.get("kv_cache")
        dtype = getattr(kv_cache, "dtype", None)
        if dtype == uint8:
            shape = kv_cache.shape
            kw = paged.get(shape[-1]) if len(shape) else None
        else:
            kw = rows.get(dtype)
        if kw is None:
            return original(*args, **kwargs)
        return ours(*args, **kwargs, **kw)

    rope_quant_insert.__doc__ = (
        "dsv4_kvcache's rope_quant_insert in place of vLLM's, for the layouts its self-check "
        f"passed ({describe_bound(bound)}); vLLM's for any other layout.")
    return rope_quant_insert


def _plain(name: str) -> Tuple[Callable[[Optional[str], Optional[bool]], Callable[..., Any]],
                               Callable[..., Callable[..., Any]]]:
    """``ours`` and ``bind`` of a function without record layouts: ours itself."""

    def ours(order: Optional[str], sanitize: Optional[bool]) -> Callable[..., Any]:
        return getattr(dk, name)

    def bind(original: Callable[..., Any], bound: Dict[str, Optional[str]],
             sanitize: Optional[bool]) -> Callable[..., Any]:
        return getattr(dk, name)

    return ours, bind


# --- The V4.1 indexer key store (module indexer_k_store) -------------------

INDEXER_K = "indexer_k_norm_rope_store"
# vLLM's ROCm tiles (FP8: 16 positions x 16 bytes) and the MFMA N values of
# AITER's MXFP4 order that this package writes.
_TILE = 16
_N_PER_TILE = (16, 32, 64)
_KEY_ARGS = ("k_pre", "positions", "cos_sin_cache", "rms_norm_weight", "rms_norm_eps", "k_cache",
             "kv_slot_mapping", "compress_ratio", "use_fp4_cache")


class KeyPlatform(NamedTuple):
    """What vLLM's indexer key store decides its page order and scale form
    from, read once from vLLM: ``rocm`` (its ``current_platform.is_rocm()``:
    paged caches of block_size > 1 tiled, FP8 in 16 x 16 tiles and, where
    the function takes ``mxfp4_n_per_tile``, MXFP4 in AITER's order),
    ``mx_scale`` (its ``mqa_logits_use_mx_scales()``, read only where the
    function calls it: FP8 scales as four UE8M0 bytes) and ``n_per_tile``
    (whether the function has the parameter ``mxfp4_n_per_tile``; without
    it, vLLM raises on a tiled MXFP4 cache)."""

    rocm: bool
    mx_scale: bool
    n_per_tile: bool


def key_platform(original: Callable[..., Any]) -> KeyPlatform:
    """Reads :class:`KeyPlatform` where vLLM's function reads it: the names
    its code uses, looked up in its own module's globals (the platform
    object vLLM's call sees, its MX scale switch); torch's ROCm build where
    the function has no Python code to look into."""
    fn = inspect.unwrap(original)
    code = getattr(fn, "__code__", None)
    names = set(code.co_names) if code is not None else set()
    glb = getattr(fn, "__globals__", None) or {}
    platform = glb.get("current_platform") if "current_platform" in names else None
    if platform is None:
        platform = getattr(sys.modules.get("vllm.platforms"), "current_platform", None)
    if platform is not None and callable(getattr(platform, "is_rocm", None)):
        rocm = bool(platform.is_rocm())
    else:
        rocm = getattr(torch.version, "hip", None) is not None
    mx = False
    switch = glb.get("mqa_logits_use_mx_scales") if "mqa_logits_use_mx_scales" in names else None
    if callable(switch):
        mx = bool(switch())
    params = parameters(original) or []
    return KeyPlatform(rocm, mx, "mxfp4_n_per_tile" in params)


def key_order(platform: KeyPlatform, fp4: bool, block_size: int) -> str:
    """The page order vLLM writes a call's keys in (``k_order``)."""
    if platform.rocm and block_size > 1:
        return "preshuffled" if fp4 else "tiled"
    return "row_major"


def key_layout(platform: KeyPlatform, fp4: bool, order: str) -> str:
    """The binding key of the keys vLLM writes in one format and order."""
    if fp4:
        return f"mxfp4 keys {order}"
    return f"fp8 keys {order}" + (", ue8m0 scales" if platform.mx_scale else "")


def _key_rows(t: int, g: torch.Generator, adversarial: bool) -> torch.Tensor:
    """``wk(latent)`` rows (f32, before the BF16 rounding); adversarial:
    zero, infinite (a no-RoPE and a RoPE dim), NaN, huge (the variance
    overflows), tiny (the epsilon dominates), subnormal and -0 rows, 32-dim
    blocks twenty binades apart (MXFP4 scales down to their floor), e2m1
    ties and a row with one dim far above the rest (FP8 steps)."""
    x = torch.randn(t, 128, generator=g) * torch.exp2(torch.randint(-6, 7, (t, 1), generator=g).float())
    if not adversarial:
        return x
    x[0] = 0.0
    x[1, 5] = float("inf")
    x[2, 100] = float("-inf")
    x[3, 70] = float("nan")
    x[3, 7] = float("nan")
    x[4, 0::2] = 3.0e38
    x[4, 1::2] = -3.0e38
    x[5] = torch.randn(128, generator=g) * 1e-30
    x[6] = torch.randn(128, generator=g) * 1e-39
    x[7] = -0.0
    for j in range(4):
        x[8, 32 * j: 32 * j + 32] *= 2.0 ** (20 * j - 50)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x[9] = torch.cat([ties, -ties]).repeat(8)
    x[10, 77] = 1e6
    return x


def _key_case(platform: KeyPlatform, fp4: bool, block: int, cr: int, adversarial: bool, seed: int,
              n_per_tile: int) -> Dict[str, Any]:
    """One call of 16 tokens (and 3 rows of padding in ``k_pre`` and
    ``positions``, as vLLM's padded batches have), two of them with slot
    -1, positions on and off group boundaries, every slot in range and
    distinct, every position inside the cos/sin table."""
    g = _gen(seed)
    t, pad, max_pos = 16, 3, 64
    blocks = max(2, -(-(t + 4) // block))
    rows = _key_rows(t + pad, g, adversarial)
    if adversarial:
        # A row stride other than 128 (vLLM reads k_pre.stride(0)).
        wide = torch.randn(t + pad, 192, generator=g)
        wide[:, 32:160] = rows
        k_pre = wide.bfloat16()[:, 32:160]
    else:
        k_pre = rows.bfloat16()
    positions = torch.randint(0, max_pos, (t + pad,), generator=g)
    slots = torch.randperm(blocks * block, generator=g)[:t]
    if adversarial:
        # Every special row at an odd position: a group end for CR 1 and 2.
        positions[:11] = torch.arange(11) * 2 + 1
        slots[11], slots[14] = -1, -1
        positions, slots = positions.int(), slots.int()
    else:
        slots[3], slots[12] = -1, -1
    ang = torch.rand(max_pos, 32, generator=g) * 6.3
    cos_sin = torch.cat([ang.cos(), ang.sin()], 1)
    weight = 1.0 + 0.25 * torch.randn(128, generator=g)
    if adversarial:
        cos_sin, weight = cos_sin.bfloat16(), weight.bfloat16()
    values: Dict[str, Any] = dict(
        k_pre=k_pre, positions=positions, cos_sin_cache=cos_sin, rms_norm_weight=weight,
        rms_norm_eps=1e-6, k_cache=_canary((blocks, block, 68 if fp4 else 132), torch.uint8, g),
        kv_slot_mapping=slots, compress_ratio=cr, use_fp4_cache=fp4)
    if platform.n_per_tile:
        values["mxfp4_n_per_tile"] = n_per_tile
    return values


def _key_cases(platform: KeyPlatform) -> List[Case]:
    """FP8 and MXFP4 keys, CR 1 and 2, random and adversarial, paged caches
    of 16 and 64 positions a block (and one of 1, which vLLM writes
    row-major on ROCm too), each case's layout the order vLLM writes it in
    on this platform."""
    cases = []
    seed = 4000
    keywords = ("mxfp4_n_per_tile",) if platform.n_per_tile else ()
    plan = [(fp4, block, cr, kind) for fp4 in (False, True) for block in (16, 64) for cr in (1, 2)
            for kind in ("random", "adversarial")]
    plan += [(False, 1, 2, "random"), (True, 1, 2, "random")]
    for i, (fp4, block, cr, kind) in enumerate(plan):
        seed += 1
        # AITER's N: each of 16, 32 and 64 where it divides the block size
        # (passed to every call of a function that takes it: vLLM ignores
        # it outside ROCm's MXFP4 caches, and so must ours).
        n = 16 if block == 16 else (0 if block == 1 else _N_PER_TILE[1 + i % 2])
        values = _key_case(platform, fp4, block, cr, kind == "adversarial", seed, n)
        layout = key_layout(platform, fp4, key_order(platform, fp4, block))
        name = f"{'mxfp4' if fp4 else 'fp8'} block {block} cr{cr} {kind}"
        if platform.n_per_tile and fp4 and block > 1:
            name += f" N {n}"
        cases.append(Case(name, layout, values, _KEY_ARGS, keywords))
    return cases


def _key_dispatch(platform: KeyPlatform, original: Callable[..., Any],
                  bound: Optional[Iterable[str]]) -> Callable[..., Any]:
    """Ours with vLLM's signature, writing each call in the order vLLM
    would on this platform (and its scale form), for the layouts in
    ``bound`` (None: all); vLLM's function for every other call, and for
    the calls on which vLLM raises (MXFP4 on a tiled ROCm cache without
    ``mxfp4_n_per_tile``, a block size the tiles do not divide, an N other
    than 16, 32 or 64 or one that does not divide the block size), so that
    the caller sees vLLM's error."""
    ours = dk.indexer_k_norm_rope_store
    layouts = None if bound is None else set(bound)

    def kwargs(fp4: bool, block_size: int) -> Optional[Dict[str, Any]]:
        order = key_order(platform, fp4, block_size)
        if order == "preshuffled" and not platform.n_per_tile:
            return None
        if layouts is not None and key_layout(platform, fp4, order) not in layouts:
            return None
        mx = platform.mx_scale and not fp4
        # vLLM's CUDA order with f32 scales is ours by default: no keywords to parse.
        return {} if order == "row_major" and not mx else {"k_order": order, "mx_scale": mx}

    # Per format (FP8, MXFP4): the keywords of a row-major call, and of a
    # tiled one (a ROCm cache of block_size > 1).
    flat = (kwargs(False, 1), kwargs(True, 1))
    tiled = (kwargs(False, 2), kwargs(True, 2)) if platform.rocm else flat
    rocm = platform.rocm

    def pick(fp4: int, k_cache: Any, n: int) -> Optional[Dict[str, Any]]:
        block_size = k_cache.shape[1]
        if block_size <= 1:
            return flat[fp4]
        if fp4:
            return tiled[1] if n in _N_PER_TILE and block_size % n == 0 else None
        return tiled[0] if block_size % _TILE == 0 else None

    if platform.n_per_tile:
        def indexer_k_norm_rope_store(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps,
                                      k_cache, kv_slot_mapping, compress_ratio, use_fp4_cache,
                                      mxfp4_n_per_tile=0):
            fp4 = 1 if use_fp4_cache else 0
            kw = pick(fp4, k_cache, mxfp4_n_per_tile) if rocm else flat[fp4]
            if kw is None:
                return original(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache,
                                kv_slot_mapping, compress_ratio, use_fp4_cache, mxfp4_n_per_tile)
            return ours(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache,
                        kv_slot_mapping, compress_ratio, use_fp4_cache, mxfp4_n_per_tile, **kw)
    else:
        def indexer_k_norm_rope_store(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps,
                                      k_cache, kv_slot_mapping, compress_ratio, use_fp4_cache):
            fp4 = 1 if use_fp4_cache else 0
            kw = pick(fp4, k_cache, 0) if rocm else flat[fp4]
            if kw is None:
                return original(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache,
                                kv_slot_mapping, compress_ratio, use_fp4_cache)
            return ours(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache,
                        kv_slot_mapping, compress_ratio, use_fp4_cache, **kw)

    what = "every layout" if layouts is None else (describe_bound({k: None for k in sorted(layouts)})
                                                     or "no layout")
    indexer_k_norm_rope_store.__doc__ = (
        "dsv4_kvcache's indexer_k_norm_rope_store in place of vLLM's, in the page order and scale "
        f"form vLLM writes on this platform ({platform_text(platform)}), for the layouts its "
        f"self-check passed ({what}); vLLM's for any other call.")
    return indexer_k_norm_rope_store


def platform_text(platform: KeyPlatform) -> str:
    """``ROCm, FP8 scales f32, mxfp4_n_per_tile taken``, for the log and docs."""
    return (f"{'ROCm' if platform.rocm else 'not ROCm'}, FP8 scales "
            f"{'as four UE8M0 bytes' if platform.mx_scale else 'f32'}, mxfp4_n_per_tile "
            f"{'taken' if platform.n_per_tile else 'absent'}")


def _key_spec(original: Callable[..., Any]) -> Spec:
    """The indexer key store's spec for vLLM's ``original``."""
    platform = key_platform(original)

    def cases(params: Optional[Sequence[str]]) -> List[Case]:
        del params  # read into the platform already
        return _key_cases(platform)

    def ours(order: Optional[str], sanitize: Optional[bool]) -> Callable[..., Any]:
        return _key_dispatch(platform, original, None)

    def bind(fn: Callable[..., Any], bound: Dict[str, Optional[str]],
             sanitize: Optional[bool]) -> Callable[..., Any]:
        return _key_dispatch(platform, fn, bound)

    return Spec(INDEXER_K, cases, ours, bind, None, platform._asdict())


def _unprepared(*args: Any) -> Any:
    raise TypeError(f"the spec of {INDEXER_K} is made per vLLM function: call prepare() first")


def prepare(spec: Spec, original: Callable[..., Any]) -> Spec:
    """``spec`` made for vLLM's function ``original`` (itself where it
    serves every original)."""
    return spec if spec.specialize is None else spec.specialize(original)


SPECS: Dict[str, Spec] = {
    "fused_save_compress_norm": Spec("fused_save_compress_norm", _compress_cases,
                                     *_plain("fused_save_compress_norm")),
    "rope_quant_insert": Spec("rope_quant_insert", _rope_cases, _rope_ours, _rope_bind),
    "save_ring_rows": Spec("save_ring_rows", _ring_cases, *_plain("save_ring_rows")),
    INDEXER_K: Spec(INDEXER_K, _unprepared, _unprepared, _unprepared, _key_spec),
}


def describe_bound(bound: Dict[str, Optional[str]]) -> str:
    """``584 B planar, 528 B per_token, bf16 rows`` (empty for no layouts)."""
    parts = []
    for key, order in bound.items():
        if not key:
            continue
        name = LAYOUT_NAMES.get(key, key)
        parts.append(f"{name} {order}" if order else name)
    return ", ".join(parts)


def parameters(fn: Callable[..., Any]) -> Optional[List[str]]:
    """The parameter names of ``fn``'s signature, or None where it has none."""
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _to(values: Dict[str, Any], device: torch.device) -> Dict[str, Any]:
    return {k: (v.to(device, copy=True) if isinstance(v, torch.Tensor) else v) for k, v in values.items()}


def _call(fn: Callable[..., Any], case: Case, values: Dict[str, Any]) -> None:
    args = [values[n] for n in case.positional]
    kwargs = {n: values[n] for n in case.keywords}
    fn(*args, **kwargs)


def _first_difference(case: Case, theirs: Dict[str, Any], ours: Dict[str, Any]) -> Optional[Mismatch]:
    """The first differing byte over every tensor argument (outputs and
    inputs alike: neither side may write what the other does not)."""
    for name, a in theirs.items():
        if not isinstance(a, torch.Tensor):
            continue
        x = a.contiguous().view(torch.uint8).reshape(-1)
        y = ours[name].contiguous().view(torch.uint8).reshape(-1)
        if torch.equal(x, y):
            continue
        i = int((x != y).nonzero()[0, 0].item())
        return Mismatch(case.name, name, i, int(x[i].item()), int(y[i].item()), "")
    return None


def orders_of(layout: str) -> Tuple[Optional[str], ...]:
    """The record orders a layout can be bound in (``(None,)``: it has none)."""
    return ORDERS if layout in PAGED else (None,)


def run(spec: Spec, original: Callable[..., Any], device: torch.device,
        sanitize: Optional[bool]) -> Tuple[Result, Dict[str, Dict[Optional[str], Mismatch]]]:
    """Runs ``spec``'s cases through ``original`` and ours on ``device``.
    Returns the decision and, per layout and order, the first mismatch.
    vLLM's failures on a case make it not comparable; they never escape.
    A spec made per original (:func:`prepare`) is made for ``original`` here
    if it was not yet."""
    start = time.perf_counter()
    spec = prepare(spec, original)
    cases = spec.cases(parameters(original))
    not_comparable: Dict[str, List[str]] = {}
    mismatches: Dict[str, Dict[Optional[str], Mismatch]] = {}
    compared: Dict[str, int] = {}
    for case in cases:
        base = _to(case.values, device)
        theirs = _to(base, device)
        try:
            _call(original, case, theirs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        except Exception as e:  # noqa: BLE001  (vLLM's function cannot run this case here)
            text = str(e).strip().splitlines()
            why = f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__
            not_comparable.setdefault(why, []).append(case.name)
            continue
        compared[case.layout] = compared.get(case.layout, 0) + 1
        for order in orders_of(case.layout):
            if order in mismatches.get(case.layout, {}):
                continue
            ours = _to(base, device)
            try:
                _call(spec.ours(order, sanitize), case, ours)
                found = _first_difference(case, theirs, ours)
            except Exception as e:  # noqa: BLE001  (ours refusing a case vLLM accepts is a difference)
                found = Mismatch(case.name, "", -1, 0, 0, f"ours raised {type(e).__name__}: {e}")
            if found is not None:
                mismatches.setdefault(case.layout, {})[order] = found
    bound: Dict[str, Optional[str]] = {}
    differences = []
    for layout in compared:
        failed = mismatches.get(layout, {})
        good = [o for o in orders_of(layout) if o not in failed]
        if good:
            bound[layout] = good[0]
            continue
        what = "; ".join((f"{o} order: " if o else "") + m.describe() for o, m in failed.items())
        differences.append((f"{LAYOUT_NAMES.get(layout, layout)}: " if layout else "") + what)
    refused = None
    if differences:
        refused = "ours differs from vLLM's: " + " | ".join(differences)
    elif not compared:
        refused = "vLLM's function ran no case on this device, so nothing could be compared"
    result = Result({} if refused else bound, refused, len(cases), not_comparable,
                    time.perf_counter() - start)
    return result, mismatches
