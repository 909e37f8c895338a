// Runs the gather kernels of kernels-hip/kv_gather.hip on the host for
// tests/gather_host_kernels.rs, one work-item after the other (they never
// talk across lanes); the launch protocol is harness.h's.
#include "prelude_host.h"
#define KV_PRELUDE_INCLUDED 1
#include "kvcache.hip"

#include "harness.h"
#include "relocate.h"

unsigned kv_host_tid, kv_host_bid, kv_host_bdim, kv_host_gdim;
// The CR2 team kernels' dynamic shared memory (never run here).
float kv_team_shared[1];

int main() {
    KvHostLaunch<KvGatherParams> l;
    kv_host_relocate(l, l.params);
    l.run_in_order(l.function());
    l.write_results();
    return 0;
}
