/* daemon_impl.h - private to the files of `gpud serve` (gpud/daemon.h):
 * the daemon's state and what its files share.
 *
 *   daemon.c          start-up and teardown: gpud_serve, the build steps,
 *                     warm-up
 *   daemon_plan.c     memory sizing: pool sizes, the plan, its report, the
 *                     check of the engines' real figures against it
 *   daemon_device.c   the device threads and their embedding queues
 *   daemon_service.c  the service the server calls (submit, embed, cancel,
 *                     tokenize) and the scheduler events that end a submit
 *   daemon_stats.c    stats and mem snapshots, /metrics
 *   daemon_dump.c     the block owner dump (MEM with PROTO_MEM_DUMP_OWNERS)
 *   daemon_signal.c   signals, draining and shutdown, the loop's timers
 *   daemon_segments.c segment tokenization and chat formatting
 *
 * Threads:
 *   loop    the libuv loop: server, signals, timers, and every service op
 *           (submit, embed, cancel, tokenize, stats, mem). Single-threaded,
 *           so its scratch (token buffer, tokenizer arena, chat buffers,
 *           stats snapshot) is one set on the daemon.
 *   device  one per device: steps the scheduler, runs queued embeddings
 *           inside gpud_sched_device_exec, samples its pools for the
 *           watchdog, and sleeps in gpud_sched_wait when idle.
 * Locks: the scheduler's (taken inside gpud_sched_*; its callbacks run
 * under it), one mutex per device (its mask cache, embed queue and pool
 * sample), one for the watchdog. Order: scheduler before device before
 * watchdog; nothing calls gpud_sched_* while holding a device mutex.
 *
 * Memory: everything is reserved before warm-up; the request path uses the
 * server's slots (struct req_priv in each slot's priv area), the device's
 * embed job slots and the loop scratch. Nothing allocates after warm-up
 * except the owner dump's file (open(2), no malloc).
 */
#ifndef GPUD_DAEMON_IMPL_H
#define GPUD_DAEMON_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <uv.h>

#include "common/arena.h"
#include "common/config.h"
#include "common/err.h"
#include "gpud/admit.h"
#include "gpud/daemon.h"
#include "gpud/scheduler.h"
#include "gpud/server.h"

#define EMBED_SLOTS 8          /* queued + running embeddings per device */
#define IDLE_WAIT_MS 100       /* device thread sleep when idle */
#define POLL_MS 50             /* shutdown: in-flight check period */
#define STEP_WATCH_MS 100      /* the step watchdog's period */
#define WARMUP_TIMEOUT_S 120
#define DUMP_BUF (64u << 10)
#define MAX_TEXT_CAP (1u << 20) /* text of one request at most */

enum req_kind { REQ_SUBMIT = 1, REQ_EMBED = 2 };

/* Per-request service state, in the server slot's priv area (zeroed at
 * accept). Written by the loop before the request reaches a device. */
struct req_priv {
	struct gpud_daemon *d;
	struct gpud_sreq *r;
	struct gpud_maskcache_entry *mask; /* pinned in dev's cache, or NULL (causal) */
	enum gpud_sched_placed placed;     /* why dev was chosen (STATS) */
	uint64_t sched_id;
	double t0;
	uint32_t dev;
	uint32_t job;                      /* REQ_EMBED: slot in dev's jobs */
	enum req_kind kind;
	int reply_err;                     /* a token batch the server refused */
	uint32_t top_logprobs;             /* alternatives a token (SUBMIT flags) */
	bool prompt_text;                  /* a prompt piece with text was sent */
};
/* A server slot's priv area (struct req_priv, 16-byte aligned). */
#define REQ_PRIV_BYTES ((sizeof(struct req_priv) + 15) / 16 * 16)

struct embed_job {
	struct gpud_sreq *r;   /* the request to answer; NULL once whoever answers
				* it (the device thread, a failure, a cancel)
				* has taken it, or for a warm-up job */
	bool busy;             /* taken (being filled, queued or running) */
	bool queued;           /* ready for the device thread */
	bool running;
	bool cancelled;
	bool warmup;
	uint64_t seq;          /* FIFO order */
	uint32_t n_tokens;
	int32_t *tokens;       /* (n_ctx) */
	float *out;            /* (dim) */
	int rc;
	char err[SW_ERR_MAX];
};

