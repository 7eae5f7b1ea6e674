/* memwatch.h - trough watchdog for fixed pools (DESIGN §2).
 *
 * The incident swarm exists to prevent showed up as memory whose *low*
 * point rose for hours: peaks say little (a busy step is allowed to fill
 * the pool), but a floor that never comes back down means something is
 * held for good (a leak, a cache that never lets go, fragmentation). So
 * for every registered pool the watchdog keeps the minimum of the amount
 * used (its live part, see below) over aligned windows of window_ms (window w covers
 * [w * window_ms, (w + 1) * window_ms)) and a ring of the last k closed
 * window minima ("troughs"). When a window closes and the ring is full,
 * the pool is *rising* if
 *   - the k troughs never fall from one window to the next, rise from one
 *     to the next at least min_steps times, and the newest is at least
 *     min_rise above the oldest (a leak rises window after window; a load
 *     that steps up once and stays, which lifts the trough of what live
 *     requests hold, rises once: min_steps 2 tells them apart), or
 *   - the newest trough is more than rise_fraction * capacity above the
 *     oldest (rise_fraction > 0), however it got there.
 * The first window close that finds a pool rising starts an episode: one
 * log_warn line and a warning string in the status; the flag clears at the
 * first window close where neither rule holds (then a new episode may
 * start and warn again).
 *
 * What to feed it (DESIGN §2): what can leak, the units held by live
 * requests (KV blocks in their tables, mask slots they pin, server slots),
 * never what a bounded cache legitimately keeps. A cache filling to its
 * bound would otherwise read as a rising trough, and a full cache, whose
 * evictions make room for whatever leaks, would hide a real leak. A pool
 * that a cache shares is registered with gpud_memwatch_register_cached
 * and fed with gpud_memwatch_sample_split: the live part is watched, the
 * cached part only recorded and reported beside it against its bound
 * (and named in the warning, so the reader sees a full cache did not
 * cause it).
 *
 * Units are the caller's (bytes or blocks), the same for capacity and
 * samples. Windows in which a pool got no sample are skipped: they do not
 * enter its ring (no information, not a low). A sample whose time is
 * earlier than the pool's latest one (a clock step back) counts in the
 * current window and is counted in clock_backwards.
 *
 * Memory is fixed at create (max_pools pools with a k-entry ring each);
 * sample, status and report never allocate. Not thread-safe: feed it from
 * one thread (the device worker or the stats tick) or under a lock.
 */
#ifndef GPUD_MEMWATCH_H
#define GPUD_MEMWATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gpud_memwatch;

#define GPUD_MEMWATCH_NAME_MAX 31  /* bytes of a pool name, NUL excluded */
#define GPUD_MEMWATCH_MAX_K 256    /* largest ring */
#define GPUD_MEMWATCH_WARN_MAX 256 /* warning string, NUL included */

struct gpud_memwatch_params {
	uint32_t max_pools;    /* 1..4096 */
	uint64_t window_ms;    /* > 0 */
	uint32_t k;            /* troughs compared, 2..GPUD_MEMWATCH_MAX_K */
	uint64_t min_rise;     /* monotonic rule: least total rise; 0 means 1 */
	uint32_t min_steps;    /* monotonic rule: least windows that rise;
				* 0 means 1, more than k - 1 means k - 1 */
	double rise_fraction;  /* threshold rule, of capacity; 0 disables it */
};

struct gpud_memwatch_status {
	const char *name;       /* owned by the watchdog */
	uint64_t capacity;
	uint64_t current;       /* latest sample (the live part) */
	uint64_t high;          /* highest sample ever (the live part) */
	uint64_t trough;        /* minimum of the open window so far */
	uint64_t trough_k_ago;  /* oldest trough in the ring (the open
				 * window's minimum while the ring is empty) */
	uint32_t windows;       /* closed windows in the ring, <= k */
	bool rising;
	uint64_t episodes;      /* rising episodes started */
	uint64_t samples;
	uint64_t clock_backwards;
	uint64_t cached;        /* latest cached part (0 without a cache) */
	uint64_t cached_high;   /* highest cached part ever */
	uint64_t cache_bound;   /* as registered; 0: the pool has no cache */
	const char *warning;    /* "" when not rising; owned by the watchdog,
				 * valid until the next sample of this pool */
};

