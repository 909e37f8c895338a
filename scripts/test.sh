#!/usr/bin/env bash
# The project's test command: installs the kernel compilers (idempotent), then
# builds with the kernels required and runs every test, doc tests included.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-toolchains.sh
# A missing compiler or a kernel compile error fails the build instead of
# silently producing a library without device kernels.
export DSV4_KVCACHE_REQUIRE_KERNELS=1

cargo test --release --all-targets
cargo test --release --doc

# The Python package: a venv under .venv/ (gitignored) with maturin, pytest
# and the registry's torch wheel (on a CPU-only machine it still brings its
# CUDA libraries, several GB, and runs on the CPU), then the wheel built
# from python/ and its tests. GPU tests report SKIPPED without a GPU.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, maturin, pytest" 2>/dev/null; then
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q maturin pytest torch
fi
rm -rf target/wheels
.venv/bin/python -m maturin build --release -m python/Cargo.toml -o target/wheels
.venv/bin/python -m pip install -q --force-reinstall --no-deps target/wheels/dsv4_kvcache-*.whl
(cd python/tests && ../../.venv/bin/python -m pytest -q -rs .)
