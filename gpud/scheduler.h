/* scheduler.h - continuous-batching scheduler over one or more engines
 * (DESIGN §1-§2). Named scheduler, not sched: meson puts gpud/ on the
 * include path, where a sched.h would shadow the system <sched.h> that
 * <pthread.h> includes.
 *
 * Requests arrive already tokenized (the daemon tokenizes). Each request
 * takes one of max_requests slots reserved at creation; every per-request
 * buffer (token ids of prompt + generated text, a sampler, the stop filter
 * and detokenizer) lives in its slot, and every per-device step array is
 * reserved at creation too, so submit, step and cancel never allocate.
 *
 * Scheduling, per device step (gpud_sched_step):
 *   1. decode entries of running sequences (one token each), in admission
 *      order; when the device's KV pool cannot hold them, the most
 *      recently admitted running sequence is preempted by recompute: its
 *      engine sequence is freed (all blocks back) and it goes back to
 *      waiting with prompt + generated tokens as its new prefill. Its
 *      sampler and stop filter keep their state, so it resumes exactly
 *      where it was (greedy outputs are bitwise those of an unpreempted
 *      run);
 *   2. prefill chunks: sequences already part-way through their prefill,
 *      then waiting requests in arrival order (FCFS), bounded by
 *      max_batch_tokens and max_seqs (chunked prefill). A waiting request
 *      that does not fit may be bypassed by a later one that does, unless
 *      it has waited more than aging_steps device steps: then nothing that
 *      arrived after it is admitted before it (no starvation);
 *   3. one engine step over that ragged batch, logits only on decode
 *      entries and last prefill chunks; sampling with the slot's own
 *      sampler, stop handling with gpud_stop_*, detokenization with the
 *      slot's gpud_detok (text is streamed alongside the token ids).
 *
 * Placement: with the prefix cache on, a new request goes to the device
 * whose cache holds the most of its prompt (looked up block by block, all
 * devices in lockstep, ending as soon as one device alone still matches),
 * unless that device's queue (waiting + running requests) is more than
 * placement_margin longer than the shortest: then, and for prompts no
 * device caches, it goes to the device with the most free KV blocks
 * (blocks held only by the prefix cache count as free), less the blocks
 * its waiting requests will still need, among equals the shortest queue,
 * and among those the fewest prompt tokens placed on it so far (idle
 * devices always tie on the first two).
 *
 * Prefix KV cache (prefix_cache_bytes > 0; gpud/prefix.h): at admission a
 * request's full prompt blocks are looked up in order (stopping at the
 * first miss, and never covering the last prompt token, which is computed
 * so that logits exist); the hits are attached to its engine sequence and
 * only the rest is prefilled. After each step the prompt blocks it has
 * fully written are inserted (it keeps using them). Blocks are keyed by
 * (parent block, token ids, attention pattern of those tokens under the
 * request's mask), verified on every hit, so the same text under another
 * mask never shares KV. Blocks no request uses stay cached up to
 * prefix_cache_bytes (LRU beyond that) and are evicted before anything is
 * preempted when the pool runs short. A preempted request looks its blocks
 * up again when it is readmitted. usage.n_cached counts the tokens served
 * at first admission.
 *
 * Thread model: one mutex per scheduler. Each device is driven by one
 * thread calling gpud_sched_step(s, dev) in a loop (the daemon's device
 * worker; several devices may step concurrently from their own threads).
 * gpud_sched_submit / cancel / stats may be called from any thread (the
 * server thread). The lock is held while a step plans its batch and while
 * it processes results, and released during the engine's forward pass
 * and the sampling of its rows (by the device's thread and the scheduler's
 * sample_threads - 1 sampling threads, shared by all devices: a slot in a
 * running batch is touched by nothing else).
 * A submit holds it only to take a request slot and to queue the request:
 * its checks (the prompt against the vocabulary) and the filling of its
 * slot (prompt copy, sampler reset) run outside it.
 * A cancel of a request whose device is in the middle of a forward pass
 * is completed by that device's thread right after the pass; otherwise
 * the KV blocks are freed and the callback runs inside gpud_sched_cancel.
 * Callbacks run with the scheduler lock held (on the device thread, or on
 * the caller of submit/cancel): they must not call gpud_sched_* functions
 * and should be quick; a TOKEN callback returning non-zero stops that
 * request (done with reason GPUD_GEN_STOP_CALLER).
 */
