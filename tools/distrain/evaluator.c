/* The evaluator task. Why it works as it does:
 * - It polls the directory (a listing every half second) rather than using inotify: the
 *   checkpoint directory of a cluster is often on a network file system, where inotify does
 *   not see the writes of other hosts; TF's checkpoints_iterator polls too.
 * - The training's ModelCheckpoint saves atomically (a temporary "<name>.tmp.<pid>.<random>"
 *   renamed over ckpt-EE.safetensors), so a name that matches the pattern exactly is a whole
 *   file; temporaries and the workertemp_N directories of other workers never match.
 * - It ends at the checkpoint of epoch --epochs, the training's last, as Keras's
 *   SidecarEvaluator ends at max_evaluations: the evaluator is started with the training's own
 *   flags, so it knows the count without a marker file that the training would have to write
 *   last (a chief that dies before writing it, or a stale one from an earlier run in the same
 *   directory, would leave the evaluator waiting or ending too soon).
 * - A file can vanish between the listing and the load (a cleanup that keeps the newest K):
 *   it is noted and passed over. The mapping of a loaded checkpoint stays valid when the file
 *   is removed or replaced afterwards (dist/checkpoint.h). */
#include "evaluator.h"

#include "interrupt.h"

#include <dirent.h>
#include <dist/checkpoint.h>
#include <dist/cluster.h>
#include <dist/tensorboard.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define POLL_SECONDS 0.5

/* The flags that ask for something the evaluator does not do (it trains nothing and writes
 * nothing but its scalars), and why. */
static const char *refused_flag(const distrain_options *o, const char **why) {
    static const char *const not_trained =
        "the evaluator trains nothing; it evaluates the checkpoints of --checkpoint-dir";
    static const char *const stops_early =
        "a training that stops before --epochs never writes the checkpoint the evaluator waits "
        "for; give the evaluator the last epoch as --epochs instead";
    *why = "the evaluator is one process beside the training; start the training on its own";
    if (o->workers > 0) return "--workers";
    if (o->ps > 0) return "--ps";
    *why = not_trained;
    if (o->save_weights) return "--save-weights";
    if (o->save_model) return "--save-model";
    if (o->load_weights) return "--load-weights";
    if (o->backup_dir) return "--backup-dir";
    if (o->backup_freq) return "--backup-freq";
    if (o->csv_log) return "--csv-log";
    if (o->trace) return "--trace";
    if (o->metrics_json) return "--metrics-json";
    if (o->reduce_lr_patience >= 0) return "--reduce-lr-patience";
    if (o->tensorboard_flag_given) return "--histogram-freq and --update-freq";
    *why = stops_early;
    if (o->early_stopping_patience >= 0) return "--early-stopping-patience";
    if (o->restore_best_weights) return "--restore-best-weights";
    if (o->target_accuracy > 0) return "--target-accuracy";
    *why = "with it the training writes only the checkpoints of improving epochs, and maybe not "
           "the last one, which the evaluator waits for";
    if (o->checkpoint_best_only) return "--checkpoint-best-only";
    return NULL;
}

/* TF_CONFIG's task type, for the strategies that read it ("" when TF_CONFIG is unset or does
 * not resolve: train() reports a bad TF_CONFIG as before). */
static void tf_config_task_type(const distrain_options *o, char *type, size_t size) {
    type[0] = '\0';
    int cluster_kind = o->strategy_kind == DIST_STRATEGY_MULTI_WORKER ||
                       o->strategy_kind == DIST_STRATEGY_PARAMETER_SERVER;
    const char *tf_config = getenv("TF_CONFIG");
    if (!cluster_kind || !tf_config || !tf_config[0] ||
        (o->transport && strcmp(o->transport, "mpi") == 0))
        return;
    dist_cluster *cl = NULL;
    if (dist_cluster_resolve(NULL, &cl) != DIST_OK) {
        dist_clear_error();
        return;
    }
    const char *t = dist_cluster_task_type(cl);
    snprintf(type, size, "%s", t ? t : "");
    dist_cluster_destroy(cl);
}

