/* worker.c - the agentd worker loop: claim -> run -> commit -> event ->
 * acknowledge (and delete), with reconnects, heartbeats, callbacks and
 * drain. */
#include "agentd/worker.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>
#include <hiredis/hiredis.h>
#include <jansson.h>

#include "agentd/db.h"
#include "agentd/fetch.h"
#include "agentd/queue.h"
#include "agentd/sql_dir.h"
#include "agentd/tasks/tasks.h"
#include "common/config.h"
#include "common/err.h"
#include "common/log.h"
#include "common/privdrop.h"
#include "common/secret.h"
#include "common/time.h"
#include "proto/task.h"
#include "sw_config.h"

#define CALLBACK_QUEUE 64
#define CALLBACK_TRIES 3
#define CALLBACK_DRAIN_MS 5000

/* Set by the signal handler and agent_worker_stop, read by the main loop
 * and the heartbeat thread: an atomic (lock-free, so a signal handler may
 * store it), not a volatile sig_atomic_t, which no other thread may read. */
static atomic_int stop_requested;

void agent_worker_stop(void)
{
	stop_requested = 1;
}

void agent_worker_reset(void)
{
	stop_requested = 0;
}

static void on_signal(int sig)
{
	stop_requested = 1;
}

/* --- callbacks: POSTs of completion events, off the main loop ------------- */

struct callback {
	char *url;
	char *json;
};

struct callbacks {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct callback q[CALLBACK_QUEUE];
	unsigned head, n;
	bool closing;
	uint64_t deadline_ms;      /* when closing: drop what is left after this */
	bool started;
	const struct agent_fetch_policy *policy; /* what a callback may reach */
};

/* url without its password, in buf: what a log line may show. */
static const char *shown_url(const char *url, char *buf, size_t len)
{
	sw_config_redact_url(url, buf, len);
	return buf;
}

static void *callback_thread(void *arg)
{
	struct callbacks *cb = arg;
	char err[SW_ERR_MAX], shown[512];

	pthread_mutex_lock(&cb->lock);
	for (;;) {
		struct callback c;
		uint64_t delay = 500;
		int rc = 0;

		while (cb->n == 0 && !cb->closing)
			pthread_cond_wait(&cb->cond, &cb->lock);
		if (cb->n == 0)
			break;
		c = cb->q[cb->head];
		cb->head = (cb->head + 1) % CALLBACK_QUEUE;
		cb->n--;
		if (cb->closing && sw_now_ms() > cb->deadline_ms) {
			pthread_mutex_unlock(&cb->lock);
			log_warn("callback %s dropped: drain deadline passed",
				 shown_url(c.url, shown, sizeof(shown)));
			free(c.url);
			free(c.json);
			pthread_mutex_lock(&cb->lock);
			continue;
		}
		pthread_mutex_unlock(&cb->lock);
		for (int i = 0; i < CALLBACK_TRIES; i++) {
			struct agent_fetch_opts o = { .timeout_ms = 5000, .connect_timeout_ms = 2000,
						      .no_redirects = true, .policy = cb->policy };

			rc = agent_fetch_post_json(c.url, c.json, strlen(c.json), &o, err, sizeof(err));
			if (rc == 0 || agent_error_permanent(rc))
				break;
			if (i + 1 < CALLBACK_TRIES)
				sw_sleep_ms(delay);
			delay *= 2;
		}
		if (rc)
			log_warn("callback %s failed: %s", shown_url(c.url, shown, sizeof(shown)), err);
		free(c.url);
		free(c.json);
		pthread_mutex_lock(&cb->lock);
	}
	pthread_mutex_unlock(&cb->lock);
	return NULL;
}

/* Queues a POST; a full queue drops it with a warning (never blocks). */
static void callback_post(struct callbacks *cb, const char *url, const char *task_id,
			  const char *status, const char *location, int64_t document_id,
			  const char *error)
{
	json_t *o;
	char *json;

	if (!url || !cb->started)
		return;
	o = json_pack("{s:s, s:s, s:s, s:s, s:o}", "task_id", task_id, "status", status,
		      "location", location ? location : "", "error", error ? error : "",
		      "document_id", document_id > 0 ? json_integer(document_id) : json_null());
	json = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	pthread_mutex_lock(&cb->lock);
	if (!json || cb->n == CALLBACK_QUEUE) {
		pthread_mutex_unlock(&cb->lock);
		char shown[512];

		log_warn("task %s: callback to %s dropped (%s)", task_id,
			 shown_url(url, shown, sizeof(shown)),
			 json ? "queue full" : "out of memory");
		free(json);
		return;
	}
	cb->q[(cb->head + cb->n) % CALLBACK_QUEUE] = (struct callback){ strdup(url), json };
	cb->n++;
	pthread_cond_signal(&cb->cond);
	pthread_mutex_unlock(&cb->lock);
}

