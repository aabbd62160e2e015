/* Decoding one encoded image into a fixed-size uint8 buffer: JPEG by libjpeg-turbo's TurboJPEG
 * API, PNG by libpng's simplified API (png_image), both reading the header first so that a
 * hostile size is refused before the pixels are allocated. */
#include "data/image_codec.h"

#include "core/error.h"

#include <png.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

const char *image_sniff(const unsigned char *b, size_t n) {
    static const unsigned char png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (n >= 8 && memcmp(b, png_magic, 8) == 0) return "PNG";
    if (n >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) return "JPEG";
    if (n >= 6 && (memcmp(b, "GIF87a", 6) == 0 || memcmp(b, "GIF89a", 6) == 0)) return "GIF";
    if (n >= 2 && b[0] == 'B' && b[1] == 'M') return "BMP";
    if (n >= 12 && memcmp(b, "RIFF", 4) == 0 && memcmp(b + 8, "WEBP", 4) == 0) return "WebP";
    if (n >= 4 && (memcmp(b, "II*\0", 4) == 0 || memcmp(b, "MM\0*", 4) == 0)) return "TIFF";
    return NULL;
}

dist_status image_buffer_grow(unsigned char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return DIST_OK;
    size_t c = *cap ? *cap : 4096;
    while (c < need) c *= 2;
    unsigned char *p = realloc(*buf, c);
    if (!p) return dist_error(DIST_OUT_OF_MEMORY, "image: cannot allocate %zu bytes", c);
    *buf = p;
    *cap = c;
    return DIST_OK;
}

void image_decoder_free(image_decoder *d) {
    if (!d) return;
    if (d->tj) tjDestroy(d->tj);
    free(d->pix);
    memset(d, 0, sizeof *d);
}

/* Bilinear resize with half-pixel centres (TF's resize(..., "bilinear")). */
static void resize_bilinear(const unsigned char *src, int sw, int sh, unsigned char *dst, int dw,
                            int dh, int c) {
    const float sx = (float)sw / (float)dw, sy = (float)sh / (float)dh;
    for (int y = 0; y < dh; y++) {
        float fy = ((float)y + 0.5f) * sy - 0.5f;
        if (fy < 0) fy = 0;
        int y0 = (int)fy;
        if (y0 > sh - 1) y0 = sh - 1;
        int y1 = y0 + 1 < sh ? y0 + 1 : sh - 1;
        float wy = fy - (float)y0;
        for (int x = 0; x < dw; x++) {
            float fx = ((float)x + 0.5f) * sx - 0.5f;
            if (fx < 0) fx = 0;
            int x0 = (int)fx;
            if (x0 > sw - 1) x0 = sw - 1;
            int x1 = x0 + 1 < sw ? x0 + 1 : sw - 1;
            float wx = fx - (float)x0;
            for (int k = 0; k < c; k++) {
                float a = src[((size_t)y0 * sw + x0) * c + k],
                      b = src[((size_t)y0 * sw + x1) * c + k];
                float d = src[((size_t)y1 * sw + x0) * c + k],
                      e = src[((size_t)y1 * sw + x1) * c + k];
                float v = (a + (b - a) * wx) * (1 - wy) + (d + (e - d) * wx) * wy;
                dst[((size_t)y * dw + x) * c + k] = (unsigned char)(v + 0.5f);
            }
        }
    }
}

/* Where an image of w x h pixels is decoded: straight into dst at the target's size, else into
 * the scratch buffer to be resized (or an error under DIST_JPEG_REJECT). */
static dist_status pixels_for(image_decoder *d, const char *format, const char *subject, int w,
                              int h, const image_target *t, unsigned char *dst,
                              unsigned char **out) {
    if (w == t->width && h == t->height) {
        *out = dst;
        return DIST_OK;
    }
    if (t->size_policy == DIST_JPEG_REJECT)
        return dist_error(DIST_FORMAT, "%s: %s is %dx%d, expected %dx%d (size policy: reject)",
                          format, subject, w, h, t->width, t->height);
    DIST_TRY(image_buffer_grow(&d->pix, &d->pix_cap, (size_t)w * (size_t)h * (size_t)t->channels));
    *out = d->pix;
    return DIST_OK;
}

