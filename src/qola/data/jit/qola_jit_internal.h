// qola_jit_internal.h — helpers shared by the JIT runtime's sources (not installed for users).
// Everything here is hidden: the runtime's .cpp files wrap it in `#pragma GCC visibility`.
#ifndef QOLA_JIT_INTERNAL_H
#define QOLA_JIT_INTERNAL_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/types.h>
#include <vector>

#include "qola_jit.h"

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
bool read_file(const std::string& path, std::string* out, size_t max_bytes);
// Write `data` to dir/name atomically: temp in dir, fsync, rename, fsync dir.
bool write_file_atomic(const std::string& dir, const std::string& name, const std::string& data,
                       std::string* err);
bool fsync_path(const std::string& path, bool directory);
// mkdir -p; created components get `mode`.
bool make_dirs(const std::string& path, mode_t mode, std::string* err);
// The dir must be a directory owned by the effective user and not writable by group/others.
bool check_private_dir(const std::string& path, bool follow_symlink, std::string* err);
// Prebuilt dirs may be owned by root, but must not be writable by others than their owner.
bool check_readonly_dir(const std::string& path, std::string* err);
// NFS, SMB/CIFS, Ceph, Lustre, GPFS, AFS, 9p, FUSE ...: flock is not reliable there.
bool is_network_fs(const std::string& path, std::string* fs_name);
// Blocking exclusive flock on `path` (created 0600). Returns the fd (close to unlock) or -1.
// Retries if the file was unlinked/replaced while waiting (so lock files may be removed safely).
int lock_file(const std::string& path, bool blocking, std::string* err);
// Run argv (no shell). stdout+stderr go to log_path (appended, "" = /dev/null) unless
// `out` is given, in which case stdout is captured there and stderr discarded.
// Returns the exit status, 128+signal if killed, -1 if it could not be run (err set).
int run(const std::vector<std::string>& argv, const std::string& log_path, std::string* out, std::string* err);
std::string which(const std::string& name); // PATH search, "" if not found
bool is_executable(const std::string& path);
bool remove_tree(const std::string& path);
std::string dir_name(const std::string& path);
std::string real_path(const std::string& path); // "" on error
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
// Verify <dir>/<key>.meta and <key>.so (size, sha256, key) and dlopen exactly the verified file.
Load try_load(const std::string& dir, const std::string& key, void** handle, std::string* why);
// flock the key's lock (on a network file system in /tmp/qola-jit-locks-<uid>/, said once).
int lock_key(const std::string& cache, const std::string& key, std::string* err);
// Temp files of dead holders of this key's lock (call with the lock held).
void remove_stale_temps(const std::string& cache, const std::string& key, bool network);
// Under the key's lock: compile the unit into <cache>/<key>.so + .meta.
bool compile_entry(const qola_jit_module& m, const qola_jit_entry& e, const std::string& jit_dir,
                   const std::string& cache, const std::string& compiler, const std::string& compiler_id,
                   const std::string& key, Failure* fail);
} // namespace store
} // namespace jit
QOLA_NS_END

#endif // QOLA_JIT_INTERNAL_H
