/* mask_test.c - descriptor compilation (gpud/mask.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gpud/mask.h"
#include "tests/unit/test_desc.h"

/* Room for any mask the tests build (127 segments, a few thousand tokens). */
static _Alignas(16) uint8_t g_mem[64 * 1024];

static void compile_ok(const struct proto_mask_desc *d, const uint32_t *lens, uint32_t bt,
		       struct gpud_mask *m)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < d->n_segments; i++)
		n += lens[i];
	size_t need = gpud_mask_bytes(d->n_segments, n, bt);
	assert_true(need <= sizeof(g_mem));
	assert_int_equal(gpud_mask_compile(d, lens, bt, g_mem, need, m), 0);
}

/* compile validates again (the rules themselves: proto_mask_test.c) */
static void test_compile_refuses_invalid(void **state)
{
	(void)state;
	struct desc_buf *b = malloc(sizeof(*b));
	struct gpud_mask m;
	uint32_t lens[3] = { 1, 1, 1 };

	desc_all(b, 3);
	desc_add(b, 0, 1); /* forward */
	assert_int_equal(gpud_mask_compile(&b->d, lens, 4, g_mem, sizeof(g_mem), &m), SW_EFORMAT);
	desc_all(b, 3);
	desc_add(b, 3, 9); /* past G */
	assert_int_equal(gpud_mask_compile(&b->d, lens, 4, g_mem, sizeof(g_mem), &m), SW_EFORMAT);
	desc_init(b, PROTO_MAX_SEGMENTS + 1);
	b->d.rows = NULL;
	assert_int_equal(gpud_mask_compile(&b->d, lens, 4, g_mem, sizeof(g_mem), &m), SW_ETOOLONG);
	free(b);
}

static void test_compile_causal(void **state)
{
	(void)state;
	struct proto_mask_desc none = { .n_segments = 3, .rows = NULL };
	uint32_t lens[3] = { 5, 0, 7 };
	struct gpud_mask m;

	compile_ok(&none, lens, 4, &m);
	assert_int_equal(m.n_segments, 3);
	assert_int_equal(m.n_prompt, 12);
	assert_int_equal(m.block_tokens, 4);
	assert_int_equal(m.n_prompt_blocks, 3);
	assert_true(m.causal);
	for (uint32_t p = 0; p < 5; p++)
		assert_int_equal(m.seg[p], 0);
	for (uint32_t p = 5; p < 12; p++)
		assert_int_equal(m.seg[p], 2);
	assert_int_equal(gpud_mask_seg(&m, 12), 3); /* G */
	assert_int_equal(gpud_mask_seg(&m, 1000), 3);
	for (unsigned i = 0; i <= 3; i++)
		for (unsigned j = 0; j < 128; j++)
			assert_int_equal(gpud_segset_has(&m.vis[i], j), j <= i);
	/* block 0 = {0}, block 1 = {0, 2}, block 2 = {2} (exactly full) */
	assert_int_equal(m.block_segs[0].w[0], 1);
	assert_int_equal(m.block_segs[1].w[0], 5);
	assert_int_equal(m.block_segs[2].w[0], 4);
	/* causal: every block is fully visible for any segment that exists after it */
	assert_int_equal(gpud_mask_block_vis(&m, 3, 0), 1);
	assert_int_equal(gpud_mask_block_vis(&m, 3, 5), 1); /* past the prompt: G */
	assert_int_equal(gpud_mask_block_vis(&m, 0, 1), 2); /* s0 sees 0 but not 2 */
}

static void test_compile_block_attention(void **state)
{
	(void)state;
	struct desc_buf *b = malloc(sizeof(*b));
	/* s0 system, s1..s3 chunks seeing only s0, s4 query sees all, G sees all */
	uint32_t lens[5] = { 3, 4, 4, 2, 3 };
	struct gpud_mask m;

	desc_init(b, 5);
	for (uint16_t c = 1; c <= 3; c++)
		desc_add(b, c, 0);
	for (uint16_t j = 0; j <= 4; j++)
		desc_add(b, 4, j);
	for (uint16_t j = 0; j <= 5; j++)
		desc_add(b, 5, j);
	compile_ok(&b->d, lens, 4, &m);
	assert_false(m.causal);
	assert_int_equal(m.n_prompt, 16);
	assert_int_equal(m.n_prompt_blocks, 4);
	assert_true(gpud_segset_has(&m.vis[2], 0));
	assert_true(gpud_segset_has(&m.vis[2], 2)); /* self, not listed */
	assert_false(gpud_segset_has(&m.vis[2], 1));
	/* positions: s0 0-2, s1 3-6, s2 7-10, s3 11-12, s4 13-15 */
	assert_int_equal(m.seg[2], 0);
	assert_int_equal(m.seg[3], 1);
	assert_int_equal(m.seg[10], 2);
	assert_int_equal(m.seg[11], 3);
	assert_int_equal(m.seg[15], 4);
	/* block 1 = positions 4-7 = {1, 2}: s3 skips it; s2 tests per token */
	assert_int_equal(gpud_mask_block_vis(&m, 3, 1), 0);
	assert_int_equal(gpud_mask_block_vis(&m, 2, 1), 2);
	assert_false(gpud_mask_visible(&m, 2, 5));
	assert_true(gpud_mask_visible(&m, 2, 7));
	assert_int_equal(gpud_mask_block_vis(&m, 4, 1), 1);
	/* block 0 = positions 0-3 = {0, 1}: s2 sees only s0 there */
	assert_int_equal(gpud_mask_block_vis(&m, 2, 0), 2);
	free(b);
}

