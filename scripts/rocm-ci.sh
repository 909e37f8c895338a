#!/usr/bin/env bash
# ROCm CI: build with hipcc and the real ROCm headers, then run the device
# parity tests, the seed vectors and the benchmark on the AMD GPU of this
# machine. Meant for the public rocm/dev-ubuntu-24.04 container on a runner
# with an MI300 (gfx942) or MI350 (gfx950); see docs/backends.md. Not run by
# this project's own CI, which has no GPU.
# Usage: bash scripts/rocm-ci.sh (in the container, from any cwd)
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/rocm-env.sh rocm-ci
rocminfo | grep -m2 -E "gfx9[0-9a-f]+" || { echo "rocm-ci: no AMD GPU visible (rocminfo)"; exit 2; }

cargo build --release --all-targets --no-default-features --features hip
./target/release/dsv4-kvcache info
# A missing GPU is a failure here, not a skip.
export DSV4_KVCACHE_REQUIRE_GPU=1
# device_parity runs every case under each of the eight launch mappings
# (LaunchPolicy::MAPPINGS: measured heuristics, lone CR2 groups, pairs, lone
# groups by halves, screened teams, screened pairs, tile-major CR1 inserts,
# blocks of 8 groups) in one process; same_errors compares the HIP backend's
# errors with the CPU reference's.
cargo test --release --no-default-features --features hip --test hip_backend --test device_parity \
    --test code_objects --test seed_vectors --test same_errors -- --nocapture
./target/release/dsv4-kvcache verify tests/vectors/seed_*.safetensors --backend hip
./target/release/dsv4-kvcache demo --backend hip
./target/release/dsv4-kvcache bench --backend hip --out rocm-bench.json
# The H200 picked screened teams and pairs for large decode batches and
# mid-sized long chunks (LaunchPolicy::cr2_shape); on gfx942 a screened team
# block's 8.2 KB of LDS lets a CU hold at most seven of them. The CR2 rows
# once more unscreened, to check that choice on this GPU.
DSV4_KVCACHE_CR2_SCREEN=0 ./target/release/dsv4-kvcache bench --backend hip \
    --only "compress CR2,fused CR2" --out rocm-bench-cr2-unscreened.json
