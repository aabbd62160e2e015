#include "options.h"

#include "dist/data.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every flag: its name, whether it takes a value, the value's form, its default and what it
 * does. --help is printed from it, and a flag that is not in it is unknown (whether or not a
 * value follows). */
typedef struct distrain_flag {
    const char *name;
    int takes_value;
    const char *value; /* the value's form, for --help; NULL: the library's strategy names */
    const char *def;   /* the default, for --help ("" = none; NULL: the default strategy) */
    const char *help;
} distrain_flag;

/* --strategy's names, from the library's registry of kinds */
static void strategy_names(FILE *out) {
    for (int k = 0; k < dist_strategy_kind_count(); k++)
        fprintf(out, "%s%s", k ? "|" : "", dist_strategy_kind_name((dist_strategy_kind)k));
}

static const distrain_flag flags[] = {
    {"--strategy", 1, NULL, NULL, "distribution strategy"},
    {"--pjrt-plugin", 1, "FILE", "$DIST_PJRT_PLUGIN, $TPU_LIBRARY_PATH, then libtpu.so",
     "tpu: the PJRT plugin that compiles and runs the step (XLA's CPU plugin, JAX's CUDA "
     "plugin, libtpu)"},
    {"--steps-per-execution", 1, "K", "1",
     "run K training steps per execution (Keras's steps_per_execution): under tpu one compiled "
     "loop of K steps; callbacks see every K-th batch"},
    {"--tpu-cores", 1, "N", "every device of the plugin",
     "tpu: replicas; the XLA CPU plugin makes N CPU devices"},
    {"--tpu", 1, "NAME", "$TPU_NAME, else local",
     "tpu: TPUClusterResolver's tpu argument (local chips only; a remote TPU node is refused)"},
    {"--devices", 1, "LIST", "all GPUs, else one CPU replica per core",
     "e.g. cpu:0,cpu:1, gpu:0,gpu:1, /gpu:0, GPU:0 or /device:CPU:0"},
    {"--model", 1, "FILE.json", "the seed CNN",
     "train the model Keras's model.to_json() wrote (Sequential or Functional; one image input "
     "(H, W, C): IDX data needs (28, 28, 1), JPEG folders and TFRecords are resized to it; or "
     "one int32 input of T token ids (T,), read by an Embedding, from TFRecords whose input "
     "feature is an Int64List of T ids; one output per class: logits, or probabilities of a "
     "softmax head, trained as Keras's from_logits=False)"},
    {"--dataset", 1, "mnist|fashion_mnist", "mnist", "the IDX dataset (not with jpeg-folder)"},
    {"--data-dir", 1, "DIR", "the built-in sources",
     "directory with the IDX files (or train/ and test/ class folders for jpeg-folder, or "
     "*train*.tfrecord* and *test*.tfrecord* shards for tfrecord)"},
    {"--data-format", 1, "idx|jpeg-folder|tfrecord", "idx", "how --data-dir is laid out"},
    {"--image-feature", 1, "NAME", "image",
     "tfrecord: the tf.train.Example feature holding the image (PNG or JPEG bytes, or 784 raw "
     "uint8 pixels), or a token model's Int64List of ids"},
    {"--label-feature", 1, "NAME", "label", "tfrecord: the int64 label feature"},
    {"--feature-keys", 1, "image=KEY,label=KEY", "image=image,label=label",
     "tfrecord: both feature names at once (tokens=KEY names the input of a token model, as "
     "image=KEY does)"},
    {"--tfrecord-compression", 1, "auto|none|gzip|zlib", "auto",
     "tfrecord: how the shards are compressed (TFRecordDataset's compression_type; auto: each "
     "file's first bytes tell)"},
    {"--auto-shard", 1, "auto|file|data", "auto",
     "multi_worker: how workers split the training data (tf.data's AutoShardPolicy): file = "
     "each worker reads its own TFRecord shards; data = every worker reads all and keeps its "
     "part of each batch; auto = file for TFRecord shards that split evenly, else data"},
    {"--epochs", 1, "N", "5",
     "epochs to train; 0 trains nothing: evaluates --load-weights, or writes the initial "
     "weights to --save-weights"},
    {"--batch-size", 1, "N", "64", "global batch size"},
    {"--learning-rate", 1, "F", "Adam 0.001, SGD 0.01", "the optimizer's learning rate"},
    {"--optimizer", 1, "adam|sgd", "adam", "the optimizer"},
    {"--lr-schedule", 1, "SPEC", "a constant --learning-rate",
     "a Keras learning-rate schedule, NAME:key=value,... with Keras's argument names, e.g. "
     "exponential_decay:initial_learning_rate=0.01,decay_steps=100,decay_rate=0.9,staircase=1 "
     "or piecewise_constant:boundaries=100/200,values=0.1/0.01/0.001 (lists separated by '/'; "
     "';' too, quoted from a shell; also polynomial_decay, "
     "inverse_time_decay, cosine_decay, cosine_decay_restarts)"},
    {"--scale-lr", 1, "none|linear|sqrt", "none",
     "scale the learning rate (--learning-rate or the optimizer's default) from --base-batch "
     "to the global --batch-size: linearly, or by the square root of the ratio"},
    {"--base-batch", 1, "N", "64",
     "with --scale-lr: the batch size the learning rate is tuned for"},
    {"--clipnorm", 1, "F", "off", "clip each variable's gradient to L2 norm F (Keras's clipnorm)"},
    {"--clipvalue", 1, "F", "off", "clip every gradient element to [-F, F] (Keras's clipvalue)"},
    {"--global-clipnorm", 1, "F", "off",
     "clip all gradients together to global L2 norm F (Keras's global_clipnorm)"},
    {"--seed", 1, "N", "42", "weights and shuffling seed"},
    {"--threads", 1, "N", "cores / replicas (/ workers on this host)",
     "compute threads per replica"},
    {"--steps-per-epoch", 1, "N", "the whole epoch", "stop each epoch after N steps"},
    {"--metrics-json", 1, "FILE", "", "write the final metrics as JSON"},
    {"--workers", 1, "N", "",
     "multi_worker, parameter_server: run N local worker processes on loopback (without "
     "it, TF_CONFIG says which task this is)"},
    {"--ps", 1, "N", "",
     "parameter_server: with --workers, also run a chief and N ps processes on loopback"},
    {"--variable-partitioner", 1, "none|fixed:N|min_size:B[:M]|max_size:B[:M]", "none",
     "parameter_server: split variables into shards on the ps tasks (TF's partitioners)"},
    {"--transport", 1, "auto|tcp|shm|mpi|tls", "auto",
     "multi_worker: how workers exchange gradients (auto: shared memory when all are on this "
     "host; mpi: the MPI world of mpirun/srun, the cluster when TF_CONFIG is absent; tls: TCP "
     "with every connection in TLS 1.3, keyed by the cluster token or --tls-cert/--tls-key/"
     "--tls-ca). parameter_server: tcp or tls"},
    {"--tls-cert", 1, "FILE", "$DIST_TLS_CERT",
     "--transport tls: this task's certificate (PEM); with --tls-key and --tls-ca, mutual TLS "
     "with certificates instead of the key derived from the cluster token"},
    {"--tls-key", 1, "FILE", "$DIST_TLS_KEY", "--transport tls: this task's private key (PEM)"},
    {"--tls-ca", 1, "FILE", "$DIST_TLS_CA",
     "--transport tls: the CA (PEM) that signed every task's certificate"},
    {"--cluster-token-file", 1, "FILE", "$DIST_CLUSTER_TOKEN; --workers makes one",
     "multi_worker: the cluster's shared secret; workers without it are refused"},
    {"--insecure", 0, "", "off",
     "multi_worker: join without a cluster token (anyone who can reach the workers' ports can "
     "join the job)"},
    {"--overlap-gradients", 0, "", "off",
     "mirrored, multi_worker (CPU replicas): all-reduce the gradients in buckets while the "
     "backward pass runs, on a communication thread per replica (the same bits)"},
    {"--bytes-per-pack", 1, "B", "0: one buffer; 262144 with --overlap-gradients",
     "mirrored, multi_worker: all-reduce the gradients in packs (buckets with "
     "--overlap-gradients) of B bytes"},
    {"--gradient-compression", 1, "none|bf16|fp16", "none",
     "mirrored, multi_worker (CPU replicas): all-reduce the gradients in bfloat16 or float16 "
     "(half the bytes on the wire, other bits)"},
    {"--collective-timeout", 1, "S", "60",
     "multi_worker: fail a step when a worker has not answered in S seconds"},
    {"--connect-timeout", 1, "S", "300",
     "multi_worker: fail when the cluster has not assembled in S seconds"},
    {"--validation-split", 1, "F", "", "hold out the last fraction F of the training set"},
    {"--checkpoint-dir", 1, "DIR", "",
     "save the training state at every epoch end (DIR/ckpt-EE.safetensors)"},
    {"--task", 1, "train|evaluator", "train; TF_CONFIG's task type evaluator: evaluator",
     "evaluator: TensorFlow's evaluator task beside a training started with the same flags: "
     "evaluates each new checkpoint of --checkpoint-dir once on the test set, writes the "
     "scalars to --logdir/validation, exits after the checkpoint of epoch --epochs"},
    {"--evaluator-timeout", 1, "S", "600",
     "--task evaluator: fail when no new checkpoint has appeared for S seconds"},
    {"--backup-dir", 1, "DIR", "", "back up the training state; a restarted run resumes from it"},
    {"--backup-freq", 1, "N", "every epoch", "with --backup-dir: back up every N steps"},
    {"--logdir", 1, "DIR", "", "TensorBoard event files under DIR/train and DIR/validation"},
    {"--histogram-freq", 1, "N", "0",
     "with --logdir: a histogram of every variable every N epochs (0: none), as Keras's "
     "TensorBoard(histogram_freq=N)"},
    {"--update-freq", 1, "epoch|batch|N", "epoch",
     "with --logdir: batch_loss and batch_accuracy every N batches (batch: every batch)"},
    {"--csv-log", 1, "FILE", "", "one CSV row of metrics per epoch (appended to on resume)"},
    {"--save-weights", 1, "FILE", "",
     "write the final weights: as Keras's .weights.h5 when FILE ends so, else as safetensors"},
    {"--save-model", 1, "FILE.keras", "",
     "write the trained model as a Keras 3 .keras file, which keras.models.load_model opens "
     "(with --checkpoint-best-only: the model of the best epoch)"},
    {"--checkpoint-best-only", 0, "", "off",
     "with --checkpoint-dir or --save-model: save only at the epochs where "
     "--checkpoint-monitor improves on the best so far (ModelCheckpoint's save_best_only)"},
    {"--checkpoint-monitor", 1, "val_loss|val_accuracy|loss|accuracy", "val_loss",
     "with --checkpoint-best-only: the metric that picks the epoch (val_* need "
     "--validation-split)"},
    {"--checkpoint-mode", 1, "auto|min|max", "auto",
     "with --checkpoint-best-only: whether the lowest or the highest value is best; auto: "
     "max for names containing 'acc', else min (ModelCheckpoint's mode)"},
    {"--load-weights", 1, "FILE", "",
     "start from these weights: safetensors (--save-weights, --checkpoint-dir) or a Keras 3 "
     ".weights.h5 file of the same model"},
    {"--check-numerics", 0, "", "off",
     "stop at the first layer output, gradient or update holding Inf or NaN, naming the "
     "layer, its op and the replica"},
    {"--trace", 1, "FILE", "",
     "a Chrome trace JSON timeline of the training (per replica: forward, backward, "
     "all-reduce, update; data wait; validation); other workers than the chief write "
     "FILE.worker-N"},
    {"--mixed-precision", 1, "none|fp16|bf16", "none",
     "compute in float16 / bfloat16 with float32 variables (Keras's mixed_float16 / "
     "mixed_bfloat16)"},
    {"--conv-algorithm", 1, "direct|winograd", "direct ($DIST_CPU_WINOGRAD=1: winograd)",
     "CPU float32 convolution forwards: oneDNN's direct kernels (TensorFlow's), or its "
     "Winograd F(4x4,3x3) kernel where it has one (AVX-512: ~1.2x faster training; as "
     "accurate, but not TensorFlow's bits, so runs leave its trajectory)"},
    {"--loss-scale", 1, "dynamic[:F]|none|F", "dynamic with fp16, none otherwise",
     "loss scaling: dynamic (from 2^15 or F), none, or a fixed scale F"},
    {"--early-stopping-patience", 1, "N", "no early stopping",
     "stop when val_loss (or loss) stalls N epochs"},
    {"--restore-best-weights", 0, "", "off",
     "with --early-stopping-patience: end with the weights of the best epoch (Keras's "
     "restore_best_weights)"},
    {"--target-accuracy", 1, "A", "off",
     "evaluate the test split after every epoch and stop after the first epoch whose test "
     "accuracy is >= A (0 < A <= 1); --epochs is then the most epochs to run"},
    {"--reduce-lr-patience", 1, "N", "no reduction",
     "multiply the learning rate by --reduce-lr-factor when val_loss (or loss) stalls N "
     "epochs"},
    {"--reduce-lr-factor", 1, "F", "0.1 (Keras's)",
     "with --reduce-lr-patience: the factor, 0 < F < 1"},
    {"--print-cluster", 0, "", "",
     "print the cluster and task resolved from TF_CONFIG (or Slurm) as JSON and exit (2 with "
     "TensorFlow's message if invalid)"},
    {"--deterministic", 0, "", "off",
     "GPUs: deterministic algorithms only (the same run gives the same bits)"},
    {"--cuda-graphs", 1, "on|off", "on", "GPUs: replay repeated step work as CUDA graphs"},
    {"--quiet", 0, "", "off", "no summary or progress, only errors"},
    {"--version", 0, "", "",
     "print the versions, the CPU ISA in use and the CUDA module, and exit"},
    {"--help", 0, "", "", "this list"},
};

