// Shared pieces of the in-memory analytics workloads (paper 003, W1-W4 and the allocator
// microbenchmark): flag parsing, deterministic dataset generators, thread pinning, timing,
// max RSS and the one-line JSON result.
//
// Datasets are generated from a counter-based hash (splitmix64 of seed and record index), so the
// data do not depend on the number of threads, and `--dump DIR` writes them as raw little-endian
// uint64 arrays for reference implementations (tests).
#pragma once

#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace tw {

[[noreturn]] inline void die(const std::string& msg) {
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    std::exit(2);
}

// ---- flags: --name value ----------------------------------------------------------------------
struct Args {
    std::map<std::string, std::string> kv;
    Args(int argc, char** argv, const std::vector<std::string>& known) {
        for (int i = 1; i < argc; ++i) {
            std::string a = argv[i];
            if (a.rfind("--", 0) != 0) die("unexpected argument " + a);
            std::string name = a.substr(2), value;
            auto eq = name.find('=');
            if (eq != std::string::npos) {
                value = name.substr(eq + 1);
                name = name.substr(0, eq);
            } else {
                if (i + 1 >= argc) die("--" + name + " needs a value");
                value = argv[++i];
            }
            if (std::find(known.begin(), known.end(), name) == known.end()) die("unknown flag --" + name);
            kv[name] = value;
        }
    }
    std::string str(const std::string& k, const std::string& def) const {
        auto it = kv.find(k);
        return it == kv.end() ? def : it->second;
    }
    uint64_t u64(const std::string& k, uint64_t def) const {
        auto it = kv.find(k);
        if (it == kv.end()) return def;
        char* end = nullptr;
        double v = std::strtod(it->second.c_str(), &end);  // accepts 1e8
        if (end == it->second.c_str() || *end || v < 0) die("--" + k + " wants a non-negative number");
        return (uint64_t)v;
    }
    double f64(const std::string& k, double def) const {
        auto it = kv.find(k);
        if (it == kv.end()) return def;
        char* end = nullptr;
        double v = std::strtod(it->second.c_str(), &end);
        if (end == it->second.c_str() || *end) die("--" + k + " wants a number");
        return v;
    }
};

// ---- deterministic randomness ------------------------------------------------------------------
inline uint64_t splitmix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}
inline uint64_t rnd(uint64_t seed, uint64_t stream, uint64_t i) {
    return splitmix64(splitmix64(seed * 0x100000001B3ULL + stream) ^ (i * 0xD1B54A32D192ED03ULL));
}
inline double unit(uint64_t r) { return (r >> 11) * (1.0 / 9007199254740992.0); }

struct Rng {  // per-thread sequential generator (xorshift-multiply)
    uint64_t s;
    explicit Rng(uint64_t seed) : s(splitmix64(seed) | 1) {}
    uint64_t next() {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 2685821657736338717ULL;
    }
};

// ---- threads -------------------------------------------------------------------------------------
struct Pinning {
    std::vector<int> cpus;  // empty: placement "none" (the OS decides)
    static Pinning parse(const std::string& list) {
        Pinning p;
        if (list.empty() || list == "none") return p;
        std::stringstream ss(list);
        std::string item;
        while (std::getline(ss, item, ',')) {
            if (item.empty()) die("malformed --pin list " + list);
            char* end = nullptr;
            long v = std::strtol(item.c_str(), &end, 10);
            if (*end || v < 0) die("malformed --pin list " + list);
            p.cpus.push_back((int)v);
        }
        return p;
    }
    // Thread t runs on cpus[t % n]: the list is the per-thread order computed by tilewise.
    void apply(unsigned t) const {
        if (cpus.empty()) return;
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[t % cpus.size()], &set);
        if (sched_setaffinity(0, sizeof(set), &set) != 0) {
            std::fprintf(stderr, "error: cannot pin thread %u to CPU %d: %s\n", t, cpus[t % cpus.size()], std::strerror(errno));
            std::exit(3);
        }
    }
};

// Run fn(thread_index) on `threads` threads, each pinned first. Thread 0 is a new thread too, so
// the main thread's affinity (the process mask set by the launcher) stays unchanged.
inline void parallel(unsigned threads, const Pinning& pin, const std::function<void(unsigned)>& fn) {
    std::vector<std::thread> ts;
    ts.reserve(threads);
    for (unsigned t = 0; t < threads; ++t)
        ts.emplace_back([&, t] {
            pin.apply(t);
            fn(t);
        });
    for (auto& th : ts) th.join();
}

