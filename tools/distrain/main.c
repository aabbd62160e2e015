/* distrain: trains the seed CNN on MNIST with a tf.distribute-style strategy. Exit codes:
 * 0 success, 1 training or data error, 2 usage error. */
#include "evaluator.h"
#include "host_workers.h"
#include "interrupt.h"
#include "launcher.h"
#include "model_file.h"
#include "options.h"
#include "predict.h"
#include "print_cluster.h"
#include "settings_check.h"
#include "target_accuracy.h"
#include "version.h"
#include "weights_file.h"

#include <dist/checkpoint.h>
#include <dist/cluster.h>
#include <dist/data.h>
#include <dist/file.h>
#include <dist/fit.h>
#include <dist/loss_scale.h>
#include <dist/mnist.h>
#include <dist/nn.h>
#include <dist/optim.h>
#include <dist/policy.h>
#include <dist/strategy.h>
#include <dist/train.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct run_state {
    const distrain_options *o;
    dist_strategy *strategy;
    dist_model *model;
    /* what the model takes: images of in_shape (height, width, channels) and labels 0..classes-1
     * (the seed CNN's (28, 28, 1) and 10; --model: the Keras model's); the sources decode to it */
    int64_t in_shape[3]; /* the model's input: (H, W, C), or (T, 0, 0) for token ids */
    int tokens;          /* the model reads int32 token ids (an Embedding) */
    int classes;
    dist_optimizer *optimizer;
    dist_loss_scale_optimizer *loss_scale; /* NULL without loss scaling */
    dist_dtype_policy policy;
    dist_mnist *mnist;
    dist_dataset *train, *test, *val;
    int64_t train_examples, test_examples, val_examples;
    const char *data_source;
    double train_seconds;
    double train_wall_seconds;
    int64_t train_images_total, steps;
    double train_loss, train_accuracy, test_loss, test_accuracy;
    int trained;     /* at least one training step ran: the train metrics mean something */
    int epochs_done; /* epochs completed, resumes included */
    /* --checkpoint-best-only: an epoch improved and wrote --save-model */
    int best_model_saved;
    int threads;
    int host_workers;         /* > 1: workers of this cluster sharing this host's cores */
    int cluster_workers;      /* parameter_server: the cluster's worker tasks */
    const char *shared_cores; /* why the default thread count was divided, or NULL */
    int chief;                /* prints progress and writes the metrics (TF's chief rule) */
    /* parameter_server: the training closure's state on a worker, the data seed (each worker
     * shuffles its own copy of the training set in its own order), the chief's coordinator */
    dist_classifier_step ps_step;
    uint64_t data_seed;
    dist_coordinator *coordinator;
    int ps_dataset;
    distrain_target_accuracy target; /* --target-accuracy (target.target 0: off) */
    distrain_interrupt interrupt;    /* where a Ctrl-C stopped the training */
} run_state;

static int fail(const char *what) {
    fprintf(stderr, "distrain: %s: %s\n", what, dist_last_error());
    return 1;
}

/* Warnings always; information (such as which MNIST source was used and why the ones before
 * it were skipped) unless --quiet. */
static void on_log(dist_log_level level, const char *msg, void *user) {
    (void)user;
    fprintf(level <= DIST_LOG_WARN ? stderr : stdout, "%s%s\n",
            level <= DIST_LOG_WARN ? "distrain: " : "", msg);
}

/* (image uint8 [28,28], label uint8) slices borrowed from the MNIST set */
static dist_status slices(const dist_tensor *images, const dist_tensor *labels,
                          dist_dataset **out) {
    dist_tensor parts[2] = {*images, *labels};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    return dist_dataset_from_tensor_slices(ptrs, 2, 0, out);
}

/* After a transformation `st = f(*ds, next)`: replaces *ds by *next (reads *next only now,
 * after the call has written it). */
static dist_status chain(dist_dataset **ds, dist_status st, dist_dataset *const *next) {
    if (st) return st;
    dist_dataset_destroy(*ds);
    *ds = *next;
    return DIST_OK;
}

/* Reads every image of a JPEG or TFRecord split once, so that a corrupt file is found now
 * rather than after the training; *count (if not NULL) is the number of examples. */
static dist_status check_images(dist_dataset *ds, int64_t *count) {
    dist_iterator *it = NULL;
    dist_status st = dist_iterator_create(ds, &it);
    int64_t n = 0;
    for (int end = 0; !st && !end;) {
        dist_element e;
        st = dist_iterator_next(it, &e, &end);
        n += !st && !end;
    }
    dist_iterator_destroy(it);
    if (count) *count = n;
    return st;
}

/* Whether the image feature holds raw pixels: its first record is the model's height x width x
 * channels bytes (784 for the seed CNN) and neither PNG nor JPEG (tf.io.serialize_tensor-free
 * uint8 pixels, as numpy's tobytes() writes them); encoded images are decoded (and any other
 * bytes named as an error). */
static dist_status raw_images(dist_dataset *ds, int64_t pixels, int *raw) {
    dist_iterator *it = NULL;
    DIST_RETURN_IF_ERROR(dist_iterator_create(ds, &it));
    dist_element e;
    int end = 0;
    dist_status st = dist_iterator_next(it, &e, &end);
    *raw = 0;
    if (!st && !end) {
        const unsigned char *b = e.items[0]->data;
        int64_t n = e.items[0]->shape[0];
        int png = n >= 4 && b[0] == 0x89 && b[1] == 'P' && b[2] == 'N' && b[3] == 'G';
        int jpeg = n >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff;
        *raw = n == pixels && !png && !jpeg;
    }
    dist_iterator_destroy(it);
    return st;
}

/* One split of a --data-format tfrecord directory, named as TensorFlow Datasets names shards
 * (mnist-train.tfrecord-00000-of-00001): tf.train.Examples of an encoded image (PNG or JPEG
 * bytes, or the model's raw pixels) and an int64 label, decoded to uint8 images of the model's
 * input shape (resized as the JPEG folders are), read once now to count them and to find a
 * damaged record before the training. */
static int tfrecord_split(const run_state *s, const char *split, const char *what,
                          dist_dataset **out, int64_t *count) {
    const distrain_options *o = s->o;
    char pattern[4200];
    snprintf(pattern, sizeof pattern, "%s/*%s*.tfrecord*", o->data_dir, split);
    dist_tfrecord_options to = DIST_TFRECORD_OPTIONS_INIT;
    to.compression = (dist_tfrecord_compression)o->tfrecord_compression;
    const dist_feature_spec spec[2] = {
        {.key = o->image_feature, .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_U8},
        {.key = o->label_feature, .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64}};
    dist_decode_image_options di = DIST_DECODE_IMAGE_OPTIONS_INIT;
    di.height = (int)s->in_shape[0];
    di.width = (int)s->in_shape[1];
    di.channels = (int)s->in_shape[2];
    di.num_parallel = DIST_AUTOTUNE; /* decode threads tuned while it runs */
    dist_dataset *ds = NULL, *next;
    dist_status st = dist_dataset_from_tfrecord_glob(pattern, &to, &ds);
    if (s->tokens) {
        /* a token model: the input feature is an Int64List of T ids, read as int32, each
         * checked against the Embedding's vocabulary (a bad id is named before the training) */
        const dist_feature_spec ts[2] = {{.key = o->image_feature,
                                          .kind = DIST_FEATURE_FIXED_LEN,
                                          .dtype = DIST_I64,
                                          .ndim = 1,
                                          .shape = {s->in_shape[0]}},
                                         spec[1]};
        if (!st) st = chain(&ds, dist_dataset_parse_example(ds, ts, 2, &next), &next);
        if (!st)
            st = chain(&ds,
                       dist_dataset_map_token_ids(ds, dist_model_input_vocabulary(s->model), &next),
                       &next);
        goto counted;
    }
    if (!st) st = chain(&ds, dist_dataset_parse_example(ds, spec, 2, &next), &next);
    int raw = 0;
    if (!st) st = raw_images(ds, s->in_shape[0] * s->in_shape[1] * s->in_shape[2], &raw);
    if (!st && raw)
        st = chain(&ds, dist_dataset_map_decode_raw(ds, 0, DIST_U8, 3, s->in_shape, &next),
                   &next);
    else if (!st)
        st = chain(&ds, dist_dataset_map_decode_image(ds, &di, &next), &next);
counted:
    if (!st) st = check_images(ds, count);
    if (!st && *count == 0) {
        fprintf(stderr, "distrain: %s: the %s set has no examples\n", pattern, what);
        dist_dataset_destroy(ds);
        return 1;
    }
    if (st) {
        fprintf(stderr, "distrain: reading the %s records (%s): %s\n", what, pattern,
                dist_last_error());
        dist_dataset_destroy(ds);
        return 1;
    }
    *out = ds;
    return 0;
}

/* A batch holds at most the whole set: the batch buffer is sized by min(batch, examples), so
 * --batch-size 1048576 on a small set allocates the set, not a million rows. */
static int64_t batch_of(const distrain_options *o, int64_t examples) {
    return examples > 0 && examples < o->batch_size ? examples : o->batch_size;
}

