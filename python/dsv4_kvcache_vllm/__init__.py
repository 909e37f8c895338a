"""dsv4_kvcache's vLLM plugin: its functions in place of the Triton ones of
vLLM's DeepSeek V4.1 ops modules (:data:`TARGETS`), each only where a byte
self-check shows it writes what vLLM's writes:

- ``vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache``:
  ``fused_save_compress_norm``, ``rope_quant_insert``, ``save_ring_rows``;
- ``vllm.models.deepseek_v41.common.ops.indexer_k_store``:
  ``indexer_k_norm_rope_store``.

vLLM calls :func:`register` (entry point ``dsv4_kvcache`` of the group
``vllm.general_plugins``) in every process it starts. This package is pure
Python and imports nothing from ``dsv4_kvcache`` (no native code, no torch
operators) unless the switch is on: ``DSV4_KVCACHE_VLLM=1``, or its alias
``VLLM_DSV4_KVCACHE=1``, which vLLM's Ray executor forwards to its workers
with every other ``VLLM_*`` variable. When on, it also adds
``DSV4_KVCACHE_VLLM`` to ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY``, so a switch
set under its first name reaches Ray workers too.

Switched on, it installs an import hook and never imports vLLM itself. When
one of these modules is (or already was) imported, the plugin *adopts* it,
each module on its own: every function of :data:`FUNCTIONS` that the module
has is checked and then replaced or kept on its own; a name the module
lacks is left alone (logged once), and so are the functions of a module
this vLLM does not have (vLLM d444c3d has no ``indexer_k_store``; logged
once at INFO). The check calls vLLM's function and ours on the same small
deterministic inputs, on the process's device, for every record layout and
mode the function accepts, random and adversarial values, with vLLM's
sanitize setting; ours replaces vLLM's only if every byte is identical, for
the paged records in one of the two record orders this package writes,
bound per record width (vLLM 0.34.0 writes 584 B records page-planar and
528 B / 288 B records per token). A case vLLM's function cannot run on the
device is not comparable and does not count; a function with any differing
byte, or with no case that ran, stays vLLM's, with a WARNING. A replaced
function is patched in its module and in every module that bound it by
name (the compressor does ``from ... import``, and vLLM's
``deepseek_v41/attention.py`` imports ``indexer_k_norm_rope_store`` from
the ops package, which re-exports it), also in modules imported later.

The indexer key store writes its pages in an order vLLM picks from the
platform, which ours takes as an argument: the replacement reads what
vLLM's function reads, once, where the check runs, and passes the same
decision to ours on every call. On ROCm (vLLM's
``current_platform.is_rocm()``) a cache of block_size > 1 is tiled: FP8
keys in 16 x 16 tiles (``k_order="tiled"``) and MXFP4 keys in AITER's
order with the caller's ``mxfp4_n_per_tile`` (``"preshuffled"``) where
vLLM's function has that parameter; vLLM 0.34.0's has not and raises
``NotImplementedError`` there, and so does the replacement, by calling it.
Where vLLM's function calls ``mqa_logits_use_mx_scales()`` (vLLM 0.34.0;
true on CUDA SM100-family GPUs), its value decides the FP8 scale form
(``mx_scale``). Any other call vLLM's function would refuse (a block size
the tiles do not divide, an N other than 16, 32 or 64 or one that does not
divide the block size) goes to vLLM's function too, and the replacement has
vLLM's signature (with ``mxfp4_n_per_tile`` only where vLLM's has it). The check runs FP8 and MXFP4 keys, CR 1 and 2, paged caches
of 1, 16 and 64 positions a block, in the order vLLM writes on this
platform; vLLM's MXFP4 kernel uses a Blackwell-only conversion, so on
Hopper and ROCm its MXFP4 cases are not comparable and MXFP4 calls stay
with vLLM's function, while the FP8 cases decide.

When the check runs, and so when this package's backend is created
(``dsv4_kvcache.init``), is fixed, so that it never happens inside a CUDA
graph capture:

- torch has no usable CUDA (``torch.cuda.is_available()`` is false): at
  adoption, on the CPU;
- CUDA is initialized and the current stream is not capturing (a worker
  loading its model, after its device is set): at adoption, on the current
  CUDA (or HIP) device;
- otherwise (CUDA available but not initialized yet): each function is
  replaced by a first-call shim. The first call made outside a capture,
  with CUDA initialized, runs the check on the current device and binds the
  outcome everywhere; a call made inside a capture (or while
  ``torch.compile`` traces, or before CUDA is initialized) runs vLLM's
  function and logs a WARNING, and the check waits for a later call.

Where the backend cannot start (no kernels for the device's architecture in
this wheel), nothing is replaced and one WARNING says why (a second module
meeting the same reason says it at INFO). A module of which nothing was
replaced says so at WARNING. :func:`register` never raises: any failure
becomes a WARNING and leaves vLLM as it was; :func:`unpatch` puts vLLM's
functions back. Lines go to the logger ``vllm.plugins.dsv4_kvcache``, a
child of vLLM's.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
import time
from types import ModuleType
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

ENV = "DSV4_KVCACHE_VLLM"
ALIAS = "VLLM_DSV4_KVCACHE"
RAY_COPY = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"
# vLLM's modules the plugin adopts, and the functions it checks in each
# (their specs are in _check.SPECS). TARGET is the first, for earlier users.
TARGETS = (
    "vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache",
    "vllm.models.deepseek_v41.common.ops.indexer_k_store",
)
FUNCTIONS: Dict[str, Tuple[str, ...]] = {
    TARGETS[0]: ("fused_save_compress_norm", "rope_quant_insert", "save_ring_rows"),
    TARGETS[1]: ("indexer_k_norm_rope_store",),
}
TARGET = TARGETS[0]

# A child of vLLM's logger, so the lines go where vLLM's own go.
logger = logging.getLogger("vllm.plugins.dsv4_kvcache")

_lock = threading.RLock()
_finder: Optional["_Finder"] = None
# id -> (function, what replaces it): vLLM's originals and the shims; the
# tuples keep both alive, so an id is never reused while it is here.
_map: Dict[int, Tuple[Callable[..., Any], Callable[..., Any]]] = {}
# id -> (function, vLLM's original it stands for) of every function this
# plugin installed (replacements and shims), for unpatch().
_installed: Dict[int, Tuple[Callable[..., Any], Callable[..., Any]]] = {}
# (id(module), attribute) -> (module, attribute, vLLM's value), for unpatch().
_patched: Dict[Tuple[int, str], Tuple[Any, str, Any]] = {}
_status: Dict[str, Dict[str, Any]] = {}
_once: Set[str] = set()
# Modules whose attributes are this plugin's own, never vLLM's.
_OWN = (__name__, __name__ + "._check", "dsv4_kvcache.vllm_plugin")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("dsv4-kvcache")
    except Exception:  # noqa: BLE001  (a source tree without metadata)
        return "unknown"


def _vllm() -> str:
    """``vLLM 0.34.0``, or ``vLLM (version unknown)``."""
    try:
        from importlib.metadata import version

        return f"vLLM {version('vllm')}"
    except Exception:  # noqa: BLE001  (a stand-in or source tree has no metadata)
        found = getattr(sys.modules.get("vllm"), "__version__", None)
        return f"vLLM {found}" if isinstance(found, str) else "vLLM (version unknown)"


def _log(level: int, msg: str, *args: Any) -> None:
    logger.log(level, "dsv4-kvcache %s: " + msg, _version(), *args)


def _log_once(level: int, key: str, msg: str, *args: Any) -> None:
    if key not in _once:
        _once.add(key)
        _log(level, msg, *args)


def _switch() -> Tuple[bool, Optional[str]]:
    """Whether the plugin is on, and a complaint about a value that is
    neither 1 nor 0 (which leaves it off)."""
    values = {n: os.environ.get(n) for n in (ENV, ALIAS)}
    on = any((v or "").strip() == "1" for v in values.values())
    odd = [f"{n}={v!r}" for n, v in values.items() if v is not None and v.strip() not in ("", "0", "1")]
    if odd and not on:
        return False, f"{', '.join(odd)} is neither 1 nor 0; the vLLM plugin stays off (set {ENV}=1 to use it)"
    return on, None


def _forward_switch() -> None:
    """Adds ENV to the names vLLM's Ray executor copies to its workers."""
    names = [n.strip() for n in os.environ.get(RAY_COPY, "").split(",") if n.strip()]
    if ENV not in names:
        os.environ[RAY_COPY] = ",".join(names + [ENV])


