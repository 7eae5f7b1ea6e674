/* lru.c - chained hash table over a fixed entry array, plus an intrusive
 * doubly linked recency list that holds only the *unpinned* entries, so
 * eviction takes the list tail without ever stepping over pinned ones.
 */
#include "common/lru.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#define NIL UINT32_MAX
#define LRU_MAX_ENTRIES (1u << 30)

struct sw_lru_entry {
	uint64_t key;
	void *value;
	size_t bytes;
	uint32_t refs;
	uint32_t hnext;         /* next in bucket chain, or next free entry */
	uint32_t prev, next;    /* recency list (unpinned entries only) */
	bool live;
};

struct sw_lru {
	char name[32];
	size_t max_bytes;
	uint32_t max_entries;
	sw_lru_evict_fn evict;
	sw_lru_eq_fn eq;
	void *ctx;

	struct sw_lru_entry *e; /* (max_entries) */
	uint32_t *bucket;       /* (nbuckets) head entry index or NIL */
	unsigned bucket_bits;   /* nbuckets == 1 << bucket_bits */
	uint32_t free_head;
	uint32_t mru, lru;      /* ends of the recency list */

	size_t bytes, pinned_bytes;
	uint32_t count, pinned;
	uint64_t hits, misses, inserts, evictions, insert_fails;
};

/* Keys may be small integers, so mix before taking the top bits. */
static inline uint32_t bucket_of(const struct sw_lru *l, uint64_t key)
{
	return (uint32_t)((key * 0x9e3779b97f4a7c15ULL) >> (64 - l->bucket_bits));
}

static inline uint32_t idx_of(const struct sw_lru *l, const struct sw_lru_entry *e)
{
	return (uint32_t)(e - l->e);
}

int sw_lru_create(struct sw_lru **out, const struct sw_lru_params *params)
{
	struct sw_lru *l;
	unsigned bits = 1;

	if (!params || params->max_bytes == 0 || params->max_entries == 0 ||
	    params->max_entries > LRU_MAX_ENTRIES)
		return -EINVAL;
	/* At least two buckets per entry keeps chains short. */
	while ((1ull << bits) < 2ull * params->max_entries)
		bits++;

	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->e = calloc(params->max_entries, sizeof(l->e[0]));
	if (!l->e)
		goto out_free_lru;
	l->bucket = malloc(((size_t)1 << bits) * sizeof(l->bucket[0]));
	if (!l->bucket)
		goto out_free_entries;

	snprintf(l->name, sizeof(l->name), "%s", params->name ? params->name : "lru");
	l->max_bytes = params->max_bytes;
	l->max_entries = params->max_entries;
	l->evict = params->evict;
	l->eq = params->eq;
	l->ctx = params->ctx;
	l->bucket_bits = bits;
	memset(l->bucket, 0xff, ((size_t)1 << bits) * sizeof(l->bucket[0]));
	for (uint32_t i = 0; i < l->max_entries; i++)
		l->e[i].hnext = i + 1 < l->max_entries ? i + 1 : NIL;
	l->free_head = 0;
	l->mru = l->lru = NIL;
	*out = l;
	return 0;

out_free_entries:
	free(l->e);
out_free_lru:
	free(l);
	return -ENOMEM;
}

static void list_unlink(struct sw_lru *l, uint32_t i)
{
	struct sw_lru_entry *e = &l->e[i];

	if (e->prev != NIL)
		l->e[e->prev].next = e->next;
	else
		l->mru = e->next;
	if (e->next != NIL)
		l->e[e->next].prev = e->prev;
	else
		l->lru = e->prev;
	e->prev = e->next = NIL;
}

static void list_push_mru(struct sw_lru *l, uint32_t i)
{
	struct sw_lru_entry *e = &l->e[i];

	e->prev = NIL;
	e->next = l->mru;
	if (l->mru != NIL)
		l->e[l->mru].prev = i;
	else
		l->lru = i;
	l->mru = i;
}

