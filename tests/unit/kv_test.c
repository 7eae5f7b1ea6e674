/* kv_test.c - paged KV accounting: reservation, exhaustion without side
 * effects, full return of blocks, truncation, slot limits, consistency,
 * the watchdog tests' planted leak. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "gpud/kv.h"

static struct gpud_kv *mk(uint32_t n_blocks, uint32_t bt, uint32_t seqs, uint32_t ctx)
{
	struct gpud_kv_params p = { .n_blocks = n_blocks, .block_tokens = bt,
				    .max_seqs = seqs, .max_ctx = ctx };
	struct gpud_kv *kv = NULL;

	assert_int_equal(gpud_kv_create(&kv, &p), 0);
	assert_non_null(kv);
	return kv;
}

static void check(const struct gpud_kv *kv)
{
	char err[SW_ERR_MAX] = "";
	int rc = gpud_kv_check(kv, err, sizeof(err));

	if (rc)
		fail_msg("%s", err);
}

static void test_create_bad_params(void **state)
{
	struct gpud_kv_params p = { .n_blocks = 4, .block_tokens = 16, .max_seqs = 2, .max_ctx = 64 };
	struct gpud_kv *kv = (void *)1;

	p.n_blocks = 0;
	assert_int_equal(gpud_kv_create(&kv, &p), -EINVAL);
	assert_null(kv);
	p.n_blocks = 4;
	p.block_tokens = 0;
	assert_int_equal(gpud_kv_create(&kv, &p), -EINVAL);
	p.block_tokens = 16;
	p.max_seqs = 0;
	assert_int_equal(gpud_kv_create(&kv, &p), -EINVAL);
	p.max_seqs = 2;
	p.max_ctx = 0;
	assert_int_equal(gpud_kv_create(&kv, &p), -EINVAL);
	gpud_kv_destroy(NULL);
}

static void test_reserve_and_free(void **state)
{
	struct gpud_kv *kv = mk(8, 16, 4, 128);
	struct gpud_kv_stats st;
	uint32_t s, n;
	const uint32_t *t;

	assert_int_equal(gpud_kv_seq_new(kv, &s), 0);
	assert_int_equal(gpud_kv_seq_len(kv, s), 0);
	assert_int_equal(gpud_kv_seq_capacity(kv, s), 0);
	assert_int_equal(gpud_kv_reserve(kv, s, 1), 0);
	assert_int_equal(gpud_kv_seq_capacity(kv, s), 16);
	assert_int_equal(gpud_kv_reserve(kv, s, 16), 0); /* same block */
	assert_int_equal(gpud_kv_free_blocks(kv), 7);
	assert_int_equal(gpud_kv_reserve(kv, s, 40), 0); /* 3 blocks */
	assert_int_equal(gpud_kv_free_blocks(kv), 5);
	t = gpud_kv_block_table(kv, s, &n);
	assert_int_equal(n, 3);
	assert_true(t[0] != t[1] && t[1] != t[2] && t[0] != t[2]);
	for (uint32_t i = 0; i < n; i++)
		assert_true(t[i] < 8);
	assert_int_equal(gpud_kv_set_len(kv, s, 40), 0);
	assert_int_equal(gpud_kv_set_len(kv, s, 49), -EINVAL); /* past the blocks */
	assert_int_equal(gpud_kv_seq_len(kv, s), 40);
	check(kv);
	gpud_kv_stats(kv, &st);
	assert_int_equal(st.used, 3);
	assert_int_equal(st.free, 5);
	assert_int_equal(st.used + st.free, st.n_blocks);
	assert_int_equal(st.seqs, 1);
	assert_int_equal(gpud_kv_seq_free(kv, s), 0);
	assert_int_equal(gpud_kv_free_blocks(kv), 8);
	assert_false(gpud_kv_seq_valid(kv, s));
	assert_int_equal(gpud_kv_seq_free(kv, s), -EINVAL); /* double free */
	assert_int_equal(gpud_kv_reserve(kv, s, 1), -EINVAL);
	gpud_kv_stats(kv, &st);
	assert_int_equal(st.high, 3);
	assert_int_equal(st.seqs, 0);
	check(kv);
	gpud_kv_destroy(kv);
}

