/* scheduler.c - continuous-batching scheduler (see scheduler.h for the policy and
 * the thread model). */
#include "gpud/scheduler.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "gpud/alloc.h"
#include "gpud/mask.h"
#include "gpud/model.h"
#include "gpud/prefix.h"
#include "gpud/tokenizer.h"

enum slot_state {
	SLOT_FREE = 0, /* on the free-slot stack */
	SLOT_WAITING,  /* on its device's wait list, no engine sequence */
	SLOT_RUNNING,  /* has an engine sequence, on its device's run list */
	SLOT_RESERVED, /* taken by a submit that fills it without the lock: on
			* no list, and only that submit touches it */
};

#define PIECE_CAP 256
#define OUT_CAP (PIECE_CAP + GPUD_STOP_MAX_LEN)

struct slot {
	enum slot_state state;
	uint64_t id;
	uint32_t dev;
	uint32_t seq;           /* engine sequence while RUNNING */
	int32_t *toks;          /* (tok_cap) prompt, then generated ids */
	int32_t *bias_id;       /* (GPUD_SAMPLER_MAX_BIAS) the sampler's biases */
	float *bias_val;
	uint32_t n_prompt;
	uint32_t n_toks;        /* prompt + generated ids appended */
	uint32_t n_done;        /* ids in the engine's KV (while RUNNING) */
	uint32_t max_gen;       /* 0: until EOG / context */
	uint64_t arrival;       /* submit order (FCFS key) */
	uint64_t wait_since;    /* device step count when it (re)started waiting */
	uint32_t n_preempt;
	bool in_batch;          /* part of the batch its device is running */
	bool cancel_pending;    /* cancelled during its device's forward pass */
	bool ended;             /* its device failed while busy: DONE sent, the
				 * slot and sequence wait for the device to be
				 * free (finish_pending), or for gpud's exit */
	bool started;           /* scheduled at least once */
	uint32_t *pfx;          /* (pfx_cap) prefix cache entries of its first
				 * blocks, in order, while RUNNING */
	uint32_t n_pfx;
	bool pfx_stop;          /* inserts no more blocks (another request
				 * cached an identical one first) */
	uint32_t n_cached;      /* prompt tokens served from the cache at
				 * first admission */
	double t_submit, t_start, t_first;
	const struct gpud_mask *mask;
	gpud_sched_cb cb;
	void *arg;
	struct gpud_sampler *smp;
	bool logprobs;          /* each token's log probability wanted */
	uint32_t top_logprobs;  /* and this many alternatives' */
	bool prompt_lp;         /* the prompt's too (its chunks' rows: ALL) */
	bool prompt_only;       /* and nothing generated */
	uint32_t lp_sent;       /* prompt tokens whose entries went out (kept
				 * across a preemption: never sent twice) */
	struct gpud_logprobs lp; /* the last token's (sample_one) */
	struct gpud_stop stop;
	struct gpud_detok detok;
	char piece[PIECE_CAP];
	char out[2 * OUT_CAP];
	char out2[OUT_CAP];
};

struct dev {
	struct gpud_engine *e;
	const struct gpud_tokenizer *tok;
	uint32_t n_ctx, bt, n_blocks, max_engine_seqs;
	uint32_t max_tokens;   /* per step */
	uint32_t max_ents;     /* per step */
	uint32_t free_blocks;  /* cached engine_free_blocks, updated under the lock */
	uint64_t pending_blocks; /* blocks the waiting list's prefills will need */
	uint64_t steps, tokens, generated, preemptions;
	uint64_t placed_prefix, placed_load; /* requests queued here, by why */
	uint64_t placed_tokens; /* prompt tokens of the requests queued here */
	uint32_t pl_parent;    /* place() scratch: last matched cache entry */
	uint32_t pl_hits;      /* place() scratch: full prompt blocks matched */
	bool pl_alive;         /* place() scratch: still matching */
	bool busy;             /* in a forward pass or a device_exec, lock released */
	int failed;            /* 0, or the code it failed with (gpud_sched_fail_device):
				* nothing is placed or stepped on it again */
	char fail_msg[SW_ERR_MAX];
	uint32_t depth;        /* waiting + running */
	bool kicked;           /* submit/cancel/wake since the last wait returned */
	pthread_cond_t cond;   /* signalled with kicked (gpud_sched_wait) */
	bool cond_ok;
	uint32_t *owner;       /* (n_blocks) scratch of gpud_sched_block_owners */
	struct gpud_prefix *pc; /* prefix cache index; NULL: reuse off */
	uint32_t *pblocks;     /* (n_ctx / bt + 1) admission scratch: hit blocks */
	struct slot **run;     /* (max_engine_seqs) by admission order */
	uint32_t n_run;
	struct slot **wait;    /* (max_requests) by arrival */
	uint32_t n_wait;
	struct gpud_batch_entry *ents; /* (max_ents) */
	struct slot **ent_slot;        /* (max_ents) */
	struct gpud_draw *draws;       /* (max_ents) GPUD_LOGITS_DRAW entries' draws */
	int32_t *ent_id;               /* (max_ents) each entry's token (or a
					* negative code), sampled after the
					* forward pass, outside the lock */
	/* the prompt's log probabilities: rows a step has beyond one an
	 * entry (the engine's max_logits less max_ents), those the plan has
	 * not given out, each entry's first row and the rows' results */
	uint32_t lp_rows, lp_rows_left, rows_planned;
	uint32_t *ent_row0;            /* (max_ents) */
	struct gpud_logprobs *plp;     /* (max_ents + lp_rows) by row */
	/* The step's sampling job, shared with the sampling threads (under
	 * sampling.mu but job_next): entries job_next.. are still to take. */
	atomic_uint job_next;
	uint32_t job_n, job_done, job_users;
	bool job_open;
	pthread_cond_t job_cv; /* job_done reached job_n with no user left */
	bool job_cv_ok;
	struct gpud_sampler_scratch *sc; /* the device thread's draws */
};

/* Sampling threads: the rows of a step that need the whole sampler (a
 * temperature, penalties) are drawn by the device's thread and these
 * together, outside the scheduler lock; a 128K-token vocabulary costs
 * about a millisecond per row on one core. */
struct sampling_thread {
	struct gpud_sched *s;
	struct gpud_sampler_scratch *sc; /* its draws' working arrays */
	pthread_t th;
};

struct sampling {
	pthread_mutex_t mu;
	pthread_cond_t go; /* a job opened, or stop */
	pthread_cond_t up; /* a thread is running */
	struct sampling_thread *th; /* (n_slots) */
	uint32_t n_slots;  /* sample_threads - 1 */
	uint32_t n_th;     /* started */
	uint32_t n_up;     /* running (create waits for all: a thread's own
			    * start-up, which may allocate, is over before
			    * the first step) */
	bool stop;
};

/* Under the lock: everything below that changes after create. Read without
 * it: p, devs[].e/tok/n_ctx/bt/n_blocks (fixed at create), n_dev, n_vocab,
 * tok_cap, and a slot the caller holds in SLOT_RESERVED. */
