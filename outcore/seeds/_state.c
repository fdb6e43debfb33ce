/* outcore.seeds._state: the state numpy's SeedSequence(entropy, spawn_key=(domain,)).generate_state(4, numpy.uint64)
 * gives, for entropy of whole numbers below 2**64, without its Python (11 us a generator, 0.3 here): the
 * seed_seq_fe hash of Melissa O'Neill that numpy documents and keeps (NEP 19), word for word. outcore.seeds
 * makes every generator of a batch and of the epoch's plan from it; tests/test_seeds.py checks the same
 * words as numpy's for many keys. Without this extension, outcore.seeds asks numpy (the same numbers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#define POOL 4
#define MAX_WORDS 64 /* entropy words one call takes: keys of a few counters need far fewer */
#define INIT_A 0x43b0d7e5u
#define MULT_A 0x931e8875u
#define INIT_B 0x8b51f9ddu
#define MULT_B 0x58f38dedu
#define MIX_MULT_L 0xca01f9ddu
#define MIX_MULT_R 0x4973f715u

static uint32_t hashmix(uint32_t value, uint32_t *hash) {
    value ^= *hash;
    *hash *= MULT_A;
    value *= *hash;
    return value ^ (value >> 16);
}

static uint32_t mix(uint32_t x, uint32_t y) {
    uint32_t result = MIX_MULT_L * x - MIX_MULT_R * y;
    return result ^ (result >> 16);
}

/* A whole number's 32-bit words, lowest first (0 is one word), appended to `words`: 0, or -1 with an exception. */
static int append_words(PyObject *number, uint32_t *words, Py_ssize_t *count) {
    unsigned long long value = PyLong_AsUnsignedLongLong(number);
    if (value == (unsigned long long)-1 && PyErr_Occurred())
        return -1; /* negative, too large, or not a whole number: the caller asks numpy */
    do {
        if (*count >= MAX_WORDS) {
            PyErr_SetString(PyExc_OverflowError, "too many words of entropy");
            return -1;
        }
        words[(*count)++] = (uint32_t)value;
        value >>= 32;
    } while (value);
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
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(sequence); i++) {
        if (append_words(PySequence_Fast_GET_ITEM(sequence, i), words, &count) < 0) {
            Py_DECREF(sequence);
            return NULL;
        }
    }
    Py_DECREF(sequence);
    while (count < POOL) /* a spawn key follows: the run entropy is filled out to the pool's size */
        words[count++] = 0;
    PyObject *key = PyLong_FromUnsignedLong(domain);
    int failed = key == NULL || append_words(key, words, &count) < 0;
    Py_XDECREF(key);
    if (failed)
        return NULL;
    uint32_t pool[POOL], hash = INIT_A;
    for (int i = 0; i < POOL; i++)
        pool[i] = hashmix(i < count ? words[i] : 0, &hash);
    for (int source = 0; source < POOL; source++)
        for (int target = 0; target < POOL; target++)
            if (source != target)
                pool[target] = mix(pool[target], hashmix(pool[source], &hash));
    for (Py_ssize_t source = POOL; source < count; source++)
        for (int target = 0; target < POOL; target++)
            pool[target] = mix(pool[target], hashmix(words[source], &hash));
    uint64_t state[POOL];
    uint32_t hash_b = INIT_B;
    for (int i = 0; i < 2 * POOL; i++) { /* 8 words, read as 4 little-endian 64-bit ones */
        uint32_t value = pool[i % POOL] ^ hash_b;
        hash_b *= MULT_B;
        value *= hash_b;
        value ^= value >> 16;
        if (i % 2)
            state[i / 2] |= (uint64_t)value << 32;
        else
            state[i / 2] = value;
    }
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