static void test_exhaustion_changes_nothing(void **state)
{
	struct gpud_kv *kv = mk(4, 16, 3, 256);
	struct gpud_kv_stats st;
	uint32_t a, b, n;
	const uint32_t *t;
	uint32_t before[4];

	assert_int_equal(gpud_kv_seq_new(kv, &a), 0);
	assert_int_equal(gpud_kv_seq_new(kv, &b), 0);
	assert_int_equal(gpud_kv_reserve(kv, a, 48), 0); /* 3 blocks */
	t = gpud_kv_block_table(kv, a, &n);
	memcpy(before, t, n * sizeof(*t));
	assert_int_equal(gpud_kv_reserve(kv, b, 32), SW_EEXHAUSTED); /* needs 2, 1 free */
	assert_int_equal(gpud_kv_seq_capacity(kv, b), 0);
	assert_int_equal(gpud_kv_free_blocks(kv), 1);
	assert_int_equal(gpud_kv_reserve(kv, a, 80), SW_EEXHAUSTED); /* needs 2 more */
	t = gpud_kv_block_table(kv, a, &n);
	assert_int_equal(n, 3);
	assert_memory_equal(t, before, 3 * sizeof(*t));
	gpud_kv_stats(kv, &st);
	assert_int_equal(st.exhausted, 2);
	check(kv);
	/* The last block can still be had, then the pool is dry. */
	assert_int_equal(gpud_kv_reserve(kv, b, 16), 0);
	assert_int_equal(gpud_kv_free_blocks(kv), 0);
	assert_int_equal(gpud_kv_reserve(kv, b, 17), SW_EEXHAUSTED);
	/* Freeing a returns every one of its blocks. */
	assert_int_equal(gpud_kv_seq_free(kv, a), 0);
	assert_int_equal(gpud_kv_free_blocks(kv), 3);
	assert_int_equal(gpud_kv_reserve(kv, b, 64), 0);
	assert_int_equal(gpud_kv_free_blocks(kv), 0);
	check(kv);
	assert_int_equal(gpud_kv_seq_free(kv, b), 0);
	assert_int_equal(gpud_kv_free_blocks(kv), 4);
	check(kv);
	gpud_kv_destroy(kv);
}

static void test_context_limit(void **state)
{
	struct gpud_kv *kv = mk(64, 16, 2, 100);
	uint32_t s;

	assert_int_equal(gpud_kv_seq_new(kv, &s), 0);
	assert_int_equal(gpud_kv_reserve(kv, s, 101), SW_ETOOLONG);
	assert_int_equal(gpud_kv_seq_capacity(kv, s), 0);
	assert_int_equal(gpud_kv_reserve(kv, s, 100), 0); /* 7 blocks, last partial */
	assert_int_equal(gpud_kv_seq_capacity(kv, s), 112);
	assert_int_equal(gpud_kv_max_ctx(kv), 100);
	check(kv);
	gpud_kv_destroy(kv);
}

static void test_slots(void **state)
{
	struct gpud_kv *kv = mk(8, 8, 2, 64);
	uint32_t a, b, c;

	assert_int_equal(gpud_kv_max_seqs(kv), 2);
	assert_int_equal(gpud_kv_seq_new(kv, &a), 0);
	assert_int_equal(gpud_kv_seq_new(kv, &b), 0);
	assert_int_not_equal(a, b);
	assert_int_equal(gpud_kv_seq_new(kv, &c), SW_EEXHAUSTED);
	assert_int_equal(gpud_kv_seq_free(kv, a), 0);
	assert_int_equal(gpud_kv_seq_new(kv, &c), 0);
	assert_int_equal(c, a);
	assert_false(gpud_kv_seq_valid(kv, 2));
	assert_false(gpud_kv_seq_valid(kv, UINT32_MAX));
	assert_int_equal(gpud_kv_seq_free(kv, 7), -EINVAL);
	check(kv);
	gpud_kv_destroy(kv);
}

