#!/usr/bin/env bash
# The HIP backend's host code on an NVIDIA GPU, through the test HIP runtime
# on CUDA (hip-on-cuda/, installed as libamdhip64.so on the loader's search
# path; the backend finds it as it would find ROCm's). See docs/backends.md.
#
# Usage:
#   scripts/hip-on-cuda.sh bundle DIR   build here (needs cargo): the runtime,
#                                       the test binaries, the CLI, the seed
#                                       vectors and this script, into DIR
#   scripts/hip-on-cuda.sh run DIR      run the checks from DIR (no Rust needed)
#   scripts/hip-on-cuda.sh              both, with DIR = target/hip-on-cuda
#
# The build step is `cargo build --release -p hip-on-cuda` plus
# `cargo test --release --no-run --test device_parity --test hip_backend
# --test hip_on_cuda` (which prints the test binaries' paths) and
# `cargo build --release --bin dsv4-kvcache`; DIR can be copied to any
# x86-64 Linux machine with an NVIDIA GPU (sm_90 or a later one the fatbin
# has) and its driver.
#
# What runs: for a reported MI300X (gfx942), MI355X (gfx950) and MI210 (gfx90a): `info`, the
# HIP backend tests (parity with the reference, graph replay vs eager, event
# timing), the in-process fault/leak/sanitize test (a failed launch or wait
# names the cache rows it may have written), the device parity suite
# through HipBackend in all eight kernel mappings (one process; one case per
# kind and value mix on MI355X and MI210), `verify` of the seed vectors and `demo --backend hip`,
# 8 threads sharing one backend on its stream, on one stream it made and each
# on a stream of its own (concurrency), `soak` with device memory sampled;
# then every injected fault through the CLI (an error naming what failed, no
# panic, nothing left allocated), an MI100 (gfx908, no code object: the
# error names it and the embedded targets), and the parity suite under
# compute-sanitizer memcheck; a copy of the runtime loaded from an unusual
# path first (the backend must use it, not the one on the search path), and a
# runtime reporting two devices (calls on one keep the caller's current
# device). Where there is no NVIDIA GPU it prints SKIPPED
# with the reason and exits 0.
#
# Environment: HIPCUDA_PARITY_CASES (cases per kind and value mix for the
# parity runs; default the suite's own, 8), HIPCUDA_MEMCHECK_CASES (default
# 1), HIPCUDA_QUICK=1 (one parity case per kind and value mix on each device),
# HIPCUDA_WORK (the folder for logs; default a new temporary one),
# HIPCUDA_SOAK_S (seconds of `soak --backend hip` per device; default 30).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

bundle() {
    local out="$1"
    cd "$here/.." || exit 2
    command -v cargo >/dev/null || { echo "hip-on-cuda: cargo not found (the bundle step builds with it)"; exit 2; }
    cargo build --release -p hip-on-cuda || exit 2
    cargo build --release --bin dsv4-kvcache || exit 2
    local list
    list="$(cargo test --release --no-run --test device_parity --test hip_backend --test hip_on_cuda --test concurrency 2>&1)" || {
        echo "$list"
        exit 2
    }
    mkdir -p "$out/bin" "$out/vectors"
    # Debug info stripped: the bundle travels.
    local strip=(cp)
    command -v objcopy >/dev/null && strip=(objcopy --strip-debug)
    local tdir="${CARGO_TARGET_DIR:-target}"
    "${strip[@]}" "$tdir/release/libhip_on_cuda.so" "$out/libamdhip64.so"
    "${strip[@]}" "$tdir/release/dsv4-kvcache" "$out/bin/dsv4-kvcache"
    local t path
    for t in device_parity hip_backend hip_on_cuda concurrency; do
        # "Executable tests/NAME.rs (target/release/deps/NAME-HASH)"
        path="$(printf '%s\n' "$list" | sed -n "s|.*Executable tests/$t\.rs (\(.*\))|\1|p" | tail -1)"
        [ -n "$path" ] && [ -x "$path" ] || { echo "hip-on-cuda: no test binary for $t in:"; echo "$list"; exit 2; }
        "${strip[@]}" "$path" "$out/bin/$t"
    done
    cp tests/vectors/seed_*.safetensors "$out/vectors/"
    cp "$here/hip-on-cuda.sh" "$out/"
    echo "hip-on-cuda: bundle in $out"
}

# ---- run ----------------------------------------------------------------------

