/* outcore.imaging._windows: a batch's samples copied out of the chunks that hold them, in one call and outside
 * the GIL: whole samples (any field, any dtype: a sample is a run of bytes), or windows of pictures (a crop,
 * zeros where the window lies past the picture's edges) mirrored left-right and top-bottom as asked.
 *
 * copy(chunks, which, local, out, rows[, tops, lefts, flips, boxes]): for every k, sample local[k] of chunk
 * chunks[which[k]] into out[rows[k]]; with tops and lefts, the window of out's sample height and width whose
 * top-left corner is at (tops[k], lefts[k]) of the picture, mirrored as flips[k] (left-right, top-bottom) says;
 * with boxes instead, each out row's (float64 rows of top, left, height, width: windows of whole pixels of out's
 * size, any other refused), its corner at boxes[rows[k]] and its mirrors flips[rows[k]] (a batch's boxes in the
 * batch's order, not put in the order of the copies).
 * Every array is C-contiguous; the chunks and out have the same item format and, past the picture's height and
 * width, the same sample shape. Indices are checked before the copies start: nothing is written out of bounds.
 *
 * lines(chunks, which, starts, sizes, crops, flips, out, targets, fill): for every k, map k is the sizes[k]
 * (height, width) pixels stored from pixel starts[k] of chunks[which[k]] (maps of one size in one array, or maps of
 * their pictures' own sizes back to back in chunks), and out[targets[k], y, x] = map[row y, column x] of its crop
 * crops[k] (top, left, height, width, float64), the line under the centre of each of out's (a label map cut and
 * resized nearest-neighbour), reversed where flips[k] (left-right, top-bottom) mirrors it, or the pixel `fill` where
 * a line lies outside the map (past the picture's edges).
 *
 * ragged_offsets(ranges, which, local, rows, offsets) and ragged_rows(values, ranges, which, local, rows, offsets,
 * out): a ragged field's samples (boxes, keypoints: rows of a few numbers each) gathered out of their chunks back to
 * back in the batch's order, their offsets first (for the caller to make out), then their rows, one call each.
 *
 * rows(keys, samples, chunk_size, order, which, local, chunks): a batch's rows sorted by chunk (a stable counting
 * sort of the keys, with the GIL kept: microseconds of work, which numpy's calls would spread over several
 * releases of the GIL, each a hand-over to another thread on a busy pool).
 *
 * interleave(parts, counts, tables, out): an epoch plan's streams' items put batch after batch (each batch's share of
 * stream 0, then of stream 1, ...), each through its stream's table where given, in one call.
 *
 * lookup(values, table, out): out[i] = table[values[i], i % k] for every i of uint8 values (any shape, C order) and a
 * table of (256, k) items of 4 or 2 bytes: a uint8 picture's pixels through each channel's table of the 256 values'
 * results (k its channels, or 1), as outcore.transforms.Normalize computes them (float32 or float16), or each value
 * cast (outcore.transforms.Cast), into out (as many items, of the table's).
 *
 * halves(values, out): float32 values rounded to float16 by the CPU's conversion (F16C), where it has one.
 *
 * adjust(images, factors, shifts, out): uint8 pictures' brightness and contrast (outcore.transforms.BrightnessContrast),
 * each picture's 256 values' results computed once, then looked up.
 *
 * It needs no library: setup.py builds it wherever a C compiler is; outcore.imaging.windows and
 * outcore.imaging.targets fall back to numpy without it (the same bytes).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../_free_time.h"
#include "../_stream_copy.h"
#include "../_table_lookup.h"
#include "../_window_copy.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CHUNKS 4096 /* chunks one call may draw on: far more than a batch's buffer holds */
/* Copies of fewer bytes in all keep the GIL: a microsecond or so of work, where letting the GIL go and taking it back
 * costs as much, and on many threads waits behind theirs (a batch's labels). */
#define HOLD_BELOW (64 << 10)

/* Whether a buffer holds `count` int64 items in this machine's byte order. */
static int int64s(const Py_buffer *view, Py_ssize_t count) {
    const char *format = view->format;
    if (*format == '@' || *format == '=' || *format == (PY_LITTLE_ENDIAN ? '<' : '>'))
        format++;
    return view->ndim == 1 && view->shape[0] == count && view->itemsize == 8 && (format[0] == 'q' || format[0] == 'l') &&
           format[1] == '\0';
}

/* The buffer of an array (C order, with its shape), writable when asked; 0, or -1 with an exception set. */
static int array_buffer(PyObject *array, Py_buffer *view, int writable) {
    return PyObject_GetBuffer(array, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0));
}

/* The buffers of the first `count` arrays of a sequence (from PySequence_Fast) into `views`, their first bytes into
 * `starts`: how many were got (`count`, or fewer with an exception set; those got are the caller's to release). */
static Py_ssize_t sequence_buffers(PyObject *sequence, Py_ssize_t count, Py_buffer *views, const uint8_t **starts) {
    Py_ssize_t got = 0;
    while (got < count && array_buffer(PySequence_Fast_GET_ITEM(sequence, got), &views[got], 0) == 0) {
        starts[got] = views[got].buf;
        got++;
    }
    return got;
}

typedef struct {
    const uint8_t **chunks; /* each chunk's first byte */
    Py_ssize_t *lengths;    /* each chunk's samples */
    const int64_t *which, *local, *rows, *tops, *lefts;
    const double *boxes;    /* each out row's (top, left, height, width), or NULL: tops and lefts, or whole samples */
    const uint8_t *flips;   /* each copy's (with tops), or each out row's (with boxes) */
    Py_ssize_t count, sample, out_sample; /* rows to copy; bytes of a chunk's sample, of out's */
    Py_ssize_t rows_in, columns_in, height, width, pixel; /* pictures: the chunks', out's, bytes a pixel */
    uint8_t *out;
} Copies;

static void copy_all(const Copies *c) {
    for (Py_ssize_t k = 0; k < c->count; k++) {
        const uint8_t *sample = c->chunks[c->which[k]] + (size_t)c->local[k] * c->sample;
        uint8_t *into = c->out + (size_t)c->rows[k] * c->out_sample;
        const Py_ssize_t at = c->boxes != NULL ? c->rows[k] : k; /* where its corner and mirrors are */
        if (c->tops == NULL && c->boxes == NULL)
            stream_copy(into, sample, (size_t)c->sample);
        else
            copy_window(sample, c->rows_in, c->columns_in, c->pixel, into, c->height, c->width,
                        c->boxes != NULL ? (Py_ssize_t)c->boxes[4 * at] : c->tops[k],
                        c->boxes != NULL ? (Py_ssize_t)c->boxes[4 * at + 1] : c->lefts[k],
                        c->flips != NULL && c->flips[2 * at], c->flips != NULL && c->flips[2 * at + 1]);
    }
    stream_fence();
}

