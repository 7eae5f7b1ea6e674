/* maskcache.c - compiled masks in fixed slots, indexed by a pinning LRU.
 *
 * The entry records live in an array indexed by slot number, so a slot and
 * its record come and go together and need no second free list. sw_lru
 * owns recency, pinning and both bounds; its evict callback gives the slot
 * back to the pool.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"
#include "common/lru.h"
#include "common/mem.h"
#include "common/pool.h"
#include "gpud/maskcache.h"

#define MASKCACHE_SEED 0x6d63616368652d31ULL /* "mcache-1" */

struct gpud_maskcache_entry {
	struct gpud_maskcache *cache;
	struct sw_lru_entry *le;   /* NULL while the slot is free */
	struct gpud_mask mask;     /* arrays point into the slot */
	const uint32_t *seg_lens;  /* (n_segments) copy, in the slot */
	size_t bytes;              /* gpud_mask_bytes() of this mask */
	uint32_t slot;
};

struct gpud_maskcache {
	struct sw_pool *pool;      /* (max_entries + 1) slots of slot_bytes */
	struct sw_lru *lru;
	struct gpud_maskcache_entry *ent; /* (max_entries + 1), by slot */
	uint32_t max_segments, max_prompt, block_tokens;
	size_t slot_bytes, lens_off;
	uint64_t key_mask;
	uint64_t exhausted;
};

/* What a lookup compares against a cached entry. */
struct probe {
	uint32_t n_segments, block_tokens;
	const uint32_t *seg_tokens; /* (n_segments) */
	const gpud_segset *vis;     /* (n_segments + 1) */
};

static bool entry_eq(void *ctx, const void *value, const void *probe)
{
	const struct gpud_maskcache_entry *e = value;
	const struct probe *p = probe;
	(void)ctx;

	if (e->mask.n_segments != p->n_segments || e->mask.block_tokens != p->block_tokens)
		return false;
	if (p->n_segments &&
	    memcmp(e->seg_lens, p->seg_tokens, p->n_segments * sizeof(*p->seg_tokens)))
		return false;
	return memcmp(e->mask.vis, p->vis, (p->n_segments + 1) * sizeof(*p->vis)) == 0;
}

static void entry_evict(void *ctx, uint64_t key, void *value, size_t bytes)
{
	struct gpud_maskcache *c = ctx;
	struct gpud_maskcache_entry *e = value;
	(void)key;
	(void)bytes;

	e->le = NULL;
	sw_pool_free_index(c->pool, e->slot);
}

int gpud_maskcache_create(struct gpud_maskcache **out, const struct gpud_maskcache_params *p)
{
	struct gpud_maskcache *c;
	struct sw_lru_params lp;
	size_t mask_max;
	uint32_t i, n_slots;
	int rc;

	if (!out || !p || p->max_segments == 0 || p->max_segments > GPUD_MASK_MAX_SEGMENTS ||
	    p->max_prompt_tokens == 0 || p->block_tokens == 0 || p->max_entries == 0 ||
	    p->max_entries > (1u << 30) || p->max_bytes == 0 || p->key_bits > 63)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->max_segments = p->max_segments;
	c->max_prompt = p->max_prompt_tokens;
	c->block_tokens = p->block_tokens;
	c->key_mask = p->key_bits ? (1ULL << p->key_bits) - 1 : UINT64_MAX;
	mask_max = gpud_mask_bytes(p->max_segments, p->max_prompt_tokens, p->block_tokens);
	c->lens_off = (mask_max + 15) & ~(size_t)15;
	c->slot_bytes = c->lens_off + (size_t)p->max_segments * sizeof(uint32_t);
	c->slot_bytes = (c->slot_bytes + 63) & ~(size_t)63; /* as the pool rounds it */
	n_slots = p->max_entries + 1;

	c->ent = calloc(n_slots, sizeof(*c->ent));
	if (!c->ent) {
		rc = -ENOMEM;
		goto out_free_cache;
	}
	rc = sw_pool_create(&c->pool, p->name ? p->name : "mask", c->slot_bytes, n_slots, 64);
	if (rc)
		goto out_free_ent;
	/* Backed now: slots are written as masks are compiled, for hours. */
	rc = sw_mem_prefault(sw_pool_ptr(c->pool, 0), c->slot_bytes * n_slots);
	if (!rc)
		rc = sw_mem_prefault(c->ent, n_slots * sizeof(*c->ent));
	if (rc)
		goto out_destroy_pool;
	lp = (struct sw_lru_params){
		.name = p->name ? p->name : "mask",
		.max_bytes = p->max_bytes,
		.max_entries = p->max_entries,
		.evict = entry_evict,
		.eq = entry_eq,
		.ctx = c,
	};
	rc = sw_lru_create(&c->lru, &lp);
	if (rc)
		goto out_destroy_pool;
	for (i = 0; i < n_slots; i++) {
		c->ent[i].cache = c;
		c->ent[i].slot = i;
	}
	*out = c;
	return 0;

out_destroy_pool:
	sw_pool_destroy(c->pool);
out_free_ent:
	free(c->ent);
out_free_cache:
	free(c);
	return rc;
}

