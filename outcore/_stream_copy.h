/* Large copies written past the caches (outcore.storage._chunks, outcore.imaging._windows).
 *
 * A pixel batch's bytes are copied twice: a chunk's, checked, into its buffer, then each sample into the batch. An
 * ordinary store first reads the cache line it writes (to own it), then writes it back when it is evicted: each
 * copied byte is read twice and written once. On a 16-core host the pixel rows stopped at 133-138k samples a second
 * whatever the threads, about 33 GB/s of such traffic (docs/benchmarks.md, "On a GPU machine again"). A
 * non-temporal store writes whole lines to memory without reading them first, and leaves the caches to what is read
 * next (the loader's own Python and arrays among it): on 2 cores, 1.2x the pixel samples a second
 * (docs/benchmarks.md, "Copies written past the caches").
 *
 * stream_copy(into, from, size): `size` bytes copied. Copies of STREAM_BYTES or more write the whole cache lines of
 * `into` by non-temporal stores (SSE2, which every x86-64 CPU has), and the bytes before its first whole line and
 * after its last by memcpy: a line is never written partly past the caches and partly through them (rows of a
 * crop's window, 336 bytes, so written took twice as long). Shorter copies, and every copy elsewhere, are memcpy's.
 * stream_fence() once a call's copies are done, before another thread may read them: until then non-temporal stores
 * are not ordered with the others. */
#ifndef OUTCORE_STREAM_COPY_H
#define OUTCORE_STREAM_COPY_H

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#define STREAM_STORES 1
#endif

#define LINE_BYTES 64 /* a cache line: only whole ones are streamed, a line written partly stays in the caches */
#define STREAM_BYTES 4096 /* shorter copies (a label, a small sample) stay in the caches, read soon */

#if defined(__GNUC__)
#define STREAM_NOINLINE __attribute__((noinline)) /* its own frame: benchmarks/where_cpu.py counts it in the copies */
#else
#define STREAM_NOINLINE
#endif

STREAM_NOINLINE static void stream_copy(uint8_t *into, const uint8_t *from, size_t size) {
#ifdef STREAM_STORES
    if (size >= STREAM_BYTES) {
        size_t head = (LINE_BYTES - ((uintptr_t)into & (LINE_BYTES - 1))) & (LINE_BYTES - 1);
        memcpy(into, from, head);
        into += head;
        from += head;
        size -= head;
        for (; size >= LINE_BYTES; size -= LINE_BYTES, into += LINE_BYTES, from += LINE_BYTES) {
            __m128i a = _mm_loadu_si128((const __m128i *)from), b = _mm_loadu_si128((const __m128i *)(from + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(from + 32)), d = _mm_loadu_si128((const __m128i *)(from + 48));
            _mm_stream_si128((__m128i *)into, a);
            _mm_stream_si128((__m128i *)(into + 16), b);
            _mm_stream_si128((__m128i *)(into + 32), c);
            _mm_stream_si128((__m128i *)(into + 48), d);
        }
    }
#endif
    memcpy(into, from, size);
}

static void stream_fence(void) {
#ifdef STREAM_STORES
    _mm_sfence();
#endif
}

#endif
