/* File sources of the input pipeline: JPEG class folders (written here with TurboJPEG), IDX
 * files (the shipped MNIST subset, and broken ones), bad input, FILE auto-sharding. */
#include "dist/data.h"
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>
#include <zlib.h>

static char g_root[256];

static void rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    char sub[1024];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        rm_tree(sub);
    }
    closedir(d);
    rmdir(path);
}

static void setup(void) {
    snprintf(g_root, sizeof g_root, "/tmp/dist_test_data_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_root));
}

static void teardown(void) { rm_tree(g_root); }

static void mkdir_in(const char *rel) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_root, rel);
    ck_assert_int_eq(mkdir(p, 0755), 0);
}

static void write_bytes(const char *rel, const void *bytes, size_t n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_root, rel);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

/* A 28x28 MNIST-like digit: a thick soft stroke pattern that depends on `seed`. */
static void digit(uint8_t *px, int w, int h, int seed) {
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            float cx = (float)w / 2 + 5.0f * sinf((float)seed), cy = (float)h / 2;
            float r = sqrtf((x - cx) * (x - cx) + (y - cy) * (y - cy));
            float ring = fabsf(r - (6.0f + (float)(seed % 4)));
            float v = ring < 3.0f ? 255.0f * (1.0f - ring / 3.0f) : 0.0f;
            px[y * w + x] = (uint8_t)v;
        }
}

/* Compresses a grayscale image with TurboJPEG and writes it; returns the JPEG size. */
static unsigned long write_jpeg(const char *rel, const uint8_t *px, int w, int h) {
    tjhandle tj = tjInitCompress();
    ck_assert_ptr_nonnull(tj);
    unsigned char *jpeg = NULL;
    unsigned long size = 0;
    ck_assert_int_eq(tjCompress2(tj, px, w, w, h, TJPF_GRAY, &jpeg, &size, TJSAMP_GRAY, 95, 0), 0);
    write_bytes(rel, jpeg, size);
    tjFree(jpeg);
    tjDestroy(tj);
    return size;
}

/* Classes named so that byte-wise sorting matters: "cat" < "dog" < "zebra". Images 28x28. */
static const char *const classes[3] = {"dog", "cat", "zebra"}; /* labels: dog 1, cat 0, zebra 2 */
static const int sorted_label[3] = {1, 0, 2};

static void make_digit_folder(int per_class) {
    for (int c = 0; c < 3; c++) {
        mkdir_in(classes[c]);
        for (int i = 0; i < per_class; i++) {
            uint8_t px[28 * 28];
            digit(px, 28, 28, c * 100 + i);
            char rel[128];
            snprintf(rel, sizeof rel, "%s/img%02d.jpg", classes[c], i);
            write_jpeg(rel, px, 28, 28);
        }
    }
}

static dist_status next(dist_iterator *it, dist_element *el, int *eos) {
    return dist_iterator_next(it, el, eos);
}

