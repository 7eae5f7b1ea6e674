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
#include "gpud/backend/cuda/cuda.h"
#include "gpud/daemon_impl.h"
#include "gpud/mask.h"
#include "gpud/model.h"
#include "gpud/sampler.h"
#include "gpud/scheduler.h"
#include "gpud/tokenizer.h"
#include "proto/msg.h"
#include "sw_config.h"

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

static bool own_memory(const struct sw_config_device *dev)
{
	return dev->kind != SW_DEVICE_CPU;
}

int gpud_plan_device_check(const struct sw_config_device *dev, uint32_t i, bool built,
			   int n_visible, char *err, size_t errlen)
{
	char name[32];

	sw_config_device_name(dev, name, sizeof(name));
	if (!built) {
		if (dev->kind == SW_DEVICE_CUDA)
			return sw_seterr(err, errlen, SW_EUNSUPPORTED,
					 "gpud.devices[%u]: %s: this gpud was built without the "
					 "CUDA backend: rebuild with `meson setup -Dgpu=enabled` "
					 "(needs nvcc and the CUDA runtime), or use \"cpu\"", i, name);
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "gpud.devices[%u]: %s: this gpud has no backend for it "
				 "(use \"cpu\")", i, name);
	}
	if (dev->kind == SW_DEVICE_CUDA && (n_visible <= 0 || dev->index >= n_visible)) {
		if (n_visible <= 0)
			return sw_seterr(err, errlen, -ENODEV,
					 "gpud.devices[%u]: %s: no CUDA device (0 visible: no "
					 "NVIDIA driver or GPU, or CUDA_VISIBLE_DEVICES hides "
					 "them)", i, name);
		if (n_visible == 1)
			return sw_seterr(err, errlen, -ENODEV,
					 "gpud.devices[%u]: %s: no CUDA device (1 visible: cuda:0)",
					 i, name);
		return sw_seterr(err, errlen, -ENODEV,
				 "gpud.devices[%u]: %s: no CUDA device (%d visible: cuda:0 to "
				 "cuda:%d)", i, name, n_visible, n_visible - 1);
	}
	return 0;
}

