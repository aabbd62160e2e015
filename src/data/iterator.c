/* The public iterator: epochs, positions, sticky errors, save and restore (by replay). */
#include "core/error.h"
#include "data/dataset.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_FORMAT "libdist.iterator"
#define STATE_VERSION 1

struct dist_iterator {
    dist_dataset *ds;
    iter_ctx ctx;
    node_it *root;
    int64_t epoch;
    int64_t position;
    int ended;
    carried_error sticky; /* status != OK: every later call returns it */
};

static uint64_t fingerprint(const char *text) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        h = (h ^ *p) * 1099511628211ULL;
    return h;
}

static dist_status start_epoch(dist_iterator *it, int64_t epoch) {
    node_it_destroy(it->root);
    it->root = NULL;
    it->epoch = epoch;
    it->position = 0;
    it->ended = 0;
    it->sticky.status = DIST_OK;
    atomic_store(&it->ctx.skipped, 0);
    /* A reused iter_ctx is fine: nothing of the old tree is alive now. */
    dist_status st =
        node_it_create(it->ds, &it->ctx, data_mix64((uint64_t)epoch ^ 0x5eedULL), &it->root);
    if (st != DIST_OK) carried_error_capture(&it->sticky, st);
    return st;
}

dist_status dist_iterator_create(dist_dataset *ds, dist_iterator **out) {
    DIST_CHECK_ARG(ds && out, "dist_iterator_create: NULL argument");
    dist_iterator *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "dist_iterator_create: out of memory");
    it->ds = dist_dataset_retain(ds);
    atomic_init(&it->ctx.skipped, 0);
    it->ctx.top = ds;
    pthread_mutex_init(&it->ctx.tune_mu, NULL);
    dist_status st = start_epoch(it, 0);
    if (st != DIST_OK) {
        dist_iterator_destroy(it);
        return st;
    }
    *out = it;
    return DIST_OK;
}

void dist_iterator_destroy(dist_iterator *it) {
    if (!it) return;
    node_it_destroy(it->root);
    pthread_mutex_destroy(&it->ctx.tune_mu);
    dist_dataset_destroy(it->ds);
    free(it);
}

dist_status dist_iterator_next(dist_iterator *it, dist_element *out, int *end_of_sequence) {
    DIST_CHECK_ARG(it && out && end_of_sequence, "dist_iterator_next: NULL argument");
    out->count = 0;
    *end_of_sequence = 0;
    if (it->sticky.status != DIST_OK) return carried_error_raise(&it->sticky);
    if (it->ended) {
        *end_of_sequence = 1;
        return DIST_OK;
    }
    int eos = 0;
    dist_status st = node_it_next(it->root, out, &eos);
    if (st != DIST_OK) {
        carried_error_capture(&it->sticky, st);
        out->count = 0;
        return st;
    }
    if (eos) {
        it->ended = 1;
        out->count = 0;
        *end_of_sequence = 1;
        return DIST_OK;
    }
    it->position++;
    return DIST_OK;
}

dist_status dist_iterator_reset(dist_iterator *it) {
    DIST_CHECK_ARG(it != NULL, "dist_iterator_reset: NULL iterator");
    return start_epoch(it, it->epoch + 1);
}

dist_status dist_iterator_seek_epoch(dist_iterator *it, int64_t epoch) {
    DIST_CHECK_ARG(it != NULL && epoch >= 0, "dist_iterator_seek_epoch: bad argument");
    return start_epoch(it, epoch);
}

int64_t dist_iterator_epoch(const dist_iterator *it) { return it ? it->epoch : 0; }
int64_t dist_iterator_position(const dist_iterator *it) { return it ? it->position : 0; }
int64_t dist_iterator_skipped(const dist_iterator *it) {
    return it ? (int64_t)atomic_load(&((dist_iterator *)it)->ctx.skipped) : 0;
}

dist_status dist_iterator_autotune(const dist_iterator *it, dist_autotune_state *out) {
    DIST_CHECK_ARG(it && out, "dist_iterator_autotune: NULL argument");
    dist_autotune_state a = {0, 0, 0, 0};
    iter_ctx *ctx = (iter_ctx *)&it->ctx;
    pthread_mutex_lock(&ctx->tune_mu);
    for (int i = 0; i < ctx->tune_count; i++) {
        int v = ctx->tune[i].value;
        if (ctx->tune[i].node->kind == NODE_PREFETCH) {
            a.prefetch_stages++;
            if (v > a.prefetch_buffer) a.prefetch_buffer = v;
        } else {
            a.map_stages++;
            if (v > a.map_parallel) a.map_parallel = v;
        }
    }
    pthread_mutex_unlock(&ctx->tune_mu);
    *out = a;
    return DIST_OK;
}