static int load_data(run_state *s) {
    const distrain_options *o = s->o;
    dist_status st;
    dist_dataset *train = NULL, *test = NULL, *next;
    if (s->tokens && strcmp(o->data_format, "tfrecord") != 0) {
        fprintf(stderr,
                "distrain: --model: the model reads %lld token ids (an int32 input); give them "
                "as --data-format tfrecord (an Int64List feature of %lld ids and an int64 label "
                "per tf.train.Example), not %s\n",
                (long long)s->in_shape[0], (long long)s->in_shape[0], o->data_format);
        return 2;
    }
    if (strcmp(o->data_format, "jpeg-folder") == 0) {
        if (!o->data_dir) {
            fprintf(stderr, "distrain: --data-format jpeg-folder needs --data-dir (with train/ and "
                            "test/ class folders)\n");
            return 2;
        }
        char path[4096];
        dist_jpeg_folder_options jo = DIST_JPEG_FOLDER_OPTIONS_INIT;
        jo.height = (int)s->in_shape[0];
        jo.width = (int)s->in_shape[1];
        jo.channels = (int)s->in_shape[2];
        jo.num_threads = DIST_AUTOTUNE; /* decode threads tuned while it runs */
        snprintf(path, sizeof path, "%s/train", o->data_dir);
        if ((st = dist_dataset_from_jpeg_folder(path, &jo, &train)))
            return fail("reading the training images");
        /* One class list, the training split's (Keras's class_names): test/ may lack a class,
         * and a class folder that train/ does not have is refused before any training. */
        int nclasses = dist_dataset_class_count(train);
        if (nclasses > s->classes) {
            fprintf(stderr,
                    "distrain: --data-dir: '%s' has %d class folders; the model has %d "
                    "outputs\n",
                    path, nclasses, s->classes);
            dist_dataset_destroy(train);
            return 1;
        }
        const char **names = calloc((size_t)(nclasses > 0 ? nclasses : 1), sizeof *names);
        if (!names) {
            dist_dataset_destroy(train);
            fprintf(stderr, "distrain: out of memory\n");
            return 1;
        }
        for (int c = 0; c < nclasses; c++) names[c] = dist_dataset_class_name(train, c);
        snprintf(path, sizeof path, "%s/test", o->data_dir);
        st = dist_dataset_from_jpeg_folder_classes(path, &jo, names, nclasses, &test);
        free(names);
        if (st) {
            dist_dataset_destroy(train);
            return fail("reading the test images");
        }
        if ((st = check_images(test, NULL))) {
            dist_dataset_destroy(train);
            dist_dataset_destroy(test);
            return fail("checking the test images");
        }
        s->train_examples = dist_dataset_cardinality(train);
        s->test_examples = dist_dataset_cardinality(test);
        s->data_source = o->data_dir;
    } else if (strcmp(o->data_format, "tfrecord") == 0) {
        if (!o->data_dir) {
            fprintf(stderr, "distrain: --data-format tfrecord needs --data-dir (with "
                            "*train*.tfrecord* and *test*.tfrecord* files)\n");
            return 2;
        }
        if (tfrecord_split(s, "train", "training", &train, &s->train_examples)) return 1;
        if (tfrecord_split(s, "test", "test", &test, &s->test_examples)) {
            dist_dataset_destroy(train);
            return 1;
        }
        s->data_source = o->data_dir;
    } else {
        /* IDX images are 28 x 28 grayscale, labels 0..9: a model must take them as they are */
        if (s->in_shape[0] != 28 || s->in_shape[1] != 28 || s->in_shape[2] != 1 ||
            s->classes < 10) {
            fprintf(stderr,
                    "distrain: --model: the model takes (%lld, %lld, %lld) images into %d "
                    "classes; the IDX datasets are (28, 28, 1) images of 10 classes: use "
                    "--data-format jpeg-folder or tfrecord, whose images are decoded to the "
                    "model's input shape\n",
                    (long long)s->in_shape[0], (long long)s->in_shape[1],
                    (long long)s->in_shape[2], s->classes);
            return 2;
        }
        dist_mnist_options mo = DIST_MNIST_OPTIONS_INIT;
        mo.kind = o->dataset && strcmp(o->dataset, "fashion_mnist") == 0 ? DIST_MNIST_FASHION
                                                                         : DIST_MNIST_DIGITS;
        mo.data_dir = o->data_dir;
        if (dist_mnist_load(&mo, &s->mnist)) return fail("loading the data");
        s->data_source = dist_mnist_source(s->mnist);
        s->train_examples = dist_mnist_train_images(s->mnist)->shape[0];
        s->test_examples = dist_mnist_test_images(s->mnist)->shape[0];
        if (slices(dist_mnist_train_images(s->mnist), dist_mnist_train_labels(s->mnist), &train) ||
            slices(dist_mnist_test_images(s->mnist), dist_mnist_test_labels(s->mnist), &test))
            return fail("building the input pipeline");
    }
    /* An empty split would "train" nothing, or score an accuracy over nothing. */
    if (s->train_examples == 0 || s->test_examples == 0) {
        int empty_train = s->train_examples == 0;
        char file[4200];
        struct stat sb;
        if (!s->mnist)
            snprintf(file, sizeof file, "%s/%s", o->data_dir, empty_train ? "train" : "test");
        else if (o->data_dir)
            snprintf(file, sizeof file, "%s/%s-images-idx3-ubyte", o->data_dir,
                     empty_train ? "train" : "t10k");
        else
            snprintf(file, sizeof file, "%s", s->data_source);
        if (s->mnist && o->data_dir && stat(file, &sb) != 0) strcat(file, ".gz");
        fprintf(stderr, "distrain: %s: the %s set has no examples\n", file,
                empty_train ? "training" : "test");
        dist_dataset_destroy(train);
        dist_dataset_destroy(test);
        return 1;
    }
    /* --validation-split F: the last F of the training set, as Keras's validation_split. A JPEG
     * folder lists its files class by class, so they are first shuffled with the run's seed (the
     * same on every worker), as image_dataset_from_directory(shuffle=True, seed) does. */
    dist_dataset *val = NULL;
    if (o->validation_split > 0 && strcmp(o->data_format, "jpeg-folder") == 0 &&
        (st = chain(&train, dist_dataset_shuffle_files(train, (uint32_t)o->seed, &next), &next))) {
        dist_dataset_destroy(train);
        dist_dataset_destroy(test);
        return fail("--validation-split: shuffling the training files");
    }
    if (o->validation_split > 0) {
        int64_t split_at = (int64_t)((double)s->train_examples * (1.0 - o->validation_split));
        if (split_at < 1 || split_at >= s->train_examples) {
            fprintf(stderr,
                    "distrain: --validation-split %g leaves no training or no validation "
                    "examples of %lld\n",
                    o->validation_split, (long long)s->train_examples);
            dist_dataset_destroy(train);
            dist_dataset_destroy(test);
            return 2;
        }
        st = dist_dataset_skip(train, split_at, &val);
        if (!st) st = chain(&train, dist_dataset_take(train, split_at, &next), &next);
        if (!st && !s->tokens)
            st = chain(&val, dist_dataset_map_image_normalize(val, &next), &next);
        if (!st)
            st = chain(&val,
                       dist_dataset_batch(val, batch_of(o, s->train_examples - split_at), 0, &next),
                       &next);
        s->val_examples = s->train_examples - split_at;
        s->train_examples = split_at;
    }
    /* Shuffle the small uint8 examples, then normalize: the shuffle buffer holds 10,000
     * examples, 4x less memory than as floats. */
    if (!st) st = chain(&train, dist_dataset_shuffle(train, 10000, s->data_seed, 1, &next), &next);
    if (!st && !s->tokens)
        st = chain(&train, dist_dataset_map_image_normalize(train, &next), &next);
    if (!st && !s->tokens) st = chain(&test, dist_dataset_map_image_normalize(test, &next), &next);
    if (!st)
        st = chain(&train, dist_dataset_batch(train, batch_of(o, s->train_examples), 0, &next),
                   &next);
    /* tf.data.AUTOTUNE, as Keras guides recommend: the depth follows the consumer's waits */
    if (!st) st = chain(&train, dist_dataset_prefetch(train, DIST_AUTOTUNE, &next), &next);
    if (!st)
        st = chain(&test, dist_dataset_batch(test, batch_of(o, s->test_examples), 0, &next), &next);
    if (!st) st = chain(&test, dist_dataset_prefetch(test, DIST_AUTOTUNE, &next), &next);
    if (st) {
        dist_dataset_destroy(train);
        dist_dataset_destroy(test);
        dist_dataset_destroy(val);
        return fail("building the input pipeline");
    }
    s->train = train;
    s->test = test;
    s->val = val;
    return 0;
}

static void json_string(FILE *f, const char *text) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* Built in memory, then replaced atomically (dist_file_write_atomic): a crash or a full disk
 * leaves the previous metrics file whole. */