/* The bytes of one sample of an array of `view`'s shape from axis `from` on, times the item size. */
static Py_ssize_t bytes_from(const Py_buffer *view, int from) {
    Py_ssize_t bytes = view->itemsize;
    for (int axis = from; axis < view->ndim; axis++)
        bytes *= view->shape[axis];
    return bytes;
}

/* Whether a buffer is a C table of `count` rows of `columns` items of `format` ("d": float64, "B": uint8). */
static int table_of(const Py_buffer *view, Py_ssize_t count, Py_ssize_t columns, const char *format) {
    return view->ndim == 2 && view->shape[0] == count && view->shape[1] == columns && strcmp(view->format, format) == 0;
}

/* Whether a box (top, left, height, width) is a window of whole pixels of `height` x `width`: copied as it is, where
 * any other would be cut wrong (a corner's fraction dropped, another size). */
static int whole_window(const double *box, Py_ssize_t height, Py_ssize_t width) {
    const double most = 1e15; /* corners far past any picture: whole numbers of doubles, exact as integers */
    return box[0] == floor(box[0]) && box[1] == floor(box[1]) && fabs(box[0]) < most && fabs(box[1]) < most &&
           box[2] == (double)height && box[3] == (double)width;
}

static PyObject *py_copy(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"chunks", "which", "local", "out", "rows", "tops", "lefts", "flips", "boxes", NULL};
    PyObject *chunk_list, *arrays[8] = {NULL, NULL, NULL, NULL, Py_None, Py_None, Py_None, Py_None};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|OOOO:copy", keywords, &chunk_list, &arrays[0], &arrays[1],
                                     &arrays[2], &arrays[3], &arrays[4], &arrays[5], &arrays[6], &arrays[7]))
        return NULL;
    PyObject *sequence = PySequence_Fast(chunk_list, "chunks must be a sequence of arrays");
    if (sequence == NULL)
        return NULL;
    Py_ssize_t chunk_count = PySequence_Fast_GET_SIZE(sequence);
    if (chunk_count < 1 || chunk_count > MAX_CHUNKS) {
        Py_DECREF(sequence);
        return PyErr_Format(PyExc_ValueError, "copy: %zd chunks; 1 to %d", chunk_count, MAX_CHUNKS);
    }
    Py_buffer *chunk_views = calloc(chunk_count, sizeof(Py_buffer));
    const uint8_t **chunks = calloc(chunk_count, sizeof(uint8_t *));
    Py_ssize_t *lengths = calloc(chunk_count, sizeof(Py_ssize_t));
    Py_buffer views[8];
    int have[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    Py_ssize_t got_chunks = 0;
    int boxed = arrays[7] != Py_None, windows = arrays[4] != Py_None || boxed, flipped = arrays[6] != Py_None;
    PyObject *result = NULL;
    if (chunk_views == NULL || chunks == NULL || lengths == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    got_chunks = sequence_buffers(sequence, chunk_count, chunk_views, chunks);
    if (got_chunks < chunk_count)
        goto done;
    if (boxed && (arrays[4] != Py_None || arrays[5] != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "copy: boxes or tops and lefts, not both");
        goto done;
    }
    for (int i = 0; i < 8; i++) { /* which, local, out, rows; tops and lefts, or boxes; flips where given */
        int wanted = i < 4 || (i == 5 && !boxed && windows) || arrays[i] != Py_None;
        if (wanted && array_buffer(arrays[i], &views[i], i == 2) < 0)
            goto done;
        have[i] = wanted;
    }
    Py_buffer *out = &views[2], *first = &chunk_views[0];
    Py_ssize_t count = views[0].ndim == 1 ? views[0].shape[0] : -1, by = boxed ? out->shape[0] : count;
    int picture_axes = windows ? 3 : 1; /* axes before a pixel's bytes: sample, rows, columns */
    int shapes_ok = out->ndim >= picture_axes && first->ndim == out->ndim && strcmp(out->format, first->format) == 0;
    for (Py_ssize_t i = 0; shapes_ok && i < chunk_count; i++) {
        Py_buffer *chunk = &chunk_views[i];
        shapes_ok = chunk->ndim == first->ndim && strcmp(chunk->format, first->format) == 0 &&
                    chunk->itemsize == first->itemsize;
        for (int axis = 1; shapes_ok && axis < chunk->ndim; axis++)
            shapes_ok = chunk->shape[axis] == first->shape[axis] && (axis < picture_axes || chunk->shape[axis] == out->shape[axis]);
        lengths[i] = chunk->shape[0];
    }
    if (!shapes_ok || count < 0 || !int64s(&views[0], count) || !int64s(&views[1], count) ||
        !int64s(&views[3], count) || (windows && !boxed && (!int64s(&views[4], count) || !int64s(&views[5], count))) ||
        (boxed && !table_of(&views[7], by, 4, "d")) || (flipped && (!windows || !table_of(&views[6], by, 2, "B")))) {
        PyErr_SetString(PyExc_ValueError,
                        "copy: wanted chunks of one format and sample shape, out of that format (and that sample shape "
                        "past the height and width with windows), which, local and rows (and tops, lefts) int64 of one "
                        "length, flips uint8 (count, 2); or boxes float64 (len(out), 4) and flips uint8 (len(out), 2), "
                        "each out row's; all C-contiguous");
        goto done;
    }
    Copies copies = {chunks, lengths, views[0].buf, views[1].buf, views[3].buf,
                     windows && !boxed ? views[4].buf : NULL, windows && !boxed ? views[5].buf : NULL,
                     boxed ? views[7].buf : NULL, flipped ? views[6].buf : NULL, count, bytes_from(first, 1),
                     bytes_from(out, 1), windows ? first->shape[1] : 0, windows ? first->shape[2] : 0,
                     windows ? out->shape[1] : 0, windows ? out->shape[2] : 0, windows ? bytes_from(out, 3) : 0,
                     out->buf};
    if (!windows && copies.sample != copies.out_sample) {
        PyErr_SetString(PyExc_ValueError, "copy: the chunks' samples and out's differ in size");
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        if (copies.which[k] < 0 || copies.which[k] >= chunk_count || copies.local[k] < 0 ||
            copies.local[k] >= lengths[copies.which[k]] || copies.rows[k] < 0 || copies.rows[k] >= out->shape[0]) {
            PyErr_Format(PyExc_IndexError, "copy: row %zd asks for sample %lld of chunk %lld into row %lld, out of range",
                         k, (long long)copies.local[k], (long long)copies.which[k], (long long)copies.rows[k]);
            goto done;
        }
        const double *box = boxed ? copies.boxes + 4 * copies.rows[k] : NULL;
        if (box != NULL && !whole_window(box, copies.height, copies.width)) {
            char said[200];
            snprintf(said, sizeof said, "copy: out row %lld's box (%g, %g, %g, %g) is no window of whole pixels of "
                     "out's %zdx%zd", (long long)copies.rows[k], box[0], box[1], box[2], box[3], copies.height,
                     copies.width);
            PyErr_SetString(PyExc_ValueError, said);
            goto done;
        }
    }
    if ((size_t)count * (size_t)copies.out_sample < HOLD_BELOW) {
        copy_all(&copies);
    } else {
        FREE_BEGIN copy_all(&copies);
        FREE_END
    }
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 8; i++)
        if (have[i])
            PyBuffer_Release(&views[i]);
    for (Py_ssize_t i = 0; i < got_chunks; i++)
        PyBuffer_Release(&chunk_views[i]);
    free(chunk_views);
    free(chunks);
    free(lengths);
    Py_DECREF(sequence);
    return result;
}