struct device {
	struct gpud_daemon *d;
	uint32_t idx;
	char name[16];         /* "cpu0" (gpud__device_name) */
	struct gpud_engine *engine;
	pthread_mutex_t lock;  /* masks, jobs, n_jobs, job_seq, sample */
	struct gpud_maskcache *masks;
	struct embed_job jobs[EMBED_SLOTS];
	uint32_t n_jobs;
	uint64_t job_seq;
	pthread_t thread;
	bool started;
	int wd_kv, wd_mask;    /* watchdog pool ids */
	/* Last sample taken by the device thread (under lock). est.kv.used
	 * = kv_live (blocks of live sequences, prefix entries in use and
	 * whatever leaked) + kv_cached (blocks only the prefix cache keeps). */
	struct gpud_engine_stats est;
	uint32_t kv_live, kv_cached;
	struct gpud_maskcache_stats mst; /* at build: the pool's figures */
	uint32_t mask_high;
	uint64_t step_errors;
	uint64_t embeds;
	/* Failure (daemon_device.c). busy_since: the monotonic ms at which
	 * the device thread started its current round of work (a step, its
	 * embeddings, its pool sample), 0 while it waits: the step watchdog
	 * reads it. failed is set once (fail_msg under lock before it);
	 * hung: the watchdog failed it while busy, its thread is left
	 * behind at exit; fail_seen: the loop has acted on it. */
	atomic_uint_fast64_t busy_since;
	atomic_bool failed;
	bool hung;
	bool fail_seen;
	char fail_msg[SW_ERR_MAX];
	/* Warm-up: its requests and embeddings not yet ended; left_out: it
	 * failed there and gpud serves without it (gpud.min_devices): fenced
	 * off, its thread idle (or hung in the device), its memory held. */
	atomic_uint warm_left;
	bool left_out;
};

/* A configured device gpud started without (gpud.min_devices). */
struct left_out {
	char name[16];         /* "cuda3": as it would have been named */
	char device[16];       /* "cuda:3" */
	char why[SW_ERR_MAX];  /* the error that left it out */
};

struct gpud_daemon {
	/* The configuration; its device list holds the devices that serve
	 * (those left out at start removed, each keeping its configured
	 * position in .pos). */
	struct sw_config cfg;
	uint32_t n_configured;  /* devices in the configuration as given */
	struct left_out left[SW_CONFIG_MAX_DEVICES];
	uint32_t n_left;        /* fixed once listening */
	struct gpud_model *model;
	const struct gpud_tokenizer *tok;
	enum gpud_chat_template tmpl;
	uint32_t n_ctx, dim, n_dev, block_tokens;
	uint64_t kv_block_bytes;
	struct gpud_plan plan;
	struct device dev[SW_CONFIG_MAX_DEVICES];
	struct gpud_sched *sched;
	struct gpud_memwatch *watch;
	pthread_mutex_t watch_lock;
	/* The planted leaks of the watchdog's tests (GPUD_TEST_LEAK, read at
	 * start, see daemon.c), one in leak_* (0: none): a finished request
	 * keeps its mask pinned; a freed KV sequence keeps its last block
	 * (gpud_kv_params.test_leak). */
	uint32_t leak_masks, leak_kv;
	/* GPUD_TEST_FAIL_ENGINE (daemon.c): the configured position of the
	 * device whose engine fails on purpose, or -1. */
	int test_fail_engine;
	atomic_uint_fast64_t mask_ends;  /* requests with a mask that ended */
	atomic_bool stopping;
	/* The step watchdog's thread (daemon_device.c): looks every
	 * STEP_WATCH_MS, ends with stopping. */
	pthread_t step_watch;
	bool step_watch_started;
	int exit_status;       /* gpud_serve's return: 0, or GPUD_EXIT_DEVICE */

