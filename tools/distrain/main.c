/* distrain: trains the seed CNN on MNIST with a tf.distribute-style strategy. Exit codes:
 * 0 success, 1 training or data error, 2 usage error. */
#include "launcher.h"
#include "options.h"
#include "print_cluster.h"

#include <dist/data.h>
#include <dist/mnist.h>
#include <dist/nn.h>
#include <dist/optim.h>
#include <dist/strategy.h>
#include <dist/train.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct run_state {
    const distrain_options *o;
    dist_strategy *strategy;
    dist_model *model;
    dist_optimizer *optimizer;
    dist_mnist *mnist;
    dist_dataset *train, *test;
    int64_t train_examples, test_examples;
    const char *data_source;
    double train_seconds;
    int64_t train_images, train_images_total, steps;
    double train_loss, train_accuracy, test_loss, test_accuracy;
    int threads;
    int chief;         /* prints progress and writes the metrics (TF's chief rule) */
} run_state;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

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

static int load_data(run_state *s) {
    const distrain_options *o = s->o;
    dist_status st;
    dist_dataset *train = NULL, *test = NULL, *next;
    if (strcmp(o->data_format, "jpeg-folder") == 0) {
        if (!o->data_dir) {
            fprintf(stderr, "distrain: --data-format jpeg-folder needs --data-dir (with train/ and "
                            "test/ class folders)\n");
            return 2;
        }
        char path[4096];
        dist_jpeg_folder_options jo = DIST_JPEG_FOLDER_OPTIONS_INIT;
        jo.height = jo.width = 28;
        jo.num_threads = 2;
        snprintf(path, sizeof path, "%s/train", o->data_dir);
        if ((st = dist_dataset_from_jpeg_folder(path, &jo, &train)))
            return fail("reading the training images");
        snprintf(path, sizeof path, "%s/test", o->data_dir);
        if ((st = dist_dataset_from_jpeg_folder(path, &jo, &test)))
            return fail("reading the test images");
        s->train_examples = dist_dataset_cardinality(train);
        s->test_examples = dist_dataset_cardinality(test);
        s->data_source = o->data_dir;
    } else {
        dist_mnist_options mo = DIST_MNIST_OPTIONS_INIT;
        mo.kind = strcmp(o->dataset, "fashion_mnist") == 0 ? DIST_MNIST_FASHION : DIST_MNIST_DIGITS;
        mo.data_dir = o->data_dir;
        if (dist_mnist_load(&mo, &s->mnist)) return fail("loading the data");
        s->data_source = dist_mnist_source(s->mnist);
        s->train_examples = dist_mnist_train_images(s->mnist)->shape[0];
        s->test_examples = dist_mnist_test_images(s->mnist)->shape[0];
        if (slices(dist_mnist_train_images(s->mnist), dist_mnist_train_labels(s->mnist), &train) ||
            slices(dist_mnist_test_images(s->mnist), dist_mnist_test_labels(s->mnist), &test))
            return fail("building the input pipeline");
    }
    /* Shuffle the small uint8 examples, then normalize: the shuffle buffer holds 10,000
     * examples, 4x less memory than as floats. */
    st = chain(&train, dist_dataset_shuffle(train, 10000, o->seed, 1, &next), &next);
    if (!st) st = chain(&train, dist_dataset_map_image_normalize(train, &next), &next);
    if (!st) st = chain(&test, dist_dataset_map_image_normalize(test, &next), &next);
    if (!st) st = chain(&train, dist_dataset_batch(train, o->batch_size, 0, &next), &next);
    if (!st) st = chain(&train, dist_dataset_prefetch(train, 2, &next), &next);
    if (!st) st = chain(&test, dist_dataset_batch(test, o->batch_size, 0, &next), &next);
    if (!st) st = chain(&test, dist_dataset_prefetch(test, 2, &next), &next);
    if (st) {
        dist_dataset_destroy(train);
        dist_dataset_destroy(test);
        return fail("building the input pipeline");
    }
    s->train = train;
    s->test = test;
    return 0;
}

