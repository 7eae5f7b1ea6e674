/* threadpool.h - fork/join worker pool for the CPU backend.
 *
 * gpud_tp_run() runs fn(arg, ith, nth) on nth = gpud_tp_size() threads (the
 * caller is thread 0) and returns when all have finished. Threads are
 * created once; a run allocates nothing. Workers spin briefly between runs
 * and then sleep on a futex, so an idle daemon uses no CPU.
 * One run at a time per pool: the caller serializes. fn must not call
 * gpud_tp_run() on the same pool.
 */
#ifndef GPUD_THREADPOOL_H
#define GPUD_THREADPOOL_H

#include <stdbool.h>

typedef void (*gpud_tp_fn)(void *arg, int ith, int nth);

struct gpud_tp;

/* n_threads <= 0 means one per online CPU. On success *out owns the pool
 * (n_threads - 1 worker threads, all started) and 0 is returned; on failure
 * *out is NULL, every thread already started is joined, and -errno is
 * returned. */
int gpud_tp_create(struct gpud_tp **out, int n_threads);
/* Stops and joins the workers and frees the pool. Must not race with a
 * run. Accepts NULL. */
void gpud_tp_destroy(struct gpud_tp *tp);
/* Number of threads a run uses, the caller included; 1 for a NULL pool. */
int gpud_tp_size(const struct gpud_tp *tp);
/* Runs fn(arg, ith, nth) once for every ith in [0, nth) and returns when
 * all calls have returned (their writes are visible to the caller).
 * A NULL pool runs fn(arg, 0, 1) on the caller. Cannot fail. */
void gpud_tp_run(struct gpud_tp *tp, gpud_tp_fn fn, void *arg);

/* Work split with stealing, for runs whose threads may run at unequal
 * speeds (a vCPU whose neighbour takes its core, memory shared unevenly):
 * a static split makes every thread wait for the slowest at the end of
 * every run. gpud_tp_split() hands [0, n) out for the next run as
 * gpud_tp_range()'s shares (align items a unit). In the run, a thread
 * calls gpud_tp_claim() until it returns false: it gets its own share
 * from the front, in pieces of half what is left of it (at least one
 * unit), so that it reads one long stretch; with its share done it takes
 * pieces from the back of the others' shares (a quarter of what is left,
 * at least one unit). Every item goes to one thread, once, and pieces
 * start on multiples of align. Both need a pool of 2 or more threads:
 * a run on one thread (NULL pool, or fn called with nth == 1) takes
 * everything itself. Allocates nothing. */
void gpud_tp_split(struct gpud_tp *tp, long n, long align);
bool gpud_tp_claim(struct gpud_tp *tp, int ith, long *lo, long *hi);

/* Splits [0, n) into nth contiguous ranges, aligned to `align` items. */
static inline void gpud_tp_range(long n, int ith, int nth, long align, long *lo, long *hi)
{
	long chunks = (n + align - 1) / align;
	long per = (chunks + nth - 1) / nth;
	long a = (long)ith * per * align, b = a + per * align;
	*lo = a < n ? a : n;
	*hi = b < n ? b : n;
}

#endif
