/* Keras 3 .keras model files: the archive's entries and their order, config.json read back by
 * libdist's Keras reader into the same model, refusals (a name Keras cannot hold, a path in a
 * missing directory, a full disk) that leave nothing at the destination, and ModelCheckpoint
 * writing .keras files with save_best_only in each mode. (That Keras itself loads the file and
 * predicts the same is conformance.keras_model_file.) */
#include "dist/fit.h"
#include "dist/nn.h"
#include "dist/strategy.h"
#include "testutil.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

/* HDF5 1.10.8 keeps an internal allocation after some calls (see test_keras.c). */
const char *__lsan_default_suppressions(void);
__attribute__((visibility("default"))) const char *__lsan_default_suppressions(void) {
    return "leak:libhdf5_serial.so\n";
}

static char tmpdir[64];
static char path[160];

static int remove_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void setup(void) {
    strcpy(tmpdir, "/tmp/dist_keras_model_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(path, sizeof path, "%s/m.keras", tmpdir);
}

static void teardown(void) {
    if (tmpdir[0]) nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    tmpdir[0] = '\0';
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static dist_model *seed_cnn(uint64_t seed) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create_mnist_cnn(&m), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 3, (int64_t[]){28, 28, 1}, seed), DIST_OK);
    return m;
}

/* Every layer kind libdist has, with arguments away from their defaults. */
static dist_model *every_layer_model(void) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create("all_layers", &m), DIST_OK);
    dist_conv2d_options c = DIST_CONV2D_OPTIONS_INIT;
    c.filters = 4;
    c.kernel_h = 5;
    c.kernel_w = 3;
    c.stride_h = c.stride_w = 2;
    c.padding = DIST_PADDING_SAME;
    c.activation = DIST_ACT_GELU;
    c.use_bias = 0;
    ck_assert_int_eq(dist_model_add_conv2d_ex(m, &c), DIST_OK);
    dist_batch_norm_options bn = DIST_BATCH_NORM_OPTIONS_INIT;
    bn.momentum = 0.9f;
    bn.synchronized = 1;
    ck_assert_int_eq(dist_model_add_batch_normalization(m, &bn), DIST_OK);
    ck_assert_int_eq(dist_model_add_max_pool2d(m, 2), DIST_OK);
    ck_assert_int_eq(dist_model_add_average_pool2d(m, 2, 1, DIST_PADDING_SAME), DIST_OK);
    ck_assert_int_eq(dist_model_add_conv2d(m, 6, 3, DIST_ACT_SIGMOID), DIST_OK);
    ck_assert_int_eq(dist_model_add_dropout(m, 0.25f, 5), DIST_OK);
    ck_assert_int_eq(dist_model_add_global_average_pool2d(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 8, DIST_ACT_TANH), DIST_OK);
    ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 3, (int64_t[]){12, 12, 2}, 9), DIST_OK);
    return m;
}

static float *weights_of(dist_model *m) {
    int64_t n = dist_model_num_params(m);
    float *w = malloc((size_t)n * sizeof *w);
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(dist_model_get_weights(m, 0, w, n), DIST_OK);
    return w;
}

/* Entry `name` of the zip at p, NUL-terminated; *size its length. */
static char *zip_entry(const char *p, const char *name, size_t *size) {
    int err = 0;
    zip_t *za = zip_open(p, ZIP_RDONLY | ZIP_CHECKCONS, &err);
    ck_assert_msg(za != NULL, "libzip cannot open '%s' (error %d)", p, err);
    zip_stat_t zs;
    ck_assert_int_eq(zip_stat(za, name, 0, &zs), 0);
    char *buf = malloc((size_t)zs.size + 1);
    zip_file_t *f = zip_fopen(za, name, 0);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(zip_fread(f, buf, zs.size), (zip_int64_t)zs.size);
    zip_fclose(f);
    zip_close(za);
    buf[zs.size] = '\0';
    if (size) *size = (size_t)zs.size;
    return buf;
}

/* The model the archive at p holds, as libdist reads it back: config.json through
 * dist_model_from_keras_json (fresh weights from another seed), then model.weights.h5. */
static dist_model *model_from_archive(const char *p) {
    char *config = zip_entry(p, "config.json", NULL);
    size_t n = 0;
    char *weights = zip_entry(p, "model.weights.h5", &n);
    char h5[200];
    snprintf(h5, sizeof h5, "%s/extracted.weights.h5", tmpdir);
    FILE *f = fopen(h5, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(weights, 1, n, f), n);
    fclose(f);
    dist_model *m = NULL;
    ck_assert_msg(dist_model_from_keras_json(config, 12345, &m) == DIST_OK, "%s",
                  dist_last_error());
    ck_assert_msg(dist_model_load_keras_weights(m, h5) == DIST_OK, "%s", dist_last_error());
    unlink(h5);
    free(config);
    free(weights);
    return m;
}

