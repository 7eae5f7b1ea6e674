/* daemon.c - `gpud serve` (gpud/daemon.h): start-up in order (the model,
 * the memory plan, every pool, the server, the device threads, warm-up,
 * the signals, listen), the loop, and teardown. The other concerns are in
 * the daemon_*.c files listed in daemon_impl.h.
 */
#include "gpud/daemon.h"

#include <errno.h>
#include <gnu/libc-version.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/arena.h"
#include "common/err.h"
#include "common/log.h"
#include "common/mem.h"
#include "gpud/alloc.h"
#include "gpud/backend.h"
#include "gpud/daemon_impl.h"
#include "gpud/engine.h"
#include "gpud/maskcache.h"
#include "gpud/memwatch.h"
#include "gpud/metrics.h"
#include "gpud/model.h"
#include "gpud/scheduler.h"
#include "gpud/server.h"
#include "gpud/tokenizer.h"
#include "sw_config.h"

static void model_desc(const struct gpud_model *m, char *name, size_t namelen, uint64_t *params,
		       const char **type)
{
	const struct gpud_gguf *g = gpud_model_gguf(m);
	struct gpud_gguf_str s;
	uint64_t n = 0;

	if (gpud_gguf_get_str(g, "general.name", &s) == 0)
		snprintf(name, namelen, "%.*s", (int)(s.len < 200 ? s.len : 200), s.s);
	else
		snprintf(name, namelen, "(unnamed)");
	for (uint64_t i = 0; i < gpud_gguf_n_tensors(g); i++) {
		const struct gpud_gguf_tensor *t = gpud_gguf_tensor(g, i);
		uint64_t e = 1;
		for (uint32_t k = 0; k < t->n_dims; k++)
			e *= t->ne[k];
		n += e;
	}
	*params = n;
	*type = gpud_type_name(gpud_model_weights(m)->layers[0].wq.type);
}

static int on_warmup_event(void *arg, const struct gpud_sched_event *ev)
{
	struct device *dv = arg;

	if (ev->kind == GPUD_SCHED_DONE) {
		if (ev->status)
			log_error("%s: warm-up request failed: %s", dv->name,
				  ev->message && ev->message[0] ? ev->message : sw_strerror(ev->status));
		atomic_fetch_sub(&dv->warm_left, 1);
	}
	return 0;
}

/* Exits at once when a device is hung (the step watchdog said so): its
 * thread is inside the backend and may never return, so nothing is torn
 * down under it (freeing its engine, or the CUDA runtime's exit handlers,
 * could wait forever). */
static void exit_if_hung(struct gpud_daemon *d, int status)
{
	for (uint32_t i = 0; i < d->n_dev; i++) {
		bool hung;

		pthread_mutex_lock(&d->dev[i].lock);
		hung = d->dev[i].hung;
		pthread_mutex_unlock(&d->dev[i].lock);
		if (hung) {
			log_error("%s is hung: gpud exits with status %d without waiting for it",
				  d->dev[i].name, status);
			_exit(status);
		}
	}
}

/* Joins a device thread, a GPU's waiting at most a step's time limit
 * (none when gpud.step_timeout_ms is 0): one that does not end is in a
 * step that hangs, and gpud exits without it (exit_if_hung's reasons). */
static void join_device(struct gpud_daemon *d, struct device *dv)
{
	uint32_t ms = d->cfg.gpud.step_timeout_ms;
	struct timespec ts;

	if (!ms || d->cfg.gpud.devices[dv->idx].kind != SW_DEVICE_CUDA) {
		pthread_join(dv->thread, NULL);
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000 + 1; /* and a second for the round it ends */
	ts.tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	if (pthread_timedjoin_np(dv->thread, NULL, &ts) == 0)
		return;
	log_error("%s: its thread did not end within gpud.step_timeout_ms (%u) of the "
		  "shutdown: hung; gpud exits with status %d without waiting for it", dv->name, ms,
		  GPUD_EXIT_DEVICE);
	_exit(GPUD_EXIT_DEVICE);
}

static void daemon_free(struct gpud_daemon *d)
{
	if (!d)
		return;
	atomic_store(&d->stopping, true);
	if (d->sched)
		gpud_sched_wake(d->sched);
	if (d->step_watch_started)
		pthread_join(d->step_watch, NULL);
	for (uint32_t i = 0; i < d->n_dev; i++)
		if (d->dev[i].started)
			join_device(d, &d->dev[i]);
	gpud_server_destroy(d->server);
	gpud_metrics_destroy(d->metrics);
	if (d->loop_ok) {
		uv_run(&d->loop, UV_RUN_DEFAULT); /* run pending closes */
		if (uv_loop_close(&d->loop))
			log_warn("libuv loop still has handles at exit");
	}
	gpud_sched_destroy(d->sched);
	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct device *dv = &d->dev[i];
		gpud_engine_destroy(dv->engine);
		gpud_maskcache_destroy(dv->masks);
		for (uint32_t j = 0; j < EMBED_SLOTS; j++) {
			free(dv->jobs[j].tokens);
			free(dv->jobs[j].out);
		}
		pthread_mutex_destroy(&dv->lock);
	}
	gpud_memwatch_destroy(d->watch);
	pthread_mutex_destroy(&d->watch_lock);
	sw_arena_destroy(&d->tok_arena);
	free(d->ids);
	free(d->fmt);
	free(d->copy);
	free(d->dump_buf);
	gpud_model_free(d->model);
	free(d);
}

/* --- building the parts (after the plan, before the loop) ------------------- */

/* The trough watchdog, with room for every pool the daemon registers.
 * It watches what live requests hold, whose trough also follows the load:
 * a load that steps up and stays lifts it once, a leak again and again,
 * hence two rising windows at least (min_steps). */
static int watch_build(struct gpud_daemon *d)
{
	const typeof(d->cfg.gpud) *g = &d->cfg.gpud;
	struct gpud_memwatch_params wp = {
		.max_pools = 2 * SW_CONFIG_MAX_DEVICES + 2,
		.window_ms = g->watchdog.window_ms,
		.k = g->watchdog.k,
		.min_rise = 1,
		.min_steps = 2,
		.rise_fraction = 0,
	};
	int rc;

	rc = gpud_memwatch_create(&d->watch, &wp);
	if (rc)
		log_error("watchdog: %s", sw_strerror(rc));
	return rc;
}

/* dv's engine: a backend instance of the device's kind with the planned
 * KV blocks, its scratch, and its thread pool. The error also into err. */
