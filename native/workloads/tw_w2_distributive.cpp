// W2 distributive aggregation (paper 003): SELECT key, COUNT(*) FROM records GROUP BY key.
// One shared concurrent hash table (open addressing, CAS on the key, atomic counters): no
// allocation while aggregating, the contrast to W1.
// checksum = sum over groups of (key + 1) * count, modulo 2^64.
#include "common.hpp"

using namespace tw;

namespace {
constexpr uint64_t EMPTY = ~0ULL;
struct Slot {
    std::atomic<uint64_t> key{EMPTY};
    std::atomic<uint64_t> count{0};
};
}  // namespace

int main(int argc, char** argv) {
    Args a(argc, argv, {"dataset", "records", "groups", "zipf-exponent", "seed", "threads", "pin", "dump", "sleep-ms"});
    std::string dataset = a.str("dataset", "moving-cluster");
    uint64_t n = a.u64("records", 10000000), groups = a.u64("groups", 100000), seed = a.u64("seed", 42);
    double ze = a.f64("zipf-exponent", 0.5);
    unsigned threads = threads_arg(a);
    Pinning pin = Pinning::parse(a.str("pin", ""));
    startup_pause(a);

    double t0 = now_s();
    AggData d = make_agg(dataset, n, groups, ze, seed, threads, pin);
    double gen_s = now_s() - t0;
    dump(a.str("dump", ""), "keys.u64", d.keys);
    dump(a.str("dump", ""), "vals.u64", d.vals);

    double t1 = now_s();
    uint64_t cap = 1;
    while (cap < 2 * groups) cap <<= 1;
    std::vector<Slot> table(cap);
    std::atomic<uint64_t> checksum{0}, found{0};
    parallel(threads, pin, [&](unsigned t) {
        auto [lo, hi] = chunk(n, threads, t);
        for (uint64_t i = lo; i < hi; ++i) {
            uint64_t k = d.keys[i];
            uint64_t h = splitmix64(k) & (cap - 1);
            for (;;) {
                uint64_t cur = table[h].key.load(std::memory_order_acquire);
                if (cur == k) break;
                if (cur == EMPTY) {
                    uint64_t expected = EMPTY;
                    if (table[h].key.compare_exchange_strong(expected, k)) break;
                    if (expected == k) break;
                }
                h = (h + 1) & (cap - 1);
            }
            table[h].count.fetch_add(1, std::memory_order_relaxed);
        }
    });
    parallel(threads, pin, [&](unsigned t) {
        auto [lo, hi] = chunk(cap, threads, t);
        uint64_t sum = 0, cnt = 0;
        for (uint64_t i = lo; i < hi; ++i) {
            uint64_t k = table[i].key.load(std::memory_order_relaxed);
            if (k == EMPTY) continue;
            sum += (k + 1) * table[i].count.load(std::memory_order_relaxed);
            ++cnt;
        }
        checksum += sum;
        found += cnt;
    });
    double time_s = now_s() - t1;

    Json j;
    common_fields(j, "W2", dataset, threads, pin);
    j.u("records", n);
    j.u("groups", groups);
    if (dataset == "zipf") j.d("zipf_exponent", ze);
    j.u("result_rows", found.load());
    j.d("time_s", time_s);
    j.d("gen_s", gen_s);
    j.u("checksum", checksum.load());
    finish(j);
    return 0;
}
