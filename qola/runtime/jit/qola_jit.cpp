// qola_jit.cpp — the on-demand JIT runtime: find, verify, compile and load deferred units.
//
// Order on the first call of a unit: in-process table -> prebuilt dirs -> cache dir -> compile.
// Cache entry = <cache>/<key>.so + <key>.meta (size, sha256, key; written after the .so, both by
// temp + fsync + rename). key = sha256(tag content_key "\n" compiler_id "\n"), compiler_id =
// sha256(tag path "\n" stdout of `path --version`) (docs/jit-cache.md, qola_jit_format.h), with
// the compiler that would be used now — so a changed compiler never reuses an old entry.
// One compile per key across processes: flock on <cache>/locks/<key>.lock (on a network file
// system: /tmp/qola-jit-locks-<uid>/). A lock dies with its holder; temp files of dead holders
// are removed by the next holder; an entry is only loaded after its size and hash check out.
#include <cstdio>
#include <cstring>
#include <dlfcn.h>
#include <fnmatch.h>
#include <pwd.h>
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
using namespace store;

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
};
Global& G()
{
    static Global* g = new Global; // never destroyed: stubs may run during exit
    return *g;
}

std::string ms_since(double t0)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.3f ms", (now_seconds() - t0) * 1e3);
    return buf;
}

// The directory the library holding this code lies in now. A publish moves OUT's lib/ and jit/
// of the version a process loaded into OUT/.qola/prev as whole dirs; /proc/self/maps follows that
// move, so the library keeps finding its own JIT sources. dladdr's name (the path it was loaded
// by, which may now hold the next version) only where the mapping is unknown or deleted.
std::string library_dir()
{
    std::string lib = mapped_path(reinterpret_cast<void*>(&library_dir));
    if(lib.empty()) {
        Dl_info info;
        if(dladdr(reinterpret_cast<void*>(&library_dir), &info) == 0 || !info.dli_fname) return std::string();
        lib = info.dli_fname;
    }
    lib = real_path(lib);
    return lib.empty() ? std::string() : dir_name(lib);
}

std::string jit_dir_of(const qola_jit_module& m)
{
    std::string root = env(fmt::k_env_source_dir);
    if(!root.empty()) return fmt::in(root, m.name);
    return fmt::in(library_dir(), m.jit_dir_rel);
}

std::string cache_dir_path()
{
    std::string d = env(fmt::k_env_cache_dir);
    if(!d.empty()) return d;
    std::string xdg = env("XDG_CACHE_HOME");
    if(!xdg.empty() && xdg[0] == '/') return xdg + fmt::k_xdg_subdir;
    std::string home = env("HOME");
    if(home.empty()) {
        struct passwd pw, *res = nullptr;
        char buf[4096];
        if(getpwuid_r(geteuid(), &pw, buf, sizeof buf, &res) == 0 && res) home = res->pw_dir;
    }
    return home.empty() ? std::string() : home + fmt::k_home_subdir;
}

