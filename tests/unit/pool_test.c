/* pool_test.c - fixed-size pools: owned, external (device-like) and index
 * pools; exhaustion, double and foreign frees, debug fill, owners, runs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/pool.h"

static void assert_consistent(struct sw_pool *p)
{
	char err[SW_ERR_MAX] = "";
	int rc = sw_pool_check(p, err, sizeof(err));
	if (rc)
		fail_msg("pool check: %s", err);
	assert_int_equal(sw_pool_used(p) + sw_pool_free_count(p), sw_pool_capacity(p));
}

static void test_create_errors(void **state)
{
	(void)state;
	struct sw_pool *p = (struct sw_pool *)0x1; /* must stay untouched */
	char mem[64];

	assert_int_equal(sw_pool_create(&p, "x", 0, 4, 8), -EINVAL);
	assert_int_equal(sw_pool_create(&p, "x", 16, 0, 8), -EINVAL);
	assert_int_equal(sw_pool_create(&p, "x", 16, 4, 0), -EINVAL);
	assert_int_equal(sw_pool_create(&p, "x", 16, 4, 24), -EINVAL);
	assert_int_equal(sw_pool_create(&p, "x", 16, 4, 8192), -EINVAL);
	assert_int_equal(sw_pool_create(&p, "x", 16, UINT32_MAX, 8), -EINVAL);
	assert_int_equal(sw_pool_create(&p, "x", SIZE_MAX / 2, 4, 8), -ENOMEM);
	assert_int_equal(sw_pool_create(&p, "x", SIZE_MAX, 1, 64), -ENOMEM);
	assert_int_equal(sw_pool_create_external(&p, "x", NULL, 16, 4, 0), -EINVAL);
	assert_int_equal(sw_pool_create_external(&p, "x", mem, 0, 4, 0), -EINVAL);
	assert_int_equal(sw_pool_create_external(&p, "x", mem, 16, 0, 0), -EINVAL);
	assert_int_equal(sw_pool_create_external(&p, "x", mem, 16, 4, 0x80), -EINVAL);
	assert_int_equal(sw_pool_create_external(&p, "x", mem, SIZE_MAX / 2, 4, 0), -ENOMEM);
	assert_int_equal(sw_pool_create_index(&p, "x", 0), -EINVAL);
	assert_ptr_equal(p, (struct sw_pool *)0x1);
	sw_pool_destroy(NULL);
}

static void test_alloc_free_order(void **state)
{
	(void)state;
	struct sw_pool *p;
	assert_int_equal(sw_pool_create(&p, "blocks", 100, 8, 64), 0);

	struct sw_pool_stats st;
	sw_pool_stats(p, &st);
	assert_string_equal(st.name, "blocks");
	assert_int_equal(st.block_size, 128); /* rounded up to the alignment */
	assert_int_equal(st.capacity, 8);
	assert_int_equal(st.free, 8);

	void *b[8];
	for (uint32_t i = 0; i < 8; i++) {
		b[i] = sw_pool_alloc(p, 1000 + i);
		assert_non_null(b[i]);
		assert_int_equal((uintptr_t)b[i] % 64, 0);
		memset(b[i], (int)i, 128); /* whole block writable */
		uint32_t idx;
		assert_int_equal(sw_pool_index(p, b[i], &idx), 0);
		assert_int_equal(idx, i); /* a fresh pool hands out 0, 1, 2, ... */
		assert_ptr_equal(sw_pool_ptr(p, i), b[i]);
		assert_true(sw_pool_is_used(p, i));
		assert_consistent(p);
	}
	for (uint32_t i = 0; i < 8; i++)
		assert_int_equal(((unsigned char *)b[i])[127], i); /* no overlap */

	/* LIFO reuse: the block freed last comes back first. */
	assert_int_equal(sw_pool_free(p, b[5]), 0);
	assert_int_equal(sw_pool_free(p, b[2]), 0);
	assert_false(sw_pool_is_used(p, 2));
	assert_ptr_equal(sw_pool_alloc(p, 7), b[2]);
	assert_ptr_equal(sw_pool_alloc(p, 7), b[5]);
	assert_consistent(p);
	sw_pool_destroy(p);
}

