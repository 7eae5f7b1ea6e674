/* err_test.c - error names, messages and sw_seterr. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"

static void test_own_codes(void **state)
{
	(void)state;
	assert_string_equal(sw_errname(SW_EFORMAT), "SW_EFORMAT");
	assert_string_equal(sw_strerror(SW_EEXHAUSTED), "pool exhausted");
	assert_string_equal(sw_strerror(0), "success");
	/* every code up to SW_ELAST has a name */
	for (int c = SW_EBASE - 1; c > SW_ELAST; c--)
		assert_string_not_equal(sw_errname(c), "SW_EUNKNOWN");
}

static void test_errno_codes(void **state)
{
	(void)state;
	assert_string_equal(sw_errname(-ENOMEM), "ENOMEM");
	assert_string_equal(sw_strerror(-ENOENT), strerror(ENOENT));
	assert_string_equal(sw_errname(SW_ELAST - 5), "SW_EUNKNOWN");
	assert_string_equal(sw_strerror(12345), "unknown error");
}

static void test_seterr(void **state)
{
	(void)state;
	char buf[16];
	assert_int_equal(sw_seterr(buf, sizeof(buf), SW_EFORMAT, "bad %s at %d", "magic", 7),
			 SW_EFORMAT);
	assert_string_equal(buf, "bad magic at 7");
	/* truncates, always terminated */
	sw_seterr(buf, sizeof(buf), -EINVAL, "%s", "0123456789abcdefghij");
	assert_int_equal(strlen(buf), sizeof(buf) - 1);
	/* NULL buffer is allowed */
	assert_int_equal(sw_seterr(NULL, 0, -EIO, "x"), -EIO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_own_codes),
		cmocka_unit_test(test_errno_codes),
		cmocka_unit_test(test_seterr),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
