"""The vLLM plugin, without vLLM: a stand-in package tree named ``vllm``
(``vllm_stub/``: the real module paths, the compressor's import style, ops
that fail if they run) and the plugin found as vLLM's loader finds it, in the
installed wheel's entry points."""

import importlib
import json
import logging
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest
import torch

import dsv4_kvcache as dk
from dsv4_kvcache import _native, vllm_plugin

from cases import LAYOUTS, clone, compress_case, insert_case, same_storage

HERE = os.path.dirname(os.path.abspath(__file__))
STUB = os.path.join(HERE, "vllm_stub")
OTHER = os.path.join(HERE, "vllm_other")
GROUP = "vllm.general_plugins"
OPS = "vllm.models.deepseek_v41.common.ops.fused_compress_quant_cache"
COMPRESSOR = "vllm.models.deepseek_v41.compressor"
NAMES = ("fused_save_compress_norm", "rope_quant_insert", "save_ring_rows")


def load_general_plugins():
    """What vLLM's loader does with the group: every entry point (those named
    in VLLM_PLUGINS, when set) loaded, then called."""
    allowed = os.environ.get("VLLM_PLUGINS")
    allowed = None if allowed is None else allowed.split(",")
    funcs = [ep.load() for ep in entry_points(group=GROUP) if allowed is None or ep.name in allowed]
    for f in funcs:
        f()


def forget_vllm():
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


@pytest.fixture
def stub(monkeypatch):
    """The stand-in on sys.path and the plugin enabled; afterwards the plugin
    undone and every stand-in module forgotten."""

    def use(tree=STUB):
        monkeypatch.syspath_prepend(tree)
        importlib.invalidate_caches()

    forget_vllm()
    monkeypatch.setenv("DSV4_KVCACHE_VLLM", "1")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    yield use
    vllm_plugin.unpatch()
    forget_vllm()


def ours(module, names=NAMES):
    return all(getattr(module, n) is getattr(dk, n) for n in names)


def test_entry_point_is_in_the_installed_wheel():
    eps = [ep for ep in entry_points(group=GROUP) if ep.name == "dsv4_kvcache"]
    assert len(eps) == 1
    ep = eps[0]
    assert ep.value == "dsv4_kvcache.vllm_plugin:register"
    assert ep.dist is not None and ep.dist.name.replace("_", "-") == "dsv4-kvcache"
    assert ep.dist.version == dk.__version__
    # The wheel's own files, not this source tree.
    assert not os.path.abspath(dk.__file__).startswith(os.path.dirname(HERE) + os.sep)
    assert ep.load() is vllm_plugin.register


def test_patches_loaded_modules_and_later_imports(stub, caplog):
    stub()
    ops = importlib.import_module(OPS)
    compressor = importlib.import_module(COMPRESSOR)
    originals = {n: getattr(ops, n) for n in NAMES}
    assert all(getattr(compressor, n) is originals[n] for n in NAMES)
    with caplog.at_level(logging.INFO, logger="vllm.plugins.dsv4_kvcache"):
        load_general_plugins()
    assert ours(ops) and ours(compressor)
    lines = [r.getMessage() for r in caplog.records
             if r.name == "vllm.plugins.dsv4_kvcache" and "replaced" in r.getMessage()]
    assert len(lines) == 1, lines
    assert dk.__version__ in lines[0] and OPS in lines[0] and COMPRESSOR in lines[0]
    assert all(n in lines[0] for n in NAMES)
    # A module imported afterwards binds ours.
    indexer = importlib.import_module("vllm.models.deepseek_v41.indexer")
    assert indexer.rope_quant_insert is dk.rope_quant_insert
    # A reloaded ops module (new function objects) is replaced again on import.
    importlib.reload(ops)
    assert ours(ops)
    # unpatch() puts the originals back.
    vllm_plugin.unpatch()
    assert all(getattr(compressor, n) is originals[n] for n in NAMES)


