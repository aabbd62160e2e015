/* The op profile (dist/tape.h): one table of per-op forward and backward times, fed by every
 * tape whose step runs while it is started (tape.c times the ops; see tape_impl.h). */
#include "autodiff/tape_impl.h"
#include "backend/ops.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROFILE_OPS 128

int dist__op_profile_on;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static dist_op_profile_entry table[PROFILE_OPS];
static int nops;

double tape_profile_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "conv2d_backward" -> "conv2d"; a unary or binary op's node by its function ("gelu", "add"),
 * its forward before the node exists by the family ("unary") */
static void op_key(const tape_node *n, const char *name, char *key, size_t size) {
    if (n && strcmp(name, "unary_backward") == 0) {
        snprintf(key, size, "%s",
                 dist_op_name(&(dist_op){.code = DIST_OPC_UNARY, .k = n->p.m.kind}));
        return;
    }
    if (n && strcmp(name, "binary_backward") == 0) {
        snprintf(key, size, "%s",
                 dist_op_name(&(dist_op){.code = DIST_OPC_BINARY, .k = n->p.m.kind}));
        return;
    }
    size_t len = strlen(name);
    const char *suffix = "_backward";
    size_t sl = strlen(suffix);
    if (len > sl && strcmp(name + len - sl, suffix) == 0) len -= sl;
    if (len >= size) len = size - 1;
    memcpy(key, name, len);
    key[len] = '\0';
}

void tape_profile_add(const tape_node *n, const char *name, int backward, double seconds) {
    char key[sizeof table[0].op];
    op_key(n, name ? name : "op", key, sizeof key);
    pthread_mutex_lock(&mu);
    int i = 0;
    while (i < nops && strcmp(table[i].op, key) != 0) i++;
    if (i == nops && nops < PROFILE_OPS) {
        memset(&table[i], 0, sizeof table[i]);
        memcpy(table[i].op, key, sizeof key);
        nops++;
    }
    if (i < nops) {
        if (backward) {
            table[i].backward_calls++;
            table[i].backward_s += seconds;
        } else {
            table[i].forward_calls++;
            table[i].forward_s += seconds;
        }
    }
    pthread_mutex_unlock(&mu);
}

void dist_op_profile_start(void) {
    pthread_mutex_lock(&mu);
    nops = 0;
    pthread_mutex_unlock(&mu);
    __atomic_store_n(&dist__op_profile_on, 1, __ATOMIC_RELAXED);
}

void dist_op_profile_stop(void) { __atomic_store_n(&dist__op_profile_on, 0, __ATOMIC_RELAXED); }

static int by_total(const void *a, const void *b) {
    const dist_op_profile_entry *x = a, *y = b;
    double tx = x->forward_s + x->backward_s, ty = y->forward_s + y->backward_s;
    return tx < ty ? 1 : tx > ty ? -1 : strcmp(x->op, y->op);
}

int dist_op_profile_read(dist_op_profile_entry *out, int max) {
    pthread_mutex_lock(&mu);
    dist_op_profile_entry sorted[PROFILE_OPS];
    int n = nops;
    memcpy(sorted, table, sizeof(dist_op_profile_entry) * (size_t)n);
    pthread_mutex_unlock(&mu);
    qsort(sorted, (size_t)n, sizeof *sorted, by_total);
    for (int i = 0; out && i < n && i < max; i++) out[i] = sorted[i];
    return n;
}