/* distrain predict's flags. */
static const distrain_flag predict_flags[] = {
    {"--weights", 1, "FILE", "",
     "required: the weights, safetensors (--save-weights) or a Keras 3 .weights.h5 file"},
    {"--input", 1, "PATH", "",
     "required: an IDX images file (e.g. t10k-images-idx3-ubyte[.gz]), a JPEG file, or a "
     "folder whose .jpg/.jpeg files (in subfolders too) are read in sorted order"},
    {"--model-json", 1, "FILE", "the seed CNN",
     "the model as Keras's model.to_json() (Sequential or Functional, 28x28x1 inputs)"},
    {"--strategy", 1, NULL, NULL,
     "distribution strategy (multi_worker: the cluster from TF_CONFIG; the chief prints)"},
    {"--devices", 1, "LIST", "all GPUs, else one CPU replica per core", "e.g. cpu:0,cpu:1"},
    {"--batch-size", 1, "N", "64", "global batch size"},
    {"--threads", 1, "N", "cores / replicas", "compute threads per replica"},
    {"--logits", 0, "", "off", "print \"logits\" instead of \"probabilities\""},
    {"--help", 0, "", "", "this list"},
};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const distrain_flag *flag_in(const distrain_flag *table, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(table[i].name, name) == 0) return &table[i];
    return NULL;
}

