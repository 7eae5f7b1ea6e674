/* gpud_load.c - gpud-load, a load generator for a running gpud.
 *
 *   gpud-load --socket PATH --requests N --concurrency C [--processes P]
 *             [--connections K] [--prompt-tokens MIN:MAX] [--max-tokens N]
 *             [--segments MIN:MAX] [--causal] [--temperature T] [--seed S]
 *             [--answer SYS:K:CHUNK:POOL:Q] [--logprobs N [--prompt-logprobs]]
 *             [--logit-bias N] [--timeout S] [--json]
 *   gpud-load --http URL [--endpoint chat|completions] [--api-key-file F]
 *             [--socket PATH] [--front-pid PID] ... (the same load options
 *             but --answer)
 *
 * P processes (fork) each keep C requests in flight over K connections
 * (default K = C: one connection per client, like agent workers) until
 * the process's share of N requests has been sent. A request is random
 * words (a fixed list of story words) cut into a random number of segments
 * in MIN:MAX at random word boundaries, with a random valid descriptor:
 * each row (G included) sees itself and each earlier segment with
 * probability 1/2 (--causal: no descriptor). The word count comes from a
 * tokens-per-word ratio measured once with proto_client_tokenize, so
 * prompt lengths hit MIN:MAX approximately (the DONE usage gives the real
 * count, which is what is reported).
 *
 * --logprobs N (0..20) asks for every token's log probability and N
 * alternatives' (native protocol only) and checks each TOKENS_LP record:
 * N alternatives a token, likeliest first, the token's own id and every
 * log probability <= 0 and not NaN, no plain TOKENS record. A request
 * whose records fail is cancelled and counted as an error (EPROTO).
 * --prompt-logprobs asks for the prompt's too: its records come first,
 * one a prompt token (the DONE's prompt_tokens of them), the first with
 * no number (NaN) and no alternatives (id -1).
 *
 * --logit-bias N (0..64, native protocol only) gives every request N
 * random logit biases, ids in [0, 256) (any vocabulary has them) and
 * biases in [-10, 10]: such requests are sampled on the host, which the
 * load then exercises.
 *
 * --answer SYS:K:CHUNK:POOL:Q sends answer-style prompts instead, shaped
 * like agentd's answer task with chunk_mask "self": a system prompt of
 * about SYS tokens (the same in every request), K chunks of about CHUNK
 * tokens drawn without repetition from a pool of POOL (the same pool in
 * every process: it comes from --seed), and a question of about Q tokens
 * (random per request). The descriptor: the system prompt and each chunk
 * see only themselves, the question sees everything, and G sees the
 * chunks, the question and itself. Repeated chunks in other orders and
 * company are what gpud's chunk-KV cache reuses (cached_prompt_tokens).
 *
 * Each process sends its samples (status, usage, latency, time to first
 * token) back through a pipe; the parent merges them and prints requests,
 * errors by code, prompt/generated tokens, tokens/s over the wall time
 * (first start to last end, CLOCK_MONOTONIC is shared by the processes),
 * gpud's CPU time over the run (/proc/PID/stat of the server's pid: cores
 * busy, tokens per CPU-second, which a shared machine distorts less than
 * wall time; the loop thread's share; and the load processes' own CPU),
 * latency and TTFT p50/p99 (nearest rank, successful requests
 * only), and the p50/p99 of gpud's own timings from the DONE usage (queue,
 * prefill, decode, and what lies outside them: where the latency went).
 * Then the daemon's STATS: the change of its request and token counters
 * during the run next to the tool's own counts (they agree when nothing
 * else uses the daemon), steps and tokens per step of each device during
 * the run, allocations since warm-up, pools and caches after it. --json
 * prints all of it as one JSON object instead.
 *
 * --http URL (http://HOST:PORT of gpud-http) sends the same load to the
 * OpenAI-compatible front instead: each of the C streams of a process is
 * a thread with its own keep-alive HTTP/1.1 connection (bench/
 * http_client.h: no library) posting streaming requests to
 * /v1/chat/completions (the prompt as one user message; --endpoint
 * completions: /v1/completions, the prompt as it is) with max_tokens,
 * temperature, seed and stream_options.include_usage; it reads the
 * server-sent events up to "data: [DONE]". Time to first token is taken
 * at the first event with non-empty content; tokens and prompt length come
 * from the final usage chunk (the count of content events when there is
 * none). The prompts are causal, one segment (a chat request without the
 * "swarm" extension is plain causal): compare with the native
 * --causal --segments 1. The model is the first of GET /v1/models; a key
 * comes from --api-key-file (its first line) or $OPENAI_API_KEY. With
 * --socket too, the tokenizer calibration and the daemon's STATS come
 * from gpud itself (its counters then check the front's usage), else the
 * calibration asks /v1/completions for one token of the word sample.
 * --front-pid PID adds that process's CPU time (gpud-http's) to the
 * report. An HTTP error status counts as an error named "http_NNN".
 *
 * Exit status: 0 when every request succeeded, 1 when any failed (or the
 * run could not be done), 2 for bad arguments.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "bench/bench_util.h"
#include "bench/http_client.h"
#include "common/err.h"
#include "proto/client.h"

#define MAX_PROCESSES 256
#define MAX_CONCURRENCY 4096
#define MAX_CODES 32
#define CALIBRATION_WORDS 400

static const char *const words[] = {
	"once", "upon", "a", "time", "there", "was", "little", "girl", "named", "lily",
	"she", "loved", "to", "play", "outside", "in", "the", "park", "one", "day",
	"saw", "big", "red", "ball", "wanted", "with", "it", "but", "too", "high",
	"boy", "tom", "dog", "cat", "bird", "tree", "sun", "happy", "sad", "friend",
	"mom", "dad", "said", "went", "home", "and", "they", "were", "very", "good",
	"toy", "car", "box", "house", "garden", "flower", "water", "jump", "run", "fast",
	"slow", "small", "blue", "green", "yellow", "cake", "eat", "sleep", "bed", "night",
	"moon", "star", "sky", "rain", "hat", "shoe", "book", "read", "sing", "song",
	"fun", "smile", "laugh", "cry", "help", "share", "kind", "nice", "new", "old",
	"look", "find", "lost", "found", "walk", "climb", "swim", "fish", "boat", "sea",
};
#define N_WORDS (sizeof(words) / sizeof(words[0]))

struct opts {
	const char *socket;
	const char *http;           /* gpud-http's URL, or NULL: the native protocol */
	struct bench_http_url url;
	bool completions;           /* --endpoint completions */
	char auth[600];             /* "Authorization: Bearer KEY\r\n" or "" */
	char model[256];            /* the first of GET /v1/models */
	int front_pid;              /* --front-pid: gpud-http's, for its CPU time */
	uint32_t requests, concurrency, processes, connections;
	uint32_t prompt_min, prompt_max, max_tokens, seg_min, seg_max;
	uint64_t seed;
	float temperature;
	double timeout_s;
	bool causal, json;
	bool answer;                     /* --answer */
	int32_t logprobs;                /* --logprobs N, or -1 */
	uint32_t logit_bias;             /* --logit-bias N */
	bool prompt_logprobs;            /* --prompt-logprobs */
	uint32_t a_sys, a_k, a_chunk, a_pool, a_q;
};

/* One finished request, as sent back through the pipe. */
struct sample {
	int32_t status;
	uint32_t prompt_tokens, cached_tokens, generated_tokens; /* DONE usage */
	uint32_t streamed_tokens; /* ids received in TOKENS records */
	float latency_us;         /* submit to DONE/ERROR */
	float ttft_us;            /* submit to the first TOKENS record; < 0 none */
	float queue_us, prefill_us, decode_us; /* DONE usage: gpud's own timings */
	float total_us;                        /* DONE usage: gpud's whole time */
};

/* Head of a process's report, followed by n samples. */
struct report {
	double t_start, t_end;
	uint32_t n;
	int32_t fatal; /* a process that could not run (connect failed) */
};

