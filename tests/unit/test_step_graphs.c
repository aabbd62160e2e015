/* Step graphs (src/backend/step_graphs.h) on a fake device: commands append their value to a
 * log when they run, a capture collects them into a "graph" instead, and launching a graph
 * appends what it holds. So the log says exactly what ran, in which order and how often, and
 * the counters say whether it came from a graph. */
#include "backend/step_graphs.h"
#include "core/error.h"
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

typedef struct fake_graph {
    int vals[64];
    int n;
} fake_graph;

typedef struct fake_device {
    int log[512];
    int nlog;
    int direct_calls; /* command functions called outside a capture */
    fake_graph *capturing;
    int capture_begins, capture_aborts, launches, destroyed;
    int refuse_capture; /* capture_end fails, as a device would for an uncapturable call */
    int fail_launches;  /* this many launches fail from now on */
    int fail_value;     /* a command with this value fails */
} fake_device;

typedef struct cmd_args {
    int value;
} cmd_args;

static dist_status cmd_fn(void *device, const void *args) {
    fake_device *d = device;
    const cmd_args *a = args;
    if (a->value == d->fail_value)
        return dist_error(DIST_CUDA, "fake device: command %d failed", a->value);
    if (d->capturing) {
        d->capturing->vals[d->capturing->n++] = a->value;
        return DIST_OK;
    }
    d->direct_calls++;
    d->log[d->nlog++] = a->value;
    return DIST_OK;
}

static dist_status fake_capture_begin(void *device) {
    fake_device *d = device;
    d->capture_begins++;
    d->capturing = calloc(1, sizeof *d->capturing);
    return DIST_OK;
}

static dist_status fake_capture_end(void *device, int ok, void **graph) {
    fake_device *d = device;
    fake_graph *g = d->capturing;
    d->capturing = NULL;
    if (!ok || d->refuse_capture) {
        free(g);
        d->capture_aborts++;
        return ok ? dist_error(DIST_CUDA, "fake device: capture refused") : DIST_OK;
    }
    *graph = g;
    return DIST_OK;
}

static dist_status fake_launch(void *device, void *graph) {
    fake_device *d = device;
    fake_graph *g = graph;
    if (d->fail_launches > 0) {
        d->fail_launches--;
        return dist_error(DIST_CUDA, "fake device: launch refused");
    }
    d->launches++;
    for (int i = 0; i < g->n; i++) d->log[d->nlog++] = g->vals[i];
    return DIST_OK;
}

static void fake_destroy(void *device, void *graph) {
    ((fake_device *)device)->destroyed++;
    free(graph);
}

static const step_rec_graph_ops fake_ops = {fake_capture_begin, fake_capture_end, fake_launch,
                                            fake_destroy};

static dist_status submit(step_recorder *r, int value) {
    cmd_args a = {value};
    return step_rec_submit(r, cmd_fn, &a, sizeof a);
}

/* One step that submits values[0..n-1]. */
static dist_status step(step_recorder *r, const int *values, int n) {
    DIST_TRY(step_rec_begin(r));
    for (int i = 0; i < n; i++) DIST_TRY(submit(r, values[i]));
    return step_rec_end(r);
}

static void assert_log(const fake_device *d, const int *expected, int n) {
    ck_assert_int_eq(d->nlog, n);
    for (int i = 0; i < n; i++) ck_assert_msg(d->log[i] == expected[i], "log[%d] = %d, expected %d",
                                              i, d->log[i], expected[i]);
}

START_TEST(test_outside_a_step_commands_run_at_once) {
    fake_device d = {.fail_value = -1};
    step_recorder r;
    step_rec_init(&r, &fake_ops, &d);
    ck_assert_int_eq(submit(&r, 7), DIST_OK);
    assert_log(&d, (int[]){7}, 1);
    ck_assert_int_eq(step_rec_pending(&r), 0);
    step_rec_release(&r);
}
END_TEST

