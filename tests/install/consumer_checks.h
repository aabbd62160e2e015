/* The checks shared by consumer.c and consumer.cpp: a program built against an installed libdist
 * calls a few functions of its public API and compares the results. Written in the common subset
 * of C11 and C++17. Returns the number of failed checks. */
#ifndef DIST_CONSUMER_CHECKS_H
#define DIST_CONSUMER_CHECKS_H

#include <stdio.h>
#include <string.h>

#define CONSUMER_EXPECT(cond)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__,      \
                    #cond, dist_last_error());                                                     \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static int consumer_run_checks(void) {
    int failures = 0;

    CONSUMER_EXPECT(strcmp(dist_status_name(DIST_OK), "DIST_OK") == 0);
    CONSUMER_EXPECT(strcmp(dist_status_name(DIST_TIMEOUT), "DIST_TIMEOUT") == 0);

    dist_device dev;
    CONSUMER_EXPECT(dist_device_parse("gpu:1", &dev) == DIST_OK);
    CONSUMER_EXPECT(dev.kind == DIST_DEVICE_CUDA && dev.index == 1);
    CONSUMER_EXPECT(dist_device_parse("tpu:0", &dev) == DIST_INVALID_ARGUMENT);
    CONSUMER_EXPECT(dist_last_error()[0] != '\0');
    dist_clear_error();

    const int64_t shape[4] = {2, 28, 28, 1};
    dist_tensor *t = NULL;
    CONSUMER_EXPECT(dist_tensor_create(DIST_F32, 4, shape, &t) == DIST_OK);
    if (t) {
        CONSUMER_EXPECT(dist_tensor_numel(t) == 2 * 28 * 28);
        CONSUMER_EXPECT(dist_tensor_bytes(t) == 2 * 28 * 28 * sizeof(float));
        CONSUMER_EXPECT(((const float *)t->data)[2 * 28 * 28 - 1] == 0.0f);
        char buf[64];
        CONSUMER_EXPECT(strcmp(dist_shape_str(t, buf, sizeof buf), "(2, 28, 28, 1)") == 0);
    }
    dist_tensor_destroy(t);
    dist_tensor_destroy(NULL);

    dist_backend_options opts = DIST_BACKEND_OPTIONS_INIT;
    CONSUMER_EXPECT(dist_device_parse("cpu:0", &opts.device) == DIST_OK);
    opts.threads = 1;
    dist_backend *backend = NULL;
    CONSUMER_EXPECT(dist_backend_create(&opts, &backend) == DIST_OK);
    if (backend) {
        CONSUMER_EXPECT(dist_backend_device(backend).kind == DIST_DEVICE_CPU);
        CONSUMER_EXPECT(strcmp(dist_backend_name(backend), "cpu/onednn") == 0);
        const int64_t vshape[1] = {3};
        dist_tensor *v = NULL;
        CONSUMER_EXPECT(dist_backend_alloc_tensor(backend, DIST_F32, 1, vshape, &v) == DIST_OK);
        if (v) {
            const float in[3] = {1.0f, -2.0f, 3.5f};
            float out[3] = {0.0f, 0.0f, 0.0f};
            CONSUMER_EXPECT(dist_backend_from_host(backend, in, sizeof in, v) == DIST_OK);
            CONSUMER_EXPECT(dist_backend_to_host(backend, v, out, sizeof out) == DIST_OK);
            CONSUMER_EXPECT(memcmp(in, out, sizeof in) == 0);
            dist_backend_free_tensor(backend, v);
        }
    }
    dist_backend_destroy(backend);
    dist_backend_destroy(NULL);

    return failures;
}

#endif
