"""What the stand-in ``vllm`` trees' ops do (tests/vllm_trees/), on any
device through dsv4_kvcache's CPU reference: the tensors are copied to the
CPU, the reference runs there, and the written tensors are copied back.

The 528 B and 288 B records are written in vLLM 0.34.0's order (each
token's scales right after its own values) by permuting every page of the
reference's page-planar bytes here, independently of the package's own
``record_order`` code, so that the plugin's self-check is tested against an
order it did not produce itself.

The indexer key store's pages are written row-major by the reference and
then moved here to the order the stand-in's vLLM asks for (ROCm's 16 x 16
FP8 tiles, AITER's MXFP4 order for an N), with the FP8 scales rewritten as
four UE8M0 bytes where it asks for MX scales, again without the package's
own ``k_order`` / ``mx_scale`` code.

``STANDIN_FLIP`` (``function``, ``rope_quant_insert:LAYOUT``, LAYOUT one
of 584, 528, 288, bf16, fp8, or ``indexer_k_norm_rope_store:FORMAT``,
FORMAT fp8 or mxfp4) makes that function write one wrong byte: the last
byte its call changed gets its low bit flipped (in the 288 B records that
is a scale, at a different offset in each order), and :data:`FLIPS`
records it.
"""

import os
from typing import Any, Dict, List, Optional, Sequence

import torch

from dsv4_kvcache import _native

# (function, layout, tensor, byte offset, byte written, correct byte), in call order.
FLIPS: List[Dict[str, Any]] = []

# Value and scale bytes of the records vLLM 0.34.0 writes per token.
SPLIT = {528: (512, 16), 288: (256, 32)}
LAYOUTS = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8"}


def _cpu(x: Any) -> Any:
    return x.detach().to("cpu", copy=True).contiguous() if isinstance(x, torch.Tensor) else x


def to_planar(cache: torch.Tensor) -> torch.Tensor:
    """Per-token pages ([blocks, B, V + S] bytes) as page-planar ones."""
    blocks, b, w = cache.shape
    v, s = SPLIT[w]
    return torch.cat([cache[:, :, :v].reshape(blocks, b * v), cache[:, :, v:].reshape(blocks, b * s)],
                     1).reshape(blocks, b, w)


def to_per_token(cache: torch.Tensor) -> torch.Tensor:
    """Page-planar pages as per-token ones (the inverse of :func:`to_planar`)."""
    blocks, b, w = cache.shape
    v, s = SPLIT[w]
    flat = cache.reshape(blocks, b * w)
    return torch.cat([flat[:, : b * v].reshape(blocks, b, v), flat[:, b * v:].reshape(blocks, b, s)], 2)


def _flip(function: str, layout: str, outputs: Dict[str, torch.Tensor],
          before: Dict[str, torch.Tensor]) -> None:
    want = os.environ.get("STANDIN_FLIP", "")
    if want not in (function, f"{function}:{layout}"):
        return
    for name, t in outputs.items():
        a = t.view(torch.uint8).reshape(-1)
        b = before[name].view(torch.uint8).reshape(-1)
        diff = (a != b).nonzero()
        if diff.numel():
            i = int(diff[-1, 0])
            good = int(a[i])
            a[i] = good ^ 1
            FLIPS.append(dict(function=function, layout=layout, tensor=name, offset=i,
                              written=good ^ 1, correct=good))
            return


def _back(dst: Optional[torch.Tensor], src: Optional[torch.Tensor]) -> None:
    if dst is not None:
        dst.copy_(src)


def rope_quant_insert(latent: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                      kv_cache: torch.Tensor, slot_mapping: torch.Tensor, compress_ratio: int,
                      fp8_scale: Optional[torch.Tensor] = None,
                      widths: Sequence[int] = (584, 528, 288), per_token: Sequence[int] = (528, 288),
                      sanitize: bool = False) -> None:
    """vLLM's insert: ``widths`` the paged record widths it accepts (others
    fail its assertion), ``per_token`` those it writes per token."""
    assert compress_ratio in (1, 2)
    assert latent.shape[1] == 512 and latent.dtype == torch.bfloat16 and latent.is_contiguous()
    if kv_cache.dtype == torch.uint8:
        assert kv_cache.shape[-1] in widths, f"unsupported paged KV record width {kv_cache.shape[-1]}"
        layout = str(kv_cache.shape[-1])
    else:
        assert kv_cache.dtype in LAYOUTS and kv_cache.shape[-1] == 512
        layout = LAYOUTS[kv_cache.dtype]
    cache = _cpu(kv_cache)
    before = cache.clone()
    reorder = kv_cache.dtype == torch.uint8 and kv_cache.shape[-1] in per_token
    work = to_planar(cache) if reorder else cache
    _native._reference("rope_quant_insert", _cpu(latent), _cpu(positions), _cpu(cos_sin_cache), work,
                       _cpu(slot_mapping), compress_ratio, _cpu(fp8_scale), sanitize=sanitize)
    cache = to_per_token(work) if reorder else work
    _flip("rope_quant_insert", layout, {"kv_cache": cache}, {"kv_cache": before})
    kv_cache.copy_(cache)