START_TEST(test_jpeg_folder_round_trips_labels_and_pixels) {
    make_digit_folder(4);
    dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
    o.num_threads = 2;
    dist_dataset *ds = NULL;
    ck_assert_msg(dist_dataset_from_jpeg_folder(g_root, &o, &ds) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(dist_dataset_cardinality(ds), 12);
    ck_assert_int_eq(dist_dataset_class_count(ds), 3);
    ck_assert_str_eq(dist_dataset_class_name(ds, 0), "cat");
    ck_assert_str_eq(dist_dataset_class_name(ds, 2), "zebra");
    const dist_element_spec *s = dist_dataset_element_spec(ds);
    ck_assert_int_eq(s->shape[0][0], 28);
    ck_assert_int_eq(s->shape[0][1], 28);
    ck_assert_int_eq(s->shape[0][2], 1);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    /* sorted: cat (orig class 1) images 0..3, dog (0) 0..3, zebra (2) 0..3 */
    const int order[3] = {1, 0, 2};
    for (int k = 0; k < 12; k++) {
        dist_element el;
        int eos = 0;
        ck_assert_msg(next(it, &el, &eos) == DIST_OK, "%s", dist_last_error());
        ck_assert_int_eq(eos, 0);
        int c = order[k / 4], i = k % 4;
        ck_assert_int_eq(*(int32_t *)el.items[1]->data, sorted_label[c]);
        uint8_t want[28 * 28];
        digit(want, 28, 28, c * 100 + i);
        const uint8_t *got = el.items[0]->data;
        double sum = 0;
        for (int p = 0; p < 784; p++) sum += fabs((double)got[p] - want[p]);
        ck_assert_msg(sum / 784 < 3.0, "image %d: mean abs error %.2f", k, sum / 784);
    }
    dist_element el;
    int eos = 0;
    ck_assert_int_eq(next(it, &el, &eos), DIST_OK);
    ck_assert_int_eq(eos, 1);
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
}
END_TEST

/* Files given as a list come in list order (not sorted), each with its index; a missing one
 * fails the iterator naming it. */
START_TEST(test_jpeg_files_come_in_list_order_with_their_index) {
    make_digit_folder(2);
    char paths[3][512];
    snprintf(paths[0], sizeof paths[0], "%s/zebra/img01.jpg", g_root);
    snprintf(paths[1], sizeof paths[1], "%s/dog/img00.jpg", g_root);
    snprintf(paths[2], sizeof paths[2], "%s/dog/missing.jpg", g_root);
    const char *list[3] = {paths[0], paths[1], paths[2]};
    const int seeds[2] = {2 * 100 + 1, 0 * 100 + 0}; /* zebra img01, dog img00 */
    dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
    o.height = o.width = 28;
    dist_dataset *ds = NULL;
    ck_assert_msg(dist_dataset_from_jpeg_files(list, 3, &o, &ds) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_int_eq(dist_dataset_cardinality(ds), 3);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    for (int k = 0; k < 2; k++) {
        dist_element el;
        int eos = 0;
        ck_assert_msg(next(it, &el, &eos) == DIST_OK, "%s", dist_last_error());
        ck_assert_int_eq(*(int32_t *)el.items[1]->data, k);
        uint8_t want[28 * 28];
        digit(want, 28, 28, seeds[k]);
        const uint8_t *got = el.items[0]->data;
        double sum = 0;
        for (int p = 0; p < 784; p++) sum += fabs((double)got[p] - want[p]);
        ck_assert_msg(sum / 784 < 3.0, "image %d: mean abs error %.2f", k, sum / 784);
    }
    dist_element el;
    int eos = 0;
    ck_assert_int_eq(next(it, &el, &eos), DIST_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "missing.jpg"));
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
    ck_assert_int_eq(dist_dataset_from_jpeg_files(list, 0, &o, &ds), DIST_INVALID_ARGUMENT);
}
END_TEST

/* The file indices a JPEG dataset yields, in order (its files are all decodable). */
static int file_order(dist_dataset *ds, int32_t *out, int max) {
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    int n = 0;
    for (;;) {
        dist_element el;
        int eos = 0;
        ck_assert_msg(next(it, &el, &eos) == DIST_OK, "%s", dist_last_error());
        if (eos) break;
        ck_assert_int_lt(n, max);
        out[n++] = *(int32_t *)el.items[1]->data;
    }
    dist_iterator_destroy(it);
    return n;
}

/* Keras's image_dataset_from_directory(shuffle=True, seed=s) orders its files with numpy's
 * np.random.RandomState(s).shuffle: for 10 files, np.random.RandomState(0).permutation(10) is
 * [2 8 4 9 1 6 7 3 0 5] and RandomState(42)'s is [8 1 5 0 7 2 9 4 3 6]. */
START_TEST(test_shuffled_jpeg_files_come_in_numpys_randomstate_order) {
    make_digit_folder(1);
    char path[512];
    snprintf(path, sizeof path, "%s/dog/img00.jpg", g_root);
    const char *list[10];
    for (int i = 0; i < 10; i++) list[i] = path; /* the index tells the files apart */
    dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
    o.height = o.width = 28;
    dist_dataset *ds = NULL, *shuffled = NULL;
    ck_assert_int_eq(dist_dataset_from_jpeg_files(list, 10, &o, &ds), DIST_OK);
    const int32_t seed0[10] = {2, 8, 4, 9, 1, 6, 7, 3, 0, 5};
    const int32_t seed42[10] = {8, 1, 5, 0, 7, 2, 9, 4, 3, 6};
    int32_t got[10];
    ck_assert_int_eq(dist_dataset_shuffle_files(ds, 0, &shuffled), DIST_OK);
    ck_assert_int_eq(dist_dataset_cardinality(shuffled), 10);
    ck_assert_int_eq(file_order(shuffled, got, 10), 10);
    for (int i = 0; i < 10; i++) ck_assert_int_eq(got[i], seed0[i]);
    dist_dataset_destroy(shuffled);
    ck_assert_int_eq(dist_dataset_shuffle_files(ds, 42, &shuffled), DIST_OK);
    ck_assert_int_eq(file_order(shuffled, got, 10), 10);
    for (int i = 0; i < 10; i++) ck_assert_int_eq(got[i], seed42[i]);
    dist_dataset_destroy(shuffled);
    dist_dataset_destroy(ds);
}
END_TEST

/* A class-ordered folder split by position holds out its last class only; with its files
 * shuffled first the held-out last third holds every class, and the labels go with the files.
 * A dataset with a transformation above the source is refused. */
START_TEST(test_a_split_of_shuffled_folder_files_holds_every_class) {
    make_digit_folder(8);
    dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
    dist_dataset *ds = NULL, *shuffled = NULL, *held = NULL;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_OK);
    ck_assert_int_eq(dist_dataset_shuffle_files(ds, 42, &shuffled), DIST_OK);
    ck_assert_int_eq(dist_dataset_class_count(shuffled), 3);
    ck_assert_str_eq(dist_dataset_class_name(shuffled, 0), "cat");
    ck_assert_int_eq(dist_dataset_skip(shuffled, 16, &held), DIST_OK);
    int32_t labels[8];
    ck_assert_int_eq(file_order(held, labels, 8), 8);
    int seen[3] = {0, 0, 0};
    for (int i = 0; i < 8; i++) seen[labels[i]]++;
    ck_assert_msg(seen[0] && seen[1] && seen[2], "held out: %d cat, %d dog, %d zebra", seen[0],
                  seen[1], seen[2]);
    dist_dataset_destroy(held);
    /* every image once, with its own label: the pixels match the class's digits */
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(shuffled, &it), DIST_OK);
    int per_label[3] = {0, 0, 0};
    for (;;) {
        dist_element el;
        int eos = 0;
        ck_assert_int_eq(next(it, &el, &eos), DIST_OK);
        if (eos) break;
        int label = *(int32_t *)el.items[1]->data, c = label == 0 ? 1 : label == 1 ? 0 : 2;
        const uint8_t *got = el.items[0]->data;
        double best = 1e9;
        for (int i = 0; i < 8; i++) {
            uint8_t want[28 * 28];
            digit(want, 28, 28, c * 100 + i);
            double sum = 0;
            for (int p = 0; p < 784; p++) sum += fabs((double)got[p] - want[p]);
            if (sum / 784 < best) best = sum / 784;
        }
        ck_assert_msg(best < 3.0, "an image labelled %d is none of its class's", label);
        per_label[label]++;
    }
    ck_assert_int_eq(per_label[0] + per_label[1] + per_label[2], 24);
    ck_assert_int_eq(per_label[0], 8);
    ck_assert_int_eq(per_label[1], 8);
    dist_iterator_destroy(it);
    ck_assert_int_eq(dist_dataset_batch(ds, 2, 0, &held), DIST_OK);
    dist_dataset *out = NULL;
    ck_assert_int_eq(dist_dataset_shuffle_files(held, 1, &out), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "not a JPEG folder"), "%s", dist_last_error());
    dist_dataset_destroy(held);
    dist_dataset_destroy(shuffled);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_jpeg_folder_rgb_resize_and_reject) {
    mkdir_in("a");
    uint8_t px[40 * 30];
    digit(px, 40, 30, 3);
    write_jpeg("a/big.JPEG", px, 40, 30);
    dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
    o.channels = 3;
    o.height = 15;
    o.width = 20;
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_OK);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_element el;
    int eos = 0;
    ck_assert_msg(next(it, &el, &eos) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(el.items[0]->shape[0], 15);
    ck_assert_int_eq(el.items[0]->shape[1], 20);
    ck_assert_int_eq(el.items[0]->shape[2], 3);
    const uint8_t *rgb = el.items[0]->data;
    /* a 2x downscale of a gray image: R = G = B, close to the 2x2 mean of the source */
    double err = 0;
    for (int y = 0; y < 15; y++)
        for (int x = 0; x < 20; x++) {
            const uint8_t *p = rgb + (y * 20 + x) * 3;
            ck_assert_int_le(abs(p[0] - p[1]), 2);
            double m = (px[(2 * y) * 40 + 2 * x] + px[(2 * y) * 40 + 2 * x + 1] +
                        px[(2 * y + 1) * 40 + 2 * x] + px[(2 * y + 1) * 40 + 2 * x + 1]) /
                       4.0;
            err += fabs(p[0] - m);
        }
    ck_assert_msg(err / 300 < 6.0, "resize error %.2f", err / 300);
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);

    o.size_policy = DIST_JPEG_REJECT;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_OK);
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    ck_assert_int_eq(next(it, &el, &eos), DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "big.JPEG") && strstr(dist_last_error(), "40x30"), "%s",
                  dist_last_error());
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
}
END_TEST

