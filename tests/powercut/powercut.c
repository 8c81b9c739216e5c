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

   With POWERCUT_AT_WRITE=N, the process kills itself (SIGKILL) right after its Nth write to a file there:
   a cut at the moment a disk is most likely to hold something half done.

   The test rebuilds the tree from POWERCUT_DIR's own inode down (tests/powercut/image.py) once the
   process is killed. Writes reach the library through write, pwrite, writev and pwritev; a write it cannot
   place (sendfile, copy_file_range) marks its whole file to be copied at the next flush. A flush copies the
   file's bytes as they are then: writes racing it on another thread count as flushed, the one way this
   model is kinder than a disk. Writes through a shared mapping are not seen (LMDB is opened without
   MDB_WRITEMAP). */
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
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FDS 65536
#define WHOLE ((off_t)-1)

struct range { off_t off; off_t len; };
struct node {  /* an inode written since its last flush */
    ino_t ino;
    struct range *ranges;
    size_t count, cap;
    struct node *next;
};
struct fdinfo { char tracked, sync, dir; ino_t ino; };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fdinfo fds[MAX_FDS];
static struct node *dirty;
static char watched[PATH_MAX], shadow[PATH_MAX / 2];
static size_t watched_len;
static int ready;
static long cut_at, writes_seen;  /* POWERCUT_AT_WRITE: the write after which the power goes (0: never) */

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
    const char *w = getenv("POWERCUT_DIR"), *s = getenv("POWERCUT_SHADOW");
    if (!w && !s) return;
    if (!w || !s || !realpath(w, watched) || strlen(s) >= sizeof shadow) {
        static const char msg[] = "powercut: POWERCUT_DIR must name a directory and POWERCUT_SHADOW a shorter path\n";
        real_write(2, msg, sizeof msg - 1);
        abort();
    }
    strcpy(shadow, s);
    const char *at = getenv("POWERCUT_AT_WRITE");
    cut_at = at ? atol(at) : 0;
    watched_len = strlen(watched);
    ready = 1;
}

static void fail(const char *what) {
    /* A record the test cannot trust: end the process loudly rather than let the test pass on it. */
    char msg[256];
    int n = snprintf(msg, sizeof msg, "powercut: %s: %s\n", what, strerror(errno));
    real_write(2, msg, (size_t)n);
    abort();
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

static struct node *node_of(ino_t ino) {  /* under lock */
    for (struct node *n = dirty; n; n = n->next)
        if (n->ino == ino) return n;
    struct node *n = calloc(1, sizeof *n);
    if (!n) fail("calloc");
    n->ino = ino;
    n->next = dirty;
    dirty = n;
    return n;
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

static int pending_file(ino_t ino, int flags) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/pending/%lu", shadow, (unsigned long)ino);
    int fd = real_open(path, flags | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) fail("open pending file");
    return fd;
}

/* A write not flushed yet, kept with its bytes: a cut may still bring any of them to the disk. */
static void pend(ino_t ino, const struct iovec *iov, int iovcnt, off_t off, ssize_t len) {  /* under lock */
    int fd = pending_file(ino, O_WRONLY | O_APPEND);
    int64_t head[2] = {(int64_t)off, (int64_t)len};
    off_t end = lseek(fd, 0, SEEK_END);
    write_all(fd, (const char *)head, sizeof head, end);
    end += (off_t)sizeof head;
    ssize_t left = len;
    for (int i = 0; i < iovcnt && left > 0; i++) {
        size_t part = iov[i].iov_len < (size_t)left ? iov[i].iov_len : (size_t)left;
        write_all(fd, iov[i].iov_base, part, end);
        end += (off_t)part, left -= (ssize_t)part;
    }
    real_close(fd);
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
            int sfd = shadow_file(info.ino);
            ssize_t left = len;
            for (int i = 0; i < iovcnt && left > 0; i++) {
                size_t part = iov[i].iov_len < (size_t)left ? iov[i].iov_len : (size_t)left;
                write_all(sfd, iov[i].iov_base, part, off);
                off += (off_t)part, left -= (ssize_t)part;
            }
            real_close(sfd);
        } else {
            struct node *n = node_of(info.ino);
            if (n->count == n->cap) {
                n->cap = n->cap ? 2 * n->cap : 16;
                n->ranges = realloc(n->ranges, n->cap * sizeof *n->ranges);
                if (!n->ranges) fail("realloc");
            }
            n->ranges[n->count++] = (struct range){off, iov ? (off_t)len : WHOLE};
            if (iov) pend(info.ino, iov, iovcnt, off, len);
        }
        if (++writes_seen == cut_at) {
            /* The power goes now, between this write and whatever was to follow it (its flush, an ack):
               held under the lock, no other thread records anything more. */
            kill(getpid(), SIGKILL);
        }
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
    if (rename(tmp, path)) fail("rename shadow directory");
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
        pthread_mutex_unlock(&lock);
        return;
    }
    struct node **at = &dirty, *n = NULL;
    for (; *at; at = &(*at)->next)
        if ((*at)->ino == info.ino) {
            n = *at;
            *at = n->next;
            break;
        }
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    int src = real_open(link, O_RDONLY | O_CLOEXEC);  /* the descriptor flushed may be write-only */
    if (src < 0) fail("reopen flushed file");
    struct stat st;
    if (fstat(src, &st)) fail("fstat flushed file");
    int sfd = shadow_file(info.ino);
    static char buf[1 << 16];
    for (size_t i = 0; n && i < n->count; i++) {
        off_t off = n->ranges[i].off, end = n->ranges[i].len == WHOLE ? st.st_size : off + n->ranges[i].len;
        if (n->ranges[i].len == WHOLE) off = 0;
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
    if (ftruncate(sfd, st.st_size)) fail("size shadow file");
    real_close(sfd);
    real_close(pending_file(info.ino, O_WRONLY | O_TRUNC));  /* every write so far is flushed now */
    real_close(src);
    if (n) {
        free(n->ranges);
        free(n);
    }
    pthread_mutex_unlock(&lock);
}

static off_t position_before(int fd, ssize_t written) {
    return written > 0 ? lseek(fd, 0, SEEK_CUR) - written : 0;
}

int open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
    int fd = real_open(path, flags, mode);
    note_open(fd);
    return fd;
}
int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int dirfd, const char *path, int flags, ...) {
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = va_arg(ap, mode_t);
        va_end(ap);
    }
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
