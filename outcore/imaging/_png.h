/* Plain PNGs decoded in C, for _jpeg.c's decode_each, crop_each, check_each and check_files (built with zlib:
 * OUTCORE_PNG).
 *
 * A plain PNG is one decode.py's decode_image gives as Pillow decodes it, pixel for pixel, with nothing but its
 * pixels to apply (png_kind says which): interlaced or not, with no orientation (no eXIf chunk, nor a text chunk keyed
 * "exif", which Pillow takes for one) and no animation (no acTL: Pillow may show a frame other than the IDAT's), asked
 * for as Pillow converts it:
 * - greyscale (colour type 0) of 1 to 16 bits, RGB (2), grey and alpha (4) or RGBA (6) of 8 or 16: 3 channels of RGB
 *   or RGBA, or of grey (each repeated), 1 of grey, 4 of RGBA; alpha dropped where it is not asked for, 16-bit samples
 *   cut to their high byte (Pillow's RGB and RGBA modes), grey of 1, 2 or 4 bits scaled to 0-255 (its modes 1 and L),
 *   except 16-bit greyscale, which Pillow keeps in 16 bits (mode I;16): its 1 channel given as it is into uint16 rows
 *   (PNG_WIDE), or into uint8 rows as decode.py's _convert_depth rounds it;
 * - a palette (colour type 3) of 1 to 8 bits: its colours, 3 channels, or 4 with the palette's transparency (tRNS) as
 *   alpha; a file with an index past its palette is left (Pillow's versions colour those differently);
 * - label maps' ids (PNG_IDS): a palette's indices, a grey file's values as Pillow gives them.
 * Its IDAT chunks' zlib stream is inflated and each row's filter undone (None, Sub, Up, Average, Paeth), straight into
 * the caller's rows where they are the file's. Any other file, and any the decoder finds damaged, is left to the caller
 * (decode_image words the error): a chunk before the first IDAT whose CRC is wrong (Pillow refuses those), a zlib
 * stream that ends or breaks before the last row, a row of an unknown filter. As in Pillow, IDATs' CRCs are not
 * checked, and what follows the last row is not read. */

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
    uint8_t *row; /* an interlaced file's row, converted, before its pixels go to their columns */
    size_t row_capacity;
} PngDecoder;

