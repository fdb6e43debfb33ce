/* outcore.storage._chunks: one chunk of a local shard file read, checked and decoded in one call outside the GIL.
 *
 * read(path, offset, nbytes, scratch, out, blosc): opens the file, reads its bytes [offset, offset + nbytes) (a
 * chunk: its encoded bytes, then their crc32c), checks the crc32c and decodes the bytes into `out` (a Blosc frame
 * that must decode to exactly out's bytes, or out's bytes as they are), and closes the file. It returns the
 * file's stamp, (inode, modification time in ns, size), as fstat gave it when the file was opened and again once
 * read, or None when anything differs from that: the file cannot be opened or is shorter, the checksum, the
 * frame or its decoding fails, or the file changed while it was read. None says nothing of why: the caller reads
 * the chunk again its own way (outcore.storage.shard_reader), which names what is wrong. `scratch` (a writable
 * buffer of nbytes or more) holds a Blosc frame; uncompressed bytes are read straight into out. On Linux a chunk whose
 * pages are all in memory is checked and decoded in place, through its file's mapping, made at the file's first read
 * and kept (_mapped_files.h: map_files(on) turns this off and on, unmap_idle(path) unmaps, mapped() counts).
 *
 * A chunk read by Python's own calls releases and takes the GIL again at each of its seven system calls and the
 * checksum and codec calls, and runs a dozen Python calls between them; here it is released once.
 *
 * read_file(path): a whole regular file's bytes (a picture file, at ingest), the GIL released twice instead of at
 * each of Python's five system calls (open, fstat, read, the read that finds the end, close); None when it cannot
 * be read so: the caller reads it its own way, which names what is wrong.
 *
 * encode(chunks, ...): a shard's chunks compressed (Blosc) and checksummed, back to back, in one call outside the GIL
 * (outcore.storage.shard_writer writes a shard file so).
 *
 * crc32c(buffer[, value]): the CRC-32C of the buffer's bytes (as the crc32c package gives it), for the tests.
 *
 * join(blobs, out): a chunk's samples (files, label maps, ragged rows) back to back in its region, in one copy outside
 * the GIL (outcore.storage.encoded writes an encoded or ragged field so).
 *
 * Blosc is numcodecs' own (the library it holds, which zarr uses): `bind(path)` finds blosc_decompress_ctx (and
 * blosc_compress_ctx) in numcodecs' module at `path`. `read` needs the CRC32 instruction of x86-64 (SSE 4.2) or ARMv8; HARDWARE says
 * whether this machine has it. Where it does not, or where the module is not built, the chunks are read by
 * Python's calls (the same bytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../_free_time.h"
#include "../_stream_copy.h"

#include <stdint.h>
#include <string.h>

#if defined(__unix__) || defined(__APPLE__)
#define OUTCORE_POSIX
#include <dlfcn.h>

#include "../_whole_files.h" /* errno, fcntl, sys/stat, sys/uio, unistd: the POSIX file calls */
#endif

#define CHECKSUM_BYTES 4
#define BLOSC_HEADER 16 /* a Blosc frame's header: nbytes at byte 4, cbytes at byte 12 */
#define BLOSC_FORMAT 2    /* byte 0 of the frames of Blosc 1 (numcodecs'), whose flags are byte 2 */
#define BLOSC_MEMCPYED 2  /* a flag: the chunk's bytes follow the header as they are (a raw frame, level 0) */

typedef int (*blosc_decompress_ctx_t)(const void *source, void *dest, size_t destsize, int numinternalthreads);
static blosc_decompress_ctx_t blosc_decompress_ctx;
typedef int (*blosc_compress_ctx_t)(int clevel, int doshuffle, size_t typesize, size_t nbytes, const void *src,
                                    void *dest, size_t destsize, const char *compressor, size_t blocksize,
                                    int numinternalthreads);
static blosc_compress_ctx_t blosc_compress_ctx;
#define BLOSC_OVERHEAD 16 /* the most a Blosc frame adds to its bytes (BLOSC_MAX_OVERHEAD) */

/* The CRC-32C with the CPU's instruction: STEP64 and STEP8 move the register (the CRC before its final inversion)
 * over 8 bytes and 1. One chain of them waits for each step's result, which takes the instruction several cycles;
 * three independent chains over three lanes of a buffer keep it busy every cycle (docs/benchmarks.md, "Figures
 * behind the code"). A lane's register is then carried over the lanes after it: the register after LANE zero bytes
 * is linear in the register before, so it is the XOR of a table entry for each of its 4 bytes (`carried`), the
 * tables made at import by the instruction itself. */
#if defined(__GNUC__) && defined(__x86_64__)
#define OUTCORE_CRC
#include <nmmintrin.h>
#define CRC_TARGET __attribute__((target("sse4.2")))
#define STEP64(reg, word) _mm_crc32_u64(reg, word)
#define STEP8(reg, byte) _mm_crc32_u8(reg, byte)

static int has_instruction(void) { return __builtin_cpu_supports("sse4.2"); }
#elif defined(__GNUC__) && defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
#define OUTCORE_CRC
#include <arm_acle.h>
#define CRC_TARGET
#define STEP64(reg, word) __crc32cd(reg, word)
#define STEP8(reg, byte) __crc32cb(reg, byte)