/* --- the worker ------------------------------------------------------------ */

struct worker {
	const struct agent_worker_opts *o;
	const struct sw_config *cfg;
	struct agent_worker_stats st;
	struct agent_db *db;
	struct agent_queue *q;
	struct agent_gpud *gpud;
	const struct agent_llm *llm;
	struct agent_ctx ctx;
	struct callbacks cb;
	struct agent_fetch_policy fetch_policy; /* agentd.fetch: URLs and callbacks */

	/* shared with the heartbeat thread */
	pthread_mutex_t lock;
	char entry[64];              /* entry in hand, "" when idle */
	_Atomic uint64_t progress_ms; /* last sign of life of the main loop */
	_Atomic uint64_t done;
	pthread_t hb;
	bool hb_started;
	_Atomic bool hb_stop;
	struct agent_queue_opts qo;

	/* outage bookkeeping: log once per episode */
	bool in_outage;
	uint64_t outage_since_ms;
	uint32_t backoff_ms;
};

static void mark_progress(void *arg)
{
	struct worker *w = arg;

	atomic_store(&w->progress_ms, sw_now_ms());
}

static void set_entry(struct worker *w, const char *id)
{
	pthread_mutex_lock(&w->lock);
	snprintf(w->entry, sizeof(w->entry), "%s", id ? id : "");
	pthread_mutex_unlock(&w->lock);
	mark_progress(w);
}

/* The heartbeat thread's own Redis connection, which keeps the lease of
 * the entry in hand. */
struct lease {
	struct agent_queue *q;   /* opened on first use */
	bool failing;            /* the last refresh failed: already reported */
};

/* Reports a failed lease refresh: a warning when it starts failing, then
 * debug lines until a refresh succeeds again. */
static void lease_failed(struct lease *l, const char *entry, const char *why)
{
	if (l->failing)
		log_debug("lease refresh of entry %s: %s", entry, why);
	else
		log_warn("lease refresh of entry %s: %s (retried every heartbeat)", entry, why);
	l->failing = true;
}

/* Resets the idle time of entry so that no other worker reclaims it. */
static void refresh_lease(struct worker *w, struct lease *l, const char *entry)
{
	char err[SW_ERR_MAX];
	int rc;

	if (!l->q) {
		rc = agent_queue_open(&l->q, &w->qo, err, sizeof(err));
		if (rc) {
			lease_failed(l, entry, err);
			return;
		}
	}
	rc = agent_queue_touch(l->q, entry, err, sizeof(err));
	switch (rc) {
	case 0:
		l->failing = false;
		break;
	case SW_ENOTFOUND: /* another worker reclaimed it */
		log_warn("%s", err);
		break;
	case SW_ECLOSED: /* an outage, which the main loop reports */
		if (agent_queue_reconnect(l->q, err, sizeof(err)) != 0)
			log_debug("lease refresh: %s", err);
		break;
	default:
		lease_failed(l, entry, err);
	}
}

/* Writes one heartbeat line; a full pipe drops it. */
static void beat(struct worker *w, const char *entry)
{
	char line[160];
	int n = snprintf(line, sizeof(line), "hb %d %s %" PRIu64 " %s\n", (int)getpid(),
			 stop_requested ? "drain" : entry[0] ? "busy" : "idle",
			 atomic_load(&w->done), entry[0] ? entry : "-");

	if (write(w->o->heartbeat_fd, line, (size_t)n) == n)
		w->st.heartbeats++;
}

static void *heartbeat_thread(void *arg)
{
	struct worker *w = arg;
	struct lease lease = { 0 };
	const uint32_t period = w->cfg->agentd.heartbeat_ms;
	const uint32_t lease_ms = w->cfg->agentd.lease_ms;
	char entry[64];

	while (!atomic_load(&w->hb_stop)) {
		uint64_t now = sw_now_ms(), last = atomic_load(&w->progress_ms);
		bool hung;

		pthread_mutex_lock(&w->lock);
		snprintf(entry, sizeof(entry), "%s", w->entry);
		pthread_mutex_unlock(&w->lock);
		hung = entry[0] && now - last > lease_ms;
		if (!hung) {
			if (w->o->heartbeat_fd >= 0)
				beat(w, entry);
			if (entry[0])
				refresh_lease(w, &lease, entry);
		}
		for (uint32_t slept = 0; slept < period && !atomic_load(&w->hb_stop); slept += 50)
			sw_sleep_ms(50);
	}
	agent_queue_close(lease.q);
	return NULL;
}

/* Sleeps for the current backoff (in slices, so a stop is seen) and
 * doubles it. */
