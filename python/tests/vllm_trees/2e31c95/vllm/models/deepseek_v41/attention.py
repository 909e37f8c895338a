"""Stand-in for the DeepSeek V4.1 attention module of vLLM at commit
2e31c95: the indexer key store bound by name from the ops package at
import, called with ``mxfp4_n_per_tile`` by keyword."""

from vllm.models.deepseek_v41.common.ops import indexer_k_norm_rope_store


class IndexerKeys:
    def __init__(self, compress_ratio, k_norm_weight, eps, k_cache, use_fp4_kv, n_per_tile=0):
        self.compress_ratio = compress_ratio
        self.k_norm_weight = k_norm_weight
        self.eps = eps
        self.k_cache = k_cache
        self.use_fp4_kv = use_fp4_kv
        self.n_per_tile = n_per_tile

    def store(self, k_pre, positions, cos_sin_cache, slot_mapping):
        indexer_k_norm_rope_store(k_pre, positions, cos_sin_cache, self.k_norm_weight, self.eps,
                                  self.k_cache, slot_mapping, self.compress_ratio, self.use_fp4_kv,
                                  mxfp4_n_per_tile=self.n_per_tile)