def _find_spec(name: str, path: Optional[Sequence[str]]) -> Any:
    """The spec the import system would find for ``name`` (parents loaded or
    not), asking every finder but this plugin's, without executing anything."""
    for finder in list(sys.meta_path):
        if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(name, path)
        if spec is not None:
            return spec
    return None


def _locations(spec: Any) -> Optional[List[str]]:
    """A package spec's search locations as a list (None: not a package)."""
    locations = spec.submodule_search_locations
    if locations is None:
        return None
    try:
        return list(locations)
    except Exception:  # noqa: BLE001  (see below)
        # A namespace package's path recomputes itself from its parent's
        # module, which is not loaded here; its first computation is kept.
        return list(getattr(locations, "_path", None) or [])


def _on_disk(part: str, path: Sequence[str]) -> Tuple[bool, Optional[List[str]]]:
    """``part`` looked up in the directories ``path`` as the path finder
    would: (found, its search locations, None for a module)."""
    suffixes = importlib.machinery.all_suffixes()
    portions = []
    for entry in path:
        base = os.path.join(entry or ".", part)
        if os.path.isdir(base):
            if any(os.path.isfile(os.path.join(base, "__init__" + s)) for s in suffixes):
                return True, [base]
            portions.append(base)
        elif not portions and any(os.path.isfile(base + s) for s in suffixes):
            return True, None
    return (True, portions) if portions else (False, None)


