// tw_stream: STREAM copy/scale/add/triad in one process of a multi-process run.
//
// One worker thread per CPU of this process's affinity mask, each pinned, each first-touching its
// own chunk of the three arrays (so the memory policy the launcher set decides where pages go).
// Processes of one run meet in a barrier in a shared file (--barrier FILE --nprocs P) before every
// kernel, so all run each kernel at the same time. Output, one line per kernel and repetition:
// "kernel rep start_ns end_ns bytes" (CLOCK_MONOTONIC, comparable across processes), then "ok" if
// the arrays hold the expected values. Bytes count reads + writes as STREAM does.
// Cache-sized arrays take microseconds per kernel, less than the barrier's skew: each timed
// repetition therefore runs the kernel --inner times back to back (default: enough passes for
// about 64 MiB per array, at least 1), as likwid-bench does. No kernel reads its own output, so
// repeating it leaves the values STREAM's check expects.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>

#include "tw_probe_common.hpp"

using namespace tw;

// Plain store loops (vectorised by the compiler). The copy loop is kept from becoming a memcpy call,
// whose non-temporal stores would measure something else than the other three kernels do.
#define TW_KERNEL static void __attribute__((noinline, optimize("no-tree-loop-distribute-patterns")))
TW_KERNEL k_copy(double* __restrict c, const double* __restrict a, size_t lo, size_t hi) {
    for (size_t j = lo; j < hi; ++j) c[j] = a[j];
}
TW_KERNEL k_scale(double* __restrict b, const double* __restrict c, double s, size_t lo, size_t hi) {
    for (size_t j = lo; j < hi; ++j) b[j] = s * c[j];
}
TW_KERNEL k_add(double* __restrict c, const double* __restrict a, const double* __restrict b, size_t lo, size_t hi) {
    for (size_t j = lo; j < hi; ++j) c[j] = a[j] + b[j];
}
TW_KERNEL k_triad(double* __restrict a, const double* __restrict b, const double* __restrict c, double s, size_t lo,
                  size_t hi) {
    for (size_t j = lo; j < hi; ++j) a[j] = b[j] + s * c[j];
}

int main(int argc, char** argv) {
    long elements = 0, ntimes = 10, nprocs = 1, inner = 0;
    std::string barrier_path;
    for (int k = 1; k < argc; ++k) {
        std::string f = argv[k];
        auto val = [&](const char* what) {
            if (k + 1 >= argc) die(std::string("missing value for ") + what);
            return argv[++k];
        };
        if (f == "--elements") elements = parse_long(val("--elements"), "--elements");
        else if (f == "--ntimes") ntimes = parse_long(val("--ntimes"), "--ntimes");
        else if (f == "--nprocs") nprocs = parse_long(val("--nprocs"), "--nprocs");
        else if (f == "--inner") inner = parse_long(val("--inner"), "--inner");
        else if (f == "--barrier") barrier_path = val("--barrier");
        else if (f == "-h" || f == "--help") {
            std::printf("usage: tw_stream --elements N [--ntimes N] [--inner N] [--barrier FILE --nprocs P]\n");
            return 0;
        } else die("unknown argument " + f);
    }
    if (elements < 1) die("--elements must be at least 1");
    if (ntimes < 2) die("--ntimes must be at least 2 (the first repetition is a warm-up)");
    if (nprocs < 1) die("--nprocs must be at least 1");
    if (inner < 0) die("--inner must be at least 1");
    if (nprocs > 1 && barrier_path.empty()) die("--nprocs > 1 needs --barrier FILE");

    SpinBarrier* xproc = nullptr;
    SpinBarrier local_only;
    if (!barrier_path.empty()) {
        int fd = open(barrier_path.c_str(), O_RDWR);
        if (fd < 0) die("cannot open barrier file " + barrier_path + ": " + std::strerror(errno));
        void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (p == MAP_FAILED) die("cannot map barrier file " + barrier_path);
        xproc = static_cast<SpinBarrier*>(p);
    } else {
        xproc = &local_only;
    }

    auto cpus = allowed_cpus();
    const size_t T = cpus.size();
    const size_t n = size_t(elements);
    size_t bytes = n * sizeof(double);
    if (inner == 0) inner = std::max<long>(1, long((64UL << 20) / bytes));
    auto alloc = [&]() {
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) die("cannot allocate " + std::to_string(bytes) + " bytes");
        return static_cast<double*>(p);
    };
    double* __restrict a = alloc();
    double* __restrict b = alloc();
    double* __restrict c = alloc();
    const double scalar = 3.0;
    const char* names[4] = {"copy", "scale", "add", "triad"};
    const size_t kbytes[4] = {2 * bytes, 2 * bytes, 3 * bytes, 3 * bytes};
    std::vector<uint64_t> start(ntimes * 4), end(ntimes * 4);
    SpinBarrier local;

    auto worker = [&](size_t t) {
        pin_self(cpus[t]);
        size_t lo = n * t / T, hi = n * (t + 1) / T;
        for (size_t j = lo; j < hi; ++j) {  // first touch by the thread that will use it
            a[j] = 1.0;
            b[j] = 2.0;
            c[j] = 0.0;
        }
        for (long r = 0; r < ntimes; ++r) {
            for (int k = 0; k < 4; ++k) {
                local.wait(T);
                if (t == 0) xproc->wait(uint32_t(nprocs));
                local.wait(T);
                if (t == 0) start[r * 4 + k] = now_ns();
                for (long i = 0; i < inner; ++i) {
                    switch (k) {
                        case 0: k_copy(c, a, lo, hi); break;
                        case 1: k_scale(b, c, scalar, lo, hi); break;
                        case 2: k_add(c, a, b, lo, hi); break;
                        default: k_triad(a, b, c, scalar, lo, hi); break;
                    }
                }
                local.wait(T);
                if (t == 0) end[r * 4 + k] = now_ns();
            }
        }
    };
    // The main thread only waits, keeping the process's affinity mask as the launcher set it (so
    // /proc/PID/status shows the binding); every worker pins itself to one CPU.
    std::vector<std::thread> threads;
    for (size_t t = 0; t < T; ++t) threads.emplace_back(worker, t);
    for (auto& th : threads) th.join();

    for (long r = 0; r < ntimes; ++r)
        for (int k = 0; k < 4; ++k)
            std::printf("%s %ld %llu %llu %zu\n", names[k], r, (unsigned long long)start[r * 4 + k],
                        (unsigned long long)end[r * 4 + k], kbytes[k] * size_t(inner));
    // STREAM's check: replay the kernels on scalars
    double aj = 1.0, bj = 2.0, cj = 0.0;
    for (long r = 0; r < ntimes; ++r) {
        cj = aj;
        bj = scalar * cj;
        cj = aj + bj;
        aj = bj + scalar * cj;
    }
    bool ok = true;
    for (size_t j = 0; j < n; j += std::max<size_t>(1, n / 1024))
        if (std::fabs(a[j] - aj) > 1e-8 * std::fabs(aj) || std::fabs(b[j] - bj) > 1e-8 * std::fabs(bj) ||
            std::fabs(c[j] - cj) > 1e-8 * std::fabs(cj))
            ok = false;
    std::printf(ok ? "ok %zu\n" : "bad %zu\n", T);
    return ok ? 0 : 3;
}