static void test_exhaustion_never_grows(void **state)
{
	(void)state;
	struct sw_pool *p;
	uint32_t idx;
	assert_int_equal(sw_pool_create(&p, "small", 32, 3, 16), 0);
	for (int i = 0; i < 3; i++)
		assert_non_null(sw_pool_alloc(p, 1));

	struct sw_pool_stats before, after;
	sw_pool_stats(p, &before);
	assert_null(sw_pool_alloc(p, 2));
	assert_int_equal(sw_pool_alloc_index(p, 2, &idx), SW_EEXHAUSTED);
	sw_pool_stats(p, &after);
	assert_int_equal(after.capacity, 3);
	assert_int_equal(after.used, 3);
	assert_int_equal(after.free, 0);
	assert_int_equal(after.fails, before.fails + 2);
	assert_int_equal(after.allocs, before.allocs);
	assert_int_equal(after.largest_free_run, 0);
	assert_consistent(p);

	/* Freeing one makes exactly one available again. */
	assert_int_equal(sw_pool_free_index(p, 1), 0);
	assert_int_equal(sw_pool_alloc_index(p, 3, &idx), 0);
	assert_int_equal(idx, 1);
	assert_int_equal(sw_pool_alloc_index(p, 3, &idx), SW_EEXHAUSTED);
	sw_pool_destroy(p);
}

static void test_bad_frees(void **state)
{
	(void)state;
	struct sw_pool *p;
	int on_stack;
	assert_int_equal(sw_pool_create(&p, "bad", 48, 4, 16), 0);
	char *a = sw_pool_alloc(p, 1);
	char *b = sw_pool_alloc(p, 2);
	assert_non_null(a);
	assert_non_null(b);

	assert_int_equal(sw_pool_free(p, a), 0);
	assert_int_equal(sw_pool_free(p, a), SW_ENOTFOUND);         /* double free */
	assert_int_equal(sw_pool_free_index(p, 0), SW_ENOTFOUND);
	assert_int_equal(sw_pool_free(p, b + 1), -EINVAL);          /* interior */
	assert_int_equal(sw_pool_free(p, &on_stack), -EINVAL);      /* foreign */
	assert_int_equal(sw_pool_free(p, NULL), -EINVAL);
	assert_int_equal(sw_pool_free(p, a + 4 * 48), -EINVAL);     /* one past the end */
	assert_int_equal(sw_pool_free(p, a - 48), -EINVAL);         /* before the start */
	assert_int_equal(sw_pool_free_index(p, 4), -EINVAL);
	assert_int_equal(sw_pool_free_index(p, SW_POOL_NONE), -EINVAL);

	struct sw_pool_stats st;
	sw_pool_stats(p, &st);
	assert_int_equal(st.bad_frees, 9);
	assert_int_equal(st.used, 1); /* b is still allocated, nothing else */
	assert_int_equal(st.frees, 1);
	assert_true(sw_pool_is_used(p, 1));
	assert_consistent(p);

	uint32_t idx;
	assert_int_equal(sw_pool_index(p, b + 3, &idx), -EINVAL);
	assert_null(sw_pool_ptr(p, 4));
	assert_false(sw_pool_is_used(p, 99));
	sw_pool_destroy(p);
}

static void test_debug_fill(void **state)
{
	(void)state;
#ifdef SW_DEBUG
	struct sw_pool *p;
	assert_int_equal(sw_pool_create(&p, "fill", 64, 2, 64), 0);
	unsigned char *a = sw_pool_alloc(p, 1);
	memset(a, 0x42, 64);
	assert_int_equal(sw_pool_free(p, a), 0);
	for (int i = 0; i < 64; i++)
		assert_int_equal(a[i], SW_POOL_FREE_FILL); /* pool memory: still ours */
	unsigned char *b = sw_pool_alloc(p, 2);
	memset(b, 0x42, 64);
	sw_pool_reset(p); /* a reset frees, and fills, every block */
	for (int i = 0; i < 64; i++)
		assert_int_equal(b[i], SW_POOL_FREE_FILL);
	sw_pool_destroy(p);

	/* External host memory is filled only when declared host-accessible. */
	unsigned char mem[4 * 32];
	memset(mem, 0x11, sizeof(mem));
	assert_int_equal(sw_pool_create_external(&p, "ext", mem, 32, 4, 0), 0);
	assert_int_equal(sw_pool_free(p, sw_pool_alloc(p, 1)), 0);
	for (size_t i = 0; i < sizeof(mem); i++)
		assert_int_equal(mem[i], 0x11);
	sw_pool_destroy(p);

	assert_int_equal(sw_pool_create_external(&p, "ext", mem, 32, 4,
						 SW_POOL_HOST_ACCESSIBLE), 0);
	assert_int_equal(sw_pool_free(p, sw_pool_alloc(p, 1)), 0);
	for (size_t i = 0; i < 32; i++)
		assert_int_equal(mem[i], SW_POOL_FREE_FILL);
	for (size_t i = 32; i < sizeof(mem); i++)
		assert_int_equal(mem[i], 0x11); /* only the freed block */
	sw_pool_destroy(p);
#else
	skip();
#endif
}