inline std::pair<uint64_t, uint64_t> chunk(uint64_t n, unsigned threads, unsigned t) {
    uint64_t per = n / threads, rem = n % threads;
    uint64_t lo = t * per + std::min<uint64_t>(t, rem);
    return {lo, lo + per + (t < rem ? 1 : 0)};
}

// A simple test-and-test-and-set spin lock (one byte), as used by fine-grained hash tables.
struct SpinLock {
    std::atomic<uint8_t> v{0};
    void lock() {
        for (;;) {
            if (!v.exchange(1, std::memory_order_acquire)) return;
            while (v.load(std::memory_order_relaxed)) sched_yield();
        }
    }
    void unlock() { v.store(0, std::memory_order_release); }
};

// ---- timing, memory ---------------------------------------------------------------------------
inline double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// Peak resident set of this program. getrusage's ru_maxrss survives execve, so a program started
// from a large parent (a Python launcher forks, then execs us) would report the parent's peak; the
// kernel's VmHWM (/proc/self/status) belongs to this program's own address space. getrusage is the
// fallback where /proc is missing.
inline uint64_t rusage_maxrss_bytes() {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_maxrss * 1024;  // Linux reports KiB
}
inline uint64_t max_rss_bytes() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
    return rusage_maxrss_bytes();
}

// Allocator libraries mapped into this process (so a result shows which allocator really ran).
inline std::vector<std::string> allocator_libs() {
    std::vector<std::string> out;
    std::ifstream f("/proc/self/maps");
    std::string line;
    const char* names[] = {"libjemalloc", "libtcmalloc", "libmimalloc", "libtbbmalloc", "libhoard"};
    while (std::getline(f, line)) {
        auto slash = line.rfind('/');
        if (slash == std::string::npos) continue;
        std::string base = line.substr(slash + 1);
        for (auto n : names)
            if (base.rfind(n, 0) == 0 && std::find(out.begin(), out.end(), base) == out.end()) out.push_back(base);
    }
    return out;
}

// ---- JSON result (one object on stdout) -------------------------------------------------------
struct Json {
    std::vector<std::pair<std::string, std::string>> fields;
    static std::string quote(const std::string& s) {
        std::string o = "\"";
        for (char c : s) {
            if (c == '"' || c == '\\') o += '\\';
            o += c;
        }
        return o + "\"";
    }
    void s(const std::string& k, const std::string& v) { fields.push_back({k, quote(v)}); }
    void u(const std::string& k, uint64_t v) { fields.push_back({k, std::to_string(v)}); }
    void d(const std::string& k, double v) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6f", v);
        fields.push_back({k, buf});
    }
    void b(const std::string& k, bool v) { fields.push_back({k, v ? "true" : "false"}); }
    void raw(const std::string& k, const std::string& v) { fields.push_back({k, v}); }
    void print() const {
        std::string o = "{";
        for (size_t i = 0; i < fields.size(); ++i) o += (i ? ", " : "") + quote(fields[i].first) + ": " + fields[i].second;
        o += "}\n";
        std::fputs(o.c_str(), stdout);
        std::fflush(stdout);
    }
};

inline std::string libs_json() {
    std::string o = "[";
    auto libs = allocator_libs();
    for (size_t i = 0; i < libs.size(); ++i) o += (i ? ", " : "") + Json::quote(libs[i]);
    return o + "]";
}

// Fields every workload reports.
inline void common_fields(Json& j, const std::string& workload, const std::string& dataset, unsigned threads,
                          const Pinning& pin) {
    j.s("workload", workload);
    j.s("dataset", dataset);
    j.u("threads", threads);
    std::string p;
    for (size_t i = 0; i < pin.cpus.size(); ++i) p += (i ? "," : "") + std::to_string(pin.cpus[i]);
    j.s("pinned_cpus", p);
}

inline void finish(Json& j, uint64_t rss = 0) {
    j.u("max_rss_bytes", rss ? rss : max_rss_bytes());
    j.raw("allocator_libs", libs_json());
    j.print();
}

