"""DeepSeek V4 / V4.1 compressed KV-cache records over PyTorch tensors.

A drop-in for ``vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache``:
the same three functions with the same arguments and in-place semantics,
plus the fused launch, and the reader ``gather_dequant`` (records gathered
by slot or by block table and written back dequantized to BF16 or F32).
``indexer_k_norm_rope_store`` is a drop-in for vLLM's V4.1 indexer key store
(``vllm.models.deepseek_v41.common.ops.indexer_k_store``), with the page
order an argument. CPU tensors run on the library's CPU reference,
CUDA tensors on its CUDA kernels on torch's current stream, and the "cuda"
tensors of a ROCm build of torch on its HIP kernels. The bytes are the
same on all three.

The functions here are the cheapest path for eager calls (straight into
the native module). They are also registered as torch operators,
``dsv4_kvcache.ops.*`` (``torch.ops.dsv4_kvcache.*``); inside
``torch.compile`` (torch >= 2.5) the plain functions stand for those, so
compiled code traces them without a graph break.
"""

from typing import NamedTuple, Union

from ._native import (
    __version__,
    fused_compress_insert,
    fused_save_compress_norm,
    gather_dequant,
    indexer_k_norm_rope_store,
    info,
    rope_quant_insert,
    save_ring_rows,
)
from . import _native

__all__ = [
    "fused_save_compress_norm",
    "rope_quant_insert",
    "save_ring_rows",
    "fused_compress_insert",
    "gather_dequant",
    "indexer_k_norm_rope_store",
    "SkipCounts",
    "take_skip_counts",
    "init",
    "info",
    "ops",
    "__version__",
]


class SkipCounts(NamedTuple):
    """Tokens skipped because an index they carry is out of range."""

    slot_out_of_range: int
    position_out_of_range: int
    index_out_of_range: int


def _device(device: "Union[str, int, object, None]"):
    import torch

    d = torch.device("cpu" if device is None else device)
    if d.type == "cpu":
        return d, "cpu", 0
    if d.type != "cuda":
        raise ValueError(f"device: {d}, expected cpu or cuda")
    return d, "cuda", torch.cuda.current_device() if d.index is None else d.index


def take_skip_counts(device: "Union[str, int, object, None]" = "cpu") -> SkipCounts:
    """Counts of skipped tokens since the last call on ``device``, then resets
    them. Waits for the device (it synchronizes it), so call it outside
    graph capture and hot loops."""
    d, kind, index = _device(device)
    if kind == "cuda":
        import torch

        torch.cuda.synchronize(d)
    return SkipCounts(*_native._take_skip_counts(kind, index))


def init(device: "Union[str, int, object, None]" = "cpu") -> str:
    """Creates the backend of ``device`` now (kernels loaded, counters
    allocated) and returns its name. A device's first call does this
    implicitly; do it before a ``torch.cuda.graph`` capture."""
    _, kind, index = _device(device)
    return _native._init(kind, index)


from . import ops  # noqa: E402  (registers the torch operators)
