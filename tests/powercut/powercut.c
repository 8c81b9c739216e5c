/* A power cut's view of the disk, for a process run with LD_PRELOAD set to this library.

   A power cut keeps of a file only what was flushed: the ranges written before an fsync or fdatasync of
   it returned, and what was written through a descriptor opened O_SYNC or O_DSYNC; of a directory, the
   entries it held when it was last flushed. This library records that much, beside the real writes,
   which it lets through unchanged: the process runs as it would, while a shadow directory
   (POWERCUT_SHADOW) holds what a power cut at any moment would leave of the files under POWERCUT_DIR:

     inodes/<ino>   a file's flushed bytes (a file never flushed has none);
     dirs/<ino>     a directory's flushed entries, one "<ino> <d_type> <name>" line each;
     pending/<ino>  the writes to a file since its last flush, in order: offset and length (two native
                    64-bit integers), then the bytes; any of them may reach the disk before a cut.

   With POWERCUT_AT_STEP=N, the power goes right after the Nth step there (a write, a flush or a rename),
   counted over the process and the processes it starts: every one of them is killed (SIGKILL) at once, a
   cut at the moment a disk is most likely to hold something half done. shadow/steps holds the count.

   The test rebuilds the tree from POWERCUT_DIR's own inode down (tests/powercut/image.py) once the
   process is killed. Writes reach the library through write, pwrite, writev and pwritev; a write it
   cannot place (sendfile, copy_file_range) marks its whole file to be copied at the next flush. Every
   process recorded appends to the same pending/<ino>, so a flush in one takes the writes of another (a
   forked child's copy flushed by its parent). A flush copies the file's bytes as they are then: writes
   racing it on another thread count as flushed, the one way this model is kinder than a disk. Writes
   through a shared mapping are not seen (LMDB is opened without MDB_WRITEMAP). */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FDS 65536

struct fdinfo { char tracked, sync, dir; ino_t ino; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fdinfo fds[MAX_FDS];
static char watched[PATH_MAX], shadow[PATH_MAX / 2];
static size_t watched_len;
static int ready;
static long cut_at;  /* POWERCUT_AT_STEP: the step after which the power goes (0: never) */
#define MAX_PROCESSES 256
/* shadow/steps, mapped by every process recorded: the steps so far, and who they are (a pid and its start
   time, which tells it from a later process given the same pid), for the cut to end them all at once. */
struct shared {
    long steps;
    int processes;
    struct { pid_t pid; unsigned long long started; } process[MAX_PROCESSES];
};
static struct shared *shared;

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_close)(int);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static ssize_t (*real_pwritev)(int, const struct iovec *, int, off_t);
static ssize_t (*real_pwritev2)(int, const struct iovec *, int, off_t, int);
static ssize_t (*real_sendfile)(int, int, off_t *, size_t);
static ssize_t (*real_copy_file_range)(int, off_t *, int, off_t *, size_t, unsigned int);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_renameat)(int, const char *, int, const char *);
static int (*real_renameat2)(int, const char *, int, const char *, unsigned int);

static void fail(const char *what) {
    /* A record the test cannot trust: end the process loudly rather than let the test pass on it. */
    char msg[256];
    int n = snprintf(msg, sizeof msg, "powercut: %s: %s\n", what, strerror(errno));
    real_write(2, msg, (size_t)n);
    abort();
}

static unsigned long long started(pid_t pid) {
    /* Field 22 of /proc/<pid>/stat, after the command in parentheses: when the process started. */
    char path[64], text[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = real_open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, text, sizeof text - 1);
    real_close(fd);
    if (n <= 0) return 0;
    text[n] = 0;
    char *at = strrchr(text, ')');
    for (int field = 2; at && field < 22; field++) at = strchr(at + 1, ' ');
    return at ? strtoull(at + 1, NULL, 10) : 0;
}

static void joined(void) {  /* this process is one the cut ends */
    int i = __atomic_fetch_add(&shared->processes, 1, __ATOMIC_SEQ_CST);
    if (i >= MAX_PROCESSES) fail("too many processes recorded");
    shared->process[i].started = started(getpid());
    __atomic_store_n(&shared->process[i].pid, getpid(), __ATOMIC_SEQ_CST);
}