static void backoff(struct worker *w)
{
	uint32_t ms = w->backoff_ms ? w->backoff_ms : AGENT_RECONNECT_MIN_MS;

	/* Waiting out an outage is not a hang: keep the heartbeat going (a
	 * restart would not bring the server back), also when the backoff
	 * is longer than the lease. */
	for (uint32_t t = 0; t < ms && !stop_requested; t += 50) {
		mark_progress(w);
		sw_sleep_ms(50);
	}
	w->backoff_ms = ms * 2 > AGENT_RECONNECT_MAX_MS ? AGENT_RECONNECT_MAX_MS : ms * 2;
}

static void outage_begin(struct worker *w, const char *what)
{
	if (w->in_outage)
		return;
	w->in_outage = true;
	w->outage_since_ms = sw_now_ms();
	w->st.outages++;
	log_warn("%s; reconnecting with backoff (%d..%d ms), the task in hand is kept", what,
		 AGENT_RECONNECT_MIN_MS, AGENT_RECONNECT_MAX_MS);
}

static void outage_end(struct worker *w)
{
	if (!w->in_outage)
		return;
	w->in_outage = false;
	w->backoff_ms = 0;
	log_info("servers reachable again after %" PRIu64 " ms", sw_now_ms() - w->outage_since_ms);
}

/* Reconnects whatever is down (gpud only when the work in hand may need
 * it). 0 when everything answers. */
static int reconnect_all(struct worker *w, bool gpud, char *err, size_t errlen)
{
	int rc;

	rc = agent_db_reconnect(w->db, err, errlen);
	if (rc == 0)
		rc = agent_queue_reconnect(w->q, err, errlen);
	if (rc == 0 && gpud && w->gpud)
		rc = agent_gpud_connect(w->gpud, err, errlen);
	return rc;
}

/* What a task whose outcome is committed in PostgreSQL still owes:
 * the move to swarm:dead, the event on swarm:results, the
 * acknowledgement that deletes its entry, the callback. Kept across an
 * outage so that the retry does only what is left (and does not count
 * another delivery in PostgreSQL). */
struct outcome {
	bool set;                          /* committed; deliver() owes the rest */
	enum agent_task_status status;
	bool dead_letter;                  /* status dead: move the entry to swarm:dead */
	char id[PROTO_TASK_MAX_ID + 80];
	char location[AGENT_LOCATION_MAX];
	int64_t doc;                       /* the document it stored or read; 0 = none */
	char error[SW_ERR_MAX + 64];       /* "" = none */
	const char *callback_url;          /* the task's (lives as long as it), or NULL */
	bool acked, announced;             /* steps done */
	uint32_t tries;                    /* deliver() calls so far */
};

/* Delivers what o owes, in this order: a dead task's entry moves to
 * swarm:dead (one transaction that also deletes the original); the event
 * goes to swarm:results; the entry is acknowledged and deleted; the
 * callback is queued. Event before acknowledgement, so that a crash
 * between them repeats the event (at least once) instead of losing it.
 * When Redis refuses the event for lack of memory the entry is
 * acknowledged anyway, which frees its memory (PostgreSQL has the
 * outcome), and the event waits for the retry. Returns 0, or the
 * (outage) code of the step that failed, with its message in err. */
static int deliver(struct worker *w, const struct agent_msg *m, struct outcome *o, char *err)
{
	const char *status = agent_task_status_name(o->status);
	const char *error = o->error[0] ? o->error : NULL;
	int rc;

	if (o->dead_letter && !o->acked) {
		/* After a lost reply the transaction may have happened: then
		 * the entry is no longer ours, and doing it again would make
		 * a second dead entry. */
		rc = o->tries ? agent_queue_holds(w->q, m->id, err, SW_ERR_MAX) : 0;
		if (rc == 0)
			rc = agent_queue_dead(w->q, m, o->id, error, err, SW_ERR_MAX);
		else if (rc == SW_ENOTFOUND)
			rc = 0;
		o->tries++;
		if (rc)
			return rc;
		o->acked = true;
		set_entry(w, NULL); /* no lease left to hold */
	}
	if (!o->announced) {
		rc = agent_queue_result(w->q, o->id, status, o->location, o->doc, error, err,
					SW_ERR_MAX);
		o->tries++;
		if (rc == SW_EBUSY && !o->acked) {
			char aerr[SW_ERR_MAX];

			if (agent_queue_ack(w->q, m->id, aerr, sizeof(aerr)) == 0) {
				o->acked = true;
				set_entry(w, NULL); /* no lease left to hold */
			}
			return rc;
		}
		if (rc)
			return rc;
		o->announced = true;
	}
	if (!o->acked) {
		rc = agent_queue_ack(w->q, m->id, err, SW_ERR_MAX);
		o->tries++;
		if (rc)
			return rc;
		o->acked = true;
	}
	callback_post(&w->cb, o->callback_url, o->id, status, o->location[0] ? o->location : NULL,
		      o->doc, error);
	atomic_fetch_add(&w->done, 1);
	o->set = false;
	return 0;
}