START_TEST(test_inside_a_step_commands_wait_for_the_flush_and_keep_their_order) {
    fake_device d = {.fail_value = -1};
    step_recorder r;
    step_rec_init(&r, &fake_ops, &d);
    ck_assert_int_eq(step_rec_begin(&r), DIST_OK);
    for (int v = 1; v <= 3; v++) ck_assert_int_eq(submit(&r, v), DIST_OK);
    ck_assert_int_eq(d.nlog, 0);
    ck_assert_int_eq(step_rec_pending(&r), 1);
    /* a sync point in the middle of the step: what came before runs, in order */
    ck_assert_int_eq(step_rec_flush(&r), DIST_OK);
    assert_log(&d, (int[]){1, 2, 3}, 3);
    ck_assert_int_eq(submit(&r, 4), DIST_OK);
    ck_assert_int_eq(d.nlog, 3);
    ck_assert_int_eq(step_rec_end(&r), DIST_OK);
    assert_log(&d, (int[]){1, 2, 3, 4}, 4);
    /* after the step, at once again */
    ck_assert_int_eq(submit(&r, 5), DIST_OK);
    assert_log(&d, (int[]){1, 2, 3, 4, 5}, 5);
    ck_assert_int_eq(r.stats.commands, 5);
    step_rec_release(&r);
}
END_TEST

START_TEST(test_a_repeated_step_is_captured_the_second_time_and_replayed_after) {
    fake_device d = {.fail_value = -1};
    step_recorder r;
    step_rec_init(&r, &fake_ops, &d);
    const int s[] = {10, 20, 30};
    ck_assert_int_eq(step(&r, s, 3), DIST_OK); /* seen once: eager */
    ck_assert_int_eq(d.direct_calls, 3);
    ck_assert_int_eq(d.capture_begins, 0);
    ck_assert_int_eq(step(&r, s, 3), DIST_OK); /* seen twice: captured, then launched once */
    ck_assert_int_eq(d.capture_begins, 1);
    ck_assert_int_eq(d.launches, 1);
    ck_assert_int_eq(d.direct_calls, 3);
    for (int i = 0; i < 5; i++) ck_assert_int_eq(step(&r, s, 3), DIST_OK);
    ck_assert_int_eq(d.direct_calls, 3); /* no command function ran again */
    ck_assert_int_eq(d.capture_begins, 1);
    ck_assert_int_eq(d.launches, 6);
    /* seven steps' work, each exactly once */
    ck_assert_int_eq(d.nlog, 21);
    for (int i = 0; i < 21; i++) ck_assert_int_eq(d.log[i], s[i % 3]);
    ck_assert_int_eq(r.stats.eager_segments, 1);
    ck_assert_int_eq(r.stats.captured, 1);
    ck_assert_int_eq(r.stats.replayed, 5);
    ck_assert_int_eq(r.stats.capture_failures, 0);
    step_rec_release(&r);
    ck_assert_int_eq(d.destroyed, 1);
}
END_TEST

START_TEST(test_a_changed_argument_is_another_segment_and_runs_eagerly) {
    fake_device d = {.fail_value = -1};
    step_recorder r;
    step_rec_init(&r, &fake_ops, &d);
    const int a[] = {1, 2, 3}, b[] = {1, 2, 4}; /* e.g. a learning rate that changed */
    ck_assert_int_eq(step(&r, a, 3), DIST_OK);
    ck_assert_int_eq(step(&r, a, 3), DIST_OK);
    ck_assert_int_eq(step(&r, a, 3), DIST_OK);
    ck_assert_int_eq(r.stats.replayed, 1);
    int calls = d.direct_calls;
    ck_assert_int_eq(step(&r, b, 3), DIST_OK); /* not the graph of a */
    ck_assert_int_eq(d.direct_calls, calls + 3);
    ck_assert_int_eq(d.log[d.nlog - 1], 4);
    ck_assert_int_eq(r.stats.replayed, 1);
    /* a shorter segment with the same prefix is another segment too */
    ck_assert_int_eq(step(&r, a, 2), DIST_OK);
    ck_assert_int_eq(d.direct_calls, calls + 5);
    /* and a still replays */
    ck_assert_int_eq(step(&r, a, 3), DIST_OK);
    ck_assert_int_eq(r.stats.replayed, 2);
    ck_assert_int_eq(d.direct_calls, calls + 5);
    step_rec_release(&r);
}
END_TEST

