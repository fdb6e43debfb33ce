/* Engine: a run of plain batches (stored fields' rows copied out of their chunks; a picture field's windows of whole
 * pixels cut and mirrored, or its boxes resized, at most; an encoded field's files decoded, or their boxes) made start
 * to end on C threads of its own, none of them ever holding the GIL (outcore.iterate.native_run).
 *
 * Made by Python for a run: the slots it reads (each one chunk of every field, read as `read_one` reads one: its file,
 * offset, bytes, whether a Blosc frame, and the stamp of the file's version whose index gave them), the run's rows in
 * batch order (each row's slot and its sample in that slot's chunk), each batch's bounds in them, the highest slot each
 * batch or one before it reads (`reach`) and the slots each reads (each once); where pictures are cut, their geometry
 * (`picture`: with a sample kind where the boxes are resized) and each row's box and mirrors; where an encoded field's
 * files are decoded (`decoded`), its pictures' size (or each row's, `sizes`, for pictures of their own sizes, whose
 * boxes are resized), each slot's first byte in the field's array (`starts`: its ranges count from there), its chunk
 * read as a field's and its ranges' chunk as one more part after the batch's fields; where files are decoded or boxes
 * resized, the decoder outcore.imaging._jpeg lends (`decoder`, a PictureDecoder capsule); the buffers Python lends it
 * for slots (kept by the iterator from run to run). Everything the threads will index is checked then. Its threads
 * read slots in order, up to `read_ahead` slots past those the batches allowed ahead need, and copy each batch's rows
 * (or cut its windows: `copy_window`, _window_copy.h; or resize its boxes, or decode its files or their boxes, a
 * decoding state a thread) into the arrays Python `give`s it (one a field, in batch order, at most `window` batches
 * ahead of the one taken), a whole batch a task. A slot's buffer goes back to the free list once every batch reading
 * it is made: as many are held as the schedule's reads ahead hold. Every read and batch is a turn of the process's
 * engines' threads (`engine_turns`): as many at work at once as Python says (`set_engine_turns`: the pool's gauge's
 * limit, fed the batches' clocks, `engine_clocks`), however many engines run (the next epoch's, started ahead; two
 * loaders').
 *
 * `take(timeout, spares)` waits (the GIL released, counted so) for the next batch in order, woken when that batch is
 * made (a condition of its own: not by every read): the arrays given for it once it is made (and, with `spares`, the
 * next batch not given yet is given a set of arrays of them that nothing else refers to: no Python a batch), None when
 * it is not within timeout seconds or the engine is being closed, or the slot (an int) whose read was not vouched for
 * (the file cannot be read, is damaged, or is not of the version indexed): the caller makes that batch and the rest its
 * own way, which names what is wrong. `undone` then says which of its rows the decoder or the resize left (a file of
 * another kind, a damaged one; a box within rounding of its picture's edges): Python makes them, or names what is
 * wrong. `close()` stops the threads, waits for them (and for a thread in `take`) and frees what the run held.
 *
 * The threads' CPU time counts as time outside the GIL (_free_time.h; `engine_seconds` says how much of it was
 * theirs). A forked child inherits an engine without its threads: it is left as it is there, never joined nor freed.
 *
 * Included by _chunks.c after read_one. */
#ifndef OUTCORE_BATCH_ENGINE_H
#define OUTCORE_BATCH_ENGINE_H

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../_picture_decoder.h"
#include "../_table_lookup.h"
#include "../_window_copy.h"

enum { SLOT_UNREAD, SLOT_READING, SLOT_READ, SLOT_FAILED };
#define WINDOW_REACH 1073741824.0 /* how far a window's corner may lie from its picture's: an int's, and more */
enum { BATCH_WAITING, BATCH_MAKING, BATCH_MADE, BATCH_FAILED };
#define ASK_WIDTH 4 /* per slot and field: the file's number, offset, bytes, Blosc */
#define STAMP_WIDTH 3 /* per file: inode, mtime_ns, size */

typedef struct Engine Engine;

typedef struct {
    Engine *engine;
    uint8_t *scratch; /* the thread's, for Blosc frames */
    void *decoding;   /* the thread's PictureDecoder state, where pictures are decoded (opened at its first) */
    uint8_t *row;     /* a picture cut, before its pixels are looked up in the table (where there is one) */
} Worker;

struct Engine {
    PyObject_HEAD
    /* fixed at making */
    int fields, thread_count;     /* fields: the parts of a slot read (the batch's fields, then a decoded one's ranges) */
    int outputs;                  /* the batch's fields: all the parts but a decoded field's ranges */
    Py_ssize_t slots, batches;
    Py_ssize_t *row_bytes;        /* fields: a sample's bytes in its chunk */
    int picture;                  /* the field whose pictures are cut (a window each, mirrored or not), or -1 */
    Py_ssize_t height, width, pixel, cut_height, cut_width; /* its pictures', a pixel's bytes, its windows' */
    int channels, kind;           /* where its boxes are resized (kind: their samples' struct letter), else kind 0 */
    uint8_t *table;               /* where its uint8 pixels are normalized: the 256 values' results, table_k columns
                                   * of table_item bytes (outcore.transforms.Normalize's), else NULL */
    Py_ssize_t table_k, table_item, out_pixel; /* out_pixel: a pixel's bytes in the batch (a cut one's, looked up) */
    int decoded;                  /* the field whose files are decoded (its ranges the last part), or -1 */
    int decoded_height, decoded_width, decoded_channels;
    const PictureDecoder *decoder; /* lent by outcore.imaging._jpeg (whose capsule is held): decoding, resizing */
    PyObject *decoder_capsule;
    long long *starts;            /* slots: where the decoded field's chunk starts in its array (its ranges count so) */
    int *sizes;                   /* rows x 2: each row's picture's height and width, where the decoded pictures are
                                   * of their own sizes (decoded_height and decoded_width 0): 0 x 0 for one left */
    uint8_t *undone;              /* rows: those whose file the decoder left (another kind, damaged), for Python */
    Py_ssize_t *undone_count;     /* batches: their rows left */
    Py_ssize_t *field_at;         /* fields: where its chunk lies in a slot's buffer */
    Py_ssize_t slot_bytes;        /* a slot's buffer: every field's chunk */
    size_t scratch_bytes;         /* the largest read: a Blosc frame is read through a thread's scratch */
    char **paths;
    Py_ssize_t path_count;
    long long *stamps;            /* path_count x STAMP_WIDTH */
    long long *asks;              /* slots x fields x ASK_WIDTH */
    long long *bounds;            /* batches + 1, into the rows */
    int *row_slot, *row_local;    /* rows */
    long long *reach;             /* batches: the highest slot it or a batch before it reads */
    long long *used_bounds;       /* batches + 1, into used */
    long long *used;              /* each batch's slots, each once */
    long long *users;             /* slots: the batches reading it not yet made */
    Py_ssize_t read_ahead, window;
    /* the run, under lock */
    pthread_mutex_t lock;
    pthread_cond_t wake;          /* the threads': a slot read, a batch made, given or taken, or stopping */
    pthread_cond_t ready;         /* the taker's: the batch it awaits made, or stopping */
    Py_ssize_t awaited;           /* the batch a thread in `take` waits for, or -1 */
    pthread_t *threads;
    int started, stopping, closed;
    pid_t pid;
    unsigned char *slot_state, *batch_state;
    uint8_t **slot_buffer;
    uint8_t **free_buffers;       /* the buffers no slot holds: lent ones, then those made here */
    uint8_t **made_buffers;       /* those made here (malloc), when every one lent was held */
    Py_ssize_t made_count;
    Py_buffer *lent;              /* the buffers Python lent (kept from run to run: their pages faulted in once) */
    Py_ssize_t lent_count;
    Py_ssize_t free_count;
    Worker *workers;
    Py_ssize_t next_read, read_prefix, next_make, taken, given;
    long long *failed_slot;       /* batches */
    Py_buffer *outs;              /* batches x fields, given */
    PyObject **sets;              /* batches: the sequence of arrays given for each, until `take` returns it */
    int *corners;                 /* rows x 2: each row's window's top and left, where windows are cut */
    double *boxes;                /* rows x 4: each row's box (top, left, height, width), where boxes are resized */
    uint8_t *mirrors;             /* rows x 2: whether it is mirrored left-right, top-bottom */
    Py_ssize_t reads;             /* slots read (for the tests' counts) */
    Py_ssize_t held, most_held;   /* slots' buffers held now, and at most (what the next run may be lent) */
    Py_ssize_t made;              /* batches made (in any order) */
    int taking;                   /* threads in `take`: `close` waits for them */
};

