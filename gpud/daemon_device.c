/* daemon_device.c - the device threads of `gpud serve` and their
 * embedding queues (daemon_impl.h).
 *
 * A device thread steps the scheduler on its device, runs the embeddings
 * queued on it (inside gpud_sched_device_exec, so the engine is its own),
 * samples its pools for the watchdog, and sleeps when idle. The loop
 * thread fills embedding job slots and queues them here.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/log.h"
#include "gpud/alloc.h"
#include "gpud/daemon_impl.h"
#include "gpud/engine.h"
#include "gpud/maskcache.h"
#include "gpud/memwatch.h"
#include "gpud/scheduler.h"
#include "gpud/server.h"

/* --- the device thread ------------------------------------------------------ */

static int embed_fn(struct gpud_engine *e, void *arg)
{
	struct embed_job *j = arg;

	return gpud_engine_embed_tokens(e, j->tokens, j->n_tokens, j->out, j->err, sizeof(j->err));
}

/* Runs every queued embedding of dv, oldest first. Returns how many ran. */
static int run_jobs(struct device *dv)
{
	struct gpud_daemon *d = dv->d;
	int ran = 0;

	for (;;) {
		struct embed_job *j = NULL;
		struct gpud_sreq *r;
		bool cancelled, warmup;
		int rc;

		pthread_mutex_lock(&dv->lock);
		for (uint32_t i = 0; i < EMBED_SLOTS; i++) {
			struct embed_job *c = &dv->jobs[i];
			if (c->queued && !c->running && (!j || c->seq < j->seq))
				j = c;
		}
		if (j)
			j->running = true;
		pthread_mutex_unlock(&dv->lock);
		if (!j)
			return ran;

		j->err[0] = '\0';
		if (atomic_load(&dv->failed)) {
			/* fail_msg is written before failed is set */
			rc = sw_seterr(j->err, sizeof(j->err), SW_EDEVICE, "%s", dv->fail_msg);
		} else {
			/* The pool may be full of prefix-cache blocks: make room first. */
			rc = gpud_sched_device_exec_blocks(d->sched, dv->idx,
							   (j->n_tokens + d->block_tokens - 1) /
							   d->block_tokens, embed_fn, j);
			if (rc == SW_EDEVICE)
				gpud__device_fail(dv, j->err[0] ? j->err : sw_strerror(rc), false);
		}
		pthread_mutex_lock(&dv->lock);
		r = j->r;
		j->r = NULL; /* its answer is this thread's now: not a cancel's or a failure's */
		cancelled = j->cancelled;
		warmup = j->warmup;
		pthread_mutex_unlock(&dv->lock);
		if (warmup) {
			if (rc)
				log_error("%s: warm-up embedding: %s", dv->name,
					  j->err[0] ? j->err : sw_strerror(rc));
			atomic_fetch_sub(&dv->warm_left, 1);
		} else if (!r) {
			/* gpud__device_fail answered it */
		} else if (cancelled) {
			atomic_fetch_add(&d->cancelled, 1);
			gpud_sreq_error(r, SW_ECANCELED, atomic_load(&d->draining) ?
					"cancelled: gpud is shutting down" : "cancelled");
		} else if (rc) {
			atomic_fetch_add(&d->errors, 1);
			gpud_sreq_error(r, rc, j->err[0] ? j->err : sw_strerror(rc));
		} else {
			atomic_fetch_add(&d->embeds, 1);
			gpud_sreq_embedding(r, j->out, d->dim);
		}
		pthread_mutex_lock(&dv->lock);
		j->busy = j->queued = j->running = j->cancelled = j->warmup = false;
		dv->n_jobs--;
		dv->embeds++;
		pthread_mutex_unlock(&dv->lock);
		ran++;
	}
}

/* Inside gpud_sched_device_exec: the engine is ours, its numbers steady,
 * and so is the device's prefix cache (the scheduler changes it only
 * while the device is not busy). What the watchdog watches is what live
 * requests hold; what the caches keep goes beside it:
 *   KV:    live = used - blocks of prefix entries no sequence uses and
 *          blocks of the chunk-KV cache (only the caches keep those; a hold leaked on one shows once the
 *          cache evicts it, which a full cache keeps doing);
 *   masks: live = slots of pinned masks, cached = the unpinned ones.
 * O(1) and no allocation: this runs after every step. */
