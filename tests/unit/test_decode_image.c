/* dist_dataset_map_decode_image (PNG and JPEG by their first bytes, the pixel cap, what other
 * bytes are named) and dist_dataset_map_decode_raw, with the images encoded here by libpng and
 * libjpeg-turbo. */
#include "dist/data.h"
#include "testutil.h"

#include <png.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>
#include <zlib.h>

/* Encodes w x h pixels of `channels` (1 or 3) as PNG into a malloc'd buffer. */
static unsigned char *png_of(const unsigned char *pix, int w, int h, int channels, size_t *n) {
    png_image img;
    memset(&img, 0, sizeof img);
    img.version = PNG_IMAGE_VERSION;
    img.width = (png_uint_32)w;
    img.height = (png_uint_32)h;
    img.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    png_alloc_size_t size = 0;
    ck_assert(png_image_write_to_memory(&img, NULL, &size, 0, pix, 0, NULL));
    unsigned char *out = malloc(size);
    ck_assert(png_image_write_to_memory(&img, out, &size, 0, pix, 0, NULL));
    *n = size;
    return out;
}

static unsigned char *jpeg_of(const unsigned char *pix, int w, int h, size_t *n) {
    tjhandle tj = tjInitCompress();
    unsigned char *jpeg = NULL;
    unsigned long size = 0;
    ck_assert_int_eq(tjCompress2(tj, pix, w, 0, h, TJPF_GRAY, &jpeg, &size, TJSAMP_GRAY, 100, 0),
                     0);
    tjDestroy(tj);
    unsigned char *out = malloc(size);
    memcpy(out, jpeg, size);
    tjFree(jpeg);
    *n = size;
    return out;
}

/* A digit-like test image: a gradient with a bright square. */
static void pattern(unsigned char *pix, int w, int h, int channels) {
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++)
            for (int c = 0; c < channels; c++)
                pix[((size_t)y * w + x) * channels + c] =
                    (unsigned char)((x > 8 && x < 20 && y > 8 && y < 20)
                                        ? 250
                                        : (x * 7 + y * 3 + c * 40) % 200);
}

/* Elements (bytes uint8 [len], label int32) of `count` rows of len bytes (copied). */
static dist_dataset *rows(const unsigned char *bytes, int64_t count, int64_t len) {
    int32_t labels[8] = {7, 3, 1, 4, 1, 5, 9, 2};
    int64_t bshape[2] = {count, len}, lshape[1] = {count};
    dist_tensor b = dist_tensor_view((void *)bytes, DIST_U8, 2, bshape);
    dist_tensor l = dist_tensor_view(labels, DIST_I32, 1, lshape);
    dist_tensor *ptrs[2] = {&b, &l};
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(ptrs, 2, 1, &ds), DIST_OK);
    return ds;
}

static dist_dataset *decoded(dist_dataset *in, int h, int w, int channels) {
    dist_decode_image_options o = DIST_DECODE_IMAGE_OPTIONS_INIT;
    o.height = h;
    o.width = w;
    o.channels = channels;
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_map_decode_image(in, &o, &ds), DIST_OK);
    dist_dataset_destroy(in);
    return ds;
}

/* The first element's status; on success its image is copied to `pix` and its label to *label. */
static dist_status first(dist_dataset *ds, unsigned char *pix, size_t n, int32_t *label) {
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_element e;
    int end = 0;
    dist_status st = dist_iterator_next(it, &e, &end);
    if (st == DIST_OK) {
        ck_assert_int_eq(end, 0);
        ck_assert_uint_eq((size_t)dist_tensor_numel(e.items[0]), n);
        memcpy(pix, e.items[0]->data, n);
        if (label) *label = *(const int32_t *)e.items[1]->data;
    }
    dist_iterator_destroy(it);
    return st;
}

/* The status of reading every element. */
static dist_status read_all(dist_dataset *ds) {
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_status st = DIST_OK;
    for (int end = 0; st == DIST_OK && !end;) {
        dist_element e;
        st = dist_iterator_next(it, &e, &end);
    }
    dist_iterator_destroy(it);
    return st;
}

START_TEST(test_decode_image_png_gray_comes_back_exactly_with_its_label) {
    unsigned char pix[28 * 28], got[28 * 28];
    pattern(pix, 28, 28, 1);
    size_t n = 0;
    unsigned char *png = png_of(pix, 28, 28, 1, &n);
    dist_dataset *ds = decoded(rows(png, 1, (int64_t)n), 28, 28, 1);
    const dist_element_spec *spec = dist_dataset_element_spec(ds);
    ck_assert_int_eq(spec->dtype[0], DIST_U8);
    ck_assert_int_eq(spec->ndim[0], 3);
    ck_assert_int_eq(spec->shape[0][2], 1);
    ck_assert_int_eq(spec->dtype[1], DIST_I32);
    int32_t label = -1;
    ck_assert_int_eq(first(ds, got, sizeof got, &label), DIST_OK);
    ck_assert_mem_eq(got, pix, sizeof pix);
    ck_assert_int_eq(label, 7);
    dist_dataset_destroy(ds);
    free(png);
}
END_TEST

