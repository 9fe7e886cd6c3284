// tw_chase_ref: a plain reference pointer chase (lmbench's lat_mem_rd method with random order),
// kept apart from tw_memory on purpose: a different permutation (a shuffled list of lines, linked in
// order), plain malloc'ed memory placed by whoever starts it (numactl --membind), one thread on
// whatever CPU it is bound to. It checks tw_memory's idle latency. Output: "ns_per_load <median>".
//   tw_chase_ref --size BYTES [--loads N] [--reps N] [--hugepages 0|1]
#include <sys/mman.h>

#include <numeric>
#include <random>

#include "tw_probe_common.hpp"

using namespace tw;

int main(int argc, char** argv) {
    long size = 0, loads = 20000000, reps = 5, huge = 1;
    for (int k = 1; k < argc; ++k) {
        std::string f = argv[k];
        auto val = [&](const char* what) {
            if (k + 1 >= argc) die(std::string("missing value for ") + what);
            return argv[++k];
        };
        if (f == "--size") size = parse_long(val("--size"), "--size");
        else if (f == "--loads") loads = parse_long(val("--loads"), "--loads");
        else if (f == "--reps") reps = parse_long(val("--reps"), "--reps");
        else if (f == "--hugepages") huge = parse_long(val("--hugepages"), "--hugepages");
        else die("unknown argument " + f);
    }
    if (size < 4096 || loads < 1 || reps < 2) die("usage: tw_chase_ref --size BYTES [--loads N] [--reps N>=2] [--hugepages 0|1]");
    const size_t line = 64, n = size_t(size) / line;
    void* mem = nullptr;
    if (posix_memalign(&mem, 2u << 20, n * line) != 0) die("out of memory");
    madvise(mem, n * line, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    char* buf = static_cast<char*>(mem);
    std::memset(buf, 0, n * line);
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937_64 rng(42);
    std::shuffle(order.begin() + 1, order.end(), rng);
    for (size_t i = 0; i < n; ++i)
        *reinterpret_cast<char**>(buf + order[i] * line) = buf + order[(i + 1) % n] * line;
    std::vector<double> v;
    char** p = reinterpret_cast<char**>(buf);
    for (long r = 0; r < reps; ++r) {
        uint64_t t0 = now_ns();
        for (long i = 0; i < loads; ++i) p = reinterpret_cast<char**>(*p);
        double ns = double(now_ns() - t0) / double(loads);
        if (r > 0) v.push_back(ns);  // the first pass warms the TLB and the page tables
    }
    std::printf("ns_per_load %.3f %p\n", percentile(v, 0.5), static_cast<void*>(p));
    return 0;
}