static void assert_same_model(dist_model *a, dist_model *b) {
    char sa[4096], sb[4096];
    ck_assert_int_eq(dist_model_summary(a, sa, sizeof sa), DIST_OK);
    ck_assert_int_eq(dist_model_summary(b, sb, sizeof sb), DIST_OK);
    ck_assert_str_eq(sa, sb);
    ck_assert_int_eq(dist_model_num_params(a), dist_model_num_params(b));
    float *wa = weights_of(a), *wb = weights_of(b);
    ck_assert_int_eq(memcmp(wa, wb, (size_t)dist_model_num_params(a) * sizeof *wa), 0);
    free(wa);
    free(wb);
}

START_TEST(test_the_archive_holds_metadata_config_and_weights_stored_in_keras_order) {
    dist_model *m = seed_cnn(7);
    ck_assert_msg(dist_model_save_keras(m, path) == DIST_OK, "%s", dist_last_error());
    int err = 0;
    zip_t *za = zip_open(path, ZIP_RDONLY | ZIP_CHECKCONS, &err);
    ck_assert_ptr_nonnull(za);
    ck_assert_int_eq(zip_get_num_entries(za, 0), 3);
    const char *order[3] = {"metadata.json", "config.json", "model.weights.h5"};
    for (int i = 0; i < 3; i++) {
        zip_stat_t zs;
        ck_assert_int_eq(zip_stat_index(za, (zip_uint64_t)i, 0, &zs), 0);
        ck_assert_str_eq(zs.name, order[i]);
        ck_assert_int_eq(zs.comp_method, ZIP_CM_STORE); /* as Keras's zipfile writes them */
    }
    zip_close(za);

    char *meta_text = zip_entry(path, "metadata.json", NULL);
    cJSON *meta = cJSON_Parse(meta_text);
    ck_assert_ptr_nonnull(meta);
    ck_assert_str_eq(cJSON_GetObjectItem(meta, "keras_version")->valuestring, "3.15.1");
    const char *date = cJSON_GetObjectItem(meta, "date_saved")->valuestring;
    int y, mo, d, h, mi, s;
    ck_assert_int_eq(sscanf(date, "%4d-%2d-%2d@%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &s), 6);
    ck_assert_int_ge(y, 2024);
    cJSON_Delete(meta);
    free(meta_text);

    char *config_text = zip_entry(path, "config.json", NULL);
    cJSON *config = cJSON_Parse(config_text);
    ck_assert_ptr_nonnull(config);
    ck_assert_str_eq(cJSON_GetObjectItem(config, "class_name")->valuestring, "Sequential");
    ck_assert_str_eq(cJSON_GetObjectItem(config, "module")->valuestring, "keras");
    const cJSON *inner = cJSON_GetObjectItem(config, "config");
    ck_assert_str_eq(cJSON_GetObjectItem(inner, "name")->valuestring, "sequential");
    const cJSON *layers = cJSON_GetObjectItem(inner, "layers");
    const char *classes[8] = {"InputLayer",   "Conv2D",  "MaxPooling2D", "Conv2D",
                              "MaxPooling2D", "Flatten", "Dense",        "Dense"};
    const char *names[8] = {"input_layer",     "conv2d",  "max_pooling2d", "conv2d_1",
                            "max_pooling2d_1", "flatten", "dense",         "dense_1"};
    ck_assert_int_eq(cJSON_GetArraySize(layers), 8);
    for (int i = 0; i < 8; i++) {
        const cJSON *l = cJSON_GetArrayItem(layers, i);
        ck_assert_str_eq(cJSON_GetObjectItem(l, "class_name")->valuestring, classes[i]);
        ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(l, "config"), "name")->valuestring,
                         names[i]);
    }
    const cJSON *batch_shape = cJSON_GetObjectItem(
        cJSON_GetObjectItem(cJSON_GetArrayItem(layers, 0), "config"), "batch_shape");
    ck_assert(cJSON_IsNull(cJSON_GetArrayItem(batch_shape, 0)));
    ck_assert_int_eq(cJSON_GetArrayItem(batch_shape, 1)->valueint, 28);
    ck_assert_int_eq(cJSON_GetArrayItem(batch_shape, 3)->valueint, 1);
    const cJSON *dense1 = cJSON_GetObjectItem(cJSON_GetArrayItem(layers, 7), "config");
    ck_assert_int_eq(cJSON_GetObjectItem(dense1, "units")->valueint, 10);
    ck_assert_str_eq(cJSON_GetObjectItem(dense1, "activation")->valuestring, "linear");
    cJSON_Delete(config);
    free(config_text);

    /* libdist's own Keras reader rebuilds the same model with the same weights, bit for bit */
    dist_model *back = model_from_archive(path);
    assert_same_model(m, back);
    dist_model_destroy(back);
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_every_layer_kind_and_its_arguments_read_back_the_same) {
    dist_model *m = every_layer_model();
    ck_assert_msg(dist_model_save_keras(m, path) == DIST_OK, "%s", dist_last_error());
    char *text = zip_entry(path, "config.json", NULL);
    /* floats in their shortest form, as Python writes Keras's arguments */
    ck_assert_ptr_nonnull(strstr(text, "\"momentum\":0.9,"));
    ck_assert_ptr_nonnull(strstr(text, "\"epsilon\":0.001,"));
    ck_assert_ptr_nonnull(strstr(text, "\"rate\":0.25,\"seed\":5,"));
    ck_assert_ptr_nonnull(strstr(text, "\"synchronized\":true"));
    free(text);
    dist_model *back = model_from_archive(path);
    assert_same_model(m, back);
    dist_model_destroy(back);
    dist_model_destroy(m);
}
END_TEST