/* Device i's own memory: its budget, its fixed pools and its KV. */
static int plan_devmem(const struct gpud_plan_in *in, uint32_t i, struct gpud_plan_dev *o,
		       char *err, size_t errlen)
{
	const struct gpud_plan_devmem *m = &in->devmem[i];
	uint32_t pos = in->devices[i].pos; /* its place in the configured list */
	uint64_t cap = (uint64_t)(in->memory_fraction * (double)m->total_bytes);
	uint64_t avail = m->free_bytes > GPUD_PLAN_DEVICE_RESERVE ?
			 m->free_bytes - GPUD_PLAN_DEVICE_RESERVE : 0;
	char dev[32], what[256], t[32], f[32], b[32], a[32], c[32], w[32], k[32], s[32];

	sw_config_device_name(&in->devices[i], dev, sizeof(dev));
	gpud_fmt_bytes(m->total_bytes, t, sizeof(t));
	gpud_fmt_bytes(m->free_bytes, f, sizeof(f));
	o->own_memory = true;
	o->kv_block_bytes = m->kv_block_bytes;
	o->budget = cap < avail ? cap : avail;
	gpud_fmt_bytes(o->budget, b, sizeof(b));
	gpud_fmt_bytes(cap, c, sizeof(c));
	if (cap <= avail)
		snprintf(what, sizeof(what), "gpud.memory_fraction %g of %s is %s",
			 in->memory_fraction, t, c);
	else
		snprintf(what, sizeof(what), "gpud.memory_fraction %g of %s is %s, but only %s "
			 "is free (%s after the context reserve)", in->memory_fraction, t, c, f, b);
	o->fixed = m->weights + m->masks + m->scratch;
	if (o->fixed > o->budget) {
		gpud_fmt_bytes(o->fixed, a, sizeof(a));
		gpud_fmt_bytes(m->weights, w, sizeof(w));
		gpud_fmt_bytes(m->masks, k, sizeof(k));
		gpud_fmt_bytes(m->scratch, s, sizeof(s));
		return sw_seterr(err, errlen, SW_EEXHAUSTED,
				 "memory plan: gpud.devices[%u] %s (%s): weights (%s) + mask pool "
				 "(%s) + scratch (%s) need %s; %s",
				 pos, dev, m->name, w, k, s, a, what);
	}
	o->kv_room = o->budget - o->fixed;
	if (in->kv_blocks) {
		uint64_t need = (uint64_t)in->kv_blocks * m->kv_block_bytes;

		if (need > o->kv_room) {
			gpud_fmt_bytes(need, a, sizeof(a));
			gpud_fmt_bytes(o->kv_room, k, sizeof(k));
			gpud_fmt_bytes(o->fixed, w, sizeof(w));
			return sw_seterr(err, errlen, SW_EEXHAUSTED,
					 "gpud.kv_blocks=%u needs %s of KV on gpud.devices[%u] %s "
					 "(%s); %s, which leaves %s after its weights and fixed "
					 "pools (%s) (at most %" PRIu64 " blocks of %" PRIu64
					 " bytes)", in->kv_blocks, a, pos, dev, m->name, what, k, w,
					 o->kv_room / m->kv_block_bytes, m->kv_block_bytes);
		}
		o->kv_blocks = in->kv_blocks;
	} else {
		uint64_t fit = o->kv_room / m->kv_block_bytes;
		uint64_t full = (uint64_t)in->max_seqs *
				((in->n_ctx + in->block_tokens - 1) / in->block_tokens);

		if (fit > full)
			fit = full;
		if (fit == 0) {
			gpud_fmt_bytes(o->kv_room, k, sizeof(k));
			return sw_seterr(err, errlen, SW_EEXHAUSTED,
					 "memory plan: gpud.devices[%u] %s (%s): %s, which leaves "
					 "%s after its weights and fixed pools: not one %" PRIu64
					 "-byte KV block fits", pos, dev, m->name, what, k,
					 m->kv_block_bytes);
		}
		o->kv_blocks = (uint32_t)fit;
	}
	o->kv_bytes = (uint64_t)o->kv_blocks * m->kv_block_bytes;
	o->used = o->fixed + o->kv_bytes;
	return 0;
}