	uv_loop_t loop;
	bool loop_ok;
	struct gpud_server *server;
	uv_signal_t sig_term, sig_int, sig_usr1;
	uv_timer_t poll_timer, deadline_timer;
	uv_timer_t sample_timer;   /* the server's pools, for the watchdog */
	int wd_req, wd_conn;       /* watchdog ids of server.requests / .connections */
	bool handles_ok;
	atomic_bool draining;  /* SIGTERM seen (read by device threads) */
	bool finishing;
	struct gpud_metrics *metrics;

	/* Loop-thread scratch. */
	int32_t *ids;                       /* (n_ctx) */
	uint32_t seg_tokens[PROTO_MAX_SEGMENTS];
	struct sw_arena tok_arena;
	char *fmt, *copy;
	struct gpud_segtok_scratch segtok;
	uint32_t max_text;
	struct gpud_admit admit;
	struct gpud_stats_snapshot snap;
	char *dump_buf;
	size_t dump_len;
	int dump_fd;
	bool dump_failed;
	char dump_path[SW_CONFIG_PATH_MAX + 64];
	uint32_t dumps;          /* owner dumps written; the file is slot dumps % GPUD_DUMPS_KEPT */
	double last_rate_t;
	uint64_t last_rate_gen;
	double rate;

	/* Counters (device threads and loop). */
	atomic_uint_fast64_t completed, errors, cancelled, embeds;
	atomic_uint_fast64_t tok_prompt, tok_cached, tok_generated;
	double t_start;
};

/* Everything the plan needs that depends on the model and the config
 * (gpud__size_pools); bytes unless said otherwise. */
struct sizing {
	uint32_t n_ctx;           /* positions per sequence */
	uint32_t threads_per_dev; /* backend threads of each device */
	uint32_t mask_entries;    /* mask cache entries per device */
	uint32_t max_text;        /* text bytes of one request */
	uint64_t scratch;         /* step scratch per device (its backend's figure) */
	uint64_t packed;          /* of which a cpu device's packed weights (the
				   * mapping's share of those tensors is not
				   * resident then: taken off the weights) */
	uint64_t mask_slot;       /* one mask pool slot */
	uint64_t mask_pool;       /* mask pool per device: mask_entries + 1 slots */
	uint64_t server;          /* connection regions and request slots */
	uint64_t tok_scratch;     /* the loop's tokenizer arena */
	uint64_t sampling;        /* the scheduler's samplers (a light one per
				   * request slot) and draw scratches (one per
				   * sampling thread, device threads included) */
	uint32_t sample_threads;  /* gpud_sched_sample_threads of the config */
	uint64_t host;            /* every host-only pool (server, loop scratch,
				   * embedding slots) */
	struct gpud_plan_devmem devmem[SW_CONFIG_MAX_DEVICES]; /* devices with memory
				   * of their own: what they report and reserve
				   * (gpud__make_plan fills them) */
};

static inline double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline uint64_t now_ms(void)
{
	return (uint64_t)(now_s() * 1000.0);
}

/* --- daemon_plan.c: memory sizing ------------------------------------------ */

/* Sizes every pool from cfg and the model into *z (no allocation). */
void gpud__size_pools(const struct sw_config *cfg, const struct gpud_model *m, struct sizing *z);

/* The memory plan for cfg with z's pools (gpud_plan_compute), after
 * checking that every device can run here (gpud_plan_device_check) and
 * asking each device with memory of its own what it has and what its
 * pools take (into z->devmem); also gives the bytes of one cpu KV block.
 * 0, or a negative code with the message and *bad: the index of the
 * device the failure is about when leaving it out could help (not there,
 * not answering, its own memory too small for its part), else -1. */
int gpud__make_plan(const struct sw_config *cfg, const struct gpud_model *m,
		    struct sizing *z, struct gpud_plan *plan, uint64_t *kv_block_bytes,
		    int *bad, char *err, size_t errlen);

/* Device i's name in logs, stats and the plan: its backend's name and its
 * place in gpud.devices as configured ("cpu0", "cuda1", ...; .pos). */
void gpud__device_name(const struct sw_config *cfg, uint32_t i, char *out, size_t outlen);

