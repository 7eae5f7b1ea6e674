/* prefix.c - prefix KV cache index (see prefix.h).
 *
 * Entries live in one array of n_blocks; free entries are chained through
 * `next_free`. Recency, pinning and the hash table are common/lru's: every
 * live entry is in an sw_lru whose u64 key is the block key, whose value
 * is the entry, and whose refcount is the entry's user count, so entries
 * with no user are exactly its unpinned ones, evicted least recently
 * released first. The lru bounds nothing itself (max_entries = n_blocks,
 * max_bytes unbounded): the bound on unreferenced bytes is the caller's
 * loop over gpud_prefix_over_bound and gpud_prefix_evict, which must hand
 * every evicted block back. Each entry's record (tokens, segment ids,
 * vis rows: block_tokens * 21 bytes) lives in one array beside it and is
 * compared byte for byte, through the lru's eq callback, on every key
 * match.
 */
#include "gpud/prefix.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"
#include "common/lru.h"
#include "common/mem.h"
#include "gpud/mask.h"

#define NONE UINT32_MAX
#define ROOT_KEY 0x70726566697852ULL /* parent key of a first block */
#define REC_SEED 0x6b76626c6f636bULL

struct entry {
	uint64_t key;
	uint32_t parent, parent_gen; /* parent entry and its gen when inserted */
	uint32_t gen;                /* bumped at each eviction of this slot */
	uint32_t block;              /* NONE: the entry is free */
	uint32_t next_free;          /* free list */
	struct sw_lru_entry *h;      /* in pc->lru while live; NULL when free */
};

/* What a lookup or insert looks for, besides the key and the record in
 * pc->probe (the lru's eq callback compares both). */
struct probe {
	uint32_t parent, parent_gen;
};

struct gpud_prefix {
	struct gpud_prefix_params p;
	size_t rec_bytes;
	struct entry *ents;    /* (n_blocks) */
	uint8_t *recs;         /* (n_blocks, rec_bytes) */
	uint8_t *probe;        /* (rec_bytes) record being looked up */
	struct sw_lru *lru;    /* the live entries */
	uint32_t *by_block;    /* (n_blocks) entry of each KV block or NONE */
	uint32_t free_head;
	uint32_t evicted;      /* block of the entry the lru evicted last */
	uint64_t key_mask;
	struct gpud_prefix_stats st; /* hits, misses, hit_tokens, collisions */
};

static uint32_t idx_of(const struct gpud_prefix *pc, const struct entry *e)
{
	return (uint32_t)(e - pc->ents);
}

static uint8_t *rec_of(const struct gpud_prefix *pc, uint32_t e)
{
	return pc->recs + (size_t)e * pc->rec_bytes;
}

/* The lru's eq: the entry is the probed one (parent, its generation and
 * the record); a key match that is not counts as a collision. */
static bool entry_eq(void *ctx, const void *value, const void *probe)
{
	struct gpud_prefix *pc = ctx;
	const struct entry *e = value;
	const struct probe *pr = probe;

	if (e->parent == pr->parent && e->parent_gen == pr->parent_gen &&
	    !memcmp(rec_of(pc, idx_of(pc, e)), pc->probe, pc->rec_bytes))
		return true;
	pc->st.collisions++;
	return false;
}

/* The lru's evict callback (gpud_prefix_evict, and every entry at
 * destroy): the entry goes back to the free list, its block to
 * pc->evicted. */
static void entry_evicted(void *ctx, uint64_t key, void *value, size_t bytes)
{
	struct gpud_prefix *pc = ctx;
	struct entry *e = value;

	(void)key;
	(void)bytes;
	pc->evicted = e->block;
	pc->by_block[e->block] = NONE;
	e->block = NONE;
	e->gen++;
	e->h = NULL;
	e->next_free = pc->free_head;
	pc->free_head = idx_of(pc, e);
}

int gpud_prefix_create(struct gpud_prefix **out, const struct gpud_prefix_params *p)
{
	struct gpud_prefix *pc;
	struct sw_lru_params lp;

	*out = NULL;
	if (!p->n_blocks || !p->block_tokens || p->block_tokens > 4096 || !p->block_bytes ||
	    p->n_blocks > (1u << 30) || p->test_key_bits > 64)
		return -EINVAL;
	pc = calloc(1, sizeof(*pc));
	if (!pc)
		return -ENOMEM;
	pc->p = *p;
	pc->rec_bytes = (size_t)p->block_tokens * (sizeof(int32_t) + 1 + sizeof(gpud_segset));
	pc->ents = calloc(p->n_blocks, sizeof(*pc->ents));
	pc->recs = malloc(pc->rec_bytes * p->n_blocks);
	pc->probe = malloc(pc->rec_bytes);
	pc->by_block = malloc(sizeof(*pc->by_block) * p->n_blocks);
	lp = (struct sw_lru_params){
		.name = "prefix", .max_bytes = SIZE_MAX, .max_entries = p->n_blocks,
		.evict = entry_evicted, .eq = entry_eq, .ctx = pc,
	};
	/* Entries and records are written as blocks are cached, for hours:
	 * backed now, so that the RSS does not climb as the cache fills. */
	if (!pc->ents || !pc->recs || !pc->probe || !pc->by_block ||
	    sw_mem_prefault(pc->ents, sizeof(*pc->ents) * p->n_blocks) ||
	    sw_mem_prefault(pc->recs, pc->rec_bytes * p->n_blocks) ||
	    sw_lru_create(&pc->lru, &lp)) {
		gpud_prefix_destroy(pc);
		return -ENOMEM;
	}
	memset(pc->by_block, 0xff, sizeof(*pc->by_block) * p->n_blocks);
	for (uint32_t i = 0; i < p->n_blocks; i++) {
		pc->ents[i].block = NONE;
		pc->ents[i].next_free = i + 1 < p->n_blocks ? i + 1 : NONE;
	}
	pc->free_head = 0;
	pc->key_mask = !p->test_key_bits || p->test_key_bits == 64 ? UINT64_MAX :
		       (1ULL << p->test_key_bits) - 1;
	pc->st.max_bytes = p->max_bytes;
	*out = pc;
	return 0;
}

