/* maskcache_test.c - compiled-mask cache: sharing, LRU order, pinning,
 * exhaustion, both bounds, forced hash collisions, counters, the slot
 * pool's accounting after every operation, and random churn checked
 * against a small model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "gpud/mask.h"
#include "gpud/maskcache.h"

#define BT 16 /* KV block tokens */

static void assert_consistent(struct gpud_maskcache *c)
{
	struct gpud_maskcache_stats st;
	struct gpud_maskcache_counts n;
	char err[SW_ERR_MAX] = "";

	if (gpud_maskcache_check(c, err, sizeof(err)))
		fail_msg("maskcache check: %s", err);
	gpud_maskcache_stats(c, &st);
	/* the watchdog's O(1) counts say what the full stats say */
	gpud_maskcache_counts(c, &n);
	assert_int_equal(n.entries, st.entries);
	assert_int_equal(n.pinned, st.pinned);
	assert_int_equal(n.pool_used, st.pool_used);
	assert_int_equal(n.pool_capacity, st.pool_capacity);
	assert_int_equal(st.pool_used + st.pool_free, st.pool_capacity);
	assert_int_equal(st.pool_used, st.entries);
	assert_true(st.bytes <= st.max_bytes);
	assert_true(st.entries <= st.max_entries);
	assert_true(st.pinned <= st.entries);
}

static struct gpud_maskcache *make(uint32_t max_entries, size_t max_bytes, unsigned key_bits)
{
	struct gpud_maskcache_params p = {
		.name = "mask0",
		.max_segments = 8,
		.max_prompt_tokens = 256,
		.block_tokens = BT,
		.max_entries = max_entries,
		.max_bytes = max_bytes,
		.key_bits = key_bits,
	};
	struct gpud_maskcache *c = NULL;

	assert_int_equal(gpud_maskcache_create(&c, &p), 0);
	assert_non_null(c);
	assert_consistent(c);
	return c;
}

/* A causal descriptor over segments of the given lengths. */
static struct proto_mask_desc causal(uint32_t s)
{
	return (struct proto_mask_desc){ .n_segments = s, .rows = NULL };
}

/* The mask must be what gpud_mask_compile makes of the same input. */
static void assert_mask_is(const struct gpud_mask *m, const struct proto_mask_desc *d,
			   const uint32_t *toks, uint32_t bt)
{
	static _Alignas(16) unsigned char mem[8192];
	struct gpud_mask ref;

	assert_int_equal(gpud_mask_compile(d, toks, bt, mem, sizeof(mem), &ref), 0);
	assert_int_equal(m->n_segments, ref.n_segments);
	assert_int_equal(m->n_prompt, ref.n_prompt);
	assert_int_equal(m->block_tokens, ref.block_tokens);
	assert_int_equal(m->n_prompt_blocks, ref.n_prompt_blocks);
	assert_int_equal(m->causal, ref.causal);
	assert_int_equal(m->hash, ref.hash);
	assert_memory_equal(m->vis, ref.vis, (ref.n_segments + 1) * sizeof(gpud_segset));
	if (ref.n_prompt) {
		assert_memory_equal(m->seg, ref.seg, ref.n_prompt);
		assert_memory_equal(m->block_segs, ref.block_segs,
				    ref.n_prompt_blocks * sizeof(gpud_segset));
	}
}

static void test_create_errors(void **state)
{
	(void)state;
	struct gpud_maskcache_params ok = {
		.max_segments = 8, .max_prompt_tokens = 64, .block_tokens = BT,
		.max_entries = 4, .max_bytes = 1 << 20,
	};
	struct gpud_maskcache_params p;
	struct gpud_maskcache *c = (struct gpud_maskcache *)0x1;

	assert_int_equal(gpud_maskcache_create(NULL, &ok), -EINVAL);
	assert_int_equal(gpud_maskcache_create(&c, NULL), -EINVAL);
	p = ok; p.max_segments = 0;
	assert_int_equal(gpud_maskcache_create(&c, &p), -EINVAL);
	p = ok; p.max_segments = GPUD_MASK_MAX_SEGMENTS + 1;
	assert_int_equal(gpud_maskcache_create(&c, &p), -EINVAL);
	p = ok; p.max_prompt_tokens = 0;
	assert_int_equal(gpud_maskcache_create(&c, &p), -EINVAL);
	p = ok; p.block_tokens = 0;
	assert_int_equal(gpud_maskcache_create(&c, &p), -EINVAL);
	p = ok; p.max_entries = 0;
	assert_int_equal(gpud_maskcache_create(&c, &p), -EINVAL);
	p = ok; p.max_bytes = 0;
	assert_int_equal(gpud_maskcache_create(&c, &p), -EINVAL);
	p = ok; p.key_bits = 64;
	assert_int_equal(gpud_maskcache_create(&c, &p), -EINVAL);
	assert_ptr_equal(c, (struct gpud_maskcache *)0x1);
	gpud_maskcache_destroy(NULL);
	assert_int_equal(gpud_maskcache_release(NULL), -EINVAL);
}

