/* Rate-limited warnings for events that a peer can cause at will: refused connections. A
 * probe or a flood must not fill the log (one probe run wrote 1,207 lines), but the first
 * refusals are logged in full and the rest are counted, so an operator still learns who was
 * refused and why.
 *
 * Per limiter: while quiet, up to `burst` events per interval are logged in full (the caller
 * logs them when dist_log_limit_admit says so); past that the limiter is flooded, and events
 * are only counted, grouped by source and reason, with at most one summary line per interval:
 *   "<prefix> 312 more <noun> in the last 10 s: 300 from 127.0.0.1: authentication failed;
 *    12 from 10.0.0.7: bad magic"
 * An interval without any event makes it quiet again. Thread-safe (a mutex inside). */
#ifndef DIST_CORE_LOG_LIMIT_H
#define DIST_CORE_LOG_LIMIT_H

#include <pthread.h>
#include <stdbool.h>

#define DIST_LOG_LIMIT_INTERVAL_S 10.0
#define DIST_LOG_LIMIT_BURST 5
#define DIST_LOG_LIMIT_GROUPS 4 /* distinct (source, reason) pairs named in a summary */

typedef struct dist_log_limit {
    pthread_mutex_t mu;
    double interval_s;
    int burst;
    char prefix[128], noun[32];
    bool started;          /* an event has come: window_start holds */
    double window_start;   /* dist_log_limit_now() time */
    int logged;            /* events logged in full in this window */
    unsigned long counted; /* events only counted in this window */
    bool flooded;          /* the last window had more than `burst` events */
    int ngroups;
    unsigned long others; /* counted events outside the groups */
    struct {
        char source[64], why[160];
        unsigned long n;
    } group[DIST_LOG_LIMIT_GROUPS];
} dist_log_limit;

/* interval_s <= 0 or burst < 0: the defaults above. prefix: what the summary starts with
 * ("net_comm rank 2: refused"), noun: what it counts ("connections"); both copied. */
void dist_log_limit_init(dist_log_limit *l, double interval_s, int burst, const char *prefix,
                         const char *noun);
/* Logs the summary still due (force) and frees the mutex. */
void dist_log_limit_destroy(dist_log_limit *l);
/* One event at `now` (dist_log_limit_now()) from `source` (a peer's address: a trailing
 * ":port" is dropped) for `why`: true when the caller should log it in full, false when it
 * was counted for a summary. Logs a summary that is due first. */
bool dist_log_limit_admit(dist_log_limit *l, double now, const char *source, const char *why);
/* Logs the summary of the window when it is over (or when force and anything was counted);
 * call it from a loop that runs anyway, so a flood that stops is still reported. */
void dist_log_limit_tick(dist_log_limit *l, double now, bool force);
/* CLOCK_MONOTONIC seconds. */
double dist_log_limit_now(void);

#endif
