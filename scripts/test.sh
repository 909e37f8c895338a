#!/usr/bin/env bash
# The project's test command: installs the kernel compilers (idempotent), then
# builds with the kernels required and runs every test, doc tests included.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/install-toolchains.sh
# A missing compiler or a kernel compile error fails the build instead of
# silently producing a library without device kernels.
export DSV4_KVCACHE_REQUIRE_KERNELS=1

cargo test --release --all-targets
cargo test --release --doc