static const distrain_flag *flag_find(const char *name) {
    return flag_in(flags, COUNT(flags), name);
}

static void print_flags(FILE *out, const distrain_flag *table, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const distrain_flag *f = &table[i];
        fprintf(out, "  %s%s%s", f->name, f->takes_value ? " " : "", f->value ? f->value : "");
        if (!f->value) strategy_names(out);
        fprintf(out, "\n      %s", f->help);
        const char *def = f->def ? f->def : dist_strategy_kind_name(DIST_STRATEGY_MIRRORED);
        if (def[0]) fprintf(out, " (default: %s)", def);
        fputc('\n', out);
    }
}

void distrain_usage(FILE *out) {
    fprintf(out, "usage: distrain [options]\n"
                 "       distrain predict --weights FILE --input PATH [options] (see distrain "
                 "predict --help)\n");
    print_flags(out, flags, COUNT(flags));
}

static void predict_usage(FILE *out) {
    fprintf(out, "usage: distrain predict --weights FILE --input PATH [options]\n"
                 "Prints one JSON line per example: {\"index\":i,\"class\":c,"
                 "\"probabilities\":[...]}, with \"file\" for JPEG input.\n");
    print_flags(out, predict_flags, COUNT(predict_flags));
}

static int bad(const char *flag, const char *value, const char *why) {
    fprintf(stderr, "distrain: invalid value '%s' for %s: %s\n", value, flag, why);
    return 2;
}

