/* Test fixture: writes MNIST digits of the built-in subset as grayscale JPEGs into
 * OUT/train/<digit>/<i>.jpg and OUT/test/<digit>/<i>.jpg (the layout distrain
 * --data-format jpeg-folder reads).
 * usage: make_jpeg_mnist OUT [train_per_class [test_per_class]] */
#include <dist/mnist.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <turbojpeg.h>

static int write_split(tjhandle tj, const char *out, const char *split, const dist_tensor *images,
                       const dist_tensor *labels, int per_class) {
    int count[10] = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", out, split);
    if (mkdir(path, 0755) && errno != EEXIST) return perror(path), 1;
    for (int d = 0; d < 10; d++) {
        snprintf(path, sizeof path, "%s/%s/%d", out, split, d);
        if (mkdir(path, 0755) && errno != EEXIST) return perror(path), 1;
    }
    const unsigned char *px = images->data, *lab = labels->data;
    for (int64_t i = 0; i < images->shape[0]; i++) {
        int d = lab[i];
        if (count[d] >= per_class) continue;
        unsigned char *jpeg = NULL;
        unsigned long size = 0;
        if (tjCompress2(tj, px + i * 784, 28, 0, 28, TJPF_GRAY, &jpeg, &size, TJSAMP_GRAY, 95, 0)) {
            fprintf(stderr, "make_jpeg_mnist: %s\n", tjGetErrorStr2(tj));
            return 1;
        }
        snprintf(path, sizeof path, "%s/%s/%d/%05lld.jpg", out, split, d, (long long)i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(jpeg, 1, size, f) != size || fclose(f)) return perror(path), 1;
        tjFree(jpeg);
        count[d]++;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUT [train_per_class [test_per_class]]\n", argv[0]);
        return 2;
    }
    int train = argc > 2 ? atoi(argv[2]) : 400, test = argc > 3 ? atoi(argv[3]) : 100;
    if (mkdir(argv[1], 0755) && errno != EEXIST) return perror(argv[1]), 1;
    dist_mnist_options o = DIST_MNIST_OPTIONS_INIT;
    o.allow_download = 0;
    dist_mnist *m;
    if (dist_mnist_load(&o, &m)) {
        fprintf(stderr, "make_jpeg_mnist: %s\n", dist_last_error());
        return 1;
    }
    tjhandle tj = tjInitCompress();
    int rc = write_split(tj, argv[1], "train", dist_mnist_train_images(m),
                         dist_mnist_train_labels(m), train) ||
             write_split(tj, argv[1], "test", dist_mnist_test_images(m), dist_mnist_test_labels(m),
                         test);
    tjDestroy(tj);
    dist_mnist_destroy(m);
    return rc;
}
