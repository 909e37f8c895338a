#!/usr/bin/env python3
"""Capture test vectors from the seed's V4.1 insert kernels.

Runs the seed's `_rope_quant_insert_mxfp8_kernel` and
`_rope_quant_insert_nvfp4_kernel` (cut out of the seed document at run time;
see seedlib.py) on fixed-seed inputs with adversarial rows, and writes one
safetensors file per (layout, compress ratio, sanitize):

    seed_<mxfp8|nvfp4>_cr<1|2>_<san|nosan>.safetensors

Tensors: in.latent BF16 [T,512], in.positions I64 [T], in.cos_sin F32 [P,64],
in.slot_mapping I64 [N], in.kv_cache U8 [B,64,W], out.kv_cache U8 [B,64,W].
Metadata (strings): format, op, layout, compress_ratio, sanitize, source,
description (JSON: row ranges per category, cos_sin special rows, ...).

Also writes summary.json: for every file, how the seed's bytes compare with a
numpy model of shared/spec/semantics.md (spec_ref.py). That comparison is a
report only; the vectors are always the seed's bytes.

Over 400 lines because of `Inputs` (about 310): the adversarial rows, one
category after another, each placed in the positions and `cos_sin` rows the
next relies on (pairs for CR2, shared table rows); split across files, the
layout of one input set would have to be read in several places.

Usage:
GPU host:   python3 scripts/peers/seed_vectors.py --seed-doc .carry/seed.txt --out $OUT/vectors
CPU check:  TRITON_INTERPRET=1 python3 scripts/peers/seed_vectors.py --device cpu --out /tmp/v
            (the interpreter's fp8 conversion and NaN handling differ from the
            GPU: such files are for plumbing checks only and say so in `source`)
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import seedlib  # noqa: E402
import spec_ref  # noqa: E402

FORMAT = "dsv4-kvcache-vectors/1"
BLOCK_SIZE = 64
P_REAL = 512  # real RoPE table rows; special rows follow
RNG_SEED = 0x5EED_D54


def f32(x):
    return np.float32(x)


def bf16_prev(b):
    """bf16 bit pattern of the next value toward zero (positive finite input)."""
    return np.uint16(b - 1)


def bf16_next(b):
    return np.uint16(b + 1)


def bf16(x):
    return seedlib.bf16_bits_from_f32(np.float32(x))


def search_f32_product(target, k, want_exact=True):
    """Find f32 A with f32(A*k) == target (product of two f32 rounded once)."""
    a0 = np.float32(np.float64(target) / np.float64(k))
    best = None
    cands = [a0]
    up, dn = a0, a0
    for _ in range(24):
        up = np.nextafter(up, np.float32(np.inf))
        dn = np.nextafter(dn, np.float32(0))
        cands += [up, dn]
    for a in cands:
        y = np.float32(np.float64(a) * np.float64(k))
        if y == target:
            return a, True
        d = abs(float(y) - float(target))
        if best is None or d < best[0]:
            best = (d, a)
    return best[1], False


def split_pow2(a):
    """a = 2^m * c with c in [0.5, 1)."""
    c, m = np.frexp(np.float64(a))
    return int(m), np.float32(c)


class Inputs:
    def __init__(self, tokens):
        self.T = tokens
        self.rng = np.random.default_rng(RNG_SEED)
        self.rows = []  # uint16 [512] bf16 bits
        self.table = []  # per row: ('real', None) | ('special', j) | ('fixed', position)
        self.cats = {}  # name -> [[start, end), ...]
        self.special = []  # list of (name, cos[32] f32, sin[32] f32)
        self.special_idx = {}

    # ---- helpers
    def normal_bf16(self, n, scale=1.0):
        return bf16((self.rng.standard_normal(n) * scale).astype(np.float32))

    def add_special(self, name, cos, sin):
        self.special_idx[name] = len(self.special)
        self.special.append((name, np.asarray(cos, np.float32).copy(), np.asarray(sin, np.float32).copy()))
        return self.special_idx[name]

    def add(self, cat, row, table=("real", None)):
        row = np.asarray(row, dtype=np.uint16)
        assert row.shape == (512,)
        t = len(self.rows)
        self.rows.append(row)
        self.table.append(table)
        rs = self.cats.setdefault(cat, [])
        if rs and rs[-1][1] == t:
            rs[-1][1] = t + 1
        else:
            rs.append([t, t + 1])

    def ident(self):
        return ("special", self.special_idx["identity(cos=1,sin=0)"])

    def scale_edge_row(self, targets, inv, key):
        """A RoPE row whose last 64 dims split into one block per target, each
        block's amax A searched so that f32(A*inv) hits the target, with the cos
        entries of that block set to A's mantissa; returns (cos, row, achieved)."""
        n = len(targets)
        width, cos_width = 64 // n, 32 // n
        cos = np.zeros(32, np.float32)
        row = self.normal_bf16(512)
        achieved = []
        for g, tgt in enumerate(targets):
            A, ok = search_f32_product(tgt, inv)
            achieved.append({key: float(tgt), "amax": float(A), "exact": bool(ok)})
            m, c = split_pow2(A)
            cos[g * cos_width:(g + 1) * cos_width] = c
            d0 = 448 + g * width
            small = (self.rng.uniform(-0.45, 0.45, width) * 2.0 ** m).astype(np.float32)
            row[d0:d0 + width] = bf16(small)
            row[d0] = bf16(np.float32(2.0 ** m))
        return cos, row, achieved

    # ---- build
    def build(self):
        rng = self.rng
        one = np.ones(32, np.float32)
        zero = np.zeros(32, np.float32)
        self.add_special("identity(cos=1,sin=0)", one, zero)
        self.add_special("cos=0,sin=1", zero, one)
        self.add_special("cos=-1,sin=0", -one, zero)
        self.add_special("cos=0,sin=-1", zero, -one)
        h = np.float32(np.sqrt(0.5))
        self.add_special("cos=sin=f32(sqrt(1/2))", one * h, one * h)
        self.add_special("cos=-0,sin=1", -zero, one)
        mixed_c = np.array([1, 0, -1, 0, 0.5, -0.5, 0.75, 0.25] * 4, np.float32)
        mixed_s = np.array([0, 1, 0, -1, 0.5, 0.5, -0.25, 0.75] * 4, np.float32)
        self.add_special("mixed exact cos/sin", mixed_c, mixed_s)
        I = self.ident()

        # 1. signed zeros
        self.add("zeros", np.zeros(512, np.uint16), I)
        self.add("zeros", np.full(512, 0x8000, np.uint16), I)
        self.add("zeros", np.tile(np.array([0x0000, 0x8000], np.uint16), 256), I)
        self.add("zeros", np.tile(np.array([0x8000, 0x0000], np.uint16), 256), I)
        self.add("zeros", np.full(512, 0x8000, np.uint16))
        self.add("zeros", np.zeros(512, np.uint16), ("special", self.special_idx["cos=-1,sin=0"]))
        self.add("zeros", np.full(512, 0x8000, np.uint16), ("special", self.special_idx["cos=0,sin=1"]))

        # 2. e2m1 ties (NVFP4): each 16-tile holds +-amax (6*2^k -> scale 2^k, or
        #    9*2^k -> scale 1.5*2^k) and values that divide to exact e2m1 ties /
        #    exact codes / other points. Identity RoPE so the RoPE tiles are exact too.
        ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
        exact = [0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0]
        for k in (-9, -7, -3, 0, 2, 5, 8):
            for mult in (1.0, 1.5):
                sc = mult * 2.0 ** k
                row = np.zeros(512, np.uint16)
                for tile in range(32):
                    vals = [6.0] + list(rng.permutation(ties + exact))[:15]
                    vals = np.array(vals, np.float64) * sc
                    signs = np.where(rng.random(16) < 0.5, -1.0, 1.0)
                    vals = vals * signs
                    perm = rng.permutation(16)
                    row[tile * 16:(tile + 1) * 16] = bf16(vals[perm].astype(np.float32))
                assert np.all(np.abs(seedlib.f32_from_bf16_bits(row).astype(np.float64)
                                     / sc * 4 % 1) == 0), "tie value not exact in bf16"
                self.add("e2m1_ties", row, I)

        # 3. e4m3 ties (MXFP8): each 32-block holds +-448*2^k (exponent exactly k)
        #    and e4m3 midpoints * 2^k (subnormal midpoints included).
        vals = spec_ref.E4M3_VALUES
        mids = (vals[:-1] + vals[1:]) / 2.0
        for k in (-6, -2, 0, 3, 10):
            row = np.zeros(512, np.uint16)
            for blk in range(16):
                m = rng.choice(mids, 31, replace=False)
                v = np.concatenate([[448.0], m]) * 2.0 ** k
                v *= np.where(rng.random(32) < 0.5, -1.0, 1.0)
                row[blk * 32:(blk + 1) * 32] = bf16(v[rng.permutation(32)].astype(np.float32))
            self.add("e4m3_ties", row, I)

        # 4. scale boundaries: one 16-tile amax per tile from a list of bf16 values
        #    at / one bf16 ulp below / above 2^k, 448*2^k, 6*2^k, 9*2^k, 6.375*2^k;
        #    the other 15 elements of the tile are smaller.
        bvals = []
        for base in (1.0, 448.0, 6.0, 9.0, 6.375):
            for k in (-30, -24, -16, -12, -10, -9, -8, -6, -3, -1, 0, 1, 2, 3, 5, 8, 16, 24, 60, 100, 118):
                b = bf16(base * 2.0 ** k)
                if not np.isfinite(seedlib.f32_from_bf16_bits(b)):
                    continue
                bvals += [bf16_prev(b), b, bf16_next(b)]
        # around the amax floor 1e-4
        b = bf16(1e-4)
        bvals += [bf16_prev(bf16_prev(b)), bf16_prev(b), b, bf16_next(b), bf16_next(bf16_next(b))]
        bvals = np.array(bvals, np.uint16)
        bvals = bvals[rng.permutation(len(bvals))]
        ntiles = len(bvals)
        for r0 in range(0, ntiles, 32):
            row = np.zeros(512, np.uint16)
            for tile in range(32):
                b = bvals[(r0 + tile) % ntiles]
                mag = float(seedlib.f32_from_bf16_bits(b))
                others = (rng.uniform(-0.45, 0.45, 15) * mag).astype(np.float32)
                v = np.concatenate([[b ^ (0x8000 if rng.random() < 0.5 else 0)], bf16(others)])
                row[tile * 16:(tile + 1) * 16] = v[rng.permutation(16)]
            self.add("scale_boundaries", row, I)

        # 5. MXFP8 exponent edge: RoPE blocks (14, 15) whose rotated amax A gives
        #    f32(A * f32(1/448)) = 2^j * (1 + n*2^-23), n in -1..3 (one or two f32 ulps
        #    above a power of two is where ceil(log2f) and an exact ceil(log2) can
        #    differ). cos = A / 2^m, sin = 0, latent even dim of the first pair = 2^m.
        targets = []
        for j in (-12, -9, -8, -3, -1, 0, 1, 2, 7):
            p = np.float32(2.0 ** j)
            targets += [np.nextafter(p, np.float32(0)), p]
            t = p
            for _ in range(3):
                t = np.nextafter(t, np.float32(np.inf))
                targets.append(t)
        self.mx_edge = []
        for i in range(0, len(targets), 2):
            pair = targets[i:i + 2]
            if len(pair) < 2:
                pair = pair + [targets[0]]
            cos, row, achieved = self.scale_edge_row(pair, spec_ref.F32_1_448, "target_x")
            j = self.add_special(f"mxfp8 exponent edge {i // 2}", cos, np.zeros(32, np.float32))
            self.mx_edge.append(achieved)
            self.add("mxfp8_exponent_edge_rope", row, ("special", j))

        # 6. NVFP4 scale edge: RoPE tiles 28..31 whose amax A gives f32(A*f32(1/6))
        #    at / one f32 ulp around e4m3 rounding midpoints and the clamp bounds.
        mids = [1.0625 * 2.0 ** -2, 1.0625, 1.0625 * 2.0 ** 4, 1.9375, 1.5 * 2.0 ** -9,
                2.5 * 2.0 ** -9, 432.0, 13.0 * 2.0 ** -4 + 2.0 ** -5, 2.0 ** -9, 448.0]
        ntargets = []
        for mval in mids:
            p = np.float32(mval)
            ntargets += [np.nextafter(p, np.float32(0)), p, np.nextafter(p, np.float32(np.inf))]
        self.nv_edge = []
        for i in range(0, len(ntargets), 4):
            grp = ntargets[i:i + 4]
            while len(grp) < 4:
                grp.append(ntargets[len(grp)])
            cos, row, achieved = self.scale_edge_row(grp, spec_ref.F32_1_6, "target_amax_div_6")
            j = self.add_special(f"nvfp4 scale edge {i // 4}", cos, np.zeros(32, np.float32))
            self.nv_edge.append(achieved)
            self.add("nvfp4_scale_edge_rope", row, ("special", j))

        # 7. huge magnitudes (near bf16 max 0x7F7F = 3.39e38)
        def huge(n):
            return (0x7F00 + rng.integers(0, 0x80, n)).astype(np.uint16) | np.where(
                rng.random(n) < 0.5, 0x8000, 0).astype(np.uint16)
        self.add("huge", huge(512), I)
        self.add("huge", huge(512))  # real RoPE: rotated pairs may overflow to inf
        self.add("huge", np.full(512, 0x7F7F, np.uint16), ("special", self.special_idx["cos=sin=f32(sqrt(1/2))"]))
        self.add("huge", np.full(512, 0xFF7F, np.uint16), I)
        r = self.normal_bf16(512)
        r[96:128] = huge(32)
        r[480:496] = huge(16)
        self.add("huge", r)
        r = self.normal_bf16(512)
        r[0] = 0x7F7F
        r[449] = 0xFF7F
        self.add("huge", r, I)

        # 8. tiny magnitudes (bf16 subnormals 0x0001..0x007F, min normal 0x0080)
        def tiny(n):
            return rng.integers(1, 0x80, n).astype(np.uint16) | np.where(
                rng.random(n) < 0.5, 0x8000, 0).astype(np.uint16)
        self.add("tiny", tiny(512), I)
        self.add("tiny", tiny(512))
        r = self.normal_bf16(512)
        r[32:64] = tiny(32)
        r[464:480] = tiny(16)
        self.add("tiny", r)
        r = np.tile(np.array([0x0080, 0x007F, 0x8080, 0x807F, 0x0001, 0x8001, 0x0000, 0x8000], np.uint16), 64)
        self.add("tiny", r, I)
        self.add("tiny", (self.normal_bf16(512, 1e-38)), I)

        # 9. infinities (a single inf also makes its pair partner NaN: inf*0 in RoPE)
        for (dim, bits, tab) in ((0, 0x7F80, I), (1, 0xFF80, I), (200, 0x7F80, ("real", None)),
                                  (448, 0x7F80, ("real", None)), (511, 0xFF80, ("real", None)),
                                  (450, 0x7F80, ("special", self.special_idx["cos=0,sin=1"])),
                                  (460, 0xFF80, I)):
            r = self.normal_bf16(512)
            r[dim] = bits
            self.add("inf_single", r, tab)
        r = self.normal_bf16(512)
        r[64], r[70] = 0x7F80, 0xFF80
        self.add("inf_pair_in_block", r, I)

        # 10. NaNs (quiet 0x7FC0 / 0xFFC0 and signalling-payload 0x7F81 / 0xFF81)
        for (dim, bits, tab) in ((5, 0x7FC0, I), (100, 0xFFC0, I), (300, 0x7F81, ("real", None)),
                                  (470, 0xFF81, ("real", None)), (449, 0x7FC0, I), (510, 0xFFC0, ("real", None))):
            r = self.normal_bf16(512)
            r[dim] = bits
            self.add("nan_single", r, tab)
        r = self.normal_bf16(512)
        r[64:96] = 0x7FC0
        self.add("nan_block32", r, I)
        r = self.normal_bf16(512)
        r[448:480] = 0xFFC0
        self.add("nan_block32", r)
        r = self.normal_bf16(512)
        r[480:496] = 0x7FC0
        self.add("nan_tile16", r)
        r = self.normal_bf16(512)
        r[160:176] = 0xFFC0
        self.add("nan_tile16", r, I)
        self.add("nan_row", np.full(512, 0x7FC0, np.uint16), I)
        r = self.normal_bf16(512)
        r[40], r[41] = 0x7FC0, 0x7F80
        self.add("nan_and_inf", r, I)

        # 11. exactly one zero block (32 dims = one MXFP8 block / two NVFP4 tiles),
        #     or one zero 16-tile, the rest random normal.
        for blk in range(16):
            r = self.normal_bf16(512)
            r[blk * 32:(blk + 1) * 32] = 0x8000 if blk % 5 == 3 else 0
            self.add("zero_block32", r, I if blk % 2 else ("real", None))
        for tile in (0, 13, 27, 28, 31):
            r = self.normal_bf16(512)
            r[tile * 16:(tile + 1) * 16] = 0
            self.add("zero_tile16", r)

        # 12. random rows on the exact special cos/sin rows
        for name in ("cos=0,sin=1", "cos=-1,sin=0", "cos=0,sin=-1", "cos=sin=f32(sqrt(1/2))",
                     "cos=-0,sin=1", "mixed exact cos/sin"):
            for _ in range(2):
                self.add("special_cos_sin", self.normal_bf16(512), ("special", self.special_idx[name]))

        n_adv = len(self.rows)
        assert n_adv < self.T, "too few tokens for the adversarial rows"

        # 13. random normal rows (bulk), row scales 2^U(-6,6) on a quarter of them;
        #     positions are fixed for a few to cover 0, 1, 2, 3 and the table end.
        fixed_pos = [0, 1, 2, 3, P_REAL - 2, P_REAL - 1]
        for i in range(self.T - n_adv):
            scale = 2.0 ** rng.uniform(-6, 6) if rng.random() < 0.25 else 1.0
            tab = ("fixed", fixed_pos[i]) if i < len(fixed_pos) else ("random", None)
            self.add("random", self.normal_bf16(512, scale), tab)
        return self

    def tensors(self):
        """Returns numpy arrays: latent u16 [T,512], positions i64, cos_sin f32, slots i64."""
        rng = self.rng
        T = self.T
        latent = np.stack(self.rows).astype(np.uint16)
        P = P_REAL + 2 * len(self.special)
        cos_sin = np.zeros((P, 64), np.float32)
        cos_sin[:P_REAL] = seedlib.rope_table(P_REAL)
        for j, (_, c, s) in enumerate(self.special):
            for r in (P_REAL + 2 * j, P_REAL + 2 * j + 1):  # CR2 reads row (p//2)*2
                cos_sin[r, :32] = c
                cos_sin[r, 32:] = s
        positions = np.zeros(T, np.int64)
        skippable = []
        for t, (kind, arg) in enumerate(self.table):
            if kind == "special":
                positions[t] = P_REAL + 2 * arg + 1  # odd: a group boundary for CR 1 and 2
            elif kind == "real":
                positions[t] = 2 * int(rng.integers(0, P_REAL // 2)) + 1
            elif kind == "fixed":
                positions[t] = arg
            else:
                positions[t] = int(rng.integers(0, P_REAL))
                skippable.append(t)
        num_blocks = -(-T // BLOCK_SIZE)
        slots = rng.permutation(num_blocks * BLOCK_SIZE)[:T].astype(np.int64)
        n_skip = max(1, round(0.05 * T))
        skip = rng.choice(np.array(skippable), n_skip, replace=False)
        slots[skip] = -1
        return latent, positions, cos_sin, slots, num_blocks

    def category_of(self, t):
        for name, ranges in self.cats.items():
            for a, b in ranges:
                if a <= t < b:
                    return name
        return None


def canary_cache(num_blocks, width, seed):
    """Pseudo-random canary fill, so any byte written that should not be is visible."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (num_blocks, BLOCK_SIZE, width), dtype=np.uint8)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed-doc", default=seedlib.DEFAULT_SEED_DOC)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=640,
                    help="rows per file (T == N); 640 keeps the MXFP8 files near 1.3 MB")
    ap.add_argument("--no-spec-check", action="store_true",
                    help="skip the report comparing the seed bytes with spec_ref.py")
    ap.add_argument("--spec-no-fma", action="store_true",
                    help="spec check models RoPE without fma (matches the CPU interpreter)")
    args = ap.parse_args()

    t0 = time.time()
    kernels, hashes = seedlib.load_seed_kernels(args.seed_doc)
    dev = torch.device(args.device)
    interp = seedlib.interpreting()
    if dev.type == "cuda":
        gpu = torch.cuda.get_device_name(dev)
    else:
        gpu = "cpu"
    source = f"seed-triton {triton.__version__} {gpu}"
    if interp:
        source += " TRITON_INTERPRET=1 (plumbing test only, not reference bytes)"
        print("WARNING: Triton interpreter: outputs are NOT valid reference vectors", file=sys.stderr)

    inp = Inputs(args.tokens).build()
    latent_u16, positions, cos_sin, slots, num_blocks = inp.tensors()

    latent_t = torch.from_numpy(latent_u16.view(np.int16).copy()).view(torch.bfloat16)
    positions_t = torch.from_numpy(positions)
    cos_sin_t = torch.from_numpy(cos_sin)
    slots_t = torch.from_numpy(slots)

    description_base = {
        "generator": "scripts/peers/seed_vectors.py",
        "rng_seed": RNG_SEED,
        "tokens": args.tokens,
        "block_size": BLOCK_SIZE,
        "rows": inp.cats,
        "cos_sin_real_rows": [0, P_REAL],
        "cos_sin_real_table": "theta 10000, rope dim 64, float64 rounded to float32; cos cols 0..31, sin 32..63",
        "cos_sin_special_rows": {name: [P_REAL + 2 * j, P_REAL + 2 * j + 2]
                                 for j, (name, _, _) in enumerate(inp.special)},
        "positions": "adversarial rows: odd positions (group boundary for CR1 and CR2); special cos_sin "
                     "rows are duplicated at 2j and 2j+1 so CR1 (row p) and CR2 (row (p//2)*2) read the "
                     "same values; random rows: random positions in [0, 512) including 0..3",
        "slots": "random permutation of distinct valid slots, about 5% of the random rows set to -1",
        "kv_cache_canary": "pseudo-random bytes (numpy default_rng, seed per file)",
        "mxfp8_exponent_edge": inp.mx_edge,
        "nvfp4_scale_edge": inp.nv_edge,
        "seed_kernel_sha256": hashes,
    }

    os.makedirs(args.out, exist_ok=True)
    summary = {"source": source, "files": {}}
    any_mismatch = False
    for layout in ("mxfp8", "nvfp4"):
        width = seedlib.RECORD_WIDTH[layout]
        kernel = kernels[seedlib.KERNEL_FOR_LAYOUT[layout]]
        for cr in (1, 2):
            for sanitize in (False, True):
                name = f"seed_{layout}_cr{cr}_{'san' if sanitize else 'nosan'}"
                cache_in = canary_cache(num_blocks, width, seed=RNG_SEED + width * 4 + cr * 2 + int(sanitize))
                cache_dev = torch.from_numpy(cache_in.copy()).to(dev)
                compiled = seedlib.launch_seed(kernel, latent_t.to(dev), positions_t.to(dev), cos_sin_t.to(dev),
                                    cache_dev, slots_t.to(dev), cr, sanitize)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                cache_out = cache_dev.cpu().numpy()
                try:  # keep the PTX the seed compiled to, for the record (not a vector)
                    asm = getattr(compiled, "asm", None)
                    if asm and "ptx" in asm:
                        os.makedirs(os.path.join(args.out, "ptx"), exist_ok=True)
                        with open(os.path.join(args.out, "ptx", name + ".ptx"), "w") as f:
                            f.write(asm["ptx"])
                except Exception as e:  # noqa: BLE001
                    print(f"(could not save PTX: {e!r})", file=sys.stderr)

                desc = dict(description_base)
                meta = {
                    "format": FORMAT,
                    "op": "rope_quant_insert",
                    "layout": layout,
                    "compress_ratio": str(cr),
                    "sanitize": "true" if sanitize else "false",
                    "source": source,
                    "description": json.dumps(desc, separators=(",", ":")),
                }
                tensors = {
                    "in.latent": latent_t.contiguous(),
                    "in.positions": positions_t.contiguous(),
                    "in.cos_sin": cos_sin_t.contiguous(),
                    "in.slot_mapping": slots_t.contiguous(),
                    "in.kv_cache": torch.from_numpy(cache_in).contiguous(),
                    "out.kv_cache": torch.from_numpy(cache_out.copy()).contiguous(),
                }
                path = os.path.join(args.out, name + ".safetensors")
                save_file(tensors, path, metadata=meta)
                size = os.path.getsize(path)

                written = int(((slots >= 0) & ((positions + 1) % cr == 0)).sum())
                changed = int((spec_ref.record_bytes(cache_in, layout)
                               != spec_ref.record_bytes(cache_out, layout)).any(1).sum())
                entry = {"path": path, "bytes": size, "records_expected": written,
                         "records_changed": changed}
                if not args.no_spec_check:
                    ref, _ = spec_ref.rope_quant_insert_ref(latent_u16, positions, cos_sin, slots, cache_in,
                                                           layout, cr, sanitize, fma=not args.spec_no_fma)
                    entry["spec_check"] = spec_ref.compare(ref, cache_out, slots, layout, inp.category_of)
                    any_mismatch |= entry["spec_check"]["bytes_differing"] > 0
                summary["files"][name] = entry
                sc = entry.get("spec_check")
                print(f"{name}: {size / 1e6:.2f} MB, records written {written}, changed {changed}"
                      + ("" if sc is None else
                         f", vs spec: {sc['records_differing']} records differ "
                         f"({sc['bytes_differing']} bytes) {sc['by_category']}"))
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"wrote {len(summary['files'])} files to {args.out} in {time.time() - t0:.1f} s; source: {source}")
    if any_mismatch:
        print("NOTE: the seed's bytes differ from spec_ref.py somewhere; see summary.json 'spec_check'")


if __name__ == "__main__":
    main()
