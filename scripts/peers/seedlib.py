"""Shared helpers for the seed scripts (own code; no seed code lives here).

The seed's two V4.1 insert kernels (`_rope_quant_insert_mxfp8_kernel` and
`_rope_quant_insert_nvfp4_kernel`) are *not* part of this repository. They are
cut out of the seed document at run time (`extract_kernel_source`), written to
a private temporary file (Triton's `@jit` needs `inspect.getsourcelines`, which
needs a file) and executed in a namespace that holds `triton`, `tl` and the
e2m1 packing helper `_fp32x2_to_fp4x2` defined below, which this project wrote
from `shared/spec/semantics.md` (the seed references but does not show it).

Usage: a module, not run by itself; the other scripts here import it.
"""

import ast
import atexit
import hashlib
import os
import shutil
import tempfile

import numpy as np

import triton
import triton.language as tl

DEFAULT_SEED_DOC = "../shared/seed/000_4510e2324b17d15c.txt"

SEED_KERNELS = ("_rope_quant_insert_mxfp8_kernel", "_rope_quant_insert_nvfp4_kernel")

# Record width (bytes per token) of each V4.1 paged layout.
RECORD_WIDTH = {"mxfp8": 528, "nvfp4": 288}
KERNEL_FOR_LAYOUT = {
    "mxfp8": "_rope_quant_insert_mxfp8_kernel",
    "nvfp4": "_rope_quant_insert_nvfp4_kernel",
}


# ---------------------------------------------------------------------------
# e2m1 (FP4) packing helper, written from semantics.md.
#
# Magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 are codes 0..7. Round to nearest with
# ties to the even code; the decision points are the midpoints
#   0.25 (0|1 -> 0), 0.75 (1|2 -> 2), 1.25 (2|3 -> 2), 1.75 (3|4 -> 4),
#   2.5 (4|5 -> 4), 3.5 (5|6 -> 6), 5 (6|7 -> 6),
# so a midpoint whose lower neighbour has the even code uses a strict ">",
# otherwise ">=". Anything above 5 (including +inf) saturates to code 7 (6.0).
# NaN fails every comparison and gets code 0, and its sign bit is dropped
# (semantics.md: "a NaN gives code 0"). Bit 3 is the sign bit of the input,
# so -0 gives 8. Plain compares and integer ops only: Hopper has no e2m1
# convert instruction.
# ---------------------------------------------------------------------------
@triton.jit
def _e2m1_code(x):
    a = tl.abs(x)
    code = (a > 0.25).to(tl.uint32)
    code += (a >= 0.75).to(tl.uint32)
    code += (a > 1.25).to(tl.uint32)
    code += (a >= 1.75).to(tl.uint32)
    code += (a > 2.5).to(tl.uint32)
    code += (a >= 3.5).to(tl.uint32)
    code += (a > 5.0).to(tl.uint32)
    sign = x.to(tl.uint32, bitcast=True) >> 31
    sign = tl.where(x == x, sign, 0)
    return code | (sign << 3)


@triton.jit
def _fp32x2_to_fp4x2(lo, hi):
    """Pack two fp32 tensors into e2m1 pairs: byte = code(lo) | code(hi) << 4."""
    return (_e2m1_code(lo) | (_e2m1_code(hi) << 4)).to(tl.uint8)