static long long engine_nanoseconds = 0; /* the part of free_nanoseconds counted on the engines' threads */

static void engine_count(long long began) {
#if (defined(__GNUC__) || defined(__clang__)) && defined(CLOCK_THREAD_CPUTIME_ID)
    if (began >= 0) {
        long long spent = thread_nanoseconds() - began;
        __atomic_fetch_add(&free_nanoseconds, spent, __ATOMIC_RELAXED);
        __atomic_fetch_add(&engine_nanoseconds, spent, __ATOMIC_RELAXED);
    }
#else
    (void)began;
#endif
}

/* engine_seconds(): the CPU seconds counted (count_free) on engines' threads: outside any Python thread. */
static PyObject *py_engine_seconds(PyObject *self, PyObject *unused) {
    return PyFloat_FromDouble((double)__atomic_load_n(&engine_nanoseconds, __ATOMIC_RELAXED) / 1e9);
}

static long long engine_clock(void) {
#if (defined(__GNUC__) || defined(__clang__)) && defined(CLOCK_THREAD_CPUTIME_ID)
    return __atomic_load_n(&free_counting, __ATOMIC_RELAXED) ? thread_nanoseconds() : -1;
#else
    return -1;
#endif
}

/* The engines' threads at work at once, in all the process: at most `limit` (Python's: the pool's gauge's, no more
 * than its threads nor the CPUs; `set_engine_turns`), each taking a turn for each read or batch. The next epoch's
 * engine, started ahead while this one's last batches are made, shares its threads as the pool's tasks share the
 * pool's; so do two loaders iterated at once. The batches' CPU and wall time are summed for the gauge
 * (`engine_clocks`): a thread that waits for a core (other work on the machine) spends wall time without CPU time.
 * A forked child's count starts again at none busy (`engine_turns_forked`). */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t freed;
    int busy, limit;
    long long cpu, wall; /* nanoseconds, of the batches made since `engine_clocks` gave them */
} engine_turns = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 1, 0, 0};

static void engine_turns_forked(void) {
    pthread_mutex_init(&engine_turns.lock, NULL);
    pthread_cond_init(&engine_turns.freed, NULL);
    engine_turns.busy = 0;
    engine_turns.cpu = engine_turns.wall = 0;
}

