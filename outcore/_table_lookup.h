/* A uint8 picture's pixels through a table of the 256 values' results (outcore.imaging._windows's `lookup`, as
 * outcore.transforms.Normalize computes them; and outcore.storage._chunks's batch engine, normalizing the pictures it
 * cuts): the same code, so the same floats.
 *
 * lookup_all(values, count, table, k, size, out): values[i] of `count` through the table (256 rows of k items of
 * `size` bytes, 4 or 2) at column i % k, into out. */
#ifndef OUTCORE_TABLE_LOOKUP_H
#define OUTCORE_TABLE_LOOKUP_H

#include <stddef.h>
#include <stdint.h>

/* values[i] of `count` through the table (256 rows of k items of ITEM) at column i % k, into out. Written straight
 * into out, through the caches: in a batch's pipeline 1.3x as fast as a block at a time streamed past them
 * (_stream_copy.h). Items of 4 bytes (float32's, int32's) and 2 (float16's bits, int16's) are copied as they are. */
#define LOOKUP_ALL(NAME, ITEM)                                                                                         \
    static void NAME(const uint8_t *values, Py_ssize_t count, const ITEM *table, Py_ssize_t k, ITEM *out) {            \
        Py_ssize_t i = 0, column = 0;                                                                                  \
        if (k == 1) {                                                                                                  \
            for (; i < count; i++)                                                                                     \
                out[i] = table[values[i]];                                                                             \
        } else if (k == 3) { /* RGB: each channel's 256 items together, a pixel's three looked up at once */          \
            ITEM columns[3][256];                                                                                      \
            for (int v = 0; v < 256; v++)                                                                              \
                for (int c = 0; c < 3; c++)                                                                            \
                    columns[c][v] = table[3 * v + c];                                                                  \
            for (; i + 3 <= count; i += 3) {                                                                           \
                out[i] = columns[0][values[i]];                                                                        \
                out[i + 1] = columns[1][values[i + 1]];                                                                \
                out[i + 2] = columns[2][values[i + 2]];                                                                \
            }                                                                                                          \
        } else {                                                                                                       \
            for (; i < count; i++) {                                                                                   \
                out[i] = table[(Py_ssize_t)values[i] * k + column];                                                    \
                if (++column == k)                                                                                     \
                    column = 0;                                                                                        \
            }                                                                                                          \
        }                                                                                                              \
    }

LOOKUP_ALL(lookup_4, uint32_t)
LOOKUP_ALL(lookup_2, uint16_t)

static inline void lookup_all(const uint8_t *values, Py_ssize_t count, const void *table, Py_ssize_t k,
                              Py_ssize_t size, void *out) {
    if (size == 4)
        lookup_4(values, count, table, k, out);
    else
        lookup_2(values, count, table, k, out);
}

#endif
