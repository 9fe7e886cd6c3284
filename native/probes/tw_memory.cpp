// tw_memory: one cell of the memory matrix (thesis 004, ch. 4 microbenchmarks): this process's CPUs
// (the initiator, bound by the launcher) against the memory of one NUMA node (the target).
//
// The buffer is mmap'ed, bound to the target with mbind(MPOL_BIND, MPOL_MF_STRICT) before any page
// exists, touched by the measuring threads, and then every page's node is asked of the kernel
// (move_pages with no destination) and the buffer's line in /proc/self/numa_maps is read (its policy and
// its page counts per node, N<node>=<pages>: a second, independent view of where the pages are). A page
// anywhere else (or not present, by either view) means the cell is not measured: the tool prints
// "not_measured <reason>" and exits 0, never a figure. The check is repeated after measuring (pages
// can move: memory-tier demotion, NUMA balancing).
//
// Tests (each repetition timed from the first thread's start to the last thread's end):
//   latency    one thread, a dependent-load chase over random cache lines of the whole buffer
//              (a single random cycle, Sattolo): ns per load
//   read_seq   each thread reads its contiguous share of the buffer (vectorised loads): GB/s
//   read_rand  each thread reads whole 64-byte lines at random in its share (independent loads): GB/s
//   write      each thread stores its share (plain vector stores): GB/s of bytes stored
//   write_nt   the same with non-temporal (streaming) stores and a closing sfence: GB/s
// at every thread count of --threads (the first k CPUs of this process's affinity mask, one pinned
// thread each). Output lines:
//   info <key> <value>...                      page size, huge pages, hypervisor
//   placement <when> target=T pages=N on_target=N other=<node:count,...|-> missing=N policy=<numa_maps policy>
//             maps=<node:pages,... as numa_maps counts them|->
//   result <test> <threads> <median> <best> <p10> <p90> <unit> <reps> <passes>
//   values <test> <threads> <every timed repetition>...
//   ok | not_measured <reason>
#include <fcntl.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include <map>
#include <random>
#include <sstream>

#include "tw_probe_common.hpp"

using namespace tw;

namespace {

constexpr size_t kLine = 64;
const char* kTests[] = {"latency", "read_seq", "read_rand", "write", "write_nt"};

[[noreturn]] void not_measured(const std::string& why) {
    std::printf("not_measured %s\n", why.c_str());
    std::fflush(stdout);
    std::exit(0);
}

std::string hypervisor() {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 31))) return "none";
    __cpuid(0x40000000, a, b, c, d);
    char v[13] = {0};
    std::memcpy(v, &b, 4);
    std::memcpy(v + 4, &c, 4);
    std::memcpy(v + 8, &d, 4);
    std::string s;
    for (char ch : v)
        if (ch > ' ' && ch < 127) s += ch;
    return s.empty() ? "unknown" : s;
#else
    return "unknown";
#endif
}

std::string node_counts(const std::map<int, size_t>& m) {
    if (m.empty()) return "-";
    std::string s;
    for (auto& [n, c] : m) s += (s.empty() ? "" : ",") + std::to_string(n) + ":" + std::to_string(c);
    return s;
}

struct Placement {
    size_t pages = 0, on_target = 0, missing = 0;
    std::map<int, size_t> other;
    std::map<int, size_t> maps;  // numa_maps' N<node>=<pages> for the buffer's mapping (4 KiB pages, THP included)
    std::string policy = "?";
    int target = -1;
    bool ok() const { return pages > 0 && on_target == pages; }
    // numa_maps agrees: every page counted on the target, none elsewhere
    bool maps_ok() const { return maps.size() == 1 && maps.count(target) && maps.at(target) == pages; }
    std::string others() const { return node_counts(other); }
};