static int has_instruction(void) { return 1; }
#endif

static int hardware;

#ifdef OUTCORE_CRC
#define LANE 4096 /* the bytes of each of the three lanes a round checks */

static uint32_t carry_table[4][256]; /* carry_table[k][b]: the register after LANE zero bytes from b << 8k */

static uint32_t carried(uint32_t reg) {
    return carry_table[0][reg & 255] ^ carry_table[1][(reg >> 8) & 255] ^ carry_table[2][(reg >> 16) & 255] ^
           carry_table[3][reg >> 24];
}

static inline uint64_t word_at(const uint8_t *data) {
    uint64_t word;
    memcpy(&word, data, 8);
    return word;
}

/* The register after `size` bytes from `data`, one chain. */
CRC_TARGET static uint32_t chain(uint32_t reg, const uint8_t *data, size_t size) {
    uint64_t value = reg;
    for (; size >= 8; size -= 8, data += 8)
        value = STEP64(value, word_at(data));
    reg = (uint32_t)value;
    for (; size; size--, data++)
        reg = STEP8(reg, *data);
    return reg;
}

/* The register after `size` bytes from `data`: rounds of three lanes, then one chain for the rest. */
CRC_TARGET static uint32_t lanes(uint32_t reg, const uint8_t *data, size_t size) {
    for (; size >= 3 * LANE; size -= 3 * LANE, data += 3 * LANE) {
        uint64_t first = reg, second = 0, third = 0;
        for (size_t at = 0; at < LANE; at += 8) {
            first = STEP64(first, word_at(data + at));
            second = STEP64(second, word_at(data + LANE + at));
            third = STEP64(third, word_at(data + 2 * LANE + at));
        }
        reg = carried(carried((uint32_t)first) ^ (uint32_t)second) ^ (uint32_t)third;
    }
    return chain(reg, data, size);
}

static void check_hardware(void) {
    static const uint8_t zeros[LANE];
    hardware = has_instruction() != 0;
    if (!hardware)
        return;
    uint32_t bit[32]; /* the register after LANE zero bytes from each single bit */
    for (int k = 0; k < 32; k++)
        bit[k] = chain(1u << k, zeros, LANE);
    for (int k = 0; k < 4; k++)
        for (int b = 0; b < 256; b++) {
            uint32_t sum = 0;
            for (int i = 0; i < 8; i++)
                if (b >> i & 1)
                    sum ^= bit[8 * k + i];
            carry_table[k][b] = sum;
        }
}

/* The CRC-32C of `size` bytes from `data`, continuing from `crc` (0 to start). */
static uint32_t crc32c(uint32_t crc, const uint8_t *data, size_t size) { return ~lanes(~crc, data, size); }
#else
static void check_hardware(void) { hardware = 0; }
#endif

#if defined(OUTCORE_POSIX) && defined(OUTCORE_CRC)
static int64_t mtime_ns(const struct stat *status) {
#if defined(__APPLE__)
    return (int64_t)status->st_mtimespec.tv_sec * 1000000000 + status->st_mtimespec.tv_nsec;
#else
    return (int64_t)status->st_mtim.tv_sec * 1000000000 + status->st_mtim.tv_nsec;
#endif
}

/* Whether two statuses are of one version of one file: its device and inode, size and modification time. */
static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && mtime_ns(a) == mtime_ns(b) && a->st_size == b->st_size;
}

#if defined(__linux__)
#define OUTCORE_MAPPED
#include "_mapped_files.h" /* files mapped once, chunks in memory read in place (same_file: a mapping's version) */
#endif

static uint32_t little_u32(const uint8_t *bytes) {
    return (uint32_t)bytes[0] | (uint32_t)bytes[1] << 8 | (uint32_t)bytes[2] << 16 | (uint32_t)bytes[3] << 24;
}

#define COPY_BLOCK (12 * LANE) /* checked, then copied while the core's caches hold it (`checked_copy`) */

/* The CRC-32C of `size` bytes from `data`, continuing from `crc`, the bytes copied into `out` a block at a time,
 * each right after it is checked: one pass over them through memory, where a check then a copy of the whole made
 * two (docs/benchmarks.md, "Figures behind the code"). `out` holds them before they are known good: its caller
 * tells. */
static uint32_t checked_copy(uint32_t crc, const uint8_t *data, size_t size, uint8_t *out) {
    for (size_t at = 0; at < size; at += COPY_BLOCK) {
        size_t part = size - at < COPY_BLOCK ? size - at : COPY_BLOCK;
        crc = crc32c(crc, data + at, part);
        stream_copy(out + at, data + at, part);
    }
    stream_fence();
    return crc;
}

/* Whether the Blosc frame of `data_bytes` whose header is `header` is raw (`out_bytes` of a chunk as they are). */
static int raw_frame(const uint8_t *header, size_t data_bytes, size_t out_bytes) {
    return header[0] == BLOSC_FORMAT && header[2] & BLOSC_MEMCPYED && data_bytes == out_bytes + BLOSC_HEADER &&
           little_u32(header + 4) == out_bytes && little_u32(header + 12) == data_bytes;
}

/* The chunk's bytes `data` and their stored crc32c checked and decoded into out: 1 when they were (out may hold
 * anything when they were not). Uncompressed bytes are copied into out as they are checked, unless they were read
 * there, and so are those of a raw Blosc frame (its header checked first; Blosc's own copy of one runs slower). */
