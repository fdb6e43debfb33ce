/* outcore.imaging._jpeg: a box of a JPEG, decoded from the file's rows and columns that the box needs
 * (libjpeg-turbo's partial decoding: jpeg_crop_scanline, jpeg_skip_scanlines), at a DCT scale of M/8,
 * and resized (bilinear, antialiased) straight into the caller's array; the GIL is released throughout.
 * A box of whole pixels at its own size (a plain crop: CenterCrop without resize on pictures kept at their
 * size, or a JPEG already of the stored size) is copied instead: the same bytes.
 *
 * The pixels are those of decoding the whole picture at that scale, then cutting: the decoded window
 * reaches MARGIN pixels past what is used, where chroma upsampling sees the crop's edge instead of the
 * picture's. The resize is the triangle filter widened by the downscale factor, normalised, in 22-bit
 * fixed point, one pass per axis (columns first) with 8-bit rounding between them: the same arithmetic
 * as Pillow's Image.resize(..., BILINEAR, box=...), which tests/test_native.py checks value for value.
 *
 * decode_each decodes the plain JPEGs of chunks' bytes that are of a batch's size whole, straight into the
 * batch's rows, one decoder for them all and the GIL released once: what decode.py's decode_image does for
 * each of them through simplejpeg, the same pixels, without the 5 us of Python a sample around it; and, built with
 * zlib (OUTCORE_PNG), the plain PNGs among them (_png.h), the pixels Pillow gives, without its Python. crop_each
 * does the same for boxes of the files (decode_region's crop_resize calls, their DCT scale and scaled box
 * chosen here by decode_region's arithmetic: `plan`), without its 11 us of Python a sample. resize_each does the
 * resize alone for boxes of pictures already decoded (a pixel store's chunks: RandomResizedCrop, CenterCrop with a
 * resize), without resize.py's Python around each. check_each is the
 * ingest survey's check of pictures kept at their own size (decoded_size: each file decoded at 1/8, its header's
 * size), for a block of files at once, without the Python around each file; check_files does the same for files
 * named by their paths, each read and digested (BLAKE2b, _blake2b.h) in the same call.
 *
 * The same decoding (decode_each's of a file whole, crop_each's of a box) is lent to outcore.storage._chunks's batch
 * engine, whose threads hold no Python: `picture_decoder`, a capsule of a PictureDecoder (../_picture_decoder.h).
 *
 * Built by setup.py when a libjpeg-turbo (1.5 or later) and its headers are found; outcore.imaging.native
 * falls back to simplejpeg and Pillow without it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../_blake2b.h"
#include "../_free_time.h"
#include "../_picture_decoder.h"
#include "../_whole_files.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#ifdef OUTCORE_PNG
#include "_png.h"
#endif

#define MARGIN 2          /* pixels decoded past a window's edges: fancy upsampling there sees the crop's edge */
#define PRECISION_BITS 22 /* fixed-point weights: 8-bit samples times weights summing to 1 fit in 32 bits */
#define MESSAGE_SIZE 200
/* Rows libjpeg decodes into for a resize start ROW_LEAD bytes past a multiple of ROW_ALIGN: libjpeg-turbo's
 * SIMD colour conversion writes rows that start on a multiple of 32 bytes with non-temporal stores, past the
 * caches, and the resize would read them back from memory. */
#define ROW_ALIGN 32
#define ROW_LEAD 16

#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__) && !defined(__clang__)
#define RESIZE_CLONES __attribute__((target_clones("avx2", "default"))) /* chosen at load time by the CPU */
#else
#define RESIZE_CLONES
#endif

typedef struct {
    struct jpeg_error_mgr manager;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
} Errors;

static void on_error(j_common_ptr cinfo) {
    Errors *errors = (Errors *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, errors->message);
    longjmp(errors->escape, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) /* a warning: corrupt data, which libjpeg would paper over with grey; the full decode refuses it too */
        on_error(cinfo);
}

/* Memory each thread reuses from one picture to the next: the rows a box is decoded into (SCRATCH_ROWS) and a
 * resize's rows between its passes (SCRATCH_MIDDLE), each grown to the largest asked for and kept until the thread
 * ends. Allocated anew for each picture, such blocks (hundreds of KiB) can come and go as fresh pages, mapped and
 * faulted in under the process's address-space lock, which the threads of one process take in turn. */
enum { SCRATCH_ROWS, SCRATCH_MIDDLE, SCRATCH_BLOCKS };

typedef struct {
    void *block[SCRATCH_BLOCKS];
    size_t size[SCRATCH_BLOCKS];
} Scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_keyed = 0; /* the key was made: else each block is allocated for its picture (scratch_done) */

static void scratch_free(void *held) {
    Scratch *scratch = held;
    for (int k = 0; k < SCRATCH_BLOCKS; k++)
        free(scratch->block[k]);
    free(scratch);
}

static void scratch_key_make(void) {
    scratch_keyed = pthread_key_create(&scratch_key, scratch_free) == 0;
}

/* This thread's block `which`, of `size` bytes at least (NULL: no memory); scratch_done lets go of it. */
static void *scratch_take(int which, size_t size) {
    pthread_once(&scratch_once, scratch_key_make);
    if (!scratch_keyed)
        return malloc(size);
    Scratch *scratch = pthread_getspecific(scratch_key);
    if (scratch == NULL) {
        scratch = calloc(1, sizeof(Scratch));
        if (scratch == NULL || pthread_setspecific(scratch_key, scratch) != 0) {
            free(scratch);
            return NULL;
        }
    }
    if (size > scratch->size[which]) {
        size_t grown = size + size / 4; /* room for a somewhat larger picture next */
        free(scratch->block[which]);
        scratch->block[which] = malloc(grown);
        scratch->size[which] = scratch->block[which] != NULL ? grown : 0;
    }
    return scratch->block[which];
}

/* Done with a block scratch_take gave (freed only where there is no thread's block to keep it in). */
static void scratch_done(void *block) {
    if (!scratch_keyed)
        free(block);
}

/* The taps of one axis of a resize: output pixel i is the weighted sum of input pixels first[i] .. first[i] + count[i],
 * by fixed-point `weights` (8-bit samples) or by `exact` ones (samples of more bits, or floating point: taps_plan's
 * `exact`), as Pillow weighs them for each. */
typedef struct {
    int size, width; /* output pixels, taps kept per output pixel */
    int *first, *count;
    int32_t *weights;
    double *exact;
} Taps;

static void taps_free(Taps *taps) {
    free(taps->first);
    free(taps->count);
    free(taps->weights);
    free(taps->exact);
}

static double triangle(double x) {
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

/* Whether tap j of output pixel i weighs nothing. */
static int tap_zero(const Taps *taps, int i, int j) {
    size_t at = (size_t)i * taps->width + j;
    return taps->exact ? taps->exact[at] == 0.0 : taps->weights[at] == 0;
}

/* The taps that resize [start, end) of an axis of `limit` pixels to `size` pixels, their weights fixed-point or, with
 * `exact`, doubles (Pillow's for 32-bit images); 0, or -1 out of memory. */
static int taps_plan(Taps *taps, double start, double end, int limit, int size, int exact) {
    float first = (float)start, last = (float)end; /* a box's edges and their difference are single precision, as in Pillow */
    float span = last - first;
    start = first;
    double scale = (double)span / size;
    double stretch = scale < 1.0 ? 1.0 : scale; /* the filter widens when shrinking: antialiasing */
    double support = stretch, inverse = 1.0 / stretch;
    int width = (int)ceil(support) * 2 + 1;
    double *raw = malloc(width * sizeof(double));
    taps->size = size;
    taps->width = width;
    taps->first = malloc(size * sizeof(int));
    taps->count = malloc(size * sizeof(int));
    if (exact)
        taps->exact = calloc((size_t)size * width, sizeof(double));
    else
        taps->weights = calloc((size_t)size * width, sizeof(int32_t));
    if (!raw || !taps->first || !taps->count || (!taps->weights && !taps->exact)) {
        free(raw);
        taps_free(taps);
        memset(taps, 0, sizeof(*taps)); /* freed again by its caller's taps_free: nothing */
        return -1;
    }
    for (int i = 0; i < size; i++) {
        double center = start + (i + 0.5) * scale;
        int low = (int)(center - support + 0.5), high = (int)(center + support + 0.5);
        if (low < 0)
            low = 0;
        if (high > limit)
            high = limit;
        int count = high > low ? high - low : 0;
        if (count > width)
            count = width;
        double total = 0.0;
        for (int j = 0; j < count; j++) {
            raw[j] = triangle((j + low - center + 0.5) * inverse);
            total += raw[j];
        }
        for (int j = 0; j < count; j++) {
            double weight = total != 0.0 ? raw[j] / total : raw[j];
            if (exact)
                taps->exact[(size_t)i * width + j] = weight;
            else
                taps->weights[(size_t)i * width + j] =
                    (int32_t)(weight < 0 ? weight * (1 << PRECISION_BITS) - 0.5 : weight * (1 << PRECISION_BITS) + 0.5);
        }
        int skip = 0; /* fixed-point taps of weight 0 add nothing: dropped (an identity keeps one). Exact ones are all
                         summed, as Pillow sums them: 0 x inf is NaN there */
        while (!exact && count > 1 && tap_zero(taps, i, count - 1))
            count--;
        while (!exact && skip < count - 1 && tap_zero(taps, i, skip))
            skip++;
        if (skip > 0)
            memmove(taps->weights + (size_t)i * width, taps->weights + (size_t)i * width + skip,
                    (count - skip) * sizeof(int32_t));
        taps->first[i] = low + skip;
        taps->count[i] = count - skip;
    }
    free(raw);
    return 0;
}

/* The input pixels [low, high) that the taps read. */
static void taps_span(const Taps *taps, int *low, int *high) {
    *low = taps->first[0];
    *high = taps->first[0] + taps->count[0];
    for (int i = 0; i < taps->size; i++) {
        if (taps->first[i] < *low)
            *low = taps->first[i];
        if (taps->first[i] + taps->count[i] > *high)
            *high = taps->first[i] + taps->count[i];
    }
}

/* Whether the taps copy their input as it is: one tap of weight 1 per output pixel (the others of weight 0), on
 * consecutive input pixels from `*origin` on (a box of whole pixels resized to its own size: a plain crop). */
static int taps_copy(const Taps *taps, int *origin) {
    int base = 0;
    for (int i = 0; i < taps->size; i++) {
        int one = -1;
        for (int j = 0; j < taps->count[i]; j++) {
            size_t at = (size_t)i * taps->width + j;
            if (tap_zero(taps, i, j))
                continue;
            if (one >= 0 || (taps->exact ? taps->exact[at] != 1.0 : taps->weights[at] != 1 << PRECISION_BITS))
                return 0;
            one = taps->first[i] + j;
        }
        if (i == 0)
            base = one;
        if (one < 0 || one != base + i)
            return 0;
    }
    *origin = base;
    return 1;
}

/* A row of `pixels` pixels, `channels` deep, mirrored left-right into `into`. RGB pixels move 4 bytes at a
 * time (rather than byte by byte): the 4th is read from the pixel after, written over the next pixel's
 * first and written again with it; the first and last pixels, whose 4th byte lies outside, go byte by byte. */
static void mirror_row(const uint8_t *row, int pixels, int channels, uint8_t *into) {
    if (channels == 3) {
        for (int x = 0; x < pixels; x++) {
            const uint8_t *pixel = row + (size_t)(pixels - 1 - x) * 3;
            if (x == 0 || x == pixels - 1) {
                memcpy(into + (size_t)x * 3, pixel, 3);
            } else {
                uint32_t four;
                memcpy(&four, pixel, 4);
                memcpy(into + (size_t)x * 3, &four, 4);
            }
        }
    } else {
        for (int x = 0; x < pixels; x++)
            into[x] = row[pixels - 1 - x];
    }
}

/* Whether a box (top, left, bottom, right) is not empty and lies within a picture, in single precision as
 * the taps see it (an edge computed as 375 * (188 / 375.0) is 188). */
static int box_inside(const double *box, double height, double width) {
    float top = (float)box[0], left = (float)box[1], bottom = (float)box[2], right = (float)box[3];
    return top >= 0 && left >= 0 && bottom <= height && right <= width && bottom > top && right > left;
}

#define ROUNDING 1e-6 /* crops.py's ROUNDING: how far past a picture's edges a box computed in floating point lies within */

/* Whether a box (top, left, bottom, right) lies within a picture as crops.py's `within` says, up to ROUNDING. */
static int box_within(const double *box, double height, double width) {
    return fmin(box[0], box[1]) > -ROUNDING && box[2] < height + ROUNDING && box[3] < width + ROUNDING;
}

/* Whether a box (top, left, height, width) is one: finite, of a positive height and width (crops.py refuses
 * others: they are left to it). */
static int a_box(const double *box) {
    return isfinite(box[0]) && isfinite(box[1]) && isfinite(box[2]) && isfinite(box[3]) && box[2] > 0 && box[3] > 0;
}

/* The part of a box (top, left, height, width) resized to out_height x out_width that lies inside a picture of
 * height x width, as crops.py's `box_part` finds it, in the same arithmetic (Python's round is rint's, ties to even):
 * its edges (top, left, bottom, right) in the picture, and where its output pixels lie in the output mirrored as
 * flip_x and flip_y say: place = first row, first column, rows, columns. 0 where nothing of it does. */
static int box_part(const double *box, int height, int width, int out_height, int out_width, int flip_x, int flip_y,
                    double edges[4], int place[4]) {
    const double top = box[0], left = box[1], rows = box[2], columns = box[3];
    const double y0 = 0 > top ? 0 : top, y1 = height < top + rows ? height : top + rows;
    const double x0 = 0 > left ? 0 : left, x1 = width < left + columns ? width : left + columns;
    const double r0 = rint((y0 - top) * out_height / rows), r1 = rint((y1 - top) * out_height / rows);
    const double c0 = rint((x0 - left) * out_width / columns), c1 = rint((x1 - left) * out_width / columns);
    if (!(y0 < y1 && x0 < x1 && r0 < r1 && c0 < c1))
        return 0;
    edges[0] = y0;
    edges[1] = x0;
    edges[2] = y0 + (y1 - y0); /* box_edges of the part (y0, x0, y1 - y0, x1 - x0) */
    edges[3] = x0 + (x1 - x0);
    place[0] = (int)(flip_y ? out_height - r1 : r0);
    place[1] = (int)(flip_x ? out_width - c1 : c0);
    place[2] = (int)(r1 - r0);
    place[3] = (int)(c1 - c0);
    return 1;
}

/* Where box (top, left, height, width) of a height x width picture is cut, resized to out_height x out_width and
 * mirrored as flip_x and flip_y say: 1 with its `edges` (top, left, bottom, right) in the picture and the output
 * pixels `place` (first row, first column, rows, columns) they are resized to: the whole output for a box inside, the
 * part inside for one past the picture's edges (box_part), its output `row` of `row_bytes` zeroed first; 0 where
 * nothing of the picture is in it (the row zeroed: done); -1 where it is left to Python: a box within ROUNDING of
 * the edges that single precision does not find inside, or not a box (a_box). */
static int box_cut(const double *box, int height, int width, int out_height, int out_width, int flip_x, int flip_y,
                   uint8_t *row, size_t row_bytes, double edges[4], int place[4]) {
    edges[0] = box[0];
    edges[1] = box[1];
    edges[2] = box[0] + box[2];
    edges[3] = box[1] + box[3];
    place[0] = place[1] = 0;
    place[2] = out_height;
    place[3] = out_width;
    if (box_inside(edges, (double)height, (double)width))
        return 1;
    if (box_within(edges, (double)height, (double)width) || !a_box(box))
        return -1;
    memset(row, 0, row_bytes);
    return box_part(box, height, width, out_height, out_width, flip_x, flip_y, edges, place);
}

static inline uint8_t clip8(int32_t value) {
    value >>= PRECISION_BITS;
    return value < 0 ? 0 : value > 255 ? 255 : (uint8_t)value;
}

#if defined(__GNUC__) && defined(__x86_64__)
#define OUTCORE_AVX2
#include <immintrin.h>

static int has_avx2; /* whether this CPU has AVX2: set when the module loads */

/* 8 bytes from `at`, or those of them before `end` (zeros after): a row's last pixels are not over-read. */
__attribute__((target("avx2"))) static inline __m128i load8(const uint8_t *at, const uint8_t *end) {
    if (at + 8 <= end)
        return _mm_loadl_epi64((const __m128i *)at);
    uint8_t bytes[8] = {0};
    memcpy(bytes, at, end - at < 8 ? (size_t)(end - at) : 8);
    return _mm_loadl_epi64((const __m128i *)bytes);
}

/* columns_pass for RGB on AVX2: two taps a step, a pixel's three channels in the lanes of one half each. The
 * same integer sums as the scalar loop, in another order: the same bytes. */
__attribute__((target("avx2"))) static void columns_rgb_avx2(const uint8_t *line, size_t bytes, int left,
                                                             const Taps *columns, uint8_t *into, int flip_x) {
    const uint8_t *end = line + bytes;
    const __m128i spread = _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m128i half = _mm_set1_epi32(1 << (PRECISION_BITS - 1));
    for (int x = 0; x < columns->size; x++) {
        const int32_t *weights = columns->weights + (size_t)x * columns->width;
        const uint8_t *pixel = line + (size_t)(columns->first[x] - left) * 3;
        int count = columns->count[x], j = 0;
        __m256i sums = _mm256_setzero_si256();
        for (; j + 1 < count; j += 2) {
            __m256i values = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(load8(pixel + 3 * j, end), spread));
            __m256i scales = _mm256_setr_epi32(weights[j], weights[j], weights[j], weights[j], weights[j + 1],
                                               weights[j + 1], weights[j + 1], weights[j + 1]);
            sums = _mm256_add_epi32(sums, _mm256_mullo_epi32(values, scales));
        }
        __m128i sum = _mm_add_epi32(_mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1)), half);
        if (j < count) {
            __m128i values = _mm_cvtepu8_epi32(_mm_shuffle_epi8(load8(pixel + 3 * j, end), spread));
            sum = _mm_add_epi32(sum, _mm_mullo_epi32(values, _mm_set1_epi32(weights[j])));
        }
        __m128i clipped = _mm_srai_epi32(sum, PRECISION_BITS);
        clipped = _mm_packus_epi16(_mm_packs_epi32(clipped, clipped), clipped); /* to 0..255, as clip8 */
        uint32_t rgb = (uint32_t)_mm_cvtsi128_si32(clipped);
        uint8_t *pixel_into = into + (size_t)(flip_x ? columns->size - 1 - x : x) * 3;
        pixel_into[0] = (uint8_t)rgb;
        pixel_into[1] = (uint8_t)(rgb >> 8);
        pixel_into[2] = (uint8_t)(rgb >> 16);
    }
}
#endif

