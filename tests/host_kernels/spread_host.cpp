// kv_spread_item (kv_compress.h) compiled for the host, for
// tests/compressor_host_kernels.rs: `spread_host GROUPS N NUM_REQS GRID`
// writes the item of every block 0..GRID of a spread launch of N tokens in
// NUM_REQS requests, in blocks of GROUPS groups (KV_CR2_PAIR, which the
// kernel runs, or KV_CR2_TEAM), as little-endian u32 in block order.
#include "prelude_host.h"
#define KV_PRELUDE_INCLUDED 1
#include "kvcache.hip"

#include <stdio.h>

unsigned kv_host_tid, kv_host_bid, kv_host_bdim, kv_host_gdim;
float kv_team_shared[1];

int main(int argc, char** argv) {
    if (argc != 5) return 2;
    const int groups = atoi(argv[1]);
    if (groups != KV_CR2_PAIR && groups != KV_CR2_TEAM) return 2;
    KvCompressParams c;
    memset(&c, 0, sizeof c);
    c.n = atoi(argv[2]);
    c.num_reqs = atoi(argv[3]);
    kv_host_gdim = (unsigned)strtoul(argv[4], 0, 10);
    for (unsigned i = 0; i < kv_host_gdim; ++i) {
        kv_host_bid = i;
        uint32_t item = groups == KV_CR2_PAIR ? kv_spread_item<KV_CR2_PAIR>(c) : kv_spread_item<KV_CR2_TEAM>(c);
        fwrite(&item, 4, 1, stdout);
    }
    return 0;
}