/* A pool over memory the host must not touch (a GPU KV cache): only
 * pointer arithmetic happens on it. The base is a made-up address, so any
 * dereference would crash the test. */
static void test_external_device_memory(void **state)
{
	(void)state;
	struct sw_pool *p;
	void *dev = (void *)(uintptr_t)0x7f0000000000ULL;
	size_t bs = 16 * 2 * 8 * 128 * 2; /* 16 tokens x (k,v) x 8 heads x 128 x fp16 */

	assert_int_equal(sw_pool_create_external(&p, "kv", dev, bs, 1000, 0), 0);
	char *b0 = sw_pool_alloc(p, 11);
	char *b1 = sw_pool_alloc(p, 12);
	assert_ptr_equal(b0, dev);
	assert_ptr_equal(b1, (char *)dev + bs);
	assert_ptr_equal(sw_pool_ptr(p, 999), (char *)dev + 999 * bs);
	uint32_t idx;
	assert_int_equal(sw_pool_index(p, (char *)dev + 999 * bs, &idx), 0);
	assert_int_equal(idx, 999);
	assert_int_equal(sw_pool_free(p, b0), 0);
	assert_int_equal(sw_pool_free(p, b1), 0);
	assert_int_equal(sw_pool_free(p, b1), SW_ENOTFOUND);
	assert_consistent(p);
	sw_pool_destroy(p); /* must not free dev */
}

static void test_index_pool(void **state)
{
	(void)state;
	struct sw_pool *p;
	uint32_t idx;
	assert_int_equal(sw_pool_create_index(&p, "ids", 5), 0);
	assert_null(sw_pool_alloc(p, 1)); /* no memory behind it */
	assert_int_equal(sw_pool_used(p), 0); /* and nothing was taken */
	assert_int_equal(sw_pool_alloc_index(p, 1, &idx), 0);
	assert_int_equal(idx, 0);
	assert_null(sw_pool_ptr(p, 0));
	assert_int_equal(sw_pool_index(p, (void *)0x1000, &idx), -EINVAL);
	assert_int_equal(sw_pool_free(p, (void *)0x1000), -EINVAL);
	assert_int_equal(sw_pool_free_index(p, 0), 0);
	struct sw_pool_stats st;
	sw_pool_stats(p, &st);
	assert_int_equal(st.block_size, 0);
	assert_int_equal(st.bad_frees, 1);
	sw_pool_destroy(p);
}

struct owners {
	uint32_t n;
	uint32_t idx[16];
	uint64_t owner[16];
	uint32_t stop_after;
};

static int collect(void *ctx, uint32_t idx, uint64_t owner)
{
	struct owners *o = ctx;
	o->idx[o->n] = idx;
	o->owner[o->n] = owner;
	o->n++;
	return o->n == o->stop_after ? 99 : 0;
}

