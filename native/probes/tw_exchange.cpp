// tw_exchange: what moving a batch from one process to another costs, per transport.
//
// Two processes (the sender is this one, the receiver a forked child), C channels, each a pair of
// threads pinned to a sender CPU and a receiver CPU. A message of SIZE bytes is a length-prefixed
// frame; the receiver reads every byte of it once (a checksum: what an operator consuming the batch
// does at least), so every transport is charged the same work at the far end.
//
// Transports:
//   shm   a ring buffer per channel in a memfd (anonymous shared memory: no file in /dev/shm, so a
//         small /dev/shm does not limit it and nothing is left when both processes are gone), its
//         pages bound (mbind MPOL_BIND) to the receiver's NUMA node before anyone touches them.
//         The ring is bounded (--ring bytes per channel, however large the message): the sender
//         copies a frame in as space frees (back-pressure), publishing it in pieces of --publish
//         bytes (64 KiB) so that the receiver reads one piece while the next is copied in; the
//         receiver reads in place and releases: one copy per hop. Waiting spins, then sleeps on a futex.
//   unix  a Unix stream socket pair per channel.
//   tcp   a loopback TCP connection per channel (TCP_NODELAY).
//
// Modes:
//   throughput  each channel sends M messages back to back; the receiver acknowledges the last;
//               GB/s = C * M * SIZE / (time from the common start to the last acknowledgement).
//   latency     channel 0 only: a message of SIZE, a reply of 8 bytes; round trips timed one by one
//               (median and p99 over M).
//   memcpy      no transport: one thread on the receiver CPU copies SIZE bytes between two buffers on
//               its node, the reference a one-copy transport is compared with.
//
// Output: one JSON object on stdout, e.g.
//   {"transport":"shm","mode":"throughput","size":1048576,"channels":1,"messages":256,"seconds":0.05,
//    "gbs":5.3,"ring_bytes":8388608,"ring_node":0,"ring_pages":{"0":2048},"checksum_ok":true}
#include "tw_probe_common.hpp"

#include <arpa/inet.h>
#include <csignal>
#include <functional>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace tw;

namespace {

constexpr size_t HEADER = 4096;
size_t PUBLISH = 64 << 10;  // --publish: the most bytes the sender copies before the receiver may read them
constexpr uint64_t ACK = 0x61636b2d74776973ull;  // the acknowledgement's 8 bytes

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val) {
    return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, nullptr, nullptr, 0);
}

// ---- the shared-memory ring ------------------------------------------------------------------

struct alignas(64) RingHead {
    std::atomic<uint64_t> head{0};  // bytes written (sender)
    char pad0[56];
    std::atomic<uint64_t> tail{0};  // bytes released (receiver)
    char pad1[56];
    std::atomic<uint32_t> data_seq{0};   // bumped after head moves; the receiver sleeps on it
    std::atomic<uint32_t> space_seq{0};  // bumped after tail moves; the sender sleeps on it
    std::atomic<uint32_t> reader_sleeping{0};
    std::atomic<uint32_t> writer_sleeping{0};
};

struct Ring {
    RingHead* h = nullptr;
    uint8_t* data = nullptr;
    size_t cap = 0;
};

void wait_until(const std::function<bool()>& ready, std::atomic<uint32_t>& seq, std::atomic<uint32_t>& sleeping) {
    for (int i = 0; i < 4000; ++i) {
        if (ready()) return;
        cpu_relax();
    }
    while (!ready()) {
        sleeping.store(1);
        uint32_t s = seq.load();
        if (ready()) {
            sleeping.store(0);
            return;
        }
        futex(&seq, FUTEX_WAIT, s);
        sleeping.store(0);
    }
}

void bump(std::atomic<uint32_t>& seq, std::atomic<uint32_t>& sleeping) {
    seq.fetch_add(1);
    if (sleeping.load()) futex(&seq, FUTEX_WAKE, 1);
}

