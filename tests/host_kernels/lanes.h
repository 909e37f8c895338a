// Runs a kernel whose groups exchange values among their lanes on the host
// (KV_HOST_LANES): a group's 32 lanes on threads of their own, group after
// group, for insert_host.cpp and compressor_host.h. Included once per
// harness executable, after harness.h.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

thread_local unsigned kv_host_tid;
unsigned kv_host_bid, kv_host_bdim, kv_host_gdim;
// The CR2 team kernels' dynamic shared memory (never run here).
float kv_team_shared[1];

// A reusable barrier of n threads. A wait that outlasts a minute means the
// lanes of a group took different paths to an exchange: that is a failure
// of the kernel's contract, reported rather than hung on.
struct Barrier {
    std::mutex m;
    std::condition_variable cv;
    unsigned n = 0, count = 0, generation = 0;
    void wait() {
        std::unique_lock<std::mutex> l(m);
        unsigned g = generation;
        if (++count == n) {
            count = 0;
            ++generation;
            cv.notify_all();
            return;
        }
        if (!cv.wait_for(l, std::chrono::seconds(60), [&] { return generation != g; })) {
            fprintf(stderr, "lane exchange timed out: the lanes of a group diverged\n");
            exit(3);
        }
    }
};

// The running group's barrier and one value slot per lane.
static Barrier group_barrier;
static std::vector<uint32_t> lane_values;

uint32_t kv_host_exchange(uint32_t v, unsigned from) {
    lane_values[kv_host_tid % 32u] = v;
    group_barrier.wait();
    uint32_t r = lane_values[from % 32u];
    group_barrier.wait();
    return r;
}

// Runs `k` over the launch's grid with a group's lanes on threads of their
// own; its groups never wait for each other.
template <class P>
void kv_host_run_lanes(KvHostLaunch<P>& in, typename KvHostLaunch<P>::Kernel k) {
    const unsigned grid = in.grid, block = in.block;
    const P& p = in.params;
    kv_host_bdim = block;
    kv_host_gdim = grid;
    // A group's 32 lanes on threads of their own, which live for the
    // whole grid and run it group by group (these kernels' groups never
    // wait for each other): each starts a group together and reports
    // back when it is done.
    group_barrier.n = 32;
    lane_values.assign(32, 0);
    Barrier start, done;
    start.n = done.n = 33;
    bool quit = false;
    unsigned base = 0;
    std::vector<std::thread> lanes;
    for (unsigned l = 0; l < 32; ++l)
        lanes.emplace_back([&, l] {
            for (;;) {
                start.wait();
                if (quit) return;
                kv_host_tid = base + l;
                k(p);
                done.wait();
            }
        });
    for (kv_host_bid = 0; kv_host_bid < grid; ++kv_host_bid)
        for (base = 0; base < block; base += 32) {
            start.wait();
            done.wait();
        }
    quit = true;
    start.wait();
    for (auto& t : lanes) t.join();
}
