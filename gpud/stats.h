/* stats.h - gpud's numbers as one plain snapshot, rendered as the STATS /
 * MEM JSON replies and as Prometheus text (DESIGN §2).
 *
 * The daemon fills a struct gpud_stats_snapshot from its parts (server,
 * scheduler, engines, caches, watchdog, allocation counters); this module
 * only renders it. Rendering writes into a caller buffer and allocates
 * nothing (a stats request must not show up in the allocation counters
 * it reports).
 *
 * JSON schema (stable: swarmctl, the tests and the load tool read it;
 * grow it, never rename). Counts are integers, rates and times floats:
 *
 * STATS:
 * { "version": "0.4.0", "uptime_s": 12.5, "draining": false,
 *   "chat_format": "llama3",
 *     (the format chat requests are written in: gpud_chat_name's, "none"
 *     when they are refused; gpud-http reads it to split a reasoning
 *     model's <think> text from its answer)
 *   "requests": { "admitted", "completed", "errors", "cancelled", "busy",
 *                 "refused", "in_flight" },
 *   "tokens": { "prompt", "cached_prompt", "generated", "per_s" },
 *   "connections": { "open", "high", "accepted", "refused_peer", "bad_frames",
 *                    "stalled" },
 *   "alloc": { "counted": true, "warm": true,
 *              "since_warmup": { "host": N, "host_loop": N, "host_device": N,
 *                                "host_other": N, "host_foreign": N, "device": N,
 *                                "host_frees": N, "host_bytes": N,
 *                                "device_bytes": N },
 *     ("host", "host_frees", "host_bytes": gpud's own threads, loop + device
 *     + other; "host_foreign": threads a library started for itself, such
 *     as the CUDA driver's, not gpud's to answer for)
 *              "total": { ...same keys... } },
 *     (counted false: "since_warmup" and "total" are null - not counted is
 *     not zero)
 *   "devices": [ { "name": "cpu0", "queue", "running", "steps", "tokens",
 *                  "generated", "preemptions", "placed_prefix",
 *                  "placed_load", "prefix_hits", "prefix_hit_tokens",
 *                  "chunk_hits", "chunk_misses", "chunk_hit_tokens",
 *                  "alloc": { "device": N } } ],
 *   "left_out": [ { "name": "cuda3", "device": "cuda:3", "error": "..." } ],
 *     (configured devices gpud started without, gpud.min_devices; [] when
 *     every one started. One left out in warm-up also stays in "devices"
 *     with "failed": true: fenced off, its memory still held)
 *   "pools": [ { "name": "cpu0.kv", "unit": "blocks", "unit_bytes",
 *                "capacity", "used", "free", "high", "largest_free_run",
 *                "live", "cached", "cache": "cpu0.prefix", "cache_bound",
 *                "trough", "trough_k_ago", "rising", "warning" } ],
 *   "caches": [ { "name": "mask", "hits", "misses", "evictions", "bytes",
 *                 "max_bytes", "entries", "max_entries", "pinned",
 *                 "hit_tokens" } ],
 *   "watchdog": { "rising": false, "warnings": [ "..." ], "window_ms": N,
 *                 "k": N } }
 *
 * A pool's "used" units are "live" (held by live requests: what can leak)
 * plus "cached" (kept by the cache named "cache", at most "cache_bound"
 * units; "" and 0 for a pool no cache shares). The watchdog watches the
 * live part (DESIGN §2): "trough" and "trough_k_ago" are its rolling
 * minima, "rising"/"warning" its verdict. For the kv pools the cache is
 * the prefix cache and cached counts its blocks no request uses plus the
 * chunk-KV cache's blocks (bound: prefix_cache_bytes + chunk_cache_bytes
 * in blocks; the "cache" name stays "<device>.prefix"); for the mask pools the mask cache and
 * its unpinned masks (bound: its entries). The "caches" entries give the
 * same caches' own counters and bounds (bytes, entries).
 *
 * MEM: the same object without "requests", "tokens", "connections" and
 * "devices", plus "dump": "<path>" when an owner dump was written.
 *
 * Floats are written with %.9g; NaN and infinities as null. A NULL version
 * is null. Names are read up to their array size (no NUL needed); control
 * characters are escaped and invalid UTF-8 bytes become U+FFFD. Counts
 * beyond the arrays (n_pools > GPUD_STATS_MAX_POOLS, ...) are clamped.
 * "watchdog.rising" is true when any pool rises; "warnings" lists the
 * non-empty pool warnings in pool order.
 */
#ifndef GPUD_STATS_H
#define GPUD_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/alloc.h"

#define GPUD_STATS_MAX_DEVICES 16
#define GPUD_STATS_MAX_POOLS 64
#define GPUD_STATS_MAX_CACHES 48 /* mask, prefix and chunk per device */
#define GPUD_STATS_NAME_MAX 32
#define GPUD_STATS_WARN_MAX 192

struct gpud_stats_pool {
	char name[GPUD_STATS_NAME_MAX]; /* "cpu0.kv", "cpu0.scratch", "mask", ... */
	const char *unit;               /* static: "blocks", "slots" or "bytes" */
	uint64_t unit_bytes;            /* bytes per unit (1 for bytes) */
	uint64_t capacity, used, free, high, largest_free_run;
	uint64_t live, cached;          /* used = live + cached (see above) */
	char cache[GPUD_STATS_NAME_MAX]; /* the cache keeping `cached`, or "" */
	uint64_t cache_bound;           /* most units that cache keeps; 0: none */
	uint64_t trough, trough_k_ago;  /* the watchdog's view of live (memwatch) */
	bool rising;
	char warning[GPUD_STATS_WARN_MAX]; /* "" when not rising */
};

