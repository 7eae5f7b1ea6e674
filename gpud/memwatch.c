/* memwatch.c - per-pool window minima in fixed rings; see memwatch.h. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "gpud/memwatch.h"

struct mw_pool {
	char name[GPUD_MEMWATCH_NAME_MAX + 1];
	uint64_t capacity;
	uint64_t cache_bound;   /* 0: no cache shares the pool */
	uint32_t min_steps;     /* the monotonic rule's, for this pool */
	uint64_t current, high; /* of the live part */
	uint64_t cached, cached_high;
	uint64_t win_idx;       /* open window: [win_idx * window_ms, +window_ms) */
	uint64_t win_min;       /* minimum of the open window */
	uint64_t last_ms;
	bool started;           /* got a sample: the fields above mean something */
	uint64_t *ring;         /* (k) closed window minima, oldest at head */
	uint32_t head, n_ring;
	bool rising;
	uint64_t episodes, samples, backwards;
	char warning[GPUD_MEMWATCH_WARN_MAX];
};

struct gpud_memwatch {
	struct gpud_memwatch_params p;
	uint32_t n_pools;
	struct mw_pool *pools;  /* (max_pools) */
	uint64_t *rings;        /* (max_pools, k) */
};

int gpud_memwatch_create(struct gpud_memwatch **out, const struct gpud_memwatch_params *p)
{
	struct gpud_memwatch *w;
	uint32_t i;

	if (!out || !p || p->max_pools == 0 || p->max_pools > 4096 || p->window_ms == 0 ||
	    p->k < 2 || p->k > GPUD_MEMWATCH_MAX_K || !(p->rise_fraction >= 0.0) ||
	    p->rise_fraction > 1.0)
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->p = *p;
	if (w->p.min_rise == 0)
		w->p.min_rise = 1;
	if (w->p.min_steps == 0)
		w->p.min_steps = 1;
	if (w->p.min_steps > w->p.k - 1)
		w->p.min_steps = w->p.k - 1;
	w->pools = calloc(p->max_pools, sizeof(*w->pools));
	if (!w->pools)
		goto out_free_w;
	w->rings = calloc((size_t)p->max_pools * p->k, sizeof(*w->rings));
	if (!w->rings)
		goto out_free_pools;
	for (i = 0; i < p->max_pools; i++)
		w->pools[i].ring = w->rings + (size_t)i * p->k;
	*out = w;
	return 0;

out_free_pools:
	free(w->pools);
out_free_w:
	free(w);
	return -ENOMEM;
}

void gpud_memwatch_destroy(struct gpud_memwatch *w)
{
	if (!w)
		return;
	free(w->rings);
	free(w->pools);
	free(w);
}

static bool name_ok(const char *name)
{
	size_t n = 0;

	if (!name)
		return false;
	for (; name[n]; n++) {
		char ch = name[n];

		if (n >= GPUD_MEMWATCH_NAME_MAX)
			return false;
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == ':' ||
		      ch == '-'))
			return false;
	}
	return n > 0;
}

int gpud_memwatch_register(struct gpud_memwatch *w, const char *name, uint64_t capacity)
{
	return gpud_memwatch_register_cached(w, name, capacity, 0);
}

int gpud_memwatch_register_cached(struct gpud_memwatch *w, const char *name, uint64_t capacity,
				  uint64_t cache_bound)
{
	struct mw_pool *mp;
	uint32_t i;

	if (!w || !name_ok(name) || capacity == 0 || cache_bound > capacity)
		return -EINVAL;
	for (i = 0; i < w->n_pools; i++)
		if (strcmp(w->pools[i].name, name) == 0)
			return -EEXIST;
	if (w->n_pools == w->p.max_pools)
		return SW_EEXHAUSTED;
	mp = &w->pools[w->n_pools];
	strcpy(mp->name, name); /* length checked by name_ok */
	mp->capacity = capacity;
	mp->cache_bound = cache_bound;
	mp->min_steps = w->p.min_steps;
	return (int)w->n_pools++;
}

