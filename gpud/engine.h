/* engine.h - one device's model runner: sequences, paged KV, batched steps.
 *
 * An engine binds a loaded model to a backend instance and a paged KV
 * pool; the kind of device in its parameters picks the backend
 * (gpud_backend_for, gpud/backend.h). Everything is reserved in
 * gpud_engine_create(): KV storage, the block tables of max_seqs sequence
 * slots, step scratch for
 * max_batch_tokens tokens and max_logits logits rows. gpud_engine_step()
 * allocates nothing (stats.allocs_after_warmup counts any allocation made
 * by the engine or backend after creation; it must stay 0).
 *
 * Usage (the daemon's scheduler, the CLI, the tests):
 *   gpud_engine_seq_add(e, mask_or_NULL, &s);
 *   struct gpud_batch_entry b[] = {{ .seq = s, .tokens = ids, .n_tokens = n,
 *                                    .logits = GPUD_LOGITS_LAST }, ...};
 *   gpud_engine_step(e, b, n_entries, err, sizeof err);
 *   const float *row = gpud_engine_logits(e, 0);   // (n_vocab) floats
 *   gpud_engine_seq_free(e, s);
 *
 * Not thread-safe: one thread (a device worker) drives an engine. Several
 * engines may share one model.
 */
#ifndef GPUD_ENGINE_H
#define GPUD_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/config.h"
#include "gpud/chunk.h"
#include "gpud/kv.h"
#include "gpud/quant.h"
#include "gpud/sampler.h"

struct gpud_model;
struct gpud_mask;
struct gpud_engine;

struct gpud_engine_params {
	int n_threads;             /* <= 0: one per online CPU; default 0 */
	uint32_t n_ctx;            /* per-sequence position limit; 0 or more
				    * than the model's: the model's */
	uint32_t max_batch_tokens; /* tokens per step; default 512 */
	uint32_t max_seqs;         /* sequence slots and entries per step; default 16 */
	uint32_t max_logits;       /* logits rows per step; 0: max_seqs */
	uint32_t block_tokens;     /* KV block size; default 16 */
	uint32_t n_blocks;         /* KV blocks; 0: from kv_bytes, or when
				    * that is 0 too, enough for max_seqs
				    * full-context sequences */
	size_t kv_bytes;           /* KV byte budget used when n_blocks is 0 */
	enum gpud_type kv_type;    /* KV element type (gpud_backend_config);
				    * default GPUD_TYPE_F32 */
	int device;                /* device index in allocation reports
				    * (gpud_alloc_device_note); default 0 */
	enum sw_device_kind kind;  /* picks the backend; default SW_DEVICE_CPU */
	int ordinal;               /* which device of that kind (N of
				    * "cuda:N"); default 0 */
	uint32_t test_leak_kv;     /* tests only: gpud_kv_params.test_leak */
	size_t chunk_bytes;        /* chunk-KV cache bound (gpud/chunk.h), blocks
				    * of this pool; 0: no cache; default 0 */
	uint32_t chunk_min_tokens; /* shortest segment cached; 0: block_tokens */
};

/* Fills the defaults listed above. */
void gpud_engine_params_default(struct gpud_engine_params *p);

/* Creates an engine on m (borrowed: it must outlive the engine).
 * p NULL means defaults. Returns 0 and *out, or a negative code with a
 * message in err (-EINVAL for inconsistent params, SW_EUNSUPPORTED for a
 * kind of device this build has no backend for, -ENOMEM, or the backend's
 * own); on failure *out is NULL and nothing stays allocated. */
int gpud_engine_create(struct gpud_engine **out, const struct gpud_model *m,
		       const struct gpud_engine_params *p, char *err, size_t errlen);
void gpud_engine_destroy(struct gpud_engine *e); /* accepts NULL */

/* The model the engine runs (borrowed at creation). */
const struct gpud_model *gpud_engine_model(const struct gpud_engine *e);
/* The effective parameters (defaults resolved, n_blocks computed). */
const struct gpud_engine_params *gpud_engine_params(const struct gpud_engine *e);

