"""torch.library operators: torch.compile without a graph break gives the
eager bytes; GPU paths (CUDA graphs, parity with the CPU) when a GPU is there."""

import inspect
import os
import re

import pytest
import torch

import dsv4_kvcache as dk

from cases import LAYOUTS, clone, compress_case, insert_case, same_storage

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def step(c):
    """A decode step: compress (CR2, through the ring) then insert."""
    dk.ops.fused_save_compress_norm(c["kv_score"], c["positions"], c["state_cache"], c["slot_mapping"],
                                    c["query_start_loc"], c["token_to_req_indices"], c["rms_norm_weight"],
                                    c["rms_norm_eps"], 2, c["latent_out"])
    dk.ops.rope_quant_insert(c["latent_out"], c["positions"], c["cos_sin_cache"], c["kv_cache"],
                             c["cache_slots"], 2)


def plain_step(c):
    """The same with the plain (seed-named) functions, and the fused launch."""
    dk.fused_save_compress_norm(c["kv_score"], c["positions"], c["state_cache"], c["slot_mapping"],
                                c["query_start_loc"], c["token_to_req_indices"], c["rms_norm_weight"],
                                c["rms_norm_eps"], 2, c["latent_out"])
    dk.rope_quant_insert(c["latent_out"], c["positions"], c["cos_sin_cache"], c["kv_cache"], c["cache_slots"], 2,
                         sanitize=True)
    dk.save_ring_rows(c["kv_score"][:2], c["slot_mapping"][:2], c["state_cache"])
    dk.fused_compress_insert(c["kv_score"], c["positions"], c["state_cache"], c["slot_mapping"],
                             c["query_start_loc"], c["token_to_req_indices"], c["rms_norm_weight"],
                             c["rms_norm_eps"], 2, c["latent_out"], c["cos_sin_cache"], c["kv2"], c["cache_slots"],
                             skip_latent_out=True)


def step_case():
    c = compress_case(2, seed=3)
    i = insert_case("nvfp4", 2, t=c["kv_score"].shape[0], seed=4)
    c.update(cos_sin_cache=i["cos_sin_cache"], kv_cache=i["kv_cache"], cache_slots=i["slot_mapping"])
    c["positions"] = c["positions"].clamp(max=40)
    c["kv2"] = c["kv_cache"].clone()
    return c


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_fullgraph_same_bytes(backend):
    torch._dynamo.reset()
    c = step_case()
    eager, comp = clone(c), clone(c)
    step(eager)
    torch.compile(step, fullgraph=True, backend=backend)(comp)
    for k in ("latent_out", "state_cache", "kv_cache"):
        assert same_storage(eager[k], comp[k]), k


@pytest.mark.skipif(not hasattr(torch.compiler, "substitute_in_graph"), reason="torch < 2.5: no substitute_in_graph")
def test_compile_plain_functions_fullgraph():
    torch._dynamo.reset()
    c = step_case()
    eager, comp = clone(c), clone(c)
    plain_step(eager)
    torch.compile(plain_step, fullgraph=True, backend="aot_eager")(comp)
    for k in ("latent_out", "state_cache", "kv_cache", "kv2"):
        assert same_storage(eager[k], comp[k]), k


def test_ops_have_mutating_schemas():
    s = str(torch.ops.dsv4_kvcache.rope_quant_insert.default._schema)
    assert re.search(r"Tensor\(a\d*!\) kv_cache", s), s
    s = str(torch.ops.dsv4_kvcache.fused_compress_insert.default._schema)
    assert "kv_cache" in s and "latent_out" in s and "!" in s, s


def test_schema_table_is_the_native_signatures():
    """ops.py's one table: each native function's signature (names, kinds,
    defaults) is the table's, and so are the registered operator's
    arguments and the in-graph stand-in's signature."""

    def plain(sig):
        return [(p.name, p.kind, p.default) for p in sig.parameters.values()]

    assert dk.ops.__all__ == ["fused_save_compress_norm", "rope_quant_insert", "save_ring_rows",
                              "fused_compress_insert", "gather_dequant", "indexer_k_norm_rope_store"]
    for name in dk.ops.__all__:
        table = dk.ops._signature(name)
        assert plain(inspect.signature(getattr(dk._native, name))) == plain(table), name
        args = getattr(torch.ops.dsv4_kvcache, name).default._schema.arguments
        assert [a.name for a in args] == list(table.parameters), name
        assert plain(inspect.signature(dk.ops._in_graph(name))) == plain(table), name


def test_readme_examples_run():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README has no python example"
    for b in blocks:
        exec(compile(b, "README.md", "exec"), {})


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU: torch.cuda.is_available() is False")


@gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cr", [1, 2])
def test_gpu_insert_matches_cpu(layout, cr):
    case = insert_case(layout, cr, seed=9, adversarial=True)
    cpu = clone(case)
    dk.rope_quant_insert(**cpu)
    dev = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    dk.rope_quant_insert(**dev)
    assert torch.equal(dev["kv_cache"].cpu().view(torch.uint8), cpu["kv_cache"].view(torch.uint8))


@gpu
def test_gpu_graph_capture_matches_eager():
    c = step_case()
    dev = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in c.items()}
    dk.init("cuda")
    eager = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in dev.items()}
    step(eager)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            step(dev)
    g.replay()
    torch.cuda.synchronize()
    for k in ("latent_out", "state_cache", "kv_cache"):
        assert torch.equal(eager[k].view(torch.uint8), dev[k].view(torch.uint8)), k