static int write_metrics(const run_state *s) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        perror(s->o->metrics_json);
        return 1;
    }
    char dev[32], train_loss[32] = "null", train_accuracy[32] = "null";
    /* null, not 0, when no step ran (a run resumed after its last epoch) */
    if (s->trained) {
        snprintf(train_loss, sizeof train_loss, "%.6f", s->train_loss);
        snprintf(train_accuracy, sizeof train_accuracy, "%.6f", s->train_accuracy);
    }
    fprintf(f, "{\n  \"strategy\": \"%s\",\n  \"replicas\": %d,\n  \"devices\": [",
            dist_strategy_name(s->strategy), dist_strategy_num_replicas_in_sync(s->strategy));
    for (int r = 0; r < dist_strategy_num_local_replicas(s->strategy); r++)
        fprintf(f, "%s\"%s\"", r ? ", " : "",
                dist_device_str(dist_strategy_replica_device(s->strategy, r), dev, sizeof dev));
    fprintf(f,
            "],\n  \"workers\": %d,\n  \"cross_device_ops\": \"%s\",\n  \"epochs\": %d,\n  "
            "\"steps\": %lld,\n  "
            "\"global_batch_size\": %lld,\n"
            "  \"train_loss\": %s,\n  \"train_accuracy\": %s,\n  \"test_loss\": %.6f,\n  "
            "\"test_accuracy\": %.6f,\n"
            "  \"train_images_per_sec\": %.1f,\n  \"train_seconds\": %.3f,\n  "
            "\"train_wall_seconds\": %.3f,\n  \"train_examples\": %lld,\n"
            "  \"test_examples\": %lld,\n  \"params\": %lld,\n  \"threads_per_replica\": %d,\n  "
            "\"data_source\": ",
            s->cluster_workers ? s->cluster_workers : dist_strategy_num_workers(s->strategy),
            dist_strategy_cross_device_name(s->strategy), s->epochs_done, (long long)s->steps,
            (long long)s->o->batch_size, train_loss, train_accuracy, s->test_loss, s->test_accuracy,
            s->train_seconds > 0 ? (double)s->train_images_total / s->train_seconds : 0.0,
            s->train_seconds, s->train_wall_seconds, (long long)s->train_examples,
            (long long)s->test_examples, (long long)dist_model_num_params(s->model), s->threads);
    json_string(f, s->data_source);
    fprintf(
        f, ",\n  \"dtype_policy\": \"%s\",\n  \"loss_scale\": ", dist_dtype_policy_name(s->policy));
    if (s->loss_scale)
        fprintf(f, "{\"dynamic\": %s, \"scale\": %.9g, \"skipped_steps\": %lld}",
                dist_loss_scale_is_dynamic(s->loss_scale) ? "true" : "false",
                (double)dist_loss_scale_loss_scale(s->loss_scale),
                (long long)dist_loss_scale_skipped_steps(s->loss_scale));
    else
        fputs("null", f);
    dist_graph_stats g;
    dist_strategy_graph_stats(s->strategy, &g);
    fprintf(f,
            ",\n  \"cuda_graphs\": {\"captured\": %lld, \"replayed\": %lld, \"eager_segments\": "
            "%lld, \"capture_failures\": %lld}",
            (long long)g.captured, (long long)g.replayed, (long long)g.eager_segments,
            (long long)g.capture_failures);
    if (s->o->target_accuracy > 0)
        fprintf(f,
                ",\n  \"target_accuracy\": {\"target\": %.6g, \"reached\": %s, \"epoch\": %d, "
                "\"epochs_evaluated\": %d}",
                s->o->target_accuracy, s->target.reached_epoch ? "true" : "false",
                s->target.reached_epoch, s->target.epochs_evaluated);
    fprintf(f, "\n}\n");
    int bad = fclose(f) != 0 || dist_file_write_atomic(s->o->metrics_json, text, len) != DIST_OK;
    if (bad) fprintf(stderr, "distrain: --metrics-json: %s\n", dist_last_error());
    free(text);
    return bad;
}

/* The callbacks the flags ask for, owned here. */
typedef struct callbacks {
    dist_progress_bar *bar;
    dist_backup_and_restore *backup;
    dist_model_checkpoint *checkpoint;
    dist_model_checkpoint *best_model; /* --save-model with --checkpoint-best-only */
    dist_tensorboard *tensorboard;
    dist_csv_logger *csv;
    dist_early_stopping *early;
    dist_reduce_lr_on_plateau *reduce_lr;
    dist_callback list[12];
    int count;
} callbacks;

static void callbacks_destroy(callbacks *c) {
    dist_progress_bar_destroy(c->bar);
    dist_backup_and_restore_destroy(c->backup);
    dist_model_checkpoint_destroy(c->checkpoint);
    dist_model_checkpoint_destroy(c->best_model);
    dist_tensorboard_destroy(c->tensorboard);
    dist_csv_logger_destroy(c->csv);
    dist_early_stopping_destroy(c->early);
    dist_reduce_lr_on_plateau_destroy(c->reduce_lr);
}

/* --checkpoint-best-only's ModelCheckpoint options for a file template (monitor, mode), or
 * plain ModelCheckpoint ones monitoring `monitor` without it. */
static dist_model_checkpoint_options checkpoint_options(const distrain_options *o, const char *tmpl,
                                                        const char *monitor) {
    dist_model_checkpoint_options mo = DIST_MODEL_CHECKPOINT_OPTIONS_INIT;
    mo.filepath = tmpl;
    mo.monitor = monitor;
    if (o->checkpoint_best_only) {
        const char *mode = o->checkpoint_mode ? o->checkpoint_mode : "auto";
        mo.save_best_only = 1;
        mo.monitor = o->checkpoint_monitor ? o->checkpoint_monitor : "val_loss";
        mo.mode = strcmp(mode, "min") == 0   ? DIST_MODE_MIN
                  : strcmp(mode, "max") == 0 ? DIST_MODE_MAX
                                             : DIST_MODE_AUTO;
    }
    return mo;
}

/* Order matters where callbacks interact: the checkpoint and the backup come last, so that at an
 * epoch end they save the learning rate ReduceLROnPlateau has just set (what the next epoch
 * uses), and the backup's restore at train begin follows the others' resets. */
static int callbacks_create(const run_state *s, callbacks *c) {
    const distrain_options *o = s->o;
    const char *monitor = s->val ? "val_loss" : "loss";
    memset(c, 0, sizeof *c);
    if (!o->quiet && s->chief) {
        if (dist_progress_bar_create(stdout, -1, &c->bar)) return fail("progress bar");
        c->list[c->count++] = dist_progress_bar_callback(c->bar);
    }
    if (o->logdir && s->chief) {
        dist_tensorboard_options to = DIST_TENSORBOARD_OPTIONS_INIT;
        to.logdir = o->logdir;
        to.histogram_freq = o->histogram_freq;
        to.update_freq = o->update_freq;
        if (dist_tensorboard_create_with_options(&to, &c->tensorboard)) return fail("--logdir");
        c->list[c->count++] = dist_tensorboard_callback(c->tensorboard);
    }
    if (o->csv_log && s->chief) {
        if (dist_csv_logger_create(o->csv_log, ',', 0, &c->csv)) return fail("--csv-log");
        c->list[c->count++] = dist_csv_logger_callback(c->csv);
    }
    if (o->reduce_lr_patience >= 0) {
        dist_reduce_lr_on_plateau_options ro = DIST_REDUCE_LR_ON_PLATEAU_OPTIONS_INIT;
        ro.monitor = monitor;
        ro.factor = o->reduce_lr_factor;
        ro.patience = o->reduce_lr_patience;
        if (dist_reduce_lr_on_plateau_create(&ro, &c->reduce_lr))
            return fail("--reduce-lr-patience");
        c->list[c->count++] = dist_reduce_lr_on_plateau_callback(c->reduce_lr);
    }
    if (o->early_stopping_patience >= 0) {
        dist_early_stopping_options eo = DIST_EARLY_STOPPING_OPTIONS_INIT;
        eo.monitor = monitor;
        eo.patience = o->early_stopping_patience;
        eo.restore_best_weights = o->restore_best_weights;
        if (dist_early_stopping_create(&eo, &c->early)) return fail("--early-stopping-patience");
        c->list[c->count++] = dist_early_stopping_callback(c->early);
    }
    if (o->checkpoint_dir && s->chief) {
        char tmpl[4096];
        if (mkdir(o->checkpoint_dir, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "distrain: --checkpoint-dir: cannot create '%s': %s\n",
                    o->checkpoint_dir, strerror(errno));
            return 1;
        }
        snprintf(tmpl, sizeof tmpl, "%s/ckpt-{epoch:02d}.safetensors", o->checkpoint_dir);
        dist_model_checkpoint_options mo = checkpoint_options(o, tmpl, monitor);
        if (dist_model_checkpoint_create(&mo, &c->checkpoint)) return fail("--checkpoint-dir");
        c->list[c->count++] = dist_model_checkpoint_callback(c->checkpoint);
    }
    if (o->save_model && o->checkpoint_best_only && s->chief) {
        /* ModelCheckpoint("FILE.keras", save_best_only=True): the name's braces doubled, so
         * that the template is the name itself */
        char tmpl[8192];
        size_t n = 0;
        for (const char *p = o->save_model; *p && n + 3 < sizeof tmpl; p++) {
            if (*p == '{' || *p == '}') tmpl[n++] = *p;
            tmpl[n++] = *p;
        }
        tmpl[n] = '\0';
        dist_model_checkpoint_options mo = checkpoint_options(o, tmpl, monitor);
        if (dist_model_checkpoint_create(&mo, &c->best_model)) return fail("--save-model");
        c->list[c->count++] = dist_model_checkpoint_callback(c->best_model);
    }
    if (o->backup_dir) {
        if (dist_backup_and_restore_create(o->backup_dir, o->backup_freq, 1, &c->backup))
            return fail("--backup-dir");
        c->list[c->count++] = dist_backup_and_restore_callback(c->backup);
    }
    return 0;
}

