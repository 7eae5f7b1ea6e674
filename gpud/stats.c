/* stats.c - renders struct gpud_stats_snapshot as JSON (STATS, MEM) and
 * as Prometheus text (gpud/stats.h). Writes into the caller's buffer
 * only; no allocation. */
#include "gpud/stats.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "gpud/jsonw.h"

#define MIN(a, b) ((a) < (b) ? (a) : (b))

/* gpud's own threads: every role but the foreign one */
static uint64_t host_sum(const uint64_t *v)
{
	uint64_t s = 0;

	for (int i = GPUD_ALLOC_OTHER; i < GPUD_ALLOC_ROLES; i++)
		s += v[i];
	return s;
}

static void json_alloc_counts(struct gpud_jsonw *w, const char *key,
			      const struct gpud_alloc_counts *c)
{
	gpud_jsonw_obj_begin(w, key);
	gpud_jsonw_u64(w, "host", host_sum(c->host_allocs));
	gpud_jsonw_u64(w, "host_loop", c->host_allocs[GPUD_ALLOC_LOOP]);
	gpud_jsonw_u64(w, "host_device", c->host_allocs[GPUD_ALLOC_DEVICE]);
	gpud_jsonw_u64(w, "host_other", c->host_allocs[GPUD_ALLOC_OTHER]);
	/* threads a library started for itself (the CUDA driver's): not
	 * gpud's, so not in "host" */
	gpud_jsonw_u64(w, "host_foreign", c->host_allocs[GPUD_ALLOC_FOREIGN]);
	gpud_jsonw_u64(w, "device", c->device_allocs);
	gpud_jsonw_u64(w, "host_frees", host_sum(c->host_frees));
	gpud_jsonw_u64(w, "host_bytes", host_sum(c->host_bytes));
	gpud_jsonw_u64(w, "device_bytes", c->device_bytes);
	gpud_jsonw_obj_end(w);
}

static void json_alloc(struct gpud_jsonw *w, const struct gpud_stats_snapshot *s)
{
	gpud_jsonw_obj_begin(w, "alloc");
	gpud_jsonw_bool(w, "counted", s->alloc_counted);
	gpud_jsonw_bool(w, "warm", s->alloc_warm);
	if (s->alloc_counted) {
		json_alloc_counts(w, "since_warmup", &s->alloc_since_warmup);
		json_alloc_counts(w, "total", &s->alloc_total);
	} else { /* "not counted", never a 0 that looks like a result */
		gpud_jsonw_null(w, "since_warmup");
		gpud_jsonw_null(w, "total");
	}
	gpud_jsonw_obj_end(w);
}

#define NAME(field) (field), strnlen((field), sizeof(field))

static void json_pools(struct gpud_jsonw *w, const struct gpud_stats_snapshot *s)
{
	uint32_t n = MIN(s->n_pools, GPUD_STATS_MAX_POOLS);

	gpud_jsonw_arr_begin(w, "pools");
	for (uint32_t i = 0; i < n; i++) {
		const struct gpud_stats_pool *p = &s->pools[i];

		gpud_jsonw_obj_begin(w, NULL);
		gpud_jsonw_strn(w, "name", NAME(p->name));
		gpud_jsonw_str(w, "unit", p->unit);
		gpud_jsonw_u64(w, "unit_bytes", p->unit_bytes);
		gpud_jsonw_u64(w, "capacity", p->capacity);
		gpud_jsonw_u64(w, "used", p->used);
		gpud_jsonw_u64(w, "free", p->free);
		gpud_jsonw_u64(w, "high", p->high);
		gpud_jsonw_u64(w, "largest_free_run", p->largest_free_run);
		gpud_jsonw_u64(w, "live", p->live);
		gpud_jsonw_u64(w, "cached", p->cached);
		gpud_jsonw_strn(w, "cache", NAME(p->cache));
		gpud_jsonw_u64(w, "cache_bound", p->cache_bound);
		gpud_jsonw_u64(w, "trough", p->trough);
		gpud_jsonw_u64(w, "trough_k_ago", p->trough_k_ago);
		gpud_jsonw_bool(w, "rising", p->rising);
		gpud_jsonw_strn(w, "warning", NAME(p->warning));
		gpud_jsonw_obj_end(w);
	}
	gpud_jsonw_arr_end(w);
}

