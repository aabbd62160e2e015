/* distrain predict: builds the model (the seed CNN or Keras JSON), loads weights, reads images
 * (an IDX file, a JPEG file or a folder of JPEGs), runs dist_predict under the strategy and
 * prints {"index":i,"class":c,"probabilities":[...]} per example, in input order ("file" too
 * for JPEGs). Only the chief prints. */
#include "predict.h"

#include "options.h"
#include "weights_file.h"

#include <dirent.h>
#include <dist/data.h>
#include <dist/fit.h>
#include <dist/idx.h>
#include <dist/nn.h>
#include <dist/strategy.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

typedef struct file_list {
    char **paths;
    int count, cap;
    size_t root_len; /* the folder's path length: "file" is the path below it */
} file_list;

static void file_list_free(file_list *l) {
    for (int i = 0; i < l->count; i++) free(l->paths[i]);
    free(l->paths);
}

static int fail(const char *what) {
    fprintf(stderr, "distrain predict: %s: %s\n", what, dist_last_error());
    return 1;
}

static int is_jpeg_name(const char *name) {
    const char *dot = strrchr(name, '.');
    return dot && (strcasecmp(dot, ".jpg") == 0 || strcasecmp(dot, ".jpeg") == 0);
}

static int file_list_push(file_list *l, const char *path) {
    if (l->count == l->cap) {
        int cap = l->cap ? 2 * l->cap : 256;
        char **p = realloc(l->paths, (size_t)cap * sizeof *p);
        if (!p) return -1;
        l->paths = p;
        l->cap = cap;
    }
    if (!(l->paths[l->count] = strdup(path))) return -1;
    l->count++;
    return 0;
}

/* Adds every .jpg/.jpeg under dir, subfolders included (hidden names and symbolic links
 * skipped); -1 with errno set when a folder cannot be read. */
static int collect(const char *dir, int depth, file_list *out) {
    if (depth > 32) {
        errno = ELOOP;
        return -1;
    }
    DIR *d = opendir(dir);
    if (!d) return -1;
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        struct stat sb;
        if (lstat(path, &sb) != 0) continue;
        if (S_ISDIR(sb.st_mode))
            rc = collect(path, depth + 1, out);
        else if (S_ISREG(sb.st_mode) && is_jpeg_name(e->d_name))
            rc = file_list_push(out, path);
    }
    int saved = errno;
    closedir(d);
    errno = saved;
    return rc;
}

