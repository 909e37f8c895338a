// The fused kernels on the host (compressor_host.h).
#define KV_HOST_PARAMS KvFusedParams
#include "compressor_host.h"