static dist_status write_weights(const run_state *s, const char *path) {
    return distrain_save_weights(s->model, path);
}

/* After a late write failed (the paths were fine before the first step): the trained weights
 * go to the output folder (that of --save-weights, else the working directory), else to a new
 * directory that only this user can enter, made under $TMPDIR or /tmp, and the message says
 * where, rather than being lost. Never a fixed name in a shared /tmp: anyone could have made
 * it first. Every file goes through the atomic writer (a temporary created with O_EXCL). */
static void rescue_weights(const run_state *s) {
    char dir[4096], path[4200];
    const char *sw = s->o->save_weights, *slash = sw ? strrchr(sw, '/') : NULL;
    if (slash)
        snprintf(dir, sizeof dir, "%.*s", slash == sw ? 1 : (int)(slash - sw), sw);
    else if (!getcwd(dir, sizeof dir))
        strcpy(dir, ".");
    snprintf(path, sizeof path, "%s/distrain-weights-%ld.safetensors", dir, (long)getpid());
    if (write_weights(s, path) == DIST_OK) {
        fprintf(stderr, "distrain: the trained weights are saved in '%s'\n", path);
        return;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/distrain-weights-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (mkdtemp(dir)) {
        snprintf(path, sizeof path, "%s/weights.safetensors", dir);
        if (write_weights(s, path) == DIST_OK) {
            fprintf(stderr, "distrain: the trained weights are saved in '%s'\n", path);
            return;
        }
        rmdir(dir);
    }
    fprintf(stderr, "distrain: the trained weights could not be saved anywhere\n");
}

/* --save-model: the model as Keras 3's .keras, written by the chief only (as every output);
 * when that fails, the weights are rescued as after any late write failure. */
static int save_model(const run_state *s) {
    if (!s->chief) return 0;
    if (dist_model_save_keras(s->model, s->o->save_model) == DIST_OK) return 0;
    fail("--save-model");
    if (!s->o->save_weights) rescue_weights(s); /* else the weights are in that file */
    return 1;
}

/* Only the chief writes the final weights (TF's chief rule); the others write nothing. */
static int save_weights(const run_state *s) {
    if (!s->chief) return 0;
    if (write_weights(s, s->o->save_weights) == DIST_OK) return 0;
    fail("--save-weights");
    rescue_weights(s);
    return 1;
}

/* After a Ctrl-C: say where the training stopped, keep the weights (--save-weights, else a
 * rescue file; the chief only, as every write) and exit 130, as a shell reports SIGINT. A
 * --backup-dir backup stays for a restart to resume from, as Keras's BackupAndRestore keeps
 * it when training is interrupted. */
static int stop_interrupted(const run_state *s) {
    const distrain_interrupt *w = &s->interrupt;
    if (w->stopped)
        fprintf(stderr,
                "distrain: interrupted: stopped after step %lld of epoch %d (%lld steps "
                "in all)\n",
                (long long)w->step, w->epoch, (long long)w->global_step);
    else
        fprintf(stderr, "distrain: interrupted\n");
    if (s->chief) {
        if (s->o->save_weights && write_weights(s, s->o->save_weights) == DIST_OK)
            fprintf(stderr, "distrain: the weights are saved in '%s'\n", s->o->save_weights);
        else
            rescue_weights(s);
        /* the best epoch's model, if any, is already in the file */
        if (s->o->save_model && !s->o->checkpoint_best_only &&
            dist_model_save_keras(s->model, s->o->save_model) == DIST_OK)
            fprintf(stderr, "distrain: the model is saved in '%s'\n", s->o->save_model);
    }
    if (s->o->backup_dir)
        fprintf(stderr, "distrain: the backup in '%s' is kept: run the same command to resume\n",
                s->o->backup_dir);
    return 130;
}

static int fit(run_state *s, dist_distributed_dataset *dtrain, dist_distributed_dataset *dval,
               dist_distributed_dataset *dtest) {
    const distrain_options *o = s->o;
    callbacks cbs;
    int rc = callbacks_create(s, &cbs);
    if (rc) {
        callbacks_destroy(&cbs);
        return rc;
    }
    if (o->target_accuracy > 0) {
        /* after the others: an epoch's checkpoint and backup are written before it stops */
        s->target = (distrain_target_accuracy){.strategy = s->strategy,
                                               .model = s->model,
                                               .test = dtest,
                                               .target = o->target_accuracy,
                                               .out = !o->quiet && s->chief ? stdout : NULL};
        cbs.list[cbs.count++] = distrain_target_accuracy_callback(&s->target);
    }
    cbs.list[cbs.count++] = distrain_interrupt_callback(&s->interrupt);
    dist_fit_options fo = DIST_FIT_OPTIONS_INIT;
    fo.coordinator = s->coordinator; /* parameter_server: steps are closures on the workers */
    fo.closure = "distrain.train";
    fo.dataset = s->ps_dataset;
    fo.epochs = o->epochs;
    fo.steps_per_epoch = (s->train_examples + o->batch_size - 1) / o->batch_size;
    if (o->max_steps && o->max_steps < fo.steps_per_epoch) fo.steps_per_epoch = o->max_steps;
    fo.seed = o->seed;
    fo.loss_scale = s->loss_scale;
    fo.steps_per_execution = o->steps_per_execution;
    if (o->trace && dist_trace_create(&fo.trace)) {
        callbacks_destroy(&cbs);
        return fail("--trace");
    }
    dist_fit_result res;
    memset(&res, 0, sizeof res);
    char training_error[1024] = "";
    int late_failure = 0; /* an output failed after a successful training */
    /* --epochs 0: no training at all, only the evaluation below (of --load-weights) */
    dist_status st = o->epochs == 0 ? DIST_OK
                                    : dist_fit(s->strategy, s->model, s->optimizer, dtrain, dval,
                                               &fo, cbs.list, cbs.count, &res);
    s->best_model_saved = cbs.best_model && dist_model_checkpoint_last_path(cbs.best_model)[0];
    callbacks_destroy(&cbs);
    /* A failed run's timeline is written too: it shows where the time went before the error. */
    if (fo.trace) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dist_last_error());
        char own[4200];
        const char *path = o->trace;
        if (!s->chief) {
            /* Each worker's own file: several on one host would otherwise write one path. */
            snprintf(own, sizeof own, "%s.worker-%d", o->trace,
                     dist_strategy_worker_id(s->strategy));
            path = own;
        }
        dist_status wst = dist_trace_write(fo.trace, path);
        dist_trace_destroy(fo.trace);
        /* The training went well: evaluate and keep the weights, then fail. */
        if (wst) fprintf(stderr, "distrain: --trace: %s\n", dist_last_error());
        late_failure = wst != DIST_OK;
        if (st) snprintf(training_error, sizeof training_error, "%s", msg);
    } else if (st) {
        snprintf(training_error, sizeof training_error, "%s", dist_last_error());
    }
    if (distrain_interrupted()) return stop_interrupted(s);
    if (st) {
        fprintf(stderr, "distrain: training: %s\n", training_error);
        /* A callback's write failed (checkpoint, backup, CSV, logs): the weights so far are
         * kept rather than lost. */
        if (st == DIST_IO && s->chief) rescue_weights(s);
        return 1;
    }
    dist_logs_get(&res.logs, "loss", &s->train_loss);
    dist_logs_get(&res.logs, "accuracy", &s->train_accuracy);
    s->steps = res.global_step;
    s->trained = res.steps > 0;
    s->epochs_done = res.epochs_done;
    s->train_seconds = res.step_seconds;
    s->train_wall_seconds = res.wall_seconds;
    s->train_images_total = res.images;
    dist_logs test;
    st = dist_evaluate(s->strategy, s->model, dtest, NULL, NULL, 0, &test);
    if (distrain_interrupted()) return stop_interrupted(s);
    if (st) return fail("evaluation");
    dist_logs_get(&test, "loss", &s->test_loss);
    dist_logs_get(&test, "accuracy", &s->test_accuracy);
    double evaluated = (double)s->test_examples;
    dist_logs_get(&test, "examples", &evaluated);
    if (!o->quiet && dist_strategy_is_chief(s->strategy))
        printf("Test loss: %.4f - test accuracy: %.4f (%lld examples)\n", s->test_loss,
               s->test_accuracy, (long long)evaluated);
    if (o->target_accuracy > 0 && !o->quiet && dist_strategy_is_chief(s->strategy)) {
        if (s->target.reached_epoch)
            printf("Target accuracy %.4g reached after epoch %d\n", o->target_accuracy,
                   s->target.reached_epoch);
        else
            printf("Target accuracy %.4g not reached in %d epochs\n", o->target_accuracy,
                   s->target.epochs_evaluated);
    }
    if (o->save_weights) {
        if (save_weights(s)) return 1;
    } else if (late_failure && s->chief) {
        rescue_weights(s);
    }
    if (o->save_model && !o->checkpoint_best_only && save_model(s)) return 1;
    if (o->save_model && o->checkpoint_best_only && s->chief && !s->best_model_saved) {
        /* as Keras's ModelCheckpoint: no epoch improved (a NaN monitor), nothing was written */
        fprintf(stderr, "distrain: --save-model: no epoch improved %s, so '%s' was not written\n",
                o->checkpoint_monitor ? o->checkpoint_monitor : "val_loss", o->save_model);
        return 1;
    }
    return late_failure;
}