/* The host's figures: cpu devices share RAM with the host pools. */
static int plan_host(const struct gpud_plan_in *in, struct gpud_plan *out, uint32_t n_own,
		     uint64_t staging, char *err, size_t errlen)
{
	char a[32], b[32], c[32], d[32], e[32], f[32];
	uint64_t n = out->n_cpu, left, per_dev_fixed = in->scratch_bytes + in->mask_bytes;

	out->total = (uint64_t)(in->memory_fraction * (double)in->host_ram);
	out->fixed = (n ? in->weight_bytes : 0) + in->host_bytes + n * per_dev_fixed +
		     (uint64_t)n_own * in->mask_bytes + staging;
	gpud_fmt_bytes(in->host_ram, b, sizeof(b));
	gpud_fmt_bytes(out->total, c, sizeof(c));
	if (out->fixed > out->total) {
		gpud_fmt_bytes(out->fixed, a, sizeof(a));
		gpud_fmt_bytes(in->weight_bytes, d, sizeof(d));
		gpud_fmt_bytes(per_dev_fixed, e, sizeof(e));
		if (!n_own)
			return sw_seterr(err, errlen, SW_EEXHAUSTED,
					 "memory plan: weights (%s) + scratch and mask pools (%s "
					 "per device x %u) + host pools need %s; "
					 "gpud.memory_fraction %g of %s is %s", d, e, out->n_cpu,
					 a, in->memory_fraction, b, c);
		gpud_fmt_bytes(in->mask_bytes, e, sizeof(e));
		gpud_fmt_bytes(staging, f, sizeof(f));
		return sw_seterr(err, errlen, SW_EEXHAUSTED,
				 "memory plan: host RAM: %s%s%s + mask pools (%s per device x %u) "
				 "+ pinned staging (%s) + host pools need %s; "
				 "gpud.memory_fraction %g of %s is %s",
				 n ? "weights and cpu scratch for " : "", n ? d : "",
				 n ? " per cpu device" : "no cpu device", e, in->n_devices, f, a,
				 in->memory_fraction, b, c);
	}
	out->used = out->fixed;
	if (!n)
		return 0;
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
					 out->n_cpu, out->n_cpu == 1 ? "" : "s",
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

int gpud_plan_compute(const struct gpud_plan_in *in, struct gpud_plan *out, char *err,
		      size_t errlen)
{
	uint64_t staging = 0;
	uint32_t n_own = 0;
	int rc;

	if (!in->n_devices || in->n_devices > SW_CONFIG_MAX_DEVICES || !in->devices ||
	    !in->kv_block_bytes || !in->block_tokens || !in->n_ctx || !in->max_seqs ||
	    !(in->memory_fraction > 0 && in->memory_fraction <= 1))
		return sw_seterr(err, errlen, -EINVAL, "memory plan: inconsistent input");
	memset(out, 0, sizeof(*out));
	out->failed_dev = -1;
	for (uint32_t i = 0; i < in->n_devices; i++) {
		if (!own_memory(&in->devices[i])) {
			out->n_cpu++;
			continue;
		}
		if (!in->devmem || !in->devmem[i].kv_block_bytes)
			return sw_seterr(err, errlen, -EINVAL,
					 "memory plan: inconsistent input (gpud.devices[%u])", i);
		n_own++;
		staging += in->devmem[i].staging;
	}
	out->kv_blocks_full = (uint32_t)((uint64_t)in->max_seqs *
					 ((in->n_ctx + in->block_tokens - 1) / in->block_tokens));
	rc = plan_host(in, out, n_own, staging, err, errlen);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < in->n_devices; i++) {
		struct gpud_plan_dev *o = &out->dev[i];

		if (own_memory(&in->devices[i])) {
			rc = plan_devmem(in, i, o, err, errlen);
			if (rc) {
				out->failed_dev = (int32_t)i;
				return rc;
			}
			continue;
		}
		o->kv_blocks = out->kv_blocks;
		o->kv_block_bytes = in->kv_block_bytes;
		o->kv_bytes = out->kv_bytes;
	}
	return 0;
}

/* --- sizing and the plan of one configuration -------------------------------- */