struct gpud_sched {
	pthread_mutex_t lock;
	pthread_cond_t idle;    /* a device left busy (block_owners waits on it) */
	uint32_t idle_waiters;
	struct gpud_sched_params p;
	struct dev *devs;
	uint32_t n_dev;
	struct slot *slots;     /* (max_requests) */
	uint32_t *free_slots;   /* (max_requests) stack of SLOT_FREE indices */
	uint32_t n_free;
	int32_t *tok_mem;       /* max_requests * tok_cap */
	int32_t *bias_id_mem;   /* max_requests * GPUD_SAMPLER_MAX_BIAS */
	float *bias_val_mem;
	uint32_t tok_cap;
	uint32_t *pfx_mem;      /* max_requests * pfx_cap */
	uint32_t pfx_cap;
	uint32_t n_vocab;
	uint64_t next_id, next_arrival;
	struct gpud_sched_stats st;
	struct sampling sm;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint32_t min_u32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

static uint32_t blocks_for(uint32_t n, uint32_t bt)
{
	return (uint32_t)(((uint64_t)n + bt - 1) / bt);
}

void gpud_sched_params_default(struct gpud_sched_params *p)
{
	*p = (struct gpud_sched_params){
		.max_requests = 64,
		.max_batch_tokens = 0,
		.max_seqs = 0,
		.aging_steps = 32,
		.placement_margin = 8,
	};
}

void gpud_sched_destroy(struct gpud_sched *s)
{
	if (!s)
		return;
	if (s->sm.th) {
		pthread_mutex_lock(&s->sm.mu);
		s->sm.stop = true;
		pthread_cond_broadcast(&s->sm.go);
		pthread_mutex_unlock(&s->sm.mu);
		for (uint32_t i = 0; i < s->sm.n_th; i++)
			pthread_join(s->sm.th[i].th, NULL);
		for (uint32_t i = 0; i < s->sm.n_slots; i++)
			gpud_sampler_scratch_free(s->sm.th[i].sc);
		free(s->sm.th);
	}
	pthread_cond_destroy(&s->sm.go);
	pthread_cond_destroy(&s->sm.up);
	pthread_mutex_destroy(&s->sm.mu);
	if (s->slots) {
		for (uint32_t i = 0; i < s->p.max_requests; i++) {
			struct slot *sl = &s->slots[i];
			if (sl->state == SLOT_RUNNING)
				gpud_engine_seq_free(s->devs[sl->dev].e, sl->seq);
			while (sl->n_pfx)
				gpud_prefix_release(s->devs[sl->dev].pc, sl->pfx[--sl->n_pfx]);
			gpud_sampler_free(sl->smp);
		}
	}
	if (s->devs) {
		for (uint32_t d = 0; d < s->n_dev; d++) {
			free(s->devs[d].run);
			free(s->devs[d].wait);
			free(s->devs[d].ents);
			free(s->devs[d].ent_slot);
			free(s->devs[d].draws);
			free(s->devs[d].ent_id);
			free(s->devs[d].ent_row0);
			free(s->devs[d].plp);
			if (s->devs[d].job_cv_ok)
				pthread_cond_destroy(&s->devs[d].job_cv);
			gpud_sampler_scratch_free(s->devs[d].sc);
			struct dev *dv = &s->devs[d];
			uint32_t b;

			/* every entry is unreferenced now: give the holds back */
			while (dv->pc && !gpud_prefix_evict(dv->pc, &b))
				gpud_engine_block_release(dv->e, b);
			gpud_prefix_destroy(dv->pc);
			free(dv->pblocks);
			free(s->devs[d].owner);
			if (s->devs[d].cond_ok)
				pthread_cond_destroy(&s->devs[d].cond);
		}
	}
	pthread_cond_destroy(&s->idle);
	pthread_mutex_destroy(&s->lock);
	free(s->slots);
	free(s->free_slots);
	free(s->tok_mem);
	free(s->bias_id_mem);
	free(s->bias_val_mem);
	free(s->pfx_mem);
	free(s->devs);
	free(s);
}

static int dev_init(struct gpud_sched *s, struct dev *d, struct gpud_engine *e, char *err,
		    size_t errlen)
{
	const struct gpud_engine_params *ep = gpud_engine_params(e);
	pthread_condattr_t ca;
	int rc;

	d->e = e;
	d->tok = gpud_model_tokenizer(gpud_engine_model(e));
	d->n_ctx = ep->n_ctx;
	d->bt = ep->block_tokens;
	d->n_blocks = ep->n_blocks;
	d->max_engine_seqs = ep->max_seqs;
	d->max_tokens = s->p.max_batch_tokens && s->p.max_batch_tokens < ep->max_batch_tokens ?
			s->p.max_batch_tokens : ep->max_batch_tokens;
	d->max_ents = min_u32(ep->max_seqs, ep->max_logits);
	if (s->p.max_seqs && s->p.max_seqs < d->max_ents)
		d->max_ents = s->p.max_seqs;
	d->free_blocks = gpud_engine_free_blocks(e);
	d->run = calloc(ep->max_seqs, sizeof(*d->run));
	d->wait = calloc(s->p.max_requests, sizeof(*d->wait));
	d->ents = calloc(d->max_ents, sizeof(*d->ents));
	d->ent_slot = calloc(d->max_ents, sizeof(*d->ent_slot));
	d->draws = calloc(d->max_ents, sizeof(*d->draws));
	d->ent_id = calloc(d->max_ents, sizeof(*d->ent_id));
	d->lp_rows = ep->max_logits > d->max_ents ? ep->max_logits - d->max_ents : 0;
	d->ent_row0 = calloc(d->max_ents, sizeof(*d->ent_row0));
	d->plp = calloc(d->max_ents + d->lp_rows, sizeof(*d->plp));
	d->owner = calloc(d->n_blocks, sizeof(*d->owner));
	d->pblocks = calloc(d->n_ctx / d->bt + 1, sizeof(*d->pblocks));
	if (!d->run || !d->wait || !d->ents || !d->ent_slot || !d->draws || !d->ent_id || !d->owner ||
	    !d->pblocks || !d->ent_row0 || !d->plp)
		return sw_seterr(err, errlen, -ENOMEM, "sched: out of memory");
	if (s->p.prefix_cache_bytes) {
		struct gpud_prefix_params pp = {
			.n_blocks = d->n_blocks, .block_tokens = d->bt,
			.block_bytes = gpud_engine_block_bytes(e),
			.max_bytes = s->p.prefix_cache_bytes,
		};
		rc = gpud_prefix_create(&d->pc, &pp);
		if (rc)
			return sw_seterr(err, errlen, rc, "sched: prefix cache of %u blocks: %s",
					 d->n_blocks, sw_strerror(rc));
	}
	if (pthread_condattr_init(&ca))
		return sw_seterr(err, errlen, -ENOMEM, "sched: condattr");
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	rc = pthread_cond_init(&d->cond, &ca);
	pthread_condattr_destroy(&ca);
	if (rc)
		return sw_seterr(err, errlen, -rc, "sched: cond init: %s", sw_strerror(-rc));
	d->cond_ok = true;
	rc = pthread_cond_init(&d->job_cv, NULL);
	if (rc)
		return sw_seterr(err, errlen, -rc, "sched: cond init: %s", sw_strerror(-rc));
	d->job_cv_ok = true;
	rc = gpud_sampler_scratch_create(&d->sc, (int32_t)gpud_engine_n_vocab(e), err, errlen);
	if (rc)
		return rc;
	return 0;
}

/* --- sampling, outside the lock ------------------------------------------ */

/* Whether entry b of sl's (b->n_tokens tokens from a) ends its prompt and
 * everything after it that is to be computed: its last row gives the next
 * token. */
static bool ent_final(const struct slot *sl, const struct gpud_batch_entry *b)
{
	return b->tokens + b->n_tokens >= sl->toks + sl->n_toks;
}

/* The prompt tokens k whose log probabilities entry b's rows give (row
 * k - 1 - a predicts k) and that have not been sent: [*k0, *k1). */
static void prompt_span(const struct slot *sl, const struct gpud_batch_entry *b, uint32_t *k0,
			uint32_t *k1)
{
	uint32_t a = (uint32_t)(b->tokens - sl->toks);

	*k0 = sl->lp_sent > a + 1 ? sl->lp_sent : a + 1;
	*k1 = a + b->n_tokens + 1 < sl->n_prompt ? a + b->n_tokens + 1 : sl->n_prompt;
}

/* Entry i's next token after the forward pass (and the log probabilities
 * asked for): its slot is in the batch, so only its device's thread (or a
 * sampling thread working for it) touches its sampler until the lock is
 * taken again. */
static void sample_one(struct dev *d, uint32_t i, struct gpud_sampler_scratch *sc)
{
	const struct gpud_batch_entry *b = &d->ents[i];
	struct slot *sl = d->ent_slot[i];
	int32_t nv = (int32_t)gpud_engine_n_vocab(d->e);
	const float *row;

	if (b->logits == GPUD_LOGITS_NONE) {
		d->ent_id[i] = -ENOENT;
		return;
	}
	row = gpud_engine_logits(d->e, i); /* NULL for an arg max or a draw */
	if (b->logits == GPUD_LOGITS_ALL) {
		/* the prompt's rows (prompt_lp): each the next prompt token's */
		uint32_t a = (uint32_t)(b->tokens - sl->toks), k0, k1;

		/* cannot fail: the ids were checked at submit, top <= 20 */
		prompt_span(sl, b, &k0, &k1);
		for (uint32_t k = k0; k < k1; k++)
			gpud_logprobs_row(row + (size_t)(k - 1 - a) * (size_t)nv, nv, sl->toks[k],
					  sl->top_logprobs, &d->plp[d->ent_row0[i] + k - 1 - a]);
		if (!ent_final(sl, b) || sl->prompt_only) {
			d->ent_id[i] = -ENOENT;
			return;
		}
		row += (size_t)(b->n_tokens - 1) * (size_t)nv; /* the next token's */
	}
	d->ent_id[i] = gpud_engine_sample(d->e, i, sl->smp, sc);
	/* the row a logprobs request always has on the host (add_entry),
	 * read before the next step overwrites it */
	if (sl->logprobs && d->ent_id[i] >= 0 && row &&
	    gpud_logprobs_row(row, nv, d->ent_id[i], sl->top_logprobs, &sl->lp))
		d->ent_id[i] = -EINVAL;
}

/* Takes entries of d's job until none is left; returns how many. */
static uint32_t sample_work(struct dev *d, struct gpud_sampler_scratch *sc)
{
	uint32_t i, k = 0;

	while ((i = atomic_fetch_add(&d->job_next, 1)) < d->job_n) {
		sample_one(d, i, sc);
		k++;
	}
	return k;
}

static void *sampling_main(void *arg)
{
	struct sampling_thread *t = arg;
	struct gpud_sched *s = t->s;
	struct sampling *sm = &s->sm;

	gpud_alloc_set_role(GPUD_ALLOC_OTHER); /* gpud's own: counted */
	pthread_mutex_lock(&sm->mu);
	sm->n_up++;
	pthread_cond_broadcast(&sm->up);
	while (!sm->stop) {
		struct dev *d = NULL;
		uint32_t k;

		for (uint32_t j = 0; j < s->n_dev && !d; j++)
			if (s->devs[j].job_open && atomic_load(&s->devs[j].job_next) < s->devs[j].job_n)
				d = &s->devs[j];
		if (!d) {
			pthread_cond_wait(&sm->go, &sm->mu);
			continue;
		}
		d->job_users++;
		pthread_mutex_unlock(&sm->mu);
		k = sample_work(d, t->sc);
		pthread_mutex_lock(&sm->mu);
		d->job_done += k;
		if (!--d->job_users && d->job_done == d->job_n)
			pthread_cond_signal(&d->job_cv);
	}
	pthread_mutex_unlock(&sm->mu);
	return NULL;
}

uint32_t gpud_sched_sample_threads(uint32_t configured)
{
	long n;

	if (configured)
		return configured;
	n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1u : n > GPUD_SCHED_AUTO_SAMPLE_THREADS ? GPUD_SCHED_AUTO_SAMPLE_THREADS :
								 (uint32_t)n;
}

/* Starts gpud_sched_sample_threads - 1 sampling threads (a device's own
 * thread samples too), each with its scratch, and waits until they run. */
static int sampling_start(struct gpud_sched *s, char *err, size_t errlen)
{
	uint32_t want = gpud_sched_sample_threads(s->p.sample_threads);

	if (want > GPUD_SCHED_MAX_SAMPLE_THREADS)
		return sw_seterr(err, errlen, -EINVAL, "sched: sample_threads %u, at most %u",
				 want, GPUD_SCHED_MAX_SAMPLE_THREADS);
	if (want < 2)
		return 0;
	s->sm.th = calloc(want - 1, sizeof(*s->sm.th));
	if (!s->sm.th)
		return sw_seterr(err, errlen, -ENOMEM, "sched: out of memory");
	s->sm.n_slots = want - 1;
	for (uint32_t i = 0; i < s->sm.n_slots; i++) {
		int rc = gpud_sampler_scratch_create(&s->sm.th[i].sc, (int32_t)s->n_vocab, err,
						     errlen);
		if (rc)
			return rc;
		s->sm.th[i].s = s;
	}
	for (uint32_t i = 0; i < s->sm.n_slots; i++) {
		int rc = pthread_create(&s->sm.th[i].th, NULL, sampling_main, &s->sm.th[i]);
		if (rc)
			return sw_seterr(err, errlen, -rc, "sched: sampling thread: %s",
					 sw_strerror(-rc));
		s->sm.n_th++;
	}
	pthread_mutex_lock(&s->sm.mu);
	while (s->sm.n_up < s->sm.n_th)
		pthread_cond_wait(&s->sm.up, &s->sm.mu);
	pthread_mutex_unlock(&s->sm.mu);
	return 0;
}

/* Samples the n entries of d's step (device thread, lock not held). Rows
 * scanned on the host (the whole sampler, or an arg max the device did
 * not find) are shared with the sampling threads when there are two or
 * more. */
static void sample_step(struct gpud_sched *s, struct dev *d, uint32_t n)
{
	bool dev_argmax = gpud_engine_device_argmax(d->e);
	uint32_t rows = 0, k;

	for (uint32_t i = 0; i < n; i++)
		rows += d->ents[i].logits == GPUD_LOGITS_ALL ? d->ents[i].n_tokens :
			d->ents[i].logits == GPUD_LOGITS_LAST ||
				(d->ents[i].logits == GPUD_LOGITS_ARGMAX && !dev_argmax);
	if (rows < 2 || !s->sm.n_th) {
		for (uint32_t i = 0; i < n; i++)
			sample_one(d, i, d->sc);
		return;
	}
	atomic_store(&d->job_next, 0);
	pthread_mutex_lock(&s->sm.mu);
	d->job_n = n;
	d->job_done = 0;
	d->job_open = true;
	pthread_cond_broadcast(&s->sm.go);
	pthread_mutex_unlock(&s->sm.mu);
	k = sample_work(d, d->sc);
	pthread_mutex_lock(&s->sm.mu);
	d->job_open = false;
	d->job_done += k;
	while (d->job_done < d->job_n || d->job_users)
		pthread_cond_wait(&d->job_cv, &s->sm.mu);
	pthread_mutex_unlock(&s->sm.mu);
}

int gpud_sched_create(struct gpud_sched **out, struct gpud_engine *const *engines, uint32_t n_dev,
		      const struct gpud_sched_params *p, char *err, size_t errlen)
{
	struct gpud_sched *s;
	struct gpud_sampler_params sp;
	int rc;

	*out = NULL;
	if (!engines || !n_dev)
		return sw_seterr(err, errlen, -EINVAL, "sched: no engines");
	if (n_dev > GPUD_SCHED_MAX_DEVICES)
		return sw_seterr(err, errlen, -EINVAL, "sched: %u engines, at most %u", n_dev,
				 GPUD_SCHED_MAX_DEVICES);
	s = calloc(1, sizeof(*s));
	if (!s)
		return sw_seterr(err, errlen, -ENOMEM, "sched: out of memory");
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->idle, NULL);
	pthread_mutex_init(&s->sm.mu, NULL);
	pthread_cond_init(&s->sm.go, NULL);
	pthread_cond_init(&s->sm.up, NULL);
	if (p)
		s->p = *p;
	else
		gpud_sched_params_default(&s->p);
	if (!s->p.max_requests || s->p.max_requests > (1u << 20)) {
		rc = sw_seterr(err, errlen, -EINVAL, "sched: max_requests %u out of range",
			       s->p.max_requests);
		goto out_destroy;
	}
	s->n_dev = n_dev;
	s->devs = calloc(n_dev, sizeof(*s->devs));
	if (!s->devs) {
		rc = sw_seterr(err, errlen, -ENOMEM, "sched: out of memory");
		goto out_destroy;
	}
	s->n_vocab = gpud_engine_n_vocab(engines[0]);
	for (uint32_t d = 0; d < n_dev; d++) {
		if (!engines[d] || gpud_engine_n_vocab(engines[d]) != s->n_vocab) {
			rc = sw_seterr(err, errlen, -EINVAL,
				       "sched: engine %u missing or of another vocabulary", d);
			goto out_destroy;
		}
		rc = dev_init(s, &s->devs[d], engines[d], err, errlen);
		if (rc)
			goto out_destroy;
		if (s->devs[d].n_ctx + 1 > s->tok_cap)
			s->tok_cap = s->devs[d].n_ctx + 1;
		if (s->devs[d].n_ctx / s->devs[d].bt + 1 > s->pfx_cap)
			s->pfx_cap = s->devs[d].n_ctx / s->devs[d].bt + 1;
	}
	s->slots = calloc(s->p.max_requests, sizeof(*s->slots));
	s->free_slots = calloc(s->p.max_requests, sizeof(*s->free_slots));
	s->tok_mem = calloc((size_t)s->p.max_requests * s->tok_cap, sizeof(*s->tok_mem));
	s->pfx_mem = calloc((size_t)s->p.max_requests * s->pfx_cap, sizeof(*s->pfx_mem));
	s->bias_id_mem = calloc((size_t)s->p.max_requests * GPUD_SAMPLER_MAX_BIAS,
				sizeof(*s->bias_id_mem));
	s->bias_val_mem = calloc((size_t)s->p.max_requests * GPUD_SAMPLER_MAX_BIAS,
				 sizeof(*s->bias_val_mem));
	if (!s->slots || !s->free_slots || !s->tok_mem || !s->pfx_mem || !s->bias_id_mem ||
	    !s->bias_val_mem) {
		rc = sw_seterr(err, errlen, -ENOMEM, "sched: out of memory for %u slots",
			       s->p.max_requests);
		goto out_destroy;
	}
	/* slot 0 on top: a fresh scheduler hands slots out in index order */
	for (uint32_t i = 0; i < s->p.max_requests; i++)
		s->free_slots[s->n_free++] = s->p.max_requests - 1 - i;
	gpud_sampler_params_default(&sp);
	for (uint32_t i = 0; i < s->p.max_requests; i++) {
		s->slots[i].toks = s->tok_mem + (size_t)i * s->tok_cap;
		s->slots[i].pfx = s->pfx_mem + (size_t)i * s->pfx_cap;
		s->slots[i].bias_id = s->bias_id_mem + (size_t)i * GPUD_SAMPLER_MAX_BIAS;
		s->slots[i].bias_val = s->bias_val_mem + (size_t)i * GPUD_SAMPLER_MAX_BIAS;
		rc = gpud_sampler_create_light(&s->slots[i].smp, (int32_t)s->n_vocab, &sp, err,
					       errlen);
		if (rc)
			goto out_destroy;
	}
	rc = sampling_start(s, err, errlen);
	if (rc)
		goto out_destroy;
	s->next_id = 1;
	*out = s;
	return 0;

out_destroy:
	gpud_sched_destroy(s);
	return rc;
}