def _lookup(name: str, path: Optional[Sequence[str]]) -> Tuple[bool, Optional[List[str]]]:
    """Whether ``name`` can be imported, and its search locations."""
    try:
        spec = _find_spec(name, path)
    except Exception:  # noqa: BLE001  (see below)
        # The path finder fails on a namespace package below one that is not
        # loaded (it asks sys.modules for the parent): look on disk instead.
        return _on_disk(name.rpartition(".")[2], sys.path if path is None else path)
    if spec is None:
        return False, None
    return True, _locations(spec)


def _target_exists(target: str = TARGET) -> bool:
    """Whether vLLM has the module ``target``, found without executing it or
    any package above it that is not loaded yet (namespace packages
    included)."""
    parts = target.split(".")
    path: Optional[List[str]] = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        last = i + 1 == len(parts)
        module = sys.modules.get(name)
        if module is not None:
            if last:
                return True
            found = getattr(module, "__path__", None)
            path = None if found is None else list(found)
        else:
            exists, path = _lookup(name, path)
            if not exists:
                return False
            if last:
                return True
        if not path:
            return False
    return True


def _sweep(modules: Optional[Iterable[Tuple[str, Any]]] = None) -> Dict[str, List[str]]:
    """Sets, in every module (or those given), each attribute that holds a
    mapped function to what replaces it; returns {module: attributes}."""
    changed: Dict[str, List[str]] = {}
    for mod_name, mod in list(sys.modules.items()) if modules is None else modules:
        if mod is None or mod_name in _OWN:
            continue
        try:
            attrs = list(vars(mod).items())
        except TypeError:
            continue
        for attr, value in attrs:
            entry = _map.get(id(value))
            if entry is None or entry[0] is not value or entry[1] is value:
                continue
            try:
                setattr(mod, attr, entry[1])
            except Exception:  # noqa: BLE001  (a module that refuses assignment keeps its value)
                continue
            _patched.setdefault((id(mod), attr), (mod, attr, value))
            changed.setdefault(mod_name, []).append(attr)
    return changed


