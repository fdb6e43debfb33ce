/* outcore.seeds._draws: the numbers numpy's Generator.integers(0, high, size=n) and Generator.random(n) draw, in one
 * C call each, without the argument handling that makes each of numpy's calls cost more than its draws for the
 * few numbers a transform draws per piece of a batch (a crop's tops and lefts, a flip's mirrors).
 *
 * integers(capsule, high, out): out[i] = Lemire's bounded draw in [0, high) from the bit generator's 32-bit
 * outputs, high - 1 below 2**32 - 1, as numpy's random_bounded_uint64_fill draws int64 numbers (buffered_bounded_
 * lemire_uint32); uniform(capsule, out): out[i] = the generator's next double, as random_standard_uniform_fill;
 * resized_crop_boxes(capsule, sizes, scale, ratio, out): RandomResizedCrop's boxes, each drawn with those draws as
 * outcore.imaging.crops.random_resized_crop_box draws it (a Python loop of a dozen calls a picture before).
 * `capsule` is the generator's bit_generator.capsule; out is a C-contiguous int64 or float64 buffer. The same
 * numbers and the same state after, for any generator: tests/test_seeds.py compares them with numpy's. Without
 * this extension outcore.seeds asks numpy itself.
 *
 * crops_and_flips(keys, domain, counts, highs, window, pad, flip, boxes, flips): the draws of a batch's pieces (its
 * crop's boxes written as float64, as a batch holds them), each from a
 * generator of its own (default_rng(SeedSequence([len(key), *key], spawn_key=(domain,))), as outcore.seeds.generator
 * makes it), made here: PCG64 (numpy's XSL-RR 128/64, seeded as numpy seeds it from the SeedSequence's state) with
 * no numpy Generator made. A piece of n pictures draws n tops, then n lefts (integers(0, high)), then n uniforms
 * for each mirrored axis, as RandomCrop.boxes and RandomFlip.draw draw them; numpy made two objects a generator and
 * parsed each call's arguments, several times the draws' own cost for a piece of 32 pictures. permutation(key,
 * domain, out): the order Generator.permutation gives, from the generator of a key (an epoch plan's windows, a few
 * a batch, each its own). resized_crops_and_flips and scale_jitters_and_flips: as crops_and_flips, RandomResizedCrop's
 * and ScaleJitter's boxes of each picture's size.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_seed_sequence.h"

typedef struct { /* numpy/random/bitgen.h: what a bit generator's capsule holds */
    void *state;
    uint64_t (*next_uint64)(void *state);
    uint32_t (*next_uint32)(void *state);
    double (*next_double)(void *state);
    uint64_t (*next_raw)(void *state);
} bitgen_t;

/* The capsule's bit generator when `fine` and out holds whole items of `item` bytes; else NULL, with the error
 * (`need` says what is needed) set and out released. */
static bitgen_t *checked(PyObject *capsule, Py_buffer *out, size_t item, int fine, const char *need) {
    bitgen_t *bits = PyCapsule_GetPointer(capsule, "BitGenerator");
    if (bits != NULL && (!fine || out->len % item)) {
        PyErr_SetString(PyExc_ValueError, need);
        bits = NULL;
    }
    if (bits == NULL)
        PyBuffer_Release(out);
    return bits;
}

/* A number in [0, range] (range below 2**32 - 1): Lemire's multiply-and-reject on 32-bit draws. */
static uint32_t bounded_lemire_uint32(bitgen_t *bits, uint32_t range) {
    const uint32_t excluded = range + 1;
    uint64_t product = (uint64_t)bits->next_uint32(bits->state) * excluded;
    uint32_t leftover = (uint32_t)product;
    if (leftover < excluded) {
        const uint32_t threshold = (UINT32_MAX - range) % excluded;
        while (leftover < threshold) {
            product = (uint64_t)bits->next_uint32(bits->state) * excluded;
            leftover = (uint32_t)product;
        }
    }
    return (uint32_t)(product >> 32);
}

static PyObject *py_integers(PyObject *self, PyObject *args) {
    PyObject *capsule;
    long long high;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "OLw*:integers", &capsule, &high, &out))
        return NULL;
    bitgen_t *bits = checked(capsule, &out, sizeof(int64_t), high >= 1 && high - 1 < (long long)UINT32_MAX,
                             "need 1 <= high < 2**32 and an int64 buffer");
    if (bits == NULL)
        return NULL;
    int64_t *numbers = out.buf;
    Py_ssize_t count = out.len / (Py_ssize_t)sizeof(int64_t);
    for (Py_ssize_t i = 0; i < count; i++)
        numbers[i] = high == 1 ? 0 : (int64_t)bounded_lemire_uint32(bits, (uint32_t)(high - 1));
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