def e2m1_code_np(x):
    """Numpy twin of `_e2m1_code` (same compare chain), for the self-test."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x)
    with np.errstate(invalid="ignore"):
        code = (
            (a > 0.25).astype(np.uint8)
            + (a >= 0.75)
            + (a > 1.25)
            + (a >= 1.75)
            + (a > 2.5)
            + (a >= 3.5)
            + (a > 5.0)
        ).astype(np.uint8)
    sign = (x.view(np.uint32) >> 31).astype(np.uint8)
    sign = np.where(np.isnan(x), 0, sign).astype(np.uint8)
    return code | (sign << 3)


# ---------------------------------------------------------------------------
# Seed extraction.
# ---------------------------------------------------------------------------
def extract_kernel_source(doc_text, name):
    """Cut `@triton.jit\\ndef <name>(...` out of the seed document.

    Takes the decorator line, the `def` header (whose closing `):` may sit in
    column 0) and every following line up to (not including) the first line
    that is non-empty and not indented; trailing blank lines are dropped. The result must parse and define exactly one function `name`.
    """
    lines = doc_text.splitlines()
    starts = [
        i
        for i in range(len(lines) - 1)
        if lines[i].rstrip() == "@triton.jit" and lines[i + 1].startswith(f"def {name}(")
    ]
    if not starts:
        raise SystemExit(f"seed document: no '@triton.jit' + 'def {name}(' found")
    if len(starts) > 1:
        raise SystemExit(f"seed document: {len(starts)} definitions of {name}; expected one")
    i = starts[0]
    out = [lines[i]]
    # The signature's closing "):" sits in column 0 in the seed document, so the
    # "first non-empty, non-indented line" rule only applies once the `def`
    # header is complete (brackets balanced and the line ends with ':').
    depth, header_done = 0, False
    for line in lines[i + 1:]:
        if header_done and line.strip() and not line[0].isspace():
            break
        out.append(line)
        if not header_done:
            depth += line.count("(") + line.count("[") - line.count(")") - line.count("]")
            header_done = depth == 0 and line.rstrip().endswith(":")
    while out and not out[-1].strip():
        out.pop()
    src = "\n".join(out) + "\n"
    tree = ast.parse(src)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if len(tree.body) != 1 or len(defs) != 1 or defs[0].name != name:
        raise SystemExit(f"seed document: extracted text for {name} is not one function")
    return src


_TMPDIR = None


def _tmpdir():
    global _TMPDIR
    if _TMPDIR is None:
        _TMPDIR = tempfile.mkdtemp(prefix="dsv4-seed-")
        atexit.register(shutil.rmtree, _TMPDIR, True)
    return _TMPDIR


def resolve_seed_doc(path):
    """A relative path is tried from the current directory, then from the repository root."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    alt = os.path.join(repo_root, path)
    if os.path.exists(alt):
        return alt
    raise SystemExit(f"seed document not found: {path} (also tried {alt}); pass --seed-doc")


def load_seed_kernels(doc_path):
    """Return ({name: JITFunction}, {name: sha256 of the extracted source})."""
    with open(resolve_seed_doc(doc_path), "r", encoding="utf-8") as f:
        text = f.read()
    kernels, hashes = {}, {}
    for name in SEED_KERNELS:
        src = extract_kernel_source(text, name)
        hashes[name] = hashlib.sha256(src.encode()).hexdigest()
        path = os.path.join(_tmpdir(), f"{name}.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(src)
        ns = {
            "__name__": "dsv4_seed_kernels",
            "triton": triton,
            "tl": tl,
            "_fp32x2_to_fp4x2": _fp32x2_to_fp4x2,
        }
        exec(compile(src, path, "exec"), ns)
        kernels[name] = ns[name]
    return kernels, hashes


def launch_seed(kernel, latent, positions, cos_sin, kv_cache, slot_mapping, compress_ratio, sanitize):
    """Launch one seed insert kernel the way the seed's `rope_quant_insert` does
    (without `launch_pdl`, which is off by default). Returns what Triton returns
    (the compiled kernel on a GPU)."""
    return kernel[(slot_mapping.numel(),)](
        latent,
        positions,
        cos_sin,
        kv_cache,
        slot_mapping,
        COS_STRIDE=cos_sin.stride(0),
        CACHE_STRIDE=kv_cache.stride(0),
        CACHE_BLOCK=kv_cache.shape[1],
        COMPRESS_RATIO=compress_ratio,
        SANITIZE_CACHE_NANS=sanitize,
        num_warps=4,
    )


def interpreting():
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ---------------------------------------------------------------------------
# Small numeric helpers (numpy).
# ---------------------------------------------------------------------------
def bf16_bits_from_f32(x):
    """Round f32 to bf16 (nearest even); returns uint16 bit patterns. NaN -> quiet NaN."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), rounded).astype(np.uint16)


def f32_from_bf16_bits(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def rope_table(max_pos, rope_dim=64, theta=10000.0):
    """cos_sin float32 [max_pos, rope_dim]: cos in the first half, sin in the second.

    Computed in float64 and rounded once to float32, so it does not depend on
    the platform's float32 cos/sin.
    """
    half = rope_dim // 2
    inv_freq = 1.0 / (theta ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim))
    ang = np.arange(max_pos, dtype=np.float64)[:, None] * inv_freq[None, :half]
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)
