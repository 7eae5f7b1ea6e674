/* backend.h - the ops table every compute backend implements (ggml-style),
 * and the registry that picks a table by device kind.
 *
 * A backend instance runs the model on one device: gpud has one instance
 * per configured device (engine.h), each with its own pools. An instance
 * holds the KV storage for n_blocks blocks, a scratch area sized for the
 * largest step (max_batch_tokens tokens, max_seqs sequences, max_logits
 * logits rows), and whatever it needs to run the model (thread pool,
 * streams, handles). All of it is reserved in init; forward() allocates
 * nothing.
 *
 * Host and device backends. The CPU backend works in host RAM: it reads
 * the weights through the model's mapping (shared by every instance) and
 * its KV and scratch are host memory. A device backend (CUDA) fits the
 * same slots: init uploads the weights to its device (once per instance,
 * so once per device) and reserves KV and scratch there from per-device
 * pools; forward() leaves logits (and hidden states) in host buffers of
 * its own, so logits() and hidden() look the same to the engine; stats()
 * counts its device allocations. cfg.ordinal says which device of its kind
 * an instance runs on.
 *
 * KV block bookkeeping is not the backend's: the engine owns a gpud_kv
 * (gpud/kv.h) and passes each sequence's block table with every step.
 * Block b of the storage holds, per layer, K then V as
 * (n_kv_heads, block_tokens, head_dim) elements of cfg.kv_type (the CPU
 * layout; other backends may choose their own); gpud_kv_block_bytes() is
 * its size, which every backend keeps (the memory plan and the caches
 * count blocks in it).
 *
 * Slots marked "optional" may be NULL; every other slot is required. The
 * CPU backend (backend/cpu/cpu.h) implements every slot and is the
 * reference for the others.
 */
#ifndef GPUD_BACKEND_H
#define GPUD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "gpud/quant.h"

struct gpud_model;
struct gpud_mask;
struct gpud_draw;

struct gpud_backend_config {
	const struct gpud_model *model; /* borrowed; outlives the backend */
	int ordinal;                    /* which device of the backend's kind:
					 * N of "cuda:N"; 0 for cpu */
	int n_threads;                  /* host threads; <= 0: one per online CPU */
	uint32_t n_blocks;              /* KV blocks to store */
	uint32_t block_tokens;          /* positions per KV block */
	uint32_t max_batch_tokens;      /* tokens per step at most */
	uint32_t max_seqs;              /* sequences per step at most */
	uint32_t max_logits;            /* logits rows per step at most */
	enum gpud_type kv_type;         /* KV elements: GPUD_TYPE_F32 (0, the
					 * reference) or GPUD_TYPE_F16, IEEE
					 * half rounded to nearest even: K
					 * after RoPE and V are rounded once,
					 * when written; attention reads them
					 * back exactly and computes in fp32 */
};

/* One sequence's part of a step. Its tokens are
 * batch->tokens[tok0 .. tok0+n_tokens) at positions pos0 .. pos0+n_tokens-1;
 * positions < pos0 are already in its KV blocks. */
struct gpud_fwd_seq {
	const uint32_t *blocks;       /* block table covering pos0+n_tokens positions */
	const struct gpud_mask *mask; /* compiled mask, or NULL for plain causal */
	uint32_t pos0;
	uint32_t n_tokens;            /* > 0 */
	uint32_t tok0;
	uint32_t logit0;              /* first logits row of this sequence */
	uint32_t n_logits;            /* 0, 1 (its last token) or n_tokens (all) */
	bool argmax;                  /* n_logits 1, and only its arg max is read:
				       * with argmax(), the row may be left out
				       * of logits() */
	const struct gpud_draw *draw; /* with argmax, on a backend whose ops
				       * have draws: the row's id is this draw
				       * from it (gpud/draw.h), not its arg
				       * max; NULL otherwise */
};

struct gpud_fwd_batch {
	const int32_t *tokens;          /* (n_tokens) */
	uint32_t n_tokens;              /* <= max_batch_tokens */
	const struct gpud_fwd_seq *seqs; /* (n_seqs), tok0 increasing, contiguous */
	uint32_t n_seqs;                /* <= max_seqs */
	uint32_t n_logits;              /* sum of seqs[].n_logits, <= max_logits */
	bool want_hidden;               /* make hidden() valid after the step */
};

struct gpud_backend_stats {
	size_t kv_bytes;        /* KV storage reserved */
	size_t scratch_bytes;   /* step scratch reserved */
	size_t scratch_high;    /* scratch actually used, high-water */
	size_t weight_bytes;    /* weights the instance holds itself, beyond the
				 * model's mapping (CPU: packed copies) */
	uint64_t allocs_after_init; /* allocations made after init: must stay 0 */
	uint64_t steps;
	uint64_t tokens;
};

struct gpud_backend_ops {
	const char *name; /* "cpu", "cuda" */

