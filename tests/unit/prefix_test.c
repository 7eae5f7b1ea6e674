/* prefix_test.c - the prefix KV cache index: keys by (parent, tokens,
 * attention pattern), verified hits, misses under another mask, users and
 * the LRU list, eviction under the byte bound, forced hash collisions,
 * stale parents after eviction, exhaustion and bad arguments; beside a
 * KV pool, the blocks live requests hold (what the trough watchdog
 * watches) apart from those only the cache keeps, leaks included. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "gpud/kv.h"
#include "gpud/mask.h"
#include "gpud/prefix.h"

#define BT 4
#define NONE GPUD_PREFIX_ROOT

static struct gpud_prefix *mk(uint32_t n_blocks, size_t max_bytes, uint32_t key_bits)
{
	struct gpud_prefix_params p = { .n_blocks = n_blocks, .block_tokens = BT,
					.block_bytes = 100, .max_bytes = max_bytes,
					.test_key_bits = key_bits };
	struct gpud_prefix *pc = NULL;

	assert_int_equal(gpud_prefix_create(&pc, &p), 0);
	assert_non_null(pc);
	return pc;
}

static void check(const struct gpud_prefix *pc)
{
	char err[SW_ERR_MAX] = "";

	if (gpud_prefix_check(pc, err, sizeof(err)))
		fail_msg("%s", err);
}

static uint32_t insert_ok(struct gpud_prefix *pc, uint32_t parent, const int32_t *t,
			  const struct gpud_mask *m, uint32_t pos0, uint32_t block)
{
	uint32_t e = 12345;

	assert_int_equal(gpud_prefix_insert(pc, parent, t, m, pos0, block, &e), 0);
	assert_int_equal(gpud_prefix_block(pc, e), block);
	assert_int_equal(gpud_prefix_block_entry(pc, block), e);
	check(pc);
	return e;
}

static void test_bad_params(void **state)
{
	(void)state;
	struct gpud_prefix_params p = { .n_blocks = 4, .block_tokens = BT, .block_bytes = 1 };
	struct gpud_prefix *pc = (void *)1;

	p.n_blocks = 0;
	assert_int_equal(gpud_prefix_create(&pc, &p), -EINVAL);
	assert_null(pc);
	p.n_blocks = 4;
	p.block_tokens = 0;
	assert_int_equal(gpud_prefix_create(&pc, &p), -EINVAL);
	p.block_tokens = 5000;
	assert_int_equal(gpud_prefix_create(&pc, &p), -EINVAL);
	p.block_tokens = BT;
	p.block_bytes = 0;
	assert_int_equal(gpud_prefix_create(&pc, &p), -EINVAL);
	p.block_bytes = 1;
	p.test_key_bits = 65;
	assert_int_equal(gpud_prefix_create(&pc, &p), -EINVAL);
	gpud_prefix_destroy(NULL);
}

/* A chain of two blocks: hits need the same parent and the same tokens. */
static void test_chain_hits_and_misses(void **state)
{
	(void)state;
	struct gpud_prefix *pc = mk(8, 1000, 0);
	int32_t a[BT] = { 1, 2, 3, 4 }, b[BT] = { 5, 6, 7, 8 }, c[BT] = { 1, 2, 3, 5 };
	uint32_t ea, eb, e;
	struct gpud_prefix_stats st;

	assert_int_equal(gpud_prefix_lookup(pc, NONE, a, NULL, 0, &e), SW_ENOTFOUND);
	ea = insert_ok(pc, NONE, a, NULL, 0, 3);
	eb = insert_ok(pc, ea, b, NULL, BT, 6);
	assert_int_equal(gpud_prefix_users(pc, ea), 1);
	assert_int_not_equal(gpud_prefix_key(pc, ea), gpud_prefix_key(pc, eb));
	/* the same chain hits, entry by entry */
	assert_int_equal(gpud_prefix_lookup(pc, NONE, a, NULL, 0, &e), 0);
	assert_int_equal(e, ea);
	assert_int_equal(gpud_prefix_lookup(pc, ea, b, NULL, BT, &e), 0);
	assert_int_equal(e, eb);
	assert_int_equal(gpud_prefix_users(pc, ea), 2);
	assert_int_equal(gpud_prefix_users(pc, eb), 2);
	/* other tokens, or the right tokens after another parent: miss */
	assert_int_equal(gpud_prefix_lookup(pc, NONE, c, NULL, 0, &e), SW_ENOTFOUND);
	assert_int_equal(gpud_prefix_lookup(pc, NONE, b, NULL, 0, &e), SW_ENOTFOUND);
	/* an identical insert is refused: the caller keeps its own copy */
	assert_int_equal(gpud_prefix_insert(pc, NONE, a, NULL, 0, 4, &e), -EEXIST);
	/* bad arguments */
	assert_int_equal(gpud_prefix_insert(pc, NONE, c, NULL, 0, 3, &e), -EINVAL); /* cached */
	assert_int_equal(gpud_prefix_insert(pc, NONE, c, NULL, 0, 8, &e), -EINVAL); /* range */
	assert_int_equal(gpud_prefix_insert(pc, 7, c, NULL, 0, 1, &e), -EINVAL);    /* free parent */
	assert_int_equal(gpud_prefix_lookup(pc, 99, c, NULL, 0, &e), -EINVAL);
	assert_int_equal(gpud_prefix_block_entry(pc, 0), NONE);
	assert_int_equal(gpud_prefix_block_entry(pc, 99), NONE);
	gpud_prefix_account(pc, 2, 1);
	gpud_prefix_stats(pc, &st);
	assert_int_equal(st.hits, 2);
	assert_int_equal(st.misses, 1);
	assert_int_equal(st.hit_tokens, 2 * BT);
	assert_int_equal(st.inserts, 2);
	assert_int_equal(st.entries, 2);
	assert_int_equal(st.unreferenced, 0);
	assert_int_equal(st.bytes, 0);
	assert_int_equal(st.max_bytes, 1000);
	check(pc);
	gpud_prefix_destroy(pc);
}

