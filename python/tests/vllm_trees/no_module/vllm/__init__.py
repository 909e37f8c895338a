"""Test stand-in for a vLLM without the DeepSeek V4.1 ops module."""

__version__ = "0.0.0+no_module"
