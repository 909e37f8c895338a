#!/usr/bin/env bash
# ROCm build CI without a GPU: in the public rocm/dev-ubuntu-24.04 container
# on a hosted runner, build the HIP code objects with hipcc and the real ROCm
# headers (any HIP compile error fails the build), check that they were
# embedded, and run every test that needs no GPU, the binding checks against
# the installed headers included. The device tests print SKIPPED here;
# scripts/rocm-ci.sh runs them on an MI300/MI350 runner. See docs/backends.md.
# Usage: bash scripts/rocm-build-ci.sh (in the container, from any cwd)
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/rocm-env.sh rocm-build-ci
"$HIPCC" --version

cargo build --release --all-targets --no-default-features --features hip
# hipcc was found, so both code objects must be embedded, built by it.
./target/release/dsv4-kvcache info | tee rocm-build-info.txt
grep -q "HIP kernels: *${DSV4_KVCACHE_HIP_ARCHS//,/, } (built by .*hipcc" rocm-build-info.txt || {
    echo "rocm-build-ci: the HIP code objects were not built by $HIPCC"
    exit 1
}
# Every test that needs no GPU; the ROCm headers must be found by the
# binding checks (tests/hip_bindings.rs compiles a probe against them).
export DSV4_KVCACHE_REQUIRE_ROCM_HEADERS=1
export CXX="${CXX:-$(command -v c++ || echo "$ROCM_PATH/llvm/bin/clang++")}"
cargo test --release --no-default-features --features hip -- --nocapture
# The test HIP runtime on CUDA builds too (its checks run on NVIDIA machines,
# scripts/hip-on-cuda.sh).
cargo build --release -p hip-on-cuda
