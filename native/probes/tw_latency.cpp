// tw_latency: core-to-core cache-line latency between pairs of CPUs.
//
// Pairs "A B" come one per line on stdin. For each pair the shared lines are allocated on the NUMA
// node of A (numa_alloc_onnode). Two modes:
//   cas : both threads compare-and-swap one shared line, taking turns (A: 2i -> 2i+1, B: 2i+1 -> 2i+2)
//   rw  : one writer / one reader on two lines (A writes line 0 and waits for B's echo on line 1)
// A batch of ITERS round trips is timed on A; one sample = batch time / (2 * ITERS), i.e. the time
// of one one-way hop (one cache-line transfer between the two cores). Output, one line per pair and
// mode: "A B mode median_ns p10_ns p90_ns min_ns max_ns samples node".
#include "tw_probe_common.hpp"

using namespace tw;

namespace {

struct alignas(64) Line {
    std::atomic<uint64_t> v;
};

constexpr size_t kLineGap = 256;  // bytes between the two lines (beyond the adjacent-line prefetcher)

std::vector<double> measure(int a, int b, const std::string& mode, Line* l0, Line* l1, long samples, long iters, long warmup) {
    l0->v.store(0);
    l1->v.store(0);
    const long total = warmup + samples * iters;
    std::vector<double> out;
    out.reserve(samples);
    SpinBarrier start;
    auto side_b = [&] {
        pin_self(b);
        start.wait(2);
        if (mode == "cas") {
            for (long i = 0; i < total; ++i) {
                uint64_t want = 2 * i + 1;
                uint64_t exp = want;
                while (!l0->v.compare_exchange_weak(exp, want + 1, std::memory_order_acq_rel)) {
                    exp = want;
                    cpu_relax();
                }
            }
        } else {
            for (long i = 1; i <= total; ++i) {
                while (l0->v.load(std::memory_order_acquire) != uint64_t(i)) cpu_relax();
                l1->v.store(uint64_t(i), std::memory_order_release);
            }
        }
    };
    std::thread tb(side_b);
    pin_self(a);
    start.wait(2);
    long i = 0;
    auto one = [&](long k) {
        if (mode == "cas") {
            uint64_t want = 2 * k;
            uint64_t exp = want;
            while (!l0->v.compare_exchange_weak(exp, want + 1, std::memory_order_acq_rel)) {
                exp = want;
                cpu_relax();
            }
        } else {
            l0->v.store(uint64_t(k + 1), std::memory_order_release);
            while (l1->v.load(std::memory_order_acquire) != uint64_t(k + 1)) cpu_relax();
        }
    };
    for (; i < warmup; ++i) one(i);
    for (long s = 0; s < samples; ++s) {
        uint64_t t0 = now_ns();
        for (long k = 0; k < iters; ++k, ++i) one(i);
        uint64_t t1 = now_ns();
        out.push_back(double(t1 - t0) / (2.0 * iters));
    }
    tb.join();
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    long samples = 100, iters = 200, warmup = 2000;
    std::vector<std::string> modes = {"cas", "rw"};
    for (int k = 1; k < argc; ++k) {
        std::string f = argv[k];
        auto val = [&](const char* what) {
            if (k + 1 >= argc) die(std::string("missing value for ") + what);
            return argv[++k];
        };
        if (f == "--samples") samples = parse_long(val("--samples"), "--samples");
        else if (f == "--iters") iters = parse_long(val("--iters"), "--iters");
        else if (f == "--warmup") warmup = parse_long(val("--warmup"), "--warmup");
        else if (f == "--modes") {
            std::string m = val("--modes");
            modes.clear();
            size_t p = 0;
            while (p <= m.size()) {
                size_t q = m.find(',', p);
                if (q == std::string::npos) q = m.size();
                std::string one = m.substr(p, q - p);
                if (one != "cas" && one != "rw") die("unknown mode " + one + " (cas, rw)");
                modes.push_back(one);
                p = q + 1;
            }
        } else if (f == "-h" || f == "--help") {
            std::printf("usage: tw_latency [--samples N] [--iters N] [--warmup N] [--modes cas,rw] < pairs\n");
            return 0;
        } else die("unknown argument " + f);
    }
    if (samples < 1 || iters < 1) die("--samples and --iters must be at least 1");
    auto allowed = allowed_cpus();
    auto pairs = read_pairs();
    for (auto& [a, b] : pairs) {
        NodeBuffer buf(4096, a);
        auto* l0 = new (buf.ptr) Line();
        auto* l1 = new (static_cast<char*>(buf.ptr) + kLineGap) Line();
        for (auto& mode : modes) {
            auto v = measure(a, b, mode, l0, l1, samples, iters, warmup);
            std::printf("%d %d %s %.3f %.3f %.3f %.3f %.3f %zu %d\n", a, b, mode.c_str(), percentile(v, 0.5),
                        percentile(v, 0.1), percentile(v, 0.9), percentile(v, 0.0), percentile(v, 1.0), v.size(),
                        buf.node);
            std::fflush(stdout);
        }
        // pin back to any allowed CPU so the next pair's threads start from a neutral place
        cpu_set_t set;
        CPU_ZERO(&set);
        for (int c : allowed) CPU_SET(c, &set);
        sched_setaffinity(0, sizeof(set), &set);
    }
    return 0;
}