/* --- lists (no allocation: arrays sized at creation) ---------------------- */

/* Takes a free slot (lock held): O(1) from the stack, the most recently
 * freed first. NULL when all max_requests are in use. */
static struct slot *slot_take(struct gpud_sched *s)
{
	struct slot *sl;

	if (!s->n_free)
		return NULL;
	sl = &s->slots[s->free_slots[--s->n_free]];
	sl->state = SLOT_RESERVED;
	return sl;
}

/* Gives a slot back to the stack (lock held). */
static void slot_give(struct gpud_sched *s, struct slot *sl)
{
	sl->state = SLOT_FREE;
	s->free_slots[s->n_free++] = (uint32_t)(sl - s->slots);
}

static void wait_insert(struct dev *d, struct slot *sl)
{
	uint32_t i = d->n_wait;

	while (i > 0 && d->wait[i - 1]->arrival > sl->arrival) {
		d->wait[i] = d->wait[i - 1];
		i--;
	}
	d->wait[i] = sl;
	d->n_wait++;
	d->pending_blocks += blocks_for(sl->n_toks, d->bt);
}

static void wait_remove(struct dev *d, struct slot *sl)
{
	for (uint32_t i = 0; i < d->n_wait; i++) {
		if (d->wait[i] != sl)
			continue;
		memmove(&d->wait[i], &d->wait[i + 1], (d->n_wait - i - 1) * sizeof(*d->wait));
		d->n_wait--;
		d->pending_blocks -= blocks_for(sl->n_toks, d->bt);
		return;
	}
}

static void run_remove(struct dev *d, struct slot *sl)
{
	for (uint32_t i = 0; i < d->n_run; i++) {
		if (d->run[i] != sl)
			continue;
		memmove(&d->run[i], &d->run[i + 1], (d->n_run - i - 1) * sizeof(*d->run));
		d->n_run--;
		return;
	}
}

/* --- prefix cache (lock held, device not busy: evictions change the
 * engine's KV) ---------------------------------------------------------- */

/* Evicts unreferenced cached blocks until want blocks are free again or
 * none is left; returns the blocks freed. */
static uint32_t reclaim(struct dev *d, uint32_t want)
{
	uint32_t before = gpud_engine_free_blocks(d->e), b;

	while (d->pc && gpud_engine_free_blocks(d->e) - before < want &&
	       !gpud_prefix_evict(d->pc, &b))
		gpud_engine_block_release(d->e, b);
	d->free_blocks = gpud_engine_free_blocks(d->e);
	return d->free_blocks - before;
}