/* A batch's clocks, read around its making: the thread's CPU time and the wall time (-1 where not read here). */
static void engine_clocks_now(long long *cpu, long long *wall) {
#if (defined(__GNUC__) || defined(__clang__)) && defined(CLOCK_THREAD_CPUTIME_ID)
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    *cpu = thread_nanoseconds();
    *wall = (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
#else
    *cpu = *wall = -1;
#endif
}

/* set_engine_turns(limit): the most engines' threads at work at once, in all the process. */
static PyObject *py_set_engine_turns(PyObject *self, PyObject *args) {
    int limit;
    if (!PyArg_ParseTuple(args, "i:set_engine_turns", &limit))
        return NULL;
    if (limit < 1) {
        PyErr_SetString(PyExc_ValueError, "set_engine_turns: the limit must be 1 or more");
        return NULL;
    }
    pthread_mutex_lock(&engine_turns.lock);
    engine_turns.limit = limit;
    pthread_cond_broadcast(&engine_turns.freed); /* more turns, maybe */
    pthread_mutex_unlock(&engine_turns.lock);
    Py_RETURN_NONE;
}

/* engine_clocks(least): (cpu, wall) seconds of the batches made since it last gave them, once their wall time sums
 * to `least` seconds or more (then counted again from none); else None. */
static PyObject *py_engine_clocks(PyObject *self, PyObject *args) {
    double least;
    if (!PyArg_ParseTuple(args, "d:engine_clocks", &least))
        return NULL;
    long long cpu = 0, wall = 0;
    pthread_mutex_lock(&engine_turns.lock);
    if (engine_turns.wall > 0 && (double)engine_turns.wall >= least * 1e9) {
        cpu = engine_turns.cpu, wall = engine_turns.wall;
        engine_turns.cpu = engine_turns.wall = 0;
    }
    pthread_mutex_unlock(&engine_turns.lock);
    if (wall == 0)
        Py_RETURN_NONE;
    return Py_BuildValue("dd", (double)cpu / 1e9, (double)wall / 1e9);
}

/* Wait for a turn (not holding e->lock): 1 once taken, 0 where the engine is stopping meanwhile (none taken). */
static int engine_turn(Engine *e) {
    pthread_mutex_lock(&engine_turns.lock);
    while (engine_turns.busy >= engine_turns.limit && !__atomic_load_n(&e->stopping, __ATOMIC_ACQUIRE))
        pthread_cond_wait(&engine_turns.freed, &engine_turns.lock);
    int taken = !__atomic_load_n(&e->stopping, __ATOMIC_ACQUIRE);
    engine_turns.busy += taken;
    pthread_mutex_unlock(&engine_turns.lock);
    return taken;
}

/* A turn over: a batch's, with the CPU and wall nanoseconds it took (a read's: 0, 0, not gauged). */
static void engine_turn_over(long long cpu, long long wall) {
    pthread_mutex_lock(&engine_turns.lock);
    engine_turns.busy--;
    if (cpu >= 0 && wall > 0) {
        engine_turns.cpu += cpu;
        engine_turns.wall += wall;
    }
    pthread_cond_signal(&engine_turns.freed);
    pthread_mutex_unlock(&engine_turns.lock);
}

/* The bytes of part f of a slot's buffer: its field's chunk. */
static Py_ssize_t engine_part_bytes(const Engine *e, int f) {
    return (f + 1 < e->fields ? e->field_at[f + 1] : e->slot_bytes) - e->field_at[f];
}

/* Slot s's chunks read into `buffer`, each vouched for by its file's stamp: 1 when all were. */
static int engine_read(Engine *e, Py_ssize_t s, uint8_t *buffer, uint8_t *scratch) {
    for (int f = 0; f < e->fields; f++) {
        const long long *ask = e->asks + (s * e->fields + f) * ASK_WIDTH;
        const long long *stamp = e->stamps + ask[0] * STAMP_WIDTH;
        struct stat opened;
        Py_ssize_t chunk_bytes = engine_part_bytes(e, f);
        if (!read_one(e->paths[ask[0]], (off_t)ask[1], (size_t)ask[2], scratch, buffer + e->field_at[f],
                      (size_t)chunk_bytes, (int)ask[3], &opened))
            return 0;
        if ((unsigned long long)opened.st_ino != (unsigned long long)stamp[0] || mtime_ns(&opened) != stamp[1] ||
            (long long)opened.st_size != stamp[2])
            return 0;
    }
    return 1;
}

/* Row r's box in its picture (top, left, height, width): its window's, or the box resized. */
static void engine_box(const Engine *e, long long r, double *box) {
    if (e->kind) {
        memcpy(box, e->boxes + r * 4, 4 * sizeof(double));
        return;
    }
    box[0] = e->corners[r * 2], box[1] = e->corners[r * 2 + 1], box[2] = (double)e->cut_height;
    box[3] = (double)e->cut_width;
}

/* A picture cut (`row`, uint8) through the table into `out`: Normalize's floats. */
static void engine_look_up(const Engine *e, const uint8_t *row, uint8_t *out) {
    lookup_all(row, e->cut_height * e->cut_width * e->channels, e->table, e->table_k, e->table_item, out);
}

/* Batch b's encoded pictures decoded into out (the batch's array of them) by the decoder outcore.imaging._jpeg lends,
 * each row's file found in its slot's chunk by its range (where they are cut, only each row's window decoded, mirrored
 * as asked: crop_each's cut); the rows it leaves (another kind of file, a damaged one, no memory) marked undone, for
 * Python to decode or to name. */
static void engine_decode(Engine *e, Py_ssize_t b, uint8_t *out, Worker *worker) {
    if (worker->decoding == NULL)
        worker->decoding = e->decoder->open();
    const int cut = e->picture == e->decoded;
    const Py_ssize_t size = cut ? e->cut_height * e->cut_width * e->out_pixel : e->row_bytes[e->decoded];
    const Py_ssize_t region = engine_part_bytes(e, e->decoded);
    long long low = e->bounds[b], high = e->bounds[b + 1];
    Py_ssize_t undone = 0;
    for (long long r = low; r < high; r++) {
        int slot = e->row_slot[r];
        const uint8_t *buffer = e->slot_buffer[slot];
        int64_t range[2]; /* the ranges' chunk follows the region's, of any length: read unaligned */
        memcpy(range, buffer + e->field_at[e->fields - 1] + (size_t)e->row_local[r] * sizeof range, sizeof range);
        long long start = range[0] - e->starts[slot], stop = range[1] - e->starts[slot];
        const uint8_t *file = buffer + e->field_at[e->decoded] + start;
        uint8_t *row = cut && e->table != NULL ? worker->row : out + (r - low) * size; /* looked up into out */
        int fine = worker->decoding != NULL && start >= 0 && start < stop && stop <= region;
        if (fine && cut) {
            double box[4];
            engine_box(e, r, box);
            const int height = e->sizes != NULL ? e->sizes[r * 2] : e->decoded_height; /* the file's picture's */
            const int width = e->sizes != NULL ? e->sizes[r * 2 + 1] : e->decoded_width;
            fine = e->decoder->crop(worker->decoding, file, (size_t)(stop - start), height, width, box,
                                    e->mirrors[r * 2], e->mirrors[r * 2 + 1], row, (int)e->cut_height,
                                    (int)e->cut_width, e->decoded_channels);
        } else if (fine) {
            fine = e->decoder->decode(worker->decoding, file, (size_t)(stop - start), row, e->decoded_height,
                                      e->decoded_width, e->decoded_channels);
        }
        if (fine && row == worker->row)
            engine_look_up(e, row, out + (r - low) * size);
        e->undone[r] = !fine;
        undone += !fine;
    }
    e->undone_count[b] = undone;
}

/* Batch b's pictures cut: each row's window of its picture (zeros past its edges), mirrored as asked,
 * into out (the batch's array of windows: `copy_window`, as outcore.imaging._windows cuts them); or each row's box
 * resized into it by the resizing outcore.imaging._jpeg lends (resize_each's), the rows it leaves marked undone. */
static void engine_cut(Engine *e, Py_ssize_t b, uint8_t *out, Worker *worker) {
    Py_ssize_t window = e->cut_height * e->cut_width * e->out_pixel, undone = 0;
    long long low = e->bounds[b], high = e->bounds[b + 1];
    for (long long r = low; r < high; r++) {
        long long k = r - low;
        const uint8_t *picture = e->slot_buffer[e->row_slot[r]] + e->field_at[e->picture] +
                                 (Py_ssize_t)e->row_local[r] * e->row_bytes[e->picture];
        uint8_t *row = e->table != NULL ? worker->row : out + k * window; /* looked up into out */
        int fine = 1;
        if (!e->kind)
            copy_window(picture, e->height, e->width, e->pixel, row, e->cut_height, e->cut_width, e->corners[r * 2],
                        e->corners[r * 2 + 1], e->mirrors[r * 2], e->mirrors[r * 2 + 1]);
        else
            fine = e->decoder->resize(picture, (int)e->height, (int)e->width, e->channels, e->kind, e->boxes + r * 4,
                                      e->mirrors[r * 2], e->mirrors[r * 2 + 1], row, (int)e->cut_height,
                                      (int)e->cut_width);
        if (fine && row == worker->row)
            engine_look_up(e, row, out + k * window);
        if (!e->kind)
            continue;
        e->undone[r] = !fine;
        undone += !fine;
    }
    if (e->kind)
        e->undone_count[b] = undone;
}

/* Batch b's rows copied out of its slots' chunks into its arrays (pictures cut or decoded as they are): -1, or the
 * first slot of it that failed. */
static long long engine_gather(Engine *e, Py_ssize_t b, Worker *worker) {
    for (long long k = e->used_bounds[b]; k < e->used_bounds[b + 1]; k++)
        if (e->slot_state[e->used[k]] == SLOT_FAILED) /* read before b was started: stable */
            return e->used[k];
    long long low = e->bounds[b], high = e->bounds[b + 1];
    for (int f = 0; f < e->outputs; f++) {
        uint8_t *out = e->outs[b * e->outputs + f].buf;
        Py_ssize_t size = e->row_bytes[f], at = e->field_at[f];
        if (f == e->decoded) {
            engine_decode(e, b, out, worker);
            continue;
        }
        if (f == e->picture) {
            engine_cut(e, b, out, worker);
            continue;
        }
        for (long long r = low; r < high; r++) /* past the caches: the batch is read next by another thread */
            stream_copy(out + (r - low) * size, e->slot_buffer[e->row_slot[r]] + at + (Py_ssize_t)e->row_local[r] * size,
                        (size_t)size);
    }
    stream_fence();
    return -1;
}

/* Whether batch b may be made now (holding the lock). */
static int engine_makeable(Engine *e, Py_ssize_t b) {
    return b < e->batches && b < e->given && b < e->taken + e->window && e->read_prefix > e->reach[b];
}

/* Whether slot s may be read now (holding the lock): within `read_ahead` of the batches allowed ahead. */
static int engine_readable(Engine *e, Py_ssize_t s) {
    Py_ssize_t ahead = e->taken + e->window - 1;
    if (ahead >= e->batches)
        ahead = e->batches - 1;
    return s < e->slots && s <= e->reach[ahead] + e->read_ahead;
}

static void *engine_work(void *arg) {
    Worker *worker = arg;
    Engine *e = worker->engine;
    uint8_t *scratch = worker->scratch;
#if defined(__linux__)
    pthread_setname_np(pthread_self(), "outcore-engine"); /* as top, perf and py-spy show it */
#endif
    long long began = engine_clock(); /* all its CPU time counts outside the GIL: it never holds it */
    pthread_mutex_lock(&e->lock);
    while (!e->stopping) {
        engine_count(began); /* each turn's, its waits' included (counting may have begun meanwhile) */
        began = engine_clock();
        Py_ssize_t b = e->next_make, s = e->next_read;
        if (engine_makeable(e, b)) {
            e->next_make++;
            e->batch_state[b] = BATCH_MAKING;
            pthread_mutex_unlock(&e->lock);
            if (!engine_turn(e)) { /* stopping: the batch is not made */
                pthread_mutex_lock(&e->lock);
                continue;
            }
            long long cpu, wall, cpu_after, wall_after;
            engine_clocks_now(&cpu, &wall);
            long long failed = engine_gather(e, b, worker);
            engine_clocks_now(&cpu_after, &wall_after);
            engine_turn_over(cpu < 0 ? -1 : cpu_after - cpu, wall_after - wall);
            pthread_mutex_lock(&e->lock);
            e->failed_slot[b] = failed;
            e->batch_state[b] = failed < 0 ? BATCH_MADE : BATCH_FAILED;
            e->made++;
            for (long long k = e->used_bounds[b]; k < e->used_bounds[b + 1]; k++) {
                long long slot = e->used[k];
                if (--e->users[slot] == 0) { /* no batch reads it again: its buffer for the next read */
                    e->free_buffers[e->free_count++] = e->slot_buffer[slot];
                    e->slot_buffer[slot] = NULL;
                    e->held--;
                }
            }
            if (b == e->awaited) /* the taker is woken by its batch only, not by every read */
                pthread_cond_signal(&e->ready);
            pthread_cond_broadcast(&e->wake);
        } else if (engine_readable(e, s)) {
            e->next_read++;
            uint8_t *buffer = e->free_count ? e->free_buffers[--e->free_count] : NULL;
            e->slot_state[s] = SLOT_READING;
            if (++e->held > e->most_held)
                e->most_held = e->held;
            pthread_mutex_unlock(&e->lock);
            if (buffer == NULL && (buffer = malloc((size_t)e->slot_bytes)) != NULL) {
                pthread_mutex_lock(&e->lock);
                e->made_buffers[e->made_count++] = buffer;
                pthread_mutex_unlock(&e->lock);
            }
            if (!engine_turn(e)) { /* stopping: the slot is not read */
                pthread_mutex_lock(&e->lock);
                continue;
            }
            int fine = buffer != NULL && engine_read(e, s, buffer, scratch);
            engine_turn_over(0, 0);
            pthread_mutex_lock(&e->lock);
            e->slot_buffer[s] = buffer;
            e->slot_state[s] = fine ? SLOT_READ : SLOT_FAILED;
            e->reads++;
            while (e->read_prefix < e->slots && e->slot_state[e->read_prefix] >= SLOT_READ)
                e->read_prefix++;
            pthread_cond_broadcast(&e->wake);
        } else {
            pthread_cond_wait(&e->wake, &e->lock);
        }
    }
    pthread_mutex_unlock(&e->lock);
    engine_count(began);
    return NULL;
}

/* An int64 (or, with `four`, int32) C-contiguous array's values copied into new memory: NULL with an error set when
 * it is not one, or does not hold `count` values (count < 0: any number, put in *count_out). */
static void *engine_copy(PyObject *array, int four, Py_ssize_t count, Py_ssize_t *count_out, const char *name) {
    Py_buffer view;
    if (PyObject_GetBuffer(array, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    Py_ssize_t item = four ? 4 : 8, got = view.len / item;
    void *copy = NULL;
    if (view.itemsize != item || view.format == NULL || strchr(four ? "il" : "lq", view.format[0]) == NULL ||
        (view.format[0] == 'l' && (Py_ssize_t)sizeof(long) != item) || (count >= 0 && got != count))
        PyErr_Format(PyExc_ValueError, "Engine: %s must be %s of %zd values", name, four ? "int32" : "int64", count);
    else if ((copy = PyMem_RawMalloc(view.len ? (size_t)view.len : 1)) == NULL)
        PyErr_NoMemory();
    else
        memcpy(copy, view.buf, (size_t)view.len);
    if (count_out != NULL)
        *count_out = got;
    PyBuffer_Release(&view);
    return copy;
}

static void engine_free(Engine *e) {
    for (Py_ssize_t k = 0; e->paths != NULL && k < e->path_count; k++)
        PyMem_RawFree(e->paths[k]);
    for (Py_ssize_t k = 0; e->made_buffers != NULL && k < e->made_count; k++)
        free(e->made_buffers[k]);
    for (Py_ssize_t k = 0; e->lent != NULL && k < e->lent_count; k++)
        PyBuffer_Release(&e->lent[k]);
    for (int t = 0; e->workers != NULL && t < e->thread_count; t++) {
        free(e->workers[t].scratch);
        free(e->workers[t].row);
        if (e->workers[t].decoding != NULL)
            e->decoder->close(e->workers[t].decoding);
    }
    Py_CLEAR(e->decoder_capsule);
    void *held[] = {e->paths, e->row_bytes, e->field_at, e->stamps, e->asks, e->bounds, e->row_slot, e->row_local,
                    e->reach, e->used_bounds, e->used, e->users, e->threads, e->slot_state, e->batch_state,
                    e->slot_buffer, e->free_buffers, e->made_buffers, e->lent, e->failed_slot, e->outs, e->corners,
                    e->mirrors, e->workers, e->sets, e->starts, e->undone, e->undone_count, e->boxes, e->sizes,
                    e->table};
    for (size_t k = 0; k < sizeof held / sizeof held[0]; k++)
        PyMem_RawFree(held[k]);
    e->paths = NULL, e->made_buffers = NULL, e->lent = NULL, e->workers = NULL, e->outs = NULL, e->sets = NULL;
    e->starts = NULL, e->undone = NULL, e->undone_count = NULL, e->boxes = NULL, e->sizes = NULL, e->table = NULL;
}

/* Let go of batch b's arrays given (holding the GIL): their buffers, and its sequence of them unless returned. */
static void engine_let_go(Engine *e, Py_ssize_t b) {
    for (int f = 0; f < e->outputs; f++)
        PyBuffer_Release(&e->outs[b * e->outputs + f]);
    Py_CLEAR(e->sets[b]);
}

/* Stop the threads and wait for them, then free what the run held (the arrays given and not taken let go). */
static void engine_close(Engine *e) {
    if (e->closed)
        return;
    e->closed = 1;
    if (e->started) {
        pthread_mutex_lock(&e->lock);
        __atomic_store_n(&e->stopping, 1, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&e->wake);
        pthread_cond_broadcast(&e->ready);
        pthread_mutex_unlock(&e->lock);
        pthread_mutex_lock(&engine_turns.lock); /* its threads waiting for a turn, too */
        pthread_cond_broadcast(&engine_turns.freed);
        pthread_mutex_unlock(&engine_turns.lock);
        Py_BEGIN_ALLOW_THREADS;
        for (int t = 0; t < e->started; t++)
            pthread_join(e->threads[t], NULL);
        Py_END_ALLOW_THREADS;
        while (e->taking) { /* another thread waiting in take, woken by stopping: it leaves before the lock goes */
            Py_BEGIN_ALLOW_THREADS;
            usleep(1000);
            Py_END_ALLOW_THREADS;
        }
    }
    for (Py_ssize_t b = e->taken; e->outs != NULL && e->sets != NULL && b < e->given; b++)
        engine_let_go(e, b);
    if (e->started || e->threads != NULL) {
        pthread_cond_destroy(&e->wake);
        pthread_cond_destroy(&e->ready);
        pthread_mutex_destroy(&e->lock);
    }
    engine_free(e);
}

/* Each row's window (top, left, height, width: (rows, 4) float64) and mirrors (left-right, top-bottom: (rows, 2)
 * uint8) kept as corners and mirrors (or, where boxes are resized, as they are): 0 with an error set where they cannot
 * be read, or *wrong set where a window is not of whole pixels of the windows' size. */
static int engine_windows(Engine *e, PyObject *windows, PyObject *mirrors, Py_ssize_t rows, const char **wrong) {
    Py_buffer boxes, flips;
    if (PyObject_GetBuffer(windows, &boxes, PyBUF_C_CONTIGUOUS) < 0)
        return 0;
    if (PyObject_GetBuffer(mirrors, &flips, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&boxes);
        return 0;
    }
    e->mirrors = PyMem_RawMalloc((size_t)(rows ? rows : 1) * 2);
    if (e->kind)
        e->boxes = PyMem_RawMalloc((size_t)(rows ? rows : 1) * 4 * sizeof(double));
    else
        e->corners = PyMem_RawMalloc((size_t)(rows ? rows : 1) * 2 * sizeof(int));
    int fine = (e->corners != NULL || e->boxes != NULL) && e->mirrors != NULL;
    if (!fine)
        PyErr_NoMemory();
    else if (boxes.len != rows * 4 * (Py_ssize_t)sizeof(double) || flips.len != rows * 2)
        *wrong = "the windows' or mirrors' count";
    else if (e->kind) { /* resized as resize_each resizes them: a box of no pixels, or past the edges, is its to judge */
        memcpy(e->boxes, boxes.buf, (size_t)boxes.len);
        for (Py_ssize_t k = 0; k < rows * 2; k++)
            e->mirrors[k] = ((const uint8_t *)flips.buf)[k] != 0;
    }
    for (Py_ssize_t r = 0; fine && !e->kind && *wrong == NULL && r < rows; r++) {
        const double *box = (const double *)boxes.buf + r * 4; /* past the edges too (a RandomCrop's padding): zeros */
        if (!(fabs(box[0]) <= WINDOW_REACH && fabs(box[1]) <= WINDOW_REACH && box[0] == (double)(int)box[0] &&
              box[1] == (double)(int)box[1] && box[2] == (double)e->cut_height && box[3] == (double)e->cut_width))
            *wrong = "a window (not of whole pixels at the windows' size)";
        else {
            e->corners[r * 2] = (int)box[0], e->corners[r * 2 + 1] = (int)box[1];
            e->mirrors[r * 2] = ((const uint8_t *)flips.buf)[r * 2] != 0;
            e->mirrors[r * 2 + 1] = ((const uint8_t *)flips.buf)[r * 2 + 1] != 0;
        }
    }
    PyBuffer_Release(&boxes);
    PyBuffer_Release(&flips);
    return fine;
}

/* The table the picture field's uint8 pixels are looked up in (256 rows of 1 or `channels` items of 4 or 2 bytes),
 * copied: 1, or 0 with an error set. */
static int engine_table(Engine *e, PyObject *table) {
    Py_buffer view;
    if (PyObject_GetBuffer(table, &view, PyBUF_C_CONTIGUOUS) < 0)
        return 0;
    const Py_ssize_t channels = e->kind ? e->channels : e->pixel; /* uint8 pictures: a pixel's bytes, its channels */
    e->table_item = view.itemsize;
    e->table_k = view.itemsize ? view.len / (256 * view.itemsize) : 0;
    int fine = e->picture >= 0 && (e->kind == 0 || e->kind == 'B') && (view.itemsize == 4 || view.itemsize == 2) &&
               channels >= 1 && (e->table_k == 1 || e->table_k == channels) &&
               view.len == 256 * e->table_k * view.itemsize;
    if (!fine)
        PyErr_SetString(PyExc_ValueError, "Engine: a table of 256 rows of 1 or the channels' items of 4 or 2 bytes, "
                                          "for the uint8 pictures cut");
    else if ((e->table = PyMem_RawMalloc((size_t)view.len)) == NULL)
        fine = PyErr_NoMemory() != NULL;
    else {
        memcpy(e->table, view.buf, (size_t)view.len);
        e->channels = (int)channels;
        e->out_pixel = channels * view.itemsize;
    }
    PyBuffer_Release(&view);
    return fine;
}

static int engine_init(Engine *e, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"paths", "stamps", "asks", "row_bytes", "chunk_bytes", "bounds", "row_slot", "row_local",
                            "reach", "used_bounds", "used", "threads", "read_ahead", "window", "lent", "picture",
                            "windows", "mirrors", "decoded", "starts", "decoder", "sizes", "table", NULL};
    PyObject *paths, *stamps, *asks, *row_bytes, *chunk_bytes, *bounds, *row_slot, *row_local, *reach, *used_bounds,
        *used, *lent, *picture = Py_None, *windows = Py_None, *mirrors = Py_None, *decoded = Py_None, *starts = Py_None,
             *decoder = Py_None, *sizes = Py_None, *table = Py_None;
    int threads;
    Py_ssize_t read_ahead, window, rows, used_count, fields;
    if (e->threads != NULL || e->closed) {
        PyErr_SetString(PyExc_RuntimeError, "Engine: made once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOOOOOOOOOinnO!|OOOOOOOO:Engine", names, &PyList_Type, &paths,
                                     &stamps, &asks, &row_bytes, &chunk_bytes, &bounds, &row_slot, &row_local, &reach,
                                     &used_bounds, &used, &threads, &read_ahead, &window, &PyList_Type, &lent,
                                     &picture, &windows, &mirrors, &decoded, &starts, &decoder, &sizes, &table))
        return -1;
    if (threads < 1 || read_ahead < 0 || window < 1) {
        PyErr_SetString(PyExc_ValueError, "Engine: threads and window must be 1 or more, read_ahead 0 or more");
        return -1;
    }
    e->pid = getpid();
    e->picture = -1;
    if (picture != Py_None &&
        !PyArg_ParseTuple(picture, "innnnn|ii:picture", &e->picture, &e->height, &e->width, &e->pixel, &e->cut_height,
                          &e->cut_width, &e->channels, &e->kind))
        return -1;
    e->decoded = -1;
    if (decoded != Py_None && !PyArg_ParseTuple(decoded, "iiii:decoded", &e->decoded, &e->decoded_height,
                                                &e->decoded_width, &e->decoded_channels))
        return -1;
    if (decoder != Py_None) {
        if ((e->decoder = PyCapsule_GetPointer(decoder, PICTURE_DECODER_CAPSULE)) == NULL)
            return -1;
        Py_INCREF(decoder);
        e->decoder_capsule = decoder;
    }
    if ((e->decoded >= 0 || e->kind) && e->decoder == NULL) {
        PyErr_SetString(PyExc_ValueError, "Engine: pictures decoded or resized need the decoder _jpeg lends");
        return -1;
    }
    e->out_pixel = e->pixel;
    if (table != Py_None && !engine_table(e, table))
        return -1;
    e->path_count = PyList_GET_SIZE(paths);
    long long *chunk_sizes = NULL;
    if ((e->row_bytes = engine_copy(row_bytes, 0, -1, &fields, "row_bytes")) == NULL ||
        (chunk_sizes = engine_copy(chunk_bytes, 0, fields, NULL, "chunk_bytes")) == NULL ||
        (e->stamps = engine_copy(stamps, 0, e->path_count * STAMP_WIDTH, NULL, "stamps")) == NULL)
        goto failed;
    e->fields = (int)fields;
    e->outputs = e->fields - (e->decoded >= 0);
    Py_ssize_t asked;
    if (fields < 1 || (e->asks = engine_copy(asks, 0, -1, &asked, "asks")) == NULL ||
        asked % (fields * ASK_WIDTH) != 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "Engine: asks must be (slots, fields, 4) int64, fields 1 or more");
        goto failed;
    }
    e->slots = asked / (fields * ASK_WIDTH);
    if ((e->bounds = engine_copy(bounds, 0, -1, &e->batches, "bounds")) == NULL)
        goto failed;
    e->batches -= 1;
    if (e->decoded >= 0 && (e->starts = engine_copy(starts, 0, e->slots, NULL, "starts")) == NULL)
        goto failed;
    if (e->batches < 1 || (e->row_slot = engine_copy(row_slot, 1, -1, &rows, "row_slot")) == NULL ||
        (e->row_local = engine_copy(row_local, 1, rows, NULL, "row_local")) == NULL ||
        (e->reach = engine_copy(reach, 0, e->batches, NULL, "reach")) == NULL ||
        (e->used_bounds = engine_copy(used_bounds, 0, e->batches + 1, NULL, "used_bounds")) == NULL ||
        (e->used = engine_copy(used, 0, -1, &used_count, "used")) == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "Engine: a run of 1 batch or more");
        goto failed;
    }
    /* Everything the threads will index is checked here: a wrong plan is an error, never a read out of bounds. */
    const char *wrong = NULL;
    e->field_at = PyMem_RawMalloc((size_t)fields * sizeof(Py_ssize_t));
    e->slot_bytes = 0;
    /* Pictures of their own sizes (0 x 0: each row's in `sizes`) are files decoded, their boxes resized. */
    const int own_sizes = e->decoded >= 0 && e->decoded_height == 0 && e->decoded_width == 0;
    if (e->picture >= fields ||
        (e->picture >= 0 &&
         (e->pixel < 1 || e->cut_height < 1 || e->cut_width < 1 || e->height < 0 || e->width < 0 ||
          e->row_bytes[e->picture] != (own_sizes && e->picture == e->decoded ? e->cut_height * e->cut_width
                                                                             : e->height * e->width) * e->pixel ||
          (e->kind && (e->channels < 1 || e->pixel % e->channels || !strchr("BHhfd", e->kind))))))
        wrong = "the pictures cut";
    if (e->decoded >= 0 &&
        (e->decoded >= e->outputs || (!own_sizes && (e->decoded_height < 1 || e->decoded_width < 1)) ||
         (e->decoded_channels != 1 && e->decoded_channels != 3) ||
         (!own_sizes && e->row_bytes[e->decoded] != (Py_ssize_t)e->decoded_height * e->decoded_width *
                                                        e->decoded_channels) ||
         e->row_bytes[e->fields - 1] != 2 * (Py_ssize_t)sizeof(int64_t) ||
         (e->kind && e->decoded != e->picture) ||                        /* one field's rows left undone */
         (own_sizes && (e->decoded != e->picture || !e->kind)) ||          /* each picture's box resized */
         (e->decoded == e->picture && (e->height != e->decoded_height || e->width != e->decoded_width ||
                                       e->pixel != e->decoded_channels))))
        wrong = "the pictures decoded";
    if (own_sizes != (sizes != Py_None))
        wrong = wrong ? wrong : "the pictures' sizes (given for decoded pictures of their own sizes only)";
    else if (own_sizes && (e->sizes = engine_copy(sizes, 1, rows * 2, NULL, "sizes")) == NULL)
        goto failed;
    for (Py_ssize_t k = 0; e->sizes != NULL && k < rows * 2 && wrong == NULL; k++)
        if (e->sizes[k] < 0)
            wrong = "a picture's size";
    for (Py_ssize_t f = 0; e->field_at != NULL && f < fields; f++) {
        if (e->row_bytes[f] < 1 || (f != e->decoded && chunk_sizes[f] < e->row_bytes[f])) /* a region: any bytes */
            wrong = "a field's row or chunk bytes";
        e->field_at[f] = e->slot_bytes;
        e->slot_bytes += (Py_ssize_t)chunk_sizes[f];
    }
    for (Py_ssize_t k = 0; k < e->slots * fields && wrong == NULL; k++) {
        const long long *ask = e->asks + k * ASK_WIDTH;
        if (ask[0] < 0 || ask[0] >= e->path_count || ask[1] < 0 || ask[2] < 4)
            wrong = "a slot's read";
        else if ((size_t)ask[2] > e->scratch_bytes)
            e->scratch_bytes = (size_t)ask[2];
    }
    if (e->bounds[0] != 0 || e->bounds[e->batches] != rows || e->used_bounds[0] != 0 ||
        e->used_bounds[e->batches] != used_count)
        wrong = wrong ? wrong : "the bounds";
    for (Py_ssize_t b = 0; b < e->batches && wrong == NULL; b++)
        if (e->bounds[b + 1] < e->bounds[b] || e->used_bounds[b + 1] < e->used_bounds[b] || e->reach[b] < 0 ||
            e->reach[b] >= e->slots || (b && e->reach[b] < e->reach[b - 1]))
            wrong = "a batch's bounds or reach";
    for (Py_ssize_t r = 0; r < rows && wrong == NULL; r++) {
        int slot = e->row_slot[r], local = e->row_local[r];
        if (slot < 0 || slot >= e->slots || local < 0)
            wrong = "a row's slot or sample";
        for (Py_ssize_t f = 0; f < fields && wrong == NULL; f++)
            if (f != e->decoded && ((long long)local + 1) * e->row_bytes[f] > chunk_sizes[f]) /* a region: any bytes */
                wrong = "a row's sample (past its chunk)";
    }
    e->users = PyMem_RawCalloc((size_t)e->slots, sizeof(long long));
    for (Py_ssize_t k = 0; e->users != NULL && k < used_count && wrong == NULL; k++) {
        if (e->used[k] < 0 || e->used[k] >= e->slots)
            wrong = "a batch's slots";
        else
            e->users[e->used[k]]++;
    }
    for (Py_ssize_t b = 0; b < e->batches && wrong == NULL; b++) /* each row's slot among its batch's, up to its reach */
        for (long long r = e->bounds[b]; r < e->bounds[b + 1] && wrong == NULL; r++)
            if (e->row_slot[r] > e->reach[b])
                wrong = "a row's slot past its batch's reach";
    PyMem_RawFree(chunk_sizes);
    chunk_sizes = NULL;
    if (wrong == NULL && e->picture >= 0 && !engine_windows(e, windows, mirrors, rows, &wrong))
        goto failed;
    if (wrong != NULL) {
        PyErr_Format(PyExc_ValueError, "Engine: %s out of range", wrong);
        goto failed;
    }
    e->paths = PyMem_RawCalloc((size_t)(e->path_count ? e->path_count : 1), sizeof(char *));
    for (Py_ssize_t k = 0; e->paths != NULL && k < e->path_count; k++) {
        PyObject *path = PyList_GET_ITEM(paths, k);
        if (!PyBytes_Check(path)) {
            PyErr_SetString(PyExc_TypeError, "Engine: paths must be a list of bytes");
            goto failed;
        }
        Py_ssize_t size = PyBytes_GET_SIZE(path);
        if ((e->paths[k] = PyMem_RawMalloc((size_t)size + 1)) == NULL)
            break;
        memcpy(e->paths[k], PyBytes_AS_STRING(path), (size_t)size + 1);
    }
    e->thread_count = threads, e->read_ahead = read_ahead, e->window = window;
    e->threads = PyMem_RawCalloc((size_t)threads, sizeof(pthread_t));
    e->workers = PyMem_RawCalloc((size_t)threads, sizeof(Worker));
    e->slot_state = PyMem_RawCalloc((size_t)e->slots, 1);
    e->batch_state = PyMem_RawCalloc((size_t)e->batches, 1);
    e->slot_buffer = PyMem_RawCalloc((size_t)e->slots, sizeof(uint8_t *));
    e->lent_count = PyList_GET_SIZE(lent);
    e->free_buffers = PyMem_RawCalloc((size_t)(e->slots + e->lent_count), sizeof(uint8_t *));
    e->made_buffers = PyMem_RawCalloc((size_t)e->slots, sizeof(uint8_t *));
    e->lent = PyMem_RawCalloc((size_t)(e->lent_count ? e->lent_count : 1), sizeof(Py_buffer));
    e->failed_slot = PyMem_RawCalloc((size_t)e->batches, sizeof(long long));
    e->outs = PyMem_RawCalloc((size_t)(e->batches * e->outputs), sizeof(Py_buffer));
    e->sets = PyMem_RawCalloc((size_t)(e->batches ? e->batches : 1), sizeof(PyObject *));
    e->undone = PyMem_RawCalloc((size_t)(rows ? rows : 1), 1);
    e->undone_count = PyMem_RawCalloc((size_t)e->batches, sizeof(Py_ssize_t));
    int made = e->paths && e->threads && e->workers && e->slot_state && e->batch_state && e->slot_buffer &&
               e->free_buffers && e->made_buffers && e->lent && e->failed_slot && e->outs && e->sets && e->users &&
               e->field_at && e->undone && e->undone_count;
    for (Py_ssize_t k = 0; made && k < e->path_count; k++)
        made = e->paths[k] != NULL;
    for (int t = 0; made && t < threads; t++) {
        e->workers[t].engine = e;
        made = (e->workers[t].scratch = malloc(e->scratch_bytes)) != NULL &&
               (e->table == NULL ||
                (e->workers[t].row = malloc((size_t)(e->cut_height * e->cut_width * e->channels))) != NULL);
    }
    if (!made) {
        PyErr_NoMemory();
        goto failed;
    }
    for (Py_ssize_t k = 0; k < e->lent_count; k++) { /* lent_count counts those held, released at the end */
        Py_buffer *view = &e->lent[k];
        if (PyObject_GetBuffer(PyList_GET_ITEM(lent, k), view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            e->lent_count = k;
            goto failed;
        }
        if (view->len < e->slot_bytes) {
            PyErr_Format(PyExc_ValueError, "Engine: a lent buffer holds %zd bytes, fewer than a slot's %zd", view->len,
                         e->slot_bytes);
            e->lent_count = k + 1;
            goto failed;
        }
        e->free_buffers[e->free_count++] = view->buf;
    }
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->wake, NULL);
    pthread_cond_init(&e->ready, NULL);
    e->awaited = -1;
    int started = 0;
    Py_BEGIN_ALLOW_THREADS; /* a thread's start is a system call or two: no other thread waits for the GIL meanwhile */
    while (started < threads && pthread_create(&e->threads[started], NULL, engine_work, &e->workers[started]) == 0)
        started++;
    Py_END_ALLOW_THREADS;
    e->started = started;
    if (e->started == 0) {
        PyErr_SetString(PyExc_RuntimeError, "Engine: no thread could be started");
        engine_close(e);
        return -1;
    }
    return 0;
failed:
    PyMem_RawFree(chunk_sizes);
    engine_free(e);
    e->closed = 1;
    return -1;
}