/* Records in o what a task committed with status st owes, and delivers
 * it (deliver()'s return). location and error may be NULL, doc 0. */
static int settle(struct worker *w, const struct agent_msg *m, struct outcome *o,
		  const char *id, enum agent_task_status st, const char *location, int64_t doc,
		  const char *error, const char *callback_url, char *err)
{
	*o = (struct outcome){ .set = true, .status = st, .dead_letter = st == AGENT_TASK_DEAD,
			       .doc = doc, .callback_url = callback_url };
	snprintf(o->id, sizeof(o->id), "%s", id);
	snprintf(o->location, sizeof(o->location), "%s", location ? location : "");
	snprintf(o->error, sizeof(o->error), "%s", error ? error : "");
	return deliver(w, m, o, err);
}

/* Handles one delivery. Returns 0 when the entry is dealt with (done, or
 * left pending on purpose), or an outage code: retry after a reconnect,
 * with the reason in err (SW_ERR_MAX bytes). When the outcome is
 * committed but not yet delivered, o is set: retry deliver(o) then, not
 * this. */
static int handle(struct worker *w, const struct agent_msg *m, const struct proto_task *t,
		  int parse_rc, const char *parse_err, struct outcome *o, char *err)
{
	const uint32_t max_attempts = w->cfg->agentd.max_attempts;
	char id[PROTO_TASK_MAX_ID + 80], location[AGENT_LOCATION_MAX] = "";
	char last[SW_ERR_MAX], msg[SW_ERR_MAX + 64];
	enum agent_task_status prev;
	int64_t doc = 0;
	int attempts, rc;

	if (t->id)
		snprintf(id, sizeof(id), "%s", t->id);
	else
		snprintf(id, sizeof(id), "stream:%s", m->id);

	rc = agent_db_task_start(w->db, id, parse_rc ? NULL : proto_task_kind_name(t->kind), m->id,
				 &prev, &attempts, err, SW_ERR_MAX);
	if (rc)
		return rc;
	if (prev != AGENT_TASK_RUNNING) { /* finished before; the ack was lost */
		rc = agent_db_task_get(w->db, id, &prev, NULL, last, sizeof(last), location,
				       sizeof(location), err, SW_ERR_MAX);
		if (rc)
			return rc;
		rc = agent_db_task_document(w->db, id, &doc, err, SW_ERR_MAX);
		if (rc && rc != SW_ENOTFOUND)
			return rc;
		log_info("task %s: redelivered after it ended %s; acknowledging", id,
			 agent_task_status_name(prev));
		/* A dead one was never moved (the move is what acknowledges):
		 * move it now, so its JSON is kept in swarm:dead. */
		return settle(w, m, o, id, prev, location, doc, last[0] ? last : NULL,
			      parse_rc ? NULL : t->callback_url, err);
	}
	if (parse_rc) {
		rc = agent_db_task_finish(w->db, id, AGENT_TASK_FAILED, parse_err, NULL, err,
					  SW_ERR_MAX);
		if (rc)
			return rc;
		log_warn("task %s: %s", id, parse_err);
		w->st.failed++;
		return settle(w, m, o, id, AGENT_TASK_FAILED, NULL, 0, parse_err, NULL, err);
	}
	if (m->deliveries > max_attempts) {
		/* The worker that had the last allowed delivery died with it. */
		rc = agent_db_task_get(w->db, id, NULL, NULL, last, sizeof(last), NULL, 0, err,
				       SW_ERR_MAX);
		if (rc)
			return rc;
		rc = agent_db_task_document(w->db, id, &doc, err, SW_ERR_MAX);
		if (rc && rc != SW_ENOTFOUND)
			return rc;
		snprintf(msg, sizeof(msg), "gave up after %u deliveries; last error: %s",
			 m->deliveries - 1, last[0] ? last : "none recorded (the worker died)");
		goto dead;
	}

	err[0] = '\0';
	mark_progress(w);
	rc = agent_run_task(&w->ctx, t, location, sizeof(location), err, SW_ERR_MAX);
	doc = w->ctx.document_id;
	if (rc == 0) {
		rc = agent_db_task_complete(w->db, id, location, doc, err, SW_ERR_MAX);
		if (rc)
			return rc;
		w->st.completed++;
		return settle(w, m, o, id, AGENT_TASK_COMPLETED, location, doc, NULL,
			      t->callback_url, err);
	}
	if (agent_error_outage(rc)) {
		log_debug("task %s: %s", id, err);
		return rc;
	}
	if (agent_error_permanent(rc)) {
		log_warn("task %s failed: %s", id, err);
		snprintf(msg, sizeof(msg), "%s", err);
		rc = agent_db_task_finish(w->db, id, AGENT_TASK_FAILED, msg, NULL, err, SW_ERR_MAX);
		if (rc)
			return rc;
		w->st.failed++;
		return settle(w, m, o, id, AGENT_TASK_FAILED, NULL, doc, msg, t->callback_url, err);
	}
	if (m->deliveries < max_attempts) {
		log_warn("task %s: attempt %u of %u failed: %s", id, m->deliveries, max_attempts, err);
		snprintf(msg, sizeof(msg), "%s", err);
		rc = agent_db_task_finish(w->db, id, AGENT_TASK_RUNNING, msg, NULL, err, SW_ERR_MAX);
		if (rc)
			return rc;
		w->st.retried++;
		return 0; /* stays pending: reclaimed after the lease */
	}
	snprintf(msg, sizeof(msg), "gave up after %u deliveries; last error: %s", m->deliveries,
		 err);
dead:
	log_warn("task %s: %s", id, msg);
	rc = agent_db_task_finish(w->db, id, AGENT_TASK_DEAD, msg, NULL, err, SW_ERR_MAX);
	if (rc)
		return rc;
	w->st.dead++;
	return settle(w, m, o, id, AGENT_TASK_DEAD, NULL, doc, msg, t->callback_url, err);
}

