"""The vLLM plugin (package ``dsv4_kvcache_vllm``), without vLLM: stand-in
``vllm`` package trees (``vllm_trees/``: vLLM 0.34.0's three functions writing
its per-token records, vLLM d444c3d's two, a vLLM without the module; trees
derived from them at run time) and vLLM's own module files from
``../shared/seed/`` where present. Each scenario runs in a fresh interpreter
(``vllm_probe.py``) that finds the plugin as vLLM's loader does, in the
installed wheel's entry points. Tests that need what this machine lacks (a
GPU, the seed files, triton) skip and say why."""

import importlib
import importlib.abc
import json
import logging
import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points
from typing import Any, Dict, List, Optional

import pytest
import torch

import dsv4_kvcache as dk
import dsv4_kvcache_vllm as plugin

HERE = os.path.dirname(os.path.abspath(__file__))
TREES = os.path.join(HERE, "vllm_trees")
V0340 = os.path.join(TREES, "v0_34_0")
D444 = os.path.join(TREES, "d444c3d")
NO_MODULE = os.path.join(TREES, "no_module")
PROBE = os.path.join(HERE, "vllm_probe.py")
SEED = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "seed"))
GROUP = "vllm.general_plugins"
LOGGER = "vllm.plugins.dsv4_kvcache"
OPS = "vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache"
COMPRESSOR = "vllm.models.deepseek_v41.compressor"
INDEXER = "vllm.models.deepseek_v41.indexer"
ENV, ALIAS, RAY_COPY = "DSV4_KVCACHE_VLLM", "VLLM_DSV4_KVCACHE", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"
NAMES = ("fused_save_compress_norm", "rope_quant_insert", "save_ring_rows")
# What vLLM 0.34.0 writes: 584 B records page-planar, 528 B and 288 B per token.
V0340_ORDERS = {"584": "planar", "528": "per_token", "288": "per_token", "bf16": None, "fp8": None}
# The check's cases per function (rope_quant_insert: 5 layouts x 2 ratios x
# random/adversarial; the compressor: CR1, CR2 ring, CR2 prev_rows x 2).
CASES = {"fused_save_compress_norm": 8, "rope_quant_insert": 20, "save_ring_rows": 2}
ALL_STEPS = [[layout, cr, pcp] for layout in ("v4", "mxfp8", "nvfp4", "bf16", "fp8")
             for cr, pcp in ((1, False), (2, False), (2, True))]