def test_patches_modules_imported_after_it(stub, caplog):
    stub()
    with caplog.at_level(logging.INFO, logger="vllm.plugins.dsv4_kvcache"):
        load_general_plugins()
        # Registering found the ops module without importing any of vLLM.
        assert not [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]
        compressor = importlib.import_module(COMPRESSOR)
    ops = sys.modules[OPS]
    assert ours(ops) and ours(compressor)
    lines = [r.getMessage() for r in caplog.records if r.name == "vllm.plugins.dsv4_kvcache"]
    assert any(OPS in m and dk.__version__ in m and "replaced" in m for m in lines), lines


def test_other_vllm_changes_nothing(stub, caplog):
    stub(OTHER)
    hooks = list(sys.meta_path)
    with caplog.at_level(logging.INFO, logger="vllm.plugins.dsv4_kvcache"):
        load_general_plugins()
    assert sys.meta_path == hooks
    lines = [r.getMessage() for r in caplog.records if r.name == "vllm.plugins.dsv4_kvcache"]
    assert len(lines) == 1 and OPS in lines[0] and "nothing patched" in lines[0], lines
    # vLLM's packages were looked up, not imported.
    assert "vllm.models" not in sys.modules


def compressor_case(layout, cr, pcp):
    """One step's buffers: the compressor's (cases.compress_case, with
    ``prev_rows`` and the ring slots to write from it under PCP) and the
    insert's (cases.insert_case's cache, table, slots and scale)."""
    c = compress_case(cr, seed=11, adversarial=True, prev=pcp)
    i = insert_case(layout, cr, t=c["kv_score"].shape[0], seed=12, adversarial=True)
    c["positions"] = c["positions"].clamp(max=40)  # within the cos/sin table
    case = dict(c, cos_sin_cache=i["cos_sin_cache"], kv_cache=i["kv_cache"],
                cache_slot_mapping=i["slot_mapping"], fp8_scale=i["fp8_scale"])
    if pcp:
        # One ring slot per gathered row: two rows written, one skipped (-1).
        n = case["prev_rows"].shape[0]
        slots = torch.full((n,), -1, dtype=c["slot_mapping"].dtype)
        slots[1], slots[3] = 5, 2
        case["ring_write_slots"] = slots
    return case


def reference_step(b):
    """The compressor's step on the CPU reference (sanitize off, as the
    CPU's default)."""
    _native._reference(
        "fused_save_compress_norm",
        b["kv_score"], b["positions"], b["state_cache"], b["slot_mapping"], b["query_start_loc"],
        b["token_to_req_indices"], b["rms_norm_weight"], b["rms_norm_eps"], b["compress_ratio"],
        b["latent_out"], b.get("prev_rows"), b.get("prev_row_indices"))
    if b.get("prev_rows") is not None:
        _native._reference("save_ring_rows", b["prev_rows"], b["ring_write_slots"], b["state_cache"])
    _native._reference(
        "rope_quant_insert",
        b["latent_out"], b["positions"], b["cos_sin_cache"], b["kv_cache"], b["cache_slot_mapping"],
        b["compress_ratio"], b["fp8_scale"])


def compressor_step(compressor, b):
    """The compressor's step (forward, then insert_cache) as vLLM calls it."""
    m = compressor.Compressor(b["compress_ratio"], b["rms_norm_weight"], b["rms_norm_eps"],
                              b["state_cache"])
    latent = m.forward(b["kv_score"], b["positions"], b["latent_out"], b["slot_mapping"],
                       b["query_start_loc"], b["token_to_req_indices"], b.get("prev_rows"),
                       b.get("prev_row_indices"), b.get("ring_write_slots"))
    m.insert_cache(latent, b["positions"], b["cos_sin_cache"], b["kv_cache"],
                   b["cache_slot_mapping"], fp8_scale=b["fp8_scale"])


def outputs(cr):
    return ("latent_out", "kv_cache") + (("state_cache",) if cr == 2 else ())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cr,pcp", [(1, False), (2, False), (2, True)])
