"""Stand-in for vLLM's Triton ops module: the seed's signatures, and bodies
that fail, so a call that reaches them shows the plugin did not replace them."""


class NotReplaced(RuntimeError):
    """The stand-in's own function ran."""


def fused_save_compress_norm(kv_score, positions, state_cache, slot_mapping, query_start_loc,
                             token_to_req_indices, rms_norm_weight, rms_norm_eps, compress_ratio,
                             latent_out, prev_rows=None, prev_row_indices=None):
    raise NotReplaced("fused_save_compress_norm")


def rope_quant_insert(latent, positions, cos_sin_cache, kv_cache, slot_mapping, compress_ratio,
                      fp8_scale=None):
    raise NotReplaced("rope_quant_insert")


def save_ring_rows(rows, slot_mapping, state_cache):
    raise NotReplaced("save_ring_rows")
