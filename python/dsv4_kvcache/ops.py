"""The operations as ``torch.library`` custom operators
(``torch.ops.dsv4_kvcache.*``), with their mutated arguments in the schema
and fake implementations, so that ``torch.compile`` traces them without a
graph break and ``torch.cuda.graph`` captures them. They call the same
native functions; the dispatcher adds a few microseconds per eager call,
so eager code should call ``dsv4_kvcache.<name>`` directly.
"""

from typing import Optional

import torch

from . import _native

__all__ = [
    "fused_save_compress_norm",
    "rope_quant_insert",
    "save_ring_rows",
    "fused_compress_insert",
]

_LIB = "dsv4_kvcache"


@torch.library.custom_op(f"{_LIB}::fused_save_compress_norm", mutates_args=("state_cache", "latent_out"))
def fused_save_compress_norm(
    kv_score: torch.Tensor,
    positions: torch.Tensor,
    state_cache: Optional[torch.Tensor],
    slot_mapping: torch.Tensor,
    query_start_loc: Optional[torch.Tensor],
    token_to_req_indices: Optional[torch.Tensor],
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    compress_ratio: int,
    latent_out: torch.Tensor,
    prev_rows: Optional[torch.Tensor] = None,
    prev_row_indices: Optional[torch.Tensor] = None,
) -> None:
    _native.fused_save_compress_norm(
        kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
        rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, prev_rows, prev_row_indices,
    )


@fused_save_compress_norm.register_fake
def _(kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
      rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, prev_rows=None, prev_row_indices=None):
    return None


@torch.library.custom_op(f"{_LIB}::rope_quant_insert", mutates_args=("kv_cache",))
def rope_quant_insert(
    latent: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    compress_ratio: int,
    fp8_scale: Optional[torch.Tensor] = None,
    sanitize: Optional[bool] = None,
) -> None:
    _native.rope_quant_insert(
        latent, positions, cos_sin_cache, kv_cache, slot_mapping, compress_ratio, fp8_scale,
        sanitize=sanitize,
    )


@rope_quant_insert.register_fake
def _(latent, positions, cos_sin_cache, kv_cache, slot_mapping, compress_ratio, fp8_scale=None, sanitize=None):
    return None


@torch.library.custom_op(f"{_LIB}::save_ring_rows", mutates_args=("state_cache",))
def save_ring_rows(rows: torch.Tensor, slot_mapping: torch.Tensor, state_cache: torch.Tensor) -> None:
    _native.save_ring_rows(rows, slot_mapping, state_cache)


@save_ring_rows.register_fake
def _(rows, slot_mapping, state_cache):
    return None


@torch.library.custom_op(
    f"{_LIB}::fused_compress_insert", mutates_args=("state_cache", "latent_out", "kv_cache")
)
def fused_compress_insert(
    kv_score: torch.Tensor,
    positions: torch.Tensor,
    state_cache: Optional[torch.Tensor],
    slot_mapping: torch.Tensor,
    query_start_loc: Optional[torch.Tensor],
    token_to_req_indices: Optional[torch.Tensor],
    rms_norm_weight: torch.Tensor,
    rms_norm_eps: float,
    compress_ratio: int,
    latent_out: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    kv_cache: torch.Tensor,
    cache_slot_mapping: torch.Tensor,
    fp8_scale: Optional[torch.Tensor] = None,
    prev_rows: Optional[torch.Tensor] = None,
    prev_row_indices: Optional[torch.Tensor] = None,
    skip_latent_out: bool = False,
    sanitize: Optional[bool] = None,
) -> None:
    _native.fused_compress_insert(
        kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
        rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, cos_sin_cache, kv_cache,
        cache_slot_mapping, fp8_scale, prev_rows, prev_row_indices,
        skip_latent_out=skip_latent_out, sanitize=sanitize,
    )


@fused_compress_insert.register_fake
def _(kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
      rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, cos_sin_cache, kv_cache,
      cache_slot_mapping, fp8_scale=None, prev_rows=None, prev_row_indices=None,
      skip_latent_out=False, sanitize=None):
    return None


# Inside torch.compile, the plain functions (native builtins dynamo cannot
# trace) stand for the operators above, so code written against the seed's
# functions compiles without a graph break too (torch >= 2.5).
_substitute = getattr(torch.compiler, "substitute_in_graph", None)
if _substitute is not None:

    @_substitute(_native.fused_save_compress_norm)
    def _fused_save_compress_norm_in_graph(
        kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
        rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, prev_rows=None, prev_row_indices=None,
    ):
        torch.ops.dsv4_kvcache.fused_save_compress_norm(
            kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
            rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, prev_rows, prev_row_indices,
        )

    @_substitute(_native.rope_quant_insert)
    def _rope_quant_insert_in_graph(
        latent, positions, cos_sin_cache, kv_cache, slot_mapping, compress_ratio, fp8_scale=None, *, sanitize=None
    ):
        torch.ops.dsv4_kvcache.rope_quant_insert(
            latent, positions, cos_sin_cache, kv_cache, slot_mapping, compress_ratio, fp8_scale, sanitize
        )

    @_substitute(_native.save_ring_rows)
    def _save_ring_rows_in_graph(rows, slot_mapping, state_cache):
        torch.ops.dsv4_kvcache.save_ring_rows(rows, slot_mapping, state_cache)

    @_substitute(_native.fused_compress_insert)
    def _fused_compress_insert_in_graph(
        kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
        rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, cos_sin_cache, kv_cache,
        cache_slot_mapping, fp8_scale=None, prev_rows=None, prev_row_indices=None, *,
        skip_latent_out=False, sanitize=None,
    ):
        torch.ops.dsv4_kvcache.fused_compress_insert(
            kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
            rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, cos_sin_cache, kv_cache,
            cache_slot_mapping, fp8_scale, prev_rows, prev_row_indices, skip_latent_out, sanitize,
        )