/* A masked text model's arguments go to Keras's config: Embedding's mask_zero, an LSTM's
 * dropout, recurrent_dropout, seed and zero_output_for_mask; and read back the same. */
START_TEST(test_masks_and_recurrent_dropout_read_back_the_same) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create("masked", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_embedding_masked(m, 30, 4), DIST_OK);
    dist_rnn_options o = DIST_RNN_OPTIONS_INIT(3);
    o.return_sequences = 1, o.zero_output_for_mask = 1;
    o.dropout = 0.25f, o.recurrent_dropout = 0.5f, o.seed = 0x50000000u; /* past 2^30 */
    ck_assert_int_eq(dist_model_add_lstm(m, &o), DIST_OK);
    ck_assert_int_eq(dist_model_add_global_average_pool1d(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_set_input_dtype(m, DIST_I32), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, (int64_t[]){6}, 3), DIST_OK);
    ck_assert_msg(dist_model_save_keras(m, path) == DIST_OK, "%s", dist_last_error());
    char *text = zip_entry(path, "config.json", NULL);
    static const char *const wants[] = {"\"mask_zero\":true", "\"zero_output_for_mask\":true",
                                        "\"dropout\":0.25,\"recurrent_dropout\":0.5",
                                        "\"seed\":1342177280"};
    for (int i = 0; i < 4; i++)
        ck_assert_msg(strstr(text, wants[i]), "no %s in %s", wants[i], text);
    free(text);
    dist_model *back = model_from_archive(path);
    assert_same_model(m, back);
    /* and the same training call: the same masks (dropout, seed, implementation read back) */
    int32_t ids[2 * 6] = {3, 0, 5, 7, 0, 0, 1, 2, 3, 4, 5, 6};
    float y[2][4];
    dist_model *both[2] = {m, back};
    for (int i = 0; i < 2; i++) {
        dist_tape *t = NULL;
        ck_assert_int_eq(dist_tape_create(dist_model_backend(both[i], 0), &t), DIST_OK);
        dist_tape_set_recording(t, 1);
        int64_t shape[2] = {2, 6};
        dist_tensor hx = dist_tensor_view(ids, DIST_I32, 2, shape), *x, *out;
        ck_assert_int_eq(dist_tape_upload(t, &hx, &x), DIST_OK);
        ck_assert_msg(dist_model_call(both[i], t, x, &out) == DIST_OK, "%s", dist_last_error());
        ck_assert_int_eq(dist_tape_download(t, out, y[i], sizeof y[i]), DIST_OK);
        dist_tape_destroy(t);
    }
    ck_assert_int_eq(memcmp(y[0], y[1], sizeof y[0]), 0);
    dist_model_destroy(back);
    dist_model_destroy(m);
}
END_TEST