static void json_caches(struct gpud_jsonw *w, const struct gpud_stats_snapshot *s)
{
	uint32_t n = MIN(s->n_caches, GPUD_STATS_MAX_CACHES);

	gpud_jsonw_arr_begin(w, "caches");
	for (uint32_t i = 0; i < n; i++) {
		const struct gpud_stats_cache *c = &s->caches[i];

		gpud_jsonw_obj_begin(w, NULL);
		gpud_jsonw_strn(w, "name", NAME(c->name));
		gpud_jsonw_u64(w, "hits", c->hits);
		gpud_jsonw_u64(w, "misses", c->misses);
		gpud_jsonw_u64(w, "evictions", c->evictions);
		gpud_jsonw_u64(w, "bytes", c->bytes);
		gpud_jsonw_u64(w, "max_bytes", c->max_bytes);
		gpud_jsonw_u64(w, "entries", c->entries);
		gpud_jsonw_u64(w, "max_entries", c->max_entries);
		gpud_jsonw_u64(w, "pinned", c->pinned);
		gpud_jsonw_u64(w, "hit_tokens", c->hit_tokens);
		gpud_jsonw_obj_end(w);
	}
	gpud_jsonw_arr_end(w);
}

static void json_watchdog(struct gpud_jsonw *w, const struct gpud_stats_snapshot *s)
{
	uint32_t n = MIN(s->n_pools, GPUD_STATS_MAX_POOLS);
	bool rising = false;

	for (uint32_t i = 0; i < n; i++)
		rising |= s->pools[i].rising;
	gpud_jsonw_obj_begin(w, "watchdog");
	gpud_jsonw_bool(w, "rising", rising);
	gpud_jsonw_arr_begin(w, "warnings");
	for (uint32_t i = 0; i < n; i++)
		if (s->pools[i].warning[0])
			gpud_jsonw_strn(w, NULL, NAME(s->pools[i].warning));
	gpud_jsonw_arr_end(w);
	gpud_jsonw_u64(w, "window_ms", s->watchdog_window_ms);
	gpud_jsonw_u64(w, "k", s->watchdog_k);
	gpud_jsonw_obj_end(w);
}

void gpud_stats_fill_alloc(struct gpud_stats_snapshot *s)
{
	s->alloc_counted = gpud_alloc_hooked();
	s->alloc_warm = gpud_alloc_warm();
	gpud_alloc_counts(&s->alloc_total);
	gpud_alloc_since_warmup(&s->alloc_since_warmup);
}