/* Bad files: a truncated JPEG and a text file named .jpg, among good ones. */
static void make_bad_folder(void) {
    mkdir_in("one");
    mkdir_in("two");
    uint8_t px[28 * 28];
    digit(px, 28, 28, 1);
    write_jpeg("one/a.jpg", px, 28, 28);
    unsigned long n = write_jpeg("one/b.jpg", px, 28, 28);
    /* rewrite b.jpg truncated to half */
    char p[512];
    snprintf(p, sizeof p, "%s/one/b.jpg", g_root);
    ck_assert_int_eq(truncate(p, (off_t)(n / 2)), 0);
    write_bytes("two/c.jpg", "hello, not a jpeg\n", 18);
    write_jpeg("two/d.jpg", px, 28, 28);
}

static void run_bad(int threads) {
    make_bad_folder();
    dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
    o.num_threads = threads;
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_OK);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_element el;
    int eos = 0;
    ck_assert_int_eq(next(it, &el, &eos), DIST_OK); /* a.jpg */
    ck_assert_int_eq(next(it, &el, &eos), DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "one/b.jpg"), "%s", dist_last_error());
    ck_assert_int_eq(next(it, &el, &eos), DIST_FORMAT); /* sticky */
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);

    o.skip_bad = 1;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_OK);
    ck_assert_int_eq(dist_dataset_cardinality(ds), DIST_CARDINALITY_UNKNOWN);
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    int labels[4], count = 0;
    for (;;) {
        ck_assert_int_eq(next(it, &el, &eos), DIST_OK);
        if (eos) break;
        labels[count++] = *(int32_t *)el.items[1]->data;
    }
    ck_assert_int_eq(count, 2);
    ck_assert_int_eq(labels[0], 0);
    ck_assert_int_eq(labels[1], 1);
    ck_assert_int_eq(dist_iterator_skipped(it), 2);
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
}

