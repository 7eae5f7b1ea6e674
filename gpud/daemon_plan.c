/* daemon_plan.c - the memory sizing of `gpud serve` (DESIGN §2): the size
 * of every pool from the config and the model, the plan that divides
 * memory_fraction of RAM between the weights, the fixed pools and each
 * device's KV (gpud_plan_compute, gpud/daemon.h), its report, and the
 * check that what the engines really reserved stays within it.
 * gpud_plan_compute and gpud_fmt_bytes are pure and unit-tested.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "gpud/backend.h"
#include "gpud/daemon_impl.h"
#include "gpud/mask.h"
#include "gpud/model.h"
#include "gpud/tokenizer.h"
#include "proto/msg.h"

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

/* --- sizing and the plan of one configuration -------------------------------- */

static uint64_t host_ram(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

/* Step scratch per device: the most any configured device's backend asks
 * for with the engine parameters daemon_build will give it. A device
 * without a backend counts nothing (the plan refuses it). */
static uint64_t scratch_bytes(const struct sw_config *cfg, const struct gpud_model *m,
			      uint32_t threads_per_dev)
{
	const typeof(cfg->gpud) *g = &cfg->gpud;
	uint64_t most = 0;

	for (uint32_t i = 0; i < g->n_devices; i++) {
		const struct gpud_backend_ops *ops = gpud_backend_for(g->devices[i].kind);
		struct gpud_backend_config bc = {
			.model = m,
			.ordinal = g->devices[i].index,
			.n_threads = (int)threads_per_dev,
			.block_tokens = g->kv_block_tokens,
			.max_batch_tokens = g->max_batch_tokens,
			.max_seqs = g->max_seqs + 1,   /* as daemon_build's engines */
			.max_logits = g->max_seqs + 1, /* the engine's default: max_seqs */
		};
		uint64_t s = ops ? ops->scratch_bytes(&bc) : 0;

		if (s > most)
			most = s;
	}
	return most;
}

void gpud__size_pools(const struct sw_config *cfg, const struct gpud_model *m, struct sizing *z)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	const typeof(cfg->gpud) *g = &cfg->gpud;
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	uint32_t threads = g->threads ? g->threads : (uint32_t)(online > 0 ? online : 1);
	uint64_t priv = REQ_PRIV_BYTES;

	memset(z, 0, sizeof(*z));
	z->n_ctx = g->context && g->context < hp->n_ctx ? g->context : hp->n_ctx;
	z->threads_per_dev = threads / g->n_devices ? threads / g->n_devices : 1;
	z->scratch = scratch_bytes(cfg, m, z->threads_per_dev);
	z->mask_slot = (gpud_mask_bytes(g->max_segments, z->n_ctx, g->kv_block_tokens) +
			4ull * g->max_segments + 63) / 64 * 64;
	/* Slots are sized for the largest mask; the cache also bounds the
	 * bytes of the masks it holds (most are far smaller). Every running
	 * sequence may pin a mask of its own: at least max_seqs slots. Waiting
	 * requests pin too; beyond the slots a submit gets SW_EBUSY. */
	z->mask_entries = (uint32_t)(g->mask_cache_bytes / z->mask_slot);
	if (z->mask_entries < g->max_seqs)
		z->mask_entries = g->max_seqs;
	if (z->mask_entries > 65536)
		z->mask_entries = 65536;
	z->mask_pool = z->mask_slot * (z->mask_entries + 1ull);
	z->max_text = g->request_bytes < MAX_TEXT_CAP ? (uint32_t)g->request_bytes : MAX_TEXT_CAP;
	z->tok_scratch = gpud_tokenizer_scratch_bytes(gpud_model_tokenizer(m), z->max_text + 512);
	z->server = (uint64_t)g->max_connections * (g->ring_bytes + g->request_bytes) +
		    (uint64_t)g->queue.global * (sizeof(struct proto_submit) + g->stage_bytes + priv);
	z->host = z->server + z->tok_scratch + 2ull * (2 * z->max_text + 512) +
		  (uint64_t)g->n_devices * EMBED_SLOTS * ((uint64_t)z->n_ctx * 4 + hp->dim * 4);
}

int gpud__make_plan(const struct sw_config *cfg, const struct gpud_model *m,
		    const struct sizing *z, struct gpud_plan *plan, uint64_t *kv_block_bytes,
		    char *err, size_t errlen)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	struct gpud_plan_in in = {
		.n_devices = cfg->gpud.n_devices,
		.devices = cfg->gpud.devices,
		.host_ram = host_ram(),
		.memory_fraction = cfg->gpud.memory_fraction,
		.weight_bytes = gpud_model_weight_bytes(m),
		.kv_block_bytes = (uint64_t)hp->n_layers * 2 * hp->n_kv_heads *
				  cfg->gpud.kv_block_tokens * hp->head_dim * sizeof(float),
		.kv_blocks = cfg->gpud.kv_blocks,
		.max_seqs = cfg->gpud.max_seqs,
		.n_ctx = z->n_ctx,
		.block_tokens = cfg->gpud.kv_block_tokens,
		.scratch_bytes = z->scratch,
		.mask_bytes = z->mask_pool,
		.host_bytes = z->host,
	};

	*kv_block_bytes = in.kv_block_bytes;
	return gpud_plan_compute(&in, plan, err, errlen);
}