/* One row (`line`, `bytes` long, its first pixel at column `left`) through the column taps into `into`,
 * mirrored left-right with `flip_x` (each pixel written to its mirrored place: the flip costs nothing). */
static void columns_pass(const uint8_t *line, size_t bytes, int left, int channels, const Taps *columns, uint8_t *into,
                         int flip_x) {
#ifdef OUTCORE_AVX2
    if (channels == 3 && has_avx2) {
        columns_rgb_avx2(line, bytes, left, columns, into, flip_x);
        return;
    }
#endif
    (void)bytes;
    for (int x = 0; x < columns->size; x++) {
        const int32_t *weights = columns->weights + (size_t)x * columns->width;
        const uint8_t *pixel = line + (size_t)(columns->first[x] - left) * channels;
        uint8_t *pixel_into = into + (size_t)(flip_x ? columns->size - 1 - x : x) * channels;
        for (int c = 0; c < channels; c++) {
            int32_t sum = 1 << (PRECISION_BITS - 1);
            for (int j = 0; j < columns->count[x]; j++)
                sum += pixel[(size_t)j * channels + c] * weights[j];
            pixel_into[c] = clip8(sum);
        }
    }
}

/* Resize through the taps: `source` (rows of `stride` bytes, `channels` deep, its origin at pixel (top, left)
 * of the axes the taps index) into `out` (rows.size rows of columns.size x channels bytes, each `out_stride` bytes
 * after the one before), mirrored as asked. */
RESIZE_CLONES static int resize(const uint8_t *source, size_t stride, int top, int left, int channels, const Taps *rows,
                  const Taps *columns, uint8_t *out, size_t out_stride, int flip_x, int flip_y) {
    size_t across = (size_t)columns->size * channels;
    int row_origin, column_origin;
    if (taps_copy(rows, &row_origin) && taps_copy(columns, &column_origin)) { /* a plain crop: its pixels copied (58 us,
                                                                                 not 91, at 112x112) */
        for (int y = 0; y < rows->size; y++) {
            const uint8_t *line =
                source + (size_t)(row_origin + y - top) * stride + (size_t)(column_origin - left) * channels;
            uint8_t *into = out + (size_t)(flip_y ? rows->size - 1 - y : y) * out_stride;
            if (flip_x)
                mirror_row(line, columns->size, channels, into);
            else
                memcpy(into, line, across);
        }
        return 0;
    }
    int row_low, row_high;
    taps_span(rows, &row_low, &row_high);
    size_t middle_bytes = ((size_t)(row_high - row_low) * across + sizeof(int32_t) - 1) / sizeof(int32_t) * sizeof(int32_t);
    uint8_t *middle = scratch_take(SCRATCH_MIDDLE, middle_bytes + across * sizeof(int32_t));
    if (middle == NULL)
        return -1;
    int32_t *sums = (int32_t *)(middle + middle_bytes);
    for (int y = row_low; y < row_high; y++) /* columns first, only the rows the second pass reads */
        columns_pass(source + (size_t)(y - top) * stride, stride, left, channels, columns,
                     middle + (size_t)(y - row_low) * across, flip_x);
    for (int y = 0; y < rows->size; y++) { /* then rows: tap by tap over a whole row, which vectorises */
        const int32_t *weights = rows->weights + (size_t)y * rows->width;
        for (size_t k = 0; k < across; k++)
            sums[k] = 1 << (PRECISION_BITS - 1);
        for (int j = 0; j < rows->count[y]; j++) {
            const uint8_t *line = middle + (size_t)(rows->first[y] + j - row_low) * across;
            int32_t weight = weights[j];
            for (size_t k = 0; k < across; k++)
                sums[k] += line[k] * weight;
        }
        uint8_t *into = out + (size_t)(flip_y ? rows->size - 1 - y : y) * out_stride;
        for (size_t k = 0; k < across; k++)
            into[k] = clip8(sums[k]);
    }
    scratch_done(middle);
    return 0;
}

/* Samples of more than 8 bits, or floating point, by their buffer format: uint16 ('H'), int16 ('h'), float32 ('f')
 * and float64 ('d'), resized as Pillow resizes a 32-bit float picture ("F"), channel by channel: read as float32
 * (a float64 sample rounded to it), summed in double precision, each pass's result float32; then rounded half to
 * even and held to an integer kind's range (resize.py's fallback does the same through Pillow). */
static size_t sample_bytes(int kind) {
    return kind == 'd' ? 8 : kind == 'f' ? 4 : kind == 'B' ? 1 : 2;
}

/* `count` samples of `kind` from `at` as float32 into `into` (a float64 sample rounded to it). */
static inline void row_get(const uint8_t *at, int kind, size_t count, float *into) {
    if (kind == 'H') {
        for (size_t k = 0; k < count; k++) {
            uint16_t value;
            memcpy(&value, at + 2 * k, 2);
            into[k] = (float)value;
        }
    } else if (kind == 'h') {
        for (size_t k = 0; k < count; k++) {
            int16_t value;
            memcpy(&value, at + 2 * k, 2);
            into[k] = (float)value;
        }
    } else if (kind == 'f') {
        memcpy(into, at, count * sizeof(float));
    } else {
        for (size_t k = 0; k < count; k++) {
            double value;
            memcpy(&value, at + 8 * k, 8);
            into[k] = (float)value;
        }
    }
}

/* A float32 held to [low, high] (integers of less than 2^22), then rounded half to even, as numpy's rint then clip
 * give it (NaN: 0, as numpy casts it): adding and taking away 1.5 * 2^23 rounds in the default rounding mode. */
static inline float held(float value, float low, float high) {
    if (!(value >= low))
        return value != value ? 0.0f : low;
    if (value > high)
        return high;
    return (value + 12582912.0f) - 12582912.0f;
}

/* `count` sums as float32, then as samples of `kind` (integers rounded and held to their range) into `at`. */
static inline void row_put(const double *sums, int kind, size_t count, uint8_t *at) {
    for (size_t k = 0; k < count; k++) {
        float value = (float)sums[k];
        if (kind == 'H') {
            uint16_t sample = (uint16_t)held(value, 0.0f, 65535.0f);
            memcpy(at + 2 * k, &sample, 2);
        } else if (kind == 'h') {
            int16_t sample = (int16_t)held(value, -32768.0f, 32767.0f);
            memcpy(at + 2 * k, &sample, 2);
        } else if (kind == 'f') {
            memcpy(at + 4 * k, &value, 4);
        } else {
            double sample = value;
            memcpy(at + 8 * k, &sample, 8);
        }
    }
}

/* A row of `pixels` pixels of `pixel` bytes each mirrored left-right into `into`. */
static void mirror_pixels(const uint8_t *row, int pixels, size_t pixel, uint8_t *into) {
    for (int x = 0; x < pixels; x++)
        memcpy(into + (size_t)x * pixel, row + (size_t)(pixels - 1 - x) * pixel, pixel);
}

/* resize for samples of `kind` (row_get) through exact taps (taps_plan's `exact`): `source` rows of `stride` bytes,
 * `out` rows `out_stride` bytes apart. A plain crop is its samples copied as they are. */
RESIZE_CLONES static int resize_exact(const uint8_t *source, size_t stride, int top, int left, int channels, int kind,
                                      const Taps *rows, const Taps *columns, uint8_t *out, size_t out_stride, int flip_x,
                                      int flip_y) {
    size_t item = sample_bytes(kind), pixel = item * channels, across = (size_t)columns->size * channels;
    int row_origin, column_origin;
    if (taps_copy(rows, &row_origin) && taps_copy(columns, &column_origin)) {
        for (int y = 0; y < rows->size; y++) {
            const uint8_t *line = source + (size_t)(row_origin + y - top) * stride + (column_origin - left) * pixel;
            uint8_t *into = out + (size_t)(flip_y ? rows->size - 1 - y : y) * out_stride;
            if (flip_x)
                mirror_pixels(line, columns->size, pixel, into);
            else
                memcpy(into, line, across * item);
        }
        return 0;
    }
    int row_low, row_high, column_low, column_high;
    taps_span(rows, &row_low, &row_high);
    taps_span(columns, &column_low, &column_high);
    size_t middle_count = (size_t)(row_high - row_low) * across, line_count = (size_t)(column_high - column_low) * channels;
    size_t floats = (middle_count + line_count + 1) / 2 * 2; /* the sums after them aligned for doubles */
    float *middle = scratch_take(SCRATCH_MIDDLE, floats * sizeof(float) + across * sizeof(double));
    if (middle == NULL)
        return -1;
    float *line = middle + middle_count; /* a source row's samples the taps read, as float32 */
    double *sums = (double *)(middle + floats);
    for (int y = row_low; y < row_high; y++) { /* columns first, only the rows the second pass reads */
        row_get(source + (size_t)(y - top) * stride + (size_t)(column_low - left) * pixel, kind, line_count, line);
        float *into = middle + (size_t)(y - row_low) * across;
        for (int x = 0; x < columns->size; x++) {
            const double *weights = columns->exact + (size_t)x * columns->width;
            const float *first = line + (size_t)(columns->first[x] - column_low) * channels;
            float *pixel_into = into + (size_t)(flip_x ? columns->size - 1 - x : x) * channels;
            if (channels == 3) { /* a pixel's three sums side by side: each in the order of its taps, as alone */
                double red = 0.0, green = 0.0, blue = 0.0;
                for (int j = 0; j < columns->count[x]; j++) {
                    red += (double)first[3 * j] * weights[j];
                    green += (double)first[3 * j + 1] * weights[j];
                    blue += (double)first[3 * j + 2] * weights[j];
                }
                pixel_into[0] = (float)red;
                pixel_into[1] = (float)green;
                pixel_into[2] = (float)blue;
                continue;
            }
            for (int c = 0; c < channels; c++) {
                double sum = 0.0;
                for (int j = 0; j < columns->count[x]; j++)
                    sum += (double)first[(size_t)j * channels + c] * weights[j];
                pixel_into[c] = (float)sum;
            }
        }
    }
    for (int y = 0; y < rows->size; y++) { /* then rows, tap by tap over a whole row, which vectorises */
        const double *weights = rows->exact + (size_t)y * rows->width;
        for (size_t k = 0; k < across; k++)
            sums[k] = 0.0;
        for (int j = 0; j < rows->count[y]; j++) {
            const float *taken = middle + (size_t)(rows->first[y] + j - row_low) * across;
            double weight = weights[j];
            for (size_t k = 0; k < across; k++)
                sums[k] += (double)taken[k] * weight;
        }
        row_put(sums, kind, across, out + (size_t)(flip_y ? rows->size - 1 - y : y) * out_stride);
    }
    scratch_done(middle);
    return 0;
}

/* A resize of samples of `kind` ('B': 8-bit, through fixed-point taps; the others: resize_exact), its taps planned
 * here: box `edges` (top, left, bottom, right) of a `height` x `width` picture into out_height x out_width; 0, or -1
 * out of memory. */
static int resize_kind(const uint8_t *source, size_t stride, int height, int width, int channels, int kind,
                       const double *edges, int out_height, int out_width, uint8_t *out, size_t out_stride, int flip_x,
                       int flip_y) {
    Taps rows = {0}, columns = {0};
    int exact = kind != 'B';
    int failed = taps_plan(&rows, edges[0], edges[2], height, out_height, exact) ||
                 taps_plan(&columns, edges[1], edges[3], width, out_width, exact) ||
                 (exact ? resize_exact(source, stride, 0, 0, channels, kind, &rows, &columns, out, out_stride, flip_x, flip_y)
                        : resize(source, stride, 0, 0, channels, &rows, &columns, out, out_stride, flip_x, flip_y));
    taps_free(&rows);
    taps_free(&columns);
    return failed ? -1 : 0;
}

typedef struct {
    const uint8_t *data;
    size_t size;
    int scale, channels;
    double box[4]; /* top, left, bottom, right, in the scaled picture's pixels */
    int height, width; /* the output's */
    int file_height, file_width; /* > 0: box is in the pixels of a file of this size, scale chosen here (plan) */
} Request;