static int engine_build(struct gpud_daemon *d, struct device *dv, const struct sizing *z,
			char err[SW_ERR_MAX])
{
	const typeof(d->cfg.gpud) *g = &d->cfg.gpud;
	struct gpud_engine_params ep;
	char a[32], b[32];
	int rc;

	gpud_engine_params_default(&ep);
	ep.n_threads = (int)z->threads_per_dev;
	ep.n_ctx = d->n_ctx;
	ep.max_batch_tokens = g->max_batch_tokens;
	ep.max_seqs = g->max_seqs + 1; /* + the embedding's temporary slot */
	ep.max_logits = ep.max_seqs + g->logprob_rows; /* the prompt's log probabilities */
	ep.block_tokens = g->kv_block_tokens;
	ep.kv_type = gpud_kv_type_of(g->kv_type);
	ep.n_blocks = d->plan.dev[dv->idx].kv_blocks;
	ep.device = (int)dv->idx;
	ep.kind = g->devices[dv->idx].kind;
	ep.ordinal = g->devices[dv->idx].index;
	ep.test_leak_kv = d->leak_kv;
	ep.chunk_bytes = g->chunk_cache_bytes;
	err[0] = '\0';
	if ((int)g->devices[dv->idx].pos == d->test_fail_engine) {
		snprintf(err, SW_ERR_MAX, "GPUD_TEST_FAIL_ENGINE: %s's engine fails on purpose",
			 dv->name);
		log_error("%s: engine: %s", dv->name, err);
		return SW_EDEVICE;
	}
	rc = gpud_engine_create(&dv->engine, d->model, &ep, err, SW_ERR_MAX);
	if (rc) {
		log_error("%s: engine: %s", dv->name, err);
		return rc;
	}
	gpud_engine_stats(dv->engine, &dv->est);
	gpud_fmt_bytes(dv->est.kv_bytes, a, sizeof(a));
	gpud_fmt_bytes(dv->est.scratch_bytes, b, sizeof(b));
	log_info("%s: reserved and backed KV %u blocks x %" PRIu64 " bytes = %s, scratch %s, %d "
		 "threads",
		 dv->name, dv->est.kv.n_blocks, d->plan.dev[dv->idx].kv_block_bytes, a, b,
		 ep.n_threads);
	return 0;
}

/* dv's mask cache and its pool of equal slots. */
static int masks_build(struct gpud_daemon *d, struct device *dv, const struct sizing *z)
{
	const typeof(d->cfg.gpud) *g = &d->cfg.gpud;
	struct gpud_maskcache_params mp;
	char wname[GPUD_STATS_NAME_MAX + 8], a[32], b[32];
	int rc;

	snprintf(wname, sizeof(wname), "%s.mask", dv->name);
	mp = (struct gpud_maskcache_params){
		.name = wname,
		.max_segments = g->max_segments,
		.max_prompt_tokens = d->n_ctx,
		.block_tokens = g->kv_block_tokens,
		.max_entries = z->mask_entries,
		.max_bytes = g->mask_cache_bytes,
	};
	rc = gpud_maskcache_create(&dv->masks, &mp);
	if (rc) {
		gpud_fmt_bytes(z->mask_pool, a, sizeof(a));
		log_error("%s: cannot reserve the mask pool (%u + 1 slots x %" PRIu64 " bytes = %s): "
			  "%s", dv->name, z->mask_entries, z->mask_slot, a, sw_strerror(rc));
		return rc;
	}
	gpud_maskcache_stats(dv->masks, &dv->mst);
	gpud_fmt_bytes(dv->mst.reserved_bytes, a, sizeof(a));
	gpud_fmt_bytes(dv->mst.max_bytes, b, sizeof(b));
	log_info("%s: reserved and backed mask pool %u slots x %zu bytes = %s (cache bound %u "
		 "entries, %s)",
		 dv->name, dv->mst.pool_capacity, dv->mst.slot_bytes, a, dv->mst.max_entries, b);
	return 0;
}

/* dv's embedding job slots: a prompt and an output vector each. */
static int jobs_build(struct gpud_daemon *d, struct device *dv)
{
	for (uint32_t j = 0; j < EMBED_SLOTS; j++) {
		dv->jobs[j].tokens = malloc((size_t)d->n_ctx * sizeof(int32_t));
		dv->jobs[j].out = malloc((size_t)d->dim * sizeof(float));
		if (!dv->jobs[j].tokens || !dv->jobs[j].out ||
		    sw_mem_prefault(dv->jobs[j].tokens, (size_t)d->n_ctx * sizeof(int32_t)) ||
		    sw_mem_prefault(dv->jobs[j].out, (size_t)d->dim * sizeof(float))) {
			log_error("%s: out of memory for embedding slots", dv->name);
			return -ENOMEM;
		}
	}
	return 0;
}

/* dv's KV and mask pools under the trough watchdog, which watches what
 * live requests hold in each and reports what its cache keeps beside it:
 * the prefix cache's blocks no request uses (bounded by
 * prefix_cache_bytes) and the chunk-KV cache's (chunk_cache_bytes), the mask cache's unpinned masks (bounded by its
 * entries). */
static int device_watch(struct gpud_daemon *d, struct device *dv)
{
	uint64_t n_blocks = dv->est.kv.n_blocks;
	uint64_t bb = d->plan.dev[dv->idx].kv_block_bytes;
	uint64_t kv_bound = (d->cfg.gpud.prefix_cache_bytes + d->cfg.gpud.chunk_cache_bytes) / bb;
	char wname[GPUD_STATS_NAME_MAX + 8];

	snprintf(wname, sizeof(wname), "%s.kv", dv->name);
	dv->wd_kv = gpud_memwatch_register_cached(d->watch, wname, n_blocks,
						  kv_bound < n_blocks ? kv_bound : n_blocks);
	snprintf(wname, sizeof(wname), "%s.mask", dv->name);
	dv->wd_mask = gpud_memwatch_register_cached(d->watch, wname, dv->mst.pool_capacity,
						    dv->mst.max_entries);
	if (dv->wd_kv < 0 || dv->wd_mask < 0) {
		log_error("%s: watchdog registration failed", dv->name);
		return -EINVAL;
	}
	return 0;
}

/* One device's engine_build on a thread of its own (engines_build), a
 * start-up thread of gpud's for the allocation counts. */
struct engine_job {
	struct gpud_daemon *d;
	struct device *dv;
	const struct sizing *z;
	int rc;
	char err[SW_ERR_MAX];
};

