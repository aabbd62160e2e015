/* Bounded spinning for threads that wait on each other for short times.
 *
 * A thread that sleeps on a futex or a condition variable is woken in tens of microseconds on
 * bare metal, but on a virtual machine an idle vCPU halts and its wake-up took 200-300 us
 * (measured between two mirrored CPU replicas on a 2-core KVM guest: the second replica
 * started each step 275 us after the first). Replicas that each own a core therefore spin for
 * a while before they sleep; the spin pauses the core between checks and yields it now and then,
 * so another runnable thread of the process (the input pipeline's) still gets it. When the
 * waiting threads do not fit the cores, a spinning waiter takes the core its peer needs: callers
 * pass a short budget then (dist_spin_budget_ns). */
#ifndef DIST_CORE_SPIN_H
#define DIST_CORE_SPIN_H

#include <sched.h>
#include <time.h>

#define DIST_SPIN_LONG_NS 2000000L /* the waiters fit the cores */
#define DIST_SPIN_SHORT_NS 30000L  /* they do not: about one futex wake-up */

static inline long dist_spin_budget_ns(int fits_cores) {
    return fits_cores ? DIST_SPIN_LONG_NS : DIST_SPIN_SHORT_NS;
}

typedef struct dist_spin {
    struct timespec t0;
    long budget_ns;
    unsigned i;
} dist_spin;

static inline void dist_spin_start(dist_spin *s, long budget_ns) {
    clock_gettime(CLOCK_MONOTONIC, &s->t0);
    s->budget_ns = budget_ns;
    s->i = 0;
}

/* One turn of the spin: 1 while the budget lasts (the caller checks its condition again), 0
 * once it is spent (the caller sleeps). */
static inline int dist_spin_again(dist_spin *s) {
    s->i++;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if ((s->i & 63) != 0) return 1;
    sched_yield(); /* every ~64 pauses: a runnable thread of the process gets the core */
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - s->t0.tv_sec) * 1000000000L + (t.tv_nsec - s->t0.tv_nsec) <= s->budget_ns;
}

#endif
