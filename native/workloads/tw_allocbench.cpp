// Allocator microbenchmark (paper 003, section 3.1.8). Each thread performs --ops memory
// operations on its own table of --slots pointers: a random slot that is empty gets a new block
// (malloc + write every byte), a full one is read back (every byte checked) and freed. Block sizes
// come from power-of-two size classes 16 B .. 16 KiB, a class drawn with probability inversely
// proportional to its size (small blocks are more frequent), the size uniform inside the class.
// Reports time and memory overhead = max RSS / peak bytes requested (live blocks + slot tables).
// checksum = sum of all bytes read back, modulo 2^64 (independent of the allocator).
#include "common.hpp"

using namespace tw;

int main(int argc, char** argv) {
    Args a(argc, argv, {"ops", "slots", "seed", "threads", "pin", "sleep-ms", "max-size"});
    uint64_t ops = a.u64("ops", 5000000), slots = a.u64("slots", 200000), seed = a.u64("seed", 42);
    uint64_t max_size = a.u64("max-size", 16384);
    if (slots == 0) die("--slots must be at least 1");
    if (max_size < 16) die("--max-size must be at least 16");
    unsigned threads = threads_arg(a);
    Pinning pin = Pinning::parse(a.str("pin", ""));
    startup_pause(a);

    std::vector<uint64_t> sizes;  // class upper bounds
    for (uint64_t s = 16; s <= max_size; s <<= 1) sizes.push_back(s);
    std::vector<double> cdf(sizes.size());
    double acc = 0;
    for (size_t c = 0; c < sizes.size(); ++c) cdf[c] = (acc += 1.0 / sizes[c]);
    for (auto& x : cdf) x /= acc;

    std::atomic<uint64_t> checksum{0}, peak_total{0}, allocs{0}, bad{0};
    double t0 = now_s();
    parallel(threads, pin, [&](unsigned t) {
        Rng g(seed * 1000003 + t);
        std::vector<unsigned char*> ptr(slots, nullptr);
        std::vector<uint32_t> len(slots, 0);
        uint64_t live = 0, peak = 0, sum = 0, na = 0, nbad = 0;
        for (uint64_t i = 0; i < ops; ++i) {
            uint64_t r = g.next();
            uint64_t s = r % slots;
            if (!ptr[s]) {
                double u = unit(g.next());
                size_t c = std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
                if (c >= sizes.size()) c = sizes.size() - 1;
                uint64_t hi = sizes[c], lo = c ? sizes[c - 1] + 1 : 1;
                uint64_t n = lo + (r >> 32) % (hi - lo + 1);
                auto* p = static_cast<unsigned char*>(std::malloc(n));
                if (!p) die("out of memory");
                std::memset(p, (int)(i & 0xFF), n);
                ptr[s] = p;
                len[s] = (uint32_t)n;
                live += n;
                peak = std::max(peak, live);
                ++na;
            } else {
                unsigned char* p = ptr[s];
                uint64_t n = len[s], local = 0;
                unsigned char tag = p[0];
                for (uint64_t b = 0; b < n; ++b) {
                    local += p[b];
                    nbad += p[b] != tag;
                }
                sum += local;
                std::free(p);
                ptr[s] = nullptr;
                live -= n;
            }
        }
        for (uint64_t s = 0; s < slots; ++s) std::free(ptr[s]);
        checksum += sum;
        peak_total += peak + slots * (sizeof(unsigned char*) + sizeof(uint32_t));
        allocs += na;
        bad += nbad;
    });
    double time_s = now_s() - t0;
    uint64_t rss = max_rss_bytes();

    Json j;
    common_fields(j, "alloc", "inverse-size-classes", threads, pin);
    j.u("ops_per_thread", ops);
    j.u("slots_per_thread", slots);
    j.u("max_block_bytes", max_size);
    j.u("allocations", allocs.load());
    j.d("time_s", time_s);
    j.u("requested_peak_bytes", peak_total.load());
    j.d("memory_overhead", peak_total.load() ? (double)rss / peak_total.load() : 0.0);
    j.b("verified", bad.load() == 0);
    j.u("checksum", checksum.load());
    finish(j, rss);
    return bad.load() == 0 ? 0 : 4;
}