// Create (0700) and check the cache dir and its subdirs: the root owned by us, every subdir a real
// directory owned by us or root, none of them writable by group or others.
bool prepare_cache(std::string* dir, std::string* err)
{
    *dir = cache_dir_path();
    if(dir->empty()) { *err = "no JIT cache dir: set QOLA_JIT_CACHE_DIR (HOME is unset)"; return false; }
    if(!make_dirs(*dir, fmt::k_dir_mode, err) || !check_private_dir(*dir, true, err)) return false;
    for(const char* sub : fmt::k_subdirs)
        if(!make_dirs(fmt::in(*dir, sub), fmt::k_dir_mode, err) || !check_trusted_dir(fmt::in(*dir, sub), err))
            return false;
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
    std::string memo_name = sha256_hex(path).substr(0, fmt::k_memo_name_len) + fmt::k_memo_suffix, text;
    std::string memo_dir = cache.empty() ? std::string() : fmt::in(cache, fmt::k_compilers);
    std::string want_head = fmt::k_memo_head + ("path " + path) + "\nsig " + sig + "\nid ";
    if(!memo_dir.empty() && read_file(fmt::in(memo_dir, memo_name), &text, fmt::k_max_memo, true) &&
       text.compare(0, want_head.size(), want_head) == 0 && text.size() >= want_head.size() + fmt::k_key_len) {
        *id = text.substr(want_head.size(), fmt::k_key_len);
    } else {
        std::string out, rerr;
        int rc = run({path, "--version"}, "", &out, &rerr);
        if(rc != 0) {
            *err = rc < 0 ? rerr : "`" + path + " --version` exited with " + std::to_string(rc);
            return false;
        }
        *id = sha256_hex(fmt::k_tag_compiler + path + "\n" + out);
        std::string werr;
        if(!memo_dir.empty()) write_file_atomic(memo_dir, memo_name, want_head + *id + "\n", &werr);
    }
    std::lock_guard<std::mutex> lk(g.mu);
    g.compilers[path] = CompilerMemo{sig, *id};
    return true;
}

std::string resolve_compiler(const qola_jit_module& m)
{
    std::string want = env(fmt::k_env_compiler);
    if(!want.empty()) return which(want);
    std::string found = which(m.compiler);
    const char* base = strrchr(m.compiler, '/');
    if(found.empty() && base && base[1]) found = which(base + 1); // moved: same name in PATH
    return found;
}