static int decode_chunk(const uint8_t *data, size_t data_bytes, const uint8_t *stored, uint8_t *out, size_t out_bytes,
                        int compressed) {
    if (!compressed) {
        if (data_bytes != out_bytes)
            return 0;
        return (data == out ? crc32c(0, data, data_bytes) : checked_copy(0, data, data_bytes, out)) == little_u32(stored);
    }
    if (data_bytes < BLOSC_HEADER || little_u32(data + 4) != out_bytes || little_u32(data + 12) != data_bytes)
        return 0; /* a frame of another size would leave part of out as it was */
    if (raw_frame(data, data_bytes, out_bytes))
        return checked_copy(crc32c(0, data, BLOSC_HEADER), data + BLOSC_HEADER, out_bytes, out) == little_u32(stored);
    if (crc32c(0, data, data_bytes) != little_u32(stored))
        return 0;
    return blosc_decompress_ctx(data, out, out_bytes, 1) == (int)out_bytes;
}

/* A chunk of the size of a raw frame read by pread: its bytes straight into out, no copy made. 1 when it was read
 * and checked; a compressed frame of that size (Blosc keeps one that fits) is put together in scratch and decoded. */
static int read_raw_frame(int fd, off_t offset, size_t data_bytes, uint8_t *scratch, uint8_t *out, size_t out_bytes) {
    uint8_t header[BLOSC_HEADER], stored[CHECKSUM_BYTES];
    struct iovec parts[3] = {{header, BLOSC_HEADER}, {out, out_bytes}, {stored, CHECKSUM_BYTES}};
    if (!read_all(fd, parts, 3, offset))
        return 0;
    if (raw_frame(header, data_bytes, out_bytes))
        return crc32c(crc32c(0, header, BLOSC_HEADER), out, out_bytes) == little_u32(stored);
    memcpy(scratch, header, BLOSC_HEADER);
    memcpy(scratch + BLOSC_HEADER, out, out_bytes);
    return decode_chunk(scratch, data_bytes, stored, out, out_bytes, 1);
}

/* The chunk read into out by pread (through scratch when compressed, but for a raw frame's bytes): 1 when it was
 * read, checked and decoded. */
static int read_chunk(int fd, off_t offset, size_t nbytes, uint8_t *scratch, uint8_t *out, size_t out_bytes,
                      int compressed) {
    size_t data_bytes = nbytes - CHECKSUM_BYTES;
    uint8_t stored[CHECKSUM_BYTES];
    uint8_t *data = compressed ? scratch : out;
    if (compressed && data_bytes == out_bytes + BLOSC_HEADER)
        return read_raw_frame(fd, offset, data_bytes, scratch, out, out_bytes);
    if (!compressed && data_bytes != out_bytes)
        return 0;
    struct iovec parts[2] = {{data, data_bytes}, {stored, CHECKSUM_BYTES}};
    return read_all(fd, parts, 2, offset) && decode_chunk(data, data_bytes, stored, out, out_bytes, compressed);
}

#ifdef OUTCORE_MAPPED
typedef struct {
    const uint8_t *data; /* in the file's mapping */
    size_t data_bytes;
    uint8_t *out;
    size_t out_bytes;
    int compressed;
} InPlace;

static int decode_in_place(void *arg) {
    const InPlace *chunk = arg;
    return decode_chunk(chunk->data, chunk->data_bytes, chunk->data + chunk->data_bytes, chunk->out, chunk->out_bytes,
                        chunk->compressed);
}
#endif

/* The chunk of the file open as `fd` (at `path`, status `opened`) read into out: in place through the file's mapping
 * where its pages are all in memory (`_mapped_files.h`), else by pread. 1 when it was read, checked and decoded. */
static int read_chunk_of(const char *path, int fd, const struct stat *opened, off_t offset, size_t nbytes,
                         uint8_t *scratch, uint8_t *out, size_t out_bytes, int compressed) {
#ifdef OUTCORE_MAPPED
    Mapping *mapping = offset + (off_t)nbytes <= opened->st_size ? mapped_acquire(path, fd, opened) : NULL;
    if (mapping != NULL) {
        InPlace chunk = {mapping->base + offset, nbytes - CHECKSUM_BYTES, out, out_bytes, compressed};
        int resident = mapped_resident(chunk.data, nbytes), fine = resident && mapped_guarded(decode_in_place, &chunk);
        mapped_release(mapping);
        if (resident) {
            __atomic_add_fetch(&mapped_reads, 1, __ATOMIC_RELAXED);
            return fine;
        }
    }
#else
    (void)path;
    (void)opened;
#endif
    return read_chunk(fd, offset, nbytes, scratch, out, out_bytes, compressed);
}

/* The chunk at [offset, offset + nbytes) of the file at `path` read, checked and decoded into out (called without
 * the GIL): 1, with the file's status as it was opened in `opened`, when it was, and the file did not change as it
 * was read. */
static int read_one(const char *path, off_t offset, size_t nbytes, uint8_t *scratch, uint8_t *out, size_t out_bytes,
                    int compressed, struct stat *opened) {
    struct stat after;
    int fine = 0, fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
#ifdef POSIX_FADV_RANDOM
        posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM); /* a chunk's exact range: read-ahead would read beyond it */