/* Held over a fork: a child forked while another thread records a write would find the lock taken for ever. */
static void before_fork(void) { pthread_mutex_lock(&lock); }
static void after_fork(void) { pthread_mutex_unlock(&lock); }
static void after_fork_in_child(void) {
    pthread_mutex_unlock(&lock);
    joined();
}

__attribute__((constructor)) static void init(void) {
    real_open = dlsym(RTLD_NEXT, "open");
    real_openat = dlsym(RTLD_NEXT, "openat");
    real_close = dlsym(RTLD_NEXT, "close");
    real_write = dlsym(RTLD_NEXT, "write");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_pwritev = dlsym(RTLD_NEXT, "pwritev");
    real_pwritev2 = dlsym(RTLD_NEXT, "pwritev2");
    real_sendfile = dlsym(RTLD_NEXT, "sendfile");
    real_copy_file_range = dlsym(RTLD_NEXT, "copy_file_range");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_renameat = dlsym(RTLD_NEXT, "renameat");
    real_renameat2 = dlsym(RTLD_NEXT, "renameat2");
    const char *w = getenv("POWERCUT_DIR"), *s = getenv("POWERCUT_SHADOW");
    if (!w && !s) return;
    if (!w || !s || !realpath(w, watched) || strlen(s) >= sizeof shadow) {
        static const char msg[] = "powercut: POWERCUT_DIR must name a directory and POWERCUT_SHADOW a shorter path\n";
        real_write(2, msg, sizeof msg - 1);
        abort();
    }
    strcpy(shadow, s);
    const char *at = getenv("POWERCUT_AT_STEP");
    cut_at = at ? atol(at) : 0;
    /* One count for the processes the recorded one starts too (a forked child inherits the mapping, an
       exec'd one maps the file again): a cut at the Nth step is at one moment of them all. */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/steps", shadow);
    int fd = real_open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, sizeof *shared)) fail("open the count of steps");
    shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (shared == MAP_FAILED) fail("map the count of steps");
    real_close(fd);
    joined();
    pthread_atfork(before_fork, after_fork, after_fork_in_child);
    watched_len = strlen(watched);
    ready = 1;
}

static void note_open(int fd) {
    if (!ready || fd < 0 || fd >= MAX_FDS) return;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    struct fdinfo info = {0};
    if (n > 0) {
        path[n] = 0;
        if (strncmp(path, watched, watched_len) == 0 && (path[watched_len] == 0 || path[watched_len] == '/')) {
            struct stat st;
            int flags = fcntl(fd, F_GETFL);
            if (fstat(fd, &st) == 0 && (S_ISREG(st.st_mode) || S_ISDIR(st.st_mode))) {
                info.tracked = 1;
                info.dir = S_ISDIR(st.st_mode);
                info.ino = st.st_ino;
                info.sync = (flags & (O_SYNC | O_DSYNC)) != 0;
            }
        }
    }
    pthread_mutex_lock(&lock);
    fds[fd] = info;
    pthread_mutex_unlock(&lock);
}

/* A write, flush or rename has returned: if it is the step to cut at, the power goes now, before whatever
   was to follow it (a flush, an ack). Under the lock: no other thread of this process records more. */
static void step(void) {
    if (__atomic_add_fetch(&shared->steps, 1, __ATOMIC_SEQ_CST) != cut_at) return;
    int count = __atomic_load_n(&shared->processes, __ATOMIC_SEQ_CST);
    for (int i = 0; i < count && i < MAX_PROCESSES; i++) {
        pid_t pid = __atomic_load_n(&shared->process[i].pid, __ATOMIC_SEQ_CST);
        if (pid > 0 && pid != getpid() && started(pid) == shared->process[i].started) kill(pid, SIGKILL);
    }
    kill(getpid(), SIGKILL);
}

static int shadow_file(ino_t ino) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/inodes/%lu", shadow, (unsigned long)ino);
    int fd = real_open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) fail("open shadow file");
    return fd;
}