// Where every 4 KiB page of [buf, buf+bytes) is (move_pages without destinations only reports), and
// the policy numa_maps shows for the mapping.
Placement check_pages(char* buf, size_t bytes, int target) {
    Placement p;
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t n = bytes / page;
    constexpr size_t kBatch = 16384;
    std::vector<void*> addrs(kBatch);
    std::vector<int> status(kBatch);
    for (size_t i = 0; i < n; i += kBatch) {
        size_t k = std::min(kBatch, n - i);
        for (size_t j = 0; j < k; ++j) addrs[j] = buf + (i + j) * page;
        if (move_pages(0, k, addrs.data(), nullptr, status.data(), 0) != 0)
            not_measured(std::string("move_pages failed: ") + std::strerror(errno));
        for (size_t j = 0; j < k; ++j) {
            int s = status[j];
            if (s == target) ++p.on_target;
            else if (s < 0) ++p.missing;
            else ++p.other[s];
        }
    }
    p.pages = n;
    p.target = target;
    char key[32];
    std::snprintf(key, sizeof key, "%lx ", reinterpret_cast<unsigned long>(buf));
    if (FILE* f = std::fopen("/proc/self/numa_maps", "r")) {
        char line[4096];
        while (std::fgets(line, sizeof line, f)) {
            if (std::strncmp(line, key, std::strlen(key)) == 0) {
                std::istringstream in(line + std::strlen(key));
                in >> p.policy;
                std::string tok;
                while (in >> tok) {  // N<node>=<pages>
                    int node;
                    unsigned long long count;
                    char tail;
                    if (std::sscanf(tok.c_str(), "N%d=%llu%c", &node, &count, &tail) == 2) p.maps[node] += count;
                }
                break;
            }
        }
        std::fclose(f);
    }
    return p;
}

void print_placement(const char* when, const Placement& p, int target) {
    std::printf("placement %s target=%d pages=%zu on_target=%zu other=%s missing=%zu policy=%s maps=%s\n", when,
                target, p.pages, p.on_target, p.others().c_str(), p.missing, p.policy.c_str(),
                node_counts(p.maps).c_str());
    std::fflush(stdout);
}

// ---- kernels (noinline, no memset/memcpy substitution: they must do what they say) ------------
#define TW_KERNEL static void __attribute__((noinline, optimize("no-tree-loop-distribute-patterns")))

TW_KERNEL k_read_seq(const uint64_t* __restrict p, size_t n, uint64_t* sink) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        s0 += p[i];
        s1 += p[i + 1];
        s2 += p[i + 2];
        s3 += p[i + 3];
        s4 += p[i + 4];
        s5 += p[i + 5];
        s6 += p[i + 6];
        s7 += p[i + 7];
    }
    *sink += s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
}

// Whole lines at random (64 bytes each), eight independent streams of addresses so loads overlap.
TW_KERNEL k_read_rand(const uint64_t* __restrict p, size_t lines, size_t accesses, uint64_t seed, uint64_t* sink) {
    uint64_t x[8], s = 0;
    for (int k = 0; k < 8; ++k) x[k] = seed * 0x9E3779B97F4A7C15ull + uint64_t(k) * 0xBF58476D1CE4E5B9ull + 1;
    for (size_t a = 0; a + 8 <= accesses; a += 8) {
        for (int k = 0; k < 8; ++k) {
            x[k] ^= x[k] << 13;
            x[k] ^= x[k] >> 7;
            x[k] ^= x[k] << 17;
            size_t line = size_t((unsigned __int128)x[k] * lines >> 64);
            const uint64_t* q = p + line * (kLine / 8);
            s += q[0] + q[1] + q[2] + q[3] + q[4] + q[5] + q[6] + q[7];
        }
    }
    *sink += s;
}

TW_KERNEL k_write(uint64_t* __restrict p, size_t n, uint64_t v) {
    for (size_t i = 0; i < n; ++i) p[i] = v;
}

// Non-temporal stores of the widest kind compiled in; false where this build has none.
static bool __attribute__((noinline)) k_write_nt(uint64_t* __restrict p, size_t n, uint64_t v) {
#if defined(__AVX512F__)
    __m512i x = _mm512_set1_epi64((long long)v);
    for (size_t i = 0; i + 8 <= n; i += 8) _mm512_stream_si512(reinterpret_cast<__m512i*>(p + i), x);
    _mm_sfence();
    return true;
#elif defined(__AVX__)
    __m256i x = _mm256_set1_epi64x((long long)v);
    for (size_t i = 0; i + 4 <= n; i += 4) _mm256_stream_si256(reinterpret_cast<__m256i*>(p + i), x);
    _mm_sfence();
    return true;
#elif defined(__SSE2__)
    __m128i x = _mm_set1_epi64x((long long)v);
    for (size_t i = 0; i + 2 <= n; i += 2) _mm_stream_si128(reinterpret_cast<__m128i*>(p + i), x);
    _mm_sfence();
    return true;
#else
    (void)p, (void)n, (void)v;
    return false;
#endif
}

