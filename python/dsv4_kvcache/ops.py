"""The operations as ``torch.library`` custom operators
(``torch.ops.dsv4_kvcache.*``), with their mutated arguments in the schema
and fake implementations, so that ``torch.compile`` traces them without a
graph break and ``torch.cuda.graph`` captures them. They call the same
native functions; the dispatcher adds a few microseconds per eager call,
so eager code should call ``dsv4_kvcache.<name>`` directly.
"""

import torch

from . import _native

__all__ = [
    "fused_save_compress_norm",
    "rope_quant_insert",
    "save_ring_rows",
    "fused_compress_insert",
    "gather_dequant",
]

_NS = "dsv4_kvcache"

# The schemas name every written tensor (alias sets a!, b!, c!), so
# functionalization under torch.compile knows what each call mutates.
_SCHEMAS = {
    "fused_save_compress_norm": (
        "(Tensor kv_score, Tensor positions, Tensor(a!)? state_cache, Tensor slot_mapping, "
        "Tensor? query_start_loc, Tensor? token_to_req_indices, Tensor rms_norm_weight, "
        "float rms_norm_eps, int compress_ratio, Tensor(b!) latent_out, Tensor? prev_rows=None, "
        "Tensor? prev_row_indices=None) -> ()"
    ),
    "rope_quant_insert": (
        "(Tensor latent, Tensor positions, Tensor cos_sin_cache, Tensor(a!) kv_cache, "
        "Tensor slot_mapping, int compress_ratio, Tensor? fp8_scale=None, bool? sanitize=None) -> ()"
    ),
    "save_ring_rows": "(Tensor rows, Tensor slot_mapping, Tensor(a!) state_cache) -> ()",
    "fused_compress_insert": (
        "(Tensor kv_score, Tensor positions, Tensor(a!)? state_cache, Tensor slot_mapping, "
        "Tensor? query_start_loc, Tensor? token_to_req_indices, Tensor rms_norm_weight, "
        "float rms_norm_eps, int compress_ratio, Tensor(b!) latent_out, Tensor cos_sin_cache, "
        "Tensor(c!) kv_cache, Tensor cache_slot_mapping, Tensor? fp8_scale=None, "
        "Tensor? prev_rows=None, Tensor? prev_row_indices=None, bool skip_latent_out=False, "
        "bool? sanitize=None) -> ()"
    ),
    "gather_dequant": (
        "(Tensor kv_cache, Tensor(a!) out, Tensor? slot_mapping=None, Tensor? block_table=None, "
        "Tensor? cu_seq_lens=None, Tensor? seq_starts=None, Tensor? fp8_scale=None) -> ()"
    ),
}


def _fused_save_compress_norm(kv_score, positions, state_cache, slot_mapping, query_start_loc,
                              token_to_req_indices, rms_norm_weight, rms_norm_eps, compress_ratio,
                              latent_out, prev_rows=None, prev_row_indices=None):
    _native.fused_save_compress_norm(
        kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
        rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, prev_rows, prev_row_indices,
    )


def _rope_quant_insert(latent, positions, cos_sin_cache, kv_cache, slot_mapping, compress_ratio,
                       fp8_scale=None, sanitize=None):
    _native.rope_quant_insert(
        latent, positions, cos_sin_cache, kv_cache, slot_mapping, compress_ratio, fp8_scale,
        sanitize=sanitize,
    )


def _save_ring_rows(rows, slot_mapping, state_cache):
    _native.save_ring_rows(rows, slot_mapping, state_cache)


def _fused_compress_insert(kv_score, positions, state_cache, slot_mapping, query_start_loc,
                           token_to_req_indices, rms_norm_weight, rms_norm_eps, compress_ratio,
                           latent_out, cos_sin_cache, kv_cache, cache_slot_mapping, fp8_scale=None,
                           prev_rows=None, prev_row_indices=None, skip_latent_out=False, sanitize=None):
    _native.fused_compress_insert(
        kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
        rms_norm_weight, rms_norm_eps, compress_ratio, latent_out, cos_sin_cache, kv_cache,
        cache_slot_mapping, fp8_scale, prev_rows, prev_row_indices,
        skip_latent_out=skip_latent_out, sanitize=sanitize,
    )


def _gather_dequant(kv_cache, out, slot_mapping=None, block_table=None, cu_seq_lens=None,
                    seq_starts=None, fp8_scale=None):
    _native.gather_dequant(
        kv_cache, out, slot_mapping, block_table=block_table, cu_seq_lens=cu_seq_lens,
        seq_starts=seq_starts, fp8_scale=fp8_scale,
    )


def _fake(*args, **kwargs):
    """Tracing: the ops return nothing and only write their mutated inputs."""
    return None


# The low-level registration (a schema plus CPU and CUDA kernels) costs
# about half of what `torch.library.custom_op`'s Python wrapper adds per
# eager call. ROCm builds of torch dispatch their tensors under CUDA too.
_lib = torch.library.Library(_NS, "DEF")
_register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
for _name, _impl in [
    ("fused_save_compress_norm", _fused_save_compress_norm),
    ("rope_quant_insert", _rope_quant_insert),
    ("save_ring_rows", _save_ring_rows),
    ("fused_compress_insert", _fused_compress_insert),
    ("gather_dequant", _gather_dequant),
]:
    _lib.define(_name + _SCHEMAS[_name])
    _lib.impl(_name, _impl, "CPU")
    _lib.impl(_name, _impl, "CUDA")
    _register_fake(f"{_NS}::{_name}", lib=_lib)(_fake)

fused_save_compress_norm = torch.ops.dsv4_kvcache.fused_save_compress_norm
rope_quant_insert = torch.ops.dsv4_kvcache.rope_quant_insert
save_ring_rows = torch.ops.dsv4_kvcache.save_ring_rows
fused_compress_insert = torch.ops.dsv4_kvcache.fused_compress_insert
gather_dequant = torch.ops.dsv4_kvcache.gather_dequant


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

    @_substitute(_native.gather_dequant)
    def _gather_dequant_in_graph(
        kv_cache, out, slot_mapping=None, *, block_table=None, cu_seq_lens=None, seq_starts=None,
        fp8_scale=None,
    ):
        torch.ops.dsv4_kvcache.gather_dequant(
            kv_cache, out, slot_mapping, block_table, cu_seq_lens, seq_starts, fp8_scale
        )
