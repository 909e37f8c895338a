// Runs the gather kernels of kernels-hip/kv_gather.h on the host for
// tests/gather_host_kernels.rs, one work-item after the other (they never
// talk across lanes); the launch protocol is harness.h's.
#include "prelude_host.h"
#define KV_PRELUDE_INCLUDED 1
#include "kvcache.hip"

#include "harness.h"

unsigned kv_host_tid, kv_host_bid, kv_host_bdim, kv_host_gdim;
// The CR2 team kernels' dynamic shared memory (never run here).
float kv_team_shared[1];

int main() {
    KvHostLaunch<KvGatherParams> l;
    KvGatherParams& p = l.params;
    l.relocate(p.cache);
    l.relocate(p.slots);
    l.relocate(p.block_table);
    l.relocate(p.cu_seq_lens);
    l.relocate(p.seq_starts);
    l.relocate(p.fp8_scale);
    l.relocate(p.out);
    typedef void (*K)(const KvGatherParams);
#define KV_HOST_GATHER(name) {#name, name}, {#name "_slots", name##_slots}, {#name "_split", name##_split}
    const std::pair<const char*, K> kernels[] = {
        KV_HOST_GATHER(kv_gather_v4_bf16),    KV_HOST_GATHER(kv_gather_v4_f32),
        KV_HOST_GATHER(kv_gather_mxfp8_bf16), KV_HOST_GATHER(kv_gather_mxfp8_f32),
        KV_HOST_GATHER(kv_gather_nvfp4_bf16), KV_HOST_GATHER(kv_gather_nvfp4_f32),
        KV_HOST_GATHER(kv_gather_bf16_bf16),  KV_HOST_GATHER(kv_gather_bf16_f32),
        KV_HOST_GATHER(kv_gather_fp8_bf16),   KV_HOST_GATHER(kv_gather_fp8_f32),
    };
#undef KV_HOST_GATHER
    K k = l.find(kernels);
    kv_host_bdim = l.block;
    kv_host_gdim = l.grid;
    for (kv_host_bid = 0; kv_host_bid < l.grid; ++kv_host_bid)
        for (kv_host_tid = 0; kv_host_tid < l.block; ++kv_host_tid) k(p);
    l.write_results();
    return 0;
}
