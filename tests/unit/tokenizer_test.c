/* tokenizer_test.c - placeholder, replaced shortly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

static void test_nothing(void **state) { (void)state; }

int main(void)
{
	const struct CMUnitTest tests[] = { cmocka_unit_test(test_nothing) };
	return cmocka_run_group_tests(tests, NULL, NULL);
}