/* Blocks held only by the cache (freed by reclaim on demand). */
static uint32_t evictable(const struct dev *d)
{
	struct gpud_prefix_stats st;

	if (!d->pc)
		return 0;
	gpud_prefix_stats(d->pc, &st);
	return st.unreferenced;
}

/* The request stops using its cached blocks (its engine sequence was just
 * freed): release them last first, then trim the cache to its bound. */
static void pfx_drop(struct dev *d, struct slot *sl)
{
	uint32_t b;

	if (!d->pc)
		return;
	while (sl->n_pfx)
		gpud_prefix_release(d->pc, sl->pfx[--sl->n_pfx]);
	sl->pfx_stop = false;
	while (!d->busy && gpud_prefix_over_bound(d->pc) && !gpud_prefix_evict(d->pc, &b))
		gpud_engine_block_release(d->e, b);
}

/* Caches the request's prompt blocks written so far, in order, after its
 * chain of cached blocks (the request keeps using them). */
static void pfx_insert(struct dev *d, struct slot *sl)
{
	uint32_t lim, nb = 0, ent;
	const uint32_t *t;

	if (!d->pc || sl->pfx_stop)
		return;
	lim = min_u32(sl->n_done, sl->n_prompt) / d->bt;
	if (sl->n_pfx >= lim)
		return;
	t = gpud_engine_block_table(d->e, sl->seq, &nb);
	while (sl->n_pfx < lim && sl->n_pfx < nb) {
		uint32_t j = sl->n_pfx;
		uint32_t parent = j ? sl->pfx[j - 1] : GPUD_PREFIX_ROOT;

		if (gpud_prefix_insert(d->pc, parent, sl->toks + (size_t)j * d->bt, sl->mask,
				       j * d->bt, t[j], &ent)) {
			sl->pfx_stop = true;
			return;
		}
		gpud_engine_block_hold(d->e, t[j]);
		sl->pfx[sl->n_pfx++] = ent;
	}
}

/* Admission of sl on d: looks up its cached prompt blocks (never the whole
 * prompt: its last token is computed so that logits exist), makes room
 * (evicting unreferenced cached blocks only when that makes it fit) and
 * claims an engine sequence with the hits attached. Returns 0 (sl->seq,
 * sl->n_done = cached tokens; *adm_b and *free_b updated) or 1 when it
 * does not fit now (nothing changed but the cache's LRU order). */
static int admit(struct dev *d, struct slot *sl, uint32_t *adm_b, uint32_t *free_b)
{
	uint32_t hits = 0, max_hits = 0, need, got;

	if (d->pc && !sl->prompt_lp) { /* the prompt's log probabilities: compute it all */
		max_hits = min_u32(sl->n_prompt, sl->n_toks - 1) / d->bt;
		while (hits < max_hits) {
			uint32_t parent = hits ? sl->pfx[hits - 1] : GPUD_PREFIX_ROOT, ent;

			if (gpud_prefix_lookup(d->pc, parent, sl->toks + (size_t)hits * d->bt,
					       sl->mask, hits * d->bt, &ent))
				break;
			sl->pfx[hits] = ent;
			d->pblocks[hits] = gpud_prefix_block(d->pc, ent);
			sl->n_pfx = ++hits;
		}
	}
	need = blocks_for(sl->n_toks, d->bt) - hits;
	if (need > *adm_b && need <= *adm_b + evictable(d)) {
		got = reclaim(d, need - *adm_b);
		*adm_b += got;
		*free_b += got;
	}
	if (need > *adm_b ||
	    gpud_engine_seq_add_prefix(d->e, sl->mask, d->pblocks, hits, &sl->seq)) {
		while (sl->n_pfx)
			gpud_prefix_release(d->pc, sl->pfx[--sl->n_pfx]);
		return 1;
	}
	*adm_b -= need;
	sl->n_done = hits * d->bt;
	if (d->pc)
		gpud_prefix_account(d->pc, hits, max_hits - hits);
	return 0;
}

/* A request's DONE event and the counts of its end (lock held); its slot
 * is the caller's to free. */
static void report(struct gpud_sched *s, struct slot *sl, int status, int reason, const char *msg)
{
	struct dev *d = &s->devs[sl->dev];
	double t = now_s();
	struct gpud_sched_event ev = {
		.kind = GPUD_SCHED_DONE, .id = sl->id, .status = status, .reason = reason,
		.message = msg ? msg : "",
	};

	ev.usage = (struct gpud_sched_usage){
		.n_prompt = sl->n_prompt,
		.n_gen = sl->stop.n_tokens, /* every sampled id, the last one too */
		.n_preempt = sl->n_preempt,
		.n_cached = sl->n_cached,
		.queue_s = sl->started ? sl->t_start - sl->t_submit : t - sl->t_submit,
		.prefill_s = sl->started ? (sl->t_first ? sl->t_first : t) - sl->t_start : 0,
		.decode_s = sl->t_first ? t - sl->t_first : 0,
	};
	d->depth--;
	s->st.in_flight--;
	s->st.completed++;
	if (status == SW_ECANCELED)
		s->st.cancelled++;
	sl->cb(sl->arg, &ev);
}

/* Frees what a request holds: its engine sequence (the caller guarantees
 * the device is not in a forward pass), its place in a list, its slot. */
static void release(struct gpud_sched *s, struct slot *sl)
{
	struct dev *d = &s->devs[sl->dev];

	if (sl->state == SLOT_RUNNING) {
		gpud_engine_seq_free(d->e, sl->seq);
		pfx_drop(d, sl);
		run_remove(d, sl);
		d->free_blocks = gpud_engine_free_blocks(d->e);
	} else if (sl->state == SLOT_WAITING) {
		wait_remove(d, sl);
	}
	sl->in_batch = false;
	sl->cancel_pending = false;
	sl->ended = false;
	slot_give(s, sl);
}

/* Ends a request: frees what it holds (the device is not in a forward
 * pass), then sends DONE (lock held: nobody can take the slot meanwhile). */
static void complete(struct gpud_sched *s, struct slot *sl, int status, int reason,
		     const char *msg)
{
	release(s, sl);
	report(s, sl, status, reason, msg);
}

static void kick(struct dev *d);

/* Whether a step's error means the device itself is gone: every later
 * call would fail the same way (a CUDA fault is sticky for the context). */
static bool dev_fatal(int rc)
{
	return rc == SW_EDEVICE;
}

/* Fails device d (lock held): every request on it ends with code and msg,
 * and nothing is placed on it again. While d is busy (a forward pass or
 * a device_exec that may never return: a hang), its running requests are
 * only answered; their sequences and slots are freed once it is free
 * again (finish_pending). Returns the requests ended. */
static uint32_t fail_dev_locked(struct gpud_sched *s, struct dev *d, int code, const char *msg)
{
	uint32_t n = 0;

	if (!d->failed) {
		d->failed = code;
		snprintf(d->fail_msg, sizeof(d->fail_msg), "%s", msg && msg[0] ? msg :
			 sw_strerror(code));
	}
	while (d->n_wait) {
		complete(s, d->wait[0], code, 0, d->fail_msg);
		n++;
	}
	for (uint32_t i = 0; i < d->n_run;) {
		struct slot *sl = d->run[i];

		if (!d->busy) {
			complete(s, sl, code, 0, d->fail_msg);
			n++;
			continue;
		}
		if (!sl->ended) {
			sl->ended = true;
			report(s, sl, code, 0, d->fail_msg);
			n++;
		}
		i++;
	}
	kick(d);
	if (s->idle_waiters) /* gpud_sched_block_owners waits no more */
		pthread_cond_broadcast(&s->idle);
	return n;
}

/* Sends ids [0, n_toks) back to waiting on the same device (recompute). */
static void preempt(struct gpud_sched *s, struct dev *d, struct slot *sl)
{
	gpud_engine_seq_free(d->e, sl->seq);
	pfx_drop(d, sl);
	run_remove(d, sl);
	d->free_blocks = gpud_engine_free_blocks(d->e);
	sl->state = SLOT_WAITING;
	sl->n_done = 0;
	sl->n_preempt++;
	sl->wait_since = d->steps;
	wait_insert(d, sl);
	s->st.preemptions++;
	d->preemptions++;
}

/* --- submit / cancel ------------------------------------------------------- */

/* Positions a request may write to the KV cache of a device, or 0 when it
 * cannot run there at all (context). */
static uint32_t max_positions(const struct dev *d, uint32_t n_prompt, uint32_t max_tokens)
{
	if (max_tokens)
		return (uint64_t)n_prompt + max_tokens > d->n_ctx ? 0 : n_prompt + max_tokens - 1;
	return n_prompt <= d->n_ctx ? d->n_ctx : 0;
}

enum place_fail {
	PLACE_DEV_FAILED = 1,  /* the device failed (the least reason: any
				* other holds whatever the device's state) */
	PLACE_NO_MASK_DEV,     /* no device uses the mask's block size */
	PLACE_NO_CTX,          /* beyond every candidate's context */
	PLACE_NO_BLOCKS,       /* more blocks than a candidate owns */
};

/* Whether d could ever take the request: 0, or the first test it fails.
 * Reads only what is fixed at create (no lock needed). Over a set of
 * candidates the highest answer is the refusal to report: no device of the
 * mask's block size, else none with the context, else none with the
 * blocks. */
static enum place_fail dev_refuses(const struct dev *d, uint32_t n_tokens, uint32_t max_tokens,
				   uint32_t mask_bt)
{
	uint32_t pos = max_positions(d, n_tokens, max_tokens);

	if (mask_bt && mask_bt != d->bt)
		return PLACE_NO_MASK_DEV;
	if (!pos)
		return PLACE_NO_CTX;
	if (blocks_for(pos, d->bt) > d->n_blocks)
		return PLACE_NO_BLOCKS;
	return 0;
}

