"""The vLLM plugin's former module name, kept for compatibility: the plugin
is the package :mod:`dsv4_kvcache_vllm` (entry point
``dsv4_kvcache_vllm:register``), which imports no native code while it is
switched off. Everything public is re-exported from there."""

from dsv4_kvcache_vllm import ALIAS, ENV, FUNCTIONS, TARGET, TARGETS, register, status, unpatch

__all__ = ["register", "status", "unpatch", "ENV", "ALIAS", "TARGET", "TARGETS", "FUNCTIONS"]
