// tw_bandwidth: core-to-core transfer bandwidth between pairs of CPUs.
//
// Pairs "A B" one per line on stdin. A buffer of SIZE bytes lives on the NUMA node of A. Each round,
// A writes the whole buffer (so it sits modified in A's caches), publishes a sequence number; B then
// reads the whole buffer (every line comes from A's caches, or memory if it did not fit) and the read
// is timed on B. One sample = SIZE / read time. Output, one line per pair:
// "A B bw median_gbs p10_gbs p90_gbs min_gbs max_gbs samples node"  (GB = 1e9 bytes).
#include "tw_probe_common.hpp"

using namespace tw;

namespace {

struct alignas(64) Flag {
    std::atomic<uint64_t> v{0};
};

std::vector<double> measure(int a, int b, uint64_t* buf, size_t words, long samples, long warmup, Flag* seq, Flag* ack) {
    seq->v.store(0);
    ack->v.store(0);
    const long total = warmup + samples;
    std::vector<double> gbs;
    SpinBarrier start;
    bool bad = false;
    std::thread reader([&] {
        pin_self(b);
        start.wait(2);
        for (long it = 1; it <= total; ++it) {
            while (seq->v.load(std::memory_order_acquire) != uint64_t(it)) cpu_relax();
            uint64_t t0 = now_ns();
            uint64_t sum = 0;
            for (size_t w = 0; w < words; ++w) sum += buf[w];
            uint64_t t1 = now_ns();
            if (sum != uint64_t(it) * words) bad = true;
            if (it > warmup) gbs.push_back(double(words * 8) / double(std::max<uint64_t>(t1 - t0, 1)));
            ack->v.store(uint64_t(it), std::memory_order_release);
        }
    });
    pin_self(a);
    start.wait(2);
    for (long it = 1; it <= total; ++it) {
        while (ack->v.load(std::memory_order_acquire) != uint64_t(it - 1)) cpu_relax();
        for (size_t w = 0; w < words; ++w) buf[w] = uint64_t(it);
        seq->v.store(uint64_t(it), std::memory_order_release);
    }
    reader.join();
    if (bad) die("reader saw a torn buffer (synchronisation bug)");
    return gbs;
}

}  // namespace

int main(int argc, char** argv) {
    long samples = 50, warmup = 5;
    long size = 256 * 1024;
    for (int k = 1; k < argc; ++k) {
        std::string f = argv[k];
        auto val = [&](const char* what) {
            if (k + 1 >= argc) die(std::string("missing value for ") + what);
            return argv[++k];
        };
        if (f == "--samples") samples = parse_long(val("--samples"), "--samples");
        else if (f == "--warmup") warmup = parse_long(val("--warmup"), "--warmup");
        else if (f == "--size") size = parse_long(val("--size"), "--size");
        else if (f == "-h" || f == "--help") {
            std::printf("usage: tw_bandwidth [--size BYTES] [--samples N] [--warmup N] < pairs\n");
            return 0;
        } else die("unknown argument " + f);
    }
    if (samples < 1) die("--samples must be at least 1");
    if (size < 4096) die("--size must be at least 4096 bytes");
    size_t words = size_t(size) / 8;
    auto allowed = allowed_cpus();
    auto pairs = read_pairs();
    for (auto& [a, b] : pairs) {
        NodeBuffer mem(words * 8 + 4096, a);
        auto* seq = new (mem.ptr) Flag();
        auto* ack = new (static_cast<char*>(mem.ptr) + 256) Flag();
        auto* buf = reinterpret_cast<uint64_t*>(static_cast<char*>(mem.ptr) + 4096);
        auto v = measure(a, b, buf, words, samples, warmup, seq, ack);
        std::printf("%d %d bw %.4f %.4f %.4f %.4f %.4f %zu %d\n", a, b, percentile(v, 0.5), percentile(v, 0.1),
                    percentile(v, 0.9), percentile(v, 0.0), percentile(v, 1.0), v.size(), mem.node);
        std::fflush(stdout);
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int c : allowed) CPU_SET(c, &set);
        sched_setaffinity(0, sizeof(set), &set);
    }
    return 0;
}