/* The load order (lock held): a before b when a has more free blocks
 * (less what queued prefills will take), then a shorter queue, then fewer
 * prompt tokens placed on it so far (idle devices tie on the first two:
 * without the third the lowest index would take every such request). */
static int64_t eff_free(const struct dev *d)
{
	return (int64_t)d->free_blocks + evictable(d) - (int64_t)d->pending_blocks;
}

static bool less_loaded(const struct dev *a, const struct dev *b)
{
	int64_t ea = eff_free(a), eb = eff_free(b);

	if (ea != eb)
		return ea > eb;
	if (a->depth != b->depth)
		return a->depth < b->depth;
	return a->placed_tokens < b->placed_tokens;
}

/* Prefix probe (lock held): how many of the prompt's full blocks each
 * candidate device caches, in d->pl_hits (0 for a device that refuses).
 * The devices are walked in lockstep, one block per round, each stopping
 * at its first miss, and the walk ends as soon as at most one device still
 * matches: that one holds the most, and by how much does not change the
 * choice. Distinct prompts cost one block probe per device, repeated ones
 * the shared depth plus one; nothing is allocated or pinned. */
static void prefix_probe(const struct gpud_sched *s, const int32_t *tokens, uint32_t n_tokens,
			 const struct gpud_mask *mask, uint32_t first, uint32_t end,
			 const bool *ok)
{
	uint32_t alive = 0;

	for (uint32_t i = first; i < end; i++) {
		struct dev *d = &s->devs[i];

		d->pl_hits = 0;
		d->pl_parent = GPUD_PREFIX_ROOT;
		d->pl_alive = ok[i - first] && d->pc && tokens;
		alive += d->pl_alive;
	}
	for (uint32_t r = 0; alive > 1 || (alive == 1 && r == 0); r++) {
		alive = 0;
		for (uint32_t i = first; i < end; i++) {
			struct dev *d = &s->devs[i];
			uint32_t ent;

			if (!d->pl_alive)
				continue;
			/* as admit(): the last prompt token is always computed */
			if (r >= (n_tokens - 1) / d->bt ||
			    gpud_prefix_peek(d->pc, d->pl_parent, tokens + (size_t)r * d->bt, mask,
					     r * d->bt, &ent)) {
				d->pl_alive = false;
				continue;
			}
			d->pl_parent = ent;
			d->pl_hits = r + 1;
			alive++;
		}
	}
}

/* Placement (lock held) among the candidate devices [first, end) the
 * request fits. By load: less_loaded's order. By prefix (tokens given, prefix
 * cache on): the device caching the most prompt tokens, among those whose
 * queue is at most placement_margin requests longer than the shortest
 * candidate queue (ties by load); load decides when no such device caches
 * a block. mask_bt: the mask's block size, 0 without a mask. Returns the
 * device and *by_prefix, or -1 and *why. */
static int place(const struct gpud_sched *s, const int32_t *tokens, uint32_t n_tokens,
		 uint32_t max_tokens, const struct gpud_mask *mask, uint32_t first, uint32_t end,
		 bool *by_prefix, enum place_fail *why)
{
	bool ok[GPUD_SCHED_MAX_DEVICES];
	const struct dev *best = NULL, *pbest = NULL;
	uint32_t min_depth = UINT32_MAX, mask_bt = mask ? mask->block_tokens : 0;
	int best_dev = -1, pbest_dev = -1;
	enum place_fail worst = 0;

	*by_prefix = false;
	for (uint32_t i = first; i < end; i++) {
		const struct dev *d = &s->devs[i];
		enum place_fail f = dev_refuses(d, n_tokens, max_tokens, mask_bt);

		if (!f && d->failed)
			f = PLACE_DEV_FAILED;
		ok[i - first] = !f;
		if (f) {
			if (f > worst)
				worst = f;
			continue;
		}
		if (d->depth < min_depth)
			min_depth = d->depth;
		if (!best || less_loaded(d, best)) {
			best = d;
			best_dev = (int)i;
		}
	}
	if (!best) {
		*why = worst;
		return -1;
	}
	if (!tokens || end - first < 2)
		return best_dev;
	prefix_probe(s, tokens, n_tokens, mask, first, end, ok);
	for (uint32_t i = first; i < end; i++) {
		const struct dev *d = &s->devs[i];
		uint64_t have = (uint64_t)d->pl_hits * d->bt;
		uint64_t top = pbest ? (uint64_t)pbest->pl_hits * pbest->bt : 0;

		if (!ok[i - first] || !d->pl_hits ||
		    d->depth > (uint64_t)min_depth + s->p.placement_margin)
			continue;
		if (!pbest || have > top || (have == top && less_loaded(d, pbest))) {
			pbest = d;
			pbest_dev = (int)i;
		}
	}
	if (!pbest)
		return best_dev;
	*by_prefix = true;
	return pbest_dev;
}

uint32_t gpud_sched_pick_device(struct gpud_sched *s, const int32_t *tokens, uint32_t n_tokens,
				uint32_t max_tokens, const struct gpud_mask *mask,
				enum gpud_sched_placed *placed)
{
	enum place_fail why;
	bool by_prefix;
	int d;

	pthread_mutex_lock(&s->lock);
	d = place(s, tokens, n_tokens, max_tokens, mask, 0, s->n_dev, &by_prefix, &why);
	pthread_mutex_unlock(&s->lock);
	if (placed)
		*placed = by_prefix ? GPUD_SCHED_PLACED_PREFIX : GPUD_SCHED_PLACED_LOAD;
	return d < 0 ? 0 : (uint32_t)d;
}

/* Tells dev's thread (in gpud_sched_wait) that something changed. */
static void kick(struct dev *d)
{
	d->kicked = true;
	pthread_cond_broadcast(&d->cond);
}

/* The devices r may go to: [*first, *end). */
static void candidates(const struct gpud_sched *s, const struct gpud_sched_req *r,
		       uint32_t *first, uint32_t *end)
{
	*first = r->pin_device ? r->device : 0;
	*end = r->pin_device ? r->device + 1 : s->n_dev;
}

static int place_error(const struct gpud_sched *s, const struct gpud_sched_req *r,
		       uint32_t first, enum place_fail why, char *err, size_t errlen)
{
	if (why == PLACE_DEV_FAILED) {
		for (uint32_t i = first; i < s->n_dev; i++)
			if (s->devs[i].failed)
				return sw_seterr(err, errlen, s->devs[i].failed,
						 "sched: device %u failed: %s", i,
						 s->devs[i].fail_msg);
	}
	if (why == PLACE_NO_MASK_DEV)
		return sw_seterr(err, errlen, -EINVAL,
				 "sched: mask compiled for %u-token KV blocks, no device uses "
				 "that size", r->mask->block_tokens);
	if (why == PLACE_NO_CTX)
		return sw_seterr(err, errlen, SW_ETOOLONG,
				 "sched: prompt of %u tokens + max_tokens %u exceeds the context "
				 "of every device (%u)", r->n_tokens, r->max_tokens,
				 s->devs[first].n_ctx);
	return sw_seterr(err, errlen, SW_ETOOLONG,
			 "sched: request of %u prompt tokens + max_tokens %u needs more "
			 "KV blocks than a device owns (%u)", r->n_tokens, r->max_tokens,
			 s->devs[first].n_blocks);
}

/* Submit, step 1 (no lock: it reads the request and what is fixed at
 * create, and scans the whole prompt): the request is well formed and
 * some candidate device could ever hold it. */
static int submit_check(const struct gpud_sched *s, const struct gpud_sched_req *r, char *err,
			size_t errlen)
{
	enum place_fail why = 0;
	uint32_t first, end;
	int rc;

	if (!r->n_tokens || !r->tokens || !r->cb)
		return sw_seterr(err, errlen, -EINVAL, "sched: empty prompt or no callback");
	for (uint32_t i = 0; i < r->n_tokens; i++) {
		if (r->tokens[i] < 0 || (uint32_t)r->tokens[i] >= s->n_vocab)
			return sw_seterr(err, errlen, -EINVAL,
					 "sched: prompt token %u (id %d) outside the vocabulary "
					 "of %u", i, r->tokens[i], s->n_vocab);
	}
	if (r->mask && r->mask->n_prompt != r->n_tokens)
		return sw_seterr(err, errlen, -EINVAL,
				 "sched: mask compiled for %u prompt tokens, request has %u",
				 r->mask->n_prompt, r->n_tokens);
	rc = gpud_sampler_params_check(&r->sampling, err, errlen);
	if (rc)
		return rc;
	if (r->n_bias && (!r->bias_id || !r->bias))
		return sw_seterr(err, errlen, -EINVAL, "sched: logit biases NULL");
	rc = gpud_sampler_bias_check(r->bias_id, r->bias, r->n_bias, (int32_t)s->n_vocab, err,
				     errlen);
	if (rc)
		return rc;
	if (r->top_logprobs > GPUD_LOGPROBS_TOP_MAX || (r->top_logprobs && !r->logprobs))
		return sw_seterr(err, errlen, -EINVAL, "sched: top_logprobs %u (at most %d, and "
				 "only with logprobs)", r->top_logprobs, GPUD_LOGPROBS_TOP_MAX);
	if ((r->prompt_logprobs && !r->logprobs) || (r->prompt_only && !r->prompt_logprobs))
		return sw_seterr(err, errlen, -EINVAL, "sched: the prompt's log probabilities need "
				 "logprobs, and prompt_only needs them");
	if (r->pin_device && r->device >= s->n_dev)
		return sw_seterr(err, errlen, -EINVAL, "sched: pinned to device %u of %u",
				 r->device, s->n_dev);
	candidates(s, r, &first, &end);
	for (uint32_t i = first; i < end; i++) {
		enum place_fail f = dev_refuses(&s->devs[i], r->n_tokens, r->max_tokens,
						r->mask ? r->mask->block_tokens : 0);
		if (!f)
			return 0;
		if (f > why)
			why = f;
	}
	return place_error(s, r, first, why, err, errlen);
}

