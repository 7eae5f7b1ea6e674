/* kv.c - paged KV cache accounting: free list of block indices and a
 * fixed-length block table per sequence slot, all reserved at creation.
 *
 * The free list is an index pool (common/pool.h). The tables of every
 * slot live in one array of max_seqs * max_blocks_seq. A block may be in
 * several tables (an attached prefix) and held by outside owners (the
 * prefix cache): ref[b] counts both, hold[b] the outside holds, and the
 * block goes back to the pool when ref reaches 0. A block's pool owner tag
 * is its sequence slot + 1 while one sequence alone has it, KV_TAG_SHARED
 * once it was ever attached or held.
 */
#include "gpud/kv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/mem.h"
#include "common/pool.h"

/* Debug builds check the pool accounting after every change (DESIGN §2). */
#ifdef SW_DEBUG
#include <assert.h>
#define KV_ACCOUNT(kv)                                                              \
	assert((kv)->n_used == sw_pool_used((kv)->pool) &&                          \
	       sw_pool_used((kv)->pool) + sw_pool_free_count((kv)->pool) == (kv)->p.n_blocks)
#else
#define KV_ACCOUNT(kv) ((void)0)
#endif

#define KV_TAG_SHARED UINT64_MAX

struct kv_seq {
	uint32_t len;      /* positions written */
	uint32_t n_blocks; /* entries of the block table in use */
	bool used;
};

struct gpud_kv {
	struct gpud_kv_params p;
	uint32_t max_blocks_seq; /* ceil(max_ctx / block_tokens) */
	struct sw_pool *pool;    /* n_blocks indices; owner tag = slot + 1 */
	uint32_t n_used;         /* blocks with ref > 0, counted apart from the pool */
	uint32_t *ref;           /* (n_blocks) tables holding the block + holds */
	uint32_t *hold;          /* (n_blocks) outside holds */
	uint32_t *tables;        /* (max_seqs, max_blocks_seq) */
	struct kv_seq *seqs;     /* (max_seqs) */
	uint32_t n_seqs;
	uint32_t high;
	uint64_t exhausted;
	uint64_t n_freed;        /* sequences with blocks freed (test_leak) */
};

int gpud_kv_create(struct gpud_kv **out, const struct gpud_kv_params *p)
{
	struct gpud_kv *kv;

	*out = NULL;
	if (!p->n_blocks || !p->block_tokens || !p->max_seqs || !p->max_ctx)
		return -EINVAL;
	kv = calloc(1, sizeof(*kv));
	if (!kv)
		return -ENOMEM;
	kv->p = *p;
	kv->max_blocks_seq = (p->max_ctx + p->block_tokens - 1) / p->block_tokens;
	kv->tables = malloc(sizeof(*kv->tables) * (size_t)p->max_seqs * kv->max_blocks_seq);
	kv->seqs = calloc(p->max_seqs, sizeof(*kv->seqs));
	kv->ref = calloc(p->n_blocks, sizeof(*kv->ref));
	kv->hold = calloc(p->n_blocks, sizeof(*kv->hold));
	/* Backed now: tables and counts are written as blocks are used. */
	if (!kv->tables || !kv->seqs || !kv->ref || !kv->hold ||
	    sw_mem_prefault(kv->tables, sizeof(*kv->tables) * (size_t)p->max_seqs *
					kv->max_blocks_seq) ||
	    sw_mem_prefault(kv->ref, sizeof(*kv->ref) * p->n_blocks) ||
	    sw_mem_prefault(kv->hold, sizeof(*kv->hold) * p->n_blocks) ||
	    sw_pool_create_index(&kv->pool, "kv", p->n_blocks)) {
		gpud_kv_destroy(kv);
		return -ENOMEM;
	}
	*out = kv;
	return 0;
}

void gpud_kv_destroy(struct gpud_kv *kv)
{
	if (!kv)
		return;
	sw_pool_destroy(kv->pool);
	free(kv->tables);
	free(kv->seqs);
	free(kv->ref);
	free(kv->hold);
	free(kv);
}

bool gpud_kv_seq_valid(const struct gpud_kv *kv, uint32_t seq)
{
	return seq < kv->p.max_seqs && kv->seqs[seq].used;
}

static uint32_t *seq_table(const struct gpud_kv *kv, uint32_t seq)
{
	return kv->tables + (size_t)seq * kv->max_blocks_seq;
}

int gpud_kv_seq_new(struct gpud_kv *kv, uint32_t *seq)
{
	for (uint32_t s = 0; s < kv->p.max_seqs; s++) {
		if (kv->seqs[s].used)
			continue;
		kv->seqs[s] = (struct kv_seq){ .used = true };
		kv->n_seqs++;
		*seq = s;
		return 0;
	}
	return SW_EEXHAUSTED;
}

/* Drops one reference to block b; at 0 it goes back to the free list. */
static void unref(struct gpud_kv *kv, uint32_t b)
{
	if (--kv->ref[b])
		return;
	sw_pool_free_index(kv->pool, b);
	kv->n_used--;
}

