# Sourced by scripts/rocm-build-ci.sh and scripts/rocm-ci.sh: the ROCm paths,
# the HIP-only build settings, and the checks that cargo and hipcc exist.
# $1 names the calling script in messages.
# Usage (not run by itself): source "$(dirname "$0")/rocm-env.sh" NAME

export ROCM_PATH="${ROCM_PATH:-/opt/rocm}"
export HIPCC="${HIPCC:-$ROCM_PATH/bin/hipcc}"
export PATH="$ROCM_PATH/bin:$PATH"
# The CUDA fatbin is not built here (no nvcc); a HIP compiler that is found
# but fails to compile is an error whatever this says (build.rs).
export DSV4_KVCACHE_REQUIRE_KERNELS=0
export DSV4_KVCACHE_HIP_ARCHS="${DSV4_KVCACHE_HIP_ARCHS:-gfx90a,gfx942,gfx950}"

command -v cargo >/dev/null || { echo "$1: cargo not found (install rustup first)"; exit 2; }
test -x "$HIPCC" || { echo "$1: hipcc not found at $HIPCC"; exit 2; }
