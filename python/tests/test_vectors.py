"""The committed test vectors (outputs of the seed's Triton kernels on an
H200) replayed through the Python API."""

import glob
import os

import pytest
import torch

import dsv4_kvcache as dk

from cases import load_vectors as load, same_bytes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = sorted(glob.glob(os.path.join(ROOT, "tests", "vectors", "seed_*.safetensors")))
# The reader's vectors (dsv4-kvcache capture --op gather_dequant).
GATHER_FILES = sorted(glob.glob(os.path.join(ROOT, "tests", "vectors", "gather_*.safetensors")))
def test_vectors_present():
    assert len(FILES) == 8, FILES
    assert len(GATHER_FILES) == 10, GATHER_FILES


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("path", GATHER_FILES, ids=[os.path.basename(p) for p in GATHER_FILES])
def test_replay_gather(path, device):
    meta, t = load(path)
    assert meta["op"] == "gather_dequant"
    d = {k[3:]: v.to(device) for k, v in t.items() if k.startswith("in.")}
    # The function and the registered operator give the file's bytes.
    for fn in [dk.gather_dequant, dk.ops.gather_dequant]:
        out = d["out"].clone()
        fn(d["kv_cache"], out, d.get("slot_mapping"), block_table=d.get("block_table"),
           cu_seq_lens=d.get("cu_seq_lens"), seq_starts=d.get("seq_starts"), fp8_scale=d.get("fp8_scale"))
        assert same_bytes(out.cpu(), t["out.out"])


@pytest.mark.parametrize("path", FILES, ids=[os.path.basename(p) for p in FILES])
def test_replay(path):
    meta, t = load(path)
    assert meta["op"] == "rope_quant_insert"
    cache = t["in.kv_cache"].clone()
    dk.rope_quant_insert(t["in.latent"], t["in.positions"], t["in.cos_sin"], cache, t["in.slot_mapping"],
                         int(meta["compress_ratio"]), sanitize=meta["sanitize"] == "true")
    assert same_bytes(cache, t["out.kv_cache"])
    # The registered operator gives the same bytes.
    cache2 = t["in.kv_cache"].clone()
    dk.ops.rope_quant_insert(t["in.latent"], t["in.positions"], t["in.cos_sin"], cache2, t["in.slot_mapping"],
                             int(meta["compress_ratio"]), None, meta["sanitize"] == "true")
    assert same_bytes(cache2, t["out.kv_cache"])
