// qola_jit_usage.cpp — recorded usage and the coverage contract (docs/usage.md).
//
// Recording (opt-in: QOLA_USAGE_DIR or <ns>_qola_usage_configure): each unit a process resolves
// adds one line to the process's own file <dir>/qola-usage-<host>-<pid>-<random>.rec, created with
// O_EXCL and written with O_APPEND, one write() per line of at most 1 KiB. One writer per file is
// what makes it safe on a network file system too (NFS does not make O_APPEND atomic across
// clients); threads of the process share the file under a mutex, and a forked child opens its own.
// A line ends with the first 16 hex digits of the sha256 of what precedes it, so a torn line (a
// process killed mid-write, a full disk) is recognised and skipped by `qola usage`. A file stops
// growing at 1 MiB. Records are written only at resolution (once per unit per process), never on
// the call path: a stub's steady state stays one atomic load and an indirect call.
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fcntl.h>
#include <mutex>
#include <pthread.h>
#include <set>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

#pragma GCC visibility push(hidden)
#include "qola_jit_internal.h"

// ---------------------------------------------------------------- settings (C API)
// Weak and called through the PLT, like the error state: every copy of the runtime in a process
// sees the settings of the copy the loader picked.
namespace {
std::atomic<const char*> g_settings[2] = {{nullptr}, {nullptr}};
} // namespace

QOLA_C_API __attribute__((weak, noinline)) const char* QOLA_C_NAME(qola_usage_setting_)(int which)
{
    return which == 0 || which == 1 ? g_settings[which].load(std::memory_order_acquire) : nullptr;
}

QOLA_C_API __attribute__((weak, noinline)) int QOLA_C_NAME(qola_usage_configure)(const char* record_dir,
                                                                                 const char* coverage)
{
    if(coverage && strcmp(coverage, "strict") != 0 && strcmp(coverage, "report") != 0 && strcmp(coverage, "off") != 0 &&
       coverage[0] != '\0')
        return -1;
    // the strings live as long as the process (a stub may run during exit); a few bytes per call
    if(record_dir) g_settings[0].store(strdup(record_dir), std::memory_order_release);
    if(coverage) g_settings[1].store(strdup(coverage), std::memory_order_release);
    return 0;
}