int distrain_evaluator_setup(distrain_options *o) {
    char type[32];
    tf_config_task_type(o, type, sizeof type);
    int tf_evaluator = strcmp(type, "evaluator") == 0;
    if (o->task_given && type[0] && tf_evaluator != o->evaluator) {
        fprintf(stderr, "distrain: --task %s, but TF_CONFIG says this task is a%s '%s'\n",
                o->evaluator ? "evaluator" : "train", tf_evaluator ? "n" : "", type);
        return 2;
    }
    if (tf_evaluator) o->evaluator = 1;
    if (!o->evaluator) {
        if (o->evaluator_timeout_given) {
            fprintf(stderr, "distrain: --evaluator-timeout needs --task evaluator\n");
            return 2;
        }
        return 0;
    }
    const char *why, *flag = refused_flag(o, &why);
    if (flag) {
        fprintf(stderr, "distrain: --task evaluator: %s does not apply: %s\n", flag, why);
        return 2;
    }
    if (!o->checkpoint_dir) {
        fprintf(stderr, "distrain: --task evaluator needs --checkpoint-dir (the training's, "
                        "whose checkpoints it evaluates)\n");
        return 2;
    }
    if (o->epochs == 0) {
        fprintf(stderr, "distrain: --task evaluator: --epochs 0 names no checkpoint; give it the "
                        "training's --epochs (it exits after that epoch's checkpoint)\n");
        return 2;
    }
    struct stat sb;
    if (stat(o->checkpoint_dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "distrain: --checkpoint-dir: '%s' exists and is not a directory\n",
                o->checkpoint_dir);
        return 2;
    }
    if (o->strategy_kind == DIST_STRATEGY_MULTI_WORKER ||
        o->strategy_kind == DIST_STRATEGY_PARAMETER_SERVER) {
        /* The cluster's command line, given to its evaluator too: the cluster flags are the
         * training's; the evaluator does not join the cluster and evaluates alone, on this
         * host's devices. */
        o->strategy_kind = DIST_STRATEGY_MIRRORED;
        o->strategy = dist_strategy_kind_name(DIST_STRATEGY_MIRRORED);
        o->transport = o->tls_cert = o->tls_key = o->tls_ca = o->token_file = NULL;
        o->collective_timeout_s = o->connect_timeout_s = 0;
        o->insecure = 0;
        o->partitioner = (dist_partitioner)DIST_PARTITIONER_INIT;
        o->partitioner_given = 0;
    }
    return 0;
}

/* The epoch of a name ModelCheckpoint gives (ckpt-EE.safetensors, EE >= 1), else 0. */
static int checkpoint_epoch(const char *name) {
    static const char prefix[] = "ckpt-", suffix[] = ".safetensors";
    if (strncmp(name, prefix, sizeof prefix - 1) != 0) return 0;
    const char *p = name + sizeof prefix - 1;
    long e = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9' && digits < 9; p++, digits++) e = e * 10 + (*p - '0');
    if (digits == 0 || strcmp(p, suffix) != 0) return 0;
    return e >= 1 && e <= 1000000 ? (int)e : 0;
}

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Sleeps for `seconds`, or less when a Ctrl-C arrives (the handler ends nanosleep early). */
static void pause_for(double seconds) {
    struct timespec t = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    if (!distrain_interrupted()) nanosleep(&t, NULL);
}

typedef struct watch {
    const distrain_options *o;
    dist_strategy *strategy;
    dist_model *model;
    dist_distributed_dataset *test;
    dist_summary_writer *validation; /* --logdir/validation, or NULL */
    char *done;                      /* [epochs + 1]: 1 once epoch e's checkpoint was handled */
    int evaluated, skipped;
} watch;

typedef enum outcome { EVALUATED, SKIPPED, GONE, FAILED } outcome;

/* Loads epoch e's checkpoint into the model and evaluates it. A file that cannot be read as a
 * checkpoint of this model is SKIPPED (named on stderr), one that vanished is GONE, and an
 * evaluation or a TensorBoard write that fails is FAILED (printed). */
static outcome evaluate(watch *w, int e, const char *name) {
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", w->o->checkpoint_dir, name);
    dist_checkpoint *c = NULL;
    dist_status st = dist_checkpoint_load(path, &c);
    if (st == DIST_NOT_FOUND) {
        dist_clear_error();
        if (!w->o->quiet) printf("Checkpoint %s was removed before it could be evaluated\n", name);
        return GONE;
    }
    if (st == DIST_OK) st = dist_checkpoint_restore_model(c, w->model);
    dist_checkpoint_destroy(c);
    if (st != DIST_OK) {
        /* the loader's message names the file; a restore's names the tensor */
        fprintf(stderr, "distrain: evaluator: skipping %s (epoch %d): %s\n", name, e,
                dist_last_error());
        dist_clear_error();
        return SKIPPED;
    }
    dist_logs logs;
    if (dist_evaluate(w->strategy, w->model, w->test, NULL, NULL, 0, &logs) != DIST_OK) {
        fprintf(stderr, "distrain: evaluator: evaluating '%s': %s\n", path, dist_last_error());
        return FAILED;
    }
    double loss = 0, accuracy = 0, examples = 0;
    dist_logs_get(&logs, "loss", &loss);
    dist_logs_get(&logs, "accuracy", &accuracy);
    dist_logs_get(&logs, "examples", &examples);
    /* Keras's TensorBoard callback writes an epoch's validation scalars at the 0-based epoch:
     * the evaluator's curve lies over the training's train/ curve in the same --logdir. */
    if (w->validation &&
        (dist_summary_writer_scalar(w->validation, "epoch_loss", (float)loss, e - 1) ||
         dist_summary_writer_scalar(w->validation, "epoch_accuracy", (float)accuracy, e - 1))) {
        fprintf(stderr, "distrain: evaluator: --logdir: %s\n", dist_last_error());
        return FAILED;
    }
    if (!w->o->quiet)
        printf("Evaluated %s (epoch %d): loss %.4f - accuracy %.4f (%lld examples)\n", name, e,
               loss, accuracy, (long long)examples);
    return EVALUATED;
}