static uint64_t host_ram(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

	return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

/* The backend configuration daemon_build's engine for device i will have
 * (the pools it asks for depend on it); n_blocks 0. */
static struct gpud_backend_config backend_config(const struct sw_config *cfg,
						 const struct gpud_model *m, uint32_t i,
						 uint32_t threads_per_dev)
{
	const typeof(cfg->gpud) *g = &cfg->gpud;

	return (struct gpud_backend_config){
		.model = m,
		.ordinal = g->devices[i].index,
		.n_threads = (int)threads_per_dev,
		.block_tokens = g->kv_block_tokens,
		.max_batch_tokens = g->max_batch_tokens,
		.max_seqs = g->max_seqs + 1,   /* as daemon_build's engines */
		.max_logits = g->max_seqs + 1 + g->logprob_rows, /* as daemon_build's */
		.kv_type = gpud_kv_type_of(g->kv_type),
	};
}

/* Step scratch per cpu device: the most any configured cpu device's
 * backend asks for with the engine parameters daemon_build will give it.
 * Devices with memory of their own plan their scratch there (devmem). */
static uint64_t scratch_bytes(const struct sw_config *cfg, const struct gpud_model *m,
			      uint32_t threads_per_dev)
{
	const typeof(cfg->gpud) *g = &cfg->gpud;
	uint64_t most = 0;

	for (uint32_t i = 0; i < g->n_devices; i++) {
		const struct gpud_backend_ops *ops = gpud_backend_for(g->devices[i].kind);
		struct gpud_backend_config bc = backend_config(cfg, m, i, threads_per_dev);
		uint64_t s = ops && g->devices[i].kind == SW_DEVICE_CPU ? ops->scratch_bytes(&bc) : 0;

		if (s > most)
			most = s;
	}
	return most;
}

/* Of that, the weights a cpu device's backend copies for itself
 * (own_weight_bytes: packed matrices), which leave the mapping. */
static uint64_t own_weight_bytes(const struct sw_config *cfg, const struct gpud_model *m,
				 uint32_t threads_per_dev)
{
	const typeof(cfg->gpud) *g = &cfg->gpud;

	for (uint32_t i = 0; i < g->n_devices; i++) {
		const struct gpud_backend_ops *ops = gpud_backend_for(g->devices[i].kind);
		struct gpud_backend_config bc = backend_config(cfg, m, i, threads_per_dev);

		if (ops && ops->own_weight_bytes && g->devices[i].kind == SW_DEVICE_CPU)
			return ops->own_weight_bytes(&bc);
	}
	return 0;
}

#define PLAN_PROBE_BLOCKS 4096u

/* Whether every configured device can run here, and what each device with
 * memory of its own reports and would reserve (z->devmem). A device that
 * is not there or does not answer sets *bad to its index; a refusal that
 * no device can help (a build without its backend, a model its backend
 * cannot run) leaves it -1. */
static int query_devices(const struct sw_config *cfg, const struct gpud_model *m,
			 struct sizing *z, int *bad, char *err, size_t errlen)
{
	const typeof(cfg->gpud) *g = &cfg->gpud;
	int n_cuda = -1, rc;

	for (uint32_t i = 0; i < g->n_devices; i++) {
		const struct sw_config_device *dev = &g->devices[i];
		bool built = gpud_backend_for(dev->kind) != NULL;

		if (dev->kind == SW_DEVICE_CUDA && built && n_cuda < 0) {
#if SW_HAVE_CUDA
			n_cuda = gpud_cuda_device_count();
#else
			n_cuda = 0;
#endif
		}
		rc = gpud_plan_device_check(dev, dev->pos, built, n_cuda, err, errlen);
		if (rc) {
			if (rc == -ENODEV)
				*bad = (int)i;
			return rc;
		}
#if SW_HAVE_CUDA
		if (dev->kind == SW_DEVICE_CUDA) {
			struct gpud_backend_config bc = backend_config(cfg, m, i, z->threads_per_dev);
			struct gpud_plan_devmem *dm = &z->devmem[i];
			struct gpud_cuda_devinfo info;
			struct gpud_cuda_plan p0, p1;
			char why[SW_ERR_MAX];
			uint64_t n0 = PLAN_PROBE_BLOCKS, bt = bc.block_tokens;

			rc = gpud_cuda_device_info(dev->index, &info, why, sizeof(why));
			if (rc) {
				*bad = (int)i;
				return sw_seterr(err, errlen, rc, "gpud.devices[%u]: %s", dev->pos,
						 why);
			}
			/* the model on this backend at all (a qwen2 model, K-quants:
			 * its reason, not a plan of zeros) */
			bc.n_blocks = PLAN_PROBE_BLOCKS;
			rc = gpud_cuda_plan_check(&bc, why, sizeof(why));
			if (rc)
				return sw_seterr(err, errlen, rc, "gpud.devices[%u] (cuda:%d): %s",
						 dev->pos, dev->index, why);
			/* The fixed pools at their largest: enough blocks that the
			 * block tables and mask slots cover the model's whole
			 * context (gpud_cuda_plan_for reports all zeros for 0
			 * blocks, a config no instance can have). The KV block
			 * size per block over PLAN_PROBE_BLOCKS more: a pool
			 * rounded up to its alignment does not pass for one
			 * block's size. */
			if (bt && (gpud_model_hparams(m)->n_ctx + bt - 1) / bt > n0)
				n0 = (gpud_model_hparams(m)->n_ctx + bt - 1) / bt;
			if (n0 > UINT32_MAX - PLAN_PROBE_BLOCKS)
				n0 = UINT32_MAX - PLAN_PROBE_BLOCKS;
			bc.n_blocks = (uint32_t)n0;
			gpud_cuda_plan_for(&bc, &p0);
			bc.n_blocks = (uint32_t)n0 + PLAN_PROBE_BLOCKS;
			gpud_cuda_plan_for(&bc, &p1);
			memset(dm, 0, sizeof(*dm));
			snprintf(dm->name, sizeof(dm->name), "%s", info.name);
			dm->cc_major = info.cc_major;
			dm->cc_minor = info.cc_minor;
			dm->total_bytes = info.total_bytes;
			dm->free_bytes = info.free_bytes;
			dm->weights = p0.weights;
			dm->weights_q8 = p0.weights_q8;
			dm->masks = p0.masks;
			dm->scratch = p0.scratch;
			dm->staging = p0.staging;
			dm->kv_block_bytes = (p1.kv - p0.kv + PLAN_PROBE_BLOCKS - 1) / PLAN_PROBE_BLOCKS;
		}
#else
		(void)m;
		(void)z;
#endif
	}
	return 0;
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
	z->packed = own_weight_bytes(cfg, m, z->threads_per_dev);
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
	/* the scheduler: max_requests = queue.global + one warm-up request per
	 * device (daemon.c), each a sampler and a slot's logit biases; the
	 * device threads and sample_threads - 1 more draw scratches */
	z->sample_threads = gpud_sched_sample_threads(g->sample_threads);
	z->sampling = ((uint64_t)g->queue.global + g->n_devices) *
			      (gpud_sampler_bytes() +
			       GPUD_SAMPLER_MAX_BIAS * (sizeof(int32_t) + sizeof(float))) +
		      ((uint64_t)g->n_devices + z->sample_threads - 1) *
			      gpud_sampler_scratch_bytes((int32_t)hp->n_vocab);
	z->host = z->server + z->tok_scratch + z->sampling + 2ull * (2 * z->max_text + 512) +
		  (uint64_t)g->n_devices * EMBED_SLOTS * ((uint64_t)z->n_ctx * 4 + hp->dim * 4);
}

int gpud__make_plan(const struct sw_config *cfg, const struct gpud_model *m,
		    struct sizing *z, struct gpud_plan *plan, uint64_t *kv_block_bytes,
		    int *bad, char *err, size_t errlen)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(m);
	struct gpud_plan_in in = {
		.n_devices = cfg->gpud.n_devices,
		.devices = cfg->gpud.devices,
		.devmem = z->devmem,
		.host_ram = host_ram(),
		.memory_fraction = cfg->gpud.memory_fraction,
		/* counted only with cpu devices: then the packed tensors are
		 * resident in each device's copy, not in the mapping */
		.weight_bytes = gpud_model_weight_bytes(m) - z->packed,
		.kv_block_bytes = gpud_kv_block_bytes(hp, cfg->gpud.kv_block_tokens,
						      gpud_kv_type_of(cfg->gpud.kv_type)),
		.kv_blocks = cfg->gpud.kv_blocks,
		.max_seqs = cfg->gpud.max_seqs,
		.n_ctx = z->n_ctx,
		.block_tokens = cfg->gpud.kv_block_tokens,
		.scratch_bytes = z->scratch,
		.mask_bytes = z->mask_pool,
		.host_bytes = z->host,
	};

	int rc;

	*kv_block_bytes = in.kv_block_bytes;
	*bad = -1;
	rc = query_devices(cfg, m, z, bad, err, errlen);
	if (rc)
		return rc;
	rc = gpud_plan_compute(&in, plan, err, errlen);
	if (rc == SW_EEXHAUSTED)
		*bad = plan->failed_dev;
	return rc;
}

