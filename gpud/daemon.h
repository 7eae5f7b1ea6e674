/* daemon.h - `gpud serve`: the daemon that ties the engines, the scheduler,
 * the mask caches, the trough watchdog and the server together (DESIGN
 * §1-§5).
 *
 * gpud_serve() is the whole daemon: configuration checks, the memory plan,
 * one engine + mask cache + worker thread per device, one scheduler over
 * all of them, warm-up, the libuv loop with the server and the signal
 * handlers, and an orderly shutdown. It returns the process exit status.
 *
 * The pure pieces below (the memory plan, a device's stats entry and
 * segment tokenization with chat formatting) are exposed so that their
 * arithmetic and messages are unit-tested without a running daemon
 * (tests/unit/daemon_test.c). Implementation: daemon*.c, listed in
 * gpud/daemon_impl.h.
 */
#ifndef GPUD_DAEMON_H
#define GPUD_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/config.h"
#include "gpud/engine.h"
#include "gpud/maskcache.h"
#include "gpud/memwatch.h"
#include "gpud/scheduler.h"
#include "gpud/stats.h"
#include "gpud/tokenizer.h"
#include "proto/msg.h"

struct sw_arena;

/* --- the daemon ------------------------------------------------------------ */

/* Runs `gpud serve` with cfg (already loaded, env applied and validated).
 * check_only: validate, open the model, compute the memory plan, print
 * "configuration OK" and the plan to out, and return 0 without reserving
 * anything; on a problem print the error (key path, numbers) to out and
 * return 1. Otherwise serve until SIGTERM/SIGINT and return 0 after a
 * clean shutdown, 1 when start-up fails (the reason is logged), or
 * GPUD_EXIT_DEVICE after a device failed. */
int gpud_serve(const struct sw_config *cfg, bool check_only, FILE *out);

/* gpud_serve's status when a device failed while serving (a CUDA fault,
 * or a step past gpud.step_timeout_ms): its requests failed with
 * SW_EDEVICE, the other devices drained, and a restart (the supervisor's,
 * systemd's Restart=on-failure) gets a fresh device context. */
#define GPUD_EXIT_DEVICE 3

/* --- memory plan (DESIGN §2) ------------------------------------------------- */

/* A device with memory of its own ("cuda:N"), as the plan sees it: what
 * the device reports (gpud_cuda_device_info) and the pools its backend
 * reserves there besides KV (gpud_cuda_plan_for). */
struct gpud_plan_devmem {
	char name[96];              /* "NVIDIA H200" */
	int cc_major, cc_minor;     /* compute capability */
	uint64_t total_bytes;       /* device memory (cudaMemGetInfo) */
	uint64_t free_bytes;        /* of it free now */
	uint64_t weights;           /* the uploaded model */
	uint64_t weights_q8;        /* of it: held as Q8_0, not in the file's type */
	uint64_t masks;             /* the device mask pool */
	uint64_t scratch;           /* step scratch */
	uint64_t kv_block_bytes;    /* one KV block as this backend stores it */
	uint64_t staging;           /* pinned host staging: host RAM */
};

/* Device memory a device's plan leaves unplanned below what is free: the
 * CUDA context's own growth (module loads, cuBLAS handle, graph
 * instantiation) that no pool of ours holds. */
#define GPUD_PLAN_DEVICE_RESERVE (256ull << 20)

/* What the plan needs to know; all sizes in bytes. */
struct gpud_plan_in {
	uint32_t n_devices;
	const struct sw_config_device *devices; /* (n_devices) */
	const struct gpud_plan_devmem *devmem;  /* (n_devices): entry i is read for
						 * every device that is not "cpu";
						 * may be NULL when all are cpu */
	uint64_t host_ram;          /* physical RAM (cpu devices share it) */
	double memory_fraction;     /* 0 < x <= 1 */
	uint64_t weight_bytes;      /* model weights, mapped once for all cpu devices */
	uint64_t kv_block_bytes;    /* one KV block (all layers, K and V), cpu */
	uint32_t kv_blocks;         /* configured blocks per device; 0 = derive */
	uint32_t max_seqs;          /* sequences in flight per device */
	uint32_t n_ctx;             /* positions per sequence */
	uint32_t block_tokens;      /* positions per KV block */
	uint64_t scratch_bytes;     /* step scratch per cpu device, as its backend
				     * sizes it (gpud_backend_ops.scratch_bytes) */
	uint64_t mask_bytes;        /* mask cache pool (host), per device of any kind */
	uint64_t host_bytes;        /* host-only pools: server slots and regions,
				     * tokenizer scratch (counted against RAM) */
};

