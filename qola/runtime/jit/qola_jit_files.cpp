// qola_jit_files.cpp — what the JIT runtime reads, it checks first: regular files only (O_NOFOLLOW,
// O_NONBLOCK, fstat before the first byte), bounded sizes, and for the cache: owned by the user or
// root, not writable by group/others. The same rules as qola.jit.safeio on the Python side.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#pragma GCC visibility push(hidden)
#include "qola_jit_internal.h"

QOLA_NS_BEGIN
namespace jit {
namespace sys {

namespace {

const char* kind_of(mode_t m)
{
    if(S_ISDIR(m)) return "a directory";
    if(S_ISFIFO(m)) return "a FIFO";
    if(S_ISCHR(m)) return "a character device";
    if(S_ISBLK(m)) return "a block device";
    if(S_ISSOCK(m)) return "a socket";
    if(S_ISLNK(m)) return "a symlink";
    return "not a regular file";
}

std::string mode_text(mode_t m)
{
    char buf[8];
    snprintf(buf, sizeof buf, "%04o", unsigned(m & 07777));
    return buf;
}
} // namespace

bool trusted_stat(const struct stat& st, std::string* why)
{
    if(st.st_uid != geteuid() && st.st_uid != 0) {
        *why = "owned by uid " + std::to_string(st.st_uid) + ", not by the current user (uid " +
               std::to_string(geteuid()) + ") or root";
        return false;
    }
    if(st.st_mode & (S_IWGRP | S_IWOTH)) {
        *why = "writable by group or others (mode " + mode_text(st.st_mode) + ")";
        return false;
    }
    return true;
}

int open_regular(const std::string& path, bool follow, bool trusted, uint64_t max_bytes, struct stat* st,
                 std::string* err)
{
    int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
    if(fd < 0) {
        int e = errno;
        *err = e == ELOOP && !follow ? "refusing " + path + ": it is a symbolic link"
                                     : "cannot read " + path + ": " + errno_text(e);
        errno = e;
        return -1;
    }
    std::string why;
    if(fstat(fd, st) != 0) why = errno_text(errno);
    else if(!S_ISREG(st->st_mode)) why = std::string("it is ") + kind_of(st->st_mode) + ", not a regular file";
    else if(uint64_t(st->st_size) > max_bytes)
        why = std::to_string(st->st_size) + " bytes, more than the " + std::to_string(max_bytes) + " allowed";
    else if(trusted) trusted_stat(*st, &why);
    if(!why.empty()) {
        close(fd);
        *err = "refusing " + path + ": " + why;
        errno = EPERM;
        return -1;
    }
    return fd;
}

namespace {
bool read_regular(const std::string& path, bool follow, std::string* out, size_t max_bytes, bool trusted,
                  std::string* err)
{
    std::string e;
    struct stat st;
    int fd = open_regular(path, follow, trusted, max_bytes, &st, &e);
    if(fd < 0) {
        if(err) *err = e;
        return false;
    }
    out->clear();
    char buf[8192];
    for(off_t off = 0;;) {
        ssize_t n = pread(fd, buf, sizeof buf, off);
        if(n < 0 && errno == EINTR) continue;
        if(n <= 0 || out->size() + size_t(n) > max_bytes) {
            int e = n < 0 ? errno : EFBIG;
            close(fd);
            if(n != 0 && err) *err = n < 0 ? "cannot read " + path + ": " + errno_text(e) : path + " grew too large";
            errno = e;
            return n == 0;
        }
        out->append(buf, size_t(n));
        off += n;
    }
}
} // namespace

bool read_file(const std::string& path, std::string* out, size_t max_bytes, bool trusted, std::string* err)
{
    return read_regular(path, false, out, max_bytes, trusted, err);
}

bool read_file_follow(const std::string& path, std::string* out, size_t max_bytes, std::string* err)
{
    return read_regular(path, true, out, max_bytes, false, err);
}

bool check_trusted_dir(const std::string& path, std::string* err)
{
    struct stat st;
    if(lstat(path.c_str(), &st) != 0) { *err = "cannot use " + path + ": " + errno_text(errno); return false; }
    std::string why;
    if(!S_ISDIR(st.st_mode)) why = std::string("it is ") + kind_of(st.st_mode) + ", not a directory";
    else trusted_stat(st, &why);
    if(!why.empty()) {
        *err = "refusing JIT cache dir " + path + ": " + why + "; remove it or run `chmod go-w " + path + "`";
        return false;
    }
    return true;
}

namespace {
struct Walk {
    std::string root;
    const char* skip;
    bool fix;
    std::vector<std::pair<std::string, std::string>> files; // relative path, sha256
    size_t entries = 0;
    std::string* err;
};

// fstat `fd` (opened O_NOFOLLOW), optionally clear g/o write bits, then require it trusted.
bool settle(int fd, const std::string& shown, bool fix, struct stat* st, std::string* err)
{
    if(fstat(fd, st) != 0) { *err = shown + ": " + errno_text(errno); return false; }
    if(fix && (st->st_mode & (S_IWGRP | S_IWOTH)) && fchmod(fd, st->st_mode & 07755) == 0) st->st_mode &= 07755;
    std::string why;
    if(!trusted_stat(*st, &why)) { *err = "refusing " + shown + ": " + why; return false; }
    return true;
}

bool walk_dir(int dfd, const std::string& rel, int depth, Walk& w) // takes dfd
{
    DIR* d = fdopendir(dfd);
    if(!d) { close(dfd); *w.err = "cannot list " + w.root + "/" + rel + ": " + errno_text(errno); return false; }
    bool ok = true;
    while(ok) {
        errno = 0;
        struct dirent* de = readdir(d);
        if(!de) {
            if(errno) { *w.err = "cannot list " + w.root + "/" + rel + ": " + errno_text(errno); ok = false; }
            break;
        }
        std::string name = de->d_name;
        if(name == "." || name == ".." || (depth == 0 && w.skip && name == w.skip)) continue;
        std::string r = rel.empty() ? name : rel + "/" + name, shown = w.root + "/" + r;
        struct stat st;
        if(++w.entries > fmt::k_max_tree_entries) { *w.err = w.root + ": too many files"; ok = false; }
        else if(name.find('\n') != std::string::npos) { *w.err = "refusing " + shown + ": newline in name"; ok = false; }
        else if(fstatat(dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
            *w.err = shown + ": " + errno_text(errno);
            ok = false;
        } else if(S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd(d), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if(sub < 0) { *w.err = shown + ": " + errno_text(errno); ok = false; }
            else if(depth + 1 > fmt::k_max_tree_depth) { close(sub); *w.err = shown + ": nested too deeply"; ok = false; }
            else if(!settle(sub, shown, w.fix, &st, w.err)) { close(sub); ok = false; }
            else ok = walk_dir(sub, r, depth + 1, w);
        } else if(S_ISREG(st.st_mode)) {
            int f = openat(dirfd(d), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
            std::string hex;
            uint64_t size = 0;
            if(f < 0) { *w.err = shown + ": " + errno_text(errno); ok = false; }
            else if(!settle(f, shown, w.fix, &st, w.err)) ok = false;
            else if(!S_ISREG(st.st_mode) || uint64_t(st.st_size) > fmt::k_max_source) {
                *w.err = "refusing " + shown + ": not a regular file of a sensible size";
                ok = false;
            } else if(!sha256_fd(f, &hex, &size)) { *w.err = "cannot read " + shown; ok = false; }
            else w.files.emplace_back(r, hex);
            if(f >= 0) close(f);
        } else {
            *w.err = "refusing " + shown + ": it is " + kind_of(st.st_mode) + ", not a regular file";
            ok = false;
        }
    }
    closedir(d);
    return ok;
}
} // namespace

bool tree_digest(const std::string& dir, const char* skip, bool fix_modes, std::string* hex, std::string* err)
{
    int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if(fd < 0) { *err = "cannot open " + dir + ": " + errno_text(errno); return false; }
    struct stat st;
    if(!settle(fd, dir, fix_modes, &st, err)) { close(fd); return false; }
    Walk w{dir, skip, fix_modes, {}, 0, err};
    if(!walk_dir(fd, "", 0, w)) return false;
    std::sort(w.files.begin(), w.files.end());
    Sha256 s;
    s.update(fmt::k_tag_headers, sizeof fmt::k_tag_headers - 1);
    for(const auto& f : w.files) {
        std::string line = f.first + "\n" + f.second + "\n";
        s.update(line.data(), line.size());
    }
    *hex = s.hex();
    return true;
}

std::string tail_of_file(const std::string& path, size_t max_bytes)
{
    struct stat st;
    std::string err;
    int fd = open_regular(path, false, false, ~0ull, &st, &err);
    if(fd < 0) return std::string();
    off_t start = st.st_size > off_t(max_bytes) ? st.st_size - off_t(max_bytes) : 0;
    std::string out(size_t(st.st_size - start), '\0');
    ssize_t n = pread(fd, &out[0], out.size(), start);
    close(fd);
    out.resize(n > 0 ? size_t(n) : 0);
    return start > 0 ? "..." + out : out;
}

} // namespace sys
} // namespace jit
QOLA_NS_END
#pragma GCC visibility pop