static PyObject *py_uniform(PyObject *self, PyObject *args) {
    PyObject *capsule;
    Py_buffer out;
    if (!PyArg_ParseTuple(args, "Ow*:uniform", &capsule, &out))
        return NULL;
    bitgen_t *bits = checked(capsule, &out, sizeof(double), 1, "need a float64 buffer");
    if (bits == NULL)
        return NULL;
    double *numbers = out.buf;
    Py_ssize_t count = out.len / (Py_ssize_t)sizeof(double);
    for (Py_ssize_t i = 0; i < count; i++)
        numbers[i] = bits->next_double(bits->state);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* Generator.integers(0, high) of one number, high below 2**32: as numpy draws it (none drawn for high 1). */
static int64_t bounded(bitgen_t *bits, int64_t high) {
    return high == 1 ? 0 : (int64_t)bounded_lemire_uint32(bits, (uint32_t)(high - 1));
}

static int64_t floor_half(int64_t value) { return value >= 0 ? value / 2 : -((1 - value) / 2); }

/* RandomResizedCrop's box of a height x width picture, drawn as outcore.imaging.crops.random_resized_crop_box draws
 * it with Generator.uniform (low + (high - low) * a double) and Generator.integers: up to 10 tries of a random share
 * of the area and a log-uniform aspect ratio, then the largest central box within the ratios. Python's round() and
 * the C library's rint() (to nearest, ties to even) agree, as do math's and libm's sqrt, exp and log. */
static void resized_crop_box(bitgen_t *bits, int64_t height, int64_t width, const double scale[2],
                             const double ratio[2], int64_t box[4]) {
    const double area = (double)height * (double)width, log_low = log(ratio[0]), log_high = log(ratio[1]);
    for (int attempt = 0; attempt < 10; attempt++) {
        const double target = area * (scale[0] + (scale[1] - scale[0]) * bits->next_double(bits->state));
        const double aspect = exp(log_low + (log_high - log_low) * bits->next_double(bits->state));
        const double box_width = rint(sqrt(target * aspect)), box_height = rint(sqrt(target / aspect));
        if (0 < box_width && box_width <= (double)width && 0 < box_height && box_height <= (double)height) {
            box[2] = (int64_t)box_height;
            box[3] = (int64_t)box_width;
            box[0] = bounded(bits, height - box[2] + 1);
            box[1] = bounded(bits, width - box[3] + 1);
            return;
        }
    }
    const double aspect = (double)width / (double)height;
    const double low = fmin(ratio[0], ratio[1]), high = fmax(ratio[0], ratio[1]);
    int64_t box_width = width, box_height = height;
    if (aspect < low)
        box_height = (int64_t)rint((double)width / low);
    else if (aspect > high)
        box_width = (int64_t)rint((double)height * high);
    box[0] = floor_half(height - box_height);
    box[1] = floor_half(width - box_width);
    box[2] = box_height;
    box[3] = box_width;
}

static PyObject *py_resized_crop_boxes(PyObject *self, PyObject *args) {
    PyObject *capsule;
    Py_buffer sizes, out;
    double scale[2], ratio[2];
    if (!PyArg_ParseTuple(args, "Oy*(dd)(dd)w*:resized_crop_boxes", &capsule, &sizes, &scale[0], &scale[1],
                          &ratio[0], &ratio[1], &out))
        return NULL;
    const Py_ssize_t count = sizes.len / (Py_ssize_t)(2 * sizeof(int64_t));
    int fine = sizes.len % (Py_ssize_t)(2 * sizeof(int64_t)) == 0 && out.len == count * (Py_ssize_t)(4 * sizeof(int64_t))
               && ratio[0] > 0 && ratio[1] > 0 && scale[0] >= 0 && scale[1] >= 0;
    const int64_t *picture = sizes.buf;
    for (Py_ssize_t i = 0; fine && i < count; i++)
        fine = picture[2 * i] >= 1 && picture[2 * i + 1] >= 1 && picture[2 * i] <= UINT32_MAX && picture[2 * i + 1] <= UINT32_MAX;
    bitgen_t *bits = checked(capsule, &out, 1, fine,
                             "need int64 sizes (n, 2) of 1 to 2**32, positive ratios, scales of 0 or more and an "
                             "int64 out (n, 4)");
    if (bits == NULL) {
        PyBuffer_Release(&sizes);
        return NULL;
    }
    int64_t *boxes = out.buf;
    for (Py_ssize_t i = 0; i < count; i++)
        resized_crop_box(bits, picture[2 * i], picture[2 * i + 1], scale, ratio, boxes + 4 * i);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

#ifdef __SIZEOF_INT128__
#define OUTCORE_PCG64
typedef __uint128_t u128;

/* numpy's PCG64 (pcg64.h): a 128-bit linear congruential state, each 64-bit output its high and low halves XORed and
 * rotated by the state's top 6 bits; a 32-bit output is the low half of a 64-bit one, its high half kept for the
 * next (numpy's buffered next_uint32). */
typedef struct {
    u128 state, increment;
    int has_half;
    uint32_t half;
} pcg64_t;

static const u128 PCG_MULTIPLIER = ((u128)2549297995355413924ULL << 64) + 4865540595714422341ULL;

/* Seeded as numpy's PCG64 seeds itself from its SeedSequence's 4 words: the first two the initial state, the last
 * two the stream (pcg_setseq_128_srandom_r). */
static void pcg64_seed(pcg64_t *generator, const uint64_t words[4]) {
    generator->increment = (((u128)words[2] << 64) | words[3]) << 1 | 1;
    generator->state = generator->increment;
    generator->state += ((u128)words[0] << 64) | words[1];
    generator->state = generator->state * PCG_MULTIPLIER + generator->increment;
    generator->has_half = 0;
    generator->half = 0;
}

static uint64_t pcg64_next64(void *state) {
    pcg64_t *generator = state;
    generator->state = generator->state * PCG_MULTIPLIER + generator->increment;
    const uint64_t folded = (uint64_t)(generator->state >> 64) ^ (uint64_t)generator->state;
    const unsigned rotation = (unsigned)(generator->state >> 122);
    return (folded >> rotation) | (folded << ((64 - rotation) & 63));
}

static uint32_t pcg64_next32(void *state) {
    pcg64_t *generator = state;
    if (generator->has_half) {
        generator->has_half = 0;
        return generator->half;
    }
    const uint64_t next = pcg64_next64(state);
    generator->has_half = 1;
    generator->half = (uint32_t)(next >> 32);
    return (uint32_t)next;
}

static double pcg64_next_double(void *state) { return (double)(pcg64_next64(state) >> 11) * (1.0 / 9007199254740992.0); }

/* The generator of `key` (`length` numbers of 0 to 2**63) in `domain`, as outcore.seeds.generator makes it: 0, or -1
 * for a key of too many words. */
static int keyed(pcg64_t *generator, const int64_t *key, Py_ssize_t length, uint64_t domain) {
    uint32_t words[MAX_WORDS + POOL + 2];
    int count = 0;
    if (length >= MAX_WORDS / 2 || append_number((uint64_t)length, words, &count) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < length; i++)
        if (append_number((uint64_t)key[i], words, &count) < 0)
            return -1;
    if (spawn_words(words, &count, domain) < 0)
        return -1;
    uint64_t state[POOL];
    seed_state(words, count, state);
    pcg64_seed(generator, state);
    return 0;
}

/* What each picture of a piece has its crop draw, as a box (top, left, height, width) of float64 in `out`: a window
 * (WINDOWS: every top, then every left, integers(0, highs), less the padding `pad`, of the `window`'s size), a resized
 * box of its picture's size (RESIZED: resized_crop_box), or ScaleJitter's window of the `window`'s size in its
 * picture's pixels (JITTER: scale_jitter_boxes). */
typedef struct {
    enum { WINDOWS, RESIZED, JITTER } kind;
    long long highs[2];
    double pad, window[2];
    const int64_t *sizes;
    double scale[2], ratio[2];
} crops_t;

/* ScaleJitter.boxes of `count` pictures of `size` (height, width) resized by a random factor in `scale` of the one
 * that fits them in `output` (height, width), then cut to a window of the output's size at a random place: every
 * factor (Generator.uniform), then every top, then every left (Generator.random), in numpy's arithmetic, step by
 * step as ScaleJitter.boxes does it on arrays (np.round is rint, ties to even). `out` holds the scaled sides between
 * the passes. */
static void scale_jitter_boxes(bitgen_t *bits, const int64_t *size, int64_t count, const double scale[2],
                               const double output[2], double *out) {
    const double height = output[0], width = output[1], range = scale[1] - scale[0];
    for (int64_t k = 0; k < count; k++)
        out[4 * k + 2] = scale[0] + range * bits->next_double(bits->state);
    for (int64_t k = 0; k < count; k++) {
        const double rows = (double)size[2 * k], columns = (double)size[2 * k + 1];
        const double factor = out[4 * k + 2] * fmin(height / rows, width / columns);
        out[4 * k + 2] = fmax(1, rint(rows * factor));
        out[4 * k + 3] = fmax(1, rint(columns * factor));
    }
    for (int side = 0; side < 2; side++)
        for (int64_t k = 0; k < count; k++)
            out[4 * k + side] = floor(bits->next_double(bits->state) * (fmax(0, out[4 * k + 2 + side] - output[side]) + 1));
    for (int64_t k = 0; k < count; k++) {
        const double sy = (double)size[2 * k] / out[4 * k + 2], sx = (double)size[2 * k + 1] / out[4 * k + 3];
        out[4 * k] *= sy;
        out[4 * k + 1] *= sx;
        out[4 * k + 2] = height * sy;
        out[4 * k + 3] = width * sx;
    }
}

static void draw_crops(bitgen_t *bits, const crops_t *crops, Py_ssize_t first, int64_t count, double *out) {
    if (crops->kind == WINDOWS) {
        for (int side = 0; side < 2; side++)
            for (int64_t k = 0; k < count; k++)
                out[4 * k + side] = (double)bounded(bits, crops->highs[side]) - crops->pad;
        for (int64_t k = 0; k < count; k++) {
            out[4 * k + 2] = crops->window[0];
            out[4 * k + 3] = crops->window[1];
        }
        return;
    }
    const int64_t *size = crops->sizes + 2 * first;
    if (crops->kind == JITTER) {
        scale_jitter_boxes(bits, size, count, crops->scale, crops->window, out);
        return;
    }
    int64_t box[4];
    for (int64_t k = 0; k < count; k++) {
        resized_crop_box(bits, size[2 * k], size[2 * k + 1], crops->scale, crops->ratio, box);
        for (int side = 0; side < 4; side++)
            out[4 * k + side] = (double)box[side];
    }
}

/* Each piece's draws from the generator of its key (`pieces` keys of `length` numbers, `count` pictures each): its
 * crops (float64 boxes, rows of 4 in out), then a uniform < p per picture for each axis of `axes` (left-right,
 * top-bottom) into flips. The buffers are checked for their sizes; 0 where anything is amiss. */
static int draw_pieces(Py_buffer *keys, uint64_t domain, Py_buffer *counts, const crops_t *crops, double p, int axes,
                       Py_buffer *out, Py_buffer *flips) {
    const Py_ssize_t pieces = counts->len / (Py_ssize_t)sizeof(int64_t);
    const int64_t *count = counts->buf, *key = keys->buf;
    if (pieces == 0 || counts->len % (Py_ssize_t)sizeof(int64_t) || keys->len % (pieces * 8) || (axes & ~3))
        return 0;
    const Py_ssize_t length = keys->len / (pieces * 8);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < pieces; i++) {
        if (count[i] < 0)
            return 0;
        total += count[i];
    }
    for (Py_ssize_t i = 0; i < pieces * length; i++)
        if (key[i] < 0)
            return 0;
    if (out->len != total * 4 * (Py_ssize_t)sizeof(double) || flips->len != total * 2)
        return 0;
    double *row = out->buf;
    uint8_t *flip = flips->buf;
    pcg64_t generator;
    bitgen_t bits = {&generator, pcg64_next64, pcg64_next32, pcg64_next_double, pcg64_next64};
    for (Py_ssize_t i = 0, first = 0; i < pieces; first += count[i], i++) {
        if (keyed(&generator, key + i * length, length, domain) < 0)
            return 0;
        draw_crops(&bits, crops, first, count[i], row + first * 4);
        for (int axis = 0; axis < 2; axis++)
            for (int64_t k = 0; k < count[i]; k++)
                flip[2 * (first + k) + axis] = axes >> axis & 1 ? pcg64_next_double(&generator) < p : 0;
    }
    return 1;
}

static int within_32_bits(long long high) { return high >= 1 && high - 1 < (long long)UINT32_MAX; }

static PyObject *py_crops_and_flips(PyObject *self, PyObject *args) {
    Py_buffer keys, counts, boxes, flips;
    unsigned long long domain;
    crops_t crops = {.kind = WINDOWS};
    double p;
    int axes;
    if (!PyArg_ParseTuple(args, "y*Ky*(LL)(dd)d(di)w*w*:crops_and_flips", &keys, &domain, &counts, &crops.highs[0],
                          &crops.highs[1], &crops.window[0], &crops.window[1], &crops.pad, &p, &axes, &boxes, &flips))
        return NULL;
    int fine = within_32_bits(crops.highs[0]) && within_32_bits(crops.highs[1]) &&
               draw_pieces(&keys, domain, &counts, &crops, p, axes, &boxes, &flips);
    PyBuffer_Release(&keys);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&boxes);
    PyBuffer_Release(&flips);
    if (!fine) {
        PyErr_SetString(PyExc_ValueError, "need int64 keys (pieces, n) of 0 or more, int64 counts (pieces), highs of 1 "
                                          "to 2**32, axes of 0 to 3, a float64 boxes (total, 4), uint8 flips (total, 2)");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* The boxes of a kind drawn from each picture's size (RESIZED, JITTER), then the mirrors, of each piece:
 * resized_crops_and_flips (scale, ratio) and scale_jitters_and_flips (scale, the output's size); `need` says what
 * the arguments must be. */
static PyObject *sized_crops_and_flips(PyObject *args, int kind, const char *format, const char *need) {
    Py_buffer keys, counts, sizes, boxes, flips;
    unsigned long long domain;
    crops_t crops = {.kind = kind};
    double p, *second = kind == JITTER ? crops.window : crops.ratio;
    int axes;
    if (!PyArg_ParseTuple(args, format, &keys, &domain, &counts, &sizes, &crops.scale[0], &crops.scale[1], &second[0],
                          &second[1], &p, &axes, &boxes, &flips))
        return NULL;
    crops.sizes = sizes.buf;
    const Py_ssize_t pictures = sizes.len / (Py_ssize_t)(2 * sizeof(int64_t));
    int fine = sizes.len % (Py_ssize_t)(2 * sizeof(int64_t)) == 0 && boxes.len == pictures * 4 * (Py_ssize_t)sizeof(double)
               && second[0] > 0 && second[1] > 0 && crops.scale[0] >= 0 && crops.scale[1] >= 0;
    for (Py_ssize_t i = 0; fine && i < 2 * pictures; i++)
        fine = crops.sizes[i] >= 1 && crops.sizes[i] <= UINT32_MAX;
    fine = fine && draw_pieces(&keys, domain, &counts, &crops, p, axes, &boxes, &flips);
    PyBuffer_Release(&keys);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&boxes);
    PyBuffer_Release(&flips);
    if (!fine) {
        PyErr_SetString(PyExc_ValueError, need);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_resized_crops_and_flips(PyObject *self, PyObject *args) {
    return sized_crops_and_flips(args, RESIZED, "y*Ky*y*(dd)(dd)(di)w*w*:resized_crops_and_flips",
                                 "need int64 keys (pieces, n) of 0 or more, int64 counts (pieces) adding up to the int64 "
                                 "sizes (n, 2) of 1 to 2**32, positive ratios, scales of 0 or more, axes of 0 to 3, a "
                                 "float64 boxes (n, 4), uint8 flips (n, 2)");
}

static PyObject *py_scale_jitters_and_flips(PyObject *self, PyObject *args) {
    return sized_crops_and_flips(args, JITTER, "y*Ky*y*(dd)(dd)(di)w*w*:scale_jitters_and_flips",
                                 "need int64 keys (pieces, n) of 0 or more, int64 counts (pieces) adding up to the int64 "
                                 "sizes (n, 2) of 1 to 2**32, scales of 0 or more, a positive output size, axes of 0 to "
                                 "3, a float64 boxes (n, 4), uint8 flips (n, 2)");
}
/* numpy's random_interval: a number in [0, most] by masked rejection, on 32-bit draws for `most` below 2**32. */
static uint64_t interval(pcg64_t *generator, uint64_t most) {
    if (most == 0)
        return 0;
    uint64_t mask = most, value;
    for (int shift = 1; shift < 64; shift *= 2)
        mask |= mask >> shift;
    if (most <= UINT32_MAX)
        do
            value = pcg64_next32(generator) & mask;
        while (value > most);
    else
        do
            value = pcg64_next64(generator) & mask;
        while (value > most);
    return value;
}

/* numpy's shuffle of order[0 .. count - 1] from `generator`: from the last, each with one at or before it (with order
 * holding 0 .. count - 1, Generator.permutation's order). */
static void shuffle(pcg64_t *generator, int64_t *order, int64_t count) {
    for (int64_t i = count - 1; i >= 1; i--) {
        const int64_t j = (int64_t)interval(generator, (uint64_t)i), held = order[i];
        order[i] = order[j];
        order[j] = held;
    }
}

#define FREE_FROM 65536 /* orders this long or longer are made with the GIL released */

static PyObject *py_permutation(PyObject *self, PyObject *args) {
    Py_buffer key, out;
    unsigned long long domain;
    if (!PyArg_ParseTuple(args, "y*Kw*:permutation", &key, &domain, &out))
        return NULL;
    const int64_t *numbers = key.buf;
    const Py_ssize_t length = key.len / (Py_ssize_t)sizeof(int64_t), count = out.len / (Py_ssize_t)sizeof(int64_t);
    int fine = key.len % (Py_ssize_t)sizeof(int64_t) == 0 && out.len % (Py_ssize_t)sizeof(int64_t) == 0;
    for (Py_ssize_t i = 0; fine && i < length; i++)
        fine = numbers[i] >= 0;
    pcg64_t generator;
    fine = fine && keyed(&generator, numbers, length, domain) == 0;
    if (fine) {
        int64_t *order = out.buf;
        PyThreadState *saved = count >= FREE_FROM ? PyEval_SaveThread() : NULL;
        for (Py_ssize_t i = 0; i < count; i++)
            order[i] = i;
        shuffle(&generator, order, count);
        if (saved != NULL)
            PyEval_RestoreThread(saved);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&out);
    if (!fine) {
        PyErr_SetString(PyExc_ValueError, "need an int64 key of numbers of 0 or more and an int64 out");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* `shuffle` of order[0 .. count - 1] drawn from the generator of (*key, last) in domain: 0, or -1 for a key too
 * long. */
static int shuffle_keyed(const int64_t *key, Py_ssize_t length, int64_t last, uint64_t domain, int64_t *order,
                         int64_t count) {
    int64_t extended[MAX_WORDS / 2];
    pcg64_t generator;
    if (length + 1 >= MAX_WORDS / 2)
        return -1;
    memcpy(extended, key, (size_t)length * sizeof(int64_t));
    extended[length] = last;
    if (keyed(&generator, extended, length + 1, domain) < 0)
        return -1;
    shuffle(&generator, order, count);
    return 0;
}

typedef struct { /* a window to make (py_window's arguments) */
    const int64_t *key, *first, *sizes, *deals, *ends;
    Py_ssize_t length, window;
    uint64_t slot_domain, window_domain;
    int64_t w, low, last, count;
    int mixed;
    int64_t *local, *owner;
} window_t;

/* The window into its local and owner, through scratch (3 x count int64 and the largest slot's): 0, or -1. */
static int make_window(const window_t *made, int64_t *scratch) {
    int64_t *order = scratch, *was_local = scratch + made->count, *was_owner = scratch + 2 * made->count;
    int64_t *dealt = scratch + 3 * made->count, at = 0;
    for (int64_t j = made->low; j <= made->last; j++) {
        const int64_t d = made->w - j, end = made->ends[j * made->window + d], number = made->deals[j * made->window + d];
        if (number == 0)
            continue;
        for (int64_t i = 0; i < made->sizes[j]; i++) /* the slot's samples in dealing order */
            dealt[i] = made->first[j] + i;
        if (made->mixed && shuffle_keyed(made->key, made->length, j, made->slot_domain, dealt, made->sizes[j]) < 0)
            return -1;
        memcpy(was_local + at, dealt + end - number, (size_t)number * sizeof(int64_t));
        for (int64_t i = 0; i < number; i++)
            was_owner[at + i] = j;
        at += number;
    }
    for (int64_t i = 0; i < made->count; i++)
        order[i] = i;
    if (made->mixed && shuffle_keyed(made->key, made->length, made->w, made->window_domain, order, made->count) < 0)
        return -1;
    for (int64_t i = 0; i < made->count; i++) { /* gathered in the window's order */
        made->local[i] = was_local[order[i]];
        made->owner[i] = was_owner[order[i]];
    }
    return 0;
}

/* For the windows w .. stop - 1 of made's stream (window v of slots max(0, v - window + 1) to min(v, slots - 1)), before
 * any is made: their deals checked against the slots, and the most samples a window holds (largest), the largest slot
 * (most) and the samples of them all (total); 0, or -1 for deals that do not fit the slots. */
static int window_counts(window_t *made, Py_ssize_t slots, int64_t w, int64_t stop, int64_t *largest, int64_t *most,
                         int64_t *total) {
    *largest = *most = *total = 0;
    for (int64_t v = w; v < stop; v++) {
        int64_t taken = 0;
        for (int64_t j = v - made->window + 1 > 0 ? v - made->window + 1 : 0; j <= v && j < slots; j++) {
            const int64_t d = v - j, end = made->ends[j * made->window + d], number = made->deals[j * made->window + d];
            if (made->sizes[j] < 0 || number < 0 || end > made->sizes[j] || end - number < 0)
                return -1;
            *most = made->sizes[j] > *most ? made->sizes[j] : *most;
            taken += number;
        }
        *largest = taken > *largest ? taken : *largest;
        *total += taken;
    }
    return 0;
}

/* Each of count samples' local index (among its slot's chunk's selected ones) into its index in the store, in place:
 * its slot's start plus it, and, with indices (a subset's, `length` of them), the index it points at there: 0, or -1
 * for one outside indices. */
static int store_indices(int64_t *local, const int64_t *owner, int64_t count, const int64_t *starts,
                         const int64_t *indices, Py_ssize_t length) {
    for (int64_t i = 0; i < count; i++) {
        const int64_t at = starts[owner[i]] + local[i];
        if (length > 0 && (at < 0 || at >= length))
            return -1;
        local[i] = length > 0 ? indices[at] : at;
    }
    return 0;
}

/* outcore.seeds.window_draws (see there): an epoch stream's windows w .. stop - 1, back to back, each sample as its
 * index in the store (`store_indices`). The GIL is kept for fewer than FREE_FROM samples: given up and taken back,
 * it would go to another thread, which costs more than the windows. */
static PyObject *py_window(PyObject *self, PyObject *args) {
    Py_buffer key, first, sizes, deals, ends, starts, indices, local, owner;
    unsigned long long slot_domain, window_domain;
    long long w, stop;
    int mixed;
    if (!PyArg_ParseTuple(args, "y*KKLLy*y*y*y*y*y*pw*w*:window", &key, &slot_domain, &window_domain, &w, &stop, &first,
                          &sizes, &deals, &ends, &starts, &indices, &mixed, &local, &owner))
        return NULL;
    const Py_ssize_t item = (Py_ssize_t)sizeof(int64_t), slots = first.len / item;
    window_t made = {key.buf, first.buf, sizes.buf, deals.buf, ends.buf, key.len / item,
                     slots ? deals.len / item / slots : 0, slot_domain, window_domain, 0, 0, 0, 0, mixed, local.buf,
                     owner.buf};
    int fine = key.len % item == 0 && first.len % item == 0 && sizes.len == first.len && local.len % item == 0 &&
               owner.len == local.len && deals.len == ends.len && starts.len == first.len && indices.len % item == 0 &&
               0 <= w && w <= stop &&
               (slots ? made.window >= 1 && deals.len == slots * made.window * item && stop <= slots + made.window - 1
                      : local.len == 0); /* a stream of no slots: windows of no samples */
    for (Py_ssize_t i = 0; fine && i < made.length; i++)
        fine = made.key[i] >= 0;
    int64_t largest = 0, most = 0, total = 0;
    fine = fine && (!slots || window_counts(&made, slots, w, stop, &largest, &most, &total) == 0) &&
           total == local.len / item;
    int64_t *scratch = fine ? PyMem_RawMalloc((size_t)(3 * largest + most + 1) * sizeof(int64_t)) : NULL;
    if (scratch != NULL) {
        PyThreadState *saved = total >= FREE_FROM ? PyEval_SaveThread() : NULL;
        int64_t *local_at = made.local, *owner_at = made.owner;
        for (int64_t v = w; fine && slots && v < stop; v++) {
            made.w = v;
            made.low = v - made.window + 1 > 0 ? v - made.window + 1 : 0;
            made.last = v < (int64_t)slots - 1 ? v : (int64_t)slots - 1;
            made.count = 0;
            for (int64_t j = made.low; j <= made.last; j++)
                made.count += made.deals[j * made.window + v - j];
            made.local = local_at;
            made.owner = owner_at;
            fine = make_window(&made, scratch) == 0;
            local_at += made.count;
            owner_at += made.count;
        }
        fine = fine && store_indices(local.buf, owner.buf, total, starts.buf, indices.buf, indices.len / item) == 0;
        if (saved != NULL)
            PyEval_RestoreThread(saved);
        PyMem_RawFree(scratch);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&first);
    PyBuffer_Release(&sizes);
    PyBuffer_Release(&deals);
    PyBuffer_Release(&ends);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&indices);
    PyBuffer_Release(&local);
    PyBuffer_Release(&owner);
    if (fine && scratch == NULL)
        return PyErr_NoMemory();
    if (!fine) {
        PyErr_SetString(PyExc_ValueError, "need an int64 key of a few numbers of 0 or more, int64 first, sizes and "
                                          "starts (slots), int64 deals and ends (slots, window) whose deals fit the "
                                          "slots, int64 indices holding every sample asked, 0 <= w <= stop <= slots + "
                                          "window - 1, int64 samples and owner as long as the windows w .. stop - 1 "
                                          "together");
        return NULL;
    }
    Py_RETURN_NONE;
}
#endif

static PyMethodDef methods[] = {
    {"integers", py_integers, METH_VARARGS,
     "integers(capsule, high, out)\n--\n\nFill the int64 buffer out as Generator.integers(0, high, size=len) would."},
    {"uniform", py_uniform, METH_VARARGS,
     "uniform(capsule, out)\n--\n\nFill the float64 buffer out as Generator.random(len) would."},
    {"resized_crop_boxes", py_resized_crop_boxes, METH_VARARGS,
     "resized_crop_boxes(capsule, sizes, scale, ratio, out)\n--\n\nFill the int64 (n, 4) buffer out with the "
     "boxes\nrandom_resized_crop_box draws, in order, for the int64 (n, 2) picture sizes."},
#ifdef OUTCORE_PCG64
    {"crops_and_flips", py_crops_and_flips, METH_VARARGS,
     "crops_and_flips(keys, domain, counts, highs, window, pad, flip, boxes, flips)\n--\n\nEach piece's windows "
     "(tops and lefts,\nintegers(0, high), less pad, of the window's size) into the float64 boxes, then its mirrors "
     "(uniform < p,\nfor the axes of flip's bit mask) into the uint8 flips, from the generator of its key in domain."},
    {"permutation", py_permutation, METH_VARARGS,
     "permutation(key, domain, out)\n--\n\nFill the int64 buffer out with the order Generator.permutation(len) gives, "
     "from the\ngenerator of the int64 key in domain."},
    {"resized_crops_and_flips", py_resized_crops_and_flips, METH_VARARGS,
     "resized_crops_and_flips(keys, domain, counts, sizes, scale, ratio, flip, boxes, flips)\n--\n\nEach piece's "
     "RandomResizedCrop\nboxes of its pictures' sizes into the float64 boxes, then its mirrors, as crops_and_flips."},
    {"scale_jitters_and_flips", py_scale_jitters_and_flips, METH_VARARGS,
     "scale_jitters_and_flips(keys, domain, counts, sizes, scale, size, flip, boxes, flips)\n--\n\nEach piece's "
     "ScaleJitter\nwindows of the output size in its pictures' pixels into the float64 boxes, then its mirrors, as\n"
     "crops_and_flips."},
    {"window", py_window, METH_VARARGS,
     "window(key, slot_domain, window_domain, w, stop, first, sizes, deals, ends, starts, indices, mixed, samples, "
     "owner)\n--\n\nStreamPlan's windows w .. stop - 1, back to back: their samples' indices in the store and their "
     "slots\ninto the int64 samples and owner, made as outcore.iterate.stream makes them."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_draws", "numpy Generator draws, in C.", -1, methods};

PyMODINIT_FUNC PyInit__draws(void) { return PyModule_Create(&module); }