static void test_owners_high_water_runs(void **state)
{
	(void)state;
	struct sw_pool *p;
	uint32_t idx;
	uint64_t owner;
	assert_int_equal(sw_pool_create_index(&p, "kv", 10), 0);
	for (uint64_t i = 0; i < 10; i++) {
		assert_int_equal(sw_pool_alloc_index(p, 100 + i, &idx), 0);
		assert_int_equal(idx, i);
	}
	/* Free 2,3,4 and 7: the largest run of adjacent free blocks is 3. */
	assert_int_equal(sw_pool_free_index(p, 3), 0);
	assert_int_equal(sw_pool_free_index(p, 7), 0);
	assert_int_equal(sw_pool_free_index(p, 2), 0);
	assert_int_equal(sw_pool_free_index(p, 4), 0);

	struct sw_pool_stats st;
	sw_pool_stats(p, &st);
	assert_int_equal(st.used, 6);
	assert_int_equal(st.free, 4);
	assert_int_equal(st.high, 10);
	assert_int_equal(st.largest_free_run, 3);
	assert_int_equal(st.allocs, 10);
	assert_int_equal(st.frees, 4);

	assert_int_equal(sw_pool_owner(p, 5, &owner), 0);
	assert_int_equal(owner, 105);
	assert_int_equal(sw_pool_owner(p, 3, &owner), SW_ENOTFOUND);
	assert_int_equal(sw_pool_owner(p, 10, &owner), -EINVAL);
	assert_int_equal(sw_pool_set_owner(p, 5, 555), 0);
	assert_int_equal(sw_pool_set_owner(p, 3, 1), SW_ENOTFOUND);
	assert_int_equal(sw_pool_set_owner(p, 10, 1), -EINVAL);

	struct owners o = { 0 };
	assert_int_equal(sw_pool_foreach_used(p, collect, &o), 0);
	assert_int_equal(o.n, 6);
	static const uint32_t want_idx[] = { 0, 1, 5, 6, 8, 9 };
	static const uint64_t want_owner[] = { 100, 101, 555, 106, 108, 109 };
	for (int i = 0; i < 6; i++) {
		assert_int_equal(o.idx[i], want_idx[i]);
		assert_int_equal(o.owner[i], want_owner[i]);
	}
	struct owners early = { .stop_after = 2 };
	assert_int_equal(sw_pool_foreach_used(p, collect, &early), 99);
	assert_int_equal(early.n, 2);

	/* The high-water mark survives frees and a reset. */
	sw_pool_reset(p);
	sw_pool_stats(p, &st);
	assert_int_equal(st.used, 0);
	assert_int_equal(st.high, 10);
	assert_int_equal(st.largest_free_run, 10);
	assert_consistent(p);
	sw_pool_destroy(p);
}

/* Random alloc/free against a shadow model of which blocks are held. */
static void test_random_churn(void **state)
{
	(void)state;
	enum { CAP = 257, OPS = 20000 };
	struct sw_pool *p;
	uint8_t held[CAP] = { 0 };
	uint32_t used = 0, high = 0;
	uint64_t x = 88172645463325252ULL;

	assert_int_equal(sw_pool_create(&p, "churn", 24, CAP, 8), 0);
	for (int op = 0; op < OPS; op++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		if (x % 3 != 0) {
			uint32_t idx;
			int rc = sw_pool_alloc_index(p, (uint64_t)op, &idx);
			if (used == CAP) {
				assert_int_equal(rc, SW_EEXHAUSTED);
				continue;
			}
			assert_int_equal(rc, 0);
			assert_false(held[idx]);
			held[idx] = 1;
			if (++used > high)
				high = used;
		} else {
			uint32_t idx = (uint32_t)((x >> 20) % CAP);
			int rc = sw_pool_free_index(p, idx);
			assert_int_equal(rc, held[idx] ? 0 : SW_ENOTFOUND);
			if (held[idx]) {
				held[idx] = 0;
				used--;
			}
		}
		assert_int_equal(sw_pool_used(p), used);
		if (op % 1000 == 0)
			assert_consistent(p);
	}
	struct sw_pool_stats st;
	sw_pool_stats(p, &st);
	assert_int_equal(st.high, high);
	uint32_t run = 0, best = 0;
	for (uint32_t i = 0; i < CAP; i++) {
		run = held[i] ? 0 : run + 1;
		if (run > best)
			best = run;
	}
	assert_int_equal(st.largest_free_run, best);
	assert_consistent(p);
	sw_pool_destroy(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_errors),
		cmocka_unit_test(test_alloc_free_order),
		cmocka_unit_test(test_exhaustion_never_grows),
		cmocka_unit_test(test_bad_frees),
		cmocka_unit_test(test_debug_fill),
		cmocka_unit_test(test_external_device_memory),
		cmocka_unit_test(test_index_pool),
		cmocka_unit_test(test_owners_high_water_runs),
		cmocka_unit_test(test_random_churn),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