static void test_compile_tail_block_has_g(void **state)
{
	(void)state;
	struct desc_buf *b = malloc(sizeof(*b));
	uint32_t lens[2] = { 2, 3 };
	struct gpud_mask m;

	/* G does not see s0 */
	desc_init(b, 2);
	desc_add(b, 1, 0);
	desc_add(b, 2, 1);
	compile_ok(&b->d, lens, 4, &m);
	assert_false(m.causal);
	assert_int_equal(m.n_prompt_blocks, 2);
	/* block 1 = positions 4..7: s1 at 4, G at 5..7 */
	assert_true(gpud_segset_has(&m.block_segs[1], 1));
	assert_true(gpud_segset_has(&m.block_segs[1], 2));
	assert_false(gpud_segset_has(&m.block_segs[0], 2));
	assert_int_equal(gpud_mask_block_vis(&m, 2, 0), 2);
	assert_int_equal(gpud_mask_block_vis(&m, 2, 1), 1);
	assert_false(gpud_mask_visible(&m, 2, 0));
	assert_true(gpud_mask_visible(&m, 2, 2));
	/* s1 sees s0 and s1 but not G in the tail block */
	assert_int_equal(gpud_mask_block_vis(&m, 1, 1), 2);
	free(b);
}

static void test_causal_flag(void **state)
{
	(void)state;
	struct desc_buf *b = malloc(sizeof(*b));
	struct gpud_mask m;
	uint32_t lens[3] = { 2, 0, 2 };

	/* hides only empty segment 1: still causal */
	desc_all(b, 3);
	b->rows[2].n = 0;
	desc_add(b, 2, 0);
	b->rows[3].n = 0;
	desc_add(b, 3, 0);
	desc_add(b, 3, 2);
	compile_ok(&b->d, lens, 16, &m);
	assert_true(m.causal);
	/* hiding a non-empty segment from G is not */
	desc_all(b, 3);
	b->rows[3].n = 0;
	desc_add(b, 3, 2);
	compile_ok(&b->d, lens, 16, &m);
	assert_false(m.causal);
	/* the empty segment's own row does not matter */
	desc_all(b, 3);
	b->rows[1].n = 0;
	compile_ok(&b->d, lens, 16, &m);
	assert_true(m.causal);
	free(b);
}

static void test_hash(void **state)
{
	(void)state;
	struct desc_buf *b = malloc(sizeof(*b));
	struct gpud_mask m;
	uint32_t lens[4] = { 3, 5, 2, 7 };
	struct proto_mask_desc none = { .n_segments = 4, .rows = NULL };
	uint64_t h_none, h_all, h;

	compile_ok(&none, lens, 16, &m);
	h_none = m.hash;
	compile_ok(&none, lens, 16, &m);
	assert_true(m.hash == h_none); /* deterministic */
	desc_all(b, 4);
	compile_ok(&b->d, lens, 16, &m);
	h_all = m.hash;
	assert_true(h_all == h_none); /* same semantics, same key */
	/* same rows listed in another order with self omitted: same key */
	desc_init(b, 4);
	for (uint32_t i = 0; i <= 4; i++)
		for (uint32_t j = i; j-- > 0;)
			desc_add(b, i, (uint16_t)j);
	compile_ok(&b->d, lens, 16, &m);
	assert_true(m.hash == h_all);
	/* different lengths */
	lens[1] = 6;
	compile_ok(&none, lens, 16, &m);
	assert_true(m.hash != h_none);
	lens[1] = 5;
	/* one entry removed from one row */
	desc_all(b, 4);
	b->rows[3].n = 1;
	compile_ok(&b->d, lens, 16, &m);
	assert_true(m.hash != h_none);
	h = m.hash;
	desc_all(b, 4);
	b->rows[4].n = 1;
	compile_ok(&b->d, lens, 16, &m);
	assert_true(m.hash != h_none && m.hash != h);
	/* different segment count with the same total tokens */
	uint32_t lens3[3] = { 3, 5, 9 };
	none.n_segments = 3;
	compile_ok(&none, lens3, 16, &m);
	assert_true(m.hash != h_none);

	/* every one-entry change over many random descriptors gives a new hash */
	srand(7);
	for (int t = 0; t < 200; t++) {
		uint32_t s = 1 + (uint32_t)rand() % 20, l[20];
		desc_init(b, s);
		for (uint32_t i = 0; i < s; i++)
			l[i] = (uint32_t)rand() % 5;
		for (uint32_t i = 0; i <= s; i++)
			for (uint32_t j = 0; j < i; j++)
				if (rand() & 1)
					desc_add(b, i, (uint16_t)j);
		compile_ok(&b->d, l, 16, &m);
		h = m.hash;
		uint32_t row = 1 + (uint32_t)rand() % s;
		uint32_t j = (uint32_t)rand() % row;
		bool had = gpud_segset_has(&m.vis[row], j);
		if (!had)
			desc_add(b, row, (uint16_t)j);
		else
			for (uint32_t e = 0; e < b->rows[row].n; e++)
				if (b->idx[row][e] == j)
					b->idx[row][e] = (uint16_t)row; /* replace by self */
		compile_ok(&b->d, l, 16, &m);
		assert_true(m.hash != h);
	}
	free(b);
}

