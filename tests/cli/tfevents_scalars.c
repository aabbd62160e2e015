/* Test tool: prints the scalar summaries of TensorBoard event files, one "TAG STEP VALUE" line
 * each (VALUE as %.9g, the float32 exactly), in file order. The records are read by libdist's
 * TFRecord reader, which checks both masked CRC-32Cs of every record (a damaged file fails);
 * the tensorflow.Event protocol buffers are decoded here: Event.step (field 2, varint),
 * Event.file_version (3), Event.summary (5) -> Summary.value (1) -> Value.tag (1) and
 * Value.simple_value (2, fixed32). The first record must be file_version "brain.Event:2".
 * usage: tfevents_scalars 'DIR/events.out.tfevents.*'   (a glob(3) pattern)
 * Exit 0, or 1 with a message on a file that is not a whole event file. */
#include <dist/data.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct pb {
    const unsigned char *p, *end;
} pb;

static int varint(pb *b, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64 && b->p < b->end; shift += 7) {
        unsigned char c = *b->p++;
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return 1;
    }
    return 0;
}

/* The next field: its number and wire type; for length-delimited fields *sub holds its bytes,
 * for fixed ones *v the bits. Returns 0 at the end, -1 on malformed input. */
static int field(pb *b, unsigned *num, unsigned *wire, uint64_t *v, pb *sub) {
    uint64_t key, n;
    if (b->p >= b->end) return 0;
    if (!varint(b, &key)) return -1;
    *num = (unsigned)(key >> 3);
    *wire = (unsigned)(key & 7);
    switch (*wire) {
    case 0: return varint(b, v) ? 1 : -1;
    case 1:
    case 5: {
        size_t k = *wire == 1 ? 8 : 4;
        if ((size_t)(b->end - b->p) < k) return -1;
        *v = 0;
        for (size_t i = 0; i < k; i++) *v |= (uint64_t)b->p[i] << (8 * i);
        b->p += k;
        return 1;
    }
    case 2:
        if (!varint(b, &n) || n > (uint64_t)(b->end - b->p)) return -1;
        sub->p = b->p;
        sub->end = b->p + n;
        b->p += n;
        return 1;
    default: return -1;
    }
}

/* Prints the scalars of one Summary.Value. */
static int value(pb v, int64_t step) {
    unsigned num, wire;
    uint64_t x = 0;
    pb sub = {0}, tag = {0};
    int r, have_value = 0;
    float f = 0;
    while ((r = field(&v, &num, &wire, &x, &sub)) > 0) {
        if (num == 1 && wire == 2) tag = sub;
        if (num == 2 && wire == 5) {
            uint32_t bits = (uint32_t)x;
            memcpy(&f, &bits, sizeof f);
            have_value = 1;
        }
    }
    if (r < 0) return -1;
    if (have_value)
        printf("%.*s %lld %.9g\n", (int)(tag.end - tag.p), (const char *)tag.p, (long long)step,
               (double)f);
    return 0;
}

/* Decodes one Event; *version is set when it carries file_version. */
static int event(pb e, int *version) {
    unsigned num, wire;
    uint64_t x = 0;
    pb sub = {0}, summary = {0};
    int64_t step = 0;
    int r, have_summary = 0;
    while ((r = field(&e, &num, &wire, &x, &sub)) > 0) {
        if (num == 2 && wire == 0) step = (int64_t)x;
        if (num == 3 && wire == 2)
            *version = (size_t)(sub.end - sub.p) == 13 && memcmp(sub.p, "brain.Event:2", 13) == 0;
        if (num == 5 && wire == 2) {
            summary = sub;
            have_summary = 1;
        }
    }
    if (r < 0) return -1;
    while (have_summary && (r = field(&summary, &num, &wire, &x, &sub)) > 0)
        if (num == 1 && wire == 2 && value(sub, step) < 0) return -1;
    return have_summary && r < 0 ? -1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: tfevents_scalars 'DIR/events.out.tfevents.*'\n");
        return 2;
    }
    char **paths = NULL;
    int count = 0;
    if (dist_glob(argv[1], &paths, &count) != DIST_OK) {
        fprintf(stderr, "tfevents_scalars: %s\n", dist_last_error());
        return 1;
    }
    int rc = 0;
    for (int i = 0; i < count && !rc; i++) {
        dist_dataset *ds = NULL;
        dist_iterator *it = NULL;
        const char *file = paths[i];
        dist_status st = dist_dataset_from_tfrecord(&file, 1, NULL, &ds);
        if (!st) st = dist_iterator_create(ds, &it);
        int version = -1;
        for (int end = 0, n = 0; !st && !end; n++) {
            dist_element el;
            st = dist_iterator_next(it, &el, &end);
            if (st || end) break;
            pb e = {el.items[0]->data,
                    (const unsigned char *)el.items[0]->data + el.items[0]->shape[0]};
            int v = 0;
            if (event(e, &v) < 0) {
                fprintf(stderr, "tfevents_scalars: %s: record %d is not an Event\n", file, n);
                rc = 1;
                break;
            }
            if (n == 0) version = v;
        }
        if (st) {
            fprintf(stderr, "tfevents_scalars: %s\n", dist_last_error());
            rc = 1;
        } else if (!rc && version != 1) {
            fprintf(stderr,
                    "tfevents_scalars: %s: the first record is not file_version "
                    "brain.Event:2\n",
                    file);
            rc = 1;
        }
        dist_iterator_destroy(it);
        dist_dataset_destroy(ds);
    }
    dist_glob_free(paths, count);
    return rc;
}
