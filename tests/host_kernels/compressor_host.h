// Runs the one-group-per-item compress and fused kernels (the tuned ones and
// the generic `_wide` ones) on the host for tests/compressor_host_kernels.rs:
// a group's 32 lanes on threads of their own (the norm's butterfly, V4's and
// MXFP8's exchanges), group after group. The team kernels, whose groups meet
// at block barriers, are left to the device tests. compress_host.cpp and
// fused_host.cpp include this with KV_HOST_PARAMS set to their parameter
// block; the launch protocol is harness.h's.
#define KV_HOST_LANES 1
#include "prelude_host.h"
#define KV_PRELUDE_INCLUDED 1
#include "kvcache.hip"

#include "harness.h"
#include "lanes.h"

// The compressor block's pointers (of either launch's parameter block).
template <class P>
void kv_host_relocate(KvHostLaunch<P>& in, KvCompressParams& c) {
    in.relocate(c.kv_score);
    in.relocate(c.positions);
    in.relocate(c.slots);
    in.relocate(c.qsl);
    in.relocate(c.ttr);
    in.relocate(c.weight);
    in.relocate(c.latent);
    in.relocate(c.ring);
    in.relocate(c.prev_rows);
    in.relocate(c.prev_idx);
}

static void kv_host_relocate(KvHostLaunch<KvFusedParams>& in, KvFusedParams& f) {
    kv_host_relocate(in, f.compress);
    in.relocate(f.insert.latent);
    in.relocate(f.insert.positions);
    in.relocate(f.insert.slots);
    in.relocate(f.insert.cos_sin);
    in.relocate(f.insert.cache);
    in.relocate(f.insert.fp8_scale);
}

int main() {
    KvHostLaunch<KV_HOST_PARAMS> in;
    kv_host_relocate(in, in.params);
    kv_host_run_lanes(in, in.function());
    in.write_results();
    return 0;
}
