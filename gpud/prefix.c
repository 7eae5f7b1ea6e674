/* prefix.c - prefix KV cache index (see prefix.h).
 *
 * Entries live in one array of n_blocks; free entries are chained through
 * `next`, unreferenced ones form a doubly linked LRU list (head = least
 * recently released). The hash table is an array of bucket heads (a power
 * of two >= 2 * n_blocks) with chains through `hnext`. Each entry's record
 * (tokens, segment ids, vis rows: block_tokens * 21 bytes) lives in one
 * array beside it and is compared byte for byte on every key match.
 */
#include "gpud/prefix.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/hash.h"
#include "gpud/mask.h"

#define NONE UINT32_MAX
#define ROOT_KEY 0x70726566697852ULL /* parent key of a first block */
#define REC_SEED 0x6b76626c6f636bULL

struct entry {
	uint64_t key;
	uint32_t parent, parent_gen; /* parent entry and its gen when inserted */
	uint32_t gen;                /* bumped at each eviction of this slot */
	uint32_t block;              /* NONE: the entry is free */
	uint32_t users;
	uint32_t hnext;              /* hash chain */
	uint32_t prev, next;         /* LRU list; next also chains free entries */
};

struct gpud_prefix {
	struct gpud_prefix_params p;
	size_t rec_bytes;
	struct entry *ents;    /* (n_blocks) */
	uint8_t *recs;         /* (n_blocks, rec_bytes) */
	uint8_t *probe;        /* (rec_bytes) record being looked up */
	uint32_t *buckets;     /* (n_buckets) */
	uint32_t bucket_mask;
	uint32_t *by_block;    /* (n_blocks) entry of each KV block or NONE */
	uint32_t free_head;
	uint32_t lru_head, lru_tail;
	uint32_t n_entries, n_unref;
	uint64_t key_mask;
	struct gpud_prefix_stats st;
};

int gpud_prefix_create(struct gpud_prefix **out, const struct gpud_prefix_params *p)
{
	struct gpud_prefix *pc;
	uint32_t nb = 2;

	*out = NULL;
	if (!p->n_blocks || !p->block_tokens || p->block_tokens > 4096 || !p->block_bytes ||
	    p->n_blocks > (1u << 30) || p->test_key_bits > 64)
		return -EINVAL;
	pc = calloc(1, sizeof(*pc));
	if (!pc)
		return -ENOMEM;
	pc->p = *p;
	pc->rec_bytes = (size_t)p->block_tokens * (sizeof(int32_t) + 1 + sizeof(gpud_segset));
	while (nb < 2 * p->n_blocks)
		nb <<= 1;
	pc->bucket_mask = nb - 1;
	pc->ents = calloc(p->n_blocks, sizeof(*pc->ents));
	pc->recs = malloc(pc->rec_bytes * p->n_blocks);
	pc->probe = malloc(pc->rec_bytes);
	pc->buckets = malloc(sizeof(*pc->buckets) * nb);
	pc->by_block = malloc(sizeof(*pc->by_block) * p->n_blocks);
	if (!pc->ents || !pc->recs || !pc->probe || !pc->buckets || !pc->by_block) {
		gpud_prefix_destroy(pc);
		return -ENOMEM;
	}
	memset(pc->buckets, 0xff, sizeof(*pc->buckets) * nb);
	memset(pc->by_block, 0xff, sizeof(*pc->by_block) * p->n_blocks);
	for (uint32_t i = 0; i < p->n_blocks; i++) {
		pc->ents[i].block = NONE;
		pc->ents[i].next = i + 1 < p->n_blocks ? i + 1 : NONE;
	}
	pc->free_head = 0;
	pc->lru_head = pc->lru_tail = NONE;
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
	free(pc->ents);
	free(pc->recs);
	free(pc->probe);
	free(pc->buckets);
	free(pc->by_block);
	free(pc);
}

