"""Stand-in for vLLM's V4.1 ops module at commit d444c3d: two functions
(``fused_save_compress_norm`` without ``prev_rows``, no ``save_ring_rows``),
and an insert that takes only the 584 B paged records (plus BF16 and FP8
rows), through dsv4_kvcache's CPU reference (tests/vllm_standin.py)."""

from typing import Optional

import torch

import vllm_standin

_ON_GFX950 = False


def fused_save_compress_norm(kv_score: torch.Tensor, positions: torch.Tensor,
                             state_cache: Optional[torch.Tensor], slot_mapping: torch.Tensor,
                             query_start_loc: Optional[torch.Tensor],
                             token_to_req_indices: Optional[torch.Tensor], rms_norm_weight: torch.Tensor,
                             rms_norm_eps: float, compress_ratio: int, latent_out: torch.Tensor) -> None:
    vllm_standin.fused_save_compress_norm(kv_score, positions, state_cache, slot_mapping,
                                          query_start_loc, token_to_req_indices, rms_norm_weight,
                                          rms_norm_eps, compress_ratio, latent_out)


def rope_quant_insert(latent: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                      kv_cache: torch.Tensor, slot_mapping: torch.Tensor, compress_ratio: int,
                      fp8_scale: Optional[torch.Tensor] = None) -> None:
    vllm_standin.rope_quant_insert(latent, positions, cos_sin_cache, kv_cache, slot_mapping,
                                   compress_ratio, fp8_scale, widths=(584,), per_token=(),
                                   sanitize=_ON_GFX950)