START_TEST(test_decode_image_png_rgb_comes_back_exactly_as_three_channels) {
    unsigned char pix[16 * 12 * 3], got[16 * 12 * 3];
    pattern(pix, 16, 12, 3);
    size_t n = 0;
    unsigned char *png = png_of(pix, 16, 12, 3, &n);
    dist_dataset *ds = decoded(rows(png, 1, (int64_t)n), 12, 16, 3);
    ck_assert_int_eq(first(ds, got, sizeof got, NULL), DIST_OK);
    ck_assert_mem_eq(got, pix, sizeof pix);
    dist_dataset_destroy(ds);
    free(png);
}
END_TEST

START_TEST(test_decode_image_jpeg_gray_at_quality_100_is_within_2_levels) {
    unsigned char pix[28 * 28], got[28 * 28];
    pattern(pix, 28, 28, 1);
    size_t n = 0;
    unsigned char *jpeg = jpeg_of(pix, 28, 28, &n);
    dist_dataset *ds = decoded(rows(jpeg, 1, (int64_t)n), 28, 28, 1);
    ck_assert_int_eq(first(ds, got, sizeof got, NULL), DIST_OK);
    for (size_t i = 0; i < sizeof pix; i++) ck_assert_int_le(abs(got[i] - pix[i]), 2);
    dist_dataset_destroy(ds);
    free(jpeg);
}
END_TEST

START_TEST(test_decode_image_resizes_56_to_28_or_rejects_by_policy) {
    unsigned char pix[56 * 56], got[28 * 28];
    memset(pix, 90, sizeof pix);
    size_t n = 0;
    unsigned char *png = png_of(pix, 56, 56, 1, &n);
    dist_dataset *ds = decoded(rows(png, 1, (int64_t)n), 28, 28, 1);
    ck_assert_int_eq(first(ds, got, sizeof got, NULL), DIST_OK);
    for (size_t i = 0; i < sizeof got; i++) ck_assert_int_eq(got[i], 90);
    dist_dataset_destroy(ds);

    dist_decode_image_options o = DIST_DECODE_IMAGE_OPTIONS_INIT;
    o.height = o.width = 28;
    o.size_policy = DIST_JPEG_REJECT;
    dist_dataset *in = rows(png, 1, (int64_t)n);
    ck_assert_int_eq(dist_dataset_map_decode_image(in, &o, &ds), DIST_OK);
    dist_dataset_destroy(in);
    ck_assert_int_eq(read_all(ds), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "record 0 is 56x56, expected 28x28"));
    dist_dataset_destroy(ds);
    free(png);
}
END_TEST

START_TEST(test_decode_image_a_truncated_png_names_the_record) {
    unsigned char pix[28 * 28];
    pattern(pix, 28, 28, 1);
    size_t n = 0;
    unsigned char *png = png_of(pix, 28, 28, 1, &n);
    /* the PNG without its last 20 bytes (the end of the image data and IEND) */
    dist_dataset *ds = decoded(rows(png, 1, (int64_t)n - 20), 28, 28, 1);
    ck_assert_int_eq(read_all(ds), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "decode_image"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "png: record 0 is truncated or damaged"));
    dist_dataset_destroy(ds);
    free(png);
}
END_TEST

/* Rewrites a PNG's IHDR size (bytes 16..23) and its CRC. */
static void claim_size(unsigned char *png, uint32_t w, uint32_t h) {
    for (int i = 0; i < 4; i++) {
        png[16 + i] = (unsigned char)(w >> (24 - 8 * i));
        png[20 + i] = (unsigned char)(h >> (24 - 8 * i));
    }
    uint32_t crc = (uint32_t)crc32(0, png + 12, 17); /* "IHDR" and its 13 bytes */
    for (int i = 0; i < 4; i++) png[29 + i] = (unsigned char)(crc >> (24 - 8 * i));
}