/* Runs one claimed entry to its end, riding out outages: until the
 * outcome is committed the whole handling is retried; after that, only
 * what is left to deliver. */
static void process(struct worker *w, const struct agent_msg *m)
{
	char perr[SW_ERR_MAX], err[SW_ERR_MAX];
	struct outcome o = { 0 };
	struct proto_task t;
	int prc, rc;

	set_entry(w, m->id);
	prc = proto_task_parse(m->payload ? m->payload : "", m->payload ? m->len : 0, &t, perr,
			       sizeof(perr));
	if (!m->payload)
		snprintf(perr, sizeof(perr), "task: the entry has no \"%s\" field", PROTO_TASK_FIELD);
	for (;;) {
		rc = o.set ? deliver(w, m, &o, err) : handle(w, m, &t, prc, perr, &o, err);
		if (!agent_error_outage(rc))
			break;
		outage_begin(w, err);
		if (stop_requested) {
			if (o.set && o.acked)
				log_warn("draining during an outage: the event of task %s (%s) is not "
					 "announced; PostgreSQL has its outcome", o.id,
					 agent_task_status_name(o.status));
			else
				log_warn("draining during an outage: entry %s stays pending for "
					 "another worker", m->id);
			break;
		}
		do {
			backoff(w);
		} while (!stop_requested && reconnect_all(w, !o.set, err, SW_ERR_MAX) != 0);
	}
	/* The outage is over once the task in hand got through, not when the
	 * connections answer again: a Redis refusing writes answers. */
	if (!agent_error_outage(rc))
		outage_end(w);
	if (rc && !agent_error_outage(rc))
		log_error("entry %s: %s", m->id, sw_strerror(rc));
	proto_task_free(&t);
	set_entry(w, NULL);
}

/* Opens PostgreSQL (and migrates) and Redis, waiting out servers that
 * are not up yet. Returns 0, a permanent error, or SW_ECANCELED when
 * stopped first. */
static int start(struct worker *w, char *err, size_t errlen)
{
	const char *dir = w->o->sql_dir ? w->o->sql_dir : agent_sql_dir_default();
	int rc;

	for (;;) {
		if (!w->db)
			rc = agent_db_open(&w->db, w->cfg->postgres.url, err, errlen);
		else
			rc = agent_db_reconnect(w->db, err, errlen);
		if (rc == 0)
			rc = agent_db_migrate(w->db, dir, NULL, err, errlen);
		if (rc == 0 && !w->q)
			rc = agent_queue_open(&w->q, &w->qo, err, errlen);
		if (rc == 0) {
			outage_end(w);
			return 0;
		}
		if (!agent_error_outage(rc)) /* SW_EBUSY: Redis full, group missing */
			return rc;
		outage_begin(w, err);
		if (stop_requested)
			return SW_ECANCELED;
		backoff(w);
	}
}

/* --- agent_worker_run, step by step ----------------------------------------- */

/* Allocates the worker and the locks its threads share. Returns 0 and
 * *out, or -ENOMEM or the code of the lock that could not be made (*out
 * NULL, nothing held). */
