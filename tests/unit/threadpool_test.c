/* threadpool_test.c - fork/join pool: coverage of every share, many runs,
 * sleeping workers, sizes and the range splitter. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpud/backend/cpu/threadpool.h"

#define MAXT 8

struct count_arg {
	_Atomic int calls[MAXT];
	_Atomic int bad_nth;
	_Atomic int bad_caller;
	int expect_nth;
	pthread_t caller;
	long slot[MAXT]; /* plain writes, read by the caller after the run */
	long run;
};

static void count_fn(void *p, int ith, int nth)
{
	struct count_arg *a = p;

	if (nth != a->expect_nth || ith < 0 || ith >= nth || ith >= MAXT) {
		atomic_fetch_add(&a->bad_nth, 1);
		return;
	}
	if (ith == 0 && !pthread_equal(pthread_self(), a->caller))
		atomic_fetch_add(&a->bad_caller, 1);
	if (ith != 0 && pthread_equal(pthread_self(), a->caller))
		atomic_fetch_add(&a->bad_caller, 1);
	atomic_fetch_add(&a->calls[ith], 1);
	a->slot[ith] = a->run * 100 + ith;
}

static void check_runs(int n_threads, int runs, int sleep_every)
{
	struct gpud_tp *tp = NULL;
	struct count_arg a;

	memset(&a, 0, sizeof(a));
	assert_int_equal(gpud_tp_create(&tp, n_threads), 0);
	assert_non_null(tp);
	assert_int_equal(gpud_tp_size(tp), n_threads);
	a.expect_nth = n_threads;
	a.caller = pthread_self();
	for (int r = 0; r < runs; r++) {
		a.run = r;
		gpud_tp_run(tp, count_fn, &a);
		/* Every share finished and its writes are visible on return. */
		for (int i = 0; i < n_threads; i++) {
			assert_int_equal(atomic_load(&a.calls[i]), r + 1);
			assert_int_equal(a.slot[i], r * 100 + i);
		}
		if (sleep_every && r % sleep_every == 0) {
			/* Long enough for the workers to leave the spin and sleep
			 * on the futex: the next run must wake them. */
			struct timespec ts = { 0, 3 * 1000 * 1000 };

			nanosleep(&ts, NULL);
		}
	}
	assert_int_equal(atomic_load(&a.bad_nth), 0);
	assert_int_equal(atomic_load(&a.bad_caller), 0);
	for (int i = n_threads; i < MAXT; i++)
		assert_int_equal(atomic_load(&a.calls[i]), 0);
	gpud_tp_destroy(tp);
}

static void test_every_share_once(void **state)
{
	(void)state;
	for (int n = 1; n <= 4; n++)
		check_runs(n, 500, 0);
}

static void test_wake_after_sleep(void **state)
{
	(void)state;
	check_runs(3, 40, 1);
	check_runs(2, 40, 4);
}

static void test_pool_of_one_runs_on_caller(void **state)
{
	(void)state;
	check_runs(1, 10, 0);
}

static void test_default_size_is_ncpu(void **state)
{
	struct gpud_tp *tp = NULL;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

	(void)state;
	assert_int_equal(gpud_tp_create(&tp, 0), 0);
	assert_int_equal(gpud_tp_size(tp), ncpu > 0 ? ncpu : 1);
	gpud_tp_destroy(tp);
	assert_int_equal(gpud_tp_create(&tp, -3), 0);
	assert_int_equal(gpud_tp_size(tp), ncpu > 0 ? ncpu : 1);
	gpud_tp_destroy(tp);
}

static void test_too_many_threads(void **state)
{
	struct gpud_tp *tp = (struct gpud_tp *)&tp; /* must be cleared */

	(void)state;
	assert_int_equal(gpud_tp_create(&tp, 100000), -EINVAL);
	assert_null(tp);
}

static void test_null_pool(void **state)
{
	struct count_arg a;

	(void)state;
	gpud_tp_destroy(NULL);
	assert_int_equal(gpud_tp_size(NULL), 1);
	memset(&a, 0, sizeof(a));
	a.expect_nth = 1;
	a.caller = pthread_self();
	gpud_tp_run(NULL, count_fn, &a);
	assert_int_equal(atomic_load(&a.calls[0]), 1);
	assert_int_equal(atomic_load(&a.bad_nth), 0);
	assert_int_equal(atomic_load(&a.bad_caller), 0);
}

struct sum_arg {
	const int *v;
	long n;
	long part[MAXT];
};

static void sum_fn(void *p, int ith, int nth)
{
	struct sum_arg *a = p;
	long lo, hi, s = 0;

	gpud_tp_range(a->n, ith, nth, 16, &lo, &hi);
	for (long i = lo; i < hi; i++)
		s += a->v[i];
	a->part[ith] = s;
}

static void test_parallel_sum(void **state)
{
	static int v[10007];
	struct gpud_tp *tp;
	struct sum_arg a = { .v = v, .n = 10007 };
	long want = 0;

	(void)state;
	for (int i = 0; i < 10007; i++) {
		v[i] = (i * 7919) % 1000 - 500;
		want += v[i];
	}
	assert_int_equal(gpud_tp_create(&tp, 4), 0);
	for (int r = 0; r < 200; r++) {
		long got = 0;

		memset(a.part, 0, sizeof(a.part));
		gpud_tp_run(tp, sum_fn, &a);
		for (int i = 0; i < 4; i++)
			got += a.part[i];
		assert_int_equal(got, want);
	}
	gpud_tp_destroy(tp);
}

