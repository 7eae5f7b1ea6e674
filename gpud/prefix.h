/* prefix.h - prefix KV cache index of one device (DESIGN §3 "Prefix KV
 * cache").
 *
 * Entries name full KV blocks of prompts. An entry's identity is its
 * parent entry (the block before it in the prompt; GPUD_PREFIX_ROOT for
 * the first block), the block's token ids and its attention pattern: for
 * each token, its segment id and that segment's vis row (from the
 * compiled mask; no mask counts as segment 0 seeing {0}). Two prompts whose
 * chains of blocks agree on all of that produce identical KV, so they may
 * share the blocks; the same tokens under another mask never do. The key
 * is hash(parent key, tokens, pattern), but a hit is verified for real:
 * the entry stores its tokens and pattern and its parent's (index,
 * generation), so a hash collision never shares KV.
 *
 * This module is bookkeeping only: it never touches the KV pool. The
 * caller (the scheduler, under its lock) takes a KV hold on a block when
 * it inserts it (gpud_kv_block_hold) and releases that hold for every
 * block an eviction returns. Entries have a user count (sequences using
 * the block, maintained by the caller through lookup/insert/release);
 * entries with no user are on an LRU list (they are the unpinned entries
 * of a common/lru cache), are bounded in bytes by max_bytes, and are what
 * eviction takes (least recently released first; a sequence releases its
 * blocks last first, so a chain is evicted from its end).
 *
 * Everything is reserved at create: nothing below allocates. Not
 * thread-safe (the scheduler lock covers it).
 */
#ifndef GPUD_PREFIX_H
#define GPUD_PREFIX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gpud_mask;
struct gpud_prefix;

#define GPUD_PREFIX_ROOT UINT32_MAX /* "no parent": the first block */

struct gpud_prefix_params {
	uint32_t n_blocks;     /* KV blocks of the device (> 0): also the entry
				* capacity, since every entry names its own block */
	uint32_t block_tokens; /* > 0 */
	size_t block_bytes;    /* KV bytes of one block (> 0), for the bound */
	size_t max_bytes;      /* bound on the bytes of entries with no user */
	uint32_t test_key_bits; /* test knob: keep only the low n bits of every
				 * key (1: everything collides); 0: all 64 */
};

struct gpud_prefix_stats {
	uint64_t hits;        /* blocks served (gpud_prefix_account) */
	uint64_t misses;      /* blocks that could have been served and were not */
	uint64_t evictions;
	uint64_t hit_tokens;  /* hits * block_tokens */
	uint64_t inserts;
	uint64_t collisions;  /* key matched, content did not (lookup or insert) */
	uint32_t entries;     /* blocks held by the cache */
	uint32_t unreferenced; /* of those, with no user */
	size_t bytes;         /* unreferenced * block_bytes */
	size_t max_bytes;
};

/* Reserves n_blocks entries, a hash table and the record storage
 * (block_tokens * 21 bytes per entry). Returns 0 and *out, or -EINVAL (a
 * zero field, block_tokens > 4096) / -ENOMEM; *out is NULL on error. */
int gpud_prefix_create(struct gpud_prefix **out, const struct gpud_prefix_params *p);
/* Frees the index (not the KV blocks: evict everything first to get them
 * back). Accepts NULL. */
void gpud_prefix_destroy(struct gpud_prefix *pc);

/* Finds the block that follows parent (GPUD_PREFIX_ROOT or an entry the
 * caller uses) with tokens[0 .. block_tokens) at positions pos0 .. under
 * mask (NULL: causal; the positions must be prompt positions of mask).
 * On a verified hit: returns 0, *entry, and the caller becomes a user (the
 * entry leaves the LRU list). SW_ENOTFOUND otherwise. Counts nothing
 * (see gpud_prefix_account). */
int gpud_prefix_lookup(struct gpud_prefix *pc, uint32_t parent, const int32_t *tokens,
		       const struct gpud_mask *mask, uint32_t pos0, uint32_t *entry);

/* Placement probe: like gpud_prefix_lookup but read-only for the caller
 * (no user taken, recency untouched; only the collision count may move).
 * Returns 0 and *entry (valid as a parent for the next peek until the
 * cache next changes), SW_ENOTFOUND, or -EINVAL for a bad parent. */
int gpud_prefix_peek(struct gpud_prefix *pc, uint32_t parent, const int32_t *tokens,
		     const struct gpud_mask *mask, uint32_t pos0, uint32_t *entry);

/* Adds block (just written by the caller's sequence, which becomes its one
 * user) as the child of parent with those tokens and pattern. Returns 0
 * and *entry; -EEXIST when an identical entry exists (the caller keeps its
 * private copy and stops inserting this chain); SW_EEXHAUSTED when every
 * entry is in use; -EINVAL for a bad parent or a block already in the
 * cache. The caller then takes one KV hold on block. */
int gpud_prefix_insert(struct gpud_prefix *pc, uint32_t parent, const int32_t *tokens,
		       const struct gpud_mask *mask, uint32_t pos0, uint32_t block,
		       uint32_t *entry);

/* The caller stops using entry (its sequence was freed). At no user the
 * entry joins the LRU list as most recent. */
void gpud_prefix_release(struct gpud_prefix *pc, uint32_t entry);

/* Evicts the least recently released entry with no user and returns its
 * block in *block (the caller releases its KV hold). 0, or SW_ENOTFOUND
 * when no entry is unreferenced. */
int gpud_prefix_evict(struct gpud_prefix *pc, uint32_t *block);

/* True while the bytes of entries with no user exceed max_bytes. */
bool gpud_prefix_over_bound(const struct gpud_prefix *pc);

/* Counts one admission: hit blocks served, miss blocks computed. */
void gpud_prefix_account(struct gpud_prefix *pc, uint32_t hits, uint32_t misses);

uint32_t gpud_prefix_block(const struct gpud_prefix *pc, uint32_t entry);
uint32_t gpud_prefix_users(const struct gpud_prefix *pc, uint32_t entry);
uint64_t gpud_prefix_key(const struct gpud_prefix *pc, uint32_t entry);
/* The entry naming KV block b, or GPUD_PREFIX_ROOT when b is not cached. */
uint32_t gpud_prefix_block_entry(const struct gpud_prefix *pc, uint32_t block);

void gpud_prefix_stats(const struct gpud_prefix *pc, struct gpud_prefix_stats *st);

/* Consistency (tests): user counts vs the LRU list, the hash chains, the
 * block map and the byte count. 0 or SW_EFORMAT with a message. */
int gpud_prefix_check(const struct gpud_prefix *pc, char *err, size_t errlen);

#endif