/* Not done here: the device worker threads themselves (the daemon loops
 * over gpud_sched_step and gpud_sched_wait), SIGTERM draining,
 * per-connection limits. A request is preempted whole (no swapping, no
 * partial truncation). */
#ifndef GPUD_SCHEDULER_H
#define GPUD_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/engine.h"
#include "gpud/sampler.h"

struct gpud_mask;
struct gpud_sched;

#define GPUD_SCHED_MAX_DEVICES 64 /* engines per scheduler */
#define GPUD_SCHED_MAX_SAMPLE_THREADS 64 /* sample_threads at most */
#define GPUD_SCHED_AUTO_SAMPLE_THREADS 16 /* sample_threads 0: online CPUs, at most this */

/* Why a request went to its device (STATS counts both per device). */
enum gpud_sched_placed {
	GPUD_SCHED_PLACED_NONE = 0,   /* pinned by the caller: counted nowhere */
	GPUD_SCHED_PLACED_LOAD = 1,   /* least loaded: no usable device caches
				       * a block of its prompt */
	GPUD_SCHED_PLACED_PREFIX = 2, /* the device caching most of its prompt */
};

struct gpud_sched_params {
	uint32_t max_requests;     /* request slots (submitted, not yet done); default 64 */
	uint32_t max_batch_tokens; /* tokens per device step; 0 or more than an
				    * engine allows: the engine's */
	uint32_t max_seqs;         /* entries per device step; 0 or more than an
				    * engine allows: the engine's */
	uint32_t aging_steps;      /* device steps after which a waiting request
				    * can no longer be bypassed; 0: never
				    * bypassed (strict FCFS); default 32 */
	uint32_t placement_margin; /* queued + running requests by which a device
				    * caching a request's prefix may exceed the
				    * least-loaded candidate and still get it;
				    * default 8: a few more sequences in a
				    * device's batch cost far less than
				    * recomputing a prompt, and 8 keeps a burst
				    * of repeats (8 agents' worth) on their
				    * prefix (bench/results/placement-*.md) */
	uint32_t sample_threads;   /* threads that sample a step's rows (the
				    * device's own thread among them): rows
				    * with a temperature or penalties cost
				    * ~1 ms each at a 128K vocabulary, so a
				    * batch of them is shared out, outside
				    * the lock; greedy rows are arg maxes.
				    * 0: one per online CPU, at most
				    * GPUD_SCHED_AUTO_SAMPLE_THREADS; 1: the
				    * device's thread alone */
	size_t prefix_cache_bytes; /* per device: KV bytes the prefix cache may
				    * keep in unreferenced blocks; 0: prefix
				    * reuse off; default 0 */
};

/* Fills the defaults listed above. */
void gpud_sched_params_default(struct gpud_sched_params *p);

/* The threads that sample a step's rows for sample_threads = configured
 * (0: one per online CPU, at most GPUD_SCHED_AUTO_SAMPLE_THREADS), the
 * device threads among them. Each has a gpud_sampler_scratch, and each
 * request slot a light sampler (gpud/sampler.h): the memory plan counts
 * both. */
uint32_t gpud_sched_sample_threads(uint32_t configured);

enum gpud_sched_event_kind {
	GPUD_SCHED_TOKEN = 1, /* one generated token (and the text it released) */
	GPUD_SCHED_DONE = 2,  /* the request ended: success or error */
	/* a prompt token's log probability given the tokens before it
	 * (prompt_logprobs): token, prompt_pos, logprobs; the prompt's first
	 * has none (logprob NaN, no alternatives) */
	GPUD_SCHED_PROMPT_TOKEN = 3,
};

