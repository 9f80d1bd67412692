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

namespace {
const uint64_t k_max_meta = 1u << 16;
const uint64_t k_max_object = 8ull << 30; // a compiled unit
const uint64_t k_max_source = 256ull << 20; // a unit's source, the header bundle

bool is_hex64(const std::string& s)
{
    return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::map<std::string, std::string> parse_meta(const std::string& meta)
{
    std::map<std::string, std::string> f;
    for(size_t pos = 0; pos < meta.size();) {
        size_t nl = meta.find('\n', pos);
        if(nl == std::string::npos) nl = meta.size();
        std::string line = meta.substr(pos, nl - pos);
        size_t sp = line.find(' ');
        if(sp != std::string::npos) f[line.substr(0, sp)] = line.substr(sp + 1);
        pos = nl + 1;
    }
    return f;
}
} // namespace

// Verify <dir>/<key>.meta and <key>.so and dlopen exactly the verified file. Checks, in order: both
// are trusted regular files (no symlink, FIFO or device is ever read); the .meta names the key and
// was written for this unit of this library (content key, source and bundle hashes; the key is
// sha256 of the content key and the recorded compiler identity); the .so has the recorded size
// (before hashing); then its sha256.
Load try_load(const std::string& dir, const std::string& key, const qola_jit_module& m, const qola_jit_entry& e,
              void** handle, std::string* why)
{
    std::string so = dir + "/" + key + ".so", meta_path = dir + "/" + key + ".meta", meta, err;
    if(!read_file(meta_path, &meta, k_max_meta, true, &err)) {
        struct stat st;
        if(errno == ENOENT) {
            if(lstat(so.c_str(), &st) != 0) return Load::missing;
            *why = so + " has no .meta (interrupted write)";
        } else {
            *why = err;
        }
        return Load::broken;
    }
    std::map<std::string, std::string> f = parse_meta(meta);
    if(meta.compare(0, 17, "qola-jit-entry 1\n") != 0 || f["key"] != key || !is_hex64(f["sha256"]) ||
       f["size"].empty() || f["size"].find_first_not_of("0123456789") != std::string::npos || f["size"].size() > 19) {
        *why = meta_path + " is malformed";
        return Load::broken;
    }
    if(f["content_key"] != e.content_key || f["source_sha256"] != e.source_sha256 ||
       f["headers_sha256"] != m.headers_sha256 || !is_hex64(f["compiler_id"]) ||
       sha256_hex("qola-jit-key-v1\n" + f["content_key"] + "\n" + f["compiler_id"] + "\n") != key) {
        *why = so + " was not built from this library's unit " + e.name + " (its .meta records other sources)";
        return Load::broken;
    }
    struct stat a, b;
    int fd = open_regular(so, false, true, k_max_object, &a, &err);
    if(fd < 0) { *why = err; return Load::broken; }
    std::string hex;
    uint64_t size = 0;
    if(std::to_string(a.st_size) != f["size"]) {
        close(fd);
        *why = so + " has the wrong size (truncated?)";
        return Load::broken;
    }
    if(!sha256_fd(fd, &hex, &size) || hex != f["sha256"]) {
        close(fd);
        *why = so + " fails its sha256 check (corrupted)";
        return Load::broken;
    }
    void* h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if(!h) {
        const char* de = dlerror();
        close(fd);
        *why = "dlopen(" + so + "): " + (de ? de : "unknown error");
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

int lock_key(const std::string& cache, const std::string& name, std::string* err, bool blocking)
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
    return lock_file(dir + "/" + name + ".lock", blocking, err);
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

void sweep_temps(const std::string& cache, const std::string& dir, const std::string& lock_prefix, bool network)
{
    std::vector<std::string> names;
    if(DIR* d = opendir(dir.c_str())) {
        while(struct dirent* de = readdir(d))
            if(strncmp(de->d_name, ".tmp-", 5) == 0 && is_hex64(std::string(de->d_name + 5).substr(0, 64)))
                names.push_back(de->d_name);
        closedir(d);
    }
    time_t now = time(nullptr);
    for(const auto& n : names) {
        std::string p = dir + "/" + n, err;
        struct stat st;
        if(lstat(p.c_str(), &st) != 0 || (network && now - st.st_mtime < 3600)) continue;
        int fd = lock_key(cache, lock_prefix + n.substr(5, 64), &err, false);
        if(fd < 0) continue; // held: a compile or unpack in progress (or our own key: removed by its holder)
        say("removing stale temp " + p);
        remove_tree(p);
        close(fd);
    }
}

namespace {
// <cache>/headers/<sha> holds the verified bundle: a trusted tree whose digest is the library's.
bool headers_ok(const qola_jit_module& m, const std::string& dir, bool fix, std::string* why)
{
    std::string digest;
    if(!tree_digest(dir, ".qola-complete", fix, &digest, why)) return false;
    if(digest != m.headers_digest) { *why = dir + " does not hold this library's headers (digest differs)"; return false; }
    return true;
}

bool unpack_headers(const qola_jit_module& m, const std::string& bundle, const std::string& cache,
                    const std::string& dst, Failure* fail)
{
    struct stat st;
    std::string err, hex;
    uint64_t size = 0;
    int fd = open_regular(bundle, true, false, k_max_source, &st, &err);
    bool ok = fd >= 0 && sha256_fd(fd, &hex, &size);
    if(!ok || hex != m.headers_sha256) {
        if(fd >= 0) close(fd);
        *fail = {QOLA_JIT_E_SOURCE, ok ? bundle + " does not match this library (sha256 differs)"
                                       : err + " (is OUT/jit shipped next to lib/?)"};
        return false;
    }
    std::string tmpl = cache + "/headers/.tmp-" + m.headers_sha256 + "-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if(!mkdtemp(buf.data())) {
        close(fd);
        *fail = {QOLA_JIT_E_CACHE, tmpl + ": " + errno_text(errno)};
        return false;
    }
    // tar reads the very bytes we hashed (our fd on stdin), never the path again
    std::string tmp(buf.data()), log = cache + "/logs/headers-" + m.headers_sha256 + ".log", why;
    std::string tar = which("tar");
    int rc = tar.empty() || lseek(fd, 0, SEEK_SET) != 0 ? -1 : run({tar, "-xzf", "-", "-C", tmp}, log, nullptr, &err, fd);
    close(fd);
    if(rc != 0 || !headers_ok(m, tmp, true, &why) || !write_file_atomic(tmp, ".qola-complete", "ok\n", &err)) {
        remove_tree(tmp);
        *fail = {QOLA_JIT_E_CACHE, "cannot unpack " + bundle + (tar.empty() ? ": `tar` not found in PATH"
                                                                : rc != 0 ? " with tar; log: " + log : ": " + why + err)};
        return false;
    }
    unlink(log.c_str());
    if(rename(tmp.c_str(), dst.c_str()) != 0) {
        remove_tree(tmp);
        *fail = {QOLA_JIT_E_CACHE, "cannot publish headers into " + dst + ": " + errno_text(errno)};
        return false;
    }
    return true;
}
} // namespace

// The module's header bundle, unpacked once per bundle hash into <cache>/headers/<sha> under the
// lock headers-<sha>, and verified against the library's digest before every use: a tree that is
// not ours (owner, mode, symlinks, other content) is moved aside and unpacked again.
bool ensure_headers(const qola_jit_module& m, const std::string& jit_dir, const std::string& cache,
                    std::string* out, Failure* fail)
{
    std::string h = m.headers;
    if(h.empty()) { *out = jit_dir; return true; }
    if(!is_hex64(m.headers_sha256) || !is_hex64(m.headers_digest)) {
        *fail = {QOLA_JIT_E_SOURCE, std::string("module ") + m.name + ": its table records no header digest"};
        return false;
    }
    std::string dst = cache + "/headers/" + m.headers_sha256, err, why, fs;
    int lock = lock_key(cache, "headers-" + std::string(m.headers_sha256), &err);
    if(lock < 0) { *fail = {QOLA_JIT_E_CACHE, err}; return false; }
    bool network = is_network_fs(cache, &fs);
    remove_stale_temps(cache + "/headers", m.headers_sha256, network); // ours: we hold its lock
    sweep_temps(cache, cache + "/headers", "headers-", network);
    struct stat st;
    bool ok = true;
    if(lstat(dst.c_str(), &st) == 0 && !headers_ok(m, dst, false, &why)) {
        say("unpacking again: " + why);
        std::string aside = cache + "/headers/.tmp-" + m.headers_sha256 + "-stale-" + std::to_string(getpid());
        remove_tree(aside);
        if(rename(dst.c_str(), aside.c_str()) != 0) {
            *fail = {QOLA_JIT_E_CACHE, "cannot move aside " + dst + " (" + why + "): " + errno_text(errno)};
            ok = false;
        } else {
            remove_tree(aside);
        }
    }
    if(ok && lstat(dst.c_str(), &st) != 0) ok = unpack_headers(m, jit_dir + "/" + h, cache, dst, fail);
    close(lock);
    if(ok) *out = dst;
    return ok;
}

// Under the key's lock: compile the unit into <cache>/<key>.so + .meta. The source is read once
// (a bounded regular file), checked against the library's hash, and compiled from a private copy.
bool compile_entry(const qola_jit_module& m, const qola_jit_entry& e, const std::string& jit_dir,
                   const std::string& cache, const std::string& compiler, const std::string& compiler_id,
                   const std::string& key, Failure* fail)
{
    std::string src = jit_dir + "/" + e.source_rel, text, hex, err;
    uint64_t size = 0;
    bool ok = read_file_follow(src, &text, k_max_source, &err);
    if(ok) hex = sha256_hex(text);
    if(!ok || hex != e.source_sha256) {
        *fail = {QOLA_JIT_E_SOURCE, ok ? src + " does not match this library (sha256 differs)"
                                       : (err.empty() ? "cannot read " + src : err) + " (is OUT/jit shipped next to lib/?)"};
        return false;
    }
    std::string headers;
    if(!ensure_headers(m, jit_dir, cache, &headers, fail)) return false;
    std::string ext = e.source_rel;
    ext = ext.find('.') == std::string::npos || ext.rfind('/') > ext.rfind('.') ? "" : ext.substr(ext.rfind('.'));
    if(ext.size() > 8 || ext.find_first_not_of(".abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+") !=
                             std::string::npos)
        ext = ".cpp";
    std::string tmpl = cache + "/.tmp-" + key + "-XXXXXX" + ext, copy;
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    int sfd = mkostemps(buf.data(), int(ext.size()), O_CLOEXEC);
    if(sfd < 0) { *fail = {QOLA_JIT_E_CACHE, tmpl + ": " + errno_text(errno)}; return false; }
    copy = buf.data();
    for(size_t done = 0; ok && done < text.size();) {
        ssize_t n = write(sfd, text.data() + done, text.size() - done);
        if(n < 0 && errno == EINTR) continue;
        ok = n > 0;
        done += n > 0 ? size_t(n) : 0;
    }
    close(sfd);
    tmpl = cache + "/.tmp-" + key + "-XXXXXX.so";
    buf.assign(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    int tfd = ok ? mkostemps(buf.data(), 3, O_CLOEXEC) : (errno = ENOSPC, -1);
    if(tfd < 0) {
        unlink(copy.c_str());
        *fail = {QOLA_JIT_E_CACHE, "cannot write into " + cache + ": " + errno_text(errno)};
        return false;
    }
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
    argv.insert(argv.end(), {"-o", tmp, copy});
    std::string cmd;
    for(const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    std::string werr;
    write_file_atomic(cache + "/logs", key + ".log", "# qola-jit: unit " + std::string(e.name) + " of " + m.name +
                      " (" + src + ")\n# key " + key + "\n# " + cmd + "\n", &werr);
    say("compiling " + std::string(e.name) + ": " + cmd);
    double t0 = now_seconds();
    int rc = run(argv, log, nullptr, &err);
    unlink(copy.c_str());
    char magic[4] = {0, 0, 0, 0};
    int fd = open(tmp.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
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
    std::string meta = "qola-jit-entry 1\nkey " + key + "\nsize " + std::to_string(size) + "\nsha256 " + hex +
                       "\nunit " + e.name + "\nmodule " + m.name + "\ncompiler " + compiler + "\ncompiler_id " +
                       compiler_id + "\ncontent_key " + e.content_key + "\nsource_sha256 " + e.source_sha256 +
                       "\nheaders_sha256 " + m.headers_sha256 + "\ncreated " + std::to_string((long long)time(nullptr)) +
                       "\n";
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