typedef struct {
    const uint8_t **chunks;                         /* each chunk's first byte */
    const int64_t *which, *starts, *sizes, *targets; /* a map's chunk, first pixel, height and width, out row */
    const double *crops;                            /* a map's crop: top, left, height, width */
    const uint8_t *flips, *fill;                    /* a map's mirrors: left-right, top-bottom */
    Py_ssize_t count, height, width, pixel;         /* maps to cut; out's height, width, bytes a pixel */
    int64_t *rows, *columns;                        /* scratch: the map's line under each of out's (height + width) */
    uint8_t *out;
} Lines;

/* The map's line (row or column) under the centre of each of `count` output lines of a crop from `start`, `length`
 * long: floor(start + ((i + 0.5) / count) * length), as outcore.imaging.targets.source_lines computes it (the same
 * operations, in double, in the same order), reversed where `mirrored`; -1 for a line before the map (or not a
 * number), `limit` for one past it. */
static void crop_lines(double start, double length, Py_ssize_t count, int mirrored, int64_t limit, int64_t *into) {
    for (Py_ssize_t i = 0; i < count; i++) {
        const double line = floor(start + (((double)i + 0.5) / (double)count) * length);
        into[mirrored ? count - 1 - i : i] = !(line >= 0.0) ? -1 : line >= (double)limit ? limit : (int64_t)line;
    }
}

/* Each output pixel from the map's pixel at its line's row and column (or `fill`), typed copies for 1, 2 and 4 bytes. */
#define GATHER_ROW(TYPE)                                                                                              \
    do {                                                                                                              \
        const TYPE *from = (const TYPE *)source;                                                                      \
        TYPE *to = (TYPE *)target, empty;                                                                             \
        memcpy(&empty, l->fill, sizeof(TYPE));                                                                        \
        for (Py_ssize_t x = 0; x < l->width; x++) {                                                                   \
            int64_t column = columns[x];                                                                              \
            to[x] = column >= 0 && column < map_columns ? from[column] : empty;                                       \
        }                                                                                                             \
    } while (0)

static void gather_lines(const Lines *l) {
    Py_ssize_t out_row = l->width * l->pixel;
    int64_t *rows = l->rows, *columns = l->columns;
    for (Py_ssize_t k = 0; k < l->count; k++) {
        int64_t map_rows = l->sizes[2 * k], map_columns = l->sizes[2 * k + 1];
        const uint8_t *map = l->chunks[l->which[k]] + (size_t)l->starts[k] * l->pixel;
        const double *crop = l->crops + 4 * k;
        crop_lines(crop[0], crop[2], l->height, l->flips[2 * k + 1], map_rows, rows);
        crop_lines(crop[1], crop[3], l->width, l->flips[2 * k], map_columns, columns);
        for (Py_ssize_t y = 0; y < l->height; y++) {
            uint8_t *target = l->out + ((size_t)l->targets[k] * l->height + y) * out_row;
            if (rows[y] < 0 || rows[y] >= map_rows) {
                for (Py_ssize_t x = 0; x < l->width; x++)
                    memcpy(target + x * l->pixel, l->fill, l->pixel);
                continue;
            }
            const uint8_t *source = map + (size_t)rows[y] * map_columns * l->pixel;
            switch (l->pixel) {
            case 1: GATHER_ROW(uint8_t); break;
            case 2: GATHER_ROW(uint16_t); break;
            case 4: GATHER_ROW(uint32_t); break;
            default:
                for (Py_ssize_t x = 0; x < l->width; x++) {
                    int64_t column = columns[x];
                    memcpy(target + x * l->pixel,
                           column >= 0 && column < map_columns ? source + column * l->pixel : l->fill, l->pixel);
                }
            }
        }
    }
}

/* Whether a buffer holds int64 items of shape (count, length). */
static int int64_table(const Py_buffer *view, Py_ssize_t count, Py_ssize_t length) {
    const char *format = view->format;
    if (*format == '@' || *format == '=' || *format == (PY_LITTLE_ENDIAN ? '<' : '>'))
        format++;
    return view->ndim == 2 && view->shape[0] == count && view->shape[1] == length && view->itemsize == 8 &&
           (format[0] == 'q' || format[0] == 'l') && format[1] == '\0';
}

