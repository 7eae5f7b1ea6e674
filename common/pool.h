/* pool.h - fixed-size block pool with O(1) alloc and free.
 *
 * Capacity is fixed when the pool is created and never grows: exhaustion is
 * an answer (NULL / SW_EEXHAUSTED), not a trigger to allocate. Blocks are
 * named by index 0 .. capacity-1; a free list of indices makes alloc and
 * free O(1). Three kinds of pool share the same code:
 *
 *   owned     sw_pool_create: the pool reserves capacity * block_size host
 *             bytes once, aligned as asked.
 *   external  sw_pool_create_external: blocks are carved from memory the
 *             caller owns, possibly device memory the host must not touch
 *             (a KV cache on a GPU). Only pointer arithmetic is done on it.
 *   index     sw_pool_create_index: no memory at all, just block indices
 *             (the caller maps an index to wherever its storage lives).
 *
 * Every block carries a u64 owner tag (a request id, a cache-entry id) so a
 * memory report can say who holds each block. Double frees and pointers
 * from elsewhere are detected and refused with an error; nothing changes.
 * Debug builds (SW_DEBUG) check used + free == capacity after every
 * operation and fill freed host blocks with 0xDD so a use after free shows.
 *
 * Not thread-safe: one owner (a device worker) or an outside lock.
 */
#ifndef SW_POOL_H
#define SW_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sw_pool;

/* Largest capacity; SW_POOL_NONE is never a valid index. */
#define SW_POOL_MAX_BLOCKS (UINT32_MAX - 1)
#define SW_POOL_NONE UINT32_MAX

/* Byte written over freed host blocks in debug builds. */
#define SW_POOL_FREE_FILL 0xDD

/* sw_pool_create_external flags. */
enum {
	/* The host may read and write the memory (debug fill on free). */
	SW_POOL_HOST_ACCESSIBLE = 1u << 0,
};

struct sw_pool_stats {
	const char *name;       /* as given at create; owned by the pool */
	size_t block_size;      /* bytes; 0 for an index pool */
	uint32_t capacity;      /* blocks */
	uint32_t used;          /* blocks handed out now */
	uint32_t free;          /* capacity - used, counted separately */
	uint32_t high;          /* largest `used` ever seen */
	uint32_t largest_free_run; /* longest run of adjacent free indices */
	uint64_t allocs;        /* successful allocations */
	uint64_t frees;         /* successful frees */
	uint64_t fails;         /* allocations refused: pool exhausted */
	uint64_t bad_frees;     /* frees refused: double free or foreign */
};

/* Creates a pool owning capacity blocks of block_size bytes, each aligned
 * to align (a power of two, at most 4096; block_size is rounded up to a
 * multiple of it). name is copied (truncated to 31 bytes).
 * Returns 0 and sets *out, or -EINVAL (zero sizes, bad align, capacity >
 * SW_POOL_MAX_BLOCKS) or -ENOMEM (including a size overflow); *out is then
 * untouched. Free with sw_pool_destroy. */
int sw_pool_create(struct sw_pool **out, const char *name, size_t block_size,
		   uint32_t capacity, size_t align);

/* Creates a pool over caller memory [base, base + capacity * block_size).
 * The pool never frees or (unless flags has SW_POOL_HOST_ACCESSIBLE)
 * touches that memory; base must outlive the pool. Errors as above. */
int sw_pool_create_external(struct sw_pool **out, const char *name, void *base,
			    size_t block_size, uint32_t capacity, unsigned flags);

/* Creates a pool of capacity bare indices with no memory behind them; the
 * pointer functions return NULL / -EINVAL on it. Errors as above. */
int sw_pool_create_index(struct sw_pool **out, const char *name, uint32_t capacity);

/* Frees the pool's metadata and, for an owned pool, its blocks, whether or
 * not blocks are still in use. Accepts NULL. */
void sw_pool_destroy(struct sw_pool *p);

/* Takes a free block, tags it with owner and returns its index in *idx.
 * Returns 0, or SW_EEXHAUSTED when no block is free (nothing changes;
 * the fails counter goes up). O(1). */
int sw_pool_alloc_index(struct sw_pool *p, uint64_t owner, uint32_t *idx);

/* As sw_pool_alloc_index but returns the block's address, or NULL when the
 * pool is exhausted or is an index pool (nothing changes then). The memory
 * is not cleared. */
void *sw_pool_alloc(struct sw_pool *p, uint64_t owner);

/* Returns block idx to the pool. Returns 0, -EINVAL if idx is out of range,
 * or SW_ENOTFOUND if the block is already free (double free); on error
 * nothing changes except the bad_frees counter. O(1). */
int sw_pool_free_index(struct sw_pool *p, uint32_t idx);

/* Frees by address. Returns 0, -EINVAL for a pointer that is not the start
 * of one of this pool's blocks (foreign, interior or NULL), or SW_ENOTFOUND
 * on a double free; on error nothing changes except bad_frees. */
int sw_pool_free(struct sw_pool *p, void *ptr);

/* Frees every block at once (end of a run, tests). Counters are kept. */
void sw_pool_reset(struct sw_pool *p);

/* Address of block idx, used or not; NULL if idx is out of range or the
 * pool has no memory. */
void *sw_pool_ptr(const struct sw_pool *p, uint32_t idx);

/* Index of the block starting at ptr. Returns 0 and sets *idx, or -EINVAL
 * when ptr is not the start of a block of this pool. */
int sw_pool_index(const struct sw_pool *p, const void *ptr, uint32_t *idx);

/* True if idx is in range and currently allocated. */
bool sw_pool_is_used(const struct sw_pool *p, uint32_t idx);

/* Owner tag of an allocated block. Returns 0 and sets *owner, -EINVAL if
 * idx is out of range, SW_ENOTFOUND if the block is free. */
int sw_pool_owner(const struct sw_pool *p, uint32_t idx, uint64_t *owner);

/* Re-tags an allocated block (a block handed from a request to a cache).
 * Same errors as sw_pool_owner; nothing changes on error. */
int sw_pool_set_owner(struct sw_pool *p, uint32_t idx, uint64_t owner);

/* Calls fn for every allocated block in index order; stops early and
 * returns fn's value when it is non-zero. For memory reports: O(capacity).
 * fn must not alloc or free in this pool. */
int sw_pool_foreach_used(const struct sw_pool *p,
			 int (*fn)(void *ctx, uint32_t idx, uint64_t owner), void *ctx);

/* Fills *st. O(capacity) because of largest_free_run; call it for reports,
 * not per step. */
void sw_pool_stats(const struct sw_pool *p, struct sw_pool_stats *st);

/* O(1) counters for per-step use. */
uint32_t sw_pool_used(const struct sw_pool *p);
uint32_t sw_pool_free_count(const struct sw_pool *p);
uint32_t sw_pool_capacity(const struct sw_pool *p);

/* Full consistency check: used + free == capacity, the free list holds
 * exactly the free blocks, once each. Returns 0 or SW_EFORMAT with a
 * description in err. O(capacity); tests and `swarmctl mem --check`.
 * Non-const: it marks blocks while walking the free list (restored after). */
int sw_pool_check(struct sw_pool *p, char *err, size_t errlen);

#endif