static void *engine_job_main(void *arg)
{
	struct engine_job *j = arg;

	gpud_alloc_set_role(GPUD_ALLOC_OTHER);
	j->rc = engine_build(j->d, j->dv, j->z, j->err);
	return NULL;
}

/* --- devices left out (gpud.min_devices) ----------------------------------- */

/* Whether one more device may be left out: gpud.min_devices is set and
 * more than that many devices remain. */
static bool may_leave_out(const struct gpud_daemon *d)
{
	uint32_t min = d->cfg.gpud.min_devices;

	return min > 0 && d->cfg.gpud.n_devices > min;
}

/* Records configured device i as left out for why, and takes it off the
 * configuration's device list (the others keep their positions, .pos). */
static void cfg_leave_out(struct gpud_daemon *d, uint32_t i, const char *why)
{
	typeof(d->cfg.gpud) *g = &d->cfg.gpud;
	struct left_out *l = &d->left[d->n_left++];

	gpud__device_name(&d->cfg, i, l->name, sizeof(l->name));
	sw_config_device_name(&g->devices[i], l->device, sizeof(l->device));
	snprintf(l->why, sizeof(l->why), "%s", why);
	memmove(&g->devices[i], &g->devices[i + 1], (g->n_devices - i - 1) * sizeof(g->devices[0]));
	g->n_devices--;
}

/* The line that says a device is left out: to out (--check) or the log. */
static void say_left_out(const struct gpud_daemon *d, bool check_only, FILE *out)
{
	const struct left_out *l = &d->left[d->n_left - 1];

	if (check_only)
		fprintf(out, "left out: %s (%s): %s\n", l->name, l->device, l->why);
	else
		log_warn("%s (%s) left out, gpud starts without it (gpud.min_devices %u, %u "
			 "device%s left): %s", l->name, l->device, d->cfg.gpud.min_devices,
			 d->cfg.gpud.n_devices, d->cfg.gpud.n_devices == 1 ? "" : "s", l->why);
}

/* Why too few devices can start: the line after the failure's own. */
static void say_too_few(const struct gpud_daemon *d, uint32_t failing, bool check_only, FILE *out)
{
	uint32_t min = d->cfg.gpud.min_devices, left = d->n_left + failing;

	if (!min)
		return;
	if (check_only)
		fprintf(out, "gpud.min_devices %u: %u of the %u configured devices cannot start\n",
			min, left, d->n_configured);
	else
		log_error("gpud.min_devices %u: %u of the %u configured devices cannot start",
			  min, left, d->n_configured);
}

/* The devices whose engine failed (jobs[i].rc), left out when
 * gpud.min_devices allows all of them to be: each is taken off d->dev,
 * the configuration, the plan and z (the others move down, keeping
 * their names). Returns 0, or the first failure in device order. */
static int devices_leave_out_failed(struct gpud_daemon *d, struct sizing *z,
				    const struct engine_job *jobs)
{
	uint32_t n = d->n_dev, n_bad = 0, min = d->cfg.gpud.min_devices;
	int first = 0;

	for (uint32_t i = 0; i < n; i++) {
		if (jobs[i].rc) {
			n_bad++;
			if (!first)
				first = jobs[i].rc;
		}
	}
	if (!n_bad)
		return 0;
	if (!min || n - n_bad < min) {
		say_too_few(d, n_bad, false, NULL);
		return first;
	}
	for (uint32_t i = n; i-- > 0;) {
		struct device *dv = &d->dev[i];

		if (!jobs[i].rc)
			continue;
		gpud_engine_destroy(dv->engine);
		pthread_mutex_destroy(&dv->lock);
		cfg_leave_out(d, i, jobs[i].err[0] ? jobs[i].err : sw_strerror(jobs[i].rc));
		for (uint32_t j = i + 1; j < d->n_dev; j++) {
			struct device *from = &d->dev[j], *to = &d->dev[j - 1];

			/* a mutex is not moved: the one at from ends, a new one at to */
			pthread_mutex_destroy(&from->lock);
			*to = *from;
			to->idx = j - 1;
			pthread_mutex_init(&to->lock, NULL);
			d->plan.dev[j - 1] = d->plan.dev[j];
			z->devmem[j - 1] = z->devmem[j];
		}
		d->n_dev--;
		memset(&d->dev[d->n_dev], 0, sizeof(d->dev[0]));
		say_left_out(d, false, NULL);
	}
	d->plan.n_cpu = 0;
	for (uint32_t i = 0; i < d->n_dev; i++)
		d->plan.n_cpu += d->cfg.gpud.devices[i].kind == SW_DEVICE_CPU;
	return 0;
}

/* Every device's engine, side by side: a thread per device past the
 * first, which the calling thread builds. An engine is most of a device's
 * start (a GPU's weight replica upload, its pools and decode graphs; a
 * CPU device's packed weights and backed KV), and each touches only its
 * own device and its own memory, reading the model and the plan: six
 * GPUs start in the time of one instead of six, and so does a restart
 * after a device fails. The rest of a device (mask cache, jobs,
 * watchdog registrations) is built after, in device order. Returns 0, or
 * the first failure in device order (each failure is logged; engines
 * built beside it are freed with the daemon) unless gpud.min_devices lets
 * the devices that failed be left out (devices_leave_out_failed). */
static int engines_build(struct gpud_daemon *d, struct sizing *z)
{
	struct engine_job jobs[SW_CONFIG_MAX_DEVICES];
	pthread_t th[SW_CONFIG_MAX_DEVICES];
	bool started[SW_CONFIG_MAX_DEVICES] = { false };
	uint32_t n = d->n_dev;

	for (uint32_t i = 0; i < n; i++) {
		jobs[i] = (struct engine_job){ .d = d, .dv = &d->dev[i], .z = z };
		if (i > 0)
			started[i] = pthread_create(&th[i], NULL, engine_job_main, &jobs[i]) == 0;
	}
	jobs[0].rc = engine_build(d, &d->dev[0], z, jobs[0].err);
	for (uint32_t i = 1; i < n; i++) {
		if (started[i])
			pthread_join(th[i], NULL);
		else /* no thread to be had: built here, after the others */
			jobs[i].rc = engine_build(d, &d->dev[i], z, jobs[i].err);
	}
	return devices_leave_out_failed(d, z, jobs);
}

