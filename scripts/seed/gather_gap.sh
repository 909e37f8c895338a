#!/usr/bin/env bash
# Issue 30, item 3 on an NVIDIA GPU: where the package's few-row gather loses
# time against the Rust bench (scripts/seed/gather_gap.py), then the package
# against the Triton gather tuned over num_warps (gather_baseline.py).
#
#   bash scripts/seed/gather_gap.sh bundle DIR    # here: the bench binary and the package into DIR
#   bash scripts/seed/gather_gap.sh run DIR OUT   # there, from the repository root: logs into OUT
#
# bundle needs cargo, the kernel toolchains (scripts/install-toolchains.sh) and
# a python with maturin ($PYTHON, default .venv/bin/python); run needs python3
# with torch and triton, and a CUDA GPU. GATHER_GAP_ROUNDS sets the rounds (3).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

bundle() {
    local out="$1"
    cd "$root" || exit 2
    mkdir -p "$out" && out="$(cd "$out" && pwd)"
    export DSV4_KVCACHE_REQUIRE_KERNELS=1
    cargo build --release --bin dsv4-kvcache || exit 2
    local strip=(cp)
    command -v objcopy >/dev/null && strip=(objcopy --strip-debug)
    "${strip[@]}" "${CARGO_TARGET_DIR:-target}/release/dsv4-kvcache" "$out/dsv4-kvcache" || exit 2
    rm -rf "$out/wheel" "$out/site"
    "${PYTHON:-$root/.venv/bin/python}" -m maturin build --release --strip -m python/Cargo.toml -o "$out/wheel" || exit 2
    mkdir -p "$out/site"
    (cd "$out/site" && python3 -m zipfile -e "$out"/wheel/dsv4_kvcache-*.whl .) || exit 2
    rm -rf "$out/wheel"
    du -sh "$out"
    echo "gather_gap: bundle in $out"
}

run() {
    local dir out failed=0
    dir="$(cd "$1" && pwd)"
    mkdir -p "$2" && out="$(cd "$2" && pwd)"
    cd "$root" || exit 2
    export PYTHONPATH="$dir/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    local bin="$dir/dsv4-kvcache" t0=$SECONDS
    nvidia-smi -L 2>&1 | head -2
    python3 scripts/seed/gather_gap.py probe --bin "$bin" 2>&1 | tee "$out/gap_probe.txt" || failed=1
    python3 scripts/seed/gather_gap.py table --bin "$bin" --rounds "${GATHER_GAP_ROUNDS:-3}" \
        --json "$out/gap.json" 2>&1 | tee "$out/gap_table.txt" || failed=1
    GATHER_BASELINE_N=1,16,128,1024 python3 scripts/seed/gather_baseline.py written 2>&1 |
        tee "$out/gather_baseline.txt" || failed=1
    echo "gather_gap: run took $((SECONDS - t0)) s, $([ $failed = 0 ] && echo 'every step passed' || echo 'a step FAILED')"
    return $failed
}

case "${1:-}" in
bundle) bundle "${2:?usage: $0 bundle DIR}" ;;
run) run "${2:?usage: $0 run DIR OUT}" "${3:?usage: $0 run DIR OUT}" ;;
*)
    echo "usage: $0 bundle DIR | run DIR OUT" >&2
    exit 2
    ;;
esac