/* How a JPEG's colour space is decoded to `channels`, the decoder set to decode it as simplejpeg does (accurate
 * integer IDCT, fancy upsampling): DECODED_AS_ASKED for greyscale as grey or as RGB (each level repeated: Pillow's
 * convert("RGB")) and YCbCr as RGB; DECODED_TO_WEIGH for YCbCr asked as grey (decoded as RGB, its rows then weighed:
 * weigh_rows); 0 for any other. */
enum { DECODED_AS_ASKED = 1, DECODED_TO_WEIGH = 2 };

static int decode_as(struct jpeg_decompress_struct *cinfo, int channels) {
    const int grey = cinfo->jpeg_color_space == JCS_GRAYSCALE;
    if (!grey && cinfo->jpeg_color_space != JCS_YCbCr)
        return 0;
    cinfo->out_color_space = grey && channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    cinfo->dct_method = JDCT_ISLOW;
    cinfo->do_fancy_upsampling = TRUE;
    return !grey && channels == 1 ? DECODED_TO_WEIGH : DECODED_AS_ASKED;
}

/* `rows` rows of `width` RGB pixels, back to back, made grey in place (rows of `width` bytes, back to back) as Pillow's
 * convert("L") weighs them (ITU-R 601-2 luma, in 16-bit fixed point, rounded). */
static void weigh_rows(uint8_t *pixels, long rows, long width) {
    const size_t count = (size_t)rows * width;
    for (size_t k = 0; k < count; k++) {
        const uint8_t *rgb = pixels + 3 * k;
        pixels[k] = (uint8_t)((rgb[0] * 19595u + rgb[1] * 38470u + rgb[2] * 7471u + 0x8000u) >> 16);
    }
}

/* decode.py's dct_scale: the smallest of 1/8, 1/4, 1/2 and 1 (in eighths) at which a picture of height x
 * width decodes to at least need_height x need_width. */
static int dct_scale(long height, long width, double need_height, double need_width) {
    if (height < 8 || width < 8)
        return 8;
    for (int eighths = 1; eighths < 8; eighths *= 2)
        if ((height * eighths + 7) / 8 >= need_height && (width * eighths + 7) / 8 >= need_width)
            return eighths;
    return 8;
}

/* decode.py's decode_region, for a box (top, left, bottom, right) of a file's own pixels resized to
 * out_height x out_width: the DCT scale, and the box in the scaled picture's pixels. The same arithmetic,
 * in the same order, in double precision: the same scale and box. */
static void plan(long height, long width, int out_height, int out_width, const double *file_box, int *scale,
                 double *box) {
    double need_height = fmin((double)height, ceil((double)(height * out_height) / (file_box[2] - file_box[0])));
    double need_width = fmin((double)width, ceil((double)(width * out_width) / (file_box[3] - file_box[1])));
    *scale = dct_scale(height, width, need_height, need_width);
    double fy = (double)((height * *scale + 7) / 8) / (double)height;
    double fx = (double)((width * *scale + 7) / 8) / (double)width;
    box[0] = file_box[0] * fy;
    box[1] = file_box[1] * fx;
    box[2] = file_box[2] * fy;
    box[3] = file_box[3] * fx;
}

/* What a crop_resize holds while it runs, on the heap: the error handler frees it after a longjmp. */
typedef struct {
    struct jpeg_decompress_struct cinfo;
    Errors errors;
    Taps rows, columns;
    uint8_t *decoded; /* the decoded rows and their pointers: this thread's SCRATCH_ROWS */
} Work;

static void work_free(Work *work) {
    jpeg_destroy_decompress(&work->cinfo);
    scratch_done(work->decoded);
    taps_free(&work->rows);
    taps_free(&work->columns);
    free(work);
}

static void fail(Work *work, const char *message) {
    snprintf(work->errors.message, JMSG_LENGTH_MAX, "%s", message);
    longjmp(work->errors.escape, 1);
}

/* Decode what the resize of `request` reads, then resize it into `out` (rows `out_stride` bytes apart); 0, or -1 with
 * `message` set, or 1 (`message` set, nothing decoded) for a colour JPEG asked for as grey: one to decode whole. */
static int crop_resize(const Request *request, uint8_t *out, size_t out_stride, int flip_x, int flip_y, char *message) {
    Work *const work = calloc(1, sizeof(Work));
    if (work == NULL) {
        snprintf(message, MESSAGE_SIZE, "out of memory");
        return -1;
    }
    struct jpeg_decompress_struct *cinfo = &work->cinfo;
    cinfo->err = jpeg_std_error(&work->errors.manager);
    work->errors.manager.error_exit = on_error;
    work->errors.manager.emit_message = on_message;
    if (setjmp(work->errors.escape)) {
        snprintf(message, MESSAGE_SIZE, "%s", work->errors.message);
        work_free(work);
        return -1;
    }
    jpeg_create_decompress(cinfo);
    jpeg_mem_src(cinfo, request->data, (unsigned long)request->size);
    jpeg_read_header(cinfo, TRUE);
    const int decoded = decode_as(cinfo, request->channels);
    if (decoded == DECODED_TO_WEIGH) { /* decoded whole by the caller (decode_plain), as Pillow's path decodes it */
        snprintf(message, MESSAGE_SIZE, "a colour JPEG asked for as grey");
        work_free(work);
        return 1;
    }
    if (!decoded)
        fail(work, request->channels == 1 ? "not a greyscale or YCbCr JPEG" : "not a YCbCr or greyscale JPEG");
    int scale = request->scale;
    double box[4] = {request->box[0], request->box[1], request->box[2], request->box[3]};
    if (request->file_height > 0) {
        if (cinfo->image_height != (JDIMENSION)request->file_height ||
            cinfo->image_width != (JDIMENSION)request->file_width)
            fail(work, "the file is of another size");
        plan(request->file_height, request->file_width, request->height, request->width, request->box, &scale, box);
    }
    cinfo->scale_num = scale;
    cinfo->scale_denom = 8;
    jpeg_start_decompress(cinfo);
    if (!box_inside(box, cinfo->output_height, cinfo->output_width))
        fail(work, "the box lies outside the scaled picture");
    if (taps_plan(&work->rows, box[0], box[2], cinfo->output_height, request->height, 0) ||
        taps_plan(&work->columns, box[1], box[3], cinfo->output_width, request->width, 0))
        fail(work, "out of memory");
    int top, bottom, left, right;
    taps_span(&work->rows, &top, &bottom);
    taps_span(&work->columns, &left, &right);
    JDIMENSION x = left > MARGIN ? left - MARGIN : 0;
    JDIMENSION end = right + MARGIN < (int)cinfo->output_width ? (JDIMENSION)(right + MARGIN) : cinfo->output_width;
    JDIMENSION across = end - x;
    if (across < cinfo->output_width)
        jpeg_crop_scanline(cinfo, &x, &across); /* moves x back to an iMCU's edge */
    if (top > MARGIN)
        jpeg_skip_scanlines(cinfo, top - MARGIN);
    int first = cinfo->output_scanline, count = bottom - first;
    size_t stride = ((size_t)cinfo->output_width * request->channels + ROW_ALIGN - 1) / ROW_ALIGN * ROW_ALIGN;
    size_t lines_bytes = (size_t)count * sizeof(JSAMPROW);
    work->decoded = scratch_take(SCRATCH_ROWS, lines_bytes + count * stride + ROW_ALIGN);
    if (work->decoded == NULL)
        fail(work, "out of memory");
    JSAMPROW *lines = (JSAMPROW *)work->decoded;
    uint8_t *start = work->decoded + lines_bytes;
    uint8_t *pixels = start + (ROW_ALIGN + ROW_LEAD - (uintptr_t)start % ROW_ALIGN) % ROW_ALIGN;
    for (int i = 0; i < count; i++)
        lines[i] = pixels + i * stride;
    while ((int)cinfo->output_scanline < bottom) /* the rows below the box are not decoded */
        jpeg_read_scanlines(cinfo, lines + (cinfo->output_scanline - first), bottom - cinfo->output_scanline);
    int failed = resize(pixels, stride, first, (int)x, request->channels, &work->rows, &work->columns, out, out_stride,
                        flip_x, flip_y);
    if (failed)
        snprintf(message, MESSAGE_SIZE, "out of memory");
    work_free(work);
    return failed;
}

/* The buffer of an array (C order, with its shape), writable when asked; 0, or -1 with an exception set. */
static int array_buffer(PyObject *array, Py_buffer *view, int writable) {
    return PyObject_GetBuffer(array, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0));
}

