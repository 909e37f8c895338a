#!/usr/bin/env bash
# Installs a release wheel (scripts/build-wheel.sh) into a fresh venv, with
# PATH scrubbed so that neither cargo nor any kernel compiler can be found,
# and runs against it the README's Python examples, dsv4_kvcache.info() and
# the Python test suite (GPU tests say SKIPPED without a GPU).
#
# Usage:
#   bash scripts/test-wheel.sh WHEEL [VENV]
#
# VENV defaults to a new temporary folder, removed afterwards. torch and
# pytest come from the registry, downloaded each time unless PIP_CACHE_DIR
# names a cache: torch's CUDA libraries are 3 GB more on a disk that CI shares.
# TORCH_SPEC picks the torch (default `torch`, the newest; scripts/test.sh also
# runs `torch==2.9.0`, the oldest the `torch` extra allows); an exact pin must
# be the version that imports.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 WHEEL [VENV]" >&2
    exit 2
fi
WHEEL=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
if [ $# -eq 2 ]; then
    VENV=$2
    rm -rf "$VENV"
else
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    VENV=$TMP/venv
fi
PY=${PYTHON:-python3}
"$PY" -m venv "$VENV"
VENV=$(cd "$VENV" && pwd)

# Only the venv and the system's basic tools; no ~/.cargo, no .toolchains.
CLEAN_PATH="$VENV/bin:/usr/local/bin:/usr/bin:/bin"
clean() {
    env -i HOME="$HOME" PATH="$CLEAN_PATH" LANG=C.UTF-8 \
        ${PIP_CACHE_DIR:+PIP_CACHE_DIR="$PIP_CACHE_DIR"} \
        DSV4_KVCACHE_REQUIRE_KERNELS=1 "$@"
}
for tool in cargo rustc nvcc hipcc hip-clang zig; do
    if found=$(clean bash -c "command -v $tool"); then
        echo "test-wheel: $tool is on the scrubbed PATH ($found); cannot test without compilers" >&2
        exit 1
    fi
done

# torch and its CUDA libraries take about 9 GB at their peak (download and
# install); the free space goes into the log, for when pip runs out of it.
df -h "$VENV" | awk 'NR == 2 { print "test-wheel: " $4 " free on " $6 " for the venv" }'
PIP_CACHE=--no-cache-dir
[ -n "${PIP_CACHE_DIR:-}" ] && PIP_CACHE=
TORCH_SPEC=${TORCH_SPEC:-torch}
clean python -m pip install -q --disable-pip-version-check $PIP_CACHE "$TORCH_SPEC" pytest
clean python -m pip install -q --disable-pip-version-check $PIP_CACHE "$WHEEL"
clean python - "$TORCH_SPEC" <<'EOF'
import sys
import torch

spec = sys.argv[1]
print(f"test-wheel: torch {torch.__version__} ({spec})")
if "==" in spec:
    want = spec.split("==", 1)[1]
    assert torch.__version__.split("+")[0] == want, f"torch {torch.__version__} imported, {spec} asked for"
EOF

# The wheel's info(): every kernel target embedded, built by CUDA 12.9.
clean python - <<'EOF'
import json
import dsv4_kvcache

info = dsv4_kvcache.info()
print(json.dumps(info, indent=1))
want = {"cuda": ["sm_90", "sm_100", "sm_103", "sm_120"], "hip": ["gfx90a", "gfx942", "gfx950"]}
assert info["kernels"] == want, f"kernels {info['kernels']}, expected {want}"
assert info["targets"]["cuda"]["ptx"] == ["compute_90"], info["targets"]
assert info["targets"]["cuda"]["toolkit"] == "12.9", info["targets"]
assert not info["missing"], info["missing"]
EOF

# Every ```python block of the README, each in its own interpreter.
"$PY" - "$ROOT/README.md" "$VENV/readme" <<'EOF'
import os, re, sys

text = open(sys.argv[1]).read()
blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
assert blocks, "no python block in the README"
os.makedirs(sys.argv[2], exist_ok=True)
for i, b in enumerate(blocks):
    with open(os.path.join(sys.argv[2], f"example_{i}.py"), "w") as f:
        f.write(b)
EOF
for ex in "$VENV"/readme/example_*.py; do
    echo "test-wheel: README example $(basename "$ex")"
    (cd "$VENV/readme" && clean python "$ex")
done

(cd "$ROOT/python/tests" && clean python -m pytest -q -rs -p no:cacheprovider .)
