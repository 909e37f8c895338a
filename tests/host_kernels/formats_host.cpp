// kv_f16_to_f32 (kv_formats.h) on every F16 code, compiled for the host for
// tests/compressor_host_kernels.rs: writes the 65,536 results' bits
// (little-endian u32, code order) to stdout.
#include "prelude_host.h"
#include "kv_formats.h"

#include <stdio.h>

unsigned kv_host_tid, kv_host_bid, kv_host_bdim, kv_host_gdim;

int main() {
    for (uint32_t h = 0; h < 65536u; ++h) {
        uint32_t bits = kv_f2u(kv_f16_to_f32((uint16_t)h));
        fwrite(&bits, 4, 1, stdout);
    }
    return 0;
}
