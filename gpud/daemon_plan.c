/* daemon_plan.c - the daemon's pure pieces: the memory plan and segment
 * tokenization with chat formatting (gpud/daemon.h). No threads, no
 * sockets: unit-tested on their own. */
#include "gpud/daemon.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/backend.h"
#include "gpud/model.h"

void gpud_fmt_bytes(uint64_t b, char *out, size_t outlen)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)b;
	int u = -1;

	if (b < 1024) {
		snprintf(out, outlen, "%" PRIu64 " B", b);
		return;
	}
	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	snprintf(out, outlen, "%.1f %s", v, units[u]);
}

int gpud_plan_compute(const struct gpud_plan_in *in, struct gpud_plan *out, char *err,
		      size_t errlen)
{
	char a[32], b[32], c[32], d[32], e[32];
	uint64_t per_dev_fixed, n = in->n_devices, left;

	if (!in->n_devices || !in->devices || !in->kv_block_bytes || !in->block_tokens ||
	    !in->n_ctx || !in->max_seqs || !(in->memory_fraction > 0 && in->memory_fraction <= 1))
		return sw_seterr(err, errlen, -EINVAL, "memory plan: inconsistent input");
	for (uint32_t i = 0; i < in->n_devices; i++) {
		char dev[32];

		if (gpud_backend_for(in->devices[i].kind))
			continue;
		sw_config_device_name(&in->devices[i], dev, sizeof(dev));
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "gpud.devices[%u]: %s: the %.*s backend is not built/implemented "
				 "yet (use \"cpu\")", i, dev, (int)strcspn(dev, ":"), dev);
	}
	memset(out, 0, sizeof(*out));
	out->total = (uint64_t)(in->memory_fraction * (double)in->host_ram);
	out->kv_blocks_full = (uint32_t)((uint64_t)in->max_seqs *
					 ((in->n_ctx + in->block_tokens - 1) / in->block_tokens));
	per_dev_fixed = in->scratch_bytes + in->mask_bytes;
	out->fixed = in->weight_bytes + in->host_bytes + n * per_dev_fixed;
	gpud_fmt_bytes(in->host_ram, b, sizeof(b));
	gpud_fmt_bytes(out->total, c, sizeof(c));
	if (out->fixed > out->total) {
		gpud_fmt_bytes(out->fixed, a, sizeof(a));
		gpud_fmt_bytes(in->weight_bytes, d, sizeof(d));
		gpud_fmt_bytes(per_dev_fixed, e, sizeof(e));
		return sw_seterr(err, errlen, SW_EEXHAUSTED,
				 "memory plan: weights (%s) + scratch and mask pools (%s per device "
				 "x %u) + host pools need %s; gpud.memory_fraction %g of %s "
				 "is %s", d, e, in->n_devices, a, in->memory_fraction, b, c);
	}
	left = out->total - out->fixed;
	out->kv_room = left / n;
	if (in->kv_blocks) {
		uint64_t need = (uint64_t)in->kv_blocks * in->kv_block_bytes;
		if (need > out->kv_room) {
			gpud_fmt_bytes(need, a, sizeof(a));
			gpud_fmt_bytes(out->kv_room, d, sizeof(d));
			gpud_fmt_bytes(out->fixed, e, sizeof(e));
			return sw_seterr(err, errlen, SW_EEXHAUSTED,
					 "gpud.kv_blocks=%u needs %s of KV per device; "
					 "gpud.memory_fraction %g of %s (%s) leaves %s per device "
					 "after weights and fixed pools (%s) on %u device%s "
					 "(at most %" PRIu64 " blocks of %" PRIu64 " bytes)",
					 in->kv_blocks, a, in->memory_fraction, b, c, d, e,
					 in->n_devices, in->n_devices == 1 ? "" : "s",
					 out->kv_room / in->kv_block_bytes, in->kv_block_bytes);
		}
		out->kv_blocks = in->kv_blocks;
	} else {
		uint64_t fit = out->kv_room / in->kv_block_bytes;
		if (fit > out->kv_blocks_full)
			fit = out->kv_blocks_full;
		if (fit == 0) {
			gpud_fmt_bytes(out->kv_room, d, sizeof(d));
			return sw_seterr(err, errlen, SW_EEXHAUSTED,
					 "memory plan: gpud.memory_fraction %g of %s (%s) leaves %s "
					 "per device after weights and fixed pools: not one %" PRIu64
					 "-byte KV block fits", in->memory_fraction, b, c, d,
					 in->kv_block_bytes);
		}
		out->kv_blocks = (uint32_t)fit;
	}
	out->kv_bytes = (uint64_t)out->kv_blocks * in->kv_block_bytes;
	out->used = out->fixed + n * out->kv_bytes;
	return 0;
}

/* --- stats snapshot ---------------------------------------------------------- */

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

