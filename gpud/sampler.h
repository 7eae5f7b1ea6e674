/* sampler.h - next-token sampling and stop conditions.
 *
 * A sampler belongs to one sequence and holds what persists from token to
 * token (parameters, PRNG, penalty history: ~16 KiB). A draw works in a
 * scratch of n_vocab-sized arrays (candidates, top-p buckets, penalty
 * counts: 24 bytes a token, 3.1 MB at 128K tokens) that nothing keeps
 * between calls: gpud_sampler_create gives the sampler its own, and a
 * server with many sequences makes light samplers and one scratch per
 * thread that samples. Everything is allocated at creation, so sampling
 * never allocates. Randomness comes
 * from the sampler's own xoshiro256** state seeded by the request: the
 * same seed, parameters and logits give the same tokens on every host.
 *
 * Order of the transforms (as in HF transformers' warpers):
 *   penalties -> temperature -> top-k -> top-p -> min-p -> draw.
 * temperature <= 0 is greedy: the arg max of the penalized logits (the
 * lowest id among equal maxima); filters and the seed are then unused.
 *
 * A draw with a temperature follows gpud/draw.h: integer masses
 * (floor(2^40 e^((l - max)/T)), tokens below 2^-40 of the best never
 * drawn) and an exact pick, so a device that draws from its own copy of
 * the row (gpud_sampler_draw_next) picks the host's token, bit for bit.
 *
 * The stop helper (gpud_stop_*) is used by generation loops: it counts
 * tokens, recognizes end-of-generation tokens and stop strings that span
 * token boundaries, and holds back text that may still turn into a stop
 * string so a stop string is never streamed to the client.
 */
#ifndef GPUD_SAMPLER_H
#define GPUD_SAMPLER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/draw.h"

#define GPUD_SAMPLER_MAX_PENALTY_LAST_N 4096

struct gpud_sampler_params {
	float temperature;       /* 0 (or less) = greedy */
	int32_t top_k;           /* <= 0 = off */
	float top_p;             /* >= 1 = off; keeps the smallest set whose mass >= top_p */
	float min_p;             /* <= 0 = off; drops p < min_p * p_max */
	uint64_t seed;
	/* Penalties over the last penalty_last_n accepted tokens (optional):
	 * repeat (llama.cpp style: positive logits divided, negative
	 * multiplied), frequency (minus f * count), presence (minus p once). */
	int32_t penalty_last_n;  /* 0 = off, at most GPUD_SAMPLER_MAX_PENALTY_LAST_N */
	float repeat_penalty;    /* 1 = off */
	float frequency_penalty; /* 0 = off */
	float presence_penalty;  /* 0 = off */
};

/* Defaults: greedy, no filters, no penalties, seed 0. */
void gpud_sampler_params_default(struct gpud_sampler_params *p);

/* Checks ranges (temperature finite, top_p in (0, 1] or off, min_p in
 * [0, 1], penalty_last_n in range, repeat_penalty > 0). Returns 0 or
 * -EINVAL with a message naming the field. */
int gpud_sampler_params_check(const struct gpud_sampler_params *p, char *err, size_t errlen);

struct gpud_sampler;
struct gpud_sampler_scratch;

/* A draw's working arrays for n_vocab tokens, usable by one thread at a
 * time with any sampler of that vocabulary. Returns 0, -EINVAL or -ENOMEM;
 * *out is NULL on error. */
int gpud_sampler_scratch_create(struct gpud_sampler_scratch **out, int32_t n_vocab, char *err,
				size_t errlen);
void gpud_sampler_scratch_free(struct gpud_sampler_scratch *sc); /* accepts NULL */
/* Bytes of a scratch for n_vocab tokens, and of a light sampler (the
 * memory plan counts them). */
size_t gpud_sampler_scratch_bytes(int32_t n_vocab);
size_t gpud_sampler_bytes(void);

/* Allocates a sampler for n_vocab tokens with a copy of *p (checked).
 * Returns 0, -EINVAL (bad params, n_vocab <= 0) or -ENOMEM; *out is NULL
 * on error. */
