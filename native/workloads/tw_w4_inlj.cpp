// W4 index nested-loop join (paper 003): the W3 data; R is indexed beforehand by an in-memory
// B+-tree (fan-out 64, nodes from new; built by inserting R in its shuffled order), then every S
// tuple looks its key up in the index. The index build is reported separately (build_s); time_s is
// the join alone, as in the paper.
// checksum = sum over matching pairs of R.payload * S.payload, modulo 2^64 (equal to W3's).
#include "common.hpp"

using namespace tw;

namespace {
constexpr int FAN = 64;  // max keys per node

struct NodeB {
    bool leaf;
    int n = 0;
    uint64_t keys[FAN];
    explicit NodeB(bool l) : leaf(l) {}
};
struct Leaf : NodeB {
    uint64_t vals[FAN];
    Leaf() : NodeB(true) {}
};
struct Inner : NodeB {
    NodeB* child[FAN + 1];
    Inner() : NodeB(false) {}
};

struct BTree {
    NodeB* root = new Leaf();
    uint64_t nodes = 1;

    // Insert into the subtree; on split return the new right sibling and its separator.
    NodeB* insert(NodeB* nd, uint64_t k, uint64_t v, uint64_t& sep) {
        if (nd->leaf) {
            Leaf* l = static_cast<Leaf*>(nd);
            int pos = std::lower_bound(l->keys, l->keys + l->n, k) - l->keys;
            if (pos < l->n && l->keys[pos] == k) {
                l->vals[pos] = v;
                return nullptr;
            }
            std::memmove(l->keys + pos + 1, l->keys + pos, (l->n - pos) * sizeof(uint64_t));
            std::memmove(l->vals + pos + 1, l->vals + pos, (l->n - pos) * sizeof(uint64_t));
            l->keys[pos] = k;
            l->vals[pos] = v;
            if (++l->n < FAN) return nullptr;
            Leaf* r = new Leaf();
            ++nodes;
            int half = l->n / 2;
            r->n = l->n - half;
            std::memcpy(r->keys, l->keys + half, r->n * sizeof(uint64_t));
            std::memcpy(r->vals, l->vals + half, r->n * sizeof(uint64_t));
            l->n = half;
            sep = r->keys[0];
            return r;
        }
        Inner* in = static_cast<Inner*>(nd);
        int pos = std::upper_bound(in->keys, in->keys + in->n, k) - in->keys;
        uint64_t csep;
        NodeB* split = insert(in->child[pos], k, v, csep);
        if (!split) return nullptr;
        std::memmove(in->keys + pos + 1, in->keys + pos, (in->n - pos) * sizeof(uint64_t));
        std::memmove(in->child + pos + 2, in->child + pos + 1, (in->n - pos) * sizeof(NodeB*));
        in->keys[pos] = csep;
        in->child[pos + 1] = split;
        if (++in->n < FAN) return nullptr;
        Inner* r = new Inner();
        ++nodes;
        int half = in->n / 2;  // keys[half] moves up
        sep = in->keys[half];
        r->n = in->n - half - 1;
        std::memcpy(r->keys, in->keys + half + 1, r->n * sizeof(uint64_t));
        std::memcpy(r->child, in->child + half + 1, (r->n + 1) * sizeof(NodeB*));
        in->n = half;
        return r;
    }
    void put(uint64_t k, uint64_t v) {
        uint64_t sep;
        NodeB* split = insert(root, k, v, sep);
        if (split) {
            Inner* r = new Inner();
            ++nodes;
            r->n = 1;
            r->keys[0] = sep;
            r->child[0] = root;
            r->child[1] = split;
            root = r;
        }
    }
    bool get(uint64_t k, uint64_t& v) const {
        const NodeB* nd = root;
        while (!nd->leaf) {
            const Inner* in = static_cast<const Inner*>(nd);
            nd = in->child[std::upper_bound(in->keys, in->keys + in->n, k) - in->keys];
        }
        const Leaf* l = static_cast<const Leaf*>(nd);
        int pos = std::lower_bound(l->keys, l->keys + l->n, k) - l->keys;
        if (pos < l->n && l->keys[pos] == k) {
            v = l->vals[pos];
            return true;
        }
        return false;
    }
    static void destroy(NodeB* nd) {
        if (nd->leaf) {
            delete static_cast<Leaf*>(nd);
            return;
        }
        Inner* in = static_cast<Inner*>(nd);
        for (int i = 0; i <= in->n; ++i) destroy(in->child[i]);
        delete in;
    }
};
}  // namespace

int main(int argc, char** argv) {
    JoinRun r = join_setup(argc, argv, "W4");
    const JoinData& d = r.d;
    const uint64_t build = r.build;
    const unsigned threads = r.threads;
    const Pinning& pin = r.pin;
    const double gen_s = r.gen_s;
    const std::string dataset = "uniform";

    // Index build: single-threaded inserts (the paper reports it apart from the join).
    double tb = now_s();
    BTree idx;
    {
        // build on thread 0's CPU, as the index would be in a loaded database
        uint64_t dummy = 0;
        parallel(1, pin, [&](unsigned) {
            for (uint64_t i = 0; i < build; ++i) idx.put(d.r_keys[i], d.r_pay[i]);
            dummy = idx.nodes;
        });
        (void)dummy;
    }
    double build_s = now_s() - tb;

    double t1 = now_s();
    std::atomic<uint64_t> checksum{0}, matches{0};
    uint64_t probe = d.s_keys.size();
    parallel(threads, pin, [&](unsigned t) {
        auto [lo, hi] = chunk(probe, threads, t);
        uint64_t sum = 0, cnt = 0, v;
        for (uint64_t i = lo; i < hi; ++i)
            if (idx.get(d.s_keys[i], v)) {
                sum += v * d.s_pay[i];
                ++cnt;
            }
        checksum += sum;
        matches += cnt;
    });
    double time_s = now_s() - t1;

    Json j;
    common_fields(j, "W4", dataset, threads, pin);
    j.u("build_records", build);
    j.u("probe_records", probe);
    j.s("index", "btree");
    j.u("index_nodes", idx.nodes);
    j.u("result_rows", matches.load());
    j.d("time_s", time_s);
    j.d("build_s", build_s);
    j.d("gen_s", gen_s);
    j.u("checksum", checksum.load());
    finish(j);
    BTree::destroy(idx.root);
    return 0;
}