/* Submit, step 3 (no lock: sl is SLOT_RESERVED, this submit's alone):
 * the stop filter, the sampler with the prompt in its penalty window, the
 * prompt copy and the per-request state. Nothing another thread reads. */
static int slot_fill(struct slot *sl, const struct gpud_sched_req *r, char *err, size_t errlen)
{
	int rc;

	gpud_stop_init(&sl->stop, r->max_tokens);
	for (uint32_t i = 0; i < r->n_stop; i++) {
		rc = gpud_stop_add(&sl->stop, r->stop[i], strlen(r->stop[i]));
		if (rc)
			return sw_seterr(err, errlen, rc, "sched: stop string %u: %s", i,
					 sw_strerror(rc));
	}
	rc = gpud_sampler_reset(sl->smp, &r->sampling, err, errlen);
	if (rc)
		return rc;
	if (r->n_bias) {
		memcpy(sl->bias_id, r->bias_id, r->n_bias * sizeof(*sl->bias_id));
		memcpy(sl->bias_val, r->bias, r->n_bias * sizeof(*sl->bias_val));
		gpud_sampler_set_bias(sl->smp, sl->bias_id, sl->bias_val, r->n_bias);
	}
	for (uint32_t i = 0; i < r->n_tokens; i++)
		gpud_sampler_accept(sl->smp, r->tokens[i]);
	memcpy(sl->toks, r->tokens, r->n_tokens * sizeof(*sl->toks));
	gpud_detok_init_continuation(&sl->detok);
	sl->n_prompt = r->n_tokens;
	sl->n_toks = r->n_tokens;
	sl->n_done = 0;
	sl->max_gen = r->max_tokens;
	sl->n_preempt = 0;
	sl->in_batch = false;
	sl->cancel_pending = false;
	sl->started = false;
	sl->n_pfx = 0;
	sl->pfx_stop = false;
	sl->n_cached = 0;
	sl->t_start = sl->t_first = 0;
	sl->mask = r->mask;
	sl->cb = r->cb;
	sl->arg = r->arg;
	sl->logprobs = r->logprobs;
	sl->top_logprobs = r->top_logprobs;
	sl->prompt_lp = r->prompt_logprobs;
	sl->prompt_only = r->prompt_only;
	sl->lp_sent = 0;
	return 0;
}

/* Counts a placement decision on the device it chose. */
static void r_placed_count(struct dev *d, enum gpud_sched_placed why)
{
	if (why == GPUD_SCHED_PLACED_PREFIX)
		d->placed_prefix++;
	else if (why == GPUD_SCHED_PLACED_LOAD)
		d->placed_load++;
}

/* Submit, step 4 (lock held): places the filled slot on a device and
 * queues it; from here on it is visible to steps and cancels. Returns 0
 * and *id, or the placement error (cannot happen after submit_check:
 * whether a device fits does not change after create). */
static int submit_enqueue(struct gpud_sched *s, struct slot *sl, const struct gpud_sched_req *r,
			  uint64_t *id, char *err, size_t errlen)
{
	enum place_fail why = 0;
	uint32_t first, end;
	bool by_prefix;
	struct dev *d;
	int dev;

	candidates(s, r, &first, &end);
	dev = place(s, r->tokens, r->n_tokens, r->max_tokens, r->mask, first, end, &by_prefix,
		    &why);
	if (dev < 0)
		return place_error(s, r, first, why, err, errlen);
	d = &s->devs[dev];
	d->placed_tokens += r->n_tokens;
	if (!r->pin_device)
		r_placed_count(d, by_prefix ? GPUD_SCHED_PLACED_PREFIX : GPUD_SCHED_PLACED_LOAD);
	else
		r_placed_count(d, r->placed);
	sl->state = SLOT_WAITING;
	sl->id = s->next_id++;
	sl->dev = (uint32_t)dev;
	sl->arrival = s->next_arrival++;
	sl->wait_since = d->steps;
	sl->t_submit = now_s();
	wait_insert(d, sl);
	d->depth++;
	kick(d);
	s->st.admitted++;
	s->st.in_flight++;
	*id = sl->id;
	return 0;
}

/* In steps, so that nothing proportional to the prompt or the vocabulary
 * runs under the scheduler lock: check (no lock), take a slot (lock), fill
 * it (no lock), place and queue (lock). A request with several faults is
 * refused for the first of: malformed, can never fit, no free slot, bad
 * stop string. */
