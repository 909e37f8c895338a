#!/usr/bin/env bash
# The project's test command: installs the kernel compilers (idempotent), then
# builds with the kernels required and runs every test, doc tests included.
# Usage: bash scripts/test.sh (from any cwd; PYTHON picks the python, default python3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-toolchains.sh
# A missing compiler or a kernel compile error fails the build instead of
# silently producing a library without device kernels.
export DSV4_KVCACHE_REQUIRE_KERNELS=1

cargo test --release --all-targets
cargo test --release --doc

# The Python package: a venv under .venv/ (gitignored) with the build tools
# (maturin, auditwheel, twine, pytest), then the release wheel, built once
# (abi3, manylinux_2_28, all kernels; checked by auditwheel and twine). torch
# goes only into the fresh venv that tests the wheel: the registry's wheel
# brings its CUDA libraries (about 5 GB installed, 3 GB downloaded, and it
# runs on the CPU), and a second copy plus pip's cache of it once filled CI's
# disk. GPU tests report SKIPPED without a GPU.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import maturin, pytest, auditwheel, twine" 2>/dev/null; then
    .venv/bin/python -m pip install -q --no-cache-dir --upgrade pip
    .venv/bin/python -m pip install -q --no-cache-dir maturin pytest auditwheel twine
fi
t0=$SECONDS
PYTHON=.venv/bin/python bash scripts/build-wheel.sh target/wheels
echo "test.sh: release wheel built and checked in $((SECONDS - t0)) s"
# .venv keeps the wheel too, for scripts and local runs against it.
.venv/bin/python -m pip install -q --force-reinstall --no-deps target/wheels/dsv4_kvcache-*.whl

# The suite runs against the wheel where nothing can compile: a fresh venv,
# PATH without cargo or any kernel compiler, the README's examples, then the
# pytest suite; twice, beside the oldest torch the `torch` extra allows (2.9.0,
# vLLM's pin) and beside the newest. One after the other: each venv (torch
# with its CUDA libraries, about 5 GB) is removed before the next is made.
for torch_spec in torch==2.9.0 torch; do
    t0=$SECONDS
    TORCH_SPEC=$torch_spec PYTHON="$PY" bash scripts/test-wheel.sh target/wheels/dsv4_kvcache-*.whl
    echo "test.sh: wheel tested beside $torch_spec in a fresh venv without compilers in $((SECONDS - t0)) s"
done

# The aarch64 wheel (GH200, GB200 hosts): cross-built (zig links it against
# glibc 2.28, the kernels compiled here as for x86_64), checked by auditwheel,
# twine and readelf, then by the checks of tests/ci_scripts.rs that read it,
# and run under qemu-user where qemu-aarch64 is installed (its extension
# imported by Debian's arm64 CPython, the aarch64 CLI replaying the seed
# vectors on the CPU); scripts/aarch64-qemu.sh says SKIPPED without qemu.
t0=$SECONDS
rm -rf target/wheels-aarch64
PYTHON=.venv/bin/python bash scripts/build-wheel.sh target/wheels-aarch64 aarch64
cargo test --release --test ci_scripts build_wheel_architectures -- --nocapture
bash scripts/aarch64-qemu.sh target/wheels-aarch64/dsv4_kvcache-*_aarch64.whl
echo "test.sh: aarch64 wheel built, checked and run under emulation in $((SECONDS - t0)) s"
