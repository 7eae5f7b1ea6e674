/* par_test.c - sw_par_ranges, sw_par_cpus (common/par.h): every iteration
 * exactly once, in contiguous ranges of ceil(n / parts) by part index,
 * empty parts never called, the part count clamped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/par.h"

struct seen {
	uint8_t hits[1000];
	uint64_t begin[SW_PAR_MAX], end[SW_PAR_MAX];
	int calls[SW_PAR_MAX];
};

static void mark(void *arg, int part, uint64_t b, uint64_t e)
{
	struct seen *s = arg;

	s->begin[part] = b;
	s->end[part] = e;
	__atomic_add_fetch(&s->calls[part], 1, __ATOMIC_RELAXED);
	for (uint64_t i = b; i < e; i++)
		s->hits[i]++; /* parts are disjoint: no two threads touch one byte */
}

static void check(uint64_t n, int parts, int want_parts)
{
	static struct seen s;
	uint64_t per = want_parts ? (n + want_parts - 1) / want_parts : 0;

	memset(&s, 0, sizeof(s));
	sw_par_ranges(n, parts, mark, &s);
	for (uint64_t i = 0; i < n; i++)
		assert_int_equal(s.hits[i], 1);
	for (int k = 0; k < SW_PAR_MAX; k++) {
		uint64_t b = (uint64_t)k * per, e = b + per;

		if (k >= want_parts || b >= n) { /* empty: never called */
			assert_int_equal(s.calls[k], 0);
			continue;
		}
		assert_int_equal(s.calls[k], 1);
		assert_int_equal(s.begin[k], b);
		assert_int_equal(s.end[k], e < n ? e : n);
	}
}

static void test_ranges(void **state)
{
	(void)state;
	check(1000, 1, 1);
	check(1000, 3, 3);
	check(1000, 7, 7);
	check(5, 8, 8);       /* fewer iterations than parts: 5 of one */
	check(1, 16, 16);
	check(999, 64, 64);
	check(999, 500, 64);  /* clamped to SW_PAR_MAX */
	check(10, 0, 1);      /* and to 1 */
	check(10, -3, 1);
	check(0, 4, 0);       /* nothing to do: no call */
}

static void test_cpus(void **state)
{
	(void)state;
	assert_true(sw_par_cpus(0) >= 1);
	assert_int_equal(sw_par_cpus(1), 1);
	assert_true(sw_par_cpus(2) >= 1 && sw_par_cpus(2) <= 2);
	/* max caps the count, no more */
	assert_int_equal(sw_par_cpus(4), sw_par_cpus(0) < 4 ? sw_par_cpus(0) : 4);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ranges),
		cmocka_unit_test(test_cpus),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