void gpud_maskcache_destroy(struct gpud_maskcache *c)
{
	if (!c)
		return;
	sw_lru_destroy(c->lru); /* evicts everything through entry_evict */
	sw_pool_destroy(c->pool);
	free(c->ent);
	free(c);
}

/* The vis rows exactly as gpud_mask_compile builds them, so that the key
 * and the equality test see rows == NULL and an explicit all-visible
 * descriptor as the same mask. desc is valid. */
static void build_vis(const struct proto_mask_desc *desc, gpud_segset *vis)
{
	uint32_t s = desc->n_segments, i, j;

	memset(vis, 0, ((size_t)s + 1) * sizeof(*vis));
	for (i = 0; i <= s; i++) {
		if (desc->rows) {
			for (j = 0; j < desc->rows[i].n; j++)
				gpud_segset_add(&vis[i], desc->rows[i].idx[j]);
		} else {
			for (j = 0; j < i; j++)
				gpud_segset_add(&vis[i], j);
		}
		gpud_segset_add(&vis[i], i);
	}
}

static uint64_t probe_key(const struct gpud_maskcache *c, const struct probe *p)
{
	uint32_t head[2] = { p->n_segments, p->block_tokens };
	uint64_t h = sw_hash64(head, sizeof(head), MASKCACHE_SEED);

	h = sw_hash_combine(h, sw_hash64(p->seg_tokens, (size_t)p->n_segments * sizeof(uint32_t),
					 MASKCACHE_SEED));
	h = sw_hash_combine(h, sw_hash64(p->vis, ((size_t)p->n_segments + 1) * sizeof(*p->vis),
					 MASKCACHE_SEED));
	return h & c->key_mask;
}

int gpud_maskcache_get_or_compile(struct gpud_maskcache *c, const struct proto_mask_desc *desc,
				  const uint32_t *seg_tokens, uint32_t block_tokens,
				  struct gpud_maskcache_entry **out)
{
	gpud_segset vis[GPUD_MASK_MAX_SEGMENTS + 1];
	struct gpud_maskcache_entry *e;
	struct sw_lru_entry *le;
	struct probe pr;
	uint64_t key, total = 0;
	uint32_t i, slot;
	size_t need;
	void *mem;
	int rc;

	if (!c || !desc || !out || block_tokens < c->block_tokens)
		return -EINVAL;
	rc = proto_mask_validate(desc, c->max_segments, NULL, 0);
	if (rc)
		return rc;
	if (desc->n_segments > 0 && !seg_tokens)
		return -EINVAL;
	for (i = 0; i < desc->n_segments; i++)
		total += seg_tokens[i];
	if (total > c->max_prompt)
		return SW_ETOOLONG;

	build_vis(desc, vis);
	pr = (struct probe){ desc->n_segments, block_tokens, seg_tokens, vis };
	key = probe_key(c, &pr);
	le = sw_lru_get(c->lru, key, &pr);
	if (le) {
		*out = sw_lru_value(le);
		return 0;
	}