/* Everything one device owns beside its engine (engines_build). */
static int device_build(struct gpud_daemon *d, struct device *dv, const struct sizing *z)
{
	int rc;

	rc = masks_build(d, dv, z);
	if (rc)
		return rc;
	rc = jobs_build(d, dv);
	if (rc)
		return rc;
	return device_watch(d, dv);
}

/* The server's request and connection slots under the trough watchdog.
 * Connection slots are held by clients, which (re)connect at their own
 * pace: after a restart, agentd's workers come back as each next needs
 * gpud, so the trough climbs in several steps (a soak on emulated GPUs,
 * bench/results/soak-cuemu-2026-12-07-0954: 0 to 4 in two, after a device's
 * hang, and a warning). Their trough counts as rising only when it rose
 * in every window of the ring: slots that leak under a steady churn. */
static int server_watch(struct gpud_daemon *d)
{
	const typeof(d->cfg.gpud) *g = &d->cfg.gpud;

	d->wd_req = gpud_memwatch_register(d->watch, "server.requests", g->queue.global);
	d->wd_conn = gpud_memwatch_register(d->watch, "server.connections", g->max_connections);
	if (d->wd_conn >= 0)
		gpud_memwatch_set_min_steps(d->watch, d->wd_conn, g->watchdog.k - 1);
	if (d->wd_req < 0 || d->wd_conn < 0) {
		log_error("watchdog registration failed");
		return -EINVAL;
	}
	return 0;
}

/* One scheduler over every device's engine. */
static int sched_build(struct gpud_daemon *d)
{
	const typeof(d->cfg.gpud) *g = &d->cfg.gpud;
	struct gpud_engine *engines[SW_CONFIG_MAX_DEVICES];
	struct gpud_sched_params sp;
	char err[SW_ERR_MAX] = "";
	int rc;

	for (uint32_t i = 0; i < d->n_dev; i++)
		engines[i] = d->dev[i].engine;
	gpud_sched_params_default(&sp);
	sp.max_requests = g->queue.global + d->n_dev; /* + the warm-up requests */
	sp.max_batch_tokens = g->max_batch_tokens;
	sp.max_seqs = g->max_seqs;
	sp.prefix_cache_bytes = g->prefix_cache_bytes;
	sp.placement_margin = g->placement_margin;
	sp.sample_threads = g->sample_threads;
	rc = gpud_sched_create(&d->sched, engines, d->n_dev, &sp, err, sizeof(err));
	if (rc) {
		log_error("scheduler: %s", err);
		return rc;
	}
	log_info("scheduler: %u request slots, max_batch_tokens %u, max_seqs %u, prefix cache "
		 "%" PRIu64 " bytes per device, placement_margin %u, %u sampling threads%s",
		 sp.max_requests, sp.max_batch_tokens, sp.max_seqs,
		 (uint64_t)sp.prefix_cache_bytes, sp.placement_margin,
		 gpud_sched_sample_threads(sp.sample_threads),
		 sp.sample_threads ? "" : " (sample_threads 0: one per CPU)");
	return 0;
}

/* The loop thread's scratch: prompt ids, chat buffers, tokenizer arena,
 * the owner dump's buffer. */
static int loop_scratch_build(struct gpud_daemon *d, const struct sizing *z)
{
	char a[32];

	d->max_text = z->max_text;
	d->ids = malloc((size_t)d->n_ctx * sizeof(int32_t));
	d->segtok.fmt_cap = 2 * (size_t)z->max_text + 512;
	d->segtok.copy_cap = 2 * ((size_t)z->max_text + 1);
	d->fmt = malloc(d->segtok.fmt_cap);
	d->copy = malloc(d->segtok.copy_cap);
	d->dump_buf = malloc(DUMP_BUF);
	if (!d->ids || !d->fmt || !d->copy || !d->dump_buf ||
	    sw_arena_init(&d->tok_arena, z->tok_scratch) ||
	    sw_mem_prefault(d->ids, (size_t)d->n_ctx * sizeof(int32_t)) ||
	    sw_mem_prefault(d->fmt, d->segtok.fmt_cap) ||
	    sw_mem_prefault(d->copy, d->segtok.copy_cap) ||
	    sw_mem_prefault(d->dump_buf, DUMP_BUF) ||
	    sw_mem_prefault(d->tok_arena.base, d->tok_arena.cap)) {
		gpud_fmt_bytes(z->tok_scratch + d->segtok.fmt_cap + d->segtok.copy_cap, a,
			       sizeof(a));
		log_error("cannot reserve the request scratch (tokenizer arena and chat buffers, "
			  "%s): out of memory", a);
		return -ENOMEM;
	}
	d->segtok.fmt = d->fmt;
	d->segtok.copy = d->copy;
	d->segtok.arena = &d->tok_arena;
	gpud_fmt_bytes(z->tok_scratch, a, sizeof(a));
	log_info("loop: reserved tokenizer scratch %s, %u-token prompt buffer", a, d->n_ctx);
	return 0;
}

/* Builds every part after the plan, in this order. Returns 0 or logs why
 * not (what was built is freed by daemon_free). */
static int daemon_build(struct gpud_daemon *d, struct sizing *z)
{
	int rc;

	rc = watch_build(d);
	if (rc)
		return rc;
	rc = engines_build(d, z);
	if (rc)
		return rc;
	for (uint32_t i = 0; i < d->n_dev; i++) {
		rc = device_build(d, &d->dev[i], z);
		if (rc)
			return rc;
	}
	rc = gpud__plan_check(d, z);
	if (rc)
		return rc;
	rc = server_watch(d);
	if (rc)
		return rc;
	rc = sched_build(d);
	if (rc)
		return rc;
	return loop_scratch_build(d, z);
}

