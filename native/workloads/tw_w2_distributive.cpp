// W2 distributive aggregation (paper 003): SELECT key, COUNT(*) FROM records GROUP BY key.
// One shared concurrent hash table (open addressing, CAS on the key, atomic counters): no
// allocation while aggregating, the contrast to W1.
// checksum = sum over groups of (key + 1) * count, modulo 2^64.
#include "common.hpp"

using namespace tw;

namespace {
struct Slot {
    std::atomic<uint64_t> key{EMPTY_KEY};
    std::atomic<uint64_t> count{0};
};
}  // namespace

int main(int argc, char** argv) {
    AggRun r = agg_setup(argc, argv);
    const AggData& d = r.d;
    const unsigned threads = r.threads;
    const Pinning& pin = r.pin;

    double t1 = now_s();
    uint64_t cap = table_capacity(r.groups);
    std::vector<Slot> table(cap);
    std::atomic<uint64_t> checksum{0}, found{0};
    parallel(threads, pin, [&](unsigned t) {
        auto [lo, hi] = chunk(r.n, threads, t);
        for (uint64_t i = lo; i < hi; ++i)
            table[find_or_insert(table, d.keys[i])].count.fetch_add(1, std::memory_order_relaxed);
    });
    parallel(threads, pin, [&](unsigned t) {
        auto [lo, hi] = chunk(cap, threads, t);
        uint64_t sum = 0, cnt = 0;
        for (uint64_t i = lo; i < hi; ++i) {
            uint64_t k = table[i].key.load(std::memory_order_relaxed);
            if (k == EMPTY_KEY) continue;
            sum += (k + 1) * table[i].count.load(std::memory_order_relaxed);
            ++cnt;
        }
        checksum += sum;
        found += cnt;
    });
    double time_s = now_s() - t1;

    Json j;
    agg_fields(j, "W2", r);
    j.u("result_rows", found.load());
    j.d("time_s", time_s);
    j.d("gen_s", r.gen_s);
    j.u("checksum", checksum.load());
    finish(j);
    return 0;
}