void gpud_prefix_destroy(struct gpud_prefix *pc)
{
	if (!pc)
		return;
	sw_lru_destroy(pc->lru); /* frees every entry through entry_evicted */
	free(pc->ents);
	free(pc->recs);
	free(pc->probe);
	free(pc->by_block);
	free(pc);
}

/* Fills the probe record for one block and returns its key. */
static uint64_t make_probe(struct gpud_prefix *pc, uint32_t parent, const int32_t *tokens,
			   const struct gpud_mask *mask, uint32_t pos0)
{
	uint32_t bt = pc->p.block_tokens;
	uint8_t *segs = pc->probe + (size_t)bt * sizeof(int32_t);
	uint8_t *vis = segs + bt;
	uint64_t parent_key = parent == GPUD_PREFIX_ROOT ? ROOT_KEY : pc->ents[parent].key;

	memcpy(pc->probe, tokens, (size_t)bt * sizeof(int32_t));
	for (uint32_t i = 0; i < bt; i++) {
		gpud_segset v = { { 1, 0 } };
		unsigned sg = 0;

		if (mask) {
			sg = gpud_mask_seg(mask, pos0 + i);
			v = mask->vis[sg];
		}
		segs[i] = (uint8_t)sg;
		memcpy(vis + (size_t)i * sizeof(v), &v, sizeof(v));
	}
	return sw_hash_combine(parent_key, sw_hash64(pc->probe, pc->rec_bytes, REC_SEED)) &
	       pc->key_mask;
}

static bool bad_parent(const struct gpud_prefix *pc, uint32_t parent)
{
	return parent != GPUD_PREFIX_ROOT &&
	       (parent >= pc->p.n_blocks || pc->ents[parent].block == NONE);
}

/* The live entry equal to the probe record under parent, or NULL. Counts
 * collisions (entry_eq), nothing else; recency untouched. */
static struct entry *find(struct gpud_prefix *pc, uint64_t key, uint32_t parent)
{
	struct probe pr = {
		.parent = parent,
		.parent_gen = parent == GPUD_PREFIX_ROOT ? 0 : pc->ents[parent].gen,
	};
	struct sw_lru_entry *h = sw_lru_peek(pc->lru, key, &pr);

	return h ? sw_lru_value(h) : NULL;
}

/* Entries with no user: the lru's unpinned ones. */
static uint32_t n_unref(const struct gpud_prefix *pc)
{
	struct sw_lru_stats ls;

	sw_lru_stats(pc->lru, &ls);
	return ls.entries - ls.pinned;
}

int gpud_prefix_peek(struct gpud_prefix *pc, uint32_t parent, const int32_t *tokens,
		     const struct gpud_mask *mask, uint32_t pos0, uint32_t *entry)
{
	struct entry *e;

	if (bad_parent(pc, parent))
		return -EINVAL;
	e = find(pc, make_probe(pc, parent, tokens, mask, pos0), parent);
	if (!e)
		return SW_ENOTFOUND;
	*entry = idx_of(pc, e);
	return 0;
}

int gpud_prefix_lookup(struct gpud_prefix *pc, uint32_t parent, const int32_t *tokens,
		       const struct gpud_mask *mask, uint32_t pos0, uint32_t *entry)
{
	int rc = gpud_prefix_peek(pc, parent, tokens, mask, pos0, entry);

	if (rc == 0)
		sw_lru_pin(pc->lru, pc->ents[*entry].h); /* one more user: off the LRU list */
	return rc;
}