/* A peek (placement's probe) finds the same chain as a lookup but takes
 * no user and leaves the LRU order alone. */
static void test_peek(void **state)
{
	(void)state;
	struct gpud_prefix *pc = mk(8, 1000, 0);
	int32_t a[BT] = { 1, 2, 3, 4 }, b[BT] = { 5, 6, 7, 8 }, c[BT] = { 1, 2, 3, 5 };
	uint32_t ea, eb, e = 77, blk;
	struct gpud_prefix_stats st;

	assert_int_equal(gpud_prefix_peek(pc, NONE, a, NULL, 0, &e), SW_ENOTFOUND);
	assert_int_equal(e, 77);
	ea = insert_ok(pc, NONE, a, NULL, 0, 3);
	eb = insert_ok(pc, ea, b, NULL, BT, 6);
	gpud_prefix_release(pc, eb); /* last first: eb is the least recent */
	gpud_prefix_release(pc, ea);
	assert_int_equal(gpud_prefix_peek(pc, NONE, a, NULL, 0, &e), 0);
	assert_int_equal(e, ea);
	assert_int_equal(gpud_prefix_peek(pc, ea, b, NULL, BT, &e), 0);
	assert_int_equal(e, eb);
	assert_int_equal(gpud_prefix_peek(pc, NONE, c, NULL, 0, &e), SW_ENOTFOUND);
	assert_int_equal(gpud_prefix_peek(pc, ea, a, NULL, BT, &e), SW_ENOTFOUND);
	assert_int_equal(gpud_prefix_peek(pc, 99, a, NULL, 0, &e), -EINVAL);
	assert_int_equal(gpud_prefix_users(pc, ea), 0);
	assert_int_equal(gpud_prefix_users(pc, eb), 0);
	gpud_prefix_stats(pc, &st);
	assert_int_equal(st.unreferenced, 2);
	assert_int_equal(st.hits + st.misses, 0);
	check(pc);
	/* the peeks did not refresh eb: it is still evicted first */
	assert_int_equal(gpud_prefix_evict(pc, &blk), 0);
	assert_int_equal(blk, 6);
	assert_int_equal(gpud_prefix_evict(pc, &blk), 0);
	assert_int_equal(blk, 3);
	check(pc);
	gpud_prefix_destroy(pc);
}

/* The key is the attention pattern of the block's tokens: another segment
 * boundary or another vis row misses; a mask that differs elsewhere (a
 * later segment, G's row) but gives these tokens the same pattern hits. */