/* The server on d's loop, with the service ops. */
static int server_build(struct gpud_daemon *d)
{
	const typeof(d->cfg.gpud) *g = &d->cfg.gpud;
	struct gpud_server_params sp;
	char err[SW_ERR_MAX] = "", a[32], b[32];
	int rc;

	gpud_server_params_default(&sp);
	sp.socket_path = g->socket;
	sp.max_connections = g->max_connections;
	sp.max_requests = g->queue.global;
	sp.max_per_connection = g->queue.per_connection;
	sp.ring_bytes = g->ring_bytes;
	sp.req_bytes = g->request_bytes;
	sp.stage_bytes = g->stage_bytes;
	sp.priv_bytes = REQ_PRIV_BYTES;
	sp.stall_ms = g->stall_ms;
	proto_limits_default(&sp.limits);
	sp.limits.max_segments = g->max_segments;
	sp.limits.max_text_bytes = d->max_text;
	sp.socket_mode = g->socket_mode;
	if (g->socket_group[0]) {
		uint32_t gid;
		rc = sw_config_group_id(g->socket_group, &gid, err, sizeof(err));
		if (rc) {
			log_error("gpud.socket_group: %s", err);
			return rc;
		}
		sp.socket_gid = (gid_t)gid;
	}
	_Static_assert(GPUD_SERVER_MAX_IDS >= SW_CONFIG_MAX_IDS, "every configured id fits");
	sp.n_allowed_uids = g->allowed_uids.n;
	sp.n_allowed_gids = g->allowed_gids.n;
	memcpy(sp.allowed_uids, g->allowed_uids.id, g->allowed_uids.n * sizeof(uint32_t));
	memcpy(sp.allowed_gids, g->allowed_gids.id, g->allowed_gids.n * sizeof(uint32_t));
	rc = gpud_server_create(&d->server, &d->loop, &sp, &gpud__service_ops, d, err, sizeof(err));
	if (rc) {
		log_error("server: %s", err);
		return rc;
	}
	gpud_fmt_bytes(g->ring_bytes, a, sizeof(a));
	gpud_fmt_bytes(g->request_bytes, b, sizeof(b));
	log_info("server: %u connection slots (region per connection: %s ring + %s request "
		 "area, made at accept), %u request slots x (%zu + %" PRIu64 " staging + %zu) bytes",
		 sp.max_connections, a, b, sp.max_requests, sizeof(struct proto_submit),
		 (uint64_t)sp.stage_bytes, sp.priv_bytes);
	return 0;
}

/* The Prometheus endpoint on d's loop, when configured. */
static int metrics_build(struct gpud_daemon *d)
{
	const typeof(d->cfg.gpud) *g = &d->cfg.gpud;
	char err[SW_ERR_MAX] = "";
	int rc;

	if (!g->metrics[0])
		return 0;
	rc = gpud_metrics_create(&d->metrics, &d->loop, g->metrics, gpud__metrics_render, d, err,
				 sizeof(err));
	if (rc) {
		log_error("metrics: %s", err);
		return rc;
	}
	log_info("metrics: Prometheus text on %s (GET /metrics)", g->metrics);
	return 0;
}

/* --- start-up steps, in the order gpud_serve runs them ----------------------- */

/* What start-up learns before it reserves anything. */
struct start {
	double t0;                /* when gpud_serve began */
	char name[256];           /* the model's general.name */
	uint64_t params;          /* the model's parameters */
	const char *type;         /* its weight type (first layer's wq) */
	struct sizing z;          /* every pool's size */
	uint64_t kv_block_bytes;  /* one KV block, all layers */
};

/* The daemon before anything is loaded; NULL when out of memory. */
static struct gpud_daemon *daemon_new(const struct sw_config *cfg, double t0)
{
	struct gpud_daemon *d = calloc(1, sizeof(*d));

	if (!d)
		return NULL;
	d->cfg = *cfg;
	d->n_configured = cfg->gpud.n_devices;
	for (uint32_t i = 0; i < cfg->gpud.n_devices; i++)
		d->cfg.gpud.devices[i].pos = i;
	d->t_start = t0;
	d->dump_fd = -1;
	pthread_mutex_init(&d->watch_lock, NULL);
	return d;
}

/* The version, library versions and effective config (STYLE: logging). */
static void log_start(const struct sw_config *cfg)
{
	char *js;

	log_info("gpud %s starting (pid %d)", SW_VERSION, (int)getpid());
	log_info("libraries: libuv %s, jansson %s, glibc %s", uv_version_string(),
		 JANSSON_VERSION, gnu_get_libc_version());
	js = sw_config_to_json(cfg);
	log_info("config: %s", js ? js : "(out of memory)");
	free(js);
}

/* Opens the model and describes it into st. The error goes to out when
 * check_only, else to the log. */
static int model_open(struct gpud_daemon *d, struct start *st, bool check_only, FILE *out)
{
	char err[SW_ERR_MAX] = "";
	enum gpud_chat_template choice;
	int rc;

	/* gpud.chat_format: a bad name stops the start; a model whose format
	 * is unknown still serves plain requests, and chat ones get the
	 * error gpud_tokenizer_chat_resolve writes (daemon_segments.c). */
	if (gpud_chat_parse(d->cfg.gpud.chat_format, &choice) != 0) {
		if (check_only)
			fprintf(out, "gpud.chat_format: unknown format \"%s\" (%s)\n",
				d->cfg.gpud.chat_format, GPUD_CHAT_NAMES);
		else
			log_error("gpud.chat_format: unknown format \"%s\" (%s)",
				  d->cfg.gpud.chat_format, GPUD_CHAT_NAMES);
		return -EINVAL;
	}
	rc = gpud_model_load(&d->model, d->cfg.gpud.model, err, sizeof(err));
	if (rc) {
		if (check_only)
			fprintf(out, "gpud.model: %s\n", err);
		else
			log_error("gpud.model: %s", err);
		return rc;
	}
	d->tok = gpud_model_tokenizer(d->model);
	/* unknown: GPUD_CHAT_NONE, said in the start's model line */
	(void)gpud_tokenizer_chat_resolve(d->tok, choice, &d->tmpl, err, sizeof(err));
	model_desc(d->model, st->name, sizeof(st->name), &st->params, &st->type);
	return 0;
}

/* Sizes the pools and computes the memory plan into st and d->plan. A
 * device the plan fails on (not there, not answering, too little memory
 * of its own) is left out and the plan made again without it while
 * gpud.min_devices allows. The error (with its numbers) goes to out when
 * check_only, else to the log. */
static int plan_memory(struct gpud_daemon *d, struct start *st, bool check_only, FILE *out)
{
	char err[SW_ERR_MAX] = "";
	int rc, bad;

	for (;;) {
		gpud__size_pools(&d->cfg, d->model, &st->z);
		rc = gpud__make_plan(&d->cfg, d->model, &st->z, &d->plan, &st->kv_block_bytes,
				     &bad, err, sizeof(err));
		if (!rc || bad < 0 || !may_leave_out(d))
			break;
		cfg_leave_out(d, (uint32_t)bad, err);
		say_left_out(d, check_only, out);
	}
	if (rc) {
		if (check_only)
			fprintf(out, "%s\n", err);
		else
			log_error("%s", err);
		if (bad >= 0)
			say_too_few(d, 1, check_only, out);
	}
	return rc;
}

