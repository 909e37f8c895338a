"""Stand-in for vLLM 0.34.0's DeepSeek V4.1 compressor: its import style
(the three ops bound by name at import) and its call sequence. ``forward``
pools and normalizes the step's rows into a latent; under prefill context
parallelism (``prev_rows``: boundary rows gathered from every rank) the
kernel leaves the ring alone and ``save_ring_rows`` then stores the ring
rows. ``insert_cache`` publishes the latent to the compressed cache.
Metadata that vLLM takes from its forward context is passed in."""

from vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache import (
    fused_save_compress_norm,
    rope_quant_insert,
    save_ring_rows,
)


class Compressor:
    def __init__(self, compress_ratio, norm_weight, rms_norm_eps, state_cache=None):
        self.compress_ratio = compress_ratio
        self.norm_weight = norm_weight
        self.rms_norm_eps = rms_norm_eps
        self.state_cache = state_cache

    def forward(self, kv_score, positions, latent, slot_mapping, query_start_loc=None,
                token_to_req_indices=None, prev_rows=None, prev_row_indices=None,
                ring_write_slots=None):
        fused_save_compress_norm(kv_score, positions, self.state_cache, slot_mapping,
                                 query_start_loc, token_to_req_indices, self.norm_weight,
                                 self.rms_norm_eps, self.compress_ratio, latent,
                                 prev_rows=prev_rows, prev_row_indices=prev_row_indices)
        if prev_rows is not None:
            save_ring_rows(prev_rows, ring_write_slots, self.state_cache)
        return latent

    def insert_cache(self, latent, positions, cos_sin_cache, kv_cache, slot_mapping, fp8_scale=None):
        rope_quant_insert(latent, positions, cos_sin_cache, kv_cache, slot_mapping,
                          self.compress_ratio, fp8_scale=fp8_scale)