struct Line {
    Line* next;
    char pad[kLine - sizeof(Line*)];
};

// One random cycle through every line of the buffer (Sattolo's algorithm).
void build_chase(char* buf, size_t bytes, uint64_t seed) {
    const size_t n = bytes / kLine;
    std::vector<uint32_t> perm(n);
    for (size_t i = 0; i < n; ++i) perm[i] = uint32_t(i);
    std::mt19937_64 rng(seed);
    for (size_t i = n - 1; i > 0; --i) {
        size_t j = std::uniform_int_distribution<size_t>(0, i - 1)(rng);
        std::swap(perm[i], perm[j]);
    }
    Line* lines = reinterpret_cast<Line*>(buf);
    for (size_t i = 0; i < n; ++i) lines[i].next = &lines[perm[i]];
}

Line* __attribute__((noinline)) chase(Line* p, size_t loads) {
    for (size_t i = 0; i < loads; i += 8) {
        p = p->next; p = p->next; p = p->next; p = p->next;
        p = p->next; p = p->next; p = p->next; p = p->next;
    }
    return p;
}

struct Stat {
    double median, best, p10, p90;
};

Stat stats(const std::vector<double>& v, bool higher_better) {
    Stat s{percentile(v, 0.5), 0, percentile(v, 0.1), percentile(v, 0.9)};
    s.best = higher_better ? percentile(v, 1.0) : percentile(v, 0.0);
    return s;
}