static void pool_watch(struct gpud_stats_pool *p, bool have, const struct gpud_memwatch_status *w)
{
	if (!have) {
		p->trough = p->trough_k_ago = p->used;
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
	}
	if ((p = pool_add(s, n->name, "kv"))) {
		p->unit = "blocks";
		p->unit_bytes = n->kv_block_bytes;
		p->capacity = kv->n_blocks;
		p->used = kv->used;
		p->free = kv->free;
		p->high = kv->high;
		p->largest_free_run = kv->free; /* fixed-size blocks: any free one fits */
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
}

/* --- segments ------------------------------------------------------------- */

/* Copies a segment's text (a view: may change under us, may hold NULs)
 * NUL-terminated into dst. */
static const char *seg_copy(const struct proto_segment *s, char *dst)
{
	memcpy(dst, s->text, s->len);
	dst[s->len] = '\0';
	return dst;
}

long gpud_chat_segment(enum gpud_chat_template tmpl, const struct proto_segment *segs,
		       uint32_t i, bool last, char *out, size_t cap, char *copy, size_t copy_cap)
{
	struct gpud_chat_msg m[2];
	uint32_t n = 0;
	size_t need_copy = segs[i].len + 1 + (i ? segs[i - 1].len + 1 : 0);
	long pre = 0, full;

	if (tmpl == GPUD_CHAT_NONE)
		return SW_EUNSUPPORTED;
	if (need_copy > copy_cap)
		return SW_ETOOLONG;
	/* A template's text for message i depends on message i and, for a
	 * deferred one (a Llama 2 system prompt), the message before it: the
	 * segment's text is format(prev, cur) minus format(prev). Templates
	 * only append, so the latter is a prefix of the former. */
	if (i > 0) {
		m[n].role = proto_role_name(segs[i - 1].role);
		m[n].content = seg_copy(&segs[i - 1], copy);
		copy += segs[i - 1].len + 1;
		n++;
	}
	m[n].role = proto_role_name(segs[i].role);
	m[n].content = seg_copy(&segs[i], copy);
	n++;
	if (!m[0].role || !m[n - 1].role)
		return -EINVAL;
	if (i > 0) {
		pre = gpud_chat_format(tmpl, m, 1, false, NULL, 0);
		if (pre < 0)
			return pre;
	}
	full = gpud_chat_format(tmpl, m, n, last, out, cap);
	if (full < 0)
		return full;
	if ((size_t)full >= cap)
		return SW_ETOOLONG;
	if (full < pre)
		return -EINVAL;
	memmove(out, out + pre, (size_t)(full - pre) + 1);
	return full - pre;
}

int gpud_segments_tokenize(const struct gpud_tokenizer *tok, enum gpud_chat_template tmpl,
			   bool chat, const struct proto_segment *segs, uint32_t n,
			   struct gpud_segtok_scratch *sc, int32_t *ids, uint32_t cap,
			   uint32_t *seg_tokens, uint32_t *n_ids, char *err, size_t errlen)
{
	size_t total = 0;
	bool over = false;

	*n_ids = 0;
	if (chat && tmpl == GPUD_CHAT_NONE)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "chat formatting: no chat template known for this model");
	for (uint32_t i = 0; i < n; i++) {
		const char *text = segs[i].text;
		size_t len = segs[i].len, got = 0;
		unsigned flags = 0;
		int rc;

		if (chat) {
			if (!proto_role_name(segs[i].role))
				return sw_seterr(err, errlen, -EINVAL,
						 "segment %u: chat formatting needs a role "
						 "(system, user or assistant)", i);
			long l = gpud_chat_segment(tmpl, segs, i, i + 1 == n, sc->fmt,
						   sc->fmt_cap, sc->copy, sc->copy_cap);
			if (l < 0)
				return sw_seterr(err, errlen, l == SW_ETOOLONG ? -EINVAL : (int)l,
						 "segment %u: cannot format it as a chat message: %s",
						 i, sw_strerror((int)l));
			text = sc->fmt;
			len = (size_t)l;
			flags = GPUD_TOK_PARSE_SPECIAL; /* the template's tokens */
		} else if (i == 0) {
			flags = GPUD_TOK_ADD_BOS;
		}
		if (len == 0) {
			seg_tokens[i] = 0;
			continue;
		}
		rc = gpud_tokenizer_encode(tok, text, len, flags, over ? NULL : ids + total,
					   over ? 0 : cap - total, &got, sc->arena);
		if (rc == SW_ETOOLONG) {
			over = true;
		} else if (rc) {
			return sw_seterr(err, errlen, rc == -ENOMEM ? -EINVAL : rc,
					 "segment %u: tokenizer: %s (%zu bytes)", i,
					 rc == -ENOMEM ? "text too long for the request scratch" :
					 sw_strerror(rc), len);
		}
		seg_tokens[i] = (uint32_t)got;
		total += got;
	}
	*n_ids = total > UINT32_MAX ? UINT32_MAX : (uint32_t)total;
	if (over)
		return sw_seterr(err, errlen, SW_ETOOLONG,
				 "prompt of %zu tokens is longer than the %u a request may have", total,
				 cap);
	return 0;
}