static PyObject *py_crop_resize(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"data", "scale", "box", "out", "flip_x", "flip_y", NULL};
    Py_buffer data, out;
    PyObject *out_array;
    Request request = {0};
    int flip_x = 0, flip_y = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*i(dddd)O|pp:crop_resize", keywords, &data, &request.scale,
                                     &request.box[0], &request.box[1], &request.box[2], &request.box[3], &out_array,
                                     &flip_x, &flip_y))
        return NULL;
    if (array_buffer(out_array, &out, 1) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    if (request.scale < 1 || request.scale > 8) {
        PyErr_Format(PyExc_ValueError, "scale=%d is not a DCT scale in 1..8 (eighths)", request.scale);
    } else if (out.ndim != 3 || strcmp(out.format, "B") ||
               (out.shape[2] != 1 && out.shape[2] != 3)) {
        PyErr_SetString(PyExc_ValueError, "out must be a C-contiguous uint8 array of shape (height, width, 1 or 3)");
    } else {
        char message[MESSAGE_SIZE] = "";
        request.data = data.buf;
        request.size = data.len;
        request.height = (int)out.shape[0];
        request.width = (int)out.shape[1];
        request.channels = (int)out.shape[2];
        int failed;
        FREE_BEGIN failed = crop_resize(&request, out.buf, (size_t)request.width * request.channels, flip_x, flip_y,
                                        message);
        FREE_END if (failed) PyErr_SetString(PyExc_ValueError, message);
        else result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return result;
}

/* A 16- or 32-bit number of a TIFF header, in its byte order (`big`: "MM"). */
static uint32_t tiff_number(const uint8_t *at, int bytes, int big) {
    uint32_t value = 0;
    for (int i = 0; i < bytes; i++)
        value |= (uint32_t)at[big ? i : bytes - 1 - i] << (8 * (bytes - 1 - i));
    return value;
}

/* The orientation tag (0x0112) of the first directory of an EXIF block's TIFF header (`tiff`, `size` bytes): its
 * value, -1 where the directory has none, 0 where the block is not one this reads as Pillow does (an odd header, a
 * directory past the block, the tag twice, or not one SHORT). */
static int tiff_orientation(const uint8_t *tiff, size_t size) {
    if (size < 8)
        return 0;
    const int big = memcmp(tiff, "MM\0*", 4) == 0;
    if (!big && memcmp(tiff, "II*\0", 4) != 0)
        return 0;
    const size_t directory = tiff_number(tiff + 4, 4, big);
    if (directory < 8 || directory + 2 > size)
        return 0;
    const size_t entries = tiff_number(tiff + directory, 2, big);
    if (directory + 2 + 12 * entries > size)
        return 0;
    int found = -1;
    for (size_t k = 0; k < entries; k++) {
        const uint8_t *entry = tiff + directory + 2 + 12 * k;
        if (tiff_number(entry, 2, big) != 0x0112)
            continue;
        if (found != -1 || tiff_number(entry + 2, 2, big) != 3 || tiff_number(entry + 4, 4, big) != 1)
            return 0;
        found = (int)tiff_number(entry + 8, 2, big);
    }
    return found;
}

/* A JPEG's EXIF orientation as decode.py's `_orientation` reads it with Pillow, from its header segments (up to its
 * image data): 1 (upright as stored) where it has no EXIF block, or one whose orientation is 1; 2-8 as its block says
 * (mirrored or turned); 0 where this cannot tell as Pillow would (segments that do not walk to the image data, two EXIF
 * blocks, which Pillow joins, an odd block, a value past 1-8, or no orientation in the block beside an XMP packet,
 * where Pillow looks for one): Pillow then reads the file; 0 too for a file that does not open as a JPEG (FF D8 FF). */
static int jpeg_orientation(const uint8_t *data, size_t size) {
    if (size < 4 || data[0] != 0xFF || data[1] != 0xD8)
        return 0;
    const uint8_t *exif = NULL;
    size_t position = 2, exif_size = 0;
    int blocks = 0, xmp = 0;
    for (;;) {
        if (position + 2 > size || data[position] != 0xFF)
            return 0;
        if (data[position + 1] == 0xFF) { /* a fill byte before a marker */
            position++;
            continue;
        }
        if (data[position + 1] == 0xDA)
            break;
        if (position + 4 > size)
            return 0;
        const size_t length = (size_t)data[position + 2] << 8 | data[position + 3];
        if (length < 2 || position + 2 + length > size)
            return 0;
        const uint8_t *body = data + position + 4;
        if (data[position + 1] == 0xE1 && length - 2 >= 6 && memcmp(body, "Exif\0\0", 6) == 0) {
            blocks++;
            exif = body + 6;
            exif_size = length - 2 - 6;
        } else if (data[position + 1] == 0xE1 && length - 2 >= 29 && memcmp(body, "http://ns.adobe.com/xap/1.0/", 29) == 0) {
            xmp = 1;
        }
        position += 2 + length;
    }
    if (blocks != 1)
        return blocks ? 0 : 1;
    const int found = tiff_orientation(exif, exif_size);
    if (found == -1)
        return xmp ? 0 : 1;
    return found >= 1 && found <= 8 ? found : 0;
}

static PyObject *py_jpeg_orientation(PyObject *self, PyObject *arg) {
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    int found = jpeg_orientation(data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromLong(found);
}

#ifdef OUTCORE_PNG
static PyObject *py_decode_png(PyObject *self, PyObject *args) {
    PyObject *data_object, *out_array;
    int ids = 0;
    if (!PyArg_ParseTuple(args, "OO|p:decode_png", &data_object, &out_array, &ids))
        return NULL;
    Py_buffer data, out;
    if (PyObject_GetBuffer(data_object, &data, PyBUF_SIMPLE) < 0)
        return NULL;
    if (array_buffer(out_array, &out, 1) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    const int wide = out.itemsize == 2 && strcmp(out.format, "H") == 0;
    const int bytes = wide || (out.itemsize == 1 && strcmp(out.format, "B") == 0);
    int decoded = 0, fine = (out.ndim == 2 || out.ndim == 3) && bytes;
    int channels = out.ndim == 3 ? (int)out.shape[2] : 1;
    if (!fine) {
        PyErr_SetString(PyExc_ValueError,
                        "out must be a C-contiguous uint8 or uint16 array (height, width[, channels])");
    } else {
        PngDecoder png = {0};
        FREE_BEGIN decoded = png_decode(&png, data.buf, (size_t)data.len, channels, (int)out.shape[0],
                                        (int)out.shape[1], out.buf, (size_t)out.shape[1] * channels * out.itemsize,
                                        (ids ? PNG_IDS : 0) | (wide ? PNG_WIDE : 0));
        png_decoder_free(&png);
        FREE_END
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return fine ? PyBool_FromLong(decoded) : NULL;
}
#endif

/* One decoder kept for a whole decode_each or check_each call: each file read into it and let go of again; its
 * scratch holds a turned or mirrored file's pixels as stored (decode_plain). */
typedef struct {
    struct jpeg_decompress_struct cinfo;
    Errors errors;
    uint8_t *scratch;
    size_t scratch_size;
} Decoder;

/* A new Decoder whose errors and warnings escape to the call's setjmp (NULL: no memory). */
static Decoder *decoder_new(void) {
    Decoder *decoder = calloc(1, sizeof(Decoder));
    if (decoder == NULL)
        return NULL;
    decoder->cinfo.err = jpeg_std_error(&decoder->errors.manager);
    decoder->errors.manager.error_exit = on_error;
    decoder->errors.manager.emit_message = on_message;
    jpeg_create_decompress(&decoder->cinfo);
    return decoder;
}

static void decoder_free(Decoder *decoder) {
    if (decoder != NULL) {
        jpeg_destroy_decompress(&decoder->cinfo);
        free(decoder->scratch);
    }
    free(decoder);
}

/* The pixels of a file stored `height` x `width` (`channels` bytes a pixel, rows back to back in `stored`) into
 * `lines`, the rows of the upright picture, as Pillow's exif_transpose turns and mirrors it for EXIF orientation
 * `orientation` (2-8): 2-4 mirrored (left-right, both ways, top-bottom), 5-8 transposed (upright rows are stored
 * columns): 5 as it is, 6 turned a quarter clockwise, 7 transverse, 8 a quarter counter-clockwise. */
static void orient(const uint8_t *stored, long height, long width, int channels, int orientation, JSAMPROW *lines) {
    const ptrdiff_t stride = (ptrdiff_t)width * channels;
    const int turned = orientation >= 5;
    const long rows = turned ? width : height, columns = turned ? height : width;
    for (long y = 0; y < rows; y++) {
        const uint8_t *from;
        ptrdiff_t step; /* bytes from a pixel of the upright row to the next, in `stored` */
        if (!turned) {
            const int up = orientation == 3 || orientation == 4, back = orientation == 2 || orientation == 3;
            from = stored + (up ? height - 1 - y : y) * stride + (back ? (width - 1) * channels : 0);
            step = back ? -channels : channels;
        } else {
            const int up = orientation == 6 || orientation == 7, back = orientation == 7 || orientation == 8;
            from = stored + (up ? (height - 1) * stride : 0) + (back ? width - 1 - y : y) * channels;
            step = up ? -stride : stride;
        }
        uint8_t *into = lines[y];
        if (channels == 3) {
            for (long x = 0; x < columns; x++, from += step, into += 3)
                memcpy(into, from, 3);
        } else {
            for (long x = 0; x < columns; x++, from += step)
                into[x] = *from;
        }
    }
}

/* What decode_plain takes: a plain JPEG (YCbCr for 3 channels, greyscale for 1 or 3, no EXIF orientation but 1; YCbCr
 * for 1 too, its rows weighed as Pillow's convert("L") weighs them), or one that EXIF turns or mirrors (jpeg_orientation
 * 2-8), of exactly height x width upright once decoded at `eighths`/8 of its size (0: whole), decoded into its rows
 * `lines`, upright (decode_each, decode_upright); or, height 0, a plain JPEG of any size up to max_pixels pixels and
 * max_side pixels a side (none: negative), decoded at the DCT scale decode.py's decoded_size uses (1/8, or whole below
 * 8 pixels a side) a row at a time into lines[0], the scaled width times 3 bytes at least (check_each). */
typedef struct {
    int channels, height, width, eighths;
    long long max_pixels, max_side;
    int turned; /* check_each: JPEGs that EXIF turns or mirrors are checked too */
} Plain;

/* Decode `data` as `plain` asks: its EXIF orientation (1 for a plain JPEG) with its upright height and width in
 * `shape`, or 0 where it is another file or cannot be decoded cleanly (left to the caller, which says what is
 * wrong). */
static int decode_plain(Decoder *decoder, const uint8_t *data, size_t size, const Plain *plain, JSAMPROW *lines,
                        int64_t *shape) {
    struct jpeg_decompress_struct *cinfo = &decoder->cinfo;
    const int whole = plain->height > 0;
    const int orientation = jpeg_orientation(data, size); /* 0: no JPEG, or one left to Pillow */
    if (orientation == 0 || (orientation != 1 && !whole && !plain->turned))
        return 0;
    if (setjmp(decoder->errors.escape)) {
        jpeg_abort_decompress(cinfo);
        return 0;
    }
    jpeg_mem_src(cinfo, data, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
    const long height = (long)cinfo->image_height, width = (long)cinfo->image_width;
    const int eighths = !whole ? dct_scale(height, width, 1, 1) : plain->eighths ? plain->eighths : 8;
    const long tall = (height * eighths + 7) / 8, wide = (width * eighths + 7) / 8; /* as libjpeg scales it */
    const int turned = orientation >= 5, decoded = decode_as(cinfo, plain->channels);
    if (!decoded ||
        (whole ? (turned ? wide : tall) != plain->height || (turned ? tall : wide) != plain->width
               : (plain->max_pixels >= 0 && (long long)height * width > plain->max_pixels) ||
                     (plain->max_side >= 0 && (height > plain->max_side || width > plain->max_side)))) {
        jpeg_abort_decompress(cinfo);
        return 0;
    }
    cinfo->scale_num = (unsigned int)eighths;
    cinfo->scale_denom = 8;
    const int weigh = decoded == DECODED_TO_WEIGH;
    const size_t stored = (size_t)wide * (weigh ? 3 : plain->channels); /* a stored row's bytes, as decoded */
    const int turn = whole && (orientation != 1 || weigh); /* into the scratch, then weighed, turned into `lines` */
    if (turn && decoder->scratch_size < stored * tall) {
        uint8_t *more = realloc(decoder->scratch, stored * tall);
        if (more == NULL) {
            jpeg_abort_decompress(cinfo);
            return 0;
        }
        decoder->scratch = more;
        decoder->scratch_size = stored * tall;
    }
    jpeg_start_decompress(cinfo);
    while (cinfo->output_scanline < cinfo->output_height) {
        if (turn) {
            JSAMPROW row = decoder->scratch + cinfo->output_scanline * stored;
            jpeg_read_scanlines(cinfo, &row, 1);
        } else if (whole) {
            jpeg_read_scanlines(cinfo, lines + cinfo->output_scanline, cinfo->output_height - cinfo->output_scanline);
        } else {
            jpeg_read_scanlines(cinfo, lines, 1);
        }
    }
    jpeg_finish_decompress(cinfo);
    if (weigh && turn)
        weigh_rows(decoder->scratch, tall, wide);
    if (turn && orientation != 1)
        orient(decoder->scratch, tall, wide, plain->channels, orientation, lines);
    else if (turn)
        for (long y = 0; y < tall; y++)
            memcpy(lines[y], decoder->scratch + y * wide, (size_t)wide);
    shape[0] = turned ? width : height;
    shape[1] = turned ? height : width;
    return orientation;
}

/* The optional `orientations` of check_each and check_files: where given (not None), a C-contiguous uint8 array of
 * `count` items into `view` (1 then, JPEGs that EXIF turns or mirrors checked too); 0 where not; -1 with an
 * exception set. */
static int orientations_buffer(PyObject *array, Py_ssize_t count, Py_buffer *view) {
    if (array == NULL || array == Py_None)
        return 0;
    if (array_buffer(array, view, 1) < 0)
        return -1;
    if (view->ndim != 1 || view->shape[0] != count || view->itemsize != 1 || strcmp(view->format, "B") != 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "wanted: orientations (files,; uint8), C-contiguous");
        return -1;
    }
    return 1;
}

/* The files and rows of one decode_each or crop_each call: row k's file is file samples[k] of chunk which[k],
 * regions[c][ranges[c][2 i] : ranges[c][2 i + 1]] for file i of chunk c. */
typedef struct {
    const uint8_t **regions;
    size_t *lengths;          /* each chunk's region's bytes */
    const int64_t **ranges;   /* each chunk's (files, 2) */
    Py_ssize_t *files;        /* each chunk's files */
    const int64_t *which, *samples, *rows; /* (count,) each */
    Py_ssize_t count;
    uint8_t *out;
    int height, width, channels;
    int wide; /* decode_each's rows are uint16: 16-bit grey PNGs only (PNG_WIDE) */
    const int64_t *sizes; /* crop_each: (count, 2), each file's height and width */
    const double *boxes;  /* (count, 4), each box's top, left, height and width in the file's pixels */
    const uint8_t *flips; /* (count, 2), left-right, top-bottom */
} Each;

/* File k of `each`, where it lies inside its chunk's region: 1 (and `data`, `size` set), else 0. */
static int file_of(const Each *each, Py_ssize_t k, const uint8_t **data, size_t *size) {
    int64_t chunk = each->which[k], sample = each->samples[k];
    int64_t start = each->ranges[chunk][2 * sample], stop = each->ranges[chunk][2 * sample + 1];
    if (start < 0 || start > stop || (size_t)stop > each->lengths[chunk])
        return 0;
    *data = each->regions[chunk] + start;
    *size = (size_t)(stop - start);
    return 1;
}

/* The pixels of a JPEG that its EXIF orientation turns or mirrors, upright (`height` x `width` there once decoded at
 * `eighths`/8 of its size), decoded whole into `turned`'s buffer (kept from file to file, as its decoder), as decode_plain decodes it for decode_each:
 * the buffer, or NULL for another file, one that does not decode cleanly, or no memory. */
typedef struct {
    Decoder *decoder;
    uint8_t *pixels;
    JSAMPROW *lines;
    size_t capacity;
    int rows;
} Turned;

static const uint8_t *turned_pixels(Turned *turned, const uint8_t *data, size_t size, int height, int width,
                                    int channels, int eighths) {
    const size_t stride = (size_t)width * channels, bytes = stride * height;
    if (turned->decoder == NULL && (turned->decoder = decoder_new()) == NULL)
        return NULL;
    if (bytes > turned->capacity) {
        free(turned->pixels);
        turned->capacity = (turned->pixels = malloc(bytes)) != NULL ? bytes : 0;
    }
    if (height > turned->rows) {
        free(turned->lines);
        turned->rows = (turned->lines = malloc((size_t)height * sizeof(JSAMPROW))) != NULL ? height : 0;
    }
    if (turned->pixels == NULL || turned->lines == NULL)
        return NULL;
    for (int y = 0; y < height; y++)
        turned->lines[y] = turned->pixels + (size_t)y * stride;
    Plain plain = {.channels = channels, .height = height, .width = width, .eighths = eighths, .max_pixels = -1,
                   .max_side = -1};
    int64_t shape[2];
    return decode_plain(turned->decoder, data, size, &plain, turned->lines, shape) ? turned->pixels : NULL;
}

static void turned_free(Turned *turned) {
    decoder_free(turned->decoder);
    free(turned->pixels);
    free(turned->lines);
}

/* decode_upright(data, eighths, out): decode_plain of one file at `eighths`/8 of its size, into `out` (its upright
 * size then): the file's EXIF orientation (1-8), or 0 where it left the file (out's contents then undefined). */
static PyObject *py_decode_upright(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    int eighths;
    PyObject *out_array;
    if (!PyArg_ParseTuple(args, "y*iO:decode_upright", &data, &eighths, &out_array))
        return NULL;
    if (array_buffer(out_array, &out, 1) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    PyObject *result = NULL;
    if (eighths < 1 || eighths > 8) {
        PyErr_Format(PyExc_ValueError, "eighths=%d is not a DCT scale in 1..8", eighths);
    } else if (out.ndim != 3 || strcmp(out.format, "B") || (out.shape[2] != 1 && out.shape[2] != 3) ||
               out.shape[0] < 1 || out.shape[1] < 1) {
        PyErr_SetString(PyExc_ValueError, "out must be a C-contiguous uint8 array of shape (height, width, 1 or 3)");
    } else {
        Plain plain = {.channels = (int)out.shape[2], .height = (int)out.shape[0], .width = (int)out.shape[1],
                       .eighths = eighths, .max_pixels = -1, .max_side = -1};
        int orientation = -1;
        FREE_BEGIN
        Decoder *decoder = decoder_new();
        JSAMPROW *lines = malloc((size_t)plain.height * sizeof(JSAMPROW));
        if (decoder != NULL && lines != NULL) {
            for (int y = 0; y < plain.height; y++)
                lines[y] = (uint8_t *)out.buf + (size_t)y * plain.width * plain.channels;
            int64_t shape[2];
            orientation = decode_plain(decoder, data.buf, (size_t)data.len, &plain, lines, shape);
        }
        decoder_free(decoder);
        free(lines);
        FREE_END
        result = orientation < 0 ? PyErr_NoMemory() : PyLong_FromLong(orientation);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    return result;
}

/* A thread's decoding of whole files into rows, kept from file to file: its decoder, its rows' pointers, and its PNG
 * decoder where built with zlib (decode_all; the engine's threads, through PictureDecoder). */
typedef struct {
    Decoder *decoder; /* made at its first JPEG */
    JSAMPROW *lines;
    int line_count;
    Turned turned; /* decoding_crop's JPEGs that EXIF turns or mirrors, or whose colours are weighed */
#ifdef OUTCORE_PNG
    PngDecoder png;
#endif
} Decoding;

static void decoding_close(void *state) {
    Decoding *decoding = state;
    if (decoding == NULL)
        return;
    decoder_free(decoding->decoder);
    free(decoding->lines);
    turned_free(&decoding->turned);
#ifdef OUTCORE_PNG
    png_decoder_free(&decoding->png);
#endif
    free(decoding);
}

static void *decoding_open(void) { return calloc(1, sizeof(Decoding)); }

/* `data` decoded into `out` (height x width x channels, of uint16 where `wide`: 16-bit grey PNGs only) where
 * decode_plain (or, built with zlib, png_decode) takes it whole: 1, else 0. */
static int decoding_decode(Decoding *decoding, const uint8_t *data, size_t size, uint8_t *out, int height, int width,
                           int channels, int wide) {
    const size_t stride = (size_t)width * channels * (wide ? 2 : 1);
#ifdef OUTCORE_PNG
    if (png_file(data, size))
        return png_decode(&decoding->png, data, size, channels, height, width, out, stride, wide ? PNG_WIDE : 0) != 0;
#endif
    if (wide || height < 1 || (decoding->decoder == NULL && (decoding->decoder = decoder_new()) == NULL))
        return 0; /* no JPEG of 16 bits */
    if (decoding->line_count < height) {
        JSAMPROW *more = realloc(decoding->lines, (size_t)height * sizeof(JSAMPROW));
        if (more == NULL)
            return 0;
        decoding->lines = more;
        decoding->line_count = height;
    }
    for (int y = 0; y < height; y++)
        decoding->lines[y] = out + (size_t)y * stride;
    const Plain plain = {.channels = channels, .height = height, .width = width, .max_pixels = -1, .max_side = -1};
    int64_t shape[2];
    return decode_plain(decoding->decoder, data, size, &plain, decoding->lines, shape) != 0;
}

static int picture_decode(void *state, const uint8_t *data, size_t size, uint8_t *out, int height, int width,
                          int channels) {
    return decoding_decode(state, data, size, out, height, width, channels, 0);
}

/* Decode every file of `each` that decode_plain (or png_decode) takes whole into its row, with one Decoding; done[k]
 * says which. */
static int decode_all(const Each *each, uint8_t *done) {
    Decoding *decoding = decoding_open();
    if (decoding == NULL)
        return -1;
    size_t bytes = (size_t)each->width * each->channels * (each->wide ? 2 : 1) * each->height;
    for (Py_ssize_t k = 0; k < each->count; k++) {
        const uint8_t *data;
        size_t size;
        done[k] = file_of(each, k, &data, &size) &&
                  decoding_decode(decoding, data, size, each->out + bytes * each->rows[k], each->height, each->width,
                                  each->channels, each->wide);
    }
    decoding_close(decoding);
    return 0;
}

/* Box `box` (top, left, height, width in the file's pixels) of the file `data` (found: 0 where its range was wrong),
 * of file_height x file_width, into `row` (height x width x channels), mirrored as flip_x and flip_y say: of a plain
 * JPEG of its stated size (no EXIF orientation but 1), as crop_resize does with the scale and box decode_region
 * would choose (plan), and, built with zlib, of a plain PNG of its stated size (decoded whole, the box resized as
 * resize.py's resize_edges resizes it), as of a JPEG its EXIF turns or mirrors, of its stated size upright (decoded
 * whole and turned upright, as decode_region decodes every file but a plain one, the box resized so too): 1, else 0
 * (left to the caller). A box past its picture's edges is zeros there, the part inside cut as its own box into the
 * output pixels it covers (box_part), as EncodedChunk.decode_region does; one within ROUNDING of them, but not inside
 * in single precision, is left to it, as is a box of no pixels or of numbers not finite. A box with nothing of the
 * picture in it is zeros, the file not read. */
static int decoding_crop(Decoding *decoding, const uint8_t *data, size_t size, int found, int file_height,
                         int file_width, const double *box, int flip_x, int flip_y, uint8_t *row, int height, int width,
                         int channels) {
    size_t out_stride = (size_t)width * channels, bytes = out_stride * height;
    Request request = {.channels = channels, .file_height = file_height, .file_width = file_width, .data = data,
                       .size = size};
    int place[4];
    const int cut = file_height > 0 && file_width > 0
                        ? box_cut(box, file_height, file_width, height, width, flip_x, flip_y, row, bytes, request.box,
                                  place)
                        : -1;
    if (cut < 1)
        return cut == 0;
    if (!found)
        return 0;
    request.height = place[2];
    request.width = place[3];
    uint8_t *into = row + out_stride * place[0] + (size_t)channels * place[1];
#ifdef OUTCORE_PNG
    if (png_file(data, size)) { /* a plain PNG of its stated size: decoded whole, the box resized */
        size_t stride = (size_t)file_width * channels;
        uint8_t *pixels = png_pixels(&decoding->png, stride * file_height);
        return pixels != NULL && box_inside(request.box, file_height, file_width) &&
               png_decode(&decoding->png, data, size, channels, file_height, file_width, pixels, stride, 0) &&
               resize_kind(pixels, stride, file_height, file_width, channels, 'B', request.box, place[2], place[3],
                           into, out_stride, flip_x, flip_y) == 0;
    }
#endif
    const int orientation = jpeg_orientation(data, size); /* 0: no JPEG, or left to Pillow */
    char message[MESSAGE_SIZE];
    const int cropped = orientation == 1 ? crop_resize(&request, into, out_stride, flip_x, flip_y, message) : -1;
    if (orientation >= 2 || cropped == 1) { /* turned, mirrored or weighed: decoded whole, upright, box resized */
        const uint8_t *pixels = box_inside(request.box, file_height, file_width)
                                    ? turned_pixels(&decoding->turned, data, size, file_height, file_width, channels, 8)
                                    : NULL;
        return pixels != NULL && resize_kind(pixels, (size_t)file_width * channels, file_height, file_width, channels,
                                             'B', request.box, place[2], place[3], into, out_stride, flip_x,
                                             flip_y) == 0;
    }
    return cropped == 0;
}

static int picture_crop(void *state, const uint8_t *data, size_t size, int file_height, int file_width,
                        const double *box, int flip_x, int flip_y, uint8_t *out, int height, int width, int channels) {
    return decoding_crop(state, data, size, 1, file_height, file_width, box, flip_x, flip_y, out, height, width,
                         channels);
}

/* Cut every box of `each` that decoding_crop cuts, with one Decoding; done[k] says which. */
static int crop_all(const Each *each, uint8_t *done) {
    Decoding *decoding = decoding_open();
    if (decoding == NULL)
        return -1;
    size_t bytes = (size_t)each->width * each->channels * each->height;
    for (Py_ssize_t k = 0; k < each->count; k++) {
        const uint8_t *data = NULL;
        size_t size = 0;
        int found = file_of(each, k, &data, &size);
        done[k] = decoding_crop(decoding, data, size, found, (int)each->sizes[2 * k], (int)each->sizes[2 * k + 1],
                                each->boxes + 4 * k, each->flips[2 * k], each->flips[2 * k + 1],
                                each->out + bytes * each->rows[k], each->height, each->width, each->channels);
    }
    decoding_close(decoding);
    return 0;
}

/* Whether a buffer holds items of `code` (a struct format letter) of 8 bytes in this machine's byte order
 * (numpy says "<q" or "l" for int64, "<d" for float64). */
static int buffer_of(const Py_buffer *view, const char *codes) {
    const char *format = view->format;
    if (*format == '@' || *format == '=' || *format == (PY_LITTLE_ENDIAN ? '<' : '>'))
        format++;
    return view->itemsize == 8 && format[0] != '\0' && format[1] == '\0' && strchr(codes, format[0]) != NULL;
}

/* Whether a buffer is a C-contiguous (count, columns) array of 8-byte `codes` items. */
static int table_of(const Py_buffer *view, Py_ssize_t count, Py_ssize_t columns, const char *codes) {
    return view->ndim == 2 && view->shape[0] == count && view->shape[1] == columns && buffer_of(view, codes);
}

/* The chunks of a call: `regions` and `ranges`, sequences of one length (uint8 arrays, (files, 2) int64 arrays),
 * their buffers taken into `views` (2 a chunk) and `each`; 0, or -1 with an exception set (the buffers taken
 * counted in `taken`, to release). */
static int chunks_from(PyObject *regions, PyObject *ranges, Py_buffer *views, Py_ssize_t chunks, Each *each,
                       Py_ssize_t *taken) {
    for (Py_ssize_t c = 0; c < chunks; c++) {
        Py_buffer *region = &views[2 * c], *table = &views[2 * c + 1];
        if (array_buffer(PySequence_Fast_GET_ITEM(regions, c), region, 0) < 0)
            return -1;
        (*taken)++;
        if (array_buffer(PySequence_Fast_GET_ITEM(ranges, c), table, 0) < 0)
            return -1;
        (*taken)++;
        if (region->ndim != 1 || strcmp(region->format, "B") || table->ndim != 2 || table->shape[1] != 2 ||
            !buffer_of(table, "ql")) {
            PyErr_SetString(PyExc_ValueError, "wanted: regions (uint8) and ranges (files, 2; int64), C-contiguous");
            return -1;
        }
        each->regions[c] = region->buf;
        each->lengths[c] = (size_t)region->len;
        each->ranges[c] = table->buf;
        each->files[c] = table->shape[0];
    }
    return 0;
}

/* `each` from the buffers of which, samples, out and rows (and, for crop_each, sizes, boxes and flips), its chunks
 * set: 0, or -1 with an exception set. */
static int each_from(Py_buffer *views, int crop, Py_ssize_t chunks, Each *each) {
    Py_buffer *which = &views[0], *samples = &views[1], *out = &views[2], *rows = &views[3];
    Py_ssize_t count = samples->ndim == 1 ? samples->shape[0] : -1;
    if (count < 0 || !buffer_of(samples, "ql") || which->ndim != 1 || which->shape[0] != count ||
        !buffer_of(which, "ql") || rows->ndim != 1 || rows->shape[0] != count || !buffer_of(rows, "ql") ||
        out->ndim != 4 || (strcmp(out->format, "B") && (crop || strcmp(out->format, "H") || out->shape[3] != 1)) ||
        (out->shape[3] != 1 && out->shape[3] != 3) ||
        (crop && (!table_of(&views[4], count, 2, "ql") || !table_of(&views[5], count, 4, "d") ||
                  views[6].ndim != 2 || views[6].shape[0] != count || views[6].shape[1] != 2 ||
                  strcmp(views[6].format, "B")))) {
        PyErr_SetString(PyExc_ValueError,
                        "wanted: which, samples and rows (int64), out (rows, height, width, 1 or 3; uint8, or for "
                        "decode_each 1 of uint16), and for crop_each sizes (int64), boxes (float64) and flips (uint8), "
                        "(count, 2), (count, 4) and (count, 2); all C-contiguous");
        return -1;
    }
    each->which = which->buf;
    each->samples = samples->buf;
    each->rows = rows->buf;
    each->count = count;
    each->out = out->buf;
    each->height = (int)out->shape[1];
    each->width = (int)out->shape[2];
    each->channels = (int)out->shape[3];
    each->wide = out->itemsize == 2;
    each->sizes = crop ? views[4].buf : NULL;
    each->boxes = crop ? views[5].buf : NULL;
    each->flips = crop ? views[6].buf : NULL;
    for (Py_ssize_t k = 0; k < count; k++)
        if (each->which[k] < 0 || each->which[k] >= chunks || each->samples[k] < 0 ||
            each->samples[k] >= each->files[each->which[k]] || each->rows[k] < 0 || each->rows[k] >= out->shape[0]) {
            PyErr_Format(PyExc_IndexError, "file %lld of chunk %lld or row %lld out of range",
                         (long long)each->samples[k], (long long)each->which[k], (long long)each->rows[k]);
            return -1;
        }
    return 0;
}

/* Release the first `count` buffers of `views`. */
static void release_buffers(Py_buffer *views, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++)
        PyBuffer_Release(&views[i]);
}

/* The positions k not marked done, as a list. */
static PyObject *positions_left(const uint8_t *done, Py_ssize_t count) {
    PyObject *left = PyList_New(0);
    for (Py_ssize_t k = 0; left != NULL && k < count; k++) {
        if (done[k])
            continue;
        PyObject *position = PyLong_FromSsize_t(k);
        if (position == NULL || PyList_Append(left, position) < 0)
            Py_CLEAR(left);
        Py_XDECREF(position);
    }
    return left;
}

/* decode_each (crop 0: 4 arrays after the chunks) or crop_each (crop 1: 7), on arguments already parsed. */
static PyObject *run_each(PyObject *region_list, PyObject *range_list, PyObject **arrays, int crop) {
    PyObject *regions = PySequence_Fast(region_list, "regions must be a sequence of arrays");
    PyObject *ranges = regions ? PySequence_Fast(range_list, "ranges must be a sequence of arrays") : NULL;
    Py_ssize_t chunks = ranges ? PySequence_Fast_GET_SIZE(regions) : 0, taken = 0;
    Py_buffer views[7], *chunk_views = NULL;
    int count = crop ? 7 : 4, got = 0;
    PyObject *left = NULL;
    Each each = {0};
    if (ranges == NULL)
        goto done;
    if (chunks < 1 || PySequence_Fast_GET_SIZE(ranges) != chunks) {
        PyErr_SetString(PyExc_ValueError, "regions and ranges: one of each a chunk, one chunk at least");
        goto done;
    }
    chunk_views = calloc(2 * chunks, sizeof(Py_buffer));
    each.regions = calloc(chunks, sizeof(uint8_t *));
    each.lengths = calloc(chunks, sizeof(size_t));
    each.ranges = calloc(chunks, sizeof(int64_t *));
    each.files = calloc(chunks, sizeof(Py_ssize_t));
    if (!chunk_views || !each.regions || !each.lengths || !each.ranges || !each.files) {
        PyErr_NoMemory();
        goto done;
    }
    if (chunks_from(regions, ranges, chunk_views, chunks, &each, &taken) < 0)
        goto done;
    while (got < count && array_buffer(arrays[got], &views[got], got == 2) == 0)
        got++;
    if (got == count && each_from(views, crop, chunks, &each) == 0) {
        uint8_t *done = calloc(each.count > 0 ? (size_t)each.count : 1, 1);
        int failed = done == NULL;
        if (!failed) {
            FREE_BEGIN
            if (crop)
                failed = crop_all(&each, done);
            else
                failed = decode_all(&each, done);
            FREE_END
        }
        left = failed ? PyErr_NoMemory() : positions_left(done, each.count);
        free(done);
    }
done:
    release_buffers(views, got);
    release_buffers(chunk_views, taken);
    free(chunk_views);
    free((void *)each.regions);
    free(each.lengths);
    free((void *)each.ranges);
    free(each.files);
    Py_XDECREF(regions);
    Py_XDECREF(ranges);
    return left;
}

#define WIDEST_ROW (65535 * 3) /* a JPEG is 65,535 pixels wide at most */

static PyObject *py_check_each(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"files", "channels", "max_pixels", "max_side", "out", "orientations", NULL};
    PyObject *file_list, *array, *turns = NULL, *left = NULL;
    int channels;
    long long max_pixels, max_side;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OiLLO|O:check_each", keywords, &file_list, &channels, &max_pixels,
                                     &max_side, &array, &turns))
        return NULL;
    PyObject *files = PySequence_Fast(file_list, "files must be a sequence of bytes");
    if (files == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(files), taken = 0;
    Py_buffer out, *views = calloc(count > 0 ? (size_t)count : 1, sizeof(Py_buffer));
    uint8_t *done = calloc(count > 0 ? (size_t)count : 1, 1), *row = malloc(WIDEST_ROW);
    Decoder *decoder = decoder_new();
    Py_buffer orientations;
    int have_out = 0, turned = 0;
    if (views == NULL || done == NULL || row == NULL || decoder == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if ((turned = orientations_buffer(turns, count, &orientations)) < 0)
        goto done;
    if (array_buffer(array, &out, 1) < 0)
        goto done;
    have_out = 1;
    if ((channels != 1 && channels != 3) || !table_of(&out, count, 2, "ql")) {
        PyErr_SetString(PyExc_ValueError, "wanted: channels 1 or 3, out (files, 2; int64), C-contiguous");
        goto done;
    }
    for (; taken < count; taken++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(files, taken), &views[taken], PyBUF_SIMPLE) < 0)
            goto done;
    Plain plain = {.channels = channels, .max_pixels = max_pixels, .max_side = max_side, .turned = turned};
    JSAMPROW lines[1] = {row};
    FREE_BEGIN
#ifdef OUTCORE_PNG
    PngDecoder png = {0};
#endif
    for (Py_ssize_t k = 0; k < count; k++) {
        int64_t *shape = (int64_t *)out.buf + 2 * k;
        shape[0] = shape[1] = 0;
#ifdef OUTCORE_PNG
        if (png_file(views[k].buf, (size_t)views[k].len)) {
            done[k] = png_check(&png, views[k].buf, (size_t)views[k].len, channels, max_pixels, max_side, shape) != 0;
            continue;
        }
#endif
        done[k] = (uint8_t)decode_plain(decoder, views[k].buf, (size_t)views[k].len, &plain, lines, shape);
    }
#ifdef OUTCORE_PNG
    png_decoder_free(&png);
#endif
    FREE_END
    if (turned)
        memcpy(orientations.buf, done, (size_t)count);
    left = positions_left(done, count);
done:
    for (Py_ssize_t i = 0; i < taken; i++)
        PyBuffer_Release(&views[i]);
    if (have_out)
        PyBuffer_Release(&out);
    if (turned > 0)
        PyBuffer_Release(&orientations);
    free(views);
    free(done);
    free(row);
    decoder_free(decoder);
    Py_DECREF(files);
    return left;
}

/* A file of check_files, read whole into a buffer grown as needed. */
typedef struct {
    uint8_t *data;
    size_t size, capacity;
} Whole;

/* Read the regular file at `path` whole into `whole` (_whole_files.h, as _chunks.read_file reads it): 1, or 0 when
 * it cannot be opened or read (left to the caller, which says why). */
static int read_whole(const char *path, Whole *whole) {
    size_t size;
    int fd = open_regular(path, &size);
    if (fd >= 0 && size > whole->capacity) {
        uint8_t *grown = realloc(whole->data, size > 0 ? size : 1);
        if (grown == NULL) {
            close(fd);
            return 0;
        }
        whole->data = grown;
        whole->capacity = size;
    }
    whole->size = size;
    return fd >= 0 && read_to_end(fd, whole->data, size);
}

/* Let go of the first `count` of `names` (path_names), and of them. */
static void path_names_free(PyObject **names, Py_ssize_t count) {
    for (Py_ssize_t k = 0; names != NULL && k < count; k++)
        Py_DECREF(names[k]);
    free(names);
}

/* The names of `count` str `paths` (a PySequence_Fast) as the file system takes them (PyUnicode_FSConverter), for a
 * call that reads the files with the GIL released: NULL, with the error set and none held, where one is not a path. */
static PyObject **path_names(PyObject *paths, Py_ssize_t count) {
    PyObject **names = calloc(count > 0 ? (size_t)count : 1, sizeof(PyObject *));
    if (names == NULL)
        return (PyObject **)PyErr_NoMemory();
    for (Py_ssize_t k = 0; k < count; k++)
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(paths, k), &names[k])) {
            path_names_free(names, k);
            return NULL;
        }
    return names;
}

static PyObject *py_check_files(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"paths", "channels", "max_pixels", "max_side", "sizes", "nbytes", "digests",
                               "orientations", NULL};
    PyObject *path_list, *arrays[3], *turns = NULL, *left = NULL;
    int channels;
    long long max_pixels, max_side;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OiLLOOO|O:check_files", keywords, &path_list, &channels,
                                     &max_pixels, &max_side, &arrays[0], &arrays[1], &arrays[2], &turns))
        return NULL;
    PyObject *paths = PySequence_Fast(path_list, "paths must be a sequence of str");
    if (paths == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(paths), viewed = 0;
    PyObject **names = NULL;
    uint8_t *done = calloc(count > 0 ? (size_t)count : 1, 1), *row = malloc(WIDEST_ROW);
    Decoder *decoder = decoder_new();
    Whole whole = {NULL, 0, 0};
    Py_buffer views[3], orientations;
    int turned = 0;
    if (done == NULL || row == NULL || decoder == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if ((turned = orientations_buffer(turns, count, &orientations)) < 0)
        goto done;
    for (; viewed < 3; viewed++)
        if (array_buffer(arrays[viewed], &views[viewed], 1) < 0)
            goto done;
    int digest_size = views[2].ndim == 2 ? (int)views[2].shape[1] : 0;
    if ((channels != 1 && channels != 3) || !table_of(&views[0], count, 2, "ql") || views[1].ndim != 1 ||
        views[1].shape[0] != count || !buffer_of(&views[1], "ql") || digest_size < 1 || digest_size > 64 ||
        views[2].shape[0] != count || views[2].itemsize != 1 || strcmp(views[2].format, "B") != 0) {
        PyErr_SetString(PyExc_ValueError, "wanted: channels 1 or 3, sizes (paths, 2; int64), nbytes (paths,; int64), "
                                          "digests (paths, 1 to 64; uint8), C-contiguous");
        goto done;
    }
    if ((names = path_names(paths, count)) == NULL)
        goto done;
    Plain plain = {.channels = channels, .max_pixels = max_pixels, .max_side = max_side, .turned = turned};
    JSAMPROW lines[1] = {row};
    FREE_BEGIN
#ifdef OUTCORE_PNG
    PngDecoder png = {0};
#endif
    for (Py_ssize_t k = 0; k < count; k++) {
        const char *path = PyBytes_AS_STRING(names[k]);
        int64_t *shape = (int64_t *)views[0].buf + 2 * k, *nbytes = (int64_t *)views[1].buf + k;
        uint8_t *digest = (uint8_t *)views[2].buf + (size_t)digest_size * k;
        shape[0] = shape[1] = *nbytes = 0;
        memset(digest, 0, (size_t)digest_size);
        if (!local_path(path) || !read_whole(path, &whole))
            continue;
        *nbytes = (int64_t)whole.size;
        blake2b(whole.data, whole.size, digest, digest_size);
#ifdef OUTCORE_PNG
        if (png_file(whole.data, whole.size)) {
            done[k] = png_check(&png, whole.data, whole.size, channels, max_pixels, max_side, shape) != 0;
            continue;
        }
#endif
        done[k] = (uint8_t)decode_plain(decoder, whole.data, whole.size, &plain, lines, shape);
    }
#ifdef OUTCORE_PNG
    png_decoder_free(&png);
#endif
    FREE_END
    if (turned)
        memcpy(orientations.buf, done, (size_t)count);
    left = positions_left(done, count);
done: /* freed in the reverse order of their making */
    path_names_free(names, names != NULL ? count : 0);
    release_buffers(views, viewed);
    if (turned > 0)
        PyBuffer_Release(&orientations);
    free(whole.data);
    decoder_free(decoder);
    free(row);
    free(done);
    Py_DECREF(paths);
    return left;
}

/* resize.py's cover_box: the edges (top, left, bottom, right) of a picture height x width that the crop policy keeps
 * for out_height x out_width (the same arithmetic, in the same order, in double precision; round half to even). */
static void cover_box(long height, long width, int out_height, int out_width, double *box) {
    const double scale = fmax((double)out_height / (double)height, (double)out_width / (double)width);
    const double scaled_height = fmax(out_height, nearbyint((double)height * scale));
    const double scaled_width = fmax(out_width, nearbyint((double)width * scale));
    const double sy = scaled_height / (double)height, sx = scaled_width / (double)width;
    const long top = ((long)scaled_height - out_height) / 2, left = ((long)scaled_width - out_width) / 2;
    box[0] = (double)top / sy;
    box[1] = (double)left / sx;
    box[2] = (double)(top + out_height) / sy;
    box[3] = (double)(left + out_width) / sx;
}

enum { FIT_EXACT, FIT_CROP, FIT_STRETCH }; /* the resize policies fit_files takes: None, "crop", "fit" */

/* decode.py's _reduced_size of a stored picture (its orientation's swap of the target made by the caller): the least
 * height and width a picture file_height x file_width may be decoded at for `policy` to reach target_height x
 * target_width (FIT_CROP: scaled to cover it, each side rounded up; else the target). */
static void reduced_size(long file_height, long file_width, long target_height, long target_width, int policy,
                         long *need_height, long *need_width) {
    *need_height = target_height;
    *need_width = target_width;
    if (policy == FIT_CROP) {
        const double scale = fmax((double)target_height / (double)file_height, (double)target_width / (double)file_width);
        *need_height = (long)ceil((double)file_height * scale);
        *need_width = (long)ceil((double)file_width * scale);
    }
}

/* The header of the JPEG `data`: its EXIF orientation (jpeg_orientation), with its stored height and width and how
 * decode_as decodes it to `channels` (DECODED_AS_ASKED or DECODED_TO_WEIGH) where the decoder reads it and decodes its
 * colour space; else 0. */
static int jpeg_header(Decoder *decoder, const uint8_t *data, size_t size, int channels, long *height, long *width,
                       int *decoded) {
    struct jpeg_decompress_struct *cinfo = &decoder->cinfo;
    const int orientation = jpeg_orientation(data, size); /* 0: no JPEG, or one left to Pillow */
    if (orientation == 0)
        return 0;
    if (setjmp(decoder->errors.escape)) {
        jpeg_abort_decompress(cinfo);
        return 0;
    }
    jpeg_mem_src(cinfo, data, (unsigned long)size);
    jpeg_read_header(cinfo, TRUE);
    *height = (long)cinfo->image_height;
    *width = (long)cinfo->image_width;
    *decoded = decode_as(cinfo, channels);
    jpeg_abort_decompress(cinfo);
    return *decoded ? orientation : 0;
}

/* resize.py's fit of an upright picture (`pixels`, picture_height x picture_width x channels, rows back to back) to
 * height x width into `out` under `policy`: as it is at that size; else, under FIT_CROP, cover_box's edges, a region
 * of whole pixels at that size copied as resize_edges copies it, or, under FIT_STRETCH, the whole picture resized.
 * 1 when done; 0 out of memory. */
static int fit_pixels(const uint8_t *pixels, int picture_height, int picture_width, int channels, int policy,
                      int height, int width, uint8_t *out) {
    const size_t stride = (size_t)picture_width * channels, out_stride = (size_t)width * channels;
    double edges[4] = {0, 0, picture_height, picture_width};
    if (policy == FIT_CROP && (picture_height != height || picture_width != width))
        cover_box(picture_height, picture_width, height, width, edges);
    if (edges[2] - edges[0] == height && edges[3] - edges[1] == width && edges[0] == floor(edges[0]) &&
        edges[1] == floor(edges[1])) { /* whole pixels at their own size: as they are */
        for (int y = 0; y < height; y++)
            memcpy(out + y * out_stride, pixels + (size_t)(y + (long)edges[0]) * stride + (size_t)edges[1] * channels,
                   out_stride);
        return 1;
    }
    return resize_kind(pixels, stride, picture_height, picture_width, channels, 'B', edges, height, width, out,
                       out_stride, 0, 0) == 0;
}

/* decode.py's decode_image of a JPEG of a colour space decode_as takes, stored file_height x file_width, that its EXIF
 * `orientation` (2-8) turns or mirrors, or that is to be weighed (a colour one asked for as grey): decoded whole at the
 * DCT scale Pillow's draft picks for the policy (_reduced_size of the stored picture, draft_eighths) into `turned`'s
 * buffer, upright (_decode_whole_jpeg), then fitted to height x width into `out` (fit_pixels). 1 when done; 0 for a
 * file of another size under FIT_EXACT, one that does not decode cleanly, or no memory. */
static int fit_whole(Turned *turned, const uint8_t *data, size_t size, int orientation, long file_height,
                      long file_width, int policy, int height, int width, int channels, uint8_t *out) {
    const int sideways = orientation >= 5;
    int eighths = 8;
    if (policy != FIT_EXACT) {
        const long target_height = sideways ? width : height, target_width = sideways ? height : width;
        long need_height, need_width;
        reduced_size(file_height, file_width, target_height, target_width, policy, &need_height, &need_width);
        const long down = file_height / need_height, across = file_width / need_width; /* whole times each side */
        const long times = down < across ? down : across;
        eighths = times >= 8 ? 1 : times >= 4 ? 2 : times >= 2 ? 4 : 8;
    }
    const long tall = (file_height * eighths + 7) / 8, wide = (file_width * eighths + 7) / 8;
    const int upright_height = (int)(sideways ? wide : tall), upright_width = (int)(sideways ? tall : wide);
    if (policy == FIT_EXACT && (upright_height != height || upright_width != width))
        return 0;
    const uint8_t *pixels = turned_pixels(turned, data, size, upright_height, upright_width, channels, eighths);
    return pixels != NULL && fit_pixels(pixels, upright_height, upright_width, channels, policy, height, width, out);
}

#ifdef OUTCORE_PNG
/* decode.py's decode_image of a plain PNG (png_decode) of at most max_pixels pixels (none: negative) into `out`
 * (height x width x channels, uint8, rows back to back) under `policy`: one of that size decoded into it, another,
 * under FIT_CROP or FIT_STRETCH, decoded whole into the decoder's pixels and fitted (fit_pixels). 1 when done; 0 for
 * another file (a 16-bit grey one asked for 1 channel too: decode.py decodes it to 16 bits, then rounds), one of
 * another size under FIT_EXACT, or one that does not decode cleanly. */
static int fit_png(PngDecoder *png, const uint8_t *data, size_t size, int policy, long long max_pixels, int height,
                   int width, int channels, uint8_t *out) {
    if (size < 29 || memcmp(data + 12, "IHDR", 4) != 0)
        return 0;
    const long long file_width = big_endian32(data + 16), file_height = big_endian32(data + 20);
    if (file_width < 1 || file_height < 1 || file_width > INT_MAX || file_height > INT_MAX ||
        (size_t)(file_width * file_height) > PNG_LARGEST / (size_t)channels ||
        (max_pixels >= 0 && file_width * file_height > max_pixels) ||
        (channels == 1 && data[24] == 16 && data[25] == 0))
        return 0;
    if (file_height == height && file_width == width)
        return png_decode(png, data, size, channels, height, width, out, (size_t)width * channels, 0);
    if (policy == FIT_EXACT)
        return 0;
    uint8_t *pixels = png_pixels(png, (size_t)(file_width * file_height) * channels);
    return pixels != NULL &&
           png_decode(png, data, size, channels, (int)file_height, (int)file_width, pixels,
                      (size_t)file_width * channels, 0) &&
           fit_pixels(pixels, (int)file_height, (int)file_width, channels, policy, height, width, out);
}
#endif

/* decode.py's decode_image of a JPEG (YCbCr or greyscale) of at most max_pixels pixels (none: negative) into `out`
 * (height x width x channels, rows back to back, `lines` pointing at them) under `policy`: a plain one (no EXIF
 * orientation but 1, of a colour space decoded as asked) as _decode_plain_jpeg with `finish` decodes it (of that size,
 * decoded whole; another, under FIT_CROP or FIT_STRETCH, decoded at the DCT scale the policy needs, _reduced_size and
 * dct_scale, and the part it keeps resized: crop_resize); one its EXIF orientation turns or mirrors, or a colour one
 * asked for as grey, by fit_whole. 1 when done; 0 for another file, one of another size under FIT_EXACT, or one that
 * does not decode cleanly. */
static int fit_file(Decoder *decoder, Turned *turned, const uint8_t *data, size_t size, int policy,
                    long long max_pixels, int height, int width, int channels, uint8_t *out, JSAMPROW *lines) {
    long file_height, file_width;
    int decoded;
    const int orientation = jpeg_header(decoder, data, size, channels, &file_height, &file_width, &decoded);
    if (orientation == 0 || (max_pixels >= 0 && (long long)file_height * file_width > max_pixels))
        return 0;
    if (orientation != 1 || decoded == DECODED_TO_WEIGH) /* as Pillow's path decodes it */
        return fit_whole(turned, data, size, orientation, file_height, file_width, policy, height, width, channels,
                         out);
    if (file_height == height && file_width == width) {
        Plain plain = {.channels = channels, .height = height, .width = width, .max_pixels = -1, .max_side = -1};
        int64_t shape[2];
        return decode_plain(decoder, data, size, &plain, lines, shape) != 0;
    }
    if (policy == FIT_EXACT)
        return 0;
    long need_height, need_width;
    reduced_size(file_height, file_width, height, width, policy, &need_height, &need_width);
    Request request = {.data = data, .size = size, .channels = channels, .height = height, .width = width};
    request.scale = dct_scale(file_height, file_width, (double)need_height, (double)need_width);
    const long scaled_height = (file_height * request.scale + 7) / 8, scaled_width = (file_width * request.scale + 7) / 8;
    if (policy == FIT_CROP) {
        cover_box(scaled_height, scaled_width, height, width, request.box);
    } else {
        request.box[2] = (double)scaled_height;
        request.box[3] = (double)scaled_width;
    }
    char message[MESSAGE_SIZE];
    return crop_resize(&request, out, (size_t)width * channels, 0, 0, message) == 0;
}

/* fit_files(paths, policy, max_pixels, out, digests): each regular file of `paths` read whole, and where it is a JPEG
 * fit_file takes (or, built with zlib, a PNG fit_png takes), decoded into out[k] and its BLAKE2b digest of digests'
 * width written into digests[k]; the GIL released once for them all; the positions left are returned. */
static PyObject *py_fit_files(PyObject *self, PyObject *args) {
    PyObject *path_list, *arrays[2], *left = NULL;
    const char *policy_name;
    long long max_pixels;
    if (!PyArg_ParseTuple(args, "OzLOO:fit_files", &path_list, &policy_name, &max_pixels, &arrays[0], &arrays[1]))
        return NULL;
    PyObject *paths = PySequence_Fast(path_list, "paths must be a sequence of str");
    if (paths == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(paths), viewed = 0;
    PyObject **names = NULL;
    uint8_t *done = calloc(count > 0 ? (size_t)count : 1, 1);
    Decoder *decoder = decoder_new();
    JSAMPROW *lines = NULL;
    Whole whole = {NULL, 0, 0};
    Turned turned = {0};
    Py_buffer views[2];
    if (done == NULL || decoder == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int policy = policy_name == NULL               ? FIT_EXACT
                       : strcmp(policy_name, "crop") == 0 ? FIT_CROP
                       : strcmp(policy_name, "fit") == 0  ? FIT_STRETCH
                                                          : -1;
    if (policy < 0) {
        PyErr_Format(PyExc_ValueError, "policy=%s is not None, 'crop' or 'fit'", policy_name);
        goto done;
    }
    for (; viewed < 2; viewed++)
        if (array_buffer(arrays[viewed], &views[viewed], 1) < 0)
            goto done;
    const Py_buffer *out = &views[0];
    const int digest_size = views[1].ndim == 2 ? (int)views[1].shape[1] : 0;
    if (out->ndim != 4 || out->shape[0] != count || strcmp(out->format, "B") != 0 || out->shape[1] < 1 ||
        out->shape[2] < 1 || (out->shape[3] != 1 && out->shape[3] != 3) || digest_size < 1 || digest_size > 64 ||
        views[1].shape[0] != count || views[1].itemsize != 1 || strcmp(views[1].format, "B") != 0) {
        PyErr_SetString(PyExc_ValueError, "wanted: out (paths, height, width, 1 or 3; uint8), digests (paths, 1 to 64; "
                                          "uint8), C-contiguous");
        goto done;
    }
    const int height = (int)out->shape[1], width = (int)out->shape[2], channels = (int)out->shape[3];
    const size_t stride = (size_t)width * channels, bytes = stride * height;
    if ((lines = malloc((size_t)height * sizeof(JSAMPROW))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if ((names = path_names(paths, count)) == NULL)
        goto done;
    FREE_BEGIN
#ifdef OUTCORE_PNG
    PngDecoder png = {0};
#endif
    for (Py_ssize_t k = 0; k < count; k++) {
        const char *path = PyBytes_AS_STRING(names[k]);
        uint8_t *pixels = (uint8_t *)out->buf + bytes * k;
        if (!local_path(path) || !read_whole(path, &whole))
            continue;
#ifdef OUTCORE_PNG
        if (png_file(whole.data, whole.size)) {
            done[k] = (uint8_t)fit_png(&png, whole.data, whole.size, policy, max_pixels, height, width, channels,
                                       pixels);
        } else
#endif
        {
            for (int y = 0; y < height; y++)
                lines[y] = pixels + (size_t)y * stride;
            done[k] = (uint8_t)fit_file(decoder, &turned, whole.data, whole.size, policy, max_pixels, height, width,
                                        channels, pixels, lines);
        }
        if (done[k])
            blake2b(whole.data, whole.size, (uint8_t *)views[1].buf + (size_t)digest_size * k, digest_size);
    }
#ifdef OUTCORE_PNG
    png_decoder_free(&png);
#endif
    FREE_END
    left = positions_left(done, count);
done: /* freed in the reverse order of their making */
    path_names_free(names, names != NULL ? count : 0);
    release_buffers(views, viewed);
    free(whole.data);
    free(lines);
    turned_free(&turned);
    decoder_free(decoder);
    free(done);
    Py_DECREF(paths);
    return left;
}

#ifdef OUTCORE_PNG
/* decode_png_files: each regular file of `paths` read whole and decoded into its `outs` array by png_decode (with
 * `exact`, only a file whose own kind is its rows': grey of their depth, RGB, RGBA), the GIL released once for them
 * all; the positions left are returned. */
static PyObject *py_decode_png_files(PyObject *self, PyObject *args) {
    PyObject *path_list, *out_list, *left = NULL;
    int ids = 0, exact = 0;
    if (!PyArg_ParseTuple(args, "OO|pp:decode_png_files", &path_list, &out_list, &ids, &exact))
        return NULL;
    PyObject *paths = PySequence_Fast(path_list, "paths must be a sequence of str");
    if (paths == NULL)
        return NULL;
    PyObject *outs = PySequence_Fast(out_list, "outs must be a sequence of arrays");
    if (outs == NULL) {
        Py_DECREF(paths);
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(paths), viewed = 0;
    PyObject **names = NULL;
    Py_buffer *views = calloc(count > 0 ? (size_t)count : 1, sizeof(Py_buffer));
    uint8_t *done = calloc(count > 0 ? (size_t)count : 1, 1);
    Whole whole = {NULL, 0, 0};
    if (views == NULL || done == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (PySequence_Fast_GET_SIZE(outs) != count) {
        PyErr_SetString(PyExc_ValueError, "one out array a path");
        goto done;
    }
    if ((names = path_names(paths, count)) == NULL)
        goto done;
    for (; viewed < count; viewed++) {
        if (array_buffer(PySequence_Fast_GET_ITEM(outs, viewed), &views[viewed], 1) < 0)
            goto done;
        Py_buffer *out = &views[viewed];
        int wide = out->itemsize == 2 && strcmp(out->format, "H") == 0;
        if (!(out->ndim == 2 || (out->ndim == 3 && !ids)) || !(wide || strcmp(out->format, "B") == 0)) {
            viewed++;
            PyErr_SetString(PyExc_ValueError, "each out: a C-contiguous uint8 or uint16 array (height, width[, "
                                              "channels]; of 2 dimensions for ids)");
            goto done;
        }
    }
    FREE_BEGIN
    PngDecoder png = {0};
    for (Py_ssize_t k = 0; k < count; k++) {
        const char *path = PyBytes_AS_STRING(names[k]);
        Py_buffer *out = &views[k];
        int channels = out->ndim == 3 ? (int)out->shape[2] : 1, wide = out->itemsize == 2;
        if (!local_path(path) || !read_whole(path, &whole))
            continue;
        done[k] = png_decode(&png, whole.data, whole.size, channels, (int)out->shape[0], (int)out->shape[1], out->buf,
                             (size_t)out->shape[1] * channels * out->itemsize,
                             (ids ? PNG_IDS : 0) | (wide ? PNG_WIDE : 0) | (exact ? PNG_EXACT : 0));
    }
    png_decoder_free(&png);
    FREE_END
    left = positions_left(done, count);
done: /* freed in the reverse order of their making */
    path_names_free(names, names != NULL ? count : 0);
    free(whole.data);
    free(done);
    release_buffers(views, viewed);
    free(views);
    Py_DECREF(outs);
    Py_DECREF(paths);
    return left;
}
#endif

static PyObject *py_decode_each(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"regions", "ranges", "which", "samples", "out", "rows", NULL};
    PyObject *regions, *ranges, *arrays[4];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOO:decode_each", keywords, &regions, &ranges, &arrays[0],
                                     &arrays[1], &arrays[2], &arrays[3]))
        return NULL;
    return run_each(regions, ranges, arrays, 0);
}

static PyObject *py_crop_each(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"regions", "ranges", "which", "samples", "out", "rows", "sizes", "boxes", "flips", NULL};
    PyObject *regions, *ranges, *arrays[7];
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOO:crop_each", keywords, &regions, &ranges, &arrays[0],
                                     &arrays[1], &arrays[2], &arrays[3], &arrays[4], &arrays[5], &arrays[6]))
        return NULL;
    return run_each(regions, ranges, arrays, 1);
}

/* The kind of a buffer's samples that resize takes (sample_bytes): its format's letter, or 0 for another. */
static int sample_kind(const Py_buffer *view) {
    const char *format = view->format;
    if (*format == '@' || *format == '=' || *format == (PY_LITTLE_ENDIAN ? '<' : '>'))
        format++;
    if (format[0] == '\0' || format[1] != '\0' || strchr("BHhfd", format[0]) == NULL ||
        (size_t)view->itemsize != sample_bytes(format[0]))
        return 0;
    return format[0];
}

/* Whether resize takes pictures of `kind` with `channels`: 8-bit ones of 1 or 3 (RGBA is premultiplied by Pillow,
 * resize.py's), the others of any. */
static int resizable(int kind, Py_ssize_t channels) {
    return kind == 'B' ? channels == 1 || channels == 3 : kind != 0 && channels >= 1;
}

static PyObject *py_resize(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"source", "box", "out", "flip_x", "flip_y", NULL};
    Py_buffer source, out;
    PyObject *source_array, *out_array;
    double box[4];
    int flip_x = 0, flip_y = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O(dddd)O|pp:resize", keywords, &source_array, &box[0], &box[1],
                                     &box[2], &box[3], &out_array, &flip_x, &flip_y))
        return NULL;
    if (array_buffer(source_array, &source, 0) < 0)
        return NULL;
    if (array_buffer(out_array, &out, 1) < 0) {
        PyBuffer_Release(&source);
        return NULL;
    }
    PyObject *result = NULL;
    const int kind = sample_kind(&source);
    if (source.ndim != 3 || out.ndim != 3 || kind != sample_kind(&out) || source.shape[2] != out.shape[2] ||
        !resizable(kind, source.shape[2])) {
        PyErr_SetString(PyExc_ValueError, "source and out must be C-contiguous arrays (height, width, channels) of one "
                                          "kind: uint8 of 1 or 3 channels, or uint16, int16, float32 or float64");
    } else if (!box_inside(box, (double)source.shape[0], (double)source.shape[1])) {
        PyErr_SetString(PyExc_ValueError, "the box lies outside the source");
    } else {
        int channels = (int)source.shape[2], failed;
        size_t pixel = sample_bytes(kind) * channels;
        FREE_BEGIN failed = resize_kind(source.buf, (size_t)source.shape[1] * pixel, (int)source.shape[0],
                                        (int)source.shape[1], channels, kind, box, (int)out.shape[0], (int)out.shape[1],
                                        out.buf, (size_t)out.shape[1] * pixel, flip_x, flip_y);
        FREE_END if (failed) PyErr_NoMemory();
        else result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&source);
    PyBuffer_Release(&out);
    return result;
}

