"""One fresh interpreter's run of the vLLM plugin, for tests/test_vllm_plugin.py:
``python vllm_probe.py CONFIG_JSON`` puts the config's stand-in trees on
``sys.path``, loads the ``vllm.general_plugins`` entry points of the installed
wheel as vLLM does, imports modules, runs compressor steps, starts workers,
runs indexer key stores through the attention module, and prints a JSON
report as its last line.

Nothing here imports torch or dsv4_kvcache before the entry points ran, so a
run with the switch off shows what loading the plugin alone loads.
"""

import importlib
import importlib.util
import inspect
import json
import logging
import os
import sys
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = "vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache"
COMPRESSOR = "vllm.models.deepseek_v41.compressor"
NAMES = ("fused_save_compress_norm", "rope_quant_insert", "save_ring_rows")
KEYS = "vllm.models.deepseek_v41.common.ops.indexer_k_store"
OPS_PACKAGE = "vllm.models.deepseek_v41.common.ops"
ATTENTION = "vllm.models.deepseek_v41.attention"
KEY_STORE = "indexer_k_norm_rope_store"

# vLLM loads the plugins once per process; a forked worker inherits the flag.
_plugins_loaded = False


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: List[List[str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append([record.levelname, record.name, record.getMessage()])


def _capture() -> _Records:
    handler = _Records()
    log = logging.getLogger("vllm")
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    return handler


def load_general_plugins() -> int:
    """What vLLM's loader does in each process: every entry point of the
    group (those named in VLLM_PLUGINS, when set) loaded, then called."""
    global _plugins_loaded
    from importlib.metadata import entry_points

    if _plugins_loaded:
        return 0
    _plugins_loaded = True
    allowed = os.environ.get("VLLM_PLUGINS")
    allowed_names = None if allowed is None else allowed.split(",")
    funcs = [ep.load() for ep in entry_points(group="vllm.general_plugins")
             if allowed_names is None or ep.name in allowed_names]
    for f in funcs:
        f()
    return len(funcs)


def kinds(module_name: str, names: Any = NAMES) -> Dict[str, str]:
    """Per function name what the module holds: ``ours`` (dsv4_kvcache's or
    the plugin's binding of it), ``shim`` (the plugin's first-call shim),
    ``vllm`` (anything else) or ``missing``."""
    module = sys.modules.get(module_name)
    out = {}
    for name in names:
        fn = getattr(module, name, None)
        if fn is None:
            out[name] = "missing"
            continue
        origin = getattr(fn, "__module__", "") or ""
        dk = sys.modules.get("dsv4_kvcache")
        if (dk is not None and fn is getattr(dk, name, None)) or origin == "dsv4_kvcache_vllm._check":
            out[name] = "ours"
        elif origin == "dsv4_kvcache_vllm":
            out[name] = "shim"
        else:
            out[name] = "vllm"
    return out


def _fresh_ops(tree: str, target: str = TARGET) -> Any:
    """A second copy of the tree's module ``target``, under another name:
    vLLM's functions, whatever the plugin did to the real one."""
    path = os.path.join(tree, *target.split(".")) + ".py"
    spec = importlib.util.spec_from_file_location("standin_copy_" + target.rpartition(".")[2], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _step_case(layout: str, cr: int, pcp: bool, device: str) -> Dict[str, Any]:
    import torch

    from cases import compress_case, insert_case

    c = compress_case(cr, seed=11, adversarial=True, prev=pcp)
    i = insert_case(layout, cr, t=c["kv_score"].shape[0], seed=12, adversarial=True)
    c["positions"] = c["positions"].clamp(max=40)  # within the cos/sin table
    case = dict(c, cos_sin_cache=i["cos_sin_cache"], kv_cache=i["kv_cache"],
                cache_slot_mapping=i["slot_mapping"], fp8_scale=i["fp8_scale"])
    if pcp:
        n = case["prev_rows"].shape[0]
        slots = torch.full((n,), -1, dtype=c["slot_mapping"].dtype)
        slots[1], slots[3] = 5, 2
        case["ring_write_slots"] = slots
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}


def _expected(fns: Any, b: Dict[str, Any]) -> None:
    """The compressor's step on vLLM's own functions."""
    kw = {}
    if b.get("prev_rows") is not None:
        kw = dict(prev_rows=b["prev_rows"], prev_row_indices=b["prev_row_indices"])
    fns.fused_save_compress_norm(
        b["kv_score"], b["positions"], b["state_cache"], b["slot_mapping"], b["query_start_loc"],
        b["token_to_req_indices"], b["rms_norm_weight"], b["rms_norm_eps"], b["compress_ratio"],
        b["latent_out"], **kw)
    if kw:
        fns.save_ring_rows(b["prev_rows"], b["ring_write_slots"], b["state_cache"])
    fns.rope_quant_insert(b["latent_out"], b["positions"], b["cos_sin_cache"], b["kv_cache"],
                          b["cache_slot_mapping"], b["compress_ratio"], fp8_scale=b["fp8_scale"])


def _step(compressor: Any, b: Dict[str, Any]) -> None:
    """The compressor's step (forward, then insert_cache) as vLLM calls it."""
    m = compressor.Compressor(b["compress_ratio"], b["rms_norm_weight"], b["rms_norm_eps"],
                              b["state_cache"])
    extra = {}
    if b.get("prev_rows") is not None:
        extra = dict(prev_rows=b["prev_rows"], prev_row_indices=b["prev_row_indices"],
                     ring_write_slots=b["ring_write_slots"])
    latent = m.forward(b["kv_score"], b["positions"], b["latent_out"], b["slot_mapping"],
                       b["query_start_loc"], b["token_to_req_indices"], **extra)
    m.insert_cache(latent, b["positions"], b["cos_sin_cache"], b["kv_cache"], b["cache_slot_mapping"],
                   fp8_scale=b["fp8_scale"])


def _outputs(cr: int) -> List[str]:
    return ["latent_out", "kv_cache"] + (["state_cache"] if cr == 2 else [])


def _compare(want: Dict[str, Any], got: Dict[str, Any], start: Dict[str, Any], cr: int) -> Dict[str, Any]:
    """Per output: equal to vLLM's bytes, and changed from where it started."""
    from cases import same_storage

    out = {}
    for name in _outputs(cr):
        g = got[name].cpu()
        out[name] = {"same": same_storage(g, want[name].cpu()), "written": not same_storage(g, start[name].cpu())}
    return out


def run_steps(tree: str, modes: List[List[Any]], device: str = "cpu", capture: bool = False) -> Dict[str, Any]:
    """Compressor steps (layout, cr, pcp) through the compressor module's
    functions against the same step through vLLM's own (a fresh copy of the
    tree's ops module, on the CPU); with ``capture``, the step runs inside a
    CUDA graph capture and is replayed."""
    import torch

    from cases import clone

    compressor = importlib.import_module(COMPRESSOR)
    fresh = _fresh_ops(tree)
    report = {}
    for layout, cr, pcp in modes:
        case = _step_case(layout, cr, pcp, device)
        want = clone({k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in case.items()})
        got = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
        _expected(fresh, want)
        if capture:
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                with torch.cuda.graph(g):
                    _step(compressor, got)
            g.replay()
            torch.cuda.synchronize()
        else:
            _step(compressor, got)
        report[f"{layout} cr{cr}{' pcp' if pcp else ''}"] = _compare(want, got, case, cr)
    return report


def _key_step_case(fp4: bool, cr: int, block: int, seed: int, device: str) -> Dict[str, Any]:
    """An indexer key step: 40 tokens (and 2 rows of padding), some with
    slot -1, positions on and off group boundaries, a few special rows."""
    import torch

    g = torch.Generator().manual_seed(seed)
    t, max_pos = 40, 128
    blocks = -(-(t + 8) // block)
    k = torch.randn(t + 2, 128, generator=g) * 4.0
    k[1] = 0.0
    k[4, 9] = float("inf")
    k[7, 90] = float("nan")
    k[10] = 1e30
    slots = torch.randperm(blocks * block, generator=g)[:t]
    slots[::7] = -1
    ang = torch.rand(max_pos, 32, generator=g) * 6.3
    case = dict(k_pre=k.bfloat16(), positions=torch.randint(0, max_pos, (t + 2,), generator=g),
                cos_sin_cache=torch.cat([ang.cos(), ang.sin()], 1),
                weight=(1.0 + 0.2 * torch.randn(128, generator=g)).bfloat16(),
                k_cache=torch.randint(0, 256, (blocks, block, 68 if fp4 else 132), dtype=torch.uint8,
                                      generator=g),
                slot_mapping=slots)
    return {k: v.to(device) for k, v in case.items()}


def run_key_steps(tree: str, modes: List[List[Any]], device: str = "cpu") -> Dict[str, Any]:
    """Indexer key stores (format, cr, block size, N: the attention module's
    ``mxfp4_n_per_tile`` where it passes one) through the attention
    module's binding against the same store through vLLM's own function (a
    fresh copy of the tree's module); per step, the cache's bytes equal to
    vLLM's and changed, or what both raised."""
    import torch

    attention = importlib.import_module(ATTENTION)
    fresh = getattr(_fresh_ops(tree, KEYS), KEY_STORE)
    report = {}
    for i, (fmt, cr, block, n) in enumerate(modes):
        fp4 = fmt == "mxfp4"
        case = _key_step_case(fp4, cr, block, 50 + i, device)
        extra = {"n_per_tile": n} if "n_per_tile" in inspect.signature(attention.IndexerKeys).parameters else {}
        want = case["k_cache"].clone()
        outcome: Dict[str, Any] = {}
        try:
            args = [case["k_pre"], case["positions"], case["cos_sin_cache"], case["weight"], 1e-6, want,
                    case["slot_mapping"], cr, fp4]
            fresh(*args, **({"mxfp4_n_per_tile": n} if extra else {}))
        except Exception as e:  # noqa: BLE001  (vLLM refuses this call: so must the binding)
            outcome["vllm_raised"] = f"{type(e).__name__}: {e}"
        got = case["k_cache"].clone()
        keys = attention.IndexerKeys(cr, case["weight"], 1e-6, got, fp4, **extra)
        try:
            keys.store(case["k_pre"], case["positions"], case["cos_sin_cache"], case["slot_mapping"])
            if device != "cpu":
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (what the test looks at)
            outcome["raised"] = f"{type(e).__name__}: {e}"
        outcome["same"] = bool(torch.equal(got.cpu(), want.cpu()))
        outcome["written"] = not bool(torch.equal(got.cpu(), case["k_cache"].cpu()))
        report[f"{fmt} cr{cr} block {block}" + (f" N {n}" if extra else "")] = outcome
    return report


def key_kinds() -> Dict[str, str]:
    """What the key module, the ops package and the attention module hold
    under the indexer key store's name (None where not imported)."""
    return {m: (kinds(m, (KEY_STORE,))[KEY_STORE] if m in sys.modules else None)
            for m in (KEYS, OPS_PACKAGE, ATTENTION)}


def _worker(queue: Any, paths: List[str], imports: List[str]) -> None:
    """A vLLM worker: its plugins loaded (unless inherited), its modules
    imported; reports what the ops module and the compressor hold."""
    sys.path[:0] = paths
    handler = _capture()
    try:
        loaded = load_general_plugins()
        for name in imports:
            importlib.import_module(name)
        import dsv4_kvcache_vllm

        queue.put({"loaded_plugins": loaded, "status": dsv4_kvcache_vllm.status(),
                   "ops": kinds(TARGET), "compressor": kinds(COMPRESSOR),
                   "switch": {k: os.environ.get(k) for k in ("DSV4_KVCACHE_VLLM", "VLLM_DSV4_KVCACHE")},
                   "records": handler.lines})
    except Exception as e:  # noqa: BLE001  (the parent reports it)
        queue.put({"error": f"{type(e).__name__}: {e}"})


def main(cfg: Dict[str, Any]) -> Dict[str, Any]:
    paths = cfg.get("paths", [])
    sys.path[:0] = paths
    handler = _capture()
    report: Dict[str, Any] = {}
    hooks = list(sys.meta_path)
    env_before = os.environ.get("VLLM_RAY_EXTRA_ENV_VARS_TO_COPY")

    fake = None
    if cfg.get("fake_cuda"):
        import torch

        fake = {"available": True, "initialized": False, "capturing": False}
        torch.cuda.is_available = lambda: fake["available"]
        torch.cuda.is_initialized = lambda: fake["initialized"]
        torch.cuda.is_current_stream_capturing = lambda: fake["capturing"]
    if cfg.get("fail_init"):
        import dsv4_kvcache

        def fail(device: Any = "cpu") -> str:
            raise RuntimeError(cfg["fail_init"])

        dsv4_kvcache.init = fail
    if cfg.get("cuda_init_first"):
        import torch

        torch.zeros(1, device="cuda")

    for name in cfg.get("import_before", []):
        importlib.import_module(name)
    for _ in range(cfg.get("register", 1)):
        globals()["_plugins_loaded"] = False
        report["loaded_plugins"] = load_general_plugins()
    report["after_register"] = {m: m in sys.modules for m in ("dsv4_kvcache", "dsv4_kvcache._native", "torch")}
    report["hooks_changed"] = sys.meta_path != hooks
    report["ray_copy"] = os.environ.get("VLLM_RAY_EXTRA_ENV_VARS_TO_COPY")
    report["ray_copy_before"] = env_before
    if cfg.get("switch_off_ops"):
        import torch

        def has_ops() -> bool:
            try:
                torch.ops.dsv4_kvcache.rope_quant_insert
                return True
            except Exception:  # noqa: BLE001  (no such operator)
                return False

        report["torch_ops_before_import"] = has_ops()
        import dsv4_kvcache  # noqa: F401  (the control: importing the package does register them)

        report["torch_ops_after_import"] = has_ops()

    for name in cfg.get("imports", []):
        importlib.import_module(name)
    if cfg.get("reload"):
        importlib.reload(sys.modules[TARGET])
    report["vllm_models_loaded"] = "vllm.models" in sys.modules

    tree = paths[0] if paths else ""
    if fake is not None:
        stages = {}
        import dsv4_kvcache_vllm

        stages["import"] = {"status": dsv4_kvcache_vllm.status(), "compressor": kinds(COMPRESSOR)}
        fake.update(initialized=False)
        stages["uninitialized"] = {"steps": run_steps(tree, [["nvfp4", 2, False]]),
                                   "status": dsv4_kvcache_vllm.status(), "compressor": kinds(COMPRESSOR)}
        fake.update(initialized=True, capturing=True)
        stages["capture"] = {"steps": run_steps(tree, [["nvfp4", 2, False]]),
                             "status": dsv4_kvcache_vllm.status(), "compressor": kinds(COMPRESSOR)}
        fake.update(available=False, initialized=False, capturing=False)
        stages["eager"] = {"steps": run_steps(tree, [["nvfp4", 2, False], ["mxfp8", 2, True]]),
                           "status": dsv4_kvcache_vllm.status(), "compressor": kinds(COMPRESSOR),
                           "ops": kinds(TARGET)}
        if cfg.get("key_steps"):
            fake.update(available=True, initialized=True, capturing=True)
            stages["key_capture"] = {"steps": run_key_steps(tree, cfg["key_steps"]),
                                     "status": dsv4_kvcache_vllm.status(), "keys": key_kinds()}
            fake.update(available=False, initialized=False, capturing=False)
            stages["key_eager"] = {"steps": run_key_steps(tree, cfg["key_steps"]),
                                   "status": dsv4_kvcache_vllm.status(), "keys": key_kinds()}
        report["stages"] = stages
    if cfg.get("steps"):
        report["steps"] = run_steps(tree, cfg["steps"])
    if cfg.get("key_steps") and fake is None:
        report["key_steps"] = run_key_steps(tree, cfg["key_steps"])
    if cfg.get("gpu_key_steps"):
        report["gpu_key_steps"] = run_key_steps(tree, cfg["gpu_key_steps"], device="cuda")
    if cfg.get("gpu_steps"):
        if not cfg.get("cuda_init_first"):
            # The first call, eager and outside any capture, runs the deferred check.
            report["gpu_first_call"] = run_steps(tree, cfg["gpu_steps"][:1], device="cuda")
        if cfg.get("gpu_capture", True):
            report["gpu_capture"] = run_steps(tree, cfg["gpu_steps"], device="cuda", capture=True)
    if cfg.get("calls_528"):
        import torch

        ops = sys.modules[TARGET]
        try:
            cache = torch.zeros(2, 4, 528, dtype=torch.uint8)
            ops.rope_quant_insert(torch.zeros(1, 512, dtype=torch.bfloat16), torch.tensor([1]),
                                  torch.zeros(4, 64), cache, torch.tensor([0]), 1)
            report["call_528"] = "returned"
        except Exception as e:  # noqa: BLE001  (what the test looks at)
            report["call_528"] = f"{type(e).__name__}: {e}"
    if cfg.get("ray"):
        from vllm.ray.ray_env import get_env_vars_to_copy

        names = get_env_vars_to_copy()
        # What the executor sends: the names to copy that are set here.
        report["ray_copies"] = sorted(n for n in names if n in ("DSV4_KVCACHE_VLLM", "VLLM_DSV4_KVCACHE")
                                     and n in os.environ)
    if cfg.get("workers"):
        import multiprocessing

        report["workers"] = {}
        for method in cfg["workers"]:
            ctx = multiprocessing.get_context(method)
            q = ctx.Queue()
            p = ctx.Process(target=_worker, args=(q, paths, cfg.get("worker_imports", [COMPRESSOR])))
            p.start()
            report["workers"][method] = q.get(timeout=240)
            p.join(60)
            report["workers"][method]["exitcode"] = p.exitcode

    if "dsv4_kvcache_vllm" in sys.modules:
        report["status"] = sys.modules["dsv4_kvcache_vllm"].status()
    report["ops"] = kinds(TARGET) if TARGET in sys.modules else None
    report["keys"] = key_kinds()
    report["compressor"] = kinds(COMPRESSOR) if COMPRESSOR in sys.modules else None
    if "indexer" in cfg:
        report["indexer"] = kinds(cfg["indexer"]).get("rope_quant_insert")
    standin = sys.modules.get("vllm_standin")
    report["flips"] = standin.FLIPS if standin is not None else []
    report["records"] = handler.lines
    return report


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    print(json.dumps(main(json.loads(sys.argv[1]))))
