#include "core/scope.h"

#include "core/error.h"

#define SCOPE_DEPTH 8

static _Thread_local const dist_placement *tls_stack[SCOPE_DEPTH];
static _Thread_local int tls_depth;

const dist_placement *dist_scope_current(void) {
    return tls_depth ? tls_stack[tls_depth - 1] : NULL;
}

dist_status dist_scope_push(const dist_placement *p) {
    if (tls_depth == SCOPE_DEPTH)
        return dist_error(DIST_INVALID_USAGE, "strategy scopes nested deeper than %d", SCOPE_DEPTH);
    tls_stack[tls_depth++] = p;
    return DIST_OK;
}

dist_status dist_scope_pop(const dist_placement *p) {
    if (tls_depth == 0 || tls_stack[tls_depth - 1] != p)
        return dist_error(DIST_INVALID_USAGE,
                          "scope exit does not match the innermost scope entered on this thread");
    tls_depth--;
    return DIST_OK;
}
