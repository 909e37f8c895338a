"""Stand-in for vllm.platforms (tests/test_vllm_plugin.py); not vLLM.

``current_platform`` answers as the platform named by ``STANDIN_PLATFORM``
says vLLM's would: ``rocm`` (an AMD GPU), ``sm100`` (a CUDA GPU of the
SM100 family), ``cuda`` (any other CUDA GPU); unset, neither ROCm nor CUDA.
"""

import os


class _StandInPlatform:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def is_rocm(self) -> bool:
        return self.kind == "rocm"

    def is_cuda(self) -> bool:
        return self.kind in ("cuda", "sm100")

    def is_device_capability_family(self, family: int) -> bool:
        return self.kind == "sm100" and family == 100


current_platform = _StandInPlatform(os.environ.get("STANDIN_PLATFORM", ""))
