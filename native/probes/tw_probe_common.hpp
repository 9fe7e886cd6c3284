// Shared helpers for the tilewise probes: pinning, clocks, NUMA allocation, argument parsing.
#pragma once
#include <sched.h>
#include <numa.h>
#include <pthread.h>
#include <time.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace tw {

[[noreturn]] inline void die(const std::string& msg) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    std::exit(2);
}

inline uint64_t now_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

inline void pin_self(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0)
        die("cannot pin to cpu " + std::to_string(cpu) + ": " + std::strerror(errno));
}

inline std::vector<int> allowed_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) die("sched_getaffinity failed");
    std::vector<int> out;
    for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) out.push_back(c);
    return out;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

// Memory on the NUMA node of `cpu` (falls back to plain aligned memory without libnuma support).
struct NodeBuffer {
    void* ptr = nullptr;
    size_t bytes = 0;
    bool numa = false;
    int node = -1;
    NodeBuffer(size_t n, int cpu) : bytes(n) {
        if (numa_available() >= 0) {
            node = numa_node_of_cpu(cpu);
            if (node >= 0) ptr = numa_alloc_onnode(n, node);
            numa = ptr != nullptr;
        }
        if (!ptr) {
            if (posix_memalign(&ptr, 4096, n) != 0) die("out of memory");
        }
        std::memset(ptr, 0, n);
    }
    ~NodeBuffer() {
        if (numa) numa_free(ptr, bytes);
        else std::free(ptr);
    }
    NodeBuffer(const NodeBuffer&) = delete;
    NodeBuffer& operator=(const NodeBuffer&) = delete;
};

inline long parse_long(const char* s, const char* what) {
    char* end = nullptr;
    errno = 0;
    long v = std::strtol(s, &end, 10);
    if (errno || !end || *end || v < 0) die(std::string("bad value for ") + what + ": " + s);
    return v;
}

// Pairs "a b" one per line on stdin.
// CPU pairs from stdin ("A B" per line): at least one, two different CPUs each, all allowed here.
inline std::vector<std::pair<int, int>> read_pairs() {
    std::vector<std::pair<int, int>> pairs;
    int a, b;
    while (std::scanf("%d %d", &a, &b) == 2) pairs.emplace_back(a, b);
    if (pairs.empty()) die("no pairs on stdin (one \"A B\" per line)");
    auto allowed = allowed_cpus();
    for (auto& [x, y] : pairs) {
        if (x == y) die("a pair needs two different CPUs (" + std::to_string(x) + ")");
        for (int c : {x, y})
            if (std::find(allowed.begin(), allowed.end(), c) == allowed.end())
                die("cpu " + std::to_string(c) + " is not in this process's allowed CPUs");
    }
    return pairs;
}

inline double percentile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    double pos = q * (v.size() - 1);
    size_t lo = size_t(pos);
    size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

// A reusable spin barrier for threads of one process (or processes sharing the memory).
struct SpinBarrier {
    std::atomic<uint32_t> count{0};
    std::atomic<uint32_t> gen{0};
    void wait(uint32_t parties) {
        uint32_t g = gen.load(std::memory_order_acquire);
        if (count.fetch_add(1, std::memory_order_acq_rel) + 1 == parties) {
            count.store(0, std::memory_order_relaxed);
            gen.fetch_add(1, std::memory_order_release);
            return;
        }
        unsigned spins = 0;
        while (gen.load(std::memory_order_acquire) == g) {
            if (++spins < 100000) cpu_relax();
            else sched_yield();  // a party is not running yet: do not starve it
        }
    }
};

}  // namespace tw
