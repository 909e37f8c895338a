"""Stand-in for vLLM 0.34.0's V4.1 indexer key store: its signature (no
``mxfp4_n_per_tile``) and its choices, writing its bytes through
dsv4_kvcache's CPU reference (tests/vllm_standin.py): on ROCm a paged cache
of block_size > 1 takes FP8 keys in 16 x 16 tiles (a block size those do
not divide is refused) and refuses MXFP4 keys; FP8 scales are four UE8M0
bytes where ``mqa_logits_use_mx_scales()`` says so."""

import torch

import vllm_standin
from vllm.platforms import current_platform
from vllm.utils.deep_gemm import mqa_logits_use_mx_scales


def indexer_k_norm_rope_store(k_pre: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                              rms_norm_weight: torch.Tensor, rms_norm_eps: float, k_cache: torch.Tensor,
                              kv_slot_mapping: torch.Tensor, compress_ratio: int,
                              use_fp4_cache: bool) -> None:
    tiled = current_platform.is_rocm() and k_cache.shape[1] > 1
    if tiled and use_fp4_cache:
        raise NotImplementedError("stand-in: no tiled MXFP4 indexer key cache on ROCm")
    if tiled and k_cache.shape[1] % 16 != 0:
        raise ValueError(f"stand-in: block_size {k_cache.shape[1]} is not a multiple of 16")
    vllm_standin.indexer_k_norm_rope_store(
        k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache, kv_slot_mapping,
        compress_ratio, use_fp4_cache, order="tiled" if tiled else "row_major",
        mx_scale=not use_fp4_cache and mqa_logits_use_mx_scales())