/* Boxes of pictures in chunks of pixels resized into a batch's rows (resize_each): box k (top, left, height, width)
 * of picture local[k] of chunks[which[k]] into out[rows[k]], mirrored as flips[k] says, where it lies inside. */
typedef struct {
    const uint8_t **chunks;
    Py_ssize_t *lengths; /* each chunk's pictures (its pixels, with `sizes`) */
    const int64_t *which, *local, *rows;
    const int64_t *sizes; /* or NULL: (count, 2) each picture's height and width, pictures of their own sizes, each
                           * at pixel local[k] of its chunk (the rows of a raster field) */
    const double *boxes;
    const uint8_t *flips;
    Py_ssize_t count;
    int height, width, channels, kind; /* the pictures' (kind: sample_kind; height and width without `sizes`) */
    uint8_t *out;
    int out_height, out_width;
} Resizes;

/* Box `box` (top, left, height, width) of `picture` (height x width x channels samples of `kind`, rows back to back)
 * resized into `row` (out_height x out_width of them) and mirrored as flip_x and flip_y say: 1, else 0 (left to
 * resize.py, which says what is wrong, or no memory). A box past its picture's edges is zeros there: the part inside
 * resized to the output pixels it covers (box_part); one within ROUNDING of them, but not inside in single precision,
 * is left, as is a box of no pixels or of numbers not finite. */