static void test_sharing(void **state)
{
	(void)state;
	struct gpud_maskcache *c = make(8, 1 << 20, 0);
	struct gpud_maskcache_entry *a, *b, *x;
	struct gpud_maskcache_stats st;
	uint32_t toks[3] = { 5, 20, 7 };
	uint32_t toks2[3] = { 5, 21, 7 };
	struct proto_mask_desc d = causal(3);
	/* The same mask spelled out row by row. */
	static const uint16_t r0[] = { 0 }, r1[] = { 0, 1 }, r2[] = { 0, 1, 2 },
			      r3[] = { 0, 1, 2, 3 };
	struct proto_mask_row rows[4] = { { r0, 1 }, { r1, 2 }, { r2, 3 }, { r3, 4 } };
	struct proto_mask_desc explicit_rows = { 3, rows };
	/* Chunks 1 and 2 hidden from each other: a different mask. */
	static const uint16_t b2[] = { 0, 2 };
	struct proto_mask_row brows[4] = { { r0, 1 }, { r1, 2 }, { b2, 2 }, { r3, 4 } };
	struct proto_mask_desc block = { 3, brows };

	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, toks, BT, &a), 0);
	assert_consistent(c);
	assert_mask_is(gpud_maskcache_mask(a), &d, toks, BT);
	assert_int_equal(gpud_maskcache_refs(a), 1);

	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, toks, BT, &b), 0);
	assert_ptr_equal(a, b);
	assert_int_equal(gpud_maskcache_refs(a), 2);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &explicit_rows, toks, BT, &x), 0);
	assert_ptr_equal(a, x); /* rows == NULL and all-visible rows are one mask */
	assert_int_equal(gpud_maskcache_refs(a), 3);
	assert_consistent(c);

	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.hits, 2);
	assert_int_equal(st.misses, 1);
	assert_int_equal(st.entries, 1);
	assert_int_equal(st.pinned, 1);
	assert_int_equal(st.bytes, gpud_mask_bytes(3, 32, BT));

	/* One token more, another block size, another vis row: new entries. */
	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, toks2, BT, &x), 0);
	assert_ptr_not_equal(x, a);
	assert_mask_is(gpud_maskcache_mask(x), &d, toks2, BT);
	assert_int_equal(gpud_maskcache_release(x), 0);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, toks, 2 * BT, &x), 0);
	assert_ptr_not_equal(x, a);
	assert_mask_is(gpud_maskcache_mask(x), &d, toks, 2 * BT);
	assert_int_equal(gpud_maskcache_release(x), 0);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &block, toks, BT, &x), 0);
	assert_ptr_not_equal(x, a);
	assert_mask_is(gpud_maskcache_mask(x), &block, toks, BT);
	assert_false(gpud_maskcache_mask(x)->causal);
	assert_int_equal(gpud_maskcache_release(x), 0);
	assert_consistent(c);

	/* No segments at all (a prompt-less request) is a mask too. */
	struct proto_mask_desc empty = causal(0);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &empty, NULL, BT, &x), 0);
	assert_mask_is(gpud_maskcache_mask(x), &empty, NULL, BT);
	assert_int_equal(gpud_maskcache_release(x), 0);

	for (int i = 0; i < 3; i++)
		assert_int_equal(gpud_maskcache_release(a), 0);
	assert_int_equal(gpud_maskcache_release(a), -EINVAL); /* no reference left */
	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.entries, 5);
	assert_int_equal(st.pinned, 0);
	assert_int_equal(st.misses, 5);
	assert_int_equal(st.evictions, 0);
	assert_consistent(c);

	/* Released entries stay cached: the next get is a hit. */
	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, toks, BT, &b), 0);
	assert_ptr_equal(a, b);
	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.hits, 3);
	assert_int_equal(gpud_maskcache_release(b), 0);
	gpud_maskcache_destroy(c);
}

