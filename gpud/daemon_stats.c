/* daemon_stats.c - the numbers `gpud serve` reports: one device's entry in
 * a stats snapshot (gpud_snapshot_add_device, gpud/daemon.h), the whole
 * snapshot for STATS, MEM and GET /metrics (loop thread), the server's
 * pools beside the devices'.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "gpud/daemon_impl.h"
#include "gpud/maskcache.h"
#include "gpud/memwatch.h"
#include "gpud/scheduler.h"
#include "gpud/server.h"
#include "gpud/stats.h"
#include "sw_config.h"

/* --- one device's entry ------------------------------------------------------- */

static struct gpud_stats_pool *pool_add(struct gpud_stats_snapshot *s, const char *dev,
					const char *what)
{
	struct gpud_stats_pool *p;

	if (s->n_pools >= GPUD_STATS_MAX_POOLS)
		return NULL;
	p = &s->pools[s->n_pools++];
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%.20s.%s", dev, what);
	return p;
}

/* The watchdog's view of p (of its live part), or without one the live
 * part now. */
static void pool_watch(struct gpud_stats_pool *p, bool have, const struct gpud_memwatch_status *w)
{
	if (!have) {
		p->trough = p->trough_k_ago = p->live;
		return;
	}
	p->trough = w->trough;
	p->trough_k_ago = w->trough_k_ago;
	p->rising = w->rising;
	snprintf(p->warning, sizeof(p->warning), "%s", w->warning ? w->warning : "");
}

static struct gpud_stats_cache *cache_add(struct gpud_stats_snapshot *s, const char *dev,
					  const char *what)
{
	struct gpud_stats_cache *c;

	if (s->n_caches >= GPUD_STATS_MAX_CACHES)
		return NULL;
	c = &s->caches[s->n_caches++];
	memset(c, 0, sizeof(*c));
	snprintf(c->name, sizeof(c->name), "%.20s.%s", dev, what);
	return c;
}

void gpud_snapshot_add_device(struct gpud_stats_snapshot *s, const struct gpud_dev_numbers *n)
{
	const struct gpud_kv_stats *kv = &n->engine.kv;
	const struct gpud_maskcache_stats *ms = &n->mask;
	const struct gpud_sched_device_stats *ds = &n->sched;
	struct gpud_stats_pool *p;
	struct gpud_stats_cache *c;

	if (s->n_devices < GPUD_STATS_MAX_DEVICES) {
		struct gpud_stats_device *sd = &s->devices[s->n_devices++];
		memset(sd, 0, sizeof(*sd));
		snprintf(sd->name, sizeof(sd->name), "%s", n->name);
		sd->queue = ds->queue;
		sd->running = ds->running;
		sd->steps = ds->steps;
		sd->tokens = ds->tokens;
		sd->generated = ds->generated;
		sd->preemptions = ds->preemptions;
		sd->placed_prefix = ds->placed_prefix;
		sd->placed_load = ds->placed_load;
		sd->alloc_device = n->engine.allocs_after_warmup;
		sd->prefix_hits = ds->prefix_hits;
		sd->prefix_hit_tokens = ds->prefix_hit_tokens;
		sd->chunk_hits = ds->chunk_hits;
		sd->chunk_misses = ds->chunk_misses;
		sd->chunk_hit_tokens = ds->chunk_hit_tokens;
		sd->rows_argmax = n->engine.rows_argmax;
		sd->rows_drawn = n->engine.rows_drawn;
		sd->rows_host = n->engine.rows_host;
		sd->failed = ds->failed != 0;
	}
	if ((p = pool_add(s, n->name, "kv"))) {
		uint64_t bound = n->kv_block_bytes ? (ds->prefix_max_bytes + ds->chunk_max_bytes) /
							     n->kv_block_bytes : 0;

		p->unit = "blocks";
		p->unit_bytes = n->kv_block_bytes;
		p->capacity = kv->n_blocks;
		p->used = kv->used;
		p->free = kv->free;
		p->high = kv->high;
		p->largest_free_run = kv->free; /* fixed-size blocks: any free one fits */
		p->cached = n->kv_cached <= kv->used ? n->kv_cached : kv->used;
		p->live = kv->used - p->cached;
		if (bound) {
			snprintf(p->cache, sizeof(p->cache), "%.20s.prefix", n->name);
			p->cache_bound = bound < kv->n_blocks ? bound : kv->n_blocks;
		}
		pool_watch(p, n->have_watch, &n->kv_watch);
	}
	if ((p = pool_add(s, n->name, "scratch"))) {
		/* Carved once at start; a step reuses the same carve. */
		p->unit = "bytes";
		p->unit_bytes = 1;
		p->capacity = n->engine.scratch_bytes;
		p->used = n->engine.scratch_high;
		p->free = p->capacity > p->used ? p->capacity - p->used : 0;
		p->high = n->engine.scratch_high;
		p->largest_free_run = p->free;
		p->live = p->used;
		pool_watch(p, false, NULL);
	}
	if ((p = pool_add(s, n->name, "mask"))) {
		p->unit = "slots";
		p->unit_bytes = ms->slot_bytes;
		p->capacity = ms->pool_capacity;
		p->used = ms->pool_used;
		p->free = ms->pool_free;
		p->high = n->mask_high;
		p->largest_free_run = ms->pool_free; /* equal slots: any free one fits */
		p->live = ms->pinned <= ms->pool_used ? ms->pinned : ms->pool_used;
		p->cached = ms->pool_used - p->live;
		snprintf(p->cache, sizeof(p->cache), "%.20s.mask", n->name);
		p->cache_bound = ms->max_entries;
		pool_watch(p, n->have_watch, &n->mask_watch);
	}
	if ((c = cache_add(s, n->name, "mask"))) {
		c->hits = ms->hits;
		c->misses = ms->misses;
		c->evictions = ms->evictions;
		c->bytes = ms->bytes;
		c->max_bytes = ms->max_bytes;
		c->entries = ms->entries;
		c->max_entries = ms->max_entries;
		c->pinned = ms->pinned;
	}
	if ((c = cache_add(s, n->name, "prefix"))) {
		c->hits = ds->prefix_hits;
		c->misses = ds->prefix_misses;
		c->evictions = ds->prefix_evictions;
		c->bytes = ds->prefix_bytes;
		c->max_bytes = ds->prefix_max_bytes;
		c->entries = ds->prefix_blocks;
		c->max_entries = kv->n_blocks;
		c->pinned = ds->prefix_blocks - ds->prefix_unreferenced;
		c->hit_tokens = ds->prefix_hit_tokens;
	}
	if ((c = cache_add(s, n->name, "chunk"))) {
		c->hits = ds->chunk_hits;
		c->misses = ds->chunk_misses;
		c->evictions = ds->chunk_evictions;
		c->bytes = ds->chunk_bytes;
		c->max_bytes = ds->chunk_max_bytes;
		c->entries = ds->chunk_entries;
		c->max_entries = ds->chunk_max_bytes / (n->kv_block_bytes ? n->kv_block_bytes : 1);
		c->pinned = 0;
		c->hit_tokens = ds->chunk_hit_tokens;
	}
}