#endif
        fine = fstat(fd, opened) == 0 && S_ISREG(opened->st_mode) &&
               read_chunk_of(path, fd, opened, offset, nbytes, scratch, out, out_bytes, compressed) &&
               fstat(fd, &after) == 0 &&
               same_file(opened, &after);
        close(fd);
    }
    return fine;
}

#include "_batch_engine.h" /* Engine: a run of plain batches made on C threads, its chunks read by read_one */

/* The file's stamp (inode, mtime_ns, size) as a tuple, or None when the read failed. */
static PyObject *stamp_of(int fine, const struct stat *opened) {
    if (!fine)
        return Py_NewRef(Py_None);
    return Py_BuildValue("(KLL)", (unsigned long long)opened->st_ino, (long long)mtime_ns(opened),
                         (long long)opened->st_size);
}

/* Whether a read's arguments can be read so: its buffers C-contiguous, a scratch large enough, Blosc bound; a
 * ValueError or RuntimeError set otherwise. */
static int readable(const Py_buffer *scratch, const Py_buffer *out, long long offset, Py_ssize_t nbytes,
                    int compressed) {
    if (!PyBuffer_IsContiguous(out, 'C') || !PyBuffer_IsContiguous(scratch, 'C')) {
        PyErr_SetString(PyExc_ValueError, "scratch and out must be C-contiguous");
        return 0;
    }
    if (offset < 0 || nbytes < CHECKSUM_BYTES || (compressed && scratch->len < nbytes)) {
        PyErr_SetString(PyExc_ValueError, "need offset >= 0, nbytes >= 4 and a scratch buffer of nbytes or more");
        return 0;
    }
    if (compressed && blosc_decompress_ctx == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Blosc is not bound: call bind() first");
        return 0;
    }
    return 1;
}

static PyObject *py_read(PyObject *self, PyObject *args) {
    PyObject *path;
    long long offset;
    Py_ssize_t nbytes;
    Py_buffer scratch, out;
    int compressed;
    if (!PyArg_ParseTuple(args, "O&Lnw*w*p:read", PyUnicode_FSConverter, &path, &offset, &nbytes, &scratch, &out,
                          &compressed))
        return NULL;
    PyObject *result = NULL;
    if (readable(&scratch, &out, offset, nbytes, compressed)) {
        struct stat opened;
        int fine;
        FREE_BEGIN;
        fine = read_one(PyBytes_AS_STRING(path), (off_t)offset, (size_t)nbytes, scratch.buf, out.buf, (size_t)out.len,
                        compressed, &opened);
        FREE_END;
        result = stamp_of(fine, &opened);
    }
    Py_DECREF(path);
    PyBuffer_Release(&scratch);
    PyBuffer_Release(&out);
    return result;
}

typedef struct {
    PyObject *path; /* bytes */
    long long offset;
    Py_ssize_t nbytes;
    Py_buffer out;
    int compressed, fine;
    struct stat opened;
} Read;

/* Several chunks read as `read` reads one, one after the other through one scratch buffer, the GIL released once
 * for them all (a chunk's fields): a list of their stamps, None for each that failed. */
static PyObject *py_read_many(PyObject *self, PyObject *args) {
    PyObject *requests;
    Py_buffer scratch;
    if (!PyArg_ParseTuple(args, "Ow*:read_many", &requests, &scratch))
        return NULL;
    PyObject *sequence = PySequence_Fast(requests, "read_many: requests must be a sequence"), *result = NULL;
    Py_ssize_t count = sequence ? PySequence_Fast_GET_SIZE(sequence) : 0, got = 0;
    Read *reads = sequence ? PyMem_Calloc(count ? count : 1, sizeof(Read)) : NULL;
    if (sequence != NULL && reads == NULL)
        PyErr_NoMemory();
    for (; reads != NULL && got < count; got++) {
        Read *r = &reads[got];
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(sequence, got), "O&Lnw*p:read_many", PyUnicode_FSConverter,
                              &r->path, &r->offset, &r->nbytes, &r->out, &r->compressed))
            break;
        if (!readable(&scratch, &r->out, r->offset, r->nbytes, r->compressed)) {
            got++; /* its path and buffer are released below */
            break;
        }
    }
    if (reads != NULL && got == count && !PyErr_Occurred()) {
        FREE_BEGIN;
        for (Py_ssize_t i = 0; i < count; i++) {
            Read *r = &reads[i];
            r->fine = read_one(PyBytes_AS_STRING(r->path), (off_t)r->offset, (size_t)r->nbytes, scratch.buf, r->out.buf,
                               (size_t)r->out.len, r->compressed, &r->opened);
        }
        FREE_END;
        result = PyList_New(count);
        for (Py_ssize_t i = 0; result != NULL && i < count; i++) {
            PyObject *stamp = stamp_of(reads[i].fine, &reads[i].opened);
            if (stamp == NULL)
                Py_CLEAR(result);
            else
                PyList_SET_ITEM(result, i, stamp);
        }
    }
    for (Py_ssize_t i = 0; reads != NULL && i < got; i++) {
        Py_XDECREF(reads[i].path);
        if (reads[i].out.obj != NULL)
            PyBuffer_Release(&reads[i].out);
    }
    PyMem_Free(reads);
    Py_XDECREF(sequence);
    PyBuffer_Release(&scratch);
    return result;
}