def fused_save_compress_norm(kv_score: torch.Tensor, positions: torch.Tensor,
                             state_cache: Optional[torch.Tensor], slot_mapping: torch.Tensor,
                             query_start_loc: Optional[torch.Tensor],
                             token_to_req_indices: Optional[torch.Tensor], rms_norm_weight: torch.Tensor,
                             rms_norm_eps: float, compress_ratio: int, latent_out: torch.Tensor,
                             prev_rows: Optional[torch.Tensor] = None,
                             prev_row_indices: Optional[torch.Tensor] = None) -> None:
    """vLLM's compressor kernel (CR1, CR2 with its ring, ``prev_rows``)."""
    assert compress_ratio in (1, 2) and kv_score.dtype == torch.float32
    latent, state = _cpu(latent_out), _cpu(state_cache) if compress_ratio == 2 else None
    before = {"latent_out": latent.clone()}
    outputs = {"latent_out": latent}
    if state is not None:
        before["state_cache"] = state.clone()
        outputs["state_cache"] = state
    _native._reference("fused_save_compress_norm", _cpu(kv_score), _cpu(positions), state,
                       _cpu(slot_mapping), _cpu(query_start_loc), _cpu(token_to_req_indices),
                       _cpu(rms_norm_weight), rms_norm_eps, compress_ratio, latent, _cpu(prev_rows),
                       _cpu(prev_row_indices))
    _flip("fused_save_compress_norm", "", outputs, before)
    latent_out.copy_(latent)
    _back(state_cache if compress_ratio == 2 else None, state)


def save_ring_rows(rows: torch.Tensor, slot_mapping: torch.Tensor, state_cache: torch.Tensor) -> None:
    """vLLM's ring store (slot -1 skipped)."""
    assert rows.dtype == torch.float32 and rows.shape[1] == 1024
    state = _cpu(state_cache)
    before = {"state_cache": state.clone()}
    _native._reference("save_ring_rows", _cpu(rows), _cpu(slot_mapping), state)
    _flip("save_ring_rows", "", {"state_cache": state}, before)
    state_cache.copy_(state)


def key_page_index(block_size: int, fp4: bool, order: str, n: int = 0) -> torch.Tensor:
    """Where each byte of a row-major indexer key page ([block_size] values
    of 128 B (FP8) or 64 B (MXFP4), then [block_size] 4-byte scales) lies in
    ``order``'s page. ``tiled``: positions in tiles of 16, each tile's
    values as [16-byte chunk of the row, position, byte], the scales kept.
    ``preshuffled``: runs of ``n`` positions, values as [16-byte chunk,
    position, byte] and scales as [scale % (64 // n), position,
    scale // (64 // n)]."""
    width = 64 if fp4 else 128
    r = torch.arange(block_size).unsqueeze(1)
    j = torch.arange(width).unsqueeze(0)
    s = torch.arange(4).unsqueeze(0)
    if order == "row_major":
        return torch.arange(block_size * (width + 4))
    if order == "tiled":
        values = (r // 16) * 16 * width + (j // 16) * 256 + (r % 16) * 16 + j % 16
        scales = block_size * width + 4 * r + s
    else:
        lo = 64 // n
        hi = 4 // lo
        values = (r // n) * n * width + (j // 16) * n * 16 + (r % n) * 16 + j % 16
        scales = block_size * width + (r // n) * n * 4 + (s % lo) * n * hi + (r % n) * hi + s // lo
    return torch.cat([values.reshape(-1), scales.reshape(-1)])


def indexer_k_norm_rope_store(k_pre: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                              rms_norm_weight: torch.Tensor, rms_norm_eps: float, k_cache: torch.Tensor,
                              kv_slot_mapping: torch.Tensor, compress_ratio: int, use_fp4_cache: bool,
                              order: str = "row_major", n_per_tile: int = 0, mx_scale: bool = False) -> None:
    """vLLM's indexer key store, writing its pages in ``order`` (the
    caller's vLLM decides it) with f32 or, ``mx_scale``, UE8M0 FP8 scales."""
    num = kv_slot_mapping.numel()
    assert k_pre.ndim == 2 and k_pre.shape[1] == 128 and k_pre.dtype == torch.bfloat16
    assert k_pre.stride(1) == 1 and num <= k_pre.shape[0] and num <= positions.numel()
    assert compress_ratio in (1, 2)
    if num == 0:
        return
    fp4 = bool(use_fp4_cache)
    cache = _cpu(k_cache)
    before = cache.clone()
    blocks, block_size, width = cache.shape
    where = key_page_index(block_size, fp4, order, n_per_tile)
    pages = cache.reshape(blocks, -1)
    row_major = pages[:, where].reshape(cache.shape)
    _native._reference("indexer_k_norm_rope_store", _cpu(k_pre), _cpu(positions), _cpu(cos_sin_cache),
                       _cpu(rms_norm_weight), rms_norm_eps, row_major, _cpu(kv_slot_mapping),
                       compress_ratio, fp4)
    if mx_scale and not fp4:
        slots = _cpu(kv_slot_mapping).long()
        pos = _cpu(positions).long()[:num]
        for slot in slots[(slots >= 0) & ((pos + 1) % compress_ratio == 0)].tolist():
            b, r = divmod(slot, block_size)
            at = block_size * (width - 4) + 4 * r
            scale = row_major[b].reshape(-1)[at: at + 4].clone()
            # The f32 power of two's biased exponent, four times.
            exponent = (int(scale.view(torch.int32).item()) >> 23) & 0xFF
            row_major[b].reshape(-1)[at: at + 4] = exponent
    pages[:, where] = row_major.reshape(blocks, -1)
    _flip("indexer_k_norm_rope_store", "mxfp4" if fp4 else "fp8", {"k_cache": cache}, {"k_cache": before})
    k_cache.copy_(cache)
