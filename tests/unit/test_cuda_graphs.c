/* Step graphs on a GPU (CUDA graphs of repeated step work, src/backend/step_graphs.h): training
 * with them must give the same weights, bit for bit, as training without them, and they must
 * really be used. Both sides run with deterministic algorithms, which cuDNN's heuristics pick
 * the same way every time, so any difference is the graphs' doing: a stale input batch, a
 * stale learning rate, a step replayed that should not have been.
 *
 * The cases cover what changes between steps: Adam's bias-corrected learning rate (every
 * step), a learning rate set by the program, the last partial batch of an epoch, and dynamic
 * loss scaling, whose finite check waits for the GPU in the middle of the step.
 *
 * Without a GPU only the host tests run, and the program exits 77 (skipped). */
#include "dist/dist.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dist_mnist *g_mnist;

/* ---- host-side: always run ------------------------------------------------------------ */

START_TEST(test_cuda_graphs_option_out_of_range_is_refused) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_ONE_DEVICE;
    so.devices = "cpu:0";
    so.cuda_graphs = 2;
    dist_strategy *s = (dist_strategy *)0x1;
    ck_assert_int_eq(dist_strategy_create(&so, &s), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(dist_last_error(), "cuda_graphs") != NULL, "message: %s",
                  dist_last_error());
}
END_TEST

START_TEST(test_cpu_strategies_report_no_graphs) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_ONE_DEVICE;
    so.devices = "cpu:0";
    so.cuda_graphs = 1;
    dist_strategy *s;
    ck_assert_int_eq(dist_strategy_create(&so, &s), DIST_OK);
    dist_graph_stats g;
    memset(&g, 0xff, sizeof g);
    dist_strategy_graph_stats(s, &g);
    ck_assert_int_eq(g.captured + g.replayed + g.eager_segments + g.capture_failures, 0);
    dist_strategy_destroy(s);
}
END_TEST