static void test_truncate(void **state)
{
	struct gpud_kv *kv = mk(8, 4, 1, 32);
	uint32_t s, n;

	assert_int_equal(gpud_kv_seq_new(kv, &s), 0);
	assert_int_equal(gpud_kv_reserve(kv, s, 13), 0); /* 4 blocks */
	assert_int_equal(gpud_kv_set_len(kv, s, 13), 0);
	assert_int_equal(gpud_kv_truncate(kv, s, 14), -EINVAL);
	assert_int_equal(gpud_kv_truncate(kv, s, 5), 0); /* keeps 2 blocks */
	gpud_kv_block_table(kv, s, &n);
	assert_int_equal(n, 2);
	assert_int_equal(gpud_kv_seq_len(kv, s), 5);
	assert_int_equal(gpud_kv_free_blocks(kv), 6);
	assert_int_equal(gpud_kv_truncate(kv, s, 0), 0);
	gpud_kv_block_table(kv, s, &n);
	assert_int_equal(n, 0);
	assert_int_equal(gpud_kv_free_blocks(kv), 8);
	check(kv);
	gpud_kv_destroy(kv);
}

/* Random reserve/truncate/free churn keeps the accounting exact. */
static void test_churn(void **state)
{
	struct gpud_kv *kv = mk(37, 4, 5, 64);
	uint64_t x = 88172645463325252ULL;
	uint32_t slots[5], n_slots = 0;

	for (int it = 0; it < 5000; it++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		uint32_t op = x % 4, r = (uint32_t)(x >> 32);
		if (op == 0 || n_slots == 0) {
			uint32_t s;
			if (gpud_kv_seq_new(kv, &s) == 0)
				slots[n_slots++] = s;
			else
				assert_int_equal(n_slots, 5);
		} else if (op == 1) {
			uint32_t i = r % n_slots, s = slots[i];
			uint32_t want = gpud_kv_seq_len(kv, s) + r % 20, freeb = gpud_kv_free_blocks(kv);
			uint32_t cap = gpud_kv_seq_capacity(kv, s);
			int rc = gpud_kv_reserve(kv, s, want);
			if (rc == 0)
				assert_int_equal(gpud_kv_set_len(kv, s, want), 0);
			else if (rc == SW_EEXHAUSTED || rc == SW_ETOOLONG) {
				assert_int_equal(gpud_kv_free_blocks(kv), freeb);
				assert_int_equal(gpud_kv_seq_capacity(kv, s), cap);
			} else
				fail_msg("reserve: %d", rc);
		} else if (op == 2) {
			uint32_t s = slots[r % n_slots];
			assert_int_equal(gpud_kv_truncate(kv, s, gpud_kv_seq_len(kv, s) / 2), 0);
		} else {
			uint32_t i = r % n_slots;
			assert_int_equal(gpud_kv_seq_free(kv, slots[i]), 0);
			slots[i] = slots[--n_slots];
		}
		if (it % 97 == 0)
			check(kv);
	}
	while (n_slots)
		assert_int_equal(gpud_kv_seq_free(kv, slots[--n_slots]), 0);
	assert_int_equal(gpud_kv_free_blocks(kv), 37);
	check(kv);
	gpud_kv_destroy(kv);
}

/* Reference counts: blocks attached to a second sequence and held from
 * outside live until the last reference goes; a truncate that would cut
 * into a shared block is refused; the check counts every reference. */