// Sender: append n bytes (copied in as space frees; a frame may be larger than the ring).
void ring_write(Ring& r, const uint8_t* src, size_t n) {
    while (n) {
        uint64_t head = r.h->head.load(std::memory_order_relaxed);
        wait_until([&] { return head - r.h->tail.load(std::memory_order_acquire) < r.cap; }, r.h->space_seq,
                   r.h->writer_sleeping);
        uint64_t free_bytes = r.cap - (head - r.h->tail.load(std::memory_order_acquire));
        size_t pos = head % r.cap;
        // published in pieces of at most PUBLISH bytes, so the receiver reads one piece while the
        // sender copies the next (the two cores work side by side, not one after the other)
        size_t chunk = std::min<size_t>({n, size_t(free_bytes), r.cap - pos, PUBLISH});
        std::memcpy(r.data + pos, src, chunk);
        r.h->head.store(head + chunk, std::memory_order_release);
        bump(r.h->data_seq, r.h->reader_sleeping);
        src += chunk;
        n -= chunk;
    }
}

// Receiver: consume n bytes in place; sum is the checksum of their 8-byte words (n a multiple of 8).
void ring_read(Ring& r, size_t n, uint64_t& sum, uint8_t* copy_to = nullptr) {
    while (n) {
        uint64_t tail = r.h->tail.load(std::memory_order_relaxed);
        wait_until([&] { return r.h->head.load(std::memory_order_acquire) != tail; }, r.h->data_seq,
                   r.h->reader_sleeping);
        uint64_t avail = r.h->head.load(std::memory_order_acquire) - tail;
        size_t pos = tail % r.cap;
        // every frame is a multiple of 8 bytes and the ring a multiple of a page: chunks stay aligned
        size_t chunk = std::min<size_t>({n, size_t(avail), r.cap - pos});
        const uint64_t* w = reinterpret_cast<const uint64_t*>(r.data + pos);
        for (size_t i = 0; i < chunk / 8; ++i) sum += w[i];
        if (copy_to) {
            std::memcpy(copy_to, r.data + pos, chunk);
            copy_to += chunk;
        }
        r.h->tail.store(tail + chunk, std::memory_order_release);
        bump(r.h->space_seq, r.h->writer_sleeping);
        n -= chunk;
    }
}

Ring make_ring(size_t cap, int node) {
    int fd = memfd_create("tilewise-exchange", MFD_CLOEXEC);
    if (fd < 0) die(std::string("memfd_create: ") + std::strerror(errno));
    if (ftruncate(fd, off_t(HEADER + cap)) != 0) die(std::string("ftruncate: ") + std::strerror(errno));
    void* p = mmap(nullptr, HEADER + cap, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) die(std::string("mmap: ") + std::strerror(errno));
    close(fd);  // the mapping keeps the memory; nothing named remains anywhere
    if (node >= 0) {
        unsigned long mask[16] = {0};
        if (node >= int(sizeof(mask) * 8)) die("node number too large");
        mask[node / 64] = 1ul << (node % 64);
        // the shared object's policy: pages land on `node` whoever faults them in
        if (syscall(SYS_mbind, p, HEADER + cap, MPOL_BIND, mask, sizeof(mask) * 8, 0) != 0)
            die(std::string("mbind to node ") + std::to_string(node) + ": " + std::strerror(errno));
    }
    Ring r;
    r.h = new (p) RingHead();
    r.data = static_cast<uint8_t*>(p) + HEADER;
    r.cap = cap;
    return r;
}

