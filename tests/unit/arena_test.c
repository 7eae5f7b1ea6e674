/* arena_test.c - bump allocation, alignment, exhaustion, reset, marks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/arena.h"

static void test_alloc_align(void **state)
{
	(void)state;
	struct sw_arena a;
	assert_int_equal(sw_arena_init(&a, 1000), 0);
	assert_true(a.cap >= 1000);
	void *p = sw_arena_alloc(&a, 3, 1);
	void *q = sw_arena_alloc(&a, 8, 64);
	assert_non_null(p);
	assert_non_null(q);
	assert_int_equal((uintptr_t)q % 64, 0);
	assert_true((char *)q >= (char *)p + 3);
	memset(q, 0xAB, 8);
	sw_arena_destroy(&a);
	sw_arena_destroy(&a); /* idempotent on a zeroed arena */
}

static void test_exhaustion_leaves_state(void **state)
{
	(void)state;
	char buf[128];
	struct sw_arena a;
	sw_arena_init_static(&a, buf, sizeof(buf));
	assert_non_null(sw_arena_alloc(&a, 100, 1));
	size_t used = a.used;
	assert_null(sw_arena_alloc(&a, 29, 1));
	assert_int_equal(a.used, used);
	assert_int_equal(a.fails, 1);
	assert_null(sw_arena_alloc(&a, SIZE_MAX, 1)); /* no overflow */
	assert_non_null(sw_arena_alloc(&a, 28, 1));
	assert_int_equal(a.used, sizeof(buf));
	sw_arena_reset(&a);
	assert_int_equal(a.used, 0);
	assert_int_equal(a.high, sizeof(buf));
	sw_arena_destroy(&a); /* static: must not free buf */
}

static void test_mark_rewind(void **state)
{
	(void)state;
	struct sw_arena a;
	assert_int_equal(sw_arena_init(&a, 256), 0);
	sw_arena_alloc(&a, 10, 1);
	size_t m = sw_arena_mark(&a);
	sw_arena_alloc(&a, 100, 1);
	sw_arena_rewind(&a, m);
	assert_int_equal(a.used, 10);
	sw_arena_destroy(&a);
}

static void test_zero_cap(void **state)
{
	(void)state;
	struct sw_arena a;
	assert_int_equal(sw_arena_init(&a, 0), 0);
	assert_int_equal(a.cap, 0);
	assert_null(sw_arena_alloc(&a, 1, 1));
	assert_int_equal(a.fails, 1);
	sw_arena_destroy(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_alloc_align),
		cmocka_unit_test(test_exhaustion_leaves_state),
		cmocka_unit_test(test_mark_rewind),
		cmocka_unit_test(test_zero_cap),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