static void test_errors(void **state)
{
	(void)state;
	struct gpud_maskcache *c = make(4, 1 << 20, 0);
	struct gpud_maskcache_entry *e = (struct gpud_maskcache_entry *)0x1;
	struct gpud_maskcache_stats st;
	uint32_t toks[9] = { 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	uint32_t big[2] = { 200, 57 }; /* 257 > 256 tokens */
	struct proto_mask_desc d = causal(2);
	struct proto_mask_desc nine = causal(9);
	static const uint16_t fwd[] = { 1 };
	static const uint16_t r1[] = { 1 }, r2[] = { 2 };
	struct proto_mask_row rows[3] = { { fwd, 1 }, { r1, 1 }, { r2, 1 } };
	struct proto_mask_desc bad = { 2, rows };

	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, big, BT, &e), SW_ETOOLONG);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &nine, toks, BT, &e), SW_ETOOLONG);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &bad, toks, BT, &e), SW_EFORMAT);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, toks, BT / 2, &e), -EINVAL);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, NULL, BT, &e), -EINVAL);
	assert_int_equal(gpud_maskcache_get_or_compile(c, NULL, toks, BT, &e), -EINVAL);
	assert_int_equal(gpud_maskcache_get_or_compile(NULL, &d, toks, BT, &e), -EINVAL);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, toks, BT, NULL), -EINVAL);
	assert_ptr_equal(e, (struct gpud_maskcache_entry *)0x1);
	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.entries, 0);
	assert_int_equal(st.hits + st.misses, 0);
	assert_consistent(c);

	/* A mask bigger than the whole byte budget can never fit. */
	struct gpud_maskcache *tiny = make(4, gpud_mask_bytes(2, 2, BT) - 1, 0);
	assert_int_equal(gpud_maskcache_get_or_compile(tiny, &d, toks, BT, &e), SW_ETOOLONG);
	assert_ptr_equal(e, (struct gpud_maskcache_entry *)0x1);
	assert_consistent(tiny);
	gpud_maskcache_stats(tiny, &st);
	assert_int_equal(st.entries, 0);
	assert_int_equal(st.misses, 1);
	gpud_maskcache_destroy(tiny);

	/* The largest admitted mask fits its slot. */
	uint32_t full[8] = { 32, 32, 32, 32, 32, 32, 32, 32 };
	struct proto_mask_desc eight = causal(8);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &eight, full, BT, &e), 0);
	assert_mask_is(gpud_maskcache_mask(e), &eight, full, BT);
	assert_int_equal(gpud_maskcache_release(e), 0);
	assert_consistent(c);
	gpud_maskcache_destroy(c);
}

/* Descriptor i: one causal segment of i + 1 tokens. */
static int get_n(struct gpud_maskcache *c, uint32_t i, struct gpud_maskcache_entry **e)
{
	uint32_t toks[1] = { i + 1 };
	struct proto_mask_desc d = causal(1);

	return gpud_maskcache_get_or_compile(c, &d, toks, BT, e);
}