static void test_shared_blocks(void **state)
{
	(void)state;
	struct gpud_kv *kv = mk(8, 4, 4, 32);
	struct gpud_kv_stats st;
	uint32_t a, b, c, n, blk[3], two[2], bad[1] = { 7 };
	const uint32_t *t;

	assert_int_equal(gpud_kv_seq_new(kv, &a), 0);
	assert_int_equal(gpud_kv_reserve(kv, a, 10), 0);
	assert_int_equal(gpud_kv_set_len(kv, a, 10), 0);
	t = gpud_kv_block_table(kv, a, &n);
	assert_int_equal(n, 3);
	memcpy(blk, t, sizeof(blk));
	assert_int_equal(gpud_kv_block_refs(kv, blk[0]), 1);
	/* outside holds on the two full blocks */
	assert_int_equal(gpud_kv_block_hold(kv, blk[0]), 0);
	assert_int_equal(gpud_kv_block_hold(kv, blk[1]), 0);
	assert_int_equal(gpud_kv_block_refs(kv, blk[1]), 2);
	assert_int_equal(gpud_kv_block_hold(kv, bad[0]), -EINVAL); /* free */
	assert_int_equal(gpud_kv_block_hold(kv, 8), -EINVAL);
	assert_int_equal(gpud_kv_block_release(kv, blk[2]), -EINVAL); /* no hold */
	assert_int_equal(gpud_kv_block_refs(kv, 99), 0);
	check(kv);
	/* b starts on them */
	assert_int_equal(gpud_kv_seq_new(kv, &b), 0);
	two[0] = blk[0];
	two[1] = blk[1];
	assert_int_equal(gpud_kv_seq_attach(kv, b, bad, 1), -EINVAL);
	assert_int_equal(gpud_kv_seq_attach(kv, b, NULL, 1), -EINVAL);
	assert_int_equal(gpud_kv_seq_attach(kv, b, two, 2), 0);
	assert_int_equal(gpud_kv_seq_attach(kv, b, two, 2), -EINVAL); /* not empty */
	assert_int_equal(gpud_kv_seq_len(kv, b), 8);
	assert_int_equal(gpud_kv_seq_capacity(kv, b), 8);
	assert_int_equal(gpud_kv_block_refs(kv, blk[0]), 3);
	assert_int_equal(gpud_kv_seq_new(kv, &c), 0);
	assert_int_equal(gpud_kv_seq_attach(kv, c, blk, 9), SW_ETOOLONG);
	assert_int_equal(gpud_kv_seq_len(kv, c), 0);
	gpud_kv_stats(kv, &st);
	assert_int_equal(st.used, 3);
	assert_int_equal(st.free, 5);
	check(kv);
	/* b appends on a private block */
	assert_int_equal(gpud_kv_reserve(kv, b, 11), 0);
	assert_int_equal(gpud_kv_set_len(kv, b, 11), 0);
	t = gpud_kv_block_table(kv, b, &n);
	assert_int_equal(n, 3);
	assert_int_not_equal(t[2], blk[2]);
	assert_int_equal(gpud_kv_block_refs(kv, t[2]), 1);
	/* cutting into a shared block: refused, nothing changes */
	assert_int_equal(gpud_kv_truncate(kv, a, 6), -EINVAL);
	assert_int_equal(gpud_kv_truncate(kv, b, 5), -EINVAL);
	assert_int_equal(gpud_kv_seq_len(kv, a), 10);
	/* to a block boundary or inside a private block: fine */
	assert_int_equal(gpud_kv_truncate(kv, b, 9), 0);
	assert_int_equal(gpud_kv_truncate(kv, a, 8), 0);
	assert_int_equal(gpud_kv_block_refs(kv, blk[2]), 0); /* a's private block went back */
	check(kv);
	/* a and b go: the held blocks stay */
	assert_int_equal(gpud_kv_seq_free(kv, a), 0);
	assert_int_equal(gpud_kv_seq_free(kv, b), 0);
	gpud_kv_stats(kv, &st);
	assert_int_equal(st.used, 2);
	assert_int_equal(st.used + st.free, 8);
	check(kv);
	assert_int_equal(gpud_kv_block_release(kv, blk[0]), 0);
	assert_int_equal(gpud_kv_block_release(kv, blk[0]), -EINVAL);
	assert_int_equal(gpud_kv_block_release(kv, blk[1]), 0);
	assert_int_equal(gpud_kv_seq_free(kv, c), 0);
	gpud_kv_stats(kv, &st);
	assert_int_equal(st.used, 0);
	assert_int_equal(st.free, 8);
	check(kv);
	gpud_kv_destroy(kv);
}

/* The planted leak of the watchdog's tests: a freed sequence leaves a
 * hold on its last block, forever; the accounting stays consistent (the
 * block is used, held from outside) and nothing else changes. */
/* Blocks taken outside any table (the chunk-KV cache's): one hold each,
 * counted as used, back to the pool with their release; none when the
 * pool is empty. */