int gpud_sampler_create(struct gpud_sampler **out, int32_t n_vocab,
			const struct gpud_sampler_params *p, char *err, size_t errlen);
/* The same without a scratch of its own: sampled only through
 * gpud_sampler_sample_with (greedy draws need none). */
int gpud_sampler_create_light(struct gpud_sampler **out, int32_t n_vocab,
			      const struct gpud_sampler_params *p, char *err, size_t errlen);
void gpud_sampler_free(struct gpud_sampler *s); /* accepts NULL */

/* Starts a new request on the same sampler: new params (checked; on error
 * nothing changes), reseeded PRNG, empty penalty history. No allocation. */
int gpud_sampler_reset(struct gpud_sampler *s, const struct gpud_sampler_params *p,
		       char *err, size_t errlen);

/* Logit biases: at most GPUD_SAMPLER_MAX_BIAS (id, bias) pairs added to
 * the logits before penalties, temperature and filters, until the next
 * reset. The arrays are the caller's (kept alive and unchanged until
 * then); check them first with gpud_sampler_bias_check (ids in the
 * vocabulary, biases in [-100, 100]): returns 0 or -EINVAL naming the
 * entry. A sampler with biases is never greedy() nor draw_next(): its
 * row comes to gpud_sampler_sample_with, which needs a scratch. */
#define GPUD_SAMPLER_MAX_BIAS 1024
int gpud_sampler_bias_check(const int32_t *ids, const float *bias, uint32_t n, int32_t n_vocab,
			    char *err, size_t errlen);
void gpud_sampler_set_bias(struct gpud_sampler *s, const int32_t *ids, const float *bias,
			   uint32_t n);

/* Picks the next token from logits (n_vocab floats, not modified).
 * Never allocates. Does NOT record the token: call gpud_sampler_accept()
 * for every token that enters the sequence (prompt tokens too, when
 * penalties should see them). Returns the id, or -EINVAL when every
 * logit is NaN / -inf. */
int32_t gpud_sampler_sample(struct gpud_sampler *s, const float *logits);

/* The same, working in sc (NULL: the sampler's own): the tokens are those
 * gpud_sampler_sample would give. -EINVAL also when neither exists or sc
 * is for another vocabulary size. */
int32_t gpud_sampler_sample_with(struct gpud_sampler *s, struct gpud_sampler_scratch *sc,
				 const float *logits);

/* Whether the next gpud_sampler_sample() is the plain arg max of the
 * logits (greedy, no penalty in effect), i.e. gpud_argmax(): a caller may
 * then take the arg max from where the logits are (the device) instead.
 * Changes only with reset() and accept(). */
bool gpud_sampler_greedy(const struct gpud_sampler *s);

/* Whether the next gpud_sampler_sample() can be made as a draw (anything
 * but a plain arg max, with at most GPUD_DRAW_MAX_PEN distinct tokens in
 * a penalty window): then fills *d with its parameters, the window's
 * tokens and counts, and the PRNG output it would use, changing nothing,
 * so that the draw can be made where the row is (gpud_draw_row's result,
 * a device's draw kernel's). The caller then calls
 * gpud_sampler_draw_done() once the token is in hand, which advances the
 * PRNG as the sample would have. */
bool gpud_sampler_draw_next(const struct gpud_sampler *s, struct gpud_draw *d);
void gpud_sampler_draw_done(struct gpud_sampler *s);

/* The token drawn from logits (n_vocab floats) by *d (gpud/draw.h),
 * working in sc (made for at least n_vocab tokens): penalties first, then
 * the arg max (temperature <= 0) or the draw. Returns the id, or -EINVAL
 * when no logit is usable or the arguments are bad (n_vocab or n_pen out
 * of range, a NaN temperature). */
int32_t gpud_draw_row(const float *logits, int32_t n_vocab, const struct gpud_draw *d,
		      struct gpud_sampler_scratch *sc);