static void test_eviction_order(void **state)
{
	(void)state;
	struct gpud_maskcache *c = make(3, 1 << 20, 0);
	struct gpud_maskcache_entry *e[8];
	struct gpud_maskcache_stats st;

	for (uint32_t i = 0; i < 3; i++) {
		assert_int_equal(get_n(c, i, &e[i]), 0);
		assert_int_equal(gpud_maskcache_release(e[i]), 0);
		assert_consistent(c);
	}
	/* Use 0 again: 1 is now the least recently used. */
	assert_int_equal(get_n(c, 0, &e[0]), 0);
	assert_int_equal(gpud_maskcache_release(e[0]), 0);
	assert_int_equal(get_n(c, 3, &e[3]), 0);
	assert_int_equal(gpud_maskcache_release(e[3]), 0);
	assert_consistent(c);
	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.evictions, 1);
	assert_int_equal(st.entries, 3);
	assert_int_equal(st.hits, 1);
	assert_int_equal(st.misses, 4);

	/* 2, 0, 3 are cached: three hits, recency unchanged. */
	assert_int_equal(get_n(c, 2, &e[2]), 0);
	assert_int_equal(gpud_maskcache_release(e[2]), 0);
	assert_int_equal(get_n(c, 0, &e[0]), 0);
	assert_int_equal(gpud_maskcache_release(e[0]), 0);
	assert_int_equal(get_n(c, 3, &e[3]), 0);
	assert_int_equal(gpud_maskcache_release(e[3]), 0);
	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.hits, 4);
	assert_int_equal(st.misses, 4);
	/* Recency now 2 < 0 < 3: bringing 1 back evicts 2. */
	assert_int_equal(get_n(c, 1, &e[1]), 0);
	assert_int_equal(gpud_maskcache_release(e[1]), 0);
	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.misses, 5);
	assert_int_equal(st.evictions, 2);
	assert_int_equal(get_n(c, 0, &e[0]), 0); /* still cached */
	assert_int_equal(gpud_maskcache_release(e[0]), 0);
	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.hits, 5);
	assert_int_equal(st.misses, 5);
	assert_consistent(c);

	gpud_maskcache_clear(c);
	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.entries, 0);
	assert_int_equal(st.bytes, 0);
	assert_int_equal(st.evictions, 5);
	assert_consistent(c);
	gpud_maskcache_destroy(c);
}

/* What the watchdog reads: a cache full of unpinned masks keeps its slots
 * (entries at the bound, nothing pinned: no leak); a pin that is never
 * released keeps its slot through any churn of other masks, and only
 * pinned slots count as held by requests. */
static void test_counts_cache_vs_pins(void **state)
{
	(void)state;
	struct gpud_maskcache *c = make(4, 1 << 20, 0);
	struct gpud_maskcache_entry *e, *leaked[2];
	struct gpud_maskcache_counts n;

	for (uint32_t i = 0; i < 20; i++) {
		assert_int_equal(get_n(c, i, &e), 0);
		gpud_maskcache_counts(c, &n);
		assert_int_equal(n.pinned, 1);
		assert_int_equal(gpud_maskcache_release(e), 0);
		assert_consistent(c);
	}
	gpud_maskcache_counts(c, &n);
	assert_int_equal(n.entries, 4);
	assert_int_equal(n.pinned, 0);
	assert_int_equal(n.pool_used, 4);
	assert_int_equal(n.pool_capacity, 5); /* + the spare */

	/* two masks "leak" (pinned, never released), then churn */
	assert_int_equal(get_n(c, 100, &leaked[0]), 0);
	assert_int_equal(get_n(c, 101, &leaked[1]), 0);
	for (uint32_t i = 0; i < 20; i++) {
		assert_int_equal(get_n(c, 200 + i, &e), 0);
		assert_int_equal(gpud_maskcache_release(e), 0);
	}
	assert_consistent(c);
	gpud_maskcache_counts(c, &n);
	assert_int_equal(n.entries, 4);
	assert_int_equal(n.pinned, 2);
	assert_int_equal(gpud_maskcache_refs(leaked[0]), 1);
	assert_int_equal(gpud_maskcache_refs(leaked[1]), 1);
	assert_int_equal(gpud_maskcache_release(leaked[0]), 0);
	assert_int_equal(gpud_maskcache_release(leaked[1]), 0);
	gpud_maskcache_counts(c, &n);
	assert_int_equal(n.pinned, 0);
	gpud_maskcache_destroy(c);
}

