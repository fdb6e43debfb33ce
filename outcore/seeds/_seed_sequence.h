/* The state numpy's SeedSequence gives a PCG64 generator, generate_state(4, numpy.uint64): the seed_seq_fe hash of
 * Melissa O'Neill that numpy documents and keeps (NEP 19), word for word. `words` holds the entropy's 32-bit words
 * (each number's, lowest first; 0 is one word), filled out with zeros to POOL words when fewer, then the spawn key's:
 * `spawn_words` sets that out from a key's numbers and a domain. Included by _state.c (the state alone) and
 * _draws.c (a batch's generators made and drawn from in one call). */
#ifndef OUTCORE_SEED_SEQUENCE_H
#define OUTCORE_SEED_SEQUENCE_H

#include <stdint.h>

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

/* A number's 32-bit words, lowest first (0 is one word), appended to `words`: 0, or -1 when they do not fit. */
static int append_number(uint64_t value, uint32_t *words, int *count) {
    do {
        if (*count >= MAX_WORDS + POOL + 2)
            return -1;
        words[(*count)++] = (uint32_t)value;
        value >>= 32;
    } while (value);
    return 0;
}

/* The entropy's `count` words filled out to POOL (a spawn key follows them), then the domain's: 0, or -1. */
static int spawn_words(uint32_t *words, int *count, uint64_t domain) {
    while (*count < POOL)
        words[(*count)++] = 0;
    return append_number(domain, words, count);
}

/* The 4 64-bit words of the state of `count` words (entropy, then spawn key, `spawn_words`). */
static void seed_state(const uint32_t *words, int count, uint64_t state[POOL]) {
    uint32_t pool[POOL], hash = INIT_A;
    for (int i = 0; i < POOL; i++)
        pool[i] = hashmix(i < count ? words[i] : 0, &hash);
    for (int source = 0; source < POOL; source++)
        for (int target = 0; target < POOL; target++)
            if (source != target)
                pool[target] = mix(pool[target], hashmix(pool[source], &hash));
    for (int source = POOL; source < count; source++)
        for (int target = 0; target < POOL; target++)
            pool[target] = mix(pool[target], hashmix(words[source], &hash));
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
}

#endif