/* --loss-scale, defaulting to dynamic for float16 (Keras's mixed_float16 advice) and to none
 * for float32 and bfloat16, whose range is float32's. */
static dist_status make_loss_scale(run_state *s) {
    const char *ls = s->o->loss_scale;
    if (!ls) ls = s->policy == DIST_POLICY_MIXED_FLOAT16 ? "dynamic" : "none";
    if (strcmp(ls, "none") == 0) return DIST_OK;
    dist_loss_scale_options lo = DIST_LOSS_SCALE_OPTIONS_INIT;
    if (strncmp(ls, "dynamic", 7) != 0) lo.dynamic = 0;
    if (strcmp(ls, "dynamic") != 0) lo.initial_scale = (float)s->o->loss_scale_value;
    return dist_loss_scale_optimizer_create(s->optimizer, &lo, &s->loss_scale);
}

/* multi_worker with FILE sharding: this worker's TFRecord shards through the whole pipeline
 * (tf.data's FILE policy), its global batches split into per-replica batches. */
static dist_status file_shard_fn(const dist_input_context *ctx, void *user, dist_dataset **out) {
    run_state *s = user;
    return dist_dataset_auto_shard(s->train, DIST_AUTO_SHARD_FILE, ctx->num_input_pipelines,
                                   ctx->input_pipeline_id, ctx->num_replicas_in_sync, out);
}

/* multi_worker: 1 when each worker reads its own TFRecord shards (--auto-shard file, or auto
 * when the shards give every worker as many batches: synchronous steps need that), 0 when
 * every worker reads all the data and keeps its replicas' part of each batch (DATA), -1 after
 * printing why --auto-shard file cannot be honoured. *mine: this worker's examples. */
static int choose_file_sharding(run_state *s, int64_t *mine) {
    const distrain_options *o = s->o;
    int want = strcmp(o->auto_shard, "file") == 0;
    if (strcmp(o->auto_shard, "data") == 0) return 0;
    if (strcmp(o->data_format, "tfrecord") != 0 || o->validation_split > 0) {
        if (!want) return 0;
        fprintf(stderr, "distrain: --auto-shard file needs --data-format tfrecord shards and no "
                        "--validation-split (the split is taken from the whole training set)\n");
        return -1;
    }
    int workers = dist_strategy_num_workers(s->strategy);
    int64_t batches0 = -1, rows0 = -1;
    for (int w = 0; w < workers; w++) {
        dist_dataset *part = NULL;
        dist_status st =
            dist_dataset_auto_shard(s->train, DIST_AUTO_SHARD_FILE, workers, w, 1, &part);
        if (st != DIST_OK) {
            if (!want) return 0;
            fprintf(stderr, "distrain: --auto-shard file: %s\n", dist_last_error());
            return -1;
        }
        dist_iterator *it = NULL;
        int64_t batches = 0, rows = 0;
        st = dist_iterator_create(part, &it);
        for (int end = 0; !st && !end;) {
            dist_element e;
            st = dist_iterator_next(it, &e, &end);
            if (!st && !end) {
                batches++;
                rows += e.items[0]->shape[0];
            }
        }
        dist_iterator_destroy(it);
        dist_dataset_destroy(part);
        if (st != DIST_OK) {
            fprintf(stderr, "distrain: reading worker %d's shards: %s\n", w, dist_last_error());
            return -1;
        }
        if (w == dist_strategy_worker_id(s->strategy)) *mine = rows;
        if (w == 0) {
            batches0 = batches;
            rows0 = rows;
        } else if (batches != batches0) {
            if (!want) return 0;
            fprintf(stderr,
                    "distrain: --auto-shard file: worker 0's shards make %lld batches of %lld, "
                    "worker %d's %lld (%lld and %lld examples); synchronous training needs as "
                    "many on every worker: split the data into shards of equal size, or use "
                    "--auto-shard data\n",
                    (long long)batches0, (long long)o->batch_size, w, (long long)batches,
                    (long long)rows0, (long long)rows);
            return -1;
        }
    }
    return 1;
}

/* parameter_server: each worker's dataset is its own shuffle of the training set (its data
 * seed), in per-replica batches. */
static dist_status ps_dataset_fn(const dist_input_context *ctx, void *user, dist_dataset **out) {
    run_state *s = user;
    if (ctx->num_replicas_in_sync == 1) {
        *out = dist_dataset_retain(s->train);
        return DIST_OK;
    }
    return dist_dataset_rebatch(s->train, ctx->num_replicas_in_sync, out);
}

/* parameter_server, every task: the names the chief schedules and the workers run. */
static dist_status ps_register(run_state *s) {
    s->ps_step = (dist_classifier_step){s->model, s->optimizer, 0, NULL};
    DIST_RETURN_IF_ERROR(dist_strategy_register_function(
        s->strategy, "distrain.train", dist_classifier_train_closure, &s->ps_step));
    return dist_strategy_register_dataset_function(s->strategy, "distrain.train", ps_dataset_fn, s);
}