int gpud_stats_json(const struct gpud_stats_snapshot *s, bool mem, char *buf, size_t cap,
		    size_t *len)
{
	struct gpud_jsonw w;
	int rc;

	if (!s || (!buf && cap) || !len)
		return -EINVAL;
	gpud_jsonw_init(&w, buf, cap);
	gpud_jsonw_obj_begin(&w, NULL);
	gpud_jsonw_str(&w, "version", s->version);
	gpud_jsonw_f64(&w, "uptime_s", s->uptime_s);
	gpud_jsonw_bool(&w, "draining", s->draining);
	if (!mem) {
		gpud_jsonw_str(&w, "chat_format", s->chat_format ? s->chat_format : "none");
		gpud_jsonw_obj_begin(&w, "requests");
		gpud_jsonw_u64(&w, "admitted", s->requests.admitted);
		gpud_jsonw_u64(&w, "completed", s->requests.completed);
		gpud_jsonw_u64(&w, "errors", s->requests.errors);
		gpud_jsonw_u64(&w, "cancelled", s->requests.cancelled);
		gpud_jsonw_u64(&w, "busy", s->requests.busy);
		gpud_jsonw_u64(&w, "refused", s->requests.refused);
		gpud_jsonw_u64(&w, "in_flight", s->requests.in_flight);
		gpud_jsonw_obj_end(&w);

		gpud_jsonw_obj_begin(&w, "tokens");
		gpud_jsonw_u64(&w, "prompt", s->tokens.prompt);
		gpud_jsonw_u64(&w, "cached_prompt", s->tokens.cached_prompt);
		gpud_jsonw_u64(&w, "generated", s->tokens.generated);
		gpud_jsonw_f64(&w, "per_s", s->tokens.per_s);
		gpud_jsonw_obj_end(&w);

		gpud_jsonw_obj_begin(&w, "connections");
		gpud_jsonw_u64(&w, "open", s->connections.open);
		gpud_jsonw_u64(&w, "high", s->connections.high);
		gpud_jsonw_u64(&w, "accepted", s->connections.accepted);
		gpud_jsonw_u64(&w, "refused_peer", s->connections.refused_peer);
		gpud_jsonw_u64(&w, "bad_frames", s->connections.bad_frames);
		gpud_jsonw_u64(&w, "stalled", s->connections.stalled);
		gpud_jsonw_obj_end(&w);
	}
	json_alloc(&w, s);
	if (!mem) {
		uint32_t n = MIN(s->n_devices, GPUD_STATS_MAX_DEVICES);

		gpud_jsonw_arr_begin(&w, "devices");
		for (uint32_t i = 0; i < n; i++) {
			const struct gpud_stats_device *d = &s->devices[i];

			gpud_jsonw_obj_begin(&w, NULL);
			gpud_jsonw_strn(&w, "name", NAME(d->name));
			gpud_jsonw_u64(&w, "queue", d->queue);
			gpud_jsonw_u64(&w, "running", d->running);
			gpud_jsonw_u64(&w, "steps", d->steps);
			gpud_jsonw_u64(&w, "tokens", d->tokens);
			gpud_jsonw_u64(&w, "generated", d->generated);
			gpud_jsonw_u64(&w, "preemptions", d->preemptions);
			gpud_jsonw_u64(&w, "placed_prefix", d->placed_prefix);
			gpud_jsonw_u64(&w, "placed_load", d->placed_load);
			gpud_jsonw_obj_begin(&w, "alloc");
			gpud_jsonw_u64(&w, "device", d->alloc_device);
			gpud_jsonw_obj_end(&w);
			gpud_jsonw_u64(&w, "prefix_hits", d->prefix_hits);
			gpud_jsonw_u64(&w, "prefix_hit_tokens", d->prefix_hit_tokens);
			gpud_jsonw_u64(&w, "chunk_hits", d->chunk_hits);
			gpud_jsonw_u64(&w, "chunk_misses", d->chunk_misses);
			gpud_jsonw_u64(&w, "chunk_hit_tokens", d->chunk_hit_tokens);
			gpud_jsonw_obj_begin(&w, "rows");
			gpud_jsonw_u64(&w, "argmax", d->rows_argmax);
			gpud_jsonw_u64(&w, "drawn", d->rows_drawn);
			gpud_jsonw_u64(&w, "host", d->rows_host);
			gpud_jsonw_obj_end(&w);
			gpud_jsonw_bool(&w, "failed", d->failed != 0);
			gpud_jsonw_obj_end(&w);
		}
		gpud_jsonw_arr_end(&w);
		n = MIN(s->n_left_out, GPUD_STATS_MAX_DEVICES);
		gpud_jsonw_arr_begin(&w, "left_out");
		for (uint32_t i = 0; i < n; i++) {
			const struct gpud_stats_left_out *l = &s->left_out[i];

			gpud_jsonw_obj_begin(&w, NULL);
			gpud_jsonw_str(&w, "name", l->name ? l->name : "");
			gpud_jsonw_str(&w, "device", l->device ? l->device : "");
			gpud_jsonw_str(&w, "error", l->error ? l->error : "");
			gpud_jsonw_obj_end(&w);
		}
		gpud_jsonw_arr_end(&w);
	}
	json_pools(&w, s);
	json_caches(&w, s);
	json_watchdog(&w, s);
	if (mem && s->dump_path)
		gpud_jsonw_str(&w, "dump", s->dump_path);
	gpud_jsonw_obj_end(&w);
	rc = gpud_jsonw_finish(&w, len);
	if (rc == SW_ETOOLONG)
		*len = 0;
	return rc;
}