dist_status image_jpeg_header(void *tj, const unsigned char *bytes, size_t n, const char *subject,
                              int64_t max_pixels, int *w, int *h) {
    int subsamp = 0, cs = 0;
    *w = *h = 0;
    if (n == 0) return dist_error(DIST_FORMAT, "jpeg: %s is empty (0 bytes): not a JPEG", subject);
    if (tjDecompressHeader3(tj, bytes, (unsigned long)n, w, h, &subsamp, &cs) != 0)
        return dist_error(DIST_FORMAT, "jpeg: %s is truncated or not a valid JPEG (%zu bytes): %s",
                          subject, n, tjGetErrorStr2(tj));
    /* libjpeg-turbo accepts bytes that end before the frame header (SOF) and reports 0x0 */
    if (*w <= 0 || *h <= 0)
        return dist_error(DIST_FORMAT,
                          "jpeg: %s is truncated or not a valid JPEG: its %zu bytes end before "
                          "the image size (no frame header)",
                          subject, n);
    if ((int64_t)*w * (int64_t)*h > max_pixels)
        return dist_error(DIST_FORMAT,
                          "jpeg: %s claims %dx%d pixels, over the cap of %lld (max_pixels)",
                          subject, *w, *h, (long long)max_pixels);
    return DIST_OK;
}

dist_status image_decode_jpeg(image_decoder *d, const unsigned char *bytes, size_t n,
                              const char *subject, const image_target *t, unsigned char *dst) {
    if (!d->tj && !(d->tj = tjInitDecompress()))
        return dist_error(DIST_SYSTEM, "jpeg: tjInitDecompress failed: %s", tjGetErrorStr2(NULL));
    int w = 0, h = 0;
    DIST_TRY(image_jpeg_header(d->tj, bytes, n, subject, t->max_pixels, &w, &h));
    const int c = t->channels, pf = c == 1 ? TJPF_GRAY : TJPF_RGB;
    unsigned char *pix = NULL;
    DIST_TRY(pixels_for(d, "jpeg", subject, w, h, t, dst, &pix));
    if (tjDecompress2(d->tj, bytes, (unsigned long)n, pix, w, w * c, h, pf, TJFLAG_STOPONWARNING) !=
        0)
        return dist_error(DIST_FORMAT, "jpeg: %s: %s", subject, tjGetErrorStr2(d->tj));
    if (pix != dst) resize_bilinear(pix, w, h, dst, t->width, t->height, c);
    return DIST_OK;
}

dist_status image_decode_png(image_decoder *d, const unsigned char *bytes, size_t n,
                             const char *subject, const image_target *t, unsigned char *dst) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    /* reads the signature and the chunks before the data (IHDR: the size), nothing more */
    if (!png_image_begin_read_from_memory(&img, bytes, n)) {
        dist_status st =
            dist_error(DIST_FORMAT, "png: %s is truncated or not a valid PNG (%zu bytes): %s",
                       subject, n, img.message);
        png_image_free(&img);
        return st;
    }
    dist_status st = DIST_OK;
    if ((int64_t)img.width * (int64_t)img.height > t->max_pixels) {
        st = dist_error(DIST_FORMAT,
                        "png: %s claims %ux%u pixels, over the cap of %lld (max_pixels)", subject,
                        img.width, img.height, (long long)t->max_pixels);
        png_image_free(&img);
        return st;
    }
    /* libpng converts any colour type and bit depth; an alpha channel is composited on black */
    img.format = t->channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    unsigned char *pix = NULL;
    st = pixels_for(d, "png", subject, (int)img.width, (int)img.height, t, dst, &pix);
    if (st != DIST_OK) {
        png_image_free(&img);
        return st;
    }
    png_color black = {0, 0, 0};
    if (!png_image_finish_read(&img, &black, pix, 0, NULL)) {
        /* finish_read has freed the image */
        return dist_error(DIST_FORMAT, "png: %s is truncated or damaged (%zu bytes): %s", subject,
                          n, img.message);
    }
    if (pix != dst)
        resize_bilinear(pix, (int)img.width, (int)img.height, dst, t->width, t->height,
                        t->channels);
    return DIST_OK;
}