START_TEST(test_bad_jpegs_error_naming_the_file_or_skip) { run_bad(1); }
END_TEST

START_TEST(test_bad_jpegs_with_parallel_decode) { run_bad(3); }
END_TEST

START_TEST(test_empty_class_folder_is_an_error_or_skipped) {
    mkdir_in("full");
    mkdir_in("hollow");
    uint8_t px[28 * 28];
    digit(px, 28, 28, 5);
    write_jpeg("full/x.jpg", px, 28, 28);
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, NULL, &ds), DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "hollow"), "%s", dist_last_error());
    dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
    o.skip_bad = 1;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_OK);
    ck_assert_int_eq(dist_dataset_class_count(ds), 2); /* "hollow" keeps its label index */
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    ck_assert_int_eq(dist_iterator_skipped(it), 1);
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
    ck_assert_int_eq(dist_dataset_from_jpeg_folder("/nonexistent/dist", NULL, &ds), DIST_NOT_FOUND);
}
END_TEST

START_TEST(test_auto_shard_file_splits_jpeg_files_over_workers) {
    make_digit_folder(2); /* 6 files: cat0 cat1 dog0 dog1 zebra0 zebra1 */
    dist_dataset *ds = NULL, *w1 = NULL;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, NULL, &ds), DIST_OK);
    ck_assert_int_eq(dist_dataset_auto_shard(ds, DIST_AUTO_SHARD_AUTO, 2, 1, 1, &w1), DIST_OK);
    ck_assert_int_eq(dist_dataset_cardinality(w1), 3);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(w1, &it), DIST_OK);
    int labels[3];
    for (int i = 0; i < 3; i++) {
        dist_element el;
        int eos = 0;
        ck_assert_int_eq(next(it, &el, &eos), DIST_OK);
        labels[i] = *(int32_t *)el.items[1]->data;
    }
    /* files 1, 3, 5: cat1, dog1, zebra1 */
    ck_assert_int_eq(labels[0], 0);
    ck_assert_int_eq(labels[1], 1);
    ck_assert_int_eq(labels[2], 2);
    dist_iterator_destroy(it);
    dist_dataset_destroy(w1);
    /* more workers than files */
    ck_assert_int_eq(dist_dataset_auto_shard(ds, DIST_AUTO_SHARD_FILE, 7, 0, 1, &w1),
                     DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "6 file(s)"), "%s", dist_last_error());
    ck_assert_int_eq(dist_dataset_auto_shard(ds, DIST_AUTO_SHARD_AUTO, 7, 0, 1, &w1),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_dataset_auto_shard(ds, DIST_AUTO_SHARD_DATA, 7, 0, 1, &w1), DIST_OK);
    ck_assert_int_eq(dist_dataset_cardinality(w1), 1);
    dist_dataset_destroy(w1);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_idx_source_reads_the_mnist_subset) {
    dist_dataset *ds = NULL;
    ck_assert_msg(
        dist_dataset_from_idx(DIST_SOURCE_DIR "/src/data/mnist_subset/t10k-images-idx3-ubyte.gz",
                              DIST_SOURCE_DIR "/src/data/mnist_subset/t10k-labels-idx1-ubyte.gz",
                              &ds) == DIST_OK,
        "%s", dist_last_error());
    ck_assert_int_eq(dist_dataset_cardinality(ds), 2004);
    ck_assert_int_eq(dist_dataset_element_spec(ds)->ndim[0], 2);
    dist_dataset *norm = NULL;
    ck_assert_int_eq(dist_dataset_map_image_normalize(ds, &norm), DIST_OK);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(norm, &it), DIST_OK);
    int n = 0;
    for (;; n++) {
        dist_element el;
        int eos = 0;
        ck_assert_int_eq(next(it, &el, &eos), DIST_OK);
        if (eos) break;
        int32_t label = *(int32_t *)el.items[1]->data;
        ck_assert(label >= 0 && label <= 9);
    }
    ck_assert_int_eq(n, 2004);
    dist_iterator_destroy(it);
    dist_dataset_destroy(norm);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_broken_idx_files_error_naming_the_file) {
    /* header promises 5 images of 2x2 = 20 bytes; the file has 8 */
    const uint8_t short_idx[16 + 8] = {0, 0, 8, 3, 0, 0, 0, 5, 0, 0, 0, 2,
                                       0, 0, 0, 2, 1, 2, 3, 4, 5, 6, 7, 8};
    write_bytes("short-idx3-ubyte", short_idx, sizeof short_idx);
    /* gzip magic followed by garbage */
    const uint8_t bad_gz[32] = {0x1f, 0x8b, 8,    0,    0,    0, 0, 0, 0,
                                3,    0xde, 0xad, 0xbe, 0xef, 1, 2, 3};
    write_bytes("corrupt-idx3-ubyte.gz", bad_gz, sizeof bad_gz);
    char p[512];
    dist_dataset *ds = NULL;
    snprintf(p, sizeof p, "%s/short-idx3-ubyte", g_root);
    ck_assert_int_eq(dist_dataset_from_idx(p, NULL, &ds), DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "short-idx3-ubyte"), "%s", dist_last_error());
    snprintf(p, sizeof p, "%s/corrupt-idx3-ubyte.gz", g_root);
    ck_assert_int_eq(dist_dataset_from_idx(p, NULL, &ds), DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "corrupt-idx3-ubyte.gz"), "%s", dist_last_error());
    ck_assert_ptr_null(ds);
    /* images and labels that disagree */
    ck_assert_int_eq(dist_dataset_from_idx(
                         DIST_SOURCE_DIR "/src/data/mnist_subset/t10k-images-idx3-ubyte.gz",
                         DIST_SOURCE_DIR "/src/data/mnist_subset/train-labels-idx1-ubyte.gz", &ds),
                     DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "train-labels"), "%s", dist_last_error());
}
END_TEST