static struct sw_lru_entry *find(const struct sw_lru *l, uint64_t key, const void *probe)
{
	for (uint32_t i = l->bucket[bucket_of(l, key)]; i != NIL; i = l->e[i].hnext) {
		const struct sw_lru_entry *e = &l->e[i];
		if (e->key == key && (!l->eq || l->eq(l->ctx, e->value, probe)))
			return (struct sw_lru_entry *)e;
	}
	return NULL;
}

/* Unlinks entry i from its bucket and the recency list, returns it to the
 * free list and hands the value to the callback. */
static void remove_entry(struct sw_lru *l, uint32_t i)
{
	struct sw_lru_entry *e = &l->e[i];
	uint32_t *link = &l->bucket[bucket_of(l, e->key)];

	while (*link != i)
		link = &l->e[*link].hnext;
	*link = e->hnext;
	if (e->refs) {
		l->pinned--;
		l->pinned_bytes -= e->bytes;
	} else {
		list_unlink(l, i);
	}
	l->count--;
	l->bytes -= e->bytes;

	uint64_t key = e->key;
	void *value = e->value;
	size_t bytes = e->bytes;
	memset(e, 0, sizeof(*e));
	e->prev = e->next = NIL;
	e->hnext = l->free_head;
	l->free_head = i;
	if (l->evict)
		l->evict(l->ctx, key, value, bytes);
}

void sw_lru_destroy(struct sw_lru *l)
{
	if (!l)
		return;
	for (uint32_t i = 0; i < l->max_entries; i++)
		if (l->e[i].live)
			remove_entry(l, i);
	free(l->bucket);
	free(l->e);
	free(l);
}

struct sw_lru_entry *sw_lru_get(struct sw_lru *l, uint64_t key, const void *probe)
{
	struct sw_lru_entry *e = find(l, key, probe);

	if (!e) {
		l->misses++;
		return NULL;
	}
	l->hits++;
	sw_lru_pin(l, e);
	return e;
}

struct sw_lru_entry *sw_lru_peek(const struct sw_lru *l, uint64_t key, const void *probe)
{
	return find(l, key, probe);
}

int sw_lru_insert(struct sw_lru *l, uint64_t key, const void *probe, void *value,
		  size_t bytes, bool pin, struct sw_lru_entry **out)
{
	if (bytes > l->max_bytes) {
		l->insert_fails++;
		return SW_ETOOLONG;
	}
	if (find(l, key, probe)) {
		l->insert_fails++;
		return -EEXIST;
	}
	/* Decide before evicting anything: only unpinned entries can go. */
	if (l->pinned + 1 > l->max_entries || l->pinned_bytes + bytes > l->max_bytes) {
		l->insert_fails++;
		return SW_EPINNED;
	}
	while (l->count + 1 > l->max_entries || l->bytes + bytes > l->max_bytes) {
		remove_entry(l, l->lru); /* non-NIL: the check above guarantees it */
		l->evictions++;
	}

	uint32_t i = l->free_head;
	struct sw_lru_entry *e = &l->e[i];
	l->free_head = e->hnext;

	uint32_t b = bucket_of(l, key);
	e->key = key;
	e->value = value;
	e->bytes = bytes;
	e->live = true;
	e->refs = 0;
	e->hnext = l->bucket[b];
	l->bucket[b] = i;
	l->count++;
	l->bytes += bytes;
	list_push_mru(l, i);
	if (pin)
		sw_lru_pin(l, e);
	l->inserts++;
	if (out)
		*out = e;
	return 0;
}

void sw_lru_pin(struct sw_lru *l, struct sw_lru_entry *e)
{
	if (e->refs++ == 0) {
		list_unlink(l, idx_of(l, e));
		l->pinned++;
		l->pinned_bytes += e->bytes;
	}
}

int sw_lru_unpin(struct sw_lru *l, struct sw_lru_entry *e)
{
	if (e->refs == 0)
		return -EINVAL;
	if (--e->refs == 0) {
		l->pinned--;
		l->pinned_bytes -= e->bytes;
		list_push_mru(l, idx_of(l, e));
	}
	return 0;
}

