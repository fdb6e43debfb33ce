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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>

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

static PyMethodDef methods[] = {
    {"integers", py_integers, METH_VARARGS,
     "integers(capsule, high, out)\n--\n\nFill the int64 buffer out as Generator.integers(0, high, size=len) would."},
    {"uniform", py_uniform, METH_VARARGS,
     "uniform(capsule, out)\n--\n\nFill the float64 buffer out as Generator.random(len) would."},
    {"resized_crop_boxes", py_resized_crop_boxes, METH_VARARGS,
     "resized_crop_boxes(capsule, sizes, scale, ratio, out)\n--\n\nFill the int64 (n, 4) buffer out with the "
     "boxes\nrandom_resized_crop_box draws, in order, for the int64 (n, 2) picture sizes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_draws", "numpy Generator draws, in C.", -1, methods};

PyMODINIT_FUNC PyInit__draws(void) { return PyModule_Create(&module); }