static void test_mask_pattern(void **state)
{
	(void)state;
	struct gpud_prefix *pc = mk(16, 1000, 0);
	int32_t t[2 * BT] = { 11, 12, 13, 14, 15, 16, 17, 18 };
	static _Alignas(16) uint8_t mem[5][1024];
	struct gpud_mask m_sep, m_sep_g, m_vis, m_cut, m_one;
	uint16_t r0[] = { 0 }, r1[] = { 1 }, r01[] = { 0, 1 }, r2[] = { 0, 1, 2 }, r2b[] = { 2 };
	struct proto_mask_row sep[3] = { { r0, 1 }, { r1, 1 }, { r2, 3 } };
	struct proto_mask_row sep_g[3] = { { r0, 1 }, { r1, 1 }, { r2b, 1 } };
	struct proto_mask_row vis[3] = { { r0, 1 }, { r01, 2 }, { r2, 3 } };
	struct proto_mask_desc d_sep = { 2, sep }, d_sep_g = { 2, sep_g }, d_vis = { 2, vis };
	struct proto_mask_row one[2] = { { r0, 1 }, { r01, 2 } };
	struct proto_mask_desc d_one = { 1, one };
	uint32_t l44[2] = { 4, 4 }, l26[2] = { 2, 6 }, l8[1] = { 8 };
	uint32_t e0, e1, e;

	assert_int_equal(gpud_mask_compile(&d_sep, l44, BT, mem[0], sizeof(mem[0]), &m_sep), 0);
	assert_int_equal(gpud_mask_compile(&d_sep_g, l44, BT, mem[1], sizeof(mem[1]), &m_sep_g), 0);
	assert_int_equal(gpud_mask_compile(&d_vis, l44, BT, mem[2], sizeof(mem[2]), &m_vis), 0);
	assert_int_equal(gpud_mask_compile(&d_sep, l26, BT, mem[3], sizeof(mem[3]), &m_cut), 0);
	assert_int_equal(gpud_mask_compile(&d_one, l8, BT, mem[4], sizeof(mem[4]), &m_one), 0);
	/* segment 1 (tokens 4..7) does not see segment 0 */
	e0 = insert_ok(pc, NONE, t, &m_sep, 0, 0);
	e1 = insert_ok(pc, e0, t + BT, &m_sep, BT, 1);
	/* G's row differs, the prompt blocks' patterns do not: both hit */
	assert_int_equal(gpud_prefix_lookup(pc, NONE, t, &m_sep_g, 0, &e), 0);
	assert_int_equal(e, e0);
	assert_int_equal(gpud_prefix_lookup(pc, e0, t + BT, &m_sep_g, BT, &e), 0);
	assert_int_equal(e, e1);
	/* segment 1 sees segment 0: block 0 is the same, block 1 is not */
	assert_int_equal(gpud_prefix_lookup(pc, NONE, t, &m_vis, 0, &e), 0);
	assert_int_equal(e, e0);
	assert_int_equal(gpud_prefix_lookup(pc, e0, t + BT, &m_vis, BT, &e), SW_ENOTFOUND);
	/* the boundary moved into block 0: it misses already */
	assert_int_equal(gpud_prefix_lookup(pc, NONE, t, &m_cut, 0, &e), SW_ENOTFOUND);
	/* no mask vs one segment (causal): the same pattern, both hit each
	 * other; vs the two-segment mask, block 0 (all segment 0) matches too */
	e = insert_ok(pc, NONE, t + BT, NULL, 0, 5);
	assert_int_equal(gpud_prefix_lookup(pc, NONE, t + BT, &m_one, 0, &e1), 0);
	assert_int_equal(e1, e);
	assert_int_equal(gpud_prefix_lookup(pc, NONE, t, NULL, 0, &e), 0);
	assert_int_equal(e, e0);
	check(pc);
	gpud_prefix_destroy(pc);
}

/* Entries with no user are LRU-listed, bounded in bytes and evicted
 * least recently released first; a lookup takes one off the list. */