/* The whole regular file at `path` as bytes, or None when it cannot be opened or read, is not a regular file, or
 * is not of the size fstat gave when it was opened. The GIL is released twice: to open the file and find its size,
 * then, the bytes object made, to read into it and close. */
static PyObject *py_read_file(PyObject *self, PyObject *args) {
    PyObject *path;
    if (!PyArg_ParseTuple(args, "O&:read_file", PyUnicode_FSConverter, &path))
        return NULL;
    size_t size;
    int fd, fine;
    FREE_BEGIN;
    fd = open_regular(PyBytes_AS_STRING(path), &size);
    FREE_END;
    Py_DECREF(path);
    if (fd < 0)
        Py_RETURN_NONE;
    PyObject *data = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (data == NULL) {
        close(fd);
        return NULL; /* no memory for the bytes: MemoryError */
    }
    FREE_BEGIN;
    fine = read_to_end(fd, PyBytes_AS_STRING(data), size);
    FREE_END;
    if (fine)
        return data;
    Py_DECREF(data);
    Py_RETURN_NONE;
}

/* The paths of a call, each as the file system's bytes (PyUnicode_FSConverter). */
typedef struct {
    PyObject **names;
    Py_ssize_t count;
} Paths;

static void paths_free(Paths *paths) {
    for (Py_ssize_t i = 0; paths->names != NULL && i < paths->count; i++)
        Py_XDECREF(paths->names[i]);
    free(paths->names);
    paths->names = NULL;
}

/* `paths` made from the sequence `path_list` (of str or path-like): 0, or -1 with an exception set. */
static int paths_from(PyObject *path_list, Paths *paths) {
    PyObject *items = PySequence_Fast(path_list, "paths must be a sequence of str");
    if (items == NULL)
        return -1;
    paths->count = PySequence_Fast_GET_SIZE(items);
    paths->names = calloc(paths->count > 0 ? (size_t)paths->count : 1, sizeof(PyObject *));
    int failed = paths->names == NULL;
    if (failed)
        PyErr_NoMemory();
    for (Py_ssize_t k = 0; !failed && k < paths->count; k++)
        failed = !PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(items, k), &paths->names[k]);
    Py_DECREF(items);
    if (failed)
        paths_free(paths);
    return failed ? -1 : 0;
}

/* Whether `view` is a C-contiguous int64 array of `rows` (columns 0) or of `rows` x `columns`. */
static int int64_rows(const Py_buffer *view, Py_ssize_t rows, Py_ssize_t columns) {
    return view->ndim == (columns ? 2 : 1) && view->shape[0] == rows && (!columns || view->shape[1] == columns) &&
           view->itemsize == 8 && strchr("ql", view->format[0]) != NULL && view->format[1] == '\0';
}

/* The regular files at `paths`, each of the size sizes[k] (int64) says, as a list of bytes read by one call that
 * releases the GIL once for them all; None for a file that cannot be opened or read, is not a regular file or is of
 * another size, and for a path holding "::" (a record's reference) or "://" (a URL), which is not opened. */
static PyObject *py_read_files(PyObject *self, PyObject *args) {
    PyObject *path_list, *size_array, *files = NULL;
    Paths paths;
    Py_buffer sizes;
    if (!PyArg_ParseTuple(args, "OO:read_files", &path_list, &size_array) || paths_from(path_list, &paths) < 0)
        return NULL;
    if (PyObject_GetBuffer(size_array, &sizes, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        paths_free(&paths);
        return NULL;
    }
    Py_ssize_t count = paths.count;
    const int64_t *size = sizes.buf;
    uint8_t *read = calloc(count > 0 ? (size_t)count : 1, 1);
    if (read == NULL)
        PyErr_NoMemory();
    else if (!int64_rows(&sizes, count, 0))
        PyErr_SetString(PyExc_ValueError, "wanted: sizes of (paths,) int64, C-contiguous");
    else
        files = PyList_New(count);
    for (Py_ssize_t k = 0; files != NULL && k < count; k++) {
        PyObject *data = PyBytes_FromStringAndSize(NULL, size[k] > 0 ? (Py_ssize_t)size[k] : 0);
        if (data == NULL)
            Py_CLEAR(files);
        else
            PyList_SET_ITEM(files, k, data);
    }
    if (files != NULL) {
        FREE_BEGIN;
        for (Py_ssize_t k = 0; k < count; k++) {
            const char *path = PyBytes_AS_STRING(paths.names[k]);
            size_t found;
            int fd = size[k] >= 0 && local_path(path) ? open_regular(path, &found) : -1;
            if (fd >= 0 && found == (size_t)size[k])
                read[k] = read_to_end(fd, PyBytes_AS_STRING(PyList_GET_ITEM(files, k)), found);
            else if (fd >= 0)
                close(fd);
        }
        FREE_END;
        for (Py_ssize_t k = 0; k < count; k++)
            if (!read[k])
                PyList_SetItem(files, k, Py_NewRef(Py_None));
    }
    free(read);
    PyBuffer_Release(&sizes);
    paths_free(&paths);
    return files;
}

/* Each path's size and modification time in ns into out[k] ((paths, 2) int64), (0, 0) for one that cannot be
 * stat'ed: os.stat's st_size and st_mtime_ns for them all, the GIL released once. */
static PyObject *py_stat_files(PyObject *self, PyObject *args) {
    PyObject *path_list, *out_array, *result = NULL;
    Paths paths;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "OO:stat_files", &path_list, &out_array) || paths_from(path_list, &paths) < 0)
        return NULL;
    if (PyObject_GetBuffer(out_array, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) {
        paths_free(&paths);
        return NULL;
    }
    Py_ssize_t columns = out.ndim == 2 && out.shape[1] == 3 ? 3 : 2; /* the third: st_mode */
    if (int64_rows(&out, paths.count, columns)) {
        int64_t *stats = out.buf;
        FREE_BEGIN;
        for (Py_ssize_t k = 0; k < paths.count; k++) {
            struct stat status;
            int found = stat(PyBytes_AS_STRING(paths.names[k]), &status) == 0;
            int64_t *row = stats + columns * k;
            row[0] = found ? (int64_t)status.st_size : 0;
            row[1] = found ? mtime_ns(&status) : 0;
            if (columns == 3)
                row[2] = found ? (int64_t)status.st_mode : 0;
        }
        FREE_END;
        result = Py_NewRef(Py_None);
    } else {
        PyErr_SetString(PyExc_ValueError, "wanted: out of (paths, 2) or (paths, 3) int64, C-contiguous and writable");
    }
    PyBuffer_Release(&out);
    paths_free(&paths);
    return result;
}

