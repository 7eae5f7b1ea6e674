/* utf8_test.c - common/utf8: every length, and each way a byte sequence
 * fails to be a character (overlong, surrogate, past U+10FFFF, cut short,
 * a stray or missing continuation byte). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/utf8.h"

#define U(s) ((const unsigned char *)(s))

static size_t ch(const char *s, size_t n)
{
	return sw_utf8_char(U(s), n);
}

static void test_valid(void **state)
{
	(void)state;
	assert_int_equal(ch("a", 1), 1);
	assert_int_equal(ch("\0", 1), 1);            /* NUL is a character here */
	assert_int_equal(ch("\x7f", 1), 1);
	assert_int_equal(ch("\xc2\x80", 2), 2);      /* U+0080, the first of 2 */
	assert_int_equal(ch("\xdf\xbf", 2), 2);      /* U+07FF */
	assert_int_equal(ch("\xe0\xa0\x80", 3), 3);  /* U+0800 */
	assert_int_equal(ch("\xed\x9f\xbf", 3), 3);  /* U+D7FF, below the surrogates */
	assert_int_equal(ch("\xee\x80\x80", 3), 3);  /* U+E000, above them */
	assert_int_equal(ch("\xef\xbf\xbf", 3), 3);  /* U+FFFF */
	assert_int_equal(ch("\xf0\x90\x80\x80", 4), 4); /* U+10000 */
	assert_int_equal(ch("\xf4\x8f\xbf\xbf", 4), 4); /* U+10FFFF */
	assert_int_equal(ch("\xc3\xa9xyz", 5), 2);   /* only the first character */
}

static void test_invalid(void **state)
{
	(void)state;
	assert_int_equal(ch("\x80", 1), 0);             /* stray continuation */
	assert_int_equal(ch("\xbf", 1), 0);
	assert_int_equal(ch("\xc0\x80", 2), 0);         /* overlong NUL */
	assert_int_equal(ch("\xc1\xbf", 2), 0);         /* overlong U+007F */
	assert_int_equal(ch("\xe0\x9f\xbf", 3), 0);     /* overlong U+07FF */
	assert_int_equal(ch("\xf0\x8f\xbf\xbf", 4), 0); /* overlong U+FFFF */
	assert_int_equal(ch("\xed\xa0\x80", 3), 0);     /* U+D800 */
	assert_int_equal(ch("\xed\xbf\xbf", 3), 0);     /* U+DFFF */
	assert_int_equal(ch("\xf4\x90\x80\x80", 4), 0); /* U+110000 */
	assert_int_equal(ch("\xf8\x88\x80\x80\x80", 5), 0); /* 5-byte form */
	assert_int_equal(ch("\xff", 1), 0);
	assert_int_equal(ch("\xc3", 1), 0);             /* cut short */
	assert_int_equal(ch("\xe2\x82", 2), 0);
	assert_int_equal(ch("\xf0\x9f\x98", 3), 0);
	assert_int_equal(ch("\xc3\x28", 2), 0);         /* continuation missing */
	assert_int_equal(ch("\xe2\x28\xa1", 3), 0);
	assert_int_equal(ch("\xf0\x9f\x28\x80", 4), 0);
}

static void test_invalid_at(void **state)
{
	static const char ok[] = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
	static const char mid[] = "ab\xc3\xa9\xed\xa0\x80zz";
	static const char end[] = "abc\xe2\x82";

	(void)state;
	assert_int_equal(sw_utf8_invalid_at(U(ok), strlen(ok)), strlen(ok));
	assert_int_equal(sw_utf8_invalid_at(U(""), 0), 0);
	assert_int_equal(sw_utf8_invalid_at(U(mid), strlen(mid)), 4);
	assert_int_equal(sw_utf8_invalid_at(U(end), strlen(end)), 3);
	assert_int_equal(sw_utf8_invalid_at(U("a\0b"), 3), 3); /* NULs are the caller's */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_valid),
		cmocka_unit_test(test_invalid),
		cmocka_unit_test(test_invalid_at),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