static void test_pinned_and_exhaustion(void **state)
{
	(void)state;
	struct gpud_maskcache *c = make(2, 1 << 20, 0);
	struct gpud_maskcache_entry *a, *b, *x = NULL;
	struct gpud_maskcache_stats before, after;

	assert_int_equal(get_n(c, 0, &a), 0);
	assert_int_equal(get_n(c, 1, &b), 0);
	gpud_maskcache_stats(c, &before);
	assert_int_equal(before.pinned, 2);

	/* Everything pinned, no room: refused, nothing cached changes. */
	assert_int_equal(get_n(c, 2, &x), SW_EEXHAUSTED);
	assert_null(x);
	assert_consistent(c);
	gpud_maskcache_stats(c, &after);
	assert_int_equal(after.entries, 2);
	assert_int_equal(after.pinned, 2);
	assert_int_equal(after.bytes, before.bytes);
	assert_int_equal(after.evictions, 0);
	assert_int_equal(after.exhausted, 1);
	assert_int_equal(gpud_maskcache_refs(a), 1);
	assert_int_equal(gpud_maskcache_refs(b), 1);
	assert_int_equal(gpud_maskcache_mask(a)->n_prompt, 1);

	/* Unpin b: now c evicts b, never the pinned a. */
	assert_int_equal(gpud_maskcache_release(b), 0);
	assert_int_equal(get_n(c, 2, &x), 0);
	assert_consistent(c);
	gpud_maskcache_stats(c, &after);
	assert_int_equal(after.evictions, 1);
	assert_int_equal(after.pinned, 2);
	assert_int_equal(gpud_maskcache_mask(a)->n_prompt, 1);
	assert_int_equal(gpud_maskcache_mask(x)->n_prompt, 3);
	assert_int_equal(gpud_maskcache_release(x), 0);
	assert_int_equal(gpud_maskcache_release(a), 0);
	gpud_maskcache_destroy(c);
}

static void test_byte_bound(void **state)
{
	(void)state;
	/* Masks of 100 tokens in one segment: 2*16 + 7*16 + 100 = 244 bytes. */
	size_t one = gpud_mask_bytes(1, 100, BT);
	struct gpud_maskcache *c = make(16, 2 * one + one / 2, 0);
	struct gpud_maskcache_entry *e[4];
	struct gpud_maskcache_stats st;
	struct proto_mask_desc d = causal(1);

	for (uint32_t i = 0; i < 4; i++) {
		uint32_t toks[1] = { 100 };
		/* Different masks of the same size: vary the block size. */
		assert_int_equal(gpud_maskcache_get_or_compile(c, &d, toks, BT * (i + 1), &e[i]), 0);
		assert_consistent(c);
		assert_int_equal(gpud_maskcache_release(e[i]), 0);
	}
	gpud_maskcache_stats(c, &st);
	assert_true(st.bytes <= 2 * one + one / 2);
	assert_true(st.evictions >= 1);
	assert_true(st.entries >= 2);

	/* A pinned entry that uses most of the budget blocks a second one. */
	gpud_maskcache_clear(c);
	uint32_t t1[1] = { 100 };
	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, t1, BT, &e[0]), 0);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, t1, 2 * BT, &e[1]), 0);
	assert_int_equal(gpud_maskcache_get_or_compile(c, &d, t1, 3 * BT, &e[2]), SW_EEXHAUSTED);
	assert_consistent(c);
	assert_int_equal(gpud_maskcache_release(e[0]), 0);
	assert_int_equal(gpud_maskcache_release(e[1]), 0);
	gpud_maskcache_destroy(c);
}

/* key_bits = 1: every descriptor lands on one of two keys. */
static void test_collisions(void **state)
{
	(void)state;
	struct gpud_maskcache *c = make(16, 1 << 20, 1);
	struct gpud_maskcache_entry *e[12], *again;
	struct gpud_maskcache_stats st;
	static const uint16_t r0[] = { 0 }, r1[] = { 1 }, r2[] = { 0, 2 };
	struct proto_mask_row hide[3] = { { r0, 1 }, { r1, 1 }, { r2, 2 } };

	for (uint32_t i = 0; i < 12; i++) {
		uint32_t toks[2] = { 1 + i % 6, 3 };
		struct proto_mask_desc d = causal(2);

		if (i >= 6)
			d.rows = hide; /* same lengths, other vis rows */
		assert_int_equal(gpud_maskcache_get_or_compile(c, &d, toks, BT, &e[i]), 0);
		assert_mask_is(gpud_maskcache_mask(e[i]), &d, toks, BT);
		for (uint32_t j = 0; j < i; j++)
			assert_ptr_not_equal(e[i], e[j]);
		assert_consistent(c);
	}
	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.misses, 12);
	assert_int_equal(st.entries, 12);
	for (uint32_t i = 0; i < 12; i++) {
		uint32_t toks[2] = { 1 + i % 6, 3 };
		struct proto_mask_desc d = causal(2);

		if (i >= 6)
			d.rows = hide;
		assert_int_equal(gpud_maskcache_get_or_compile(c, &d, toks, BT, &again), 0);
		assert_ptr_equal(again, e[i]);
		assert_int_equal(gpud_maskcache_release(again), 0);
		assert_int_equal(gpud_maskcache_release(e[i]), 0);
	}
	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.hits, 12);
	assert_int_equal(st.pinned, 0);
	assert_consistent(c);
	gpud_maskcache_destroy(c);
}