struct gpud_sched_usage {
	uint32_t n_prompt;  /* prompt tokens */
	uint32_t n_gen;     /* generated tokens */
	uint32_t n_preempt; /* times this request was preempted */
	uint32_t n_cached;  /* prompt tokens whose KV came from the prefix cache
			     * (at first admission) */
	double queue_s;     /* submit to first scheduled step */
	double prefill_s;   /* first scheduled step to first token */
	double decode_s;    /* first token to done */
};

struct gpud_sched_event {
	enum gpud_sched_event_kind kind;
	uint64_t id;       /* the request id from gpud_sched_submit */
	/* TOKEN: */
	int32_t token;     /* the sampled id (also an EOG token that ends the request) */
	const char *text;  /* UTF-8 text released by this token (not NUL-terminated;
			    * held back while it may start a stop string; stop
			    * strings are never released); valid during the call */
	size_t len;
	const struct gpud_logprobs *logprobs; /* the token's, when the request
					       * asked (gpud_sched_req); else NULL */
	uint32_t prompt_pos;                  /* PROMPT_TOKEN: its place, from 0 */
	/* DONE: */
	int status;        /* 0, SW_ECANCELED, or the error that ended it */
	int reason;        /* enum gpud_stop_reason or GPUD_GEN_STOP_CONTEXT /
			    * GPUD_GEN_STOP_CALLER when status is 0 */
	const char *message; /* "" or an error message, valid during the call */
	struct gpud_sched_usage usage;
};

/* Called on the device thread (or the canceller's thread) with the lock
 * held; see the thread model above. The return value matters only for
 * TOKEN events: non-zero ends the request. */
typedef int (*gpud_sched_cb)(void *arg, const struct gpud_sched_event *ev);

struct gpud_sched_req {
	const int32_t *tokens;  /* (n_tokens) prompt ids, copied by submit */
	uint32_t n_tokens;      /* > 0 */
	const struct gpud_mask *mask; /* compiled for the engines' block_tokens and
				       * these n_tokens, or NULL (causal);
				       * borrowed until the DONE event */
	struct gpud_sampler_params sampling;
	uint32_t max_tokens;    /* generated tokens at most; 0: until EOG or
				 * the context is full */
	const char *const *stop; /* stop strings, copied by submit; may be NULL */
	uint32_t n_stop;
	/* logit biases (gpud_sampler_set_bias), copied by submit: token ids
	 * and the biases added to their logits; the request's rows then come
	 * to the host's sampler */
	const int32_t *bias_id;
	const float *bias;
	uint32_t n_bias;        /* <= GPUD_SAMPLER_MAX_BIAS */
	bool logprobs;          /* each TOKEN event carries the token's log
				 * probability (its row then comes to the host
				 * whatever the sampler) */
	uint32_t top_logprobs;  /* and its alternatives', <= GPUD_LOGPROBS_TOP_MAX */
	bool prompt_logprobs;   /* and the prompt's tokens' (PROMPT_TOKEN events
				 * before the first TOKEN; the prompt is then
				 * computed whole: no cached prefix or chunk,
				 * its chunks within the engine's spare rows) */
	bool prompt_only;       /* generate nothing: DONE after the prompt's */
	gpud_sched_cb cb;       /* required */
	void *arg;
	bool pin_device;        /* place on `device` instead of choosing */
	uint32_t device;
	enum gpud_sched_placed placed; /* with pin_device: why the caller chose
					* `device` (gpud_sched_pick_device's
					* answer), counted in its stats */
};

/* Creates a scheduler over n_dev engines (borrowed: they must outlive it,
 * and from now on only the scheduler drives them). All engines must run
 * models with the same vocabulary size (tokens are sampled per device).
 * Reserves max_requests slots, each with a token buffer of the largest
 * engine n_ctx + 1 and a sampler, and per-device step arrays. Returns 0
 * and *out, or -EINVAL / -ENOMEM with a message; *out is NULL on error. */
int gpud_sched_create(struct gpud_sched **out, struct gpud_engine *const *engines, uint32_t n_dev,
		      const struct gpud_sched_params *p, char *err, size_t errlen);

/* Frees everything. Requests still in flight get no callback; their
 * engine sequences are freed. Accepts NULL. Not concurrent with steps. */
void gpud_sched_destroy(struct gpud_sched *s);

