/* outcore.seeds._state: the state numpy's SeedSequence(entropy, spawn_key=(domain,)).generate_state(4, numpy.uint64)
 * gives, for entropy of whole numbers below 2**64, without its Python (11 us a generator, 0.3 here): the
 * seed_seq_fe hash of Melissa O'Neill that numpy documents and keeps (NEP 19), word for word. outcore.seeds
 * makes every generator of a batch and of the epoch's plan from it; tests/test_seeds.py checks the same
 * words as numpy's for many keys. Without this extension, outcore.seeds asks numpy (the same numbers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "_seed_sequence.h"

/* A whole number's 32-bit words appended to `words`: 0, or -1 with an exception. */
static int append_words(PyObject *number, uint32_t *words, int *count) {
    unsigned long long value = PyLong_AsUnsignedLongLong(number);
    if (value == (unsigned long long)-1 && PyErr_Occurred())
        return -1; /* negative, too large, or not a whole number: the caller asks numpy */
    if (*count >= MAX_WORDS || append_number(value, words, count) < 0) {
        PyErr_SetString(PyExc_OverflowError, "too many words of entropy");
        return -1;
    }
    return 0;
}

static PyObject *py_state(PyObject *self, PyObject *args) {
    PyObject *entropy;
    unsigned long domain;
    if (!PyArg_ParseTuple(args, "Ok:state", &entropy, &domain))
        return NULL;
    PyObject *sequence = PySequence_Fast(entropy, "entropy must be a sequence of whole numbers");
    if (sequence == NULL)
        return NULL;
    uint32_t words[MAX_WORDS + POOL + 2];
    int count = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(sequence); i++) {
        if (append_words(PySequence_Fast_GET_ITEM(sequence, i), words, &count) < 0) {
            Py_DECREF(sequence);
            return NULL;
        }
    }
    Py_DECREF(sequence);
    if (spawn_words(words, &count, domain) < 0) {
        PyErr_SetString(PyExc_OverflowError, "too many words of entropy");
        return NULL;
    }
    uint64_t state[POOL];
    seed_state(words, count, state);
    return PyBytes_FromStringAndSize((const char *)state, sizeof(state));
}

static PyMethodDef methods[] = {
    {"state", py_state, METH_VARARGS,
     "state(entropy, domain)\n--\n\n"
     "The bytes of numpy.random.SeedSequence(entropy, spawn_key=(domain,)).generate_state(4, numpy.uint64), in this\n"
     "machine's byte order, for entropy of whole numbers in [0, 2**64); OverflowError for others."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_state", "numpy's SeedSequence state, in C.", -1, methods};

PyMODINIT_FUNC PyInit__state(void) { return PyModule_Create(&module); }