static void test_block_take(void **state)
{
	(void)state;
	struct gpud_kv *kv = mk(3, 4, 2, 12);
	struct gpud_kv_stats st;
	uint32_t b[3], extra, s;
	char err[SW_ERR_MAX];

	for (int i = 0; i < 3; i++) {
		assert_int_equal(gpud_kv_block_take(kv, &b[i]), 0);
		assert_int_equal(gpud_kv_block_refs(kv, b[i]), 1);
	}
	assert_true(b[0] != b[1] && b[1] != b[2] && b[0] != b[2]);
	assert_int_equal(gpud_kv_block_take(kv, &extra), SW_EEXHAUSTED);
	gpud_kv_stats(kv, &st);
	assert_int_equal(st.used, 3);
	assert_int_equal(st.free, 0);
	assert_int_equal(st.exhausted, 1);
	assert_int_equal(gpud_kv_check(kv, err, sizeof(err)), 0);
	/* a sequence cannot get one meanwhile */
	assert_int_equal(gpud_kv_seq_new(kv, &s), 0);
	assert_int_equal(gpud_kv_reserve(kv, s, 1), SW_EEXHAUSTED);
	assert_int_equal(gpud_kv_block_release(kv, b[1]), 0);
	assert_int_equal(gpud_kv_block_release(kv, b[1]), -EINVAL); /* no hold left */
	assert_int_equal(gpud_kv_reserve(kv, s, 1), 0);
	assert_int_equal(gpud_kv_seq_free(kv, s), 0);
	assert_int_equal(gpud_kv_block_release(kv, b[0]), 0);
	assert_int_equal(gpud_kv_block_release(kv, b[2]), 0);
	gpud_kv_stats(kv, &st);
	assert_int_equal(st.used, 0);
	assert_int_equal(st.free, 3);
	assert_int_equal(st.high, 3);
	assert_int_equal(gpud_kv_check(kv, err, sizeof(err)), 0);
	gpud_kv_destroy(kv);
}

static void test_planted_leak(void **state)
{
	(void)state;
	struct gpud_kv_params p = { .n_blocks = 8, .block_tokens = 4, .max_seqs = 2,
				    .max_ctx = 32, .test_leak = 1 };
	struct gpud_kv *kv = NULL;
	struct gpud_kv_stats st;
	uint32_t a, n, last;
	const uint32_t *t;

	assert_int_equal(gpud_kv_create(&kv, &p), 0);
	/* no block, nothing to leak */
	assert_int_equal(gpud_kv_seq_new(kv, &a), 0);
	assert_int_equal(gpud_kv_seq_free(kv, a), 0);
	gpud_kv_stats(kv, &st);
	assert_int_equal(st.used, 0);
	for (uint32_t i = 1; i <= 3; i++) {
		assert_int_equal(gpud_kv_seq_new(kv, &a), 0);
		assert_int_equal(gpud_kv_reserve(kv, a, 10), 0); /* 3 blocks */
		assert_int_equal(gpud_kv_set_len(kv, a, 10), 0);
		t = gpud_kv_block_table(kv, a, &n);
		last = t[n - 1];
		assert_int_equal(gpud_kv_seq_free(kv, a), 0);
		assert_int_equal(gpud_kv_block_refs(kv, last), 1);
		gpud_kv_stats(kv, &st);
		assert_int_equal(st.used, i);
		assert_int_equal(st.seqs, 0);
		check(kv);
	}
	/* the leaked blocks are what is missing: 5 free, a 6-block sequence
	 * does not fit */
	assert_int_equal(gpud_kv_seq_new(kv, &a), 0);
	assert_int_equal(gpud_kv_reserve(kv, a, 24), SW_EEXHAUSTED);
	assert_int_equal(gpud_kv_reserve(kv, a, 20), 0);
	gpud_kv_destroy(kv);

	/* one in 2: the 2nd and 4th sequences with blocks leak */
	p.test_leak = 2;
	assert_int_equal(gpud_kv_create(&kv, &p), 0);
	for (uint32_t i = 1; i <= 4; i++) {
		assert_int_equal(gpud_kv_seq_new(kv, &a), 0);
		assert_int_equal(gpud_kv_reserve(kv, a, 5), 0);
		assert_int_equal(gpud_kv_seq_free(kv, a), 0);
		gpud_kv_stats(kv, &st);
		assert_int_equal(st.used, i / 2);
		check(kv);
	}
	gpud_kv_destroy(kv);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_bad_params),
		cmocka_unit_test(test_reserve_and_free),
		cmocka_unit_test(test_exhaustion_changes_nothing),
		cmocka_unit_test(test_context_limit),
		cmocka_unit_test(test_slots),
		cmocka_unit_test(test_truncate),
		cmocka_unit_test(test_churn),
		cmocka_unit_test(test_shared_blocks),
		cmocka_unit_test(test_block_take),
		cmocka_unit_test(test_planted_leak),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
