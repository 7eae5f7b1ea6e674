/* lru.h - bounded LRU cache with pinning (mask cache, prefix KV cache).
 *
 * Bounded twice: at most max_entries entries and at most max_bytes bytes
 * (the caller states each entry's size). Inserting past either bound evicts
 * least recently used *unpinned* entries; a pinned entry (refs > 0) is never
 * evicted. Every entry leaving the cache, by eviction, erase, clear or
 * destroy, goes through the evict callback, which releases the value.
 *
 * Keys: a u64 key, usually a sw_hash64 of the real key. Without an eq
 * callback the u64 *is* the key (exact match). With one, entries whose
 * u64 matches are also compared with eq(value, probe), so two different
 * real keys that collide on the hash never share an entry, and insert
 * accepts several entries under one u64.
 *
 * Entries come from a fixed array and the hash table is sized at create:
 * nothing is allocated after sw_lru_create. Lookup, insert, pin, unpin and
 * erase are O(1) (plus the entries evicted). Not thread-safe: one owner or
 * an outside lock. Callbacks must not call back into the same cache.
 */
#ifndef SW_LRU_H
#define SW_LRU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sw_lru;
struct sw_lru_entry; /* a handle, valid while the entry is in the cache */

/* Called once for every entry that leaves the cache. */
typedef void (*sw_lru_evict_fn)(void *ctx, uint64_t key, void *value, size_t bytes);

/* True when value (stored in the cache) is the one probe describes. */
typedef bool (*sw_lru_eq_fn)(void *ctx, const void *value, const void *probe);

struct sw_lru_params {
	const char *name;       /* copied; for reports */
	size_t max_bytes;       /* > 0 */
	uint32_t max_entries;   /* > 0, at most 1 << 30 */
	sw_lru_evict_fn evict;  /* optional */
	sw_lru_eq_fn eq;        /* optional: NULL means the u64 key is exact */
	void *ctx;              /* passed to both callbacks */
};

struct sw_lru_stats {
	uint64_t hits, misses;  /* sw_lru_get outcomes */
	uint64_t inserts;       /* successful inserts */
	uint64_t evictions;     /* entries pushed out to make room */
	uint64_t insert_fails;  /* inserts refused (pinned, too big, dup) */
	size_t bytes;           /* sum of entry sizes now */
	size_t pinned_bytes;
	uint32_t entries;       /* entries now */
	uint32_t pinned;        /* entries with refs > 0 */
	size_t max_bytes;
	uint32_t max_entries;
};

/* Creates a cache. Returns 0 and sets *out, -EINVAL for a zero or too large
 * bound, or -ENOMEM. On error *out is untouched. */
int sw_lru_create(struct sw_lru **out, const struct sw_lru_params *params);

/* Evicts every entry (pinned ones too: the cache is going away) through the
 * callback, then frees the cache. Accepts NULL. */
void sw_lru_destroy(struct sw_lru *l);

/* Looks key (and probe, with eq) up. On a hit the entry becomes most
 * recently used, its refcount goes up (the caller must sw_lru_unpin it)
 * and it is returned; on a miss NULL. Counts a hit or a miss. */
struct sw_lru_entry *sw_lru_get(struct sw_lru *l, uint64_t key, const void *probe);

/* Looks up without pinning, counting or touching recency (reports). */
struct sw_lru_entry *sw_lru_peek(const struct sw_lru *l, uint64_t key, const void *probe);

/* Inserts value of the given size under key, evicting unpinned entries in
 * LRU order until both bounds hold. probe describes the new entry for the
 * duplicate check, as for sw_lru_get (ignored without eq). When pin is set the new entry starts
 * with one reference. *out (may be NULL) receives the handle.
 * Errors, after which nothing at all has changed (nothing evicted, value
 * not owned by the cache, only insert_fails counted):
 *   SW_ETOOLONG  bytes > max_bytes: can never fit;
 *   SW_EPINNED   it would fit only by evicting pinned entries;
 *   -EEXIST      an equal entry (same key, and eq true if set) is cached.
 * On success the cache owns value until the evict callback returns it. */
int sw_lru_insert(struct sw_lru *l, uint64_t key, const void *probe, void *value,
		  size_t bytes, bool pin, struct sw_lru_entry **out);

/* Takes one more reference on a cached entry. */
void sw_lru_pin(struct sw_lru *l, struct sw_lru_entry *e);

/* Drops one reference; at zero the entry becomes evictable again and most
 * recently used. Returns 0, or -EINVAL if the entry was not pinned
 * (nothing changes). */
int sw_lru_unpin(struct sw_lru *l, struct sw_lru_entry *e);

/* Removes an unpinned entry now, through the evict callback (not counted as
 * an eviction). Returns 0 or SW_EPINNED (nothing changes). */
int sw_lru_erase(struct sw_lru *l, struct sw_lru_entry *e);

/* Evicts every unpinned entry through the callback (counted). */
void sw_lru_clear(struct sw_lru *l);

/* Evicts the least recently used unpinned entry through the callback
 * (counted), for owners that bound the cache by something of their own
 * (free memory elsewhere, a bound on unpinned bytes). Returns 0, or
 * SW_ENOTFOUND when no entry is unpinned (nothing changes). */
int sw_lru_evict_one(struct sw_lru *l);

/* Accessors for a handle. */
void *sw_lru_value(const struct sw_lru_entry *e);
uint64_t sw_lru_key(const struct sw_lru_entry *e);
size_t sw_lru_bytes(const struct sw_lru_entry *e);
uint32_t sw_lru_refs(const struct sw_lru_entry *e);

void sw_lru_stats(const struct sw_lru *l, struct sw_lru_stats *st);

/* Consistency (tests): the hash chains hold exactly the cached entries,
 * each under its key's bucket; the recency list exactly the unpinned
 * ones, linked both ways; the free list the rest; the counts and byte
 * sums agree. Returns 0, or SW_EFORMAT with a message in err. */
int sw_lru_check(const struct sw_lru *l, char *err, size_t errlen);

#endif
