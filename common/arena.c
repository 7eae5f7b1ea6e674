/* arena.c - bump allocator. */
#include "common/arena.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int sw_arena_init(struct sw_arena *a, size_t cap)
{
	memset(a, 0, sizeof(*a));
	if (cap == 0)
		return 0;
	size_t rounded = (cap + 63) & ~(size_t)63;
	void *p = aligned_alloc(64, rounded);
	if (!p)
		return -ENOMEM;
	a->base = p;
	a->cap = rounded;
	a->own_base = 1;
	return 0;
}

void sw_arena_init_static(struct sw_arena *a, void *base, size_t cap)
{
	memset(a, 0, sizeof(*a));
	a->base = base;
	a->cap = cap;
}

void sw_arena_destroy(struct sw_arena *a)
{
	if (!a)
		return;
	if (a->own_base)
		free(a->base);
	memset(a, 0, sizeof(*a));
}

void *sw_arena_alloc(struct sw_arena *a, size_t size, size_t align)
{
	if (align == 0)
		align = 1;
	uintptr_t base = (uintptr_t)a->base;
	uintptr_t p = (base + a->used + (align - 1)) & ~(uintptr_t)(align - 1);
	size_t off = p - base;
	if (off > a->cap || size > a->cap - off) {
		a->fails++;
		return NULL;
	}
	a->used = off + size;
	if (a->used > a->high)
		a->high = a->used;
	return (void *)p;
}