/* One device's share of the plan. */
struct gpud_plan_dev {
	bool own_memory;            /* a device with memory of its own (cuda) */
	uint32_t kv_blocks;
	uint64_t kv_block_bytes;
	uint64_t kv_bytes;          /* kv_blocks x kv_block_bytes */
	/* own_memory only (0 for cpu devices, which share the host figures): */
	uint64_t budget;            /* memory_fraction x total, at most free -
				     * GPUD_PLAN_DEVICE_RESERVE */
	uint64_t fixed;             /* weights + masks + scratch */
	uint64_t kv_room;           /* budget - fixed */
	uint64_t used;              /* fixed + kv_bytes */
};

/* The host figures cover host RAM: the cpu devices' KV, scratch and the
 * weights they read, every device's host mask pool, the pinned staging of
 * the device backends and the host pools. */
struct gpud_plan {
	uint64_t total;             /* memory_fraction x RAM */
	uint64_t fixed;             /* weights (when a cpu device reads them) +
				     * host pools + per-device mask pools of
				     * every device + cpu devices' scratch +
				     * pinned staging */
	uint64_t kv_room;           /* total - fixed, per cpu device (0: none) */
	uint32_t kv_blocks;         /* per cpu device (0: no cpu device) */
	uint32_t kv_blocks_full;    /* what max_seqs full contexts need */
	uint64_t kv_bytes;          /* kv_blocks x kv_block_bytes, per cpu device */
	uint64_t used;              /* fixed + every cpu device's KV */
	uint32_t n_cpu;             /* cpu devices */
	int32_t failed_dev;         /* a failed plan: the device (index into
				     * gpud_plan_in.devices) whose own memory
				     * cannot hold its part, else -1 */
	struct gpud_plan_dev dev[SW_CONFIG_MAX_DEVICES]; /* (n_devices) */
};

/* Computes the plan: every cpu device gets an equal share of what
 * memory_fraction of RAM leaves after the weights (counted once) and the
 * fixed pools; every device with memory of its own gets what
 * memory_fraction of its total memory (at most what is free less
 * GPUD_PLAN_DEVICE_RESERVE) leaves after its own pools. kv_blocks 0
 * derives the largest count that fits, capped at kv_blocks_full; a
 * configured kv_blocks holds for every device. Returns 0 and *out, or with
 * a message giving the numbers (*out then unspecified):
 *   SW_EEXHAUSTED    the configured kv_blocks, or the fixed pools alone,
 *                    do not fit host RAM or a device's budget, or not one
 *                    block fits (out->failed_dev: that device, or -1 for
 *                    host RAM);
 *   -EINVAL          inconsistent input (no device, zero sizes, too many
 *                    devices, a device that is not cpu without devmem).
 * Which devices this build and machine can run is gpud_plan_device_check's
 * question, asked before. */
int gpud_plan_compute(const struct gpud_plan_in *in, struct gpud_plan *out, char *err,
		      size_t errlen);

/* Whether gpud.devices[i] (dev) can run here: built says whether this
 * build has a backend for its kind, n_visible how many devices of its kind
 * the process sees (gpud_cuda_device_count; ignored for cpu). Returns 0,
 * or with the message:
 *   SW_EUNSUPPORTED  no backend in this build ("gpud.devices[1]: cuda:0:
 *                    this gpud was built without the CUDA backend ...",
 *                    saying how to build it);
 *   -ENODEV          no such device ("gpud.devices[0]: cuda:0: no CUDA
 *                    device (0 visible) ..."). */
int gpud_plan_device_check(const struct sw_config_device *dev, uint32_t i, bool built,
			   int n_visible, char *err, size_t errlen);

/* "512 B", "1.5 KiB", "12.5 GiB" (one decimal above 1 KiB). */
void gpud_fmt_bytes(uint64_t bytes, char *out, size_t outlen);

/* --- stats snapshot ----------------------------------------------------------- */

