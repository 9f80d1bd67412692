// qola_jit.cpp — the on-demand JIT runtime: find, verify, compile and load deferred units.
//
// Order on the first call of a unit: in-process table -> prebuilt dirs -> cache dir -> compile.
// Cache entry = <cache>/<key>.so + <key>.meta (size, sha256, key; written after the .so, both by
// temp + fsync + rename). key = sha256("qola-jit-key-v1\n" content_key "\n" compiler_id "\n"),
// compiler_id = sha256("qola-jit-compiler-v1\n" path "\n" stdout of `path --version`), with the
// compiler that would be used now — so a changed compiler never reuses an old entry.
// One compile per key across processes: flock on <cache>/locks/<key>.lock (on a network file
// system: /tmp/qola-jit-locks-<uid>/). A lock dies with its holder; temp files of dead holders
// are removed by the next holder; an entry is only loaded after its size and hash check out.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <pwd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#pragma GCC visibility push(hidden)
#include "qola_jit_internal.h"

// ---------------------------------------------------------------- error state (C API)
// Weak and called through the PLT, so every copy of the runtime in a process (one per module
// library, or several modules in one static program) shares the copy the loader picked.
namespace {
thread_local std::string t_error;
thread_local int t_status = 0;
} // namespace

QOLA_C_API __attribute__((weak, noinline)) void QOLA_C_NAME(qola_jit_set_error_)(int status, const char* msg)
{
    t_status = status;
    t_error = msg ? msg : "";
}
QOLA_C_API __attribute__((weak, noinline)) const char* QOLA_C_NAME(qola_jit_last_error)(void)
{
    return t_error.c_str();
}
QOLA_C_API __attribute__((weak, noinline)) int QOLA_C_NAME(qola_jit_last_status)(void) { return t_status; }
QOLA_C_API __attribute__((weak, noinline)) void QOLA_C_NAME(qola_jit_clear_error)(void)
{
    t_status = 0;
    t_error.clear();
}