START_TEST(test_what_keras_cannot_hold_is_refused_and_nothing_is_written) {
    /* a model name with '/' (Keras refuses it in every name) */
    dist_model *m = NULL;
    ck_assert_int_eq(dist_model_create("team/net", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_flatten(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, (int64_t[]){3}, 1), DIST_OK);
    ck_assert_int_eq(dist_model_save_keras(m, path), DIST_UNSUPPORTED);
    ck_assert_msg(strstr(dist_last_error(), "model 'team/net'") && strstr(dist_last_error(), path),
                  "%s", dist_last_error());
    dist_model_destroy(m);
    /* a Dropout seed beyond int64, TensorFlow's seed type */
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dropout(m, 0.5f, UINT64_MAX), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, (int64_t[]){3}, 1), DIST_OK);
    ck_assert_int_eq(dist_model_save_keras(m, path), DIST_UNSUPPORTED);
    ck_assert_msg(strstr(dist_last_error(), "layer 'dropout' (Dropout): argument 'seed'"), "%s",
                  dist_last_error());
    dist_model_destroy(m);
    /* a model that is not built has no input shape for Keras */
    ck_assert_int_eq(dist_model_create_mnist_cnn(&m), DIST_OK);
    ck_assert_int_eq(dist_model_save_keras(m, path), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "not built"), "%s", dist_last_error());
    dist_model_destroy(m);
    ck_assert_int_eq(count_files(tmpdir), 0);

    m = seed_cnn(1);
    /* a name load_model would not open as a model archive */
    char other[200];
    snprintf(other, sizeof other, "%s/m.zip", tmpdir);
    ck_assert_int_eq(dist_model_save_keras(m, other), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "must end in .keras"), "%s", dist_last_error());
    /* a directory that does not exist: an I/O error naming the file */
    snprintf(other, sizeof other, "%s/missing/m.keras", tmpdir);
    ck_assert_int_eq(dist_model_save_keras(m, other), DIST_IO);
    ck_assert_msg(strstr(dist_last_error(), other), "%s", dist_last_error());
    ck_assert_int_eq(count_files(tmpdir), 0);
    dist_model_destroy(m);
}
END_TEST

static unsigned char *slurp(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)len + 1);
    ck_assert_uint_eq(fread(b, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return b;
}

START_TEST(test_a_full_disk_keeps_the_previous_file_whole) {
    dist_model *small = NULL;
    ck_assert_int_eq(dist_model_create(NULL, &small), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(small, 2, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(small, 1, (int64_t[]){3}, 1), DIST_OK);
    ck_assert_int_eq(dist_model_save_keras(small, path), DIST_OK);
    size_t n0 = 0;
    unsigned char *before = slurp(path, &n0);
    dist_model *big = seed_cnn(3); /* ~500 KB of weights */
    struct rlimit old, limit;
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    limit = old;
    limit.rlim_cur = 64 << 10; /* the write fails with EFBIG, as on a full disk */
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &limit), 0);
    dist_status st = dist_model_save_keras(big, path);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_DFL);
    ck_assert_int_eq(st, DIST_IO);
    ck_assert_msg(strstr(dist_last_error(), path), "%s", dist_last_error());
    size_t n1 = 0;
    unsigned char *after = slurp(path, &n1);
    ck_assert_uint_eq(n1, n0);
    ck_assert_mem_eq(after, before, n0);
    ck_assert_int_eq(count_files(tmpdir), 1); /* no temporary left */
    free(before);
    free(after);
    dist_model_destroy(big);
    dist_model_destroy(small);
}
END_TEST

/* ---- ModelCheckpoint writing Keras files ------------------------------------------------- */

static dist_strategy *one_device(void) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.kind = DIST_STRATEGY_ONE_DEVICE;
    o.devices = "cpu:0";
    o.threads_per_replica = 1;
    dist_strategy *s = NULL;
    ck_assert_msg(dist_strategy_create(&o, &s) == DIST_OK, "%s", dist_last_error());
    return s;
}

static dist_model *tiny_model(dist_strategy *s) {
    dist_model *m = NULL;
    ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(m, 1, (int64_t[]){4}, 1), DIST_OK);
    dist_strategy_scope_exit(s);
    return m;
}

/* Runs three epochs whose weights are all e + 1 in epoch e (0-based), with `monitor` taking
 * values[e], through ModelCheckpoint(file, save_best_only, monitor, mode); returns the epoch
 * (1-based) whose weights the file holds at the end, 0 if none was written. */
