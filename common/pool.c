/* pool.c - fixed-size blocks, a stack of free indices, per-block owner tags.
 *
 * Metadata (owner tags, the free stack, a used byte per block) lives in one
 * allocation made at create; block memory, for an owned pool, in a second.
 * Nothing is allocated after create.
 */
#include "common/pool.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

struct sw_pool {
	char name[32];
	uint8_t *base;          /* (capacity, block_size) bytes; NULL for index pools */
	size_t block_size;
	uint32_t capacity;
	uint32_t used;
	uint32_t nfree;         /* entries on free_stack; used + nfree == capacity */
	uint32_t high;
	uint64_t *owner;        /* (capacity) owner tag of each used block */
	uint32_t *free_stack;   /* (capacity) free indices, top at nfree - 1 */
	uint8_t *in_use;        /* (capacity) 1 while allocated */
	bool own_base;
	bool host_access;       /* debug fill allowed */
	uint64_t allocs, frees, fails, bad_frees;
};

#ifdef SW_DEBUG
#define POOL_CHECK(p)                                                             \
	do {                                                                      \
		if ((p)->used + (p)->nfree != (p)->capacity) {                    \
			fprintf(stderr, "pool %s: used %u + free %u != capacity %u\n", \
				(p)->name, (p)->used, (p)->nfree, (p)->capacity);    \
			abort();                                                  \
		}                                                                 \
	} while (0)
#else
#define POOL_CHECK(p) ((void)0)
#endif

static int pool_new(struct sw_pool **out, const char *name, uint32_t capacity)
{
	struct sw_pool *p;
	size_t head = (sizeof(*p) + 7) & ~(size_t)7;
	size_t bytes = head + (size_t)capacity * (sizeof(uint64_t) + sizeof(uint32_t) + 1);

	if (capacity == 0 || capacity > SW_POOL_MAX_BLOCKS)
		return -EINVAL;
	p = malloc(bytes);
	if (!p)
		return -ENOMEM;
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%s", name ? name : "pool");
	p->capacity = capacity;
	p->owner = (uint64_t *)((uint8_t *)p + head);
	p->free_stack = (uint32_t *)(p->owner + capacity);
	p->in_use = (uint8_t *)(p->free_stack + capacity);
	sw_pool_reset(p);
	*out = p;
	return 0;
}

int sw_pool_create(struct sw_pool **out, const char *name, size_t block_size,
		   uint32_t capacity, size_t align)
{
	struct sw_pool *p;
	void *mem;
	int rc;

	if (block_size == 0 || align == 0 || align > 4096 || (align & (align - 1)))
		return -EINVAL;
	if (capacity == 0 || capacity > SW_POOL_MAX_BLOCKS)
		return -EINVAL;
	if (block_size > SIZE_MAX - (align - 1))
		return -ENOMEM;
	block_size = (block_size + align - 1) & ~(align - 1);
	if (block_size > SIZE_MAX / capacity)
		return -ENOMEM;
	if (align < sizeof(void *))
		align = sizeof(void *); /* posix_memalign's minimum */
	rc = posix_memalign(&mem, align, block_size * capacity);
	if (rc)
		return -rc;
	rc = pool_new(&p, name, capacity);
	if (rc)
		goto out_free_mem;
	p->base = mem;
	p->block_size = block_size;
	p->own_base = true;
	p->host_access = true;
#ifdef SW_DEBUG
	memset(mem, SW_POOL_FREE_FILL, block_size * capacity);
#endif
	*out = p;
	return 0;

out_free_mem:
	free(mem);
	return rc;
}

int sw_pool_create_external(struct sw_pool **out, const char *name, void *base,
			    size_t block_size, uint32_t capacity, unsigned flags)
{
	struct sw_pool *p;
	int rc;

	if (!base || block_size == 0 || (flags & ~(unsigned)SW_POOL_HOST_ACCESSIBLE))
		return -EINVAL;
	if (capacity == 0 || capacity > SW_POOL_MAX_BLOCKS)
		return -EINVAL;
	if (block_size > SIZE_MAX / capacity ||
	    (uintptr_t)base > UINTPTR_MAX - block_size * capacity)
		return -ENOMEM;
	rc = pool_new(&p, name, capacity);
	if (rc)
		return rc;
	p->base = base;
	p->block_size = block_size;
	p->host_access = flags & SW_POOL_HOST_ACCESSIBLE;
	*out = p;
	return 0;
}

int sw_pool_create_index(struct sw_pool **out, const char *name, uint32_t capacity)
{
	return pool_new(out, name, capacity);
}

void sw_pool_destroy(struct sw_pool *p)
{
	if (!p)
		return;
	if (p->own_base)
		free(p->base);
	free(p);
}

void sw_pool_reset(struct sw_pool *p)
{
	/* Lowest index on top, so a fresh pool hands out 0, 1, 2, ... */
	for (uint32_t i = 0; i < p->capacity; i++)
		p->free_stack[i] = p->capacity - 1 - i;
	memset(p->in_use, 0, p->capacity);
	memset(p->owner, 0, (size_t)p->capacity * sizeof(p->owner[0]));
	p->nfree = p->capacity;
	p->used = 0;
#ifdef SW_DEBUG
	if (p->base && p->host_access)
		memset(p->base, SW_POOL_FREE_FILL, p->block_size * p->capacity);
#endif
	POOL_CHECK(p);
}

int sw_pool_alloc_index(struct sw_pool *p, uint64_t owner, uint32_t *idx)
{
	if (p->nfree == 0) {
		p->fails++;
		POOL_CHECK(p);
		return SW_EEXHAUSTED;
	}
	uint32_t i = p->free_stack[--p->nfree];
	p->in_use[i] = 1;
	p->owner[i] = owner;
	p->used++;
	if (p->used > p->high)
		p->high = p->used;
	p->allocs++;
	POOL_CHECK(p);
	*idx = i;
	return 0;
}

