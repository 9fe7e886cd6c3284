// T2 baseline: the output cardinality of R JOIN S ON key, counted by a non-partitioned hash join
// that does not materialize (the thesis's baselines were modified the same way, section 3.4.3).
// Build: a count per R key (concurrent open addressing, pre-allocated, cleared outside the timed
// region); probe: every S key adds its R key's count. Unique and non-unique keys alike.
// Flags: --r FILE --s FILE (raw int64) --threads T --pin LIST --runs N --warmup W.
#include "keys.hpp"

using namespace tw;

int main(int argc, char** argv) {
    Args a(argc, argv, {"r", "s", "threads", "pin", "runs", "warmup"});
    std::string rp = a.str("r", ""), sp = a.str("s", "");
    if (rp.empty() || sp.empty()) die("--r FILE and --s FILE are required");
    unsigned threads = threads_arg(a);
    Pinning pin = Pinning::parse(a.str("pin", ""));
    uint64_t runs = a.u64("runs", 3), warmup = a.u64("warmup", 1);
    if (runs < 1) die("--runs must be at least 1");
    std::vector<uint64_t> r = read_keys(rp), s = read_keys(sp);
    CountTable table(r.size());
    std::vector<double> times, builds;
    uint64_t matches = 0;
    for (uint64_t k = 0; k < warmup + runs; ++k) {
        table.clear(threads, pin);
        std::atomic<uint64_t> total{0};
        double t0 = now_s();
        parallel(threads, pin, [&](unsigned t) {
            auto [lo, hi] = chunk(r.size(), threads, t);
            for (uint64_t i = lo; i < hi; ++i) table.add(r[i]);
        });
        double t1 = now_s();
        parallel(threads, pin, [&](unsigned t) {
            auto [lo, hi] = chunk(s.size(), threads, t);
            uint64_t mine = 0;
            for (uint64_t i = lo; i < hi; ++i) mine += table.count_of(s[i]);
            total += mine;
        });
        double t2 = now_s();
        if (k >= warmup) {
            times.push_back(t2 - t0);
            builds.push_back(t1 - t0);
        }
        matches = total.load();
    }
    Json j;
    j.s("baseline", "hash-join-count");
    j.u("r_records", r.size());
    j.u("s_records", s.size());
    j.u("threads", threads);
    j.u("answer", matches);
    j.raw("times_s", times_json(times));
    j.raw("build_s", times_json(builds));
    finish(j);
    return 0;
}
