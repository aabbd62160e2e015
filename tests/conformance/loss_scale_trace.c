/* Prints libdist's loss-scale trace for one sequence of steps, for loss_scale_run.py.
 *
 * Usage: loss_scale_trace RULE DYNAMIC INITIAL GROWTH STEPS
 *   RULE tf_keras | keras3; DYNAMIC 0 | 1; INITIAL and GROWTH a number or "default";
 *   STEPS runs such as "F1999 I1 N2": F finite gradients, I one Inf, N one NaN.
 * Prints one line per step: "<scale> <counter> <applied>". Exit 2 on a libdist error. */
#include "dist/loss_scale.h"
#include "dist/nn.h"
#include "dist/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) != DIST_OK) {                                                                   \
            fprintf(stderr, "ERROR: %s: %s\n", #call, dist_last_error());                         \
            return 2;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s RULE DYNAMIC INITIAL GROWTH STEPS\n", argv[0]);
        return 1;
    }
    dist_loss_scale_options o = DIST_LOSS_SCALE_OPTIONS_INIT;
    o.rule = strcmp(argv[1], "keras3") == 0 ? DIST_LOSS_SCALE_RULE_KERAS3
                                            : DIST_LOSS_SCALE_RULE_TF_KERAS;
    o.dynamic = atoi(argv[2]);
    if (strcmp(argv[3], "default") != 0) o.initial_scale = strtof(argv[3], NULL);
    if (strcmp(argv[4], "default") != 0) o.dynamic_growth_steps = strtoll(argv[4], NULL, 10);

    dist_model *m;
    CHECK(dist_model_create(NULL, &m));
    CHECK(dist_model_add_dense(m, 1, DIST_ACT_NONE));
    int64_t shape[1] = {2};
    CHECK(dist_model_build(m, 1, shape, 1));
    dist_tape *tape;
    CHECK(dist_tape_create(dist_model_backend(m, 0), &tape));
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    dist_optimizer *sgd;
    CHECK(dist_optimizer_create_sgd(&so, &sgd));
    dist_loss_scale_optimizer *lso;
    CHECK(dist_loss_scale_optimizer_create(sgd, &o, &lso));

    char *steps = strdup(argv[5]);
    for (char *run = strtok(steps, " "); run; run = strtok(NULL, " ")) {
        long n = strtol(run + 1, NULL, 10);
        float g[3] = {1.0f, 1.0f, 1.0f};
        if (run[0] == 'I') g[0] = INFINITY;
        if (run[0] == 'N') g[0] = NAN;
        for (long i = 0; i < n; i++) {
            CHECK(dist_backend_from_host(dist_model_backend(m, 0), g, sizeof g,
                                         dist_model_grads(m, 0)));
            int applied;
            CHECK(dist_loss_scale_apply_gradients(lso, m, tape, &applied));
            printf("%.17g %lld %d\n", (double)dist_loss_scale_loss_scale(lso),
                   (long long)dist_loss_scale_dynamic_counter(lso), applied);
        }
    }
    free(steps);
    dist_loss_scale_optimizer_destroy(lso);
    dist_optimizer_destroy(sgd);
    dist_tape_destroy(tape);
    dist_model_destroy(m);
    return 0;
}