static void write_all(int fd, const char *buf, size_t len, off_t off) {
    while (len) {
        ssize_t n = real_pwrite(fd, buf, len, off);
        if (n < 0) {
            if (errno == EINTR) continue;
            fail("write shadow file");
        }
        buf += n, len -= (size_t)n, off += n;
    }
}

/* pending/<ino>, locked (flock) against the other processes recorded: each appends its writes to the
   file there, and a flush by any of them (the page cache is theirs in common) takes the lot. */
static int pending_locked(ino_t ino) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/pending/%lu", shadow, (unsigned long)ino);
    int fd = real_open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) fail("open pending file");
    while (flock(fd, LOCK_EX))
        if (errno != EINTR) fail("lock pending file");
    return fd;
}

static void unlock_pending(int fd) {
    flock(fd, LOCK_UN);
    real_close(fd);
}

/* A write not flushed yet, kept with its bytes (len -1 and none: a write placed nowhere, its whole file
   to copy at the next flush): a cut may still bring any of them to the disk. */
static void pend(ino_t ino, const struct iovec *iov, int iovcnt, off_t off, ssize_t len) {
    size_t size = 2 * sizeof(int64_t) + (iov ? (size_t)len : 0);
    char *record = malloc(size);
    if (!record) fail("malloc");
    int64_t head[2] = {(int64_t)off, iov ? (int64_t)len : -1};
    memcpy(record, head, sizeof head);
    size_t at = sizeof head;
    ssize_t left = iov ? len : 0;
    for (int i = 0; i < iovcnt && left > 0; i++) {
        size_t part = iov[i].iov_len < (size_t)left ? iov[i].iov_len : (size_t)left;
        memcpy(record + at, iov[i].iov_base, part);
        at += part, left -= (ssize_t)part;
    }
    int fd = pending_locked(ino);
    write_all(fd, record, size, lseek(fd, 0, SEEK_END));
    unlock_pending(fd);
    free(record);
}

/* A write of len bytes at off has returned: flushed at once through a synchronous descriptor, else
   left for the next flush. */
static void wrote(int fd, const struct iovec *iov, int iovcnt, off_t off, ssize_t len) {
    if (!ready || len <= 0 || off < 0 || fd < 0 || fd >= MAX_FDS) return;
    pthread_mutex_lock(&lock);
    struct fdinfo info = fds[fd];
    struct stat st;
    /* The same file still: a descriptor closed other than through close() may have been reused. */
    if (info.tracked && !info.dir && fstat(fd, &st) == 0 && st.st_ino == info.ino) {
        if (info.sync) {
            int held = pending_locked(info.ino);  /* not amid another process's flush of the file */
            int sfd = shadow_file(info.ino);
            ssize_t left = len;
            for (int i = 0; i < iovcnt && left > 0; i++) {
                size_t part = iov[i].iov_len < (size_t)left ? iov[i].iov_len : (size_t)left;
                write_all(sfd, iov[i].iov_base, part, off);
                off += (off_t)part, left -= (ssize_t)part;
            }
            real_close(sfd);
            unlock_pending(held);
        } else {
            pend(info.ino, iov, iovcnt, off, len);
        }
        step();
    }
    pthread_mutex_unlock(&lock);
}

static void flush_dir(int fd, ino_t ino) {
    char path[PATH_MAX], tmp[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/dirs/%lu", shadow, (unsigned long)ino);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int dfd = real_openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) fail("open directory");
    DIR *d = fdopendir(dfd);
    if (!d) fail("fdopendir");
    int out = real_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0) fail("open shadow directory");
    struct dirent *e;
    char line[PATH_MAX + 64];
    off_t at = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        int n = snprintf(line, sizeof line, "%lu %u %s\n", (unsigned long)e->d_ino, (unsigned)e->d_type, e->d_name);
        write_all(out, line, (size_t)n, at);
        at += n;
    }
    closedir(d);
    real_close(out);
    if (real_renameat(AT_FDCWD, tmp, AT_FDCWD, path)) fail("rename shadow directory");
}

