/* maskcache.h - cache of compiled attention masks (DESIGN §3).
 *
 * Identical descriptors (same segment token lengths, same vis rows, same
 * KV block size) share one compiled mask. Entries are refcounted while
 * requests use them (pinned) and LRU-evicted once unpinned, bounded both in
 * entries and in bytes (the sum of gpud_mask_bytes() of the cached masks).
 *
 * Memory: one mask pool (common/pool.h) of equal-sized *slots*, each big
 * enough for the largest mask the cache admits (max_segments segments,
 * max_prompt_tokens tokens, block_tokens per KV block) plus a copy of its
 * segment lengths. Every mask takes exactly one slot, so the pool cannot
 * fragment: any free slot fits any mask. A compiled mask must be one
 * contiguous block (its arrays are read by pointer arithmetic), which rules
 * out page chains; contiguous runs of small pages would fragment. The cost
 * is internal waste for small masks, which is bounded: a slot for 64
 * segments and 4096 tokens with 16-token blocks is about 10 KiB. The pool
 * has max_entries + 1 slots; the spare one receives a new compilation
 * before the cache knows whether it can keep it, so a refused insert
 * changes nothing cached. Everything is reserved and backed at create
 * (common/mem.h: the pages are the process's from the start): nothing is
 * allocated afterwards.
 *
 * Keys: a 64-bit hash of (S, block_tokens, segment lengths, vis rows),
 * computed from the descriptor without compiling it. Entries under the
 * same hash are compared for real (S, block size, every segment length,
 * every vis row), so a hash collision never shares a mask.
 *
 * Not thread-safe: one cache per device, used by that device's worker (or
 * under an outside lock).
 */
#ifndef GPUD_MASKCACHE_H
#define GPUD_MASKCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/mask.h"

struct gpud_maskcache;
struct gpud_maskcache_entry; /* a pinned handle returned by get_or_compile */

struct gpud_maskcache_params {
	const char *name;           /* copied; names the pool in reports */
	uint32_t max_segments;      /* 1..GPUD_MASK_MAX_SEGMENTS */
	uint32_t max_prompt_tokens; /* > 0; larger prompts are refused */
	uint32_t block_tokens;      /* > 0; smallest KV block size used */
	uint32_t max_entries;       /* > 0 */
	size_t max_bytes;           /* > 0; bound on the sum of mask sizes */
	/* Tests only: keep this many low bits of each hash (1..63) to force
	 * collisions; 0 keeps all 64. */
	unsigned key_bits;
};

struct gpud_maskcache_stats {
	uint64_t hits, misses, evictions;
	uint64_t exhausted;        /* requests refused with SW_EEXHAUSTED */
	size_t bytes;              /* sum of gpud_mask_bytes() of cached masks */
	size_t max_bytes;
	uint32_t entries, max_entries;
	uint32_t pinned;           /* entries with a reference */
	size_t slot_bytes;         /* size of one pool slot */
	size_t reserved_bytes;     /* slot_bytes * pool capacity */
	uint32_t pool_used, pool_free, pool_capacity; /* slots */
};

/* Creates a cache and reserves its pool, backed at once. Returns 0 and
 * sets *out; -EINVAL for a parameter out of range, -ENOMEM (also when the
 * kernel cannot back the pool); *out untouched on error.
 * Free with gpud_maskcache_destroy. */
int gpud_maskcache_create(struct gpud_maskcache **out, const struct gpud_maskcache_params *p);

/* Frees the cache, its pool and every entry, pinned or not: handles die
 * with it. Accepts NULL. */
void gpud_maskcache_destroy(struct gpud_maskcache *c);

/* Returns in *out a pinned handle on the compiled form of desc with
 * seg_tokens[i] tokens in segment i and KV blocks of block_tokens
 * (>= the block_tokens given at create). A cached equal mask is shared
 * (a hit); otherwise the mask is compiled into a free slot, evicting
 * least recently used unpinned entries as the bounds require (a miss).
 * The caller must gpud_maskcache_release the handle exactly once.
 * Errors (nothing cached changes, *out untouched; only the counters move):
 *   SW_ETOOLONG   more segments or tokens than the cache was sized for,
 *                 or a mask larger than max_bytes (it could never fit);
 *   SW_EFORMAT    invalid descriptor (see proto_mask_validate);
 *   SW_EEXHAUSTED no room without evicting pinned entries;
 *   -EINVAL       NULL arguments (a descriptor row's indices included),
 *                 seg_tokens NULL with segments, or a block_tokens below
 *                 the one given at create. */
int gpud_maskcache_get_or_compile(struct gpud_maskcache *c, const struct proto_mask_desc *desc,
				  const uint32_t *seg_tokens, uint32_t block_tokens,
				  struct gpud_maskcache_entry **out);

/* The compiled mask of a handle; valid until the handle is released (and
 * while the entry stays cached, but only a pin guarantees that). */
const struct gpud_mask *gpud_maskcache_mask(const struct gpud_maskcache_entry *e);

/* References currently held on the handle's entry. */
uint32_t gpud_maskcache_refs(const struct gpud_maskcache_entry *e);

/* Drops one reference taken by get_or_compile. An entry with no reference
 * left stays cached, most recently used, evictable. Returns 0, or -EINVAL
 * when e is NULL or holds no reference (nothing changes). */
int gpud_maskcache_release(struct gpud_maskcache_entry *e);

/* Evicts every unpinned entry (counted as evictions). */
void gpud_maskcache_clear(struct gpud_maskcache *c);

/* Fills *st. O(1) apart from the pool's own stats (O(slots)). */
void gpud_maskcache_stats(const struct gpud_maskcache *c, struct gpud_maskcache_stats *st);

/* What the trough watchdog samples after every step, in O(1): slots of
 * cached masks (entries; pool_used equals it but while a compilation
 * holds the spare), of those the ones pinned by a request (what can leak)
 * and the pool's capacity. */
struct gpud_maskcache_counts {
	uint32_t entries, pinned;
	uint32_t pool_used, pool_capacity;
};
void gpud_maskcache_counts(const struct gpud_maskcache *c, struct gpud_maskcache_counts *n);

/* Full consistency check: the pool's own check (used + free == capacity,
 * free list sound), one used slot per cached entry and no other, bytes
 * equal to the sum of the cached masks. Returns 0 or SW_EFORMAT with a
 * description in err. O(slots); tests and `swarmctl mem --check`. */
int gpud_maskcache_check(struct gpud_maskcache *c, char *err, size_t errlen);

#endif
