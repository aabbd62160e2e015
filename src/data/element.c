/* Element slots (reusable element copies) and errors carried across threads. */
#include "core/error.h"
#include "data/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dist_status slot_reserve(elem_slot *slot, int i, size_t bytes) {
    if (bytes <= slot->cap[i] && slot->t[i].data) return DIST_OK;
    void *p = realloc(slot->t[i].data, bytes ? bytes : 1);
    if (!p)
        return dist_error(DIST_OUT_OF_MEMORY, "dataset: cannot allocate %zu bytes for an element",
                          bytes);
    slot->t[i].data = p;
    slot->cap[i] = bytes;
    return DIST_OK;
}

dist_status slot_copy(elem_slot *slot, const dist_element *src) {
    for (int i = 0; i < src->count; i++) {
        const dist_tensor *s = src->items[i];
        size_t bytes = dist_tensor_bytes(s);
        DIST_TRY(slot_reserve(slot, i, bytes));
        void *data = slot->t[i].data;
        slot->t[i] = dist_tensor_view(data, s->dtype, s->ndim, s->shape);
        if (bytes) memcpy(data, s->data, bytes);
    }
    slot->count = src->count;
    return DIST_OK;
}

void slot_view(elem_slot *slot, dist_element *out) {
    out->count = slot->count;
    for (int i = 0; i < slot->count; i++) out->items[i] = &slot->t[i];
}

void slot_free(elem_slot *slot) {
    for (int i = 0; i < DIST_ELEMENT_MAX; i++) free(slot->t[i].data);
    memset(slot, 0, sizeof *slot);
}

dist_status slot_alloc_spec(elem_slot *slot, const dist_element_spec *spec) {
    for (int i = 0; i < spec->count; i++) {
        dist_tensor shape_only =
            dist_tensor_view(NULL, spec->dtype[i], spec->ndim[i], spec->shape[i]);
        size_t bytes = dist_tensor_bytes(&shape_only);
        DIST_TRY(slot_reserve(slot, i, bytes));
        void *data = slot->t[i].data;
        memset(data, 0, bytes);
        slot->t[i] = shape_only;
        slot->t[i].data = data;
    }
    slot->count = spec->count;
    return DIST_OK;
}

void carried_error_capture(carried_error *e, dist_status st) {
    e->status = st;
    snprintf(e->message, sizeof e->message, "%s", dist_last_error());
}

dist_status carried_error_raise(const carried_error *e) {
    return dist_error(e->status, "%s", e->message);
}