	/* Miss: compile into a free slot (there is always one: the spare). */
	rc = sw_pool_alloc_index(c->pool, key, &slot);
	if (rc)
		return rc; /* cannot happen while the accounting holds */
	e = &c->ent[slot];
	mem = sw_pool_ptr(c->pool, slot);
	need = gpud_mask_bytes(desc->n_segments, (uint32_t)total, block_tokens);
	rc = gpud_mask_compile(desc, seg_tokens, block_tokens, mem, c->lens_off, &e->mask);
	if (rc)
		goto out_free_slot;
	if (desc->n_segments)
		memcpy((char *)mem + c->lens_off, seg_tokens, desc->n_segments * sizeof(uint32_t));
	e->seg_lens = (const uint32_t *)((char *)mem + c->lens_off);
	e->bytes = need;
	rc = sw_lru_insert(c->lru, key, &pr, e, need, true, &le);
	if (rc) {
		if (rc == SW_EPINNED) {
			c->exhausted++;
			rc = SW_EEXHAUSTED;
		}
		goto out_free_slot;
	}
	e->le = le;
	*out = e;
	return 0;

out_free_slot:
	sw_pool_free_index(c->pool, slot);
	return rc;
}

const struct gpud_mask *gpud_maskcache_mask(const struct gpud_maskcache_entry *e)
{
	return &e->mask;
}

uint32_t gpud_maskcache_refs(const struct gpud_maskcache_entry *e)
{
	return e && e->le ? sw_lru_refs(e->le) : 0;
}

int gpud_maskcache_release(struct gpud_maskcache_entry *e)
{
	if (!e || !e->le)
		return -EINVAL;
	return sw_lru_unpin(e->cache->lru, e->le);
}

void gpud_maskcache_clear(struct gpud_maskcache *c)
{
	sw_lru_clear(c->lru);
}

void gpud_maskcache_stats(const struct gpud_maskcache *c, struct gpud_maskcache_stats *st)
{
	struct sw_lru_stats ls;
	struct sw_pool_stats ps;

	sw_lru_stats(c->lru, &ls);
	sw_pool_stats(c->pool, &ps);
	*st = (struct gpud_maskcache_stats){
		.hits = ls.hits,
		.misses = ls.misses,
		.evictions = ls.evictions,
		.exhausted = c->exhausted,
		.bytes = ls.bytes,
		.max_bytes = ls.max_bytes,
		.entries = ls.entries,
		.max_entries = ls.max_entries,
		.pinned = ls.pinned,
		.slot_bytes = c->slot_bytes,
		.reserved_bytes = c->slot_bytes * ps.capacity,
		.pool_used = ps.used,
		.pool_free = ps.free,
		.pool_capacity = ps.capacity,
	};
}

void gpud_maskcache_counts(const struct gpud_maskcache *c, struct gpud_maskcache_counts *n)
{
	struct sw_lru_stats ls;

	sw_lru_stats(c->lru, &ls);
	*n = (struct gpud_maskcache_counts){
		.entries = ls.entries,
		.pinned = ls.pinned,
		.pool_used = sw_pool_used(c->pool),
		.pool_capacity = sw_pool_capacity(c->pool),
	};
}

int gpud_maskcache_check(struct gpud_maskcache *c, char *err, size_t errlen)
{
	struct sw_lru_stats ls;
	uint32_t i, live = 0, cap;
	size_t bytes = 0;
	int rc;

	rc = sw_pool_check(c->pool, err, errlen);
	if (rc)
		return rc;
	sw_lru_stats(c->lru, &ls);
	cap = sw_pool_capacity(c->pool);
	for (i = 0; i < cap; i++) {
		bool used = sw_pool_is_used(c->pool, i);

		if (!!c->ent[i].le != used)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "maskcache: slot %u is %s but its entry is %s", i,
					 used ? "used" : "free", c->ent[i].le ? "cached" : "free");
		if (used) {
			live++;
			bytes += c->ent[i].bytes;
		}
	}
	if (live != ls.entries || bytes != ls.bytes)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "maskcache: %u slots / %zu bytes used, LRU holds %u / %zu", live,
				 bytes, ls.entries, ls.bytes);
	if (live > cap - 1)
		return sw_seterr(err, errlen, SW_EFORMAT, "maskcache: spare slot taken");
	return 0;
}