/* Drops seq's table entries from index keep on (last first). */
static void release_from(struct gpud_kv *kv, uint32_t seq, uint32_t keep)
{
	struct kv_seq *s = &kv->seqs[seq];
	uint32_t *t = seq_table(kv, seq);

	while (s->n_blocks > keep)
		unref(kv, t[--s->n_blocks]);
	KV_ACCOUNT(kv);
}

/* True when block b is allocated and not this sequence's alone. */
static bool shared(const struct gpud_kv *kv, uint32_t b)
{
	return kv->ref[b] > 1 || kv->hold[b];
}

int gpud_kv_seq_free(struct gpud_kv *kv, uint32_t seq)
{
	if (!gpud_kv_seq_valid(kv, seq))
		return -EINVAL;
	if (kv->p.test_leak && kv->seqs[seq].n_blocks && ++kv->n_freed % kv->p.test_leak == 0)
		gpud_kv_block_hold(kv, seq_table(kv, seq)[kv->seqs[seq].n_blocks - 1]); /* kv.h */
	release_from(kv, seq, 0);
	kv->seqs[seq] = (struct kv_seq){ 0 };
	kv->n_seqs--;
	return 0;
}

int gpud_kv_reserve(struct gpud_kv *kv, uint32_t seq, uint32_t n_tokens)
{
	struct kv_seq *s;
	uint32_t need, *t;

	if (!gpud_kv_seq_valid(kv, seq))
		return -EINVAL;
	if (n_tokens > kv->p.max_ctx)
		return SW_ETOOLONG;
	s = &kv->seqs[seq];
	need = (n_tokens + kv->p.block_tokens - 1) / kv->p.block_tokens;
	if (need <= s->n_blocks)
		return 0;
	if (need - s->n_blocks > sw_pool_free_count(kv->pool)) {
		kv->exhausted++;
		return SW_EEXHAUSTED;
	}
	t = seq_table(kv, seq);
	while (s->n_blocks < need) {
		/* Cannot fail: the free count was checked above. */
		sw_pool_alloc_index(kv->pool, (uint64_t)seq + 1, &t[s->n_blocks]);
		kv->ref[t[s->n_blocks++]] = 1;
		kv->n_used++;
	}
	if (kv->n_used > kv->high)
		kv->high = kv->n_used;
	KV_ACCOUNT(kv);
	return 0;
}

int gpud_kv_set_len(struct gpud_kv *kv, uint32_t seq, uint32_t n)
{
	if (!gpud_kv_seq_valid(kv, seq) || n > kv->seqs[seq].n_blocks * kv->p.block_tokens)
		return -EINVAL;
	kv->seqs[seq].len = n;
	return 0;
}

int gpud_kv_truncate(struct gpud_kv *kv, uint32_t seq, uint32_t n)
{
	uint32_t bt = kv->p.block_tokens;

	if (!gpud_kv_seq_valid(kv, seq) || n > kv->seqs[seq].len)
		return -EINVAL;
	/* A kept block cut in the middle would be written again: never a
	 * shared one. */
	if (n % bt && n / bt < kv->seqs[seq].n_blocks && n < kv->seqs[seq].len &&
	    shared(kv, seq_table(kv, seq)[n / bt]))
		return -EINVAL;
	kv->seqs[seq].len = n;
	release_from(kv, seq, (n + kv->p.block_tokens - 1) / kv->p.block_tokens);
	return 0;
}

int gpud_kv_seq_attach(struct gpud_kv *kv, uint32_t seq, const uint32_t *blocks, uint32_t n)
{
	struct kv_seq *s;
	uint32_t *t;

	if (!gpud_kv_seq_valid(kv, seq) || kv->seqs[seq].n_blocks || kv->seqs[seq].len ||
	    (n && !blocks))
		return -EINVAL;
	if ((uint64_t)n * kv->p.block_tokens > kv->p.max_ctx)
		return SW_ETOOLONG;
	for (uint32_t j = 0; j < n; j++)
		if (blocks[j] >= kv->p.n_blocks || !kv->ref[blocks[j]])
			return -EINVAL;
	s = &kv->seqs[seq];
	t = seq_table(kv, seq);
	for (uint32_t j = 0; j < n; j++) {
		t[j] = blocks[j];
		kv->ref[blocks[j]]++;
		sw_pool_set_owner(kv->pool, blocks[j], KV_TAG_SHARED);
	}
	s->n_blocks = n;
	s->len = n * kv->p.block_tokens;
	return 0;
}

int gpud_kv_block_hold(struct gpud_kv *kv, uint32_t block)
{
	if (block >= kv->p.n_blocks || !kv->ref[block])
		return -EINVAL;
	kv->ref[block]++;
	kv->hold[block]++;
	sw_pool_set_owner(kv->pool, block, KV_TAG_SHARED);
	return 0;
}

int gpud_kv_block_take(struct gpud_kv *kv, uint32_t *block)
{
	if (!sw_pool_free_count(kv->pool)) {
		kv->exhausted++;
		return SW_EEXHAUSTED;
	}
	/* Cannot fail: a block is free. */
	sw_pool_alloc_index(kv->pool, KV_TAG_SHARED, block);
	kv->ref[*block] = 1;
	kv->hold[*block] = 1;
	if (++kv->n_used > kv->high)
		kv->high = kv->n_used;
	KV_ACCOUNT(kv);
	return 0;
}

