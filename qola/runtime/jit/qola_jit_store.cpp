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
    std::string v = env(fmt::k_env_verbose);
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
using fmt::in;

bool is_hex64(const std::string& s)
{
    return s.size() == fmt::k_key_len && s.find_first_not_of("0123456789abcdef") == std::string::npos;
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

std::string entry_key(const std::string& content_key, const std::string& compiler_id)
{
    return sha256_hex(fmt::k_tag_key + content_key + "\n" + compiler_id + "\n");
}

// Verify <dir>/<key>.meta and <key>.so and dlopen exactly the verified file. Checks, in order: both
// are trusted regular files (no symlink, FIFO or device is ever read); the .meta names the key and
// was written for this unit of this library (content key, source and bundle hashes; the key is
// sha256 of the content key and the recorded compiler identity); the .so has the recorded size
// (before hashing); then its sha256.
Load try_load(const std::string& dir, const std::string& key, const qola_jit_module& m, const qola_jit_entry& e,
              void** handle, std::string* why)
{
    std::string so = in(dir, fmt::so_name(key)), meta_path = in(dir, fmt::meta_name(key)), meta, err;
    if(!read_file(meta_path, &meta, fmt::k_max_meta, true, &err)) {
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
    if(meta.compare(0, sizeof fmt::k_meta_head - 1, fmt::k_meta_head) != 0 || f["key"] != key ||
       !is_hex64(f["sha256"]) || f["size"].empty() || f["size"].find_first_not_of("0123456789") != std::string::npos ||
       f["size"].size() > fmt::k_max_size_digits) {
        *why = meta_path + " is malformed";
        return Load::broken;
    }
    if(f["content_key"] != e.content_key || f["source_sha256"] != e.source_sha256 ||
       f["headers_sha256"] != m.headers_sha256 || !is_hex64(f["compiler_id"]) ||
       entry_key(f["content_key"], f["compiler_id"]) != key) {
        *why = so + " was not built from this library's unit " + e.name + " (its .meta records other sources)";
        return Load::broken;
    }
    struct stat a, b;
    int fd = open_regular(so, false, true, fmt::k_max_object, &a, &err);
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
    std::string dir = in(cache, fmt::k_locks), fs;
    if(is_network_fs(cache, &fs)) {
        dir = fmt::k_network_lock_dir + std::to_string(geteuid());
        static std::atomic<bool> said{false};
        if(!said.exchange(true))
            fprintf(stderr, "qola-jit: JIT cache %s is on %s; locks go to %s (compiles are coordinated "
                    "on this host only)\n", cache.c_str(), fs.c_str(), dir.c_str());
        if(mkdir(dir.c_str(), fmt::k_dir_mode) != 0 && errno != EEXIST) { *err = dir + ": " + errno_text(errno); return -1; }
        if(!check_private_dir(dir, false, err)) return -1;
    }
    return lock_file(in(dir, fmt::lock_name(name)), blocking, err);
}

// Remove temp files left by dead holders of this key's lock (we hold it now).
void remove_stale_temps(const std::string& cache, const std::string& key, bool network)
{
    std::string prefix = fmt::temp_prefix(key);
    DIR* d = opendir(cache.c_str());
    if(!d) return;
    time_t now = time(nullptr);
    while(struct dirent* de = readdir(d)) {
        if(strncmp(de->d_name, prefix.c_str(), prefix.size()) != 0) continue;
        std::string p = in(cache, de->d_name);
        struct stat st;
        if(network && (lstat(p.c_str(), &st) != 0 || now - st.st_mtime < fmt::k_network_stale_s)) continue; // other hosts
        remove_tree(p);
    }
    closedir(d);
}

void sweep_temps(const std::string& cache, const std::string& dir, const std::string& lock_prefix, bool network)
{
    const size_t skip = sizeof fmt::k_temp_prefix - 1;
    std::vector<std::string> names;
    if(DIR* d = opendir(dir.c_str())) {
        while(struct dirent* de = readdir(d))
            if(strncmp(de->d_name, fmt::k_temp_prefix, skip) == 0 &&
               is_hex64(std::string(de->d_name + skip).substr(0, fmt::k_key_len)))
                names.push_back(de->d_name);
        closedir(d);
    }
    time_t now = time(nullptr);
    for(const auto& n : names) {
        std::string p = in(dir, n), err;
        struct stat st;
        if(lstat(p.c_str(), &st) != 0 || (network && now - st.st_mtime < fmt::k_network_stale_s)) continue;
        int fd = lock_key(cache, lock_prefix + n.substr(skip, fmt::k_key_len), &err, false);
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
    if(!tree_digest(dir, fmt::k_complete, fix, &digest, why)) return false;
    if(digest != m.headers_digest) { *why = dir + " does not hold this library's headers (digest differs)"; return false; }
    return true;
}

bool unpack_headers(const qola_jit_module& m, const std::string& bundle, const std::string& cache,
                    const std::string& dst, Failure* fail)
{
    struct stat st;
    std::string err, hex;
    uint64_t size = 0;
    int fd = open_regular(bundle, true, false, fmt::k_max_source, &st, &err);
    bool ok = fd >= 0 && sha256_fd(fd, &hex, &size);
    if(!ok || hex != m.headers_sha256) {
        if(fd >= 0) close(fd);
        *fail = {QOLA_JIT_E_SOURCE, ok ? bundle + " does not match this library (sha256 differs)"
                                       : err + " (is OUT/jit shipped next to lib/?)"};
        return false;
    }
    std::string tmpl = in(in(cache, fmt::k_headers), fmt::temp_prefix(m.headers_sha256) + fmt::k_temp_random);
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if(!mkdtemp(buf.data())) {
        close(fd);
        *fail = {QOLA_JIT_E_CACHE, tmpl + ": " + errno_text(errno)};
        return false;
    }
    // tar reads the very bytes we hashed (our fd on stdin), never the path again
    std::string tmp(buf.data()), log = in(in(cache, fmt::k_logs), fmt::log_name(fmt::headers_lock(m.headers_sha256))), why;
    std::string tar = which("tar");
    int rc = tar.empty() || lseek(fd, 0, SEEK_SET) != 0 ? -1 : run({tar, "-xzf", "-", "-C", tmp}, log, nullptr, &err, fd);
    close(fd);
    if(rc != 0 || !headers_ok(m, tmp, true, &why) || !write_file_atomic(tmp, fmt::k_complete, fmt::k_complete_text, &err)) {
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
    std::string heads = in(cache, fmt::k_headers), dst = in(heads, m.headers_sha256), err, why, fs;
    int lock = lock_key(cache, fmt::headers_lock(m.headers_sha256), &err);
    if(lock < 0) { *fail = {QOLA_JIT_E_CACHE, err}; return false; }
    bool network = is_network_fs(cache, &fs);
    remove_stale_temps(heads, m.headers_sha256, network); // ours: we hold its lock
    sweep_temps(cache, heads, fmt::k_headers_lock_prefix, network);
    struct stat st;
    bool ok = true;
    if(lstat(dst.c_str(), &st) == 0 && !headers_ok(m, dst, false, &why)) {
        say("unpacking again: " + why);
        std::string aside = in(heads, fmt::stale_aside(m.headers_sha256, long(getpid())));
        remove_tree(aside);
        if(rename(dst.c_str(), aside.c_str()) != 0) {
            *fail = {QOLA_JIT_E_CACHE, "cannot move aside " + dst + " (" + why + "): " + errno_text(errno)};
            ok = false;
        } else {
            remove_tree(aside);
        }
    }
    if(ok && lstat(dst.c_str(), &st) != 0) ok = unpack_headers(m, in(jit_dir, h), cache, dst, fail);
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
    std::string src = in(jit_dir, e.source_rel), text, hex, err;
    uint64_t size = 0;
    bool ok = read_file_follow(src, &text, fmt::k_max_source, &err);
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
    std::string tmpl = in(cache, fmt::temp_prefix(key) + fmt::k_temp_random + ext), copy;
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
    tmpl = in(cache, fmt::temp_prefix(key) + fmt::k_temp_random + fmt::k_so_suffix);
    buf.assign(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    int tfd = ok ? mkostemps(buf.data(), int(sizeof fmt::k_so_suffix - 1), O_CLOEXEC) : (errno = ENOSPC, -1);
    if(tfd < 0) {
        unlink(copy.c_str());
        *fail = {QOLA_JIT_E_CACHE, "cannot write into " + cache + ": " + errno_text(errno)};
        return false;
    }
    close(tfd);
    std::string tmp(buf.data()), logs = in(cache, fmt::k_logs), log = in(logs, fmt::log_name(key));
    std::vector<std::string> argv{compiler};
    std::string flags = e.flags;
    for(size_t pos = 0; pos < flags.size();) {
        size_t nl = flags.find('\n', pos);
        if(nl == std::string::npos) nl = flags.size();
        if(nl > pos) {
            std::string a = replace_all(flags.substr(pos, nl - pos), fmt::k_headers_token, headers);
            argv.push_back(replace_all(a, fmt::k_dir_token, jit_dir));
        }
        pos = nl + 1;
    }
    argv.insert(argv.end(), {"-o", tmp, copy});
    std::string cmd;
    for(const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    std::string werr;
    write_file_atomic(logs, fmt::log_name(key), "# qola-jit: unit " + std::string(e.name) + " of " + m.name +
                      " (" + src + ")\n# key " + key + "\n# " + cmd + "\n", &werr);
    say("compiling " + std::string(e.name) + ": " + cmd);
    double t0 = now_seconds();
    int rc = run(argv, log, nullptr, &err);
    unlink(copy.c_str());
    char magic[4] = {0, 0, 0, 0};
    int fd = open(tmp.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    bool elf = fd >= 0 && pread(fd, magic, 4, 0) == 4 && memcmp(magic, "\177ELF", 4) == 0 &&
               fchmod(fd, fmt::k_file_mode) == 0 && fsync(fd) == 0; // whatever mode the linker left
    ok = elf && sha256_fd(fd, &hex, &size);
    if(fd >= 0) close(fd);
    if(rc != 0 || !ok) {
        unlink(tmp.c_str());
        std::string why = rc < 0 ? err : rc != 0 ? "exit status " + std::to_string(rc) : "no shared object written";
        *fail = {QOLA_JIT_E_COMPILE, "compiling JIT unit " + std::string(e.name) + " of " + m.name + " failed (" + why +
                                         "); log: " + log + "\n" + tail_of_file(log, 2000)};
        return false;
    }
    std::string so = in(cache, fmt::so_name(key));
    const std::string values[] = {key, std::to_string(size), hex, e.name, m.name, compiler, compiler_id, e.content_key,
                                  e.source_sha256, m.headers_sha256, std::to_string((long long)time(nullptr))};
    static_assert(sizeof values / sizeof values[0] == fmt::k_n_meta_fields, "one value per .meta field");
    std::string meta = fmt::k_meta_head;
    for(size_t i = 0; i < fmt::k_n_meta_fields; ++i) meta += fmt::k_meta_fields[i] + (" " + values[i]) + "\n";
    if(rename(tmp.c_str(), so.c_str()) != 0 || !write_file_atomic(cache, fmt::meta_name(key), meta, &err)) {
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