// pages of the ring per NUMA node (move_pages without moving: where each page is)
std::string ring_pages(const Ring& r) {
    long page = sysconf(_SC_PAGESIZE);
    size_t n = r.cap / size_t(page);
    std::vector<void*> pages(n);
    std::vector<int> status(n, -1);
    for (size_t i = 0; i < n; ++i) pages[i] = r.data + i * size_t(page);
    if (syscall(SYS_move_pages, 0, n, pages.data(), nullptr, status.data(), 0) != 0) return "{}";
    std::vector<std::pair<int, long>> count;
    for (int s : status) {
        auto it = std::find_if(count.begin(), count.end(), [&](auto& kv) { return kv.first == s; });
        if (it == count.end()) count.emplace_back(s, 1);
        else it->second++;
    }
    std::string out = "{";
    for (size_t i = 0; i < count.size(); ++i)
        out += (i ? "," : "") + std::string("\"") + std::to_string(count[i].first) + "\":" + std::to_string(count[i].second);
    return out + "}";
}

// ---- sockets ---------------------------------------------------------------------------------

void send_all(int fd, const uint8_t* p, size_t n) {
    while (n) {
        ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            die(std::string("send: ") + std::strerror(errno));
        }
        p += k;
        n -= size_t(k);
    }
}

void recv_sum(int fd, size_t n, uint64_t& sum, std::vector<uint8_t>& buf, uint8_t* copy_to = nullptr) {
    // a stream delivers any number of bytes at a time: the words are summed as they complete
    size_t have = 0;  // bytes at the front of buf not yet summed (fewer than 8)
    while (n) {
        size_t want = std::min(n, buf.size() - have);
        ssize_t k = ::recv(fd, buf.data() + have, want, 0);
        if (k <= 0) {
            if (k < 0 && errno == EINTR) continue;
            die(k == 0 ? "the peer closed the connection" : std::string("recv: ") + std::strerror(errno));
        }
        size_t got = size_t(k);
        if (copy_to) {
            std::memcpy(copy_to, buf.data() + have, got);
            copy_to += got;
        }
        n -= got;
        have += got;
        size_t words = have / 8;
        const uint64_t* w = reinterpret_cast<const uint64_t*>(buf.data());
        for (size_t i = 0; i < words; ++i) sum += w[i];
        size_t rest = have - words * 8;
        std::memmove(buf.data(), buf.data() + words * 8, rest);
        have = rest;
    }
}


void nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// ---- one channel's two ends, whatever the transport -------------------------------------------

struct Channel {
    std::string transport;
    Ring fwd, back;  // shm: sender -> receiver, receiver -> sender
    int sfd = -1, rfd = -1;  // sockets: the sender's end, the receiver's end
    std::vector<uint8_t> sbuf, rbuf;

    void send(const uint8_t* p, size_t n) {
        if (transport == "shm") ring_write(fwd, p, n);
        else send_all(sfd, p, n);
    }
    void receive(size_t n, uint64_t& sum, uint8_t* copy_to = nullptr) {
        if (transport == "shm") ring_read(fwd, n, sum, copy_to);
        else recv_sum(rfd, n, sum, rbuf, copy_to);
    }
    void reply(uint64_t v) {
        if (transport == "shm") ring_write(back, reinterpret_cast<uint8_t*>(&v), 8);
        else send_all(rfd, reinterpret_cast<uint8_t*>(&v), 8);
    }
    uint64_t await_reply() {
        uint64_t v = 0;
        uint8_t b[8];
        if (transport == "shm") ring_read(back, 8, v, b);
        else recv_sum(sfd, 8, v, sbuf, b);
        uint64_t got;
        std::memcpy(&got, b, 8);
        return got;
    }
};

struct Control {  // shared by both processes (anonymous MAP_SHARED, before the fork)
    std::atomic<int> ready{0};
    std::atomic<int> go{0};
    std::atomic<int> bad{0};
    char pages[4096];
};