QOLA_NS_BEGIN
namespace jit {
namespace {
using namespace sys;

struct UnitState {
    void* handle = nullptr;
    bool busy = false;
    int fail_status = 0; // sticky in this process: compile failures only
    std::string fail_msg;
};
struct CompilerMemo {
    std::string sig, id;
};
struct Global {
    std::mutex mu;
    std::condition_variable cv;
    std::map<const qola_jit_entry*, UnitState> units;
    std::vector<const qola_jit_module*> modules;
    std::map<std::string, CompilerMemo> compilers;
    bool said_netfs = false;
};
Global& G()
{
    static Global* g = new Global; // never destroyed: stubs may run during exit
    return *g;
}

bool verbose()
{
    std::string v = env("QOLA_JIT_VERBOSE");
    return !v.empty() && v != "0";
}
void say(const std::string& msg)
{
    if(verbose()) fprintf(stderr, "qola-jit: %s\n", msg.c_str());
}

struct Failure {
    int status;
    std::string msg;
};

std::string library_dir()
{
    Dl_info info;
    if(dladdr(reinterpret_cast<void*>(&library_dir), &info) == 0 || !info.dli_fname) return std::string();
    std::string lib = real_path(info.dli_fname);
    return lib.empty() ? std::string() : dir_name(lib);
}

std::string jit_dir_of(const qola_jit_module& m)
{
    std::string root = env("QOLA_JIT_SOURCE_DIR");
    if(!root.empty()) return root + "/" + m.name;
    return library_dir() + "/" + m.jit_dir_rel;
}

std::string cache_dir_path()
{
    std::string d = env("QOLA_JIT_CACHE_DIR");
    if(!d.empty()) return d;
    std::string xdg = env("XDG_CACHE_HOME");
    if(!xdg.empty() && xdg[0] == '/') return xdg + "/qola/jit";
    std::string home = env("HOME");
    if(home.empty()) {
        struct passwd pw, *res = nullptr;
        char buf[4096];
        if(getpwuid_r(geteuid(), &pw, buf, sizeof buf, &res) == 0 && res) home = res->pw_dir;
    }
    return home.empty() ? std::string() : home + "/.cache/qola/jit";
}

// Create (0700) and check the cache dir and its subdirs.
bool prepare_cache(std::string* dir, std::string* err)
{
    *dir = cache_dir_path();
    if(dir->empty()) { *err = "no JIT cache dir: set QOLA_JIT_CACHE_DIR (HOME is unset)"; return false; }
    if(!make_dirs(*dir, 0700, err) || !check_private_dir(*dir, true, err)) return false;
    for(const char* sub : {"/logs", "/headers", "/compilers", "/locks"})
        if(!make_dirs(*dir + sub, 0700, err)) return false;
    return true;
}

// compiler identity: in-process memo, then <cache>/compilers/<h>.id keyed by the file's
// signature (path, inode, size, mtime, ctime), else run `compiler --version`.
bool compiler_identity(const std::string& path, const std::string& cache, std::string* id, std::string* err)
{
    std::string sig = file_signature(path);
    Global& g = G();
    {
        std::lock_guard<std::mutex> lk(g.mu);
        auto it = g.compilers.find(path);
        if(it != g.compilers.end() && it->second.sig == sig) { *id = it->second.id; return true; }
    }
    std::string memo_name = sha256_hex(path).substr(0, 32) + ".id", text;
    std::string memo_dir = cache.empty() ? std::string() : cache + "/compilers";
    std::string want_head = "qola-jit-compiler 1\npath " + path + "\nsig " + sig + "\nid ";
    if(!memo_dir.empty() && read_file(memo_dir + "/" + memo_name, &text, 4096) &&
       text.compare(0, want_head.size(), want_head) == 0 && text.size() >= want_head.size() + 64) {
        *id = text.substr(want_head.size(), 64);
    } else {
        std::string out, rerr;
        int rc = run({path, "--version"}, "", &out, &rerr);
        if(rc != 0) {
            *err = rc < 0 ? rerr : "`" + path + " --version` exited with " + std::to_string(rc);
            return false;
        }
        *id = sha256_hex("qola-jit-compiler-v1\n" + path + "\n" + out);
        std::string werr;
        if(!memo_dir.empty()) write_file_atomic(memo_dir, memo_name, want_head + *id + "\n", &werr);
    }
    std::lock_guard<std::mutex> lk(g.mu);
    g.compilers[path] = CompilerMemo{sig, *id};
    return true;
}

std::string resolve_compiler(const qola_jit_module& m)
{
    std::string want = env("QOLA_JIT_COMPILER");
    if(!want.empty()) return which(want);
    std::string found = which(m.compiler);
    const char* base = strrchr(m.compiler, '/');
    if(found.empty() && base && base[1]) found = which(base + 1); // moved: same name in PATH
    return found;
}

enum class Load { missing, broken, loaded, failed };

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
        Global& g = G();
        bool first;
        {
            std::lock_guard<std::mutex> lk(g.mu);
            first = !g.said_netfs;
            g.said_netfs = true;
        }
        if(first)
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

std::string replace_all(std::string s, const std::string& from, const std::string& to)
{
    for(size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
    return s;
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

// Find or build the unit's shared object and dlopen it (no global lock held).
void* load_unit(const qola_jit_module& m, const qola_jit_entry& e, Failure* fail)
{
    std::string jit_dir = jit_dir_of(m), cache, cache_err, why, notes;
    bool cache_ok = prepare_cache(&cache, &cache_err);
    std::string compiler = resolve_compiler(m), compiler_id, cerr;
    bool have_compiler = !compiler.empty() && compiler_identity(compiler, cache_ok ? cache : "", &compiler_id, &cerr);
    // Without a usable compiler, look for what the build's compiler would have produced.
    std::string key = sha256_hex("qola-jit-key-v1\n" + std::string(e.content_key) + "\n" +
                                 (have_compiler ? compiler_id : std::string(m.compiler_id)) + "\n");
    void* h = nullptr;
    std::vector<std::string> prebuilt;
    std::string list = env("QOLA_JIT_PREBUILT_DIR");
    for(size_t pos = 0; pos < list.size();) {
        size_t c = list.find(':', pos);
        if(c == std::string::npos) c = list.size();
        if(c > pos) prebuilt.push_back(list.substr(pos, c - pos));
        pos = c + 1;
    }
    std::string shipped = dir_name(jit_dir) + "/prebuilt";
    if(access(shipped.c_str(), F_OK) == 0) prebuilt.push_back(shipped);
    for(const auto& dir : prebuilt) {
        std::string derr;
        if(!check_readonly_dir(dir, &derr)) { notes += "\n  " + derr; continue; }
        Load r = try_load(dir, key, &h, &why);
        if(r == Load::loaded) { say("loaded " + std::string(e.name) + " from prebuilt " + dir); return h; }
        if(r == Load::broken || r == Load::failed) notes += "\n  skipped prebuilt entry: " + why;
    }
    if(!cache_ok) { *fail = {QOLA_JIT_E_CACHE, cache_err + notes}; return nullptr; }
    Load r = try_load(cache, key, &h, &why);
    if(r == Load::loaded) { say("loaded " + std::string(e.name) + " from cache " + cache); return h; }
    if(r == Load::failed) { *fail = {QOLA_JIT_E_LOAD, why}; return nullptr; }
    if(r == Load::broken) say("rebuilding: " + why);
    if(env("QOLA_JIT") == "0") {
        *fail = {QOLA_JIT_E_DISABLED, "JIT unit " + std::string(e.name) + " of " + m.name + " is not in the cache (" +
                                          cache + ") or a prebuilt dir, and QOLA_JIT=0 forbids compiling it" + notes};
        return nullptr;
    }
    if(!have_compiler) {
        *fail = {QOLA_JIT_E_COMPILER, (compiler.empty() ? "JIT compiler " + std::string(m.compiler) + " not found"
                                                        : "cannot identify JIT compiler: " + cerr) +
                                          " (set QOLA_JIT_COMPILER)" + notes};
        return nullptr;
    }
    std::string lerr, fs;
    int lock = lock_key(cache, key, &lerr);
    if(lock < 0) { *fail = {QOLA_JIT_E_CACHE, lerr}; return nullptr; }
    r = try_load(cache, key, &h, &why); // another process may have built it meanwhile
    if(r == Load::missing || r == Load::broken) {
        remove_stale_temps(cache, key, is_network_fs(cache, &fs));
        if(compile_entry(m, e, jit_dir, cache, compiler, compiler_id, key, fail)) r = try_load(cache, key, &h, &why);
        else { close(lock); return nullptr; }
    }
    close(lock);
    if(r != Load::loaded) { *fail = {QOLA_JIT_E_LOAD, why}; return nullptr; }
    return h;
}

const qola_jit_entry* find_entry(const qola_jit_module& m, const char* name)
{
    unsigned lo = 0, hi = m.n_entries;
    while(lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        int c = strcmp(m.entries[mid].name, name);
        if(c == 0) return &m.entries[mid];
        if(c < 0) lo = mid + 1;
        else hi = mid;
    }
    return nullptr;
}

// The unit's dlopen handle: load it once per process; other threads wait for the first.
void* ensure_unit(const qola_jit_module& m, const qola_jit_entry& e, Failure* fail)
{
    Global& g = G();
    std::unique_lock<std::mutex> lk(g.mu);
    UnitState& st = g.units[&e];
    while(st.busy) g.cv.wait(lk);
    if(st.handle) return st.handle;
    if(st.fail_status) { *fail = {st.fail_status, st.fail_msg}; return nullptr; }
    st.busy = true;
    lk.unlock();
    void* h = nullptr;
    try {
        h = load_unit(m, e, fail);
    } catch(...) {
        *fail = {QOLA_JIT_E_INTERNAL, "out of memory or internal error in the JIT runtime"};
    }
    lk.lock();
    st.busy = false;
    st.handle = h;
    if(!h && fail->status == QOLA_JIT_E_COMPILE) { st.fail_status = fail->status; st.fail_msg = fail->msg; }
    g.cv.notify_all();
    return h;
}

} // namespace

void* resolve(const qola_jit_module& mod, const char* unit, unsigned which, void** slot, const void* self) noexcept
{
    Failure fail{QOLA_JIT_OK, std::string()};
    try {
        const qola_jit_entry* e = find_entry(mod, unit);
        void* p = nullptr;
        if(!e || which >= e->n_funcs) {
            fail = {QOLA_JIT_E_NOT_FOUND, std::string("no JIT unit ") + unit + " #" + std::to_string(which) +
                                              " in module " + mod.name};
        } else if(void* h = ensure_unit(mod, *e, &fail)) {
            std::string sym = std::string(e->entry_symbol) + "_" + std::to_string(which);
            void* f = dlsym(h, sym.c_str());
            p = f ? reinterpret_cast<void* (*)()>(f)() : nullptr;
            if(!p || p == self)
                fail = {QOLA_JIT_E_LOAD, std::string("JIT unit ") + unit + (f ? ": entry " + sym + " resolved to the "
                                                                               "library's own stub (link it with -Bsymbolic)"
                                                                             : ": entry " + sym + " not found")};
            else {
                __atomic_store_n(slot, p, __ATOMIC_RELEASE);
                return p;
            }
        }
    } catch(...) {
        fail = {QOLA_JIT_E_INTERNAL, "out of memory or internal error in the JIT runtime"};
    }
    say(fail.msg);
    QOLA_C_NAME(qola_jit_set_error_)(fail.status, fail.msg.c_str());
    return nullptr;
}

registrar::registrar(const qola_jit_module* mod) noexcept
{
    try {
        Global& g = G();
        std::lock_guard<std::mutex> lk(g.mu);
        g.modules.push_back(mod);
    } catch(...) {
    }
}

} // namespace jit
QOLA_NS_END

QOLA_C_API int QOLA_C_NAME(qola_jit_prepare)(const char* module, const char* pattern)
{
    using namespace QOLA_NS(jit);
    std::vector<const qola_jit_module*> mods;
    {
        Global& g = G();
        std::lock_guard<std::mutex> lk(g.mu);
        for(const qola_jit_module* m : g.modules)
            if(!module || strcmp(m->name, module) == 0) mods.push_back(m);
    }
    if(mods.empty()) return -1;
    int failed = 0;
    for(const qola_jit_module* m : mods)
        for(unsigned i = 0; i < m->n_entries; ++i) {
            const qola_jit_entry& e = m->entries[i];
            if(pattern && fnmatch(pattern, e.name, 0) != 0) continue;
            Failure fail{QOLA_JIT_OK, std::string()};
            if(!ensure_unit(*m, e, &fail)) {
                ++failed;
                QOLA_C_NAME(qola_jit_set_error_)(fail.status, fail.msg.c_str());
            }
        }
    return failed;
}
#pragma GCC visibility pop