failures=()
passes=0
pass() {
    passes=$((passes + 1))
    echo "PASS  [${dur}s] $*"
}
fail() {
    failures+=("$*")
    echo "FAIL  [${dur}s] $*"
}

# Runs "$@" with output to $log; sets $rc.
logrun() {
    log="$work/log.$((++nlog))"
    echo "+ $*" >"$log"
    local t0=$SECONDS
    "$@" >>"$log" 2>&1
    rc=$?
    dur=$((SECONDS - t0))
}

show_tail() { tail -n "${2:-25}" "$1" | sed 's/^/      /'; }

# The runtime's counters at each process exit (HIPCUDA_REPORT) balance.
counters_balanced() {
    local f="$1" line bad=0
    [ -s "$f" ] || { echo "      no counters were reported"; return 1; }
    while read -r line; do
        for pair in allocs:frees modules_loaded:modules_unloaded graphs_created:graphs_destroyed \
            execs_created:execs_destroyed streams_created:streams_destroyed events_created:events_destroyed; do
            local a="${pair%%:*}" b="${pair##*:}" va vb
            va="$(sed -n "s/.* $a=\([0-9]*\).*/\1/p" <<<" $line")"
            vb="$(sed -n "s/.* $b=\([0-9]*\).*/\1/p" <<<" $line")"
            if [ "$va" != "$vb" ]; then
                echo "      $a=$va but $b=$vb: $line"
                bad=1
            fi
        done
        grep -q " bad_frees=0 " <<<"$line " || { echo "      $line"; bad=1; }
    done <"$f"
    return $bad
}