/* The index of the greatest of n logits that are numbers above -inf (the
 * lowest among equal maxima: -0 equals +0), or -EINVAL when none is: the
 * token greedy sampling picks. */
int32_t gpud_argmax(const float *logits, int32_t n);

/* --- log probabilities ---------------------------------------------------- */

#define GPUD_LOGPROBS_TOP_MAX 20

/* A token's log probability and its likeliest alternatives', under the
 * model's own distribution: log softmax of the raw logits, before the
 * penalties, temperature and filters a draw applies (what OpenAI's and
 * vLLM's logprobs report). */
struct gpud_logprobs {
	float logprob;   /* the token's; -inf for one that cannot occur */
	uint32_t n_top;  /* alternatives below */
	int32_t top_id[GPUD_LOGPROBS_TOP_MAX];
	float top_lp[GPUD_LOGPROBS_TOP_MAX];
};

/* Fills *out for token id from a row of n_vocab logits: n_top (at most
 * GPUD_LOGPROBS_TOP_MAX) alternatives in gpud_argmax's order (greater
 * logit first, lower index on ties; NaN never), fewer when fewer logits
 * are numbers. Two passes over the row and an n_top insertion list; no
 * allocation. -EINVAL for bad arguments. */
int gpud_logprobs_row(const float *logits, int32_t n_vocab, int32_t id, uint32_t n_top,
		      struct gpud_logprobs *out);

/* Records token id for the penalties (ignored when they are off or id
 * is out of range). */
void gpud_sampler_accept(struct gpud_sampler *s, int32_t id);

/* The next raw PRNG output (tests; reproducibility checks). */
uint64_t gpud_sampler_next_u64(struct gpud_sampler *s);

/* --- stop conditions ---------------------------------------------------- */

#define GPUD_STOP_MAX_STRINGS 8
#define GPUD_STOP_MAX_LEN 64 /* bytes per stop string */

enum gpud_stop_reason {
	GPUD_STOP_NONE = 0,       /* keep generating */
	GPUD_STOP_EOG = 1,        /* end-of-generation token */
	GPUD_STOP_STRING = 2,     /* a stop string appeared in the text */
	GPUD_STOP_MAX_TOKENS = 3, /* max_tokens generated */
};

/* Plain value type; copy it freely. */
struct gpud_stop {
	uint32_t max_tokens; /* 0 = no limit */
	uint32_t n_tokens;   /* tokens pushed so far */
	uint32_t n_strings;
	uint8_t len[GPUD_STOP_MAX_STRINGS];
	char str[GPUD_STOP_MAX_STRINGS][GPUD_STOP_MAX_LEN];
	char held[GPUD_STOP_MAX_LEN]; /* text that may start a stop string */
	uint32_t n_held;
	int matched;                  /* index of the stop string hit, or -1 */
	int reason;                   /* enum gpud_stop_reason once stopped */
};

void gpud_stop_init(struct gpud_stop *st, uint32_t max_tokens);

/* Adds a stop string (copied). Returns 0, -EINVAL for an empty string,
 * SW_ETOOLONG when longer than GPUD_STOP_MAX_LEN or when there are
 * already GPUD_STOP_MAX_STRINGS; nothing changes on error. */
int gpud_stop_add(struct gpud_stop *st, const char *s, size_t len);

/* Feeds one generated token: eog says whether it ends generation (from
 * gpud_tokenizer_is_eog), text/len is its decoded text (from
 * gpud_detok_push; pass len 0 for an EOG token). Writes to out the text
 * that may now be shown and sets *out_len. cap must be at least
 * len + GPUD_STOP_MAX_LEN; otherwise -EINVAL and nothing changes.
 * Returns the reason to stop, or GPUD_STOP_NONE. On GPUD_STOP_STRING the
 * text before the stop string is released and the stop string and what
 * follows it are dropped; on EOG or max tokens every held byte is
 * released. After a stop reason, further pushes return it again and
 * release nothing. */
int gpud_stop_push(struct gpud_stop *st, bool eog, const char *text, size_t len,
		   char *out, size_t cap, size_t *out_len);

#endif
