/* threadpool.h - fork/join worker pool for the CPU backend.
 *
 * gpud_tp_run() runs fn(arg, ith, nth) on nth = gpud_tp_size() threads (the
 * caller is thread 0) and returns when all have finished. Threads are
 * created once; a run allocates nothing. Workers spin briefly between runs
 * and then sleep on a futex/condvar, so an idle daemon uses no CPU.
 * One run at a time per pool: the caller serializes.
 */
#ifndef GPUD_THREADPOOL_H
#define GPUD_THREADPOOL_H

typedef void (*gpud_tp_fn)(void *arg, int ith, int nth);

struct gpud_tp;

/* n_threads <= 0 means one per online CPU. Returns 0 or -errno. */
int gpud_tp_create(struct gpud_tp **out, int n_threads);
void gpud_tp_destroy(struct gpud_tp *tp); /* accepts NULL */
int gpud_tp_size(const struct gpud_tp *tp);
void gpud_tp_run(struct gpud_tp *tp, gpud_tp_fn fn, void *arg);

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
