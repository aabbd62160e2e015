#include "target_accuracy.h"

/* Evaluated here rather than as fit's validation data: validation feeds EarlyStopping,
 * ReduceLROnPlateau and the checkpoints' monitor, which --target-accuracy must not change. */
static dist_status on_epoch_end(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    distrain_target_accuracy *t = user;
    dist_logs test;
    dist_status st = dist_evaluate(t->strategy, t->model, t->test, NULL, NULL, 0, &test);
    if (st != DIST_OK) return st; /* distrain prints "training: " and the message */
    double loss = 0, accuracy = 0;
    dist_logs_get(&test, "loss", &loss);
    dist_logs_get(&test, "accuracy", &accuracy);
    t->last_accuracy = accuracy;
    t->epochs_evaluated++;
    /* metrics that another callback may read (the CSV log, TensorBoard); the logs' room is
     * bounded, and a full one does not stop the run */
    if (dist_logs_set(logs, "test_loss", loss) != DIST_OK ||
        dist_logs_set(logs, "test_accuracy", accuracy) != DIST_OK)
        dist_clear_error();
    int reached = accuracy >= t->target;
    if (reached && !t->reached_epoch) t->reached_epoch = epoch + 1;
    if (t->out) {
        fprintf(t->out, "Epoch %d: test accuracy %.4f (target %.4g%s)\n", epoch + 1, accuracy,
                t->target, reached ? ": reached, stopping" : "");
        fflush(t->out);
    }
    if (reached) fs->stop_training = 1;
    return DIST_OK;
}

dist_callback distrain_target_accuracy_callback(distrain_target_accuracy *t) {
    dist_callback c = {0};
    c.user = t;
    c.on_epoch_end = on_epoch_end;
    return c;
}