/* One device's numbers, as the daemon samples them. */
struct gpud_dev_numbers {
	const char *name;                    /* "cpu0" */
	uint64_t kv_block_bytes;
	struct gpud_engine_stats engine;     /* KV pool and scratch */
	uint32_t kv_live, kv_cached;         /* engine.kv.used split as the
					      * watchdog sees it: blocks live
					      * requests hold, blocks only the
					      * prefix cache keeps */
	struct gpud_maskcache_stats mask;
	uint32_t mask_high;                  /* most mask slots used at once */
	struct gpud_sched_device_stats sched; /* queue, steps, prefix cache */
	bool have_watch;                     /* kv_watch and mask_watch are set */
	struct gpud_memwatch_status kv_watch, mask_watch;
};

/* Appends dev's entry to s->devices, its pools "<name>.kv" (blocks),
 * "<name>.scratch" (bytes), "<name>.mask" (slots) to s->pools and its
 * caches "<name>.mask" and "<name>.prefix" to s->caches. The kv pool's
 * live and cached parts are kv_live and kv_cached (the prefix cache's,
 * bounded by prefix_max_bytes in blocks), the mask pool's the pinned and
 * unpinned masks (bounded by the cache's max_entries). Entries that do
 * not fit the snapshot's arrays are left out (the counts stay within
 * their maxima). Copies every string (warnings included). */
void gpud_snapshot_add_device(struct gpud_stats_snapshot *s, const struct gpud_dev_numbers *n);

/* --- segment tokenization ----------------------------------------------------- */

/* Working memory of gpud_segments_tokenize, reserved once (the daemon keeps
 * one for its loop thread). fmt holds formatted chat text, copy the
 * NUL-terminated copies of two chat segments, or the private copy of a
 * plain one (its text may sit in memory a client can rewrite meanwhile:
 * the tokenizer reads only copies). */
struct gpud_segtok_scratch {
	char *fmt;
	size_t fmt_cap;   /* >= 2 * max segment bytes + 256 */
	char *copy;
	size_t copy_cap;  /* >= 2 * (max segment bytes + 1) */
	struct sw_arena *arena; /* tokenizer scratch for the largest segment */
};

/* Tokenizes the segments of a request into ids (cap ids), segment after
 * segment, and sets seg_tokens[i] (n entries) and *n_ids.
 *  - plain (chat false): segment 0 gets BOS when the vocabulary asks for
 *    it, no later segment does; special-token text is ordinary text.
 *  - chat: segment i becomes message i (its role) in tmpl's format; the
 *    template's own BOS text comes once, at the start of segment 0 (for a
 *    format without one, ChatML and Phi-3, the vocabulary's BOS when it
 *    asks), and the assistant header is appended to the last segment;
 *    special tokens are parsed (they are the template's). A message whose
 *    text the template defers (a Llama 2 or Mistral system prompt goes
 *    into the next [INST]) gives 0 tokens to its own segment.
 *  - a segment of token ids (PROTO_SEG_IDS, plain only) is its ids as
 *    they are, each checked against the vocabulary; no BOS is added to
 *    it (a plain request that starts with text still gets one).
 * Returns 0, or with a message: SW_ETOOLONG (more than cap ids: *n_ids is
 * then the number needed, counting every segment), SW_EUNSUPPORTED (chat
 * with GPUD_CHAT_NONE: the message says why and names --chat-format and
 * gpud.chat_format), -EINVAL (a segment without a role in chat mode,
 * text longer than the scratch allows, an id outside the vocabulary), -ENOMEM (arena too small). */
int gpud_segments_tokenize(const struct gpud_tokenizer *tok, enum gpud_chat_template tmpl,
			   bool chat, const struct proto_segment *segs, uint32_t n,
			   struct gpud_segtok_scratch *scratch, int32_t *ids, uint32_t cap,
			   uint32_t *seg_tokens, uint32_t *n_ids, char *err, size_t errlen);

/* Formats segment i of a chat request alone: the text the template adds
 * for message i after messages 0..i-1 (with the assistant header when
 * last). out gets at most cap bytes, NUL-terminated; returns the length,
 * or a negative code (-EINVAL bad role, SW_ETOOLONG cap too small,
 * SW_EUNSUPPORTED no template). Uses copy (copy_cap bytes) for the
 * NUL-terminated message texts. */
long gpud_chat_segment(enum gpud_chat_template tmpl, const struct proto_segment *segs,
		       uint32_t i, bool last, char *out, size_t cap, char *copy, size_t copy_cap);

#endif