static int worker_new(struct worker **out, const struct agent_worker_opts *o, char *err,
		      size_t errlen)
{
	const struct sw_config *cfg = o->cfg;
	const char *what;
	struct worker *w;
	int rc;

	*out = NULL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return sw_seterr(err, errlen, -ENOMEM, "worker: out of memory");
	rc = agent_fetch_policy_init(&w->fetch_policy, cfg, err, errlen);
	if (rc) {
		free(w);
		return rc;
	}
	for (uint32_t i = 0; i < w->fetch_policy.n_file_dirs; i++) {
		struct stat st;

		if (stat(w->fetch_policy.file_dirs[i], &st) != 0 || !S_ISDIR(st.st_mode))
			log_warn("agentd.fetch.file_dirs[%u]: %s is not a directory (now): no file "
				 "is read there",
				 i, w->fetch_policy.file_dirs[i]);
	}
	w->cb.policy = &w->fetch_policy;
	what = "the entry lock";
	rc = pthread_mutex_init(&w->lock, NULL);
	if (rc)
		goto out_free;
	what = "the callback queue lock";
	rc = pthread_mutex_init(&w->cb.lock, NULL);
	if (rc)
		goto out_lock;
	what = "the callback queue condition";
	rc = pthread_cond_init(&w->cb.cond, NULL);
	if (rc)
		goto out_cb_lock;
	w->o = o;
	w->cfg = cfg;
	mark_progress(w);
	w->qo = (struct agent_queue_opts){
		.url = cfg->redis.url,
		.stream = o->stream,
		.dead_stream = o->dead_stream,
		.results_stream = o->results_stream,
		.consumer = o->consumer,
		.lease_ms = cfg->agentd.lease_ms,
		.block_ms = o->block_ms ? o->block_ms : AGENT_DEFAULT_BLOCK_MS,
		.results_maxlen = cfg->agentd.results_maxlen,
		.dead_maxlen = cfg->agentd.dead_maxlen,
	};
	*out = w;
	return 0;

out_cb_lock:
	pthread_mutex_destroy(&w->cb.lock);
out_lock:
	pthread_mutex_destroy(&w->lock);
out_free:
	free(w);
	return sw_seterr(err, errlen, -rc, "worker: cannot initialize %s: %s", what,
			 sw_strerror(-rc));
}

/* Closes the connections and frees w (its threads are stopped). */
static void worker_free(struct worker *w)
{
	agent_gpud_close(w->gpud);
	agent_queue_close(w->q);
	agent_db_close(w->db);
	pthread_cond_destroy(&w->cb.cond);
	pthread_mutex_destroy(&w->cb.lock);
	pthread_mutex_destroy(&w->lock);
	free(w);
}

/* A heartbeat fd that never blocks, and the drain signals (when asked
 * for). Returns 0, or the fcntl error of a heartbeat fd that is not
 * open. */
static int setup_process(struct worker *w, char *err, size_t errlen)
{
	const struct agent_worker_opts *o = w->o;

	if (o->heartbeat_fd >= 0) {
		int fl = fcntl(o->heartbeat_fd, F_GETFL);

		if (fl < 0 || fcntl(o->heartbeat_fd, F_SETFL, fl | O_NONBLOCK) != 0) {
			int rc = -errno;

			return sw_seterr(err, errlen, rc, "worker: heartbeat fd %d: %s",
					 o->heartbeat_fd, sw_strerror(rc));
		}
	}
	if (o->handle_signals) {
		struct sigaction sa = { .sa_handler = on_signal };

		sigemptyset(&sa.sa_mask);
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGINT, &sa, NULL);
		signal(SIGPIPE, SIG_IGN);
	}
	return 0;
}

/* Removes the group's long-silent consumers; housekeeping only, so a
 * failure is logged and start-up goes on. */
static void prune_consumers(struct worker *w)
{
	uint64_t idle = 4ull * w->cfg->agentd.lease_ms;
	char err[SW_ERR_MAX];

	if (idle < AGENT_PRUNE_MIN_IDLE_MS)
		idle = AGENT_PRUNE_MIN_IDLE_MS;
	if (idle > UINT32_MAX)
		idle = UINT32_MAX;
	if (agent_queue_prune(w->q, (uint32_t)idle, NULL, err, sizeof(err)) != 0)
		log_warn("pruning old consumers: %s", err);
}

/* Removes entries of swarm:tasks acknowledged but never deleted (by an
 * agentd from before deletion on acknowledgement, or a tool that only
 * XACKs); housekeeping like prune_consumers. */
static void sweep_stream(struct worker *w)
{
	char err[SW_ERR_MAX];

	if (agent_queue_sweep(w->q, NULL, err, sizeof(err)) != 0)
		log_warn("sweeping acknowledged entries: %s", err);
}

/* Warns when Redis would evict keys at its memory limit: stream entries
 * evicted are tasks lost. noeviction makes it refuse writes instead,
 * which the submitters see and the workers ride out. */
static void check_memory_policy(struct worker *w)
{
	char err[SW_ERR_MAX], policy[64];
	uint64_t max;

	if (agent_queue_memory_policy(w->q, &max, policy, sizeof(policy), err, sizeof(err)) != 0)
		log_warn("reading Redis's memory policy: %s", err);
	else if (max && strcmp(policy, "noeviction") != 0)
		log_warn("Redis evicts keys at its maxmemory limit (%" PRIu64 " bytes, policy %s): "
			 "queued tasks can be evicted and lost; set maxmemory-policy noeviction",
			 max, policy);
}