static PyObject *py_bind(PyObject *self, PyObject *args) {
    PyObject *path;
    if (!PyArg_ParseTuple(args, "O&:bind", PyUnicode_FSConverter, &path))
        return NULL;
    void *library = dlopen(PyBytes_AS_STRING(path), RTLD_NOW | RTLD_LOCAL);
    Py_DECREF(path);
    void *found = library ? dlsym(library, "blosc_decompress_ctx") : NULL;
    if (found == NULL)
        Py_RETURN_FALSE; /* the library stays open if it was found: numcodecs holds it anyway */
    blosc_decompress_ctx = (blosc_decompress_ctx_t)found;
    blosc_compress_ctx = (blosc_compress_ctx_t)dlsym(library, "blosc_compress_ctx"); /* NULL: `encode` refuses */
    Py_RETURN_TRUE;
}

/* encode(chunks, count, typesize, clevel, shuffle, cname, blocksize, raw_above, out, index): the `count` chunks of
 * equal size back to back in `chunks`, each compressed as a Blosc frame (as numcodecs' blosc.compress makes it with
 * these settings; a frame of more than `raw_above` bytes made again at level 0, its bytes copied as they are) and
 * followed by the frame's crc32c (4 bytes, little-endian), back to back in `out` (a writable buffer of
 * count * (chunk bytes + 20) bytes or more); index[k] ((count, 2) uint64, writable) gets chunk k's offset in `out`
 * and its bytes with the checksum. The bytes written, in one call outside the GIL; None when Blosc fails. */
static PyObject *py_encode(PyObject *self, PyObject *args) {
    Py_buffer chunks, out, index;
    Py_ssize_t count, typesize, blocksize, raw_above;
    int clevel, shuffle;
    const char *cname;
    if (!PyArg_ParseTuple(args, "y*nniisnnw*w*:encode", &chunks, &count, &typesize, &clevel, &shuffle, &cname,
                          &blocksize, &raw_above, &out, &index))
        return NULL;
    PyObject *result = NULL;
    size_t size = count > 0 ? (size_t)chunks.len / (size_t)count : 0;
    if (blosc_compress_ctx == NULL)
        PyErr_SetString(PyExc_RuntimeError, "Blosc's compressor is not bound: call bind() first");
    else if (count < 1 || typesize < 1 || blocksize < 0 || size * (size_t)count != (size_t)chunks.len ||
             raw_above < 0 || (size_t)out.len < (size_t)count * (size + BLOSC_OVERHEAD + CHECKSUM_BYTES) ||
             (size_t)index.len != (size_t)count * 2 * sizeof(uint64_t) || !PyBuffer_IsContiguous(&chunks, 'C') ||
             !PyBuffer_IsContiguous(&out, 'C') || !PyBuffer_IsContiguous(&index, 'C'))
        PyErr_SetString(PyExc_ValueError, "wanted: count chunks of equal size, out of count * (chunk bytes + 20) "
                                          "bytes or more and index of (count, 2) uint64, all C-contiguous");
    else {
        const uint8_t *source = chunks.buf;
        uint8_t *target = out.buf;
        uint64_t *entries = index.buf;
        size_t offset = 0;
        int fine = 1;
        FREE_BEGIN;
        for (Py_ssize_t k = 0; fine && k < count; k++) {
            int framed = blosc_compress_ctx(clevel, shuffle, (size_t)typesize, size, source + (size_t)k * size,
                                            target + offset, size + BLOSC_OVERHEAD, cname, (size_t)blocksize, 1);
            if (framed > raw_above) /* it saves too little to be worth its decompression: a copy, as it is */
                framed = blosc_compress_ctx(0, shuffle, (size_t)typesize, size, source + (size_t)k * size,
                                            target + offset, size + BLOSC_OVERHEAD, cname, (size_t)blocksize, 1);
            fine = framed > 0;
            if (fine) {
                uint32_t crc = crc32c(0, target + offset, (size_t)framed);
                for (int b = 0; b < CHECKSUM_BYTES; b++)
                    target[offset + (size_t)framed + (size_t)b] = (uint8_t)(crc >> (8 * b));
                entries[2 * k] = offset;
                entries[2 * k + 1] = (uint64_t)framed + CHECKSUM_BYTES;
                offset += (size_t)framed + CHECKSUM_BYTES;
            }
        }
        FREE_END;
        result = fine ? PyLong_FromSize_t(offset) : Py_NewRef(Py_None);
    }
    PyBuffer_Release(&chunks);
    PyBuffer_Release(&out);
    PyBuffer_Release(&index);
    return result;
}
#endif

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    Py_buffer data;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I:crc32c", &data, &value))
        return NULL;