std::vector<int> parse_cpus(const char* s) {
    std::vector<int> out;
    std::string t = s;
    size_t i = 0;
    while (i < t.size()) {
        size_t j = t.find(',', i);
        if (j == std::string::npos) j = t.size();
        out.push_back(std::atoi(t.substr(i, j - i).c_str()));
        i = j + 1;
    }
    if (out.empty()) die("empty CPU list");
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    std::string transport = "shm", mode = "throughput";
    long size = 1 << 20, channels = 1, messages = 64, ring = 8 << 20, node = -1;
    std::vector<int> scpus{0}, rcpus{0};
    for (int k = 1; k < argc; ++k) {
        std::string f = argv[k];
        auto val = [&](const char* what) {
            if (k + 1 >= argc) die(std::string("missing value for ") + what);
            return argv[++k];
        };
        if (f == "--transport") transport = val("--transport");
        else if (f == "--mode") mode = val("--mode");
        else if (f == "--size") size = std::atol(val("--size"));
        else if (f == "--channels") channels = std::atol(val("--channels"));
        else if (f == "--messages") messages = std::atol(val("--messages"));
        else if (f == "--ring") ring = std::atol(val("--ring"));
        else if (f == "--ring-node") node = std::atol(val("--ring-node"));
        else if (f == "--publish") PUBLISH = size_t(std::atol(val("--publish")));
        else if (f == "--sender-cpus") scpus = parse_cpus(val("--sender-cpus"));
        else if (f == "--receiver-cpus") rcpus = parse_cpus(val("--receiver-cpus"));
        else die("unknown argument " + f);
    }
    if (size < 8 || size % 8) die("--size must be a positive multiple of 8");
    if (channels < 1 || messages < 1 || ring < 4096 || ring % 4096) die("bad --channels, --messages or --ring");
    if (PUBLISH < 8 || PUBLISH % 8) die("--publish must be a positive multiple of 8");
    if (transport != "shm" && transport != "unix" && transport != "tcp" && transport != "memcpy")
        die("unknown transport " + transport);
    if (mode == "latency") channels = 1;

    if (transport == "memcpy") {  // the one-copy reference, on the receiver CPU and its node
        pin_self(rcpus[0]);
        NodeBuffer a(size_t(size), rcpus[0]), b(size_t(size), rcpus[0]);
        std::memset(a.ptr, 1, size_t(size));
        std::vector<double> gbs;
        for (long m = 0; m < std::max(messages, 3L); ++m) {
            uint64_t t0 = now_ns();
            std::memcpy(b.ptr, a.ptr, size_t(size));
            uint64_t t1 = now_ns();
            if (m) gbs.push_back(double(size) / double(std::max<uint64_t>(t1 - t0, 1)));
        }
        std::sort(gbs.begin(), gbs.end());
        std::printf("{\"transport\":\"memcpy\",\"mode\":\"throughput\",\"size\":%ld,\"channels\":1,\"messages\":%zu,"
                    "\"gbs\":%.4f,\"node\":%d}\n", size, gbs.size(), gbs[gbs.size() / 2], a.node);
        return 0;
    }

    auto* ctl = static_cast<Control*>(mmap(nullptr, sizeof(Control), PROT_READ | PROT_WRITE,
                                           MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (ctl == MAP_FAILED) die("mmap of the control block failed");
    new (ctl) Control();
    std::vector<Channel> ch(static_cast<size_t>(channels));
    int listener = -1;
    sockaddr_in addr{};
    for (auto& c : ch) {
        c.transport = transport;
        c.sbuf.resize(1 << 20);
        c.rbuf.resize(1 << 20);
        if (transport == "shm") {
            c.fwd = make_ring(size_t(ring), int(node));
            c.back = make_ring(4096, -1);
        } else if (transport == "unix") {
            int sv[2];
            if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) die("socketpair failed");
            c.sfd = sv[0];
            c.rfd = sv[1];
        }
    }
    if (transport == "tcp") {
        listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof(addr);
        if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(listener, int(channels)) != 0 ||
            getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
            die(std::string("loopback TCP: ") + std::strerror(errno));
        for (auto& c : ch) {  // connect all, then accept all: the receiver's ends, in order
            c.sfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (connect(c.sfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
                die(std::string("connect: ") + std::strerror(errno));
            c.rfd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
            if (c.rfd < 0) die(std::string("accept: ") + std::strerror(errno));
            nodelay(c.sfd);
            nodelay(c.rfd);
        }
        close(listener);
    }

    std::vector<uint64_t> msg(size_t(size) / 8);
    for (size_t i = 0; i < msg.size(); ++i) msg[i] = i * 2654435761ull;
    uint64_t msg_sum = 0;
    for (uint64_t w : msg) msg_sum += w;

    pid_t child = fork();
    if (child < 0) die("fork failed");
    if (child == 0) {  // the receiver: dies with the sender
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1) _exit(1);
        std::vector<std::thread> ts;
        for (long i = 0; i < channels; ++i) {
            ts.emplace_back([&, i] {
                pin_self(rcpus[size_t(i) % rcpus.size()]);
                Channel& c = ch[size_t(i)];
                ctl->ready.fetch_add(1);
                while (!ctl->go.load()) cpu_relax();
                for (long m = 0; m < messages; ++m) {
                    uint64_t sum = 0;
                    c.receive(size_t(size), sum);
                    if (sum != msg_sum) ctl->bad.store(1);
                    if (mode == "latency" || m == messages - 1) c.reply(ACK);
                }
            });
        }
        for (auto& t : ts) t.join();
        if (transport == "shm") {
            std::string p = ring_pages(ch[0].fwd);
            std::snprintf(ctl->pages, sizeof(ctl->pages), "%s", p.c_str());
        }
        _exit(0);
    }
    std::vector<std::vector<double>> lat(static_cast<size_t>(channels));
    std::vector<std::thread> ts;
    std::atomic<int> ready{0};
    uint64_t t_start = 0;
    for (long i = 0; i < channels; ++i) {
        ts.emplace_back([&, i] {
            pin_self(scpus[size_t(i) % scpus.size()]);
            Channel& c = ch[size_t(i)];
            ready.fetch_add(1);
            while (!ctl->go.load()) cpu_relax();
            const uint8_t* p = reinterpret_cast<const uint8_t*>(msg.data());
            for (long m = 0; m < messages; ++m) {
                uint64_t t0 = now_ns();
                c.send(p, size_t(size));
                if (mode == "latency") {
                    if (c.await_reply() != ACK) ctl->bad.store(1);
                    lat[size_t(i)].push_back(double(now_ns() - t0) / 1e3);
                }
            }
            if (mode != "latency" && c.await_reply() != ACK) ctl->bad.store(1);
        });
    }
    while (ctl->ready.load() < channels || ready.load() < channels) std::this_thread::sleep_for(std::chrono::microseconds(50));
    t_start = now_ns();
    ctl->go.store(1);
    for (auto& t : ts) t.join();
    uint64_t t_end = now_ns();
    int status = 0;
    waitpid(child, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) die("the receiver process failed");
    double secs = double(t_end - t_start) / 1e9;
    std::printf("{\"transport\":\"%s\",\"mode\":\"%s\",\"size\":%ld,\"channels\":%ld,\"messages\":%ld,\"seconds\":%.6f",
                transport.c_str(), mode.c_str(), size, channels, messages, secs);
    if (mode == "latency") {
        auto& v = lat[0];
        std::sort(v.begin(), v.end());
        std::printf(",\"latency_us_median\":%.3f,\"latency_us_p99\":%.3f", v[v.size() / 2],
                    v[std::min(v.size() - 1, size_t(double(v.size()) * 0.99))]);
    } else {
        std::printf(",\"gbs\":%.4f", double(channels) * double(messages) * double(size) / (secs * 1e9));
    }
    if (transport == "shm")
        std::printf(",\"ring_bytes\":%ld,\"ring_node\":%ld,\"ring_pages\":%s", ring, node, ctl->pages[0] ? ctl->pages : "{}");
    std::printf(",\"checksum_ok\":%s}\n", ctl->bad.load() ? "false" : "true");
    return ctl->bad.load() ? 1 : 0;
}
