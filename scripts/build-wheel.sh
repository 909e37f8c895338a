#!/usr/bin/env bash
# Builds the release wheel of the Python package into OUTDIR: abi3 (CPython
# >= 3.9), manylinux_2_28 x86_64, linked by zig against glibc 2.28's symbols,
# with the CUDA (sm_90, sm_100) and HIP (gfx942, gfx950) kernels embedded and
# required (a missing compiler fails the build). Then checks it: auditwheel
# must accept it as manylinux_2_28, no symbol may need a glibc newer than
# 2.28, twine check must pass, and the wheel must hold the LICENSE.
#
# Usage:
#   bash scripts/build-wheel.sh OUTDIR
#
# Needs cargo, the toolchains of scripts/install-toolchains.sh (nvcc, and the
# ziglang package that is both the HIP compiler and maturin's linker) and a
# python with maturin, auditwheel and twine ($PYTHON, default .venv/bin/python).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

if [ $# -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
POLICY=manylinux_2_28
TARGET=x86_64-unknown-linux-gnu

bash scripts/install-toolchains.sh
"$PY" -c "import maturin, auditwheel, twine" 2>/dev/null ||
    "$PY" -m pip install -q maturin auditwheel twine

# maturin --zig finds `zig` on PATH; the toolchains' ziglang package has it.
export PATH="$ROOT/.toolchains/py/ziglang:$PATH"
export DSV4_KVCACHE_REQUIRE_KERNELS=1
export DSV4_KVCACHE_CUDA_ARCHS=sm_90,sm_100
export DSV4_KVCACHE_HIP_ARCHS=gfx942,gfx950

rm -f "$OUT"/dsv4_kvcache-*.whl
"$PY" -m maturin build --release --strip --zig --compatibility "$POLICY" --target "$TARGET" \
    -m python/Cargo.toml -o "$OUT"
shopt -s nullglob
wheels=("$OUT"/dsv4_kvcache-*.whl)
if [ ${#wheels[@]} -ne 1 ]; then
    echo "build-wheel: expected one wheel in $OUT, found ${#wheels[@]}" >&2
    exit 1
fi
WHEEL=${wheels[0]}
case "$(basename "$WHEEL")" in
*-cp39-abi3-manylinux_2_28_x86_64.whl) ;;
*)
    echo "build-wheel: unexpected wheel tags: $(basename "$WHEEL")" >&2
    exit 1
    ;;
esac

# auditwheel: the wheel is consistent with its manylinux_2_28 tag (external
# libraries, glibc symbol versions, instruction set).
show=$("$PY" -m auditwheel show "$WHEEL")
echo "$show"
if ! tr '\n' ' ' <<<"$show" | grep -q "consistent with the following platform tag: \"$POLICY"; then
    echo "build-wheel: auditwheel does not accept $(basename "$WHEEL") as $POLICY" >&2
    exit 1
fi

"$PY" -m twine check --strict "$WHEEL"

# The extension's own view: the newest glibc symbol version it needs, and
# the kernel targets its data holds (the wheel must not lose any of them).
"$PY" - "$WHEEL" <<'EOF'
import re, subprocess, sys, tempfile, zipfile

wheel = sys.argv[1]
with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as d:
    names = z.namelist()
    if not any(n.endswith("licenses/LICENSE") or n.endswith("/LICENSE") for n in names):
        sys.exit(f"build-wheel: no LICENSE in {wheel}: {names}")
    so = [n for n in names if n.endswith(".so")]
    if len(so) != 1:
        sys.exit(f"build-wheel: expected one extension module, found {so}")
    path = z.extract(so[0], d)
    syms = subprocess.run(["objdump", "-T", path], check=True, capture_output=True, text=True).stdout
    versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", syms)}
    newest = max(versions)
    print(f"build-wheel: {so[0]} needs glibc {'.'.join(map(str, newest))} at most")
    if newest > (2, 28):
        sys.exit("build-wheel: a symbol needs a glibc newer than 2.28")
EOF
echo "build-wheel: $WHEEL"