struct gpud_stats_cache {
	char name[GPUD_STATS_NAME_MAX]; /* "mask", "cpu0.prefix", ... */
	uint64_t hits, misses, evictions;
	uint64_t bytes, max_bytes;
	uint64_t entries, max_entries, pinned;
	uint64_t hit_tokens;            /* prefix caches: prompt tokens served from cache */
};

struct gpud_stats_device {
	char name[GPUD_STATS_NAME_MAX]; /* "cpu0", "cuda:1" */
	uint32_t queue;                 /* waiting + running requests */
	uint32_t running;
	uint64_t steps, tokens, generated, preemptions;
	uint64_t placed_prefix;         /* requests placed here for a cached prefix */
	uint64_t placed_load;           /* requests placed here by load */
	uint64_t alloc_device;          /* allocations its backend made after init
					 * (struct gpud_backend_stats
					 * allocs_after_init): must stay 0 */
	uint64_t prefix_hits;           /* prompt blocks served by the prefix cache */
	uint64_t prefix_hit_tokens;     /* their tokens */
	uint64_t chunk_hits;            /* self-only segments copied from the chunk-KV cache */
	uint64_t chunk_misses;          /* cacheable segments it did not have */
	uint64_t chunk_hit_tokens;      /* their tokens (copied, not computed) */
	uint64_t rows_argmax;           /* logits rows of greedy tokens (arg max) */
	uint64_t rows_drawn;            /* drawn where the row is (the device) */
	uint64_t rows_host;             /* read (sampled) on the host */
	uint64_t failed;                /* 1: the device failed (SW_EDEVICE),
					 * gpud is on its way out */
};

/* A configured device gpud started without (gpud.min_devices); the
 * strings are the daemon's, fixed after start. */
struct gpud_stats_left_out {
	const char *name;               /* "cuda3" */
	const char *device;             /* "cuda:3" */
	const char *error;              /* why it could not start */
};

struct gpud_stats_snapshot {
	const char *version;
	const char *chat_format;        /* gpud_chat_name, or "none" */
	uint64_t watchdog_window_ms;    /* gpud.watchdog.window_ms */
	uint32_t watchdog_k;            /* gpud.watchdog.k */
	double uptime_s;
	bool draining;
	struct {
		uint64_t admitted, completed, errors, cancelled, busy, refused;
		uint32_t in_flight;
	} requests;
	struct {
		uint64_t prompt, cached_prompt, generated;
		double per_s;                   /* generated tokens/s, recent */
	} tokens;
	struct {
		uint32_t open, high;
		uint64_t accepted, refused_peer, bad_frames, stalled;
	} connections;
	bool alloc_counted;
	bool alloc_warm;
	struct gpud_alloc_counts alloc_total;
	struct gpud_alloc_counts alloc_since_warmup;
	uint32_t n_devices;
	struct gpud_stats_device devices[GPUD_STATS_MAX_DEVICES];
	uint32_t n_left_out;
	struct gpud_stats_left_out left_out[GPUD_STATS_MAX_DEVICES];
	uint32_t n_pools;
	struct gpud_stats_pool pools[GPUD_STATS_MAX_POOLS];
	uint32_t n_caches;
	struct gpud_stats_cache caches[GPUD_STATS_MAX_CACHES];
	const char *dump_path;                  /* MEM with an owner dump, else NULL */
};

/* Fills the alloc_* fields of s from gpud/alloc.h (counted = hooked()).
 * Any thread; never allocates. */
void gpud_stats_fill_alloc(struct gpud_stats_snapshot *s);

/* Renders the STATS object (mem false) or the MEM object (mem true) into
 * buf (cap bytes, not NUL-terminated; *len bytes written). Strings are
 * escaped. Returns 0, SW_ETOOLONG when cap is too small (nothing usable
 * in buf), -EINVAL for NULL arguments. Never allocates. */
int gpud_stats_json(const struct gpud_stats_snapshot *s, bool mem, char *buf, size_t cap,
		    size_t *len);

/* The same numbers in the Prometheus text exposition format (version
 * 0.0.4): gpud_requests_total{status="completed"}, gpud_tokens_total,
 * gpud_pool_used{pool="cpu0.kv"}, gpud_pool_capacity, gpud_pool_high,
 * gpud_pool_live, gpud_pool_cached, gpud_pool_cache_bound,
 * gpud_pool_trough, gpud_cache_hits_total{cache="mask"}, ...,
 * gpud_devices{state="serving"} (devices not failed) and
 * gpud_devices{state="left_out"},
 * gpud_alloc_since_warmup{kind="host",role="device"}, each with # HELP and
 * # TYPE lines. Label values escape backslash, quote and newline; other
 * control characters and invalid UTF-8 become U+FFFD. When allocations
 * are not counted only gpud_alloc_counted 0 is written, no gpud_alloc_*
 * count series. Same returns as gpud_stats_json. */
int gpud_stats_prometheus(const struct gpud_stats_snapshot *s, char *buf, size_t cap,
			  size_t *len);

#endif