/* The next batch's arrays `sequence` (a list or tuple, one a field) given to make it into (holding the GIL): 1, or 0
 * where `quiet` and they do not fit it (nothing kept), or -1 with an error set. */
static int engine_give_set(Engine *e, PyObject *sequence, int quiet) {
    Py_ssize_t b = e->given;
    Py_ssize_t rows = (Py_ssize_t)(e->bounds[b + 1] - e->bounds[b]);
    int f = 0;
    for (; f < e->outputs; f++) {
        Py_buffer *out = &e->outs[b * e->outputs + f];
        Py_ssize_t wanted = rows * (f == e->picture ? e->cut_height * e->cut_width * e->out_pixel : e->row_bytes[f]);
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(sequence, f), out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            if (quiet)
                PyErr_Clear();
            break;
        }
        if (out->len != wanted) {
            if (!quiet)
                PyErr_Format(PyExc_ValueError, "give: batch %zd's array of field %d holds %zd bytes, not %zd", b, f,
                             out->len, wanted);
            PyBuffer_Release(out);
            break;
        }
    }
    if (f < e->outputs) {
        while (f-- > 0)
            PyBuffer_Release(&e->outs[b * e->outputs + f]);
        return quiet ? 0 : -1;
    }
    Py_INCREF(sequence);
    e->sets[b] = sequence;
    pthread_mutex_lock(&e->lock);
    e->given++;
    pthread_cond_broadcast(&e->wake);
    pthread_mutex_unlock(&e->lock);
    return 1;
}