/* Claims a sequence slot (length 0). mask: a compiled mask (gpud/mask.h)
 * built for this engine's block_tokens, borrowed until gpud_engine_seq_free,
 * or NULL for plain causal attention. Returns 0 and *seq, SW_EEXHAUSTED
 * when all slots are taken, or -EINVAL for a mask built for another
 * block size. */
int gpud_engine_seq_add(struct gpud_engine *e, const struct gpud_mask *mask, uint32_t *seq);

/* Claims a sequence slot that starts with n full KV blocks already
 * written (a cached prompt prefix: blocks referenced elsewhere, e.g. held
 * by the prefix cache); its length is n * block_tokens and the next step
 * appends after them (shared blocks are never written: a sequence only
 * appends). The KV in those blocks must be what this sequence's first
 * n * block_tokens tokens under mask would produce - the caller's promise
 * (the prefix cache keys blocks by tokens and attention pattern). Returns 0
 * and *seq, SW_EEXHAUSTED (no slot), SW_ETOOLONG (past n_ctx) or -EINVAL
 * (mask of another block size, a free or bad block); nothing changes on
 * error. */
int gpud_engine_seq_add_prefix(struct gpud_engine *e, const struct gpud_mask *mask,
			       const uint32_t *blocks, uint32_t n, uint32_t *seq);

/* The prefix cache's holds on KV blocks (gpud_kv_block_hold/release). */
int gpud_engine_block_hold(struct gpud_engine *e, uint32_t block);
int gpud_engine_block_release(struct gpud_engine *e, uint32_t block);
/* KV bytes of one block (every layer, K and V). */
size_t gpud_engine_block_bytes(const struct gpud_engine *e);
/* The engine's KV accounting, read-only (reports, tests). */
const struct gpud_kv *gpud_engine_kv(const struct gpud_engine *e);

/* Frees the slot and drops its references to its KV blocks (a block
 * returns to the pool with its last reference). 0 or -EINVAL. */
int gpud_engine_seq_free(struct gpud_engine *e, uint32_t seq);

/* Positions already in seq's KV cache (its next token's position). */
uint32_t gpud_engine_seq_len(const struct gpud_engine *e, uint32_t seq);

/* seq's KV block table (*n entries; entry j holds positions
 * [j*block_tokens, (j+1)*block_tokens)), for memory reports. Owned by the
 * engine, valid until seq next changes; NULL and *n = 0 for a seq not in
 * use. */
const uint32_t *gpud_engine_block_table(const struct gpud_engine *e, uint32_t seq, uint32_t *n);

/* Drops seq's positions >= n (and the blocks past them). 0 or -EINVAL. */
int gpud_engine_seq_truncate(struct gpud_engine *e, uint32_t seq, uint32_t n);

/* For admission and scheduling: KV blocks a step appending n tokens to
 * seq would take from the pool (0 when its last block has room; a seq not
 * in use counts as empty), and blocks free now. */
uint32_t gpud_engine_blocks_needed(const struct gpud_engine *e, uint32_t seq, uint32_t n);
/* Free blocks, counting those the chunk-KV cache holds (evicted on demand). */
uint32_t gpud_engine_free_blocks(const struct gpud_engine *e);

enum gpud_logits_mode {
	GPUD_LOGITS_NONE = 0, /* e.g. a prefill chunk that is not the last */
	GPUD_LOGITS_LAST = 1, /* the entry's last token */
	GPUD_LOGITS_ALL = 2,  /* every token of the entry (reference tests) */
	/* The entry's last token, of which only the arg max is wanted
	 * (greedy sampling: gpud_sampler_greedy): a device backend finds it
	 * where the logits are and downloads no row. */
	GPUD_LOGITS_ARGMAX = 3,
	/* The entry's last token, of which only one draw is wanted (a
	 * sampler that is not a plain arg max: gpud_sampler_draw_next, with
	 * its penalties): a backend that draws
	 * (gpud_engine_device_draw) draws where the logits are, the same
	 * token gpud_draw_row picks from the row, and downloads no row. Only
	 * for such a backend (else -EINVAL). */
	GPUD_LOGITS_DRAW = 4,
};

