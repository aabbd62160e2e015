/* dist_dataset_map_token_ids (token ids for an Embedding) and dist_model_input_vocabulary:
 * int64 ids and labels come out int32 with the same values, a float component unchanged; an id
 * at the vocabulary's end, a negative id, and a label beyond int32 are named errors when the
 * element is read; bad arguments are refused at once; the vocabulary of a token model is its
 * Embedding's input_dim, 0 for an image model. */
#include "testutil.h"

#include <dist/dist.h>
#include <string.h>

/* (ids int64 [2, 3], label int64, weight float32) x 2 elements */
static dist_dataset *source(int64_t bad_id, int64_t bad_label) {
    static int64_t ids[2][2][3];
    static int64_t labels[2];
    static float weights[2] = {0.25f, -1.5f};
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 6; i++) ids[e][i / 3][i % 3] = e * 6 + i;
    ids[1][1][2] = bad_id;
    labels[0] = 3, labels[1] = bad_label;
    int64_t is[3] = {2, 2, 3}, ls[1] = {2}, ws[1] = {2};
    dist_tensor t[3] = {dist_tensor_view(ids, DIST_I64, 3, is),
                        dist_tensor_view(labels, DIST_I64, 1, ls),
                        dist_tensor_view(weights, DIST_F32, 1, ws)};
    dist_tensor *p[3] = {&t[0], &t[1], &t[2]};
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(p, 3, 0, &ds), DIST_OK);
    return ds;
}

/* reads the mapped set; returns the first error (DIST_OK after both elements) */
static dist_status read_all(int64_t vocabulary, int64_t bad_id, int64_t bad_label,
                            int32_t got_ids[2][6], int32_t got_labels[2], float got_w[2]) {
    dist_dataset *src = source(bad_id, bad_label), *ds = NULL;
    ck_assert_int_eq(dist_dataset_map_token_ids(src, vocabulary, &ds), DIST_OK);
    dist_dataset_destroy(src);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_status st = DIST_OK;
    for (int e = 0; e < 2 && !st; e++) {
        dist_element el;
        int end = 0;
        st = dist_iterator_next(it, &el, &end);
        if (st) break;
        ck_assert(!end);
        ck_assert_int_eq(el.items[0]->dtype, DIST_I32);
        ck_assert_int_eq(el.items[0]->ndim, 2);
        ck_assert_int_eq(el.items[1]->dtype, DIST_I32);
        ck_assert_int_eq(el.items[2]->dtype, DIST_F32);
        memcpy(got_ids[e], el.items[0]->data, 6 * sizeof(int32_t));
        got_labels[e] = *(const int32_t *)el.items[1]->data;
        got_w[e] = *(const float *)el.items[2]->data;
    }
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
    return st;
}

START_TEST(test_ids_and_labels_become_int32_and_bad_values_are_named) {
    int32_t ids[2][6], labels[2];
    float w[2];
    ck_assert_int_eq(read_all(12, 11, 7, ids, labels, w), DIST_OK);
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 6; i++) ck_assert_int_eq(ids[e][i], e * 6 + i);
    ck_assert_int_eq(labels[0], 3);
    ck_assert_int_eq(labels[1], 7);
    ck_assert(w[0] == 0.25f && w[1] == -1.5f);
    /* vocabulary 0: any int32 id */
    ck_assert_int_eq(read_all(0, 2147483647, 7, ids, labels, w), DIST_OK);
    ck_assert_int_eq(ids[1][5], 2147483647);
    ck_assert_int_eq(read_all(12, 12, 7, ids, labels, w), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "id 12 (position 5 of 6) is not in [0, 12)"));
    ck_assert_int_eq(read_all(12, -1, 7, ids, labels, w), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "id -1"));
    ck_assert_int_eq(read_all(0, (int64_t)1 << 31, 7, ids, labels, w), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "outside int32's range"));
    ck_assert_int_eq(read_all(12, 1, (int64_t)1 << 40, ids, labels, w), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "component 1 holds 1099511627776"));
}
END_TEST

START_TEST(test_bad_arguments_are_refused) {
    dist_dataset *src = source(1, 1), *ds = NULL;
    ck_assert_int_eq(dist_dataset_map_token_ids(src, -1, &ds), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_dataset_map_token_ids(src, ((int64_t)1 << 31) + 1, &ds),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_dataset_map_token_ids(NULL, 5, &ds), DIST_INVALID_ARGUMENT);
    dist_dataset_destroy(src);
    float f[4] = {0};
    int64_t fs[1] = {4};
    dist_tensor t = dist_tensor_view(f, DIST_F32, 1, fs);
    dist_tensor *p[1] = {&t};
    ck_assert_int_eq(dist_dataset_from_tensor_slices(p, 1, 0, &src), DIST_OK);
    ck_assert_int_eq(dist_dataset_map_token_ids(src, 5, &ds), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "must be integers"));
    dist_dataset_destroy(src);
}
END_TEST

START_TEST(test_the_vocabulary_is_the_embeddings_input_dim) {
    static const char *json =
        "{\"class_name\": \"Sequential\", \"config\": {\"name\": \"s\", \"layers\": ["
        "{\"class_name\": \"InputLayer\", \"config\": {\"batch_input_shape\": [null, 6], "
        "\"dtype\": \"int32\", \"name\": \"in\"}},"
        "{\"class_name\": \"Embedding\", \"config\": {\"name\": \"e\", \"input_dim\": 37, "
        "\"output_dim\": 4}},"
        "{\"class_name\": \"GlobalAveragePooling1D\", \"config\": {\"name\": \"g\"}},"
        "{\"class_name\": \"Dense\", \"config\": {\"name\": \"d\", \"units\": 2}}]}}";
    dist_model *m = NULL;
    ck_assert_msg(dist_model_from_keras_json(json, 1, &m) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_model_input_vocabulary(m), 37);
    dist_model_destroy(m);
    ck_assert_int_eq(dist_model_create_mnist_cnn(&m), DIST_OK);
    ck_assert_int_eq(dist_model_input_vocabulary(m), 0);
    dist_model_destroy(m);
    ck_assert_int_eq(dist_model_input_vocabulary(NULL), 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("map_token_ids");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_ids_and_labels_become_int32_and_bad_values_are_named);
    tcase_add_test(tc, test_bad_arguments_are_refused);
    tcase_add_test(tc, test_the_vocabulary_is_the_embeddings_input_dim);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
