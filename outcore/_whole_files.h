/* Whole regular files read by outcore's C extensions where the GIL is released: the ingest's pictures, read by
 * _chunks.read_file and read_files and by _jpeg.check_files alike, each as much as fstat said when it was opened and
 * nothing past it (a file that grew or shrank meanwhile is not read). POSIX only. */
#ifndef OUTCORE_WHOLE_FILES_H
#define OUTCORE_WHOLE_FILES_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* Fill the iovecs from the file at `offset`, reads that return less continued: 1 when all came, 0 otherwise. */
static int read_all(int fd, struct iovec *parts, int count, off_t offset) {
    while (count) {
        ssize_t got;
        do
            got = preadv(fd, parts, count, offset);
        while (got < 0 && errno == EINTR);
        if (got <= 0)
            return 0;
        offset += got;
        while (count && (size_t)got >= parts->iov_len) {
            got -= (ssize_t)parts->iov_len;
            parts++, count--;
        }
        if (count) {
            parts->iov_base = (uint8_t *)parts->iov_base + got;
            parts->iov_len -= (size_t)got;
        }
    }
    return 1;
}

/* Whether `path` names a file of this machine: not a record's reference (FILE::WHAT) nor a URL, which the caller's
 * reader reads. */
static int local_path(const char *path) { return strstr(path, "::") == NULL && strstr(path, "://") == NULL; }

/* The regular file at `path` opened, its size in `size`: the descriptor, or -1 (nothing left open). */
static int open_regular(const char *path, size_t *size) {
    struct stat opened;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && (fstat(fd, &opened) != 0 || !S_ISREG(opened.st_mode))) {
        close(fd);
        fd = -1;
    }
    *size = fd >= 0 ? (size_t)opened.st_size : 0;
    return fd;
}

/* Read the `size` bytes of the open file `fd` into `into`, find nothing past them (it had that size when opened),
 * and close it: 1 when all came and nothing more, 0 otherwise. */
static int read_to_end(int fd, void *into, size_t size) {
    struct iovec whole = {into, size};
    char beyond;
    ssize_t more;
    int fine = size == 0 || read_all(fd, &whole, 1, 0);
    do
        more = pread(fd, &beyond, 1, (off_t)size);
    while (more < 0 && errno == EINTR);
    close(fd);
    return fine && more == 0;
}

#endif