/* Random gets and releases against a model of an entry-bounded LRU whose
 * recency is the moment an entry last became unpinned. */
#define N_DESC 12
#define CAP 5
#define MAX_HELD 64

struct model {
	bool cached[N_DESC];
	uint32_t refs[N_DESC];
	uint64_t stamp[N_DESC];
	struct gpud_maskcache_entry *handle[N_DESC];
};

static void test_churn(void **state)
{
	(void)state;
	struct gpud_maskcache *c = make(CAP, 1 << 20, 3); /* 8 keys: collisions too */
	struct model m = { 0 };
	uint32_t toks[N_DESC][3];
	struct proto_mask_desc desc[N_DESC];
	uint32_t held[MAX_HELD], n_held = 0;
	uint64_t hits = 0, misses = 0, evictions = 0, clock = 0, rng = 12345;
	struct gpud_maskcache_stats st;

	for (uint32_t i = 0; i < N_DESC; i++) {
		toks[i][0] = 1 + i;
		toks[i][1] = 40 + 3 * i;
		toks[i][2] = 2;
		desc[i] = causal(1 + i % 3);
	}
	for (int op = 0; op < 4000; op++) {
		rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
		uint32_t r = (uint32_t)(rng >> 33);

		if (n_held > 0 && (r % 2 == 0 || n_held == MAX_HELD)) {
			uint32_t k = (r >> 1) % n_held, id = held[k];

			held[k] = held[--n_held];
			assert_int_equal(gpud_maskcache_release(m.handle[id]), 0);
			if (--m.refs[id] == 0)
				m.stamp[id] = ++clock;
		} else {
			uint32_t id = (r >> 1) % N_DESC, n_cached = 0, victim = N_DESC;
			struct gpud_maskcache_entry *e = NULL;
			int rc = gpud_maskcache_get_or_compile(c, &desc[id], toks[id], BT, &e);

			for (uint32_t j = 0; j < N_DESC; j++) {
				if (!m.cached[j])
					continue;
				n_cached++;
				if (m.refs[j] == 0 &&
				    (victim == N_DESC || m.stamp[j] < m.stamp[victim]))
					victim = j;
			}
			if (m.cached[id]) {
				assert_int_equal(rc, 0);
				assert_ptr_equal(e, m.handle[id]);
				hits++;
			} else if (n_cached == CAP && victim == N_DESC) {
				assert_int_equal(rc, SW_EEXHAUSTED);
				misses++;
				continue;
			} else {
				assert_int_equal(rc, 0);
				misses++;
				if (n_cached == CAP) {
					m.cached[victim] = false;
					evictions++;
				}
				m.cached[id] = true;
				m.handle[id] = e;
			}
			m.refs[id]++;
			held[n_held++] = id;
			assert_mask_is(gpud_maskcache_mask(e), &desc[id], toks[id], BT);
		}
		uint32_t n_cached = 0, n_pinned = 0;
		for (uint32_t j = 0; j < N_DESC; j++) {
			n_cached += m.cached[j];
			n_pinned += m.cached[j] && m.refs[j] > 0;
		}
		gpud_maskcache_stats(c, &st);
		assert_int_equal(st.hits, hits);
		assert_int_equal(st.misses, misses);
		assert_int_equal(st.evictions, evictions);
		assert_int_equal(st.entries, n_cached);
		assert_int_equal(st.pinned, n_pinned);
		assert_consistent(c);
	}
	assert_true(evictions > 10);
	assert_true(hits > 10);
	while (n_held > 0)
		assert_int_equal(gpud_maskcache_release(m.handle[held[--n_held]]), 0);
	gpud_maskcache_stats(c, &st);
	assert_int_equal(st.pinned, 0);
	gpud_maskcache_destroy(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_errors),
		cmocka_unit_test(test_sharing),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_eviction_order),
		cmocka_unit_test(test_pinned_and_exhaustion),
		cmocka_unit_test(test_counts_cache_vs_pins),
		cmocka_unit_test(test_byte_bound),
		cmocka_unit_test(test_collisions),
		cmocka_unit_test(test_churn),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