static int epoch_kept(const char *file, const char *monitor, dist_monitor_mode mode,
                      const double values[3]) {
    dist_strategy *s = one_device();
    dist_model *m = tiny_model(s);
    dist_fit_state fs = {.strategy = s, .model = m};
    dist_model_checkpoint_options o = DIST_MODEL_CHECKPOINT_OPTIONS_INIT;
    o.filepath = file;
    o.monitor = monitor;
    o.mode = mode;
    o.save_best_only = 1;
    dist_model_checkpoint *mc = NULL;
    ck_assert_int_eq(dist_model_checkpoint_create(&o, &mc), DIST_OK);
    dist_callback cb = dist_model_checkpoint_callback(mc);
    unlink(file);
    dist_logs empty = {0};
    ck_assert_int_eq(cb.on_train_begin(cb.user, &fs, &empty), DIST_OK);
    for (int e = 0; e < 3; e++) {
        float w[15];
        for (int i = 0; i < 15; i++) w[i] = (float)(e + 1);
        ck_assert_int_eq(dist_model_set_weights(m, w, 15), DIST_OK);
        dist_logs l;
        dist_logs_clear(&l);
        ck_assert_int_eq(dist_logs_set(&l, monitor, values[e]), DIST_OK);
        ck_assert_msg(cb.on_epoch_end(cb.user, &fs, e, &l) == DIST_OK, "%s", dist_last_error());
    }
    int kept = 0;
    if (access(file, F_OK) == 0) {
        ck_assert_str_eq(dist_model_checkpoint_last_path(mc), file);
        /* read back into another model: the first weight is the epoch number */
        size_t n = strlen(file);
        dist_model *back = NULL;
        if (n > 6 && strcmp(file + n - 6, ".keras") == 0) {
            back = model_from_archive(file);
        } else {
            back = tiny_model(s);
            ck_assert_int_eq(dist_model_load_keras_weights(back, file), DIST_OK);
        }
        float w[15];
        ck_assert_int_eq(dist_model_get_weights(back, 0, w, 15), DIST_OK);
        kept = (int)w[0];
        dist_model_destroy(back);
    }
    dist_model_checkpoint_destroy(mc);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
    return kept;
}

START_TEST(test_save_best_only_keeps_the_epoch_the_monitor_chose_not_a_later_worse_one) {
    /* epoch 3's val_loss is worse than epoch 2's: the file keeps epoch 2 */
    const double val_loss[3] = {0.50, 0.30, 0.40};
    ck_assert_int_eq(epoch_kept(path, "val_loss", DIST_MODE_AUTO, val_loss), 2);
    ck_assert_int_eq(epoch_kept(path, "val_loss", DIST_MODE_MIN, val_loss), 2);
    /* max: 0.30 and 0.40 are both below epoch 1's 0.50 */
    ck_assert_int_eq(epoch_kept(path, "val_loss", DIST_MODE_MAX, val_loss), 1);
    /* auto is max for a name with "acc" (ModelCheckpoint's rule) */
    ck_assert_int_eq(epoch_kept(path, "val_accuracy", DIST_MODE_AUTO, val_loss), 1);
    ck_assert_int_eq(epoch_kept(path, "val_accuracy", DIST_MODE_MIN, val_loss), 2);
    const double rising[3] = {0.2, 0.5, 0.9};
    ck_assert_int_eq(epoch_kept(path, "accuracy", DIST_MODE_AUTO, rising), 3);
    ck_assert_int_eq(epoch_kept(path, "loss", DIST_MODE_AUTO, rising), 1);
    /* a monitor that is NaN at every epoch never improves: nothing is written, as in Keras */
    const double nan3[3] = {NAN, NAN, NAN};
    ck_assert_int_eq(epoch_kept(path, "val_loss", DIST_MODE_AUTO, nan3), 0);
    /* a .weights.h5 name gets the weights alone (Keras 3's save_weights_only) */
    char h5[200];
    snprintf(h5, sizeof h5, "%s/best.weights.h5", tmpdir);
    ck_assert_int_eq(epoch_kept(h5, "val_loss", DIST_MODE_AUTO, val_loss), 2);
}
END_TEST

static Suite *keras_model_suite(void) {
    Suite *s = suite_create("keras_model");
    TCase *tc = tcase_create("keras_model");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_the_archive_holds_metadata_config_and_weights_stored_in_keras_order);
    tcase_add_test(tc, test_every_layer_kind_and_its_arguments_read_back_the_same);
    tcase_add_test(tc, test_masks_and_recurrent_dropout_read_back_the_same);
    tcase_add_test(tc, test_what_keras_cannot_hold_is_refused_and_nothing_is_written);
    tcase_add_test(tc, test_a_full_disk_keeps_the_previous_file_whole);
    tcase_add_test(tc, test_save_best_only_keeps_the_epoch_the_monitor_chose_not_a_later_worse_one);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return dist_test_run(keras_model_suite()); }