void gpud__device_name(const struct sw_config *cfg, uint32_t i, char *out, size_t outlen)
{
	const struct gpud_backend_ops *ops = gpud_backend_for(cfg->gpud.devices[i].kind);

	snprintf(out, outlen, "%s%u", ops ? ops->name : "dev", cfg->gpud.devices[i].pos);
}

/* A device with memory of its own: what it reports, its budget, each pool. */
static void print_devmem(FILE *out, const struct sw_config *cfg, const struct sizing *z,
			 const struct gpud_plan *p, uint32_t i, const char *dev)
{
	const struct gpud_plan_devmem *m = &z->devmem[i];
	const struct gpud_plan_dev *o = &p->dev[i];
	char cfgname[32], a[32], b[32], c[32];

	sw_config_device_name(&cfg->gpud.devices[i], cfgname, sizeof(cfgname));
	gpud_fmt_bytes(m->total_bytes, a, sizeof(a));
	gpud_fmt_bytes(m->free_bytes, b, sizeof(b));
	fprintf(out, "  %s: %s, %s (sm_%d%d): %s total, %s free\n", dev, cfgname, m->name,
		m->cc_major, m->cc_minor, a, b);
	gpud_fmt_bytes(o->budget, a, sizeof(a));
	gpud_fmt_bytes(o->used, b, sizeof(b));
	fprintf(out, "  %s.budget: %s of it (gpud.memory_fraction %g of total, at most free "
		"less %llu MiB for the CUDA context), %s planned\n", dev, a,
		cfg->gpud.memory_fraction, GPUD_PLAN_DEVICE_RESERVE >> 20, b);
	gpud_fmt_bytes(m->weights, a, sizeof(a));
	if (m->weights_q8) {
		gpud_fmt_bytes(m->weights_q8, b, sizeof(b));
		fprintf(out, "  %s.weights: %s (a full replica; %s of it held as Q8_0: weight "
			"types with no CUDA kernel, requantized at load)\n", dev, a, b);
	} else {
		fprintf(out, "  %s.weights: %s (a full replica)\n", dev, a);
	}
	gpud_fmt_bytes(o->kv_bytes, a, sizeof(a));
	fprintf(out, "  %s.kv: %u blocks x %" PRIu64 " bytes = %s (%u %s tokens/block; %u "
		"blocks hold max_seqs %u full contexts)\n", dev, o->kv_blocks, o->kv_block_bytes, a,
		cfg->gpud.kv_block_tokens, gpud_type_name(gpud_kv_type_of(cfg->gpud.kv_type)),
		p->kv_blocks_full, cfg->gpud.max_seqs);
	gpud_fmt_bytes(m->masks, a, sizeof(a));
	gpud_fmt_bytes(z->mask_pool, b, sizeof(b));
	fprintf(out, "  %s.mask: %s on the device, %s on the host (%u + 1 slots x %" PRIu64
		" bytes)\n", dev, a, b, z->mask_entries, z->mask_slot);
	gpud_fmt_bytes(m->scratch, a, sizeof(a));
	fprintf(out, "  %s.scratch: %s (max_batch_tokens %u)\n", dev, a,
		cfg->gpud.max_batch_tokens);
	gpud_fmt_bytes(m->staging, a, sizeof(a));
	gpud_fmt_bytes(cfg->gpud.prefix_cache_bytes, c, sizeof(c));
	fprintf(out, "  %s.staging: %s of pinned host memory\n", dev, a);
	fprintf(out, "  %s.prefix: at most %s of unreferenced KV (inside %s.kv)\n", dev, c, dev);
}