static Suite *host_suite(void) {
    Suite *s = suite_create("cuda_graphs_host");
    TCase *tc = tcase_create("host");
    tcase_add_test(tc, test_cuda_graphs_option_out_of_range_is_refused);
    tcase_add_test(tc, test_cpu_strategies_report_no_graphs);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- training with and without graphs ------------------------------------------------- */

typedef struct run_cfg {
    const char *devices;
    int graphs;
    int sgd;          /* SGD with momentum 0.9, else Adam */
    int fp16;         /* mixed_float16 with a dynamic loss scale */
    int64_t batch;    /* global batch */
    int steps;        /* the dataset repeats, so steps may cross epochs */
    int lr_change_at; /* > 0: the learning rate is halved before this step */
} run_cfg;

#define MAX_PARAMS 200000

typedef struct run_result {
    float *weights;
    int64_t n;
    dist_graph_stats stats;
    float last_loss;
} run_result;

#define OK(call) ck_assert_msg((call) == DIST_OK, "%s: %s", #call, dist_last_error())

static run_result train(const run_cfg *cfg) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_MIRRORED;
    so.devices = cfg->devices;
    so.deterministic = 1;
    so.cuda_graphs = cfg->graphs ? 1 : -1;
    dist_strategy *s;
    OK(dist_strategy_create(&so, &s));
    dist_model *model;
    dist_optimizer *opt;
    int64_t shape[3] = {28, 28, 1};
    OK(dist_strategy_scope_enter(s));
    OK(dist_model_create_mnist_cnn(&model));
    OK(dist_model_build(model, 3, shape, 7));
    if (cfg->sgd) {
        dist_sgd_options o = DIST_SGD_OPTIONS_INIT;
        o.momentum = 0.9f;
        OK(dist_optimizer_create_sgd(&o, &opt));
    } else {
        dist_adam_options o = DIST_ADAM_OPTIONS_INIT;
        OK(dist_optimizer_create_adam(&o, &opt));
    }
    OK(dist_strategy_scope_exit(s));
    dist_loss_scale_optimizer *lso = NULL;
    if (cfg->fp16) {
        OK(dist_model_set_dtype_policy(model, DIST_POLICY_MIXED_FLOAT16));
        dist_loss_scale_options lo = DIST_LOSS_SCALE_OPTIONS_INIT;
        OK(dist_loss_scale_optimizer_create(opt, &lo, &lso));
    }

    dist_tensor images = *dist_mnist_train_images(g_mnist);
    dist_tensor labels = *dist_mnist_train_labels(g_mnist);
    dist_tensor *parts[2] = {&images, &labels};
    dist_dataset *ds, *next;
    OK(dist_dataset_from_tensor_slices(parts, 2, 0, &ds));
    OK(dist_dataset_map_image_normalize(ds, &next));
    dist_dataset_destroy(ds), ds = next;
    OK(dist_dataset_shuffle(ds, 8000, 3, 1, &next));
    dist_dataset_destroy(ds), ds = next;
    OK(dist_dataset_batch(ds, cfg->batch, 0, &next)); /* keeps the partial last batch */
    dist_dataset_destroy(ds), ds = next;
    OK(dist_dataset_repeat(ds, -1, &next));
    dist_dataset_destroy(ds), ds = next;
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    OK(dist_strategy_distribute_dataset(s, ds, &dds));
    OK(dist_distributed_dataset_iterator(dds, &it));

    run_result res = {0};
    dist_classifier_step cs = {model, opt, 0, lso};
    for (int i = 0; i < cfg->steps; i++) {
        if (cfg->lr_change_at > 0 && i == cfg->lr_change_at)
            OK(dist_optimizer_set_learning_rate(opt, dist_optimizer_learning_rate(opt) * 0.5f));
        dist_per_replica_element e;
        int end = 0;
        OK(dist_distributed_iterator_next(it, &e, &end));
        ck_assert_int_eq(end, 0);
        cs.global_batch_size = e.global_batch_size;
        dist_per_replica out;
        OK(dist_strategy_run(s, dist_classifier_train_step, &cs, &e, &out));
        dist_tensor *loss;
        OK(dist_strategy_reduce(s, DIST_REDUCE_SUM, &out, 0, -1, &loss));
        res.last_loss = *(float *)loss->data;
        dist_tensor_destroy(loss);
    }
    res.n = dist_model_num_params(model);
    ck_assert_int_le(res.n, MAX_PARAMS);
    res.weights = malloc((size_t)res.n * sizeof *res.weights);
    OK(dist_model_get_weights(model, 0, res.weights, res.n));
    for (int r = 1; r < dist_model_num_replicas(model); r++) {
        float *other = malloc((size_t)res.n * sizeof *other);
        OK(dist_model_get_weights(model, r, other, res.n));
        ck_assert_msg(memcmp(other, res.weights, (size_t)res.n * sizeof *other) == 0,
                      "replica %d differs from replica 0", r);
        free(other);
    }
    dist_strategy_graph_stats(s, &res.stats);

    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    dist_loss_scale_optimizer_destroy(lso);
    dist_optimizer_destroy(opt);
    dist_model_destroy(model);
    dist_strategy_destroy(s);
    return res;
}

/* Trains cfg with graphs off, then on, and compares. min_replayed: how many segments the
 * graphs run must at least have replayed. */
static void expect_graphs_change_nothing(run_cfg cfg, int64_t min_replayed) {
    cfg.graphs = 0;
    run_result eager = train(&cfg);
    cfg.graphs = 1;
    run_result graphs = train(&cfg);
    printf("  %s %s%s batch %lld, %d steps: replayed %lld, captured %lld, eager %lld, capture "
           "failures %lld; last loss %.6f (eager %.6f)\n",
           cfg.devices, cfg.sgd ? "SGD" : "Adam", cfg.fp16 ? " fp16" : "", (long long)cfg.batch,
           cfg.steps, (long long)graphs.stats.replayed, (long long)graphs.stats.captured,
           (long long)graphs.stats.eager_segments, (long long)graphs.stats.capture_failures,
           graphs.last_loss, eager.last_loss);
    ck_assert_msg(isfinite(eager.last_loss), "the eager run's loss is %g", eager.last_loss);
    ck_assert_int_eq(eager.stats.captured + eager.stats.replayed + eager.stats.eager_segments, 0);
    ck_assert_int_eq(graphs.stats.capture_failures, 0);
    ck_assert_int_ge(graphs.stats.captured, 1);
    ck_assert_msg(graphs.stats.replayed >= min_replayed, "only %lld segments replayed (>= %lld)",
                  (long long)graphs.stats.replayed, (long long)min_replayed);
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < eager.n; i++)
        if (memcmp(&eager.weights[i], &graphs.weights[i], sizeof(float)) != 0) {
            if (first < 0) first = i;
            differ++;
        }
    ck_assert_msg(
        differ == 0, "%lld of %lld weights differ with graphs (first: [%lld] %.9g vs %.9g eager)",
        (long long)differ, (long long)eager.n, (long long)first,
        first >= 0 ? graphs.weights[first] : 0.0, first >= 0 ? eager.weights[first] : 0.0);
    ck_assert_float_eq(graphs.last_loss, eager.last_loss);
    free(eager.weights);
    free(graphs.weights);
}

