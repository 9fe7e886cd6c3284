// W1 holistic aggregation (paper 003): SELECT key, MEDIAN(val) FROM records GROUP BY key.
// One shared concurrent hash table (open addressing, CAS on the key, a spin lock per group);
// every group keeps all its values in a growing std::vector, so the run is allocation-heavy.
// The median is the lower median (element (n-1)/2 of the sorted values).
// checksum = sum over groups of (key + 1) * median, modulo 2^64.
#include "common.hpp"

using namespace tw;

namespace {
struct Slot {
    std::atomic<uint64_t> key{EMPTY_KEY};
    SpinLock lock;
    std::vector<uint32_t> vals;
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
        for (uint64_t i = lo; i < hi; ++i) {
            Slot& s = table[find_or_insert(table, d.keys[i])];
            s.lock.lock();
            s.vals.push_back((uint32_t)d.vals[i]);
            s.lock.unlock();
        }
    });
    double build_s = now_s() - t1;
    parallel(threads, pin, [&](unsigned t) {
        auto [lo, hi] = chunk(cap, threads, t);
        uint64_t sum = 0, cnt = 0;
        for (uint64_t i = lo; i < hi; ++i) {
            Slot& s = table[i];
            uint64_t k = s.key.load(std::memory_order_relaxed);
            if (k == EMPTY_KEY) continue;
            auto mid = s.vals.begin() + (s.vals.size() - 1) / 2;
            std::nth_element(s.vals.begin(), mid, s.vals.end());
            sum += (k + 1) * (uint64_t)*mid;
            ++cnt;
        }
        checksum += sum;
        found += cnt;
    });
    double time_s = now_s() - t1;

    Json j;
    agg_fields(j, "W1", r);
    j.u("result_rows", found.load());
    j.d("time_s", time_s);
    j.d("insert_s", build_s);
    j.d("median_s", time_s - build_s);
    j.d("gen_s", r.gen_s);
    j.u("checksum", checksum.load());
    finish(j);
    return 0;
}