static int resize_one(const uint8_t *picture, int height, int width, int channels, int kind, const double *box,
                      int flip_x, int flip_y, uint8_t *row, int out_height, int out_width) {
    size_t pixel = sample_bytes(kind) * channels, out_stride = (size_t)out_width * pixel;
    double edges[4];
    int place[4];
    const int cut = box_cut(box, height, width, out_height, out_width, flip_x, flip_y, row, out_stride * out_height,
                            edges, place);
    if (cut < 1)
        return cut == 0; /* nothing of the picture in it: zeros */
    return box_inside(edges, (double)height, (double)width) &&
           resize_kind(picture, (size_t)width * pixel, height, width, channels, kind, edges, place[2], place[3],
                       row + out_stride * place[0] + pixel * place[1], out_stride, flip_x, flip_y) == 0;
}

static const PictureDecoder picture_decoder = {decoding_open, decoding_close, picture_decode, picture_crop,
                                               resize_one};

/* Every box of `resizes` resized into its row (resize_one); done[k] says which. */
static void resize_all(const Resizes *r, uint8_t *done) {
    size_t pixel = sample_bytes(r->kind) * r->channels, row_bytes = (size_t)r->out_width * pixel * r->out_height;
    for (Py_ssize_t k = 0; k < r->count; k++) {
        const int height = r->sizes ? (int)r->sizes[2 * k] : r->height, width = r->sizes ? (int)r->sizes[2 * k + 1] : r->width;
        const size_t first = r->sizes ? (size_t)r->local[k] : (size_t)r->local[k] * r->height * r->width; /* pixel */
        done[k] = resize_one(r->chunks[r->which[k]] + first * pixel, height, width, r->channels, r->kind,
                             r->boxes + 4 * k, r->flips[2 * k], r->flips[2 * k + 1],
                             r->out + row_bytes * (size_t)r->rows[k], r->out_height, r->out_width);
    }
}