static void test_range_covers(void **state)
{
	static const long ns[] = { 0, 1, 15, 16, 17, 100, 768, 32000, 32001 };
	static const long aligns[] = { 1, 4, 16, 64 };

	(void)state;
	for (size_t k = 0; k < sizeof(ns) / sizeof(ns[0]); k++) {
		for (size_t j = 0; j < sizeof(aligns) / sizeof(aligns[0]); j++) {
			for (int nth = 1; nth <= 7; nth++) {
				long next = 0, lo, hi;

				for (int ith = 0; ith < nth; ith++) {
					gpud_tp_range(ns[k], ith, nth, aligns[j], &lo, &hi);
					assert_true(lo <= hi);
					assert_int_equal(lo, next); /* contiguous, in order */
					if (lo < ns[k])
						assert_int_equal(lo % aligns[j], 0);
					next = hi;
				}
				assert_int_equal(next, ns[k]);
			}
		}
	}
}

/* Split runs: every item claimed by one thread, once; pieces on
 * multiples of align; a thread's own pieces in order from the front of
 * its share. `idle` threads claim nothing, so that the others must take
 * their shares from the back (deterministically). */
#define SPLIT_MAX 40000
struct split_arg {
	struct gpud_tp *tp;
	long n, align;
	unsigned idle; /* bit ith: that thread claims nothing */
	_Atomic unsigned char *owner; /* (n): 1 + the claiming thread */
	_Atomic int bad;
	long items[MAXT];
	long stolen[MAXT];
};

static void split_fn(void *p, int ith, int nth)
{
	struct split_arg *a = p;
	long lo, hi, own_lo, own_hi, next, units = (a->n + a->align - 1) / a->align, ul, uh;

	if (a->idle & 1u << ith)
		return;
	gpud_tp_range(units, ith, nth, 1, &ul, &uh);
	own_lo = ul * a->align;
	own_hi = uh * a->align < a->n ? uh * a->align : a->n;
	next = own_lo;
	while (gpud_tp_claim(a->tp, ith, &lo, &hi)) {
		if (lo >= hi || lo % a->align || hi > a->n || (hi != a->n && hi % a->align))
			atomic_fetch_add(&a->bad, 1);
		if (lo >= own_lo && lo < own_hi) {
			if (lo != next) /* own pieces: front to back */
				atomic_fetch_add(&a->bad, 1);
			next = hi;
		} else {
			a->stolen[ith] += hi - lo;
		}
		for (long i = lo; i < hi && i < a->n; i++) {
			unsigned char z = 0;

			if (!atomic_compare_exchange_strong(&a->owner[i], &z,
							    (unsigned char)(1 + ith)))
				atomic_fetch_add(&a->bad, 1); /* claimed twice */
		}
		a->items[ith] += hi - lo;
	}
}

static void check_split(int nth, long n, long align, unsigned idle)
{
	static _Atomic unsigned char owner[SPLIT_MAX];
	struct split_arg a = { .n = n, .align = align, .idle = idle, .owner = owner };
	long sum = 0;

	assert_true(n <= SPLIT_MAX);
	assert_int_equal(gpud_tp_create(&a.tp, nth), 0);
	for (int r = 0; r < 3; r++) {
		for (long i = 0; i < n; i++)
			atomic_store(&owner[i], 0);
		memset(a.items, 0, sizeof(a.items));
		memset(a.stolen, 0, sizeof(a.stolen));
		gpud_tp_split(a.tp, n, align);
		gpud_tp_run(a.tp, split_fn, &a);
		assert_int_equal(atomic_load(&a.bad), 0);
		sum = 0;
		for (int t = 0; t < nth; t++) {
			sum += a.items[t];
			if (idle & 1u << t)
				assert_int_equal(a.items[t], 0);
		}
		for (long i = 0; i < n; i++)
			assert_int_not_equal(atomic_load(&owner[i]), 0); /* every item */
		assert_int_equal(sum, n);
		if (idle) {
			/* the idle threads' shares went to the others */
			long stolen = 0;

			for (int t = 0; t < nth; t++)
				stolen += a.stolen[t];
			for (int t = 0; t < nth; t++)
				if (idle & 1u << t) {
					long ul, uh;

					gpud_tp_range((n + align - 1) / align, t, nth, 1, &ul, &uh);
					stolen -= (uh * align < n ? uh * align : n) - ul * align;
				}
			assert_true(stolen >= 0);
		}
	}
	gpud_tp_destroy(a.tp);
}

static void test_split_claims(void **state)
{
	(void)state;
	check_split(2, 3072, 16, 0);
	check_split(2, 5120 + 7, 16, 0);
	check_split(3, 1, 16, 0);
	check_split(4, 32000, 16, 0);
	check_split(7, 100, 1, 0);
	/* one thread does nothing: the others take all of its share */
	check_split(2, 8192, 16, 2u);
	check_split(2, 8192, 16, 1u);
	check_split(4, 4099, 8, 1u << 3 | 1u << 1);
	check_split(3, 17, 16, 1u << 2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_every_share_once),
		cmocka_unit_test(test_wake_after_sleep),
		cmocka_unit_test(test_pool_of_one_runs_on_caller),
		cmocka_unit_test(test_default_size_is_ncpu),
		cmocka_unit_test(test_too_many_threads),
		cmocka_unit_test(test_null_pool),
		cmocka_unit_test(test_parallel_sum),
		cmocka_unit_test(test_range_covers),
		cmocka_unit_test(test_split_claims),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