static uint64_t rng_next(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. */
static uint32_t rng_range(uint64_t *s, uint32_t lo, uint32_t hi)
{
	return lo + (uint32_t)(rng_next(s) % ((uint64_t)hi - lo + 1));
}

/* --- one process: C requests in flight --------------------------------------- */

struct worker;

/* A client: one request in flight at a time, with its own buffers for the
 * request it builds (the library copies the request into the region at
 * submit, so they are reused for the next one). */
#define MAX_LOAD_BIAS 64

struct slot {
	struct worker *w;
	uint32_t conn;
	double t0, t_first;
	uint32_t streamed;
	char *text;                        /* (text_cap) prompt bytes */
	size_t text_cap;
	struct proto_segment *seg;         /* (max segments) */
	struct proto_mask_row *rows;       /* (max segments + 1) */
	uint16_t *idx;                     /* (S+1)(S+2)/2 */
	uint32_t *cut;                     /* (max segments) word index of each start */
	struct proto_bias bias[MAX_LOAD_BIAS]; /* --logit-bias */
	bool lp_bad;                       /* --logprobs: a record failed the checks */
	uint32_t lp_prompt, lp_gen;        /* prompt and generated tokens' records */
};

struct worker {
	const struct opts *o;
	double tokens_per_word;
	uint64_t rng;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct slot *slots;  /* (concurrency) */
	uint32_t *free_slots;
	uint32_t n_free;
	struct sample *samples;
	uint32_t n_samples, cap_samples;
	int32_t seen_codes[MAX_CODES];
	uint32_t n_seen;
	uint32_t next, n_req;  /* --http: requests taken by the streams, of n_req */
	/* --answer: the system prompt and the chunk pool (seeded by --seed
	 * alone: every process has the same) */
	char *a_sys;
	char **a_pool;                   /* (a_pool) */
};

/* An error code's name: sw_errname, or "http_NNN" for an HTTP status. */
static const char *code_name(int code, char *buf, size_t cap)
{
	if (code > 0) {
		snprintf(buf, cap, "http_%d", code);
		return buf;
	}
	return sw_errname(code);
}

/* Prints the first message of each error code once per process. */
static void note_error(struct worker *w, int code, const char *msg)
{
	for (uint32_t i = 0; i < w->n_seen; i++)
		if (w->seen_codes[i] == code)
			return;
	char name[32];

	if (w->n_seen < MAX_CODES)
		w->seen_codes[w->n_seen++] = code;
	fprintf(stderr, "gpud-load[%d]: %s: %s\n", (int)getpid(), code_name(code, name, sizeof(name)),
		msg && *msg ? msg : code > 0 ? "(no message)" : sw_strerror(code));
}

/* Records a finished request; called with w->mu held. */
static void record(struct slot *s, int status, const struct proto_done *usage)
{
	struct worker *w = s->w;
	struct sample *x = &w->samples[w->n_samples++];

	memset(x, 0, sizeof(*x));
	x->status = status;
	if (usage) {
		x->prompt_tokens = usage->prompt_tokens;
		x->cached_tokens = usage->cached_prompt_tokens;
		x->generated_tokens = usage->generated_tokens;
		x->queue_us = (float)usage->queue_us;
		x->prefill_us = (float)usage->prefill_us;
		x->decode_us = (float)usage->decode_us;
		x->total_us = (float)usage->total_us;
	}
	x->streamed_tokens = s->streamed;
	x->latency_us = (float)((bench_now() - s->t0) * 1e6);
	x->ttft_us = s->t_first > 0 ? (float)((s->t_first - s->t0) * 1e6) : -1.0f;
}

/* Records a finished request and frees its slot; called with w->mu held. */
static void finish(struct slot *s, int status, const struct proto_done *usage)
{
	struct worker *w = s->w;

	record(s, status, usage);
	w->free_slots[w->n_free++] = (uint32_t)(s - w->slots);
	pthread_cond_signal(&w->cv);
}

/* --logprobs: whether t is what was asked for (the header's checks);
 * first: the prompt's first token's record (no number, alternatives -1). */
static bool lp_ok(const struct proto_tokens *t, int32_t n_top, bool first)
{
	struct proto_lp_iter it;
	struct proto_lp_entry e;
	float prev = 0;
	uint32_t n = 0;

	if (!t->logprobs || t->n_top != (uint32_t)n_top)
		return false;
	proto_lp_iter_init(&it, t);
	while (proto_lp_next(&it, &e)) {
		if (first ? !isnan(e.logprob) || (e.rank > 0 && e.id != -1) :
			    !(e.logprob <= 0) || (e.rank > 1 && e.logprob > prev))
			return false;
		if (e.rank == 0 && e.id != proto_tokens_id(t, e.token))
			return false;
		prev = e.logprob;
		n++;
	}
	return n == t->n_ids * (1 + t->n_top);
}

static int on_tokens(void *arg, uint64_t request_id, const struct proto_tokens *t)
{
	struct slot *s = arg;

	if (t->n_ids > 0 && s->t_first == 0)
		s->t_first = bench_now();
	s->streamed += t->n_ids;
	if (s->w->o->logprobs >= 0) {
		bool ok = lp_ok(t, s->w->o->logprobs, t->prompt && s->lp_prompt == 0);
		/* the prompt's only when asked, and all before the answer's */
		ok &= t->prompt ? s->w->o->prompt_logprobs && !s->lp_gen : true;
		*(t->prompt ? &s->lp_prompt : &s->lp_gen) += t->n_ids;
		if (!ok) {
			s->lp_bad = true; /* read in on_done, on this same reader thread */
			return 1;
		}
	}
	return 0;
}

static void on_done(void *arg, uint64_t request_id, int status, const struct proto_done *usage,
		    const char *msg)
{
	struct slot *s = arg;
	struct worker *w = s->w;

	pthread_mutex_lock(&w->mu);
	if (!status && w->o->prompt_logprobs && usage->prompt_tokens != s->lp_prompt)
		s->lp_bad = true; /* one record a prompt token */
	if (s->lp_bad) {
		s->lp_bad = false;
		status = -EPROTO;
		msg = "a TOKENS_LP record failed the --logprobs checks";
	}
	s->lp_prompt = s->lp_gen = 0;
	if (status)
		note_error(w, status, msg);
	finish(s, status, status ? NULL : usage);
	pthread_mutex_unlock(&w->mu);
}

/* n_words random words from *rng, space separated, in a new string. */
static char *random_words(uint64_t *rng, uint32_t n_words)
{
	size_t cap = (size_t)n_words * 16 + 1, at = 0;
	char *t = malloc(cap);

	if (!t)
		return NULL;
	for (uint32_t k = 0; k < n_words; k++)
		at += (size_t)snprintf(t + at, cap - at, "%s%s", k ? " " : "",
				       words[rng_next(rng) % N_WORDS]);
	return t;
}

static uint32_t words_for(const struct worker *w, uint32_t tokens)
{
	uint32_t n = (uint32_t)lround(tokens / w->tokens_per_word);

	return n ? n : 1;
}

/* --answer: system prompt and pool, the same in every process. */
static int answer_init(struct worker *w)
{
	const struct opts *o = w->o;
	uint64_t rng = o->seed ^ 0xa115e7ULL;

	w->a_sys = random_words(&rng, words_for(w, o->a_sys));
	w->a_pool = calloc(o->a_pool, sizeof(*w->a_pool));
	if (!w->a_sys || !w->a_pool)
		return -ENOMEM;
	for (uint32_t i = 0; i < o->a_pool; i++)
		if (!(w->a_pool[i] = random_words(&rng, words_for(w, o->a_chunk))))
			return -ENOMEM;
	return 0;
}

/* What every request carries beyond its prompt: log probabilities
 * (--logprobs) and logit biases (--logit-bias). */
static void req_options(struct worker *w, struct slot *s, struct proto_submit_req *req)
{
	const struct opts *o = w->o;

	if (o->logprobs >= 0)
		req->flags = PROTO_SUBMIT_LOGPROBS | (uint32_t)o->logprobs << PROTO_SUBMIT_TOP_SHIFT |
			     (o->prompt_logprobs ? PROTO_SUBMIT_PROMPT_LOGPROBS : 0);
	for (uint32_t i = 0; i < o->logit_bias; i++)
		s->bias[i] = (struct proto_bias){
			.id = (int32_t)(rng_next(&w->rng) % 256),
			.bias = (float)(rng_next(&w->rng) % 2001) / 100.0f - 10.0f,
		};
	req->n_bias = o->logit_bias;
	req->bias = o->logit_bias ? s->bias : NULL;
}

/* --answer: [system, K chunks of the pool, question] with the descriptor
 * of the file comment. */
static void build_answer(struct worker *w, struct slot *s, struct proto_submit_req *req,
			 struct proto_mask_desc *desc)
{
	const struct opts *o = w->o;
	uint32_t k = o->a_k, q = k + 1, S = k + 2, pick[PROTO_MAX_SEGMENTS], n_words;
	size_t at = 0, x = 0;

	for (uint32_t i = 0; i < k; i++) {
		bool dup;
		do {
			pick[i] = rng_range(&w->rng, 0, o->a_pool - 1);
			dup = false;
			for (uint32_t j = 0; j < i; j++)
				dup |= pick[j] == pick[i];
		} while (dup);
	}
	s->seg[0] = (struct proto_segment){ .text = w->a_sys, .len = (uint32_t)strlen(w->a_sys) };
	for (uint32_t i = 0; i < k; i++)
		s->seg[1 + i] = (struct proto_segment){ .text = w->a_pool[pick[i]],
							.len = (uint32_t)strlen(w->a_pool[pick[i]]) };
	n_words = words_for(w, o->a_q);
	for (uint32_t i = 0; i < n_words; i++) {
		const char *wd = words[rng_next(&w->rng) % N_WORDS];
		size_t len = strlen(wd);
		s->text[at++] = ' ';
		memcpy(s->text + at, wd, len);
		at += len;
	}
	s->seg[q] = (struct proto_segment){ .text = s->text, .len = (uint32_t)at };
	/* rows: each of 0..k itself; the question 0..q; G 1..q and itself */
	for (uint32_t i = 0; i <= k; i++) {
		s->rows[i] = (struct proto_mask_row){ .idx = &s->idx[x], .n = 1 };
		s->idx[x++] = (uint16_t)i;
	}
	s->rows[q] = (struct proto_mask_row){ .idx = &s->idx[x], .n = q + 1 };
	for (uint32_t i = 0; i <= q; i++)
		s->idx[x++] = (uint16_t)i;
	s->rows[S] = (struct proto_mask_row){ .idx = &s->idx[x], .n = q + 1 };
	for (uint32_t i = 1; i <= S; i++)
		s->idx[x++] = (uint16_t)i;
	memset(req, 0, sizeof(*req));
	req->n_segments = S;
	req->segments = s->seg;
	req->max_tokens = o->max_tokens;
	req->sampling.temperature = o->temperature;
	req->sampling.top_p = 1.0f;
	req->sampling.repeat_penalty = 1.0f;
	req->sampling.seed = rng_next(&w->rng);
	req_options(w, s, req);
	desc->n_segments = S;
	desc->rows = s->rows;
	req->mask = desc;
}

/* Fills the slot's request: random words cut into segments, and a random
 * descriptor unless --causal. */
static void build_request(struct worker *w, struct slot *s, struct proto_submit_req *req,
			  struct proto_mask_desc *desc)
{
	const struct opts *o = w->o;
	uint32_t target, n_words, n_seg;

	if (o->answer) {
		build_answer(w, s, req, desc);
		return;
	}
	target = rng_range(&w->rng, o->prompt_min, o->prompt_max);
	n_words = (uint32_t)lround(target / w->tokens_per_word);
	n_seg = rng_range(&w->rng, o->seg_min, o->seg_max);
	if (n_words < 1)
		n_words = 1;
	if (n_seg > n_words)
		n_seg = n_words;
	/* Segment starts: word 0, then n_seg - 1 distinct cuts in 1..n_words-1
	 * (sorted insertion; n_seg is small). */
	s->cut[0] = 0;
	for (uint32_t i = 1; i < n_seg; i++) {
		uint32_t c, j;
		bool dup;
		do {
			c = rng_range(&w->rng, 1, n_words - 1);
			dup = false;
			for (j = 1; j < i; j++)
				dup |= s->cut[j] == c;
		} while (dup);
		for (j = i; j > 1 && s->cut[j - 1] > c; j--)
			s->cut[j] = s->cut[j - 1];
		s->cut[j] = c;
	}
	size_t at = 0;
	for (uint32_t i = 0; i < n_seg; i++) {
		uint32_t end = i + 1 < n_seg ? s->cut[i + 1] : n_words;
		size_t start = at;
		for (uint32_t k = s->cut[i]; k < end; k++) {
			const char *wd = words[rng_next(&w->rng) % N_WORDS];
			size_t len = strlen(wd);
			if (k > 0)
				s->text[at++] = ' ';
			memcpy(s->text + at, wd, len);
			at += len;
		}
		s->seg[i].text = s->text + start;
		s->seg[i].len = (uint32_t)(at - start);
		s->seg[i].role = PROTO_ROLE_NONE;
	}
	memset(req, 0, sizeof(*req));
	req->n_segments = n_seg;
	req->segments = s->seg;
	req->max_tokens = o->max_tokens;
	req->sampling.temperature = o->temperature;
	req->sampling.top_p = 1.0f;
	req->sampling.repeat_penalty = 1.0f;
	req->sampling.seed = rng_next(&w->rng);
	req_options(w, s, req);
	if (o->causal)
		return;
	size_t k = 0;
	for (uint32_t i = 0; i <= n_seg; i++) {
		uint16_t *row = &s->idx[k];
		uint32_t n = 0;
		for (uint32_t j = 0; j < i; j++)
			if (rng_next(&w->rng) & 1)
				row[n++] = (uint16_t)j;
		row[n++] = (uint16_t)i;
		s->rows[i].idx = row;
		s->rows[i].n = n;
		k += n;
	}
	desc->n_segments = n_seg;
	desc->rows = s->rows;
	req->mask = desc;
}

static void worker_free(struct worker *w)
{
	if (w->slots) {
		for (uint32_t i = 0; i < w->o->concurrency; i++) {
			free(w->slots[i].text);
			free(w->slots[i].seg);
			free(w->slots[i].rows);
			free(w->slots[i].idx);
			free(w->slots[i].cut);
		}
	}
	if (w->a_pool)
		for (uint32_t i = 0; i < w->o->a_pool; i++)
			free(w->a_pool[i]);
	free(w->a_pool);
	free(w->a_sys);
	free(w->slots);
	free(w->free_slots);
	free(w->samples);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
}

static int worker_init(struct worker *w, const struct opts *o, double tpw, uint32_t n,
		       uint64_t seed)
{
	uint32_t max_seg = o->seg_max;
	size_t max_words = (size_t)ceil(o->prompt_max / tpw) + 2;
	size_t longest = 0;

	for (size_t i = 0; i < N_WORDS; i++)
		if (strlen(words[i]) > longest)
			longest = strlen(words[i]);
	memset(w, 0, sizeof(*w));
	w->o = o;
	w->tokens_per_word = tpw;
	w->rng = seed;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	w->slots = calloc(o->concurrency, sizeof(*w->slots));
	w->free_slots = calloc(o->concurrency, sizeof(*w->free_slots));
	w->samples = calloc(n ? n : 1, sizeof(*w->samples));
	w->cap_samples = n;
	if (!w->slots || !w->free_slots || !w->samples)
		return -ENOMEM;
	for (uint32_t i = 0; i < o->concurrency; i++) {
		struct slot *s = &w->slots[i];
		s->w = w;
		s->conn = i % o->connections;
		s->text_cap = max_words * (longest + 1) + 1;
		s->text = malloc(s->text_cap);
		s->seg = calloc(max_seg, sizeof(*s->seg));
		s->rows = calloc(max_seg + 1, sizeof(*s->rows));
		s->idx = calloc((size_t)(max_seg + 1) * (max_seg + 2) / 2, sizeof(*s->idx));
		s->cut = calloc(max_seg, sizeof(*s->cut));
		if (!s->text || !s->seg || !s->rows || !s->idx || !s->cut)
			return -ENOMEM;
		w->free_slots[w->n_free++] = o->concurrency - 1 - i;
	}
	return o->answer ? answer_init(w) : 0;
}

static void opts_client(const struct opts *o, struct proto_client_opts *co)
{
	proto_client_opts_default(co);
	co->timeout_ms = (uint32_t)(o->timeout_s * 1000.0);
}

/* Runs n requests and fills *rep and w->samples. Returns 0, or a negative
 * code when the connections could not be opened. */
static int worker_run(struct worker *w, uint32_t n, struct report *rep)
{
	const struct opts *o = w->o;
	struct proto_client **conns = calloc(o->connections, sizeof(*conns));
	struct proto_client_opts co;
	struct proto_mask_desc *descs = calloc(o->concurrency, sizeof(*descs));
	char err[SW_ERR_MAX];
	int rc = 0;

	memset(rep, 0, sizeof(*rep));
	if (!conns || !descs) {
		rc = -ENOMEM;
		goto out_free;
	}
	opts_client(o, &co);
	for (uint32_t i = 0; i < o->connections; i++) {
		rc = proto_client_connect(&conns[i], o->socket, &co, err, sizeof(err));
		if (rc) {
			fprintf(stderr, "gpud-load: connect %s: %s\n", o->socket, err);
			goto out_close;
		}
	}
	rep->t_start = bench_now();
	for (uint32_t i = 0; i < n; i++) {
		struct proto_submit_req req;
		struct slot *s;
		uint32_t si;

		pthread_mutex_lock(&w->mu);
		while (w->n_free == 0)
			pthread_cond_wait(&w->cv, &w->mu);
		si = w->free_slots[--w->n_free];
		pthread_mutex_unlock(&w->mu);
		s = &w->slots[si];
		build_request(w, s, &req, &descs[si]);
		s->t0 = bench_now();
		s->t_first = 0;
		s->streamed = 0;
		struct proto_client_events ev = { on_tokens, on_done, s };
		int src = proto_client_submit(conns[s->conn], &req, &ev, NULL, err, sizeof(err));
		if (src) {
			pthread_mutex_lock(&w->mu);
			note_error(w, src, err);
			finish(s, src, NULL);
			pthread_mutex_unlock(&w->mu);
		}
	}
	pthread_mutex_lock(&w->mu);
	while (w->n_free < o->concurrency)
		pthread_cond_wait(&w->cv, &w->mu);
	pthread_mutex_unlock(&w->mu);
	rep->t_end = bench_now();
	rep->n = w->n_samples;
out_close:
	for (uint32_t i = 0; i < o->connections; i++)
		proto_client_close(conns[i]);
out_free:
	free(descs);
	free(conns);
	return rc;
}

/* --- one process over HTTP: C streams, a thread and a connection each ------- */

/* The JSON string of len bytes of t, quoted, at out (cap >= 2 * len + 3).
 * Returns the length written. */
static size_t json_quote(char *out, const char *t, size_t len)
{
	size_t k = 0;

	out[k++] = '"';
	for (size_t i = 0; i < len; i++) {
		unsigned char ch = (unsigned char)t[i];

		if (ch == '"' || ch == '\\') {
			out[k++] = '\\';
			out[k++] = (char)ch;
		} else if (ch < 0x20) {
			out[k++] = ' '; /* the word list has none; never a raw control */
		} else {
			out[k++] = (char)ch;
		}
	}
	out[k++] = '"';
	out[k] = '\0';
	return k;
}

/* The request body for the prompt t (len bytes) into out (cap bytes).
 * Returns its length, or 0 when it does not fit. */
static size_t http_body(const struct opts *o, const char *t, size_t len, uint64_t seed,
			bool stream, uint32_t max_tokens, char *out, size_t cap)
{
	char *q = malloc(2 * len + 3);
	int n;

	if (!q)
		return 0;
	json_quote(q, t, len);
	if (o->completions)
		n = snprintf(out, cap, "{\"model\":\"%s\",\"prompt\":%s,\"max_tokens\":%u,"
			     "\"temperature\":%g,\"seed\":%" PRIu64 ",\"stream\":%s%s}",
			     o->model, q, max_tokens, (double)o->temperature, seed,
			     stream ? "true" : "false",
			     stream ? ",\"stream_options\":{\"include_usage\":true}" : "");
	else
		n = snprintf(out, cap, "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\","
			     "\"content\":%s}],\"max_tokens\":%u,\"temperature\":%g,\"seed\":%"
			     PRIu64 ",\"stream\":%s%s}",
			     o->model, q, max_tokens, (double)o->temperature, seed,
			     stream ? "true" : "false",
			     stream ? ",\"stream_options\":{\"include_usage\":true}" : "");
	free(q);
	return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* Whether a chunk's JSON has a non-empty string under "key" (the delta's
 * "content", a completion's "text"), without parsing the whole chunk. */
static bool has_text(const char *json, const char *key)
{
	const char *p = strstr(json, key);

	if (!p)
		return false;
	p += strlen(key);
	while (*p == ' ')
		p++;
	if (*p++ != ':')
		return false;
	while (*p == ' ')
		p++;
	return p[0] == '"' && p[1] != '"';
}

/* A "usage" object of a chunk or reply into d. Returns true when found. */
static bool http_usage(const char *json, struct proto_done *d)
{
	json_t *root, *u;
	bool ok = false;

	if (!strstr(json, "\"usage\""))
		return false;
	root = json_loads(json, 0, NULL);
	u = json_object_get(root, "usage");
	if (json_is_object(u)) {
		d->prompt_tokens = (uint32_t)json_integer_value(json_object_get(u, "prompt_tokens"));
		d->generated_tokens =
			(uint32_t)json_integer_value(json_object_get(u, "completion_tokens"));
		d->cached_prompt_tokens = (uint32_t)json_integer_value(json_object_get(
			json_object_get(u, "prompt_tokens_details"), "cached_tokens"));
		ok = true;
	}
	json_decref(root);
	return ok;
}

/* One streaming request on c: the slot's prompt already built. Fills
 * *usage; returns 0, an HTTP status (> 0) or a negative code, with a
 * message in err. */
static int http_stream_one(struct slot *s, struct bench_http *c, const char *body,
			   size_t body_len, struct proto_done *usage, char *err, size_t errlen)
{
	const struct opts *o = s->w->o;
	const char *key = o->completions ? "\"text\"" : "\"content\"";
	const char *line;
	bool done = false, have_usage = false;
	long k;
	int rc;

	rc = bench_http_request(c, &o->url, "POST",
				o->completions ? "/v1/completions" : "/v1/chat/completions",
				o->auth, body, body_len, err, errlen);
	if (rc)
		return rc;
	if (c->status != 200) {
		char msg[256];
		long got = bench_http_read(c, msg, sizeof(msg) - 1);

		msg[got > 0 ? got : 0] = '\0';
		bench_http_drain(c);
		snprintf(err, errlen, "HTTP %d: %s", c->status, msg);
		return c->status;
	}
	while ((k = bench_http_line(c, &line)) >= 0) {
		if (strncmp(line, "data:", 5) != 0)
			continue; /* blank lines between events, comments */
		line += line[5] == ' ' ? 6 : 5;
		if (!strcmp(line, "[DONE]")) {
			done = true;
			continue;
		}
		if (strstr(line, "\"error\"") && !strstr(line, "\"choices\"")) {
			snprintf(err, errlen, "error event: %.200s", line);
			bench_http_drain(c);
			return -EIO;
		}
		if (has_text(line, key)) {
			if (s->t_first == 0)
				s->t_first = bench_now();
			s->streamed++;
		}
		have_usage |= http_usage(line, usage);
	}
	if (k != -ENODATA) {
		snprintf(err, errlen, "reading the stream: %s", strerror((int)-k));
		return (int)k;
	}
	if (!done) {
		snprintf(err, errlen, "the stream ended without data: [DONE]");
		return -EPROTO;
	}
	if (!have_usage)
		usage->generated_tokens = s->streamed;
	return 0;
}

static void *http_stream_thread(void *arg)
{
	struct slot *s = arg;
	struct worker *w = s->w;
	const struct opts *o = w->o;
	struct bench_http *c = malloc(sizeof(*c));
	size_t cap = 2 * s->text_cap + 1024;
	char *body = malloc(cap), err[SW_ERR_MAX + 256];

	if (!c || !body) {
		free(c);
		free(body);
		return (void *)(intptr_t)-ENOMEM;
	}
	bench_http_init(c, (uint32_t)(o->timeout_s * 1000.0));
	for (;;) {
		struct proto_submit_req req;
		struct proto_mask_desc desc;
		struct proto_done usage;
		size_t len;
		int rc;

		pthread_mutex_lock(&w->mu);
		if (w->next >= w->n_req) {
			pthread_mutex_unlock(&w->mu);
			break;
		}
		w->next++;
		build_request(w, s, &req, &desc);
		pthread_mutex_unlock(&w->mu);
		/* JSON integers stop at INT64_MAX: the seed's low 63 bits */
		len = http_body(o, req.segments[0].text, req.segments[0].len,
				req.sampling.seed & (uint64_t)INT64_MAX, true, req.max_tokens, body,
				cap);
		memset(&usage, 0, sizeof(usage));
		err[0] = '\0';
		s->t_first = 0;
		s->streamed = 0;
		s->t0 = bench_now();
		rc = len ? http_stream_one(s, c, body, len, &usage, err, sizeof(err)) : -E2BIG;
		pthread_mutex_lock(&w->mu);
		if (rc)
			note_error(w, rc, err);
		record(s, rc, rc ? NULL : &usage);
		pthread_mutex_unlock(&w->mu);
	}
	bench_http_close(c);
	free(c);
	free(body);
	return NULL;
}

/* worker_run over HTTP: min(C, n) streams share the n requests. */
static int worker_run_http(struct worker *w, uint32_t n, struct report *rep)
{
	const struct opts *o = w->o;
	uint32_t k = o->concurrency < n ? o->concurrency : n, started = 0;
	pthread_t *th = calloc(k ? k : 1, sizeof(*th));
	pthread_attr_t attr;
	int rc = 0;

	memset(rep, 0, sizeof(*rep));
	if (!th)
		return -ENOMEM;
	w->next = 0;
	w->n_req = n;
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	rep->t_start = bench_now();
	for (; started < k; started++) {
		rc = -pthread_create(&th[started], &attr, http_stream_thread, &w->slots[started]);
		if (rc)
			break;
	}
	for (uint32_t i = 0; i < started; i++)
		pthread_join(th[i], NULL);
	rep->t_end = bench_now();
	pthread_attr_destroy(&attr);
	free(th);
	rep->n = w->n_samples;
	return started ? 0 : rc;
}

/* The first model of GET /v1/models into o->model. Returns 0 or -1. */
static int http_model(struct opts *o)
{
	struct bench_http c;
	char err[SW_ERR_MAX], *text = malloc(1 << 20);
	size_t at = 0;
	long k = 0;
	json_t *root;
	const char *id;
	int rc;

	if (!text)
		return -1;
	bench_http_init(&c, (uint32_t)(o->timeout_s * 1000.0));
	rc = bench_http_request(&c, &o->url, "GET", "/v1/models", o->auth, NULL, 0, err,
				sizeof(err));
	while (!rc && at < (1 << 20) - 1 && (k = bench_http_read(&c, text + at, (1 << 20) - 1 - at)) > 0)
		at += (size_t)k;
	text[at] = '\0';
	if (rc || c.status != 200 || k < 0) {
		fprintf(stderr, "gpud-load: GET %s/v1/models: %s\n", o->http,
			rc ? err : c.status != 200 ? text : strerror((int)-k));
		bench_http_close(&c);
		free(text);
		return -1;
	}
	bench_http_close(&c);
	root = json_loads(text, 0, NULL);
	id = json_string_value(json_object_get(json_array_get(json_object_get(root, "data"), 0), "id"));
	if (id)
		snprintf(o->model, sizeof(o->model), "%s", id);
	else
		fprintf(stderr, "gpud-load: GET %s/v1/models: no model in %.200s\n", o->http, text);
	json_decref(root);
	free(text);
	return id ? 0 : -1;
}

/* Tokens per word over HTTP: the usage of a one-token completion of the
 * word sample. */
static int http_calibrate(struct opts *o, double *tpw)
{
	char text[CALIBRATION_WORDS * 8], err[SW_ERR_MAX], reply[8192];
	size_t at = 0, len, cap = sizeof(text) * 2 + 1024;
	char *body = malloc(cap);
	uint64_t rng = o->seed ^ 0x5eedULL;
	struct bench_http c;
	struct proto_done d;
	bool completions = o->completions;
	size_t got = 0;
	long k = 0;
	int rc;

	if (!body)
		return -1;
	for (int i = 0; i < CALIBRATION_WORDS; i++)
		at += (size_t)snprintf(text + at, sizeof(text) - at, "%s%s", i ? " " : "",
				       words[rng_next(&rng) % N_WORDS]);
	o->completions = true; /* the prompt as it is, no chat template */
	len = http_body(o, text, at, 1, false, 1, body, cap);
	o->completions = completions;
	bench_http_init(&c, (uint32_t)(o->timeout_s * 1000.0));
	rc = bench_http_request(&c, &o->url, "POST", "/v1/completions", o->auth, body, len, err,
				sizeof(err));
	while (!rc && got < sizeof(reply) - 1 &&
	       (k = bench_http_read(&c, reply + got, sizeof(reply) - 1 - got)) > 0)
		got += (size_t)k;
	reply[got] = '\0';
	bench_http_close(&c);
	free(body);
	memset(&d, 0, sizeof(d));
	if (rc || c.status != 200 || !http_usage(reply, &d) || d.prompt_tokens == 0) {
		fprintf(stderr, "gpud-load: calibration over %s/v1/completions: %s\n", o->http,
			rc ? err : reply);
		return -1;
	}
	*tpw = (double)d.prompt_tokens / CALIBRATION_WORDS;
	return 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;

	while (len > 0) {
		ssize_t k = write(fd, p, len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -errno;
		p += k;
		len -= (size_t)k;
	}
	return 0;
}

static int read_all(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len > 0) {
		ssize_t k = read(fd, p, len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			return SW_ECLOSED;
		p += k;
		len -= (size_t)k;
	}
	return 0;
}

/* The child: runs its share and writes the report and samples to fd. */
static int child_main(const struct opts *o, double tpw, uint32_t n, uint64_t seed, int fd)
{
	struct worker w;
	struct report rep;
	int rc = worker_init(&w, o, tpw, n, seed);

	memset(&rep, 0, sizeof(rep));
	if (rc == 0)
		rc = o->http ? worker_run_http(&w, n, &rep) : worker_run(&w, n, &rep);
	rep.fatal = rc;
	if (rc)
		rep.n = 0;
	if (write_all(fd, &rep, sizeof(rep)) == 0 && rep.n > 0)
		write_all(fd, w.samples, rep.n * sizeof(*w.samples));
	worker_free(&w);
	return rc ? 1 : 0;
}

/* --- daemon stats ---------------------------------------------------------------- */

static json_t *fetch_stats(const struct opts *o)
{
	struct proto_client *c;
	struct proto_client_opts co;
	char err[SW_ERR_MAX], *text = NULL;
	json_error_t je;
	json_t *root = NULL;

	opts_client(o, &co);
	if (proto_client_connect(&c, o->socket, &co, err, sizeof(err))) {
		fprintf(stderr, "gpud-load: connect %s: %s\n", o->socket, err);
		return NULL;
	}
	if (proto_client_stats(c, &text, err, sizeof(err)))
		fprintf(stderr, "gpud-load: stats: %s\n", err);
	else if (!(root = json_loads(text, 0, &je)))
		fprintf(stderr, "gpud-load: stats reply is not JSON: %s\n", je.text);
	free(text);
	proto_client_close(c);
	return root;
}

/* Integer at a dotted path ("requests.completed"); -1 when absent. */
static json_int_t jget(const json_t *root, const char *path)
{
	char buf[128];
	const json_t *v = root;

	snprintf(buf, sizeof(buf), "%s", path);
	for (char *save = NULL, *k = strtok_r(buf, ".", &save); k && v;
	     k = strtok_r(NULL, ".", &save))
		v = json_object_get(v, k);
	return json_is_integer(v) ? json_integer_value(v) : -1;
}

/* Per-device counters copied into devices_delta: its key, STATS's path. */
static const char *const dev_keys[][2] = {
	{ "steps", "steps" },
	{ "tokens", "tokens" },
	{ "generated", "generated" },
	{ "preemptions", "preemptions" },
	{ "placed_prefix", "placed_prefix" },
	{ "placed_load", "placed_load" },
	{ "rows_argmax", "rows.argmax" },
	{ "rows_drawn", "rows.drawn" },
	{ "rows_host", "rows.host" },
};

/* Tokens per word of the word list under gpud's tokenizer. */
/* CPU seconds (user + system) the process pid has used, from
 * /proc/PID/stat, or with thread_only its main thread alone (gpud's loop
 * thread), from /proc/PID/task/PID/stat; < 0 when it cannot be read (gpud
 * in another pid namespace). */
static double proc_cpu_s(int pid, bool thread_only)
{
	char path[64], line[1024];
	unsigned long long ut, st;
	FILE *f;

	if (thread_only)
		snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", pid, pid);
	else
		snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(line, 1, sizeof(line) - 1, f);
	fclose(f);
	line[n] = '\0';
	/* The command name may hold spaces and parentheses: fields count
	 * from the last ')'. utime and stime are fields 14 and 15. */
	char *p = strrchr(line, ')');
	if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
			 &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int calibrate(const struct opts *o, double *tpw, int *server_pid)
{
	struct proto_client *c;
	struct proto_client_opts co;
	char err[SW_ERR_MAX], text[CALIBRATION_WORDS * 8];
	int32_t *ids = NULL;
	uint32_t n = 0;
	size_t at = 0;
	uint64_t rng = o->seed ^ 0x5eedULL;
	int rc;

	opts_client(o, &co);
	rc = proto_client_connect(&c, o->socket, &co, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "gpud-load: connect %s: %s\n", o->socket, err);
		return rc;
	}
	for (int i = 0; i < CALIBRATION_WORDS; i++)
		at += (size_t)snprintf(text + at, sizeof(text) - at, "%s%s", i ? " " : "",
				       words[rng_next(&rng) % N_WORDS]);
	*server_pid = proto_client_server_pid(c);
	rc = proto_client_tokenize(c, text, at, 0, &ids, &n, err, sizeof(err));
	if (rc)
		fprintf(stderr, "gpud-load: tokenize: %s\n", err);
	else
		*tpw = n > 0 ? (double)n / CALIBRATION_WORDS : 1.0;
	free(ids);
	proto_client_close(c);
	return rc;
}

/* --- merging and printing ---------------------------------------------------------- */

struct summary {
	uint64_t ok, errors;
	int32_t codes[MAX_CODES];
	uint64_t code_count[MAX_CODES];
	uint32_t n_codes;
	uint64_t prompt, cached, generated, streamed;
	double wall_s;
	double lat_p50, lat_p99, lat_max, ttft_p50, ttft_p99, ttft_max;
	uint64_t n_ttft;
	double gpud_cpu_s; /* gpud's user + system CPU time during the run; < 0 unknown */
	double gpud_loop_cpu_s; /* of which gpud's main (loop) thread */
	double tool_cpu_s; /* the load processes' own CPU time (children) */
	double front_cpu_s; /* --front-pid's CPU time during the run; < 0 unknown */
	/* p50, p99 in ms of gpud's usage timings (successful requests) */
	double queue[2], prefill[2], decode[2];
	double admit[2]; /* total - queue - prefill - decode: gpud before queuing */
	double outside[2]; /* latency - total: the client library and the wire */
	double first_gap[2]; /* ttft - queue - prefill: the first token's way out */
};

/* Sorts v (n > 0) and stores its p50 and p99 in ms (v in µs). */
static void p50_p99(float *v, size_t n, double out[2])
{
	bench_sort_floats(v, n);
	out[0] = bench_pct(v, n, 50) / 1e3;
	out[1] = bench_pct(v, n, 99) / 1e3;
}

static void summarize(const struct sample *s, size_t n, double wall, struct summary *out)
{
	float *lat = malloc((n ? n : 1) * sizeof(float));
	float *ttft = malloc((n ? n : 1) * sizeof(float));
	size_t nl = 0, nt = 0;

	memset(out, 0, sizeof(*out));
	out->wall_s = wall;
	for (size_t i = 0; i < n; i++) {
		if (s[i].status) {
			uint32_t c;
			out->errors++;
			for (c = 0; c < out->n_codes && out->codes[c] != s[i].status; c++)
				;
			if (c == out->n_codes && c < MAX_CODES)
				out->codes[out->n_codes++] = s[i].status;
			if (c < MAX_CODES)
				out->code_count[c]++;
			continue;
		}
		out->ok++;
		out->prompt += s[i].prompt_tokens;
		out->cached += s[i].cached_tokens;
		out->generated += s[i].generated_tokens;
		out->streamed += s[i].streamed_tokens;
		if (lat)
			lat[nl++] = s[i].latency_us;
		if (ttft && s[i].ttft_us >= 0)
			ttft[nt++] = s[i].ttft_us;
	}
	if (nl) {
		bench_sort_floats(lat, nl);
		out->lat_p50 = bench_pct(lat, nl, 50) / 1e3;
		out->lat_p99 = bench_pct(lat, nl, 99) / 1e3;
		out->lat_max = lat[nl - 1] / 1e3;
	}
	if (nt) {
		bench_sort_floats(ttft, nt);
		out->ttft_p50 = bench_pct(ttft, nt, 50) / 1e3;
		out->ttft_p99 = bench_pct(ttft, nt, 99) / 1e3;
		out->ttft_max = ttft[nt - 1] / 1e3;
	}
	out->n_ttft = nt;
	/* gpud's timings, reusing lat (nl entries, all successful). */
	if (lat && nl) {
		size_t k = 0;
		for (size_t i = 0; i < n; i++)
			if (!s[i].status)
				lat[k++] = s[i].queue_us;
		p50_p99(lat, k, out->queue);
		k = 0;
		for (size_t i = 0; i < n; i++)
			if (!s[i].status)
				lat[k++] = s[i].prefill_us;
		p50_p99(lat, k, out->prefill);
		k = 0;
		for (size_t i = 0; i < n; i++)
			if (!s[i].status)
				lat[k++] = s[i].decode_us;
		p50_p99(lat, k, out->decode);
		k = 0;
		for (size_t i = 0; i < n; i++)
			if (!s[i].status)
				lat[k++] = s[i].total_us - s[i].queue_us - s[i].prefill_us -
					   s[i].decode_us;
		p50_p99(lat, k, out->admit);
		k = 0;
		for (size_t i = 0; i < n; i++)
			if (!s[i].status)
				lat[k++] = s[i].latency_us - s[i].total_us;
		p50_p99(lat, k, out->outside);
		k = 0;
		for (size_t i = 0; i < n; i++)
			if (!s[i].status && s[i].ttft_us >= 0)
				lat[k++] = s[i].ttft_us - s[i].queue_us - s[i].prefill_us;
		if (k)
			p50_p99(lat, k, out->first_gap);
	}
	free(lat);
	free(ttft);
}

static const char *const alloc_keys[] = { "host", "host_loop", "host_device", "host_other",
					  "host_foreign", "device" };
static const char *const delta_keys[] = { "requests.admitted", "requests.completed",
					  "requests.errors", "requests.cancelled",
					  "requests.busy", "requests.refused",
					  "tokens.prompt", "tokens.cached_prompt",
					  "tokens.generated" };
#define N_DELTA (sizeof(delta_keys) / sizeof(delta_keys[0]))

static json_int_t delta(const json_t *before, const json_t *after, const char *key)
{
	json_int_t a = jget(after, key), b = jget(before, key);
	return a < 0 || b < 0 ? -1 : a - b;
}

static void print_text(const struct opts *o, const struct summary *m, double tpw,
		       const json_t *before, const json_t *after)
{
	char name[32];

	if (o->http)
		printf("gpud-load: over HTTP, %s%s (model %s), one connection per stream\n", o->http,
		       o->completions ? "/v1/completions" : "/v1/chat/completions", o->model);
	printf("gpud-load: %u requests, %u processes x %u concurrent over %u connections each, "
	       "prompt %u:%u tokens, %u:%u segments%s, max_tokens %u, temperature %.2f, "
	       "seed %" PRIu64 "\n",
	       o->requests, o->processes, o->concurrency, o->http ? o->concurrency : o->connections,
	       o->prompt_min,
	       o->prompt_max, o->seg_min, o->seg_max, o->causal ? " (causal)" : "",
	       o->max_tokens, o->temperature, o->seed);
	printf("calibration: %.3f tokens per word\n", tpw);
	printf("requests: %" PRIu64 " ok, %" PRIu64 " errors\n", m->ok, m->errors);
	for (uint32_t c = 0; c < m->n_codes; c++)
		printf("  %s (%d): %" PRIu64 "\n", code_name(m->codes[c], name, sizeof(name)),
		       m->codes[c], m->code_count[c]);
	printf("tokens: prompt %" PRIu64 " (cached %" PRIu64 "), generated %" PRIu64
	       " (%s %" PRIu64 ")\n",
	       m->prompt, m->cached, m->generated,
	       o->http ? "events with content" : "streamed ids", m->streamed);
	printf("wall: %.3f s; generated tokens/s %.1f; prompt tokens/s %.1f; requests/s %.1f\n",
	       m->wall_s, m->wall_s > 0 ? m->generated / m->wall_s : 0.0,
	       m->wall_s > 0 ? m->prompt / m->wall_s : 0.0,
	       m->wall_s > 0 ? m->ok / m->wall_s : 0.0);
	if (m->gpud_cpu_s >= 0)
		printf("gpud cpu: %.2f s (user + system) = %.2f cores busy on average; "
		       "generated tokens per gpud cpu-second %.1f, all tokens %.1f\n",
		       m->gpud_cpu_s, m->wall_s > 0 ? m->gpud_cpu_s / m->wall_s : 0.0,
		       m->gpud_cpu_s > 0 ? m->generated / m->gpud_cpu_s : 0.0,
		       m->gpud_cpu_s > 0 ? (m->generated + m->prompt - m->cached) / m->gpud_cpu_s
					 : 0.0);
	if (m->gpud_loop_cpu_s >= 0)
		printf("gpud cpu by thread: loop (main thread) %.2f s, other threads "
		       "(devices) %.2f s; load tool processes %.2f s\n",
		       m->gpud_loop_cpu_s, m->gpud_cpu_s - m->gpud_loop_cpu_s, m->tool_cpu_s);
	if (m->front_cpu_s >= 0)
		printf("front (pid %d) cpu: %.2f s = %.2f cores busy on average\n", o->front_pid,
		       m->front_cpu_s, m->wall_s > 0 ? m->front_cpu_s / m->wall_s : 0.0);
	printf("latency ms: p50 %.2f  p99 %.2f  max %.2f\n", m->lat_p50, m->lat_p99, m->lat_max);
	printf("ttft ms:    p50 %.2f  p99 %.2f  max %.2f  (%" PRIu64 " requests streamed "
	       "tokens)\n", m->ttft_p50, m->ttft_p99, m->ttft_max, m->n_ttft);
	if (o->http)
		goto stats; /* gpud's own timings do not cross the HTTP API */
	printf("gpud usage ms: queue p50 %.2f p99 %.2f; prefill p50 %.2f p99 %.2f; "
	       "decode p50 %.2f p99 %.2f\n",
	       m->queue[0], m->queue[1], m->prefill[0], m->prefill[1], m->decode[0], m->decode[1]);
	printf("  gpud before queuing (total - queue - prefill - decode) p50 %.2f p99 %.2f; "
	       "outside gpud's total (latency - total) p50 %.2f p99 %.2f\n",
	       m->admit[0], m->admit[1], m->outside[0], m->outside[1]);
	printf("  ttft - queue - prefill p50 %.2f p99 %.2f\n", m->first_gap[0], m->first_gap[1]);
stats:
	if (!after) {
		printf("daemon stats: unavailable\n");
		return;
	}
	if (before) {
		printf("daemon counters during the run:");
		for (size_t i = 0; i < N_DELTA; i++)
			printf(" %s %+" JSON_INTEGER_FORMAT, delta_keys[i],
			       delta(before, after, delta_keys[i]));
		printf("\n");
		bool match = delta(before, after, "requests.completed") == (json_int_t)m->ok &&
			     delta(before, after, "tokens.generated") == (json_int_t)m->generated &&
			     delta(before, after, "tokens.prompt") == (json_int_t)m->prompt;
		printf("check against the daemon (completed, prompt and generated tokens): %s\n",
		       match ? "match" : "MISMATCH (another client, or a miscount)");
	}
	/* Per device during the run: steps and tokens per step show how much
	 * the scheduler batched. */
	json_t *da = json_object_get(after, "devices"), *db = json_object_get(before, "devices");
	for (size_t i = 0; i < json_array_size(da); i++) {
		const json_t *a = json_array_get(da, i), *b = json_array_get(db, i);
		json_int_t steps = jget(a, "steps") - (b ? jget(b, "steps") : 0);
		json_int_t toks = jget(a, "tokens") - (b ? jget(b, "tokens") : 0);
		json_int_t gen = jget(a, "generated") - (b ? jget(b, "generated") : 0);
		json_int_t pre = jget(a, "preemptions") - (b ? jget(b, "preemptions") : 0);
		printf("device %s during the run: steps %" JSON_INTEGER_FORMAT
		       " tokens %" JSON_INTEGER_FORMAT " generated %" JSON_INTEGER_FORMAT
		       " preemptions %" JSON_INTEGER_FORMAT " tokens/step %.1f\n",
		       json_string_value(json_object_get(a, "name")) ?: "?", steps, toks, gen, pre,
		       steps > 0 ? (double)toks / (double)steps : 0.0);
	}
	printf("alloc since warm-up:");
	for (size_t i = 0; i < sizeof(alloc_keys) / sizeof(alloc_keys[0]); i++) {
		char k[64];
		snprintf(k, sizeof(k), "alloc.since_warmup.%s", alloc_keys[i]);
		printf(" %s %" JSON_INTEGER_FORMAT, alloc_keys[i], jget(after, k));
	}
	printf(" (counted %s)\n",
	       json_is_true(json_object_get(json_object_get(after, "alloc"), "counted")) ? "yes"
											  : "no");
	size_t i;
	json_t *v;
	printf("pools:\n");
	json_array_foreach(json_object_get(after, "pools"), i, v)
		printf("  %-18s used %" JSON_INTEGER_FORMAT " high %" JSON_INTEGER_FORMAT
		       " capacity %" JSON_INTEGER_FORMAT " %s%s\n",
		       json_string_value(json_object_get(v, "name")), jget(v, "used"),
		       jget(v, "high"), jget(v, "capacity"),
		       json_string_value(json_object_get(v, "unit")) ?: "",
		       json_is_true(json_object_get(v, "rising")) ? " RISING" : "");
	printf("caches:\n");
	json_array_foreach(json_object_get(after, "caches"), i, v)
		printf("  %-18s hits %" JSON_INTEGER_FORMAT " misses %" JSON_INTEGER_FORMAT
		       " evictions %" JSON_INTEGER_FORMAT " entries %" JSON_INTEGER_FORMAT
		       " bytes %" JSON_INTEGER_FORMAT "/%" JSON_INTEGER_FORMAT
		       " hit_tokens %" JSON_INTEGER_FORMAT "\n",
		       json_string_value(json_object_get(v, "name")), jget(v, "hits"),
		       jget(v, "misses"), jget(v, "evictions"), jget(v, "entries"),
		       jget(v, "bytes"), jget(v, "max_bytes"), jget(v, "hit_tokens"));
}

static void print_json(const struct opts *o, const struct summary *m, double tpw,
		       const json_t *before, json_t *after)
{
	json_t *root = json_object(), *codes = json_object(), *d = json_object();
	double w = m->wall_s > 0 ? m->wall_s : 1.0;

	char name[32];

	for (uint32_t c = 0; c < m->n_codes; c++)
		json_object_set_new(codes, code_name(m->codes[c], name, sizeof(name)),
				    json_integer((json_int_t)m->code_count[c]));
	json_object_set_new(root, "protocol", json_string(!o->http ? "native"
							  : o->completions ? "http-completions"
									   : "http-chat"));
	json_object_set_new(root, "front_cpu_s", json_real(m->front_cpu_s));
	json_object_set_new(root, "requests", json_integer((json_int_t)(m->ok + m->errors)));
	json_object_set_new(root, "ok", json_integer((json_int_t)m->ok));
	json_object_set_new(root, "errors", json_integer((json_int_t)m->errors));
	json_object_set_new(root, "error_codes", codes);
	json_object_set_new(root, "processes", json_integer(o->processes));
	json_object_set_new(root, "concurrency", json_integer(o->concurrency));
	json_object_set_new(root, "connections", json_integer(o->connections));
	json_object_set_new(root, "tokens_per_word", json_real(tpw));
	json_object_set_new(root, "prompt_tokens", json_integer((json_int_t)m->prompt));
	json_object_set_new(root, "cached_prompt_tokens", json_integer((json_int_t)m->cached));
	json_object_set_new(root, "generated_tokens", json_integer((json_int_t)m->generated));
	json_object_set_new(root, "streamed_tokens", json_integer((json_int_t)m->streamed));
	json_object_set_new(root, "wall_s", json_real(m->wall_s));
	json_object_set_new(root, "gpud_cpu_s", json_real(m->gpud_cpu_s));
	json_object_set_new(root, "gpud_loop_cpu_s", json_real(m->gpud_loop_cpu_s));
	json_object_set_new(root, "tool_cpu_s", json_real(m->tool_cpu_s));
	json_object_set_new(root, "tokens_per_s", json_real(m->generated / w));
	json_object_set_new(root, "prompt_tokens_per_s", json_real(m->prompt / w));
	json_object_set_new(root, "latency_ms", json_pack("{s:f,s:f,s:f}", "p50", m->lat_p50,
							  "p99", m->lat_p99, "max", m->lat_max));
	json_object_set_new(root, "ttft_ms", json_pack("{s:f,s:f,s:f}", "p50", m->ttft_p50,
						       "p99", m->ttft_p99, "max", m->ttft_max));
	json_object_set_new(root, "usage_ms",
			    json_pack("{s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f},s:{s:f,s:f}}",
				      "queue", "p50", m->queue[0], "p99", m->queue[1], "prefill",
				      "p50", m->prefill[0], "p99", m->prefill[1], "decode", "p50",
				      m->decode[0], "p99", m->decode[1], "before_queue", "p50",
				      m->admit[0], "p99", m->admit[1], "outside", "p50",
				      m->outside[0], "p99", m->outside[1]));
	if (before && after) {
		for (size_t i = 0; i < N_DELTA; i++)
			json_object_set_new(d, delta_keys[i],
					    json_integer(delta(before, after, delta_keys[i])));
	}
	json_object_set_new(root, "daemon_delta", d);
	json_t *devs = json_array();
	json_t *da = json_object_get(after, "devices"), *db = json_object_get(before, "devices");
	for (size_t i = 0; i < json_array_size(da); i++) {
		const json_t *a = json_array_get(da, i), *b = json_array_get(db, i);
		json_t *dv = json_pack("{s:s?}", "name",
				      json_string_value(json_object_get(a, "name")));
		for (size_t k = 0; k < sizeof(dev_keys) / sizeof(dev_keys[0]); k++)
			json_object_set_new(dv, dev_keys[k][0],
					    json_integer(jget(a, dev_keys[k][1]) -
							 (b ? jget(b, dev_keys[k][1]) : 0)));
		json_array_append_new(devs, dv);
	}
	json_object_set_new(root, "devices_delta", devs);
	if (after) {
		json_object_set(root, "alloc", json_object_get(after, "alloc"));
		json_object_set(root, "pools", json_object_get(after, "pools"));
		json_object_set(root, "caches", json_object_get(after, "caches"));
		/* devices gpud started without (gpud.min_devices): a run on
		 * fewer devices than configured says so */
		if (json_object_get(after, "left_out"))
			json_object_set(root, "left_out", json_object_get(after, "left_out"));
	}
	char *text = json_dumps(root, JSON_COMPACT);
	if (text)
		printf("%s\n", text);
	free(text);
	json_decref(root);
}

/* --- main ----------------------------------------------------------------------------- */

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

static int parse_range(const char *s, uint32_t lo, uint32_t hi, uint32_t *a, uint32_t *b)
{
	char buf[64], *colon;

	snprintf(buf, sizeof(buf), "%s", s);
	colon = strchr(buf, ':');
	if (!colon)
		return parse_u32(buf, lo, hi, a) || parse_u32(buf, lo, hi, b) ? -EINVAL : 0;
	*colon = '\0';
	if (parse_u32(buf, lo, hi, a) || parse_u32(colon + 1, lo, hi, b) || *a > *b)
		return -EINVAL;
	return 0;
}

/* --http: the URL, the key, and the load it can carry (causal, one
 * segment). Returns 0, or -1 with a message. */
static int http_setup(struct opts *o, const char *key_file)
{
	char err[SW_ERR_MAX], key[512] = "";
	const char *env = getenv("OPENAI_API_KEY");

	if (bench_http_url_parse(o->http, &o->url, err, sizeof(err))) {
		fprintf(stderr, "gpud-load: --http %s\n", err);
		return -1;
	}
	if (key_file) {
		FILE *f = fopen(key_file, "re");

		if (!f || !fgets(key, sizeof(key), f)) {
			fprintf(stderr, "gpud-load: --api-key-file %s: %s\n", key_file,
				f ? "empty" : strerror(errno));
			if (f)
				fclose(f);
			return -1;
		}
		fclose(f);
		key[strcspn(key, "\r\n")] = '\0';
	} else if (env) {
		snprintf(key, sizeof(key), "%s", env);
	}
	if (key[0])
		snprintf(o->auth, sizeof(o->auth), "Authorization: Bearer %s\r\n", key);
	if (!o->causal || o->seg_max != 1)
		fprintf(stderr, "gpud-load: --http: causal prompts of one segment (the API's "
			"plain requests)\n");
	o->causal = true;
	o->seg_min = o->seg_max = 1;
	return 0;
}

static void usage(const char *argv0)
{
	fprintf(stderr,
		"usage: %s --socket PATH --requests N --concurrency C [--processes P]\n"
		"       [--connections K] [--prompt-tokens MIN:MAX] [--max-tokens N]\n"
		"       [--segments MIN:MAX] [--causal] [--temperature T] [--seed S]\n"
		"       [--answer SYS:K:CHUNK:POOL:Q] [--logprobs N [--prompt-logprobs]]\n"
		"       [--logit-bias N] [--timeout SECONDS] [--json]\n"
		"   or: %s --http http://HOST:PORT [--endpoint chat|completions]\n"
		"       [--api-key-file PATH] [--socket PATH] [--front-pid PID] (and the above\n"
		"       but --answer)\n",
		argv0, argv0);
}

int main(int argc, char **argv)
{
	struct opts o = {
		.requests = 100, .concurrency = 1, .processes = 1, .prompt_min = 32,
		.prompt_max = 256, .max_tokens = 64, .seg_min = 1, .seg_max = 8, .seed = 1,
		.timeout_s = 300, .logprobs = -1,
	};
	const char *key_file = NULL;
	int bad = 0;

	for (int i = 1; i < argc && !bad; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		bool takes = true;

		if (!strcmp(a, "--json")) {
			o.json = true;
			takes = false;
		} else if (!strcmp(a, "--causal")) {
			o.causal = true;
			takes = false;
		} else if (!strcmp(a, "--prompt-logprobs")) {
			o.prompt_logprobs = true;
			takes = false;
		} else if (!v) {
			bad = 1;
		} else if (!strcmp(a, "--socket")) {
			o.socket = v;
		} else if (!strcmp(a, "--http")) {
			o.http = v;
		} else if (!strcmp(a, "--endpoint")) {
			bad = strcmp(v, "chat") && strcmp(v, "completions");
			o.completions = !strcmp(v, "completions");
		} else if (!strcmp(a, "--api-key-file")) {
			key_file = v;
		} else if (!strcmp(a, "--front-pid")) {
			uint32_t pid;

			bad = parse_u32(v, 1, INT32_MAX, &pid) != 0;
			o.front_pid = (int)pid;
		} else if (!strcmp(a, "--requests")) {
			bad = parse_u32(v, 1, UINT32_MAX / 2, &o.requests) != 0;
		} else if (!strcmp(a, "--concurrency")) {
			bad = parse_u32(v, 1, MAX_CONCURRENCY, &o.concurrency) != 0;
		} else if (!strcmp(a, "--processes")) {
			bad = parse_u32(v, 1, MAX_PROCESSES, &o.processes) != 0;
		} else if (!strcmp(a, "--connections")) {
			bad = parse_u32(v, 1, MAX_CONCURRENCY, &o.connections) != 0;
		} else if (!strcmp(a, "--prompt-tokens")) {
			bad = parse_range(v, 1, 1u << 20, &o.prompt_min, &o.prompt_max) != 0;
		} else if (!strcmp(a, "--max-tokens")) {
			bad = parse_u32(v, 0, 1u << 20, &o.max_tokens) != 0;
		} else if (!strcmp(a, "--segments")) {
			bad = parse_range(v, 1, PROTO_MAX_SEGMENTS, &o.seg_min, &o.seg_max) != 0;
		} else if (!strcmp(a, "--logprobs")) {
			uint32_t n;

			bad = parse_u32(v, 0, PROTO_MAX_TOP_LOGPROBS, &n) != 0;
			o.logprobs = (int32_t)n;
		} else if (!strcmp(a, "--logit-bias")) {
			bad = parse_u32(v, 0, MAX_LOAD_BIAS, &o.logit_bias) != 0;
		} else if (!strcmp(a, "--seed")) {
			o.seed = strtoull(v, NULL, 0);
		} else if (!strcmp(a, "--temperature")) {
			o.temperature = strtof(v, NULL);
		} else if (!strcmp(a, "--timeout")) {
			o.timeout_s = atof(v);
		} else if (!strcmp(a, "--answer")) {
			o.answer = true;
			bad = sscanf(v, "%u:%u:%u:%u:%u", &o.a_sys, &o.a_k, &o.a_chunk, &o.a_pool,
				     &o.a_q) != 5 || !o.a_sys || !o.a_k || !o.a_chunk || !o.a_q ||
			      o.a_k > o.a_pool || o.a_k + 2 > PROTO_MAX_SEGMENTS ||
			      o.a_pool > 1u << 16;
		} else {
			bad = 1;
		}
		if (takes)
			i++;
		if (bad)
			fprintf(stderr, "gpud-load: bad argument: %s%s%s\n", a, takes ? " " : "",
				takes && v ? v : "");
	}
	if (bad || (!o.socket && !o.http) || o.timeout_s < 0) {
		usage(argv[0]);
		return 2;
	}
	if (o.http && o.answer) {
		fprintf(stderr, "gpud-load: --answer sends mask descriptors over the native "
			"protocol; it does not combine with --http\n");
		return 2;
	}
	if (o.prompt_logprobs && o.logprobs < 0) {
		fprintf(stderr, "gpud-load: --prompt-logprobs needs --logprobs N\n");
		return 2;
	}
	if (o.http && o.logit_bias) {
		fprintf(stderr, "gpud-load: --logit-bias is for the native protocol; it does not "
			"combine with --http\n");
		return 2;
	}
	if (o.http && o.logprobs >= 0) {
		fprintf(stderr, "gpud-load: --logprobs checks TOKENS_LP records of the native "
			"protocol; it does not combine with --http\n");
		return 2;
	}
	if (o.http && http_setup(&o, key_file))
		return 2;
	if (o.answer) {
		/* slots sized for the question; segments for the whole prompt */
		o.prompt_min = o.prompt_max = o.a_q;
		o.seg_min = o.seg_max = o.a_k + 2;
		o.causal = false;
	}
	if (!o.connections || o.connections > o.concurrency)
		o.connections = o.concurrency;
	if (o.processes > o.requests)
		o.processes = o.requests;
	signal(SIGPIPE, SIG_IGN);

	double tpw = 1.0;
	int server_pid = 0;
	if (o.http && http_model(&o))
		return 1;
	if (o.socket ? calibrate(&o, &tpw, &server_pid) : http_calibrate(&o, &tpw))
		return 1;
	json_t *before = o.socket ? fetch_stats(&o) : NULL;
	double cpu0 = proc_cpu_s(server_pid, false), loop0 = proc_cpu_s(server_pid, true);
	double front0 = o.front_pid ? proc_cpu_s(o.front_pid, false) : -1;

	/* No client thread is alive here: the children start clean. */
	pid_t pids[MAX_PROCESSES];
	int fds[MAX_PROCESSES];
	uint32_t share[MAX_PROCESSES];
	for (uint32_t p = 0; p < o.processes; p++) {
		int pfd[2];
		share[p] = o.requests / o.processes + (p < o.requests % o.processes ? 1 : 0);
		fflush(NULL);
		if (pipe(pfd)) {
			perror("gpud-load: pipe");
			return 1;
		}
		pids[p] = fork();
		if (pids[p] < 0) {
			perror("gpud-load: fork");
			return 1;
		}
		if (pids[p] == 0) {
			close(pfd[0]);
			for (uint32_t q = 0; q < p; q++)
				close(fds[q]);
			int rc = child_main(&o, tpw, share[p],
					    o.seed * 0x100000001b3ULL + p * 0x9e3779b97f4a7c15ULL,
					    pfd[1]);
			close(pfd[1]);
			_exit(rc);
		}
		close(pfd[1]);
		fds[p] = pfd[0];
	}

	struct sample *all = calloc(o.requests, sizeof(*all));
	size_t n_all = 0;
	double t_start = 0, t_end = 0;
	int failed = all ? 0 : 1;
	for (uint32_t p = 0; p < o.processes; p++) {
		struct report rep;
		int status = 0;
		if (read_all(fds[p], &rep, sizeof(rep)) || rep.fatal || rep.n > share[p] || !all ||
		    read_all(fds[p], all + n_all, rep.n * sizeof(*all))) {
			fprintf(stderr, "gpud-load: process %u gave no results\n", p);
			failed = 1;
		} else {
			if (n_all == 0 || rep.t_start < t_start)
				t_start = rep.t_start;
			if (rep.t_end > t_end)
				t_end = rep.t_end;
			n_all += rep.n;
		}
		close(fds[p]);
		waitpid(pids[p], &status, 0);
	}

	struct summary m;
	summarize(all, n_all, t_end - t_start, &m);
	double cpu1 = proc_cpu_s(server_pid, false), loop1 = proc_cpu_s(server_pid, true);
	m.gpud_cpu_s = cpu0 >= 0 && cpu1 >= 0 ? cpu1 - cpu0 : -1;
	m.gpud_loop_cpu_s = loop0 >= 0 && loop1 >= 0 ? loop1 - loop0 : -1;
	double front1 = o.front_pid ? proc_cpu_s(o.front_pid, false) : -1;
	m.front_cpu_s = front0 >= 0 && front1 >= 0 ? front1 - front0 : -1;
	struct rusage ru;
	m.tool_cpu_s = -1;
	if (getrusage(RUSAGE_CHILDREN, &ru) == 0)
		m.tool_cpu_s = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
			       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
	json_t *after = o.socket ? fetch_stats(&o) : NULL;
	if (o.json)
		print_json(&o, &m, tpw, before, after);
	else
		print_text(&o, &m, tpw, before, after);
	json_decref(before);
	json_decref(after);
	free(all);
	return failed || m.errors > 0 || n_all < o.requests ? 1 : 0;
}