static PyObject *py_resize_each(PyObject *self, PyObject *args) {
    PyObject *chunk_list, *arrays[6], *sizes_array = Py_None; /* which, local, boxes, out, rows, flips; sizes */
    if (!PyArg_ParseTuple(args, "OOOOOOO|O:resize_each", &chunk_list, &arrays[0], &arrays[1], &arrays[2], &arrays[3],
                          &arrays[4], &arrays[5], &sizes_array))
        return NULL;
    const int ragged = sizes_array != Py_None, dims = ragged ? 2 : 4; /* chunks of (pixels, channels), or pictures */
    Py_buffer sizes_view;
    if (ragged && array_buffer(sizes_array, &sizes_view, 0) < 0)
        return NULL;
    PyObject *chunks = PySequence_Fast(chunk_list, "resize_each: chunks must be a sequence of arrays"), *left = NULL;
    Py_ssize_t count_chunks = chunks ? PySequence_Fast_GET_SIZE(chunks) : 0, taken = 0;
    Py_buffer views[6], *chunk_views = chunks ? calloc(count_chunks ? count_chunks : 1, sizeof(Py_buffer)) : NULL;
    int got = 0;
    Resizes r = {0};
    r.chunks = calloc(count_chunks ? count_chunks : 1, sizeof(uint8_t *));
    r.lengths = calloc(count_chunks ? count_chunks : 1, sizeof(Py_ssize_t));
    if (chunks == NULL)
        goto done;
    if (chunk_views == NULL || r.chunks == NULL || r.lengths == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int fine = count_chunks >= 1;
    for (; fine && taken < count_chunks; taken++) {
        Py_buffer *view = &chunk_views[taken];
        if (array_buffer(PySequence_Fast_GET_ITEM(chunks, taken), view, 0) < 0) {
            fine = 0;
            break;
        }
        const Py_buffer *first = &chunk_views[0];
        fine = view->ndim == dims && resizable(sample_kind(view), view->shape[dims - 1]) &&
               sample_kind(view) == sample_kind(first) && view->shape[dims - 1] == first->shape[dims - 1] &&
               (ragged || (view->shape[1] == first->shape[1] && view->shape[2] == first->shape[2]));
        r.chunks[taken] = view->buf;
        r.lengths[taken] = view->shape[0];
    }
    while (fine && got < 6 && array_buffer(arrays[got], &views[got], got == 3) == 0)
        got++;
    Py_ssize_t count = got == 6 && views[0].ndim == 1 ? views[0].shape[0] : -1;
    Py_buffer *out = &views[3];
    fine = fine && count >= 0 && buffer_of(&views[0], "ql") && views[1].ndim == 1 && views[1].shape[0] == count &&
           buffer_of(&views[1], "ql") && table_of(&views[2], count, 4, "d") && out->ndim == 4 &&
           sample_kind(out) == sample_kind(&chunk_views[0]) && out->shape[3] == chunk_views[0].shape[dims - 1] &&
           views[4].ndim == 1 && views[4].shape[0] == count && buffer_of(&views[4], "ql") && views[5].ndim == 2 &&
           views[5].shape[0] == count && views[5].shape[1] == 2 && !strcmp(views[5].format, "B") &&
           (!ragged || table_of(&sizes_view, count, 2, "ql"));
    if (!fine) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError,
                            "wanted: chunks (pictures, height, width, channels; or, with sizes, pixels, channels; of one "
                            "shape and kind: uint8 of 1 or 3 channels, or uint16, int16, float32 or float64), which, "
                            "local and rows (int64), boxes (count, 4; float64), out (rows, height, width, the chunks' "
                            "channels and kind), flips (count, 2; uint8) and sizes (count, 2; int64), all C-contiguous");
        goto done;
    }
    r.sizes = ragged ? sizes_view.buf : NULL;
    r.which = views[0].buf;
    r.local = views[1].buf;
    r.boxes = views[2].buf;
    r.out = out->buf;
    r.rows = views[4].buf;
    r.flips = views[5].buf;
    r.count = count;
    r.height = ragged ? 0 : (int)chunk_views[0].shape[1];
    r.width = ragged ? 0 : (int)chunk_views[0].shape[2];
    r.channels = (int)chunk_views[0].shape[dims - 1];
    r.kind = sample_kind(&chunk_views[0]);
    r.out_height = (int)out->shape[1];
    r.out_width = (int)out->shape[2];
    for (Py_ssize_t k = 0; k < count; k++) {
        const int64_t pixels = ragged ? r.sizes[2 * k] * r.sizes[2 * k + 1] : 1; /* a ragged picture's, in its chunk */
        if (r.which[k] < 0 || r.which[k] >= count_chunks || r.local[k] < 0 || r.rows[k] < 0 ||
            r.rows[k] >= out->shape[0] || (ragged && (r.sizes[2 * k] < 1 || r.sizes[2 * k + 1] < 1 ||
                                                      r.sizes[2 * k] > INT_MAX || r.sizes[2 * k + 1] > INT_MAX)) ||
            r.local[k] > r.lengths[r.which[k]] - pixels) {
            PyErr_Format(PyExc_IndexError, "picture %lld of chunk %lld or row %lld out of range", (long long)r.local[k],
                         (long long)r.which[k], (long long)r.rows[k]);
            goto done;
        }
    }
    uint8_t *resized = calloc(count > 0 ? (size_t)count : 1, 1);
    if (resized == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    FREE_BEGIN resize_all(&r, resized);
    FREE_END
    left = positions_left(resized, count);
    free(resized);
done:
    release_buffers(views, got);
    release_buffers(chunk_views, taken);
    if (ragged)
        PyBuffer_Release(&sizes_view);
    free(chunk_views);
    free((void *)r.chunks);
    free(r.lengths);
    Py_XDECREF(chunks);
    return left;
}

