/* Local files mapped into the process once and read in place, where their pages are in memory (outcore.storage._chunks).
 *
 * A pread of a chunk held in the page cache has the kernel find each of its 4 KiB pages and copy them into a buffer,
 * which the checksum and the decoder then read again: a quarter of a pixel batch's CPU time (docs/benchmarks.md,
 * "Figures behind the code"). Mapped once, a file's pages are read where they lie: the first read of a page maps it
 * (one fault for 16 pages), every later one costs nothing.
 *
 * `mapped_acquire` gives the mapping of an open file (the whole file, made at its first read and kept), or NULL to
 * read it by pread: MOST_MAPPED files or MOST_MAPPED_BYTES are mapped already (the page tables of a mapping's pages
 * read are 1/512 of their bytes, in each process: a store larger than that is read partly in place, partly by
 * pread, never mapping one file in place of another), or the file cannot be mapped. Mappings are keyed by path:
 * a path whose file changed (another inode, size or modification time: a store rewritten) is mapped anew once no
 * read holds its old mapping, so a replaced file's space is never held for long; one not read for
 * IDLE_NANOSECONDS is unmapped at the next acquire; `mapped_unmap_idle` unmaps a file's (or every) mapping no read
 * holds, found by inode (outcore.storage.chunk_reads.unmap_idle: before pages are evicted, and before a store written
 * over is removed). `mapped_resident` says whether a range's pages are all in
 * memory (mincore): a range that is not is read by pread, which reads it from the device at once, where faults
 * through the mapping would read it a page at a time. (For a file the process may not write and does not own,
 * mincore says only which pages this process has mapped, so such files are read by pread.)
 *
 * A file truncated while it is read through its mapping raises SIGBUS where its pages are gone: `mapped_guarded`
 * runs a read with a handler that returns from it (0: the read failed, and the caller reads the chunk its own
 * way, which names what is wrong). A SIGBUS outside a guarded read goes to the handler there was before, as if
 * this one did not exist. A read cut short so leaks what Blosc allocated for it.
 *
 * Included by _chunks.c after its same_file (whether two statuses are of one version of one file).
 *
 * A forked child inherits the mappings, none of them in use (a fork waits for the table's lock, which is made anew in
 * the child).
 *
 * Bytes read in place are read where they lie: a file rewritten in place as it is read (never by outcore, which
 * writes a new file and renames it) is refused by the caller's stamp check after the read (its modification time
 * changed), as a pread of it would be. */
#ifndef OUTCORE_MAPPED_FILES_H
#define OUTCORE_MAPPED_FILES_H

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MOST_MAPPED 1024                          /* files mapped at once, far below the kernel's 65,530 maps */
#define MOST_MAPPED_BYTES (64ULL << 30)           /* their bytes: the page tables of what is read cost 1/512 of it */
#define IDLE_NANOSECONDS 10000000000LL            /* a mapping not read for this long is unmapped */
#define RESIDENT_PAGES 4096                       /* pages mincore reports on at a time */

typedef struct {
    char *path; /* NULL: a free slot */
    uint64_t hash;
    struct stat stamp;
    uint8_t *base;
    size_t length;
    int users;            /* reads holding it */
    long long last_used;  /* CLOCK_MONOTONIC ns */
} Mapping;

static Mapping mapped[MOST_MAPPED];
static pthread_mutex_t mapped_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long mapped_bytes; /* of the files mapped */
static long long mapped_swept;          /* when idle mappings were last looked for */
static unsigned long long mapped_reads;  /* chunks read through mappings: `mapped()` */
static unsigned long long mapped_shrunk; /* reads cut short by their file shrinking */
static int mapped_on = 1;
static size_t page_bytes;

static long long monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static uint64_t path_hash(const char *path) {
    uint64_t hash = 14695981039346656037ULL; /* FNV-1a */
    for (; *path; path++)
        hash = (hash ^ (uint8_t)*path) * 1099511628211ULL;
    return hash;
}

/* Unmap the slot's file and free the slot (holding the lock, no read holding it). */
static void mapped_drop(Mapping *slot) {
    munmap(slot->base, slot->length);
    mapped_bytes -= slot->length;
    free(slot->path);
    memset(slot, 0, sizeof *slot);
}

/* Unmap every mapping no read holds and none has read since `before`, of the file `only` (its device and inode) or
 * of any (NULL), holding the lock. */
static void mapped_drop_idle(long long before, const struct stat *only) {
    for (int k = 0; k < MOST_MAPPED; k++)
        if (mapped[k].path != NULL && !mapped[k].users && mapped[k].last_used < before &&
            (only == NULL || (mapped[k].stamp.st_dev == only->st_dev && mapped[k].stamp.st_ino == only->st_ino)))
            mapped_drop(&mapped[k]);
}

/* Unmap every mapping no read holds, of the file `only` or of any (NULL): made again at the next reads. */
static void mapped_unmap_idle(const struct stat *only) {
    pthread_mutex_lock(&mapped_lock);
    mapped_drop_idle(LLONG_MAX, only);
    pthread_mutex_unlock(&mapped_lock);
}

/* The mapping of the file open as `fd` at `path` (status `opened`), held until `mapped_release`; NULL to read it
 * by pread. */