#ifdef OUTCORE_CRC
    if (hardware) {
        uint32_t crc;
        FREE_BEGIN;
        crc = crc32c(value, data.buf, (size_t)data.len);
        FREE_END;
        PyBuffer_Release(&data);
        return PyLong_FromUnsignedLong(crc);
    }
#endif
    PyBuffer_Release(&data);
    PyErr_SetString(PyExc_RuntimeError, "this machine has no CRC32C instruction outcore uses");
    return NULL;
}

#ifdef OUTCORE_MAPPED
static PyObject *py_unmap_idle(PyObject *self, PyObject *args) {
    PyObject *path = NULL;
    if (!PyArg_ParseTuple(args, "|O&:unmap_idle", PyUnicode_FSConverter, &path))
        return NULL;
    struct stat file;
    if (path == NULL)
        mapped_unmap_idle(NULL);
    else if (stat(PyBytes_AS_STRING(path), &file) == 0)
        mapped_unmap_idle(&file);
    Py_XDECREF(path);
    Py_RETURN_NONE;
}

static PyObject *py_map_files(PyObject *self, PyObject *args) {
    int on = -1;
    if (!PyArg_ParseTuple(args, "|p:map_files", &on))
        return NULL;
    if (on < 0)
        return PyBool_FromLong(__atomic_load_n(&mapped_on, __ATOMIC_RELAXED));
    int before = __atomic_exchange_n(&mapped_on, on, __ATOMIC_RELAXED);
    if (!on)
        mapped_unmap_idle(NULL);
    return PyBool_FromLong(before);
}

static PyObject *py_mapped(PyObject *self, PyObject *args) {
    int files = 0;
    pthread_mutex_lock(&mapped_lock);
    for (int k = 0; k < MOST_MAPPED; k++)
        files += mapped[k].path != NULL;
    pthread_mutex_unlock(&mapped_lock);
    return Py_BuildValue("(iKK)", files, (unsigned long long)__atomic_load_n(&mapped_reads, __ATOMIC_RELAXED),
                         (unsigned long long)__atomic_load_n(&mapped_shrunk, __ATOMIC_RELAXED));
}
#endif

/* join(blobs, out): the bytes of each of `blobs` (a sequence of buffers) back to back in `out` (a writable, C-contiguous
 * buffer of rows along its first axis), in one copy outside the GIL: True. False, and out untouched, unless every blob
 * is C-contiguous, of out's item format and of whole rows of out's, and together they fill out exactly: the caller
 * joins them its own way then (casting, say). bytes.join copies outside the GIL only what is exactly bytes (a label
 * map, an array, is copied holding it), and its result is copied once more into the region. */