void *sw_pool_alloc(struct sw_pool *p, uint64_t owner)
{
	uint32_t i;

	if (!p->base)
		return NULL;
	if (sw_pool_alloc_index(p, owner, &i))
		return NULL;
	return p->base + (size_t)i * p->block_size;
}

int sw_pool_free_index(struct sw_pool *p, uint32_t idx)
{
	if (idx >= p->capacity) {
		p->bad_frees++;
		return -EINVAL;
	}
	if (!p->in_use[idx]) {
		p->bad_frees++;
		return SW_ENOTFOUND;
	}
	p->in_use[idx] = 0;
	p->owner[idx] = 0;
	p->free_stack[p->nfree++] = idx;
	p->used--;
	p->frees++;
#ifdef SW_DEBUG
	if (p->base && p->host_access)
		memset(p->base + (size_t)idx * p->block_size, SW_POOL_FREE_FILL, p->block_size);
#endif
	POOL_CHECK(p);
	return 0;
}

int sw_pool_index(const struct sw_pool *p, const void *ptr, uint32_t *idx)
{
	uintptr_t b = (uintptr_t)p->base;
	uintptr_t q = (uintptr_t)ptr;

	if (!p->base || q < b)
		return -EINVAL;
	uintptr_t off = q - b;
	if (off % p->block_size)
		return -EINVAL;
	uintptr_t i = off / p->block_size;
	if (i >= p->capacity)
		return -EINVAL;
	*idx = (uint32_t)i;
	return 0;
}

int sw_pool_free(struct sw_pool *p, void *ptr)
{
	uint32_t i;

	if (sw_pool_index(p, ptr, &i)) {
		p->bad_frees++;
		return -EINVAL;
	}
	return sw_pool_free_index(p, i);
}

void *sw_pool_ptr(const struct sw_pool *p, uint32_t idx)
{
	if (!p->base || idx >= p->capacity)
		return NULL;
	return p->base + (size_t)idx * p->block_size;
}

bool sw_pool_is_used(const struct sw_pool *p, uint32_t idx)
{
	return idx < p->capacity && p->in_use[idx];
}

int sw_pool_owner(const struct sw_pool *p, uint32_t idx, uint64_t *owner)
{
	if (idx >= p->capacity)
		return -EINVAL;
	if (!p->in_use[idx])
		return SW_ENOTFOUND;
	*owner = p->owner[idx];
	return 0;
}

int sw_pool_set_owner(struct sw_pool *p, uint32_t idx, uint64_t owner)
{
	if (idx >= p->capacity)
		return -EINVAL;
	if (!p->in_use[idx])
		return SW_ENOTFOUND;
	p->owner[idx] = owner;
	return 0;
}

int sw_pool_foreach_used(const struct sw_pool *p,
			 int (*fn)(void *ctx, uint32_t idx, uint64_t owner), void *ctx)
{
	for (uint32_t i = 0; i < p->capacity; i++) {
		if (!p->in_use[i])
			continue;
		int rc = fn(ctx, i, p->owner[i]);
		if (rc)
			return rc;
	}
	return 0;
}

void sw_pool_stats(const struct sw_pool *p, struct sw_pool_stats *st)
{
	uint32_t run = 0, best = 0;

	for (uint32_t i = 0; i < p->capacity; i++) {
		if (p->in_use[i]) {
			run = 0;
		} else if (++run > best) {
			best = run;
		}
	}
	st->name = p->name;
	st->block_size = p->block_size;
	st->capacity = p->capacity;
	st->used = p->used;
	st->free = p->nfree;
	st->high = p->high;
	st->largest_free_run = best;
	st->allocs = p->allocs;
	st->frees = p->frees;
	st->fails = p->fails;
	st->bad_frees = p->bad_frees;
}

uint32_t sw_pool_used(const struct sw_pool *p)
{
	return p->used;
}

uint32_t sw_pool_free_count(const struct sw_pool *p)
{
	return p->nfree;
}

uint32_t sw_pool_capacity(const struct sw_pool *p)
{
	return p->capacity;
}

int sw_pool_check(struct sw_pool *p, char *err, size_t errlen)
{
	uint32_t used = 0;

	if (p->used + p->nfree != p->capacity)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: used %u + free %u != capacity %u",
				 p->name, p->used, p->nfree, p->capacity);
	for (uint32_t i = 0; i < p->capacity; i++)
		used += p->in_use[i] ? 1 : 0;
	if (used != p->used)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: %u blocks marked used, counter says %u",
				 p->name, used, p->used);
	/* Every stack entry must be a free block, and no block may appear twice:
	 * mark visited entries by flipping in_use to 2 and restore afterwards. */
	uint8_t *mark = p->in_use;
	int rc = 0;
	uint32_t k;
	for (k = 0; k < p->nfree; k++) {
		uint32_t i = p->free_stack[k];
		if (i >= p->capacity) {
			rc = sw_seterr(err, errlen, SW_EFORMAT, "%s: free list entry %u out of range",
				       p->name, i);
			break;
		}
		if (mark[i]) {
			rc = sw_seterr(err, errlen, SW_EFORMAT, "%s: block %u on free list is %s",
				       p->name, i, mark[i] == 2 ? "listed twice" : "in use");
			break;
		}
		mark[i] = 2;
	}
	for (uint32_t j = 0; j < k; j++)
		if (mark[p->free_stack[j]] == 2)
			mark[p->free_stack[j]] = 0;
	return rc;
}