static void png_decoder_free(PngDecoder *png) {
    if (png->ready)
        inflateEnd(&png->stream);
    free(png->filtered);
    free(png->pixels);
    free(png->row);
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
 * (`above`, NULL for the first: zeros); 0 for an unknown filter. `row` may be `filtered` itself: each byte is read
 * before it is written. */
static int png_unfilter(int filter, const uint8_t *filtered, const uint8_t *above, size_t bytes, int depth,
                        uint8_t *row) {
    switch (filter) {
    case 0:
        if (row != filtered) /* undone in place (png_decode): nothing to do */
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

/* Whether a chunk may turn the picture or show another: an orientation (eXIf, or a text chunk keyed "exif", which
 * Pillow takes as one) or an animation (acTL). */
static int png_turns(const uint8_t *type, const uint8_t *body, uint32_t length) {
    if (memcmp(type, "eXIf", 4) == 0 || memcmp(type, "acTL", 4) == 0)
        return 1;
    const int text = memcmp(type, "tEXt", 4) == 0 || memcmp(type, "zTXt", 4) == 0 || memcmp(type, "iTXt", 4) == 0;
    return text && length >= 5 && memcmp(body, "exif", 5) == 0;
}

/* How png_decode gives a file, flags of `as` (0: uint8 pixels): into uint16 rows (Pillow's I;16, or 16-bit ids), as a
 * label map's ids, only where the file's own kind is its rows' (a paired picture: label_maps.Paired.check_kind). */
enum { PNG_WIDE = 1, PNG_IDS = 2, PNG_EXACT = 4 };

/* The samples a pixel of a PNG of colour type `type` holds (1-4), where a plain PNG of that type and `depth` bits
 * (IHDR's) gives `channels` as Pillow converts it (the header above), as `as` asks; 0 where it does not. As PNG_IDS, a
 * label map's ids as Pillow gives them (label_maps.py): a palette's indices, a grey file's values (1 bit: 0 and 1,
 * Pillow's mode 1; 2 and 4 bits scaled to 0-255, its mode L), in rows of its depth (16 bits: PNG_WIDE). With PNG_EXACT,
 * only files of the rows' own kind, as Paired.of reads it: grey of the rows' depth (1 channel), RGB or a palette's
 * colours (3), RGBA (4). */
static int png_kind(int type, int depth, int channels, int as) {
    const int wide = as & PNG_WIDE, low = depth == 1 || depth == 2 || depth == 4;
    if ((type == 0 && !low && depth != 8 && depth != 16) || (type == 3 && !low && depth != 8) ||
        ((type == 2 || type == 4 || type == 6) && depth != 8 && depth != 16))
        return 0; /* not a depth PNG allows for its colour type */
    if (as & PNG_IDS) /* 16-bit grey into uint16 rows; a palette's, or grey of 8 bits or fewer, into uint8 rows */
        return channels == 1 && (wide ? type == 0 && depth == 16 : (type == 0 || type == 3) && depth <= 8);
    if (type == 3) /* a palette's colours: RGB, or RGBA with the palette's transparency (tRNS) */
        return !wide && (channels == 3 || (channels == 4 && !(as & PNG_EXACT)));
    const int samples = type == 0 ? 1 : type == 4 ? 2 : type == 2 ? 3 : type == 6 ? 4 : 0;
    if (samples == 0)
        return 0;
    const int own = channels == 1 ? 0 : channels == 3 ? 2 : 6; /* the colour type of the rows' own kind */
    if ((as & PNG_EXACT) && (type != own || (channels == 1 && !wide && depth == 16)))
        return 0;
    if (wide) /* Pillow's I;16, as it is */
        return type == 0 && depth == 16 && channels == 1 ? samples : 0;
    switch (channels) {
    case 1: /* grey, alpha dropped (16-bit grey and alpha is RGBA to Pillow: left) */
        return type == 0 || (type == 4 && depth == 8) ? samples : 0;
    case 3: /* RGB, alpha dropped; grey of 8 bits or fewer repeated */
        return samples >= 3 || depth <= 8 ? samples : 0;
    case 4:
        return type == 6 ? samples : 0;
    default:
        return 0;
    }
}

/* The value of pixel `x` of a row of one sample of `depth` bits (1, 2, 4 or 8) a pixel, packed from the high bits. */
static inline int png_value(const uint8_t *line, int x, int depth) {
    if (depth == 8)
        return line[x];
    const int shift = depth == 1 ? 3 : depth == 2 ? 2 : 1; /* log2 of the pixels in a byte */
    return line[x >> shift] >> (8 - depth * ((x & ((1 << shift) - 1)) + 1)) & ((1 << depth) - 1);
}

/* The largest value of `height` rows of `width` pixels of one `depth`-bit sample, `bytes` apart. */
static int png_largest(const uint8_t *rows, size_t bytes, int height, int width, int depth) {
    int largest = 0;
    for (int y = 0; y < height; y++)
        for (int x = 0; x < width; x++) {
            const int value = png_value(rows + bytes * (size_t)y, x, depth);
            largest = value > largest ? value : largest;
        }
    return largest;
}

/* One unfiltered row of `width` pixels of `samples` samples of `depth` bits each (big-endian) into `row`, of
 * `channels` as png_kind says (`wide`: uint16); a sample of fewer than 8 bits times `scale`; `palette`: a palette
 * file's colours (256 RGBA entries), NULL for its indices and every other file. */
static void png_convert(const uint8_t *line, int width, int samples, int depth, int channels, int wide, int scale,
                        const uint8_t *palette, uint8_t *row) {
    const int bytes = depth == 16 ? 2 : 1, step = samples * bytes;
    if (wide) {
        uint16_t *values = (uint16_t *)row;
        for (int x = 0; x < width; x++)
            values[x] = (uint16_t)(line[2 * x] << 8 | line[2 * x + 1]);
    } else if (bytes == 2 && samples == 1) { /* as _convert_depth rounds 16 bits to 8 */
        for (int x = 0; x < width; x++)
            row[x] = (uint8_t)(((uint32_t)(line[2 * x] << 8 | line[2 * x + 1]) * 255 + 32767) / 65535);
    } else if (palette) {
        for (int x = 0; x < width; x++, row += channels)
            memcpy(row, palette + 4 * png_value(line, x, depth), (size_t)channels);
    } else if (depth < 8) {
        for (int x = 0; x < width; x++, row += channels)
            memset(row, png_value(line, x, depth) * scale, (size_t)channels);
    } else {
        const int grey = samples < 3; /* its one value in every channel asked for */
        for (int x = 0; x < width; x++, line += step, row += channels)
            for (int c = 0; c < channels; c++)
                row[c] = line[(grey ? 0 : c) * bytes];
    }
}

/* The rows of a PNG's pixels as its zlib stream holds them: one pass of the whole picture, or an interlaced file's
 * seven (Adam7), each its own picture of every `down`th row from `top` and every `across`th column from `left`. */
typedef struct {
    int top, left, down, across, height, width; /* height or width 0: the pass holds no row, not even a filter byte */
    size_t bytes, at; /* a row's bytes, its filter's byte not counted; the first row's place in the stream */
} PngPass;

static const int ADAM7[7][4] = {{0, 0, 8, 8}, {0, 4, 8, 8}, {4, 0, 8, 4}, {0, 2, 4, 4},
                                {2, 0, 4, 2}, {0, 1, 2, 2}, {1, 0, 2, 1}}; /* top, left, down, across */
static const int WHOLE[4] = {0, 0, 1, 1};

/* The passes of a picture of `height` x `width` pixels of `bits` bits each into `passes` (7 if `interlaced`, else 1):
 * the bytes of the stream they fill, or 0 where more than one zlib call would inflate them (left to Pillow). */
static size_t png_passes(int interlaced, int height, int width, int bits, PngPass *passes) {
    size_t at = 0;
    for (int k = 0; k < (interlaced ? 7 : 1); k++) {
        PngPass *pass = &passes[k];
        const int *step = interlaced ? ADAM7[k] : WHOLE;
        pass->top = step[0], pass->left = step[1], pass->down = step[2], pass->across = step[3];
        pass->height = height > pass->top ? (height - pass->top + pass->down - 1) / pass->down : 0;
        pass->width = width > pass->left ? (width - pass->left + pass->across - 1) / pass->across : 0;
        pass->bytes = ((size_t)pass->width * bits + 7) / 8;
        pass->at = at;
        if (pass->height && pass->width) {
            if (pass->bytes + 1 > (UINT_MAX - at) / (size_t)pass->height)
                return 0;
            at += (pass->bytes + 1) * (size_t)pass->height;
        }
    }
    return at;
}

/* Decode `data` into `height` rows of `width` x `channels` samples (uint8; uint16 with PNG_WIDE in `as`, png_kind's
 * flags), each `stride` bytes after the one before, if it is a plain PNG of that size (above) that gives them: 1, else
 * 0 (left to the caller). */
static int png_decode(PngDecoder *png, const uint8_t *data, size_t size, int channels, int height, int width,
                      uint8_t *out, size_t stride, int as) {
    if (!png_file(data, size) || size < 33 || memcmp(data + 12, "IHDR", 4) != 0 || height <= 0 || width <= 0)
        return 0;
    const int depth = data[24], colour = data[25], interlaced = data[28] == 1;
    const int samples = png_kind(colour, depth, channels, as), wide = as & PNG_WIDE;
    const int colours = colour == 3 && !(as & PNG_IDS); /* a palette's colours, looked up */
    if (samples == 0)
        return 0;
    /* A low-bit sample's scale: indices and 1-bit ids as they are (Pillow's modes P and 1), grey to 0-255 (mode L). */
    const int scale = depth >= 8 || colour == 3 || ((as & PNG_IDS) && depth == 1) ? 1 : 255 / ((1 << depth) - 1);
    const int pixel_bytes = depth < 8 ? 1 : samples * depth / 8; /* the filters' distance to the left */
    const size_t pixel_out = (size_t)channels * (wide ? 2 : 1);
    const int in_place = depth == 8 && samples == channels && !wide && !colours && !interlaced;
    PngPass passes[7];
    const int count = interlaced ? 7 : 1;
    const size_t filtered_bytes = png_passes(interlaced, height, width, samples * depth, passes);
    if (filtered_bytes == 0)
        return 0;
    if (filtered_bytes > png->capacity) {
        free(png->filtered);
        png->filtered = malloc(filtered_bytes);
        png->capacity = png->filtered ? filtered_bytes : 0;
        if (png->filtered == NULL)
            return 0;
    }
    if (interlaced && (size_t)width * pixel_out > png->row_capacity) {
        free(png->row);
        png->row = malloc((size_t)width * pixel_out);
        png->row_capacity = png->row ? (size_t)width * pixel_out : 0;
        if (png->row == NULL)
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
    uint8_t palette[256 * 4]; /* a palette file's colours, RGBA: opaque but where its tRNS says */
    memset(palette, 255, sizeof(palette));
    size_t at = 8;
    int chunks = 0, in_idat = 0, inflated = 0, entries = 0;
    while (!inflated) {
        if (size - at < 12)
            return 0; /* truncated */
        const uint32_t length = big_endian32(data + at);
        const uint8_t *type = data + at + 4, *body = data + at + 8;
        if (length > size - at - 12)
            return 0;
        if (chunks++ == 0) { /* IHDR first (its depth and colour type read above): of this size, deflate, plain
                                filters, no interlace or Adam7 */
            if (memcmp(type, "IHDR", 4) != 0 || length != 13 || big_endian32(body) != (uint32_t)width ||
                big_endian32(body + 4) != (uint32_t)height || body[10] != 0 || body[11] != 0 || body[12] > 1)
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
            if (png_turns(type, body, length))
                return 0; /* an orientation, or an animation */
            if ((uint32_t)crc32(crc32(0L, type, 4), body, length) != big_endian32(body + length))
                return 0; /* Pillow refuses a chunk before the IDATs whose CRC is wrong */
            if (colours && memcmp(type, "PLTE", 4) == 0) {
                if (entries || length == 0 || length % 3 || length > 3 * 256)
                    return 0;
                entries = (int)length / 3;
                for (int k = 0; k < entries; k++)
                    memcpy(palette + 4 * k, body + 3 * k, 3);
            } else if (colours && memcmp(type, "tRNS", 4) == 0) {
                for (uint32_t k = 0; k < length && k < 256; k++)
                    palette[4 * k + 3] = body[k];
            }
        }
        at += 12 + (size_t)length;
    }
    for (size_t more = at; size - more >= 12;) { /* an orientation after the pixels: Pillow may read it; leave it */
        const uint32_t length = big_endian32(data + more);
        if (memcmp(data + more + 4, "IEND", 4) == 0 || length > size - more - 12)
            break;
        if (png_turns(data + more + 4, data + more + 8, length))
            return 0;
        more += 12 + (size_t)length;
    }
    if (colours && entries == 0)
        return 0; /* a palette file without its palette: Pillow's error */
    for (int k = 0; k < count; k++) /* every row's filter known before a row is written */
        for (int y = 0; y < (passes[k].width ? passes[k].height : 0); y++)
            if (png->filtered[passes[k].at + (passes[k].bytes + 1) * (size_t)y] > 4)
                return 0;
    if (in_place) { /* the file's rows are the caller's: undone straight into them (every filter known: above) */
        for (int y = 0; y < height; y++) {
            uint8_t *line = png->filtered + (passes[0].bytes + 1) * (size_t)y, *row = out + stride * (size_t)y;
            png_unfilter(line[0], line + 1, y > 0 ? row - stride : NULL, passes[0].bytes, pixel_bytes, row);
        }
        return 1;
    }
    for (int converted = 0; converted < 1 + colours; converted++) /* a palette's colours once every index is checked */
        for (int k = 0; k < count; k++) {
            const PngPass *pass = &passes[k];
            const int rows = pass->width ? pass->height : 0;
            for (int y = 0; y < rows; y++) {
                uint8_t *line = png->filtered + pass->at + (pass->bytes + 1) * (size_t)y;
                uint8_t *row = out + stride * (size_t)(pass->top + pass->down * y), *into = interlaced ? png->row : row;
                if (!converted) /* undone where it lies, the row above undone already */
                    png_unfilter(line[0], line + 1, y > 0 ? line - pass->bytes : NULL, pass->bytes, pixel_bytes,
                                 line + 1);
                if (colours && !converted)
                    continue;
                png_convert(line + 1, pass->width, samples, depth, channels, wide, scale, colours ? palette : NULL,
                            into);
                for (int x = 0; interlaced && x < pass->width; x++) /* each pixel to its column */
                    memcpy(row + pixel_out * (size_t)(pass->left + pass->across * x), into + pixel_out * x, pixel_out);
            }
            if (colours && !converted && entries < 1 << depth && /* an index past the palette is Pillow's to colour */
                png_largest(png->filtered + pass->at + 1, pass->bytes + 1, rows, pass->width, depth) >= entries)
                return 0; /* (its versions differ), every one checked before a row is written */
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
        !png_decode(png, data, size, channels, (int)height, (int)width, pixels, (size_t)width * channels, 0))
        return 0;
    shape[0] = height;
    shape[1] = width;
    return 1;
}
