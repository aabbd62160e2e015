#include "options.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void distrain_usage(FILE *out) {
    fprintf(
        out,
        "usage: distrain [options]\n"
        "  --strategy one_device|mirrored|multi_worker\n"
        "                                   distribution strategy (default mirrored)\n"
        "  --devices LIST                   e.g. cpu:0,cpu:1 or gpu:0,gpu:1 (default: all GPUs, "
        "else one\n"
        "                                   CPU replica per core)\n"
        "  --dataset mnist|fashion_mnist    (default mnist)\n"
        "  --data-dir DIR                   directory with the IDX files (or class folders for "
        "jpeg-folder)\n"
        "  --data-format idx|jpeg-folder    (default idx)\n"
        "  --epochs N                       (default 5)\n"
        "  --batch-size N                   global batch size (default 64)\n"
        "  --learning-rate F                (default: Adam 0.001, SGD 0.01)\n"
        "  --optimizer adam|sgd             (default adam)\n"
        "  --seed N                         (default 42)\n"
        "  --threads N                      compute threads per replica (default cores / "
        "replicas)\n"
        "  --steps-per-epoch N              stop each epoch after N steps (default: whole epoch)\n"
        "  --metrics-json FILE              write final metrics as JSON\n"
        "  --workers N                      multi_worker: run N local worker processes on "
        "loopback\n"
        "                                   (without it, TF_CONFIG says which worker this is)\n"
        "  --transport auto|tcp|shm|mpi     multi_worker: how workers exchange gradients "
        "(default auto:\n"
        "                                   shared memory when all are on this host; mpi: "
        "the MPI world\n"
        "                                   of mpirun/srun, the cluster when TF_CONFIG is "
        "absent)\n"
        "  --cluster-token-file FILE        multi_worker: the cluster's shared secret (else "
        "$DIST_CLUSTER_TOKEN;\n"
        "                                   --workers makes one); workers without it are "
        "refused\n"
        "  --insecure                       multi_worker: join without a cluster token (anyone "
        "who can reach\n"
        "                                   the workers' ports can join the job)\n"
        "  --collective-timeout S           fail a step when a worker has not answered in S "
        "seconds (60)\n"
        "  --connect-timeout S              fail when the cluster has not assembled in S "
        "seconds (300)\n"
        "  --validation-split F             hold out the last fraction F of the training set "
        "(0 < F < 1)\n"
        "  --checkpoint-dir DIR             save the training state at every epoch end "
        "(DIR/ckpt-EE.safetensors)\n"
        "  --backup-dir DIR                 back up the training state; a restarted run "
        "resumes from it\n"
        "  --backup-freq N                  back up every N steps instead of every epoch\n"
        "  --logdir DIR                     TensorBoard event files under DIR/train and "
        "DIR/validation\n"
        "  --csv-log FILE                   one CSV row of metrics per epoch\n"
        "  --save-weights FILE              write the final weights as safetensors\n"
        "  --check-numerics                 stop at the first layer output, gradient or update "
        "holding\n"
        "                                   Inf or NaN, naming the layer, its op and the replica\n"
        "  --trace FILE                     a Chrome trace JSON timeline of the training "
        "(per replica: forward,\n"
        "                                   backward, all-reduce, update; data wait; "
        "validation)\n"
        "  --mixed-precision none|fp16|bf16 compute in float16 / bfloat16 with float32 "
        "variables (Keras's\n"
        "                                   mixed_float16 / mixed_bfloat16; default none)\n"
        "  --loss-scale dynamic[:F]|none|F  loss scaling: dynamic (from 2^15 or F, TF's "
        "rules), none, or\n"
        "                                   a fixed scale F (default: dynamic with fp16, none "
        "otherwise)\n"
        "  --early-stopping-patience N      stop when val_loss (or loss) stalls N epochs\n"
        "  --reduce-lr-patience N           halve the learning rate when val_loss (or loss) "
        "stalls N epochs\n"
        "  --print-cluster                  print the cluster and task resolved from TF_CONFIG (or "
        "Slurm)\n"
        "                                   as JSON and exit (2 with TensorFlow's message if "
        "invalid)\n"
        "  --deterministic                  GPUs: deterministic algorithms only (the same run "
        "gives the same bits)\n"
        "  --cuda-graphs on|off             GPUs: replay repeated step work as CUDA graphs "
        "(default on)\n"
        "  --quiet                          no summary or progress, only errors\n"
        "  --help\n");
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
    o->strategy = "mirrored";
    o->dataset = "mnist";
    o->data_format = "idx";
    o->epochs = 5;
    o->batch_size = 64;
    o->optimizer = "adam";
    o->seed = 42;
    o->early_stopping_patience = -1;
    o->reduce_lr_patience = -1;
    o->mixed_precision = "none";
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
        if (strcmp(a, "--insecure") == 0) {
            o->insecure = 1;
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
        } else if (strncmp(a, "--", 2) == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "distrain: %s needs a value (see --help)\n", a);
                return 2;
            }
            v = argv[++i];
        } else {
            fprintf(stderr, "distrain: unexpected argument '%s' (see --help)\n", a);
            return 2;
        }
        int64_t n;
        int rc = 0;
        if (strcmp(a, "--strategy") == 0) {
            o->strategy = v;
        } else if (strcmp(a, "--devices") == 0) {
            o->devices = v;
        } else if (strcmp(a, "--dataset") == 0) {
            if (strcmp(v, "mnist") && strcmp(v, "fashion_mnist"))
                return bad(a, v, "expected mnist or fashion_mnist");
            o->dataset = v;
        } else if (strcmp(a, "--data-dir") == 0) {
            o->data_dir = v;
        } else if (strcmp(a, "--data-format") == 0) {
            if (strcmp(v, "idx") && strcmp(v, "jpeg-folder"))
                return bad(a, v, "expected idx or jpeg-folder");
            o->data_format = v;
        } else if (strcmp(a, "--epochs") == 0) {
            if (!(rc = parse_int(a, v, 1, 100000, &n))) o->epochs = (int)n;
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
        } else if (strcmp(a, "--transport") == 0) {
            if (strcmp(v, "auto") && strcmp(v, "tcp") && strcmp(v, "shm") && strcmp(v, "mpi"))
                return bad(a, v, "expected auto, tcp, shm or mpi");
            o->transport = v;
        } else if (strcmp(a, "--cluster-token-file") == 0) {
            o->token_file = v;
        } else if (strcmp(a, "--collective-timeout") == 0 || strcmp(a, "--connect-timeout") == 0) {
            char *end;
            double x = strtod(v, &end);
            if (*end || end == v || !(x > 0) || x > 1e6)
                return bad(a, v, "must be a positive number of seconds");
            if (a[2] == 'c' && a[3] == 'o' && a[4] == 'l')
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
        } else if (strcmp(a, "--backup-dir") == 0) {
            o->backup_dir = v;
        } else if (strcmp(a, "--backup-freq") == 0) {
            if (!(rc = parse_int(a, v, 1, INT64_MAX, &n))) o->backup_freq = n;
        } else if (strcmp(a, "--trace") == 0) {
            o->trace = v;
        } else if (strcmp(a, "--logdir") == 0) {
            o->logdir = v;
        } else if (strcmp(a, "--csv-log") == 0) {
            o->csv_log = v;
        } else if (strcmp(a, "--save-weights") == 0) {
            o->save_weights = v;
        } else if (strcmp(a, "--early-stopping-patience") == 0) {
            if (!(rc = parse_int(a, v, 0, 100000, &n))) o->early_stopping_patience = (int)n;
        } else if (strcmp(a, "--mixed-precision") == 0) {
            if (strcmp(v, "none") && strcmp(v, "fp16") && strcmp(v, "bf16"))
                return bad(a, v, "expected none, fp16 or bf16");
            o->mixed_precision = v;
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
        } else {
            fprintf(stderr, "distrain: unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (rc) return rc;
    }
    if (o->workers > 0 && strcmp(o->strategy, "multi_worker") != 0) {
        fprintf(stderr, "distrain: --workers needs --strategy multi_worker\n");
        return 2;
    }
    return 0;
}
