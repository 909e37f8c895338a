"""The vLLM plugin (package ``dsv4_kvcache_vllm``), without vLLM: stand-in
``vllm`` package trees (``vllm_trees/``: vLLM 0.34.0's three functions writing
its per-token records and its indexer key store, vLLM d444c3d's two and no
key store, vLLM 2e31c95's key store with ``mxfp4_n_per_tile``, a vLLM without
the modules; trees derived from them at run time; a stand-in platform that
says ROCm or SM100 where a test asks) and vLLM's own module files from
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
V2E3 = os.path.join(TREES, "2e31c95")
NO_MODULE = os.path.join(TREES, "no_module")
PROBE = os.path.join(HERE, "vllm_probe.py")
# vLLM's own files: ../shared/seed/ beside the checkout, or where this says
# (a machine the checkout was copied to without it).
SEED = os.environ.get("DSV4_KVCACHE_VLLM_SEED") or os.path.normpath(
    os.path.join(HERE, "..", "..", "..", "shared", "seed"))
GROUP = "vllm.general_plugins"
LOGGER = "vllm.plugins.dsv4_kvcache"
OPS = "vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache"
COMPRESSOR = "vllm.models.deepseek_v41.compressor"
INDEXER = "vllm.models.deepseek_v41.indexer"
KEYS = "vllm.models.deepseek_v41.common.ops.indexer_k_store"
OPS_PACKAGE = "vllm.models.deepseek_v41.common.ops"
ATTENTION = "vllm.models.deepseek_v41.attention"
KEY_STORE = "indexer_k_norm_rope_store"
ENV, ALIAS, RAY_COPY = "DSV4_KVCACHE_VLLM", "VLLM_DSV4_KVCACHE", "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"
NAMES = ("fused_save_compress_norm", "rope_quant_insert", "save_ring_rows")
# Every function of vLLM 0.34.0's two modules.
ALL = NAMES + (KEY_STORE,)
# What vLLM 0.34.0 writes: 584 B records page-planar, 528 B and 288 B per token.
V0340_ORDERS = {"584": "planar", "528": "per_token", "288": "per_token", "bf16": None, "fp8": None}
# The check's cases per function (rope_quant_insert: 5 layouts x 2 ratios x
# random/adversarial; the compressor: CR1, CR2 ring, CR2 prev_rows x 2).
# The key store: FP8 and MXFP4 x blocks of 16 and 64 x CR 1 and 2 x
# random/adversarial, and a CR 2 block of 1 per format.
CASES = {"fused_save_compress_norm": 8, "rope_quant_insert": 20, "save_ring_rows": 2, KEY_STORE: 18}
ALL_STEPS = [[layout, cr, pcp] for layout in ("v4", "mxfp8", "nvfp4", "bf16", "fp8")
             for cr, pcp in ((1, False), (2, False), (2, True))]
# Indexer key stores: format, CR, block size, N (where the function takes it).
KEY_STEPS = [["fp8", 1, 64, 0], ["fp8", 2, 16, 0], ["mxfp4", 1, 64, 0], ["mxfp4", 2, 16, 0],
             ["fp8", 2, 1, 0], ["mxfp4", 1, 1, 0]]


def probe(cfg: Dict[str, Any], switch: Optional[str] = ENV, value: Optional[str] = "1",
          env: Optional[Dict[str, str]] = None, cpu: bool = True) -> Dict[str, Any]:
    """Runs vllm_probe.py in a fresh interpreter with the switch ``switch``
    set to ``value`` (no switch: None) and returns its report. ``cpu`` hides
    the GPUs, so the check runs on the CPU on any machine."""
    e = {k: v for k, v in os.environ.items()
         if k not in (ENV, ALIAS, "VLLM_PLUGINS", RAY_COPY, "STANDIN_FLIP", "STANDIN_PLATFORM")}
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


def assert_key_steps(steps: Dict[str, Any], refused: Any = ()) -> None:
    """Every indexer key store gave vLLM's bytes and wrote something, but
    those in ``refused``, where the binding raised what vLLM's raised and
    wrote nothing."""
    assert steps
    for case, r in steps.items():
        if case in refused:
            assert r["raised"] == r["vllm_raised"] and r["raised"].startswith(refused[case]), (case, r)
            assert r["same"] and not r["written"], (case, r)
        else:
            assert r == {"same": True, "written": True}, (case, r)


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
    r = probe({"paths": [V0340], "imports": [COMPRESSOR, INDEXER, ATTENTION], "switch_off_ops": True,
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
    assert r["keys"] == {KEYS: "vllm", OPS_PACKAGE: "vllm", ATTENTION: "vllm"}
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
    """vLLM 0.34.0's three functions and its indexer key store: each checked
    on the CPU and replaced, the 528 B and 288 B inserts bound to the
    per-token order; the compressor's steps then give vLLM's bytes in every
    layout and mode, and so do the key stores through the attention
    module, which bound the key store by name from the ops package (before
    the plugin was registered, or after the plugin replaced it)."""
    cfg = {"paths": [V0340], "indexer": INDEXER, "steps": ALL_STEPS, "key_steps": KEY_STEPS}
    if import_first:
        cfg.update(import_before=[COMPRESSOR, ATTENTION], imports=[INDEXER])
    else:
        cfg.update(imports=[COMPRESSOR, INDEXER, ATTENTION])
    r = probe(cfg, switch)
    assert states(r) == {n: "replaced" for n in ALL}, r["status"]
    assert r["status"]["rope_quant_insert"]["orders"] == V0340_ORDERS
    keys = r["status"][KEY_STORE]
    assert keys["orders"] == {"fp8 keys row_major": None, "mxfp4 keys row_major": None}
    assert keys["dispatch"] == {"rocm": False, "mx_scale": False, "n_per_tile": False}
    assert keys["module"] == KEYS
    for name in ALL:
        s = r["status"][name]
        assert (s["cases"], s["not_comparable"], s["device"]) == (CASES[name], 0, "cpu"), (name, s)
    assert r["ops"] == r["compressor"] == {n: "ours" for n in NAMES}
    assert r["indexer"] == "ours"
    assert r["keys"] == {KEYS: "ours", OPS_PACKAGE: "ours", ATTENTION: "ours"}
    assert_steps(r["steps"])
    assert_key_steps(r["key_steps"])
    assert not lines(r, "WARNING"), lines(r, "WARNING")
    info = lines(r, "INFO")
    for name in ALL:
        cost = [m for m in info if f"self-check of {name} on cpu: {CASES[name]} cases, 0 not comparable" in m]
        assert len(cost) == 1 and cost[0].endswith(" ms"), info
    replaced = [m for m in info if ": replaced " in m]
    assert len(replaced) == 2 and all(dk.__version__ in m for m in replaced), info
    fused = [m for m in replaced if OPS in m]
    assert len(fused) == 1 and all(n in fused[0] for n in NAMES) and KEY_STORE not in fused[0]
    assert "528 B per_token" in fused[0] and "584 B planar" in fused[0]
    assert (COMPRESSOR in fused[0]) == import_first
    key = [m for m in replaced if KEYS in m]
    assert len(key) == 1 and "fp8 keys row_major, mxfp4 keys row_major" in key[0], key
    # Imported first, the ops package and the attention module bound vLLM's
    # function and are patched at adoption; else the package bound ours.
    patched = key[0].rpartition(" in ")[2].split(", ")
    assert (ATTENTION in patched) == (OPS_PACKAGE in patched) == import_first, key
    # The switch is forwarded to Ray workers under its first name.
    assert r["ray_copy"] == ENV


def test_d444c3d_two_functions_and_584_only():
    """vLLM d444c3d: no save_ring_rows (logged once, though the module is
    checked twice), no prev_rows (no such case), no 528/288 B records (vLLM's
    raises: not comparable, and calls with them still go to vLLM's)."""
    r = probe({"paths": [D444], "imports": [COMPRESSOR], "register": 2, "reload": True, "calls_528": True,
               "steps": [[layout, cr, False] for layout in ("v4", "bf16", "fp8") for cr in (1, 2)]})
    assert states(r) == {"fused_save_compress_norm": "replaced", "rope_quant_insert": "replaced",
                         "save_ring_rows": "absent", KEY_STORE: "absent"}, r["status"]
    # No indexer_k_store module: its function is absent, said once at INFO.
    assert r["status"][KEY_STORE] == {"state": "absent", "module": KEYS,
                                      "reason": f"vLLM (version unknown) has no {KEYS}"}
    no_module = [m for m in lines(r) if f"has no {KEYS}" in m]
    assert len(no_module) == 1 and lines(r, "INFO").count(no_module[0]) == 1, lines(r)
    assert r["keys"] == {KEYS: None, OPS_PACKAGE: "missing", ATTENTION: None}
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
    r = probe({"paths": [root], "imports": [COMPRESSOR, ATTENTION], "steps": [["nvfp4", 2, True]],
               "key_steps": KEY_STEPS[:2]})
    assert states(r) == {n: "replaced" for n in ALL}, (r["status"], lines(r))
    assert r["compressor"] == {n: "ours" for n in NAMES}
    assert r["keys"] == {KEYS: "ours", OPS_PACKAGE: "ours", ATTENTION: "ours"}
    assert_steps(r["steps"])
    assert_key_steps(r["key_steps"])
    assert not lines(r, "WARNING")


# The case each flip shows in first, after the order whose bytes it breaks
# (the flipped byte is the call's last written one: a scale of the last
# record, at different offsets in the two orders).
FLIPPED_CASE = {"rope_quant_insert:288": "per_token order: case '288 B cr1 random'",
                "rope_quant_insert:584": "planar order: case '584 B cr1 random'",
                "rope_quant_insert:fp8": "case 'fp8 rows cr1 random'",
                "fused_save_compress_norm": "case 'cr1 random'", "save_ring_rows": "case 'random'",
                f"{KEY_STORE}:fp8": "case 'fp8 block 16 cr1 random'",
                f"{KEY_STORE}:mxfp4": "case 'mxfp4 block 16 cr1 random'"}


@pytest.mark.parametrize("flip", sorted(FLIPPED_CASE))
def test_a_function_writing_one_other_byte_is_kept(flip):
    """One flipped byte in vLLM's output: that function stays vLLM's, with a
    WARNING naming it, the case and the byte; the others are replaced."""
    name = flip.split(":")[0]
    r = probe({"paths": [V0340], "imports": [COMPRESSOR, ATTENTION]}, env={"STANDIN_FLIP": flip})
    assert r["status"][name]["state"] == "kept"
    assert {n: s for n, s in states(r).items() if n != name} == {n: "replaced" for n in ALL if n != name}
    assert r["compressor"] == {n: ("vllm" if n == name else "ours") for n in NAMES}
    keys = "vllm" if name == KEY_STORE else "ours"
    assert r["keys"] == {KEYS: keys, OPS_PACKAGE: keys, ATTENTION: keys}
    f = r["flips"][0]
    warnings = lines(r, "WARNING")
    # The key store is its module's only function: that module replaced nothing, which is said too.
    assert len(warnings) == (2 if name == KEY_STORE else 1), warnings
    if name == KEY_STORE:
        assert f"replaced nothing in {KEYS}" in warnings[1]
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
        assert {n: s["state"] for n, s in w["status"].items()} == {n: "replaced" for n in ALL}, w["status"]
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
    # The key store's module (adopted first: the ops package imports it) met
    # it first; the second module's failure is said at INFO.
    assert KEY_STORE in warnings[0]
    assert [m for m in lines(r, "INFO") if reason in m and "rope_quant_insert" in m]
    assert states(r) == {n: "kept" for n in ALL}
    assert r["compressor"] == {n: "vllm" for n in NAMES}


def test_check_deferred_to_the_first_call_outside_a_capture():
    """CUDA available but not initialized when the module is imported (torch's
    CUDA state faked on the CPU): first-call shims; a call before CUDA is
    initialized or inside a graph capture runs vLLM's function with a
    WARNING; the first call outside one runs the check and binds."""
    r = probe({"paths": [V0340], "imports": [COMPRESSOR, ATTENTION], "fake_cuda": True,
               "key_steps": KEY_STEPS[:3]})
    st = r["stages"]
    assert {n: s["state"] for n, s in st["import"]["status"].items()} == {n: "deferred" for n in ALL}
    assert st["import"]["compressor"] == {n: "shim" for n in NAMES}
    for stage, why in (("uninitialized", "CUDA is not initialized yet"),
                       ("capture", "the current stream is capturing a CUDA graph")):
        assert_steps(st[stage]["steps"])
        assert {n: s["state"] for n, s in st[stage]["status"].items()} == {n: "deferred" for n in ALL}
        assert st[stage]["compressor"] == {n: "shim" for n in NAMES}
        waits = [m for m in lines(r, "WARNING") if why in m and KEY_STORE not in m]
        assert len(waits) == 1 and "vLLM's function runs" in waits[0], lines(r)
    assert_steps(st["eager"]["steps"])
    assert {n: s["state"] for n, s in st["eager"]["status"].items()} == {
        n: "deferred" if n == KEY_STORE else "replaced" for n in ALL}
    assert st["eager"]["compressor"] == st["eager"]["ops"] == {n: "ours" for n in NAMES}
    # The key store's own shim: vLLM's inside a capture, checked at its first eager call.
    assert_key_steps(st["key_capture"]["steps"])
    assert st["key_capture"]["status"][KEY_STORE]["state"] == "deferred"
    assert st["key_capture"]["keys"] == {KEYS: "shim", OPS_PACKAGE: "shim", ATTENTION: "shim"}
    waits = [m for m in lines(r, "WARNING") if KEY_STORE in m]
    assert len(waits) == 1 and "capturing a CUDA graph" in waits[0], lines(r)
    assert_key_steps(st["key_eager"]["steps"])
    assert st["key_eager"]["status"][KEY_STORE]["state"] == "replaced"
    assert st["key_eager"]["keys"] == {KEYS: "ours", OPS_PACKAGE: "ours", ATTENTION: "ours"}
    assert len(lines(r, "WARNING")) == 3, lines(r, "WARNING")
    assert [m for m in lines(r, "INFO") if "self-check of rope_quant_insert on cpu" in m]
    assert [m for m in lines(r, "INFO") if f"self-check of {KEY_STORE} on cpu" in m]


# What vLLM's own modules import, in stand-ins (_real_tree).
_REAL_PLATFORM = '''"""Stand-in for vllm.platforms: the platform torch runs on (neither ROCm
nor CUDA where no GPU is visible)."""
import torch


class _Platform:
    def __init__(self):
        gpu = torch.cuda.is_available()
        self.rocm = gpu and torch.version.hip is not None
        self.cuda = gpu and not self.rocm
        self.major = torch.cuda.get_device_capability()[0] if self.cuda else 0

    def is_rocm(self):
        return self.rocm

    def is_cuda(self):
        return self.cuda

    def is_device_capability_family(self, family):
        return self.cuda and self.major * 10 == family


current_platform = _Platform()
'''
_REAL_DEEP_GEMM = '''"""Stand-in for vllm.utils.deep_gemm's MX scale switch: on CUDA's SM100 family."""
from vllm.platforms import current_platform


def mqa_logits_use_mx_scales():
    return current_platform.is_cuda() and current_platform.is_device_capability_family(100)
'''
_REAL_UE8M0 = '''"""Stand-in for the UE8M0 packing of vllm.v1.attention.ops.common."""
import triton
import triton.language as tl


@triton.jit
def pack_ue8m0_x4(scale):
    # A power of two's biased exponent in each of the four bytes.
    e = (scale.to(tl.int32, bitcast=True) >> 23) & 255
    return e | (e << 8) | (e << 16) | (e << 24)
'''
_REAL_OPS_PACKAGE = '''"""Stand-in for the V4.1 ops package: what indexer_k_store takes from it.
The e2m1 conversion is Blackwell-only in vLLM; this stand-in has none, so
vLLM's MXFP4 keys never compile here (as on Hopper and ROCm)."""
import triton
import triton.language as tl

MXFP4_BLOCK_SIZE = 32


@triton.jit
def _fp32x2_to_fp4x2(lo, hi):
    tl.static_assert(False, "stand-in: no e2m1 conversion here")
    return lo
'''


def _real_tree(tmp_path: Any, which: str, modules: Any = (OPS,)) -> str:
    """vLLM's own module files (symlinked from ../shared/seed/) in a tree
    with stand-ins for what they import: vllm.platforms (the platform torch
    runs on), vllm.triton_utils (triton itself), the MX scale switch and
    packing, and the Blackwell e2m1 helpers (a @triton.jit stub for the
    compressor's, one that never compiles for the key store's)."""
    srcs = {m: os.path.join(SEED, which, *m.split(".")) + ".py" for m in modules}
    for src in srcs.values():
        if not os.path.exists(src):
            pytest.skip(f"vLLM's module is not at {src} (../shared/seed/ is not here)")
    if sys.version_info < (3, 10):
        pytest.skip("vLLM's module needs Python 3.10 or later (X | None annotations)")
    pytest.importorskip("triton", reason="triton is not importable: vLLM's module cannot be imported")
    root = os.path.join(str(tmp_path), "tree")
    files = {
        "vllm/__init__.py": '"""Stand-in."""\n',
        "vllm/platforms/__init__.py": _REAL_PLATFORM,
        "vllm/triton_utils/__init__.py": '"""Stand-in."""\nimport triton\nimport triton.language as tl\n',
        "vllm/models/deepseek_v4/common/ops/fused_indexer_q.py": (
            '"""Stand-in for the Blackwell e2m1 helper."""\nimport triton\n\n\n'
            "@triton.jit\ndef _fp32x2_to_fp4x2(lo, hi):\n    return lo\n"),
        "vllm/utils/deep_gemm.py": _REAL_DEEP_GEMM,
        "vllm/v1/attention/ops/common.py": _REAL_UE8M0,
    }
    for pkg in ("vllm/models", "vllm/models/deepseek_v4", "vllm/models/deepseek_v4/common",
                "vllm/models/deepseek_v4/common/ops", "vllm/models/deepseek_v41",
                "vllm/models/deepseek_v41/common", "vllm/utils", "vllm/v1", "vllm/v1/attention",
                "vllm/v1/attention/ops"):
        files[pkg + "/__init__.py"] = '"""Stand-in package."""\n'
    files["vllm/models/deepseek_v41/common/ops/__init__.py"] = _REAL_OPS_PACKAGE
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    for module, src in srcs.items():
        os.symlink(src, os.path.join(root, *module.split(".")) + ".py")
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


# Key stores through the attention module (format, CR, block size, N):
# vLLM 0.34.0's signature (no N) and 2e31c95's (N by keyword).
V0340_KEY_STEPS = KEY_STEPS + [["fp8", 2, 24, 0], ["mxfp4", 1, 24, 0]]
V2E3_KEY_STEPS = [["fp8", 1, 64, 16], ["fp8", 2, 16, 0], ["mxfp4", 1, 64, 32], ["mxfp4", 2, 64, 64],
                  ["mxfp4", 2, 16, 16], ["mxfp4", 1, 64, 0], ["mxfp4", 1, 64, 128], ["mxfp4", 2, 16, 32],
                  ["fp8", 2, 24, 0], ["fp8", 1, 1, 0], ["mxfp4", 2, 1, 0]]
ROW_MAJOR = {"fp8 keys row_major": None, "mxfp4 keys row_major": None}


@pytest.mark.parametrize("tree,platform,dispatch,orders,not_comparable,refused", [
    # Neither ROCm nor CUDA, and a CUDA GPU outside the SM100 family: row-major, f32 scales.
    (V0340, "", (False, False, False), ROW_MAJOR, 0, {}),
    (V0340, "cuda", (False, False, False), ROW_MAJOR, 0, {}),
    # SM100: vLLM 0.34.0's FP8 scales are four UE8M0 bytes.
    (V0340, "sm100", (False, True, False),
     {"fp8 keys row_major, ue8m0 scales": None, "mxfp4 keys row_major": None}, 0, {}),
    # ROCm: FP8 tiled (a block of 24 is refused, by vLLM's function); vLLM
    # 0.34.0 refuses tiled MXFP4 (8 cases not comparable), so MXFP4 calls
    # to a paged cache go to vLLM's function, which raises.
    (V0340, "rocm", (True, False, False),
     {"fp8 keys tiled": None, "fp8 keys row_major": None, "mxfp4 keys row_major": None}, 8,
     {"fp8 cr2 block 24": "ValueError: stand-in", "mxfp4 cr1 block 64": "NotImplementedError",
      "mxfp4 cr2 block 16": "NotImplementedError", "mxfp4 cr1 block 24": "NotImplementedError"}),
    # 2e31c95 has no MX scales, even on SM100 (its module never asks).
    (V2E3, "sm100", (False, False, True), ROW_MAJOR, 0, {}),
    # ROCm: MXFP4 in AITER's order for the caller's N; N 0, 128 or one
    # that does not divide the block size go to vLLM's function.
    (V2E3, "rocm", (True, False, True),
     {"fp8 keys tiled": None, "mxfp4 keys preshuffled": None, "fp8 keys row_major": None,
      "mxfp4 keys row_major": None}, 0,
     {"mxfp4 cr1 block 64 N 0": "ValueError: stand-in", "mxfp4 cr1 block 64 N 128": "ValueError: stand-in",
      "mxfp4 cr2 block 16 N 32": "ValueError: stand-in", "fp8 cr2 block 24 N 0": "ValueError: stand-in"}),
], ids=["0.34.0-cpu", "0.34.0-cuda", "0.34.0-sm100", "0.34.0-rocm", "2e31c95-sm100", "2e31c95-rocm"])
def test_key_store_dispatches_as_vllm_does(tree, platform, dispatch, orders, not_comparable, refused):
    """The indexer key store under a stand-in platform: the replacement
    reads what vLLM's function reads (the platform, its MX scale switch
    where it has one, its parameters), writes each call in the order vLLM
    writes it in there (the stand-in's tiles, AITER's order and UE8M0 scales
    are permuted and packed in the test's own code), and hands vLLM's
    function every call it refuses, so the caller sees vLLM's error."""
    steps = V0340_KEY_STEPS if tree == V0340 else V2E3_KEY_STEPS
    r = probe({"paths": [tree], "imports": [ATTENTION], "key_steps": steps},
              env={"STANDIN_PLATFORM": platform})
    s = r["status"][KEY_STORE]
    assert s["state"] == "replaced", (s, lines(r))
    assert s["dispatch"] == dict(zip(("rocm", "mx_scale", "n_per_tile"), dispatch))
    assert s["orders"] == orders
    assert (s["cases"], s["not_comparable"]) == (CASES[KEY_STORE], not_comparable)
    assert r["keys"] == {KEYS: "ours", OPS_PACKAGE: "ours", ATTENTION: "ours"}
    assert_key_steps(r["key_steps"], refused)
    assert set(refused) <= set(r["key_steps"])
    assert not lines(r, "WARNING"), lines(r, "WARNING")
    replaced = [m for m in lines(r, "INFO") if ": replaced " in m]
    assert len(replaced) == 1 and KEY_STORE in replaced[0], lines(r)
    if tree == V2E3:
        # This tree has no fused_compress_quant_cache: its functions are absent, at INFO.
        assert all(r["status"][n]["state"] == "absent" for n in NAMES)
        assert [m for m in lines(r, "INFO") if f"has no {OPS}" in m]


def _fake_key_store(rocm: bool, mx: Optional[bool], n_per_tile: bool) -> Any:
    """A function with vLLM's key store signature (with or without
    ``mxfp4_n_per_tile``) whose module has a platform and an MX scale switch
    (which it calls only where ``mx`` is not None), recording its calls."""
    calls: List[Any] = []
    asked: List[bool] = []

    class Platform:
        def is_rocm(self):
            return rocm

    def switch():
        asked.append(True)
        return True

    glb = {"current_platform": Platform(), "mqa_logits_use_mx_scales": (lambda: switch() and mx)
           if mx is not None else switch, "calls": calls}
    n = ", mxfp4_n_per_tile=0" if n_per_tile else ""
    body = "mqa_logits_use_mx_scales()\n    " if mx is not None else ""
    exec(f"def indexer_k_norm_rope_store(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps,"
         f" k_cache, kv_slot_mapping, compress_ratio, use_fp4_cache{n}):\n"
         f"    current_platform.is_rocm()\n    {body}calls.append(('vllm', k_cache.shape[1], use_fp4_cache"
         f"{', mxfp4_n_per_tile' if n_per_tile else ''}))\n", glb)
    fn = glb["indexer_k_norm_rope_store"]
    fn.calls, fn.asked = calls, asked
    return fn


@pytest.mark.parametrize("rocm,mx,n_per_tile", [(False, None, False), (False, True, False),
                                                (False, False, False), (True, None, False),
                                                (True, None, True), (False, None, True)])
def test_key_store_dispatch_table_in_process(monkeypatch, rocm, mx, n_per_tile):
    """The replacement's routing, without the check: ours gets the order and
    scale form vLLM's function would use, vLLM's function every call it
    refuses and every layout the check did not bind; the MX scale switch is
    asked once, at adoption, and only where vLLM's function asks it; the
    signature is vLLM's."""
    import inspect

    from dsv4_kvcache_vllm import _check

    ours: List[Any] = []
    monkeypatch.setattr(dk, "indexer_k_norm_rope_store",
                        lambda *a, **kw: ours.append((a[5].shape[1], a[8], a[9] if len(a) > 9 else None,
                                                      kw.get("k_order", "row_major"),
                                                      kw.get("mx_scale", False))))
    original = _fake_key_store(rocm, mx, n_per_tile)
    spec = _check.prepare(_check.SPECS[KEY_STORE], original)
    assert spec.facts == {"rocm": rocm, "mx_scale": bool(mx), "n_per_tile": n_per_tile}
    assert len(original.asked) == (1 if mx is not None else 0)
    every = {"fp8 keys row_major", "fp8 keys row_major, ue8m0 scales", "mxfp4 keys row_major",
             "fp8 keys tiled", "mxfp4 keys preshuffled"}
    fn = spec.bind(original, {k: None for k in every}, None)
    assert list(inspect.signature(fn).parameters) == list(inspect.signature(original).parameters)

    def call(block, fp4, n=None, keywords=False):
        args = [None, None, None, None, 1e-6, torch.empty(2, block, 68 if fp4 else 132, dtype=torch.uint8),
                None, 1, fp4]
        names = ["k_pre", "positions", "cos_sin_cache", "rms_norm_weight", "rms_norm_eps", "k_cache",
                 "kv_slot_mapping", "compress_ratio", "use_fp4_cache"]
        extra = {} if n is None else {"mxfp4_n_per_tile": n}
        ours.clear()
        original.calls.clear()
        if keywords:
            fn(**dict(zip(names, args)), **extra)
        else:
            fn(*args, **extra)
        assert len(ours) + len(original.calls) == 1
        return ("ours",) + ours[0][3:] if ours else ("vllm",)

    fp8_mx = bool(mx)
    if not rocm:
        for block in (1, 16, 24, 64):
            assert call(block, False) == ("ours", "row_major", fp8_mx)
            assert call(block, True, keywords=True) == ("ours", "row_major", False)
    else:
        assert call(64, False) == ("ours", "tiled", False)
        assert call(16, False, keywords=True) == ("ours", "tiled", False)
        assert call(24, False) == ("vllm",)  # vLLM raises: the tiles do not divide 24
        assert call(1, False) == ("ours", "row_major", False)
        assert call(1, True) == ("ours", "row_major", False)
        if not n_per_tile:
            assert call(64, True) == ("vllm",)  # vLLM 0.34.0 raises NotImplementedError
        else:
            assert call(64, True, 32) == ("ours", "preshuffled", False)
            assert call(64, True, 16, keywords=True) == ("ours", "preshuffled", False)
            for block, n in ((64, 0), (64, 128), (64, 48), (16, 32)):
                assert call(block, True, n) == ("vllm",), (block, n)
            assert call(64, False, 16) == ("ours", "tiled", False)
    if n_per_tile:
        # N passed on to ours (it ignores it outside the preshuffled order).
        assert call(16, True, 16)[0] == "ours" and ours[0][2] == 16
    else:
        with pytest.raises(TypeError):
            fn(*[None] * 5, torch.empty(2, 16, 132, dtype=torch.uint8), None, 1, False, 16)
    assert len(original.asked) == (1 if mx is not None else 0)  # never asked per call
    # Layouts the check did not bind go to vLLM's function.
    fp8 = "fp8 keys row_major" + (", ue8m0 scales" if mx else "")
    only_fp8 = spec.bind(original, {fp8: None, "fp8 keys tiled": None}, None)
    fn = only_fp8
    assert call(1, True) == ("vllm",)
    assert call(1, False)[0] == "ours"


@pytest.mark.parametrize("which,n_per_tile", [("vllm", False), ("vllm-2e31c95", True)])
def test_vllm_own_key_store_module_on_the_cpu(tmp_path, which, n_per_tile):
    """vLLM's own indexer_k_store.py (0.34.0's and 2e31c95's) through the
    plugin's hook and re-exported by an ops package, as vLLM imports it: its
    Triton kernel cannot run on the CPU, so every case is not comparable and
    the function is kept, with a WARNING; what the replacement would read
    from it is in status()."""
    root = _real_tree(tmp_path, which, (KEYS,))
    r = probe({"paths": [root], "imports": [KEYS]})
    s = r["status"][KEY_STORE]
    assert s["state"] == "kept" and "ran no case" in s["reason"], s
    assert s["cases"] == s["not_comparable"] == CASES[KEY_STORE]
    assert s["dispatch"] == {"rocm": False, "mx_scale": False, "n_per_tile": n_per_tile}
    assert r["keys"][KEYS] == "vllm"
    assert all(r["status"][n]["state"] == "absent" for n in NAMES)  # this tree has no fused module
    warnings = lines(r, "WARNING")
    assert len(warnings) == 2 and f"kept vLLM's {KEY_STORE}" in warnings[0], warnings
    assert "replaced nothing in " + KEYS in warnings[1]


def test_gpu_vllm_own_key_store_module(tmp_path):
    """vLLM 0.34.0's own indexer_k_store.py on this GPU, in the order and
    scale form vLLM uses here: the FP8 cases decide (vLLM's MXFP4 kernel
    needs Blackwell's e2m1 conversion, which the tree's stand-in never
    compiles, so its cases are not comparable and MXFP4 calls stay with
    vLLM's function)."""
    _gpu_backend_or_skip()
    root = _real_tree(tmp_path, "vllm", (KEYS,))
    r = probe({"paths": [root], "imports": [KEYS], "cuda_init_first": True}, cpu=False)
    s = r["status"][KEY_STORE]
    print(json.dumps(s))  # the outcome, for the record (pytest -s)
    assert s["device"].startswith("cuda:"), s
    assert (s["cases"], s["not_comparable"]) == (CASES[KEY_STORE], 9), (s, lines(r))
    if s["state"] == "kept":
        # A byte of vLLM's own FP8 keys that ours does not write: a finding, not a failure of the check.
        assert s["reason"].startswith("ours differs from vLLM's: fp8 keys"), s
    else:
        assert s["state"] == "replaced", (s, lines(r))
        assert set(s["orders"]) in ({"fp8 keys row_major"}, {"fp8 keys row_major, ue8m0 scales"},
                                    {"fp8 keys tiled", "fp8 keys row_major"}), s


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


def test_unpatch_restores_vllm_in_every_module_in_process(inprocess):
    """unpatch() puts vLLM's functions back also where a module bound ours
    itself: the ops package, which imported the key store while the plugin
    adopted it, the attention module and the compressor, imported after the
    replacement; dsv4_kvcache's own functions stay its own."""
    inprocess.syspath_prepend(V0340)
    mine = {n: getattr(dk, n) for n in ALL}
    plugin.register()
    compressor = importlib.import_module(COMPRESSOR)
    attention = importlib.import_module(ATTENTION)
    assert {n: s["state"] for n, s in plugin.status().items()} == {n: "replaced" for n in ALL}
    keys, package, ops = sys.modules[KEYS], sys.modules[OPS_PACKAGE], sys.modules[OPS]
    ours = keys.indexer_k_norm_rope_store
    assert ours.__module__ == "dsv4_kvcache_vllm._check"
    assert package.indexer_k_norm_rope_store is ours and attention.indexer_k_norm_rope_store is ours
    assert compressor.save_ring_rows is dk.save_ring_rows
    plugin.unpatch()
    for module in (keys, package, attention):
        assert module.indexer_k_norm_rope_store.__module__ == KEYS, module
    for name in NAMES:
        assert getattr(ops, name).__module__ == OPS and getattr(compressor, name) is getattr(ops, name)
    assert {n: getattr(dk, n) for n in ALL} == mine
    assert plugin.status() == {}


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
    r = probe({"paths": [V0340], "imports": [COMPRESSOR, ATTENTION], "cuda_init_first": init_first,
               "gpu_steps": GPU_STEPS, "gpu_key_steps": KEY_STEPS}, cpu=False)
    assert states(r) == {n: "replaced" for n in ALL}, (r["status"], lines(r))
    assert r["status"][KEY_STORE]["orders"] == {"fp8 keys row_major": None, "mxfp4 keys row_major": None}
    assert all(s["device"].startswith("cuda:") for s in r["status"].values())
    assert r["status"]["rope_quant_insert"]["orders"] == V0340_ORDERS
    assert [m for m in lines(r, "INFO") if "created on cuda:" in m]
    if not init_first:
        assert_steps(r["gpu_first_call"])
        assert [m for m in lines(r, "INFO") if "waits for their first call" in m]
    assert_steps(r["gpu_capture"])
    assert_key_steps(r["gpu_key_steps"])
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
    # The key store (never called here) is kept where its module was
    # adopted with CUDA initialized, else it still waits for its first call.
    assert states(r) == dict({n: "kept" for n in NAMES}, **{KEY_STORE: "kept" if init_first else "deferred"})
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
