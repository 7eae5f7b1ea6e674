/* chunk.c - the chunk-KV cache index (chunk.h): entries over pages (one
 * KV block and its block_tokens token ids each), an LRU over the entries
 * (common/lru, with the tokens as the real key), free lists for both.
 */
#include "gpud/chunk.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"
#include "common/lru.h"

#define NO_PAGE UINT32_MAX

struct rec {
	uint32_t n_tokens;
	uint32_t n_pages;
	uint32_t first;    /* first page; pages chain through next[] */
	int32_t pos0;
	struct sw_lru_entry *h;
};

struct probe {
	const int32_t *tokens;
	uint32_t n;
};

struct gpud_chunk {
	struct gpud_chunk_params p;
	uint32_t n_pages;      /* capacity */
	uint32_t used_pages;
	struct sw_lru *lru;
	struct rec *recs;      /* (n_pages) */
	uint32_t *free_recs;   /* (n_pages) stack */
	uint32_t n_free_recs;
	uint32_t *next;        /* (n_pages) chain, NO_PAGE at the end */
	uint32_t *blk;         /* (n_pages) KV block of each page */
	int32_t *toks;         /* (n_pages, block_tokens) */
	uint32_t *free_pages;  /* (n_pages) stack */
	uint8_t *held;         /* (max_blocks) 1: KV block held by a page */
	uint32_t n_free_pages;
	uint64_t hits, misses, hit_tokens;
};

static uint64_t key_of(const int32_t *tokens, uint32_t n)
{
	return sw_hash64(tokens, (size_t)n * sizeof(*tokens), 0x63686b6bULL + n);
}

static bool rec_eq(void *ctx, const void *value, const void *probe)
{
	const struct gpud_chunk *c = ctx;
	const struct rec *r = value;
	const struct probe *q = probe;
	uint32_t bt = c->p.block_tokens, pg = r->first;

	if (r->n_tokens != q->n)
		return false;
	for (uint32_t j = 0; j < q->n; j += bt, pg = c->next[pg]) {
		uint32_t k = q->n - j < bt ? q->n - j : bt;
		if (memcmp(c->toks + (size_t)pg * bt, q->tokens + j, k * sizeof(int32_t)))
			return false;
	}
	return true;
}

/* Every entry leaving the LRU: blocks back to their owner, pages and the
 * record back to the free lists. */
static void rec_evict(void *ctx, uint64_t key, void *value, size_t bytes)
{
	struct gpud_chunk *c = ctx;
	struct rec *r = value;

	(void)key;
	(void)bytes;
	for (uint32_t pg = r->first; pg != NO_PAGE;) {
		uint32_t nx = c->next[pg];
		c->held[c->blk[pg]] = 0;
		c->p.release(c->p.ctx, c->blk[pg]);
		c->free_pages[c->n_free_pages++] = pg;
		pg = nx;
	}
	c->used_pages -= r->n_pages;
	*r = (struct rec){ .first = NO_PAGE };
	c->free_recs[c->n_free_recs++] = (uint32_t)(r - c->recs);
}

int gpud_chunk_create(struct gpud_chunk **out, const struct gpud_chunk_params *p)
{
	struct gpud_chunk *c;
	size_t pages;

	*out = NULL;
	if (!p->block_tokens || p->block_tokens > 4096 || !p->block_bytes || !p->release ||
	    !p->max_blocks)
		return -EINVAL;
	pages = p->max_bytes / p->block_bytes;
	if (pages > p->max_blocks)
		pages = p->max_blocks;
	if (!pages || pages > (1u << 30))
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->p = *p;
	c->n_pages = (uint32_t)pages;
	c->recs = calloc(pages, sizeof(*c->recs));
	c->free_recs = calloc(pages, sizeof(*c->free_recs));
	c->next = calloc(pages, sizeof(*c->next));
	c->blk = calloc(pages, sizeof(*c->blk));
	c->toks = calloc(pages * p->block_tokens, sizeof(*c->toks));
	c->free_pages = calloc(pages, sizeof(*c->free_pages));
	c->held = calloc(p->max_blocks, 1);
	if (!c->held || !c->recs || !c->free_recs || !c->next || !c->blk || !c->toks ||
	    !c->free_pages ||
	    sw_lru_create(&c->lru, &(struct sw_lru_params){
				  .name = "chunk-kv", .max_bytes = pages * p->block_bytes,
				  .max_entries = (uint32_t)pages, .evict = rec_evict,
				  .eq = rec_eq, .ctx = c })) {
		gpud_chunk_destroy(c);
		return -ENOMEM;
	}
	/* Popped from the end: page 0 and record 0 first. */
	for (uint32_t i = 0; i < c->n_pages; i++) {
		c->free_pages[i] = c->n_pages - 1 - i;
		c->free_recs[i] = c->n_pages - 1 - i;
		c->recs[i].first = NO_PAGE;
	}
	c->n_free_pages = c->n_free_recs = c->n_pages;
	*out = c;
	return 0;
}

void gpud_chunk_destroy(struct gpud_chunk *c)
{
	if (!c)
		return;
	sw_lru_destroy(c->lru); /* every entry through rec_evict */
	free(c->recs);
	free(c->free_recs);
	free(c->next);
	free(c->blk);
	free(c->toks);
	free(c->free_pages);
	free(c->held);
	free(c);
}

