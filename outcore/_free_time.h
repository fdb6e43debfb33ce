/* The CPU time threads spend in an extension's calls with the GIL released, counted while asked: each of
 * outcore's extensions that includes this keeps its own count, and outcore.measure.gil_free_clock sums them.
 * Each thread's own CPU clock is read, so time spent waiting for a core, or asleep in a read, is not counted:
 * the count is the work done outside the GIL, whatever else runs on the machine.
 *
 * FREE_BEGIN and FREE_END replace Py_BEGIN_ALLOW_THREADS and Py_END_ALLOW_THREADS (two clock reads a call when
 * counting, a flag read otherwise); FREE_METHOD is the module's count_free(on) method and its thread_free(), the
 * calling thread's part of the count. Where the compiler or the
 * system lacks what this needs (GCC's atomics, a thread CPU clock), nothing is counted and count_free returns
 * None. */
#ifndef OUTCORE_FREE_TIME_H
#define OUTCORE_FREE_TIME_H

#include <Python.h>
#include <time.h>

#if (defined(__GNUC__) || defined(__clang__)) && defined(CLOCK_THREAD_CPUTIME_ID)

static int free_counting = 0;       /* read and written with relaxed atomics */
static long long free_nanoseconds = 0;
static __thread long long thread_free_nanoseconds = 0; /* the part of it counted on each thread */

static long long thread_nanoseconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

#define FREE_BEGIN                                                                                                     \
    Py_BEGIN_ALLOW_THREADS long long free_began_ =                                                                     \
        __atomic_load_n(&free_counting, __ATOMIC_RELAXED) ? thread_nanoseconds() : -1;
#define FREE_END                                                                                                       \
    if (free_began_ >= 0) {                                                                                            \
        long long free_spent_ = thread_nanoseconds() - free_began_;                                                    \
        __atomic_fetch_add(&free_nanoseconds, free_spent_, __ATOMIC_RELAXED);                                          \
        thread_free_nanoseconds += free_spent_;                                                                        \
    }                                                                                                                  \
    Py_END_ALLOW_THREADS

static PyObject *py_count_free(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p:count_free", &on))
        return NULL;
    __atomic_store_n(&free_counting, on, __ATOMIC_RELAXED);
    return PyFloat_FromDouble((double)__atomic_load_n(&free_nanoseconds, __ATOMIC_RELAXED) / 1e9);
}

static PyObject *py_thread_free(PyObject *self, PyObject *unused) {
    return PyFloat_FromDouble((double)thread_free_nanoseconds / 1e9);
}

#else

#define FREE_BEGIN Py_BEGIN_ALLOW_THREADS
#define FREE_END Py_END_ALLOW_THREADS

static PyObject *py_count_free(PyObject *self, PyObject *args) {
    int on;
    if (!PyArg_ParseTuple(args, "p:count_free", &on))
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_thread_free(PyObject *self, PyObject *unused) { Py_RETURN_NONE; }

#endif

/* Two entries of a method table. */
#define FREE_METHOD                                                                                                    \
    {"count_free", py_count_free, METH_VARARGS,                                                                        \
     "count_free(on)\n--\n\nCount the CPU time this extension's calls spend with the GIL released from now on (or\n"  \
     "stop): the seconds counted so far, or None where they cannot be counted."},                                     \
    {"thread_free", py_thread_free, METH_NOARGS,                                                                       \
     "thread_free()\n--\n\nThe part of count_free's seconds counted on the calling thread, or None where nothing is\n" \
     "counted."}

#endif
