#!/usr/bin/env bash
# The CUDA-side checks of a change, on any NVIDIA machine, from prebuilt
# binaries (the machine needs no Rust):
#
# Usage:
#   bash scripts/gpu-check.sh bundle DIR   # here: build and copy what the run needs into DIR
#   bash DIR/gpu-check.sh run DIR          # there: run every check, print PASS/FAIL lines
#
# The run: device parity in every kernel mapping (one process), the
# hardware conversions against their definitions on all 2^32 inputs, the same run
# under compute-sanitizer memcheck (fewer cases), graph capture and replay,
# the seed vectors (test and `verify`), the same-errors test, the reader's
# device parity (gather_device), `demo`, 8 threads sharing one backend on
# its stream, on one stream it made and each on a stream of its own
# (concurrency), `soak` for GPU_CHECK_SOAK_S seconds (default 60), and the
# host cost of one eager launch beside an older build's when DIR/old/ holds
# one (OLD_BIN names an older build's binary when bundling). Then the PTX the
# fatbin carries for GPUs without SASS of their own: the driver made to JIT it
# (CUDA_FORCE_PTX_JIT=1, an empty JIT cache), the first backend's creation
# timed against the SASS one's (the JIT cost of a first launch), and the
# device parity suite in every mapping on the JIT-compiled kernels.
# Without an NVIDIA GPU it prints SKIPPED with the reason and exits 0.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TESTS=(device_parity hardware_formats cuda_graph seed_vectors same_errors gather_device concurrency)

bundle() {
    local out="$1"
    cd "$here/.." || exit 2
    export DSV4_KVCACHE_REQUIRE_KERNELS=1
    cargo build --release --bin dsv4-kvcache || exit 2
    local list
    list="$(cargo test --release --no-run $(printf -- '--test %s ' "${TESTS[@]}") 2>&1)" || {
        echo "$list"
        exit 2
    }
    mkdir -p "$out/bin" "$out/vectors" "$out/old"
    local strip=(cp)
    command -v objcopy >/dev/null && strip=(objcopy --strip-debug)
    local tdir="${CARGO_TARGET_DIR:-target}"
    "${strip[@]}" "$tdir/release/dsv4-kvcache" "$out/bin/dsv4-kvcache"
    local t path
    for t in "${TESTS[@]}"; do
        path="$(printf '%s\n' "$list" | sed -n "s|.*Executable tests/$t\.rs (\(.*\))|\1|p" | tail -1)"
        [ -n "$path" ] && [ -x "$path" ] || { echo "gpu-check: no test binary for $t"; exit 2; }
        "${strip[@]}" "$path" "$out/bin/$t"
    done
    if [ -n "${OLD_BIN:-}" ]; then
        "${strip[@]}" "$OLD_BIN" "$out/old/dsv4-kvcache"
    fi
    cp tests/vectors/seed_*.safetensors tests/vectors/gather_*.safetensors "$out/vectors/"
    cp "$here/gpu-check.sh" "$out/"
    echo "gpu-check: bundle in $out"
}

passes=0
failures=()
step() {
    # step NAME COMMAND...: runs COMMAND, logs to $work/NAME.log, PASS/FAIL by exit status.
    local name="$1"
    shift
    local t0=$SECONDS
    "$@" >"$work/$name.log" 2>&1
    local rc=$?
    local dur=$((SECONDS - t0))
    grep -E "PARITY|SKIPPED|mismatch|ERROR SUMMARY|test result|PASS|FAIL" "$work/$name.log" | head -20 | sed 's/^/    /'
    if [ $rc -eq 0 ]; then
        passes=$((passes + 1))
        echo "PASS  [${dur}s] $name"
    else
        failures+=("$name")
        echo "FAIL  [${dur}s] $name (rc $rc)"
        tail -30 "$work/$name.log" | sed 's/^/    /'
    fi
}