/* Creates a watchdog. Returns 0 and sets *out, -EINVAL for parameters out
 * of range (rise_fraction must be in [0, 1]), -ENOMEM; *out untouched on
 * error. Free with gpud_memwatch_destroy. */
int gpud_memwatch_create(struct gpud_memwatch **out, const struct gpud_memwatch_params *p);

/* Frees the watchdog. Accepts NULL. */
void gpud_memwatch_destroy(struct gpud_memwatch *w);

/* Registers a pool of the given capacity (> 0) named name (1 to
 * GPUD_MEMWATCH_NAME_MAX characters from [A-Za-z0-9_.:-], copied) and
 * returns its id (>= 0, ids are given in order). Errors, nothing changes:
 * -EINVAL (bad name or capacity), -EEXIST (name taken), SW_EEXHAUSTED
 * (max_pools already registered). */
int gpud_memwatch_register(struct gpud_memwatch *w, const char *name, uint64_t capacity);

/* Registers like gpud_memwatch_register a pool part of which a bounded
 * cache may keep, at most cache_bound units (1..capacity; 0 is a plain
 * pool). Same returns; -EINVAL also for cache_bound > capacity. */
int gpud_memwatch_register_cached(struct gpud_memwatch *w, const char *name, uint64_t capacity,
				  uint64_t cache_bound);

/* Sets the monotonic rule's min_steps for pool id alone (0 means 1, more
 * than k - 1 means k - 1; a pool starts with the watchdog's). For a pool
 * whose use is a population that joins at its own pace, not a load that
 * comes and goes: gpud's connection slots, one per connected client,
 * whose trough climbs in as many steps as the clients take to (re)connect
 * after a start, but rises in every window only when slots leak under a
 * steady churn. Returns 0, or -EINVAL for an unknown id. */
int gpud_memwatch_set_min_steps(struct gpud_memwatch *w, int id, uint32_t min_steps);

/* Feeds one sample of pool id: used units at now_ms (any monotonic clock
 * in ms). Closes the pool's open window when now_ms is past it, which may
 * start or end a rising episode (and log). O(k) at a window close, O(1)
 * otherwise. Returns 0, or -EINVAL for an unknown id or used > capacity
 * (the sample is dropped). */
int gpud_memwatch_sample(struct gpud_memwatch *w, int id, uint64_t now_ms, uint64_t used);

/* Feeds one sample of pool id split in two: live units (held by live
 * requests: what the trough watches, exactly as gpud_memwatch_sample's
 * used) and cached units (kept by the pool's cache: recorded, never
 * watched; it may pass cache_bound, since an owner trims its cache after
 * the fact). Same returns as gpud_memwatch_sample, -EINVAL also when
 * live + cached > capacity (dropped). gpud_memwatch_sample(used) is
 * gpud_memwatch_sample_split(used, 0). */
int gpud_memwatch_sample_split(struct gpud_memwatch *w, int id, uint64_t now_ms, uint64_t live,
			       uint64_t cached);

/* Fills *st for pool id. Returns 0 or -EINVAL for an unknown id. */
int gpud_memwatch_status(const struct gpud_memwatch *w, int id, struct gpud_memwatch_status *st);

/* Number of registered pools; ids are 0 .. count - 1. */
int gpud_memwatch_count(const struct gpud_memwatch *w);

/* True when any pool is rising. */
bool gpud_memwatch_any_rising(const struct gpud_memwatch *w);

/* Writes a JSON object describing every pool into buf (NUL-terminated when
 * len > 0), like snprintf: returns the length the whole report needs
 * (excluding the NUL), so a result >= len means it was cut; -EINVAL when
 * buf is NULL with len > 0. Never allocates. Shape:
 * {"window_ms":N,"k":N,"pools":[{"name":"kv","capacity":N,"current":N,
 *  "high":N,"trough":N,"trough_k_ago":N,"windows":N,"rising":false,
 *  "episodes":N,"samples":N,"clock_backwards":N,"cached":N,
 *  "cached_high":N,"cache_bound":N,"warning":""},...]} */
int gpud_memwatch_report(const struct gpud_memwatch *w, char *buf, size_t len);

#endif
