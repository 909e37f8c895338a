// Every pointer of a parameter block made a host address
// (KvHostLaunch::relocate): one overload per block of kv_abi.h, so each
// block's pointers are listed once for all the host-run launches.
#pragma once

#include "harness.h"

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

template <class P>
void kv_host_relocate(KvHostLaunch<P>& in, KvInsertParams& i) {
    in.relocate(i.latent);
    in.relocate(i.positions);
    in.relocate(i.slots);
    in.relocate(i.cos_sin);
    in.relocate(i.cache);
    in.relocate(i.fp8_scale);
}

template <class P>
void kv_host_relocate(KvHostLaunch<P>& in, KvFusedParams& f) {
    kv_host_relocate(in, f.compress);
    kv_host_relocate(in, f.insert);
}

template <class P>
void kv_host_relocate(KvHostLaunch<P>& in, KvGatherParams& g) {
    in.relocate(g.cache);
    in.relocate(g.slots);
    in.relocate(g.block_table);
    in.relocate(g.cu_seq_lens);
    in.relocate(g.seq_starts);
    in.relocate(g.fp8_scale);
    in.relocate(g.out);
}

template <class P>
void kv_host_relocate(KvHostLaunch<P>& in, KvIndexerKParams& k) {
    in.relocate(k.k_pre);
    in.relocate(k.positions);
    in.relocate(k.slots);
    in.relocate(k.cos_sin);
    in.relocate(k.weight);
    in.relocate(k.cache);
}