QOLA_NS_BEGIN
namespace jit {
namespace usage {
namespace {
using namespace sys;

std::string setting(int which, const char* env_name)
{
    const char* v = QOLA_C_NAME(qola_usage_setting_)(which);
    return v ? std::string(v) : env(env_name);
}

struct Writer {
    std::mutex mu;
    int fd = -1;
    pid_t pid = 0; // the process that opened fd (a forked child opens its own file)
    std::string dir; // the dir fd's file lies in
    uint64_t size = 0;
    bool full = false; // k_usage_max_file reached, or the file could not be created
    std::set<std::pair<const void*, std::string>> seen; // (entry, event) recorded by this process
};
void fork_prepare();
void fork_release();
Writer& W()
{
    static Writer* w = [] {
        Writer* made = new Writer; // never destroyed: stubs may run during exit
        // a fork while another thread records must not leave the child's copy of the mutex held
        pthread_atfork(fork_prepare, fork_release, fork_release);
        return made;
    }();
    return *w;
}
void fork_prepare() { W().mu.lock(); }
void fork_release() { W().mu.unlock(); }

std::string host_name()
{
    char buf[256] = {0};
    if(gethostname(buf, sizeof buf - 1) != 0) return "host";
    std::string h;
    for(const char* p = buf; *p && h.size() < 64; ++p)
        h += (isalnum(static_cast<unsigned char>(*p)) || *p == '.' || *p == '-') ? *p : '_';
    return h.empty() ? "host" : h;
}

bool clean_field(const char* s)
{
    for(; *s; ++s)
        if(*s == '\t' || *s == '\n' || *s == '\r') return false;
    return true;
}

// Open this process's record file in `dir` (created 0644 with O_EXCL: never someone else's file).
int open_record_file(const std::string& dir, const std::string& host)
{
    std::string err;
    if(!make_dirs(dir, 0755, &err)) {
        store::say("usage: " + err);
        return -1;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for(int attempt = 0; attempt < 8; ++attempt) {
        std::string seed = host + " " + std::to_string(getpid()) + " " + std::to_string(ts.tv_sec) + " " +
                           std::to_string(ts.tv_nsec) + " " + std::to_string(attempt) + " " +
                           std::to_string(reinterpret_cast<uintptr_t>(&err));
        std::string name = std::string(fmt::k_usage_prefix) + host + "-" + std::to_string(getpid()) + "-" +
                           sha256_hex(seed).substr(0, 8) + fmt::k_usage_suffix;
        int fd = open(fmt::in(dir, name).c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_NOFOLLOW | O_CLOEXEC,
                      fmt::k_file_mode);
        if(fd >= 0) return fd;
        if(errno != EEXIST) {
            store::say("usage: cannot create a record file in " + dir + ": " + errno_text(errno));
            return -1;
        }
    }
    return -1;
}
} // namespace

Coverage coverage()
{
    std::string v = setting(1, fmt::k_env_coverage);
    if(v.empty() || v == "off" || v == "0") return Coverage::off;
    if(v == "report") return Coverage::report;
    if(v != "strict") {
        static std::atomic<bool> said{false};
        if(!said.exchange(true))
            fprintf(stderr, "qola-jit: %s=%s is not strict, report or off: taking it as strict\n", fmt::k_env_coverage,
                    v.c_str());
    }
    return Coverage::strict;
}

std::string manifest_line(const qola_jit_module& m, const qola_jit_entry& e)
{
    const char* mod = m.manifest_name && m.manifest_name[0] ? m.manifest_name : m.name;
    return std::string("{ module = \"") + mod + "\", name = \"" + e.name + "\" },";
}

void record(const qola_jit_module& m, const qola_jit_entry& e, const char* event) noexcept
{
    try {
        std::string dir = setting(0, fmt::k_env_usage_dir);
        if(dir.empty()) return;
        const char* mod = m.manifest_name && m.manifest_name[0] ? m.manifest_name : m.name;
        const char* key = m.build_key ? m.build_key : "";
        for(const char* f : {mod, m.name, e.name, e.arch, key, event})
            if(!clean_field(f)) return;
        Writer& w = W();
        std::lock_guard<std::mutex> lk(w.mu);
        if(w.pid != getpid() || w.dir != dir) { // first record, a forked child, or another dir
            if(w.fd >= 0 && w.pid == getpid()) close(w.fd);
            w.seen.clear();
            w.fd = -1;
            w.pid = getpid();
            w.dir = dir;
            w.size = 0;
            w.full = false;
        }
        if(w.full || !w.seen.insert({&e, event}).second) return;
        static const std::string host = host_name();
        std::string line = std::string(fmt::k_usage_head) + "\t" + event + "\t" + mod + "\t" + m.name + "\t" + e.name +
                           "\t" + e.arch + "\t" + key + "\t" + host + "\t" + std::to_string(getpid()) + "\t" +
                           std::to_string(static_cast<long long>(time(nullptr)));
        line += "\t" + sha256_hex(line).substr(0, fmt::k_usage_sum_len) + "\n";
        if(line.size() > fmt::k_usage_max_line) return;
        if(w.size + line.size() > fmt::k_usage_max_file) {
            w.full = true;
            store::say("usage: record file full (" + std::to_string(fmt::k_usage_max_file) + " bytes); recording stops");
            return;
        }
        if(w.fd < 0) w.fd = open_record_file(dir, host);
        if(w.fd < 0) { w.full = true; return; }
        ssize_t n;
        do n = write(w.fd, line.data(), line.size());
        while(n < 0 && errno == EINTR);
        if(n == static_cast<ssize_t>(line.size())) w.size += line.size();
        else w.full = true; // a short write (disk full): a torn line, skipped when merged; stop here
    } catch(...) {
    }
}

} // namespace usage
} // namespace jit
QOLA_NS_END
#pragma GCC visibility pop
