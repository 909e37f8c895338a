#!/usr/bin/env bash
# Runs the aarch64 build on this x86_64 machine under qemu-user: the
# aarch64 release wheel's extension module imported by Debian's arm64
# CPython (its info(); no torch there, so not the pytest suite), and the aarch64 `dsv4-kvcache` replaying the
# seed test vectors on its CPU reference, byte for byte (`verify --backend
# cpu`), and its `demo` on the CPU.
#
#   bash scripts/aarch64-qemu.sh WHEEL     # an aarch64 wheel of scripts/build-wheel.sh
#
# Needs apt-get and dpkg (Debian bookworm's arm64 libc and CPython, and its
# static qemu-aarch64 where the machine has no qemu-aarch64, are fetched
# into .toolchains/ without touching the system), and the rustup target
# aarch64-unknown-linux-gnu with the ziglang of scripts/install-toolchains.sh
# (zig links the CLI, as it links the wheel). Without any qemu-aarch64 it
# prints SKIPPED with the reason and exits 0.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

if [ $# -ne 1 ]; then
    echo "usage: $0 WHEEL" >&2
    exit 2
fi
WHEEL=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
case "$(basename "$WHEEL")" in
*_aarch64.whl) ;;
*) echo "aarch64-qemu: $WHEEL is not an aarch64 wheel" >&2; exit 2 ;;
esac
# qemu: the machine's, else Debian bookworm's static build fetched into
# .toolchains/qemu (a CI machine has none); without apt-get, SKIPPED.
QEMU=$(command -v qemu-aarch64 || command -v qemu-aarch64-static || true)
QEMU_PIN=qemu-user-static=1:7.2+dfsg-7+deb12u18+b3
QDIR="$ROOT/.toolchains/qemu"
if [ -z "$QEMU" ] && [ -x "$QDIR/usr/bin/qemu-aarch64-static" ] && [ "$(cat "$QDIR/stamp" 2>/dev/null)" = "$QEMU_PIN" ]; then
    QEMU="$QDIR/usr/bin/qemu-aarch64-static"
