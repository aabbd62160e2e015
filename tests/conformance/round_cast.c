/* Rounds float32 values to float16 / bfloat16 precision with libdist's dist_op_cast on a CPU
 * tape, for round_conformance.py.
 *
 * Usage: round_cast float16|bfloat16 IN OUT
 *   IN: raw little-endian float32 values; OUT: the rounded values, raw float32 likewise.
 * Exit 2 on a libdist error, 1 on a usage or file error. */
#include <dist/dist.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what) {
    fprintf(stderr, "round_cast: %s: %s\n", what, dist_last_error());
    return 2;
}

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[1], "float16") && strcmp(argv[1], "bfloat16"))) {
        fprintf(stderr, "usage: %s float16|bfloat16 IN OUT\n", argv[0]);
        return 1;
    }
    dist_dtype to = strcmp(argv[1], "float16") == 0 ? DIST_F16 : DIST_BF16;
    FILE *f = fopen(argv[2], "rb");
    if (!f) return perror(argv[2]), 1;
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    rewind(f);
    int64_t n = bytes / 4;
    float *x = malloc((size_t)n * 4 + 4);
    if (!x || fread(x, 4, (size_t)n, f) != (size_t)n) return fprintf(stderr, "short read\n"), 1;
    fclose(f);
    dist_backend_options bo = DIST_BACKEND_OPTIONS_INIT;
    dist_backend *be;
    if (dist_backend_create(&bo, &be)) return fail("backend");
    dist_tape *t;
    if (dist_tape_create(be, &t)) return fail("tape");
    int64_t shape[1] = {n};
    dist_tensor hx = dist_tensor_view(x, DIST_F32, 1, shape), *dx, *y;
    if (dist_tape_upload(t, &hx, &dx)) return fail("upload");
    if (dist_op_cast(t, dx, DIST_F32, to, &y)) return fail("cast");
    if (dist_tape_download(t, y, x, (size_t)n * 4)) return fail("download");
    f = fopen(argv[3], "wb");
    if (!f || fwrite(x, 4, (size_t)n, f) != (size_t)n || fclose(f)) return perror(argv[3]), 1;
    dist_tape_destroy(t);
    dist_backend_destroy(be);
    free(x);
    return 0;
}