static void progress(const run_state *s, int64_t step, int64_t total, double elapsed, double loss,
                     double acc, int final) {
    if (s->o->quiet || !s->chief) return;
    int tty = isatty(STDOUT_FILENO);
    if (!final && !tty) return;
    int width = 30, done = total > 0 ? (int)(width * step / total) : width;
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < done ? '=' : '.';
    if (done < width && done > 0) bar[done - 1] = '>';
    bar[width] = '\0';
    double ips = elapsed > 0 ? (double)s->train_images / elapsed : 0.0;
    printf("%s%lld/%lld [%s] - %.0fs %.0fms/step - loss: %.4f - accuracy: %.4f - %.0f images/s - "
           "%d replica%s%s",
           tty ? "\r" : "", (long long)step, (long long)total, bar, elapsed,
           step ? 1000.0 * elapsed / (double)step : 0.0, loss, acc, ips,
           dist_strategy_num_replicas_in_sync(s->strategy),
           dist_strategy_num_replicas_in_sync(s->strategy) == 1 ? "" : "s", final ? "\n" : "");
    fflush(stdout);
}

/* One pass over a distributed dataset with a step; sums the three classifier outputs. */
static int run_epoch(run_state *s, dist_distributed_iterator *it, dist_step_fn fn, int training,
                     double *loss, double *acc, int64_t total_steps) {
    dist_classifier_step cs = {s->model, s->optimizer, 0};
    dist_per_replica_element in;
    dist_per_replica out;
    double loss_sum = 0, correct = 0, seen = 0, epoch_start = now_s(), step_time = 0;
    int64_t step = 0;
    s->train_images = 0;
    for (;;) {
        int end = 0;
        if (dist_distributed_iterator_next(it, &in, &end)) return fail("reading input");
        if (end || (training && s->o->max_steps && step == s->o->max_steps)) break;
        cs.global_batch_size = in.global_batch_size;
        double t0 = now_s();
        if (dist_strategy_run(s->strategy, fn, &cs, &in, &out))
            return fail(training ? "training step" : "evaluation");
        dist_tensor *l, *c, *n;
        if (dist_strategy_reduce(s->strategy, DIST_REDUCE_SUM, &out, 0, -1, &l) ||
            dist_strategy_reduce(s->strategy, DIST_REDUCE_SUM, &out, 1, -1, &c) ||
            dist_strategy_reduce(s->strategy, DIST_REDUCE_SUM, &out, 2, -1, &n))
            return fail("reducing metrics");
        double batch = *(float *)n->data;
        step_time += now_s() - t0;
        loss_sum += *(float *)l->data * batch;
        correct += *(float *)c->data;
        seen += batch;
        dist_tensor_destroy(l);
        dist_tensor_destroy(c);
        dist_tensor_destroy(n);
        step++;
        if (training) {
            s->train_images += (int64_t)batch;
            s->steps++;
            if (!isfinite(loss_sum)) {
                fprintf(stderr, "distrain: the loss became %f at step %lld\n", loss_sum,
                        (long long)step);
                return 1;
            }
            progress(s, step, total_steps, now_s() - epoch_start, loss_sum / seen, correct / seen,
                     0);
        }
    }
    if (training) {
        s->train_seconds += step_time;
        s->train_images_total += s->train_images;
    }
    *loss = seen > 0 ? loss_sum / seen : 0.0;
    *acc = seen > 0 ? correct / seen : 0.0;
    if (training) {
        double ips = step_time > 0 ? (double)s->train_images / step_time : 0.0;
        if (!s->o->quiet && s->chief) {
            double elapsed = now_s() - epoch_start;
            int tty = isatty(STDOUT_FILENO);
            int width = 30;
            char bar[64];
            memset(bar, '=', (size_t)width);
            bar[width] = '\0';
            int replicas = dist_strategy_num_replicas_in_sync(s->strategy);
            printf("%s%lld/%lld [%s] - %.0fs %.0fms/step - loss: %.4f - accuracy: %.4f - %.0f "
                   "images/s - %d replica%s\n",
                   tty ? "\r" : "", (long long)step, (long long)step, bar, elapsed,
                   step ? 1000.0 * elapsed / (double)step : 0.0, *loss, *acc, ips, replicas,
                   replicas == 1 ? "" : "s");
        }
    }
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

static int write_metrics(const run_state *s) {
    FILE *f = fopen(s->o->metrics_json, "w");
    if (!f) {
        perror(s->o->metrics_json);
        return 1;
    }
    char dev[32];
    fprintf(f, "{\n  \"strategy\": \"%s\",\n  \"replicas\": %d,\n  \"devices\": [",
            dist_strategy_name(s->strategy), dist_strategy_num_replicas_in_sync(s->strategy));
    for (int r = 0; r < dist_strategy_num_local_replicas(s->strategy); r++)
        fprintf(f, "%s\"%s\"", r ? ", " : "",
                dist_device_str(dist_strategy_replica_device(s->strategy, r), dev, sizeof dev));
    fprintf(f,
            "],\n  \"workers\": %d,\n  \"cross_device_ops\": \"%s\",\n  \"epochs\": %d,\n  \"steps\": %lld,\n  "
            "\"global_batch_size\": %lld,\n"
            "  \"train_loss\": %.6f,\n  \"train_accuracy\": %.6f,\n  \"test_loss\": %.6f,\n  "
            "\"test_accuracy\": %.6f,\n"
            "  \"train_images_per_sec\": %.1f,\n  \"train_seconds\": %.3f,\n  \"train_examples\": "
            "%lld,\n"
            "  \"test_examples\": %lld,\n  \"params\": %lld,\n  \"threads_per_replica\": %d,\n  "
            "\"data_source\": ",
            dist_strategy_num_workers(s->strategy), dist_strategy_cross_device_name(s->strategy),
            s->o->epochs, (long long)s->steps,
            (long long)s->o->batch_size, s->train_loss, s->train_accuracy, s->test_loss,
            s->test_accuracy,
            s->train_seconds > 0 ? (double)s->train_images_total / s->train_seconds : 0.0,
            s->train_seconds, (long long)s->train_examples, (long long)s->test_examples,
            (long long)dist_model_num_params(s->model), s->threads);
    json_string(f, s->data_source);
    fprintf(f, "\n}\n");
    return fclose(f) == 0 ? 0 : 1;
}

static int train(run_state *s) {
    const distrain_options *o = s->o;
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    if (dist_strategy_kind_parse(o->strategy, &so.kind)) {
        fprintf(stderr, "distrain: --strategy: %s\n", dist_last_error());
        return 2;
    }
    so.devices = o->devices;
    so.threads_per_replica = o->threads;
    so.collective_timeout_s = o->collective_timeout_s;
    so.connect_timeout_s = o->connect_timeout_s;
    if (o->transport)
        so.transport = strcmp(o->transport, "tcp") == 0   ? DIST_TRANSPORT_TCP
                       : strcmp(o->transport, "shm") == 0 ? DIST_TRANSPORT_SHM
                                                          : DIST_TRANSPORT_AUTO;
    dist_status st = dist_strategy_create(&so, &s->strategy);
    if (st == DIST_INVALID_ARGUMENT || st == DIST_NOT_FOUND || st == DIST_UNSUPPORTED) {
        fprintf(stderr, "distrain: %s\n", dist_last_error());
        return 2;
    }
    if (st) return fail("creating the strategy");
    s->chief = dist_strategy_is_chief(s->strategy);
    /* The other workers repeat what the chief says: only their warnings and errors show. */
    if (!s->chief) dist_set_log_callback(on_log, DIST_LOG_WARN, NULL);
    int replicas = dist_strategy_num_local_replicas(s->strategy);
    int cpus = dist_device_count(DIST_DEVICE_CPU);
    s->threads = o->threads ? o->threads : (cpus / replicas > 0 ? cpus / replicas : 1);
    int rc = load_data(s);
    if (rc) return rc;

    if (dist_strategy_scope_enter(s->strategy)) return fail("entering the strategy scope");
    int64_t shape[3] = {28, 28, 1};
    st = dist_model_create_mnist_cnn(&s->model);
    if (!st) st = dist_model_build(s->model, 3, shape, o->seed);
    if (!st && strcmp(o->optimizer, "sgd") == 0) {
        dist_sgd_options sg = DIST_SGD_OPTIONS_INIT;
        if (o->learning_rate > 0) sg.learning_rate = (float)o->learning_rate;
        st = dist_optimizer_create_sgd(&sg, &s->optimizer);
    } else if (!st) {
        dist_adam_options ad = DIST_ADAM_OPTIONS_INIT;
        if (o->learning_rate > 0) ad.learning_rate = (float)o->learning_rate;
        st = dist_optimizer_create_adam(&ad, &s->optimizer);
    }
    if (st) return fail("building the model");
    if (dist_strategy_scope_exit(s->strategy)) return fail("leaving the strategy scope");

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
        if (dist_strategy_num_workers(s->strategy) > 1)
            printf("Cluster: %d workers, %d replicas in sync; this is worker %d (chief)\n",
                   dist_strategy_num_workers(s->strategy),
                   dist_strategy_num_replicas_in_sync(s->strategy),
                   dist_strategy_worker_id(s->strategy));
        if (s->mnist)
            printf("Data: %s\n", s->data_source);
        else
            printf("Data: JPEG class folders under %s (%lld train / %lld test images)\n",
                   s->data_source, (long long)s->train_examples, (long long)s->test_examples);
    }
    dist_distributed_dataset *dtrain, *dtest;
    dist_distributed_iterator *itrain, *itest;
    if (dist_strategy_distribute_dataset(s->strategy, s->train, &dtrain) ||
        dist_strategy_distribute_dataset(s->strategy, s->test, &dtest) ||
        dist_distributed_dataset_iterator(dtrain, &itrain) ||
        dist_distributed_dataset_iterator(dtest, &itest))
        return fail("distributing the data");
    int64_t steps_per_epoch = (s->train_examples + o->batch_size - 1) / o->batch_size;
    if (o->max_steps && o->max_steps < steps_per_epoch) steps_per_epoch = o->max_steps;
    for (int e = 0; e < o->epochs; e++) {
        if (!o->quiet && s->chief) printf("Epoch %d/%d\n", e + 1, o->epochs);
        if (e > 0 && dist_distributed_iterator_reset(itrain)) return fail("starting the epoch");
        rc = run_epoch(s, itrain, dist_classifier_train_step, 1, &s->train_loss, &s->train_accuracy,
                       steps_per_epoch);
        if (rc) return rc;
    }
    rc = run_epoch(s, itest, dist_classifier_eval_step, 0, &s->test_loss, &s->test_accuracy, 0);
    if (rc) return rc;
    if (!o->quiet && s->chief)
        printf("Test loss: %.4f - test accuracy: %.4f (%lld examples)\n", s->test_loss,
               s->test_accuracy, (long long)s->test_examples);
    dist_distributed_iterator_destroy(itrain);
    dist_distributed_iterator_destroy(itest);
    dist_distributed_dataset_destroy(dtrain);
    dist_distributed_dataset_destroy(dtest);
    if (o->metrics_json && s->chief && write_metrics(s)) return 1;
    return 0;
}

int main(int argc, char **argv) {
    distrain_options o;
    int rc = distrain_parse_args(argc, argv, &o);
    if (rc == 1) return 0;
    if (rc) return rc;
    if (o.print_cluster) return distrain_print_cluster();
    if (o.workers > 0) return distrain_launch(argc, argv, &o);
    /* Line by line, so a launcher or a log collector reading a pipe sees progress as it
     * happens. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    dist_set_log_callback(on_log, o.quiet ? DIST_LOG_WARN : DIST_LOG_INFO, NULL);
    run_state s;
    memset(&s, 0, sizeof s);
    s.o = &o;
    rc = train(&s);
    dist_optimizer_destroy(s.optimizer);
    dist_model_destroy(s.model);
    dist_dataset_destroy(s.train);
    dist_dataset_destroy(s.test);
    dist_mnist_destroy(s.mnist);
    dist_strategy_destroy(s.strategy);
    return rc;
}
