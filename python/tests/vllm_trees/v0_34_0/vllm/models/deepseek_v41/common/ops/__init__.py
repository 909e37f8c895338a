"""Stand-in for vLLM 0.34.0's V4.1 ops package (tests/test_vllm_plugin.py):
like vLLM's, it re-exports the indexer key store, so importing any of its
modules first runs ``indexer_k_store``."""

from .indexer_k_store import indexer_k_norm_rope_store

__all__ = ["indexer_k_norm_rope_store"]