static int sample_fn(struct gpud_engine *e, void *arg)
{
	struct device *dv = arg;
	struct gpud_daemon *d = dv->d;
	struct gpud_engine_stats st;
	struct gpud_sched_device_stats ds;
	struct gpud_maskcache_counts mc;
	uint32_t kv_cached;
	uint64_t t = now_ms();

	gpud_engine_stats(e, &st);
	gpud_sched_device_stats(d->sched, dv->idx, &ds);
	kv_cached = ds.prefix_unreferenced + st.chunk.blocks;
	kv_cached = kv_cached <= st.kv.used ? kv_cached : st.kv.used;
#ifdef SW_DEBUG
	/* O(1) per-step accounting check (DESIGN §2); the full check is
	 * gpud_engine_check / gpud_maskcache_check. */
	if (st.kv.used + st.kv.free != st.kv.n_blocks ||
	    ds.prefix_unreferenced > st.kv.used) {
		log_error("%s: KV pool accounting broken: used %u + free %u != %u, or %u "
			  "blocks cached unused", dv->name, st.kv.used, st.kv.free,
			  st.kv.n_blocks, ds.prefix_unreferenced);
		abort();
	}
#endif
	pthread_mutex_lock(&dv->lock);
	gpud_maskcache_counts(dv->masks, &mc);
#ifdef SW_DEBUG
	if (mc.pool_used != mc.entries || mc.pinned > mc.entries ||
	    mc.pool_used >= mc.pool_capacity) {
		log_error("%s: mask pool accounting broken: %u slots used, %u masks cached, %u "
			  "pinned, %u slots", dv->name, mc.pool_used, mc.entries, mc.pinned,
			  mc.pool_capacity);
		abort();
	}
#endif
	dv->est = st;
	dv->kv_live = st.kv.used - kv_cached;
	dv->kv_cached = kv_cached;
	if (mc.pool_used > dv->mask_high)
		dv->mask_high = mc.pool_used;
	pthread_mutex_unlock(&dv->lock);
	pthread_mutex_lock(&d->watch_lock);
	gpud_memwatch_sample_split(d->watch, dv->wd_kv, t, st.kv.used - kv_cached, kv_cached);
	gpud_memwatch_sample_split(d->watch, dv->wd_mask, t, mc.pinned, mc.entries - mc.pinned);
	pthread_mutex_unlock(&d->watch_lock);
	return 0;
}

void *gpud__device_main(void *arg)
{
	struct device *dv = arg;
	struct gpud_daemon *d = dv->d;
	double last_err = 0, last_sample = 0;
	char err[SW_ERR_MAX];

	gpud_alloc_set_role(GPUD_ALLOC_DEVICE);
	while (!atomic_load(&d->stopping)) {
		int n, jobs;
		double t;

		atomic_store(&dv->busy_since, now_ms());
		n = gpud_sched_step(d->sched, dv->idx, err, sizeof(err));
		if (n == SW_EDEVICE)
			gpud__device_fail(dv, err[0] ? err : sw_strerror(n), false);
		jobs = run_jobs(dv);
		t = now_s();
		if (n < 0) {
			dv->step_errors++;
			if (t - last_err > 1.0) { /* one line a second at most */
				log_error("%s: step failed: %s (%" PRIu64 " failures so far)", dv->name,
					  err[0] ? err : sw_strerror(n), dv->step_errors);
				last_err = t;
			}
		}
		/* Every step while busy (the debug check is per step), and at
		 * least every idle wait so the watchdog sees the quiet times. */
		if (n > 0 || jobs > 0 || t - last_sample >= IDLE_WAIT_MS / 1000.0) {
			gpud_sched_device_exec(d->sched, dv->idx, sample_fn, dv);
			last_sample = t;
		}
		atomic_store(&dv->busy_since, 0);
		if (n <= 0 && jobs == 0)
			gpud_sched_wait(d->sched, dv->idx, IDLE_WAIT_MS);
	}
	return NULL;
}

/* --- failure: a device that faults or hangs --------------------------------- */

void gpud__device_fail(struct device *dv, const char *msg, bool hung)
{
	struct gpud_daemon *d = dv->d;
	struct gpud_sreq *ans[EMBED_SLOTS];
	uint32_t n = 0;

	pthread_mutex_lock(&dv->lock);
	if (!atomic_load(&dv->failed)) {
		snprintf(dv->fail_msg, sizeof(dv->fail_msg), "%s", msg);
		dv->hung = hung;
		atomic_store(&dv->failed, true);
	}
	/* Queued and running embeddings are answered here, cancelled ones
	 * too: a running one may never come back. Taking r makes the answer
	 * ours (run_jobs, svc_cancel); the slots stay taken until the device
	 * thread frees them. */
	for (uint32_t i = 0; i < EMBED_SLOTS; i++) {
		struct embed_job *j = &dv->jobs[i];

		if (j->r) {
			ans[n++] = j->r;
			j->r = NULL;
		}
	}
	pthread_mutex_unlock(&dv->lock);
	gpud_sched_fail_device(d->sched, dv->idx, SW_EDEVICE, dv->fail_msg);
	for (uint32_t i = 0; i < n; i++) {
		atomic_fetch_add(&d->errors, 1);
		gpud_sreq_error(ans[i], SW_EDEVICE, dv->fail_msg);
	}
}

bool gpud__all_failed(struct gpud_daemon *d)
{
	for (uint32_t i = 0; i < d->n_dev; i++)
		if (!atomic_load(&d->dev[i].failed))
			return false;
	return true;
}

