"""Every rejected argument raises ValueError or TypeError naming it, and a
rejected call writes nothing."""

import pytest
import torch

import dsv4_kvcache as dk

from cases import clone, compress_case, fused_case, insert_case, ring_case, same_storage


def rejects(fn, case, arg, exc, words=()):
    before = clone(case)
    with pytest.raises(exc) as e:
        fn(**case)
    msg = str(e.value)
    assert msg.startswith(arg + ":") or f"'{arg}'" in msg, msg
    for w in words:
        assert w in msg, msg
    for k, v in case.items():
        if isinstance(v, torch.Tensor):
            assert same_storage(v, before[k]), f"{k} was written by a rejected call"


def ins(**change):
    c = insert_case("mxfp8", 1, seed=2)
    c.update(change)
    return c


INSERT_BAD = [
    ("latent", TypeError, lambda c: c["latent"].float(), ["BF16"]),
    ("latent", ValueError, lambda c: c["latent"][:, :256].contiguous(), ["512"]),
    ("latent", ValueError, lambda c: c["latent"].t().contiguous().t(), []),
    ("latent", TypeError, lambda c: "not a tensor", ["torch.Tensor"]),
    ("latent", TypeError, lambda c: c["latent"].half(), ["F16", "expected BF16"]),
    ("positions", TypeError, lambda c: c["positions"].float(), ["I32 or I64"]),
    ("positions", ValueError, lambda c: c["positions"][:3], ["slot_mapping"]),
    ("positions", ValueError, lambda c: c["positions"].reshape(1, -1), ["1-D"]),
    ("slot_mapping", ValueError, lambda c: c["slot_mapping"][::2], ["contiguous"]),
    ("cos_sin_cache", ValueError, lambda c: c["cos_sin_cache"][:, :32], [">= 64"]),
    ("cos_sin_cache", TypeError, lambda c: c["cos_sin_cache"].double(), []),
    ("cos_sin_cache", TypeError, lambda c: c["cos_sin_cache"].to(torch.int32), ["F32, BF16 or F16"]),
    ("kv_cache", ValueError, lambda c: torch.zeros(3, 16, 530, dtype=torch.uint8), ["530", "584, 528 or 288"]),
    ("kv_cache", TypeError, lambda c: torch.zeros(3, 16, 528, dtype=torch.int32), []),
    ("kv_cache", ValueError, lambda c: torch.zeros(3, 16, 528, dtype=torch.uint8).transpose(0, 1), []),
    ("fp8_scale", TypeError, lambda c: torch.ones(1), ["only an F8_E4M3"]),
    ("compress_ratio", ValueError, lambda c: 3, ["1 or 2"]),
    ("compress_ratio", ValueError, lambda c: -1, ["1 or 2"]),
]


@pytest.mark.parametrize("arg,exc,make,words", INSERT_BAD)
def test_insert_rejects(arg, exc, make, words):
    c = ins()
    c[arg] = make(c)
    rejects(dk.rope_quant_insert, c, arg, exc, words)


def test_fp8_scale_required():
    c = insert_case("fp8", 1)
    c["fp8_scale"] = None
    rejects(dk.rope_quant_insert, c, "fp8_scale", TypeError, ["required"])
    c["fp8_scale"] = torch.ones(2)
    rejects(dk.rope_quant_insert, c, "fp8_scale", ValueError, ["one element"])


def test_meta_device_rejected():
    c = ins()
    c["positions"] = torch.empty(c["positions"].shape, dtype=torch.int64, device="meta")
    rejects(dk.rope_quant_insert, c, "positions", ValueError, ["meta"])


def test_overlapping_output_rejected():
    c = ins()
    # The latent's bytes lie inside the cache's second block.
    buf = torch.zeros(2 * 16 * 528 + 37 * 1024, dtype=torch.uint8)
    c["kv_cache"] = buf[: 2 * 16 * 528].view(2, 16, 528)
    c["latent"] = buf[16 * 528: 16 * 528 + 37 * 1024].view(torch.bfloat16).view(37, 512)
    rejects(dk.rope_quant_insert, c, "kv_cache", ValueError, ["latent"])


def comp(cr=2, **change):
    c = compress_case(cr, seed=1)
    c.update(change)
    return c


COMPRESS_BAD = [
    ("kv_score", TypeError, lambda c: c["kv_score"].double(), []),
    ("kv_score", ValueError, lambda c: c["kv_score"][:, :512], ["1024"]),
    ("state_cache", TypeError, lambda c: None, ["required"]),
    ("state_cache", ValueError, lambda c: c["state_cache"][..., :512], ["1024"]),
    ("query_start_loc", TypeError, lambda c: None, ["required"]),
    ("token_to_req_indices", TypeError, lambda c: None, ["required"]),
    ("rms_norm_weight", TypeError, lambda c: c["rms_norm_weight"].double(), []),
    ("rms_norm_weight", TypeError, lambda c: c["rms_norm_weight"].to(torch.int32), ["F32, BF16 or F16"]),
    ("rms_norm_weight", ValueError, lambda c: c["rms_norm_weight"][:256], ["512"]),
    ("rms_norm_eps", ValueError, lambda c: float("nan"), ["finite"]),
    ("rms_norm_eps", ValueError, lambda c: -1.0, ["finite"]),
    ("latent_out", ValueError, lambda c: c["latent_out"][:-1], []),
    ("latent_out", TypeError, lambda c: c["latent_out"].float(), ["BF16"]),
    ("prev_rows", TypeError, lambda c: torch.zeros(2, 1024), ["prev_row_indices"]),
]


@pytest.mark.parametrize("arg,exc,make,words", COMPRESS_BAD)
def test_compress_rejects(arg, exc, make, words):
    c = comp()
    c[arg] = make(c)
    if arg == "prev_rows":
        arg = "prev_row_indices"
    rejects(dk.fused_save_compress_norm, c, arg, exc, words)


def test_ring_rejects():
    c = ring_case()
    c["rows"] = c["rows"][:, :512]
    rejects(dk.save_ring_rows, c, "rows", ValueError, ["1024"])
    c = ring_case()
    c["slot_mapping"] = c["slot_mapping"][:-1]
    rejects(dk.save_ring_rows, c, "slot_mapping", ValueError, ["one per row"])
    c = ring_case()
    c["state_cache"] = c["state_cache"].double()
    rejects(dk.save_ring_rows, c, "state_cache", TypeError, [])


def test_fused_rejects():
    c = fused_case("nvfp4", 2)
    c["cache_slot_mapping"] = c["cache_slot_mapping"][:-1]
    rejects(dk.fused_compress_insert, c, "cache_slot_mapping", ValueError, [])
    c = fused_case("nvfp4", 2)
    c["kv_cache"] = torch.zeros(2, 8, 300, dtype=torch.uint8)
    rejects(dk.fused_compress_insert, c, "kv_cache", ValueError, ["300"])


def test_keyword_names_are_the_seeds():
    c = ins()
    with pytest.raises(TypeError):
        dk.rope_quant_insert(**c, cache=c["kv_cache"])