// Find or build the unit's shared object and dlopen it (no global lock held). *how: where it came
// from (a usage record's event: prebuilt, cache, compile; refused by the coverage contract).
void* load_unit(const qola_jit_module& m, const qola_jit_entry& e, Failure* fail, const char** how)
{
    double t0 = now_seconds();
    std::string jit_dir = jit_dir_of(m), cache, cache_err, why, notes;
    bool cache_ok = prepare_cache(&cache, &cache_err);
    std::string compiler = resolve_compiler(m), compiler_id, cerr;
    bool have_compiler = !compiler.empty() && compiler_identity(compiler, cache_ok ? cache : "", &compiler_id, &cerr);
    // Without a usable compiler, look for what the build's compiler would have produced.
    std::string key = entry_key(e.content_key, have_compiler ? compiler_id : std::string(m.compiler_id));
    void* h = nullptr;
    std::vector<std::string> prebuilt;
    std::string list = env(fmt::k_env_prebuilt);
    for(size_t pos = 0; pos < list.size();) {
        size_t c = list.find(':', pos);
        if(c == std::string::npos) c = list.size();
        if(c > pos) prebuilt.push_back(list.substr(pos, c - pos));
        pos = c + 1;
    }
    std::string shipped = fmt::in(dir_name(jit_dir), fmt::k_prebuilt);
    if(access(shipped.c_str(), F_OK) == 0) prebuilt.push_back(shipped);
    for(const auto& dir : prebuilt) {
        std::string derr;
        if(!check_readonly_dir(dir, &derr)) { notes += "\n  " + derr; continue; }
        Load r = try_load(dir, key, m, e, &h, &why);
        if(r == Load::loaded) {
            say("loaded " + std::string(e.name) + " from prebuilt " + dir + " in " + ms_since(t0));
            *how = fmt::k_prebuilt; // the event has the dir's name
            return h;
        }
        if(r == Load::broken || r == Load::failed) notes += "\n  skipped prebuilt entry: " + why;
    }
    if(!cache_ok) { *fail = {QOLA_JIT_E_CACHE, cache_err + notes}; return nullptr; }
    Load r = try_load(cache, key, m, e, &h, &why);
    if(r == Load::loaded) {
        say("loaded " + std::string(e.name) + " from cache " + cache + " in " + ms_since(t0));
        *how = "cache";
        return h;
    }
    if(r == Load::failed) { *fail = {QOLA_JIT_E_LOAD, why}; return nullptr; }
    if(r == Load::broken) say("rebuilding: " + why);
    usage::Coverage cov = usage::coverage();
    if(cov == usage::Coverage::strict) {
        *how = "refused";
        *fail = {QOLA_JIT_E_COVERAGE, "variant " + std::string(e.name) + " of module " + m.name +
                                          " was not built ahead and is not in the JIT cache (" + cache +
                                          ") or a prebuilt dir, and " + fmt::k_env_coverage +
                                          "=strict forbids compiling it at run time. To build it ahead, add this "
                                          "line to the manifest's [usage] variants (or to the usage fragment) and "
                                          "rebuild:\n    " + usage::manifest_line(m, e) + notes};
        fprintf(stderr, "qola-jit: coverage: %s\n", fail->msg.c_str()); // once: the refusal is sticky
        return nullptr;
    }
    if(env(fmt::k_env_jit) == "0") {
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
    r = try_load(cache, key, m, e, &h, &why); // another process may have built it meanwhile
    *how = "cache";
    if(r == Load::missing || r == Load::broken) {
        *how = "compile";
        if(cov == usage::Coverage::report)
            fprintf(stderr, "qola-jit: coverage: variant %s of module %s was not built ahead; compiling it at run "
                            "time. To build it ahead, add to the manifest's [usage] variants: %s\n",
                    e.name, m.name, usage::manifest_line(m, e).c_str());
        bool network = is_network_fs(cache, &fs);
        remove_stale_temps(cache, key, network);
        sweep_temps(cache, cache, "", network); // what killed compiles of other keys left behind
        if(compile_entry(m, e, jit_dir, cache, compiler, compiler_id, key, fail))
            r = try_load(cache, key, m, e, &h, &why);
        else { close(lock); return nullptr; }
    }
    close(lock);
    if(r != Load::loaded) { *fail = {QOLA_JIT_E_LOAD, why}; return nullptr; }
    return h;
}

// The row named `name` of a table sorted by name (the deferred entries, or the ahead ones).
const qola_jit_entry* find_in(const qola_jit_entry* rows, unsigned n, const char* name)
{
    unsigned lo = 0, hi = n;
    while(lo < hi) {
        unsigned mid = lo + (hi - lo) / 2;
        int c = strcmp(rows[mid].name, name);
        if(c == 0) return &rows[mid];
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
    const char* how = "failed";
    try {
        h = load_unit(m, e, fail, &how);
    } catch(...) {
        *fail = {QOLA_JIT_E_INTERNAL, "out of memory or internal error in the JIT runtime"};
    }
    usage::record(m, e, h ? how : fail->status == QOLA_JIT_E_COVERAGE ? "refused" : "failed");
    lk.lock();
    st.busy = false;
    st.handle = h;
    if(!h && (fail->status == QOLA_JIT_E_COMPILE || fail->status == QOLA_JIT_E_COVERAGE)) {
        st.fail_status = fail->status; // sticky in this process: reported (and recorded) once
        st.fail_msg = fail->msg;
    }
    g.cv.notify_all();
    return h;
}

} // namespace

void* resolve(const qola_jit_module& mod, const char* unit, unsigned which, void** slot, const void* self) noexcept
{
    Failure fail{QOLA_JIT_OK, std::string()};
    try {
        const qola_jit_entry* e = find_in(mod.entries, mod.n_entries, unit);
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

void* resolve_ahead(const qola_jit_module& mod, const char* unit, unsigned which, void** slot, void* fn) noexcept
{
    (void)which; // a unit is recorded once, whichever of its functions is called first
    if(const qola_jit_entry* e = find_in(mod.ahead, mod.n_ahead, unit))
        usage::record(mod, *e, fmt::k_usage_ahead); // once per unit per process; never throws
    void* expected = nullptr; // another thread may have published first: same pointer either way
    __atomic_compare_exchange_n(slot, &expected, fn, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return fn;
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
