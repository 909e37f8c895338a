"""Test stand-in for vLLM (tests/test_vllm_plugin.py); not vLLM."""

__version__ = "0.0.0+2e31c95"