static void test_lru_bound(void **state)
{
	(void)state;
	struct gpud_prefix *pc = mk(8, 250, 0); /* 100-byte blocks: 2 unreferenced fit */
	int32_t t[4][BT] = { { 1, 1, 1, 1 }, { 2, 2, 2, 2 }, { 3, 3, 3, 3 }, { 4, 4, 4, 4 } };
	uint32_t e[4], x, b;
	struct gpud_prefix_stats st;

	for (int i = 0; i < 4; i++)
		e[i] = insert_ok(pc, NONE, t[i], NULL, 0, (uint32_t)i + 2);
	assert_int_equal(gpud_prefix_evict(pc, &b), SW_ENOTFOUND); /* all in use */
	assert_false(gpud_prefix_over_bound(pc));
	gpud_prefix_release(pc, e[2]);
	gpud_prefix_release(pc, e[0]);
	assert_false(gpud_prefix_over_bound(pc));
	gpud_prefix_release(pc, e[3]);
	gpud_prefix_stats(pc, &st);
	assert_int_equal(st.unreferenced, 3);
	assert_int_equal(st.bytes, 300);
	assert_true(gpud_prefix_over_bound(pc));
	check(pc);
	/* a hit on e[2] takes it off the list: e[0] is now the oldest */
	assert_int_equal(gpud_prefix_lookup(pc, NONE, t[2], NULL, 0, &x), 0);
	assert_int_equal(x, e[2]);
	assert_false(gpud_prefix_over_bound(pc));
	gpud_prefix_release(pc, e[2]);
	assert_int_equal(gpud_prefix_evict(pc, &b), 0);
	assert_int_equal(b, 2); /* e[0]'s block */
	assert_int_equal(gpud_prefix_block_entry(pc, 2), NONE);
	assert_int_equal(gpud_prefix_lookup(pc, NONE, t[0], NULL, 0, &x), SW_ENOTFOUND);
	assert_false(gpud_prefix_over_bound(pc));
	assert_int_equal(gpud_prefix_evict(pc, &b), 0);
	assert_int_equal(b, 5); /* e[3] */
	assert_int_equal(gpud_prefix_evict(pc, &b), 0);
	assert_int_equal(b, 4); /* e[2], released last */
	assert_int_equal(gpud_prefix_evict(pc, &b), SW_ENOTFOUND);
	/* a release below zero users is ignored */
	gpud_prefix_release(pc, e[1]);
	gpud_prefix_release(pc, e[1]);
	gpud_prefix_stats(pc, &st);
	assert_int_equal(st.unreferenced, 1);
	assert_int_equal(st.evictions, 3);
	assert_int_equal(st.entries, 1);
	check(pc);
	gpud_prefix_destroy(pc);
}

/* With keys cut to one bit nearly everything collides; lookups still find
 * exactly the right entries and never another one. */
static void test_forced_collisions(void **state)
{
	(void)state;
	enum { N = 16 };
	struct gpud_prefix *pc = mk(N, 100 * N, 1);
	int32_t t[N][BT];
	uint32_t e[N], x;
	struct gpud_prefix_stats st;

	for (int i = 0; i < N; i++) {
		for (int j = 0; j < BT; j++)
			t[i][j] = i * 7 + j;
		e[i] = insert_ok(pc, i ? e[i - 1] : NONE, t[i], NULL, (uint32_t)i * BT,
				 (uint32_t)(N - 1 - i));
		assert_true(gpud_prefix_key(pc, e[i]) <= 1);
	}
	for (int i = 0; i < N; i++) {
		assert_int_equal(gpud_prefix_lookup(pc, i ? e[i - 1] : NONE, t[i], NULL,
						    (uint32_t)i * BT, &x), 0);
		assert_int_equal(x, e[i]);
		assert_int_equal(gpud_prefix_block(pc, x), N - 1 - i);
	}
	/* right tokens, wrong parent; right parent, wrong tokens: misses */
	assert_int_equal(gpud_prefix_lookup(pc, e[3], t[5], NULL, 5 * BT, &x), SW_ENOTFOUND);
	assert_int_equal(gpud_prefix_lookup(pc, e[4], t[6], NULL, 5 * BT, &x), SW_ENOTFOUND);
	gpud_prefix_stats(pc, &st);
	assert_true(st.collisions > 0);
	/* block 0 is cached already */
	assert_int_equal(gpud_prefix_insert(pc, NONE, t[1], NULL, 0, 0, &x), -EINVAL);
	check(pc);
	gpud_prefix_destroy(pc);
}

/* An evicted parent's slot reused by another block is not the parent of
 * the old children any more; the cache runs out of entries cleanly. */