/* After a flush of fd returned: its inode's written ranges (or its entries) are the power cut's now. */
static void flushed(int fd) {
    if (!ready || fd < 0 || fd >= MAX_FDS) return;
    pthread_mutex_lock(&lock);
    struct fdinfo info = fds[fd];
    struct stat now;
    if (!info.tracked || fstat(fd, &now) || now.st_ino != info.ino) {
        pthread_mutex_unlock(&lock);
        return;
    }
    if (info.dir) {
        flush_dir(fd, info.ino);
        step();
        pthread_mutex_unlock(&lock);
        return;
    }
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    int src = real_open(link, O_RDONLY | O_CLOEXEC);  /* the descriptor flushed may be write-only */
    if (src < 0) fail("reopen flushed file");
    int held = pending_locked(info.ino);
    struct stat st, log;
    if (fstat(src, &st) || fstat(held, &log)) fail("fstat flushed file");
    char *pending = log.st_size ? malloc((size_t)log.st_size) : NULL;
    if (log.st_size && (!pending || pread(held, pending, (size_t)log.st_size, 0) != log.st_size)) fail("read pending file");
    int sfd = shadow_file(info.ino);
    static char buf[1 << 16];
    for (off_t at = 0; at < log.st_size;) {
        int64_t head[2];
        memcpy(head, pending + at, sizeof head);
        at += (off_t)sizeof head + (head[1] < 0 ? 0 : head[1]);
        /* The file's bytes as they are now, which the flush wrote: a later write may have changed them. */
        off_t off = head[1] < 0 ? 0 : head[0], end = head[1] < 0 ? st.st_size : head[0] + head[1];
        if (end > st.st_size) end = st.st_size;  /* cut since: the size below says so */
        while (off < end) {
            size_t want = (size_t)(end - off) < sizeof buf ? (size_t)(end - off) : sizeof buf;
            ssize_t got = pread(src, buf, want, off);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) fail("read flushed file");
            write_all(sfd, buf, (size_t)got, off);
            off += got;
        }
    }
    free(pending);
    if (ftruncate(sfd, st.st_size)) fail("size shadow file");
    real_close(sfd);
    if (ftruncate(held, 0)) fail("empty pending file");  /* every write so far is flushed now */
    unlock_pending(held);
    real_close(src);
    step();
    pthread_mutex_unlock(&lock);
}

static off_t position_before(int fd, ssize_t written) {
    return written > 0 ? lseek(fd, 0, SEEK_CUR) - written : 0;
}

/* An open's mode, its variadic argument: there only with O_CREAT or O_TMPFILE. */
#define MODE_ARGUMENT(flags, mode)                \
    do {                                          \
        if ((flags) & (O_CREAT | O_TMPFILE)) {    \
            va_list ap;                           \
            va_start(ap, flags);                  \
            (mode) = va_arg(ap, mode_t);          \
            va_end(ap);                           \
        }                                         \
    } while (0)

int open(const char *path, int flags, ...) {
    mode_t mode = 0;
    MODE_ARGUMENT(flags, mode);
    int fd = real_open(path, flags, mode);
    note_open(fd);
    return fd;
}
int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int dirfd, const char *path, int flags, ...) {
    mode_t mode = 0;
    MODE_ARGUMENT(flags, mode);
    int fd = real_openat(dirfd, path, flags, mode);
    note_open(fd);
    return fd;
}
int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));

int __open_2(const char *path, int flags) { return open(path, flags); }
int __open64_2(const char *path, int flags) { return open(path, flags); }
int __openat_2(int dirfd, const char *path, int flags) { return openat(dirfd, path, flags); }
int __openat64_2(int dirfd, const char *path, int flags) { return openat(dirfd, path, flags); }
int creat(const char *path, mode_t mode) { return open(path, O_WRONLY | O_CREAT | O_TRUNC, mode); }
int creat64(const char *path, mode_t mode) __attribute__((alias("creat")));

int close(int fd) {
    if (ready && fd >= 0 && fd < MAX_FDS) {
        pthread_mutex_lock(&lock);
        fds[fd].tracked = 0;
        pthread_mutex_unlock(&lock);
    }
    return real_close(fd);
}

