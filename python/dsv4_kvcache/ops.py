"""The operations as ``torch.library`` custom operators
(``torch.ops.dsv4_kvcache.*``), with their mutated arguments in the schema
and fake implementations, so that ``torch.compile`` traces them without a
graph break and ``torch.cuda.graph`` captures them. They call the same
native functions; the dispatcher adds a few microseconds per eager call,
so eager code should call ``dsv4_kvcache.<name>`` directly.
"""

import inspect
from typing import Optional

import torch

from . import _native

_NS = "dsv4_kvcache"

# Each operation's parameters, written once in torch's schema language: the
# written tensors carry alias sets (a!, b!, c!), so functionalization under
# torch.compile knows what each call mutates, and `*` marks where the native
# function's keyword-only parameters start (the torch schema itself takes
# every parameter positionally). The operators, their kernels, the fake
# implementations and the signatures of the in-graph stand-ins are made from
# this table; tests check it against the native functions' signatures.
_COMPRESSOR = (
    "Tensor kv_score, Tensor positions, Tensor(a!)? state_cache, Tensor slot_mapping, "
    "Tensor? query_start_loc, Tensor? token_to_req_indices, Tensor rms_norm_weight, "
    "float rms_norm_eps, int compress_ratio, Tensor(b!) latent_out"
)
_PREV = "Tensor? prev_rows=None, Tensor? prev_row_indices=None"
_SCHEMAS = {
    "fused_save_compress_norm": f"{_COMPRESSOR}, {_PREV}",
    "rope_quant_insert": (
        "Tensor latent, Tensor positions, Tensor cos_sin_cache, Tensor(a!) kv_cache, "
        "Tensor slot_mapping, int compress_ratio, Tensor? fp8_scale=None, *, bool? sanitize=None, "
        'str record_order="planar"'
    ),
    "save_ring_rows": "Tensor rows, Tensor slot_mapping, Tensor(a!) state_cache",
    "fused_compress_insert": (
        f"{_COMPRESSOR}, Tensor cos_sin_cache, Tensor(c!) kv_cache, Tensor cache_slot_mapping, "
        f"Tensor? fp8_scale=None, {_PREV}, *, bool skip_latent_out=False, bool? sanitize=None, "
        'str record_order="planar"'
    ),
    "gather_dequant": (
        "Tensor kv_cache, Tensor(a!) out, Tensor? slot_mapping=None, *, Tensor? block_table=None, "
        "Tensor? cu_seq_lens=None, Tensor? seq_starts=None, Tensor? fp8_scale=None, "
        'str record_order="planar"'
    ),
    "indexer_k_norm_rope_store": (
        "Tensor k_pre, Tensor positions, Tensor cos_sin_cache, Tensor rms_norm_weight, "
        "float rms_norm_eps, Tensor(a!) k_cache, Tensor kv_slot_mapping, int compress_ratio, "
        'bool use_fp4_cache, int mxfp4_n_per_tile=0, *, str k_order="row_major", bool mx_scale=False'
    ),
}

__all__ = list(_SCHEMAS)

_TYPES = {"Tensor": torch.Tensor, "float": float, "int": int, "bool": bool, "str": str}
_DEFAULTS = {"None": None, "False": False, "True": True}


def _torch_schema(name):
    """The operator's torch schema: every parameter positional."""
    params = [p for p in _SCHEMAS[name].split(", ") if p != "*"]
    return "(" + ", ".join(params) + ") -> ()"


def _signature(name):
    """The native function's signature, as the table states it."""
    params, kind = [], inspect.Parameter.POSITIONAL_OR_KEYWORD
    for p in _SCHEMAS[name].split(", "):
        if p == "*":
            kind = inspect.Parameter.KEYWORD_ONLY
            continue
        ty, rest = p.split(" ")
        pname, _, default = rest.partition("=")
        hint = _TYPES[ty.split("(")[0].rstrip("?")]
        if ty.endswith("?"):
            hint = Optional[hint]
        if default.startswith('"'):
            default = default.strip('"')
        elif default in _DEFAULTS:
            default = _DEFAULTS[default]
        elif default:
            default = int(default)
        else:
            default = inspect.Parameter.empty
        params.append(inspect.Parameter(pname, kind, default=default, annotation=hint))
    return inspect.Signature(params, return_annotation=None)


def _kernel(name):
    """The operator's CPU and CUDA kernel: the native function, with the
    schema's trailing positional arguments passed to its keyword-only
    parameters."""
    native = getattr(_native, name)
    keywords = [p.name for p in _signature(name).parameters.values() if p.kind == p.KEYWORD_ONLY]
    if not keywords:
        return native
    positional = len(_signature(name).parameters) - len(keywords)

    def kernel(*args, **kwargs):
        native(*args[:positional], **dict(zip(keywords, args[positional:])), **kwargs)

    kernel.__name__ = name
    return kernel


def _fake(*args, **kwargs):
    """Tracing: the ops return nothing and only write their mutated inputs."""
    return None


# The low-level registration (a schema plus CPU and CUDA kernels) costs
# about half of what `torch.library.custom_op`'s Python wrapper adds per
# eager call. ROCm builds of torch dispatch their tensors under CUDA too.
_lib = torch.library.Library(_NS, "DEF")
_register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract
for _name in _SCHEMAS:
    _lib.define(_name + _torch_schema(_name))
    _lib.impl(_name, _kernel(_name), "CPU")
    _lib.impl(_name, _kernel(_name), "CUDA")
    _register_fake(f"{_NS}::{_name}", lib=_lib)(_fake)

fused_save_compress_norm = torch.ops.dsv4_kvcache.fused_save_compress_norm
rope_quant_insert = torch.ops.dsv4_kvcache.rope_quant_insert
save_ring_rows = torch.ops.dsv4_kvcache.save_ring_rows
fused_compress_insert = torch.ops.dsv4_kvcache.fused_compress_insert
gather_dequant = torch.ops.dsv4_kvcache.gather_dequant
indexer_k_norm_rope_store = torch.ops.dsv4_kvcache.indexer_k_norm_rope_store


def _in_graph(name):
    """The operator standing for native function `name` inside
    torch.compile, with the native function's signature."""
    op = getattr(torch.ops.dsv4_kvcache, name)

    def in_graph(*args, **kwargs):
        op(*args, **kwargs)

    in_graph.__name__ = f"{name}_in_graph"
    in_graph.__signature__ = _signature(name)
    return in_graph


# Inside torch.compile, the plain functions (native builtins dynamo cannot
# trace) stand for the operators above, so code written against the seed's
# functions compiles without a graph break too (torch >= 2.5).
_substitute = getattr(torch.compiler, "substitute_in_graph", None)
if _substitute is not None:
    for _name in _SCHEMAS:
        _substitute(getattr(_native, _name))(_in_graph(_name))