int gpud_memwatch_set_min_steps(struct gpud_memwatch *w, int id, uint32_t min_steps)
{
	if (!w || id < 0 || (uint32_t)id >= w->n_pools)
		return -EINVAL;
	if (min_steps == 0)
		min_steps = 1;
	w->pools[id].min_steps = min_steps > w->p.k - 1 ? w->p.k - 1 : min_steps;
	return 0;
}

static uint64_t ring_at(const struct gpud_memwatch *w, const struct mw_pool *mp, uint32_t i)
{
	return mp->ring[(mp->head + i) % w->p.k];
}

static void ring_push(const struct gpud_memwatch *w, struct mw_pool *mp, uint64_t v)
{
	if (mp->n_ring < w->p.k) {
		mp->ring[(mp->head + mp->n_ring) % w->p.k] = v;
		mp->n_ring++;
	} else {
		mp->ring[mp->head] = v;
		mp->head = (mp->head + 1) % w->p.k;
	}
}

/* Applies both rules to a full ring. */
static bool troughs_rising(const struct gpud_memwatch *w, const struct mw_pool *mp)
{
	uint64_t oldest = ring_at(w, mp, 0), newest = ring_at(w, mp, w->p.k - 1);
	bool monotonic = true;
	uint32_t i, steps = 0;

	if (newest <= oldest)
		return false;
	for (i = 1; i < w->p.k && monotonic; i++) {
		uint64_t a = ring_at(w, mp, i - 1), b = ring_at(w, mp, i);

		monotonic = b >= a;
		steps += b > a;
	}
	if (monotonic && steps >= mp->min_steps && newest - oldest >= w->p.min_rise)
		return true;
	return w->p.rise_fraction > 0.0 &&
	       (double)(newest - oldest) > w->p.rise_fraction * (double)mp->capacity;
}

static void close_window(struct gpud_memwatch *w, struct mw_pool *mp)
{
	bool rising;

	ring_push(w, mp, mp->win_min);
	if (mp->n_ring < w->p.k)
		return;
	rising = troughs_rising(w, mp);
	if (rising && !mp->rising) {
		uint64_t oldest = ring_at(w, mp, 0), newest = ring_at(w, mp, w->p.k - 1);

		mp->episodes++;
		if (mp->cache_bound)
			snprintf(mp->warning, sizeof(mp->warning),
				 "pool %s: trough held by live requests rose from %" PRIu64 " to %"
				 PRIu64 " of %" PRIu64 " over the last %u windows of %" PRIu64
				 " ms (its cache keeps %" PRIu64 " more, bound %" PRIu64 ")",
				 mp->name, oldest, newest, mp->capacity, w->p.k, w->p.window_ms,
				 mp->cached, mp->cache_bound);
		else
			snprintf(mp->warning, sizeof(mp->warning),
				 "pool %s: trough rose from %" PRIu64 " to %" PRIu64 " of %" PRIu64
				 " over the last %u windows of %" PRIu64 " ms",
				 mp->name, oldest, newest, mp->capacity, w->p.k, w->p.window_ms);
		log_warn("memwatch: %s", mp->warning);
	} else if (!rising && mp->rising) {
		mp->warning[0] = '\0';
		log_info("memwatch: pool %s: trough no longer rising (%" PRIu64 " of %" PRIu64 ")",
			 mp->name, ring_at(w, mp, w->p.k - 1), mp->capacity);
	}
	mp->rising = rising;
}

int gpud_memwatch_sample(struct gpud_memwatch *w, int id, uint64_t now_ms, uint64_t used)
{
	return gpud_memwatch_sample_split(w, id, now_ms, used, 0);
}