static int g_decodes;

static dist_status plus_one(const dist_element *in, dist_element *out, void *user) {
    (void)user;
    __atomic_fetch_add(&g_decodes, 1, __ATOMIC_RELAXED);
    *(int32_t *)out->items[0]->data = *(const int32_t *)in->items[0]->data + 1;
    return DIST_OK;
}

static dist_dataset *cached_pipeline(const char *file) {
    int64_t shape[1] = {7};
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_tensor_create(DIST_I32, 1, shape, &t), DIST_OK);
    for (int i = 0; i < 7; i++) ((int32_t *)t->data)[i] = i * 10;
    dist_dataset *ds = NULL, *m = NULL, *c = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(&t, 1, 1, &ds), DIST_OK);
    dist_tensor_destroy(t);
    dist_element_spec spec = {0};
    spec.count = 1;
    spec.dtype[0] = DIST_I32;
    dist_map_options o = DIST_MAP_OPTIONS_INIT;
    o.output_spec = &spec;
    o.name = "plus_one";
    ck_assert_int_eq(dist_dataset_map(ds, plus_one, NULL, &o, &m), DIST_OK);
    ck_assert_int_eq(dist_dataset_cache(m, file, &c), DIST_OK);
    dist_dataset_destroy(ds);
    dist_dataset_destroy(m);
    return c;
}

static int sum_pass(dist_dataset *ds) {
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    int sum = 0;
    for (;;) {
        dist_element el;
        int eos = 0;
        ck_assert_msg(next(it, &el, &eos) == DIST_OK, "%s", dist_last_error());
        if (eos) break;
        sum += *(int32_t *)el.items[0]->data;
    }
    dist_iterator_destroy(it);
    return sum;
}

