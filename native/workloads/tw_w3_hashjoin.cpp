// W3 non-partitioned hash join (paper 003, after Blanas et al. / Balkesen et al. "NPO"):
// SELECT * FROM R JOIN S ON R.key = S.fkey with |R| : |S| = 1 : ratio (16 by default).
// Build: one shared bucket array; every R tuple goes into its own heap node (new) pushed with a
// CAS onto its bucket's chain, so the build exercises the allocator from all threads. Probe: every
// S tuple walks its chain. The join result is counted, not materialised.
// checksum = sum over matching pairs of R.payload * S.payload, modulo 2^64.
#include "common.hpp"

using namespace tw;

namespace {
struct Node {
    uint64_t key, pay;
    Node* next;
};
}  // namespace

int main(int argc, char** argv) {
    JoinRun r = join_setup(argc, argv, "W3");
    const JoinData& d = r.d;
    const uint64_t build = r.build;
    const unsigned threads = r.threads;
    const Pinning& pin = r.pin;
    const double gen_s = r.gen_s;
    const std::string dataset = "uniform";

    double t1 = now_s();
    uint64_t nb = 1;
    while (nb < build) nb <<= 1;
    std::vector<std::atomic<Node*>> heads(nb);
    for (auto& h : heads) h.store(nullptr, std::memory_order_relaxed);
    parallel(threads, pin, [&](unsigned t) {
        auto [lo, hi] = chunk(build, threads, t);
        for (uint64_t i = lo; i < hi; ++i) {
            Node* nd = new Node{d.r_keys[i], d.r_pay[i], nullptr};
            auto& head = heads[splitmix64(nd->key) & (nb - 1)];
            nd->next = head.load(std::memory_order_relaxed);
            while (!head.compare_exchange_weak(nd->next, nd, std::memory_order_release, std::memory_order_relaxed)) {
            }
        }
    });
    double build_s = now_s() - t1;
    std::atomic<uint64_t> checksum{0}, matches{0};
    uint64_t probe = d.s_keys.size();
    parallel(threads, pin, [&](unsigned t) {
        auto [lo, hi] = chunk(probe, threads, t);
        uint64_t sum = 0, cnt = 0;
        for (uint64_t i = lo; i < hi; ++i) {
            uint64_t k = d.s_keys[i];
            for (Node* nd = heads[splitmix64(k) & (nb - 1)].load(std::memory_order_acquire); nd; nd = nd->next)
                if (nd->key == k) {
                    sum += nd->pay * d.s_pay[i];
                    ++cnt;
                }
        }
        checksum += sum;
        matches += cnt;
    });
    double time_s = now_s() - t1;

    Json j;
    common_fields(j, "W3", dataset, threads, pin);
    j.u("build_records", build);
    j.u("probe_records", probe);
    j.u("result_rows", matches.load());
    j.d("time_s", time_s);
    j.d("build_s", build_s);
    j.d("probe_s", time_s - build_s);
    j.d("gen_s", gen_s);
    j.u("checksum", checksum.load());
    finish(j);
    for (auto& h : heads)
        for (Node* nd = h.load(); nd;) {
            Node* nx = nd->next;
            delete nd;
            nd = nx;
        }
    return 0;
}