def _device_now() -> Tuple[Any, str]:
    """The device to check on now, or (None, why the check must wait)."""
    import torch

    cuda = torch.cuda
    if not cuda.is_available():
        return torch.device("cpu"), ""
    if not cuda.is_initialized():
        return None, "CUDA is not initialized yet"
    if cuda.is_current_stream_capturing():
        return None, "the current stream is capturing a CUDA graph"
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and getattr(compiler, "is_compiling", lambda: False)():
        return None, "torch.compile is tracing"
    return torch.device("cuda", cuda.current_device()), ""


def _device_name(device: Any) -> str:
    """``cuda:0 (NVIDIA H100 80GB HBM3, sm_90)``, or the device alone."""
    if device.type != "cuda":
        return str(device)
    try:
        import torch

        p = torch.cuda.get_device_properties(device)
        arch = getattr(p, "gcnArchName", "") or f"sm_{p.major}{p.minor}"
        return f"{device} ({p.name}, {arch})"
    except Exception:  # noqa: BLE001  (the name is only for the log line)
        return str(device)


def _sanitize(module: ModuleType) -> Optional[bool]:
    """vLLM's sanitize setting for the paged records (its ``_ON_GFX950``),
    or None (the device's default) where the module has none."""
    value = getattr(module, "_ON_GFX950", None)
    return value if isinstance(value, bool) else None


def _decide(module_name: str, found: Dict[str, Callable[..., Any]], sanitize: Optional[bool],
            device: Any) -> Tuple[Dict[str, Callable[..., Any]], bool]:
    """Creates the backend on ``device``, checks every function of
    ``found`` there and returns what each is to be (ours, bound, or
    vLLM's), and whether a WARNING already said why nothing is replaced."""
    import dsv4_kvcache as dk

    from . import _check

    final = dict(found)
    where = _device_name(device)
    start = time.perf_counter()
    try:
        backend = dk.init(device)
    except Exception as e:  # noqa: BLE001  (no kernels for this device, or no driver)
        try:
            kernels = dk.info().get("kernels", {})
            embeds = "; ".join(f"{k} {', '.join(v) or 'none'}" for k, v in kernels.items())
        except Exception:  # noqa: BLE001  (the targets are only for the log line)
            embeds = "unknown"
        reason = f"no backend on {where}: {e} (this wheel embeds kernels for {embeds})"
        # One WARNING per reason: a second module meeting it is said at INFO.
        key = f"nobackend:{reason}"
        level = logging.INFO if key in _once else logging.WARNING
        _once.add(key)
        _log(level, "%s; nothing replaced, vLLM's %s kept", reason, ", ".join(found))
        for name in found:
            _status[name] = {"state": "kept", "reason": reason, "device": str(device)}
        return final, True
    _log(logging.INFO, "backend %s created on %s in %.1f ms", backend, where,
         (time.perf_counter() - start) * 1e3)
    for name, original in found.items():
        spec = _check.SPECS[name]
        try:
            # A spec made for this function: what vLLM's reads (the platform), once.
            spec = _check.prepare(spec, original)
            if spec.facts:
                _log(logging.INFO, "%s: vLLM's function on %s: %s", name, where,
                     ", ".join(f"{k}={v}" for k, v in spec.facts.items()))
            result, _ = _check.run(spec, original, device, sanitize)
        except Exception as e:  # noqa: BLE001  (the check itself failed: keep vLLM's)
            result = _check.Result({}, f"the self-check failed: {type(e).__name__}: {e}", 0, {}, 0.0)
        skipped = sum(len(v) for v in result.not_comparable.values())
        _log(logging.INFO, "self-check of %s on %s: %d cases, %d not comparable, %.1f ms", name, where,
             result.cases, skipped, result.seconds * 1e3)
        for why, cases in result.not_comparable.items():
            _log(logging.INFO, "%s: not comparable (vLLM's raised %s): %s", name, why, ", ".join(cases))
        entry: Dict[str, Any] = {"cases": result.cases, "not_comparable": skipped,
                                 "seconds": result.seconds, "device": str(device), "module": module_name}
        if spec.facts:
            entry["dispatch"] = dict(spec.facts)
        if result.refused:
            _log(logging.WARNING, "kept vLLM's %s: %s", name, result.refused)
            entry.update(state="kept", reason=result.refused)
        else:
            try:
                final[name] = spec.bind(original, result.bound, sanitize)
            except Exception as e:  # noqa: BLE001  (binding failed: keep vLLM's)
                entry.update(state="kept", reason=f"binding failed: {type(e).__name__}: {e}")
                _log(logging.WARNING, "kept vLLM's %s: %s", name, entry["reason"])
            else:
                _installed[id(final[name])] = (final[name], original)
                entry.update(state="replaced", orders={k: v for k, v in result.bound.items() if k})
        _status[name] = entry
    return final, False