START_TEST(test_decode_image_a_png_claiming_a_huge_size_is_refused_before_allocating) {
    unsigned char pix[28 * 28];
    pattern(pix, 28, 28, 1);
    size_t n = 0;
    unsigned char *png = png_of(pix, 28, 28, 1, &n);
    /* 1,000,000 x 1,000,000 (libpng's own limit) is 10^12 pixels: a terabyte if allocated */
    claim_size(png, 1000000, 1000000);
    dist_dataset *ds = decoded(rows(png, 1, (int64_t)n), 28, 28, 1);
    ck_assert_int_eq(read_all(ds), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "record 0 claims 1000000x1000000 pixels, over "
                                                    "the cap of 67108864 (max_pixels)"));
    dist_dataset_destroy(ds);
    free(png);
}
END_TEST

START_TEST(test_decode_image_gif_bytes_are_named_with_their_record) {
    unsigned char pix[28 * 28];
    pattern(pix, 28, 28, 1);
    size_t n = 0;
    unsigned char *png = png_of(pix, 28, 28, 1, &n);
    unsigned char *two = calloc(2, n);
    memcpy(two, png, n);
    memcpy(two + n, "GIF89a\x1c\x00\x1c\x00", 10); /* record 1: a GIF header */
    dist_dataset *ds = decoded(rows(two, 2, (int64_t)n), 28, 28, 1);
    ck_assert_int_eq(read_all(ds), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "decode_image: record 1 is a GIF image"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "only PNG and JPEG"));
    dist_dataset_destroy(ds);

    memset(two + n, 0x42, 8); /* record 1: bytes of no known format */
    memcpy(two + n, "\x01\x02\x03\x04", 4);
    ds = decoded(rows(two, 2, (int64_t)n), 28, 28, 1);
    ck_assert_int_eq(read_all(ds), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "record 1 is neither PNG nor JPEG"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "bytes starting 01 02 03 04"));
    dist_dataset_destroy(ds);
    free(two);
    free(png);
}
END_TEST

START_TEST(test_decode_image_refuses_bad_options) {
    unsigned char bytes[4] = {0};
    dist_dataset *in = rows(bytes, 1, 4), *ds = NULL;
    dist_decode_image_options o = DIST_DECODE_IMAGE_OPTIONS_INIT;
    ck_assert_int_eq(dist_dataset_map_decode_image(in, &o, &ds),
                     DIST_INVALID_ARGUMENT); /* no size */
    o.height = o.width = 28;
    o.channels = 2;
    ck_assert_int_eq(dist_dataset_map_decode_image(in, &o, &ds), DIST_INVALID_ARGUMENT);
    o.channels = 1;
    o.component = 1; /* the int32 labels */
    ck_assert_int_eq(dist_dataset_map_decode_image(in, &o, &ds), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "component 1 is not uint8 [length]"));
    o.component = 0;
    o.num_parallel = -7;
    ck_assert_int_eq(dist_dataset_map_decode_image(in, &o, &ds), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "num_parallel -7"));
    ck_assert_ptr_null(ds);
    dist_dataset_destroy(in);
}
END_TEST

START_TEST(test_decode_raw_reads_little_endian_floats_of_the_shape) {
    const float want[6] = {0.5f, -1.0f, 2.25f, 3.0f, 1e-3f, 42.0f};
    unsigned char bytes[24];
    for (int i = 0; i < 6; i++) {
        uint32_t u;
        memcpy(&u, &want[i], 4);
        for (int b = 0; b < 4; b++) bytes[i * 4 + b] = (unsigned char)(u >> (8 * b));
    }
    dist_dataset *in = rows(bytes, 1, 24), *ds = NULL;
    const int64_t shape[2] = {2, 3};
    ck_assert_int_eq(dist_dataset_map_decode_raw(in, 0, DIST_F32, 2, shape, &ds), DIST_OK);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_element e;
    int end = 0;
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.items[0]->dtype, DIST_F32);
    ck_assert_int_eq(e.items[0]->ndim, 2);
    ck_assert_int_eq(e.items[0]->shape[1], 3);
    ck_assert_mem_eq(e.items[0]->data, want, sizeof want);
    ck_assert_int_eq(*(const int32_t *)e.items[1]->data, 7);
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);

    const int64_t five[1] = {5}; /* 20 bytes wanted, 24 there */
    ck_assert_int_eq(dist_dataset_map_decode_raw(in, 0, DIST_F32, 1, five, &ds), DIST_OK);
    ck_assert_int_eq(read_all(ds), DIST_FORMAT);
    ck_assert_ptr_nonnull(
        strstr(dist_last_error(), "decode_raw: record 0 holds 24 bytes, expected 20"));
    dist_dataset_destroy(ds);
    dist_dataset_destroy(in);
}
END_TEST

