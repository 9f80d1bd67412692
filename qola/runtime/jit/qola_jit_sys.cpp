// qola_jit_sys.cpp — files, directories, locks and child processes for the JIT runtime.
// libc only. Every fd is O_CLOEXEC so a compiler child never inherits a lock.
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <vector>

extern char** environ; // declared before the pragma: it lives in libc

#pragma GCC visibility push(hidden)
#include "qola_jit_internal.h"

QOLA_NS_BEGIN
namespace jit {
namespace sys {

// ---------------------------------------------------------------- files and dirs
std::string errno_text(int e) { return std::string(strerror(e)); }

std::string env(const char* name)
{
    const char* v = getenv(name);
    return v ? std::string(v) : std::string();
}

bool fsync_path(const std::string& path, bool directory)
{
    int fd = open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
    if(fd < 0) return false;
    bool ok = fsync(fd) == 0 || errno == EINVAL;
    close(fd);
    return ok;
}

bool write_file_atomic(const std::string& dir, const std::string& name, const std::string& data, std::string* err)
{
    std::string tmpl = fmt::in(dir, fmt::temp_prefix(name) + fmt::k_temp_random);
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    int fd = mkostemp(buf.data(), O_CLOEXEC);
    if(fd < 0) { *err = "cannot create a file in " + dir + ": " + errno_text(errno); return false; }
    std::string tmp(buf.data());
    size_t done = 0;
    while(done < data.size()) {
        ssize_t n = write(fd, data.data() + done, data.size() - done);
        if(n < 0 && errno == EINTR) continue;
        if(n <= 0) break;
        done += size_t(n);
    }
    bool ok = done == data.size() && fchmod(fd, fmt::k_file_mode) == 0 && fsync(fd) == 0;
    int e = errno;
    close(fd);
    if(ok && rename(tmp.c_str(), (dir + "/" + name).c_str()) == 0) {
        fsync_path(dir, true);
        return true;
    }
    if(ok) e = errno;
    unlink(tmp.c_str());
    *err = "cannot write " + dir + "/" + name + ": " + errno_text(e);
    return false;
}

bool make_dirs(const std::string& path, mode_t mode, std::string* err)
{
    struct stat st;
    if(stat(path.c_str(), &st) == 0) {
        if(S_ISDIR(st.st_mode)) return true;
        *err = path + " exists and is not a directory";
        return false;
    }
    std::string parent = dir_name(path);
    if(parent != path && !make_dirs(parent, mode, err)) return false;
    if(mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
        *err = "cannot create " + path + ": " + errno_text(errno);
        return false;
    }
    return true;
}

bool check_private_dir(const std::string& path, bool follow_symlink, std::string* err)
{
    struct stat st;
    int rc = follow_symlink ? stat(path.c_str(), &st) : lstat(path.c_str(), &st);
    if(rc != 0) { *err = "cannot use " + path + ": " + errno_text(errno); return false; }
    if(!S_ISDIR(st.st_mode)) { *err = path + " is not a directory"; return false; }
    if(st.st_uid != geteuid()) {
        *err = "refusing JIT cache dir " + path + ": owned by uid " + std::to_string(st.st_uid) +
               ", not by the current user (uid " + std::to_string(geteuid()) +
               "); set QOLA_JIT_CACHE_DIR to a directory of your own";
        return false;
    }
    if(st.st_mode & (S_IWGRP | S_IWOTH)) {
        char mode[8];
        snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
        *err = "refusing JIT cache dir " + path + ": writable by group or others (mode " + mode +
               "); run `chmod go-w " + path + "` or set QOLA_JIT_CACHE_DIR";
        return false;
    }
    return true;
}

bool check_readonly_dir(const std::string& path, std::string* err)
{
    struct stat st;
    if(stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) { *err = path + " is not a directory"; return false; }
    std::string why;
    if(!trusted_stat(st, &why)) {
        *err = "refusing prebuilt dir " + path + ": " + why;
        return false;
    }
    return true;
}

bool is_network_fs(const std::string& path, std::string* fs_name)
{
    struct statfs sf;
    if(statfs(path.c_str(), &sf) != 0) return false;
    for(const auto& k : fmt::k_network_fs)
        if((unsigned long)(unsigned int)sf.f_type == k.magic) { *fs_name = k.name; return true; }
    return false;
}

int lock_file(const std::string& path, bool blocking, std::string* err)
{
    for(int attempt = 0; attempt < 100; ++attempt) {
        int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, fmt::k_private_mode);
        if(fd < 0) { *err = "cannot open lock " + path + ": " + errno_text(errno); return -1; }
        int rc;
        do rc = flock(fd, blocking ? LOCK_EX : LOCK_EX | LOCK_NB);
        while(rc != 0 && errno == EINTR);
        if(rc != 0) {
            *err = errno == EWOULDBLOCK ? "busy" : "cannot lock " + path + ": " + errno_text(errno);
            close(fd);
            return -1;
        }
        struct stat a, b;
        if(fstat(fd, &a) == 0 && stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            return fd;
        close(fd); // the file was removed or replaced while we waited: lock the new one
    }
    *err = "cannot lock " + path + ": it keeps being replaced";
    return -1;
}

// ---------------------------------------------------------------- processes
int run(const std::vector<std::string>& argv, const std::string& log_path, std::string* out, std::string* err,
        int stdin_fd)
{
    std::vector<char*> args;
    for(const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    if(stdin_fd >= 0) posix_spawn_file_actions_adddup2(&fa, stdin_fd, 0);
    else posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    int pipefd[2] = {-1, -1};
    if(out) {
        if(pipe2(pipefd, O_CLOEXEC) != 0) { *err = "pipe: " + errno_text(errno); return -1; }
        posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
        posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    } else {
        const char* log = log_path.empty() ? "/dev/null" : log_path.c_str();
        posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW, fmt::k_private_mode);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
    }
    // hipcc needs HIP_PLATFORM=amd (Debian's falls back to nvcc without it): the child gets it when unset;
    // our own process environment is never changed
    std::vector<char*> envp;
    static char hip_platform[] = "HIP_PLATFORM=amd";
    const std::string& exe = argv[0];
    const std::string base = exe.substr(exe.find_last_of('/') == std::string::npos ? 0 : exe.find_last_of('/') + 1);
    for(char** e = environ; e && *e; ++e) envp.push_back(*e);
    if(base.find("hip") != std::string::npos && getenv("HIP_PLATFORM") == nullptr) envp.push_back(hip_platform);
    envp.push_back(nullptr);
    pid_t pid;
    int rc = posix_spawn(&pid, args[0], &fa, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if(out) close(pipefd[1]);
    if(rc != 0) {
        if(out) close(pipefd[0]);
        *err = "cannot run " + argv[0] + ": " + errno_text(rc);
        return -1;
    }
    if(out) {
        out->clear();
        char buf[4096];
        for(;;) {
            ssize_t n = read(pipefd[0], buf, sizeof buf);
            if(n < 0 && errno == EINTR) continue;
            if(n <= 0) break;
            if(out->size() < (1u << 20)) out->append(buf, size_t(n));
        }
        close(pipefd[0]);
    }
    int status = 0;
    pid_t w;
    do w = waitpid(pid, &status, 0);
    while(w < 0 && errno == EINTR);
    if(w < 0) { *err = "waitpid(" + argv[0] + "): " + errno_text(errno) + " (is SIGCHLD ignored?)"; return -1; }
    if(WIFEXITED(status)) return WEXITSTATUS(status);
    if(WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return -1;
}

bool is_executable(const std::string& path)
{
    struct stat st;
    return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string which(const std::string& name)
{
    if(name.find('/') != std::string::npos) return is_executable(name) ? name : std::string();
    std::string path = env("PATH");
    size_t start = 0;
    while(start <= path.size()) {
        size_t end = path.find(':', start);
        if(end == std::string::npos) end = path.size();
        std::string dir = path.substr(start, end - start);
        start = end + 1;
        if(dir.empty() || dir[0] != '/') continue; // never relative PATH entries
        std::string cand = dir + (dir.back() == '/' ? "" : "/") + name;
        if(is_executable(cand)) return cand;
    }
    return std::string();
}

namespace {
int remove_one(const char* p, const struct stat*, int, struct FTW*)
{
    remove(p);
    return 0; // keep going: remove what can be removed
}
} // namespace

bool remove_tree(const std::string& path)
{
    nftw(path.c_str(), remove_one, 16, FTW_DEPTH | FTW_PHYS);
    struct stat st;
    return lstat(path.c_str(), &st) != 0;
}

std::string dir_name(const std::string& path)
{
    size_t slash = path.find_last_of('/');
    if(slash == std::string::npos) return ".";
    if(slash == 0) return "/";
    return path.substr(0, slash);
}

std::string real_path(const std::string& path)
{
    char buf[PATH_MAX];
    return realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

std::string mapped_path(const void* addr)
{
    FILE* f = fopen("/proc/self/maps", "re");
    if(!f) return std::string();
    char* line = nullptr;
    size_t cap = 0;
    std::string found;
    const unsigned long a = reinterpret_cast<unsigned long>(addr);
    while(getline(&line, &cap, f) > 0) {
        unsigned long lo = 0, hi = 0;
        int n = 0;
        // start-end perms offset dev inode path
        if(sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &n) < 2 || n <= 0) continue;
        if(a < lo || a >= hi) continue;
        std::string p(line + n);
        while(!p.empty() && p.back() == '\n') p.pop_back();
        static const std::string deleted = " (deleted)";
        if(p.empty() || p[0] != '/' ||
           (p.size() >= deleted.size() && p.compare(p.size() - deleted.size(), deleted.size(), deleted) == 0))
            break;
        found = p;
        break;
    }
    free(line);
    fclose(f);
    return found;
}

std::string file_signature(const std::string& path)
{
    struct stat st;
    if(stat(path.c_str(), &st) != 0) return std::string();
    char buf[256];
    snprintf(buf, sizeof buf, "|%llu|%llu|%lld|%lld.%09ld|%lld.%09ld", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
             st.st_mtim.tv_nsec, (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
    return real_path(path) + buf;
}

double now_seconds()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

} // namespace sys
} // namespace jit
QOLA_NS_END
#pragma GCC visibility pop
