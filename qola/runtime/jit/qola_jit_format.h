// qola_jit_format.h — the JIT cache format as the runtime spells it: every name, tag, .meta field,
// mode and limit, once (not installed for users; the runtime's sources include it through
// qola_jit_internal.h). The spec is docs/jit-cache.md; the Python side is qola/jit/format.py, and
// tests/jit/test_jit_format.py checks each constant here against it and that the runtime's sources
// spell none of these strings inline — change both sides (and the doc) together.
#ifndef QOLA_JIT_FORMAT_H
#define QOLA_JIT_FORMAT_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/types.h>

#include "qola_jit.h"

QOLA_NS_BEGIN
namespace jit {
namespace fmt {

// keys: sha256 over a domain tag and '\n'-separated fields, 64 lowercase hex digits
constexpr char k_tag_headers[] = "qola-jit-headers-v1\n";
constexpr char k_tag_compiler[] = "qola-jit-compiler-v1\n";
constexpr char k_tag_key[] = "qola-jit-key-v1\n";
constexpr size_t k_key_len = 64;

// an entry: <key>.so + <key>.meta
constexpr char k_so_suffix[] = ".so";
constexpr char k_meta_suffix[] = ".meta";
constexpr char k_meta_head[] = "qola-jit-entry 1\n";
// "<field> <value>\n" each, in this order, after k_meta_head
constexpr const char* k_meta_fields[] = {"key", "size", "sha256", "unit", "module", "compiler", "compiler_id",
                                         "content_key", "source_sha256", "headers_sha256", "created"};
constexpr size_t k_n_meta_fields = sizeof k_meta_fields / sizeof k_meta_fields[0];
constexpr size_t k_max_size_digits = 19;

// the cache dir
constexpr char k_logs[] = "logs";
constexpr char k_headers[] = "headers";
constexpr char k_compilers[] = "compilers";
constexpr char k_locks[] = "locks";
constexpr const char* k_subdirs[] = {k_logs, k_headers, k_compilers, k_locks};
constexpr char k_temp_prefix[] = ".tmp-";
constexpr char k_temp_random[] = "XXXXXX"; // mkstemp's template, after temp_prefix(name)
constexpr char k_stale_infix[] = "-stale-";
constexpr char k_lock_suffix[] = ".lock";
constexpr char k_log_suffix[] = ".log";
constexpr char k_headers_lock_prefix[] = "headers-";
constexpr char k_complete[] = ".qola-complete";
constexpr char k_complete_text[] = "ok\n";
constexpr char k_network_lock_dir[] = "/tmp/qola-jit-locks-"; // + uid
constexpr char k_memo_head[] = "qola-jit-compiler 1\n";
constexpr char k_memo_suffix[] = ".id";
constexpr size_t k_memo_name_len = 32;

// modes, staleness, limits
constexpr mode_t k_dir_mode = 0700;
constexpr mode_t k_file_mode = 0644;
constexpr mode_t k_private_mode = 0600;
constexpr long k_network_stale_s = 3600;
constexpr uint64_t k_max_meta = 64ull << 10;
constexpr uint64_t k_max_memo = 4ull << 10;
constexpr uint64_t k_max_source = 256ull << 20;
constexpr uint64_t k_max_object = 8ull << 30;
constexpr size_t k_max_tree_entries = 200000;
constexpr int k_max_tree_depth = 64;

// file systems where flock does not coordinate hosts (statfs f_type): locks go to k_network_lock_dir
struct network_fs_name {
    unsigned long magic;
    const char* name;
};
constexpr network_fs_name k_network_fs[] = {
    {0x6969, "nfs"},          {0x517B, "smb"},         {0xFF534D42, "cifs"},   {0xFE534D42, "smb2"},
    {0x00C36400, "ceph"},     {0x0BD00BD0, "lustre"},  {0x47504653, "gpfs"},   {0x5346414F, "afs"},
    {0x01021997, "9p"},       {0x65735546, "fuse"},    {0x19830326, "beegfs"}, {0xAAD7AAEA, "panfs"},
    {0x20030528, "orangefs"}, {0x7461636F, "ocfs2"},   {0x01161970, "gfs2"}};

// settings
constexpr char k_env_cache_dir[] = "QOLA_JIT_CACHE_DIR";
constexpr char k_env_jit[] = "QOLA_JIT";
constexpr char k_env_compiler[] = "QOLA_JIT_COMPILER";
constexpr char k_env_prebuilt[] = "QOLA_JIT_PREBUILT_DIR";
constexpr char k_env_source_dir[] = "QOLA_JIT_SOURCE_DIR";
constexpr char k_env_verbose[] = "QOLA_JIT_VERBOSE";
constexpr char k_xdg_subdir[] = "/qola/jit";
constexpr char k_home_subdir[] = "/.cache/qola/jit";
constexpr char k_prebuilt[] = "prebuilt";

// recorded usage and the coverage contract (docs/usage.md)
constexpr char k_env_usage_dir[] = "QOLA_USAGE_DIR"; // opt-in: one record file per process in this dir
constexpr char k_env_coverage[] = "QOLA_JIT_COVERAGE"; // "strict" | "report" | unset/"off"
constexpr char k_usage_head[] = "qola-usage 1"; // first field of every record line
constexpr char k_usage_prefix[] = "qola-usage-"; // record files: <prefix><host>-<pid>-<rand><suffix>
constexpr char k_usage_suffix[] = ".rec";
constexpr size_t k_usage_max_line = 1024; // one write() per record, well under PIPE_BUF
constexpr uint64_t k_usage_max_file = 1ull << 20; // a process stops recording at this size
constexpr size_t k_usage_sum_len = 16; // hex digits of sha256(line before the sum) ending a record
constexpr char k_usage_ahead[] = "ahead"; // the event of a recorded unit built ahead into the library

// a unit's flags
constexpr char k_headers_token[] = "@QOLA_JIT_HEADERS@";
constexpr char k_dir_token[] = "@QOLA_JIT_DIR@";

// names (qola.jit.format's functions of the same names)
inline std::string so_name(const std::string& key) { return key + k_so_suffix; }
inline std::string meta_name(const std::string& key) { return key + k_meta_suffix; }
inline std::string lock_name(const std::string& name) { return name + k_lock_suffix; }
inline std::string log_name(const std::string& name) { return name + k_log_suffix; }
inline std::string temp_prefix(const std::string& name) { return k_temp_prefix + name + "-"; }
inline std::string headers_lock(const std::string& sha) { return k_headers_lock_prefix + sha; }
inline std::string stale_aside(const std::string& sha, long pid)
{
    return k_temp_prefix + sha + k_stale_infix + std::to_string(pid);
}
inline std::string in(const std::string& dir, const std::string& name) { return dir + "/" + name; }

} // namespace fmt
} // namespace jit
QOLA_NS_END

#endif // QOLA_JIT_FORMAT_H