	/* Step scratch bytes an instance made from cfg will reserve, known
	 * before any instance exists: the memory plan (gpud/daemon.h) sizes
	 * each device with it. Reads cfg's model, n_threads, max_batch_tokens,
	 * max_seqs and max_logits (0: one row). An estimate within a small
	 * factor of the real figure, which stats() reports once the instance
	 * exists. */
	uint64_t (*scratch_bytes)(const struct gpud_backend_config *cfg);

	/* Optional. Of scratch_bytes(), the model weights an instance copies
	 * for itself and then reads instead of the model's mapping (the CPU
	 * backend's packed matrices): the plan counts those bytes per
	 * instance and no longer in the mapping. Exact. */
	uint64_t (*own_weight_bytes)(const struct gpud_backend_config *cfg);

	/* Creates an instance for cfg: reserves everything its steps will use
	 * (a device backend uploads the weights here). Returns 0 and *ctx, or
	 * a negative code with a message in err (nothing is left allocated). */
	int (*init)(void **ctx, const struct gpud_backend_config *cfg, char *err, size_t errlen);

	/* Frees everything init reserved; accepts NULL. */
	void (*destroy)(void *ctx);

	/* Runs one forward pass over a ragged batch: embeds the tokens, writes
	 * their K/V into the given blocks at their positions, attends each
	 * token to its own sequence's positions <= its own under the mask, and
	 * produces the requested logits rows. The batch must be valid (the
	 * engine checks); returns 0 or a negative code with a message. KV
	 * entries at the batch's positions are unspecified after an error. */
	int (*forward)(void *ctx, const struct gpud_fwd_batch *b, char *err, size_t errlen);

	/* (n_logits, n_vocab) floats of the last forward; host memory owned by
	 * the backend, valid until the next forward. */
	const float *(*logits)(void *ctx);

	/* optional: (n_logits) ids of the last forward, one per logits row:
	 * the row's gpud_argmax (gpud/sampler.h), -1 for none; valid for
	 * every row, read by the engine for sequences with argmax set, whose
	 * rows logits() then need not hold (a device backend finds the arg
	 * max on its device and downloads ids instead of rows). */
	const int32_t *(*argmax)(void *ctx);

	/* With argmax: whether it also draws. The row of a sequence with
	 * draw set then holds the token that draw picks (gpud_draw_row's
	 * result on the same row, bit for bit), -1 when none is usable. */
	bool draws;

	/* optional: (n_tokens, dim) hidden states after the final norm of the
	 * last forward that set want_hidden; owned by the backend. */
	const float *(*hidden)(void *ctx);

	/* optional: copies KV block src into dst (prefix sharing,
	 * copy-on-write). Returns 0 or a negative code. */
	int (*kv_copy)(void *ctx, uint32_t dst, uint32_t src);

	/* optional: chunk-KV reuse (gpud/chunk.h). Copies the KV of n
	 * consecutive positions, every layer: those at token offsets
	 * [src_off, src_off + n) of block src into offsets [dst_off,
	 * dst_off + n) of block dst (dst != src; both ranges within a block),
	 * with each K rotated by delta positions (RoPE composes: keys written
	 * at position p become the keys of position p + delta; delta may be
	 * negative or 0, which copies). V is copied as is. The rotation must
	 * be the forward pass's own RoPE (same pairing, same frequencies), so
	 * the copy equals what a forward pass at the new positions writes to
	 * within rounding. NULL: the engine keeps no chunk-KV cache (a chunk
	 * is recomputed). Returns 0 or -EINVAL (a bad block or range). */
	int (*kv_copy_shift)(void *ctx, uint32_t dst, uint32_t dst_off, uint32_t src,
			     uint32_t src_off, uint32_t n, int32_t delta);

	/* optional: fills *st (O(1), callable every step). */
	void (*stats)(void *ctx, struct gpud_backend_stats *st);
};

/* --- the registry ---------------------------------------------------------- */

/* The ops table that runs devices of kind (config "cpu" -> the CPU
 * backend), or NULL when this build has no backend for it ("cuda:N" until
 * the CUDA backend lands). The table is static; a new backend adds its row
 * to the registry (gpud/backend.c) and nothing else changes. */
const struct gpud_backend_ops *gpud_backend_for(enum sw_device_kind kind);

/* --- KV geometry, shared by every backend and the memory plan -------------- */

struct gpud_model_hparams;

/* True for the element types a KV cache may have (F32, F16). */
bool gpud_kv_type_ok(enum gpud_type t);

/* Bytes of one KV block: every layer's K and V of block_tokens positions,
 * in elements of t (a type gpud_kv_type_ok accepts). */
uint64_t gpud_kv_block_bytes(const struct gpud_model_hparams *hp, uint32_t block_tokens,
			     enum gpud_type t);

/* The config's gpud.kv_type as an element type. */
enum gpud_type gpud_kv_type_of(enum sw_config_kv_type k);

#endif
