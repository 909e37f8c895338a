#!/usr/bin/env bash
# Builds the release wheel of the Python package into OUTDIR: abi3 (CPython
# >= 3.9), manylinux_2_28 for x86_64 (the default) or aarch64 (cross-built:
# GH200 and GB200 hosts), linked by zig against glibc 2.28's symbols, with
# the CUDA (SASS for sm_90, sm_100, sm_103, sm_120 and compute_90 PTX, by
# CUDA 12.9) and HIP (gfx90a, gfx942, gfx950) kernels embedded and required
# (a missing compiler fails the build). The kernels are compiled on the build
# machine whatever the wheel's architecture, by the same compilers from the
# same source: the same images in both wheels. Then checks it: auditwheel
# must accept it as manylinux_2_28 for its architecture, no symbol may need a
# glibc newer than 2.28, twine check must pass, and the wheel must hold the
# LICENSE.
#
# Usage:
#   bash scripts/build-wheel.sh OUTDIR [x86_64|aarch64]
#
# Needs cargo (and for aarch64 the rustup target aarch64-unknown-linux-gnu,
# which it adds when rustup is there), the toolchains of
# scripts/install-toolchains.sh (the CUDA compilers, and the ziglang package
# that is both the HIP compiler and maturin's linker) and a python with
# maturin, auditwheel and twine ($PYTHON, default .venv/bin/python).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 OUTDIR [x86_64|aarch64]" >&2
    exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
ARCH=${2:-x86_64}
case "$ARCH" in
x86_64 | aarch64) ;;
*)
    echo "build-wheel: unknown architecture $ARCH (x86_64 or aarch64)" >&2
    exit 2
    ;;
esac
PY=${PYTHON:-$ROOT/.venv/bin/python}
POLICY=manylinux_2_28
TARGET=$ARCH-unknown-linux-gnu

bash scripts/install-toolchains.sh
"$PY" -c "import maturin, auditwheel, twine" 2>/dev/null ||
    "$PY" -m pip install -q maturin auditwheel twine
if [ "$ARCH" != "$(uname -m)" ] && command -v rustup >/dev/null; then
    rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET"
fi

# maturin --zig finds `zig` on PATH; the toolchains' ziglang package has it.
export PATH="$ROOT/.toolchains/py/ziglang:$PATH"
export DSV4_KVCACHE_REQUIRE_KERNELS=1
export DSV4_KVCACHE_CUDA_ARCHS=sm_90,sm_100,sm_103,sm_120
export DSV4_KVCACHE_CUDA_PTX=compute_90
export DSV4_KVCACHE_CUDA_TOOLKIT=12.9
export DSV4_KVCACHE_HIP_ARCHS=gfx90a,gfx942,gfx950

rm -f "$OUT"/dsv4_kvcache-*"$ARCH".whl
"$PY" -m maturin build --release --strip --zig --compatibility "$POLICY" --target "$TARGET" \
    -m python/Cargo.toml -o "$OUT"
shopt -s nullglob
wheels=("$OUT"/dsv4_kvcache-*"$ARCH".whl)
if [ ${#wheels[@]} -ne 1 ]; then
    echo "build-wheel: expected one $ARCH wheel in $OUT, found ${#wheels[@]}" >&2
    exit 1
fi
WHEEL=${wheels[0]}
case "$(basename "$WHEEL")" in
*-cp39-abi3-${POLICY}_$ARCH.whl) ;;
*)
    echo "build-wheel: unexpected wheel tags: $(basename "$WHEEL")" >&2
    exit 1
    ;;
esac

# auditwheel: the wheel is consistent with its manylinux_2_28 tag (external
# libraries, glibc symbol versions, instruction set).
show=$("$PY" -m auditwheel show "$WHEEL")
echo "$show"
if ! tr '\n' ' ' <<<"$show" | grep -q "consistent with the following platform tag: \"${POLICY}_$ARCH"; then
    echo "build-wheel: auditwheel does not accept $(basename "$WHEEL") as ${POLICY}_$ARCH" >&2
    exit 1
fi

"$PY" -m twine check --strict "$WHEEL"

# The extension's own view: its machine, and the newest glibc symbol version
# it needs (readelf reads any architecture's ELF).
"$PY" - "$WHEEL" "$ARCH" <<'PYEOF'
import re, subprocess, sys, tempfile, zipfile

wheel, arch = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z, tempfile.TemporaryDirectory() as d:
    names = z.namelist()
    if not any(n.endswith("licenses/LICENSE") or n.endswith("/LICENSE") for n in names):
        sys.exit(f"build-wheel: no LICENSE in {wheel}: {names}")
    so = [n for n in names if n.endswith(".so")]
    if len(so) != 1:
        sys.exit(f"build-wheel: expected one extension module, found {so}")
    path = z.extract(so[0], d)
    header = subprocess.run(["readelf", "-h", path], check=True, capture_output=True, text=True).stdout
    machine = {"x86_64": "Advanced Micro Devices X86-64", "aarch64": "AArch64"}[arch]
    if machine not in header:
        sys.exit(f"build-wheel: {so[0]} is not an {arch} object:\n{header}")
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", path], check=True, capture_output=True, text=True).stdout
    versions = {tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", syms)}
    newest = max(versions)
    print(f"build-wheel: {so[0]} ({arch}) needs glibc {'.'.join(map(str, newest))} at most")
    if newest > (2, 28):
        sys.exit("build-wheel: a symbol needs a glibc newer than 2.28")
PYEOF
echo "build-wheel: $WHEEL"
