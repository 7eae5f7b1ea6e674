/* arena.h - bump allocator over one block reserved up front.
 *
 * Used for per-request and per-step scratch: allocation is a pointer bump,
 * sw_arena_reset() frees everything at once. The arena never grows; when it
 * is full sw_arena_alloc() returns NULL and nothing changes. The high-water
 * mark is kept so start-up sizing can be checked against real use.
 */
#ifndef SW_ARENA_H
#define SW_ARENA_H

#include <stddef.h>
#include <stdint.h>

struct sw_arena {
	uint8_t *base;    /* owned when own_base is set */
	size_t cap;       /* bytes */
	size_t used;      /* bytes handed out since the last reset */
	size_t high;      /* largest `used` ever seen */
	uint64_t fails;   /* allocations refused for lack of room */
	int own_base;
};

/* Reserves cap bytes (64-byte aligned). Returns 0 or -ENOMEM. */
int sw_arena_init(struct sw_arena *a, size_t cap);

/* Uses caller memory [base, base+cap); the arena does not free it. */
void sw_arena_init_static(struct sw_arena *a, void *base, size_t cap);

/* Frees what sw_arena_init reserved. Accepts a zeroed arena. */
void sw_arena_destroy(struct sw_arena *a);

/* Returns size bytes aligned to align (a power of two, at most 4096), or
 * NULL when the arena is full (the arena is then unchanged). */
void *sw_arena_alloc(struct sw_arena *a, size_t size, size_t align);

static inline void sw_arena_reset(struct sw_arena *a) { a->used = 0; }

/* A mark/rewind pair frees everything allocated after the mark. */
static inline size_t sw_arena_mark(const struct sw_arena *a) { return a->used; }
static inline void sw_arena_rewind(struct sw_arena *a, size_t mark) { a->used = mark; }

#endif
