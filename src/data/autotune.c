/* AUTOTUNE bookkeeping: what each tuned stage of an iterator chose, kept across its passes. */
#include "core/error.h"
#include "data/dataset.h"

#include <time.h>
#include <unistd.h>

int data_autotune_start(iter_ctx *ctx, const dist_dataset *node, int first) {
    int value = first;
    pthread_mutex_lock(&ctx->tune_mu);
    for (int i = 0; i < ctx->tune_count; i++)
        if (ctx->tune[i].node == node) value = ctx->tune[i].value;
    pthread_mutex_unlock(&ctx->tune_mu);
    return value;
}

void data_autotune_record(iter_ctx *ctx, const dist_dataset *node, int value) {
    pthread_mutex_lock(&ctx->tune_mu);
    int i = 0;
    while (i < ctx->tune_count && ctx->tune[i].node != node) i++;
    if (i == ctx->tune_count && i < AUTOTUNE_SLOTS) ctx->tune[ctx->tune_count++].node = node;
    if (i < AUTOTUNE_SLOTS) ctx->tune[i].value = value;
    pthread_mutex_unlock(&ctx->tune_mu);
}

int data_autotune_map_max(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) n = 1;
    return n > DIST_AUTOTUNE_MAP_MAX ? DIST_AUTOTUNE_MAP_MAX : (int)n;
}

demand_slot *data_autotune_demand(iter_ctx *ctx, const dist_dataset *node) {
    demand_slot *d = NULL;
    pthread_mutex_lock(&ctx->tune_mu);
    for (int i = 0; i < ctx->demand_count && !d; i++)
        if (ctx->demand[i].node == node) d = &ctx->demand[i];
    if (!d && ctx->demand_count < AUTOTUNE_SLOTS) {
        d = &ctx->demand[ctx->demand_count++];
        d->node = node;
        atomic_init(&d->asks, 0);
        atomic_init(&d->wait_ns, 0);
    }
    pthread_mutex_unlock(&ctx->tune_mu);
    return d;
}

const dist_dataset *data_autotune_prefetch_above(const iter_ctx *ctx, const dist_dataset *node) {
    const dist_dataset *nearest = NULL;
    for (const dist_dataset *d = ctx->top; d && d != node; d = d->input)
        if (d->kind == NODE_PREFETCH) nearest = d;
    return nearest;
}

int64_t data_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
