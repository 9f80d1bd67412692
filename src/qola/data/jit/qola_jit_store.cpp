// qola_jit_store.cpp — the on-disk side of the JIT runtime: verify + load an entry, lock a key,
// unpack headers, compile a unit into the cache (temp file, fsync, rename; .meta written last).
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <string>
#include <vector>

#pragma GCC visibility push(hidden)
#include "qola_jit_internal.h"

QOLA_NS_BEGIN
namespace jit {
namespace store {
using namespace sys;

bool verbose()
{
    std::string v = env("QOLA_JIT_VERBOSE");
    return !v.empty() && v != "0";
}

void say(const std::string& msg)
{
    if(verbose()) fprintf(stderr, "qola-jit: %s\n", msg.c_str());
}

namespace {
std::string replace_all(std::string s, const std::string& from, const std::string& to)
{
    for(size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
    return s;
}
} // namespace

// Verify <dir>/<key>.meta and <key>.so (size, sha256, key) and dlopen exactly the verified file.
Load try_load(const std::string& dir, const std::string& key, void** handle, std::string* why)
{
    std::string so = dir + "/" + key + ".so", meta;
    if(!read_file(dir + "/" + key + ".meta", &meta, 1u << 16)) {
        if(access(so.c_str(), F_OK) != 0) return Load::missing;
        *why = so + " has no valid .meta (interrupted write)";
        return Load::broken;
    }
    std::map<std::string, std::string> f;
    size_t pos = 0;
    while(pos < meta.size()) {
        size_t nl = meta.find('\n', pos);
        if(nl == std::string::npos) nl = meta.size();
        std::string line = meta.substr(pos, nl - pos);
        size_t sp = line.find(' ');
        if(sp != std::string::npos) f[line.substr(0, sp)] = line.substr(sp + 1);
        pos = nl + 1;
    }
    if(meta.compare(0, 17, "qola-jit-entry 1\n") != 0 || f["key"] != key || f["sha256"].size() != 64) {
        *why = dir + "/" + key + ".meta is malformed";
        return Load::broken;
    }
    int fd = open(so.c_str(), O_RDONLY | O_CLOEXEC);
    if(fd < 0) { *why = so + ": " + errno_text(errno); return Load::broken; }
    std::string hex;
    uint64_t size = 0;
    struct stat a, b;
    bool ok = fstat(fd, &a) == 0 && sha256_fd(fd, &hex, &size);
    if(!ok || std::to_string(size) != f["size"] || hex != f["sha256"]) {
        close(fd);
        *why = so + (ok && std::to_string(size) != f["size"] ? " has the wrong size (truncated?)"
                                                              : " fails its sha256 check (corrupted)");
        return Load::broken;
    }
    void* h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if(!h) {
        const char* e = dlerror();
        close(fd);
        *why = "dlopen(" + so + "): " + (e ? e : "unknown error");
        return Load::failed;
    }
    bool same = stat(so.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
    close(fd);
    if(!same) { // replaced between the check and dlopen: not the bytes we verified
        dlclose(h);
        *why = so + " changed while loading";
        return Load::broken;
    }
    *handle = h;
    return Load::loaded;
}

int lock_key(const std::string& cache, const std::string& key, std::string* err)
{
    std::string dir = cache + "/locks", fs;
    if(is_network_fs(cache, &fs)) {
        dir = "/tmp/qola-jit-locks-" + std::to_string(geteuid());
        static std::atomic<bool> said{false};
        if(!said.exchange(true))
            fprintf(stderr, "qola-jit: JIT cache %s is on %s; locks go to %s (compiles are coordinated "
                    "on this host only)\n", cache.c_str(), fs.c_str(), dir.c_str());
        if(mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) { *err = dir + ": " + errno_text(errno); return -1; }
        if(!check_private_dir(dir, false, err)) return -1;
    }
    return lock_file(dir + "/" + key + ".lock", true, err);
}

// Remove temp files left by dead holders of this key's lock (we hold it now).
void remove_stale_temps(const std::string& cache, const std::string& key, bool network)
{
    std::string prefix = ".tmp-" + key;
    DIR* d = opendir(cache.c_str());
    if(!d) return;
    time_t now = time(nullptr);
    while(struct dirent* de = readdir(d)) {
        if(strncmp(de->d_name, prefix.c_str(), prefix.size()) != 0) continue;
        std::string p = cache + "/" + de->d_name;
        struct stat st;
        if(network && (lstat(p.c_str(), &st) != 0 || now - st.st_mtime < 3600)) continue; // other hosts
        remove_tree(p);
    }
    closedir(d);
}

// Unpack the module's header bundle once per bundle hash into <cache>/headers/<sha>.
bool ensure_headers(const qola_jit_module& m, const std::string& jit_dir, const std::string& cache,
                    std::string* out, Failure* fail)
{
    std::string h = m.headers;
    if(h.empty()) { *out = jit_dir; return true; }
    if(h.size() < 7 || h.compare(h.size() - 7, 7, ".tar.gz") != 0) { *out = jit_dir + "/" + h; return true; }
    std::string dst = cache + "/headers/" + m.headers_sha256;
    if(access((dst + "/.qola-complete").c_str(), F_OK) == 0) { *out = dst; return true; }
    std::string bundle = jit_dir + "/" + h, hex;
    uint64_t size = 0;
    int fd = open(bundle.c_str(), O_RDONLY | O_CLOEXEC);
    bool ok = fd >= 0 && sha256_fd(fd, &hex, &size);
    if(fd >= 0) close(fd);
    if(!ok || hex != m.headers_sha256) {
        *fail = {QOLA_JIT_E_SOURCE, ok ? bundle + " does not match this library (sha256 differs)"
                                       : "cannot read " + bundle + " (is OUT/jit shipped next to lib/?)"};
        return false;
    }
    std::string tmpl = cache + "/headers/.tmp-" + m.headers_sha256 + "-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if(!mkdtemp(buf.data())) { *fail = {QOLA_JIT_E_CACHE, tmpl + ": " + errno_text(errno)}; return false; }
    std::string tmp(buf.data()), err, log = cache + "/logs/headers-" + m.headers_sha256 + ".log";
    std::string tar = which("tar");
    int rc = tar.empty() ? -1 : run({tar, "-xzf", bundle, "-C", tmp}, log, nullptr, &err);
    std::string marker_err;
    if(rc != 0 || !write_file_atomic(tmp, ".qola-complete", "ok\n", &marker_err)) {
        remove_tree(tmp);
        *fail = {QOLA_JIT_E_CACHE, "cannot unpack " + bundle + (tar.empty() ? ": `tar` not found in PATH"
                                                                            : " with tar; log: " + log)};
        return false;
    }
    unlink(log.c_str());
    if(rename(tmp.c_str(), dst.c_str()) != 0) remove_tree(tmp); // another process won: use theirs
    if(access((dst + "/.qola-complete").c_str(), F_OK) != 0) {
        *fail = {QOLA_JIT_E_CACHE, "cannot publish headers into " + dst};
        return false;
    }
    *out = dst;
    return true;
}


// Under the key's lock: compile the unit into <cache>/<key>.so + .meta.
bool compile_entry(const qola_jit_module& m, const qola_jit_entry& e, const std::string& jit_dir,
                   const std::string& cache, const std::string& compiler, const std::string& compiler_id,
                   const std::string& key, Failure* fail)
{
    std::string src = jit_dir + "/" + e.source_rel, hex, err;
    uint64_t size = 0;
    int fd = open(src.c_str(), O_RDONLY | O_CLOEXEC);
    bool ok = fd >= 0 && sha256_fd(fd, &hex, &size);
    if(fd >= 0) close(fd);
    if(!ok || hex != e.source_sha256) {
        *fail = {QOLA_JIT_E_SOURCE, ok ? src + " does not match this library (sha256 differs)"
                                       : "cannot read " + src + " (is OUT/jit shipped next to lib/?)"};
        return false;
    }
    std::string headers;
    if(!ensure_headers(m, jit_dir, cache, &headers, fail)) return false;
    std::string tmpl = cache + "/.tmp-" + key + "-XXXXXX.so";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    int tfd = mkostemps(buf.data(), 3, O_CLOEXEC);
    if(tfd < 0) { *fail = {QOLA_JIT_E_CACHE, tmpl + ": " + errno_text(errno)}; return false; }
    close(tfd);
    std::string tmp(buf.data()), log = cache + "/logs/" + key + ".log";
    std::vector<std::string> argv{compiler};
    std::string flags = e.flags;
    for(size_t pos = 0; pos < flags.size();) {
        size_t nl = flags.find('\n', pos);
        if(nl == std::string::npos) nl = flags.size();
        if(nl > pos) {
            std::string a = replace_all(flags.substr(pos, nl - pos), "@QOLA_JIT_HEADERS@", headers);
            argv.push_back(replace_all(a, "@QOLA_JIT_DIR@", jit_dir));
        }
        pos = nl + 1;
    }
    argv.insert(argv.end(), {"-o", tmp, src});
    std::string cmd;
    for(const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    std::string werr;
    write_file_atomic(cache + "/logs", key + ".log", "# qola-jit: unit " + std::string(e.name) + " of " + m.name +
                      "\n# key " + key + "\n# " + cmd + "\n", &werr);
    say("compiling " + std::string(e.name) + ": " + cmd);
    double t0 = now_seconds();
    int rc = run(argv, log, nullptr, &err);
    char magic[4] = {0, 0, 0, 0};
    fd = open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
    bool elf = fd >= 0 && pread(fd, magic, 4, 0) == 4 && memcmp(magic, "\177ELF", 4) == 0 && fsync(fd) == 0;
    ok = elf && sha256_fd(fd, &hex, &size);
    if(fd >= 0) close(fd);
    if(rc != 0 || !ok) {
        unlink(tmp.c_str());
        std::string why = rc < 0 ? err : rc != 0 ? "exit status " + std::to_string(rc) : "no shared object written";
        *fail = {QOLA_JIT_E_COMPILE, "compiling JIT unit " + std::string(e.name) + " of " + m.name + " failed (" + why +
                                         "); log: " + log + "\n" + tail_of_file(log, 2000)};
        return false;
    }
    std::string so = cache + "/" + key + ".so";
    char meta[1024];
    snprintf(meta, sizeof meta, "qola-jit-entry 1\nkey %s\nsize %llu\nsha256 %s\nunit %s\nmodule %s\ncompiler %s\n"
             "compiler_id %s\ncreated %lld\n", key.c_str(), (unsigned long long)size, hex.c_str(), e.name, m.name,
             compiler.c_str(), compiler_id.c_str(), (long long)time(nullptr));
    if(rename(tmp.c_str(), so.c_str()) != 0 || !write_file_atomic(cache, key + ".meta", meta, &err)) {
        unlink(tmp.c_str());
        *fail = {QOLA_JIT_E_CACHE, "cannot publish " + so + ": " + (err.empty() ? errno_text(errno) : err)};
        return false;
    }
    fsync_path(cache, true);
    if(!verbose()) unlink(log.c_str());
    say("compiled " + std::string(e.name) + " in " + std::to_string(now_seconds() - t0) + " s -> " + so);
    return true;
}

} // namespace store
} // namespace jit
QOLA_NS_END
#pragma GCC visibility pop
