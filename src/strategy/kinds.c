/* The registry of strategy kinds: the one list of them. A kind is its file, which defines its
 * vtable, constructor and descriptor (dist_strategy_kind_<name>: name, constructor, default
 * deadline, default devices), plus its line in DIST_STRATEGY_KINDS below. dist_strategy_create,
 * the name parsing and distrain's --strategy read the kinds from here only. */
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <stdio.h>
#include <string.h>

/* In the public enum's order, one line each (a new kind adds its line above the last). */
#define DIST_STRATEGY_KINDS(X)                                                                     \
    X(one_device)                                                                                  \
    X(mirrored)                                                                                    \
    X(multi_worker)                                                                                \
    X(parameter_server)                                                                            \
    X(tpu)                                                                                         \
    X(central_storage)                                                                             \
    /* the end of the list */

#define DIST_KIND_DECLARE(k) extern const dist_strategy_kind_desc dist_strategy_kind_##k;
#define DIST_KIND_ENTRY(k) &dist_strategy_kind_##k,
DIST_STRATEGY_KINDS(DIST_KIND_DECLARE)
static const dist_strategy_kind_desc *const kinds[] = {DIST_STRATEGY_KINDS(DIST_KIND_ENTRY)};
#define DIST_KIND_COUNT ((int)(sizeof kinds / sizeof kinds[0]))

const dist_strategy_kind_desc *dist_strategy_kind_find(dist_strategy_kind kind) {
    for (int i = 0; i < DIST_KIND_COUNT; i++)
        if (kinds[i]->kind == kind) return kinds[i];
    return NULL;
}

void dist_strategy_kind_list(char *buf, size_t size, const char *sep) {
    if (size == 0) return;
    buf[0] = '\0';
    size_t used = 0;
    for (int i = 0; i < DIST_KIND_COUNT && used < size; i++) {
        int n = snprintf(buf + used, size - used, "%s%s", i ? sep : "", kinds[i]->name);
        if (n < 0) break;
        used += (size_t)n;
    }
}

int dist_strategy_kind_count(void) { return DIST_KIND_COUNT; }

const char *dist_strategy_kind_name(dist_strategy_kind kind) {
    const dist_strategy_kind_desc *d = dist_strategy_kind_find(kind);
    return d ? d->name : NULL;
}

dist_status dist_strategy_kind_parse(const char *text, dist_strategy_kind *out) {
    DIST_CHECK_ARG(text && out, "dist_strategy_kind_parse: NULL argument");
    for (int i = 0; i < DIST_KIND_COUNT; i++)
        if (strcmp(text, kinds[i]->name) == 0) {
            *out = kinds[i]->kind;
            return DIST_OK;
        }
    char names[256];
    dist_strategy_kind_list(names, sizeof names, ", ");
    return dist_error(DIST_INVALID_ARGUMENT, "unknown strategy '%s' (the strategies: %s)", text,
                      names);
}
