"""Stand-in for a second module that binds an op by name: imported by the
tests only after the plugin has replaced it."""

from vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache import rope_quant_insert

__all__ = ["rope_quant_insert"]