/* `gpud serve --check`'s report. */
static void print_check(const struct gpud_daemon *d, const struct start *st, FILE *out)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(d->model);

	fprintf(out, "configuration OK\n");
	fprintf(out, "model: %s (%s): %" PRIu64 " parameters, %s, %u layers, dim %u, "
		"n_ctx %u (using %u)\n", st->name, d->cfg.gpud.model, st->params, st->type,
		hp->n_layers, hp->dim, hp->n_ctx, st->z.n_ctx);
	fprintf(out, "chat format: %s\n", d->tmpl == GPUD_CHAT_NONE ?
		"none (chat requests are refused; choose one with --chat-format or "
		"gpud.chat_format)" : gpud_chat_name(d->tmpl));
	if (d->n_left)
		fprintf(out, "devices: %u of the %u configured start (gpud.min_devices %u; left "
			"out above)\n", d->cfg.gpud.n_devices, d->n_configured,
			d->cfg.gpud.min_devices);
	gpud__print_plan(out, &d->cfg, &st->z, &d->plan, st->kv_block_bytes,
			 gpud_model_weight_bytes(d->model));
}

/* The model and the plan, to the log. */
static void log_model_plan(const struct gpud_daemon *d, const struct start *st)
{
	const struct gpud_model_hparams *hp = gpud_model_hparams(d->model);

	log_info("model: %s (%s): %" PRIu64 " parameters, %s, %u layers, dim %u, heads "
		 "%u/%u, vocab %u, n_ctx %u (using %u), chat format %s", st->name,
		 d->cfg.gpud.model, st->params, st->type, hp->n_layers, hp->dim, hp->n_heads,
		 hp->n_kv_heads, hp->n_vocab, hp->n_ctx, st->z.n_ctx,
		 d->tmpl == GPUD_CHAT_NONE ? "none (chat requests refused)" :
		 gpud_chat_name(d->tmpl));
	gpud__log_plan(&d->cfg, &st->z, &d->plan, st->kv_block_bytes,
		       gpud_model_weight_bytes(d->model));
}

/* GPUD_TEST_LEAK: the planted leaks of the trough watchdog's tests
 * (tests/integration/gpud_watch_test.c), a comma-separated list of
 * "mask" (every finished request keeps its mask pinned) and "kv" (every
 * freed KV sequence keeps a hold on its last block), each optionally
 * ":N" for one in N instead of every one (so that the rest fill the
 * caches to their bounds and the leak must show behind them). An
 * environment variable, not a configuration key, so that no swarm.json,
 * SWARM_* override, systemd unit or `swarmctl start` can turn it on: only
 * a test that sets it for the daemon it spawns; and in the shipped
 * binary, so that the tests prove the watchdog of the binary that runs
 * (it costs a branch per finished request and per freed sequence). Unset
 * or empty: nothing. Anything else refuses to start. */
static int test_leaks_read(struct gpud_daemon *d)
{
	const char *v = getenv("GPUD_TEST_LEAK");

	while (v && *v) {
		size_t n = strcspn(v, ",");
		size_t w = strcspn(v, ",:");
		unsigned long every = 1;
		uint32_t *slot = NULL;

		if (w == 4 && !strncmp(v, "mask", 4))
			slot = &d->leak_masks;
		else if (w == 2 && !strncmp(v, "kv", 2))
			slot = &d->leak_kv;
		if (slot && w < n) { /* ":N" */
			char *end;

			every = strtoul(v + w + 1, &end, 10);
			if (end != v + n || v[w + 1] < '0' || v[w + 1] > '9' || every < 1 ||
			    every > 1000000)
				slot = NULL;
		}
		if (!slot && n) {
			log_error("GPUD_TEST_LEAK: unknown leak \"%.*s\" (expected mask, kv, "
				  "mask:N or kv:N, comma-separated)", (int)(n < 64 ? n : 64), v);
			return -EINVAL;
		}
		if (slot)
			*slot = (uint32_t)every;
		v += n + (v[n] == ',');
	}
	if (d->leak_masks)
		log_warn("GPUD_TEST_LEAK: leaking on purpose, for the watchdog's tests: one "
			 "finished request in %u keeps its mask pinned", d->leak_masks);
	if (d->leak_kv)
		log_warn("GPUD_TEST_LEAK: leaking on purpose, for the watchdog's tests: one freed "
			 "KV sequence in %u keeps its last block", d->leak_kv);
	return 0;
}

/* GPUD_TEST_FAIL_ENGINE=N: the engine of gpud.devices[N] (its configured
 * position) fails to build, as a GPU's does when its memory is gone, for
 * the tests of gpud.min_devices on machines without one (an environment
 * variable, like GPUD_TEST_LEAK, so that no configuration can set it).
 * Unset or empty: none. Anything but a position in the list refuses to
 * start. */
static int test_fail_read(struct gpud_daemon *d)
{
	const char *v = getenv("GPUD_TEST_FAIL_ENGINE");
	char *end;
	unsigned long n;

	d->test_fail_engine = -1;
	if (!v || !*v)
		return 0;
	n = strtoul(v, &end, 10);
	if (*end || v[0] < '0' || v[0] > '9' || n >= d->n_configured) {
		log_error("GPUD_TEST_FAIL_ENGINE: \"%.32s\" is not a position in gpud.devices "
			  "(0 to %u)", v, d->n_configured - 1);
		return -EINVAL;
	}
	d->test_fail_engine = (int)n;
	log_warn("GPUD_TEST_FAIL_ENGINE: the engine of gpud.devices[%lu] fails on purpose, for "
		 "the tests", n);
	return 0;
}

/* The planned figures onto d, and each device's name and lock. */
static void devices_init(struct gpud_daemon *d, const struct start *st)
{
	d->dim = gpud_model_hparams(d->model)->dim;
	d->n_ctx = st->z.n_ctx;
	d->n_dev = d->cfg.gpud.n_devices;
	d->block_tokens = d->cfg.gpud.kv_block_tokens;
	d->kv_block_bytes = st->kv_block_bytes;
	for (uint32_t i = 0; i < d->n_dev; i++) {
		d->dev[i].d = d;
		d->dev[i].idx = i;
		gpud__device_name(&d->cfg, i, d->dev[i].name, sizeof(d->dev[i].name));
		pthread_mutex_init(&d->dev[i].lock, NULL);
	}
}