static PyObject *py_join(PyObject *self, PyObject *args) {
    PyObject *blobs, *target;
    if (!PyArg_ParseTuple(args, "OO:join", &blobs, &target))
        return NULL;
    PyObject *items = PySequence_Fast(blobs, "join: blobs must be a sequence");
    if (items == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(items), held = 0;
    Py_buffer out, *views = PyMem_Calloc((size_t)(count > 0 ? count : 1), sizeof(Py_buffer));
    if (views == NULL) {
        Py_DECREF(items);
        return PyErr_NoMemory();
    }
    PyObject *result = NULL;
    if (PyObject_GetBuffer(target, &out, PyBUF_WRITABLE | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
        goto done;
    const char *format = out.format ? out.format : "B";
    size_t row = out.ndim >= 1 && out.shape[0] > 0 ? (size_t)out.len / (size_t)out.shape[0] : 0, total = 0;
    int fits = out.ndim >= 1;
    for (; fits && held < count; held++) {
        Py_buffer *view = &views[held];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(items, held), view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear(); /* not a contiguous buffer: the caller's way */
            fits = 0;
            break;
        }
        fits = view->ndim >= 1 && strcmp(view->format ? view->format : "B", format) == 0 &&
               (size_t)view->len == (size_t)view->shape[0] * row;
        total += (size_t)view->len;
    }
    fits = fits && total == (size_t)out.len;
    if (fits) {
        char *place = out.buf;
        FREE_BEGIN;
        for (Py_ssize_t k = 0; k < count; k++) {
            memcpy(place, views[k].buf, (size_t)views[k].len);
            place += views[k].len;
        }
        FREE_END;
    }
    result = PyBool_FromLong(fits);
    PyBuffer_Release(&out);
done:
    for (Py_ssize_t k = 0; k < held; k++)
        PyBuffer_Release(&views[k]);
    PyMem_Free(views);
    Py_DECREF(items);
    return result;
}

static PyMethodDef methods[] = {
#if defined(OUTCORE_POSIX) && defined(OUTCORE_CRC)
    {"read", py_read, METH_VARARGS,
     "read(path, offset, nbytes, scratch, out, blosc)\n--\n\n"
     "Chunk bytes [offset, offset + nbytes) of the file read, checked (crc32c) and decoded into out; the file's\n"
     "(inode, mtime_ns, size), or None when anything failed."},
    {"stat_files", py_stat_files, METH_VARARGS,
     "stat_files(paths, out)\n--\n\nEach path's size and modification time in ns into out[k] ((paths, 2) int64; with a\n"
     "third column, its st_mode), zeros for one that cannot be stat'ed, in one call outside the GIL."},
    {"bind", py_bind, METH_VARARGS,
     "bind(path)\n--\n\nFind blosc_decompress_ctx in the shared library at path: whether it was found."},
    {"read_many", py_read_many, METH_VARARGS,
     "read_many(requests, scratch)\n--\n\nEach request's chunk, a tuple (path, offset, nbytes, out, blosc), as read "
     "reads it,\nthrough the one scratch buffer (of each nbytes or more), the GIL released once: their stamps, "
     "None\nfor each that failed."},
    {"read_file", py_read_file, METH_VARARGS,
     "read_file(path)\n--\n\nThe whole regular file's bytes, or None when they cannot be read so."},
    {"encode", py_encode, METH_VARARGS,
     "encode(chunks, count, typesize, clevel, shuffle, cname, blocksize, out, index)\n--\n\n"
     "The count chunks each compressed by Blosc and followed by its crc32c, back to back into out, their offsets and\n"
     "bytes into index: the bytes written, in one call outside the GIL; None when Blosc fails."},
    {"set_engine_turns", py_set_engine_turns, METH_VARARGS,
     "set_engine_turns(limit)\n--\n\nThe most threads of the process's engines (Engine) at work at once (1 until set)."},
    {"engine_clocks", py_engine_clocks, METH_VARARGS,
     "engine_clocks(least)\n--\n\n(cpu, wall): the seconds of the batches the engines made since it last gave them,\n"
     "once their wall time sums to least seconds or more; else None."},
    {"engine_seconds", py_engine_seconds, METH_NOARGS,
     "engine_seconds()\n--\n\nThe CPU seconds count_free counted on the threads of engines (Engine), which no Python\n"
     "thread runs."},
    {"read_files", py_read_files, METH_VARARGS,
     "read_files(paths, sizes)\n--\n\nEach regular file's bytes, of sizes[k] (int64), in one call outside the GIL; None\n"
     "for each that cannot be read so, and for a path holding \"::\" or \"://\", which is not opened."},
#endif
#ifdef OUTCORE_MAPPED
    {"map_files", py_map_files, METH_VARARGS,
     "map_files(on=None)\n--\n\nWhether read and read_many read chunks in memory in place through their files' mappings\n"
     "(on by default); turned off, the mappings no read holds are unmapped. The setting before (without on: now)."},
    {"unmap_idle", py_unmap_idle, METH_VARARGS,
     "unmap_idle(path=None)\n--\n\nUnmap the files no read holds, or the file at path if given, whatever path it was\n"
     "mapped by (the next reads map them again): their pages may then leave the page cache (posix_fadvise leaves mapped\n"
     "pages), and a file removed gives its space back."},
    {"mapped", py_mapped, METH_NOARGS,
     "mapped()\n--\n\n(files mapped now, chunks read through mappings, reads cut short by their file shrinking): the\n"
     "counts since the module was loaded."},
#endif
    {"crc32c", py_crc32c, METH_VARARGS, "crc32c(buffer, value=0)\n--\n\nThe CRC-32C of the buffer's bytes."},
    {"join", py_join, METH_VARARGS,
     "join(blobs, out)\n--\n\nThe blobs' bytes back to back in out, in one copy outside the GIL: True; False, out\n"
     "untouched, unless each is C-contiguous, of out's item format and whole rows of it, and together they fill out."},
    FREE_METHOD,
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_chunks", "Chunks of local shard files read in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__chunks(void) {
    check_hardware();
#if defined(OUTCORE_POSIX) && defined(OUTCORE_CRC)
    window_copy_setup();
#endif
#ifdef OUTCORE_MAPPED
    mapped_setup();
#endif
    PyObject *made = PyModule_Create(&module);
    if (made != NULL && PyModule_AddIntConstant(made, "HARDWARE", hardware) < 0) {
        Py_DECREF(made);
        return NULL;
    }
#if defined(OUTCORE_POSIX) && defined(OUTCORE_CRC)
    if (made != NULL && (PyType_Ready(&EngineType) < 0 || PyModule_AddObjectRef(made, "Engine", (PyObject *)&EngineType) < 0 ||
                         pthread_atfork(NULL, NULL, engine_turns_forked) != 0)) {
        Py_DECREF(made);
        return NULL;
    }
#endif
    return made;
}
