/* Plain PNGs decoded in C, for _jpeg.c's decode_each, crop_each, check_each and check_files (built with zlib:
 * OUTCORE_PNG).
 *
 * A plain PNG is one decode.py's decode_image gives as Pillow decodes it, pixel for pixel, with nothing but its
 * pixels to apply: 8 bits a sample, RGB (colour type 2) for 3 channels or greyscale (type 0) for 1, not interlaced,
 * with no orientation (no eXIf chunk) and no animation (no acTL: Pillow may show a frame other than the IDAT's). Its
 * IDAT chunks' zlib stream is inflated and each row's filter undone (None, Sub, Up, Average, Paeth) straight into
 * the caller's rows. Any other file, and any the decoder finds damaged, is left to the caller (decode_image words
 * the error): a chunk before the first IDAT whose CRC is wrong (Pillow refuses those), a zlib stream that ends or
 * breaks before the last row, a row of an unknown filter. As in Pillow, IDATs' CRCs are not checked, and what
 * follows the last row is not read.
 */

#include <limits.h>
#include <zlib.h>

#define PNG_LARGEST ((size_t)1 << 31) /* the most bytes of pixels a survey's check decodes: more are left to Pillow */

static const uint8_t PNG_SIGNATURE[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

/* Whether `data` begins as a PNG file does. */
static int png_file(const uint8_t *data, size_t size) {
    return size >= 8 && memcmp(data, PNG_SIGNATURE, 8) == 0;
}

static uint32_t big_endian32(const uint8_t *at) {
    return (uint32_t)at[0] << 24 | (uint32_t)at[1] << 16 | (uint32_t)at[2] << 8 | at[3];
}

/* What decoding PNGs into a batch's rows keeps from file to file: a zlib stream, the filtered rows' buffer, and a
 * picture's pixels where a box of it is cut (crop_each). */
typedef struct {
    z_stream stream;
    int ready;         /* inflateInit was called */
    uint8_t *filtered; /* a picture's rows as inflated, each its filter's byte first */
    size_t capacity;
    uint8_t *pixels; /* png_pixels */
    size_t pixels_capacity;
} PngDecoder;

static void png_decoder_free(PngDecoder *png) {
    if (png->ready)
        inflateEnd(&png->stream);
    free(png->filtered);
    free(png->pixels);
    memset(png, 0, sizeof(*png));
}

/* A buffer of `bytes` for a picture's pixels, kept from file to file (NULL: no memory). */
static uint8_t *png_pixels(PngDecoder *png, size_t bytes) {
    if (bytes > png->pixels_capacity) {
        free(png->pixels);
        png->pixels = malloc(bytes);
        png->pixels_capacity = png->pixels ? bytes : 0;
    }
    return png->pixels;
}

/* The Paeth predictor of a byte from its left (a), upper (b) and upper-left (c) neighbours. */
static inline uint8_t paeth(uint8_t a, uint8_t b, uint8_t c) {
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/* One row's filter undone: `row` (`bytes` long, `depth` bytes a pixel) from its filtered bytes and the row above
 * (`above`, NULL for the first: zeros); 0 for an unknown filter. */
static int png_unfilter(int filter, const uint8_t *filtered, const uint8_t *above, size_t bytes, int depth,
                        uint8_t *row) {
    switch (filter) {
    case 0:
        memcpy(row, filtered, bytes);
        return 1;
    case 1:
        for (size_t k = 0; k < bytes; k++)
            row[k] = (uint8_t)(filtered[k] + (k >= (size_t)depth ? row[k - depth] : 0));
        return 1;
    case 2:
        for (size_t k = 0; k < bytes; k++)
            row[k] = (uint8_t)(filtered[k] + (above ? above[k] : 0));
        return 1;
    case 3:
        for (size_t k = 0; k < bytes; k++) {
            int left = k >= (size_t)depth ? row[k - depth] : 0, up = above ? above[k] : 0;
            row[k] = (uint8_t)(filtered[k] + ((left + up) >> 1));
        }
        return 1;
    case 4:
        for (size_t k = 0; k < bytes; k++) {
            uint8_t left = k >= (size_t)depth ? row[k - depth] : 0, up = above ? above[k] : 0;
            uint8_t corner = above && k >= (size_t)depth ? above[k - depth] : 0;
            row[k] = (uint8_t)(filtered[k] + paeth(left, up, corner));
        }
        return 1;
    default:
        return 0;
    }
}

/* Decode `data` into `height` rows of `width` x `channels` bytes, each `stride` bytes after the one before, if it
 * is a plain PNG of that size (above): 1, else 0 (left to the caller). */
static int png_decode(PngDecoder *png, const uint8_t *data, size_t size, int channels, int height, int width,
                      uint8_t *out, size_t stride) {
    if (!png_file(data, size) || (channels != 1 && channels != 3) || height <= 0 || width <= 0)
        return 0;
    const size_t bytes = (size_t)width * channels, filtered_bytes = (bytes + 1) * (size_t)height;
    if (filtered_bytes > png->capacity) {
        free(png->filtered);
        png->filtered = malloc(filtered_bytes);
        png->capacity = png->filtered ? filtered_bytes : 0;
        if (png->filtered == NULL)
            return 0;
    }
    if (!png->ready) {
        if (inflateInit(&png->stream) != Z_OK)
            return 0;
        png->ready = 1;
    } else if (inflateReset(&png->stream) != Z_OK) {
        return 0;
    }
    z_stream *stream = &png->stream;
    stream->next_out = png->filtered;
    stream->avail_out = (uInt)filtered_bytes;
    size_t at = 8;
    int chunks = 0, in_idat = 0, inflated = 0;
    while (!inflated) {
        if (size - at < 12)
            return 0; /* truncated */
        const uint32_t length = big_endian32(data + at);
        const uint8_t *type = data + at + 4, *body = data + at + 8;
        if (length > size - at - 12)
            return 0;
        if (chunks++ == 0) { /* IHDR first: of this size, 8-bit RGB or grey, deflate, plain filters, no interlace */
            if (memcmp(type, "IHDR", 4) != 0 || length != 13 || big_endian32(body) != (uint32_t)width ||
                big_endian32(body + 4) != (uint32_t)height || body[8] != 8 || body[9] != (channels == 3 ? 2 : 0) ||
                body[10] != 0 || body[11] != 0 || body[12] != 0)
                return 0;
        }
        if (memcmp(type, "IDAT", 4) == 0) {
            in_idat = 1;
            stream->next_in = (Bytef *)body;
            stream->avail_in = length;
            while (stream->avail_in > 0 && stream->avail_out > 0) {
                int status = inflate(stream, Z_NO_FLUSH);
                if (status == Z_STREAM_END)
                    break;
                if (status != Z_OK)
                    return 0; /* damaged */
            }
            inflated = stream->avail_out == 0;
        } else {
            if (in_idat || memcmp(type, "IEND", 4) == 0)
                return 0; /* the IDATs ended, or none came, before the last row */
            if (memcmp(type, "eXIf", 4) == 0 || memcmp(type, "acTL", 4) == 0)
                return 0; /* an orientation, or an animation */
            if ((uint32_t)crc32(crc32(0L, type, 4), body, length) != big_endian32(body + length))
                return 0; /* Pillow refuses a chunk before the IDATs whose CRC is wrong */
        }
        at += 12 + (size_t)length;
    }
    for (size_t more = at; size - more >= 12;) { /* an orientation after the pixels: Pillow may read it; leave it */
        const uint32_t length = big_endian32(data + more);
        if (memcmp(data + more + 4, "eXIf", 4) == 0 || memcmp(data + more + 4, "acTL", 4) == 0)
            return 0;
        if (memcmp(data + more + 4, "IEND", 4) == 0 || length > size - more - 12)
            break;
        more += 12 + (size_t)length;
    }
    for (int y = 0; y < height; y++) /* every row's filter known before a row is written */
        if (png->filtered[(bytes + 1) * (size_t)y] > 4)
            return 0;
    for (int y = 0; y < height; y++) {
        const uint8_t *line = png->filtered + (bytes + 1) * (size_t)y;
        uint8_t *row = out + stride * (size_t)y;
        if (!png_unfilter(line[0], line + 1, y > 0 ? row - stride : NULL, bytes, channels, row))
            return 0;
    }
    return 1;
}

/* The survey's check of a file (check_each, check_files): 1 with its height and width in `shape` where it is a plain
 * PNG (png_decode) of `channels`, of at most max_pixels pixels and max_side pixels a side (none: negative), decoded
 * whole, as decode.py's decoded_size decodes it, to find it sound; else 0 (left to the caller). */
static int png_check(PngDecoder *png, const uint8_t *data, size_t size, int channels, long long max_pixels,
                     long long max_side, int64_t *shape) {
    if (!png_file(data, size) || size < 24 || memcmp(data + 12, "IHDR", 4) != 0)
        return 0;
    const long long width = big_endian32(data + 16), height = big_endian32(data + 20);
    if (width < 1 || height < 1 || width > INT_MAX || height > INT_MAX ||
        (size_t)(width * height) > PNG_LARGEST / (size_t)channels ||
        (max_pixels >= 0 && width * height > max_pixels) || (max_side >= 0 && (width > max_side || height > max_side)))
        return 0;
    uint8_t *pixels = png_pixels(png, (size_t)(width * height) * channels);
    if (pixels == NULL ||
        !png_decode(png, data, size, channels, (int)height, (int)width, pixels, (size_t)width * channels))
        return 0;
    shape[0] = height;
    shape[1] = width;
    return 1;
}