/* Admits a request and places it on a device. Returns 0 and *id (unique,
 * never 0), or, with nothing queued and no callback:
 *   -EINVAL       empty prompt, no callback, bad sampling params, a token
 *                 outside the vocabulary, a bad stop string (SW_ETOOLONG
 *                 for too many or too long stop strings), a mask for
 *                 another block size or prompt length;
 *   SW_EBUSY      all max_requests slots are taken;
 *   SW_ETOOLONG   the request can never fit: prompt + max_tokens beyond
 *                 every device's n_ctx, or more KV blocks than any device
 *                 owns. */
int gpud_sched_submit(struct gpud_sched *s, const struct gpud_sched_req *r, uint64_t *id,
		      char *err, size_t errlen);

/* Cancels request id: frees its KV blocks (at once, or right after the
 * forward pass its device is in) and completes it with SW_ECANCELED.
 * Returns 0, or SW_ENOTFOUND when no such request is in flight. */
int gpud_sched_cancel(struct gpud_sched *s, uint64_t id);

/* Runs one iteration on device dev: builds one batch, runs it, samples,
 * streams and completes requests. One thread per device: a second thread
 * stepping the same device meanwhile gets SW_EBUSY. Returns the number of
 * batch entries run (0 when the device has nothing to do; the caller then
 * waits for a submit), -EINVAL for a bad dev, or the engine's error after
 * completing the requests of that batch with it. SW_EDEVICE (the device
 * itself failed: a CUDA fault, which is sticky) also fails the device, as
 * gpud_sched_fail_device does; a failed device's steps return 0 (or the
 * failure, once, for the step a gpud_sched_fail_device interrupted). */
int gpud_sched_step(struct gpud_sched *s, uint32_t dev, char *err, size_t errlen);

/* Fails device dev: every request on it ends now (DONE with status code,
 * normally SW_EDEVICE, and msg), new requests go to the other devices
 * (pinned to it, or with no other left: refused with code and "sched:
 * device N failed: msg"), and it is never stepped again. Any thread. When
 * the device is in a forward pass or a device_exec (a hang a watchdog
 * saw), its running requests are answered at once but their sequences and
 * slots stay until that call returns (if ever: gpud then exits). A second
 * call only ends what arrived since. Returns the requests ended, or
 * -EINVAL for a bad dev. */
int gpud_sched_fail_device(struct gpud_sched *s, uint32_t dev, int code, const char *msg);

struct gpud_sched_stats {
	uint64_t steps;       /* device steps that ran a batch */
	uint64_t tokens;      /* tokens through the engines (prefill + decode) */
	uint64_t generated;   /* tokens sampled */
	uint64_t preemptions;
	uint64_t admitted;
	uint64_t refused;     /* submits that returned an error */
	uint64_t cancelled;
	uint64_t completed;   /* DONE events, any status */
	uint32_t in_flight;   /* requests submitted and not done */
};
void gpud_sched_stats(struct gpud_sched *s, struct gpud_sched_stats *st);

/* Requests placed on dev and not done (waiting + running); 0 for a bad dev. */
uint32_t gpud_sched_queue_depth(struct gpud_sched *s, uint32_t dev);

/* The device gpud_sched_submit would choose now for a request of n_tokens
 * prompt tokens and max_tokens (the daemon compiles the mask in that
 * device's mask cache, then submits with pin_device and *placed). tokens
 * (may be NULL: load only) and mask (NULL: causal; any device's copy of
 * the request's mask: only its pattern is read) feed the prefix probe;
 * the mask's block size is not checked (all devices are taken to share
 * one). *placed (may be NULL) says why. 0 when no device fits (the pinned
 * submit then refuses with SW_ETOOLONG). */
uint32_t gpud_sched_pick_device(struct gpud_sched *s, const int32_t *tokens, uint32_t n_tokens,
				uint32_t max_tokens, const struct gpud_mask *mask,
				enum gpud_sched_placed *placed);

