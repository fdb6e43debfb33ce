/* A picture's window copied, mirrored left-right and top-bottom as asked (outcore.imaging._windows, and the batch
 * engine of outcore.storage._chunks): `copy_window`, zeros where the window lies past the picture's edges. RGB rows
 * are mirrored five pixels a shuffle where the CPU has SSSE3 (`window_copy_setup` finds out, once, when the module
 * loads), and the rows to mirror are asked for ahead of the reads.
 *
 * Included after Python.h (Py_ssize_t) and string.h. */
#ifndef OUTCORE_WINDOW_COPY_H
#define OUTCORE_WINDOW_COPY_H

#include <stdint.h>
#include <string.h>

/* RGB pixels mirrored one at a time: `pixels` of them from `row` into `into`. */
static void mirror_rgb_scalar(const uint8_t *row, Py_ssize_t pixels, uint8_t *into) {
    const uint8_t *pixel = row + (pixels - 1) * 3;
    for (Py_ssize_t x = 0; x < pixels; x++, pixel -= 3, into += 3)
        memcpy(into, pixel, 3);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define OUTCORE_SSSE3
#include <tmmintrin.h>

static int has_ssse3; /* whether this CPU has SSSE3: set by window_copy_setup, when the module loads */

static void window_copy_setup(void) { has_ssse3 = __builtin_cpu_supports("ssse3"); }

/* RGB pixels mirrored five at a time (3-4x the scalar loop): source pixels [5g, 5g + 5) are loaded with the byte
 * after them (16 bytes: only where source pixel 5g + 5 exists), put in reverse order by one shuffle, and stored at
 * their mirrored place with one byte too many, over the first byte of the next group's place; the groups are
 * taken from the last, so that byte is written again by its own group, and group 0 goes last, byte by byte. */
__attribute__((target("ssse3"))) static void mirror_rgb_ssse3(const uint8_t *row, Py_ssize_t pixels, uint8_t *into) {
    const __m128i reverse = _mm_setr_epi8(12, 13, 14, 9, 10, 11, 6, 7, 8, 3, 4, 5, 0, 1, 2, 15);
    Py_ssize_t groups = pixels >= 6 ? (pixels - 6) / 5 + 1 : 0;
    mirror_rgb_scalar(row + groups * 15, pixels - groups * 5, into); /* the source's last pixels, to into's first */
    for (Py_ssize_t g = groups - 1; g >= 1; g--) {
        __m128i five = _mm_loadu_si128((const __m128i *)(row + g * 15));
        _mm_storeu_si128((__m128i *)(into + (pixels - 5 * g - 5) * 3), _mm_shuffle_epi8(five, reverse));
    }
    if (groups)
        mirror_rgb_scalar(row, 5, into + (pixels - 5) * 3);
}
#endif

/* A row of `pixels` pixels of `size` bytes each, mirrored left-right into `into`. */
static void mirror_row(const uint8_t *row, Py_ssize_t pixels, Py_ssize_t size, uint8_t *into) {
    const uint8_t *pixel = row + (pixels - 1) * size;
    switch (size) {
    case 1:
        for (Py_ssize_t x = 0; x < pixels; x++)
            into[x] = row[pixels - 1 - x];
        break;
    case 3:
#ifdef OUTCORE_SSSE3
        if (has_ssse3) {
            mirror_rgb_ssse3(row, pixels, into);
            break;
        }
#endif
        mirror_rgb_scalar(row, pixels, into);
        break;
    case 4:
        for (Py_ssize_t x = 0; x < pixels; x++, pixel -= 4, into += 4)
            memcpy(into, pixel, 4);
        break;
    default:
        for (Py_ssize_t x = 0; x < pixels; x++, pixel -= size, into += size)
            memcpy(into, pixel, size);
    }
}

/* Have the cache lines of `bytes` bytes from `start` loaded while other work goes on. A row is mirrored from its
 * end, and the CPU's prefetcher, which follows reads going up through memory, does not fetch ahead of reads going
 * down a short row: mirrored rows waited for memory at every line, far longer than rows copied (docs/benchmarks.md,
 * "Figures behind the code"). Asked for two rows ahead, the lines arrive while these are mirrored. */
static void ask_for(const uint8_t *start, size_t bytes) {
#if defined(__GNUC__)
    for (size_t at = 0; at < bytes; at += 64)
        __builtin_prefetch(start + at, 0, 3);
    if (bytes)
        __builtin_prefetch(start + bytes - 1, 0, 3);
#endif
}

#define ROWS_AHEAD 2 /* mirrored rows whose lines are asked for ahead */

/* The window of `height` x `width` pixels at (top, left) of a picture of `rows` x `columns` pixels of `size` bytes,
 * into `into`, mirrored as asked; zeros where it lies past the picture. */
static void copy_window(const uint8_t *picture, Py_ssize_t rows, Py_ssize_t columns, Py_ssize_t size, uint8_t *into,
                        Py_ssize_t height, Py_ssize_t width, Py_ssize_t top, Py_ssize_t left, int flip_x, int flip_y) {
    Py_ssize_t first = left < 0 ? -left : 0;                               /* the window's columns inside the picture */
    Py_ssize_t last = columns - left < width ? columns - left : width;     /* [first, last) */
    size_t line = (size_t)width * size;
    for (Py_ssize_t y = 0; y < height; y++) {
        uint8_t *target = into + (size_t)(flip_y ? height - 1 - y : y) * line;
        Py_ssize_t source_row = top + y;
        if (source_row < 0 || source_row >= rows || first >= last) {
            memset(target, 0, line);
            continue;
        }
        const uint8_t *source = picture + ((size_t)source_row * columns + (size_t)(left + first)) * size;
        size_t inside = (size_t)(last - first) * size;
        if (flip_x) { /* window column x lands at column width - 1 - x */
            for (Py_ssize_t ahead = y ? ROWS_AHEAD : 0; ahead <= ROWS_AHEAD; ahead++)
                if (source_row + ahead < rows && y + ahead < height)
                    ask_for(source + (size_t)ahead * columns * size, inside);
            memset(target, 0, (size_t)(width - last) * size);
            mirror_row(source, last - first, size, target + (size_t)(width - last) * size);
            memset(target + (size_t)(width - first) * size, 0, (size_t)first * size);
        } else {
            memset(target, 0, (size_t)first * size);
            memcpy(target + (size_t)first * size, source, inside);
            memset(target + (size_t)last * size, 0, (size_t)(width - last) * size);
        }
    }
}

#if !defined(OUTCORE_SSSE3)
static void window_copy_setup(void) {}
#endif

#endif