static PyObject *engine_give(Engine *e, PyObject *arrays) {
    if (e->closed || e->given >= e->batches) {
        PyErr_SetString(PyExc_ValueError, e->closed ? "give: the engine was closed" : "give: every batch's arrays were given");
        return NULL;
    }
    PyObject *sequence = PySequence_Fast(arrays, "give: a sequence of one array a field");
    if (sequence == NULL)
        return NULL;
    int given = -1;
    if (PySequence_Fast_GET_SIZE(sequence) != e->outputs)
        PyErr_SetString(PyExc_ValueError, "give: one array a field");
    else
        given = engine_give_set(e, sequence, 0);
    Py_DECREF(sequence);
    if (given < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* A tuple of `spares` (a list) that nothing but the list refers to, nor to any of its arrays, given for the next
 * batch where its arrays fit it (holding the GIL throughout: no other thread gives it meanwhile): whether one was.
 * None is written while anything else refers to it (a batch held, a view of it). */
static int engine_give_spare(Engine *e, PyObject *spares) {
    for (Py_ssize_t k = PyList_GET_SIZE(spares) - 1; k >= 0 && e->given < e->batches && !e->closed; k--) {
        PyObject *set = PyList_GET_ITEM(spares, k);
        if (!PyTuple_CheckExact(set) || Py_REFCNT(set) != 1 || PyTuple_GET_SIZE(set) != e->outputs)
            continue;
        int free = 1;
        for (int f = 0; f < e->outputs && free; f++)
            free = Py_REFCNT(PyTuple_GET_ITEM(set, f)) == 1;
        if (free && engine_give_set(e, set, 1))
            return 1;
    }
    return 0;
}

static PyObject *engine_give_spare_method(Engine *e, PyObject *spares) {
    if (!PyList_Check(spares)) {
        PyErr_SetString(PyExc_TypeError, "give_spare: spares must be a list of tuples of arrays");
        return NULL;
    }
    return PyBool_FromLong(engine_give_spare(e, spares));
}

static PyObject *engine_take(Engine *e, PyObject *args) {
    double timeout;
    PyObject *spares = Py_None;
    if (!PyArg_ParseTuple(args, "d|O:take", &timeout, &spares))
        return NULL;
    if (spares != Py_None && !PyList_Check(spares)) {
        PyErr_SetString(PyExc_TypeError, "take: spares must be a list of tuples of arrays, or None");
        return NULL;
    }
    Py_ssize_t b = e->taken;
    if (e->closed || b >= e->given) {
        PyErr_SetString(PyExc_ValueError, e->closed ? "take: the engine was closed" : "take: its arrays were not given");
        return NULL;
    }
    int state;
    e->taking++;
    FREE_BEGIN; /* its CPU time (the wait's wake-up) is outside the GIL */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long long nanoseconds = until.tv_nsec + (long long)(timeout * 1e9);
    until.tv_sec += (time_t)(nanoseconds / 1000000000LL);
    until.tv_nsec = (long)(nanoseconds % 1000000000LL);
    pthread_mutex_lock(&e->lock);
    e->awaited = b;
    while (e->batch_state[b] < BATCH_MADE && !e->stopping && pthread_cond_timedwait(&e->ready, &e->lock, &until) == 0) {
    }
    e->awaited = -1;
    state = e->batch_state[b];
    if (state == BATCH_MADE) {
        e->taken++;
        pthread_cond_broadcast(&e->wake);
    }
    pthread_mutex_unlock(&e->lock);
    FREE_END;
    e->taking--;
    if (state == BATCH_FAILED)
        return PyLong_FromLongLong(e->failed_slot[b]);
    if (state != BATCH_MADE)
        Py_RETURN_NONE;
    PyObject *made = e->sets[b];
    e->sets[b] = NULL;
    engine_let_go(e, b);
    if (spares != Py_None)
        engine_give_spare(e, spares);
    return made;
}

static PyObject *engine_close_method(Engine *e, PyObject *unused) {
    engine_close(e);
    Py_RETURN_NONE;
}

/* A count kept under the lock (read as it is once the threads are stopped). */
static PyObject *engine_count_of(Engine *e, const Py_ssize_t *count) {
    if (e->closed || !e->started)
        return PyLong_FromSsize_t(*count);
    pthread_mutex_lock(&e->lock);
    Py_ssize_t value = *count;
    pthread_mutex_unlock(&e->lock);
    return PyLong_FromSsize_t(value);
}

static PyObject *engine_reads(Engine *e, void *unused) { return engine_count_of(e, &e->reads); }

static PyObject *engine_most_held(Engine *e, void *unused) { return engine_count_of(e, &e->most_held); }

static PyObject *engine_made(Engine *e, void *unused) { return engine_count_of(e, &e->made); }

/* The rows of the batch last taken whose files the engine's decoder left (positions in the batch, a list), for Python
 * to decode or to name; None where it left none. Read once the batch is taken: made before, under the lock. */
static PyObject *engine_undone(Engine *e, void *unused) {
    Py_ssize_t b = e->taken - 1;
    if (e->closed || b < 0 || e->undone_count == NULL || e->undone_count[b] == 0)
        Py_RETURN_NONE;
    PyObject *left = PyList_New(0);
    for (long long r = e->bounds[b]; left != NULL && r < e->bounds[b + 1]; r++) {
        if (!e->undone[r])
            continue;
        PyObject *position = PyLong_FromLongLong(r - e->bounds[b]);
        if (position == NULL || PyList_Append(left, position) < 0)
            Py_CLEAR(left);
        Py_XDECREF(position);
    }
    return left;
}

/* Changed only by threads holding the GIL (give, take): read without the lock. */
static PyObject *engine_given(Engine *e, void *unused) { return PyLong_FromSsize_t(e->given); }

static void engine_dealloc(Engine *e) {
    if (e->pid == getpid())
        engine_close(e); /* a forked child's copy has no threads to stop: left as it is */
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyMethodDef engine_methods[] = {
    {"give", (PyCFunction)engine_give, METH_O,
     "give(arrays)\n--\n\nThe next batch's arrays, one a field (writable, C-contiguous, its rows' bytes; the windows' "
     "where\npictures are cut), to make it into."},
    {"give_spare", (PyCFunction)engine_give_spare_method, METH_O,
     "give_spare(spares)\n--\n\nGive the next batch a tuple of `spares` (a list of tuples of arrays, one a field) that\n"
     "nothing else refers to, nor to its arrays, where one fits it: whether one did."},
    {"take", (PyCFunction)engine_take, METH_VARARGS,
     "take(timeout, spares=None)\n--\n\nWait (the GIL released) for the next batch: the sequence of arrays given for it\n"
     "once made into them, None when not within timeout seconds, or the slot (an int) whose read was not vouched\n"
     "for. With `spares` (a list of tuples of arrays, one a field), the next batch not given yet is given a tuple\n"
     "of it that nothing else refers to, nor to its arrays, where one fits it (`given` says whether one did)."},
    {"close", (PyCFunction)engine_close_method, METH_NOARGS,
     "close()\n--\n\nStop the threads, wait for them and free what the run held."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef engine_getset[] = {
    {"reads", (getter)engine_reads, NULL, "Slots read so far.", NULL},
    {"most_held", (getter)engine_most_held, NULL, "The most slots' buffers held at once so far.", NULL},
    {"made", (getter)engine_made, NULL, "The batches made so far (taken or not).", NULL},
    {"given", (getter)engine_given, NULL, "The batches whose arrays were given so far.", NULL},
    {"undone", (getter)engine_undone, NULL,
     "The positions in the batch last taken of the rows whose files the decoder left, or None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "outcore.storage._chunks.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Engine(paths, stamps, asks, row_bytes, chunk_bytes, bounds, row_slot, row_local, reach, used_bounds, "
              "used, threads, read_ahead, window, lent, picture=None, windows=None, mirrors=None, decoded=None, "
              "starts=None, decoder=None, sizes=None, table=None)\n--\n\nA run of plain batches made on C threads (_batch_engine.h).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)engine_init,
    .tp_dealloc = (destructor)engine_dealloc,
    .tp_methods = engine_methods,
    .tp_getset = engine_getset,
};

#endif
