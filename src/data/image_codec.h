/* Internal: encoded images (JPEG with libjpeg-turbo, PNG with libpng) decoded into a fixed-size
 * uint8 [height, width, channels] buffer. Shared by the JPEG folder source and decode_image. */
#ifndef DIST_DATA_IMAGE_CODEC_H
#define DIST_DATA_IMAGE_CODEC_H

#include "dist/data.h"

#include <stddef.h>
#include <stdint.h>

/* Per-thread decoding state: a TurboJPEG handle (made on the first JPEG) and the scratch buffer
 * of an image that must be resized. Zero-initialise; release with image_decoder_free. */
typedef struct image_decoder {
    void *tj;
    unsigned char *pix;
    size_t pix_cap;
} image_decoder;

/* What an image is decoded to. Every header's size is checked against max_pixels (> 0) before
 * anything is allocated for it. */
typedef struct image_target {
    int height, width, channels; /* channels 1 (grayscale) or 3 (RGB) */
    dist_jpeg_size_policy size_policy;
    int64_t max_pixels;
} image_target;

/* Grows *buf (realloc, doubling from 4 KiB) to hold at least `need` bytes; *cap its size. */
dist_status image_buffer_grow(unsigned char **buf, size_t *cap, size_t need);

/* The format named by the first bytes ("PNG", "JPEG", "GIF", "BMP", "WebP", "TIFF"), or NULL. */
const char *image_sniff(const unsigned char *bytes, size_t n);

/* Decodes JPEG / PNG bytes into dst (height * width * channels bytes). `subject` names the input
 * in messages, quoted as the caller wants ("'a/b.jpg'", "record 3"). Errors: DIST_FORMAT (not
 * that format, truncated or damaged, over max_pixels, another size under DIST_JPEG_REJECT),
 * DIST_OUT_OF_MEMORY, DIST_SYSTEM (no TurboJPEG handle). */
dist_status image_decode_jpeg(image_decoder *d, const unsigned char *bytes, size_t n,
                              const char *subject, const image_target *t, unsigned char *dst);
dist_status image_decode_png(image_decoder *d, const unsigned char *bytes, size_t n,
                             const char *subject, const image_target *t, unsigned char *dst);

/* Reads a JPEG header's size (as dist_jpeg_read_header, with `subject` already quoted). */
dist_status image_jpeg_header(void *tj, const unsigned char *bytes, size_t n, const char *subject,
                              int64_t max_pixels, int *w, int *h);

void image_decoder_free(image_decoder *d);

#endif