/* The plan, one line per pool, to out (`gpud serve --check`) or the log. */
void gpud__print_plan(FILE *out, const struct sw_config *cfg, const struct sizing *z,
		      const struct gpud_plan *p, uint64_t bb, uint64_t weights);
void gpud__log_plan(const struct sw_config *cfg, const struct sizing *z,
		    const struct gpud_plan *p, uint64_t bb, uint64_t weights);

/* The plan used estimates: holds what the devices really reserved (their
 * engines' and mask pools' figures, d->dev[].est and .mst) plus the
 * weights and host pools to its budget. Logs the total; SW_EEXHAUSTED
 * (logged) when it passes. */
int gpud__plan_check(const struct gpud_daemon *d, const struct sizing *z);

/* --- daemon_device.c: device threads and their embedding queues ------------ */

/* The device thread (pthread start routine; arg is its struct device). */
void *gpud__device_main(void *arg);

/* The device with a free embed slot and the shortest queue; -1 if none. */
int gpud__embed_device(struct gpud_daemon *d);
/* Takes a free job slot of dv (busy, not queued); NULL when full. */
struct embed_job *gpud__job_take(struct device *dv, uint32_t *slot);
/* Hands a filled slot to dv's thread (r NULL for a warm-up job). */
void gpud__job_queue(struct device *dv, struct embed_job *j, struct gpud_sreq *r, bool warmup);
/* Frees a slot taken but not queued. */
void gpud__job_drop(struct device *dv, struct embed_job *j);
/* Fails dv (any thread; the first reason stays): its requests and
 * embeddings end with SW_EDEVICE and msg, nothing goes to it again, and
 * the loop then drains the others and ends gpud with GPUD_EXIT_DEVICE
 * (gpud__check_failures). hung: the device is in a step that does not
 * return; its thread is left behind at exit. */
void gpud__device_fail(struct device *dv, const char *msg, bool hung);
/* Starts the step watchdog's thread (gpud.step_timeout_ms > 0): a device
 * busy in one round of work longer than that is failed as hung. */
int gpud__step_watch_start(struct gpud_daemon *d);
/* Loop thread: acts once on each device newly failed (logs it, sets the
 * exit status, starts the drain). */
void gpud__check_failures(struct gpud_daemon *d);
/* Whether every device has failed. */
bool gpud__all_failed(struct gpud_daemon *d);

/* --- daemon_service.c, daemon_stats.c, daemon_dump.c: the service ----------- */

/* What the server calls (loop thread); svc is the daemon. */
extern const struct gpud_service_ops gpud__service_ops;
int gpud__svc_stats(void *svc, char *buf, size_t cap, size_t *len, char *err, size_t errlen);
int gpud__svc_mem(void *svc, uint32_t flags, char *buf, size_t cap, size_t *len, char *err,
		  size_t errlen);
/* GET /metrics (gpud_metrics render callback; arg is the daemon). */
int gpud__metrics_render(void *arg, char *buf, size_t cap, size_t *len);
/* Writes every KV block's owner to a JSON file under state_dir,
 * gpud-blocks-<slot>.json with slot 0..GPUD_DUMPS_KEPT-1 in turn, so
 * repeated dumps (a monitoring script) keep the last few and never fill
 * the disk; its path in d->dump_path. 0, or a negative code with the
 * message. */
#define GPUD_DUMPS_KEPT 8
int gpud__dump_owners(struct gpud_daemon *d, char *err, size_t errlen);

/* --- daemon_signal.c: signals and shutdown ---------------------------------- */

/* Closes every handle on the loop (the server's too); uv_run then returns.
 * Idempotent. */
void gpud__finish(struct gpud_daemon *d);
/* SIGTERM/SIGINT: drain, then close (again: cancel all); SIGUSR1: reopen
 * the log. h->data is the daemon. */
void gpud__on_signal(uv_signal_t *h, int signum);
/* Refuses new requests, closes once none is in flight, cancels what is
 * left after shutdown_deadline_ms (why: for the log). Once only. */
void gpud__drain(struct gpud_daemon *d, const char *why);
/* Samples the server's slot pools for the watchdog (t->data: the daemon). */
void gpud__on_sample(uv_timer_t *t);

#endif