static int train(run_state *s) {
    const distrain_options *o = s->o;
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = o->strategy_kind; /* parsed with the flags */
    int ps_kind = so.kind == DIST_STRATEGY_PARAMETER_SERVER;
    int cpus = dist_device_count(DIST_DEVICE_CPU);
    if ((so.kind == DIST_STRATEGY_MULTI_WORKER &&
         !(o->transport && !strcmp(o->transport, "mpi"))) ||
        ps_kind) {
        /* Resolved here first so that every invalid TF_CONFIG, malformed JSON included, is a
         * usage error, and a role distrain does not play is refused before anything starts. */
        dist_cluster *cl = NULL;
        if (dist_cluster_resolve(NULL, &cl)) {
            fprintf(stderr, "distrain: TF_CONFIG: %s\n", dist_last_error());
            return 2;
        }
        char type[32];
        snprintf(type, sizeof type, "%s",
                 dist_cluster_task_type(cl) ? dist_cluster_task_type(cl) : "");
        int evaluator = strcmp(type, "evaluator") == 0, ps_task = strcmp(type, "ps") == 0;
        if (ps_kind) {
            /* the steps run on the workers; the chief coordinates, the ps tasks update */
            s->host_workers = strcmp(type, "worker") == 0 ? distrain_host_tasks(cl, "worker") : 0;
            s->cluster_workers = (int)dist_cluster_num_tasks(cl, "worker");
        } else {
            s->host_workers = distrain_host_tasks(cl, NULL);
        }
        dist_cluster_destroy(cl);
        if (evaluator || (ps_task && !ps_kind)) {
            fprintf(stderr,
                    "distrain: TF_CONFIG: task type '%s' is not supported: distrain trains as "
                    "a chief or worker only (or evaluates, as TF_CONFIG's evaluator task or "
                    "with --task evaluator)\n",
                    type);
            return 2;
        }
        if (ps_kind && !o->threads && strcmp(type, "worker") != 0) {
            /* a chief or ps task of a cluster: it leaves the cores to the workers */
            so.threads_per_replica = 1;
            s->shared_cores = "the workers compute; this task coordinates or holds variables";
        }
    }
    so.devices = o->devices;
    if (!so.threads_per_replica) so.threads_per_replica = o->threads;
    if (!o->threads && s->host_workers > 1) {
        /* Workers started by hand on one host would each take every core (1,250 images/s
         * against 15,000 with --threads 1 for two of them): they share the cores instead. */
        int replicas = 1;
        for (const char *p = o->devices; p && *p; p++) replicas += *p == ',';
        int t = cpus / (s->host_workers * replicas);
        so.threads_per_replica = t > 0 ? t : 1;
        s->shared_cores = "workers of this cluster share this host's cores";
    }
    so.deterministic = o->deterministic;
    so.cuda_graphs = o->cuda_graphs;
    so.collective_timeout_s = o->collective_timeout_s;
    so.cluster.connect_timeout_s = o->connect_timeout_s;
    so.cluster.allow_insecure = o->insecure;
    so.overlap_gradients = o->overlap_gradients;
    so.bytes_per_pack = (size_t)o->bytes_per_pack;
    if (o->gradient_compression)
        so.gradient_wire_dtype = strcmp(o->gradient_compression, "bf16") == 0   ? DIST_BF16
                                 : strcmp(o->gradient_compression, "fp16") == 0 ? DIST_F16
                                                                                : DIST_F32;
    so.ps.variable_partitioner = &o->partitioner;
    so.tpu.pjrt_plugin = o->pjrt_plugin;
    so.tpu.name = o->tpu;
    so.tpu.cores = o->tpu_cores;
    if (o->token_file) setenv("DIST_CLUSTER_TOKEN_FILE", o->token_file, 1);
    /* read by every CPU backend the strategy creates */
    if (o->conv_algorithm)
        setenv("DIST_CPU_WINOGRAD", strcmp(o->conv_algorithm, "winograd") == 0 ? "1" : "0", 1);
    if (o->transport)
        so.cluster.transport = strcmp(o->transport, "tcp") == 0   ? DIST_TRANSPORT_TCP
                               : strcmp(o->transport, "shm") == 0 ? DIST_TRANSPORT_SHM
                               : strcmp(o->transport, "mpi") == 0 ? DIST_TRANSPORT_MPI
                               : strcmp(o->transport, "tls") == 0 ? DIST_TRANSPORT_TLS
                                                                  : DIST_TRANSPORT_AUTO;
    so.cluster.tls_cert = o->tls_cert;
    so.cluster.tls_key = o->tls_key;
    so.cluster.tls_ca = o->tls_ca;
    dist_status st = dist_strategy_create(&so, &s->strategy);
    if (st == DIST_INVALID_ARGUMENT || st == DIST_NOT_FOUND || st == DIST_UNSUPPORTED) {
        fprintf(stderr, "distrain: %s\n", dist_last_error());
        return 2;
    }
    if (st) return fail("creating the strategy");
    if (so.kind == DIST_STRATEGY_TPU &&
        o->batch_size % dist_strategy_num_replicas_in_sync(s->strategy) != 0) {
        /* --tpu-cores given was checked with the flags; this is the plugin's device count */
        fprintf(stderr,
                "distrain: --batch-size %lld does not split evenly over the %d replicas of "
                "--strategy tpu (the plugin's devices): use a multiple of %d, or --tpu-cores\n",
                (long long)o->batch_size, dist_strategy_num_replicas_in_sync(s->strategy),
                dist_strategy_num_replicas_in_sync(s->strategy));
        return 2;
    }
    s->chief = dist_strategy_is_chief(s->strategy);
    const char *role = dist_strategy_task_type(s->strategy);
    if (ps_kind && strcmp(role, "ps") == 0) {
        /* a ps task holds variables until the chief shuts the cluster down */
        if (!o->quiet)
            printf("ps %d: holding variables for the chief, %d compute thread(s)\n",
                   dist_strategy_task_index(s->strategy),
                   dist_strategy_threads_per_replica(s->strategy));
        if (dist_strategy_serve(s->strategy)) return fail("serving the variables");
        return 0;
    }
    s->data_seed = o->seed;
    if (ps_kind && strcmp(role, "worker") == 0)
        s->data_seed = o->seed + 1000003u * (uint64_t)(dist_strategy_task_index(s->strategy) + 1);
    /* The other workers repeat what the chief says: only their warnings and errors show. */
    if (!s->chief) dist_set_log_callback(on_log, DIST_LOG_WARN, NULL);
    int replicas = dist_strategy_num_local_replicas(s->strategy);
    if (o->threads > cpus)
        fprintf(stderr, "distrain: warning: --threads %d is more than this host's %d cores\n",
                o->threads, cpus);
    s->threads = dist_strategy_threads_per_replica(s->strategy);
    if (!s->threads) /* no local CPU replica (tpu: the plugin's devices) */
        s->threads = so.threads_per_replica ? so.threads_per_replica
                                            : (cpus / replicas > 0 ? cpus / replicas : 1);
    int rc = distrain_check_settings(s->strategy, o);
    if (rc) return rc;
    /* the model first: the sources decode images to its input shape */
    if (dist_strategy_scope_enter(s->strategy)) return fail("entering the strategy scope");
    s->in_shape[0] = 28, s->in_shape[1] = 28, s->in_shape[2] = 1;
    s->classes = 10;
    if (o->model_file) {
        rc = distrain_model_from_file(o->model_file, o->seed, &s->model, s->in_shape, &s->classes,
                                      &s->tokens);
        if (rc) return rc;
        st = DIST_OK;
    } else {
        st = dist_model_create_mnist_cnn(&s->model);
        if (!st) st = dist_model_build(s->model, 3, s->in_shape, o->seed);
    }
    if (!st && strcmp(o->optimizer, "sgd") == 0) {
        dist_sgd_options sg = DIST_SGD_OPTIONS_INIT;
        if (o->learning_rate > 0) sg.learning_rate = (float)o->learning_rate;
        st = dist_optimizer_create_sgd(&sg, &s->optimizer);
    } else if (!st) {
        dist_adam_options ad = DIST_ADAM_OPTIONS_INIT;
        if (o->learning_rate > 0) ad.learning_rate = (float)o->learning_rate;
        st = dist_optimizer_create_adam(&ad, &s->optimizer);
    }
    if (!st && o->lr_schedule_given)
        st = dist_optimizer_set_lr_schedule(s->optimizer, &o->lr_schedule);
    if (!st)
        st = dist_optimizer_set_clipping(s->optimizer, (float)o->clipnorm, (float)o->clipvalue,
                                         (float)o->global_clipnorm);
    if (!st && o->check_numerics) st = dist_model_set_check_numerics(s->model, 1);
    if (!st) st = dist_dtype_policy_parse(o->mixed_precision, &s->policy);
    if (!st) st = dist_model_set_dtype_policy(s->model, s->policy);
    if (!st) st = make_loss_scale(s);
    if (st) return fail("building the model");
    if (dist_strategy_scope_exit(s->strategy)) return fail("leaving the strategy scope");
    rc = load_data(s);
    if (rc) return rc;
    /* Every task loads them (a ps task never gets here; under parameter_server the chief's
     * load restores them on the ps tasks, and the workers read them from there). */
    if (o->load_weights && !(ps_kind && strcmp(role, "worker") == 0) &&
        distrain_load_weights(s->model, o->load_weights))
        return fail("--load-weights");
    if (ps_kind && ps_register(s)) return fail("registering the training step");
    if (ps_kind && strcmp(role, "worker") == 0) {
        /* the worker runs the chief's closures until it shuts the cluster down */
        if (!o->quiet) {
            printf("worker %d: running the chief's steps, %d thread(s) per replica",
                   dist_strategy_task_index(s->strategy), s->threads);
            if (!o->threads && s->host_workers > 1)
                printf(" (%d workers share this host's %d cores; --threads overrides)",
                       s->host_workers, cpus);
            printf("\n");
        }
        /* its own info lines (the chief runs no step, so none repeats the chief's): where it
         * serves, the kernels it chose, and when the chief shuts the cluster down where its
         * closures' time went */
        if (!o->quiet) dist_set_log_callback(on_log, DIST_LOG_INFO, NULL);
        if (dist_strategy_serve(s->strategy)) return fail("serving the chief");
        return 0;
    }

    if (!o->quiet && s->chief) {
        char summary[8192];
        dist_model_summary(s->model, summary, sizeof summary);
        fputs(summary, stdout);
        char dev[32];
        printf("Strategy: %s, %d replica(s) [", dist_strategy_name(s->strategy), replicas);
        for (int r = 0; r < replicas; r++)
            printf("%s%s", r ? ", " : "",
                   dist_device_str(dist_strategy_replica_device(s->strategy, r), dev, sizeof dev));
        printf("], %s reduction, %d thread(s) per replica, global batch %lld\n",
               dist_strategy_cross_device_name(s->strategy), s->threads, (long long)o->batch_size);
        if (o->scale_lr != DIST_LR_SCALING_NONE)
            printf("Learning rate: %g (%g scaled %s from batch %lld to global batch %lld)\n",
                   o->learning_rate, o->base_learning_rate, dist_lr_scaling_name(o->scale_lr),
                   (long long)o->base_batch, (long long)o->batch_size);
        if (s->policy == DIST_POLICY_FLOAT32 && s->loss_scale)
            printf("Loss scale: %s %g\n",
                   dist_loss_scale_is_dynamic(s->loss_scale) ? "dynamic from" : "fixed",
                   (double)dist_loss_scale_loss_scale(s->loss_scale));
        if (s->policy != DIST_POLICY_FLOAT32) {
            if (s->policy == DIST_POLICY_MIXED_BFLOAT16)
                printf("Mixed precision: %s (float32 variables; %s)",
                       dist_dtype_policy_name(s->policy),
                       dist_cpu_bfloat16_kernels(o->deterministic));
            else
                printf("Mixed precision: %s (float32 variables; float32 kernels, values stored at "
                       "%s precision)",
                       dist_dtype_policy_name(s->policy),
                       dist_dtype_name(dist_dtype_policy_compute_dtype(s->policy)));
            if (s->loss_scale && dist_loss_scale_is_dynamic(s->loss_scale))
                printf(", dynamic loss scale from %g\n",
                       (double)dist_loss_scale_loss_scale(s->loss_scale));
            else if (s->loss_scale)
                printf(", fixed loss scale %g\n",
                       (double)dist_loss_scale_loss_scale(s->loss_scale));
            else
                printf(", no loss scaling\n");
        }
        if (!o->threads && s->host_workers > 1)
            printf("Threads: %d workers share this host's %d cores: %d thread(s) per replica "
                   "(--threads overrides)\n",
                   s->host_workers, cpus, s->threads);
        else if (!o->threads && s->shared_cores)
            printf("Threads: %d per replica: %s (--threads overrides)\n", s->threads,
                   s->shared_cores);
        else if (!o->threads && s->threads * replicas < cpus && cpus / replicas > 1 &&
                 dist_strategy_replica_device(s->strategy, 0).kind == DIST_DEVICE_CPU)
            /* the strategy counted only the cores other programs left free (a look at the
             * load when it was made): say so, and what it left out */
            printf("Threads: %d per replica: other programs keep %d of this host's %d cores "
                   "busy (--threads overrides)\n",
                   s->threads, cpus - s->threads * replicas, cpus);
        if (ps_kind)
            printf("Cluster: parameter_server, this is the chief (coordinator); steps run on the "
                   "workers as closures, variables live on the ps tasks\n");
        if (dist_strategy_num_workers(s->strategy) > 1)
            printf("Cluster: %d workers, %d replicas in sync; this is worker %d (chief)\n",
                   dist_strategy_num_workers(s->strategy),
                   dist_strategy_num_replicas_in_sync(s->strategy),
                   dist_strategy_worker_id(s->strategy));
        if (s->mnist)
            printf("Data: %s\n", s->data_source);
        else
            printf("Data: %s under %s (%lld train / %lld test images)\n",
                   strcmp(s->o->data_format, "tfrecord") == 0 ? "TFRecord files"
                                                              : "JPEG class folders",
                   s->data_source, (long long)s->train_examples, (long long)s->test_examples);
    }
    int by_file = 0;
    int64_t my_examples = 0;
    if (!rc && !ps_kind && dist_strategy_num_workers(s->strategy) > 1) {
        by_file = choose_file_sharding(s, &my_examples);
        if (by_file < 0) rc = 2;
        if (by_file > 0 && !o->quiet)
            printf("Input: FILE sharding: worker %d reads its own TFRecord shards (%lld of the "
                   "%lld training examples)\n",
                   dist_strategy_worker_id(s->strategy), (long long)my_examples,
                   (long long)s->train_examples);
    }
    dist_distributed_dataset *dtrain = NULL, *dtest = NULL, *dval = NULL;
    if (rc) {
        /* refused above */
    } else if ((by_file ? dist_strategy_distribute_datasets_from_function(s->strategy,
                                                                          file_shard_fn, s, &dtrain)
                        : dist_strategy_distribute_dataset(s->strategy, s->train, &dtrain)) ||
               dist_strategy_distribute_dataset(s->strategy, s->test, &dtest) ||
               (s->val && dist_strategy_distribute_dataset(s->strategy, s->val, &dval)))
        rc = fail("distributing the data");
    if (!rc && ps_kind) {
        if (dist_coordinator_create(s->strategy, NULL, &s->coordinator) ||
            dist_coordinator_create_per_worker_dataset(s->coordinator, "distrain.train",
                                                       &s->ps_dataset))
            rc = fail("starting the coordinator");
    }
    if (!rc)
        rc = o->evaluator ? distrain_evaluator_run(o, s->strategy, s->model, dtest)
                          : fit(s, dtrain, dval, dtest);
    if (s->coordinator) {
        /* the workers and ps tasks leave when told, failed run or not */
        if (dist_coordinator_shutdown_cluster(s->coordinator))
            fprintf(stderr, "distrain: shutting the cluster down: %s\n", dist_last_error());
        dist_coordinator_destroy(s->coordinator);
        s->coordinator = NULL;
    }
    dist_distributed_dataset_destroy(dtrain);
    dist_distributed_dataset_destroy(dtest);
    dist_distributed_dataset_destroy(dval);
    if (rc) return rc;
    if (o->metrics_json && s->chief && write_metrics(s)) {
        fprintf(stderr, "distrain: --metrics-json: cannot write '%s': %s\n", o->metrics_json,
                strerror(errno));
        if (!o->save_weights) rescue_weights(s);
        return 1;
    }
    return 0;
}