/* A checkpoint file found by a listing. */
typedef struct found {
    int epoch;
    char name[256];
} found;

/* The checkpoints of the directory that are not handled yet, by ascending epoch, in fresh[]
 * (room for o->epochs: one per epoch, the first name listed when two spell one epoch, as
 * ckpt-1 and ckpt-01). Returns their count, or -1 with errno when the directory cannot be
 * listed. */
static int list_new(const watch *w, found *fresh) {
    DIR *d = opendir(w->o->checkpoint_dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        int e = checkpoint_epoch(de->d_name), i = 0;
        if (e < 1 || e > w->o->epochs || w->done[e]) continue;
        while (i < n && fresh[i].epoch < e) i++;
        if (i < n && fresh[i].epoch == e) continue;
        memmove(fresh + i + 1, fresh + i, (size_t)(n - i) * sizeof *fresh);
        fresh[i].epoch = e;
        snprintf(fresh[i].name, sizeof fresh[i].name, "%s", de->d_name);
        n++;
    }
    closedir(d);
    return n;
}

static int watch_loop(watch *w, found *fresh) {
    const distrain_options *o = w->o;
    const double timeout = o->evaluator_timeout_s;
    double deadline = now_seconds() + timeout;
    int dir_seen = 0;
    for (;;) {
        if (distrain_interrupted()) {
            fprintf(stderr, "distrain: evaluator: interrupted after %d evaluation(s)\n",
                    w->evaluated);
            return 130;
        }
        int n = list_new(w, fresh);
        if (n < 0 && errno == ENOENT && dir_seen) {
            fprintf(stderr,
                    "distrain: evaluator: the checkpoint directory '%s' disappeared (after %d "
                    "evaluation(s))\n",
                    o->checkpoint_dir, w->evaluated);
            return 1;
        }
        if (n < 0 && errno != ENOENT) {
            fprintf(stderr, "distrain: evaluator: cannot list '%s': %s\n", o->checkpoint_dir,
                    strerror(errno));
            return 1;
        }
        dir_seen |= n >= 0;
        for (int i = 0; i < n; i++) {
            int e = fresh[i].epoch;
            outcome r = evaluate(w, e, fresh[i].name);
            if (r == FAILED) return 1;
            w->done[e] = 1;
            w->evaluated += r == EVALUATED;
            w->skipped += r == SKIPPED;
            if (e == o->epochs) {
                if (r == EVALUATED) return 0;
                fprintf(stderr, "distrain: evaluator: the final checkpoint (epoch %d) in '%s' %s\n",
                        e, o->checkpoint_dir,
                        r == GONE ? "was removed before it could be evaluated"
                                  : "could not be evaluated (see above)");
                return 1;
            }
            deadline = now_seconds() + timeout; /* the wait starts after the evaluation */
        }
        if (n <= 0 && now_seconds() >= deadline) {
            if (!dir_seen)
                fprintf(stderr,
                        "distrain: evaluator: the checkpoint directory '%s' did not appear in "
                        "%g s (--evaluator-timeout)\n",
                        o->checkpoint_dir, timeout);
            else
                fprintf(stderr,
                        "distrain: evaluator: no new checkpoint in '%s' for %g s "
                        "(--evaluator-timeout) after %d evaluation(s); still waiting for the "
                        "checkpoint of epoch %d\n",
                        o->checkpoint_dir, timeout, w->evaluated, o->epochs);
            return 1;
        }
        if (n <= 0) {
            double left = deadline - now_seconds();
            pause_for(left < POLL_SECONDS ? (left > 0 ? left : 0) : POLL_SECONDS);
        }
    }
}

int distrain_evaluator_run(const distrain_options *o, dist_strategy *strategy, dist_model *model,
                           dist_distributed_dataset *test) {
    watch w = {.o = o, .strategy = strategy, .model = model, .test = test};
    w.done = calloc((size_t)o->epochs + 1, 1);
    found *fresh = calloc((size_t)o->epochs + 1, sizeof *fresh);
    if (!w.done || !fresh) {
        free(w.done);
        free(fresh);
        fprintf(stderr, "distrain: evaluator: out of memory\n");
        return 1;
    }
    int rc = 0;
    if (o->logdir) {
        char path[4200];
        snprintf(path, sizeof path, "%s/validation", o->logdir);
        if (dist_summary_writer_create(path, &w.validation) != DIST_OK) {
            fprintf(stderr, "distrain: evaluator: --logdir: %s\n", dist_last_error());
            rc = 1;
        }
    }
    if (!rc && !o->quiet)
        printf("Evaluator: watching '%s' for the checkpoints of epochs 1 to %d (timeout %g s)\n",
               o->checkpoint_dir, o->epochs, o->evaluator_timeout_s);
    if (!rc) rc = watch_loop(&w, fresh);
    if (!rc && !o->quiet)
        printf("Evaluator: done: %d checkpoint(s) evaluated, %d skipped\n", w.evaluated, w.skipped);
    dist_summary_writer_destroy(w.validation);
    free(w.done);
    free(fresh);
    return rc;
}
