#include "interrupt.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    if (g_interrupted) {
        static const char again[] = "\ndistrain: interrupted again: exiting now, nothing saved\n";
        ssize_t w = write(STDERR_FILENO, again, sizeof again - 1);
        (void)w;
        _exit(130);
    }
    g_interrupted = 1;
    static const char first[] = "\ndistrain: interrupt: stopping after this step (Ctrl-C again "
                                "to quit at once)\n";
    ssize_t w = write(STDERR_FILENO, first, sizeof first - 1);
    (void)w;
}

void distrain_interrupt_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sa.sa_flags = SA_RESTART; /* a step's reads and waits go on; the step ends normally */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
}

int distrain_interrupted(void) { return g_interrupted != 0; }

static dist_status stop_on_interrupt(void *user, dist_fit_state *fs, int64_t batch,
                                     dist_logs *logs) {
    (void)batch;
    (void)logs;
    if (!g_interrupted) return DIST_OK;
    distrain_interrupt *where = user;
    where->stopped = 1;
    where->epoch = fs->epoch + 1;
    where->step = fs->step;
    where->global_step = fs->global_step;
    return DIST_CANCELLED;
}

dist_callback distrain_interrupt_callback(distrain_interrupt *where) {
    dist_callback cb;
    memset(&cb, 0, sizeof cb);
    cb.user = where;
    cb.on_batch_end = stop_on_interrupt;
    return cb;
}
