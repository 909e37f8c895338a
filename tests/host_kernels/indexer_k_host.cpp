// The indexer key store's kernels on the host (compressor_host.h's runner:
// a group's 32 lanes on threads of their own, for the norm's and the
// scale's exchanges), for tests/indexer_k_device.rs.
#define KV_HOST_PARAMS KvIndexerKParams
#include "compressor_host.h"