struct gpud_batch_entry {
	uint32_t seq;
	const int32_t *tokens; /* (n_tokens) borrowed for the call */
	uint32_t n_tokens;     /* > 0: a prefill chunk or one decode token */
	enum gpud_logits_mode logits;
};

/* Runs one forward pass over n entries (distinct sequences). Each entry
 * appends its tokens at the sequence's next positions. On success every
 * sequence's length grows by its n_tokens and logits are readable with
 * gpud_engine_logits() until the next step.
 * Errors, with nothing changed (lengths and blocks as before):
 *   -EINVAL        n == 0, an empty entry, a bad or repeated seq, a token
 *                  id outside the vocabulary;
 *   SW_ETOOLONG    more than max_batch_tokens tokens, more than max_seqs
 *                  entries, more than max_logits logits rows, or a
 *                  sequence would pass n_ctx positions;
 *   SW_EEXHAUSTED  the KV pool lacks blocks (the scheduler queues or
 *                  preempts; nothing was reserved). */
int gpud_engine_step(struct gpud_engine *e, const struct gpud_batch_entry *ents, uint32_t n,
		     char *err, size_t errlen);
/* The same with draws[i] the draw of entry i when it is GPUD_LOGITS_DRAW
 * ((n) entries, read during the call; NULL when none is). */
int gpud_engine_step_draws(struct gpud_engine *e, const struct gpud_batch_entry *ents,
			   const struct gpud_draw *draws, uint32_t n, char *err, size_t errlen);

/* Logits of entry i of the last successful step: n_vocab floats for
 * GPUD_LOGITS_LAST, n_tokens consecutive rows of n_vocab for
 * GPUD_LOGITS_ALL; NULL for GPUD_LOGITS_NONE, GPUD_LOGITS_ARGMAX (see
 * gpud_engine_argmax) or i out of range. Owned by
 * the engine, valid until the next step. */
const float *gpud_engine_logits(const struct gpud_engine *e, uint32_t i);
/* The arg max of entry i's last logits row of the last successful step
 * (gpud_argmax: what greedy sampling picks), from the backend's device for
 * GPUD_LOGITS_ARGMAX when it can, else from the row; -EINVAL when no logit
 * is a number above -inf, -ENOENT for GPUD_LOGITS_NONE or i out of range. */
int32_t gpud_engine_argmax(const struct gpud_engine *e, uint32_t i);

/* Whether the backend finds GPUD_LOGITS_ARGMAX entries' arg max itself
 * (on its device: gpud_engine_argmax is then a lookup), or the engine
 * scans the row on the host. */
bool gpud_engine_device_argmax(const struct gpud_engine *e);
/* Whether it also draws (GPUD_LOGITS_DRAW entries are then allowed). */
bool gpud_engine_device_draw(const struct gpud_engine *e);

/* The next token of entry i (its last logits row) by smp: the arg max for
 * GPUD_LOGITS_ARGMAX, the device's draw for GPUD_LOGITS_DRAW (smp's PRNG
 * then advances: gpud_sampler_draw_done), gpud_sampler_sample_with(smp,
 * sc) otherwise (sc NULL: the sampler's own scratch). A negative code as
 * gpud_engine_argmax or gpud_sampler_sample. The caller accepts the
 * token. */
int32_t gpud_engine_sample(const struct gpud_engine *e, uint32_t i, struct gpud_sampler *smp,
			   struct gpud_sampler_scratch *sc);

/* Floats per logits row (the model's vocabulary, token_embd rows). */
uint32_t gpud_engine_n_vocab(const struct gpud_engine *e);

/* Embedding of n tokens: the mean over tokens of the hidden states after
 * the final norm, L2-normalized, into out (dim floats). Uses a temporary
 * sequence slot (prefilled in chunks) and frees it before returning.
 * Returns 0, SW_ETOOLONG (n > n_ctx), SW_EEXHAUSTED (no slot or blocks) or
 * -EINVAL; nothing changes on error. */
int gpud_engine_embed_tokens(struct gpud_engine *e, const int32_t *tokens, uint32_t n,
			     float *out, char *err, size_t errlen);