START_TEST(test_a_refused_capture_runs_eagerly_and_is_not_tried_again) {
    fake_device d = {.fail_value = -1, .refuse_capture = 1};
    step_recorder r;
    step_rec_init(&r, &fake_ops, &d);
    const int s[] = {5, 6};
    for (int i = 0; i < 4; i++) ck_assert_int_eq(step(&r, s, 2), DIST_OK);
    ck_assert_int_eq(d.capture_begins, 1);
    ck_assert_int_eq(d.capture_aborts, 1);
    ck_assert_int_eq(d.launches, 0);
    ck_assert_int_eq(d.direct_calls, 8); /* every step ran, each once */
    assert_log(&d, (int[]){5, 6, 5, 6, 5, 6, 5, 6}, 8);
    ck_assert_int_eq(r.stats.capture_failures, 1);
    ck_assert_int_eq(r.stats.eager_segments, 4);
    step_rec_release(&r);
}
END_TEST

START_TEST(test_a_graph_that_fails_to_launch_runs_eagerly_and_is_dropped) {
    fake_device d = {.fail_value = -1};
    step_recorder r;
    step_rec_init(&r, &fake_ops, &d);
    const int s[] = {4, 5};
    ck_assert_int_eq(step(&r, s, 2), DIST_OK); /* eager */
    ck_assert_int_eq(step(&r, s, 2), DIST_OK); /* captured and launched */
    d.fail_launches = 1;
    ck_assert_int_eq(step(&r, s, 2), DIST_OK); /* the replay fails: eager instead */
    ck_assert_int_eq(d.destroyed, 1);
    for (int i = 0; i < 2; i++) ck_assert_int_eq(step(&r, s, 2), DIST_OK); /* eager from now on */
    ck_assert_int_eq(d.capture_begins, 1);
    ck_assert_int_eq(d.launches, 1);
    assert_log(&d, (int[]){4, 5, 4, 5, 4, 5, 4, 5, 4, 5}, 10); /* five steps, each once */
    ck_assert_int_eq(r.stats.replayed, 0);
    step_rec_release(&r);
}
END_TEST

START_TEST(test_a_failing_command_fails_the_flush_and_clears_the_segment) {
    fake_device d = {.fail_value = 99};
    step_recorder r;
    step_rec_init(&r, &fake_ops, &d);
    ck_assert_int_eq(step_rec_begin(&r), DIST_OK);
    ck_assert_int_eq(submit(&r, 1), DIST_OK);
    ck_assert_int_eq(submit(&r, 99), DIST_OK); /* recorded: fails when it runs */
    ck_assert_int_eq(submit(&r, 2), DIST_OK);
    ck_assert_int_eq(step_rec_end(&r), DIST_CUDA);
    ck_assert_msg(strstr(dist_last_error(), "command 99 failed") != NULL, "message: %s",
                  dist_last_error());
    assert_log(&d, (int[]){1}, 1); /* stopped at the failure */
    ck_assert_int_eq(step_rec_pending(&r), 0);
    ck_assert_int_eq(r.recording, 0);
    ck_assert_int_eq(step(&r, (int[]){3}, 1), DIST_OK);
    assert_log(&d, (int[]){1, 3}, 2);
    step_rec_release(&r);
}
END_TEST

START_TEST(test_a_command_failing_in_the_capture_fails_once_eagerly) {
    fake_device d = {.fail_value = -1};
    step_recorder r;
    step_rec_init(&r, &fake_ops, &d);
    const int s[] = {1, 42, 2};
    ck_assert_int_eq(step(&r, s, 3), DIST_OK);
    d.fail_value = 42; /* the device breaks between the two steps */
    ck_assert_int_eq(step(&r, s, 3), DIST_CUDA);
    ck_assert_int_eq(d.capture_begins, 1);
    ck_assert_int_eq(d.capture_aborts, 1); /* the capture was discarded, nothing launched */
    ck_assert_int_eq(d.launches, 0);
    assert_log(&d, (int[]){1, 42, 2, 1}, 4); /* the second step ran eagerly up to the failure */
    step_rec_release(&r);
}
END_TEST

START_TEST(test_without_graph_hooks_every_segment_runs_eagerly) {
    fake_device d = {.fail_value = -1};
    step_recorder r;
    step_rec_init(&r, NULL, &d);
    const int s[] = {8, 9};
    for (int i = 0; i < 3; i++) ck_assert_int_eq(step(&r, s, 2), DIST_OK);
    ck_assert_int_eq(d.direct_calls, 6);
    ck_assert_int_eq(d.capture_begins, 0);
    ck_assert_int_eq(r.stats.eager_segments, 3);
    ck_assert_int_eq(r.stats.captured + r.stats.replayed, 0);
    step_rec_release(&r);
}
END_TEST