ssize_t write(int fd, const void *buf, size_t len) {
    ssize_t n = real_write(fd, buf, len);
    struct iovec iov = {(void *)buf, len};
    if (n > 0) wrote(fd, &iov, 1, position_before(fd, n), n);
    return n;
}

ssize_t pwrite(int fd, const void *buf, size_t len, off_t off) {
    ssize_t n = real_pwrite(fd, buf, len, off);
    struct iovec iov = {(void *)buf, len};
    wrote(fd, &iov, 1, off, n);
    return n;
}
ssize_t pwrite64(int fd, const void *buf, size_t len, off_t off) __attribute__((alias("pwrite")));

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    ssize_t n = real_writev(fd, iov, iovcnt);
    if (n > 0) wrote(fd, iov, iovcnt, position_before(fd, n), n);
    return n;
}

ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t off) {
    ssize_t n = real_pwritev(fd, iov, iovcnt, off);
    wrote(fd, iov, iovcnt, off, n);
    return n;
}
ssize_t pwritev64(int fd, const struct iovec *iov, int iovcnt, off_t off) __attribute__((alias("pwritev")));

ssize_t pwritev2(int fd, const struct iovec *iov, int iovcnt, off_t off, int flags) {
    off_t at = off == -1 ? lseek(fd, 0, SEEK_CUR) : off;
    ssize_t n = real_pwritev2(fd, iov, iovcnt, off, flags);
    wrote(fd, iov, iovcnt, at, n);
    return n;
}
ssize_t pwritev64v2(int fd, const struct iovec *iov, int iovcnt, off_t off, int flags)
    __attribute__((alias("pwritev2")));

ssize_t sendfile(int out, int in, off_t *off, size_t count) {
    ssize_t n = real_sendfile(out, in, off, count);
    wrote(out, NULL, 0, 0, n);  /* placed nowhere: the whole file is copied at its next flush */
    return n;
}
ssize_t sendfile64(int out, int in, off_t *off, size_t count) __attribute__((alias("sendfile")));

ssize_t copy_file_range(int in, off_t *in_off, int out, off_t *out_off, size_t len, unsigned int flags) {
    ssize_t n = real_copy_file_range(in, in_off, out, out_off, len, flags);
    wrote(out, NULL, 0, 0, n);
    return n;
}

static int watched_path(int dirfd, const char *path) {
    /* Whether a rename's path lies under POWERCUT_DIR (resolved through its directory, which exists). */
    char dir[PATH_MAX], link[64], full[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (path[0] == '/' || dirfd == AT_FDCWD) {
        if (!slash) return getcwd(full, sizeof full) && strncmp(full, watched, watched_len) == 0;
        size_t len = (size_t)(slash - path);
        if (len >= sizeof dir) return 0;
        memcpy(dir, path, len);
        dir[len] = 0;
        if (!realpath(len ? dir : "/", full)) return 0;
    } else {
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, full, sizeof full - 1);
        if (n <= 0) return 0;
        full[n] = 0;
    }
    return strncmp(full, watched, watched_len) == 0 && (full[watched_len] == 0 || full[watched_len] == '/');
}

static void renamed(int olddirfd, const char *oldpath, int r) {
    if (!ready || r != 0 || !watched_path(olddirfd, oldpath)) return;
    pthread_mutex_lock(&lock);
    step();
    pthread_mutex_unlock(&lock);
}

int rename(const char *oldpath, const char *newpath) {
    int r = real_renameat(AT_FDCWD, oldpath, AT_FDCWD, newpath);
    renamed(AT_FDCWD, newpath, r);
    return r;
}

int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath) {
    int r = real_renameat(olddirfd, oldpath, newdirfd, newpath);
    renamed(newdirfd, newpath, r);
    return r;
}

int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags) {
    int r = real_renameat2(olddirfd, oldpath, newdirfd, newpath, flags);
    renamed(newdirfd, newpath, r);
    return r;
}

int fsync(int fd) {
    int r = real_fsync(fd);
    if (r == 0) flushed(fd);
    return r;
}

int fdatasync(int fd) {
    int r = real_fdatasync(fd);
    if (r == 0) flushed(fd);
    return r;
}