static void test_stale_parent_and_exhaustion(void **state)
{
	(void)state;
	struct gpud_prefix *pc = mk(3, 1000, 0);
	int32_t a[BT] = { 1, 2, 3, 4 }, b[BT] = { 5, 6, 7, 8 }, c[BT] = { 9, 9, 9, 9 };
	uint32_t ea, eb, ec, x, blk;

	ea = insert_ok(pc, NONE, a, NULL, 0, 0);
	eb = insert_ok(pc, ea, b, NULL, BT, 1);
	ec = insert_ok(pc, NONE, c, NULL, 0, 2);
	assert_int_equal(gpud_prefix_insert(pc, NONE, b, NULL, 0, 1, &x), -EINVAL);
	gpud_prefix_release(pc, ec);
	gpud_prefix_release(pc, ea); /* the parent goes first, its child stays used */
	assert_int_equal(gpud_prefix_evict(pc, &blk), 0);
	assert_int_equal(blk, 2);
	assert_int_equal(gpud_prefix_evict(pc, &blk), 0);
	assert_int_equal(blk, 0);
	/* the freed entry is reused for another first block with a's tokens
	 * under another mask... here simply a new block 0 of a */
	x = insert_ok(pc, NONE, a, NULL, 0, 0);
	/* the old child still names the evicted generation: a miss */
	assert_int_equal(gpud_prefix_lookup(pc, x, b, NULL, BT, &ec), SW_ENOTFOUND);
	gpud_prefix_release(pc, eb);
	gpud_prefix_release(pc, x);
	check(pc);
	gpud_prefix_destroy(pc);
}

/* --- what the trough watchdog reads (gpud/daemon_device.c) ------------------
 * KV blocks held by live requests = kv used - prefix entries with no user
 * (blocks only the cache keeps). Below, requests go through the KV pool
 * and the index the way the scheduler drives them; live() must equal the
 * blocks in live sequences' tables plus whatever leaked, however full the
 * cache is. */

struct wreq {
	uint32_t seq, ent[8], n_ent;
};

static uint32_t live(const struct gpud_kv *kv, const struct gpud_prefix *pc, uint32_t *cached)
{
	struct gpud_kv_stats ks;
	struct gpud_prefix_stats ps;

	gpud_kv_stats(kv, &ks);
	gpud_prefix_stats(pc, &ps);
	*cached = ps.unreferenced;
	return ks.used - ps.unreferenced;
}

/* Admits a prompt of n full blocks (token t + j in block j) plus one
 * partial block: hits attached, the rest reserved, the full ones cached. */
static void wreq_run(struct gpud_kv *kv, struct gpud_prefix *pc, struct wreq *r, int32_t t,
		     uint32_t n)
{
	uint32_t hits = 0, blocks[8], nb, e;
	const uint32_t *tab;
	int32_t tok[8][BT];

	assert_true(n < 8);
	for (uint32_t j = 0; j < n; j++)
		for (uint32_t i = 0; i < BT; i++)
			tok[j][i] = t + (int32_t)j;
	r->n_ent = 0;
	while (hits < n && !gpud_prefix_lookup(pc, hits ? r->ent[hits - 1] : NONE, tok[hits],
					       NULL, hits * BT, &e)) {
		r->ent[r->n_ent++] = e;
		blocks[hits++] = gpud_prefix_block(pc, e);
	}
	assert_int_equal(gpud_kv_seq_new(kv, &r->seq), 0);
	assert_int_equal(gpud_kv_seq_attach(kv, r->seq, blocks, hits), 0);
	assert_int_equal(gpud_kv_reserve(kv, r->seq, n * BT + 2), 0);
	assert_int_equal(gpud_kv_set_len(kv, r->seq, n * BT + 2), 0);
	tab = gpud_kv_block_table(kv, r->seq, &nb);
	for (uint32_t j = hits; j < n; j++) {
		if (gpud_prefix_insert(pc, j ? r->ent[j - 1] : NONE, tok[j], NULL, j * BT, tab[j],
				       &e))
			break;
		assert_int_equal(gpud_kv_block_hold(kv, tab[j]), 0);
		r->ent[r->n_ent++] = e;
	}
}

/* Ends it (keep_users: entries it fails to release, a leak), then trims
 * the cache to its bound. */
static void wreq_end(struct gpud_kv *kv, struct gpud_prefix *pc, struct wreq *r,
		     uint32_t keep_users)
{
	uint32_t b;

	assert_int_equal(gpud_kv_seq_free(kv, r->seq), 0);
	while (r->n_ent > keep_users)
		gpud_prefix_release(pc, r->ent[--r->n_ent]);
	while (gpud_prefix_over_bound(pc) && !gpud_prefix_evict(pc, &b))
		assert_int_equal(gpud_kv_block_release(kv, b), 0);
}

static struct gpud_kv *wkv(bool leak)
{
	struct gpud_kv_params p = { .n_blocks = 64, .block_tokens = BT, .max_seqs = 4,
				    .max_ctx = 64, .test_leak = leak ? 1 : 0 };
	struct gpud_kv *kv = NULL;

