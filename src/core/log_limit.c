/* Rate-limited warnings (log_limit.h). */
#include "core/log_limit.h"

#include "core/error.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

double dist_log_limit_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

void dist_log_limit_init(dist_log_limit *l, double interval_s, int burst, const char *prefix,
                         const char *noun) {
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
    l->interval_s = interval_s > 0 ? interval_s : DIST_LOG_LIMIT_INTERVAL_S;
    l->burst = burst >= 0 ? burst : DIST_LOG_LIMIT_BURST;
    snprintf(l->prefix, sizeof l->prefix, "%s", prefix ? prefix : "");
    snprintf(l->noun, sizeof l->noun, "%s", noun ? noun : "events");
}

/* The summary of the window into out (empty when nothing was counted); starts a new window.
 * Under l->mu. */
static void end_window(dist_log_limit *l, double now, char *out, size_t cap) {
    out[0] = '\0';
    if (l->counted) {
        size_t n = (size_t)snprintf(out, cap, "%s %lu more %s in the last %.0f s:", l->prefix,
                                    l->counted, l->noun, now - l->window_start);
        for (int i = 0; i < l->ngroups && n < cap; i++)
            n += (size_t)snprintf(out + n, cap - n, "%s %lu from %s: %s", i ? ";" : "",
                                  l->group[i].n, l->group[i].source, l->group[i].why);
        if (l->others && n < cap)
            snprintf(out + n, cap - n, "; %lu from other sources or for other reasons", l->others);
    }
    /* a window with more events than the burst keeps the next one to summaries only (once
     * flooded, every event is counted); a window without any event ends the flood */
    l->flooded = l->counted > 0;
    l->window_start = now;
    l->logged = 0;
    l->counted = 0;
    l->ngroups = 0;
    l->others = 0;
}

static void count(dist_log_limit *l, const char *source, const char *why) {
    char host[64];
    snprintf(host, sizeof host, "%s", source ? source : "?");
    /* "127.0.0.1:54321" -> "127.0.0.1" (net_accept's "host:port", IPv6 hosts too): every
     * connection has its own port */
    char *colon = strrchr(host, ':');
    if (colon && colon != host && colon[1] && strspn(colon + 1, "0123456789") == strlen(colon + 1))
        *colon = '\0';
    if (!why) why = "";
    l->counted++;
    for (int i = 0; i < l->ngroups; i++)
        if (strcmp(l->group[i].source, host) == 0 && strncmp(l->group[i].why, why, 159) == 0) {
            l->group[i].n++;
            return;
        }
    if (l->ngroups == DIST_LOG_LIMIT_GROUPS) {
        l->others++;
        return;
    }
    snprintf(l->group[l->ngroups].source, sizeof l->group[0].source, "%s", host);
    snprintf(l->group[l->ngroups].why, sizeof l->group[0].why, "%s", why);
    l->group[l->ngroups++].n = 1;
}

bool dist_log_limit_admit(dist_log_limit *l, double now, const char *source, const char *why) {
    char line[1024] = "";
    pthread_mutex_lock(&l->mu);
    if (!l->started || now - l->window_start >= l->interval_s)
        end_window(l, now, line, sizeof line);
    l->started = true;
    bool full = !l->flooded && l->logged < l->burst;
    if (full)
        l->logged++;
    else {
        l->flooded = true;
        count(l, source, why);
    }
    pthread_mutex_unlock(&l->mu);
    if (line[0]) dist_log(DIST_LOG_WARN, "%s", line);
    return full;
}

void dist_log_limit_tick(dist_log_limit *l, double now, bool force) {
    char line[1024] = "";
    pthread_mutex_lock(&l->mu);
    if (l->started && (now - l->window_start >= l->interval_s || (force && l->counted)))
        end_window(l, now, line, sizeof line);
    pthread_mutex_unlock(&l->mu);
    if (line[0]) dist_log(DIST_LOG_WARN, "%s", line);
}

void dist_log_limit_destroy(dist_log_limit *l) {
    if (!l) return;
    dist_log_limit_tick(l, dist_log_limit_now(), true);
    pthread_mutex_destroy(&l->mu);
}