run() {
    local dir
    dir="$(cd "$1" && pwd)"
    work="${GPU_CHECK_WORK:-$dir/work}"
    mkdir -p "$work"
    if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
        echo "SKIPPED: no NVIDIA GPU on this machine (nvidia-smi finds none); gpu-check needs one"
        exit 0
    fi
    nvidia-smi -L
    export DSV4_KVCACHE_REQUIRE_GPU=cuda
    local bin="$dir/bin"
    step device_parity "$bin/device_parity" --nocapture
    step hardware_formats "$bin/hardware_formats" --nocapture
    step cuda_graph "$bin/cuda_graph" --nocapture
    step seed_vectors "$bin/seed_vectors" --nocapture
    step same_errors "$bin/same_errors" --nocapture
    step gather_device "$bin/gather_device" --nocapture
    step verify "$bin/dsv4-kvcache" verify --backend cuda "$dir"/vectors/seed_*.safetensors "$dir"/vectors/gather_*.safetensors
    step demo "$bin/dsv4-kvcache" demo --backend cuda
    step concurrency "$bin/concurrency" --nocapture
    step soak "$bin/dsv4-kvcache" soak --backend cuda --duration "${GPU_CHECK_SOAK_S:-60}"
    grep -E "^(soak summary|memory)" "$work/soak.log" | sed 's/^/    /'
    local cs
    cs="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
    if [ -n "$cs" ]; then
        step memcheck env DSV4_KVCACHE_PARITY_CASES="${GPU_CHECK_MEMCHECK_CASES:-1}" \
            "$cs" --tool memcheck --leak-check full --error-exitcode 1 "$bin/device_parity" --nocapture
        step memcheck_gather "$cs" --tool memcheck --leak-check full --error-exitcode 1 \
            "$bin/gather_device" --nocapture
    else
        echo "SKIPPED: memcheck (no compute-sanitizer on this machine)"
    fi
    if [ -x "$dir/old/dsv4-kvcache" ]; then
        # Host cost, the old build and this one interleaved, three rounds each.
        local r
        for r in 1 2 3; do
            step "host_old_$r" "$dir/old/dsv4-kvcache" bench --backend cuda --only host
            grep -E "^ *(insert|compress|save|fused|host)" "$work/host_old_$r.log" | sed 's/^/    old: /'
            step "host_new_$r" "$bin/dsv4-kvcache" bench --backend cuda --only host
            grep -E "^ *(insert|compress|save|fused|host)" "$work/host_new_$r.log" | sed 's/^/    new: /'
        done
    fi
    # The compute_90 PTX, JIT-compiled: what every GPU without SASS here runs.
    local jit="$work/jit-cache"
    rm -rf "$jit"
    step info_sass env -u CUDA_FORCE_PTX_JIT "$bin/dsv4-kvcache" info
    grep -E "CUDA|driver" "$work/info_sass.log" | sed 's/^/    /'
    local t0 t1
    t0=$(date +%s.%N)
    step info_ptx_first env CUDA_FORCE_PTX_JIT=1 CUDA_CACHE_PATH="$jit" "$bin/dsv4-kvcache" info
    t1=$(date +%s.%N)
    grep -E "cuda:" "$work/info_ptx_first.log" | sed 's/^/    /'
    grep -q "PTX, JIT-compiled by the driver (CUDA_FORCE_PTX_JIT=1)" "$work/info_ptx_first.log" ||
        { failures+=("info_ptx_first: the backend does not report the JIT-compiled PTX"); }
    step info_ptx_cached env CUDA_FORCE_PTX_JIT=1 CUDA_CACHE_PATH="$jit" "$bin/dsv4-kvcache" info
    echo "    first info with the PTX JIT-compiled (empty cache): $(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }") s (info_sass and info_ptx_cached above: the same run without the JIT)"
    step device_parity_ptx env CUDA_FORCE_PTX_JIT=1 CUDA_CACHE_PATH="$jit" "$bin/device_parity" --nocapture
    step seed_vectors_ptx env CUDA_FORCE_PTX_JIT=1 CUDA_CACHE_PATH="$jit" "$bin/seed_vectors" --nocapture
    echo
    echo "gpu-check: $passes passed, ${#failures[@]} failed"
    [ ${#failures[@]} -eq 0 ] || { printf 'FAILED: %s\n' "${failures[@]}"; exit 1; }
}

case "${1:-}" in
bundle) bundle "${2:?bundle DIR}" ;;
run) run "${2:-$here}" ;;
*)
    echo "usage: gpu-check.sh bundle DIR | run DIR" >&2
    exit 2
    ;;
esac