dist_status dist_iterator_save(const dist_iterator *it, void **bytes, size_t *n) {
    DIST_CHECK_ARG(it && bytes && n, "dist_iterator_save: NULL argument");
    cJSON *root = cJSON_CreateObject();
    if (!root) return dist_error(DIST_OUT_OF_MEMORY, "dist_iterator_save: out of memory");
    char fp[32];
    snprintf(fp, sizeof fp, "%016" PRIx64, fingerprint(it->ds->desc));
    cJSON_AddStringToObject(root, "format", STATE_FORMAT);
    cJSON_AddNumberToObject(root, "version", STATE_VERSION);
    cJSON_AddStringToObject(root, "pipeline", it->ds->desc);
    cJSON_AddStringToObject(root, "fingerprint", fp);
    cJSON_AddNumberToObject(root, "epoch", (double)it->epoch);
    cJSON_AddNumberToObject(root, "position", (double)it->position);
    cJSON_AddBoolToObject(root, "ended", it->ended);
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return dist_error(DIST_OUT_OF_MEMORY, "dist_iterator_save: out of memory");
    *bytes = text;
    *n = strlen(text);
    return DIST_OK;
}

void dist_iterator_state_free(void *bytes) { cJSON_free(bytes); }

/* Names the first stage (outermost first) where two descriptions differ. */
static dist_status mismatch_error(const char *saved, const char *mine) {
    int stage = 0;
    const char *a = saved, *b = mine;
    for (;;) {
        const char *ea = strstr(a, " <- "), *eb = strstr(b, " <- ");
        size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
        if (la != lb || memcmp(a, b, la) != 0 || !ea || !eb) {
            return dist_error(
                DIST_INVALID_ARGUMENT,
                "iterator state belongs to another pipeline: stage %d is '%.*s' in the "
                "state but '%.*s' in this iterator",
                stage, (int)(la > 200 ? 200 : la), a, (int)(lb > 200 ? 200 : lb), b);
        }
        a = ea + 4;
        b = eb + 4;
        stage++;
    }
}

dist_status dist_iterator_restore(dist_iterator *it, const void *bytes, size_t n) {
    DIST_CHECK_ARG(it && bytes, "dist_iterator_restore: NULL argument");
    cJSON *root = cJSON_ParseWithLength((const char *)bytes, n);
    if (!root) return dist_error(DIST_FORMAT, "iterator state: not JSON");
    dist_status st = DIST_OK;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *pipe = cJSON_GetObjectItemCaseSensitive(root, "pipeline");
    const cJSON *ep = cJSON_GetObjectItemCaseSensitive(root, "epoch");
    const cJSON *pos = cJSON_GetObjectItemCaseSensitive(root, "position");
    const cJSON *ended = cJSON_GetObjectItemCaseSensitive(root, "ended");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, STATE_FORMAT) != 0 ||
        !cJSON_IsNumber(ver) || !cJSON_IsString(pipe) || !cJSON_IsNumber(ep) ||
        !cJSON_IsNumber(pos) || ep->valuedouble < 0 || pos->valuedouble < 0) {
        st = dist_error(DIST_FORMAT,
                        "iterator state: not a %s state (format, version, pipeline, epoch, "
                        "position)",
                        STATE_FORMAT);
        goto done;
    }
    if (ver->valueint != STATE_VERSION) {
        st = dist_error(DIST_FORMAT, "iterator state: version %d, this libdist reads %d",
                        ver->valueint, STATE_VERSION);
        goto done;
    }
    if (strcmp(pipe->valuestring, it->ds->desc) != 0) {
        st = mismatch_error(pipe->valuestring, it->ds->desc);
        goto done;
    }
    int64_t target = (int64_t)pos->valuedouble;
    DIST_TRY_GOTO(start_epoch(it, (int64_t)ep->valuedouble), st, done);
    while (it->position < target) {
        dist_element el;
        int eos = 0;
        DIST_TRY_GOTO(dist_iterator_next(it, &el, &eos), st, done);
        if (eos) {
            st = dist_error(DIST_FORMAT,
                            "iterator state: position %lld is past the end of epoch %lld "
                            "(%lld elements)",
                            (long long)target, (long long)it->epoch, (long long)it->position);
            goto done;
        }
    }
    if (cJSON_IsTrue(ended)) it->ended = 1;
done:
    cJSON_Delete(root);
    return st;
}
