"""Stand-in for the one function of vllm.utils.deep_gemm the indexer key
store reads (tests/test_vllm_plugin.py); not vLLM."""

import functools

from vllm.platforms import current_platform


@functools.cache
def mqa_logits_use_mx_scales() -> bool:
    """True where the stand-in platform is a CUDA GPU of the SM100 family."""
    return current_platform.is_cuda() and current_platform.is_device_capability_family(100)
