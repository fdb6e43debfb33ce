/* outcore.seeds._draws: the numbers numpy's Generator.integers(0, high, size=n) and Generator.random(n) draw, in one
 * C call each, without the argument handling that makes each of numpy's calls cost more than its draws for the
 * few numbers a transform draws per piece of a batch (a crop's tops and lefts, a flip's mirrors).
 *
 * integers(capsule, high, out): out[i] = Lemire's bounded draw in [0, high) from the bit generator's 32-bit
 * outputs, high - 1 below 2**32 - 1, as numpy's random_bounded_uint64_fill draws int64 numbers (buffered_bounded_
 * lemire_uint32); uniform(capsule, out): out[i] = the generator's next double, as random_standard_uniform_fill.
 * `capsule` is the generator's bit_generator.capsule; out is a C-contiguous int64 or float64 buffer. The same
 * numbers and the same state after, for any generator: tests/test_seeds.py compares them with numpy's. Without
 * this extension outcore.seeds asks numpy itself.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

static PyMethodDef methods[] = {
    {"integers", py_integers, METH_VARARGS,
     "integers(capsule, high, out)\n--\n\nFill the int64 buffer out as Generator.integers(0, high, size=len) would."},
    {"uniform", py_uniform, METH_VARARGS,
     "uniform(capsule, out)\n--\n\nFill the float64 buffer out as Generator.random(len) would."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_draws", "numpy Generator draws, in C.", -1, methods};

PyMODINIT_FUNC PyInit__draws(void) { return PyModule_Create(&module); }