/* Same for a text, tokenized with BOS as the vocabulary asks. */
int gpud_engine_embed(struct gpud_engine *e, const char *text, size_t len,
		      float *out, char *err, size_t errlen);
/* Floats of an embedding (the model's dim). */
uint32_t gpud_engine_dim(const struct gpud_engine *e);

/* --- chunk-KV cache (gpud/chunk.h; on when chunk_bytes > 0 and the
 * backend has kv_copy_shift) ------------------------------------------------
 *
 * A prompt segment whose visibility row is "itself only" (vis = {s}) has
 * KV that depends on its tokens alone up to a rotation of K by the offset.
 * The engine caches such segments of at least chunk_min_tokens tokens,
 * each once, in blocks of its own pool (bounded by chunk_bytes, least
 * recently used first out; blocks it holds count as free in
 * gpud_engine_free_blocks and are evicted whenever a step, a reuse or a
 * store needs them), and copies them into later sequences at any offset.
 *
 * Partial blocks: an entry is stored compactly from offset 0 of its first
 * block and copied position by position into the destination's range, so
 * an offset that is not a multiple of block_tokens costs nothing extra and
 * needs no recomputed edge: the destination's blocks are always its own
 * (only full blocks are ever shared, and a sequence only appends). */

/* Before seq's next prefill step: while seq's length is the start of a
 * self-only segment of its mask that is cached, that does not reach the
 * prompt's end (its last token is always computed, for logits) and whose
 * blocks fit in max_blocks more blocks in all, copies the segment's KV in
 * (K re-rotated to its positions here) and advances seq's length past it.
 * prompt: seq's prompt tokens (n_prompt, as the mask was compiled for).
 * *n_reused: the positions added (0 when nothing applied). Counts a hit per
 * segment copied (gpud_engine_chunk_store counts the misses). Returns 0,
 * -EINVAL (a bad seq), or a backend error (seq as it was before that
 * segment). A no-op without a cache or a mask. */
int gpud_engine_chunk_reuse(struct gpud_engine *e, uint32_t seq, const int32_t *prompt,
			    uint32_t n_prompt, uint32_t max_blocks, uint32_t *n_reused);

/* After a step: caches the self-only segments of seq's prompt that its KV
 * now holds in full and that were neither reused nor stored before (the
 * engine remembers how far each sequence was scanned), except the first
 * segment (at position 0 it is what a prefix cache keeps; a chunk stored
 * from elsewhere is still reused at position 0). Takes free blocks only,
 * and never the pool's last eighth (evicting older entries under the
 * bound, or to keep that eighth free); a segment that does not fit is
 * skipped. Each such segment (self-only, at least chunk_min_tokens, not
 * the first, not wholly in the blocks gpud_engine_seq_add_prefix gave the
 * sequence) counts as a miss: it was computed, not copied. Returns the
 * segments stored, or -EINVAL for a bad seq. A no-op without a cache or
 * a mask. */
int gpud_engine_chunk_store(struct gpud_engine *e, uint32_t seq, const int32_t *prompt,
			    uint32_t n_prompt);

/* For planning seq's next prefill step: how many of its next prompt
 * tokens to compute so that the step ends where the next cached self-only
 * segment starts (gpud_engine_chunk_reuse then copies it instead), or
 * UINT32_MAX when no cached segment lies ahead. Read-only (no count, no
 * recency); 0 when the next position itself starts one. */
uint32_t gpud_engine_chunk_until(const struct gpud_engine *e, uint32_t seq,
				 const int32_t *prompt, uint32_t n_prompt);

/* Evicts least recently used chunk entries until blocks blocks are free
 * in the pool (a step evicts what it needs itself; a scheduler that
 * serializes its chunk calls with a lock calls this under it before a
 * step, so that the step leaves the cache alone). True when they are. */
bool gpud_engine_chunk_reclaim(struct gpud_engine *e, uint64_t blocks);

/* Evicts every chunk entry (their blocks go back to the pool). */
void gpud_engine_chunk_flush(struct gpud_engine *e);

/* The chunk-KV cache's counters alone (zeros without one): unlike
 * gpud_engine_stats it reads nothing a forward pass changes, so a
 * scheduler may call it while another thread steps the engine, as long as
 * it serializes it with its own chunk calls and reclaims before each step
 * (gpud_engine_chunk_reclaim). */