/* ---- Prometheus text format 0.0.4 ---- */

struct prom {
	char *buf;
	size_t cap, len;
	bool overflow;
	int nlabels; /* labels written in the current sample */
};

static void p_put(struct prom *o, const char *s, size_t n)
{
	if (o->overflow)
		return;
	if (n > o->cap - o->len) {
		o->overflow = true;
		return;
	}
	memcpy(o->buf + o->len, s, n);
	o->len += n;
}

static void p_str(struct prom *o, const char *s)
{
	p_put(o, s, strlen(s));
}

static void p_u64(struct prom *o, uint64_t v)
{
	char d[20];

	p_put(o, d, gpud_u64_dec(d, v));
}

static void p_f64(struct prom *o, double v)
{
	char d[32];
	int n;

	if (isnan(v)) {
		p_str(o, "NaN");
		return;
	}
	if (isinf(v)) {
		p_str(o, v > 0 ? "+Inf" : "-Inf");
		return;
	}
	n = snprintf(d, sizeof(d), "%.9g", v);
	for (int i = 0; i < n; i++)
		if (d[i] == ',')
			d[i] = '.';
	p_put(o, d, (size_t)n);
}

/* Label values: backslash, quote and newline escaped as the format says;
 * other control characters and invalid UTF-8 become U+FFFD so a line
 * always parses. */
static void p_label_value(struct prom *o, const char *str, size_t n)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t i = 0;

	while (i < n) {
		unsigned char c = s[i];
		size_t len;

		if (c == '\\') {
			p_put(o, "\\\\", 2);
			i++;
		} else if (c == '"') {
			p_put(o, "\\\"", 2);
			i++;
		} else if (c == '\n') {
			p_put(o, "\\n", 2);
			i++;
		} else if (c < 0x20 || c == 0x7f) {
			p_put(o, "\xef\xbf\xbd", 3);
			i++;
		} else if ((len = gpud_utf8_seq(s + i, n - i)) == 0) {
			p_put(o, "\xef\xbf\xbd", 3);
			i++;
		} else {
			p_put(o, (const char *)s + i, len);
			i += len;
		}
	}
}

static void family(struct prom *o, const char *name, const char *type, const char *help)
{
	p_str(o, "# HELP ");
	p_str(o, name);
	p_str(o, " ");
	p_str(o, help);
	p_str(o, "\n# TYPE ");
	p_str(o, name);
	p_str(o, " ");
	p_str(o, type);
	p_str(o, "\n");
}

static void sample(struct prom *o, const char *name)
{
	p_str(o, name);
	o->nlabels = 0;
}

static void label(struct prom *o, const char *key, const char *v, size_t n)
{
	p_str(o, o->nlabels++ ? "," : "{");
	p_str(o, key);
	p_str(o, "=\"");
	p_label_value(o, v, n);
	p_str(o, "\"");
}

static void value_u64(struct prom *o, uint64_t v)
{
	p_str(o, o->nlabels ? "} " : " ");
	p_u64(o, v);
	p_str(o, "\n");
}

static void value_f64(struct prom *o, double v)
{
	p_str(o, o->nlabels ? "} " : " ");
	p_f64(o, v);
	p_str(o, "\n");
}

static void one_u64(struct prom *o, const char *name, const char *type, const char *help,
		    uint64_t v)
{
	family(o, name, type, help);
	sample(o, name);
	value_u64(o, v);
}

/* A family with one sample per label value of one label. */
static void labelled_u64(struct prom *o, const char *name, const char *type, const char *help,
			 const char *key, const char *const *keys, const uint64_t *vals, int n)
{
	family(o, name, type, help);
	for (int i = 0; i < n; i++) {
		sample(o, name);
		label(o, key, keys[i], strlen(keys[i]));
		value_u64(o, vals[i]);
	}
}