fi
if [ -z "$QEMU" ] && command -v apt-get >/dev/null && command -v dpkg >/dev/null; then
    rm -rf "$QDIR"
    mkdir -p "$QDIR/apt/lists/partial" "$QDIR/apt/cache/archives/partial" "$QDIR/debs"
    echo "deb [arch=amd64] http://deb.debian.org/debian bookworm main" >"$QDIR/apt/sources.list"
    echo "deb [arch=amd64] http://deb.debian.org/debian-security bookworm-security main" >>"$QDIR/apt/sources.list"
    QAPT=(
        -o "Dir::Etc::SourceList=$QDIR/apt/sources.list"
        -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$QDIR/apt/lists"
        -o "Dir::Cache=$QDIR/apt/cache"
        -o Dir::State::status=/dev/null
        -o Debug::NoLocking=1
        -o APT::Sandbox::User=root
    )
    if apt-get "${QAPT[@]}" -q update >/dev/null && (cd "$QDIR/debs" && apt-get "${QAPT[@]}" -q download "$QEMU_PIN" >/dev/null); then
        dpkg -x "$QDIR"/debs/*.deb "$QDIR"
        echo "$QEMU_PIN" >"$QDIR/stamp"
        QEMU="$QDIR/usr/bin/qemu-aarch64-static"
    fi
    rm -rf "$QDIR/debs" "$QDIR/apt"
fi
if [ -z "$QEMU" ] || [ ! -x "$QEMU" ]; then
    echo "SKIPPED: aarch64-qemu: no qemu-aarch64 (apt-get install qemu-user) and none could be fetched"
    exit 0
fi
echo "aarch64-qemu: $QEMU"

# Debian bookworm's arm64 libc and CPython, exact versions, in a private apt.
SYS="$ROOT/.toolchains/arm64"
PINS=(
    libc6:arm64=2.36-9+deb12u14
    libgcc-s1:arm64=12.2.0-14+deb12u1
    python3.11-minimal:arm64=3.11.2-6+deb12u8
    libpython3.11-minimal:arm64=3.11.2-6+deb12u8
    libpython3.11-stdlib:arm64=3.11.2-6+deb12u8
    zlib1g:arm64=1:1.2.13.dfsg-1
    libexpat1:arm64=2.5.0-1+deb12u2
    libffi8:arm64=3.4.4-1
)
want="bookworm ${PINS[*]}"
if [[ ! -f "$SYS/stamp" || "$(cat "$SYS/stamp")" != "$want" ]]; then
    rm -rf "$SYS"
    APTD="$SYS/apt"
    mkdir -p "$APTD/lists/partial" "$APTD/cache/archives/partial" "$SYS/debs"
    echo "deb [arch=arm64] http://deb.debian.org/debian bookworm main" >"$APTD/sources.list"
    APT=(
        -o "Dir::Etc::SourceList=$APTD/sources.list"
        -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$APTD/lists"
        -o "Dir::Cache=$APTD/cache"
        -o Dir::State::status=/dev/null
        -o Debug::NoLocking=1
        -o APT::Sandbox::User=root
        -o APT::Architecture=arm64
        -o APT::Architectures::=arm64
    )
    apt-get "${APT[@]}" -q update >/dev/null
    (cd "$SYS/debs" && apt-get "${APT[@]}" -q download "${PINS[@]}" >/dev/null)
    for deb in "$SYS"/debs/*.deb; do
        dpkg -x "$deb" "$SYS/sysroot"
    done
    rm -rf "$SYS/debs" "$APTD"
    echo "$want" >"$SYS/stamp"
fi
S="$SYS/sysroot"
run() { "$QEMU" -L "$S" "$@"; }

# The wheel, unpacked as pip would install it.
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$WHEEL" "$WORK/site"
# The package's __init__ imports torch (its operators), which this CPython
# lacks: the extension module is imported under its own name, with a bare
# package around it.
run "$S/usr/bin/python3.11" -c "
import importlib, json, platform, sys, types
pkg = types.ModuleType('dsv4_kvcache')
pkg.__path__ = ['$WORK/site/dsv4_kvcache']
sys.modules['dsv4_kvcache'] = pkg
native = importlib.import_module('dsv4_kvcache._native')
i = native.info()
print(platform.machine(), json.dumps(i['kernels']), json.dumps(i['targets']['cuda']['min_driver']))
assert platform.machine() == 'aarch64'
assert i['backends'] == ['cpu'], i['backends']
assert not i['missing'], i['missing']
print('aarch64-qemu: the wheel imports and runs under', sys.version.split()[0], 'on', platform.machine())
"

# The CLI for aarch64, linked by zig against glibc 2.28 as the wheel is.
LINK="$ROOT/.toolchains/bin/zig-cc-aarch64"
printf '%s\n' '#!/usr/bin/env bash' "# Generated by scripts/aarch64-qemu.sh: zig's cc as the aarch64 linker." \
    "exec python3 -m ziglang cc -target aarch64-linux-gnu.2.28 \"\$@\"" >"$LINK"
chmod +x "$LINK"
# The kernel settings of scripts/build-wheel.sh, so that the kernels the
# wheel's build compiled for this target are reused.
export DSV4_KVCACHE_REQUIRE_KERNELS=1
export DSV4_KVCACHE_CUDA_ARCHS=sm_90,sm_100,sm_103,sm_120
export DSV4_KVCACHE_CUDA_PTX=compute_90
export DSV4_KVCACHE_CUDA_TOOLKIT=12.9
export DSV4_KVCACHE_HIP_ARCHS=gfx90a,gfx942,gfx950
PYTHONPATH="$ROOT/.toolchains/py${PYTHONPATH:+:$PYTHONPATH}" \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER="$LINK" \
    cargo build --release --target aarch64-unknown-linux-gnu --bin dsv4-kvcache
BIN="${CARGO_TARGET_DIR:-target}/aarch64-unknown-linux-gnu/release/dsv4-kvcache"
run "$BIN" info
run "$BIN" verify --backend cpu tests/vectors/seed_*.safetensors
run "$BIN" demo --backend cpu --requests 2 --prefill-tokens 128 --decode-steps 4
echo "aarch64-qemu: PASS"