static PyMethodDef methods[] = {
    {"crop_resize", (PyCFunction)(void (*)(void))py_crop_resize, METH_VARARGS | METH_KEYWORDS,
     "crop_resize(data, scale, box, out, flip_x=False, flip_y=False)\n--\n\n"
     "Decode the JPEG `data` at `scale`/8 (only the rows and columns the box needs), resize `box` (top, left,\n"
     "bottom, right, in the scaled picture's pixels) into `out` (height, width, 1 or 3; uint8), mirrored as asked.\n"
     "A damaged file, or one of another colour space than `out` asks, raises ValueError."},
    {"decode_each", (PyCFunction)(void (*)(void))py_decode_each, METH_VARARGS | METH_KEYWORDS,
     "decode_each(regions, ranges, which, samples, out, rows)\n--\n\n"
     "Decode file samples[k] of chunk which[k], regions[c][ranges[c][i, 0]:ranges[c][i, 1]] for file i of chunk\n"
     "c, whole into out[rows[k]], for every k, where it is a plain JPEG of out's height and width (YCbCr for 3\n"
     "channels, greyscale for 1 or 3, YCbCr for 1 too, weighed as Pillow's convert(\"L\") weighs it; one its EXIF\n"
     "orientation turns or mirrors, upright, as Pillow's exif_transpose turns it), or, built with zlib (ZLIB: its\n"
     "version), a plain PNG of that size (as Pillow converts it to out's channels; no eXIf, no animation; into uint16\n"
     "rows of 1 channel, 16-bit grey only), that decodes cleanly; the list of the k left (other files, damaged ones)\n"
     "is returned."},
    {"crop_each", (PyCFunction)(void (*)(void))py_crop_each, METH_VARARGS | METH_KEYWORDS,
     "crop_each(regions, ranges, which, samples, out, rows, sizes, boxes, flips)\n--\n\n"
     "For every k: boxes[k] (top, left, height, width) of file samples[k] of chunk which[k] (as decode_each), a plain\n"
     "JPEG of sizes[k] (height, width), resized into out[rows[k]] and mirrored as flips[k] (left-right,\n"
     "top-bottom) says, as decode.py's decode_region does, only the rows and columns the box needs decoded (or a\n"
     "plain PNG of that size, as decode_each takes it, or a JPEG its EXIF orientation turns or mirrors, of that size\n"
     "upright, decoded whole); the list of the k left (other files, damaged ones, boxes not inside the picture) is\n"
     "returned."},
    {"check_each", (PyCFunction)(void (*)(void))py_check_each, METH_VARARGS | METH_KEYWORDS,
     "check_each(files, channels, max_pixels, max_side, out, orientations=None)\n--\n\n"
     "Decode each of `files` (bytes) that is a plain JPEG (YCbCr or greyscale, no EXIF orientation but 1) of at\n"
     "most max_pixels pixels and max_side a side (none: negative) at 1/8 of its size, as decode.py's decoded_size\n"
     "does, and write its height and width into out[k] (files, 2; int64); the list of the k left (other files,\n"
     "damaged ones, those past the limits: (0, 0) in out) is returned. With `orientations` (files,; uint8), JPEGs\n"
     "that EXIF turns or mirrors are checked too, their upright height and width written: each file's EXIF\n"
     "orientation goes there (1 for a plain one, 0 for one left). The GIL is released once for them all."},
    {"check_files", (PyCFunction)(void (*)(void))py_check_files, METH_VARARGS | METH_KEYWORDS,
     "check_files(paths, channels, max_pixels, max_side, sizes, nbytes, digests, orientations=None)\n--\n\n"
     "Read each regular file of `paths` whole (a path holding \"::\" or \"://\" is not read), write its size into\n"
     "nbytes[k] (paths,; int64) and its BLAKE2b digest of digests' width (1 to 64 bytes) into digests[k], then\n"
     "check it as check_each does (with `orientations` as it takes them), its height and width into sizes[k] (paths,\n"
     "2; int64); the list of the k left\n"
     "(files not read: 0 in nbytes and digests; other files, damaged ones, those past the limits) is returned.\n"
     "The GIL is released once for them all."},
    {"fit_files", py_fit_files, METH_VARARGS,
     "fit_files(paths, policy, max_pixels, out, digests)\n--\n\n"
     "Read each regular file of `paths` whole (a path holding \"::\" or \"://\" is not read) and, where it is a JPEG\n"
     "(YCbCr or greyscale, a colour one asked for as grey weighed as decode_upright weighs it; upright, or turned or\n"
     "mirrored by its EXIF orientation) or, built with zlib, a plain PNG (as decode_png takes it, as 8-bit samples)\n"
     "of at most max_pixels pixels (none: negative) that decodes cleanly, decode it into out[k] (paths, height,\n"
     "width, 1 or 3; uint8) as decode.py's decode_image does under `policy` (None: a file of out's size only; 'crop'\n"
     "or 'fit': any size, a JPEG decoded at the DCT scale the policy needs, upright, then fitted) and write its\n"
     "BLAKE2b digest of digests' width (1 to 64 bytes) into digests[k]; the list of the k left (files not read, other\n"
     "files, damaged ones; their rows and digests as they were, or partly written) is returned. The GIL is released\n"
     "once for them all."},
#ifdef OUTCORE_PNG
    {"decode_png_files", py_decode_png_files, METH_VARARGS,
     "decode_png_files(paths, outs, ids=False, exact=False)\n--\n\n"
     "Read each regular file of `paths` whole (a path holding \"::\" or \"://\" is not read) and decode it into\n"
     "outs[k] as decode_png(data, outs[k], ids) does (with `exact`, only a file whose own kind is its array's: grey\n"
     "of its depth for 1 channel, RGB or a palette's colours for 3, RGBA for 4); the list of the k left (files not read, other files,\n"
     "damaged ones, those of another size; their arrays' contents undefined) is returned. The GIL is released once\n"
     "for them all."},
    {"decode_png", py_decode_png, METH_VARARGS,
     "decode_png(data, out, ids=False)\n--\n\n"
     "Decode the PNG `data` into `out` (uint8, or uint16 for a 16-bit greyscale file: (height, width[, channels]))\n"
     "where it is a plain PNG of that size (_png.h: grey of 1 to 16 bits, RGB, with or without alpha, a palette's\n"
     "colours, interlaced or not, as Pillow converts it to those channels; no eXIf or animation) that decodes\n"
     "cleanly: True; else False and `out` left as it was (for Pillow, which words what is wrong). With `ids`, a label\n"
     "map's ids as Pillow gives them: a palette's indices, a grey file's values, into (height, width) of its depth\n"
     "(uint8 or uint16). The GIL is released meanwhile."},
#endif
    {"decode_upright", py_decode_upright, METH_VARARGS,
     "decode_upright(data, eighths, out)\n--\n\n"
     "Decode the JPEG `data` whole at `eighths`/8 of its size into `out` (height, width, 1 or 3; uint8), upright as\n"
     "Pillow's exif_transpose turns it, where it is a plain JPEG (YCbCr for 3 channels, greyscale for 1 or 3, YCbCr\n"
     "for 1 too, its rows weighed as Pillow's convert(\"L\") weighs them) or one its EXIF orientation turns or\n"
     "mirrors (jpeg_orientation 2-8), of out's height and width upright once scaled (libjpeg's: each side times\n"
     "eighths/8, rounded up), that decodes cleanly: its orientation (1-8); else 0, out's contents undefined (for\n"
     "Pillow, which words what is wrong). The GIL is released meanwhile."},
    {"jpeg_orientation", py_jpeg_orientation, METH_O,
     "jpeg_orientation(data)\n--\n\n"
     "The EXIF orientation of the JPEG `data`, read from its header segments as Pillow reads it: 1 (upright as\n"
     "stored: no EXIF, or EXIF saying 1), 2-8 as its EXIF says, 0 where that cannot be told without Pillow (two EXIF\n"
     "blocks, an odd one, no orientation beside an XMP packet, segments that do not reach the image data)."},
    {"resize_each", py_resize_each, METH_VARARGS,
     "resize_each(chunks, which, local, boxes, out, rows, flips, sizes=None)\n--\n\n"
     "For every k: boxes[k] (top, left, height, width) of picture local[k] of chunks[which[k]] ((pictures, height,\n"
     "width, channels), as resize takes them) resized into out[rows[k]] as resize does, mirrored as flips[k]\n"
     "(left-right, top-bottom) says; the list of the k left (boxes not inside their picture) is returned. The GIL is\n"
     "released once for them all. With sizes ((count, 2) heights and widths), the chunks are (pixels, channels)\n"
     "arrays of pictures of their own sizes (a raster field's rows), picture k of sizes[k] at pixel local[k]."},
    {"resize", (PyCFunction)(void (*)(void))py_resize, METH_VARARGS | METH_KEYWORDS,
     "resize(source, box, out, flip_x=False, flip_y=False)\n--\n\n"
     "Resize `box` (top, left, bottom, right) of `source` (height, width, channels) into `out` (of its kind),\n"
     "antialiased bilinear, as Pillow's Image.resize(..., BILINEAR, box=...) does: uint8 of 1 or 3 channels, columns\n"
     "first then rows, rounded between; uint16, int16, float32 or float64 of any, each channel as a float32 picture\n"
     "(mode F), then rounded half to even and held to an integer kind's range."},
    FREE_METHOD,
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpeg", "Cropped JPEG decoding and resizing.", -1, methods};

PyMODINIT_FUNC PyInit__jpeg(void) {
    PyObject *created = PyModule_Create(&module);
    if (created == NULL)
        return NULL;
#ifdef LIBJPEG_TURBO_VERSION
#define OUTCORE_STRING(x) #x
#define OUTCORE_VERSION(x) OUTCORE_STRING(x)
    const char *version = OUTCORE_VERSION(LIBJPEG_TURBO_VERSION);
#else
    const char *version = "unknown";
#endif
#ifdef OUTCORE_AVX2
    has_avx2 = __builtin_cpu_supports("avx2");
    const char *simd = has_avx2 ? "AVX2" : "scalar";
#else
    const char *simd = "scalar";
#endif
#ifdef OUTCORE_PNG
    const char *zlib = zlibVersion(); /* decode_each decodes plain PNGs with it */
#else
    const char *zlib = "";
#endif
    PyObject *decoder = PyCapsule_New((void *)&picture_decoder, PICTURE_DECODER_CAPSULE, NULL);
    if (decoder == NULL || PyModule_AddObject(created, "picture_decoder", decoder) < 0) {
        Py_XDECREF(decoder);
        Py_DECREF(created);
        return NULL;
    }
    if (PyModule_AddStringConstant(created, "LIBJPEG_TURBO_VERSION", version) < 0 ||
        PyModule_AddStringConstant(created, "SIMD", simd) < 0 || PyModule_AddStringConstant(created, "ZLIB", zlib) < 0) {
        Py_DECREF(created);
        return NULL;
    }
    return created;
}