/* --- the daemon's snapshot (loop thread) ------------------------------------ */

static void server_pool(struct gpud_daemon *d, struct gpud_stats_snapshot *s, const char *name,
			int wid, uint64_t cap, uint64_t used, uint64_t high, uint64_t unit_bytes)
{
	struct gpud_memwatch_status ws;
	struct gpud_stats_pool *p;

	if (s->n_pools >= GPUD_STATS_MAX_POOLS)
		return;
	p = &s->pools[s->n_pools++];
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->unit = "slots";
	p->unit_bytes = unit_bytes;
	p->capacity = cap;
	p->used = used <= cap ? used : cap;
	p->free = cap - p->used;
	p->high = high;
	p->largest_free_run = p->free;
	p->live = p->used; /* no cache: every slot in use is a live request's */
	p->trough = p->trough_k_ago = p->used;
	pthread_mutex_lock(&d->watch_lock);
	if (gpud_memwatch_status(d->watch, wid, &ws) == 0) {
		p->trough = ws.trough;
		p->trough_k_ago = ws.trough_k_ago;
		p->rising = ws.rising;
		snprintf(p->warning, sizeof(p->warning), "%s", ws.warning ? ws.warning : "");
	}
	pthread_mutex_unlock(&d->watch_lock);
}

static void fill_snapshot(struct gpud_daemon *d, bool mem)
{
	struct gpud_stats_snapshot *s = &d->snap;
	struct gpud_server_stats ss;
	struct gpud_sched_stats sch;
	double t = now_s();
	uint64_t gen;

	memset(s, 0, sizeof(*s));
	s->version = SW_VERSION;
	s->chat_format = d->tmpl == GPUD_CHAT_NONE ? "none" : gpud_chat_name(d->tmpl);
	s->watchdog_window_ms = d->cfg.gpud.watchdog.window_ms;
	s->watchdog_k = d->cfg.gpud.watchdog.k;
	s->uptime_s = t - d->t_start;
	s->draining = atomic_load(&d->draining);
	gpud_server_stats(d->server, &ss);
	gpud_sched_stats(d->sched, &sch);
	s->requests.admitted = ss.requests;
	s->requests.completed = atomic_load(&d->completed) + atomic_load(&d->embeds);
	s->requests.errors = atomic_load(&d->errors);
	s->requests.cancelled = atomic_load(&d->cancelled);
	s->requests.busy = ss.busy;
	s->requests.refused = ss.refused;
	s->requests.in_flight = ss.in_flight;
	gen = atomic_load(&d->tok_generated);
	s->tokens.prompt = atomic_load(&d->tok_prompt);
	s->tokens.cached_prompt = atomic_load(&d->tok_cached);
	s->tokens.generated = gen;
	if (t - d->last_rate_t >= 1.0) { /* a rate over at least a second */
		d->rate = (double)(gen - d->last_rate_gen) / (t - d->last_rate_t);
		d->last_rate_t = t;
		d->last_rate_gen = gen;
	}
	s->tokens.per_s = d->rate;
	s->connections.open = ss.connections;
	s->connections.high = ss.connections_high;
	s->connections.accepted = ss.accepted;
	s->connections.refused_peer = ss.refused_peer;
	s->connections.bad_frames = ss.bad_frames;
	s->connections.stalled = ss.stalled;
	gpud_stats_fill_alloc(s);

	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct device *dv = &d->dev[i];
		struct gpud_dev_numbers n = { .name = dv->name,
					       .kv_block_bytes = d->plan.dev[i].kv_block_bytes };

		gpud_sched_device_stats(d->sched, i, &n.sched);
		pthread_mutex_lock(&dv->lock);
		n.engine = dv->est;
		n.kv_live = dv->kv_live;
		n.kv_cached = dv->kv_cached;
		gpud_maskcache_stats(dv->masks, &n.mask);
		n.mask_high = dv->mask_high > n.mask.pool_used ? dv->mask_high : n.mask.pool_used;
		pthread_mutex_unlock(&dv->lock);
		pthread_mutex_lock(&d->watch_lock);
		n.have_watch = gpud_memwatch_status(d->watch, dv->wd_kv, &n.kv_watch) == 0 &&
			       gpud_memwatch_status(d->watch, dv->wd_mask, &n.mask_watch) == 0;
		gpud_snapshot_add_device(s, &n); /* copies the warnings while locked */
		pthread_mutex_unlock(&d->watch_lock);
	}
	for (uint32_t i = 0; i < d->n_left && i < GPUD_STATS_MAX_DEVICES; i++) {
		s->left_out[i].name = d->left[i].name;
		s->left_out[i].device = d->left[i].device;
		s->left_out[i].error = d->left[i].why;
	}
	s->n_left_out = d->n_left;
	server_pool(d, s, "server.requests", d->wd_req, d->cfg.gpud.queue.global, ss.in_flight,
		    ss.in_flight_high,
		    sizeof(struct proto_submit) + d->cfg.gpud.stage_bytes +
		    REQ_PRIV_BYTES);
	server_pool(d, s, "server.connections", d->wd_conn, d->cfg.gpud.max_connections,
		    ss.connections, ss.connections_high,
		    d->cfg.gpud.ring_bytes + d->cfg.gpud.request_bytes);
	(void)mem;
}

