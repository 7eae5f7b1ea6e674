/* kv.h - paged KV cache accounting: a fixed pool of blocks and one block
 * table per sequence slot (DESIGN §2).
 *
 * A block holds block_tokens consecutive positions of one sequence for
 * every layer and KV head. This module owns only the bookkeeping (free
 * list, block tables, lengths); the storage lives with the backend (host
 * memory for the CPU backend, device memory for CUDA), addressed by block
 * index. Everything is reserved at creation: no call below allocates.
 *
 * Blocks are reference counted: a full block may be in several sequences'
 * tables (a shared prompt prefix, gpud_kv_seq_attach) and held by outside
 * owners (the prefix cache, gpud_kv_block_hold); it returns to the free
 * list when the last reference goes. Sharing is safe because only full
 * blocks are shared and sequences only append (a truncate that would cut
 * into a shared block is refused), so a shared block is never written.
 *
 * Invariant, checked by gpud_kv_check(): used + free == n_blocks, and every
 * block is either free (no reference) or has references == tables holding
 * it + outside holds.
 *
 * Not thread-safe: one device worker owns a kv.
 */
#ifndef GPUD_KV_H
#define GPUD_KV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gpud_kv_params {
	uint32_t n_blocks;     /* blocks in the pool (> 0) */
	uint32_t block_tokens; /* positions per block (> 0), typically 16 */
	uint32_t max_seqs;     /* sequence slots (> 0) */
	uint32_t max_ctx;      /* positions per sequence at most (> 0) */
	/* Tests only: the planted leak of the trough watchdog's tests
	 * (gpud serve under GPUD_TEST_LEAK=kv[:N]). Every test_leak-th
	 * gpud_kv_seq_free of a sequence with blocks (1: each; 0: none)
	 * leaves an outside hold on its last block (its newest positions,
	 * which a prefix cache never shares) that nothing ever releases. */
	uint32_t test_leak;
};

struct gpud_kv_stats {
	uint32_t n_blocks;    /* capacity */
	uint32_t used;        /* blocks referenced (tables or holds) */
	uint32_t free;        /* blocks on the free list */
	uint32_t high;        /* largest `used` seen */
	uint32_t seqs;        /* sequence slots in use */
	uint64_t exhausted;   /* reservations refused for lack of blocks */
};

struct gpud_kv;

/* Reserves the free list and max_seqs block tables of
 * ceil(max_ctx / block_tokens) entries. Returns 0, -EINVAL (a zero field)
 * or -ENOMEM; on failure *out is NULL. */
int gpud_kv_create(struct gpud_kv **out, const struct gpud_kv_params *p);
void gpud_kv_destroy(struct gpud_kv *kv); /* accepts NULL */

/* Claims a free sequence slot with length 0 and no blocks. Returns 0 and
 * the slot in *seq, or SW_EEXHAUSTED when all max_seqs slots are taken. */
int gpud_kv_seq_new(struct gpud_kv *kv, uint32_t *seq);

/* Returns every block of seq to the pool and frees the slot. Returns 0 or
 * -EINVAL for a slot not in use (then nothing changes). */
int gpud_kv_seq_free(struct gpud_kv *kv, uint32_t seq);

/* True when seq is a slot in use. */
bool gpud_kv_seq_valid(const struct gpud_kv *kv, uint32_t seq);

/* Makes seq's block table cover n_tokens positions in total (its current
 * length plus what the caller is about to write). Returns 0,
 * SW_ETOOLONG when n_tokens > max_ctx, SW_EEXHAUSTED when the pool lacks
 * blocks, -EINVAL for a bad slot; on any error nothing changes. Does not
 * change the length. */
int gpud_kv_reserve(struct gpud_kv *kv, uint32_t seq, uint32_t n_tokens);

/* Sets seq's length (positions written) to n, which must be covered by
 * its blocks. Returns 0 or -EINVAL. */
int gpud_kv_set_len(struct gpud_kv *kv, uint32_t seq, uint32_t n);

/* Shrinks seq to n positions and drops its references to the blocks past
 * ceil(n / block_tokens) (rollback, preemption). n larger than the length,
 * or an n that cuts into a shared block (referenced elsewhere too, so it
 * must not be written again), is -EINVAL; nothing changes then. */
int gpud_kv_truncate(struct gpud_kv *kv, uint32_t seq, uint32_t n);

/* Gives an empty seq (length 0, no blocks) the n full blocks in blocks,
 * which must be referenced already (in another table or held): each gets
 * one more reference, and seq's length becomes n * block_tokens. Its next
 * reserve adds fresh private blocks after them. Returns 0, SW_ETOOLONG
 * (n blocks pass max_ctx), -EINVAL (bad or non-empty seq, a free or
 * out-of-range block); nothing changes on error. */
int gpud_kv_seq_attach(struct gpud_kv *kv, uint32_t seq, const uint32_t *blocks, uint32_t n);

/* Outside holds (the prefix cache): hold adds a reference to an allocated
 * block (-EINVAL for a free or out-of-range one); release drops one hold
 * (-EINVAL when block has none) and frees the block when it was the last
 * reference. */
int gpud_kv_block_hold(struct gpud_kv *kv, uint32_t block);
int gpud_kv_block_release(struct gpud_kv *kv, uint32_t block);
/* References to block (tables + holds); 0 when free or out of range. */
/* Takes a free block with one outside hold and no table (the chunk-KV
 * cache's storage; gpud_kv_block_release returns it). 0 and *block, or
 * SW_EEXHAUSTED when no block is free (counted in exhausted). */
int gpud_kv_block_take(struct gpud_kv *kv, uint32_t *block);
uint32_t gpud_kv_block_refs(const struct gpud_kv *kv, uint32_t block);

/* Positions written (0 for a slot not in use). */
uint32_t gpud_kv_seq_len(const struct gpud_kv *kv, uint32_t seq);
/* Positions seq's blocks cover (a multiple of block_tokens). */
uint32_t gpud_kv_seq_capacity(const struct gpud_kv *kv, uint32_t seq);
/* seq's block table: *n blocks, entry j holds positions
 * [j*block_tokens, (j+1)*block_tokens). Owned by kv; valid until the next
 * reserve/truncate/free of seq. */
const uint32_t *gpud_kv_block_table(const struct gpud_kv *kv, uint32_t seq, uint32_t *n);

/* Creation parameters and O(1) counters. */
uint32_t gpud_kv_block_tokens(const struct gpud_kv *kv);
uint32_t gpud_kv_max_seqs(const struct gpud_kv *kv);
uint32_t gpud_kv_max_ctx(const struct gpud_kv *kv);
uint32_t gpud_kv_free_blocks(const struct gpud_kv *kv);
void gpud_kv_stats(const struct gpud_kv *kv, struct gpud_kv_stats *st);

/* Full consistency check (every block free with no reference, or
 * referenced exactly by the tables holding it plus its holds; used + free
 * == capacity). Returns 0, SW_EFORMAT with a message, or -ENOMEM.
 * O(n_blocks + table entries); allocates a counter array. */
int gpud_kv_check(const struct gpud_kv *kv, char *err, size_t errlen);

#endif