void gpud__device_name(const struct sw_config *cfg, uint32_t i, char *out, size_t outlen)
{
	const struct gpud_backend_ops *ops = gpud_backend_for(cfg->gpud.devices[i].kind);

	snprintf(out, outlen, "%s%u", ops ? ops->name : "dev", i);
}

void gpud__print_plan(FILE *out, const struct sw_config *cfg, const struct sizing *z,
		      const struct gpud_plan *p, uint64_t bb, uint64_t weights)
{
	char a[32], b[32], c[32];

	gpud_fmt_bytes(p->total, a, sizeof(a));
	gpud_fmt_bytes(p->used, b, sizeof(b));
	fprintf(out, "memory plan: %s of %s budget (gpud.memory_fraction %g)\n", b, a,
		cfg->gpud.memory_fraction);
	gpud_fmt_bytes(weights, a, sizeof(a));
	fprintf(out, "  weights: %s (mapped once, shared by the devices)\n", a);
	for (uint32_t i = 0; i < cfg->gpud.n_devices; i++) {
		char dev[16];

		gpud__device_name(cfg, i, dev, sizeof(dev));
		gpud_fmt_bytes(p->kv_bytes, a, sizeof(a));
		fprintf(out, "  %s.kv: %u blocks x %" PRIu64 " bytes = %s (%u tokens/block; "
			"%u blocks hold max_seqs %u full contexts)\n", dev, p->kv_blocks, bb, a,
			cfg->gpud.kv_block_tokens, p->kv_blocks_full, cfg->gpud.max_seqs);
		gpud_fmt_bytes(z->scratch, a, sizeof(a));
		fprintf(out, "  %s.scratch: %s (max_batch_tokens %u, estimate)\n", dev, a,
			cfg->gpud.max_batch_tokens);
		gpud_fmt_bytes(z->mask_pool, a, sizeof(a));
		fprintf(out, "  %s.mask: %u + 1 slots x %" PRIu64 " bytes = %s\n", dev,
			z->mask_entries, z->mask_slot, a);
		gpud_fmt_bytes(cfg->gpud.prefix_cache_bytes, a, sizeof(a));
		fprintf(out, "  %s.prefix: at most %s of unreferenced KV (inside %s.kv)\n", dev,
			a, dev);
		gpud_fmt_bytes(cfg->gpud.chunk_cache_bytes, a, sizeof(a));
		fprintf(out, "  %s.chunk: at most %s of self-only segments' KV (inside %s.kv, "
			"never its last eighth)\n", dev, a, dev);
	}
	gpud_fmt_bytes(z->server, a, sizeof(a));
	gpud_fmt_bytes(cfg->gpud.ring_bytes, b, sizeof(b));
	gpud_fmt_bytes(cfg->gpud.request_bytes, c, sizeof(c));
	fprintf(out, "  server: %s (%u connections x (%s ring + %s request area), %u request "
		"slots)\n", a, cfg->gpud.max_connections, b, c, cfg->gpud.queue.global);
	gpud_fmt_bytes(z->tok_scratch, a, sizeof(a));
	fprintf(out, "  tokenizer scratch: %s (requests up to %u bytes of text)\n", a, z->max_text);
}

void gpud__log_plan(const struct sw_config *cfg, const struct sizing *z,
		    const struct gpud_plan *p, uint64_t bb, uint64_t weights)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	if (!f)
		return;
	gpud__print_plan(f, cfg, z, p, bb, weights);
	fclose(f);
	for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
		log_info("%s", line);
	free(buf);
}

int gpud__plan_check(const struct gpud_daemon *d, const struct sizing *z)
{
	uint64_t real = gpud_model_weight_bytes(d->model) + z->host;
	char a[32], b[32], c[32];

	for (uint32_t i = 0; i < d->n_dev; i++)
		real += d->dev[i].est.kv_bytes + d->dev[i].est.scratch_bytes +
			d->dev[i].mst.reserved_bytes;
	gpud_fmt_bytes(real, a, sizeof(a));
	gpud_fmt_bytes(d->plan.used, b, sizeof(b));
	if (real > d->plan.total) {
		gpud_fmt_bytes(d->plan.total, c, sizeof(c));
		log_error("reserved %s in all, more than the budget of %s (plan %s): lower "
			  "gpud.kv_blocks or gpud.memory_fraction's share", a, c, b);
		return SW_EEXHAUSTED;
	}
	log_info("reserved %s in all (plan %s)", a, b);
	return 0;
}