// every timed repetition (after the warm-up), for the results' raw values
void print_values(const char* test, long threads, const std::vector<double>& v) {
    std::printf("values %s %ld", test, threads);
    for (double x : v) std::printf(" %.4f", x);
    std::printf("\n");
    std::fflush(stdout);
}

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    size_t p = 0;
    while (p <= s.size()) {
        size_t q = s.find(',', p);
        if (q == std::string::npos) q = s.size();
        if (q > p) out.push_back(s.substr(p, q - p));
        p = q + 1;
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    long target = -1, size = 0, reps = 5, seed = 1, misplace = -1;
    double min_ms = 100;
    bool huge = true;
    std::vector<std::string> tests(std::begin(kTests), std::end(kTests));
    std::vector<long> threads;
    for (int k = 1; k < argc; ++k) {
        std::string f = argv[k];
        auto val = [&](const char* what) {
            if (k + 1 >= argc) die(std::string("missing value for ") + what);
            return argv[++k];
        };
        if (f == "--target") target = parse_long(val("--target"), "--target");
        else if (f == "--size") size = parse_long(val("--size"), "--size");
        else if (f == "--reps") reps = parse_long(val("--reps"), "--reps");
        else if (f == "--seed") seed = parse_long(val("--seed"), "--seed");
        else if (f == "--misplace") misplace = parse_long(val("--misplace"), "--misplace");
        else if (f == "--min-ms") {
            char* end = nullptr;
            const char* v = val("--min-ms");
            min_ms = std::strtod(v, &end);
            if (!end || *end || !(min_ms > 0 && min_ms < 1e6)) die(std::string("bad value for --min-ms: ") + v);
        } else if (f == "--hugepages") huge = parse_long(val("--hugepages"), "--hugepages") != 0;
        else if (f == "--tests") {
            tests = split(val("--tests"));
            for (auto& t : tests)
                if (std::find(std::begin(kTests), std::end(kTests), t) == std::end(kTests)) die("unknown test " + t);
        } else if (f == "--threads") {
            threads.clear();
            for (auto& t : split(val("--threads"))) threads.push_back(parse_long(t.c_str(), "--threads"));
        } else if (f == "-h" || f == "--help") {
            std::printf("usage: tw_memory --target NODE --size BYTES [--threads 1,2,...] [--tests %s]\n"
                        "                 [--reps N] [--min-ms MS] [--hugepages 0|1] [--seed N]\n"
                        "                 [--misplace NODE: test hook, binds the buffer to NODE instead]\n",
                        "latency,read_seq,read_rand,write,write_nt");
            return 0;
        } else die("unknown argument " + f);
    }
    if (target < 0) die("--target NODE is required");
    if (size < long(1 << 20)) die("--size must be at least 1 MiB");
    if (reps < 2) die("--reps must be at least 2 (the first repetition is a warm-up)");
    auto cpus = allowed_cpus();
    if (threads.empty()) threads.push_back(long(cpus.size()));
    for (long t : threads)
        if (t < 1 || size_t(t) > cpus.size())
            die("--threads " + std::to_string(t) + ": this process may use " + std::to_string(cpus.size()) + " CPUs");
    if (numa_available() < 0) not_measured("this kernel has no NUMA support (numa_available failed)");
    if (target > numa_max_node()) not_measured("node " + std::to_string(target) + " does not exist here");
    // test hook: bind the buffer to another node than the target, so the page check must refuse the cell
    const long bind_node = misplace >= 0 ? misplace : target;
    if (bind_node > numa_max_node()) die("--misplace " + std::to_string(bind_node) + ": no such node");

    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    const size_t huge_page = 2u << 20;
    size_t bytes = (size_t(size) + huge_page - 1) / huge_page * huge_page;
    // over-allocate to align to a huge page, so THP can back the whole buffer
    size_t map_bytes = bytes + huge_page;
    char* map = static_cast<char*>(mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (map == MAP_FAILED) die("cannot map " + std::to_string(map_bytes) + " bytes: " + std::strerror(errno));
    char* buf = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(map) + huge_page - 1) & ~(uintptr_t(huge_page) - 1));
    if (huge && madvise(buf, bytes, MADV_HUGEPAGE) != 0) huge = false;
    if (!huge) madvise(buf, bytes, MADV_NOHUGEPAGE);
    {
        std::vector<unsigned long> mask(size_t(bind_node) / (8 * sizeof(unsigned long)) + 1, 0);
        mask[size_t(bind_node) / (8 * sizeof(unsigned long))] |= 1ul << (size_t(bind_node) % (8 * sizeof(unsigned long)));
        if (mbind(buf, bytes, MPOL_BIND, mask.data(), mask.size() * 8 * sizeof(unsigned long) + 1, MPOL_MF_STRICT) != 0)
            not_measured("mbind(MPOL_BIND) to node " + std::to_string(target) + " failed: " + std::strerror(errno));
    }
    std::printf("info page_bytes %zu\ninfo hugepages %s\ninfo hypervisor %s\ninfo buffer_bytes %zu\n", page,
                huge ? "madvise" : "off", hypervisor().c_str(), bytes);

    // first touch by the measuring threads (all of them), each its share
    const size_t maxt = size_t(*std::max_element(threads.begin(), threads.end()));
    {
        std::vector<std::thread> ts;
        for (size_t t = 0; t < maxt; ++t)
            ts.emplace_back([&, t] {
                pin_self(cpus[t]);
                size_t lo = bytes * t / maxt / page * page, hi = bytes * (t + 1) / maxt / page * page;
                if (t + 1 == maxt) hi = bytes;
                std::memset(buf + lo, 1, hi - lo);
            });
        for (auto& th : ts) th.join();
    }
    Placement before = check_pages(buf, bytes, int(target));
    print_placement("before", before, int(target));
    if (!before.ok()) {
        std::ostringstream why;
        why << before.pages - before.on_target << " of " << before.pages << " pages are not on node " << target
            << " (elsewhere: " << before.others() << ", not present: " << before.missing << ")";
        not_measured(why.str());
    }
    if (!before.maps_ok())
        not_measured("/proc/self/numa_maps counts the buffer's pages as " + node_counts(before.maps) + ", not all " +
                     std::to_string(before.pages) + " on node " + std::to_string(target));

    uint64_t sink = 0;
    const size_t words = bytes / 8;
    for (const auto& test : tests) {
        if (test == "latency") {
            build_chase(buf, bytes, uint64_t(seed));
            pin_self(cpus[0]);
            Line* p = reinterpret_cast<Line*>(buf);
            // calibrate: loads per repetition for about min_ms
            size_t loads = 1 << 16;
            for (;;) {
                uint64_t t0 = now_ns();
                p = chase(p, loads);
                double ms = (now_ns() - t0) / 1e6;
                if (ms >= min_ms / 4 || loads >= (size_t(1) << 34)) {
                    loads = std::max<size_t>(8, size_t(double(loads) * min_ms / std::max(ms, 1e-3)) / 8 * 8);
                    break;
                }
                loads *= 4;
            }
            std::vector<double> v;
            for (long r = 0; r < reps; ++r) {
                uint64_t t0 = now_ns();
                p = chase(p, loads);
                double ns = double(now_ns() - t0) / double(loads);
                if (r > 0) v.push_back(ns);
            }
            sink += reinterpret_cast<uintptr_t>(p);
            Stat s = stats(v, false);
            std::printf("result latency 1 %.3f %.3f %.3f %.3f ns %zu %zu\n", s.median, s.best, s.p10, s.p90, v.size(), loads);
            print_values("latency", 1, v);
            // the allowed mask back for the threads to come
            cpu_set_t set;
            CPU_ZERO(&set);
            for (int c : cpus) CPU_SET(c, &set);
            sched_setaffinity(0, sizeof(set), &set);
            continue;
        }
        if (test == "write_nt") {
            uint64_t probe = 0;
            if (!k_write_nt(&probe, 0, 0)) {
                std::printf("result write_nt 0 nan nan nan nan GB/s 0 0\n");
                continue;
            }
        }
        for (long T : threads) {
            double moved = 0;  // bytes one pass of all threads moves
            auto run_once = [&](size_t passes) -> double {  // seconds from first start to last end
                std::vector<uint64_t> start(T), end(T), sinks(T, 0), bytes_of(T, 0);
                SpinBarrier bar;
                std::vector<std::thread> ts;
                for (long t = 0; t < T; ++t)
                    ts.emplace_back([&, t] {
                        pin_self(cpus[t]);
                        size_t lo = words * t / T / 8 * 8, hi = words * (t + 1) / T / 8 * 8;
                        uint64_t* q = reinterpret_cast<uint64_t*>(buf) + lo;
                        size_t n = hi - lo;
                        size_t lines = n * 8 / kLine, accesses = lines / 8 * 8;
                        bytes_of[t] = test == "read_rand" ? accesses * kLine : n * 8;
                        bar.wait(uint32_t(T));
                        start[t] = now_ns();
                        for (size_t k = 0; k < passes; ++k) {
                            if (test == "read_seq") k_read_seq(q, n, &sinks[t]);
                            else if (test == "read_rand") k_read_rand(q, lines, accesses, uint64_t(seed) + t * 131 + k, &sinks[t]);
                            else if (test == "write") k_write(q, n, k + 1);
                            else k_write_nt(q, n, k + 1);
                        }
                        end[t] = now_ns();
                    });
                for (auto& th : ts) th.join();
                for (auto x : sinks) sink += x;
                moved = 0;
                for (auto x : bytes_of) moved += double(x);
                uint64_t s0 = *std::min_element(start.begin(), start.end());
                uint64_t e1 = *std::max_element(end.begin(), end.end());
                return double(std::max<uint64_t>(e1 - s0, 1)) / 1e9;
            };
            double one = run_once(1);  // also the warm-up
            size_t passes = std::max<size_t>(1, size_t(min_ms / 1e3 / std::max(one, 1e-6) + 0.5));
            std::vector<double> v;
            for (long r = 1; r < reps; ++r) {
                double sec = run_once(passes);
                v.push_back(moved * double(passes) / sec / 1e9);
            }
            Stat s = stats(v, true);
            std::printf("result %s %ld %.4f %.4f %.4f %.4f GB/s %zu %zu\n", test.c_str(), T, s.median, s.best, s.p10,
                        s.p90, v.size(), passes);
            print_values(test.c_str(), T, v);
        }
    }
    Placement after = check_pages(buf, bytes, int(target));
    print_placement("after", after, int(target));
    if (!after.ok()) {
        std::ostringstream why;
        why << "pages moved while measuring: " << after.pages - after.on_target << " of " << after.pages
            << " are no longer on node " << target << " (elsewhere: " << after.others() << ")";
        not_measured(why.str());
    }
    if (!after.maps_ok())
        not_measured("pages moved while measuring: /proc/self/numa_maps counts them as " + node_counts(after.maps) +
                     ", not all " + std::to_string(after.pages) + " on node " + std::to_string(target));
    std::printf("ok %llu\n", (unsigned long long)(sink & 1));
    munmap(map, map_bytes);
    return 0;
}