START_TEST(test_file_cache_second_epoch_reads_the_file) {
    char file[512];
    snprintf(file, sizeof file, "%s/pipeline.cache", g_root);
    dist_dataset *ds = cached_pipeline(file);
    g_decodes = 0;
    /* a partial pass leaves no cache file */
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_element el;
    int eos = 0;
    ck_assert_int_eq(next(it, &el, &eos), DIST_OK);
    dist_iterator_destroy(it);
    ck_assert_int_ne(access(file, F_OK), 0);
    ck_assert_int_eq(sum_pass(ds), 217);
    ck_assert_int_eq(access(file, F_OK), 0);
    int before = g_decodes;
    ck_assert_int_eq(sum_pass(ds), 217);
    ck_assert_int_eq(g_decodes, before); /* read from the file */
    dist_dataset_destroy(ds);
    /* another process (here: another dataset) over the same pipeline reuses the file */
    ds = cached_pipeline(file);
    ck_assert_int_eq(sum_pass(ds), 217);
    ck_assert_int_eq(g_decodes, before);
    dist_dataset_destroy(ds);
    /* a cache file of another pipeline is an error */
    dist_dataset *r = NULL, *c = NULL;
    int64_t shape[1] = {3};
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_tensor_create(DIST_I32, 1, shape, &t), DIST_OK);
    ck_assert_int_eq(dist_dataset_from_tensor_slices(&t, 1, 1, &r), DIST_OK);
    dist_tensor_destroy(t);
    ck_assert_int_eq(dist_dataset_cache(r, file, &c), DIST_OK);
    ck_assert_int_eq(dist_iterator_create(c, &it), DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "pipeline.cache"), "%s", dist_last_error());
    dist_dataset_destroy(c);
    dist_dataset_destroy(r);
}
END_TEST

/* The digest of every element of the rest of the epoch, one per element. */
static int digests(dist_iterator *it, uint64_t *out, int max) {
    int n = 0;
    for (;;) {
        dist_element el;
        int eos = 0;
        ck_assert_msg(next(it, &el, &eos) == DIST_OK, "%s", dist_last_error());
        if (eos) return n;
        uint64_t h = 1469598103934665603ULL;
        for (int i = 0; i < el.count; i++) {
            const unsigned char *p = el.items[i]->data;
            for (size_t k = 0;
                 k < (size_t)dist_tensor_numel(el.items[i]) * dist_dtype_size(el.items[i]->dtype);
                 k++)
                h = (h ^ p[k]) * 1099511628211ULL;
        }
        ck_assert_int_lt(n, max);
        out[n++] = h;
    }
}

static dist_dataset *jpeg_train_pipeline(int threads) {
    dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
    o.num_threads = threads;
    dist_dataset *ds = NULL, *n = NULL;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_OK);
    ck_assert_int_eq(dist_dataset_map_image_normalize(ds, &n), DIST_OK);
    dist_dataset_destroy(ds);
    ck_assert_int_eq(dist_dataset_shuffle(n, 8, 99, 1, &ds), DIST_OK);
    dist_dataset_destroy(n);
    ck_assert_int_eq(dist_dataset_batch(ds, 3, 0, &n), DIST_OK);
    dist_dataset_destroy(ds);
    ck_assert_int_eq(dist_dataset_prefetch(n, 2, &ds), DIST_OK);
    dist_dataset_destroy(n);
    return ds;
}

START_TEST(test_jpeg_pipeline_is_deterministic_across_threads_and_restores) {
    make_digit_folder(5); /* 15 images -> 5 batches of 3 */
    dist_dataset *one = jpeg_train_pipeline(1), *three = jpeg_train_pipeline(3);
    dist_iterator *a = NULL, *b = NULL;
    ck_assert_int_eq(dist_iterator_create(one, &a), DIST_OK);
    ck_assert_int_eq(dist_iterator_create(three, &b), DIST_OK);
    ck_assert_int_eq(dist_iterator_reset(a), DIST_OK);
    ck_assert_int_eq(dist_iterator_reset(b), DIST_OK);
    uint64_t ra[8], rb[8];
    ck_assert_int_eq(digests(a, ra, 8), 5);
    ck_assert_int_eq(digests(b, rb, 8), 5);
    ck_assert_mem_eq(ra, rb, sizeof(uint64_t) * 5); /* thread count does not change the data */
    /* save after 2 batches of epoch 1 with 3 threads, restore into a 1-thread iterator */
    dist_iterator_destroy(b);
    ck_assert_int_eq(dist_iterator_create(three, &b), DIST_OK);
    ck_assert_int_eq(dist_iterator_reset(b), DIST_OK);
    dist_element el;
    int eos = 0;
    ck_assert_int_eq(next(b, &el, &eos), DIST_OK);
    ck_assert_int_eq(next(b, &el, &eos), DIST_OK);
    void *state = NULL;
    size_t n = 0;
    ck_assert_int_eq(dist_iterator_save(b, &state, &n), DIST_OK);
    dist_iterator_destroy(b);
    ck_assert_msg(dist_iterator_restore(a, state, n) == DIST_OK, "%s", dist_last_error());
    uint64_t rest[8];
    ck_assert_int_eq(digests(a, rest, 8), 3);
    ck_assert_mem_eq(rest, ra + 2, sizeof(uint64_t) * 3);
    dist_iterator_state_free(state);
    dist_iterator_destroy(a);
    dist_dataset_destroy(one);
    dist_dataset_destroy(three);
}
END_TEST