int sw_lru_erase(struct sw_lru *l, struct sw_lru_entry *e)
{
	if (e->refs)
		return SW_EPINNED;
	remove_entry(l, idx_of(l, e));
	return 0;
}

void sw_lru_clear(struct sw_lru *l)
{
	while (sw_lru_evict_one(l) == 0)
		;
}

int sw_lru_evict_one(struct sw_lru *l)
{
	if (l->lru == NIL)
		return SW_ENOTFOUND;
	remove_entry(l, l->lru);
	l->evictions++;
	return 0;
}

void *sw_lru_value(const struct sw_lru_entry *e)
{
	return e->value;
}

uint64_t sw_lru_key(const struct sw_lru_entry *e)
{
	return e->key;
}

size_t sw_lru_bytes(const struct sw_lru_entry *e)
{
	return e->bytes;
}

uint32_t sw_lru_refs(const struct sw_lru_entry *e)
{
	return e->refs;
}

void sw_lru_stats(const struct sw_lru *l, struct sw_lru_stats *st)
{
	st->hits = l->hits;
	st->misses = l->misses;
	st->inserts = l->inserts;
	st->evictions = l->evictions;
	st->insert_fails = l->insert_fails;
	st->bytes = l->bytes;
	st->pinned_bytes = l->pinned_bytes;
	st->entries = l->count;
	st->pinned = l->pinned;
	st->max_bytes = l->max_bytes;
	st->max_entries = l->max_entries;
}

int sw_lru_check(const struct sw_lru *l, char *err, size_t errlen)
{
	uint32_t live = 0, pinned = 0, hashed = 0, listed = 0, n_free = 0;
	size_t bytes = 0, pinned_bytes = 0;

	for (uint32_t i = 0; i < l->max_entries; i++) {
		const struct sw_lru_entry *e = &l->e[i];

		if (!e->live)
			continue;
		live++;
		bytes += e->bytes;
		if (e->refs) {
			pinned++;
			pinned_bytes += e->bytes;
		}
	}
	for (uint32_t b = 0; b < (1u << l->bucket_bits); b++) {
		for (uint32_t i = l->bucket[b]; i != NIL; i = l->e[i].hnext) {
			if (i >= l->max_entries || !l->e[i].live ||
			    bucket_of(l, l->e[i].key) != b || ++hashed > live)
				return sw_seterr(err, errlen, SW_EFORMAT,
						 "%s: bucket %u holds a bad entry %u", l->name, b,
						 i);
		}
	}
	for (uint32_t i = l->mru, prev = NIL; i != NIL; prev = i, i = l->e[i].next) {
		if (i >= l->max_entries || !l->e[i].live || l->e[i].refs ||
		    l->e[i].prev != prev || ++listed > live)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "%s: recency list holds a bad entry %u", l->name, i);
		if (l->e[i].next == NIL && l->lru != i)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "%s: recency list ends at %u, lru is %u", l->name, i,
					 l->lru);
	}
	if (l->mru == NIL && l->lru != NIL)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: empty recency list, lru %u",
				 l->name, l->lru);
	for (uint32_t i = l->free_head; i != NIL; i = l->e[i].hnext)
		if (i >= l->max_entries || l->e[i].live || ++n_free > l->max_entries)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "%s: free list holds a bad entry %u", l->name, i);
	if (live != l->count || pinned != l->pinned || hashed != live ||
	    listed != live - pinned || live + n_free != l->max_entries ||
	    bytes != l->bytes || pinned_bytes != l->pinned_bytes)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: %u live (count %u), %u pinned (count %u), %u hashed, "
				 "%u listed, %u free, %zu bytes (count %zu), %zu pinned bytes "
				 "(count %zu)", l->name, live, l->count, pinned, l->pinned, hashed,
				 listed, n_free, bytes, l->bytes, pinned_bytes, l->pinned_bytes);
	return 0;
}
