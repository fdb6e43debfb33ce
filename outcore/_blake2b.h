/* BLAKE2b (RFC 7693) of a whole buffer, unkeyed, of 1 to 64 bytes: the digest hashlib.blake2b(data,
 * digest_size=n).digest() gives, computed where the GIL is released (the ingest's survey digests each file it
 * reads and checks in C). Written from the RFC's description; tests compare it with hashlib's for every length
 * around the 128-byte blocks. */
#ifndef OUTCORE_BLAKE2B_H
#define OUTCORE_BLAKE2B_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static const uint64_t blake2b_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

static const uint8_t blake2b_sigma[12][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4}, {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13}, {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11}, {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5}, {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
};

static inline uint64_t blake2b_rotate(uint64_t word, int bits) { return (word >> bits) | (word << (64 - bits)); }

static inline uint64_t blake2b_load(const uint8_t *bytes) { /* little-endian */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t word;
    memcpy(&word, bytes, 8);
    return word;
#else
    uint64_t word = 0;
    for (int i = 7; i >= 0; i--)
        word = word << 8 | bytes[i];
    return word;
#endif
}

#define BLAKE2B_MIX(a, b, c, d, x, y)                                                                                  \
    do {                                                                                                               \
        v[a] = v[a] + v[b] + (x);                                                                                      \
        v[d] = blake2b_rotate(v[d] ^ v[a], 32);                                                                        \
        v[c] = v[c] + v[d];                                                                                            \
        v[b] = blake2b_rotate(v[b] ^ v[c], 24);                                                                        \
        v[a] = v[a] + v[b] + (y);                                                                                      \
        v[d] = blake2b_rotate(v[d] ^ v[a], 16);                                                                        \
        v[c] = v[c] + v[d];                                                                                            \
        v[b] = blake2b_rotate(v[b] ^ v[c], 63);                                                                        \
    } while (0)

#define BLAKE2B_ROUND(r)                                                                                               \
    do {                                                                                                               \
        BLAKE2B_MIX(0, 4, 8, 12, m[blake2b_sigma[r][0]], m[blake2b_sigma[r][1]]);                                      \
        BLAKE2B_MIX(1, 5, 9, 13, m[blake2b_sigma[r][2]], m[blake2b_sigma[r][3]]);                                      \
        BLAKE2B_MIX(2, 6, 10, 14, m[blake2b_sigma[r][4]], m[blake2b_sigma[r][5]]);                                     \
        BLAKE2B_MIX(3, 7, 11, 15, m[blake2b_sigma[r][6]], m[blake2b_sigma[r][7]]);                                     \
        BLAKE2B_MIX(0, 5, 10, 15, m[blake2b_sigma[r][8]], m[blake2b_sigma[r][9]]);                                     \
        BLAKE2B_MIX(1, 6, 11, 12, m[blake2b_sigma[r][10]], m[blake2b_sigma[r][11]]);                                   \
        BLAKE2B_MIX(2, 7, 8, 13, m[blake2b_sigma[r][12]], m[blake2b_sigma[r][13]]);                                    \
        BLAKE2B_MIX(3, 4, 9, 14, m[blake2b_sigma[r][14]], m[blake2b_sigma[r][15]]);                                    \
    } while (0)

/* Compress one 128-byte block into the state h; `counted` bytes hashed so far, this block's included. */
static void blake2b_compress(uint64_t h[8], const uint8_t block[128], uint64_t counted, int last) {
    uint64_t v[16], m[16];
    for (int i = 0; i < 16; i++)
        m[i] = blake2b_load(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = blake2b_iv[i];
    }
    v[12] ^= counted; /* the counter's high word stays 0: under 2^64 bytes */
    if (last)
        v[14] = ~v[14];
    /* each round written out: its message words' positions are then constants, and the words stay in registers */
    BLAKE2B_ROUND(0);
    BLAKE2B_ROUND(1);
    BLAKE2B_ROUND(2);
    BLAKE2B_ROUND(3);
    BLAKE2B_ROUND(4);
    BLAKE2B_ROUND(5);
    BLAKE2B_ROUND(6);
    BLAKE2B_ROUND(7);
    BLAKE2B_ROUND(8);
    BLAKE2B_ROUND(9);
    BLAKE2B_ROUND(10);
    BLAKE2B_ROUND(11);
    for (int i = 0; i < 8; i++)
        h[i] ^= v[i] ^ v[i + 8];
}

/* The `digest_size`-byte (1 to 64) BLAKE2b digest of data[0:size] into `digest`. */
static void blake2b(const uint8_t *data, size_t size, uint8_t *digest, int digest_size) {
    uint64_t h[8];
    memcpy(h, blake2b_iv, sizeof h);
    h[0] ^= 0x01010000ULL ^ (uint64_t)digest_size; /* depth 1, fanout 1, no key */
    size_t done = 0;
    for (; size - done > 128; done += 128) /* every block but the last, which may be whole */
        blake2b_compress(h, data + done, done + 128, 0);
    uint8_t last[128] = {0};
    if (size > done)
        memcpy(last, data + done, size - done);
    blake2b_compress(h, last, size, 1);
    for (int i = 0; i < digest_size; i++)
        digest[i] = (uint8_t)(h[i / 8] >> (8 * (i % 8)));
}

#endif