int gpud_chunk_find(struct gpud_chunk *c, const int32_t *tokens, uint32_t n,
		    struct gpud_chunk_hit *hit, uint32_t *blocks)
{
	struct probe q = { tokens, n };
	struct sw_lru_entry *h;
	const struct rec *r;
	uint32_t j = 0;

	h = n ? sw_lru_get(c->lru, key_of(tokens, n), &q) : NULL;
	if (!h)
		return SW_ENOTFOUND;
	r = sw_lru_value(h);
	for (uint32_t pg = r->first; pg != NO_PAGE; pg = c->next[pg])
		blocks[j++] = c->blk[pg];
	*hit = (struct gpud_chunk_hit){ .handle = h, .pos0 = r->pos0, .n_blocks = r->n_pages };
	return 0;
}

void gpud_chunk_account(struct gpud_chunk *c, uint32_t hits, uint64_t hit_tokens,
			uint32_t misses)
{
	c->hits += hits;
	c->hit_tokens += hit_tokens;
	c->misses += misses;
}

void gpud_chunk_unpin(struct gpud_chunk *c, struct gpud_chunk_hit *hit)
{
	if (hit->handle)
		sw_lru_unpin(c->lru, hit->handle);
	hit->handle = NULL;
}

bool gpud_chunk_contains(const struct gpud_chunk *c, const int32_t *tokens, uint32_t n)
{
	struct probe q = { tokens, n };

	return n && sw_lru_peek(c->lru, key_of(tokens, n), &q);
}

int gpud_chunk_make_room(struct gpud_chunk *c, uint32_t n_blocks)
{
	struct sw_lru_stats st;

	if (n_blocks > c->n_pages)
		return SW_ETOOLONG;
	sw_lru_stats(c->lru, &st);
	/* Pinned pages stay: check first so that nothing is evicted in vain. */
	if (n_blocks > c->n_pages - st.pinned_bytes / c->p.block_bytes)
		return SW_ETOOLONG;
	while (c->n_pages - c->used_pages < n_blocks)
		if (sw_lru_evict_one(c->lru))
			return SW_ETOOLONG;
	return 0;
}

int gpud_chunk_insert(struct gpud_chunk *c, const int32_t *tokens, uint32_t n, int32_t pos0,
		      const uint32_t *blocks)
{
	uint32_t bt = c->p.block_tokens, np = (n + bt - 1) / bt, ri, prev = NO_PAGE;
	struct probe q = { tokens, n };
	struct rec *r;
	int rc;

	if (!n)
		return -EINVAL;
	if (gpud_chunk_contains(c, tokens, n))
		return -EEXIST;
	if (np > c->n_free_pages || !c->n_free_recs)
		return SW_ETOOLONG;
	ri = c->free_recs[--c->n_free_recs];
	r = &c->recs[ri];
	*r = (struct rec){ .n_tokens = n, .n_pages = np, .first = NO_PAGE, .pos0 = pos0 };
	for (uint32_t j = 0; j < np; j++) {
		uint32_t pg = c->free_pages[--c->n_free_pages];
		uint32_t k = n - j * bt < bt ? n - j * bt : bt;

		c->blk[pg] = blocks[j];
		c->next[pg] = NO_PAGE;
		memcpy(c->toks + (size_t)pg * bt, tokens + (size_t)j * bt, k * sizeof(int32_t));
		if (prev == NO_PAGE)
			r->first = pg;
		else
			c->next[prev] = pg;
		prev = pg;
	}
	for (uint32_t j = 0; j < np; j++)
		if (blocks[j] >= c->p.max_blocks || c->held[blocks[j]])
			goto out_unwind;
	c->used_pages += np;
	rc = sw_lru_insert(c->lru, key_of(tokens, n), &q, r, (size_t)np * c->p.block_bytes,
			   false, &r->h);
	if (!rc) {
		for (uint32_t j = 0; j < np; j++)
			c->held[blocks[j]] = 1;
		return 0;
	}
	c->used_pages -= np;
	rc = rc == -EEXIST ? rc : SW_ETOOLONG;
	goto out_free;
out_unwind:
	rc = -EINVAL;
out_free:
	/* Not owned: pages and record back, blocks stay the caller's. */
	for (uint32_t pg = r->first; pg != NO_PAGE; pg = c->next[pg])
		c->free_pages[c->n_free_pages++] = pg;
	*r = (struct rec){ .first = NO_PAGE };
	c->free_recs[c->n_free_recs++] = ri;
	return rc;
}

int gpud_chunk_evict(struct gpud_chunk *c)
{
	return sw_lru_evict_one(c->lru);
}

bool gpud_chunk_holds(const struct gpud_chunk *c, uint32_t block)
{
	return block < c->p.max_blocks && c->held[block];
}

uint32_t gpud_chunk_blocks(const struct gpud_chunk *c)
{
	return c->used_pages;
}

void gpud_chunk_stats(const struct gpud_chunk *c, struct gpud_chunk_stats *st)
{
	struct sw_lru_stats ls;

	sw_lru_stats(c->lru, &ls);
	*st = (struct gpud_chunk_stats){
		.hits = c->hits,
		.misses = c->misses,
		.hit_tokens = c->hit_tokens,
		.inserts = ls.inserts,
		.evictions = ls.evictions,
		.entries = ls.entries,
		.blocks = c->used_pages,
		.bytes = (size_t)c->used_pages * c->p.block_bytes,
		.max_bytes = (size_t)c->n_pages * c->p.block_bytes,
	};
}