static void prom_alloc(struct prom *o, const char *name, const char *type, const char *help,
		       const struct gpud_alloc_counts *c, bool bytes)
{
	family(o, name, type, help);
	for (int r = 0; r < GPUD_ALLOC_ROLES; r++) {
		const char *role = gpud_alloc_role_name((enum gpud_alloc_role)r);

		sample(o, name);
		label(o, "kind", "host", 4);
		label(o, "role", role, strlen(role));
		value_u64(o, bytes ? c->host_bytes[r] : c->host_allocs[r]);
	}
	sample(o, name);
	label(o, "kind", "device", 6);
	value_u64(o, bytes ? c->device_bytes : c->device_allocs);
}

/* Per-pool, per-cache and per-device families: one field each. */
#define PER(o, arr, n, lkey, metric, type, help, field)                      \
	do {                                                                 \
		family((o), (metric), (type), (help));                       \
		for (uint32_t i_ = 0; i_ < (n); i_++) {                      \
			sample((o), (metric));                               \
			label((o), (lkey), NAME((arr)[i_].name));            \
			value_u64((o), (arr)[i_].field);                     \
		}                                                            \
	} while (0)

int gpud_stats_prometheus(const struct gpud_stats_snapshot *s, char *buf, size_t cap,
			  size_t *len)
{
	static const char *const req_keys[] = { "admitted", "completed", "errors",
						"cancelled", "busy", "refused" };
	static const char *const tok_keys[] = { "prompt", "cached_prompt", "generated" };
	struct prom o = { .buf = buf, .cap = buf ? cap : 0 };
	uint32_t nd, np, nc, serving = 0;
	bool rising = false;

	if (!s || (!buf && cap) || !len)
		return -EINVAL;
	nd = MIN(s->n_devices, GPUD_STATS_MAX_DEVICES);
	np = MIN(s->n_pools, GPUD_STATS_MAX_POOLS);
	nc = MIN(s->n_caches, GPUD_STATS_MAX_CACHES);

	family(&o, "gpud_info", "gauge", "gpud build information.");
	sample(&o, "gpud_info");
	label(&o, "version", s->version ? s->version : "", s->version ? strlen(s->version) : 0);
	value_u64(&o, 1);
	family(&o, "gpud_uptime_seconds", "gauge", "Seconds since gpud started.");
	sample(&o, "gpud_uptime_seconds");
	value_f64(&o, s->uptime_s);
	one_u64(&o, "gpud_draining", "gauge", "1 while gpud drains for shutdown.",
		s->draining);

	labelled_u64(&o, "gpud_requests_total", "counter", "Requests by outcome.", "status",
		     req_keys,
		     (const uint64_t[]){ s->requests.admitted, s->requests.completed,
					 s->requests.errors, s->requests.cancelled,
					 s->requests.busy, s->requests.refused },
		     6);
	one_u64(&o, "gpud_requests_in_flight", "gauge", "Requests admitted and not finished.",
		s->requests.in_flight);
	labelled_u64(&o, "gpud_tokens_total", "counter", "Tokens by kind.", "kind", tok_keys,
		     (const uint64_t[]){ s->tokens.prompt, s->tokens.cached_prompt,
					 s->tokens.generated },
		     3);
	family(&o, "gpud_tokens_per_second", "gauge", "Generated tokens per second, recent.");
	sample(&o, "gpud_tokens_per_second");
	value_f64(&o, s->tokens.per_s);

	one_u64(&o, "gpud_connections_open", "gauge", "Open client connections.",
		s->connections.open);
	one_u64(&o, "gpud_connections_high", "gauge", "Most client connections open at once.",
		s->connections.high);
	one_u64(&o, "gpud_connections_accepted_total", "counter", "Connections accepted.",
		s->connections.accepted);
	one_u64(&o, "gpud_connections_refused_peer_total", "counter",
		"Connections refused by the peer check (gpud.allowed_uids / allowed_gids).",
		s->connections.refused_peer);
	one_u64(&o, "gpud_bad_frames_total", "counter", "Malformed frames received.",
		s->connections.bad_frames);
	one_u64(&o, "gpud_connections_stalled_total", "counter",
		"Connections dropped for not reading their replies.", s->connections.stalled);

	one_u64(&o, "gpud_alloc_counted", "gauge",
		"1 when host allocations are counted (0: no allocation count series).",
		s->alloc_counted);
	one_u64(&o, "gpud_alloc_warm", "gauge", "1 once warm-up has ended.", s->alloc_warm);
	if (s->alloc_counted) {
		/* a gauge: moving the warm-up mark takes it back to 0 */
		prom_alloc(&o, "gpud_alloc_since_warmup", "gauge",
			   "Allocations since warm-up (must stay 0).", &s->alloc_since_warmup,
			   false);
		prom_alloc(&o, "gpud_alloc_total", "counter", "Allocations since start.",
			   &s->alloc_total, false);
		prom_alloc(&o, "gpud_alloc_bytes_total", "counter", "Bytes allocated since start.",
			   &s->alloc_total, true);
	}

	for (uint32_t i = 0; i < nd; i++)
		serving += !s->devices[i].failed;
	labelled_u64(&o, "gpud_devices", "gauge",
		     "Configured devices: serving (not failed), or left out at start "
		     "(gpud.min_devices).",
		     "state", (const char *const[]){ "serving", "left_out" },
		     (const uint64_t[]){ serving, MIN(s->n_left_out, GPUD_STATS_MAX_DEVICES) }, 2);
	PER(&o, s->devices, nd, "device", "gpud_device_queue", "gauge",
	    "Waiting and running requests.", queue);
	PER(&o, s->devices, nd, "device", "gpud_device_running", "gauge", "Running requests.",
	    running);
	PER(&o, s->devices, nd, "device", "gpud_device_steps_total", "counter",
	    "Engine steps.", steps);
	PER(&o, s->devices, nd, "device", "gpud_device_tokens_total", "counter",
	    "Tokens processed (prompt and generated).", tokens);
	PER(&o, s->devices, nd, "device", "gpud_device_generated_tokens_total", "counter",
	    "Tokens generated.", generated);
	PER(&o, s->devices, nd, "device", "gpud_device_preemptions_total", "counter",
	    "Requests preempted (recomputed later).", preemptions);
	PER(&o, s->devices, nd, "device", "gpud_device_placed_prefix_total", "counter",
	    "Requests placed on the device for the prompt prefix its cache holds.",
	    placed_prefix);
	PER(&o, s->devices, nd, "device", "gpud_device_placed_load_total", "counter",
	    "Requests placed on the device by load.", placed_load);
	PER(&o, s->devices, nd, "device", "gpud_device_alloc_device_total", "counter",
	    "Device allocations the device's backend made after init (must stay 0).",
	    alloc_device);
	PER(&o, s->devices, nd, "device", "gpud_device_prefix_hit_tokens_total", "counter",
	    "Prompt tokens served by the device's prefix cache.", prefix_hit_tokens);
	PER(&o, s->devices, nd, "device", "gpud_device_chunk_hits_total", "counter",
	    "Self-only prompt segments copied from the device's chunk-KV cache.", chunk_hits);
	PER(&o, s->devices, nd, "device", "gpud_device_chunk_misses_total", "counter",
	    "Cacheable self-only segments the chunk-KV cache did not have.", chunk_misses);
	PER(&o, s->devices, nd, "device", "gpud_device_chunk_hit_tokens_total", "counter",
	    "Prompt tokens copied from the chunk-KV cache instead of computed.",
	    chunk_hit_tokens);
	PER(&o, s->devices, nd, "device", "gpud_device_rows_argmax_total", "counter",
	    "Logits rows whose token was their arg max (greedy).", rows_argmax);
	PER(&o, s->devices, nd, "device", "gpud_device_rows_drawn_total", "counter",
	    "Logits rows drawn from where they are (sampled on the device).", rows_drawn);
	PER(&o, s->devices, nd, "device", "gpud_device_rows_host_total", "counter",
	    "Logits rows read on the host (sampled there).", rows_host);
	PER(&o, s->devices, nd, "device", "gpud_device_failed", "gauge",
	    "1 once the device failed (a CUDA fault, a hung step): gpud exits for a restart.",
	    failed);

	family(&o, "gpud_pool_unit_bytes", "gauge", "Bytes per pool unit.");
	for (uint32_t i = 0; i < np; i++) {
		const char *u = s->pools[i].unit ? s->pools[i].unit : "";

		sample(&o, "gpud_pool_unit_bytes");
		label(&o, "pool", NAME(s->pools[i].name));
		label(&o, "unit", u, strlen(u));
		value_u64(&o, s->pools[i].unit_bytes);
	}
	PER(&o, s->pools, np, "pool", "gpud_pool_capacity", "gauge", "Pool capacity in units.",
	    capacity);
	PER(&o, s->pools, np, "pool", "gpud_pool_used", "gauge", "Units in use.", used);
	PER(&o, s->pools, np, "pool", "gpud_pool_free", "gauge", "Units free.", free);
	PER(&o, s->pools, np, "pool", "gpud_pool_high", "gauge", "High-water mark in units.",
	    high);
	PER(&o, s->pools, np, "pool", "gpud_pool_largest_free_run", "gauge",
	    "Largest run of free units.", largest_free_run);
	PER(&o, s->pools, np, "pool", "gpud_pool_live", "gauge",
	    "Units held by live requests (what can leak).", live);
	PER(&o, s->pools, np, "pool", "gpud_pool_cached", "gauge",
	    "Units kept by the pool's cache (used - live).", cached);
	PER(&o, s->pools, np, "pool", "gpud_pool_cache_bound", "gauge",
	    "Most units the pool's cache keeps (0: no cache).", cache_bound);
	PER(&o, s->pools, np, "pool", "gpud_pool_trough", "gauge",
	    "Rolling minimum of units held by live requests (trough watchdog).", trough);
	PER(&o, s->pools, np, "pool", "gpud_pool_trough_k_ago", "gauge",
	    "The trough k windows ago.", trough_k_ago);
	PER(&o, s->pools, np, "pool", "gpud_pool_rising", "gauge",
	    "1 while the pool's trough rises (possible leak).", rising);

	PER(&o, s->caches, nc, "cache", "gpud_cache_hits_total", "counter", "Cache hits.",
	    hits);
	PER(&o, s->caches, nc, "cache", "gpud_cache_misses_total", "counter", "Cache misses.",
	    misses);
	PER(&o, s->caches, nc, "cache", "gpud_cache_evictions_total", "counter",
	    "Cache evictions.", evictions);
	PER(&o, s->caches, nc, "cache", "gpud_cache_bytes", "gauge", "Bytes held.", bytes);
	PER(&o, s->caches, nc, "cache", "gpud_cache_max_bytes", "gauge", "Bound in bytes.",
	    max_bytes);
	PER(&o, s->caches, nc, "cache", "gpud_cache_entries", "gauge", "Entries held.",
	    entries);
	PER(&o, s->caches, nc, "cache", "gpud_cache_max_entries", "gauge",
	    "Bound in entries.", max_entries);
	PER(&o, s->caches, nc, "cache", "gpud_cache_pinned", "gauge",
	    "Entries pinned by requests.", pinned);
	PER(&o, s->caches, nc, "cache", "gpud_cache_hit_tokens_total", "counter",
	    "Prompt tokens served from the cache.", hit_tokens);

	for (uint32_t i = 0; i < np; i++)
		rising |= s->pools[i].rising;
	one_u64(&o, "gpud_watchdog_rising", "gauge", "1 while any pool's trough rises.", rising);
	one_u64(&o, "gpud_watchdog_window_ms", "gauge", "Trough watchdog window.",
		s->watchdog_window_ms);
	one_u64(&o, "gpud_watchdog_k", "gauge", "Trough watchdog: windows compared.",
		s->watchdog_k);

	*len = o.overflow ? 0 : o.len;
	return o.overflow ? SW_ETOOLONG : 0;
}