static uint8_t *rec_of(const struct gpud_prefix *pc, uint32_t e)
{
	return pc->recs + (size_t)e * pc->rec_bytes;
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

/* The entry equal to the probe (same key, parent, record), or NONE. */
static uint32_t find(struct gpud_prefix *pc, uint64_t key, uint32_t parent)
{
	uint32_t pgen = parent == GPUD_PREFIX_ROOT ? 0 : pc->ents[parent].gen;

	for (uint32_t i = pc->buckets[key & pc->bucket_mask]; i != NONE; i = pc->ents[i].hnext) {
		const struct entry *e = &pc->ents[i];

		if (e->key != key)
			continue;
		if (e->parent == parent && e->parent_gen == pgen &&
		    !memcmp(rec_of(pc, i), pc->probe, pc->rec_bytes))
			return i;
		pc->st.collisions++;
	}
	return NONE;
}

static void lru_unlink(struct gpud_prefix *pc, uint32_t i)
{
	struct entry *e = &pc->ents[i];

	if (e->prev != NONE)
		pc->ents[e->prev].next = e->next;
	else
		pc->lru_head = e->next;
	if (e->next != NONE)
		pc->ents[e->next].prev = e->prev;
	else
		pc->lru_tail = e->prev;
	e->prev = e->next = NONE;
	pc->n_unref--;
}

static void lru_append(struct gpud_prefix *pc, uint32_t i)
{
	struct entry *e = &pc->ents[i];

	e->next = NONE;
	e->prev = pc->lru_tail;
	if (pc->lru_tail != NONE)
		pc->ents[pc->lru_tail].next = i;
	else
		pc->lru_head = i;
	pc->lru_tail = i;
	pc->n_unref++;
}

int gpud_prefix_lookup(struct gpud_prefix *pc, uint32_t parent, const int32_t *tokens,
		       const struct gpud_mask *mask, uint32_t pos0, uint32_t *entry)
{
	uint32_t i;

	if (bad_parent(pc, parent))
		return -EINVAL;
	i = find(pc, make_probe(pc, parent, tokens, mask, pos0), parent);
	if (i == NONE)
		return SW_ENOTFOUND;
	if (!pc->ents[i].users++)
		lru_unlink(pc, i);
	*entry = i;
	return 0;
}

int gpud_prefix_insert(struct gpud_prefix *pc, uint32_t parent, const int32_t *tokens,
		       const struct gpud_mask *mask, uint32_t pos0, uint32_t block,
		       uint32_t *entry)
{
	struct entry *e;
	uint64_t key;
	uint32_t i, *head;

	if (bad_parent(pc, parent) || block >= pc->p.n_blocks || pc->by_block[block] != NONE)
		return -EINVAL;
	key = make_probe(pc, parent, tokens, mask, pos0);
	if (find(pc, key, parent) != NONE)
		return -EEXIST;
	if (pc->free_head == NONE)
		return SW_EEXHAUSTED;
	i = pc->free_head;
	e = &pc->ents[i];
	pc->free_head = e->next;
	head = &pc->buckets[key & pc->bucket_mask];
	e->key = key;
	e->parent = parent;
	e->parent_gen = parent == GPUD_PREFIX_ROOT ? 0 : pc->ents[parent].gen;
	e->block = block;
	e->users = 1;
	e->prev = e->next = NONE;
	e->hnext = *head;
	*head = i;
	memcpy(rec_of(pc, i), pc->probe, pc->rec_bytes);
	pc->by_block[block] = i;
	pc->n_entries++;
	pc->st.inserts++;
	*entry = i;
	return 0;
}

void gpud_prefix_release(struct gpud_prefix *pc, uint32_t entry)
{
	if (entry >= pc->p.n_blocks || pc->ents[entry].block == NONE || !pc->ents[entry].users)
		return;
	if (!--pc->ents[entry].users)
		lru_append(pc, entry);
}

int gpud_prefix_evict(struct gpud_prefix *pc, uint32_t *block)
{
	uint32_t i = pc->lru_head, *link;
	struct entry *e;

	if (i == NONE)
		return SW_ENOTFOUND;
	e = &pc->ents[i];
	lru_unlink(pc, i);
	for (link = &pc->buckets[e->key & pc->bucket_mask]; *link != i;
	     link = &pc->ents[*link].hnext)
		;
	*link = e->hnext;
	*block = e->block;
	pc->by_block[e->block] = NONE;
	e->block = NONE;
	e->gen++;
	e->hnext = NONE;
	e->next = pc->free_head;
	pc->free_head = i;
	pc->n_entries--;
	pc->st.evictions++;
	return 0;
}

bool gpud_prefix_over_bound(const struct gpud_prefix *pc)
{
	return (uint64_t)pc->n_unref * pc->p.block_bytes > pc->p.max_bytes;
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
	return entry < pc->p.n_blocks ? pc->ents[entry].users : 0;
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
	*st = pc->st;
	st->entries = pc->n_entries;
	st->unreferenced = pc->n_unref;
	st->bytes = (size_t)pc->n_unref * pc->p.block_bytes;
	st->max_bytes = pc->p.max_bytes;
}

int gpud_prefix_check(const struct gpud_prefix *pc, char *err, size_t errlen)
{
	uint32_t live = 0, unref = 0, listed = 0, hashed = 0, n_free = 0;

	for (uint32_t i = 0; i < pc->p.n_blocks; i++) {
		const struct entry *e = &pc->ents[i];

		if (e->block == NONE)
			continue;
		live++;
		unref += !e->users;
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
	for (uint32_t i = pc->lru_head, prev = NONE; i != NONE; prev = i, i = pc->ents[i].next) {
		if (pc->ents[i].users || pc->ents[i].block == NONE || pc->ents[i].prev != prev ||
		    ++listed > live)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "prefix: LRU list holds entry %u with %u users", i,
					 pc->ents[i].users);
	}
	for (uint32_t b = 0; b <= pc->bucket_mask; b++)
		for (uint32_t i = pc->buckets[b]; i != NONE; i = pc->ents[i].hnext) {
			if (pc->ents[i].block == NONE || (pc->ents[i].key & pc->bucket_mask) != b ||
			    ++hashed > live)
				return sw_seterr(err, errlen, SW_EFORMAT,
						 "prefix: hash bucket %u holds a bad entry %u", b, i);
		}
	for (uint32_t i = pc->free_head; i != NONE; i = pc->ents[i].next)
		if (pc->ents[i].block != NONE || ++n_free > pc->p.n_blocks)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "prefix: free list holds live entry %u", i);
	if (live != pc->n_entries || unref != pc->n_unref || listed != unref ||
	    hashed != live || live + n_free != pc->p.n_blocks)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "prefix: %u live (counted %u), %u unreferenced (counted %u, "
				 "listed %u), %u hashed, %u free", live, pc->n_entries, unref,
				 pc->n_unref, listed, hashed, n_free);
	return 0;
}