/* Whether `path` can be written, found by creating it (and removing it again when it did
 * not exist) before the first step, so that a typo does not cost the training. */
static int check_output_file(const char *flag, const char *path) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "distrain: %s: '%s' is a directory\n", flag, path);
        return 2;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0666);
    if (fd >= 0) {
        close(fd);
        unlink(path);
        return 0;
    }
    /* Gone again between the two calls: another worker of this host checking the same path. */
    if (errno == EEXIST && (fd = open(path, O_WRONLY)) < 0 && errno == ENOENT) return 0;
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    fprintf(stderr, "distrain: %s: cannot write '%s': %s\n", flag, path, strerror(errno));
    return 2;
}

/* A directory option names a directory: an existing file is refused, and so is a name with
 * '{' or '}' (ModelCheckpoint's filename template syntax), which the checkpoint file name
 * under it would otherwise expand. A missing one must be creatable (made and removed again:
 * only the chief makes it, later). */
static int check_output_dir(const char *flag, const char *path) {
    struct stat sb;
    if (strpbrk(path, "{}")) {
        fprintf(stderr,
                "distrain: %s: '%s' is a directory name, not a template ('{' and '}' are not "
                "allowed)\n",
                flag, path);
        return 2;
    }
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) return 0;
        fprintf(stderr, "distrain: %s: '%s' exists and is not a directory\n", flag, path);
        return 2;
    }
    if (mkdir(path, 0777) == 0) {
        rmdir(path);
        return 0;
    }
    if (errno == EEXIST) return 0; /* another worker of this host made it meanwhile */
    fprintf(stderr, "distrain: %s: cannot create '%s': %s\n", flag, path, strerror(errno));
    return 2;
}

/* --save-model and ModelCheckpoint's save_best_only flags: a model file Keras opens, and a
 * monitor that the epochs' logs will have. Returns 2 (usage error, printed) or 0. */
static int check_checkpoint_flags(const distrain_options *o) {
    static const char suffix[] = ".keras";
    size_t n = o->save_model ? strlen(o->save_model) : 0, k = sizeof suffix - 1;
    if (o->save_model && (n <= k || strcmp(o->save_model + n - k, suffix) != 0)) {
        fprintf(stderr,
                "distrain: --save-model: '%s' must end in .keras (the model file "
                "keras.models.load_model opens; --save-weights writes weights alone)\n",
                o->save_model);
        return 2;
    }
    if (o->save_model && check_output_file("--save-model", o->save_model)) return 2;
    if ((o->checkpoint_monitor || o->checkpoint_mode) && !o->checkpoint_best_only) {
        fprintf(stderr, "distrain: %s needs --checkpoint-best-only\n",
                o->checkpoint_monitor ? "--checkpoint-monitor" : "--checkpoint-mode");
        return 2;
    }
    if (!o->checkpoint_best_only) return 0;
    if (!o->checkpoint_dir && !o->save_model) {
        fprintf(stderr, "distrain: --checkpoint-best-only needs --checkpoint-dir or --save-model "
                        "(what it saves)\n");
        return 2;
    }
    const char *monitor = o->checkpoint_monitor ? o->checkpoint_monitor : "val_loss";
    if (strncmp(monitor, "val_", 4) == 0 && !(o->validation_split > 0)) {
        fprintf(stderr,
                "distrain: --checkpoint-best-only monitors %s%s, which needs --validation-split "
                "(or --checkpoint-monitor loss or accuracy)\n",
                monitor, o->checkpoint_monitor ? "" : " (the default, as ModelCheckpoint's)");
        return 2;
    }
    return 0;
}

/* Flags that would do nothing in this combination are usage errors, and every output path is
 * checked now. */
