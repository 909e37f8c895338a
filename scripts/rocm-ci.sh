#!/usr/bin/env bash
# ROCm CI: build with hipcc and the real ROCm headers, then run the device
# parity tests, the seed vectors and the benchmark on the AMD GPU of this
# machine. Meant for the public rocm/dev-ubuntu-24.04 container on a runner
# with an MI300 (gfx942) or MI350 (gfx950); see docs/backends.md. Not run by
# this project's own CI, which has no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

export ROCM_PATH="${ROCM_PATH:-/opt/rocm}"
export HIPCC="${HIPCC:-$ROCM_PATH/bin/hipcc}"
export PATH="$ROCM_PATH/bin:$PATH"
# Build the HIP code objects with hipcc (the real ROCm headers) and fail on
# any compile error; the CUDA fatbin is not needed here.
export DSV4_KVCACHE_REQUIRE_KERNELS=0
export DSV4_KVCACHE_HIP_ARCHS="${DSV4_KVCACHE_HIP_ARCHS:-gfx942,gfx950}"

command -v cargo >/dev/null || { echo "rocm-ci: cargo not found (install rustup first)"; exit 2; }
test -x "$HIPCC" || { echo "rocm-ci: hipcc not found at $HIPCC"; exit 2; }
rocminfo | grep -m2 -E "gfx9[0-9a-f]+" || { echo "rocm-ci: no AMD GPU visible (rocminfo)"; exit 2; }

cargo build --release --all-targets --no-default-features --features hip
./target/release/dsv4-kvcache info
# A missing GPU is a failure here, not a skip.
export DSV4_KVCACHE_REQUIRE_GPU=1
cargo test --release --no-default-features --features hip --test hip_backend --test device_parity --test code_objects -- --nocapture
# The parity cases are decode-sized, so CR2 runs in teams and CR1 inserts a
# token per group above; once more with the one-group-per-item CR2 kernels,
# with the pair kernels, with the long-chunk kernels (lone groups pooling by
# halves), with the screened token blocks of large decode batches (teams
# and pairs), with the tile-major CR1 inserts, which larger launches use,
# and once with blocks of 8 groups (the tile-major mapping's other shape).
DSV4_KVCACHE_CR2_TEAMS=0 cargo test --release --no-default-features --features hip --test device_parity -- --nocapture
DSV4_KVCACHE_CR2_TEAMS=2 cargo test --release --no-default-features --features hip --test device_parity -- --nocapture
DSV4_KVCACHE_CR2_TEAMS=3 cargo test --release --no-default-features --features hip --test device_parity -- --nocapture
DSV4_KVCACHE_CR2_SCREEN=1 cargo test --release --no-default-features --features hip --test device_parity -- --nocapture
DSV4_KVCACHE_CR2_SCREEN=1 DSV4_KVCACHE_CR2_TEAMS=2 \
    cargo test --release --no-default-features --features hip --test device_parity -- --nocapture
DSV4_KVCACHE_INSERT_TILES=1 cargo test --release --no-default-features --features hip --test device_parity -- --nocapture
DSV4_KVCACHE_GROUPS_PER_BLOCK=8 DSV4_KVCACHE_INSERT_TILES=1 DSV4_KVCACHE_CR2_TEAMS=0 \
    cargo test --release --no-default-features --features hip --test device_parity -- --nocapture
./target/release/dsv4-kvcache verify tests/vectors/seed_*.safetensors --backend hip
./target/release/dsv4-kvcache demo --backend hip
./target/release/dsv4-kvcache bench --backend hip --out rocm-bench.json
# The H200 picked screened teams and pairs for large decode batches and
# mid-sized long chunks (kernel_abi::cr2_shape); on gfx942 a screened team
# block's 8.2 KB of LDS lets a CU hold at most seven of them. The CR2 rows
# once more unscreened, to check that choice on this GPU.
DSV4_KVCACHE_CR2_SCREEN=0 ./target/release/dsv4-kvcache bench --backend hip \
    --only "compress CR2,fused CR2" --out rocm-bench-cr2-unscreened.json
