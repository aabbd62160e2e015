/* How many of this process's cores other programs keep busy, for the default thread count.
 *
 * Why: compute threads split each kernel's work evenly (static OpenMP schedules, oneDNN's own
 * partitioning), so a step lasts as long as its slowest thread. When another program keeps one
 * of two cores busy, the thread that shares that core gets about half of it and its partner
 * waits (spinning, in OpenMP's default policy), and the step runs slower than on one thread
 * alone. A default that counts only the cores that are free keeps every thread on a core of its
 * own. Measured once, when a strategy is made: load that comes later is not followed. */
#include "backend/backend.h"

#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Busy and total clock ticks of the CPUs in `set`, summed, from /proc/stat ("cpuN user nice
 * system idle iowait irq softirq steal ..."). 0 when it cannot be read. */
static int read_cpu_ticks(const cpu_set_t *set, unsigned long long *busy,
                          unsigned long long *total) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return 0;
    char line[512];
    int found = 0;
    *busy = *total = 0;
    while (fgets(line, sizeof line, f)) {
        int cpu;
        unsigned long long v[8] = {0};
        if (strncmp(line, "cpu", 3) != 0 || line[3] < '0' || line[3] > '9') continue;
        if (sscanf(line + 3, "%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0], &v[1],
                   &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) < 5)
            continue;
        if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, set)) continue;
        /* idle and iowait are free time; steal is time the hypervisor gave to others */
        unsigned long long used = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
        *busy += used;
        *total += used + v[3] + v[4];
        found++;
    }
    fclose(f);
    return found;
}

/* This process's own clock ticks (utime + stime of /proc/self/stat), -1 when unreadable. */
static long long read_own_ticks(void) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* the command name may hold spaces and parentheses: the fields start after the last ')' */
    char *p = strrchr(buf, ')');
    unsigned long long utime, stime;
    if (!p ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        return -1;
    return (long long)(utime + stime);
}

int dist_cpu_busy_cores(int sample_ms) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    int cpus = CPU_COUNT(&set);
    unsigned long long b0, t0, b1, t1;
    long long own0 = read_own_ticks();
    if (cpus < 2 || sample_ms <= 0 || !read_cpu_ticks(&set, &b0, &t0) || own0 < 0) return 0;
    struct timespec pause = {sample_ms / 1000, (long)(sample_ms % 1000) * 1000000L};
    while (nanosleep(&pause, &pause) != 0) {
    }
    long long own1 = read_own_ticks();
    if (!read_cpu_ticks(&set, &b1, &t1) || own1 < 0 || t1 <= t0) return 0;
    /* this process's threads (a data loader, another strategy) are not "other programs" */
    double others = (double)(b1 - b0) - (double)(own1 - own0);
    double per_cpu = (double)(t1 - t0) / cpus; /* ticks in the window, per CPU */
    /* a core counts as busy from ~60% of its time: a program that keeps a core, not noise */
    int busy = (int)(others / per_cpu + 0.4);
    if (busy < 0) busy = 0;
    return busy < cpus ? busy : cpus - 1;
}