static int parse_int(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || *end || end == v) return bad(flag, v, "not an integer");
    if (x < lo || x > hi) {
        char why[96];
        snprintf(why, sizeof why, "must be between %lld and %lld", (long long)lo, (long long)hi);
        return bad(flag, v, why);
    }
    *out = x;
    return 0;
}

int distrain_parse_args(int argc, char **argv, distrain_options *o) {
    memset(o, 0, sizeof *o);
    o->strategy = dist_strategy_kind_name(DIST_STRATEGY_MIRRORED);
    o->partitioner = (dist_partitioner)DIST_PARTITIONER_INIT;
    o->dataset = NULL; /* mnist; NULL tells "not given" apart */
    o->data_format = "idx";
    o->image_feature = "image";
    o->label_feature = "label";
    o->tfrecord_compression = DIST_TFRECORD_AUTO;
    o->auto_shard = "auto";
    o->epochs = 5;
    o->batch_size = 64;
    o->optimizer = "adam";
    o->seed = 42;
    o->early_stopping_patience = -1;
    o->reduce_lr_patience = -1;
    o->reduce_lr_factor = 0.1;
    o->mixed_precision = "none";
    o->base_batch = 64;
    o->evaluator_timeout_s = 600;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            distrain_usage(stdout);
            return 1;
        }
        if (strcmp(a, "--print-cluster") == 0) {
            o->print_cluster = 1;
            continue;
        }
        if (strcmp(a, "--check-numerics") == 0) {
            o->check_numerics = 1;
            continue;
        }
        if (strcmp(a, "--quiet") == 0) {
            o->quiet = 1;
            continue;
        }
        if (strcmp(a, "--deterministic") == 0) {
            o->deterministic = 1;
            continue;
        }
        if (strcmp(a, "--restore-best-weights") == 0) {
            o->restore_best_weights = 1;
            continue;
        }
        if (strcmp(a, "--checkpoint-best-only") == 0) {
            o->checkpoint_best_only = 1;
            continue;
        }
        if (strcmp(a, "--insecure") == 0) {
            o->insecure = 1;
            continue;
        }
        if (strcmp(a, "--overlap-gradients") == 0) {
            o->overlap_gradients = 1;
            continue;
        }
        if (strcmp(a, "--version") == 0) {
            o->version = 1;
            continue;
        }
        const char *v = NULL;
        char flag[64];
        const char *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) == 0 && eq && (size_t)(eq - a) < sizeof flag) {
            memcpy(flag, a, (size_t)(eq - a));
            flag[eq - a] = '\0';
            v = eq + 1;
            a = flag;
        }
        /* Known flags only from here: an unknown one is unknown, with or without a value. */
        const distrain_flag *known = strncmp(a, "--", 2) == 0 ? flag_find(a) : NULL;
        if (strncmp(a, "--", 2) == 0 && !known) {
            fprintf(stderr, "distrain: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (known && !known->takes_value) {
            fprintf(stderr, "distrain: %s takes no value (got '%s')\n", a, v);
            return 2;
        }
        if (!known) {
            fprintf(stderr, "distrain: unexpected argument '%s' (see --help)\n", a);
            return 2;
        }
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "distrain: %s needs a value (see --help)\n", a);
                return 2;
            }
            v = argv[++i];
        }
        int64_t n;
        int rc = 0;
        if (strcmp(a, "--strategy") == 0) {
            o->strategy = v;
        } else if (strcmp(a, "--pjrt-plugin") == 0) {
            o->pjrt_plugin = v;
        } else if (strcmp(a, "--tpu") == 0) {
            o->tpu = v;
        } else if (strcmp(a, "--steps-per-execution") == 0) {
            if (!(rc = parse_int(a, v, 1, 256, &n))) o->steps_per_execution = (int)n;
        } else if (strcmp(a, "--tpu-cores") == 0) {
            if (!(rc = parse_int(a, v, 1, 64, &n))) o->tpu_cores = (int)n;
        } else if (strcmp(a, "--devices") == 0) {
            o->devices = v;
        } else if (strcmp(a, "--dataset") == 0) {
            if (strcmp(v, "mnist") && strcmp(v, "fashion_mnist"))
                return bad(a, v, "expected mnist or fashion_mnist");
            o->dataset = v;
        } else if (strcmp(a, "--data-dir") == 0) {
            o->data_dir = v;
        } else if (strcmp(a, "--data-format") == 0) {
            if (strcmp(v, "idx") && strcmp(v, "jpeg-folder") && strcmp(v, "tfrecord"))
                return bad(a, v, "expected idx, jpeg-folder or tfrecord");
            o->data_format = v;
        } else if (strcmp(a, "--image-feature") == 0) {
            if (!*v) return bad(a, v, "a feature name is needed");
            o->image_feature = v;
        } else if (strcmp(a, "--label-feature") == 0) {
            if (!*v) return bad(a, v, "a feature name is needed");
            o->label_feature = v;
        } else if (strcmp(a, "--feature-keys") == 0) {
            /* image=KEY,label=KEY (either or both) */
            static char keys[2][256];
            char copy[600];
            if (strlen(v) >= sizeof copy) return bad(a, v, "too long");
            snprintf(copy, sizeof copy, "%s", v);
            char *save = NULL;
            int any = 0;
            for (char *kv = strtok_r(copy, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
                char *sep = strchr(kv, '=');
                if (!sep || !sep[1]) return bad(a, v, "expected image=KEY,label=KEY");
                *sep = 0;
                int which = strcmp(kv, "image") == 0 || strcmp(kv, "tokens") == 0 ? 0
                            : strcmp(kv, "label") == 0                            ? 1
                                                                                  : -1;
                if (which < 0) return bad(a, v, "the keys are image (or tokens) and label");
                if (strlen(sep + 1) >= sizeof keys[which]) return bad(a, v, "a key is too long");
                snprintf(keys[which], sizeof keys[which], "%s", sep + 1);
                if (which == 0)
                    o->image_feature = keys[0];
                else
                    o->label_feature = keys[1];
                any = 1;
            }
            if (!any) return bad(a, v, "expected image=KEY,label=KEY");
        } else if (strcmp(a, "--auto-shard") == 0) {
            if (strcmp(v, "auto") && strcmp(v, "file") && strcmp(v, "data"))
                return bad(a, v, "expected auto, file or data");
            o->auto_shard = v;
        } else if (strcmp(a, "--tfrecord-compression") == 0) {
            if (strcmp(v, "auto") == 0)
                o->tfrecord_compression = DIST_TFRECORD_AUTO;
            else if (strcmp(v, "none") == 0)
                o->tfrecord_compression = DIST_TFRECORD_NONE;
            else if (strcmp(v, "gzip") == 0)
                o->tfrecord_compression = DIST_TFRECORD_GZIP;
            else if (strcmp(v, "zlib") == 0)
                o->tfrecord_compression = DIST_TFRECORD_ZLIB;
            else
                return bad(a, v, "expected auto, none, gzip or zlib");
        } else if (strcmp(a, "--epochs") == 0) {
            if (!(rc = parse_int(a, v, 0, 100000, &n))) o->epochs = (int)n;
        } else if (strcmp(a, "--batch-size") == 0) {
            if (!(rc = parse_int(a, v, 1, 1 << 20, &n))) o->batch_size = n;
        } else if (strcmp(a, "--learning-rate") == 0) {
            char *end;
            double x = strtod(v, &end);
            if (*end || end == v || !(x > 0) || x > 1e3)
                return bad(a, v, "must be a positive number");
            o->learning_rate = x;
        } else if (strcmp(a, "--optimizer") == 0) {
            if (strcmp(v, "adam") && strcmp(v, "sgd")) return bad(a, v, "expected adam or sgd");
            o->optimizer = v;
        } else if (strcmp(a, "--lr-schedule") == 0) {
            if (dist_lr_schedule_parse(v, &o->lr_schedule) != DIST_OK)
                return bad(a, v, dist_last_error());
            o->lr_schedule_given = 1;
        } else if (strcmp(a, "--scale-lr") == 0) {
            if (dist_lr_scaling_parse(v, &o->scale_lr) != DIST_OK)
                return bad(a, v, "expected none, linear or sqrt");
        } else if (strcmp(a, "--base-batch") == 0) {
            if (!(rc = parse_int(a, v, 1, 1 << 20, &n))) o->base_batch = n;
            o->base_batch_given = 1;
        } else if (strcmp(a, "--clipnorm") == 0 || strcmp(a, "--clipvalue") == 0 ||
                   strcmp(a, "--global-clipnorm") == 0) {
            char *end;
            double x = strtod(v, &end);
            if (*end || end == v || !(x > 0) || !isfinite(x))
                return bad(a, v, "must be a positive number");
            if (strcmp(a, "--clipnorm") == 0)
                o->clipnorm = x;
            else if (strcmp(a, "--clipvalue") == 0)
                o->clipvalue = x;
            else
                o->global_clipnorm = x;
        } else if (strcmp(a, "--seed") == 0) {
            if (!(rc = parse_int(a, v, 0, INT64_MAX, &n))) o->seed = (uint64_t)n;
        } else if (strcmp(a, "--threads") == 0) {
            if (!(rc = parse_int(a, v, 1, 1024, &n))) o->threads = (int)n;
        } else if (strcmp(a, "--steps-per-epoch") == 0) {
            if (!(rc = parse_int(a, v, 1, INT64_MAX, &n))) o->max_steps = n;
        } else if (strcmp(a, "--metrics-json") == 0) {
            o->metrics_json = v;
        } else if (strcmp(a, "--workers") == 0) {
            if (!(rc = parse_int(a, v, 1, 64, &n))) o->workers = (int)n;
        } else if (strcmp(a, "--ps") == 0) {
            if (!(rc = parse_int(a, v, 1, 64, &n))) o->ps = (int)n;
        } else if (strcmp(a, "--variable-partitioner") == 0) {
            if (dist_partitioner_parse(v, &o->partitioner) != DIST_OK)
                return bad(a, v, dist_last_error());
            o->partitioner_given = 1;
        } else if (strcmp(a, "--transport") == 0) {
            if (strcmp(v, "auto") && strcmp(v, "tcp") && strcmp(v, "shm") && strcmp(v, "mpi") &&
                strcmp(v, "tls"))
                return bad(a, v, "expected auto, tcp, shm, mpi or tls");
            o->transport = v;
        } else if (strcmp(a, "--gradient-compression") == 0) {
            if (strcmp(v, "none") && strcmp(v, "bf16") && strcmp(v, "fp16"))
                return bad(a, v, "expected none, bf16 or fp16");
            o->gradient_compression = v;
        } else if (strcmp(a, "--bytes-per-pack") == 0) {
            if (!(rc = parse_int(a, v, 1, INT64_MAX, &n))) o->bytes_per_pack = n;
        } else if (strcmp(a, "--tls-cert") == 0) {
            o->tls_cert = v;
        } else if (strcmp(a, "--tls-key") == 0) {
            o->tls_key = v;
        } else if (strcmp(a, "--tls-ca") == 0) {
            o->tls_ca = v;
        } else if (strcmp(a, "--cluster-token-file") == 0) {
            o->token_file = v;
        } else if (strcmp(a, "--collective-timeout") == 0 || strcmp(a, "--connect-timeout") == 0) {
            char *end;
            double x = strtod(v, &end);
            if (*end || end == v || !(x > 0) || x > 1e6)
                return bad(a, v, "must be a positive number of seconds");
            if (strcmp(a, "--collective-timeout") == 0)
                o->collective_timeout_s = x;
            else
                o->connect_timeout_s = x;
        } else if (strcmp(a, "--validation-split") == 0) {
            char *end;
            double x = strtod(v, &end);
            if (*end || end == v || !(x > 0 && x < 1))
                return bad(a, v, "must be a number between 0 and 1 (exclusive)");
            o->validation_split = x;
        } else if (strcmp(a, "--checkpoint-dir") == 0) {
            o->checkpoint_dir = v;
        } else if (strcmp(a, "--task") == 0) {
            if (strcmp(v, "train") && strcmp(v, "evaluator"))
                return bad(a, v, "expected train or evaluator");
            o->evaluator = strcmp(v, "evaluator") == 0;
            o->task_given = 1;
        } else if (strcmp(a, "--evaluator-timeout") == 0) {
            char *end;
            double x = strtod(v, &end);
            if (*end || end == v || !(x > 0) || x > 1e6)
                return bad(a, v, "must be a positive number of seconds");
            o->evaluator_timeout_s = x;
            o->evaluator_timeout_given = 1;
        } else if (strcmp(a, "--backup-dir") == 0) {
            o->backup_dir = v;
        } else if (strcmp(a, "--backup-freq") == 0) {
            if (!(rc = parse_int(a, v, 1, INT64_MAX, &n))) o->backup_freq = n;
        } else if (strcmp(a, "--trace") == 0) {
            o->trace = v;
        } else if (strcmp(a, "--logdir") == 0) {
            o->logdir = v;
        } else if (strcmp(a, "--histogram-freq") == 0) {
            if (!(rc = parse_int(a, v, 0, 1000000, &n))) o->histogram_freq = (int)n;
            o->tensorboard_flag_given = 1;
        } else if (strcmp(a, "--update-freq") == 0) {
            if (strcmp(v, "epoch") == 0)
                o->update_freq = 0;
            else if (strcmp(v, "batch") == 0)
                o->update_freq = 1;
            else if (!(rc = parse_int(a, v, 1, INT64_MAX, &n)))
                o->update_freq = n;
            o->tensorboard_flag_given = 1;
        } else if (strcmp(a, "--csv-log") == 0) {
            o->csv_log = v;
        } else if (strcmp(a, "--save-weights") == 0) {
            o->save_weights = v;
        } else if (strcmp(a, "--save-model") == 0) {
            o->save_model = v;
        } else if (strcmp(a, "--model") == 0) {
            o->model_file = v;
        } else if (strcmp(a, "--checkpoint-monitor") == 0) {
            if (strcmp(v, "val_loss") && strcmp(v, "val_accuracy") && strcmp(v, "loss") &&
                strcmp(v, "accuracy"))
                return bad(a, v, "expected val_loss, val_accuracy, loss or accuracy");
            o->checkpoint_monitor = v;
        } else if (strcmp(a, "--checkpoint-mode") == 0) {
            if (strcmp(v, "auto") && strcmp(v, "min") && strcmp(v, "max"))
                return bad(a, v, "expected auto, min or max");
            o->checkpoint_mode = v;
        } else if (strcmp(a, "--load-weights") == 0) {
            o->load_weights = v;
        } else if (strcmp(a, "--target-accuracy") == 0) {
            char *end;
            double x = strtod(v, &end);
            if (*end || end == v || !(x > 0 && x <= 1))
                return bad(a, v, "must be a number in (0, 1]");
            o->target_accuracy = x;
        } else if (strcmp(a, "--early-stopping-patience") == 0) {
            if (!(rc = parse_int(a, v, 0, 100000, &n))) o->early_stopping_patience = (int)n;
        } else if (strcmp(a, "--mixed-precision") == 0) {
            if (strcmp(v, "none") && strcmp(v, "fp16") && strcmp(v, "bf16"))
                return bad(a, v, "expected none, fp16 or bf16");
            o->mixed_precision = v;
            o->mixed_precision_given = 1;
        } else if (strcmp(a, "--conv-algorithm") == 0) {
            if (strcmp(v, "direct") && strcmp(v, "winograd"))
                return bad(a, v, "expected direct or winograd");
            o->conv_algorithm = v;
        } else if (strcmp(a, "--loss-scale") == 0) {
            const char *num = strncmp(v, "dynamic:", 8) == 0 ? v + 8 : v;
            if (strcmp(v, "dynamic") && strcmp(v, "none")) {
                char *end;
                errno = 0;
                double x = strtod(num, &end);
                if (errno || *end || end == num || !(x > 0) || x > 3.0e38)
                    return bad(a, v,
                               "expected dynamic, dynamic:INITIAL, none or a positive finite "
                               "scale");
                o->loss_scale_value = x;
            }
            o->loss_scale = v;
        } else if (strcmp(a, "--cuda-graphs") == 0) {
            if (strcmp(v, "on") == 0)
                o->cuda_graphs = 1;
            else if (strcmp(v, "off") == 0)
                o->cuda_graphs = -1;
            else
                return bad(a, v, "expected on or off");
        } else if (strcmp(a, "--reduce-lr-patience") == 0) {
            if (!(rc = parse_int(a, v, 0, 100000, &n))) o->reduce_lr_patience = (int)n;
        } else if (strcmp(a, "--reduce-lr-factor") == 0) {
            char *end;
            double x = strtod(v, &end);
            if (*end || end == v || !(x > 0 && x < 1))
                return bad(a, v, "must be a number between 0 and 1 (exclusive), as Keras requires");
            o->reduce_lr_factor = x;
            o->reduce_lr_factor_given = 1;
        } else {
            fprintf(stderr, "distrain: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (rc) return rc;
    }
    if (dist_strategy_kind_parse(o->strategy, &o->strategy_kind)) {
        fprintf(stderr, "distrain: --strategy: %s\n", dist_last_error());
        return 2;
    }
    int ps = o->strategy_kind == DIST_STRATEGY_PARAMETER_SERVER;
    if (o->workers > 0 && o->strategy_kind != DIST_STRATEGY_MULTI_WORKER && !ps) {
        fprintf(stderr, "distrain: --workers needs --strategy multi_worker or parameter_server\n");
        return 2;
    }
    if (o->ps > 0 && (!ps || !o->workers)) {
        fprintf(stderr, "distrain: --ps needs --strategy parameter_server and --workers\n");
        return 2;
    }
    if (ps && o->workers > 0 && !o->ps) {
        fprintf(stderr, "distrain: --strategy parameter_server --workers N needs --ps M (the "
                        "ps tasks that hold the variables)\n");
        return 2;
    }
    if ((o->clipnorm > 0) + (o->clipvalue > 0) + (o->global_clipnorm > 0) > 1) {
        fprintf(stderr, "distrain: only one of --clipnorm, --clipvalue and --global-clipnorm can "
                        "be set (as Keras's optimizers)\n");
        return 2;
    }
    if (ps && (o->clipnorm > 0 || o->clipvalue > 0 || o->global_clipnorm > 0)) {
        fprintf(stderr, "distrain: --clipnorm, --clipvalue and --global-clipnorm are not "
                        "supported with --strategy parameter_server (the ps tasks apply the "
                        "update and do not clip)\n");
        return 2;
    }
    if (o->lr_schedule_given && o->learning_rate > 0) {
        fprintf(stderr, "distrain: --learning-rate and --lr-schedule are exclusive (the schedule "
                        "gives the learning rate)\n");
        return 2;
    }
    if (o->lr_schedule_given && o->reduce_lr_patience >= 0) {
        fprintf(stderr, "distrain: --reduce-lr-patience cannot reduce a --lr-schedule (Keras's "
                        "ReduceLROnPlateau fails on a schedule: its learning rate is not "
                        "settable)\n");
        return 2;
    }
    int tpu = o->strategy_kind == DIST_STRATEGY_TPU;
    if (tpu && o->devices) {
        fprintf(stderr, "distrain: --devices does not apply to --strategy tpu: its replicas are "
                        "the PJRT plugin's devices (choose how many with --tpu-cores)\n");
        return 2;
    }
    if (tpu && o->tpu_cores && o->batch_size % o->tpu_cores != 0) {
        fprintf(stderr,
                "distrain: --batch-size %lld does not split evenly over --tpu-cores %d: the "
                "compiled step takes equal per-replica shards; use a multiple of %d\n",
                (long long)o->batch_size, o->tpu_cores, o->tpu_cores);
        return 2;
    }
    if (!tpu && (o->pjrt_plugin || o->tpu || o->tpu_cores)) {
        fprintf(stderr, "distrain: --pjrt-plugin, --tpu and --tpu-cores apply to --strategy tpu "
                        "only\n");
        return 2;
    }
    if (o->base_batch_given && o->scale_lr == DIST_LR_SCALING_NONE) {
        fprintf(stderr, "distrain: --base-batch needs --scale-lr linear or sqrt (without it the "
                        "learning rate is not scaled)\n");
        return 2;
    }
    if (o->scale_lr != DIST_LR_SCALING_NONE && o->lr_schedule_given) {
        fprintf(stderr, "distrain: --scale-lr scales --learning-rate, not a --lr-schedule (scale "
                        "the schedule's rates in its spec)\n");
        return 2;
    }
    if (o->scale_lr != DIST_LR_SCALING_NONE) {
        dist_sgd_options sgd = DIST_SGD_OPTIONS_INIT;
        dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
        double base = o->learning_rate > 0               ? o->learning_rate
                      : strcmp(o->optimizer, "sgd") == 0 ? sgd.learning_rate
                                                         : adam.learning_rate;
        float lr;
        if (dist_scale_learning_rate((float)base, o->base_batch, o->batch_size, o->scale_lr, &lr) !=
            DIST_OK) {
            fprintf(stderr, "distrain: --scale-lr: %s\n", dist_last_error());
            return 2;
        }
        o->base_learning_rate = base;
        o->learning_rate = lr;
    }
    /* each name as the strategy will read it (dist_device_parse: libdist's and TensorFlow's
     * forms), so a bad one is a usage error before anything starts */
    if (o->devices) {
        size_t n = strlen(o->devices);
        if (n == 0 || o->devices[0] == ',' || o->devices[n - 1] == ',' ||
            strstr(o->devices, ",,")) {
            fprintf(stderr, "distrain: --devices: empty entry in '%s'\n", o->devices);
            return 2;
        }
        char list[1024], *save = NULL;
        snprintf(list, sizeof list, "%s", o->devices);
        for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            dist_device d;
            while (*tok == ' ') tok++; /* "cpu:0, cpu:1", as the strategy reads it */
            if (dist_device_parse(tok, &d)) {
                fprintf(stderr, "distrain: --devices: %s\n", dist_last_error());
                return 2;
            }
        }
    }
    if (ps && o->steps_per_execution > 1) {
        fprintf(stderr, "distrain: --steps-per-execution does not apply to --strategy "
                        "parameter_server (each step is a closure on a free worker)\n");
        return 2;
    }
    if (o->partitioner_given && !ps) {
        fprintf(stderr, "distrain: --variable-partitioner applies to --strategy "
                        "parameter_server only\n");
        return 2;
    }
    return 0;
}