/* Device worker support. gpud_sched_wait blocks the calling (device)
 * thread until dev may have work (a submit placed on it, a cancel, a
 * gpud_sched_wake) or timeout_ms passes; returns at once when dev already
 * has work (waiting or running requests), and at once for a bad dev.
 * gpud_sched_wake wakes every waiting device thread (shutdown: set your
 * own stop flag first, then wake). Nothing is lost between a thread's
 * last look at its own state and its wait: a submit/cancel/wake for dev
 * that comes while its thread is not waiting makes the next wait return
 * at once (one spurious return at most). */
void gpud_sched_wait(struct gpud_sched *s, uint32_t dev, uint32_t timeout_ms);
void gpud_sched_wake(struct gpud_sched *s);

/* Runs fn(engine, arg) on dev's engine from dev's own thread, between
 * steps, as the scheduler's exclusive use of the engine (cancels arriving
 * meanwhile are completed right after, as during a forward pass); the
 * scheduler lock is not held during fn. For embeddings and for sampling
 * engine stats. fn may call submit/cancel/stats, but not
 * gpud_sched_block_owners (it waits for the device). Returns fn's return, or SW_EBUSY when another thread is
 * stepping dev (or a device_exec on it is running), -EINVAL for a bad dev
 * or a NULL fn. */
int gpud_sched_device_exec(struct gpud_sched *s, uint32_t dev,
			   int (*fn)(struct gpud_engine *e, void *arg), void *arg);
/* The same, but first, while fewer than `blocks` KV blocks are free,
 * evicts blocks held only by the prefix cache (an embedding of n tokens
 * needs ceil(n / block_tokens) blocks; with the cache on, the pool may be
 * full of cached blocks that plain device_exec leaves alone). */
int gpud_sched_device_exec_blocks(struct gpud_sched *s, uint32_t dev, uint32_t blocks,
				  int (*fn)(struct gpud_engine *e, void *arg), void *arg);

struct gpud_sched_device_stats {
	uint32_t queue;     /* waiting + running */
	uint32_t running;   /* with an engine sequence */
	uint64_t steps, tokens, generated, preemptions;
	uint64_t placed_prefix; /* requests placed here for their cached prefix */
	uint64_t placed_load;   /* requests placed here by load */
	/* prefix cache of this device (all 0 when off) */
	uint64_t prefix_hits;       /* full blocks reused */
	uint64_t prefix_misses;     /* full prompt blocks looked up and not found */
	uint64_t prefix_evictions;
	uint64_t prefix_hit_tokens; /* prompt tokens served from the cache */
	uint32_t prefix_blocks;     /* blocks held by the cache (referenced or not) */
	uint32_t prefix_unreferenced; /* of those, held only by the cache */
	size_t prefix_bytes, prefix_max_bytes; /* unreferenced cache bytes, bound */
	/* chunk-KV cache of this device's engine (all 0 when off) */
	uint64_t chunk_hits;        /* self-only segments copied from the cache */
	uint64_t chunk_misses;      /* cacheable segments computed instead */
	uint64_t chunk_evictions;
	uint64_t chunk_hit_tokens;  /* prompt tokens copied, not computed */
	uint32_t chunk_entries, chunk_blocks;
	size_t chunk_bytes, chunk_max_bytes;
	int failed;                 /* 0, or the code it failed with */
};
/* -EINVAL for a bad dev. */
int gpud_sched_device_stats(struct gpud_sched *s, uint32_t dev,
			    struct gpud_sched_device_stats *st);

/* Owner of every KV block of dev, for the memory dump (waits for a forward
 * pass or device_exec in progress on dev to end): fn is called once
 * per block in index order with kind "free", "request" (id = the request
 * id from submit), "prefix" (held only by the prefix cache; id = the
 * block's hash), "shared" (a prefix block also used by requests; id =
 * the hash) or "chunk" (held by the engine's chunk-KV cache; id 0). Under the scheduler lock: fn must not call gpud_sched_*.
 * Returns 0, -EINVAL, or the code a failed device failed with (fn is then
 * not called: a failed device's pass may never end). */
int gpud_sched_block_owners(struct gpud_sched *s, uint32_t dev,
			    void (*fn)(void *arg, uint32_t block, const char *kind, uint64_t id),
			    void *arg);

#endif