int gpud_memwatch_sample_split(struct gpud_memwatch *w, int id, uint64_t now_ms, uint64_t used,
			       uint64_t cached)
{
	struct mw_pool *mp;
	uint64_t win;

	if (!w || id < 0 || (uint32_t)id >= w->n_pools)
		return -EINVAL;
	mp = &w->pools[id];
	if (used > mp->capacity || cached > mp->capacity - used)
		return -EINVAL;
	/* Before the window closes, so that a warning names the cache as it
	 * is now. */
	mp->cached = cached;
	if (cached > mp->cached_high)
		mp->cached_high = cached;
	if (!mp->started) {
		mp->started = true;
		mp->win_idx = now_ms / w->p.window_ms;
		mp->win_min = used;
		mp->high = used;
	} else {
		if (now_ms < mp->last_ms) {
			mp->backwards++;
			now_ms = mp->last_ms;
		}
		win = now_ms / w->p.window_ms;
		if (win > mp->win_idx) {
			/* Windows between the two got no sample: skipped. */
			close_window(w, mp);
			mp->win_idx = win;
			mp->win_min = used;
		} else if (used < mp->win_min) {
			mp->win_min = used;
		}
		if (used > mp->high)
			mp->high = used;
	}
	mp->current = used;
	mp->last_ms = now_ms;
	mp->samples++;
	return 0;
}

int gpud_memwatch_status(const struct gpud_memwatch *w, int id, struct gpud_memwatch_status *st)
{
	const struct mw_pool *mp;

	if (!w || !st || id < 0 || (uint32_t)id >= w->n_pools)
		return -EINVAL;
	mp = &w->pools[id];
	*st = (struct gpud_memwatch_status){
		.name = mp->name,
		.capacity = mp->capacity,
		.current = mp->current,
		.high = mp->high,
		.trough = mp->win_min,
		.trough_k_ago = mp->n_ring ? ring_at(w, mp, 0) : mp->win_min,
		.windows = mp->n_ring,
		.rising = mp->rising,
		.episodes = mp->episodes,
		.samples = mp->samples,
		.clock_backwards = mp->backwards,
		.cached = mp->cached,
		.cached_high = mp->cached_high,
		.cache_bound = mp->cache_bound,
		.warning = mp->warning,
	};
	return 0;
}

int gpud_memwatch_count(const struct gpud_memwatch *w)
{
	return w ? (int)w->n_pools : 0;
}

bool gpud_memwatch_any_rising(const struct gpud_memwatch *w)
{
	uint32_t i;

	for (i = 0; w && i < w->n_pools; i++)
		if (w->pools[i].rising)
			return true;
	return false;
}

/* snprintf at *off into buf, counting what did not fit. */
__attribute__((format(printf, 4, 5)))
static void put(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(*off < len ? buf + *off : NULL, *off < len ? len - *off : 0, fmt, ap);
	va_end(ap);
	if (n > 0)
		*off += (size_t)n;
}

int gpud_memwatch_report(const struct gpud_memwatch *w, char *buf, size_t len)
{
	size_t off = 0;
	uint32_t i;

	if (!w || (!buf && len > 0))
		return -EINVAL;
	if (len > 0)
		buf[0] = '\0';
	put(buf, len, &off, "{\"window_ms\":%" PRIu64 ",\"k\":%u,\"pools\":[", w->p.window_ms,
	    w->p.k);
	for (i = 0; i < w->n_pools; i++) {
		struct gpud_memwatch_status st;

		gpud_memwatch_status(w, (int)i, &st);
		/* Names and warnings hold no character that needs escaping. */
		put(buf, len, &off,
		    "%s{\"name\":\"%s\",\"capacity\":%" PRIu64 ",\"current\":%" PRIu64
		    ",\"high\":%" PRIu64 ",\"trough\":%" PRIu64 ",\"trough_k_ago\":%" PRIu64
		    ",\"windows\":%u,\"rising\":%s,\"episodes\":%" PRIu64 ",\"samples\":%" PRIu64
		    ",\"clock_backwards\":%" PRIu64 ",\"cached\":%" PRIu64 ",\"cached_high\":%" PRIu64
		    ",\"cache_bound\":%" PRIu64 ",\"warning\":\"%s\"}",
		    i ? "," : "", st.name, st.capacity, st.current, st.high, st.trough,
		    st.trough_k_ago, st.windows, st.rising ? "true" : "false", st.episodes,
		    st.samples, st.clock_backwards, st.cached, st.cached_high, st.cache_bound,
		    st.warning);
	}
	put(buf, len, &off, "]}");
	if (off > INT32_MAX)
		return -EINVAL;
	return (int)off;
}
