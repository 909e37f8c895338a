#!/usr/bin/env bash
# Interleaved bench of several prebuilt builds on one GPU, for
# scripts/bench_builds.py:
#
# Usage:
#   bash scripts/bench_builds.sh OUT ROUNDS NAME=BINARY ... -- BENCH ARGS
#   python3 scripts/bench_builds.py OUT [--base NAME] [--fail-slower]
#
# Runs `BINARY bench BENCH ARGS --out OUT/b<round>-<NAME>.json` for every
# build in every round, the builds in the order given in odd rounds and
# reversed in even ones, so that neither the GPU's warm-up nor its clocks
# favour one build; each run's text output goes beside its JSON (.log).
# Example (docs/tuning.md's interleaved comparisons):
#
#   bash scripts/bench_builds.sh /tmp/ab 3 old=./old/dsv4-kvcache new=./dsv4-kvcache \
#       -- --backend cuda --only insert --tokens 16,1024,8192,65536
set -uo pipefail

usage() {
    sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

[ $# -ge 4 ] || usage
out="$1"
rounds="$2"
shift 2
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "bench_builds.sh: ROUNDS must be a positive integer, not '$rounds'" >&2; exit 2; }
names=()
bins=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case "$1" in
        *=*) ;;
        *) echo "bench_builds.sh: '$1' is not NAME=BINARY" >&2; exit 2 ;;
    esac
    name="${1%%=*}"
    bin="${1#*=}"
    [[ "$name" =~ ^[A-Za-z0-9_.]+$ ]] || { echo "bench_builds.sh: build name '$name': letters, digits, _ and . only" >&2; exit 2; }
    [ -x "$bin" ] || { echo "bench_builds.sh: $bin (build $name) is not an executable file" >&2; exit 2; }
    names+=("$name")
    bins+=("$bin")
    shift
done
[ $# -gt 0 ] || { echo "bench_builds.sh: no '--' before the bench arguments" >&2; exit 2; }
shift
[ ${#names[@]} -ge 1 ] || usage
mkdir -p "$out" || exit 2

status=0
for ((r = 1; r <= rounds; r++)); do
    order=$(seq 0 $((${#names[@]} - 1)))
    [ $((r % 2)) -eq 0 ] && order=$(seq $((${#names[@]} - 1)) -1 0)
    for i in $order; do
        base="$out/b$r-${names[$i]}"
        if ! "${bins[$i]}" bench "$@" --out "$base.json" >"$base.log" 2>&1; then
            echo "bench_builds.sh: round $r, build ${names[$i]} failed (see $base.log)" >&2
            status=1
        fi
        echo "round $r ${names[$i]}"
    done
done
exit $status