/* Sets the height and width of a baseline JPEG's frame header (SOF0) to h x w. */
static void patch_jpeg_size(unsigned char *jpeg, size_t n, int h, int w) {
    for (size_t i = 0; i + 9 < n; i++)
        if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
            jpeg[i + 5] = (unsigned char)(h >> 8), jpeg[i + 6] = (unsigned char)h;
            jpeg[i + 7] = (unsigned char)(w >> 8), jpeg[i + 8] = (unsigned char)w;
            return;
        }
    ck_abort_msg("no SOF0 marker");
}

static unsigned char *read_bytes(const char *rel, size_t *n) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_root, rel);
    return dist_test_read_file(p, n);
}

START_TEST(test_a_jpeg_header_over_the_pixel_cap_is_refused_before_decoding) {
    mkdir_in("a");
    uint8_t px[28 * 28];
    digit(px, 28, 28, 1);
    write_jpeg("a/huge.jpg", px, 28, 28);
    size_t n = 0;
    unsigned char *b = read_bytes("a/huge.jpg", &n);
    /* libjpeg itself refuses 65535 per side; 65500 x 65500 (12 GiB of RGB) is what it allows. */
    patch_jpeg_size(b, n, 65500, 65500);
    write_bytes("a/huge.jpg", b, n);
    free(b);
    /* As the first image, which would set the output size. */
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, NULL, &ds), DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "65500x65500") && strstr(dist_last_error(), "huge.jpg"),
                  "%s", dist_last_error());
    /* As any image, at decode time. */
    dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
    o.height = o.width = 28;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_OK);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_element el;
    int eos = 0;
    ck_assert_int_eq(next(it, &el, &eos), DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "max_pixels"), "%s", dist_last_error());
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
}
END_TEST

/* A JPEG cut inside its header (libjpeg-turbo reads 10 bytes as a 0x0 image) or emptied says
 * so, naming the file, as the first image (which sets the size) and at decode time; it used to
 * "claim 0x0 pixels, over the cap". */
START_TEST(test_a_truncated_jpeg_header_is_called_truncated_naming_the_file) {
    mkdir_in("a");
    uint8_t px[28 * 28];
    digit(px, 28, 28, 1);
    write_jpeg("a/cut.jpg", px, 28, 28);
    char p[512];
    snprintf(p, sizeof p, "%s/a/cut.jpg", g_root);
    const off_t sizes[2] = {10, 0};
    const char *const want[2] = {"a/cut.jpg' is truncated or not a valid JPEG",
                                 "a/cut.jpg' is empty (0 bytes)"};
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(truncate(p, sizes[k]), 0);
        dist_dataset *ds = NULL;
        ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, NULL, &ds), DIST_FORMAT);
        ck_assert_msg(strstr(dist_last_error(), want[k]) && !strstr(dist_last_error(), "0x0"), "%s",
                      dist_last_error());
        dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
        o.height = o.width = 28;
        ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_OK);
        dist_iterator *it = NULL;
        ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
        dist_element el;
        int eos = 0;
        ck_assert_int_eq(next(it, &el, &eos), DIST_FORMAT);
        ck_assert_msg(strstr(dist_last_error(), want[k]) && !strstr(dist_last_error(), "0x0"), "%s",
                      dist_last_error());
        dist_iterator_destroy(it);
        dist_dataset_destroy(ds);
    }
}
END_TEST

