/* threadpool.c - fork/join pool: generation counter + completion count.
 *
 * A run publishes (fn, arg), sets `pending` to the number of workers and
 * bumps `gen`. Each worker waits for `gen` to change (spinning a little,
 * then sleeping on a futex on `gen`), runs its share, and decrements
 * `pending`; the caller runs share 0 and then waits for `pending` to reach
 * zero (spinning, then sleeping on a futex on `pending`). Sleepers announce
 * themselves in a counter so the fast path needs no system call.
 */
#include "gpud/backend/cpu/threadpool.h"
#include "gpud/alloc.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Polling time before a thread sleeps: long enough to bridge the gap
 * between two kernels of one forward pass, short enough that an idle
 * daemon (or an oversubscribed machine) stops burning CPU at once. Timed
 * rather than counted: a pause lasts 10 to 150 cycles depending on the CPU.
 * 100 us, not 20: once the packed kernels made a 3B decode step ~70 ms of
 * ~200 sections, 20 us let workers fall asleep between sections often
 * enough that futex wake-ups (slow in a VM) cost 10-15% of the step;
 * bench_engine's 3B q4_0 decode went from 10.5-14.5 to 16.0-17.4 tokens/s
 * (best step; means 7.3-12.7 to 13.2-14.2), 2 threads, 2026-12-02. */
#define TP_SPIN_NS 100000
#define TP_SPIN_CHECK 32 /* pauses between two clock reads */
#define TP_MAX_THREADS 512

/* A thread's share of a split run: units [front, back) as front << 32 |
 * back, one cache line each (claims by the owner do not disturb the
 * others' lines). */
struct tp_share {
	_Alignas(64) _Atomic uint64_t fb;
};

struct tp_worker {
	struct gpud_tp *tp;
	pthread_t thread;
	int ith;
};

struct gpud_tp {
	int nth;
	/* Written by the caller before gen is bumped; read by workers after. */
	gpud_tp_fn fn;
	void *arg;
	_Atomic uint32_t gen;      /* futex word: bumped once per run */
	_Atomic uint32_t pending;  /* futex word: workers still running */
	_Atomic int gen_sleepers;  /* workers in (or entering) futex_wait(gen) */
	_Atomic int done_sleeper;  /* caller in (or entering) futex_wait(pending) */
	_Atomic int stop;
	_Atomic uint32_t starting; /* futex word: workers not yet running */
	struct tp_worker *workers; /* (nth - 1) */
	struct tp_share *shares;   /* (nth): gpud_tp_split() */
	long split_n, split_align;
};

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
	/* EAGAIN (value changed) and EINTR both mean: recheck. */
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
	syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Returns the generation that differs from seen. */
static uint32_t wait_gen(struct gpud_tp *tp, uint32_t seen)
{
	int64_t until = now_ns() + TP_SPIN_NS;
	uint32_t g;

	for (int i = 1;; i++) {
		g = atomic_load_explicit(&tp->gen, memory_order_acquire);
		if (g != seen)
			return g;
		cpu_relax();
		if (i % TP_SPIN_CHECK == 0 && now_ns() > until)
			break;
	}
	for (;;) {
		atomic_fetch_add(&tp->gen_sleepers, 1);
		/* seq_cst pairs with the caller's bump-then-read-sleepers. */
		g = atomic_load(&tp->gen);
		if (g == seen)
			futex_wait(&tp->gen, seen);
		atomic_fetch_sub(&tp->gen_sleepers, 1);
		g = atomic_load_explicit(&tp->gen, memory_order_acquire);
		if (g != seen)
			return g;
	}
}

static void *worker_main(void *p)
{
	struct tp_worker *w = p;
	struct gpud_tp *tp = w->tp;
	uint32_t seen = 0;

	gpud_alloc_set_role(GPUD_ALLOC_DEVICE); /* the step's compute threads */
	if (atomic_fetch_sub(&tp->starting, 1) == 1)
		futex_wake_all(&tp->starting);
	for (;;) {
		seen = wait_gen(tp, seen);
		if (atomic_load_explicit(&tp->stop, memory_order_acquire))
			break;
		tp->fn(tp->arg, w->ith, tp->nth);
		if (atomic_fetch_sub(&tp->pending, 1) == 1 && atomic_load(&tp->done_sleeper))
			futex_wake_all(&tp->pending);
	}
	return NULL;
}

static void wait_done(struct gpud_tp *tp)
{
	int64_t until = now_ns() + TP_SPIN_NS;
	uint32_t left;

	for (int i = 1;; i++) {
		if (atomic_load_explicit(&tp->pending, memory_order_acquire) == 0)
			return;
		cpu_relax();
		if (i % TP_SPIN_CHECK == 0 && now_ns() > until)
			break;
	}
	for (;;) {
		atomic_store(&tp->done_sleeper, 1);
		left = atomic_load(&tp->pending);
		if (left != 0)
			futex_wait(&tp->pending, left);
		atomic_store(&tp->done_sleeper, 0);
		if (atomic_load_explicit(&tp->pending, memory_order_acquire) == 0)
			return;
	}
}

static void publish(struct gpud_tp *tp)
{
	atomic_fetch_add(&tp->gen, 1); /* seq_cst: release fn/arg/pending/stop */
	if (atomic_load(&tp->gen_sleepers) > 0)
		futex_wake_all(&tp->gen);
}