void gpud_engine_chunk_stats(const struct gpud_engine *e, struct gpud_chunk_stats *st);

/* True when block is held by the chunk-KV cache (memory dumps). */
bool gpud_engine_chunk_holds(const struct gpud_engine *e, uint32_t block);

/* True when the engine keeps a chunk-KV cache. */
bool gpud_engine_chunk_enabled(const struct gpud_engine *e);

struct gpud_engine_stats {
	uint64_t steps;
	uint64_t tokens;              /* tokens processed by steps */
	uint64_t allocs_after_warmup; /* must stay 0 */
	/* logits rows of successful steps, by how their token was found:
	 * an arg max, a draw made by the backend where the row is
	 * (GPUD_LOGITS_DRAW), or a row read on the host (sampling there,
	 * GPUD_LOGITS_LAST / ALL) */
	uint64_t rows_argmax, rows_drawn, rows_host;
	size_t kv_bytes;              /* KV storage reserved */
	size_t scratch_bytes;         /* step scratch reserved */
	size_t scratch_high;          /* step scratch used, high-water */
	struct gpud_kv_stats kv;
	struct gpud_chunk_stats chunk; /* zeros without a chunk cache */
};
/* Fills *st; O(1), callable every step. */
void gpud_engine_stats(const struct gpud_engine *e, struct gpud_engine_stats *st);

/* Full KV accounting check (`swarmctl mem --check`, tests): every block
 * free, or referenced exactly by the sequences holding it plus the prefix
 * cache's holds; used + free == capacity, lengths within their blocks.
 * O(n_blocks); allocates a counter array. Returns 0 or SW_EFORMAT
 * (-ENOMEM) with a message. */
int gpud_engine_check(const struct gpud_engine *e, char *err, size_t errlen);

/* --- single-request generation (the CLI; the daemon has its own loop) --- */

/* Why generation ended: enum gpud_stop_reason (gpud/sampler.h) or one of: */
#define GPUD_GEN_STOP_CONTEXT 16 /* the context is full */
#define GPUD_GEN_STOP_CALLER 17  /* the emit callback asked to stop */

struct gpud_gen_params {
	uint32_t max_tokens;      /* generated tokens at most; 0: until EOG/context */
	struct gpud_sampler_params sampling; /* temperature 0: greedy */
	const char *const *stop;  /* stop strings (not emitted), may be NULL */
	uint32_t n_stop;
	bool no_bos;              /* do not prepend BOS even if the vocab asks */
	bool parse_special;       /* special tokens in the prompt text */
	uint32_t prefill_chunk;   /* tokens per prefill step; 0: max_batch_tokens */
};
/* max_tokens 256, greedy, no stop strings, BOS as the vocab asks. */
void gpud_gen_params_default(struct gpud_gen_params *p);

/* Receives generated text as it becomes final (UTF-8 complete, not part
 * of a possible stop string). Returning non-zero stops generation. */
typedef int (*gpud_gen_emit_fn)(void *arg, const char *text, size_t len);

struct gpud_gen_result {
	uint32_t n_prompt;     /* prompt tokens */
	uint32_t n_gen;        /* generated tokens */
	double prefill_s;      /* wall time of the prompt steps */
	double decode_s;       /* wall time of the decode steps (incl. sampling) */
	int reason;            /* see GPUD_GEN_STOP_* above */
};

/* Tokenizes prompt with the model's tokenizer, prefills it in chunks,
 * samples up to max_tokens tokens and streams their text through emit.
 * Uses one sequence slot, freed before returning, and the engine's one
 * sampler (made at creation, reset per call); the only allocation per
 * call is the tokenizer's working arena. Returns 0 (res filled),
 * SW_ETOOLONG when the prompt does not fit the context, or another
 * negative code with a message in err. */
int gpud_engine_generate(struct gpud_engine *e, const char *prompt, size_t len,
			 const struct gpud_gen_params *p, gpud_gen_emit_fn emit, void *arg,
			 struct gpud_gen_result *res, char *err, size_t errlen);

#endif
