/* unicode_test.c - UTF-8 coding and the generated class table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gpud/unicode.h"

static void test_roundtrip_every_code_point(void **state)
{
	(void)state;
	for (uint32_t cp = 0; cp <= GPUD_UC_MAX; cp++) {
		uint8_t b[4];
		uint32_t back = 0;
		size_t n = gpud_utf8_encode(cp, b);
		if (cp >= 0xD800 && cp <= 0xDFFF) {
			assert_int_equal(n, 3); /* written as U+FFFD */
			assert_memory_equal(b, "\xEF\xBF\xBD", 3);
			continue;
		}
		assert_int_equal(n, cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
		assert_int_equal(gpud_utf8_seq_len(b[0]), n);
		assert_int_equal(gpud_utf8_decode(b, n, &back), n);
		assert_int_equal(back, cp);
		for (size_t k = 1; k < n; k++)
			assert_true(gpud_utf8_is_partial(b, k));
		assert_false(gpud_utf8_is_partial(b, n));
		assert_int_equal(gpud_utf8_lead_len(b[0]), n);
	}
	uint8_t b[4];
	assert_int_equal(gpud_utf8_encode(0x110000, b), 3);
	assert_memory_equal(b, "\xEF\xBF\xBD", 3);
}

static void check_bad(const char *s, size_t len)
{
	uint32_t cp = 0;
	assert_int_equal(gpud_utf8_decode((const uint8_t *)s, len, &cp), 1);
	assert_int_equal(cp, GPUD_UC_REPLACEMENT);
}

static void test_malformed(void **state)
{
	(void)state;
	check_bad("\x80", 1);             /* stray continuation */
	check_bad("\xBF\x80", 2);
	check_bad("\xC0\x80", 2);         /* overlong NUL */
	check_bad("\xC1\xBF", 2);         /* overlong */
	check_bad("\xE0\x80\x80", 3);     /* overlong 3-byte */
	check_bad("\xF0\x80\x80\x80", 4); /* overlong 4-byte */
	check_bad("\xED\xA0\x80", 3);     /* surrogate D800 */
	check_bad("\xF4\x90\x80\x80", 4); /* above U+10FFFF */
	check_bad("\xF5\x80\x80\x80", 4);
	check_bad("\xFF", 1);
	check_bad("\xC3", 1);             /* truncated */
	check_bad("\xE2\x96", 2);
	check_bad("\xE2\x41\x81", 3);     /* bad continuation */
	check_bad("\xF0\x9F\x98\x41", 4);

	assert_false(gpud_utf8_is_partial((const uint8_t *)"\xC0", 1));
	assert_false(gpud_utf8_is_partial((const uint8_t *)"\x80", 1));
	assert_false(gpud_utf8_is_partial((const uint8_t *)"A", 1));
	assert_false(gpud_utf8_is_partial((const uint8_t *)"\xED\xA0", 2));
	assert_false(gpud_utf8_is_partial((const uint8_t *)"\xE2\x41", 2));
	assert_true(gpud_utf8_is_partial((const uint8_t *)"\xED\x9F", 2));
	assert_true(gpud_utf8_is_partial((const uint8_t *)"\xF0\x9F\x98", 3));
	assert_false(gpud_utf8_is_partial((const uint8_t *)"\xF0\x9F\x41", 3));
	assert_int_equal(gpud_utf8_seq_len(0x80), 0);
	assert_int_equal(gpud_utf8_seq_len(0xC1), 0);
	assert_int_equal(gpud_utf8_seq_len(0xF5), 0);
	assert_int_equal(gpud_utf8_lead_len(0x80), 1); /* SentencePiece split */
	assert_int_equal(gpud_utf8_lead_len(0xFF), 4);

	/* A decode loop covers every byte exactly once. */
	const char *mix = "a\xC3\xA4\xFF\xE2\x96\x81\xE2\x96z";
	size_t len = strlen(mix), i = 0, steps = 0;
	uint32_t cps[16];
	while (i < len) {
		i += gpud_utf8_decode((const uint8_t *)mix + i, len - i, &cps[steps]);
		steps++;
	}
	assert_int_equal(i, len);
	assert_int_equal(steps, 7);
	assert_int_equal(cps[0], 'a');
	assert_int_equal(cps[1], 0xE4);
	assert_int_equal(cps[2], GPUD_UC_REPLACEMENT);
	assert_int_equal(cps[3], 0x2581);
	assert_int_equal(cps[4], GPUD_UC_REPLACEMENT);
	assert_int_equal(cps[5], GPUD_UC_REPLACEMENT);
	assert_int_equal(cps[6], 'z');
}