static int cmp_path(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every .jpg/.jpeg under dir (hidden names skipped), sorted byte-wise by path. */
static int list_jpegs(const char *dir, file_list *out) {
    memset(out, 0, sizeof *out);
    out->root_len = strlen(dir);
    while (out->root_len > 1 && dir[out->root_len - 1] == '/') out->root_len--;
    char root[4096];
    snprintf(root, sizeof root, "%.*s", (int)out->root_len, dir);
    if (collect(root, 0, out) != 0) {
        fprintf(stderr, "distrain predict: --input: cannot read the folder '%s': %s\n", dir,
                strerror(errno));
        return 1;
    }
    if (out->count == 0) {
        fprintf(stderr, "distrain predict: --input: no .jpg/.jpeg files under '%s'\n", dir);
        return 1;
    }
    qsort(out->paths, (size_t)out->count, sizeof *out->paths, cmp_path);
    return 0;
}

/* What a file's first bytes say it holds: the formats predict reads, and others a user may hand
 * it by mistake (by name they all look alike: a PNG renamed .jpg). */
typedef enum input_kind {
    INPUT_EMPTY,
    INPUT_JPEG, /* FF D8 FF */
    INPUT_IDX,  /* 00 00 <type 08..0E> <ndim>, or gzip (1F 8B), which dist_idx_read unpacks */
    INPUT_OTHER /* something else: `name` says what when it is known */
} input_kind;

static input_kind sniff_input(const char *path, const char **name) {
    static const struct {
        const char *name;
        unsigned char magic[8];
        size_t len;
    } known[] = {
        {"PNG", {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'}, 8},
        {"GIF", {'G', 'I', 'F', '8'}, 4},
        {"HDF5", {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'}, 8},
        {"PDF", {'%', 'P', 'D', 'F'}, 4},
        {"zip", {'P', 'K', 3, 4}, 4},
    };
    unsigned char h[8];
    size_t n = 0;
    FILE *f = fopen(path, "rb");
    if (f) {
        n = fread(h, 1, sizeof h, f);
        fclose(f);
    }
    *name = NULL;
    if (n == 0) return INPUT_EMPTY;
    if (n >= 3 && h[0] == 0xFF && h[1] == 0xD8 && h[2] == 0xFF) return INPUT_JPEG;
    if ((n >= 4 && h[0] == 0 && h[1] == 0 && h[2] >= 0x08 && h[2] <= 0x0E) ||
        (n >= 2 && h[0] == 0x1F && h[1] == 0x8B))
        return INPUT_IDX;
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (n >= known[i].len && memcmp(h, known[i].magic, known[i].len) == 0)
            *name = known[i].name;
    if (!*name && n >= 2 && h[0] == 'B' && h[1] == 'M' && is_jpeg_name(path)) *name = "BMP";
    return INPUT_OTHER;
}

/* The input as a dataset of uint8 28x28 images: JPEGs (files listed in *files) or an IDX file
 * (*images holds its tensor, which the dataset borrows). */
static int open_input(const char *input, file_list *files, dist_tensor **images,
                      dist_dataset **out) {
    struct stat sb;
    if (stat(input, &sb) != 0) {
        fprintf(stderr, "distrain predict: --input: cannot open '%s': %s\n", input,
                strerror(errno));
        return 1;
    }
    memset(files, 0, sizeof *files);
    const char *format = NULL;
    input_kind kind = S_ISDIR(sb.st_mode) ? INPUT_JPEG : sniff_input(input, &format);
    if (kind == INPUT_EMPTY || format || (kind == INPUT_OTHER && is_jpeg_name(input))) {
        /* told by its bytes, not its name; an unknown one not named .jpg is left to the IDX
         * reader, whose message says what an IDX file starts with */
        if (kind == INPUT_EMPTY)
            fprintf(stderr, "distrain predict: --input: '%s' is empty (0 bytes)", input);
        else if (format)
            fprintf(stderr, "distrain predict: --input: '%s' holds %s data", input, format);
        else
            fprintf(stderr,
                    "distrain predict: --input: '%s' is not a JPEG (it does not start with "
                    "FF D8 FF)",
                    input);
        fprintf(stderr, "; distrain predict reads JPEG and IDX files\n");
        return 1;
    }
    if (kind == INPUT_JPEG) {
        if (S_ISDIR(sb.st_mode)) {
            if (list_jpegs(input, files)) return 1;
        } else {
            files->paths = malloc(sizeof *files->paths);
            if (!files->paths || !(files->paths[0] = strdup(input))) {
                fprintf(stderr, "distrain predict: out of memory\n");
                return 1;
            }
            files->count = files->cap = 1;
            const char *slash = strrchr(input, '/');
            files->root_len = slash ? (size_t)(slash - input) : (size_t)-1;
        }
        dist_jpeg_folder_options jo = DIST_JPEG_FOLDER_OPTIONS_INIT;
        jo.height = jo.width = 28;
        jo.num_threads = 2;
        if (dist_dataset_from_jpeg_files((const char *const *)files->paths, files->count, &jo, out))
            return fail("reading the JPEG files");
        return 0;
    }
    if (dist_idx_read(input, images)) return fail("reading the IDX file");
    const dist_tensor *t = *images;
    int ok = t->dtype == DIST_U8 && (t->ndim == 3 || (t->ndim == 4 && t->shape[3] == 1)) &&
             t->shape[1] == 28 && t->shape[2] == 28 && t->shape[0] > 0;
    if (!ok) {
        fprintf(stderr,
                "distrain predict: --input: '%s' is not an IDX file of 28x28 uint8 images (an "
                "images file such as t10k-images-idx3-ubyte)\n",
                input);
        return 1;
    }
    dist_tensor *parts[1] = {*images};
    if (dist_dataset_from_tensor_slices(parts, 1, 0, out)) return fail("reading the IDX file");
    return 0;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char chunk[65536];
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = 2 * (len + n + 1);
            char *g = realloc(buf, cap);
            if (!g) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = g;
        }
        memcpy(buf + len, chunk, n);
        len += n;
    }
    fclose(f);
    if (!buf) buf = calloc(1, 1);
    if (buf) buf[len] = '\0';
    return buf;
}

static void json_string(const char *text) {
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if (*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    }
    putchar('"');
}

static void print_rows(const dist_tensor *out, const file_list *files, int logits) {
    const float *p = out->data;
    int64_t cols = out->shape[1];
    for (int64_t i = 0; i < out->shape[0]; i++) {
        const float *row = p + i * cols;
        int64_t best = 0;
        for (int64_t c = 1; c < cols; c++)
            if (row[c] > row[best]) best = c;
        printf("{\"index\":%lld,", (long long)i);
        if (files->count) {
            const char *path = files->paths[i];
            size_t skip = files->root_len == (size_t)-1 ? 0 : files->root_len + 1;
            fputs("\"file\":", stdout);
            json_string(path + skip);
            putchar(',');
        }
        printf("\"class\":%lld,\"%s\":[", (long long)best, logits ? "logits" : "probabilities");
        /* JSON has no NaN or Infinity: a non-finite value (weights that overflowed) is null */
        for (int64_t c = 0; c < cols; c++) {
            if (isfinite(row[c]))
                printf("%s%.7g", c ? "," : "", (double)row[c]);
            else
                printf("%snull", c ? "," : "");
        }
        printf("]}\n");
    }
}

static int run(const distrain_predict_options *o, dist_strategy **s, dist_model **model,
               file_list *files, dist_tensor **images, dist_dataset **ds) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = o->strategy_kind; /* parsed with the flags */
    if (so.kind == DIST_STRATEGY_PARAMETER_SERVER) {
        fprintf(stderr, "distrain predict: --strategy parameter_server is not supported (use "
                        "one_device, mirrored or multi_worker)\n");
        return 2;
    }
    so.devices = o->devices;
    so.threads_per_replica = o->threads;
    dist_status st = dist_strategy_create(&so, s);
    if (st == DIST_INVALID_ARGUMENT || st == DIST_NOT_FOUND || st == DIST_UNSUPPORTED) {
        fprintf(stderr, "distrain predict: %s\n", dist_last_error());
        return 2;
    }
    if (st) return fail("creating the strategy");
    char *json = NULL;
    if (o->model_json && !(json = read_text(o->model_json))) {
        fprintf(stderr, "distrain predict: --model-json: cannot read '%s': %s\n", o->model_json,
                strerror(errno));
        return 1;
    }
    if (dist_strategy_scope_enter(*s)) {
        free(json);
        return fail("entering the strategy scope");
    }
    int64_t shape[3] = {28, 28, 1};
    if (json) {
        st = dist_model_from_keras_json(json, 0, model);
    } else {
        st = dist_model_create_mnist_cnn(model);
        if (!st) st = dist_model_build(*model, 3, shape, 0);
    }
    free(json);
    if (st) return fail(o->model_json ? "--model-json" : "building the model");
    if (dist_strategy_scope_exit(*s)) return fail("leaving the strategy scope");
    if (distrain_load_weights(*model, o->weights)) return fail("--weights");

    int rc = open_input(o->input, files, images, ds);
    if (rc) return rc;
    int64_t n = dist_dataset_cardinality(*ds);
    dist_dataset *next = NULL;
    if (dist_dataset_map_image_normalize(*ds, &next)) return fail("building the input pipeline");
    dist_dataset_destroy(*ds);
    *ds = next;
    if (dist_dataset_batch(*ds, n > 0 && n < o->batch_size ? n : o->batch_size, 0, &next))
        return fail("building the input pipeline");
    dist_dataset_destroy(*ds);
    *ds = next;
    dist_distributed_dataset *dds = NULL;
    if (dist_strategy_distribute_dataset(*s, *ds, &dds)) return fail("distributing the data");
    dist_tensor *out = NULL;
    st = dist_predict(*s, *model, dds, 0,
                      o->logits ? DIST_PREDICT_LOGITS : DIST_PREDICT_PROBABILITIES, &out);
    dist_distributed_dataset_destroy(dds);
    if (st) return fail("predicting");
    if (dist_strategy_is_chief(*s)) print_rows(out, files, o->logits);
    dist_tensor_destroy(out);
    return 0;
}

int distrain_predict_main(int argc, char **argv) {
    distrain_predict_options o;
    int rc = distrain_parse_predict_args(argc, argv, &o);
    if (rc == 1) return 0;
    if (rc) return rc;
    dist_strategy *s = NULL;
    dist_model *model = NULL;
    file_list files = {0};
    dist_tensor *images = NULL;
    dist_dataset *ds = NULL;
    rc = run(&o, &s, &model, &files, &images, &ds);
    if (fflush(stdout) != 0 && rc == 0) {
        fprintf(stderr, "distrain predict: writing the predictions: %s\n", strerror(errno));
        rc = 1;
    }
    dist_dataset_destroy(ds);
    dist_tensor_destroy(images);
    file_list_free(&files);
    dist_model_destroy(model);
    dist_strategy_destroy(s);
    return rc;
}
