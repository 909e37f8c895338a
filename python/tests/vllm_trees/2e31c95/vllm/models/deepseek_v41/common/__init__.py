"""Test stand-in package (tests/test_vllm_plugin.py)."""