int gpud_kv_block_release(struct gpud_kv *kv, uint32_t block)
{
	if (block >= kv->p.n_blocks || !kv->hold[block])
		return -EINVAL;
	kv->hold[block]--;
	unref(kv, block);
	KV_ACCOUNT(kv);
	return 0;
}

uint32_t gpud_kv_block_refs(const struct gpud_kv *kv, uint32_t block)
{
	return block < kv->p.n_blocks ? kv->ref[block] : 0;
}

uint32_t gpud_kv_seq_len(const struct gpud_kv *kv, uint32_t seq)
{
	return gpud_kv_seq_valid(kv, seq) ? kv->seqs[seq].len : 0;
}

uint32_t gpud_kv_seq_capacity(const struct gpud_kv *kv, uint32_t seq)
{
	return gpud_kv_seq_valid(kv, seq) ? kv->seqs[seq].n_blocks * kv->p.block_tokens : 0;
}

const uint32_t *gpud_kv_block_table(const struct gpud_kv *kv, uint32_t seq, uint32_t *n)
{
	if (!gpud_kv_seq_valid(kv, seq)) {
		*n = 0;
		return NULL;
	}
	*n = kv->seqs[seq].n_blocks;
	return seq_table(kv, seq);
}

uint32_t gpud_kv_block_tokens(const struct gpud_kv *kv) { return kv->p.block_tokens; }
uint32_t gpud_kv_max_seqs(const struct gpud_kv *kv) { return kv->p.max_seqs; }
uint32_t gpud_kv_max_ctx(const struct gpud_kv *kv) { return kv->p.max_ctx; }
uint32_t gpud_kv_free_blocks(const struct gpud_kv *kv) { return sw_pool_free_count(kv->pool); }

void gpud_kv_stats(const struct gpud_kv *kv, struct gpud_kv_stats *st)
{
	st->n_blocks = kv->p.n_blocks;
	st->free = sw_pool_free_count(kv->pool);
	st->used = kv->n_used;
	st->high = kv->high;
	st->seqs = kv->n_seqs;
	st->exhausted = kv->exhausted;
}

int gpud_kv_check(const struct gpud_kv *kv, char *err, size_t errlen)
{
	uint32_t n = kv->p.n_blocks, owned = 0, seqs = 0;
	uint32_t *seen;
	int rc;

	/* The pool marks blocks while it walks its free list and restores
	 * them before returning: logically const. */
	rc = sw_pool_check((struct sw_pool *)kv->pool, err, errlen);
	if (rc)
		return rc;
	seen = calloc(n, sizeof(*seen));
	if (!seen)
		return -ENOMEM;
	for (uint32_t s = 0; s < kv->p.max_seqs && !rc; s++) {
		const struct kv_seq *q = &kv->seqs[s];
		if (!q->used) {
			if (q->n_blocks || q->len)
				rc = sw_seterr(err, errlen, SW_EFORMAT,
					       "kv: free slot %u holds blocks", s);
			continue;
		}
		seqs++;
		if (q->len > q->n_blocks * kv->p.block_tokens || q->n_blocks > kv->max_blocks_seq)
			rc = sw_seterr(err, errlen, SW_EFORMAT,
				       "kv: seq %u length %u exceeds its %u blocks", s,
				       q->len, q->n_blocks);
		for (uint32_t j = 0; j < q->n_blocks && !rc; j++) {
			uint32_t b = seq_table(kv, s)[j];
			uint64_t owner = 0;
			if (b >= n || sw_pool_owner(kv->pool, b, &owner) ||
			    (owner != (uint64_t)s + 1 && owner != KV_TAG_SHARED)) {
				rc = sw_seterr(err, errlen, SW_EFORMAT,
					       "kv: seq %u entry %u (block %u) bad, free or owned "
					       "by another", s, j, b);
				break;
			}
			seen[b]++;
		}
	}
	/* every block: ref == tables holding it + outside holds; ref 0 xor
	 * allocated in the pool */
	for (uint32_t b = 0; b < n && !rc; b++) {
		bool used = sw_pool_is_used(kv->pool, b);
		if (kv->ref[b] != seen[b] + kv->hold[b] || used != (kv->ref[b] > 0))
			rc = sw_seterr(err, errlen, SW_EFORMAT,
				       "kv: block %u has %u references, %u tables + %u holds, %s",
				       b, kv->ref[b], seen[b], kv->hold[b], used ? "used" : "free");
		else if (used)
			owned++;
	}
	if (!rc && (owned != kv->n_used || owned != sw_pool_used(kv->pool)))
		rc = sw_seterr(err, errlen, SW_EFORMAT, "kv: %u blocks referenced, counted %u, "
			       "pool says %u", owned, kv->n_used, sw_pool_used(kv->pool));
	if (!rc && seqs != kv->n_seqs)
		rc = sw_seterr(err, errlen, SW_EFORMAT, "kv: %u slots in use, counted %u",
			       seqs, kv->n_seqs);
	free(seen);
	return rc;
}