/* The model the tasks use: the one in the options, else gpud's client. */
static int open_llm(struct worker *w, char *err, size_t errlen)
{
	int rc;

	if (w->o->llm) {
		w->llm = w->o->llm;
		return 0;
	}
	rc = agent_gpud_open(&w->gpud, w->cfg->gpud.socket, 0);
	if (rc)
		return sw_seterr(err, errlen, rc, "worker: gpud client for %s: %s",
				 w->cfg->gpud.socket, sw_strerror(rc));
	w->llm = agent_gpud_llm(w->gpud);
	return 0;
}

/* What comes after the servers answer: the consumer name the heartbeat
 * connection must use (ours), old consumers pruned, the model, and the
 * context the tasks run in. */
static int prepare(struct worker *w, char *err, size_t errlen)
{
	const struct agent_worker_opts *o = w->o;
	int rc;

	w->qo.consumer = agent_queue_consumer(w->q);
	prune_consumers(w);
	sweep_stream(w);
	check_memory_policy(w);
	rc = open_llm(w, err, errlen);
	if (rc)
		return rc;
	w->ctx = (struct agent_ctx){
		.db = w->db,
		.llm = w->llm,
		.fetch = { .max_bytes = PROTO_TASK_MAX_TEXT,
			   .timeout_ms = o->fetch_timeout_ms ? o->fetch_timeout_ms : 30000,
			   .policy = &w->fetch_policy },
		.chunk_tokens = o->chunk_tokens ? o->chunk_tokens : AGENT_DEFAULT_CHUNK_TOKENS,
		.chunk_overlap = o->chunk_overlap ? o->chunk_overlap : AGENT_DEFAULT_CHUNK_OVERLAP,
		.summary_fanin = o->summary_fanin ? o->summary_fanin : AGENT_DEFAULT_SUMMARY_FANIN,
		.answer_self_chunks = o->cfg && !strcmp(o->cfg->agentd.answer_chunk_mask, "self"),
		.progress = mark_progress,
		.progress_arg = w,
	};
	if (w->ctx.chunk_overlap >= w->ctx.chunk_tokens)
		w->ctx.chunk_overlap = w->ctx.chunk_tokens / 4;
	return 0;
}

/* Starts the callback and heartbeat threads. Returns 0, or the code of
 * the one that could not start; the one that did is marked started, for
 * stop_threads. */
static int start_threads(struct worker *w, char *err, size_t errlen)
{
	int rc;

	rc = pthread_create(&w->cb.thread, NULL, callback_thread, &w->cb);
	if (rc)
		return sw_seterr(err, errlen, -rc, "worker: cannot start the callback thread: %s",
				 sw_strerror(-rc));
	w->cb.started = true;
	rc = pthread_create(&w->hb, NULL, heartbeat_thread, w);
	if (rc)
		return sw_seterr(err, errlen, -rc, "worker: cannot start the heartbeat thread: %s",
				 sw_strerror(-rc));
	w->hb_started = true;
	return 0;
}

/* Stops the threads that started: the heartbeat at once, the callbacks
 * once their queue is empty or CALLBACK_DRAIN_MS have passed. */
static void stop_threads(struct worker *w)
{
	if (w->hb_started) {
		atomic_store(&w->hb_stop, true);
		pthread_join(w->hb, NULL);
	}
	if (w->cb.started) {
		pthread_mutex_lock(&w->cb.lock);
		w->cb.closing = true;
		w->cb.deadline_ms = sw_now_ms() + CALLBACK_DRAIN_MS;
		pthread_cond_signal(&w->cb.cond);
		pthread_mutex_unlock(&w->cb.lock);
		pthread_join(w->cb.thread, NULL);
	}
}

/* Claims and runs entries until stopped, or until max_tasks_per_worker
 * are done; a failed claim is an outage, ridden out with backoff. */
static void claim_loop(struct worker *w, char *err, size_t errlen)
{
	const struct sw_config *cfg = w->cfg;
	int rc;

	while (!stop_requested) {
		struct agent_msg m;

		if (cfg->agentd.max_tasks_per_worker &&
		    atomic_load(&w->done) >= cfg->agentd.max_tasks_per_worker) {
			log_info("worker: %u tasks done, exiting to be recycled",
				 cfg->agentd.max_tasks_per_worker);
			break;
		}
		mark_progress(w);
		rc = agent_queue_claim(w->q, &m, err, errlen);
		if (rc == 0 || rc == SW_ENOTFOUND)
			outage_end(w);
		if (rc == SW_ENOTFOUND)
			continue;
		if (rc) {
			outage_begin(w, err);
			backoff(w);
			reconnect_all(w, true, err, errlen);
			continue;
		}
		w->st.claimed++;
		process(w, &m);
		agent_msg_free(&m);
	}
}