def _install(module_name: str, found: Dict[str, Callable[..., Any]], final: Dict[str, Callable[..., Any]],
             shims: Optional[Dict[str, Callable[..., Any]]] = None, warned: bool = False) -> None:
    """Maps each original (and its shim) to its final function, sweeps every
    module, and logs what was replaced where (a WARNING where nothing of
    ``module_name``'s was, unless ``warned``: the reason is logged already)."""
    for name, original in found.items():
        _map[id(original)] = (original, final[name])
        if shims:
            _map[id(shims[name])] = (shims[name], final[name])
    changed = _sweep()
    replaced = [n for n in found if final[n] is not found[n]]
    if replaced:
        from ._check import describe_bound

        what = ", ".join(
            n + (f" ({describe_bound(_status[n]['orders'])})" if _status[n].get("orders") else "")
            for n in replaced)
        ours = {id(final[n]) for n in replaced}
        mods = sorted(m for m, attrs in changed.items()
                      if any(id(getattr(sys.modules.get(m), a, None)) in ours for a in attrs))
        _log(logging.INFO, "replaced %s in %s", what, ", ".join(mods))
    elif not warned:
        _log(logging.WARNING, "%s is switched on but replaced nothing in %s: %s keeps its own functions "
             "(the lines above say why)", ENV, module_name, _vllm())