static void test_compile_args(void **state)
{
	(void)state;
	struct proto_mask_desc none = { .n_segments = 2, .rows = NULL };
	uint32_t lens[2] = { 10, 10 };
	struct gpud_mask m;
	size_t need = gpud_mask_bytes(2, 20, 16);

	/* 3 vis + 2 blocks of 16 bytes + 20 ids */
	assert_int_equal(need, 5 * 16 + 20);
	assert_int_equal(gpud_mask_bytes(2, 20, 0), 0);
	assert_int_equal(gpud_mask_compile(&none, lens, 16, g_mem, need - 1, &m), -EINVAL);
	assert_int_equal(gpud_mask_compile(&none, lens, 16, g_mem + 1, need, &m), -EINVAL);
	assert_int_equal(gpud_mask_compile(&none, lens, 0, g_mem, need, &m), -EINVAL);
	assert_int_equal(gpud_mask_compile(&none, NULL, 16, g_mem, need, &m), -EINVAL);
	assert_int_equal(gpud_mask_compile(NULL, lens, 16, g_mem, need, &m), -EINVAL);
	/* token total overflow */
	uint32_t big[2] = { UINT32_MAX, 2 };
	assert_int_equal(gpud_mask_compile(&none, big, 16, g_mem, sizeof(g_mem), &m), SW_ETOOLONG);

	/* zero segments: only G */
	struct proto_mask_desc zero = { .n_segments = 0, .rows = NULL };
	assert_int_equal(gpud_mask_compile(&zero, NULL, 16, g_mem, gpud_mask_bytes(0, 0, 16), &m), 0);
	assert_int_equal(m.n_prompt, 0);
	assert_int_equal(m.n_prompt_blocks, 0);
	assert_true(m.causal);
	assert_int_equal(gpud_mask_block_vis(&m, 0, 0), 1);

	/* exact size is enough; nothing written past it */
	memset(g_mem, 0x5a, sizeof(g_mem));
	assert_int_equal(gpud_mask_compile(&none, lens, 16, g_mem, need, &m), 0);
	assert_int_equal(g_mem[need], 0x5a);
	assert_true((const uint8_t *)m.seg + 20 == g_mem + need);
}

/* Exhaustive check of the compiled mask against the definition on many
 * random descriptors: for every (q, k) the block test plus the token test
 * give exactly "k <= q and seg(k) in vis[seg(q)]". */
static void test_compile_random_vs_definition(void **state)
{
	(void)state;
	struct desc_buf *b = malloc(sizeof(*b));
	struct gpud_mask m;

	srand(11);
	for (int t = 0; t < 100; t++) {
		uint32_t s = 1 + (uint32_t)rand() % 8, l[8], bt = 1 + (uint32_t)rand() % 6;
		uint32_t n = 0;
		desc_init(b, s);
		for (uint32_t i = 0; i < s; i++) {
			l[i] = (uint32_t)rand() % 6;
			n += l[i];
		}
		for (uint32_t i = 0; i <= s; i++)
			for (uint32_t j = 0; j < i; j++)
				if (rand() % 3)
					desc_add(b, i, (uint16_t)j);
		compile_ok(&b->d, l, bt, &m);
		uint32_t total = n + 5; /* a few generated tokens */
		for (uint32_t q = 0; q < total; q++) {
			unsigned qs = gpud_mask_seg(&m, q);
			for (uint32_t k = 0; k <= q; k++) {
				unsigned ks = gpud_mask_seg(&m, k);
				bool want = ks == qs;
				for (uint32_t e = 0; e < b->rows[qs].n; e++)
					want |= b->idx[qs][e] == ks;
				int bv = gpud_mask_block_vis(&m, qs, k / bt);
				bool got = bv == 1 || (bv == 2 && gpud_mask_visible(&m, qs, k));
				assert_int_equal(got, want);
			}
		}
	}
	free(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_compile_refuses_invalid),
		cmocka_unit_test(test_compile_causal),
		cmocka_unit_test(test_compile_block_attention),
		cmocka_unit_test(test_compile_tail_block_has_g),
		cmocka_unit_test(test_causal_flag),
		cmocka_unit_test(test_hash),
		cmocka_unit_test(test_compile_args),
		cmocka_unit_test(test_compile_random_vs_definition),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
