// T1 baseline (thesis 004, section 3.4.3 "distinct-hash"): COUNT(DISTINCT key) with a hash set.
// Concurrent open addressing (CAS on the key), the table pre-allocated and cleared outside the
// timed region; each run inserts every key and counts the inserts that were new.
// Flags: --keys FILE (raw int64) --threads T --pin LIST --runs N (timed runs; a warm-up run first).
#include "keys.hpp"

using namespace tw;

int main(int argc, char** argv) {
    Args a(argc, argv, {"keys", "threads", "pin", "runs", "warmup"});
    std::string path = a.str("keys", "");
    if (path.empty()) die("--keys FILE is required");
    unsigned threads = threads_arg(a);
    Pinning pin = Pinning::parse(a.str("pin", ""));
    uint64_t runs = a.u64("runs", 3), warmup = a.u64("warmup", 1);
    if (runs < 1) die("--runs must be at least 1");
    std::vector<uint64_t> keys = read_keys(path);
    CountTable table(keys.size());
    std::vector<double> times;
    uint64_t distinct = 0;
    for (uint64_t r = 0; r < warmup + runs; ++r) {
        table.clear(threads, pin);
        std::atomic<uint64_t> found{0};
        double t0 = now_s();
        parallel(threads, pin, [&](unsigned t) {
            auto [lo, hi] = chunk(keys.size(), threads, t);
            uint64_t mine = 0;
            for (uint64_t i = lo; i < hi; ++i) mine += table.add(keys[i]);
            found += mine;
        });
        double dt = now_s() - t0;
        if (r >= warmup) times.push_back(dt);
        distinct = found.load();
    }
    Json j;
    j.s("baseline", "hash-set");
    j.u("records", keys.size());
    j.u("threads", threads);
    j.u("answer", distinct);
    j.raw("times_s", times_json(times));
    j.u("table_slots", table.slots.size());
    finish(j);
    return 0;
}
