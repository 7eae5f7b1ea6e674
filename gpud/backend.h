/* backend.h - the ops table every compute backend implements (ggml-style).
 *
 * A backend instance holds, for one device: the KV storage for n_blocks
 * blocks, a scratch area sized for the largest step (max_batch_tokens
 * tokens, max_seqs sequences, max_logits logits rows), and whatever it
 * needs to run the model (thread pool, streams, handles). All of it is
 * reserved in init; forward() allocates nothing.
 *
 * KV block bookkeeping is not the backend's: the engine owns a gpud_kv
 * (gpud/kv.h) and passes each sequence's block table with every step.
 * Block b of the storage holds, per layer, K then V as
 * (n_kv_heads, block_tokens, head_dim) floats (the CPU layout; other
 * backends may choose their own).
 *
 * Slots marked "optional" may be NULL. The CPU backend (backend/cpu/cpu.h)
 * implements every slot and is the reference for the others.
 */
#ifndef GPUD_BACKEND_H
#define GPUD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct gpud_model;
struct gpud_mask;

struct gpud_backend_config {
	const struct gpud_model *model; /* borrowed; outlives the backend */
	int n_threads;                  /* <= 0: one per online CPU */
	uint32_t n_blocks;              /* KV blocks to store */
	uint32_t block_tokens;          /* positions per KV block */
	uint32_t max_batch_tokens;      /* tokens per step at most */
	uint32_t max_seqs;              /* sequences per step at most */
	uint32_t max_logits;            /* logits rows per step at most */
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
	uint64_t allocs_after_init; /* allocations made after init: must stay 0 */
	uint64_t steps;
	uint64_t tokens;
};

struct gpud_backend_ops {
	const char *name; /* "cpu", "cuda" */

	/* Creates an instance for cfg. Returns 0 and *ctx, or a negative code
	 * with a message in err (nothing is left allocated). */
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

	/* optional: (n_tokens, dim) hidden states after the final norm of the
	 * last forward that set want_hidden; owned by the backend. */
	const float *(*hidden)(void *ctx);

	/* optional: copies KV block src into dst (prefix sharing,
	 * copy-on-write). Returns 0 or a negative code. */
	int (*kv_copy)(void *ctx, uint32_t dst, uint32_t src);

	/* optional */
	void (*stats)(void *ctx, struct gpud_backend_stats *st);
};

#endif