int gpud_prefix_insert(struct gpud_prefix *pc, uint32_t parent, const int32_t *tokens,
		       const struct gpud_mask *mask, uint32_t pos0, uint32_t block,
		       uint32_t *entry)
{
	struct probe pr = { .parent = parent };
	struct entry *e;
	uint64_t key;
	uint32_t i;
	int rc;

	if (bad_parent(pc, parent) || block >= pc->p.n_blocks || pc->by_block[block] != NONE)
		return -EINVAL;
	key = make_probe(pc, parent, tokens, mask, pos0);
	/* Every live entry holds its own block, so with block free an entry
	 * is free too; checked anyway before the lru sees the insert, which
	 * would otherwise make room by evicting behind the caller's back. */
	if (pc->free_head == NONE)
		return SW_EEXHAUSTED;
	i = pc->free_head;
	e = &pc->ents[i];
	pr.parent_gen = parent == GPUD_PREFIX_ROOT ? 0 : pc->ents[parent].gen;
	/* one user from the start: pinned, not on the LRU list */
	rc = sw_lru_insert(pc->lru, key, &pr, e, pc->p.block_bytes, true, &e->h);
	if (rc)
		return rc; /* -EEXIST: an identical entry is cached */
	pc->free_head = e->next_free;
	e->key = key;
	e->parent = parent;
	e->parent_gen = pr.parent_gen;
	e->block = block;
	memcpy(rec_of(pc, i), pc->probe, pc->rec_bytes);
	pc->by_block[block] = i;
	*entry = i;
	return 0;
}

void gpud_prefix_release(struct gpud_prefix *pc, uint32_t entry)
{
	if (entry >= pc->p.n_blocks || pc->ents[entry].block == NONE ||
	    !sw_lru_refs(pc->ents[entry].h))
		return;
	sw_lru_unpin(pc->lru, pc->ents[entry].h); /* at no user: most recent on the list */
}

int gpud_prefix_evict(struct gpud_prefix *pc, uint32_t *block)
{
	if (sw_lru_evict_one(pc->lru))
		return SW_ENOTFOUND;
	*block = pc->evicted; /* set by entry_evicted */
	return 0;
}

bool gpud_prefix_over_bound(const struct gpud_prefix *pc)
{
	return (uint64_t)n_unref(pc) * pc->p.block_bytes > pc->p.max_bytes;
}

void gpud_prefix_account(struct gpud_prefix *pc, uint32_t hits, uint32_t misses)
{
	pc->st.hits += hits;
	pc->st.misses += misses;
	pc->st.hit_tokens += (uint64_t)hits * pc->p.block_tokens;
}

uint32_t gpud_prefix_block(const struct gpud_prefix *pc, uint32_t entry)
{
	return entry < pc->p.n_blocks ? pc->ents[entry].block : NONE;
}

uint32_t gpud_prefix_users(const struct gpud_prefix *pc, uint32_t entry)
{
	return entry < pc->p.n_blocks && pc->ents[entry].h ? sw_lru_refs(pc->ents[entry].h) : 0;
}

uint64_t gpud_prefix_key(const struct gpud_prefix *pc, uint32_t entry)
{
	return entry < pc->p.n_blocks ? pc->ents[entry].key : 0;
}

uint32_t gpud_prefix_block_entry(const struct gpud_prefix *pc, uint32_t block)
{
	return block < pc->p.n_blocks ? pc->by_block[block] : GPUD_PREFIX_ROOT;
}

void gpud_prefix_stats(const struct gpud_prefix *pc, struct gpud_prefix_stats *st)
{
	struct sw_lru_stats ls;

	sw_lru_stats(pc->lru, &ls);
	*st = pc->st;
	st->inserts = ls.inserts;
	st->evictions = ls.evictions;
	st->entries = ls.entries;
	st->unreferenced = ls.entries - ls.pinned;
	st->bytes = (size_t)st->unreferenced * pc->p.block_bytes;
	st->max_bytes = pc->p.max_bytes;
}

int gpud_prefix_check(const struct gpud_prefix *pc, char *err, size_t errlen)
{
	uint32_t live = 0, unref = 0, n_free = 0;
	struct sw_lru_stats ls;
	int rc;

	rc = sw_lru_check(pc->lru, err, errlen);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < pc->p.n_blocks; i++) {
		const struct entry *e = &pc->ents[i];

		if (e->block == NONE) {
			if (e->h)
				return sw_seterr(err, errlen, SW_EFORMAT,
						 "prefix: free entry %u still cached", i);
			continue;
		}
		live++;
		if (!e->h || sw_lru_value(e->h) != e || sw_lru_key(e->h) != e->key)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "prefix: entry %u not cached under its key", i);
		unref += !sw_lru_refs(e->h);
		if (e->block >= pc->p.n_blocks || pc->by_block[e->block] != i)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "prefix: entry %u block %u not mapped back", i, e->block);
	}
	for (uint32_t b = 0; b < pc->p.n_blocks; b++) {
		uint32_t i = pc->by_block[b];
		if (i != NONE && (i >= pc->p.n_blocks || pc->ents[i].block != b))
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "prefix: block %u maps to a bad entry", b);
	}
	for (uint32_t i = pc->free_head; i != NONE; i = pc->ents[i].next_free)
		if (pc->ents[i].block != NONE || ++n_free > pc->p.n_blocks)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "prefix: free list holds live entry %u", i);
	sw_lru_stats(pc->lru, &ls);
	if (live != ls.entries || unref != ls.entries - ls.pinned ||
	    live + n_free != pc->p.n_blocks)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "prefix: %u live (cached %u), %u unreferenced (cached %u), "
				 "%u free", live, ls.entries, unref, ls.entries - ls.pinned,
				 n_free);
	return 0;
}
