/* The CUDA module loader when $DIST_CUDA_MODULE names a file that does not exist: no GPU is
 * counted, and every CUDA entry fails with DIST_UNSUPPORTED and a message naming that path;
 * nothing aborts. A program of its own: the module is resolved once per process. */
#include "backend/nccl.h"
#include "dist/backend.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#define MISSING_MODULE "/nonexistent/libdist-test/libdist_cuda.so"

START_TEST(test_missing_module_counts_no_gpus) {
    ck_assert_int_eq(dist_device_count(DIST_DEVICE_CUDA), 0);
}
END_TEST

START_TEST(test_gpu_backend_with_missing_module_fails_naming_the_path) {
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.device = (dist_device){DIST_DEVICE_CUDA, 0};
    dist_backend *be = (dist_backend *)0x1;
    dist_status st = dist_backend_create(&o, &be);
    ck_assert_msg(st == DIST_UNSUPPORTED, "got %s", dist_status_name(st));
    ck_assert_ptr_null(be);
    const char *msg = dist_last_error();
    ck_assert_msg(strstr(msg, "gpu:0") != NULL, "message '%s' does not name gpu:0", msg);
    ck_assert_msg(strstr(msg, MISSING_MODULE) != NULL, "message '%s' does not name the module",
                  msg);
    ck_assert_msg(strstr(msg, "DIST_CUDA_MODULE") != NULL,
                  "message '%s' does not say where the path came from", msg);
    /* the dlopen() reason follows the path */
    ck_assert_msg(strstr(msg, "No such file") != NULL, "message '%s' lacks the loader's reason",
                  msg);
}
END_TEST

START_TEST(test_nccl_with_missing_module_fails_naming_the_path) {
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    dist_backend *cpu = NULL;
    ck_assert_int_eq(dist_backend_create(&o, &cpu), DIST_OK);
    dist_comm *c = (dist_comm *)0x1;
    dist_status st = dist_backend_nccl_comm_create(1, &cpu, 0, &c);
    ck_assert_msg(st == DIST_UNSUPPORTED, "got %s", dist_status_name(st));
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(dist_last_error(), MISSING_MODULE) != NULL,
                  "message '%s' does not name the module", dist_last_error());
    unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES];
    ck_assert_int_eq(dist_backend_nccl_unique_id(id), DIST_UNSUPPORTED);
    ck_assert_msg(strstr(dist_last_error(), MISSING_MODULE) != NULL,
                  "message '%s' does not name the module", dist_last_error());
    memset(id, 0, sizeof id);
    c = (dist_comm *)0x1;
    ck_assert_int_eq(dist_backend_nccl_comm_create_ranks(2, 0, 1, &cpu, id, 0, &c),
                     DIST_UNSUPPORTED);
    ck_assert_ptr_null(c);
    dist_comm_destroy(NULL);
    dist_backend_destroy(cpu);
}
END_TEST

int main(void) {
    setenv("CK_FORK", "no", 1);
    /* before anything can load the module: the loader reads it once */
    setenv("DIST_CUDA_MODULE", MISSING_MODULE, 1);
    Suite *s = suite_create("cuda_loader");
    TCase *tc = tcase_create("missing_module");
    tcase_add_test(tc, test_missing_module_counts_no_gpus);
    tcase_add_test(tc, test_gpu_backend_with_missing_module_fails_naming_the_path);
    tcase_add_test(tc, test_nccl_with_missing_module_fails_naming_the_path);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