/* The libuv loop the server, metrics, signals and timers live on. */
static int loop_init(struct gpud_daemon *d)
{
	int rc = uv_loop_init(&d->loop);

	if (rc) {
		log_error("libuv: %s", uv_strerror(rc));
		return rc;
	}
	d->loop_ok = true;
	return 0;
}

/* One thread per device (gpud__device_main). */
static int devices_start(struct gpud_daemon *d)
{
	for (uint32_t i = 0; i < d->n_dev; i++) {
		int rc = -pthread_create(&d->dev[i].thread, NULL, gpud__device_main, &d->dev[i]);

		if (rc) {
			log_error("%s: cannot start the device thread: %s", d->dev[i].name,
				  strerror(-rc));
			return rc;
		}
		d->dev[i].started = true;
	}
	return 0;
}

/* Warm-up prompts: a tiny one, then one long enough for the steps that run
 * without a graph past GPUD_CUDA_GRAPH_MAX_T tokens (the prefill matmuls and
 * tiled attention): the CUDA runtime allocates host memory on some first
 * launches (a 32-byte malloc inside cudaLaunchKernelExC, seen on an H200),
 * which must happen here, not on the first long prompt a client sends. */
#define WARMUP_LONG 96

/* Devices serving: not failed at warm-up and left out. */
static uint32_t n_serving(const struct gpud_daemon *d)
{
	uint32_t n = 0;

	for (uint32_t i = 0; i < d->n_dev; i++)
		n += !d->dev[i].left_out;
	return n;
}

/* dv failed during warm-up: left out when gpud.min_devices allows (it
 * stays in d->dev, fenced off by the scheduler since it failed: its
 * thread may be inside the device and its engine cannot be freed under
 * it), else the start fails. */
static int warm_failed(struct gpud_daemon *d, struct device *dv)
{
	uint32_t min = d->cfg.gpud.min_devices, serving = n_serving(d);
	struct left_out *l;

	if (!min || serving - 1 < min) {
		log_error("warm-up: %s failed: %s", dv->name, dv->fail_msg);
		say_too_few(d, 1, false, NULL);
		return SW_EDEVICE;
	}
	dv->left_out = true;
	dv->fail_seen = true; /* not the drain and exit of a device failing while serving */
	l = &d->left[d->n_left++];
	_Static_assert(sizeof(l->name) == sizeof(dv->name), "device names");
	memcpy(l->name, dv->name, sizeof(l->name));
	sw_config_device_name(&d->cfg.gpud.devices[dv->idx], l->device, sizeof(l->device));
	memcpy(l->why, "warm-up: ", 9);
	memccpy(l->why + 9, dv->fail_msg, '\0', sizeof(l->why) - 10);
	l->why[sizeof(l->why) - 1] = '\0';
	log_warn("%s (%s) left out, gpud starts without it (gpud.min_devices %u, %u device%s "
		 "left): %s", l->name, l->device, min, serving - 1, serving == 2 ? "" : "s",
		 l->why);
	return 0;
}

/* One request of n tokens per device (and with embed, one embedding of
 * them), through the real paths; waits for all of them but those of a
 * device that fails meanwhile (warm_failed). */
static int warm_round(struct gpud_daemon *d, const int32_t *tok, uint32_t n, bool embed)
{
	double t0 = now_s();
	char err[SW_ERR_MAX];
	bool waiting = true;

	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct device *dv = &d->dev[i];
		struct gpud_sched_req r = {
			.tokens = tok,
			.n_tokens = n,
			.max_tokens = 2,
			.cb = on_warmup_event,
			.arg = dv,
			.pin_device = true,
			.device = i,
		};
		struct embed_job *j;
		uint64_t id;
		uint32_t slot;
		int rc;

		if (dv->left_out)
			continue;
		atomic_store(&dv->warm_left, embed ? 2 : 1);
		gpud_sampler_params_default(&r.sampling);
		rc = gpud_sched_submit(d->sched, &r, &id, err, sizeof(err));
		if (rc && atomic_load(&dv->failed)) {
			atomic_store(&dv->warm_left, 0); /* refused: it failed already */
			continue;
		}
		if (rc) {
			log_error("%s: warm-up request: %s", dv->name, err);
			return rc;
		}
		if (!embed)
			continue;
		j = gpud__job_take(dv, &slot);
		if (!j)
			return -EBUSY;
		memcpy(j->tokens, tok, n * sizeof(*tok));
		j->n_tokens = n;
		gpud__job_queue(dv, j, NULL, true);
	}
	while (waiting) {
		struct timespec ts = { 0, 1000000 };
		int rc;

		waiting = false;
		for (uint32_t i = 0; i < d->n_dev; i++) {
			struct device *dv = &d->dev[i];

			if (dv->left_out)
				continue;
			if (atomic_load(&dv->failed)) {
				if ((rc = warm_failed(d, dv)))
					return rc;
				continue;
			}
			waiting |= atomic_load(&dv->warm_left) > 0;
		}
		if (waiting && now_s() - t0 > WARMUP_TIMEOUT_S) {
			log_error("warm-up did not finish in %d s", WARMUP_TIMEOUT_S);
			return -ETIMEDOUT;
		}
		if (waiting)
			nanosleep(&ts, NULL);
	}
	return 0;
}

/* A tiny request and an embedding per device, then a long request. */
static int warm_up(struct gpud_daemon *d)
{
	int32_t tok[WARMUP_LONG];
	uint32_t n_long = WARMUP_LONG;
	double t0 = now_s();
	int rc;

	tok[0] = gpud_tokenizer_bos(d->tok);
	if (tok[0] < 0)
		tok[0] = 1;
	for (uint32_t i = 1; i < WARMUP_LONG; i++)
		tok[i] = 1;
	if ((rc = warm_round(d, tok, 2, true)))
		return rc;
	if (d->n_ctx < n_long + 2) /* room for the tokens it generates */
		n_long = d->n_ctx > 4 ? d->n_ctx - 2 : 0;
	if (n_long > 2 && (rc = warm_round(d, tok, n_long, false)))
		return rc;
	log_info("warm-up done in %.1f ms (per device: a 2-token request and embedding, "
		 "a %u-token request)", (now_s() - t0) * 1e3, n_long > 2 ? n_long : 0);
	return 0;
}