// Before the work: optional pause so a test can read /proc/PID/maps of a running workload.
inline void startup_pause(const Args& a) {
    uint64_t ms = a.u64("sleep-ms", 0);
    if (ms) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// ---- dumping data for reference implementations ---------------------------------------------
inline void dump(const std::string& dir, const std::string& name, const std::vector<uint64_t>& v) {
    if (dir.empty()) return;
    std::string path = dir + "/" + name;
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) die("cannot write " + path + ": " + std::strerror(errno));
    if (!v.empty() && std::fwrite(v.data(), sizeof(uint64_t), v.size(), f) != v.size()) die("short write to " + path);
    std::fclose(f);
}

// ---- aggregation datasets (W1, W2): keys in [0, groups), values in [0, 2^20) ----------------
// moving-cluster: each key comes from a window of `window` keys that slides from 0 to groups-window
//                 over the input (gradual shift of locality, as in streaming data).
// sequential:     `groups` segments of records/groups records each; segment j holds key j (keys
//                 increase incrementally, as in transactional data).
// zipf:           key = rank drawn from Zipf(groups, exponent): rank r (0-based) has weight 1/(r+1)^e.
struct AggData {
    std::vector<uint64_t> keys, vals;
};

inline AggData make_agg(const std::string& dataset, uint64_t n, uint64_t groups, double zipf_e, uint64_t seed,
                        unsigned threads, const Pinning& pin) {
    if (groups == 0) die("--groups must be at least 1");
    AggData d;
    d.keys.resize(n);
    d.vals.resize(n);
    uint64_t window = std::min<uint64_t>(groups, 1024);
    std::vector<double> cdf;
    if (dataset == "zipf") {
        cdf.resize(groups);
        double acc = 0;
        for (uint64_t r = 0; r < groups; ++r) cdf[r] = (acc += 1.0 / std::pow((double)(r + 1), zipf_e));
        for (auto& c : cdf) c /= acc;
    } else if (dataset != "moving-cluster" && dataset != "sequential") {
        die("unknown dataset " + dataset + " (moving-cluster, sequential, zipf)");
    }
    parallel(threads, pin, [&](unsigned t) {
        auto [lo, hi] = chunk(n, threads, t);
        for (uint64_t i = lo; i < hi; ++i) {
            uint64_t r = rnd(seed, 1, i), k;
            if (dataset == "moving-cluster") {
                uint64_t base = n > 1 ? (uint64_t)((unsigned __int128)i * (groups - window) / (n - 1)) : 0;
                k = base + r % window;
            } else if (dataset == "sequential") {
                k = (uint64_t)((unsigned __int128)i * groups / n);
            } else {
                double u = unit(r);
                uint64_t rank = std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin();
                if (rank >= groups) rank = groups - 1;
                k = rank;  // rank 0 is the heaviest hitter
            }
            d.keys[i] = k;
            d.vals[i] = rnd(seed, 2, i) & 0xFFFFF;
        }
    });
    return d;
}

// ---- join datasets (W3, W4): R has `build` unique keys, S has ratio*build foreign keys into R --
struct JoinData {
    std::vector<uint64_t> r_keys, r_pay, s_keys, s_pay;
};

inline JoinData make_join(uint64_t build, uint64_t ratio, uint64_t seed, unsigned threads, const Pinning& pin) {
    if (build == 0) die("--records (build size) must be at least 1");
    JoinData d;
    uint64_t probe = build * ratio;
    d.r_keys.resize(build);
    d.r_pay.resize(build);
    d.s_keys.resize(probe);
    d.s_pay.resize(probe);
    // R keys: 1..build, permuted by a deterministic Fisher-Yates shuffle (serial, cheap next to S).
    for (uint64_t i = 0; i < build; ++i) d.r_keys[i] = i + 1;
    Rng g(seed * 31 + 7);
    for (uint64_t i = build - 1; i > 0; --i) std::swap(d.r_keys[i], d.r_keys[g.next() % (i + 1)]);
    parallel(threads, pin, [&](unsigned t) {
        auto [lo, hi] = chunk(build, threads, t);
        for (uint64_t i = lo; i < hi; ++i) d.r_pay[i] = rnd(seed, 3, i) & 0xFFFFFFFF;
        auto [plo, phi] = chunk(probe, threads, t);
        for (uint64_t i = plo; i < phi; ++i) {
            d.s_keys[i] = 1 + rnd(seed, 4, i) % build;
            d.s_pay[i] = rnd(seed, 5, i) & 0xFFFFFFFF;
        }
    });
    return d;
}