class _Deferred:
    """The first-call shims of one adoption, and the check they wait for."""

    def __init__(self, module_name: str, found: Dict[str, Callable[..., Any]],
                 sanitize: Optional[bool]) -> None:
        self.module_name = module_name
        self.found = found
        self.sanitize = sanitize
        self.final: Optional[Dict[str, Callable[..., Any]]] = None
        self.shims = {name: self._shim(name, fn) for name, fn in found.items()}

    def _shim(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        deferred = self

        def shim(*args: Any, **kwargs: Any) -> Any:
            final = deferred.final
            if final is None:
                final = deferred.resolve(name)
                if final is None:
                    return original(*args, **kwargs)
            return final[name](*args, **kwargs)

        shim.__name__ = shim.__qualname__ = name
        shim.__doc__ = (f"vLLM's {name} until dsv4_kvcache's self-check has run on this process's "
                        "device (at the first call outside a CUDA graph capture), then its outcome.")
        return shim

    def resolve(self, name: str) -> Optional[Dict[str, Callable[..., Any]]]:
        """Runs the check now if this call may, and returns the outcome, or
        None (vLLM's function runs, with a WARNING once)."""
        with _lock:
            if self.final is not None:
                return self.final
            try:
                device, why = _device_now()
            except Exception as e:  # noqa: BLE001  (torch cannot say: wait for a later call)
                device, why = None, f"{type(e).__name__}: {e}"
            if device is None:
                _log_once(logging.WARNING, f"wait:{id(self)}:{why}",
                          "first call of %s while %s: vLLM's function runs; the self-check waits for "
                          "a call outside a graph capture", name, why)
                return None
            try:
                final, warned = _decide(self.module_name, self.found, self.sanitize, device)
            except Exception as e:  # noqa: BLE001  (never fail vLLM's call: keep its functions)
                _log(logging.WARNING, "the self-check failed (%s: %s); vLLM's functions kept",
                     type(e).__name__, e)
                final, warned = dict(self.found), True
            self.final = final
            _install(self.module_name, self.found, final, self.shims, warned)
            return final


def _adopt(module: ModuleType) -> None:
    """Checks and replaces (or defers the check of) each function of
    :data:`FUNCTIONS` the module has; see the module docstring."""
    try:
        from . import _check
    except Exception as e:  # noqa: BLE001  (dsv4_kvcache or torch cannot be imported)
        _log_once(logging.WARNING, f"noload:{type(e).__name__}: {e}", "cannot load dsv4_kvcache (%s: %s); "
                  "nothing replaced", type(e).__name__, e)
        return
    names = FUNCTIONS[module.__name__]
    found: Dict[str, Callable[..., Any]] = {}
    for name in names:
        fn = getattr(module, name, None)
        if not callable(fn):
            _log_once(logging.INFO, f"absent:{module.__name__}:{name}",
                      "%s has no %s: not replaced", module.__name__, name)
            _status.setdefault(name, {"state": "absent"})
            continue
        entry = _map.get(id(fn))
        if id(fn) in _installed or (entry is not None and entry[0] is fn):
            continue  # checked already (a second register() or import)
        found[name] = fn
    if not found:
        if not any(_status.get(n, {}).get("state", "absent") != "absent" for n in names):
            _log_once(logging.WARNING, f"none:{module.__name__}", "%s's %s has none of %s; nothing "
                      "replaced", _vllm(), module.__name__, ", ".join(names))
        return
    sanitize = _sanitize(module)
    device, why = _device_now()
    if device is None:
        deferred = _Deferred(module.__name__, found, sanitize)
        for name, fn in found.items():
            _map[id(fn)] = (fn, deferred.shims[name])
            _installed[id(deferred.shims[name])] = (deferred.shims[name], fn)
            _status[name] = {"state": "deferred", "reason": why, "module": module.__name__}
        _sweep()
        _log(logging.INFO, "%s: the self-check of %s waits for their first call outside a graph "
             "capture", why, ", ".join(found))
        return
    final, warned = _decide(module.__name__, found, sanitize, device)
    _install(module.__name__, found, final, warned=warned)


def _on_loaded(module: ModuleType) -> None:
    """After a ``vllm`` module ran: adopt it if it is one of :data:`TARGETS`,
    else patch it where it bound functions this plugin replaces."""
    with _lock:
        try:
            if module.__name__ in FUNCTIONS:
                _adopt(module)
            else:
                _sweep([(module.__name__, module)])
        except Exception as e:  # noqa: BLE001  (never break vLLM's import)
            _log(logging.WARNING, "failed on %s (%s: %s); its functions left as they are",
                 module.__name__, type(e).__name__, e)


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then lets the plugin see the module it made."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _on_loaded(module)

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, is_package, ... of the real loader.
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of every ``vllm`` module imported from now on."""

    _busy = threading.local()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
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


def _register() -> None:
    global _finder
    on, complaint = _switch()
    if complaint:
        _log(logging.WARNING, "%s", complaint)
    if not on:
        return
    with _lock:
        present = [t for t in TARGETS if _target_exists(t)]
        if not present:
            _log(logging.WARNING, "%s is set but %s has none of %s; nothing replaced", ENV, _vllm(),
                 ", ".join(TARGETS))
            return
        for target in TARGETS:
            if target in present:
                continue
            reason = f"{_vllm()} has no {target}"
            _log_once(logging.INFO, f"no-module:{target}", "%s: %s not replaced", reason,
                      ", ".join(FUNCTIONS[target]))
            for name in FUNCTIONS[target]:
                _status.setdefault(name, {"state": "absent", "module": target, "reason": reason})
        if _finder is None:
            _finder = _Finder()
            sys.meta_path.insert(0, _finder)
        waiting = [t for t in present if sys.modules.get(t) is None]
        if waiting:
            _log(logging.INFO, "will check vLLM's functions in %s when imported, and replace "
                 "those that pass", " and ".join(waiting))
        for target in present:
            module = sys.modules.get(target)
            if module is not None:
                _adopt(module)
        _forward_switch()


def register() -> None:
    """vLLM's entry point: with ``DSV4_KVCACHE_VLLM=1`` (or
    ``VLLM_DSV4_KVCACHE=1``), installs the plugin (see the module
    docstring); otherwise returns at once. Never raises."""
    try:
        _register()
    except Exception as e:  # noqa: BLE001  (vLLM calls plugins without a try)
        try:
            unpatch()
        except Exception:  # noqa: BLE001  (already failing: the WARNING below says so)
            pass
        try:
            _log(logging.WARNING, "the vLLM plugin failed (%s: %s); vLLM left unchanged",
                 type(e).__name__, e)
        except Exception:  # noqa: BLE001  (a broken logging setup must not stop vLLM either)
            pass


def status() -> Dict[str, Dict[str, Any]]:
    """What the plugin did in this process, per function name: ``state``
    (``replaced``, ``kept``, ``deferred`` or ``absent``), ``module`` (vLLM's
    module it is in), ``orders`` (the layouts a replaced function writes,
    with the record order bound per layout of a replaced insert; for the
    indexer key store, its formats in the page order vLLM writes them in
    here), ``dispatch`` (what the indexer key store read from vLLM: ``rocm``,
    ``mx_scale``, ``n_per_tile``), the self-check's ``cases``,
    ``not_comparable``, ``seconds`` and ``device``, and the ``reason`` a
    function was kept, deferred or absent (its module missing)."""
    with _lock:
        return {name: dict(entry) for name, entry in _status.items()}


def unpatch() -> None:
    """Undoes :func:`register`: vLLM's functions back in every module this
    plugin changed, and in every module that bound one of this plugin's
    functions itself (``from ... import`` after the replacement, or a
    package re-exporting a module adopted while the package was being
    imported), the import hook removed, the plugin's state cleared."""
    global _finder
    with _lock:
        for module, attr, value in _patched.values():
            try:
                setattr(module, attr, value)
            except Exception:  # noqa: BLE001  (a module that refuses assignment keeps ours)
                pass
        _patched.clear()
        for mod_name, mod in list(sys.modules.items()):
            # dsv4_kvcache's own modules hold its functions as their own.
            if mod is None or mod_name in _OWN or mod_name.split(".")[0] == "dsv4_kvcache":
                continue
            try:
                attrs = list(vars(mod).items())
            except TypeError:
                continue
            for attr, value in attrs:
                entry = _installed.get(id(value))
                if entry is not None and entry[0] is value:
                    try:
                        setattr(mod, attr, entry[1])
                    except Exception:  # noqa: BLE001  (as above)
                        pass
        if _finder is not None:
            try:
                sys.meta_path.remove(_finder)
            except ValueError:
                pass
            _finder = None
        _map.clear()
        _installed.clear()
        _status.clear()
        _once.clear()


__all__ = ["register", "status", "unpatch", "ENV", "ALIAS", "TARGET", "TARGETS", "FUNCTIONS"]
