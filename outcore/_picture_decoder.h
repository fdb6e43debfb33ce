/* PictureDecoder: the decoding and resizing of outcore.imaging._jpeg, lent to another extension (outcore.storage._chunks's batch
 * engine) through a capsule, `_jpeg.picture_decoder`, so that threads with no Python decode what decode_each decodes:
 * the same pixels, by the same code, without linking libjpeg twice.
 *
 * Each function is called without the GIL, from any thread; a state is one thread's at a time. */
#ifndef OUTCORE_PICTURE_DECODER_H
#define OUTCORE_PICTURE_DECODER_H

#include <stddef.h>
#include <stdint.h>

#define PICTURE_DECODER_CAPSULE "outcore.imaging._jpeg.picture_decoder"

typedef struct {
    /* A thread's decoding state, kept from file to file (NULL: no memory). */
    void *(*open)(void);
    void (*close)(void *state);
    /* The file `data` decoded into `out` (`height` x `width` x `channels` uint8, rows back to back) where decode_each
     * decodes it straight into its row (a plain JPEG of that size, upright or turned by its EXIF, or a plain PNG): 1;
     * else 0 (another file, a damaged one: left to the caller, which says what is wrong). */
    int (*decode)(void *state, const uint8_t *data, size_t size, uint8_t *out, int height, int width, int channels);
    /* Box `box` (top, left, height, width in its pixels) of the file `data`, a picture of file_height x file_width,
     * resized into `out` (`height` x `width` x `channels` uint8) and mirrored (left-right, top-bottom) as crop_each
     * cuts it: 1; else 0, as decode. */
    int (*crop)(void *state, const uint8_t *data, size_t size, int file_height, int file_width, const double *box,
                int flip_x, int flip_y, uint8_t *out, int height, int width, int channels);
    /* Box `box` of `picture` (height x width x channels samples of `kind`: 'B', 'H', 'h', 'f' or 'd', as a struct
     * format says them; 8-bit ones of 1 or 3 channels) resized into `out` (out_height x out_width of them) and
     * mirrored as resize_each resizes it, zeros past the picture's edges: 1; else 0, as decode. No state. */
    int (*resize)(const uint8_t *picture, int height, int width, int channels, int kind, const double *box, int flip_x,
                  int flip_y, uint8_t *out, int out_height, int out_width);
} PictureDecoder;

#endif