/* Adam's learning rate changes every step (its bias correction), and 7,996 examples in
 * batches of 256 end each epoch with a batch of 60: a segment of its own. */
START_TEST(test_adam_across_a_partial_batch_is_bitwise_the_same_with_graphs) {
    run_cfg cfg = {.devices = "gpu:0", .batch = 256, .steps = 40};
    expect_graphs_change_nothing(cfg, 30);
}
END_TEST

START_TEST(test_adam_with_a_learning_rate_change_is_bitwise_the_same_with_graphs) {
    run_cfg cfg = {.devices = "gpu:0", .batch = 64, .steps = 30, .lr_change_at = 12};
    expect_graphs_change_nothing(cfg, 20);
}
END_TEST

/* SGD's learning rate is a kernel argument: after the change the step is a new segment. */
START_TEST(test_sgd_with_a_learning_rate_change_is_bitwise_the_same_with_graphs) {
    run_cfg cfg = {.devices = "gpu:0", .sgd = 1, .batch = 64, .steps = 30, .lr_change_at = 12};
    expect_graphs_change_nothing(cfg, 18);
}
END_TEST

/* The finite check of dynamic loss scaling reads the gradients on the host mid-step. */
START_TEST(test_fp16_with_dynamic_loss_scaling_is_bitwise_the_same_with_graphs) {
    run_cfg cfg = {.devices = "gpu:0", .fp16 = 1, .batch = 64, .steps = 30};
    expect_graphs_change_nothing(cfg, 20);
}
END_TEST

/* NCCL's all-reduce is queued outside the graphs, between two segments. */
START_TEST(test_two_gpus_over_nccl_are_bitwise_the_same_with_graphs) {
    if (dist_device_count(DIST_DEVICE_CUDA) < 2) {
        printf("  one GPU: the NCCL case is skipped\n");
        return;
    }
    run_cfg cfg = {.devices = "gpu:0,gpu:1", .batch = 128, .steps = 20};
    expect_graphs_change_nothing(cfg, 20);
}
END_TEST

static Suite *gpu_suite(void) {
    Suite *s = suite_create("cuda_graphs");
    TCase *tc = tcase_create("training");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_adam_across_a_partial_batch_is_bitwise_the_same_with_graphs);
    tcase_add_test(tc, test_adam_with_a_learning_rate_change_is_bitwise_the_same_with_graphs);
    tcase_add_test(tc, test_sgd_with_a_learning_rate_change_is_bitwise_the_same_with_graphs);
    tcase_add_test(tc, test_fp16_with_dynamic_loss_scaling_is_bitwise_the_same_with_graphs);
    tcase_add_test(tc, test_two_gpus_over_nccl_are_bitwise_the_same_with_graphs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    setenv("CK_FORK", "no", 1); /* a CUDA context cannot cross fork() */
    if (dist_test_run(host_suite()) != EXIT_SUCCESS) return EXIT_FAILURE;
    if (dist_device_count(DIST_DEVICE_CUDA) == 0) {
        return dist_test_skip_without_gpu(1, "test_cuda_graphs: no CUDA device is visible");
    }
    if (dist_mnist_load(NULL, &g_mnist) != DIST_OK) {
        fprintf(stderr, "MNIST: %s\n", dist_last_error());
        return EXIT_FAILURE;
    }
    int rc = dist_test_run(gpu_suite());
    dist_mnist_destroy(g_mnist);
    return rc;
}