START_TEST(test_the_jpeg_pixel_cap_is_configurable) {
    mkdir_in("a");
    uint8_t px[28 * 28];
    digit(px, 28, 28, 1);
    write_jpeg("a/x.jpg", px, 28, 28);
    dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
    dist_dataset *ds = NULL;
    o.max_pixels = 28 * 28 - 1;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "cap of 783"), "%s", dist_last_error());
    o.max_pixels = 28 * 28;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_OK);
    dist_dataset_destroy(ds);
    o.max_pixels = -1;
    ck_assert_int_eq(dist_dataset_from_jpeg_folder(g_root, &o, &ds), DIST_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_a_damaged_cache_file_is_refused_and_left_as_it_was) {
    char file[512];
    snprintf(file, sizeof file, "%s/pipeline.cache", g_root);
    dist_dataset *ds = cached_pipeline(file);
    ck_assert_int_eq(sum_pass(ds), 217);
    size_t n = 0;
    unsigned char *good = read_bytes("pipeline.cache", &n);
    for (size_t at = 0; at < n; at++) {
        good[at] ^= 0x04;
        write_bytes("pipeline.cache", good, n);
        good[at] ^= 0x04;
        dist_iterator *it = NULL;
        dist_status st = dist_iterator_create(ds, &it);
        ck_assert_msg(st == DIST_FORMAT, "flip at byte %zu of %zu: %d", at, n, (int)st);
        ck_assert_msg(strstr(dist_last_error(), "pipeline.cache"), "%s", dist_last_error());
    }
    for (size_t len = 0; len < n; len++) {
        write_bytes("pipeline.cache", good, len);
        dist_iterator *it = NULL;
        ck_assert_msg(dist_iterator_create(ds, &it) == DIST_FORMAT, "length %zu accepted", len);
    }
    /* A refused file is not touched: the bad bytes stay for inspection. */
    good[n - 1] ^= 0x01;
    write_bytes("pipeline.cache", good, n);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_FORMAT);
    size_t n2 = 0;
    unsigned char *after = read_bytes("pipeline.cache", &n2);
    ck_assert_uint_eq(n2, n);
    ck_assert_mem_eq(after, good, n);
    free(after);
    /* The good bytes back: read from the file again, no decode. */
    good[n - 1] ^= 0x01;
    write_bytes("pipeline.cache", good, n);
    int before = g_decodes;
    ck_assert_int_eq(sum_pass(ds), 217);
    ck_assert_int_eq(g_decodes, before);
    free(good);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_a_cache_write_past_the_file_size_limit_leaves_no_file) {
    char file[512];
    snprintf(file, sizeof file, "%s/pipeline.cache", g_root);
    dist_dataset *ds = cached_pipeline(file);
    struct rlimit old, small;
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    small = old;
    small.rlim_cur = 16;
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
    dist_iterator *it = NULL;
    dist_status st = dist_iterator_create(ds, &it);
    dist_element el;
    int eos = 0;
    while (st == DIST_OK && !eos) st = next(it, &el, &eos);
    dist_iterator_destroy(it);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_DFL);
    ck_assert_int_eq(st, DIST_IO);
    /* No cache file and no temporary; the next pass records the cache afresh. */
    DIR *d = opendir(g_root);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) ck_assert_msg(e->d_name[0] == '.', "left: %s", e->d_name);
    closedir(d);
    ck_assert_int_eq(sum_pass(ds), 217);
    ck_assert_int_eq(access(file, F_OK), 0);
    dist_dataset_destroy(ds);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("data_files");
    TCase *tc = tcase_create("files");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_jpeg_folder_round_trips_labels_and_pixels);
    tcase_add_test(tc, test_jpeg_folder_rgb_resize_and_reject);
    tcase_add_test(tc, test_jpeg_files_come_in_list_order_with_their_index);
    tcase_add_test(tc, test_shuffled_jpeg_files_come_in_numpys_randomstate_order);
    tcase_add_test(tc, test_a_split_of_shuffled_folder_files_holds_every_class);
    tcase_add_test(tc, test_bad_jpegs_error_naming_the_file_or_skip);
    tcase_add_test(tc, test_bad_jpegs_with_parallel_decode);
    tcase_add_test(tc, test_empty_class_folder_is_an_error_or_skipped);
    tcase_add_test(tc, test_auto_shard_file_splits_jpeg_files_over_workers);
    tcase_add_test(tc, test_idx_source_reads_the_mnist_subset);
    tcase_add_test(tc, test_broken_idx_files_error_naming_the_file);
    tcase_add_test(tc, test_file_cache_second_epoch_reads_the_file);
    tcase_add_test(tc, test_jpeg_pipeline_is_deterministic_across_threads_and_restores);
    tcase_add_test(tc, test_a_jpeg_header_over_the_pixel_cap_is_refused_before_decoding);
    tcase_add_test(tc, test_the_jpeg_pixel_cap_is_configurable);
    tcase_add_test(tc, test_a_truncated_jpeg_header_is_called_truncated_naming_the_file);
    tcase_add_test(tc, test_a_damaged_cache_file_is_refused_and_left_as_it_was);
    tcase_add_test(tc, test_a_cache_write_past_the_file_size_limit_leaves_no_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return dist_test_run(suite()); }