/* 8 PNG rows of distinct images, padded to one row length (PNG ignores bytes after IEND). */
static unsigned char *eight_pngs(int64_t *len) {
    unsigned char *png[8];
    size_t n[8], longest = 0;
    for (int i = 0; i < 8; i++) {
        unsigned char pix[28 * 28];
        pattern(pix, 28, 28, 1);
        pix[i * 30] = (unsigned char)(i + 1); /* each image differs */
        png[i] = png_of(pix, 28, 28, 1, &n[i]);
        if (n[i] > longest) longest = n[i];
    }
    unsigned char *all = calloc(8, longest);
    for (int i = 0; i < 8; i++) {
        memcpy(all + (size_t)i * longest, png[i], n[i]);
        free(png[i]);
    }
    *len = (int64_t)longest;
    return all;
}

/* Every element's image and label, concatenated. */
static void collect(dist_dataset *ds, unsigned char *pix, int32_t *labels, int64_t *count) {
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    int64_t k = 0;
    for (;;) {
        dist_element e;
        int end = 0;
        ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
        if (end) break;
        memcpy(pix + (size_t)k * 28 * 28, e.items[0]->data, 28 * 28);
        labels[k++] = *(const int32_t *)e.items[1]->data;
    }
    *count = k;
    dist_iterator_destroy(it);
}

START_TEST(test_decode_image_on_several_threads_gives_the_same_elements_in_order) {
    int64_t len = 0;
    unsigned char *pngs = eight_pngs(&len);
    unsigned char want[8 * 28 * 28], got[8 * 28 * 28];
    int32_t want_labels[8], got_labels[8];
    int64_t nw = 0, ng = 0;
    dist_dataset *one = decoded(rows(pngs, 8, len), 28, 28, 1);
    collect(one, want, want_labels, &nw);
    ck_assert_int_eq(nw, 8);
    ck_assert_int_eq(want_labels[6], 9);
    ck_assert_int_eq(want[6 * 28 * 28 + 6 * 30], 7); /* image 6 is image 6 */
    const int parallel[3] = {3, 8, DIST_AUTOTUNE};
    for (int p = 0; p < 3; p++) {
        dist_decode_image_options o = DIST_DECODE_IMAGE_OPTIONS_INIT;
        o.height = o.width = 28;
        o.num_parallel = parallel[p];
        dist_dataset *in = rows(pngs, 8, len), *ds = NULL;
        ck_assert_int_eq(dist_dataset_map_decode_image(in, &o, &ds), DIST_OK);
        dist_dataset_destroy(in);
        /* the same pipeline whatever the threads: the description does not change */
        ck_assert_str_eq(dist_dataset_describe(ds), dist_dataset_describe(one));
        collect(ds, got, got_labels, &ng);
        ck_assert_int_eq(ng, 8);
        ck_assert_mem_eq(got, want, sizeof want);
        ck_assert_mem_eq(got_labels, want_labels, sizeof want_labels);
        dist_dataset_destroy(ds);
    }
    /* the error of record 5 names record 5 with 4 threads too */
    memset(pngs + 5 * len + 20, 0xee, 40);
    dist_decode_image_options o = DIST_DECODE_IMAGE_OPTIONS_INIT;
    o.height = o.width = 28;
    o.num_parallel = 4;
    dist_dataset *in = rows(pngs, 8, len), *ds = NULL;
    ck_assert_int_eq(dist_dataset_map_decode_image(in, &o, &ds), DIST_OK);
    dist_dataset_destroy(in);
    ck_assert_int_eq(read_all(ds), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "record 5"));
    dist_dataset_destroy(ds);
    dist_dataset_destroy(one);
    free(pngs);
}
END_TEST

int main(void) {
    Suite *s = suite_create("decode_image");
    TCase *tc = tcase_create("decode");
    tcase_add_test(tc, test_decode_image_png_gray_comes_back_exactly_with_its_label);
    tcase_add_test(tc, test_decode_image_png_rgb_comes_back_exactly_as_three_channels);
    tcase_add_test(tc, test_decode_image_jpeg_gray_at_quality_100_is_within_2_levels);
    tcase_add_test(tc, test_decode_image_resizes_56_to_28_or_rejects_by_policy);
    tcase_add_test(tc, test_decode_image_a_truncated_png_names_the_record);
    tcase_add_test(tc, test_decode_image_a_png_claiming_a_huge_size_is_refused_before_allocating);
    tcase_add_test(tc, test_decode_image_gif_bytes_are_named_with_their_record);
    tcase_add_test(tc, test_decode_image_refuses_bad_options);
    tcase_add_test(tc, test_decode_raw_reads_little_endian_floats_of_the_shape);
    tcase_add_test(tc, test_decode_image_on_several_threads_gives_the_same_elements_in_order);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
