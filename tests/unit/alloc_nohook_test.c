/* alloc_nohook_test.c - the counters without gpud/alloc_hook.c linked:
 * hooked() and hook_linked() are false and host counts stay 0 however
 * much the process allocates; device notes and the warm-up mark still
 * work. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "gpud/alloc.h"

static void *(*volatile v_malloc)(size_t) = malloc;

static void test_not_hooked(void **state)
{
	struct gpud_alloc_counts c;
	void *p[8];

	(void)state;
	assert_false(gpud_alloc_hooked());
	assert_false(gpud_alloc_hook_linked());
	for (int r = 0; r < GPUD_ALLOC_ROLES; r++) {
		gpud_alloc_set_role((enum gpud_alloc_role)r);
		for (int i = 0; i < 8; i++)
			p[i] = v_malloc(64);
		for (int i = 0; i < 8; i++)
			free(p[i]);
	}
	gpud_alloc_set_role(GPUD_ALLOC_OTHER);
	gpud_alloc_counts(&c);
	for (int r = 0; r < GPUD_ALLOC_ROLES; r++) {
		assert_int_equal(c.host_allocs[r], 0);
		assert_int_equal(c.host_frees[r], 0);
		assert_int_equal(c.host_bytes[r], 0);
	}
	assert_int_equal(gpud_alloc_host_allocs(), 0);
	gpud_alloc_device_note(0, 5);
	gpud_alloc_warmup_done();
	gpud_alloc_device_note(0, 6);
	gpud_alloc_since_warmup(&c);
	assert_int_equal(c.device_allocs, 1);
	assert_int_equal(c.device_bytes, 6);
	assert_int_equal(c.host_allocs[GPUD_ALLOC_OTHER], 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_not_hooked),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