static Mapping *mapped_acquire(const char *path, int fd, const struct stat *opened) {
    if (!__atomic_load_n(&mapped_on, __ATOMIC_RELAXED) || opened->st_size <= 0)
        return NULL;
    uint64_t hash = path_hash(path);
    long long now = monotonic_ns();
    Mapping *found = NULL, *free_slot = NULL;
    pthread_mutex_lock(&mapped_lock);
    if (now - mapped_swept > IDLE_NANOSECONDS) {
        mapped_swept = now;
        mapped_drop_idle(now - IDLE_NANOSECONDS, NULL);
    }
    for (int k = 0; k < MOST_MAPPED && found == NULL; k++) {
        Mapping *slot = &mapped[k];
        if (slot->path == NULL)
            free_slot = free_slot ? free_slot : slot;
        else if (slot->hash == hash && strcmp(slot->path, path) == 0)
            found = slot;
    }
    if (found != NULL && !same_file(&found->stamp, opened)) {
        if (found->users) /* the path's earlier file, still read: this read goes by pread */
            found = free_slot = NULL;
        else
            mapped_drop(found);
    }
    if (found == NULL || found->path == NULL) {
        Mapping *slot = found != NULL ? found : free_slot; /* none: as many files as are mapped, the others by pread */
        found = NULL;
        if (slot != NULL && mapped_bytes + (unsigned long long)opened->st_size <= MOST_MAPPED_BYTES) {
            void *base = mmap(NULL, (size_t)opened->st_size, PROT_READ, MAP_SHARED, fd, 0);
            char *copy = base != MAP_FAILED ? strdup(path) : NULL;
            if (copy != NULL) {
                madvise(base, (size_t)opened->st_size, MADV_RANDOM); /* a page evicted meanwhile: that page alone */
                *slot = (Mapping){copy, hash, *opened, base, (size_t)opened->st_size, 0, now};
                mapped_bytes += slot->length;
                found = slot;
            } else if (base != MAP_FAILED) {
                munmap(base, (size_t)opened->st_size);
            }
        }
    }
    if (found != NULL) {
        found->users++;
        found->last_used = now;
    }
    pthread_mutex_unlock(&mapped_lock);
    return found;
}

static void mapped_release(Mapping *mapping) {
    pthread_mutex_lock(&mapped_lock);
    mapping->users--;
    pthread_mutex_unlock(&mapped_lock);
}

/* Whether every page of [start, start + length) is in memory. */
static int mapped_resident(const uint8_t *start, size_t length) {
    unsigned char pages[RESIDENT_PAGES];
    uintptr_t first = (uintptr_t)start & ~(uintptr_t)(page_bytes - 1);
    size_t count = ((uintptr_t)start + length - first + page_bytes - 1) / page_bytes;
    for (size_t done = 0; done < count; done += RESIDENT_PAGES) {
        size_t some = count - done < RESIDENT_PAGES ? count - done : RESIDENT_PAGES;
        if (mincore((void *)(first + done * page_bytes), some * page_bytes, pages) != 0)
            return 0;
        for (size_t k = 0; k < some; k++)
            if (!(pages[k] & 1))
                return 0;
    }
    return 1;
}

static __thread sigjmp_buf *mapped_guard; /* set while this thread reads through a mapping */
static struct sigaction bus_before;
static pthread_once_t bus_once = PTHREAD_ONCE_INIT;

static struct sigaction bus_action;

static void on_bus(int signal, siginfo_t *info, void *context) {
    (void)context;
    if (mapped_guard != NULL && info->si_code > 0) /* a fault in a guarded read: its file shrank */
        siglongjmp(*mapped_guard, 1);
    sigaction(signal, &bus_before, NULL); /* a fault runs again into the handler there was before */
    if (info->si_code <= 0) {             /* sent, not a fault: to that handler, then this one again */
        raise(signal);
        sigaction(signal, &bus_action, NULL);
    }
}

static void install_bus(void) {
    memset(&bus_action, 0, sizeof bus_action);
    bus_action.sa_sigaction = on_bus;
    bus_action.sa_flags = SA_SIGINFO | SA_NODEFER; /* not blocked in the handler: a jump out of it leaves no mask */
    sigemptyset(&bus_action.sa_mask);
    sigaction(SIGBUS, &bus_action, &bus_before);
}

/* A read through a mapping, `read(arg)`, with a file shrinking under it made a failed read (0). */
static int mapped_guarded(int (*read)(void *), void *arg) {
    pthread_once(&bus_once, install_bus);
    sigjmp_buf here;
    volatile int fine = 0;
    mapped_guard = &here;
    if (sigsetjmp(here, 0) == 0)
        fine = read(arg);
    else
        __atomic_add_fetch(&mapped_shrunk, 1, __ATOMIC_RELAXED);
    mapped_guard = NULL;
    return fine;
}

/* A fork waits for the table to be whole (no thread halfway through changing it); the child's reads are its own. */
static void mapped_before_fork(void) { pthread_mutex_lock(&mapped_lock); }

static void mapped_after_fork_in_parent(void) { pthread_mutex_unlock(&mapped_lock); }

static void mapped_after_fork_in_child(void) {
    pthread_mutex_init(&mapped_lock, NULL);
    for (int k = 0; k < MOST_MAPPED; k++)
        mapped[k].users = 0;
}

static void mapped_setup(void) {
    page_bytes = (size_t)sysconf(_SC_PAGESIZE);
    pthread_atfork(mapped_before_fork, mapped_after_fork_in_parent, mapped_after_fork_in_child);
}

#endif
