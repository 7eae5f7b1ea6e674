/* chunk.h - chunk-KV cache index of one device (issue 14: chunk KV reused
 * at any position).
 *
 * A prompt segment whose visibility row is "itself only" computes the same
 * hidden states wherever it sits: RoPE makes attention depend on relative
 * positions only, so its V does not depend on the offset and its K at
 * offset o + d is its K at o rotated by d. The engine (engine.h,
 * gpud_engine_chunk_reuse / _store) keeps such segments' KV here, keyed by
 * their tokens alone (the model is the engine's; the mask around the
 * segment does not matter since the segment sees only itself), and copies
 * it into any later sequence that has the same tokens as a self-only
 * segment, with K re-rotated to the new positions.
 *
 * An entry is n tokens written once at positions pos0 .. pos0+n-1 and kept
 * compactly from token offset 0 of its first block: token j lies in its
 * block j / block_tokens at offset j % block_tokens. Its blocks come from
 * the device's KV pool (the engine takes them with gpud_kv_block_take) and
 * go back through the release callback when the entry leaves. A hit is
 * verified on the tokens themselves, never on the hash alone.
 *
 * Bounded in bytes: max_bytes / block_bytes blocks at most (pages), LRU
 * among entries not pinned. Token storage for every page and the entry
 * table are reserved at create: nothing below allocates. Not thread-safe
 * (one device worker drives its engine).
 */
#ifndef GPUD_CHUNK_H
#define GPUD_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gpud_chunk;

struct gpud_chunk_params {
	uint32_t block_tokens;  /* > 0, <= 4096 */
	size_t block_bytes;     /* KV bytes of one block (> 0) */
	size_t max_bytes;       /* the bound: max_bytes / block_bytes blocks */
	uint32_t max_blocks;    /* a cap on that (the device's pool size) */
	/* Called once for every block an entry gives back (eviction, destroy). */
	void (*release)(void *ctx, uint32_t block);
	void *ctx;
};

struct gpud_chunk_stats {
	uint64_t hits;        /* segments served from the cache */
	uint64_t misses;      /* cacheable segments computed (not there) */
	uint64_t hit_tokens;  /* tokens of the hits (not computed) */
	uint64_t inserts;
	uint64_t evictions;   /* entries pushed out (bound or pool pressure) */
	uint32_t entries;
	uint32_t blocks;      /* KV blocks held */
	size_t bytes;         /* blocks * block_bytes */
	size_t max_bytes;     /* capacity in bytes (whole blocks) */
};

/* A verified hit, pinned (not evictable) until gpud_chunk_unpin. */
struct gpud_chunk_hit {
	void *handle;
	int32_t pos0;       /* positions the entry's K were written at */
	uint32_t n_blocks;
};

/* Reserves the index. Returns 0 and *out, or -EINVAL (a zero field, a
 * bound that holds no block, no release callback) / -ENOMEM; *out is NULL
 * on error. */
int gpud_chunk_create(struct gpud_chunk **out, const struct gpud_chunk_params *p);
/* Gives every block back through release and frees the index. Accepts NULL. */
void gpud_chunk_destroy(struct gpud_chunk *c);

/* Looks up tokens[0 .. n). A hit: returns 0, fills *hit and blocks[0 ..
 * hit->n_blocks) (room for ceil(n / block_tokens)), makes the entry most
 * recent and pins it. SW_ENOTFOUND otherwise. Counts nothing (the caller
 * counts what it used: gpud_chunk_account). */
int gpud_chunk_find(struct gpud_chunk *c, const int32_t *tokens, uint32_t n,
		    struct gpud_chunk_hit *hit, uint32_t *blocks);
/* Counts hits (hit_tokens tokens served in all) and misses. */
void gpud_chunk_account(struct gpud_chunk *c, uint32_t hits, uint64_t hit_tokens,
			uint32_t misses);
/* Unpins a hit's entry (evictable again). */
void gpud_chunk_unpin(struct gpud_chunk *c, struct gpud_chunk_hit *hit);
/* True when tokens[0 .. n) are cached (read-only: no count, no recency). */
bool gpud_chunk_contains(const struct gpud_chunk *c, const int32_t *tokens, uint32_t n);

/* Evicts least recently used unpinned entries until n_blocks more blocks
 * fit the bound. 0, or SW_ETOOLONG when they never can (more than the
 * bound) or only by evicting pinned entries (nothing evicted then). */
int gpud_chunk_make_room(struct gpud_chunk *c, uint32_t n_blocks);

/* Adds tokens[0 .. n) written at pos0 with their KV in blocks[0 ..
 * ceil(n / block_tokens)), whose holds the cache takes over (released
 * through the callback when the entry leaves). Call make_room first.
 * Returns 0; -EEXIST (already cached) or SW_ETOOLONG (no room): the caller
 * keeps its holds. -EINVAL for n == 0, or a block that is out of range
 * (max_blocks) or held by the cache already. */
int gpud_chunk_insert(struct gpud_chunk *c, const int32_t *tokens, uint32_t n, int32_t pos0,
		      const uint32_t *blocks);

/* Evicts the least recently used unpinned entry (its blocks released).
 * 0, or SW_ENOTFOUND when none is unpinned. */
int gpud_chunk_evict(struct gpud_chunk *c);

/* True when the cache holds KV block block (memory dumps). */
bool gpud_chunk_holds(const struct gpud_chunk *c, uint32_t block);
/* KV blocks the cache holds now. */
uint32_t gpud_chunk_blocks(const struct gpud_chunk *c);
void gpud_chunk_stats(const struct gpud_chunk *c, struct gpud_chunk_stats *st);

#endif
