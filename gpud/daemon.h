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
 * clean shutdown, or 1 when start-up fails (the reason is logged). */
int gpud_serve(const struct sw_config *cfg, bool check_only, FILE *out);

/* --- memory plan (DESIGN §2) ------------------------------------------------- */

/* What the plan needs to know; all sizes in bytes. */
struct gpud_plan_in {
	uint32_t n_devices;
	const struct sw_config_device *devices; /* (n_devices) */
	uint64_t host_ram;          /* physical RAM (cpu devices share it) */
	double memory_fraction;     /* 0 < x <= 1 */
	uint64_t weight_bytes;      /* model weights, mapped once for all cpu devices */
	uint64_t kv_block_bytes;    /* one KV block (all layers, K and V) */
	uint32_t kv_blocks;         /* configured blocks per device; 0 = derive */
	uint32_t max_seqs;          /* sequences in flight per device */
	uint32_t n_ctx;             /* positions per sequence */
	uint32_t block_tokens;      /* positions per KV block */
	uint64_t scratch_bytes;     /* step scratch per device, as its backend
				     * sizes it (gpud_backend_ops.scratch_bytes) */
	uint64_t mask_bytes;        /* mask cache pool, per device */
	uint64_t host_bytes;        /* host-only pools: server slots and regions,
				     * tokenizer scratch (counted against RAM) */
};

struct gpud_plan {
	uint64_t total;             /* memory_fraction x RAM */
	uint64_t fixed;             /* weights + host pools + per-device scratch
				     * and mask pools of every device */
	uint64_t kv_room;           /* total - fixed, per device */
	uint32_t kv_blocks;         /* per device */
	uint32_t kv_blocks_full;    /* what max_seqs full contexts need */
	uint64_t kv_bytes;          /* kv_blocks x kv_block_bytes, per device */
	uint64_t used;              /* fixed + every device's KV */
};

/* Computes the plan: every cpu device gets an equal share of what
 * memory_fraction of RAM leaves after the weights (counted once) and the
 * fixed pools. kv_blocks 0 derives the largest count that fits, capped at
 * kv_blocks_full. Returns 0 and *out, or with a message giving the numbers
 * (*out then unspecified):
 *   SW_EUNSUPPORTED  a device this build has no backend for (cuda: "the
 *                    cuda backend is not built/implemented yet");
 *   SW_EEXHAUSTED    the configured kv_blocks, or the fixed pools alone,
 *                    do not fit, or not one block fits;
 *   -EINVAL          inconsistent input (no device, zero sizes). */
int gpud_plan_compute(const struct gpud_plan_in *in, struct gpud_plan *out, char *err,
		      size_t errlen);

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
 * Returns 0, or with a message: SW_ETOOLONG (more than cap ids: *n_ids is
 * then the number needed, counting every segment), SW_EUNSUPPORTED (chat
 * with GPUD_CHAT_NONE: the message says why and names --chat-format and
 * gpud.chat_format), -EINVAL (a segment without a role in chat mode,
 * text longer than the scratch allows), -ENOMEM (arena too small). */
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
