"""Stand-in for vLLM 0.34.0's V4.1 ops module: its three functions with its
signatures, writing its bytes (the 584 B records page-planar, the 528 B and
288 B records per token) through dsv4_kvcache's CPU reference
(tests/vllm_standin.py)."""

from typing import Optional

import torch

import vllm_standin

# vLLM's sanitize setting (off except on gfx950 under ROCm).
_ON_GFX950 = False


def fused_save_compress_norm(kv_score: torch.Tensor, positions: torch.Tensor,
                             state_cache: Optional[torch.Tensor], slot_mapping: torch.Tensor,
                             query_start_loc: Optional[torch.Tensor],
                             token_to_req_indices: Optional[torch.Tensor], rms_norm_weight: torch.Tensor,
                             rms_norm_eps: float, compress_ratio: int, latent_out: torch.Tensor,
                             prev_rows: Optional[torch.Tensor] = None,
                             prev_row_indices: Optional[torch.Tensor] = None) -> None:
    vllm_standin.fused_save_compress_norm(kv_score, positions, state_cache, slot_mapping,
                                          query_start_loc, token_to_req_indices, rms_norm_weight,
                                          rms_norm_eps, compress_ratio, latent_out, prev_rows,
                                          prev_row_indices)


def save_ring_rows(rows: torch.Tensor, slot_mapping: torch.Tensor, state_cache: torch.Tensor) -> None:
    vllm_standin.save_ring_rows(rows, slot_mapping, state_cache)


def rope_quant_insert(latent: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                      kv_cache: torch.Tensor, slot_mapping: torch.Tensor, compress_ratio: int,
                      fp8_scale: Optional[torch.Tensor] = None) -> None:
    vllm_standin.rope_quant_insert(latent, positions, cos_sin_cache, kv_cache, slot_mapping,
                                   compress_ratio, fp8_scale, sanitize=_ON_GFX950)