static void test_classes(void **state)
{
	(void)state;
	assert_string_equal(gpud_unicode_version, "14.0.0");
	/* letters: Lu, Ll, Lo, Lm, Lt */
	assert_true(gpud_uc_is_letter('A'));
	assert_true(gpud_uc_is_letter('z'));
	assert_true(gpud_uc_is_letter(0x00C4)); /* Ä */
	assert_true(gpud_uc_is_letter(0x0436)); /* ж */
	assert_true(gpud_uc_is_letter(0x6211)); /* 我 */
	assert_true(gpud_uc_is_letter(0x1780)); /* Khmer KA */
	assert_true(gpud_uc_is_letter(0x02B0)); /* modifier letter (Lm) */
	assert_true(gpud_uc_is_letter(0x01C5)); /* Dž (Lt) */
	assert_false(gpud_uc_is_letter(0x17B6)); /* Khmer vowel sign (Mc) */
	assert_int_equal(gpud_uc_class(0x17B6), GPUD_UC_MARK);
	assert_int_equal(gpud_uc_class(0x0301), GPUD_UC_MARK);
	/* numbers: Nd, Nl, No */
	assert_true(gpud_uc_is_number('0'));
	assert_true(gpud_uc_is_number('9'));
	assert_true(gpud_uc_is_number(0x00BD)); /* ½ (No) */
	assert_true(gpud_uc_is_number(0x2162)); /* Roman numeral three (Nl) */
	assert_true(gpud_uc_is_number(0x0663)); /* Arabic-Indic three */
	assert_false(gpud_uc_is_number('a'));
	/* White_Space, not Python's isspace() */
	const uint32_t ws[] = { 9, 10, 11, 12, 13, 32, 0x85, 0xA0, 0x1680, 0x2000, 0x200A,
				0x2028, 0x2029, 0x202F, 0x205F, 0x3000 };
	for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
		assert_true(gpud_uc_is_space(ws[i]));
	const uint32_t not_ws[] = { 0, 8, 14, 0x1C, 0x1D, 0x1E, 0x1F, 0x200B, 0x200D, 0x180E,
				    0xFEFF, 'a', 0x2581 };
	for (size_t i = 0; i < sizeof(not_ws) / sizeof(not_ws[0]); i++)
		assert_false(gpud_uc_is_space(not_ws[i]));
	/* the rest */
	assert_int_equal(gpud_uc_class('!'), GPUD_UC_PUNCT);
	assert_int_equal(gpud_uc_class('$'), GPUD_UC_SYMBOL);
	assert_int_equal(gpud_uc_class(0x1F999), GPUD_UC_SYMBOL); /* llama emoji */
	assert_int_equal(gpud_uc_class(' '), GPUD_UC_SEP);
	assert_int_equal(gpud_uc_class('\n'), GPUD_UC_OTHER);
	assert_int_equal(gpud_uc_class(0x200D), GPUD_UC_OTHER); /* ZWJ (Cf) */
	assert_int_equal(gpud_uc_class(0xE000), GPUD_UC_OTHER); /* private use */
	assert_int_equal(gpud_uc_class(0x10FFFF), GPUD_UC_OTHER);
	assert_int_equal(gpud_uc_class(0x110000), GPUD_UC_OTHER); /* out of range */
	assert_int_equal(gpud_uc_bits(0xFFFFFFFF), 0);
	assert_int_equal(gpud_uc_bits(' '), GPUD_UC_SEP | GPUD_UC_WS);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roundtrip_every_code_point),
		cmocka_unit_test(test_malformed),
		cmocka_unit_test(test_classes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
