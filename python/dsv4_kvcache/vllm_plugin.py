"""The vLLM plugin: dsv4_kvcache's three functions in place of the Triton ones
of ``vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache``.

vLLM calls :func:`register` (entry point ``dsv4_kvcache`` of the group
``vllm.general_plugins``) in each of its processes. It does nothing unless
``DSV4_KVCACHE_VLLM=1``, so installing the wheel never changes vLLM by
itself (loading the entry point imports ``dsv4_kvcache``, which registers
its ``torch.ops.dsv4_kvcache`` operators and loads its native module, and
nothing else). Active, it replaces ``fused_save_compress_norm``,
``rope_quant_insert`` and ``save_ring_rows`` in that module and in every
loaded module that bound them by name (the compressor does ``from
...fused_compress_quant_cache import ...``), and installs an import hook
that does the same for ``vllm`` modules imported later (the ops module
itself included, when it is not loaded yet). Where vLLM has no such module,
it logs so and changes nothing.

It never imports the ops module itself (importing it early could initialize
a GPU in vLLM's parent process) and never initializes CUDA: the worker's
backend is created (:func:`dsv4_kvcache.init`) when the functions are
installed in a process whose CUDA is already initialized (a worker loading
its model), and otherwise by the first call, which vLLM makes in its profile
run, eagerly, before it captures graphs.
"""

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading

ENV = "DSV4_KVCACHE_VLLM"
TARGET = "vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache"
NAMES = ("fused_save_compress_norm", "rope_quant_insert", "save_ring_rows")

# A child of vLLM's logger, so the lines go where vLLM's own go.
logger = logging.getLogger("vllm.plugins.dsv4_kvcache")

_lock = threading.RLock()
# (name, function) of every replaced function seen (a reloaded ops module
# makes new ones).
_originals = []
# (module, attribute, original) of every replacement, for unpatch().
_patched = []
_finder = None
_initialized_devices = set()


def _ours():
    import dsv4_kvcache

    return {name: getattr(dsv4_kvcache, name) for name in NAMES}


def _version():
    import dsv4_kvcache

    return dsv4_kvcache.__version__


def _target_exists():
    """Whether vLLM has the ops module, found without executing it or any
    package above it that is not loaded yet."""
    parts = TARGET.split(".")
    path = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        module = sys.modules.get(name)
        if module is not None:
            path = getattr(module, "__path__", None)
            if i + 1 < len(parts) and path is None:
                return False
            continue
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return False
        path = spec.submodule_search_locations
        if i + 1 < len(parts) and path is None:
            return False
    return True


def _vllm_version():
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:  # noqa: BLE001  (a stub or source tree has no metadata)
        return "unknown"


def _init_backend():
    """Creates the backend of torch's current CUDA device, once per device,
    where this process has initialized CUDA already (never initializes it)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    device = torch.cuda.current_device()
    if device in _initialized_devices:
        return
    import dsv4_kvcache

    _initialized_devices.add(device)
    try:
        name = dsv4_kvcache.init(device)
    except Exception as e:  # noqa: BLE001  (the calls raise it again, where vLLM reports it)
        logger.warning("dsv4-kvcache %s: no backend on cuda:%d: %s", _version(), device, e)
        return
    logger.info("dsv4-kvcache %s: backend created on cuda:%d (%s)", _version(), device, name)


def _patch_module(module):
    """Replaces, in ``module``, every attribute that is one of the original
    functions; returns the attribute names replaced."""
    ours = _ours()
    done = []
    for name, fn in list(vars(module).items()):
        for orig_name, orig in _originals:
            if fn is orig:
                setattr(module, name, ours[orig_name])
                _patched.append((module, name, fn))
                done.append(name)
                break
    return done


def _adopt_target(module):
    """Records the ops module's functions as the originals and replaces them
    there and in every loaded module; returns {module name: names} or None
    when the module lacks one of the functions (another vLLM)."""
    ours = _ours()
    found = {name: getattr(module, name, None) for name in NAMES}
    missing = [n for n, f in found.items() if not callable(f)]
    if missing:
        logger.warning(
            "dsv4-kvcache %s: %s has no %s; nothing patched",
            _version(), TARGET, ", ".join(missing),
        )
        return None
    for name, fn in found.items():
        if fn is not ours[name] and all(fn is not o for _, o in _originals):
            _originals.append((name, fn))
    report = {}
    for mod_name, mod in list(sys.modules.items()):
        if mod is None or mod_name == __name__:
            continue
        try:
            names = _patch_module(mod)
        except Exception:  # noqa: BLE001  (a module whose attributes cannot be read or set)
            continue
        if names:
            report[mod_name] = names
    return report


def _log_patched(report):
    what = "; ".join(f"{m} ({', '.join(n)})" for m, n in sorted(report.items()))
    logger.info("dsv4-kvcache %s: replaced the Triton functions in %s", _version(), what)


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then patches the module it made."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        with _lock:
            if module.__name__ == TARGET:
                report = _adopt_target(module)
            else:
                names = _patch_module(module)
                report = {module.__name__: names} if names else None
            if report:
                _log_patched(report)
                _init_backend()

    def __getattr__(self, name):
        # get_source, get_filename, is_package, ... of the real loader.
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of every ``vllm`` module imported from now on."""

    _busy = threading.local()

    def find_spec(self, fullname, path, target=None):
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        busy = self._busy.__dict__.setdefault("names", set())
        if fullname in busy:  # a finder below asked the import system again
            return None
        busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader)
                    return spec
            return None
        finally:
            busy.discard(fullname)


def register():
    """vLLM's entry point: with ``DSV4_KVCACHE_VLLM=1``, installs the
    functions (see the module docstring); otherwise returns at once."""
    global _finder
    if os.environ.get(ENV, "").strip() != "1":
        return
    with _lock:
        if not _target_exists():
            logger.info(
                "dsv4-kvcache %s: vLLM %s has no %s; nothing patched",
                _version(), _vllm_version(), TARGET,
            )
            return
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)
        module = sys.modules.get(TARGET)
        if module is None:
            logger.info(
                "dsv4-kvcache %s: will replace %s in %s and the modules that import them",
                _version(), ", ".join(NAMES), TARGET,
            )
            return
        report = _adopt_target(module)
        if report:
            _log_patched(report)
        _init_backend()


def unpatch():
    """Undoes :func:`register`: the original functions back in every module
    this plugin changed, and the import hook removed."""
    global _finder
    with _lock:
        while _patched:
            module, attr, orig = _patched.pop()
            setattr(module, attr, orig)
        if _finder is not None:
            try:
                sys.meta_path.remove(_finder)
            except ValueError:
                pass
            _finder = None
        _originals.clear()
        _initialized_devices.clear()