START_TEST(test_the_least_recently_used_graph_is_destroyed_when_the_cache_is_full) {
    fake_device d = {.fail_value = -1};
    step_recorder r;
    step_rec_init(&r, &fake_ops, &d);
    /* STEP_REC_CACHE distinct segments, each captured */
    for (int k = 0; k < STEP_REC_CACHE; k++)
        for (int i = 0; i < 2; i++) ck_assert_int_eq(step(&r, (int[]){k}, 1), DIST_OK);
    ck_assert_int_eq(r.stats.captured, STEP_REC_CACHE);
    ck_assert_int_eq(d.destroyed, 0);
    ck_assert_int_eq(step(&r, (int[]){0}, 1), DIST_OK); /* segment 0 is now the most recent */
    ck_assert_int_eq(r.stats.replayed, 1);
    ck_assert_int_eq(step(&r, (int[]){1000}, 1), DIST_OK); /* evicts segment 1, the oldest */
    ck_assert_int_eq(d.destroyed, 1);
    ck_assert_int_eq(step(&r, (int[]){0}, 1), DIST_OK);
    ck_assert_int_eq(r.stats.replayed, 2);
    int calls = d.direct_calls;
    ck_assert_int_eq(step(&r, (int[]){1}, 1), DIST_OK); /* forgotten: eager again */
    ck_assert_int_eq(d.direct_calls, calls + 1);
    step_rec_release(&r);
    ck_assert_int_eq(d.destroyed, STEP_REC_CACHE);
}
END_TEST

START_TEST(test_steps_that_never_repeat_stop_being_captured) {
    fake_device d = {.fail_value = -1};
    step_recorder r;
    step_rec_init(&r, &fake_ops, &d);
    /* each segment twice in a row: captured, then never seen again */
    for (int k = 0; k < STEP_REC_THRASH_CAPTURES + 10; k++)
        for (int i = 0; i < 2; i++) ck_assert_int_eq(step(&r, (int[]){k}, 1), DIST_OK);
    ck_assert_int_eq(r.stats.captured, STEP_REC_THRASH_CAPTURES);
    ck_assert_int_eq(r.stats.replayed, 0);
    ck_assert_int_eq(d.capture_begins, STEP_REC_THRASH_CAPTURES);
    /* everything still ran, once */
    ck_assert_int_eq(d.nlog, 2 * (STEP_REC_THRASH_CAPTURES + 10));
    step_rec_release(&r);
}
END_TEST

START_TEST(test_nested_steps_and_oversized_commands_are_refused) {
    fake_device d = {.fail_value = -1};
    step_recorder r;
    step_rec_init(&r, &fake_ops, &d);
    ck_assert_int_eq(step_rec_begin(&r), DIST_OK);
    ck_assert_int_eq(step_rec_begin(&r), DIST_INVALID_USAGE);
    static unsigned char big[2048];
    ck_assert_int_eq(step_rec_submit(&r, cmd_fn, big, sizeof big), DIST_INTERNAL);
    ck_assert_int_eq(step_rec_end(&r), DIST_OK);
    ck_assert_int_eq(d.nlog, 0);
    step_rec_release(&r);
}
END_TEST

int main(void) {
    Suite *s = suite_create("step_graphs");
    TCase *tc = tcase_create("recorder");
    tcase_add_test(tc, test_outside_a_step_commands_run_at_once);
    tcase_add_test(tc, test_inside_a_step_commands_wait_for_the_flush_and_keep_their_order);
    tcase_add_test(tc, test_a_repeated_step_is_captured_the_second_time_and_replayed_after);
    tcase_add_test(tc, test_a_changed_argument_is_another_segment_and_runs_eagerly);
    tcase_add_test(tc, test_a_refused_capture_runs_eagerly_and_is_not_tried_again);
    tcase_add_test(tc, test_a_graph_that_fails_to_launch_runs_eagerly_and_is_dropped);
    tcase_add_test(tc, test_a_failing_command_fails_the_flush_and_clears_the_segment);
    tcase_add_test(tc, test_a_command_failing_in_the_capture_fails_once_eagerly);
    tcase_add_test(tc, test_without_graph_hooks_every_segment_runs_eagerly);
    tcase_add_test(tc, test_the_least_recently_used_graph_is_destroyed_when_the_cache_is_full);
    tcase_add_test(tc, test_steps_that_never_repeat_stop_being_captured);
    tcase_add_test(tc, test_nested_steps_and_oversized_commands_are_refused);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