int agent_worker_run(const struct agent_worker_opts *o, struct agent_worker_stats *stats,
		     char *err, size_t errlen)
{
	struct worker *w;
	int rc;

	rc = worker_new(&w, o, err, errlen);
	if (rc)
		return rc;
	rc = setup_process(w, err, errlen);
	if (rc)
		goto out;
	rc = start(w, err, errlen);
	if (rc == SW_ECANCELED) {
		rc = 0; /* stopped before the servers came: a clean exit */
		goto out;
	}
	if (rc)
		goto out;
	rc = prepare(w, err, errlen);
	if (rc)
		goto out;
	rc = start_threads(w, err, errlen);
	if (rc)
		goto out;
	log_info("worker %s: claiming from %s (lease %u ms, max_attempts %u)",
		 agent_queue_consumer(w->q), o->stream ? o->stream : PROTO_TASK_STREAM,
		 w->cfg->agentd.lease_ms, w->cfg->agentd.max_attempts);
	claim_loop(w, err, errlen);
	log_info("worker %s: drained (%" PRIu64 " completed, %" PRIu64 " failed, %" PRIu64
		 " dead, %" PRIu64 " retried)",
		 agent_queue_consumer(w->q), w->st.completed, w->st.failed, w->st.dead,
		 w->st.retried);
out:
	stop_threads(w);
	if (stats)
		*stats = w->st;
	worker_free(w);
	return rc;
}

/* --- `agentd worker` ---------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f, "usage: agentd worker --config FILE [--heartbeat-fd N] [--sql-dir DIR] [-n]\n"
		   "  -n, --check   load and validate the configuration, print \"configuration OK\"\n");
}

int agent_worker_main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "heartbeat-fd", required_argument, NULL, 'H' },
		{ "sql-dir", required_argument, NULL, 's' },
		{ "check", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct agent_worker_opts o = { .heartbeat_fd = -1, .handle_signals = true };
	struct agent_worker_stats st;
	struct sw_config cfg;
	const char *config = NULL, *hb = getenv("SWARM_HEARTBEAT_FD");
	bool check = false;
	char err[SW_ERR_MAX], *json;
	int c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "c:H:s:nh", longopts, NULL)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 'n': check = true; break;
		case 'H': hb = optarg; break;
		case 's': o.sql_dir = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!config || optind != argc) {
		usage(stderr);
		return 2;
	}
	if (hb && hb[0]) {
		char *end;
		long fd = strtol(hb, &end, 10);

		if (*end || fd < 0 || fd > 65535) {
			fprintf(stderr, "agentd worker: bad heartbeat fd \"%s\"\n", hb);
			return 2;
		}
		o.heartbeat_fd = (int)fd;
	}
	if (sw_config_load_file(config, &cfg, err, SW_ERR_MAX) != 0 ||
	    sw_config_apply_env(&cfg, err, SW_ERR_MAX) != 0 ||
	    sw_config_validate(&cfg, 0, err, SW_ERR_MAX) != 0 ||
	    sw_secrets_load(&cfg, err, SW_ERR_MAX) != 0) {
		fprintf(stderr, "agentd worker: %s\n", err);
		return 1;
	}
	if (check) {
		printf("configuration OK\n");
		return 0;
	}
	sw_log_init("agentd-worker", (enum sw_log_level)cfg.log.level);
	if (cfg.log.file[0] && (rc = sw_log_open(cfg.log.file)) != 0)
		fprintf(stderr, "agentd worker: cannot open log file %s: %s; logging to stderr\n",
			cfg.log.file, sw_strerror(rc));
	sw_log_install_sigusr1();
	/* a worker of a supervisor that switched already runs as the user */
	if ((rc = sw_privdrop(cfg.user, NULL, err, SW_ERR_MAX)) != 0) {
		log_error("user: %s", err);
		return 1;
	}
	if (agent_fetch_global_init(err, sizeof(err)) != 0) {
		log_error("%s", err);
		return 1;
	}
	{
		char red_pg[256], red_redis[256];

		sw_config_redact_url(cfg.postgres.url, red_pg, sizeof(red_pg));
		sw_config_redact_url(cfg.redis.url, red_redis, sizeof(red_redis));
		log_info("agentd worker %s (libpq %d, hiredis %d.%d.%d, %s): postgres %s, redis %s, "
			 "gpud %s",
			 SW_VERSION, PQlibVersion(), HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH,
			 curl_version(), red_pg, red_redis, cfg.gpud.socket);
	}
	json = sw_config_to_json(&cfg); /* passwords redacted */
	if (json)
		log_info("effective configuration: %s", json);
	free(json);
	o.cfg = &cfg;
	rc = agent_worker_run(&o, &st, err, SW_ERR_MAX);
	if (rc) {
		log_error("worker: %s", err);
		return 1;
	}
	return 0;
}