int gpud__svc_stats(void *svc, char *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
	struct gpud_daemon *d = svc;
	int rc;

	fill_snapshot(d, false);
	rc = gpud_stats_json(&d->snap, false, buf, cap, len);
	if (rc)
		return sw_seterr(err, errlen, rc, "stats: %s", sw_strerror(rc));
	return 0;
}

int gpud__svc_mem(void *svc, uint32_t flags, char *buf, size_t cap, size_t *len, char *err,
		   size_t errlen)
{
	struct gpud_daemon *d = svc;
	int rc;

	fill_snapshot(d, true);
	if (flags & PROTO_MEM_DUMP_OWNERS) {
		rc = gpud__dump_owners(d, err, errlen);
		if (rc)
			return rc;
		d->snap.dump_path = d->dump_path;
	}
	rc = gpud_stats_json(&d->snap, true, buf, cap, len);
	if (rc)
		return sw_seterr(err, errlen, rc, "mem: %s", sw_strerror(rc));
	return 0;
}

/* GET /metrics, on the loop thread. */
int gpud__metrics_render(void *arg, char *buf, size_t cap, size_t *len)
{
	struct gpud_daemon *d = arg;

	fill_snapshot(d, false);
	return gpud_stats_prometheus(&d->snap, buf, cap, len);
}
