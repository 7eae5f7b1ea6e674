/* chunk_test.c - the chunk-KV cache index (gpud/chunk.h) alone: hits are
 * verified on the tokens, entries keep their blocks until they leave (and
 * give each back exactly once), the byte bound evicts least recently used
 * first, a pinned hit is never evicted, duplicates and misfits are refused
 * with nothing changed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "gpud/chunk.h"

#define BT 4
#define NB 16

static uint32_t released[NB];

static void release(void *ctx, uint32_t block)
{
	(void)ctx;
	assert_true(block < NB);
	released[block]++;
}

static struct gpud_chunk *mk(uint32_t pages)
{
	struct gpud_chunk *c;
	struct gpud_chunk_params p = { .block_tokens = BT, .block_bytes = 100,
				       .max_bytes = pages * 100 + 99, .max_blocks = NB,
				       .release = release };

	memset(released, 0, sizeof(released));
	assert_int_equal(gpud_chunk_create(&c, &p), 0);
	return c;
}

static void test_find_insert(void **state)
{
	struct gpud_chunk *c = mk(8);
	const int32_t a[6] = { 1, 2, 3, 4, 5, 6 }, b[6] = { 1, 2, 3, 4, 5, 7 };
	const uint32_t blk[2] = { 3, 9 };
	uint32_t got[2];
	struct gpud_chunk_hit h;
	struct gpud_chunk_stats st;

	(void)state;
	assert_int_equal(gpud_chunk_find(c, a, 6, &h, got), SW_ENOTFOUND);
	assert_int_equal(gpud_chunk_insert(c, a, 6, 17, blk), 0);
	assert_true(gpud_chunk_holds(c, 3) && gpud_chunk_holds(c, 9) && !gpud_chunk_holds(c, 4));
	assert_int_equal(gpud_chunk_insert(c, a, 6, 0, (uint32_t[]){ 1, 2 }), -EEXIST);
	assert_false(gpud_chunk_holds(c, 1));
	/* the same prefix of tokens, another length or last token: misses */
	assert_int_equal(gpud_chunk_find(c, a, 5, &h, got), SW_ENOTFOUND);
	assert_int_equal(gpud_chunk_find(c, b, 6, &h, got), SW_ENOTFOUND);
	assert_false(gpud_chunk_contains(c, b, 6));
	assert_true(gpud_chunk_contains(c, a, 6));
	assert_int_equal(gpud_chunk_find(c, a, 6, &h, got), 0);
	assert_int_equal(h.pos0, 17);
	assert_int_equal(h.n_blocks, 2);
	assert_int_equal(got[0], 3);
	assert_int_equal(got[1], 9);
	gpud_chunk_unpin(c, &h);
	gpud_chunk_account(c, 1, 6, 2);
	gpud_chunk_stats(c, &st);
	assert_int_equal(st.hits, 1);
	assert_int_equal(st.hit_tokens, 6);
	assert_int_equal(st.misses, 2);
	assert_int_equal(st.entries, 1);
	assert_int_equal(st.blocks, 2);
	assert_int_equal(st.bytes, 200);
	assert_int_equal(st.max_bytes, 800);
	/* a block out of range or held already: refused */
	assert_int_equal(gpud_chunk_insert(c, b, 6, 0, (uint32_t[]){ 9, 10 }), -EINVAL);
	assert_int_equal(gpud_chunk_insert(c, b, 6, 0, (uint32_t[]){ 10, NB }), -EINVAL);
	assert_int_equal(gpud_chunk_insert(c, a, 0, 0, blk), -EINVAL);
	gpud_chunk_destroy(c);
	assert_int_equal(released[3], 1);
	assert_int_equal(released[9], 1);
	assert_int_equal(released[10], 0);
}

static void test_bound_lru_pin(void **state)
{
	struct gpud_chunk *c = mk(4);
	int32_t t[4][8];
	uint32_t got[2];
	struct gpud_chunk_hit h;
	struct gpud_chunk_stats st;

	(void)state;
	for (int i = 0; i < 4; i++)
		for (int j = 0; j < 8; j++)
			t[i][j] = i * 100 + j;
	/* two entries of 2 blocks fill the bound of 4 */
	assert_int_equal(gpud_chunk_make_room(c, 2), 0);
	assert_int_equal(gpud_chunk_insert(c, t[0], 8, 0, (uint32_t[]){ 0, 1 }), 0);
	assert_int_equal(gpud_chunk_make_room(c, 2), 0);
	assert_int_equal(gpud_chunk_insert(c, t[1], 8, 0, (uint32_t[]){ 2, 3 }), 0);
	/* no room without make_room */
	assert_int_equal(gpud_chunk_insert(c, t[2], 5, 0, (uint32_t[]){ 4, 5 }), SW_ETOOLONG);
	assert_int_equal(released[4] + released[5], 0);
	/* t[0] used: t[1] is the least recent and goes */
	assert_int_equal(gpud_chunk_find(c, t[0], 8, &h, got), 0);
	gpud_chunk_unpin(c, &h);
	assert_int_equal(gpud_chunk_make_room(c, 1), 0);
	assert_int_equal(released[2] + released[3], 2);
	assert_int_equal(gpud_chunk_insert(c, t[2], 3, 0, (uint32_t[]){ 4 }), 0);
	/* pinned t[0] stays: room for 3 more would need it */
	assert_int_equal(gpud_chunk_find(c, t[0], 8, &h, got), 0);
	assert_int_equal(gpud_chunk_make_room(c, 3), SW_ETOOLONG);
	assert_int_equal(released[4], 0); /* nothing evicted in vain */
	assert_int_equal(gpud_chunk_make_room(c, 5), SW_ETOOLONG);
	assert_int_equal(gpud_chunk_make_room(c, 2), 0); /* t[2] goes */
	assert_int_equal(released[4], 1);
	assert_int_equal(gpud_chunk_evict(c), SW_ENOTFOUND); /* only the pinned one */
	gpud_chunk_unpin(c, &h);
	assert_int_equal(gpud_chunk_evict(c), 0);
	assert_int_equal(released[0] + released[1], 2);
	gpud_chunk_stats(c, &st);
	assert_int_equal(st.entries, 0);
	assert_int_equal(st.blocks, 0);
	assert_int_equal(st.evictions, 3);
	gpud_chunk_destroy(c);
	for (int b = 0; b < 5; b++)
		assert_int_equal(released[b], 1);
	assert_int_equal(released[5], 0);
}

static void test_create_errors(void **state)
{
	struct gpud_chunk *c = (void *)1;
	struct gpud_chunk_params p = { .block_tokens = BT, .block_bytes = 100, .max_bytes = 99,
				       .max_blocks = NB, .release = release };

	(void)state;
	assert_int_equal(gpud_chunk_create(&c, &p), -EINVAL); /* no whole block */
	assert_null(c);
	p.max_bytes = 1000;
	p.release = NULL;
	assert_int_equal(gpud_chunk_create(&c, &p), -EINVAL);
	p.release = release;
	p.block_tokens = 0;
	assert_int_equal(gpud_chunk_create(&c, &p), -EINVAL);
	gpud_chunk_destroy(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_find_insert),
		cmocka_unit_test(test_bound_lru_pin),
		cmocka_unit_test(test_create_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
