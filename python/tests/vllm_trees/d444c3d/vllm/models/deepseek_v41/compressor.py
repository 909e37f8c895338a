"""Stand-in for the DeepSeek V4.1 compressor of vLLM at commit d444c3d: the
two ops bound by name at import, no prefill context parallelism."""

from vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache import (
    fused_save_compress_norm,
    rope_quant_insert,
)


class Compressor:
    def __init__(self, compress_ratio, norm_weight, rms_norm_eps, state_cache=None):
        self.compress_ratio = compress_ratio
        self.norm_weight = norm_weight
        self.rms_norm_eps = rms_norm_eps
        self.state_cache = state_cache

    def forward(self, kv_score, positions, latent, slot_mapping, query_start_loc=None,
                token_to_req_indices=None):
        fused_save_compress_norm(kv_score, positions, self.state_cache, slot_mapping,
                                 query_start_loc, token_to_req_indices, self.norm_weight,
                                 self.rms_norm_eps, self.compress_ratio, latent)
        return latent

    def insert_cache(self, latent, positions, cos_sin_cache, kv_cache, slot_mapping, fp8_scale=None):
        rope_quant_insert(latent, positions, cos_sin_cache, kv_cache, slot_mapping,
                          self.compress_ratio, fp8_scale=fp8_scale)
