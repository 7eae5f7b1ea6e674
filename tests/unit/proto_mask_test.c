/* proto_mask_test.c - the mask descriptor's rules (proto/mask.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "proto/mask.h"
#include "tests/unit/test_desc.h"

static void test_validate_ok(void **state)
{
	(void)state;
	struct desc_buf *b = malloc(sizeof(*b));
	char err[SW_ERR_MAX] = "";
	struct proto_mask_desc none = { .n_segments = 5, .rows = NULL };

	assert_int_equal(proto_mask_validate(&none, 64, err, sizeof(err)), 0);
	desc_all(b, 4);
	assert_int_equal(proto_mask_validate(&b->d, 64, err, sizeof(err)), 0);
	/* empty rows are fine (self is implicit), duplicates too */
	desc_init(b, 3);
	desc_add(b, 2, 0);
	desc_add(b, 2, 0);
	assert_int_equal(proto_mask_validate(&b->d, 64, err, sizeof(err)), 0);
	/* no segments: G's row alone */
	desc_init(b, 0);
	desc_add(b, 0, 0);
	assert_int_equal(proto_mask_validate(&b->d, 64, err, sizeof(err)), 0);
	/* exactly the maximum */
	desc_all(b, 64);
	assert_int_equal(proto_mask_validate(&b->d, 64, err, sizeof(err)), 0);
	/* 0, or a value over the hard limit, means the hard limit */
	desc_all(b, PROTO_MAX_SEGMENTS);
	assert_int_equal(proto_mask_validate(&b->d, 0, err, sizeof(err)), 0);
	assert_int_equal(proto_mask_validate(&b->d, 1000, err, sizeof(err)), 0);
	free(b);
}

static void test_validate_errors(void **state)
{
	(void)state;
	struct desc_buf *b = malloc(sizeof(*b));
	char err[SW_ERR_MAX];

	/* too many segments */
	desc_all(b, 65);
	assert_int_equal(proto_mask_validate(&b->d, 64, err, sizeof(err)), SW_ETOOLONG);
	assert_string_equal(err, "mask: 65 segments exceed the maximum of 64");
	desc_init(b, PROTO_MAX_SEGMENTS + 1);
	b->d.rows = NULL;
	assert_int_equal(proto_mask_validate(&b->d, 1000, err, sizeof(err)), SW_ETOOLONG);
	assert_non_null(strstr(err, "maximum of 127"));
	assert_int_equal(proto_mask_validate(&b->d, 0, NULL, 0), SW_ETOOLONG);

	/* forward reference: row 1 names segment 2 */
	desc_all(b, 3);
	desc_add(b, 1, 2);
	assert_int_equal(proto_mask_validate(&b->d, 64, err, sizeof(err)), SW_EFORMAT);
	assert_string_equal(err, "mask: row 1, entry 2: forward reference to segment 2");

	/* index out of range (beyond G), reported as such even where it is
	 * also forward */
	desc_all(b, 3);
	desc_add(b, 3, 9);
	assert_int_equal(proto_mask_validate(&b->d, 64, err, sizeof(err)), SW_EFORMAT);
	assert_string_equal(err, "mask: row 3, entry 4: segment 9 out of range (0..3)");
	desc_all(b, 3);
	desc_add(b, 0, 0xFFFF);
	assert_int_equal(proto_mask_validate(&b->d, 64, err, sizeof(err)), SW_EFORMAT);
	assert_string_equal(err, "mask: row 0, entry 1: segment 65535 out of range (0..3)");
	/* G's own index is in range; past it is not */
	desc_all(b, 3);
	desc_add(b, 3, 4);
	assert_int_equal(proto_mask_validate(&b->d, 64, NULL, 0), SW_EFORMAT);

	/* a row with a count and no index array is the caller's mistake */
	desc_all(b, 2);
	b->rows[1].idx = NULL;
	assert_int_equal(proto_mask_validate(&b->d, 64, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "mask: row 1: 2 indices but no index array");
	b->rows[1].n = 0; /* no count: nothing to read */
	assert_int_equal(proto_mask_validate(&b->d, 64, err, sizeof(err)), 0);

	assert_int_equal(proto_mask_validate(NULL, 64, err, sizeof(err)), -EINVAL);
	free(b);
}

/* Validation reads and never writes. */
static void test_validate_reads_only(void **state)
{
	(void)state;
	struct desc_buf *b = malloc(sizeof(*b));
	struct desc_buf *copy = malloc(sizeof(*copy));

	desc_all(b, 5);
	desc_add(b, 2, 4);
	memcpy(copy, b, sizeof(*b));
	assert_int_equal(proto_mask_validate(&b->d, 64, NULL, 0), SW_EFORMAT);
	assert_memory_equal(b->idx, copy->idx, sizeof(b->idx));
	assert_int_equal(b->d.n_segments, 5);
	free(copy);
	free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_validate_ok),
		cmocka_unit_test(test_validate_errors),
		cmocka_unit_test(test_validate_reads_only),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