static PyObject *py_lines(PyObject *self, PyObject *args) {
    PyObject *chunk_list, *arrays[7];
    Py_buffer views[7], fill;
    int got = 0, got_fill = 0;
    Py_ssize_t got_chunks = 0;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "OOOOOOOOy*:lines", &chunk_list, &arrays[0], &arrays[1], &arrays[2], &arrays[3],
                          &arrays[4], &arrays[5], &arrays[6], &fill))
        return NULL;
    got_fill = 1;
    PyObject *sequence = PySequence_Fast(chunk_list, "chunks must be a sequence of arrays");
    if (sequence == NULL) {
        PyBuffer_Release(&fill);
        return NULL;
    }
    Py_ssize_t chunk_count = PySequence_Fast_GET_SIZE(sequence);
    Py_buffer *chunk_views = calloc(chunk_count > 0 ? chunk_count : 1, sizeof(Py_buffer));
    const uint8_t **chunks = calloc(chunk_count > 0 ? chunk_count : 1, sizeof(uint8_t *));
    if (chunk_views == NULL || chunks == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (chunk_count < 1 || chunk_count > MAX_CHUNKS) {
        PyErr_Format(PyExc_ValueError, "lines: %zd chunks; 1 to %d", chunk_count, MAX_CHUNKS);
        goto done;
    }
    got_chunks = sequence_buffers(sequence, chunk_count, chunk_views, chunks);
    if (got_chunks < chunk_count)
        goto done;
    while (got < 7 && array_buffer(arrays[got], &views[got], got == 5) == 0)
        got++;
    if (got < 7)
        goto done;
    Py_buffer *out = &views[5];
    Py_ssize_t count = views[0].ndim == 1 ? views[0].shape[0] : -1;
    Py_ssize_t pixel = out->ndim >= 3 ? bytes_from(out, 3) : 0;
    int ok = pixel > 0 && count >= 0 && int64s(&views[0], count) && int64s(&views[1], count) &&
             int64_table(&views[2], count, 2) && table_of(&views[3], count, 4, "d") &&
             table_of(&views[4], count, 2, "B") && int64s(&views[6], count) && fill.len == pixel;
    for (Py_ssize_t i = 0; ok && i < chunk_count; i++) {
        Py_buffer *chunk = &chunk_views[i];
        ok = strcmp(chunk->format, out->format) == 0 && chunk->itemsize == out->itemsize && chunk->len % pixel == 0;
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "lines: wanted chunks of out's format (whole pixels), out (n, height, width, "
                                          "...), which, starts and targets int64 (k,), sizes int64 (k, 2), crops "
                                          "float64 (k, 4), flips uint8 (k, 2) and one pixel's bytes as fill; all "
                                          "C-contiguous");
        goto done;
    }
    Lines lines = {chunks, views[0].buf, views[1].buf, views[2].buf, views[6].buf, views[3].buf, views[4].buf, fill.buf,
                   count, out->shape[1], out->shape[2], pixel, NULL, NULL, out->buf};
    for (Py_ssize_t k = 0; k < count; k++) {
        int64_t chunk = lines.which[k], start = lines.starts[k], map_rows = lines.sizes[2 * k];
        int64_t map_columns = lines.sizes[2 * k + 1], target = lines.targets[k];
        if (chunk < 0 || chunk >= chunk_count || start < 0 || map_rows < 0 || map_columns < 0 || target < 0 ||
            target >= out->shape[0] || start + map_rows * map_columns > chunk_views[chunk].len / pixel) {
            PyErr_Format(PyExc_IndexError, "lines: map %zd (chunk %lld, pixels %lld of %lld x %lld, into row %lld) "
                         "lies out of range", k, (long long)chunk, (long long)start, (long long)map_rows,
                         (long long)map_columns, (long long)target);
            goto done;
        }
    }
    lines.rows = PyMem_Calloc((size_t)(lines.height + lines.width) + 1, sizeof(int64_t));
    if (lines.rows == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    lines.columns = lines.rows + lines.height;
    FREE_BEGIN gather_lines(&lines);
    FREE_END result = Py_NewRef(Py_None);
    PyMem_Free(lines.rows);
done:
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    for (Py_ssize_t i = 0; i < got_chunks; i++)
        PyBuffer_Release(&chunk_views[i]);
    if (got_fill)
        PyBuffer_Release(&fill);
    free(chunk_views);
    free(chunks);
    Py_DECREF(sequence);
    return result;
}

/* A ragged field's samples in a batch (outcore.format.ragged): sample k of the batch's copies is row span
 * ranges[which[k]][local[k]] ([start, stop) of its chunk's rows), put at batch row rows[k]. */
typedef struct {
    const int64_t **ranges;  /* each chunk's (samples, 2) spans */
    const Py_ssize_t *spans; /* each chunk's samples */
    const int64_t *which, *local, *rows;
    Py_ssize_t count;
} Spans;

/* The ranges of a sequence (from PySequence_Fast) as int64 tables (n, 2) into `views`, their spans into `ranges` and
 * their counts into `spans`: how many were got (fewer with an exception set; those got are the caller's to release). */
static Py_ssize_t span_tables(PyObject *sequence, Py_ssize_t count, Py_buffer *views, const int64_t **ranges,
                              Py_ssize_t *spans) {
    Py_ssize_t got = 0;
    while (got < count && array_buffer(PySequence_Fast_GET_ITEM(sequence, got), &views[got], 0) == 0) {
        ranges[got] = views[got].buf;
        spans[got] = views[got].ndim == 2 ? views[got].shape[0] : -1;
        if (!int64_table(&views[got], spans[got], 2)) {
            PyErr_Format(PyExc_ValueError, "ranges %zd: wanted C-contiguous int64 (n, 2)", got);
            return got + 1;
        }
        got++;
    }
    return got;
}

/* Whether copy k's span is one of its chunk's, in order (0 <= start <= stop), and its row one of `count`; else an
 * IndexError naming it. */
static int span_fits(const Spans *s, Py_ssize_t chunk_count, Py_ssize_t k) {
    const int64_t chunk = s->which[k], sample = s->local[k], row = s->rows[k];
    if (chunk >= 0 && chunk < chunk_count && sample >= 0 && sample < s->spans[chunk] && row >= 0 && row < s->count) {
        const int64_t *span = s->ranges[chunk] + 2 * sample;
        if (span[0] >= 0 && span[1] >= span[0])
            return 1;
    }
    PyErr_Format(PyExc_IndexError, "copy %zd: sample %lld of chunk %lld into row %lld lies out of range, or its span "
                 "runs backwards", k, (long long)sample, (long long)chunk, (long long)row);
    return 0;
}

/* The parts every ragged call parses: the ranges, which, local and rows (their buffers from `views`, released by
 * `release_spans`). 0, or -1 with an exception set. */
typedef struct {
    PyObject *sequence;
    Py_buffer *views, indices[3];
    Py_ssize_t got, got_indices;
    Spans spans;
} SpanArgs;