	assert_int_equal(gpud_kv_create(&kv, &p), 0);
	return kv;
}

static void wdrain(struct gpud_kv *kv, struct gpud_prefix *pc)
{
	uint32_t b;

	while (!gpud_prefix_evict(pc, &b))
		gpud_kv_block_release(kv, b);
	gpud_prefix_destroy(pc);
	gpud_kv_destroy(kv);
}

/* Shared prefixes and a cache filling to its bound and evicting: live is
 * what running requests hold and 0 between them, whatever the cache
 * keeps. */
static void test_live_blocks_beside_cache(void **state)
{
	(void)state;
	struct gpud_kv *kv = wkv(false);
	struct gpud_prefix *pc = mk(64, 1000, 0); /* 10 unreferenced blocks */
	struct gpud_prefix_stats ps;
	struct wreq a, b;
	uint32_t cached;

	wreq_run(kv, pc, &a, 100, 3); /* 4 blocks, 3 cached */
	assert_int_equal(live(kv, pc, &cached), 4);
	assert_int_equal(cached, 0);
	wreq_run(kv, pc, &b, 100, 3); /* 3 hits shared + 1 private */
	assert_int_equal(b.n_ent, 3);
	assert_int_equal(live(kv, pc, &cached), 5);
	wreq_end(kv, pc, &a, 0);
	assert_int_equal(live(kv, pc, &cached), 4); /* a's private block went */
	wreq_end(kv, pc, &b, 0);
	assert_int_equal(live(kv, pc, &cached), 0);
	assert_int_equal(cached, 3);
	for (int32_t i = 0; i < 40; i++) {
		wreq_run(kv, pc, &a, 1000 + 10 * i, 2);
		assert_int_equal(live(kv, pc, &cached), 3);
		wreq_end(kv, pc, &a, 0);
		assert_int_equal(live(kv, pc, &cached), 0);
		assert_true(cached <= 10);
	}
	gpud_prefix_stats(pc, &ps);
	assert_int_equal(ps.unreferenced, 10); /* full */
	assert_true(ps.evictions >= 70);
	check(pc);
	wdrain(kv, pc);
}

/* Leaks behind a full cache: a request that keeps its first cached block
 * (a user never released), and KV's planted leak (a hold on each freed
 * sequence's last block). Each leaked block counts as live at once and
 * stays live through any churn. */
static void test_live_blocks_count_leaks(void **state)
{
	(void)state;
	struct gpud_kv *kv = wkv(false);
	struct gpud_prefix *pc = mk(64, 500, 0); /* 5 unreferenced blocks */
	struct wreq a;
	uint32_t cached;

	for (int32_t i = 0; i < 30; i++) { /* fill the cache */
		wreq_run(kv, pc, &a, 10 * i, 2);
		wreq_end(kv, pc, &a, 0);
	}
	for (uint32_t i = 0; i < 6; i++) {
		wreq_run(kv, pc, &a, 5000 + 10 * (int32_t)i, 2);
		wreq_end(kv, pc, &a, 1); /* its first block stays in use */
		assert_int_equal(live(kv, pc, &cached), i + 1);
		assert_int_equal(cached, 5);
		wreq_run(kv, pc, &a, 9000 + 10 * (int32_t)i, 3); /* churn */
		wreq_end(kv, pc, &a, 0);
		assert_int_equal(live(kv, pc, &cached), i + 1);
	}
	wdrain(kv, pc);

	kv = wkv(true);
	pc = mk(64, 500, 0);
	for (uint32_t i = 0; i < 20; i++) {
		wreq_run(kv, pc, &a, 10 * (int32_t)i, 2);
		wreq_end(kv, pc, &a, 0);
		assert_int_equal(live(kv, pc, &cached), i + 1);
		assert_true(cached <= 5);
	}
	assert_int_equal(cached, 5);
	wdrain(kv, pc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bad_params),
		cmocka_unit_test(test_chain_hits_and_misses),
		cmocka_unit_test(test_peek),
		cmocka_unit_test(test_mask_pattern),
		cmocka_unit_test(test_lru_bound),
		cmocka_unit_test(test_forced_collisions),
		cmocka_unit_test(test_stale_parent_and_exhaustion),
		cmocka_unit_test(test_live_blocks_beside_cache),
		cmocka_unit_test(test_live_blocks_count_leaks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