int gpud_sched_submit(struct gpud_sched *s, const struct gpud_sched_req *r, uint64_t *id,
		      char *err, size_t errlen)
{
	struct slot *sl = NULL;
	int rc;

	*id = 0;
	rc = submit_check(s, r, err, errlen);
	if (rc)
		goto out_refuse;
	pthread_mutex_lock(&s->lock);
	sl = slot_take(s); /* step 2 */
	pthread_mutex_unlock(&s->lock);
	if (!sl) {
		rc = sw_seterr(err, errlen, SW_EBUSY, "sched: all %u request slots are in use",
			       s->p.max_requests);
		goto out_refuse;
	}
	rc = slot_fill(sl, r, err, errlen);
	if (rc)
		goto out_refuse;
	pthread_mutex_lock(&s->lock);
	rc = submit_enqueue(s, sl, r, id, err, errlen);
	if (!rc) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	pthread_mutex_unlock(&s->lock);

out_refuse:
	pthread_mutex_lock(&s->lock);
	if (sl)
		slot_give(s, sl);
	s->st.refused++;
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int gpud_sched_cancel(struct gpud_sched *s, uint64_t id)
{
	int rc = SW_ENOTFOUND;

	pthread_mutex_lock(&s->lock);
	for (uint32_t i = 0; i < s->p.max_requests && id; i++) {
		struct slot *sl = &s->slots[i];

		/* a slot being filled by a submit has no id yet: skip it unread */
		if ((sl->state != SLOT_WAITING && sl->state != SLOT_RUNNING) || sl->id != id ||
		    sl->cancel_pending || sl->ended)
			continue;
		if (sl->state == SLOT_RUNNING && s->devs[sl->dev].busy)
			sl->cancel_pending = true; /* its device completes it after the pass */
		else
			complete(s, sl, SW_ECANCELED, 0, "cancelled");
		kick(&s->devs[sl->dev]);
		rc = 0;
		break;
	}
	pthread_mutex_unlock(&s->lock);
	return rc;
}

/* --- step ------------------------------------------------------------------ */

/* Tokens seq can take from its last block plus free blocks. */
static uint32_t fit_tokens(const struct dev *d, uint32_t len, uint32_t free_blocks)
{
	uint32_t room = len % d->bt ? d->bt - len % d->bt : 0;
	uint64_t n = room + (uint64_t)free_blocks * d->bt;

	return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* Before sl's next prefill chunk (lock held, device not busy): copies in
 * the cached self-only segments that start where its prefill stands
 * (gpud_engine_chunk_reuse), within *free_b blocks (less what they take),
 * and returns at most how many tokens the chunk should compute so that it
 * ends where the next cached segment starts. */
static uint32_t chunk_reuse(struct dev *d, struct slot *sl, uint32_t *free_b)
{
	uint32_t got = 0, before, until;

	if (!gpud_engine_chunk_enabled(d->e) || !sl->mask || sl->n_done >= sl->n_prompt ||
	    sl->prompt_lp)
		return UINT32_MAX;
	before = gpud_engine_free_blocks(d->e);
	if (!gpud_engine_chunk_reuse(d->e, sl->seq, sl->toks, sl->n_prompt, *free_b, &got) &&
	    got) {
		uint32_t used = before - gpud_engine_free_blocks(d->e);
		*free_b -= used < *free_b ? used : *free_b;
		sl->n_done += got;
		if (!sl->n_preempt)
			sl->n_cached += got;
		d->free_blocks = gpud_engine_free_blocks(d->e);
	}
	/* 0 (a cached segment next that did not fit): compute it then */
	until = gpud_engine_chunk_until(d->e, sl->seq, sl->toks, sl->n_prompt);
	return until ? until : UINT32_MAX;
}

/* Whether sl's next chunk computes a row for every token: its prompt's
 * log probabilities, some of them not sent yet. */
static bool wants_rows(const struct slot *sl)
{
	return sl->prompt_lp && sl->lp_sent < sl->n_prompt && sl->n_done < sl->n_prompt;
}

/* A chunk of such a slot within the step's spare rows (one row an entry
 * is always there). */
static uint32_t rows_cap(const struct dev *d, const struct slot *sl, uint32_t chunk)
{
	return wants_rows(sl) ? min_u32(chunk, 1 + d->lp_rows_left) : chunk;
}

static void add_entry(struct dev *d, uint32_t *n, struct slot *sl, uint32_t chunk)
{
	enum gpud_logits_mode mode = GPUD_LOGITS_NONE;

	/* The last chunk's row: an arg max, or a draw where the row is when
	 * the device draws (the sampler's PRNG advances once the token is
	 * read: gpud_engine_sample), or the row for the host's sampler. A
	 * prompt whose log probabilities are wanted: every row. */
	d->ent_row0[*n] = d->rows_planned;
	if (wants_rows(sl)) {
		mode = GPUD_LOGITS_ALL;
		d->lp_rows_left -= chunk - 1; /* rows_cap kept it within */
	} else if (sl->n_done + chunk >= sl->n_toks)
		mode = sl->logprobs ? GPUD_LOGITS_LAST :
		       gpud_sampler_greedy(sl->smp) ? GPUD_LOGITS_ARGMAX :
		       gpud_engine_device_draw(d->e) && gpud_sampler_draw_next(sl->smp, &d->draws[*n]) ?
							     GPUD_LOGITS_DRAW :
							     GPUD_LOGITS_LAST;
	d->rows_planned += mode == GPUD_LOGITS_ALL ? chunk : mode != GPUD_LOGITS_NONE;
	d->ents[*n] = (struct gpud_batch_entry){
		.seq = sl->seq, .tokens = sl->toks + sl->n_done, .n_tokens = chunk,
		.logits = mode,
	};
	d->ent_slot[*n] = sl;
	sl->in_batch = true;
	(*n)++;
}

/* Plans one batch (lock held). Returns the number of entries. */
static uint32_t plan(struct gpud_sched *s, struct dev *d)
{
	uint32_t n, free_b, adm_b, tok_left, later;

again:
	later = 0;
	d->lp_rows_left = d->lp_rows;
	d->rows_planned = 0;
	/* 1. decode entries of running sequences; preempt the most recently
	 * admitted while their new blocks do not fit. */
	n = 0;
	free_b = d->free_blocks;
	for (uint32_t i = 0; i < d->n_run; i++) {
		struct slot *sl = d->run[i];
		uint32_t need;

		if (sl->n_toks - sl->n_done != 1)
			continue;
		if (n == d->max_ents || n == d->max_tokens)
			break;
		need = gpud_engine_blocks_needed(d->e, sl->seq, 1);
		if (need > free_b)
			free_b += reclaim(d, need - free_b);
		if (need > free_b) {
			for (uint32_t j = 0; j < n; j++)
				d->ent_slot[j]->in_batch = false;
			preempt(s, d, d->run[d->n_run - 1]);
			goto again;
		}
		free_b -= need;
		add_entry(d, &n, sl, 1);
	}
	tok_left = d->max_tokens - n;
	/* 2. sequences part-way through their prefill. */
	for (uint32_t i = 0; i < d->n_run && n < d->max_ents && tok_left; i++) {
		struct slot *sl = d->run[i];
		uint32_t rem = sl->n_toks - sl->n_done, chunk;

		if (rem <= 1)
			continue;
		chunk = min_u32(chunk_reuse(d, sl, &free_b), tok_left);
		rem = sl->n_toks - sl->n_done;
		chunk = rows_cap(d, sl, min_u32(rem, chunk));
		if (fit_tokens(d, sl->n_done, free_b) < chunk) {
			uint32_t want = gpud_engine_blocks_needed(d->e, sl->seq, chunk);
			free_b += reclaim(d, want - free_b);
		}
		chunk = min_u32(chunk, fit_tokens(d, sl->n_done, free_b));
		if (!chunk)
			continue;
		free_b -= gpud_engine_blocks_needed(d->e, sl->seq, chunk);
		/* blocks the rest of its prefill will take later */
		later += blocks_for(sl->n_toks, d->bt) - blocks_for(sl->n_done + chunk, d->bt);
		tok_left -= chunk;
		add_entry(d, &n, sl, chunk);
	}
	adm_b = free_b > later ? free_b - later : 0;
	/* 3. waiting requests, FCFS; an aged one is never bypassed. A request
	 * is admitted only when the blocks of its whole prefill are free. */
	for (uint32_t i = 0; i < d->n_wait && n < d->max_ents && tok_left;) {
		struct slot *sl = d->wait[i];
		uint32_t chunk;
		bool aged = !s->p.aging_steps || d->steps - sl->wait_since >= s->p.aging_steps;

		if (d->n_run == d->max_engine_seqs || admit(d, sl, &adm_b, &free_b)) {
			if (aged)
				break;
			i++;
			continue;
		}
		wait_remove(d, sl); /* shifts the list: i now names the next one */
		d->run[d->n_run++] = sl;
		sl->state = SLOT_RUNNING;
		if (!sl->started) {
			sl->started = true;
			sl->t_start = now_s();
			sl->n_cached = sl->n_done;
		}
		chunk = min_u32(chunk_reuse(d, sl, &free_b), tok_left);
		chunk = rows_cap(d, sl, min_u32(sl->n_toks - sl->n_done, chunk));
		free_b -= gpud_engine_blocks_needed(d->e, sl->seq, chunk);
		tok_left -= chunk;
		add_entry(d, &n, sl, chunk);
	}
	if (!n && d->n_run) {
		/* Running sequences but none can make progress (prefills that
		 * lack blocks): recompute the most recently admitted. */
		preempt(s, d, d->run[d->n_run - 1]);
		goto again;
	}
	return n;
}

/* The device's thread takes the engine back (lock held). */
static void leave_busy(struct gpud_sched *s, struct dev *d)
{
	d->busy = false;
	if (s->idle_waiters)
		pthread_cond_broadcast(&s->idle);
}

/* Completes cancels that arrived while the device was busy, for requests
 * outside the batch, and frees the requests a failure answered meanwhile
 * (lock held, device not busy). */
static void finish_pending(struct gpud_sched *s, struct dev *d)
{
	for (uint32_t i = 0; i < d->n_run;) {
		struct slot *sl = d->run[i];
		if (sl->ended)
			release(s, sl);
		else if (sl->cancel_pending)
			complete(s, sl, SW_ECANCELED, 0, "cancelled");
		else
			i++;
	}
	d->free_blocks = gpud_engine_free_blocks(d->e);
}

/* Streams the prompt's log probabilities entry i's rows gave (and, at
 * the prompt's start, its first token's, which has none). Returns true
 * when the request ended: the caller stopped it, or it wanted nothing
 * more. */
static bool finish_prompt(struct gpud_sched *s, struct dev *d, uint32_t i)
{
	const struct gpud_batch_entry *b = &d->ents[i];
	struct slot *sl = d->ent_slot[i];
	struct gpud_sched_event ev = { .kind = GPUD_SCHED_PROMPT_TOKEN, .id = sl->id, .text = "" };
	uint32_t a = (uint32_t)(b->tokens - sl->toks), k0, k1;

	prompt_span(sl, b, &k0, &k1);
	if (sl->lp_sent == 0) {
		struct gpud_logprobs none = { .logprob = NAN };
		ev.token = sl->toks[0];
		ev.prompt_pos = 0;
		ev.logprobs = &none;
		if (sl->cb(sl->arg, &ev)) {
			complete(s, sl, 0, GPUD_GEN_STOP_CALLER, NULL);
			return true;
		}
		sl->lp_sent = 1;
	}
	for (uint32_t k = k0; k < k1; k++) {
		ev.token = sl->toks[k];
		ev.prompt_pos = k;
		ev.logprobs = &d->plp[d->ent_row0[i] + k - 1 - a];
		if (sl->cb(sl->arg, &ev)) {
			complete(s, sl, 0, GPUD_GEN_STOP_CALLER, NULL);
			return true;
		}
		sl->lp_sent = k + 1;
	}
	if (sl->prompt_only && sl->lp_sent >= sl->n_prompt) {
		complete(s, sl, 0, GPUD_STOP_MAX_TOKENS, NULL);
		return true;
	}
	return false;
}

/* Samples, streams and maybe completes entry i's request after a step. */
static void finish_entry(struct gpud_sched *s, struct dev *d, uint32_t i)
{
	struct slot *sl = d->ent_slot[i];
	const struct gpud_batch_entry *b = &d->ents[i];
	struct gpud_sched_event ev = { .kind = GPUD_SCHED_TOKEN, .id = sl->id };
	size_t olen = 0, o2 = 0;
	int32_t id;
	int n = 0, reason, cbrc;
	bool eog;

	sl->in_batch = false;
	sl->n_done += b->n_tokens;
	pfx_insert(d, sl);
	if (sl->mask && b->tokens < sl->toks + sl->n_prompt)
		gpud_engine_chunk_store(d->e, sl->seq, sl->toks, sl->n_prompt);
	if (b->logits == GPUD_LOGITS_NONE)
		return;
	if (b->logits == GPUD_LOGITS_ALL && (finish_prompt(s, d, i) || !ent_final(sl, b)))
		return;
	id = d->ent_id[i];
	if (id < 0) {
		complete(s, sl, id, 0, "sched: no token can be sampled");
		return;
	}
	gpud_sampler_accept(sl->smp, id);
	s->st.generated++;
	d->generated++;
	if (!sl->t_first)
		sl->t_first = now_s();
	eog = gpud_tokenizer_is_eog(d->tok, id);
	if (!eog) {
		n = gpud_detok_push(d->tok, &sl->detok, id, sl->piece, sizeof(sl->piece));
		if (n < 0)
			n = 0;
	}
	reason = gpud_stop_push(&sl->stop, eog, sl->piece, (size_t)n, sl->out, OUT_CAP, &olen);
	if (reason == GPUD_STOP_NONE && sl->n_done >= d->n_ctx) {
		/* Context full: release what is held back, as generate does. */
		reason = GPUD_GEN_STOP_CONTEXT;
		n = gpud_detok_flush(&sl->detok, sl->piece, sizeof(sl->piece));
		gpud_stop_push(&sl->stop, true, sl->piece, n > 0 ? (size_t)n : 0, sl->out2,
			       sizeof(sl->out2), &o2);
		memcpy(sl->out + olen, sl->out2, o2);
		olen += o2;
	}
	if (reason == GPUD_STOP_NONE)
		sl->toks[sl->n_toks++] = id;
	ev.token = id;
	ev.text = sl->out;
	ev.len = olen;
	ev.logprobs = sl->logprobs ? &sl->lp : NULL;
	cbrc = sl->cb(sl->arg, &ev);
	if (reason == GPUD_STOP_NONE && cbrc)
		reason = GPUD_GEN_STOP_CALLER;
	if (reason != GPUD_STOP_NONE)
		complete(s, sl, 0, reason, NULL);
}

int gpud_sched_step(struct gpud_sched *s, uint32_t dev, char *err, size_t errlen)
{
	struct dev *d;
	uint32_t n, tokens = 0;
	int rc, tries = 0;

	if (dev >= s->n_dev)
		return sw_seterr(err, errlen, -EINVAL, "sched: no device %u", dev);
	d = &s->devs[dev];
	pthread_mutex_lock(&s->lock);
	if (d->busy) {
		pthread_mutex_unlock(&s->lock);
		return sw_seterr(err, errlen, SW_EBUSY,
				 "sched: device %u is being stepped by another thread", dev);
	}
retry:
	n = d->failed ? 0 : plan(s, d);
	if (!n) {
		pthread_mutex_unlock(&s->lock);
		return 0;
	}
	if (gpud_engine_chunk_enabled(d->e)) {
		/* the step's blocks now, under the lock: the step then leaves
		 * the chunk cache alone */
		uint64_t want = 0;
		for (uint32_t i = 0; i < n; i++)
			want += gpud_engine_blocks_needed(d->e, d->ents[i].seq,
							  d->ents[i].n_tokens);
		gpud_engine_chunk_reclaim(d->e, want);
	}
	d->busy = true;
	pthread_mutex_unlock(&s->lock);
	rc = gpud_engine_step_draws(d->e, d->ents, d->draws, n, err, errlen);
	if (!rc)
		sample_step(s, d, n); /* wasted when the device fails meanwhile */
	pthread_mutex_lock(&s->lock);
	leave_busy(s, d);
	if (d->failed) {
		/* failed during the pass (gpud_sched_fail_device: a hang, seen
		 * by a watchdog): its requests were answered then; free them */
		rc = sw_seterr(err, errlen, d->failed, "sched: device %u failed: %s", dev,
			       d->fail_msg);
		goto out;
	}
	if (rc == SW_EEXHAUSTED && tries++ < 4) {
		/* The plan's block count was short (should not happen): recompute
		 * the most recently admitted and plan again. */
		for (uint32_t i = 0; i < n; i++)
			d->ent_slot[i]->in_batch = false;
		preempt(s, d, d->run[d->n_run - 1]);
		goto retry;
	}
	if (rc) {
		for (uint32_t i = 0; i < n; i++) {
			struct slot *sl = d->ent_slot[i];
			if (sl->state != SLOT_FREE)
				complete(s, sl, rc, 0, err);
		}
		if (dev_fatal(rc))
			fail_dev_locked(s, d, rc, err);
		goto out;
	}
	d->steps++;
	s->st.steps++;
	for (uint32_t i = 0; i < n; i++)
		tokens += d->ents[i].n_tokens;
	s->st.tokens += tokens;
	d->tokens += tokens;
	for (uint32_t i = 0; i < n; i++) {
		struct slot *sl = d->ent_slot[i];

		if (sl->cancel_pending) {
			sl->in_batch = false;
			complete(s, sl, SW_ECANCELED, 0, "cancelled");
			continue;
		}
		finish_entry(s, d, i);
	}
	rc = (int)n;
out:
	finish_pending(s, d);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

void gpud_sched_stats(struct gpud_sched *s, struct gpud_sched_stats *st)
{
	pthread_mutex_lock(&s->lock);
	*st = s->st;
	pthread_mutex_unlock(&s->lock);
}

uint32_t gpud_sched_queue_depth(struct gpud_sched *s, uint32_t dev)
{
	uint32_t n;

	if (dev >= s->n_dev)
		return 0;
	pthread_mutex_lock(&s->lock);
	n = s->devs[dev].depth;
	pthread_mutex_unlock(&s->lock);
	return n;
}

void gpud_sched_wait(struct gpud_sched *s, uint32_t dev, uint32_t timeout_ms)
{
	struct timespec ts;
	struct dev *d;

	if (dev >= s->n_dev)
		return;
	d = &s->devs[dev];
	clock_gettime(CLOCK_MONOTONIC, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&s->lock);
	/* A kick while this thread was not waiting is remembered (kicked), so
	 * a stop flag set before gpud_sched_wake is never missed. */
	while (!d->n_wait && !d->n_run && !d->kicked) {
		if (pthread_cond_timedwait(&d->cond, &s->lock, &ts) == ETIMEDOUT)
			break;
	}
	d->kicked = false;
	pthread_mutex_unlock(&s->lock);
}

void gpud_sched_wake(struct gpud_sched *s)
{
	pthread_mutex_lock(&s->lock);
	for (uint32_t d = 0; d < s->n_dev; d++)
		kick(&s->devs[d]);
	pthread_mutex_unlock(&s->lock);
}

int gpud_sched_device_exec(struct gpud_sched *s, uint32_t dev,
			   int (*fn)(struct gpud_engine *e, void *arg), void *arg)
{
	return gpud_sched_device_exec_blocks(s, dev, 0, fn, arg);
}

int gpud_sched_device_exec_blocks(struct gpud_sched *s, uint32_t dev, uint32_t blocks,
				  int (*fn)(struct gpud_engine *e, void *arg), void *arg)
{
	struct dev *d;
	int rc;

	if (dev >= s->n_dev || !fn)
		return -EINVAL;
	d = &s->devs[dev];
	pthread_mutex_lock(&s->lock);
	if (d->busy) {
		pthread_mutex_unlock(&s->lock);
		return SW_EBUSY;
	}
	/* cached blocks no request uses give way to what fn needs */
	if (d->free_blocks < blocks)
		reclaim(d, blocks - d->free_blocks);
	gpud_engine_chunk_reclaim(d->e, blocks); /* counted in free_blocks already */
	d->busy = true;
	pthread_mutex_unlock(&s->lock);
	rc = fn(d->e, arg);
	pthread_mutex_lock(&s->lock);
	leave_busy(s, d);
	finish_pending(s, d);
	pthread_mutex_unlock(&s->lock);
	return rc;
}

int gpud_sched_fail_device(struct gpud_sched *s, uint32_t dev, int code, const char *msg)
{
	uint32_t n;

	if (dev >= s->n_dev || code >= 0)
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	n = fail_dev_locked(s, &s->devs[dev], code, msg);
	pthread_mutex_unlock(&s->lock);
	return (int)n;
}

int gpud_sched_device_stats(struct gpud_sched *s, uint32_t dev,
			    struct gpud_sched_device_stats *st)
{
	const struct dev *d;

	if (dev >= s->n_dev)
		return -EINVAL;
	d = &s->devs[dev];
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&s->lock);
	st->queue = d->depth;
	st->running = d->n_run;
	st->steps = d->steps;
	st->tokens = d->tokens;
	st->generated = d->generated;
	st->preemptions = d->preemptions;
	st->placed_prefix = d->placed_prefix;
	st->placed_load = d->placed_load;
	st->failed = d->failed;
	{
		/* changed only under the lock (plan, finish_entry) */
		struct gpud_chunk_stats cs;

		gpud_engine_chunk_stats(d->e, &cs);
		st->chunk_hits = cs.hits;
		st->chunk_misses = cs.misses;
		st->chunk_evictions = cs.evictions;
		st->chunk_hit_tokens = cs.hit_tokens;
		st->chunk_entries = cs.entries;
		st->chunk_blocks = cs.blocks;
		st->chunk_bytes = cs.bytes;
		st->chunk_max_bytes = cs.max_bytes;
	}
	if (d->pc) {
		struct gpud_prefix_stats ps;

		gpud_prefix_stats(d->pc, &ps);
		st->prefix_hits = ps.hits;
		st->prefix_misses = ps.misses;
		st->prefix_evictions = ps.evictions;
		st->prefix_hit_tokens = ps.hit_tokens;
		st->prefix_blocks = ps.entries;
		st->prefix_unreferenced = ps.unreferenced;
		st->prefix_bytes = ps.bytes;
		st->prefix_max_bytes = ps.max_bytes;
	}
	pthread_mutex_unlock(&s->lock);
	return 0;
}

#define OWNER_FREE UINT32_MAX

int gpud_sched_block_owners(struct gpud_sched *s, uint32_t dev,
			    void (*fn)(void *arg, uint32_t block, const char *kind, uint64_t id),
			    void *arg)
{
	struct dev *d;

	if (dev >= s->n_dev || !fn)
		return -EINVAL;
	d = &s->devs[dev];
	pthread_mutex_lock(&s->lock);
	/* The engine changes block tables during a pass: wait for its end,
	 * or for the device to be failed (a pass that never ends). */
	while (d->busy && !d->failed) {
		s->idle_waiters++;
		pthread_cond_wait(&s->idle, &s->lock);
		s->idle_waiters--;
	}
	if (d->failed) {
		pthread_mutex_unlock(&s->lock);
		return d->failed;
	}
	for (uint32_t b = 0; b < d->n_blocks; b++)
		d->owner[b] = OWNER_FREE;
	for (uint32_t i = 0; i < d->n_run; i++) {
		const struct slot *sl = d->run[i];
		uint32_t nb = 0;
		const uint32_t *t = gpud_engine_block_table(d->e, sl->seq, &nb);

		for (uint32_t j = 0; j < nb; j++)
			if (t[j] < d->n_blocks)
				d->owner[t[j]] = (uint32_t)(sl - s->slots);
	}
	for (uint32_t b = 0; b < d->n_blocks; b++) {
		uint32_t ent = d->pc ? gpud_prefix_block_entry(d->pc, b) : GPUD_PREFIX_ROOT;

		if (ent != GPUD_PREFIX_ROOT)
			fn(arg, b, gpud_prefix_users(d->pc, ent) ? "shared" : "prefix",
			   gpud_prefix_key(d->pc, ent));
		else if (gpud_engine_chunk_holds(d->e, b))
			fn(arg, b, "chunk", 0);
		else if (d->owner[b] == OWNER_FREE)
			fn(arg, b, "free", 0);
		else
			fn(arg, b, "request", s->slots[d->owner[b]].id);
	}
	pthread_mutex_unlock(&s->lock);
	return 0;
}