static void release_spans(SpanArgs *a) {
    for (Py_ssize_t i = 0; i < a->got; i++)
        PyBuffer_Release(&a->views[i]);
    for (Py_ssize_t i = 0; i < a->got_indices; i++)
        PyBuffer_Release(&a->indices[i]);
    free(a->views);
    free((void *)a->spans.ranges);
    free((void *)a->spans.spans);
    Py_XDECREF(a->sequence);
}

static int parse_spans(SpanArgs *a, PyObject *range_list, PyObject *which, PyObject *local, PyObject *rows) {
    memset(a, 0, sizeof(*a));
    a->sequence = PySequence_Fast(range_list, "ranges must be a sequence of arrays");
    if (a->sequence == NULL)
        return -1;
    Py_ssize_t chunks = PySequence_Fast_GET_SIZE(a->sequence);
    if (chunks > MAX_CHUNKS) {
        PyErr_Format(PyExc_ValueError, "%zd chunks; %d at most", chunks, MAX_CHUNKS);
        return -1;
    }
    a->views = calloc(chunks > 0 ? chunks : 1, sizeof(Py_buffer));
    a->spans.ranges = calloc(chunks > 0 ? chunks : 1, sizeof(int64_t *));
    a->spans.spans = calloc(chunks > 0 ? chunks : 1, sizeof(Py_ssize_t));
    if (a->views == NULL || a->spans.ranges == NULL || a->spans.spans == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    a->got = span_tables(a->sequence, chunks, a->views, (const int64_t **)a->spans.ranges, (Py_ssize_t *)a->spans.spans);
    if (a->got < chunks || PyErr_Occurred())
        return -1;
    PyObject *arrays[3] = {which, local, rows};
    while (a->got_indices < 3 && array_buffer(arrays[a->got_indices], &a->indices[a->got_indices], 0) == 0)
        a->got_indices++;
    if (a->got_indices < 3)
        return -1;
    Py_ssize_t count = a->indices[0].ndim == 1 ? a->indices[0].shape[0] : -1;
    if (count < 0 || !int64s(&a->indices[0], count) || !int64s(&a->indices[1], count) || !int64s(&a->indices[2], count)) {
        PyErr_SetString(PyExc_ValueError, "which, local and rows: wanted C-contiguous int64 (k,) each");
        return -1;
    }
    a->spans.which = a->indices[0].buf;
    a->spans.local = a->indices[1].buf;
    a->spans.rows = a->indices[2].buf;
    a->spans.count = count;
    for (Py_ssize_t k = 0; k < count; k++)
        if (!span_fits(&a->spans, chunks, k))
            return -1;
    return 0;
}

static PyObject *py_ragged_offsets(PyObject *self, PyObject *args) {
    PyObject *range_list, *which, *local, *rows;
    Py_buffer offsets;
    if (!PyArg_ParseTuple(args, "OOOOw*:ragged_offsets", &range_list, &which, &local, &rows, &offsets))
        return NULL;
    SpanArgs a;
    PyObject *result = NULL;
    if (parse_spans(&a, range_list, which, local, rows) == 0) {
        const Spans *s = &a.spans;
        if (offsets.len != (s->count + 1) * (Py_ssize_t)sizeof(int64_t)) {
            PyErr_SetString(PyExc_ValueError, "ragged_offsets: offsets must hold len(rows) + 1 int64");
        } else {
            int64_t *into = offsets.buf, total = 0;
            memset(into, 0, (size_t)offsets.len);
            for (Py_ssize_t k = 0; k < s->count; k++) {
                const int64_t *span = s->ranges[s->which[k]] + 2 * s->local[k];
                into[s->rows[k] + 1] = span[1] - span[0];
            }
            for (Py_ssize_t i = 1; i <= s->count; i++)
                into[i] = total += into[i];
            result = PyLong_FromLongLong(total);
        }
    }
    release_spans(&a);
    PyBuffer_Release(&offsets);
    return result;
}

/* Each copy's rows (`row` bytes each) from its chunk's `values` into `out` at its batch row's offset. */
static void copy_spans(const Spans *s, const uint8_t **values, const int64_t *offsets, Py_ssize_t row, uint8_t *out) {
    for (Py_ssize_t k = 0; k < s->count; k++) {
        const int64_t *span = s->ranges[s->which[k]] + 2 * s->local[k];
        memcpy(out + (size_t)offsets[s->rows[k]] * row, values[s->which[k]] + (size_t)span[0] * row,
               (size_t)(span[1] - span[0]) * row);
    }
}

static PyObject *py_ragged_rows(PyObject *self, PyObject *args) {
    PyObject *value_list, *range_list, *which, *local, *rows, *offset_array, *out_array;
    if (!PyArg_ParseTuple(args, "OOOOOOO:ragged_rows", &value_list, &range_list, &which, &local, &rows, &offset_array,
                          &out_array))
        return NULL;
    SpanArgs a;
    Py_buffer offsets, out, *value_views = NULL;
    const uint8_t **values = NULL;
    int got_offsets = 0, got_out = 0;
    Py_ssize_t got_values = 0;
    PyObject *result = NULL, *sequence = PySequence_Fast(value_list, "values must be a sequence of arrays");
    if (sequence == NULL || parse_spans(&a, range_list, which, local, rows) != 0)
        goto done;
    const Spans *s = &a.spans;
    Py_ssize_t chunks = PySequence_Fast_GET_SIZE(sequence);
    value_views = calloc(chunks > 0 ? chunks : 1, sizeof(Py_buffer));
    values = calloc(chunks > 0 ? chunks : 1, sizeof(uint8_t *));
    if (value_views == NULL || values == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (chunks != a.got) {
        PyErr_Format(PyExc_ValueError, "ragged_rows: %zd values for %zd ranges", chunks, a.got);
        goto done;
    }
    got_values = sequence_buffers(sequence, chunks, value_views, values);
    if (got_values < chunks || array_buffer(offset_array, &offsets, 0) != 0)
        goto done;
    got_offsets = 1;
    if (array_buffer(out_array, &out, 1) != 0)
        goto done;
    got_out = 1;
    const Py_ssize_t row = out.ndim >= 1 ? bytes_from(&out, 1) : 0, out_rows = out.ndim >= 1 ? out.shape[0] : -1;
    int ok = int64s(&offsets, s->count + 1);
    for (Py_ssize_t i = 0; ok && i < chunks; i++) {
        const Py_buffer *chunk = &value_views[i];
        ok = strcmp(chunk->format, out.format) == 0 && chunk->itemsize == out.itemsize && chunk->ndim >= 1 &&
             chunk->ndim == out.ndim && bytes_from(chunk, 1) == row;
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "ragged_rows: wanted values of out's format and row shape, and offsets int64 "
                                          "(len(rows) + 1,); all C-contiguous");
        goto done;
    }
    const int64_t *at = offsets.buf;
    for (Py_ssize_t k = 0; k < s->count; k++) {
        const int64_t *span = s->ranges[s->which[k]] + 2 * s->local[k], target = s->rows[k];
        if (span[1] > value_views[s->which[k]].shape[0] || at[target] < 0 || at[target + 1] > out_rows ||
            at[target + 1] - at[target] != span[1] - span[0]) {
            PyErr_Format(PyExc_IndexError, "ragged_rows: copy %zd (rows %lld..%lld of chunk %lld into row %lld) does "
                         "not fit its chunk's rows or its place in out", k, (long long)span[0], (long long)span[1],
                         (long long)s->which[k], (long long)target);
            goto done;
        }
    }
    if (out.len < HOLD_BELOW) {
        copy_spans(s, values, at, row, out.buf);
    } else {
        FREE_BEGIN copy_spans(s, values, at, row, out.buf);
        FREE_END
    }
    result = Py_NewRef(Py_None);
done:
    if (sequence != NULL)
        release_spans(&a);
    for (Py_ssize_t i = 0; i < got_values; i++)
        PyBuffer_Release(&value_views[i]);
    if (got_offsets)
        PyBuffer_Release(&offsets);
    if (got_out)
        PyBuffer_Release(&out);
    free(value_views);
    free(values);
    Py_XDECREF(sequence);
    return result;
}

/* Keys spread over more than this many values past 4 per row are left to numpy's sort (a counting sort's table
 * would cost more than the sort). */
#define COUNTED_SPAN 4096
/* `rows` and `interleave` of this many items or more release the GIL (work that long is worth a hand-over). */
#define ITEMS_HOLD_BELOW (1 << 16)

static PyObject *py_rows(PyObject *self, PyObject *args) {
    Py_buffer views[6];
    long long chunk_size;
    if (!PyArg_ParseTuple(args, "y*y*Lw*w*w*w*:rows", &views[0], &views[1], &chunk_size, &views[2], &views[3],
                          &views[4], &views[5]))
        return NULL;
    const Py_ssize_t count = views[0].len / (Py_ssize_t)sizeof(int64_t);
    int fine = chunk_size >= 1;
    for (int i = 0; i < 6; i++)
        fine = fine && views[i].len == count * (Py_ssize_t)sizeof(int64_t);
    const int64_t *keys = views[0].buf, *samples = views[1].buf;
    int64_t *order = views[2].buf, *which = views[3].buf, *local = views[4].buf, *chunks = views[5].buf;
    int64_t low = 0, high = -1, found = -1, *next = NULL;
    for (Py_ssize_t i = 0; fine && i < count; i++) {
        low = i == 0 || keys[i] < low ? keys[i] : low;
        high = i == 0 || keys[i] > high ? keys[i] : high;
    }
    const uint64_t spread = (uint64_t)high - (uint64_t)low; /* unsigned: keys far apart do not overflow */
    const int64_t span = spread < (uint64_t)COUNTED_SPAN + 4 * (uint64_t)count ? (int64_t)spread + 1 : 0;
    if (fine && count && span > 0 &&
        (next = PyMem_RawCalloc((size_t)span, sizeof(int64_t))) != NULL) {
        PyThreadState *saved = count >= ITEMS_HOLD_BELOW ? PyEval_SaveThread() : NULL;
        for (Py_ssize_t i = 0; i < count; i++) /* rows of each key, then where each key's rows start */
            next[keys[i] - low]++;
        found = 0;
        for (int64_t v = 0, at = 0; v < span; v++) {
            const int64_t rows = next[v];
            next[v] = at;
            if (rows) {
                for (int64_t k = at; k < at + rows; k++)
                    which[k] = found;
                chunks[found++] = low + v;
            }
            at += rows;
        }
        for (Py_ssize_t i = 0; i < count; i++) { /* stable: each key's rows in their order */
            const int64_t at = next[keys[i] - low]++, remainder = samples[i] % chunk_size;
            order[at] = i;
            local[at] = remainder < 0 ? remainder + chunk_size : remainder;
        }
        if (saved != NULL)
            PyEval_RestoreThread(saved);
        PyMem_RawFree(next);
    } else if (fine && count == 0) {
        found = 0;
    }
    for (int i = 0; i < 6; i++)
        PyBuffer_Release(&views[i]);
    if (!fine) {
        PyErr_SetString(PyExc_ValueError, "need int64 keys, samples, order, which, local and chunks of one length and "
                                          "chunk_size >= 1");
        return NULL;
    }
    return PyLong_FromLongLong(found);
}

static PyObject *py_interleave(PyObject *self, PyObject *args) {
    PyObject *part_list, *table_list;
    Py_buffer counts, out;
    if (!PyArg_ParseTuple(args, "Oy*Ow*:interleave", &part_list, &counts, &table_list, &out))
        return NULL;
    PyObject *parts = PySequence_Fast(part_list, "interleave: parts must be a sequence");
    PyObject *tables = parts == NULL || table_list == Py_None
                           ? NULL : PySequence_Fast(table_list, "interleave: tables must be a sequence or None");
    const Py_ssize_t item = (Py_ssize_t)sizeof(int64_t), streams = parts ? PySequence_Fast_GET_SIZE(parts) : 0;
    Py_buffer *views = parts ? PyMem_Calloc((size_t)(2 * streams + 1), sizeof(Py_buffer)) : NULL;
    Py_ssize_t got = 0, got_tables = 0, *taken = views ? PyMem_Calloc((size_t)streams + 1, sizeof(Py_ssize_t)) : NULL;
    int fine = taken != NULL && (table_list == Py_None || (tables && PySequence_Fast_GET_SIZE(tables) == streams)) &&
               counts.len % item == 0 && out.len % item == 0 && streams > 0 && counts.len / item % streams == 0;
    while (fine && got < streams && (fine = PyObject_GetBuffer(PySequence_Fast_GET_ITEM(parts, got), &views[got],
                                                               PyBUF_C_CONTIGUOUS) == 0))
        fine = views[got++].len % item == 0;
    while (fine && tables && got_tables < streams &&
           (fine = PyObject_GetBuffer(PySequence_Fast_GET_ITEM(tables, got_tables), &views[streams + got_tables],
                                      PyBUF_C_CONTIGUOUS) == 0))
        fine = views[streams + got_tables++].len % item == 0;
    const int64_t *count = counts.buf;
    const Py_ssize_t batches = streams ? counts.len / item / streams : 0, total = out.len / item;
    Py_ssize_t all = 0;
    for (Py_ssize_t s = 0; fine && s < streams; s++) { /* each part holds its counts, each item in its table */
        Py_ssize_t part = 0;
        for (Py_ssize_t b = 0; fine && b < batches; b++) {
            fine = count[b * streams + s] >= 0;
            part += count[b * streams + s];
        }
        fine = fine && part == views[s].len / item;
        for (Py_ssize_t i = 0; fine && tables && i < part; i++) {
            const int64_t value = ((const int64_t *)views[s].buf)[i];
            fine = value >= 0 && value < views[streams + s].len / item;
        }
        all += part;
    }
    fine = fine && all == total;
    if (fine) {
        int64_t *into = out.buf;
        PyThreadState *saved = total >= ITEMS_HOLD_BELOW ? PyEval_SaveThread() : NULL;
        for (Py_ssize_t b = 0; b < batches; b++)
            for (Py_ssize_t s = 0; s < streams; s++) {
                const int64_t *from = (const int64_t *)views[s].buf + taken[s], number = count[b * streams + s];
                const int64_t *table = tables ? views[streams + s].buf : NULL;
                for (int64_t i = 0; i < number; i++)
                    *into++ = table ? table[from[i]] : from[i];
                taken[s] += number;
            }
        if (saved != NULL)
            PyEval_RestoreThread(saved);
    }
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    for (Py_ssize_t i = 0; i < got_tables; i++)
        PyBuffer_Release(&views[streams + i]);
    PyMem_Free(views);
    PyMem_Free(taken);
    Py_XDECREF(parts);
    Py_XDECREF(tables);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&out);
    if (!fine) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "need int64 parts (one a stream), int64 counts (batches, streams) adding up "
                                              "to each part, tables (one a stream, holding each item) or None, and an "
                                              "int64 out of all the items");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_lookup(PyObject *self, PyObject *args) {
    Py_buffer values, table, out;
    if (!PyArg_ParseTuple(args, "y*y*w*:lookup", &values, &table, &out))
        return NULL;
    const Py_ssize_t count = values.len, size = count ? out.len / count : 0;
    const Py_ssize_t k = size ? table.len / (256 * size) : 0;
    int fine = (size == 4 || size == 2) && out.len == count * size && k >= 1 && table.len == k * 256 * size &&
               count % k == 0 && PyBuffer_IsContiguous(&values, 'C') && PyBuffer_IsContiguous(&table, 'C') &&
               PyBuffer_IsContiguous(&out, 'C');
    fine = fine || (count == 0 && out.len == 0); /* no values: nothing to look up */
    if (fine && count) {
        if (count < ITEMS_HOLD_BELOW) {
            lookup_all(values.buf, count, table.buf, k, size, out.buf);
        } else {
            FREE_BEGIN lookup_all(values.buf, count, table.buf, k, size, out.buf);
            FREE_END
        }
    }
    PyBuffer_Release(&values);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out);
    if (!fine) {
        PyErr_SetString(PyExc_ValueError, "need uint8 values, a table of (256, k) items of 4 or 2 bytes where k divides "
                                          "the values' count, and an out of as many items of that size, all C-contiguous");
        return NULL;
    }
    Py_RETURN_NONE;
}