inline unsigned threads_arg(const Args& a) {
    uint64_t t = a.u64("threads", 0);
    if (t == 0) {  // default: the CPUs this process may run on (the launcher's mask)
        cpu_set_t set;
        CPU_ZERO(&set);
        t = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : std::thread::hardware_concurrency();
        if (t == 0) t = 1;
    }
    if (t > 4096) die("--threads is too large");
    return (unsigned)t;
}

// ---- the shared set-up of the aggregation workloads (W1, W2) -----------------------------------
struct AggRun {
    std::string dataset;
    uint64_t n, groups, seed;
    double ze;
    unsigned threads;
    Pinning pin;
    AggData d;
    double gen_s;
};

// Flags, data generation (timed apart) and the dump the tests compare against.
inline AggRun agg_setup(int argc, char** argv) {
    Args a(argc, argv, {"dataset", "records", "groups", "zipf-exponent", "seed", "threads", "pin", "dump", "sleep-ms"});
    AggRun r;
    r.dataset = a.str("dataset", "moving-cluster");
    r.n = a.u64("records", 10000000);
    r.groups = a.u64("groups", 100000);
    r.seed = a.u64("seed", 42);
    r.ze = a.f64("zipf-exponent", 0.5);
    r.threads = threads_arg(a);
    r.pin = Pinning::parse(a.str("pin", ""));
    startup_pause(a);
    double t0 = now_s();
    r.d = make_agg(r.dataset, r.n, r.groups, r.ze, r.seed, r.threads, r.pin);
    r.gen_s = now_s() - t0;
    dump(a.str("dump", ""), "keys.u64", r.d.keys);
    dump(a.str("dump", ""), "vals.u64", r.d.vals);
    return r;
}

inline void agg_fields(Json& j, const std::string& workload, const AggRun& r) {
    common_fields(j, workload, r.dataset, r.threads, r.pin);
    j.u("records", r.n);
    j.u("groups", r.groups);
    if (r.dataset == "zipf") j.d("zipf_exponent", r.ze);
}

// Lock-free linear probing over a power-of-two table whose slots have `std::atomic<uint64_t> key`
// (EMPTY_KEY when free): the index of key k's slot, claiming a free one if k is new.
constexpr uint64_t EMPTY_KEY = ~0ULL;

inline uint64_t table_capacity(uint64_t groups) {
    uint64_t cap = 1;
    while (cap < 2 * groups) cap <<= 1;
    return cap;
}

template <class Slot>
inline uint64_t find_or_insert(std::vector<Slot>& table, uint64_t k) {
    uint64_t mask = table.size() - 1;
    uint64_t h = splitmix64(k) & mask;
    for (;;) {
        uint64_t cur = table[h].key.load(std::memory_order_acquire);
        if (cur == k) return h;
        if (cur == EMPTY_KEY) {
            uint64_t expected = EMPTY_KEY;
            if (table[h].key.compare_exchange_strong(expected, k) || expected == k) return h;
        }
        h = (h + 1) & mask;
    }
}

// ---- the shared set-up of the join workloads (W3, W4) ------------------------------------------
struct JoinRun {
    uint64_t build, ratio, seed;
    unsigned threads;
    Pinning pin;
    JoinData d;
    double gen_s;
};

inline JoinRun join_setup(int argc, char** argv, const std::string& workload) {
    Args a(argc, argv, {"records", "ratio", "seed", "threads", "pin", "dump", "sleep-ms", "dataset"});
    JoinRun r;
    r.build = a.u64("records", 1000000);
    r.ratio = a.u64("ratio", 16);
    r.seed = a.u64("seed", 42);
    if (a.str("dataset", "uniform") != "uniform")
        die(workload + " has one dataset: uniform (foreign keys uniform over R)");
    r.threads = threads_arg(a);
    r.pin = Pinning::parse(a.str("pin", ""));
    startup_pause(a);
    double t0 = now_s();
    r.d = make_join(r.build, r.ratio, r.seed, r.threads, r.pin);
    r.gen_s = now_s() - t0;
    std::string dir = a.str("dump", "");
    dump(dir, "r_keys.u64", r.d.r_keys);
    dump(dir, "r_pay.u64", r.d.r_pay);
    dump(dir, "s_keys.u64", r.d.s_keys);
    dump(dir, "s_pay.u64", r.d.s_pay);
    return r;
}

}  // namespace tw