/* The signal handlers and the loop's timers (daemon_signal.c). */
static void signals_start(struct gpud_daemon *d)
{
	uv_signal_init(&d->loop, &d->sig_term);
	uv_signal_init(&d->loop, &d->sig_int);
	uv_signal_init(&d->loop, &d->sig_usr1);
	uv_timer_init(&d->loop, &d->poll_timer);
	uv_timer_init(&d->loop, &d->deadline_timer);
	uv_timer_init(&d->loop, &d->sample_timer);
	d->sig_term.data = d->sig_int.data = d->sig_usr1.data = d;
	d->poll_timer.data = d->deadline_timer.data = d->sample_timer.data = d;
	d->handles_ok = true;
	uv_signal_start(&d->sig_term, gpud__on_signal, SIGTERM);
	uv_signal_start(&d->sig_int, gpud__on_signal, SIGINT);
	uv_signal_start(&d->sig_usr1, gpud__on_signal, SIGUSR1);
}

/* Opens the socket; from here on the allocation counters say "since
 * warm-up". */
static int server_listen(struct gpud_daemon *d, double t0)
{
	char err[SW_ERR_MAX] = "";
	int rc;

	rc = gpud_server_listen(d->server, err, sizeof(err));
	if (rc) {
		log_error("server: %s", err);
		return rc;
	}
	d->last_rate_t = now_s();
	uv_timer_start(&d->sample_timer, gpud__on_sample, IDLE_WAIT_MS, IDLE_WAIT_MS);
	gpud_alloc_traces_arm(); /* an allocation by gpud's threads from now on keeps its stack */
	gpud_alloc_warmup_done();
	if (d->n_left)
		log_warn("listening on %s (%u of the %u configured devices; %u left out: STATS "
			 "left_out) after %.2f s of start-up", d->cfg.gpud.socket, n_serving(d),
			 d->n_configured, d->n_left, now_s() - t0);
	else
		log_info("listening on %s (%u device%s) after %.2f s of start-up",
			 d->cfg.gpud.socket, d->n_dev, d->n_dev == 1 ? "" : "s", now_s() - t0);
	return 0;
}

/* What reserving every pool made resident, and how long it took: the RSS
 * from here on stays near this (DESIGN §2); the weights count only as far
 * as they are read (file-backed, shared, not prefaulted). */
static void log_reserved(double t_build)
{
	struct sw_mem_rss r;
	char a[32], b[32], c[32];

	if (sw_mem_rss(0, &r) != 0)
		return;
	gpud_fmt_bytes(r.rss, a, sizeof(a));
	gpud_fmt_bytes(r.anon, b, sizeof(b));
	gpud_fmt_bytes(r.file, c, sizeof(c));
	log_info("memory: %s resident after reserving every pool (%s private, %s file-backed); "
		 "pools backed at once (%s) in %.2f s", a, b, c,
		 sw_mem_method_name(sw_mem_prefault_method()), now_s() - t_build);
}

/* Serves until the signal handlers close every handle. */
static void loop_run(struct gpud_daemon *d)
{
	gpud_alloc_set_role(GPUD_ALLOC_LOOP);
	uv_run(&d->loop, UV_RUN_DEFAULT);
	gpud_alloc_set_role(GPUD_ALLOC_OTHER);
}

/* The totals, and the allocations the request path made (must be 0). */
static void log_stopped(struct gpud_daemon *d)
{
	struct gpud_alloc_counts c;

	gpud_alloc_since_warmup(&c);
	log_info("stopped: %" PRIu64 " requests completed, %" PRIu64 " errors, %" PRIu64
		 " cancelled; host allocations since warm-up: loop %" PRIu64 ", device %"
		 PRIu64 ", other %" PRIu64 " (threads libraries started for themselves: %"
		 PRIu64 ")%s", (uint64_t)atomic_load(&d->completed) + atomic_load(&d->embeds),
		 (uint64_t)atomic_load(&d->errors), (uint64_t)atomic_load(&d->cancelled),
		 c.host_allocs[GPUD_ALLOC_LOOP], c.host_allocs[GPUD_ALLOC_DEVICE],
		 c.host_allocs[GPUD_ALLOC_OTHER], c.host_allocs[GPUD_ALLOC_FOREIGN],
		 gpud_alloc_hooked() ? "" : " (not counted in this build)");
	if (gpud_alloc_own_host(&c)) {
		log_warn("gpud's threads allocated after warm-up; the stacks of the first %d:",
			 GPUD_ALLOC_TRACES);
		gpud_alloc_traces_write(sw_log_fd());
	}
}

int gpud_serve(const struct sw_config *cfg, bool check_only, FILE *out)
{
	struct gpud_daemon *d;
	struct start st = { .t0 = now_s() };
	double t_build;
	int rc;

	d = daemon_new(cfg, st.t0);
	if (!d) {
		fprintf(out, "gpud: out of memory\n");
		return 1;
	}
	if (!check_only)
		log_start(cfg);
	rc = model_open(d, &st, check_only, out);
	if (rc)
		goto out_fail;
	rc = plan_memory(d, &st, check_only, out);
	if (rc)
		goto out_fail;
	if (check_only) {
		print_check(d, &st, out);
		daemon_free(d);
		return 0;
	}
	log_model_plan(d, &st);
	rc = test_leaks_read(d);
	if (rc)
		goto out_fail;
	rc = test_fail_read(d);
	if (rc)
		goto out_fail;

	devices_init(d, &st);
	t_build = now_s();
	rc = daemon_build(d, &st.z);
	if (rc)
		goto out_fail;
	rc = loop_init(d);
	if (rc)
		goto out_fail;
	rc = server_build(d);
	if (rc)
		goto out_fail;
	log_reserved(t_build);
	rc = metrics_build(d);
	if (rc)
		goto out_fail;
	rc = devices_start(d);
	if (rc)
		goto out_fail;
	rc = gpud__step_watch_start(d);
	if (rc)
		goto out_fail;
	rc = warm_up(d);
	if (rc)
		goto out_fail;
	signals_start(d);
	rc = server_listen(d, st.t0);
	if (rc)
		goto out_fail;

	loop_run(d);
	log_stopped(d);
	rc = d->exit_status;
	exit_if_hung(d, rc);
	daemon_free(d);
	if (rc)
		log_info("gpud exits with status %d (a device failed)", rc);
	else
		log_info("gpud exits");
	return rc;

out_fail:
	if (d->loop_ok && !d->finishing) {
		gpud__finish(d);
		uv_run(&d->loop, UV_RUN_DEFAULT);
	}
	rc = d->n_dev && gpud__all_failed(d) ? GPUD_EXIT_DEVICE : 1;
	exit_if_hung(d, GPUD_EXIT_DEVICE);
	daemon_free(d);
	return rc;
}