void gpud__print_plan(FILE *out, const struct sw_config *cfg, const struct sizing *z,
		      const struct gpud_plan *p, uint64_t bb, uint64_t weights)
{
	char a[32], b[32], c[32];

	gpud_fmt_bytes(p->total, a, sizeof(a));
	gpud_fmt_bytes(p->used, b, sizeof(b));
	fprintf(out, "memory plan: %s of %s host budget (gpud.memory_fraction %g)\n", b, a,
		cfg->gpud.memory_fraction);
	gpud_fmt_bytes(weights, a, sizeof(a));
	gpud_fmt_bytes(z->packed, c, sizeof(c));
	if (p->n_cpu && z->packed)
		fprintf(out, "  weights: %s (mapped once; %s of it copied into each cpu device's "
			"scratch in the kernels' packed layout, and no longer resident in the "
			"mapping)\n", a, c);
	else if (p->n_cpu)
		fprintf(out, "  weights: %s (mapped once, shared by the cpu devices)\n", a);
	else
		fprintf(out, "  weights: %s (mapped; read once per device at start)\n", a);
	for (uint32_t i = 0; i < cfg->gpud.n_devices; i++) {
		char dev[16];

		gpud__device_name(cfg, i, dev, sizeof(dev));
		if (p->dev[i].own_memory) {
			print_devmem(out, cfg, z, p, i, dev);
			continue;
		}
		gpud_fmt_bytes(p->kv_bytes, a, sizeof(a));
		fprintf(out, "  %s.kv: %u blocks x %" PRIu64 " bytes = %s (%u %s tokens/block; "
			"%u blocks hold max_seqs %u full contexts)\n", dev, p->kv_blocks, bb, a,
			cfg->gpud.kv_block_tokens,
			gpud_type_name(gpud_kv_type_of(cfg->gpud.kv_type)), p->kv_blocks_full,
			cfg->gpud.max_seqs);
		gpud_fmt_bytes(z->scratch, a, sizeof(a));
		fprintf(out, "  %s.scratch: %s (max_batch_tokens %u, estimate; %s of packed "
			"weights)\n", dev, a, cfg->gpud.max_batch_tokens, c);
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
	gpud_fmt_bytes(z->sampling, a, sizeof(a));
	fprintf(out, "  sampling: %s (%u request samplers, %u threads' draw scratch)\n", a,
		cfg->gpud.queue.global + cfg->gpud.n_devices,
		cfg->gpud.n_devices + z->sample_threads - 1);
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
	uint64_t real = z->host;
	char a[32], b[32], c[32];

	if (d->plan.n_cpu)
		real += gpud_model_weight_bytes(d->model) - z->packed;
	for (uint32_t i = 0; i < d->n_dev; i++) {
		const struct gpud_plan_dev *o = &d->plan.dev[i];
		const struct device *dv = &d->dev[i];
		uint64_t dreal;

		real += dv->mst.reserved_bytes;
		if (!o->own_memory) {
			real += dv->est.kv_bytes + dv->est.scratch_bytes;
			continue;
		}
		/* The device's own pools against its budget; its staging is host. */
		dreal = o->fixed - z->devmem[i].scratch + dv->est.kv_bytes +
				 dv->est.scratch_bytes;

		real += z->devmem[i].staging;
		gpud_fmt_bytes(dreal, a, sizeof(a));
		gpud_fmt_bytes(o->used, b, sizeof(b));
		if (dreal > o->budget) {
			gpud_fmt_bytes(o->budget, c, sizeof(c));
			log_error("%s: reserved %s on the device, more than its budget of %s "
				  "(plan %s): lower gpud.kv_blocks or gpud.memory_fraction",
				  dv->name, a, c, b);
			return SW_EEXHAUSTED;
		}
		log_info("%s: reserved %s on the device (plan %s)", dv->name, a, b);
	}
	gpud_fmt_bytes(real, a, sizeof(a));
	gpud_fmt_bytes(d->plan.used, b, sizeof(b));
	if (real > d->plan.total) {
		gpud_fmt_bytes(d->plan.total, c, sizeof(c));
		log_error("reserved %s of host memory in all, more than the budget of %s (plan "
			  "%s): lower gpud.kv_blocks or gpud.memory_fraction's share", a, c, b);
		return SW_EEXHAUSTED;
	}
	log_info("reserved %s of host memory in all (plan %s)", a, b);
	return 0;
}
