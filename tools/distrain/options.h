/* distrain's command line. */
#ifndef DISTRAIN_OPTIONS_H
#define DISTRAIN_OPTIONS_H

#include "dist/optim.h"
#include "dist/partitioner.h"
#include "dist/strategy.h"

#include <stdint.h>
#include <stdio.h>

typedef struct distrain_options {
    const char *strategy;
    dist_strategy_kind strategy_kind; /* --strategy, parsed by the library's registry */
    const char *devices;
    const char *dataset; /* mnist | fashion_mnist */
    const char *data_dir;
    const char *data_format;      /* idx | jpeg-folder | tfrecord */
    const char *image_feature;    /* tfrecord: the Example's encoded image (bytes); "image" */
    const char *label_feature;    /* tfrecord: the Example's label (int64); "label" */
    int tfrecord_compression;     /* tfrecord: dist_tfrecord_compression; auto */
    const char *auto_shard;       /* multi_worker: auto | file | data */
    int epochs;                   /* 0: evaluate only (with --load-weights) */
    int64_t batch_size;           /* global */
    double learning_rate;         /* <= 0: the optimizer's default */
    const char *optimizer;        /* adam | sgd */
    dist_lr_schedule lr_schedule; /* --lr-schedule, when lr_schedule_given */
    int lr_schedule_given;
    int mixed_precision_given; /* --mixed-precision was on the command line (else a --model's
                                  Keras dtype policy stands) */
    /* --scale-lr: learning_rate holds the scaled rate, base_learning_rate the one scaled
     * (--learning-rate or the optimizer's default), tuned at base_batch (--base-batch, 64) */
    dist_lr_scaling scale_lr;
    int64_t base_batch;
    int base_batch_given;
    double base_learning_rate;
    double clipnorm, clipvalue, global_clipnorm; /* 0 = off */
    uint64_t seed;
    int threads; /* per replica; 0 = cores / replicas */
    const char *metrics_json;
    int quiet;
    int version; /* --version: print the versions and exit */
    int print_cluster;
    int64_t max_steps; /* per epoch; 0 = all (for quick runs and benchmarks) */
    /* multi_worker */
    int workers;                  /* > 0: spawn this many local workers (the launcher) */
    int ps;                       /* parameter_server with workers: this many ps tasks too */
    dist_partitioner partitioner; /* --variable-partitioner */
    int partitioner_given;
    double collective_timeout_s;      /* 0: the strategy's default (60 s across workers) */
    double connect_timeout_s;         /* 0: 300 s */
    const char *transport;            /* auto | tcp | shm | mpi | tls */
    const char *tls_cert;             /* --tls-cert */
    const char *tls_key;              /* --tls-key */
    const char *tls_ca;               /* --tls-ca */
    const char *token_file;           /* --cluster-token-file: $DIST_CLUSTER_TOKEN_FILE */
    int insecure;                     /* --insecure: join without a cluster token */
    int overlap_gradients;            /* --overlap-gradients */
    int64_t bytes_per_pack;           /* --bytes-per-pack; 0: the strategy's default */
    const char *gradient_compression; /* --gradient-compression: none | bf16 | fp16 */
    const char *checkpoint_dir;       /* ModelCheckpoint: the training state at every epoch end */
    const char *backup_dir;           /* BackupAndRestore */
    int64_t backup_freq;              /* backups every N batches; 0 = at epoch ends */
    const char *logdir;               /* TensorBoard event files */
    int histogram_freq;         /* --histogram-freq: weight histograms every N epochs; 0 = off */
    int64_t update_freq;        /* --update-freq: batch scalars every N batches; 0 = epoch */
    int tensorboard_flag_given; /* --histogram-freq or --update-freq was on the command line */
    const char *csv_log;        /* CSVLogger */
    const char *model_file;     /* --model: Keras's model.to_json() to train; NULL: the seed CNN */
    const char *save_weights;   /* the final weights: safetensors, or Keras's *.weights.h5 */
    /* --save-model: the trained model as Keras 3's .keras (the best epoch's with
     * --checkpoint-best-only, ModelCheckpoint's save_best_only for it and --checkpoint-dir,
     * with its monitor, NULL: val_loss, and mode, NULL: auto) */
    const char *save_model;
    int checkpoint_best_only;
    const char *checkpoint_monitor;
    const char *checkpoint_mode;
    const char *load_weights;    /* start from these weights (safetensors or .weights.h5) */
    int early_stopping_patience; /* -1 = no EarlyStopping */
    int reduce_lr_patience;      /* -1 = no ReduceLROnPlateau */
    double reduce_lr_factor;     /* ReduceLROnPlateau's factor (Keras's default 0.1) */
    int reduce_lr_factor_given;  /* --reduce-lr-factor was on the command line */
    double target_accuracy;      /* > 0: stop after the epoch whose test accuracy reaches it */
    int restore_best_weights;    /* EarlyStopping's restore_best_weights (Keras's default off) */
    double validation_split;     /* 0 = no validation */
    const char *trace;           /* Chrome trace JSON of the training steps */
    int check_numerics;          /* stop at the first Inf/NaN, naming layer, op and replica */
    const char *mixed_precision; /* none | fp16 | bf16 */
    const char *conv_algorithm;  /* direct | winograd; NULL: $DIST_CPU_WINOGRAD decides */
    /* --loss-scale: NULL = the policy's default (dynamic for fp16, none otherwise), "dynamic",
     * "dynamic:F" (initial scale F), "none", or a fixed scale F; F in loss_scale_value */
    const char *loss_scale;
    double loss_scale_value;
    int deterministic;       /* GPUs: deterministic cuDNN algorithms only */
    int cuda_graphs;         /* 0 = default (on, unless $DIST_CUDA_GRAPHS=0), 1 = on, -1 = off */
    const char *pjrt_plugin; /* tpu: --pjrt-plugin */
    const char *tpu;         /* tpu: --tpu (TPUClusterResolver's name) */
    int tpu_cores;           /* tpu: replicas; 0 = every device */
    int steps_per_execution; /* Keras's steps_per_execution; 0 = 1 */
    /* --task evaluator, or TF_CONFIG's evaluator task: evaluate --checkpoint-dir's checkpoints
     * as they appear (evaluator.h) */
    int evaluator;
    int task_given;              /* --task was on the command line */
    double evaluator_timeout_s;  /* --evaluator-timeout: the longest wait for a new checkpoint */
    int evaluator_timeout_given; /* --evaluator-timeout was on the command line */
} distrain_options;

/* distrain predict: a model's predictions, one JSON line per example. */
typedef struct distrain_predict_options {
    const char *weights;    /* required: safetensors or Keras .weights.h5 */
    const char *input;      /* required: an IDX images file, a JPEG file or a folder of JPEGs */
    const char *model_json; /* Keras's model.to_json(); NULL: the seed CNN */
    const char *strategy;
    dist_strategy_kind strategy_kind;
    const char *devices;
    int64_t batch_size; /* global */
    int threads;        /* per replica; 0 = cores / replicas */
    int logits;         /* print logits instead of probabilities */
} distrain_predict_options;

/* Parses the arguments after "predict" (argv[0] is "predict"). Returns 0 to run, 1 when --help
 * was printed, 2 on a usage error (printed). */
int distrain_parse_predict_args(int argc, char **argv, distrain_predict_options *o);

/* Parses argv. Returns 0 to run, 1 when --help was printed, 2 on a usage error (printed). */
int distrain_parse_args(int argc, char **argv, distrain_options *o);
void distrain_usage(FILE *out);

#endif
