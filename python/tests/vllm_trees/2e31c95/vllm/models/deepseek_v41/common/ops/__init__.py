"""Stand-in for the V4.1 ops package of vLLM at commit 2e31c95
(tests/test_vllm_plugin.py): it re-exports the indexer key store; this
tree has no fused_compress_quant_cache."""

from .indexer_k_store import indexer_k_norm_rope_store

__all__ = ["indexer_k_norm_rope_store"]
