/* SHA-256 against the FIPS 180-4 / NIST test vectors. */
#include "core/sha256.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

static const char *hex_of(const void *data, size_t n) {
    static char hex[DIST_SHA256_HEX_CHARS + 1];
    unsigned char d[DIST_SHA256_BYTES];
    dist_sha256(data, n, d);
    return dist_sha256_hex(d, hex);
}

START_TEST(test_sha256_abc) {
    ck_assert_str_eq(hex_of("abc", 3),
                     "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}
END_TEST

START_TEST(test_sha256_empty_string) {
    ck_assert_str_eq(hex_of("", 0),
                     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}
END_TEST

START_TEST(test_sha256_448_bit_message) {
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    ck_assert_str_eq(hex_of(m, strlen(m)),
                     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}
END_TEST

START_TEST(test_sha256_896_bit_message) {
    const char *m =
        "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
        "klmnopqrlmnopqrsmnopqrstnopqrstu";
    ck_assert_str_eq(hex_of(m, strlen(m)),
                     "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}
END_TEST

START_TEST(test_sha256_million_a_fed_in_uneven_pieces) {
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    dist_sha256_ctx c;
    dist_sha256_init(&c);
    size_t done = 0, step = 1;
    while (done < 1000000) {
        size_t k = step < 1000000 - done ? step : 1000000 - done;
        dist_sha256_update(&c, a + done, k);
        done += k;
        step = step * 3 % 997 + 1;
    }
    unsigned char d[DIST_SHA256_BYTES];
    char hex[DIST_SHA256_HEX_CHARS + 1];
    dist_sha256_final(&c, d);
    ck_assert_str_eq(dist_sha256_hex(d, hex),
                     "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}
END_TEST

START_TEST(test_sha256_lengths_around_the_padding_boundary) {
    /* 55, 56 and 64 bytes straddle the one-block / two-block padding cases. */
    char m[64];
    memset(m, 'a', sizeof m);
    ck_assert_str_eq(hex_of(m, 55),
                     "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
    ck_assert_str_eq(hex_of(m, 56),
                     "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
    ck_assert_str_eq(hex_of(m, 64),
                     "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}
END_TEST

static Suite *sha256_suite(void) {
    Suite *s = suite_create("sha256");
    TCase *tc = tcase_create("vectors");
    tcase_add_test(tc, test_sha256_abc);
    tcase_add_test(tc, test_sha256_empty_string);
    tcase_add_test(tc, test_sha256_448_bit_message);
    tcase_add_test(tc, test_sha256_896_bit_message);
    tcase_add_test(tc, test_sha256_million_a_fed_in_uneven_pieces);
    tcase_add_test(tc, test_sha256_lengths_around_the_padding_boundary);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return dist_test_run(sha256_suite()); }