int distrain_parse_predict_args(int argc, char **argv, distrain_predict_options *o) {
    memset(o, 0, sizeof *o);
    o->strategy = dist_strategy_kind_name(DIST_STRATEGY_MIRRORED);
    o->batch_size = 64;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            predict_usage(stdout);
            return 1;
        }
        const char *v = NULL;
        char flag[64];
        const char *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) == 0 && eq && (size_t)(eq - a) < sizeof flag) {
            memcpy(flag, a, (size_t)(eq - a));
            flag[eq - a] = '\0';
            v = eq + 1;
            a = flag;
        }
        const distrain_flag *known =
            strncmp(a, "--", 2) == 0 ? flag_in(predict_flags, COUNT(predict_flags), a) : NULL;
        if (!known) {
            fprintf(stderr, "distrain predict: %s '%s' (see distrain predict --help)\n",
                    strncmp(a, "--", 2) == 0 ? "unknown option" : "unexpected argument", a);
            return 2;
        }
        if (!known->takes_value) {
            if (v) {
                fprintf(stderr, "distrain predict: %s takes no value (got '%s')\n", a, v);
                return 2;
            }
            o->logits = 1; /* --logits, the one switch */
            continue;
        }
        if (!v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "distrain predict: %s needs a value (see --help)\n", a);
                return 2;
            }
            v = argv[++i];
        }
        int64_t n;
        int rc = 0;
        if (strcmp(a, "--weights") == 0)
            o->weights = v;
        else if (strcmp(a, "--input") == 0)
            o->input = v;
        else if (strcmp(a, "--model-json") == 0)
            o->model_json = v;
        else if (strcmp(a, "--strategy") == 0)
            o->strategy = v;
        else if (strcmp(a, "--devices") == 0)
            o->devices = v;
        else if (strcmp(a, "--batch-size") == 0) {
            if (!(rc = parse_int(a, v, 1, 1 << 20, &n))) o->batch_size = n;
        } else if (strcmp(a, "--threads") == 0) {
            if (!(rc = parse_int(a, v, 1, 1024, &n))) o->threads = (int)n;
        }
        if (rc) return rc;
    }
    if (!o->weights || !o->input) {
        fprintf(stderr, "distrain predict: %s is required (see distrain predict --help)\n",
                !o->weights ? "--weights" : "--input");
        return 2;
    }
    if (dist_strategy_kind_parse(o->strategy, &o->strategy_kind)) {
        fprintf(stderr, "distrain predict: --strategy: %s\n", dist_last_error());
        return 2;
    }
    return 0;
}