def test_compressor_sequence_matches_the_reference(stub, layout, cr, pcp):
    stub()
    load_general_plugins()
    compressor = importlib.import_module(COMPRESSOR)
    case = compressor_case(layout, cr, pcp)
    want, got = clone(case), clone(case)
    reference_step(want)
    compressor_step(compressor, got)
    for out in outputs(cr):
        assert same_storage(got[out], want[out]), out
        # The step wrote something: not the canary it started as.
        assert not same_storage(got[out], case[out]), out


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: torch.cuda.is_available() is False")


@gpu
@pytest.mark.parametrize("layout", ["mxfp8", "nvfp4", "fp8"])
def test_gpu_backend_created_before_capture(stub, caplog, layout):
    """In a process whose CUDA is initialized (a vLLM worker loading its
    model), importing the compressor creates the device's backend, so the
    first call can be inside a graph capture; the replay gives the
    reference's bytes."""
    torch.zeros(1, device="cuda")
    dev = torch.cuda.current_device()
    stub()
    with caplog.at_level(logging.INFO, logger="vllm.plugins.dsv4_kvcache"):
        load_general_plugins()
        compressor = importlib.import_module(COMPRESSOR)
    lines = [r.getMessage() for r in caplog.records if r.name == "vllm.plugins.dsv4_kvcache"]
    assert any(f"backend created on cuda:{dev}" in m for m in lines), lines
    cr = 2
    case = compressor_case(layout, cr, pcp=True)
    want = clone(case)
    props = torch.cuda.get_device_properties(dev)
    gfx950 = getattr(torch.version, "hip", None) and "gfx950" in getattr(props, "gcnArchName", "")
    _native._reference(
        "fused_save_compress_norm",
        want["kv_score"], want["positions"], want["state_cache"], want["slot_mapping"],
        want["query_start_loc"], want["token_to_req_indices"], want["rms_norm_weight"],
        want["rms_norm_eps"], cr, want["latent_out"], want["prev_rows"], want["prev_row_indices"])
    _native._reference("save_ring_rows", want["prev_rows"], want["ring_write_slots"], want["state_cache"])
    _native._reference(
        "rope_quant_insert",
        want["latent_out"], want["positions"], want["cos_sin_cache"], want["kv_cache"],
        want["cache_slot_mapping"], cr, want["fp8_scale"], sanitize=bool(gfx950))
    got = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            compressor_step(compressor, got)
    g.replay()
    torch.cuda.synchronize()
    for out in outputs(cr):
        assert torch.equal(got[out].cpu().view(torch.uint8), want[out].view(torch.uint8)), out


UNSET_SCRIPT = textwrap.dedent(
    """
    import importlib, json, sys
    from importlib.metadata import entry_points
    sys.path.insert(0, sys.argv[1])
    ops = importlib.import_module(sys.argv[2])
    comp = importlib.import_module(sys.argv[3])
    before = {n: getattr(ops, n) for n in sys.argv[4:]}
    hooks = list(sys.meta_path)
    found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "dsv4_kvcache"]
    for ep in found:
        ep.load()()
    later = importlib.import_module("vllm.models.deepseek_v41.indexer")
    print(json.dumps({
        "found": len(found),
        "ops": all(getattr(ops, n) is f for n, f in before.items()),
        "compressor": all(getattr(comp, n) is f for n, f in before.items()),
        "later": later.rope_quant_insert is before["rope_quant_insert"],
        "hooks": sys.meta_path == hooks,
    }))
    """
)


@pytest.mark.parametrize("value", [None, "0", ""])
def test_nothing_patched_without_the_variable(value):
    env = {k: v for k, v in os.environ.items() if k not in ("DSV4_KVCACHE_VLLM", "VLLM_PLUGINS")}
    if value is not None:
        env["DSV4_KVCACHE_VLLM"] = value
    out = subprocess.run([sys.executable, "-c", UNSET_SCRIPT, STUB, OPS, COMPRESSOR, *NAMES], env=env,
                         cwd=HERE, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"found": 1, "ops": True, "compressor": True, "later": True, "hooks": True}


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