static void stop_workers(struct gpud_tp *tp, int started)
{
	atomic_store(&tp->stop, 1);
	publish(tp);
	for (int i = 0; i < started; i++)
		pthread_join(tp->workers[i].thread, NULL);
}

int gpud_tp_create(struct gpud_tp **out, int n_threads)
{
	struct gpud_tp *tp;
	int started = 0, rc;

	*out = NULL;
	if (n_threads <= 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		n_threads = n > 0 ? (int)(n < TP_MAX_THREADS ? n : TP_MAX_THREADS) : 1;
	}
	if (n_threads > TP_MAX_THREADS)
		return -EINVAL;

	tp = calloc(1, sizeof(*tp));
	if (!tp)
		return -ENOMEM;
	tp->nth = n_threads;
	if (n_threads > 1) {
		tp->workers = calloc((size_t)n_threads - 1, sizeof(*tp->workers));
		tp->shares = aligned_alloc(_Alignof(struct tp_share),
					   (size_t)n_threads * sizeof(*tp->shares));
		if (!tp->workers || !tp->shares) {
			rc = -ENOMEM;
			goto out_free;
		}
		for (int i = 0; i < n_threads; i++)
			atomic_init(&tp->shares[i].fb, 0);
	}
	atomic_store(&tp->starting, (uint32_t)n_threads - 1);
	for (int i = 0; i < n_threads - 1; i++) {
		struct tp_worker *w = &tp->workers[i];

		w->tp = tp;
		w->ith = i + 1;
		rc = pthread_create(&w->thread, NULL, worker_main, w);
		if (rc) {
			rc = -rc;
			goto out_stop;
		}
		started++;
	}
	/* Returns with every worker running, so that no thread start-up
	 * overlaps the caller's first run (the sanitizers allocate in a
	 * starting thread: a test counting allocations would see it). */
	for (uint32_t left; (left = atomic_load(&tp->starting)) != 0;)
		futex_wait(&tp->starting, left);
	*out = tp;
	return 0;

out_stop:
	stop_workers(tp, started);
out_free:
	free(tp->shares);
	free(tp->workers);
	free(tp);
	return rc;
}

void gpud_tp_destroy(struct gpud_tp *tp)
{
	if (!tp)
		return;
	stop_workers(tp, tp->nth - 1);
	free(tp->shares);
	free(tp->workers);
	free(tp);
}

int gpud_tp_size(const struct gpud_tp *tp)
{
	return tp ? tp->nth : 1;
}

void gpud_tp_run(struct gpud_tp *tp, gpud_tp_fn fn, void *arg)
{
	if (!tp || tp->nth == 1) {
		fn(arg, 0, 1);
		return;
	}
	tp->fn = fn;
	tp->arg = arg;
	atomic_store_explicit(&tp->pending, (uint32_t)(tp->nth - 1), memory_order_relaxed);
	publish(tp);
	fn(arg, 0, tp->nth);
	wait_done(tp);
}

void gpud_tp_split(struct gpud_tp *tp, long n, long align)
{
	long units = (n + align - 1) / align, lo, hi;

	assert(tp && tp->nth > 1 && units <= (long)UINT32_MAX);
	tp->split_n = n;
	tp->split_align = align;
	for (int i = 0; i < tp->nth; i++) {
		gpud_tp_range(units, i, tp->nth, 1, &lo, &hi);
		/* published to the workers by gpud_tp_run()'s bump of gen */
		atomic_store_explicit(&tp->shares[i].fb, (uint64_t)lo << 32 | (uint64_t)hi,
				      memory_order_relaxed);
	}
}

/* Units [*f, *b) of a share word */
static void share_get(uint64_t v, uint64_t *f, uint64_t *b)
{
	*f = v >> 32;
	*b = v & UINT32_MAX;
}

static bool claim_units(struct gpud_tp *tp, uint64_t u0, uint64_t u1, long *lo, long *hi)
{
	long a = (long)u0 * tp->split_align, b = (long)u1 * tp->split_align;

	*lo = a;
	*hi = b < tp->split_n ? b : tp->split_n;
	return true;
}

bool gpud_tp_claim(struct gpud_tp *tp, int ith, long *lo, long *hi)
{
	_Atomic uint64_t *own = &tp->shares[ith].fb;
	uint64_t v = atomic_load_explicit(own, memory_order_relaxed), f, b, k;

	/* From the front of the own share. Relaxed: the items are the
	 * caller's, published by the run; the results go back through
	 * `pending`. */
	for (share_get(v, &f, &b); f < b; share_get(v, &f, &b)) {
		k = (b - f) / 2 ? (b - f) / 2 : 1;
		if (atomic_compare_exchange_weak_explicit(own, &v, (f + k) << 32 | b,
							  memory_order_relaxed, memory_order_relaxed))
			return claim_units(tp, f, f + k, lo, hi);
	}
	/* From the back of the others' */
	for (int d = 1; d < tp->nth; d++) {
		_Atomic uint64_t *other = &tp->shares[(ith + d) % tp->nth].fb;

		v = atomic_load_explicit(other, memory_order_relaxed);
		for (share_get(v, &f, &b); f < b; share_get(v, &f, &b)) {
			k = (b - f) / 4 ? (b - f) / 4 : 1;
			if (atomic_compare_exchange_weak_explicit(other, &v, f << 32 | (b - k),
								  memory_order_relaxed,
								  memory_order_relaxed))
				return claim_units(tp, b - k, b, lo, hi);
		}
	}
	return false;
}
