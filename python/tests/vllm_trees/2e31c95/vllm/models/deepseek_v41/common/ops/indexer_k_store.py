"""Stand-in for the V4.1 indexer key store of vLLM at commit 2e31c95: its
signature (``mxfp4_n_per_tile``, default 0) and its choices, writing its
bytes through dsv4_kvcache's CPU reference (tests/vllm_standin.py): on ROCm
a paged cache of block_size > 1 takes FP8 keys in 16 x 16 tiles and MXFP4
keys in AITER's order for the given N, which must divide the block size;
FP8 scales are always f32 (this version has no MX scales, although
vllm.utils.deep_gemm still says whether the GPU would want them)."""

import torch

import vllm_standin
from vllm.platforms import current_platform


def indexer_k_norm_rope_store(k_pre: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                              rms_norm_weight: torch.Tensor, rms_norm_eps: float, k_cache: torch.Tensor,
                              kv_slot_mapping: torch.Tensor, compress_ratio: int, use_fp4_cache: bool,
                              mxfp4_n_per_tile: int = 0) -> None:
    block_size = k_cache.shape[1]
    tiled = current_platform.is_rocm() and block_size > 1
    if tiled and use_fp4_cache:
        if mxfp4_n_per_tile not in (16, 32, 64) or block_size % mxfp4_n_per_tile != 0:
            raise ValueError(f"stand-in: N {mxfp4_n_per_tile} does not tile block_size {block_size}")
        order = "preshuffled"
    elif tiled:
        if block_size % 16 != 0:
            raise ValueError(f"stand-in: block_size {block_size} is not a multiple of 16")
        order = "tiled"
    else:
        order = "row_major"
    vllm_standin.indexer_k_norm_rope_store(
        k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache, kv_slot_mapping,
        compress_ratio, use_fp4_cache, order=order, n_per_tile=mxfp4_n_per_tile)
