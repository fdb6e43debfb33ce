/* A fault-injecting file layer for tests, loaded with LD_PRELOAD (outcore.testing.faults builds it).

   The opens and reads of files whose path contains OUTCORE_FAULT_MATCH fail as a failing disk or file
   server makes them fail, as the environment says:
     OUTCORE_FAULT_ERRNO  the errno the call fails with (EIO = 5, EINTR = 4, EAGAIN = 11, ESTALE = 116)
     OUTCORE_FAULT_ON     "read" (pread, preadv, preadv2) or "open" (open, openat)
     OUTCORE_FAULT_TIMES  how many calls fail, then the rest succeed (a transient fault); -1: every call
     OUTCORE_FAULT_SHORT  "1": reads return at most half of what was asked (at least one byte) instead
   Every other call goes to the C library unchanged. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static const char *match;
static int fault_errno, on_open, short_reads;
static atomic_long remaining;
static atomic_int configured;

static void configure(void) {
    if (atomic_load(&configured)) return;
    match = getenv("OUTCORE_FAULT_MATCH");
    const char *number = getenv("OUTCORE_FAULT_ERRNO"), *on = getenv("OUTCORE_FAULT_ON");
    const char *times = getenv("OUTCORE_FAULT_TIMES"), *shorten = getenv("OUTCORE_FAULT_SHORT");
    fault_errno = number ? atoi(number) : EIO;
    on_open = on && strcmp(on, "open") == 0;
    short_reads = shorten && strcmp(shorten, "1") == 0;
    atomic_store(&remaining, times ? atol(times) : -1);
    atomic_store(&configured, 1);
}

/* Whether this call fails: its path matches, and faults are left (each one taken counts). */
static int faulty(const char *path) {
    configure();
    if (!match || !*match || !path || !strstr(path, match)) return 0;
    long left = atomic_load(&remaining);
    while (left != 0) {
        if (left < 0) return 1;
        if (atomic_compare_exchange_weak(&remaining, &left, left - 1)) return 1;
    }
    return 0;
}

static int faulty_fd(int fd) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t length = readlink(link, path, sizeof path - 1);
    if (length < 0) return 0;
    path[length] = '\0';
    return faulty(path);
}

/* A read of `count` bytes: how many to ask of the C library, or -1 (errno set) for a failed call. */
static ssize_t allowed(int fd, size_t count) {
    configure();
    if (on_open || !faulty_fd(fd)) return (ssize_t)count;
    if (short_reads) return count > 1 ? (ssize_t)(count / 2) : (ssize_t)count;
    errno = fault_errno;
    return -1;
}

ssize_t pread(int fd, void *buffer, size_t count, off_t offset) {
    static ssize_t (*real)(int, void *, size_t, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "pread");
    ssize_t asked = allowed(fd, count);
    return asked < 0 ? -1 : real(fd, buffer, (size_t)asked, offset);
}

ssize_t pread64(int fd, void *buffer, size_t count, off_t offset) __attribute__((alias("pread")));

ssize_t preadv(int fd, const struct iovec *vectors, int count, off_t offset) {
    static ssize_t (*real)(int, const struct iovec *, int, off_t);
    if (!real) real = dlsym(RTLD_NEXT, "preadv");
    size_t total = 0;
    for (int i = 0; i < count; i++) total += vectors[i].iov_len;
    ssize_t asked = allowed(fd, total);
    if (asked < 0) return -1;
    if ((size_t)asked == total) return real(fd, vectors, count, offset);
    struct iovec first = {vectors[0].iov_base, vectors[0].iov_len < (size_t)asked ? vectors[0].iov_len : (size_t)asked};
    return real(fd, &first, 1, offset);
}

ssize_t preadv64(int fd, const struct iovec *vectors, int count, off_t offset) __attribute__((alias("preadv")));

/* CPython's os.preadv calls this one (glibc's preadv64v2). */
ssize_t preadv2(int fd, const struct iovec *vectors, int count, off_t offset, int flags) {
    static ssize_t (*real)(int, const struct iovec *, int, off_t, int);
    if (!real) real = dlsym(RTLD_NEXT, "preadv2");
    size_t total = 0;
    for (int i = 0; i < count; i++) total += vectors[i].iov_len;
    ssize_t asked = allowed(fd, total);
    if (asked < 0) return -1;
    if ((size_t)asked == total) return real(fd, vectors, count, offset, flags);
    struct iovec first = {vectors[0].iov_base, vectors[0].iov_len < (size_t)asked ? vectors[0].iov_len : (size_t)asked};
    return real(fd, &first, 1, offset, flags);
}

ssize_t preadv64v2(int fd, const struct iovec *vectors, int count, off_t offset, int flags)
    __attribute__((alias("preadv2")));

static int opened(const char *path, int flags, va_list arguments, int at, int directory) {
    mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(arguments, mode_t) : 0;
    configure();
    if (on_open && faulty(path)) {
        errno = fault_errno;
        return -1;
    }
    if (at) {
        static int (*real_at)(int, const char *, int, ...);
        if (!real_at) real_at = dlsym(RTLD_NEXT, "openat");
        return real_at(directory, path, flags, mode);
    }
    static int (*real)(const char *, int, ...);
    if (!real) real = dlsym(RTLD_NEXT, "open");
    return real(path, flags, mode);
}

int open(const char *path, int flags, ...) {
    va_list arguments;
    va_start(arguments, flags);
    int fd = opened(path, flags, arguments, 0, 0);
    va_end(arguments);
    return fd;
}

int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int directory, const char *path, int flags, ...) {
    va_list arguments;
    va_start(arguments, flags);
    int fd = opened(path, flags, arguments, 1, directory);
    va_end(arguments);
    return fd;
}

int openat64(int directory, const char *path, int flags, ...) __attribute__((alias("openat")));