static int check_flags(distrain_options *o) {
    int multi = o->strategy_kind == DIST_STRATEGY_MULTI_WORKER;
    int ps = o->strategy_kind == DIST_STRATEGY_PARAMETER_SERVER;
    if (ps && ((o->mixed_precision && strcmp(o->mixed_precision, "fp16") == 0) ||
               (o->loss_scale && strcmp(o->loss_scale, "none") != 0))) {
        fprintf(stderr, "distrain: --strategy parameter_server: the ps tasks apply plain Adam or "
                        "SGD; loss scaling (--loss-scale, --mixed-precision fp16) is not "
                        "supported there\n");
        return 2;
    }
    if (o->strategy_kind == DIST_STRATEGY_CENTRAL_STORAGE &&
        ((o->mixed_precision && strcmp(o->mixed_precision, "fp16") == 0) ||
         (o->loss_scale && strcmp(o->loss_scale, "none") != 0))) {
        /* TF's LossScaleOptimizer refuses it too: the update that adjusts the scale runs on the
         * central device only, while every replica scales its loss */
        fprintf(stderr, "distrain: --strategy central_storage: loss scaling (--loss-scale, "
                        "--mixed-precision fp16) is not supported with it, as in TensorFlow; use "
                        "mirrored, or --mixed-precision bf16\n");
        return 2;
    }
    if (o->epochs == 0) {
        /* nothing trains: a flag about training or its epochs would do nothing */
        const char *idle = o->checkpoint_dir                 ? "--checkpoint-dir"
                           : o->backup_dir                   ? "--backup-dir"
                           : o->csv_log                      ? "--csv-log"
                           : o->logdir                       ? "--logdir"
                           : o->trace                        ? "--trace"
                           : o->validation_split > 0         ? "--validation-split"
                           : o->early_stopping_patience >= 0 ? "--early-stopping-patience"
                           : o->reduce_lr_patience >= 0      ? "--reduce-lr-patience"
                           : o->target_accuracy > 0          ? "--target-accuracy"
                           : o->checkpoint_best_only         ? "--checkpoint-best-only"
                                                             : NULL;
        if (idle) {
            fprintf(stderr, "distrain: %s does nothing with --epochs 0 (which only evaluates)\n",
                    idle);
            return 2;
        }
        if (!o->load_weights && !o->save_weights && !o->save_model) {
            fprintf(stderr, "distrain: --epochs 0 trains nothing: give it --load-weights FILE to "
                            "evaluate, or --save-weights FILE to write the initial weights "
                            "(alone it would evaluate random weights)\n");
            return 2;
        }
    }
    if (o->tensorboard_flag_given && !o->logdir) {
        fprintf(stderr, "distrain: --histogram-freq and --update-freq need --logdir\n");
        return 2;
    }
    if (check_checkpoint_flags(o)) return 2;
    if (o->backup_freq && !o->backup_dir) {
        fprintf(stderr, "distrain: --backup-freq needs --backup-dir\n");
        return 2;
    }
    if (o->backup_freq && ps) {
        fprintf(stderr, "distrain: --backup-freq: a backup inside an epoch cannot be resumed under "
                        "parameter_server (each worker reads its own data stream, whose position "
                        "is not in the backup); --backup-dir alone backs up at every epoch end\n");
        return 2;
    }
    if (o->restore_best_weights && o->early_stopping_patience < 0) {
        fprintf(stderr, "distrain: --restore-best-weights needs --early-stopping-patience\n");
        return 2;
    }
    if (o->reduce_lr_factor_given && o->reduce_lr_patience < 0) {
        fprintf(stderr, "distrain: --reduce-lr-factor needs --reduce-lr-patience\n");
        return 2;
    }
    const char *mw_flag = o->transport              ? "--transport"
                          : o->collective_timeout_s ? "--collective-timeout"
                          : o->connect_timeout_s    ? "--connect-timeout"
                                                    : NULL;
    /* parameter_server's connections are TCP, with or without TLS */
    bool ps_transport =
        o->transport && (!strcmp(o->transport, "tcp") || !strcmp(o->transport, "tls"));
    if (ps && o->transport && !ps_transport) {
        fprintf(stderr, "distrain: --transport %s: parameter_server takes tcp or tls\n",
                o->transport);
        return 2;
    }
    const char *tls_flag = o->tls_cert  ? "--tls-cert"
                           : o->tls_key ? "--tls-key"
                           : o->tls_ca  ? "--tls-ca"
                                        : NULL;
    if (tls_flag && !(o->transport && !strcmp(o->transport, "tls"))) {
        fprintf(stderr, "distrain: %s needs --transport tls\n", tls_flag);
        return 2;
    }
    if (mw_flag && !multi && !(ps && (strcmp(mw_flag, "--transport") != 0 || ps_transport))) {
        fprintf(stderr, "distrain: %s applies to --strategy multi_worker%s only\n", mw_flag,
                strcmp(mw_flag, "--transport") ? " and parameter_server" : "");
        return 2;
    }
    /* the gradients' all-reduce flags: the kinds that all-reduce them (mirrored, multi_worker;
     * central_storage's sum goes in packs too, but neither overlapped nor compressed) */
    const char *ar_flag = o->overlap_gradients      ? "--overlap-gradients"
                          : o->gradient_compression ? "--gradient-compression"
                          : o->bytes_per_pack       ? "--bytes-per-pack"
                                                    : NULL;
    int packs_only = ar_flag && !strcmp(ar_flag, "--bytes-per-pack");
    if (ar_flag && !multi && o->strategy_kind != DIST_STRATEGY_MIRRORED &&
        !(packs_only && o->strategy_kind == DIST_STRATEGY_CENTRAL_STORAGE)) {
        fprintf(stderr, "distrain: %s applies to --strategy mirrored%s and multi_worker only\n",
                ar_flag, packs_only ? ", central_storage" : "");
        return 2;
    }
    if (o->dataset && strcmp(o->data_format, "jpeg-folder") == 0) {
        fprintf(stderr, "distrain: --dataset does not apply to --data-format jpeg-folder (the "
                        "classes are the folders under --data-dir)\n");
        return 2;
    }
    if (strcmp(o->image_feature, o->label_feature) == 0) {
        fprintf(stderr,
                "distrain: --image-feature and --label-feature name the same feature '%s'\n",
                o->image_feature);
        return 2;
    }
    if (o->dataset && strcmp(o->data_format, "tfrecord") == 0) {
        fprintf(stderr, "distrain: --dataset does not apply to --data-format tfrecord (the "
                        "records under --data-dir are the data)\n");
        return 2;
    }
    if (strcmp(o->auto_shard, "file") == 0 &&
        (o->strategy_kind != DIST_STRATEGY_MULTI_WORKER ||
         strcmp(o->data_format, "tfrecord") != 0 || o->validation_split > 0)) {
        fprintf(stderr, "distrain: --auto-shard file needs --strategy multi_worker, --data-format "
                        "tfrecord shards and no --validation-split (the split is taken from the "
                        "whole training set)\n");
        return 2;
    }
    int rc = 0;
    if (!rc && o->save_weights) rc = check_output_file("--save-weights", o->save_weights);
    if (!rc && o->metrics_json) rc = check_output_file("--metrics-json", o->metrics_json);
    if (!rc && o->trace) rc = check_output_file("--trace", o->trace);
    if (!rc && o->csv_log) rc = check_output_file("--csv-log", o->csv_log);
    /* the evaluator's is the training's: made by the training, and read only */
    if (!rc && o->checkpoint_dir && !o->evaluator)
        rc = check_output_dir("--checkpoint-dir", o->checkpoint_dir);
    if (!rc && o->backup_dir) rc = check_output_dir("--backup-dir", o->backup_dir);
    if (!rc && o->logdir) rc = check_output_dir("--logdir", o->logdir);
    return rc;
}

/* Under mpirun (or another MPI launcher) with more than one process, every strategy but
 * multi_worker would train once per process, each alone, all printing: refused, naming the
 * strategy that joins them. */
static int check_mpi_world(const distrain_options *o) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
    if (o->strategy_kind == DIST_STRATEGY_MULTI_WORKER) return 0;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        long n = v ? strtol(v, NULL, 10) : 0;
        if (n > 1) {
            fprintf(stderr,
                    "distrain: started by MPI as one of %ld processes (%s=%s), but --strategy %s "
                    "would train in each of them alone: use --strategy multi_worker --transport "
                    "mpi, or start one process\n",
                    n, vars[i], v, o->strategy);
            return 2;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "predict") == 0) {
        dist_set_log_callback(on_log, DIST_LOG_WARN, NULL); /* stdout holds the predictions */
        return distrain_predict_main(argc - 1, argv + 1);
    }
    distrain_options o;
    int rc = distrain_parse_args(argc, argv, &o);
    if (rc == 1) return 0;
    if (rc) return rc;
    if (o.version) {
        distrain_print_version(stdout);
        return 0;
    }
    if (o.print_cluster) return distrain_print_cluster();
    if ((rc = distrain_evaluator_setup(&o))) return rc;
    if (o.model_file && !o.mixed_precision_given) {
        /* a Keras model saved under a mixed policy trains under it, as Keras would; every task
         * reads it here, before the strategy, the flag checks and the settings check */
        const char *mp = distrain_model_file_precision(o.model_file);
        if (mp && strcmp(mp, "fp16") == 0 &&
            (o.strategy_kind == DIST_STRATEGY_PARAMETER_SERVER ||
             o.strategy_kind == DIST_STRATEGY_CENTRAL_STORAGE)) {
            fprintf(stderr,
                    "distrain: --model %s: the model's policy is mixed_float16, whose loss "
                    "scaling --strategy %s does not support; give --mixed-precision bf16 or "
                    "none\n",
                    o.model_file, dist_strategy_kind_name(o.strategy_kind));
            return 2;
        }
        if (mp) o.mixed_precision = mp;
    }
    if ((rc = check_flags(&o))) return rc;
    if (o.workers > 0 && o.transport && strcmp(o.transport, "mpi") == 0) {
        fprintf(stderr,
                "distrain: --transport mpi: MPI starts the workers itself; run "
                "'mpirun -np %d distrain --strategy multi_worker --transport mpi ...' "
                "without --workers\n",
                o.workers);
        return 2;
    }
    if ((rc = check_mpi_world(&o))) return rc;
    if (o.workers > 0) return distrain_launch(argc, argv, &o);
    /* Line by line, so a launcher or a log collector reading a pipe sees progress as it
     * happens. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    dist_set_log_callback(on_log, o.quiet ? DIST_LOG_WARN : DIST_LOG_INFO, NULL);
    distrain_interrupt_install();
    run_state s;
    memset(&s, 0, sizeof s);
    s.o = &o;
    rc = train(&s);
    if (rc != 130 && distrain_interrupted()) {
        /* interrupted before or outside the training (loading data, joining a cluster) */
        fprintf(stderr, "distrain: interrupted\n");
        rc = 130;
    }
    dist_loss_scale_optimizer_destroy(s.loss_scale);
    dist_optimizer_destroy(s.optimizer);
    dist_model_destroy(s.model);
    dist_dataset_destroy(s.train);
    dist_dataset_destroy(s.test);
    dist_dataset_destroy(s.val);
    dist_mnist_destroy(s.mnist);
    dist_strategy_destroy(s.strategy);
    return rc;
}
