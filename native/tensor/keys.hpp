// Shared pieces of the tensor workloads' native baselines (thesis 004, ch. 3): key files written
// by tilewise.tensor (raw little-endian int64), and a concurrent open-addressing hash table
// pre-allocated before the clock starts (the thesis's distinct-hash baseline does not time its
// allocation either). Keys are 64-bit patterns; the empty-slot marker ~0 (int64 -1) is a valid key
// too, counted beside the table.
#pragma once

#include "../workloads/common.hpp"

namespace tw {

inline std::vector<uint64_t> read_keys(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) die("cannot read " + path + ": " + std::strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) die("cannot stat " + path);
    if (st.st_size % 8) die(path + " is not a whole number of int64 keys");
    std::vector<uint64_t> v((size_t)st.st_size / 8);
    if (!v.empty() && std::fread(v.data(), 8, v.size(), f) != v.size()) die("short read from " + path);
    std::fclose(f);
    return v;
}

struct CountSlot {
    std::atomic<uint64_t> key{EMPTY_KEY};
    std::atomic<uint64_t> count{0};
};

struct CountTable {
    std::vector<CountSlot> slots;
    std::atomic<uint64_t> empty_key_count{0};  // occurrences of the key ~0
    explicit CountTable(uint64_t distinct_bound) : slots(table_capacity(distinct_bound ? distinct_bound : 1)) {}
    // Add one occurrence of k; true when k was new.
    bool add(uint64_t k) {
        if (k == EMPTY_KEY) return empty_key_count.fetch_add(1, std::memory_order_relaxed) == 0;
        CountSlot& s = slots[find_or_insert(slots, k)];
        return s.count.fetch_add(1, std::memory_order_relaxed) == 0;
    }
    uint64_t count_of(uint64_t k) const {
        if (k == EMPTY_KEY) return empty_key_count.load(std::memory_order_relaxed);
        uint64_t mask = slots.size() - 1, h = splitmix64(k) & mask;
        for (;;) {
            uint64_t cur = slots[h].key.load(std::memory_order_relaxed);
            if (cur == k) return slots[h].count.load(std::memory_order_relaxed);
            if (cur == EMPTY_KEY) return 0;
            h = (h + 1) & mask;
        }
    }
    void clear(unsigned threads, const Pinning& pin) {
        parallel(threads, pin, [&](unsigned t) {
            auto [lo, hi] = chunk(slots.size(), threads, t);
            for (uint64_t i = lo; i < hi; ++i) {
                slots[i].key.store(EMPTY_KEY, std::memory_order_relaxed);
                slots[i].count.store(0, std::memory_order_relaxed);
            }
        });
        empty_key_count = 0;
    }
};

inline std::string times_json(const std::vector<double>& ts) {
    std::string o = "[";
    for (size_t i = 0; i < ts.size(); ++i) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s%.6f", i ? ", " : "", ts[i]);
        o += buf;
    }
    return o + "]";
}

}  // namespace tw
