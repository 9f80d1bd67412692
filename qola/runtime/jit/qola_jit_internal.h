// qola_jit_internal.h — helpers shared by the JIT runtime's sources (not installed for users).
// Everything here is hidden: the runtime's .cpp files wrap it in `#pragma GCC visibility`.
#ifndef QOLA_JIT_INTERNAL_H
#define QOLA_JIT_INTERNAL_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/stat.h>
#include <sys/types.h>
#include <vector>

#include "qola_jit.h"
#include "qola_jit_format.h"

QOLA_NS_BEGIN
namespace jit {
namespace sys {

// SHA-256 (qola_jit_sha256.cpp), used for keys, compiler identities and entry verification.
class Sha256 {
public:
    Sha256();
    void update(const void* data, size_t n);
    std::string hex(); // finalises
private:
    uint32_t h_[8];
    unsigned char buf_[64];
    uint64_t len_;
    size_t fill_;
};
std::string sha256_hex(const std::string& data);
// Hash an open file from offset 0; false on a read error.
bool sha256_fd(int fd, std::string* hex, uint64_t* size);

std::string env(const char* name); // "" when unset

// qola_jit_files.cpp: what the runtime opens, it checks first (qola.jit.safeio is the Python twin).
// Owned by the effective user or root and not writable by group/others; else false + why.
bool trusted_stat(const struct stat& st, std::string* why);
// Open a regular file for reading: O_NOFOLLOW (unless `follow`) | O_NONBLOCK, then fstat before any
// read: a regular file of at most max_bytes (and trusted, if asked). -1 + err (errno kept) otherwise.
int open_regular(const std::string& path, bool follow, bool trusted, uint64_t max_bytes, struct stat* st,
                 std::string* err);
// Read a whole regular file (no symlinks, at most max_bytes); trusted: see trusted_stat.
bool read_file(const std::string& path, std::string* out, size_t max_bytes, bool trusted = false,
               std::string* err = nullptr);
// The same for an input verified by hash afterwards (OUT/jit): a symlink to a regular file is followed.
bool read_file_follow(const std::string& path, std::string* out, size_t max_bytes, std::string* err);
// A directory (lstat: not a symlink) owned by the effective user or root, not group/other-writable.
bool check_trusted_dir(const std::string& path, std::string* err);
// Digest of a directory tree as qola.jit.key.headers_digest computes it over its regular files
// (relative paths; `skip` at the top level is left out). Symlinks, special files and untrusted
// entries fail; `fix_modes` first clears group/other write bits (a tree we just unpacked).
bool tree_digest(const std::string& dir, const char* skip, bool fix_modes, std::string* hex, std::string* err);
// Write `data` to dir/name atomically: temp in dir, fsync, rename, fsync dir.
bool write_file_atomic(const std::string& dir, const std::string& name, const std::string& data,
                       std::string* err);
bool fsync_path(const std::string& path, bool directory);
// mkdir -p; created components get `mode`.
bool make_dirs(const std::string& path, mode_t mode, std::string* err);
// The dir must be a directory owned by the effective user and not writable by group/others.
bool check_private_dir(const std::string& path, bool follow_symlink, std::string* err);
// Prebuilt dirs: trusted (owned by the user or root, not group/other-writable), symlinks followed.
bool check_readonly_dir(const std::string& path, std::string* err);
// NFS, SMB/CIFS, Ceph, Lustre, GPFS, AFS, 9p, FUSE ...: flock is not reliable there.
bool is_network_fs(const std::string& path, std::string* fs_name);
// Blocking exclusive flock on `path` (created 0600). Returns the fd (close to unlock) or -1.
// Retries if the file was unlinked/replaced while waiting (so lock files may be removed safely).
int lock_file(const std::string& path, bool blocking, std::string* err);
// Run argv (no shell). stdout+stderr go to log_path (appended, "" = /dev/null) unless
// `out` is given, in which case stdout is captured there and stderr discarded.
// Returns the exit status, 128+signal if killed, -1 if it could not be run (err set).
// stdin is /dev/null, or `stdin_fd` when >= 0.
int run(const std::vector<std::string>& argv, const std::string& log_path, std::string* out, std::string* err,
        int stdin_fd = -1);
std::string which(const std::string& name); // PATH search, "" if not found
bool is_executable(const std::string& path);
bool remove_tree(const std::string& path);
std::string dir_name(const std::string& path);
std::string real_path(const std::string& path); // "" on error
// Where the file mapped at addr is now (/proc/self/maps: the kernel follows renames of the file
// and of its directories); "" when unknown or deleted.
std::string mapped_path(const void* addr);
// realpath|dev|ino|size|mtime_ns|ctime_ns of the file (following links); "" if missing.
std::string file_signature(const std::string& path);
std::string errno_text(int e);
std::string tail_of_file(const std::string& path, size_t max_bytes);
double now_seconds();

} // namespace sys

// qola_jit_store.cpp: the cache on disk
namespace store {
struct Failure {
    int status;
    std::string msg;
};
enum class Load { missing, broken, loaded, failed };
bool verbose(); // QOLA_JIT_VERBOSE set and not "0"
void say(const std::string& msg); // "qola-jit: msg" on stderr when verbose
// Verify <dir>/<key>.meta and <key>.so (trusted regular files; key, provenance = the unit's content
// key, source and header bundle; size, then sha256) and dlopen exactly the verified file.
Load try_load(const std::string& dir, const std::string& key, const qola_jit_module& m, const qola_jit_entry& e,
              void** handle, std::string* why);
// key = sha256(k_tag_key content_key "\n" compiler_id "\n") (docs/jit-cache.md)
std::string entry_key(const std::string& content_key, const std::string& compiler_id);
// flock <locks>/<name>.lock (on a network file system in /tmp/qola-jit-locks-<uid>/, said once).
int lock_key(const std::string& cache, const std::string& name, std::string* err, bool blocking = true);
// Temp files of dead holders of this key's lock (call with the lock held).
void remove_stale_temps(const std::string& cache, const std::string& key, bool network);
// Temp files (".tmp-<64 hex>...") in `dir` whose lock <lock_prefix><hex> nobody holds: left by killed
// compiles or unpacks. On a network file system only those older than an hour (other hosts).
void sweep_temps(const std::string& cache, const std::string& dir, const std::string& lock_prefix, bool network);
// Under the key's lock: compile the unit into <cache>/<key>.so + .meta.
bool compile_entry(const qola_jit_module& m, const qola_jit_entry& e, const std::string& jit_dir,
                   const std::string& cache, const std::string& compiler, const std::string& compiler_id,
                   const std::string& key, Failure* fail);
} // namespace store

// qola_jit_usage.cpp: recorded usage and the coverage contract (docs/usage.md)
namespace usage {
enum class Coverage { off, strict, report };
// QOLA_JIT_COVERAGE (or qola_usage_configure); an unknown value is strict (fail closed), said once.
Coverage coverage();
// The line of the manifest's [usage] variants that builds this unit ahead.
std::string manifest_line(const qola_jit_module& m, const qola_jit_entry& e);
// Append one record (event: prebuilt | cache | compile | refused | failed | ahead) when recording is on:
// one write() of one line to this process's own file; bounded; never throws.
void record(const qola_jit_module& m, const qola_jit_entry& e, const char* event) noexcept;
} // namespace usage
} // namespace jit
QOLA_NS_END

#endif // QOLA_JIT_INTERNAL_H