def probe(cfg: Dict[str, Any], switch: Optional[str] = ENV, value: Optional[str] = "1",
          env: Optional[Dict[str, str]] = None, cpu: bool = True) -> Dict[str, Any]:
    """Runs vllm_probe.py in a fresh interpreter with the switch ``switch``
    set to ``value`` (no switch: None) and returns its report. ``cpu`` hides
    the GPUs, so the check runs on the CPU on any machine."""
    e = {k: v for k, v in os.environ.items()
         if k not in (ENV, ALIAS, "VLLM_PLUGINS", RAY_COPY, "STANDIN_FLIP")}
    if switch is not None and value is not None:
        e[switch] = value
    if cpu:
        e["CUDA_VISIBLE_DEVICES"] = ""
        e["HIP_VISIBLE_DEVICES"] = ""
    e.update(env or {})
    out = subprocess.run([sys.executable, PROBE, json.dumps(cfg)], env=e, cwd=HERE,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-6000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def lines(report: Dict[str, Any], level: Optional[str] = None) -> List[str]:
    """The plugin's lines as a handler on vLLM's logger ``vllm`` received them."""
    return [m for lv, name, m in report["records"] if name == LOGGER and (level is None or lv == level)]


def states(report: Dict[str, Any]) -> Dict[str, str]:
    return {n: s["state"] for n, s in report["status"].items()}


def derived_tree(tmp_path: Any, base: str = V0340) -> str:
    root = os.path.join(str(tmp_path), "tree")
    shutil.copytree(base, root)
    return root


def assert_steps(steps: Dict[str, Any]) -> None:
    """Every compressor step gave vLLM's bytes, and wrote something."""
    assert steps
    for case, outs in steps.items():
        for name, r in outs.items():
            assert r == {"same": True, "written": True}, (case, name, r)


def test_entry_point_is_in_the_installed_wheel():
    eps = [ep for ep in entry_points(group=GROUP) if ep.name == "dsv4_kvcache"]
    assert len(eps) == 1
    ep = eps[0]
    assert ep.value == "dsv4_kvcache_vllm:register"
    assert ep.dist is not None and ep.dist.name.replace("_", "-") == "dsv4-kvcache"
    assert ep.dist.version == dk.__version__
    files = {str(f) for f in ep.dist.files}
    assert "dsv4_kvcache_vllm/__init__.py" in files and "dsv4_kvcache_vllm/_check.py" in files
    # The wheel's own files, not this source tree.
    src = os.path.dirname(HERE) + os.sep
    assert not os.path.abspath(plugin.__file__).startswith(src)
    assert ep.load() is plugin.register
    # The former module name re-exports the plugin.
    from dsv4_kvcache import vllm_plugin

    assert vllm_plugin.register is plugin.register and vllm_plugin.unpatch is plugin.unpatch


@pytest.mark.parametrize("switch,value", [(ENV, None), (ENV, "0"), (ENV, ""), (ALIAS, "0")])
def test_switch_off_loads_no_native_code(switch, value):
    r = probe({"paths": [V0340], "imports": [COMPRESSOR, INDEXER], "switch_off_ops": True,
               "indexer": INDEXER}, switch, value)
    assert r["loaded_plugins"] == 1
    # Loading and calling the entry point loaded neither the package, its
    # native module nor torch, and registered no operator.
    assert r["after_register"] == {"dsv4_kvcache": False, "dsv4_kvcache._native": False, "torch": False}
    assert r["torch_ops_before_import"] is False
    assert r["torch_ops_after_import"] is True  # the control: importing the package registers them
    assert r["hooks_changed"] is False and r["ray_copy"] is None
    assert r["ops"] == {n: "vllm" for n in NAMES} and r["compressor"] == {n: "vllm" for n in NAMES}
    assert r["indexer"] == "vllm"
    assert r["records"] == []


def test_a_switch_value_other_than_1_warns_and_stays_off():
    r = probe({"paths": [V0340], "imports": [COMPRESSOR]}, ENV, "true")
    warnings = lines(r, "WARNING")
    assert len(warnings) == 1 and "'true'" in warnings[0] and "stays off" in warnings[0], warnings
    assert r["after_register"]["dsv4_kvcache"] is False
    assert r["compressor"] == {n: "vllm" for n in NAMES}


@pytest.mark.parametrize("switch", [ENV, ALIAS])
@pytest.mark.parametrize("import_first", [False, True])
def test_v0_34_0_every_function_checked_and_replaced(switch, import_first):
    """vLLM 0.34.0's three functions: each checked on the CPU and replaced,
    the 528 B and 288 B inserts bound to the per-token order; the
    compressor's steps then give vLLM's bytes in every layout and mode."""
    cfg = {"paths": [V0340], "indexer": INDEXER, "steps": ALL_STEPS}
    if import_first:
        cfg.update(import_before=[COMPRESSOR], imports=[INDEXER])
    else:
        cfg.update(imports=[COMPRESSOR, INDEXER])
    r = probe(cfg, switch)
    assert states(r) == {n: "replaced" for n in NAMES}, r["status"]
    assert r["status"]["rope_quant_insert"]["orders"] == V0340_ORDERS
    for name in NAMES:
        s = r["status"][name]
        assert (s["cases"], s["not_comparable"], s["device"]) == (CASES[name], 0, "cpu"), (name, s)
    assert r["ops"] == r["compressor"] == {n: "ours" for n in NAMES}
    assert r["indexer"] == "ours"
    assert_steps(r["steps"])
    assert not lines(r, "WARNING"), lines(r, "WARNING")
    info = lines(r, "INFO")
    for name in NAMES:
        cost = [m for m in info if f"self-check of {name} on cpu: {CASES[name]} cases, 0 not comparable" in m]
        assert len(cost) == 1 and cost[0].endswith(" ms"), info
    replaced = [m for m in info if "replaced" in m and "self-check" not in m]
    assert len(replaced) == 1 and dk.__version__ in replaced[0], info
    assert all(n in replaced[0] for n in NAMES)
    assert "528 B per_token" in replaced[0] and "584 B planar" in replaced[0]
    assert OPS in replaced[0]
    assert (COMPRESSOR in replaced[0]) == import_first
    # The switch is forwarded to Ray workers under its first name.
    assert r["ray_copy"] == ENV


def test_d444c3d_two_functions_and_584_only():
    """vLLM d444c3d: no save_ring_rows (logged once, though the module is
    checked twice), no prev_rows (no such case), no 528/288 B records (vLLM's
    raises: not comparable, and calls with them still go to vLLM's)."""
    r = probe({"paths": [D444], "imports": [COMPRESSOR], "register": 2, "reload": True, "calls_528": True,
               "steps": [[layout, cr, False] for layout in ("v4", "bf16", "fp8") for cr in (1, 2)]})
    assert states(r) == {"fused_save_compress_norm": "replaced", "rope_quant_insert": "replaced",
                         "save_ring_rows": "absent"}, r["status"]
    assert r["status"]["fused_save_compress_norm"]["cases"] == 6
    rope = r["status"]["rope_quant_insert"]
    assert rope["orders"] == {"584": "planar", "bf16": None, "fp8": None}
    assert (rope["cases"], rope["not_comparable"]) == (20, 8)
    assert r["ops"] == {"fused_save_compress_norm": "ours", "rope_quant_insert": "ours",
                        "save_ring_rows": "missing"}
    assert r["compressor"] == r["ops"]
    assert r["call_528"].startswith("AssertionError: unsupported paged KV record width 528")
    assert_steps(r["steps"])
    absent = [m for m in lines(r) if "has no save_ring_rows" in m]
    assert len(absent) == 1 and lines(r, "INFO").count(absent[0]) == 1, lines(r)
    skipped = [m for m in lines(r, "INFO") if "rope_quant_insert: not comparable" in m]
    assert skipped and "AssertionError" in skipped[0] and "528 B cr1 random" in skipped[0], lines(r)
    assert not lines(r, "WARNING"), lines(r, "WARNING")


@pytest.mark.parametrize("missing", [
    ["vllm/models/deepseek_v41/common/__init__.py"],
    ["vllm/__init__.py", "vllm/models/__init__.py", "vllm/models/deepseek_v41/common/__init__.py"],
])
def test_namespace_packages_on_the_path(tmp_path, missing):
    root = derived_tree(tmp_path)
    for rel in missing:
        os.remove(os.path.join(root, rel))
    r = probe({"paths": [root], "imports": [COMPRESSOR], "steps": [["nvfp4", 2, True]]})
    assert states(r) == {n: "replaced" for n in NAMES}, (r["status"], lines(r))
    assert r["compressor"] == {n: "ours" for n in NAMES}
    assert_steps(r["steps"])
    assert not lines(r, "WARNING")


# The case each flip shows in first, after the order whose bytes it breaks
# (the flipped byte is the call's last written one: a scale of the last
# record, at different offsets in the two orders).
FLIPPED_CASE = {"rope_quant_insert:288": "per_token order: case '288 B cr1 random'",
                "rope_quant_insert:584": "planar order: case '584 B cr1 random'",
                "rope_quant_insert:fp8": "case 'fp8 rows cr1 random'",
                "fused_save_compress_norm": "case 'cr1 random'", "save_ring_rows": "case 'random'"}


@pytest.mark.parametrize("flip", sorted(FLIPPED_CASE))
def test_a_function_writing_one_other_byte_is_kept(flip):
    """One flipped byte in vLLM's output: that function stays vLLM's, with a
    WARNING naming it, the case and the byte; the others are replaced."""
    name = flip.split(":")[0]
    r = probe({"paths": [V0340], "imports": [COMPRESSOR]}, env={"STANDIN_FLIP": flip})
    assert r["status"][name]["state"] == "kept"
    assert {n: s for n, s in states(r).items() if n != name} == {n: "replaced" for n in NAMES if n != name}
    assert r["compressor"] == {n: ("vllm" if n == name else "ours") for n in NAMES}
    f = r["flips"][0]
    warnings = lines(r, "WARNING")
    assert len(warnings) == 1, warnings
    byte = (f"{FLIPPED_CASE[flip]}: first differing byte at offset {f['offset']} of {f['tensor']} "
            f"(vLLM 0x{f['written']:02x}, ours 0x{f['correct']:02x})")
    assert f"kept vLLM's {name}" in warnings[0] and byte in warnings[0], (byte, warnings[0])


def test_vllm_without_the_module_changes_nothing():
    r = probe({"paths": [NO_MODULE]})
    assert r["loaded_plugins"] == 1
    warnings = lines(r, "WARNING")
    assert len(warnings) == 1 and OPS in warnings[0] and "nothing replaced" in warnings[0], lines(r)
    assert lines(r) == warnings
    assert r["hooks_changed"] is False
    # vLLM's packages were looked up, not imported; nor was the native module.
    assert r["vllm_models_loaded"] is False
    assert r["after_register"]["dsv4_kvcache._native"] is False


@pytest.mark.parametrize("switch", [ENV, ALIAS])
def test_workers_started_by_fork_and_spawn_inherit_the_switch(switch):
    r = probe({"paths": [V0340], "workers": ["fork", "spawn"]}, switch)
    for method in ("fork", "spawn"):
        w = r["workers"][method]
        assert "error" not in w and w["exitcode"] == 0, w
        assert w["switch"][switch] == "1"
        # A forked worker inherits the loaded plugin; a spawned one loads it again.
        assert w["loaded_plugins"] == (0 if method == "fork" else 1)
        assert {n: s["state"] for n, s in w["status"].items()} == {n: "replaced" for n in NAMES}, w["status"]
        assert w["compressor"] == {n: "ours" for n in NAMES}


def _ray_tree(tmp_path: Any) -> str:
    """v0_34_0 with vLLM 0.34.0's own vllm/ray/ray_env.py and stand-ins for
    the two modules it imports."""
    ray_env = os.path.join(SEED, "vllm", "vllm", "ray", "ray_env.py")
    if not os.path.exists(ray_env):
        pytest.skip(f"vLLM's ray_env.py is not at {ray_env} (../shared/seed/ is not here)")
    if sys.version_info < (3, 10):
        pytest.skip("vLLM 0.34.0's files need Python 3.10 or later (X | None annotations)")
    root = derived_tree(tmp_path)
    with open(os.path.join(root, "vllm", "envs.py"), "w") as f:
        f.write('"""Stand-in for vllm.envs: every VLLM_* read from the environment when asked."""\n'
                "import os\n\nenvironment_variables = {}\n\n\n"
                "def __getattr__(name):\n"
                "    if name == 'VLLM_CONFIG_ROOT':\n"
                "        return os.environ.get(name, '/nonexistent-vllm-config')\n"
                "    if name.startswith('VLLM_'):\n"
                "        return os.environ.get(name, '')\n"
                "    raise AttributeError(name)\n")
    with open(os.path.join(root, "vllm", "logger.py"), "w") as f:
        f.write('"""Stand-in for vllm.logger."""\nimport logging\n\n\n'
                "def init_logger(name):\n    return logging.getLogger(name)\n")
    os.makedirs(os.path.join(root, "vllm", "ray"))
    with open(os.path.join(root, "vllm", "ray", "__init__.py"), "w") as f:
        f.write('"""Stand-in package."""\n')
    os.symlink(ray_env, os.path.join(root, "vllm", "ray", "ray_env.py"))
    return root


@pytest.mark.parametrize("switch,value", [(ENV, "1"), (ALIAS, "1"), (ENV, "0")])
def test_vllm_ray_env_copies_the_switch(tmp_path, switch, value):
    """vLLM 0.34.0's own get_env_vars_to_copy() (what its Ray executor sends
    to every worker) includes the switch once the plugin is registered, under
    either name; with the switch off, the plugin adds nothing."""
    root = _ray_tree(tmp_path)
    r = probe({"paths": [root], "register": 2, "ray": True}, switch, value, env={RAY_COPY: "FOO_BAR"})
    if value == "1":
        assert r["ray_copy"] == f"FOO_BAR,{ENV}"  # appended once, though registered twice
        assert r["ray_copies"] == [switch]
    else:
        assert r["ray_copy"] == "FOO_BAR"
        assert r["ray_copies"] == []


def test_no_backend_one_warning_and_nothing_replaced():
    reason = "no kernels for sm_120 in this build (it embeds sm_90, sm_100)"
    r = probe({"paths": [V0340], "imports": [COMPRESSOR], "fail_init": reason})
    warnings = lines(r, "WARNING")
    assert len(warnings) == 1 and reason in warnings[0] and "nothing replaced" in warnings[0], lines(r)
    assert "no backend on cpu" in warnings[0]
    assert not [m for m in lines(r) if "self-check of" in m]
    assert states(r) == {n: "kept" for n in NAMES}
    assert r["compressor"] == {n: "vllm" for n in NAMES}


def test_check_deferred_to_the_first_call_outside_a_capture():
    """CUDA available but not initialized when the module is imported (torch's
    CUDA state faked on the CPU): first-call shims; a call before CUDA is
    initialized or inside a graph capture runs vLLM's function with a
    WARNING; the first call outside one runs the check and binds."""
    r = probe({"paths": [V0340], "imports": [COMPRESSOR], "fake_cuda": True})
    st = r["stages"]
    assert {n: s["state"] for n, s in st["import"]["status"].items()} == {n: "deferred" for n in NAMES}
    assert st["import"]["compressor"] == {n: "shim" for n in NAMES}
    for stage, why in (("uninitialized", "CUDA is not initialized yet"),
                       ("capture", "the current stream is capturing a CUDA graph")):
        assert_steps(st[stage]["steps"])
        assert {n: s["state"] for n, s in st[stage]["status"].items()} == {n: "deferred" for n in NAMES}
        assert st[stage]["compressor"] == {n: "shim" for n in NAMES}
        waits = [m for m in lines(r, "WARNING") if why in m]
        assert len(waits) == 1 and "vLLM's function runs" in waits[0], lines(r)
    assert_steps(st["eager"]["steps"])
    assert {n: s["state"] for n, s in st["eager"]["status"].items()} == {n: "replaced" for n in NAMES}
    assert st["eager"]["compressor"] == st["eager"]["ops"] == {n: "ours" for n in NAMES}
    assert len(lines(r, "WARNING")) == 2, lines(r, "WARNING")
    assert [m for m in lines(r, "INFO") if "self-check of rope_quant_insert on cpu" in m]


def _real_tree(tmp_path: Any, which: str) -> str:
    """vLLM's own ops module file (symlinked from ../shared/seed/) in a tree
    with stand-ins for what it imports: vllm.platforms (neither ROCm nor
    CUDA), vllm.triton_utils (triton itself) and the Blackwell e2m1 helper
    (a @triton.jit stub: no kernel can run on the CPU anyway)."""
    src = os.path.join(SEED, which, *OPS.split(".")) + ".py"
    if not os.path.exists(src):
        pytest.skip(f"vLLM's module is not at {src} (../shared/seed/ is not here)")
    if sys.version_info < (3, 10):
        pytest.skip("vLLM's module needs Python 3.10 or later (X | None annotations)")
    pytest.importorskip("triton", reason="triton is not importable: vLLM's module cannot be imported")
    root = os.path.join(str(tmp_path), "tree")
    files = {
        "vllm/__init__.py": '"""Stand-in."""\n',
        "vllm/platforms/__init__.py": (
            '"""Stand-in for vllm.platforms: neither ROCm nor CUDA."""\n\n\n'
            "class _Platform:\n    device_type = 'cpu'\n\n"
            "    def is_rocm(self):\n        return False\n\n"
            "    def is_cuda(self):\n        return False\n\n\ncurrent_platform = _Platform()\n"),
        "vllm/triton_utils/__init__.py": '"""Stand-in."""\nimport triton\nimport triton.language as tl\n',
        "vllm/models/deepseek_v4/common/ops/fused_indexer_q.py": (
            '"""Stand-in for the Blackwell e2m1 helper."""\nimport triton\n\n\n'
            "@triton.jit\ndef _fp32x2_to_fp4x2(lo, hi):\n    return lo\n"),
    }
    for pkg in ("vllm/models", "vllm/models/deepseek_v4", "vllm/models/deepseek_v4/common",
                "vllm/models/deepseek_v4/common/ops", "vllm/models/deepseek_v41",
                "vllm/models/deepseek_v41/common", "vllm/models/deepseek_v41/common/ops"):
        files[pkg + "/__init__.py"] = '"""Stand-in package."""\n'
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    os.symlink(src, os.path.join(root, *OPS.split(".")) + ".py")
    return root


@pytest.mark.parametrize("which,names", [("vllm", NAMES),
                                         ("vllm-d444c3d", ("fused_save_compress_norm", "rope_quant_insert"))])
def test_vllm_own_module_files_on_the_cpu(tmp_path, which, names):
    """vLLM's real module imported through the plugin's hook: its Triton
    kernels cannot run on the CPU, so every case is not comparable and
    nothing is replaced, with a WARNING per function and one overall."""
    root = _real_tree(tmp_path, which)
    r = probe({"paths": [root], "imports": [OPS]})
    want_cases = dict(CASES, fused_save_compress_norm=8 if which == "vllm" else 6)
    for name in NAMES:
        s = r["status"][name]
        if name not in names:
            assert s == {"state": "absent"}
            assert r["ops"][name] == "missing"
            continue
        assert s["state"] == "kept" and "ran no case" in s["reason"], s
        assert s["cases"] == s["not_comparable"] == want_cases[name]
        assert r["ops"][name] == "vllm"
    warnings = lines(r, "WARNING")
    assert len(warnings) == len(names) + 1, warnings
    assert all(any(f"kept vLLM's {n}" in m for m in warnings) for n in names)
    assert "replaced nothing" in warnings[-1]


class _Boom(importlib.abc.MetaPathFinder):
    """A finder that fails on vLLM's names."""

    def find_spec(self, fullname, path, target=None):
        if fullname.startswith("vllm"):
            raise RuntimeError("boom")
        return None


@pytest.fixture
def inprocess(monkeypatch):
    """The plugin in this process: switched on, no GPU, undone afterwards."""

    def forget():
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]

    forget()
    monkeypatch.setenv(ENV, "1")
    monkeypatch.delenv(RAY_COPY, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    yield monkeypatch
    plugin.unpatch()
    forget()


def test_a_finder_that_fails_on_vllm_names_does_not_hide_the_module(inprocess, caplog):
    """The path finder raises on a namespace package below one not loaded
    yet; any finder may raise: the lookup then looks on disk."""
    inprocess.syspath_prepend(V0340)
    inprocess.setattr(sys, "meta_path", [_Boom()] + sys.meta_path)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        plugin.register()
    got = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert len(got) == 1 and got[0][0] == logging.INFO and "will check" in got[0][1], got
    assert isinstance(sys.meta_path[0], plugin._Finder)


def test_register_never_raises_and_undoes_itself(inprocess, caplog):
    """A failure after the import hook is in: one WARNING, the hook removed,
    vLLM's functions and the environment as they were."""
    inprocess.syspath_prepend(V0340)
    ops = importlib.import_module(OPS)
    before = {n: getattr(ops, n) for n in NAMES}
    hooks = list(sys.meta_path)

    def boom():
        raise RuntimeError("boom")

    inprocess.setattr(plugin, "_device_now", boom)
    inprocess.setenv(RAY_COPY, "FOO_BAR")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        plugin.register()
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "RuntimeError: boom" in warnings[0] and "left unchanged" in warnings[0]
    assert sys.meta_path == hooks
    assert {n: getattr(ops, n) for n in NAMES} == before
    assert os.environ[RAY_COPY] == "FOO_BAR"


def test_register_never_raises_when_the_package_cannot_load(inprocess, caplog):
    inprocess.syspath_prepend(V0340)
    ops = importlib.import_module(OPS)
    before = {n: getattr(ops, n) for n in NAMES}
    # The check's module cannot be imported (as when torch or the native module fails).
    inprocess.setitem(sys.modules, "dsv4_kvcache_vllm._check", None)
    inprocess.delattr(plugin, "_check", raising=False)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        plugin.register()
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "cannot load dsv4_kvcache" in warnings[0], warnings
    assert {n: getattr(ops, n) for n in NAMES} == before


def test_register_with_a_vllm_that_is_not_a_package(inprocess, caplog):
    inprocess.setitem(sys.modules, "vllm", type(sys)("vllm"))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        plugin.register()
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1 and "nothing replaced" in warnings[0]
    assert not any(isinstance(f, plugin._Finder) for f in sys.meta_path)


def test_check_refuses_ours_where_vllm_writes_other_bytes_in_process(inprocess):
    """The check itself, without the import machinery: vLLM's 0.34.0 insert
    against ours in the seed's order only is refused for 528 and 288 B."""
    from dsv4_kvcache_vllm import _check

    inprocess.syspath_prepend(V0340)
    ops = importlib.import_module(OPS)
    spec = _check.SPECS["rope_quant_insert"]
    planar_only = spec._replace(ours=lambda order, sanitize: spec.ours(None, sanitize))
    result, mismatches = _check.run(planar_only, ops.rope_quant_insert, torch.device("cpu"), None)
    assert result.refused and "528 B" in result.refused and "288 B" in result.refused
    assert set(mismatches) == {"528", "288"}
    assert result.cases == 20 and not result.not_comparable


def _gpu_backend_or_skip():
    if not torch.cuda.is_available():
        pytest.skip("no GPU: torch.cuda.is_available() is False")
    i = dk.info()
    if not any(i["kernels"].values()):
        pytest.skip("this wheel embeds no GPU kernels (a build without a GPU compiler)")


GPU_STEPS = [["mxfp8", 2, True], ["nvfp4", 2, True], ["fp8", 2, True], ["v4", 1, False]]


@pytest.mark.parametrize("init_first", [True, False])
def test_gpu_check_before_capture(init_first):
    """With CUDA initialized when the module is imported (a worker loading its
    model), the check and the backend happen at import; without, at the
    first (eager) call. Either way a graph captured afterwards replays
    vLLM's bytes (the per-token orders included)."""
    _gpu_backend_or_skip()
    r = probe({"paths": [V0340], "imports": [COMPRESSOR], "cuda_init_first": init_first,
               "gpu_steps": GPU_STEPS}, cpu=False)
    assert states(r) == {n: "replaced" for n in NAMES}, (r["status"], lines(r))
    assert all(s["device"].startswith("cuda:") for s in r["status"].values())
    assert r["status"]["rope_quant_insert"]["orders"] == V0340_ORDERS
    assert [m for m in lines(r, "INFO") if "created on cuda:" in m]
    if not init_first:
        assert_steps(r["gpu_first_call"])
        assert [m for m in lines(r, "INFO") if "waits for their first call" in m]
    assert_steps(r["gpu_capture"])
    assert not lines(r, "WARNING"), lines(r, "WARNING")


@pytest.mark.parametrize("init_first", [True, False])
def test_gpu_without_kernels_keeps_vllm(init_first):
    """A wheel without GPU kernels on a GPU: the backend cannot start (at
    import, or at the first call), one WARNING with the reason, nothing
    replaced, vLLM's functions keep running."""
    if not torch.cuda.is_available():
        pytest.skip("no GPU: torch.cuda.is_available() is False")
    if any(dk.info()["kernels"].values()):
        pytest.skip("this wheel embeds GPU kernels")
    r = probe({"paths": [V0340], "imports": [COMPRESSOR], "cuda_init_first": init_first,
               "gpu_steps": [["nvfp4", 2, True]], "gpu_capture": False}, cpu=False)
    warnings = lines(r, "WARNING")
    assert len(warnings) == 1 and "no backend on cuda:" in warnings[0], lines(r)
    assert "nothing replaced" in warnings[0]
    assert states(r) == {n: "kept" for n in NAMES}
    assert r["compressor"] == {n: "vllm" for n in NAMES}
    if not init_first:
        assert_steps(r["gpu_first_call"])


def test_info_lists_embedded_kernels_and_backends():
    i = dk.info()
    assert i["version"] == dk.__version__
    assert set(i["kernels"]) == {"cuda", "hip"}
    for backend in ("cuda", "hip"):
        targets = i["kernels"][backend]
        # A backend has targets exactly when a compiler built them, else a reason.
        assert bool(targets) == (i["compilers"][backend] is not None)
    assert len(i["missing"]) == sum(not t for t in i["kernels"].values())
    assert i["targets"]["cuda"]["sass"] == i["kernels"]["cuda"]
    assert i["targets"]["hip"]["code_objects"] == i["kernels"]["hip"]
    assert i["targets"]["hip"]["code_object_version"] == 5
    cuda = i["targets"]["cuda"]
    assert set(cuda["min_driver"]) == set(cuda["sass"]) | set(cuda["ptx"])
    if os.environ.get("DSV4_KVCACHE_REQUIRE_KERNELS") == "1":
        assert i["kernels"] == {"cuda": ["sm_90", "sm_100", "sm_103", "sm_120"],
                                "hip": ["gfx90a", "gfx942", "gfx950"]}
        # CUDA 12.9: SASS for every CUDA 12 era driver the GPU runs on, the
        # PTX for 12.9's driver and newer (docs/backends.md, "Drivers").
        assert cuda["ptx"] == ["compute_90"] and cuda["toolkit"] == "12.9"
        assert cuda["min_driver"] == {"sm_90": "525.60.13", "sm_100": "570.26", "sm_103": "575.51.03",
                                      "sm_120": "570.26", "compute_90": "575.51.03"}
    assert i["backends"][0] == "cpu"
    assert "cuda" not in i["backends"] or (i["kernels"]["cuda"] and torch.cuda.is_available())
    assert all(b in i["devices"] for b in ("cpu", "cuda", "hip"))