run() {
    local dir
    dir="$(cd "$1" && pwd)" || exit 2
    local bin="$dir/bin"
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "SKIPPED: hip-on-cuda: no NVIDIA GPU (nvidia-smi not found)"
        exit 0
    fi
    local gpus
    gpus="$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>&1)"
    if [ $? -ne 0 ] || [ -z "$gpus" ]; then
        echo "SKIPPED: hip-on-cuda: no NVIDIA GPU (nvidia-smi: ${gpus:-no devices})"
        exit 0
    fi
    for f in libamdhip64.so bin/dsv4-kvcache bin/device_parity bin/hip_backend bin/hip_on_cuda bin/concurrency; do
        [ -e "$dir/$f" ] || { echo "hip-on-cuda: $dir/$f missing (make the bundle with: $0 bundle $dir)"; exit 2; }
    done
    echo "hip-on-cuda: $(head -1 <<<"$gpus"); runtime $dir/libamdhip64.so"

    # HIPCUDA_WORK: where the logs go (default a new temporary folder).
    work="${HIPCUDA_WORK:-$(mktemp -d)}"
    mkdir -p "$work"
    nlog=0
    dur=0
    # The runtime alone in a folder of its own, first on the search path.
    mkdir -p "$work/lib"
    cp "$dir/libamdhip64.so" "$work/lib/"
    export LD_LIBRARY_PATH="$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export HIPCUDA_REPORT="$work/counters"
    export HIPCUDA_REQUIRED=1
    export DSV4_KVCACHE_REQUIRE_GPU=1
    unset DSV4_KVCACHE_SANITIZE HIPCUDA_FAULT
    local parity_env=()
    [ -n "${HIPCUDA_PARITY_CASES:-}" ] && parity_env=("DSV4_KVCACHE_PARITY_CASES=$HIPCUDA_PARITY_CASES")
    cd "$work" || exit 2

    local dev arch sanitize
    for dev in mi300x mi355x mi210; do
        export HIPCUDA_DEVICE=$dev
        case $dev in
            mi300x) arch="gfx942:sramecc+:xnack-" sanitize=off ;;
            mi355x) arch="gfx950:sramecc+:xnack-" sanitize=on ;;
            mi210) arch="gfx90a:sramecc+:xnack-" sanitize=off ;;
        esac
        : >"$HIPCUDA_REPORT"

        logrun "$bin/dsv4-kvcache" info
        if [ $rc -eq 0 ] && grep -q "hip:0 .*$arch.*code object ${arch%%:*}, sanitize $sanitize" "$log"; then
            pass "$dev info: $(grep -o "hip:0 .*" "$log" | head -1)"
        else
            fail "$dev info (expected $arch, sanitize $sanitize by default)"
            show_tail "$log"
        fi

        logrun "$bin/hip_backend" --nocapture --test-threads 1
        if [ $rc -eq 0 ] && ! grep -q SKIPPED "$log" && grep -q "running on hip:0" "$log"; then
            pass "$dev hip_backend: parity both sanitize settings, graph replay = eager, event timing"
        else
            fail "$dev hip_backend (rc $rc)"
            show_tail "$log"
        fi

        logrun "$bin/hip_on_cuda" --nocapture --skip preloaded_copy_is_used --skip second_device_leaves_the_callers_current
        if [ $rc -eq 0 ] && ! grep -q SKIPPED "$log"; then
            pass "$dev hip_on_cuda: device reports, sanitize switch, faults in process, no leaks"
        else
            fail "$dev hip_on_cuda (rc $rc)"
            show_tail "$log" 40
        fi

        # One run covers the eight kernel mappings (LaunchPolicy::MAPPINGS):
        # device_parity prints a PARITY line for each.
        local quick=()
        if [ "$dev" != mi300x ] || [ "${HIPCUDA_QUICK:-0}" = 1 ]; then
            [ -z "${HIPCUDA_PARITY_CASES:-}" ] && quick=("DSV4_KVCACHE_PARITY_CASES=1")
        fi
        logrun env "${parity_env[@]}" "${quick[@]}" "$bin/device_parity" hip_matches_reference --exact --nocapture
        local lines
        lines="$(grep -o "PARITY hip:.*" "$log")"
        if [ $rc -eq 0 ] && [ "$(grep -c ", 0 mismatching cases" <<<"$lines")" -eq 8 ]; then
            while IFS= read -r line; do
                pass "$dev parity: ${line#PARITY }"
            done <<<"$lines"
        else
            fail "$dev parity, eight mappings (rc $rc)"
            show_tail "$log"
        fi

        logrun "$bin/dsv4-kvcache" verify "$dir"/vectors/seed_*.safetensors --backend hip
        if [ $rc -eq 0 ]; then
            pass "$dev verify: $(tail -1 "$log")"
        else
            fail "$dev verify (rc $rc)"
            show_tail "$log"
        fi

        logrun "$bin/dsv4-kvcache" demo --backend hip
        if [ $rc -eq 0 ]; then
            pass "$dev demo --backend hip: $(tail -1 "$log")"
        else
            fail "$dev demo --backend hip (rc $rc)"
            show_tail "$log"
        fi

        logrun "$bin/concurrency" hip_ --nocapture
        if [ $rc -eq 0 ] && ! grep -q SKIPPED "$log" && [ "$(grep -c "hip, .*identical to the sequential run" "$log")" -eq 3 ]; then
            while IFS= read -r line; do
                pass "$dev concurrency: $(cut -c1-160 <<<"$line")"
            done <<<"$(grep -o "hip, .*identical to the sequential run" "$log")"
        else
            fail "$dev concurrency (rc $rc)"
            show_tail "$log"
        fi

        logrun "$bin/dsv4-kvcache" soak --backend hip --duration "${HIPCUDA_SOAK_S:-30}"
        if [ $rc -eq 0 ] && grep -q "^PASS" "$log"; then
            pass "$dev soak: $(grep -m1 "^soak summary" "$log" | cut -c15-200)"
            grep "^memory" "$log" | sed 's/^/      /'
        else
            fail "$dev soak --backend hip (rc $rc)"
            show_tail "$log"
        fi

        if counters_balanced "$HIPCUDA_REPORT"; then
            pass "$dev: every process released what it allocated ($(wc -l <"$HIPCUDA_REPORT") processes counted)"
        else
            fail "$dev: allocations, modules, graphs, streams or events left at exit"
        fi
    done

    # A runtime already in the process (as ROCm torch loads its own from
    # torch/lib): a copy under an unusual name and folder, loaded first; the
    # copy on the search path must stay unmapped.
    export HIPCUDA_DEVICE=mi300x
    mkdir -p "$work/unusual/site-packages/torch/lib"
    cp "$dir/libamdhip64.so" "$work/unusual/site-packages/torch/lib/libamdhip64.so.6.4.99"
    : >"$HIPCUDA_REPORT"
    logrun env HIPCUDA_PRELOAD="$work/unusual/site-packages/torch/lib/libamdhip64.so.6.4.99" \
        "$bin/hip_on_cuda" preloaded_copy_is_used --exact --nocapture
    if [ $rc -eq 0 ] && ! grep -q SKIPPED "$log" && grep -q "runtime used: .*unusual.*already loaded" "$log"; then
        pass "preloaded runtime: $(grep -m1 -o "runtime used: .*" "$log" | cut -c1-160)"
    else
        fail "preloaded runtime used, the search path's copy not loaded (rc $rc)"
        show_tail "$log"
    fi
    # Two devices reported (both on this GPU): calls on one keep the caller's current device.
    logrun env HIPCUDA_DEVICE_COUNT=2 "$bin/hip_on_cuda" second_device_leaves_the_callers_current --exact --nocapture
    if [ $rc -eq 0 ] && ! grep -q SKIPPED "$log" && grep -q "two devices: calls on each left" "$log"; then
        pass "two devices: calls on device 1 leave device 0 current, and the reverse"
    else
        fail "two devices, the caller's current device restored (rc $rc)"
        show_tail "$log"
    fi

    # Faults through the CLI: an error naming the call (or the property) that
    # failed, the CLI's error exit (2, not a panic's 101), nothing left.
    export HIPCUDA_DEVICE=mi300x
    local spec want
    for spec in "alloc:hipMalloc" "alloc@3:hipMalloc" "module-load:hipModuleLoadData" \
        "missing-kernel@2:hipModuleGetFunction" "launch:hipModuleLaunchKernel" "sync@3:hipStreamSynchronize" \
        "arch:gcnArchName"; do
        want="${spec#*:}"
        : >"$HIPCUDA_REPORT"
        logrun env HIPCUDA_FAULT="${spec%%:*}" "$bin/dsv4-kvcache" demo --backend hip
        if [ $rc -eq 2 ] && grep -q "$want" "$log" && ! grep -q "panicked" "$log" && counters_balanced "$HIPCUDA_REPORT"; then
            pass "fault ${spec%%:*}: $(grep -m1 "$want" "$log" | cut -c1-160)"
        else
            fail "fault ${spec%%:*}: expected exit 2 and an error naming $want, no panic, nothing left (rc $rc)"
            show_tail "$log"
        fi
    done
    export HIPCUDA_DEVICE=mi100
    logrun "$bin/dsv4-kvcache" demo --backend hip
    if [ $rc -eq 2 ] && grep -q "gfx908" "$log" && grep -q "gfx90a, gfx942, gfx950" "$log" && ! grep -q panicked "$log"; then
        pass "unsupported architecture (MI100): $(grep -m1 gfx908 "$log" | cut -c1-160)"
    else
        fail "unsupported architecture (MI100) (rc $rc)"
        show_tail "$log"
    fi
    export HIPCUDA_DEVICE=mi300x

    # compute-sanitizer memcheck over the parity suite through HipBackend.
    local cs
    cs="$(command -v compute-sanitizer || true)"
    [ -z "$cs" ] && for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
        [ -x "$c" ] && cs="$c" && break
    done
    if [ -z "$cs" ]; then
        echo "SKIPPED memcheck: compute-sanitizer not found (install the CUDA toolkit's compute-sanitizer or put it on PATH)"
    else
        logrun env DSV4_KVCACHE_PARITY_CASES="${HIPCUDA_MEMCHECK_CASES:-1}" "$cs" --tool memcheck --leak-check full \
            --error-exitcode 3 "$bin/device_parity" hip_matches_reference --exact --nocapture
        if [ $rc -eq 0 ] && grep -q "ERROR SUMMARY: 0 errors" "$log" && grep -q ", 0 mismatching cases" "$log"; then
            pass "memcheck parity: $(grep -o "[0-9]* cases, [0-9]* output bytes compared, 0 mismatching cases" "$log" | head -1); $(grep -m1 -o "ERROR SUMMARY.*" "$log")"
        else
            fail "memcheck parity (rc $rc)"
            show_tail "$log"
        fi
    fi

    echo
    echo "hip-on-cuda: $passes passed, ${#failures[@]} failed (logs in $work)"
    for f in "${failures[@]}"; do
        echo "  FAILED: $f"
    done
    [ ${#failures[@]} -eq 0 ]
}

case "${1:-}" in
    bundle)
        [ -n "${2:-}" ] || { echo "usage: $0 bundle DIR"; exit 2; }
        bundle "$2"
        ;;
    run)
        [ -n "${2:-}" ] || { echo "usage: $0 run DIR"; exit 2; }
        run "$2"
        ;;
    "")
        out="${CARGO_TARGET_DIR:-$here/../target}/hip-on-cuda"
        if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
            bundle "$out" && run "$out"
        else
            echo "SKIPPED: hip-on-cuda: no NVIDIA GPU (nvidia-smi not found or sees no device)"
        fi
        ;;
    *)
        echo "usage: $0 [bundle DIR | run DIR]"
        exit 2
        ;;
esac