#if defined(__GNUC__) && defined(__x86_64__)
#define OUTCORE_F16C
#include <immintrin.h>

static int has_f16c; /* whether this CPU converts to float16 itself (F16C): set when the module loads */

/* `count` float32s rounded to the nearest float16 (ties to even, as numpy's astype rounds them), eight at a time. */
__attribute__((target("avx,f16c"))) static void halves_f16c(const float *from, Py_ssize_t count, uint16_t *into) {
    Py_ssize_t i = 0;
    for (; i + 8 <= count; i += 8)
        _mm_storeu_si128((__m128i *)(into + i), _mm256_cvtps_ph(_mm256_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < count; i++)
        into[i] = _cvtss_sh(from[i], _MM_FROUND_TO_NEAREST_INT);
}
#endif

static PyObject *py_halves(PyObject *self, PyObject *args) {
    Py_buffer from, into;
    if (!PyArg_ParseTuple(args, "y*w*:halves", &from, &into))
        return NULL;
    const Py_ssize_t count = from.len / (Py_ssize_t)sizeof(float);
    int fine = from.len == count * (Py_ssize_t)sizeof(float) && into.len == count * 2 &&
               PyBuffer_IsContiguous(&from, 'C') && PyBuffer_IsContiguous(&into, 'C');
    int done = 0;
#ifdef OUTCORE_F16C
    if (fine && has_f16c) {
        if (count < ITEMS_HOLD_BELOW) {
            halves_f16c(from.buf, count, into.buf);
        } else {
            FREE_BEGIN halves_f16c(from.buf, count, into.buf);
            FREE_END
        }
        done = 1;
    }
#endif
    PyBuffer_Release(&from);
    PyBuffer_Release(&into);
    if (!fine) {
        PyErr_SetString(PyExc_ValueError, "need float32 values and an out of as many 2-byte items, both C-contiguous");
        return NULL;
    }
    return PyBool_FromLong(done);
}

/* Brightness and contrast of `images` uint8 pictures of `size` values each, into out: picture i's values v become
 * clip(((v - mean) * factors[i] + mean) + shifts[i], 0, 255) truncated to uint8, in float32 one operation at a time
 * (outcore.transforms.BrightnessContrast computes the same floats with numpy), mean the picture's exact mean
 * (its integer sum over its size, in float64) rounded to float32. */
static void adjust_all(const uint8_t *images, Py_ssize_t count, Py_ssize_t size, const float *factors,
                       const float *shifts, uint8_t *out) {
    for (Py_ssize_t i = 0; i < count; i++) {
        const uint8_t *image = images + i * size;
        uint8_t *into = out + i * size;
        uint64_t sum = 0;
        for (Py_ssize_t j = 0; j < size; j++)
            sum += image[j];
        const float mean = (float)((double)sum / (double)size), factor = factors[i], shift = shifts[i];
        uint8_t table[256]; /* a picture's 256 values' results: the same floats as computed for each pixel */
        for (int v = 0; v < 256; v++) {
            float x = (float)v - mean;
            x = x * factor;
            x = x + mean;
            x = x + shift;
            table[v] = (uint8_t)(x < 0.0f ? 0.0f : x > 255.0f ? 255.0f : x);
        }
        for (Py_ssize_t j = 0; j < size; j++)
            into[j] = table[image[j]];
    }
}

static PyObject *py_adjust(PyObject *self, PyObject *args) {
    Py_buffer images, factors, shifts, out;
    if (!PyArg_ParseTuple(args, "y*y*y*w*:adjust", &images, &factors, &shifts, &out))
        return NULL;
    const Py_ssize_t count = factors.len / (Py_ssize_t)sizeof(float), size = count ? images.len / count : 0;
    int fine = factors.len == count * (Py_ssize_t)sizeof(float) && shifts.len == factors.len &&
               images.len == count * size && out.len == images.len && PyBuffer_IsContiguous(&images, 'C') &&
               PyBuffer_IsContiguous(&factors, 'C') && PyBuffer_IsContiguous(&shifts, 'C') &&
               PyBuffer_IsContiguous(&out, 'C');
    if (fine) {
        if (images.len < ITEMS_HOLD_BELOW) {
            adjust_all(images.buf, count, size, factors.buf, shifts.buf, out.buf);
        } else {
            FREE_BEGIN adjust_all(images.buf, count, size, factors.buf, shifts.buf, out.buf);
            FREE_END
        }
    }
    PyBuffer_Release(&images);
    PyBuffer_Release(&factors);
    PyBuffer_Release(&shifts);
    PyBuffer_Release(&out);
    if (!fine) {
        PyErr_SetString(PyExc_ValueError, "need uint8 images (n, ...), float32 factors and shifts (n) and a uint8 out "
                                          "of the images' size, all C-contiguous");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"copy", (PyCFunction)(void (*)(void))py_copy, METH_VARARGS | METH_KEYWORDS,
     "copy(chunks, which, local, out, rows, tops=None, lefts=None, flips=None, boxes=None)\n--\n\n"
     "For every k, sample local[k] of chunks[which[k]] into out[rows[k]]: whole, or, with tops and lefts, the\n"
     "window of out's height and width at (tops[k], lefts[k]) of the picture (zeros past its edges), mirrored\n"
     "left-right and top-bottom as flips[k] says; with boxes (float64, one a row of out: windows of whole pixels\n"
     "of out's size, any other a ValueError), at boxes[rows[k]]'s top and left, mirrored as flips[rows[k]] says.\n"
     "The GIL is released while the bytes are copied."},
    {"lines", py_lines, METH_VARARGS,
     "lines(chunks, which, starts, sizes, crops, flips, out, targets, fill)\n--\n\n"
     "For every k, map k is the sizes[k] (height, width) pixels from pixel starts[k] of chunks[which[k]], and\n"
     "out[targets[k], y, x] = map[row y, column x], the map's line under the centre of each of out's in the crop\n"
     "crops[k] (top, left, height, width; floor(top + (y + 0.5) / height * crop height)), reversed where flips[k]\n"
     "(left-right, top-bottom) says, or the pixel fill (bytes) where the row or column lies outside the map. The\n"
     "GIL is released while the pixels are copied."},
    {"ragged_offsets", py_ragged_offsets, METH_VARARGS,
     "ragged_offsets(ranges, which, local, rows, offsets)\n--\n\n"
     "A ragged field's batch: copy k is the span ranges[which[k]][local[k]] ([start, stop) of its chunk's rows) put\n"
     "at batch row rows[k]; offsets (int64, len(rows) + 1) gets where each batch row's rows begin, back to back,\n"
     "and the total. Every index is checked: an IndexError names the first out of range. The GIL is kept."},
    {"ragged_rows", py_ragged_rows, METH_VARARGS,
     "ragged_rows(values, ranges, which, local, rows, offsets, out)\n--\n\n"
     "The spans of ragged_offsets copied out of values[which[k]] (each chunk's rows, of out's format and row\n"
     "shape) into out at offsets[rows[k]]. Every span is checked against its chunk and its place first. The GIL is\n"
     "released for 64 KiB or more."},
    {"rows", py_rows, METH_VARARGS,
     "rows(keys, samples, chunk_size, order, which, local, chunks)\n--\n\n"
     "A batch's rows by chunk (outcore.iterate.gather.Rows): order the rows' stable sort by keys, chunks the keys\n"
     "(each once, increasing), which each sorted row's index in chunks, local its sample % chunk_size. Returns\n"
     "how many chunks, or -1 where the keys spread too far for a counting sort. The GIL is kept for a few\n"
     "thousand rows."},
    {"interleave", py_interleave, METH_VARARGS,
     "interleave(parts, counts, tables, out)\n--\n\n"
     "Into out, batch after batch, each stream's next counts[b, s] items of parts[s] (through tables[s]: an item\n"
     "v as tables[s][v], where tables is not None). The GIL is kept for a few thousand items."},
    {"lookup", py_lookup, METH_VARARGS,
     "lookup(values, table, out)\n--\n\n"
     "out[i] = table[values[i], i % k] for every i of the uint8 values (C order), the table (256, k) of items of 4 or\n"
     "2 bytes (float32, float16, ...), out of as many items of that size. The GIL is released for 65,536 values or\n"
     "more."},
    {"halves", py_halves, METH_VARARGS,
     "halves(values, out)\n--\n\n"
     "The float32 values rounded to float16 (to nearest, ties to even) into out, by the CPU's own conversion (F16C):\n"
     "True; False, and nothing written, where the CPU has none. The GIL is released for 65,536 values or more."},
    {"adjust", py_adjust, METH_VARARGS,
     "adjust(images, factors, shifts, out)\n--\n\n"
     "uint8 picture i's values v into out as clip(((v - mean) * factors[i] + mean) + shifts[i], 0, 255), truncated,\n"
     "in float32 (factors and shifts float32, mean the picture's exact mean rounded to float32). The GIL is released\n"
     "for 65,536 values or more."},
    FREE_METHOD,
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_windows", "Batch samples and windows copied out of chunks.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__windows(void) {
    window_copy_setup();
#ifdef OUTCORE_F16C
    has_f16c = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
#endif
    return PyModule_Create(&module);
}