/* The step watchdog: a GPU whose thread has been in one round of work (a
 * step, its embeddings, its pool sample) past step_timeout_ms is hung: a
 * kernel that never ends, a device that stopped answering. Its own
 * thread, so that nothing it waits on (the loop, a lock) can hold it.
 * CPU devices are not watched: a step of theirs takes what the machine's
 * cores make of max_batch_tokens (minutes for a long prefill of a large
 * model on a few cores), and nothing on them hangs the way a GPU does. */
static void *step_watch_main(void *arg)
{
	struct gpud_daemon *d = arg;
	const uint64_t limit = d->cfg.gpud.step_timeout_ms;
	const struct timespec nap = { 0, STEP_WATCH_MS * 1000000L };

	gpud_alloc_set_role(GPUD_ALLOC_DEVICE);
	while (!atomic_load(&d->stopping)) {
		uint64_t now = now_ms();

		for (uint32_t i = 0; i < d->n_dev; i++) {
			struct device *dv = &d->dev[i];
			uint64_t since = atomic_load(&dv->busy_since);
			char msg[SW_ERR_MAX];

			if (d->cfg.gpud.devices[i].kind != SW_DEVICE_CUDA || !since ||
			    now < since + limit || atomic_load(&dv->failed))
				continue;
			snprintf(msg, sizeof(msg), "%s: hung: one step has run for %" PRIu64 " ms, "
				 "past gpud.step_timeout_ms (%" PRIu64 ")", dv->name, now - since,
				 limit);
			gpud__device_fail(dv, msg, true);
		}
		nanosleep(&nap, NULL);
	}
	return NULL;
}

int gpud__step_watch_start(struct gpud_daemon *d)
{
	int rc;

	if (!d->cfg.gpud.step_timeout_ms)
		return 0;
	rc = -pthread_create(&d->step_watch, NULL, step_watch_main, d);
	if (rc) {
		log_error("cannot start the step watchdog's thread: %s", strerror(-rc));
		return rc;
	}
	d->step_watch_started = true;
	return 0;
}

void gpud__check_failures(struct gpud_daemon *d)
{
	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct device *dv = &d->dev[i];

		if (dv->fail_seen || !atomic_load(&dv->failed))
			continue;
		dv->fail_seen = true;
		d->exit_status = GPUD_EXIT_DEVICE;
		log_error("%s failed: %s; its requests ended with SW_EDEVICE, %s, and gpud "
			  "exits with status %d for its supervisor to restart it", dv->name,
			  dv->fail_msg,
			  gpud__all_failed(d) ? "no device is left" : "the other devices drain",
			  GPUD_EXIT_DEVICE);
		gpud__drain(d, "a device failed");
	}
}

/* --- embedding job slots (loop thread) ------------------------------------- */

/* The device with a free embed slot and the shortest queue; -1 if none. */
int gpud__embed_device(struct gpud_daemon *d)
{
	int best = -1;
	uint64_t best_load = UINT64_MAX;

	for (uint32_t i = 0; i < d->n_dev; i++) {
		struct device *dv = &d->dev[i];
		uint64_t load;
		uint32_t nj;

		if (atomic_load(&dv->failed))
			continue;
		pthread_mutex_lock(&dv->lock);
		nj = dv->n_jobs;
		pthread_mutex_unlock(&dv->lock);
		if (nj >= EMBED_SLOTS)
			continue;
		load = (uint64_t)gpud_sched_queue_depth(d->sched, i) + nj;
		if (load < best_load) {
			best_load = load;
			best = (int)i;
		}
	}
	return best;
}

/* Takes a free job slot of dv (busy, not queued); NULL when full. */
struct embed_job *gpud__job_take(struct device *dv, uint32_t *slot)
{
	struct embed_job *j = NULL;

	pthread_mutex_lock(&dv->lock);
	for (uint32_t i = 0; i < EMBED_SLOTS; i++) {
		if (!dv->jobs[i].busy) {
			j = &dv->jobs[i];
			j->busy = true;
			dv->n_jobs++;
			*slot = i;
			break;
		}
	}
	pthread_mutex_unlock(&dv->lock);
	return j;
}

void gpud__job_queue(struct device *dv, struct embed_job *j, struct gpud_sreq *r, bool warmup)
{
	pthread_mutex_lock(&dv->lock);
	j->r = r;
	j->warmup = warmup;
	j->queued = true;
	j->seq = ++dv->job_seq;
	pthread_mutex_unlock(&dv->lock);
	gpud_sched_wake(dv->d->sched);
}

void gpud__job_drop(struct device *dv, struct embed_job *j)
{
	pthread_mutex_lock(&dv->lock);
	j->r = NULL;
	j->busy = j->queued = j->running = j->cancelled = j->warmup = false;
	dv->n_jobs--;
	pthread_mutex_unlock(&dv->lock);
}
