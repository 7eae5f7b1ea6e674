/* msg.h - payloads of the frames: encoding and decoding (DESIGN §4; byte
 * layouts in proto/README.md).
 *
 * Requests (SUBMIT, TOKENIZE, EMBED, MEM) are written by the client into
 * the request area of its region; replies (TOKENS, DONE, ERROR, *_REPLY)
 * by gpud into the response ring. Every payload is a sequence of
 * little-endian fields with no internal offsets: counts come first, then
 * arrays, then string bytes, and the sizes must add up to exactly the
 * payload length. Decoding checks every count against the payload length
 * (overflow-safe) and against struct proto_limits: malformed input gives
 * SW_EFORMAT, a count over a limit SW_ETOOLONG, both with a message naming
 * the field ("submit: segment 3: length 70000 runs past the payload").
 *
 * Nothing here allocates. Decoders fill caller-provided structs:
 *
 *   COPIED into the struct (private memory): every fixed field and count,
 *   segment lengths and roles, sampling parameters, the mask descriptor's
 *   rows and indices, stop strings, error messages, usage. These are what
 *   gpud validates and then acts on; the peer can rewrite the shared bytes
 *   at any time, so they are read once (proto_copy_in) and the checks and
 *   all later uses see the same private copy. A mask index changed after
 *   validation would otherwise index a bitset out of bounds.
 *
 *   VIEWS into the region: segment text, tokenize/embed text, token ids
 *   and text of a batch, embedding values, JSON. A view's pointer and
 *   length are private copies, validated to lie inside the payload, and
 *   the region can neither shrink nor grow (sealed), so reading a view
 *   never leaves the mapping. A peer that rewrites the bytes behind a view
 *   only corrupts its own request. Readers must therefore treat view bytes
 *   as untrusted (bounded by the view's length) and must not assume two
 *   reads return the same bytes; a reader that needs them stable (say, a
 *   two-pass parser) copies them first. Protocol rule (README): a
 *   request's bytes are lent to gpud until gpud's first reply record for
 *   that request id, and a ring record is stable until the consumer
 *   releases it.
 */
#ifndef PROTO_MSG_H
#define PROTO_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/frame.h"
#include "proto/mask.h"

/* Hard limits of the format (struct proto_limits may only lower them);
 * PROTO_MAX_SEGMENTS is in proto/mask.h. gpud's own limits may be wider
 * but never narrower (it asserts so where it converts). */
/* Index storage for a full descriptor: row i can name i + 1 segments. */
#define PROTO_MAX_MASK_IDX ((PROTO_MAX_SEGMENTS + 1) * (PROTO_MAX_SEGMENTS + 2) / 2)
#define PROTO_MAX_STOP 8      /* stop strings per request */
#define PROTO_MAX_STOP_LEN 64 /* bytes per stop string */
#define PROTO_MAX_ERROR_MSG 256 /* bytes including the NUL */

/* Configured limits, checked by the decoders (gpud fills them from its
 * config). A field of 0 means its default; a value above a hard limit
 * means the hard limit. */
struct proto_limits {
	uint32_t max_segments;   /* <= PROTO_MAX_SEGMENTS; default 64 */
	uint32_t max_stop;       /* <= PROTO_MAX_STOP */
	uint32_t max_text_bytes; /* segment text in all (submit), or the text
				  * of a tokenize/embed request; default 1 MiB */
	uint32_t max_ids;        /* ids in a token batch / tokenize reply;
				  * default 1 Mi */
	uint32_t max_embed_dim;  /* default 65536 */
	uint32_t max_json_bytes; /* stats/mem replies; default 4 MiB */
};

/* Fills *lim with the defaults. */
void proto_limits_default(struct proto_limits *lim);

/* --- submit ------------------------------------------------------------- */

#define PROTO_SUBMIT_CHAT 0x1u /* format segments as chat messages (roles) */
/* Log probabilities: every generated token's, and (bits 8-15) those of
 * its PROTO_SUBMIT_TOP(flags) likeliest alternatives, at most
 * PROTO_MAX_TOP_LOGPROBS; the replies are TOKENS_LP records (§4.2). */
#define PROTO_SUBMIT_LOGPROBS 0x2u
/* And the prompt's: each prompt token's given the tokens before it (the
 * first has none), in TOKENS_LP records flagged PROTO_LP_PROMPT before
 * the generated tokens' (needs LOGPROBS). */
#define PROTO_SUBMIT_PROMPT_LOGPROBS 0x4u
/* Generate nothing: the request ends with its prompt's log probabilities
 * (DONE: 0 generated tokens; needs PROMPT_LOGPROBS). */
#define PROTO_SUBMIT_PROMPT_ONLY 0x8u
/* A logit-bias table follows the stop strings (§4.1): set by the encoder
 * exactly when n_bias > 0. */
#define PROTO_SUBMIT_LOGIT_BIAS 0x10u
#define PROTO_SUBMIT_TOP_SHIFT 8
#define PROTO_SUBMIT_TOP_MASK (0xffu << PROTO_SUBMIT_TOP_SHIFT)
#define PROTO_SUBMIT_TOP(flags) (((flags) & PROTO_SUBMIT_TOP_MASK) >> PROTO_SUBMIT_TOP_SHIFT)
#define PROTO_SUBMIT_FLAGS_KNOWN                                                              \
	(PROTO_SUBMIT_CHAT | PROTO_SUBMIT_LOGPROBS | PROTO_SUBMIT_PROMPT_LOGPROBS |           \
	 PROTO_SUBMIT_PROMPT_ONLY | PROTO_SUBMIT_LOGIT_BIAS | PROTO_SUBMIT_TOP_MASK)
#define PROTO_MAX_TOP_LOGPROBS 20
#define PROTO_MAX_LOGIT_BIAS 1024 /* entries of a logit-bias table */

/* Roles for chat formatting (PROTO_SUBMIT_CHAT); grow at the end. */
enum proto_role {
	PROTO_ROLE_NONE = 0, /* plain text (only without PROTO_SUBMIT_CHAT) */
	PROTO_ROLE_SYSTEM = 1,
	PROTO_ROLE_USER = 2,
	PROTO_ROLE_ASSISTANT = 3,
	PROTO_ROLE_LAST = 4,
};

/* "system", "user", "assistant"; NULL for NONE or unknown. */
const char *proto_role_name(uint8_t role);

struct proto_text {
	const char *p; /* (len) bytes, not NUL-terminated */
	uint32_t len;
};

/* A segment's flags (byte 5 of its table entry). */
/* The segment is token ids, not text: (len / 4) little-endian i32 ids of
 * the model's vocabulary, fed as they are (no BOS added, nothing
 * tokenized). len a multiple of 4; not with PROTO_SUBMIT_CHAT. */
#define PROTO_SEG_IDS 0x1u
#define PROTO_SEG_FLAGS_KNOWN PROTO_SEG_IDS

struct proto_segment {
	const char *text; /* (len) bytes, not NUL-terminated; a view after decode */
	uint32_t len;
	uint8_t role;     /* enum proto_role */
	uint8_t flags;    /* PROTO_SEG_* */
};

/* Sampling parameters as the wire carries them; gpud checks their ranges
 * and applies them in this order: penalties, temperature, top-k, top-p,
 * min-p, draw. */
struct proto_sampling {
	float temperature;       /* 0 (or less) = greedy */
	int32_t top_k;           /* <= 0 = off */
	float top_p;             /* >= 1 = off; keeps the smallest set whose mass >= top_p */
	float min_p;             /* <= 0 = off; drops p < min_p * p_max */
	uint64_t seed;
	/* Penalties over the last penalty_last_n tokens (optional): repeat
	 * (positive logits divided, negative multiplied), frequency (minus
	 * f * count), presence (minus p once). */
	int32_t penalty_last_n;  /* 0 = off; gpud's limit is 4096 */
	float repeat_penalty;    /* 1 = off */
	float frequency_penalty; /* 0 = off */
	float presence_penalty;  /* 0 = off */
};

/* A token's logit bias: added to its logit before anything else (gpud
 * takes -100..100, an id of the vocabulary). */
struct proto_bias {
	int32_t id;
	float bias;
};

/* Fills *p with the defaults: greedy, no filters, no penalties, seed 0. */
void proto_sampling_default(struct proto_sampling *p);

/* A generation request, as the client fills it to encode and as decode
 * presents it. */
struct proto_submit_req {
	uint32_t n_segments;
	const struct proto_segment *segments; /* (n_segments) */
	/* NULL, or rows NULL: no descriptor (plain causal). Otherwise
	 * n_segments must equal the request's n_segments and rows holds
	 * n_segments + 1 rows (the last is G). */
	const struct proto_mask_desc *mask;
	struct proto_sampling sampling;
	uint32_t max_tokens;
	uint32_t flags;                /* PROTO_SUBMIT_* */
	uint32_t n_stop;
	const struct proto_text *stop; /* (n_stop) stop strings, 1..64 bytes */
	uint32_t n_bias;               /* <= PROTO_MAX_LOGIT_BIAS */
	const struct proto_bias *bias; /* (n_bias) */
};

/* Decode storage (about 31 KiB: keep it in a preallocated request slot,
 * not on a small stack). After a successful decode, req points into this
 * struct (mask rows and indices, stop strings: copies) and into the region
 * (segment text: views). */
struct proto_submit {
	struct proto_submit_req req;
	struct proto_segment seg[PROTO_MAX_SEGMENTS];
	struct proto_mask_desc mask;
	struct proto_mask_row rows[PROTO_MAX_SEGMENTS + 1];
	uint16_t idx[PROTO_MAX_MASK_IDX];
	struct proto_text stop[PROTO_MAX_STOP];
	char stop_buf[PROTO_MAX_STOP][PROTO_MAX_STOP_LEN];
	struct proto_bias bias[PROTO_MAX_LOGIT_BIAS];
};

/* Bytes the encoded request takes (*size). Also the check an encoder
 * runs first. Checks the request against the hard limits (segments, stop
 * strings and their lengths, the descriptor as proto_mask_validate does
 * and its index total, flags, roles, sizes overflowing u32): returns 0,
 * -EINVAL (NULL where data is needed, mask n_segments mismatch) or
 * SW_EFORMAT / SW_ETOOLONG with a message. */
int proto_submit_size(const struct proto_submit_req *req, size_t *size, char *err,
		      size_t errlen);

/* Encodes req into buf (cap bytes) and sets *len. Same checks and returns
 * as proto_submit_size, plus -ENOSPC when cap is too small (buf may then
 * be partly written). */
int proto_submit_encode(const struct proto_submit_req *req, uint8_t *buf, size_t cap,
			size_t *len, char *err, size_t errlen);

/* Decodes a SUBMIT payload (len bytes, normally in the request area) into
 * *out, checking against lim (NULL: defaults). Returns 0, SW_EFORMAT,
 * SW_ETOOLONG or -EINVAL (NULL arguments), with a message naming the
 * field. The mask descriptor's copy is checked for shape and then by
 * proto_mask_validate against lim's max_segments; the sampling parameters
 * are copied unchecked (their ranges are gpud's to check). On error *out
 * is unspecified. */
int proto_submit_decode(const uint8_t *payload, size_t len, const struct proto_limits *lim,
			struct proto_submit *out, char *err, size_t errlen);

/* --- token batch (TOKENS; also TOKENIZE_REPLY, with text usually empty) -- */

struct proto_tokens {
	uint32_t n_ids;
	const uint8_t *ids_le; /* view: (n_ids) little-endian i32 */
	uint32_t text_len;
	const char *text;      /* view: (text_len) bytes of UTF-8 */
	/* TOKENS_LP only (logprobs true): for each id its log probability and
	 * n_top alternatives', read with struct proto_lp_iter. */
	bool logprobs;
	bool eog;              /* the last id is the end-of-generation token
				* that ended the request (PROTO_LP_EOG) */
	bool prompt;           /* the ids are the prompt's (PROTO_LP_PROMPT) */
	uint32_t n_top;        /* <= PROTO_MAX_TOP_LOGPROBS */
	const uint8_t *lp_le;  /* view: n_ids * (1 + n_top) {i32 id, f32 logprob} */
	const uint8_t *plen_le; /* view: as many u16 piece lengths */
	const char *pieces;    /* view: (pieces_len) bytes, the pieces in order */
	uint32_t pieces_len;
};

/* Id i (< n_ids) of a decoded batch (TOKENS or TOKENS_LP); reads the
 * view, no alignment needed. */
static inline int32_t proto_tokens_id(const struct proto_tokens *t, uint32_t i)
{
	if (t->logprobs)
		return (int32_t)proto_get32(t->lp_le + 8 * (size_t)i * (1 + (size_t)t->n_top));
	return (int32_t)proto_get32(t->ids_le + 4 * (size_t)i);
}

/* Bytes of a batch with n_ids ids and text_len bytes of text; 0 when the
 * total would not fit in u32. */
size_t proto_tokens_size(uint32_t n_ids, uint32_t text_len);

/* Encodes into buf (cap bytes, e.g. from proto_ring_reserve); sets *len.
 * Returns 0, -EINVAL (NULL with a nonzero count), -ENOSPC, SW_ETOOLONG
 * (total over u32). */
int proto_tokens_encode(uint8_t *buf, size_t cap, const int32_t *ids, uint32_t n_ids,
			const char *text, uint32_t text_len, size_t *len);

/* Decodes a TOKENS or TOKENIZE_REPLY payload; views point into payload.
 * Returns 0, SW_EFORMAT, SW_ETOOLONG (n_ids or text over lim) or -EINVAL. */
int proto_tokens_decode(const uint8_t *payload, size_t len, const struct proto_limits *lim,
			struct proto_tokens *out, char *err, size_t errlen);

/* TOKENS_LP (§4.2): a token batch with log probabilities. Entry e of
 * the n_ids * (1 + n_top) is token e / (1 + n_top)'s own (e % (1 + n_top)
 * == 0) or one of its alternatives, likeliest first; ids[] and lps[]
 * hold them in that order, plen[] their pieces' lengths (the token's raw
 * bytes, which need not be whole UTF-8 characters), pieces the pieces
 * back to back. */
#define PROTO_TOKENS_LP_HEADER 20
/* flags: the batch's last id is the end-of-generation token that ended
 * the request (its text, if any, is not part of the answer) */
#define PROTO_LP_EOG 0x1u
/* the ids are prompt tokens, the prompt's from its first on (text empty):
 * a log probability given the tokens before it; the prompt's first token
 * has none (NaN, its alternatives id -1) */
#define PROTO_LP_PROMPT 0x2u
#define PROTO_LP_KNOWN (PROTO_LP_EOG | PROTO_LP_PROMPT)
size_t proto_tokens_lp_size(uint32_t n_ids, uint32_t n_top, uint32_t text_len,
			    uint32_t pieces_len); /* 0 when over u32 */
/* Returns 0, -EINVAL (NULL arrays, n_top over PROTO_MAX_TOP_LOGPROBS,
 * piece lengths that do not add up to pieces_len, unknown flags or EOG
 * without an id), -ENOSPC, SW_ETOOLONG. */
int proto_tokens_lp_encode(uint8_t *buf, size_t cap, uint32_t n_ids, uint32_t n_top,
			   const int32_t *ids, const float *lps, const uint16_t *plen,
			   const char *pieces, uint32_t pieces_len, const char *text,
			   uint32_t text_len, uint32_t flags, size_t *len);
/* Decodes one into *out (logprobs set); the same returns as
 * proto_tokens_decode, SW_EFORMAT also for n_top over the hard limit or
 * piece lengths that do not add up. */
int proto_tokens_lp_decode(const uint8_t *payload, size_t len, const struct proto_limits *lim,
			   struct proto_tokens *out, char *err, size_t errlen);

/* Walks a TOKENS_LP batch's entries in order. The views are re-read, so
 * a piece past pieces_len (bytes rewritten since decode) ends the walk. */
struct proto_lp_iter {
	const struct proto_tokens *t;
	uint32_t e, off;
};

struct proto_lp_entry {
	uint32_t token;    /* which of the batch's ids */
	uint32_t rank;     /* 0: the token itself; k: its k-th alternative */
	int32_t id;
	float logprob;
	const char *piece; /* view: (piece_len) raw bytes */
	uint32_t piece_len;
};

static inline void proto_lp_iter_init(struct proto_lp_iter *it, const struct proto_tokens *t)
{
	it->t = t;
	it->e = 0;
	it->off = 0;
}

/* The next entry into *out; false at the end. */
bool proto_lp_next(struct proto_lp_iter *it, struct proto_lp_entry *out);

/* --- done ------------------------------------------------------------------ */

#define PROTO_DONE_SIZE 48

struct proto_done {
	uint32_t prompt_tokens;
	uint32_t cached_prompt_tokens; /* <= prompt_tokens */
	uint32_t generated_tokens;
	uint32_t stop_reason;          /* enum proto_stop_reason */
	uint64_t queue_us;             /* admission to first scheduled step */
	uint64_t prefill_us;
	uint64_t decode_us;
	uint64_t total_us;
};

/* Why generation ended; grow at the end. */
enum proto_stop_reason {
	PROTO_STOP_EOG = 1,        /* end-of-generation token */
	PROTO_STOP_STRING = 2,     /* a stop string appeared */
	PROTO_STOP_MAX_TOKENS = 3, /* max_tokens generated, or the context is full */
	PROTO_STOP_CANCELED = 4,
};

/* Encodes PROTO_DONE_SIZE bytes. Returns 0, -EINVAL or -ENOSPC. */
int proto_done_encode(uint8_t *buf, size_t cap, const struct proto_done *d, size_t *len);
/* Copies the usage out. SW_EFORMAT for a wrong length or cached > prompt. */
int proto_done_decode(const uint8_t *payload, size_t len, struct proto_done *out,
		      char *err, size_t errlen);

/* --- error ----------------------------------------------------------------- */

struct proto_error {
	int32_t code;                  /* negative: SW_E* or -errno */
	char msg[PROTO_MAX_ERROR_MSG]; /* copied, NUL-terminated */
};

/* Bytes for a message of msg_len bytes (truncated to
 * PROTO_MAX_ERROR_MSG - 1). */
size_t proto_error_size(size_t msg_len);
/* Encodes code (must be negative) and msg (may be NULL; truncated to
 * PROTO_MAX_ERROR_MSG - 1 bytes so an error always fits). Returns 0,
 * -EINVAL or -ENOSPC. */
int proto_error_encode(uint8_t *buf, size_t cap, int32_t code, const char *msg, size_t *len);
/* SW_EFORMAT for a non-negative code or lengths that do not add up,
 * SW_ETOOLONG for a message over the limit. */
int proto_error_decode(const uint8_t *payload, size_t len, struct proto_error *out,
		       char *err, size_t errlen);

/* --- tokenize / embed requests ---------------------------------------------- */

#define PROTO_TOK_ADD_BOS 0x1u       /* tokenize: add BOS when the vocab asks */
#define PROTO_TOK_PARSE_SPECIAL 0x2u /* tokenize: recognize special tokens */
#define PROTO_TOK_FLAGS_KNOWN (PROTO_TOK_ADD_BOS | PROTO_TOK_PARSE_SPECIAL)

/* DETOKENIZE: the text is (len / 4) little-endian i32 token ids. */
#define PROTO_DETOK_SPECIAL 0x1u /* control tokens by their text (else none) */
#define PROTO_DETOK_FLAGS_KNOWN PROTO_DETOK_SPECIAL

struct proto_text_req {
	uint32_t flags;   /* PROTO_TOK_* for tokenize, PROTO_DETOK_* for
			   * detokenize; 0 for embed */
	const char *text; /* view */
	uint32_t len;
};

/* Bytes of a tokenize/embed request with len bytes of text: 8 + len. */
size_t proto_text_req_size(uint32_t len);
/* Encodes a TOKENIZE (type PROTO_T_TOKENIZE), DETOKENIZE (its ids as the
 * text: len a multiple of 4) or EMBED request. Returns 0, -EINVAL (bad
 * type, flags or length, NULL text with len > 0) or -ENOSPC. */
int proto_text_req_encode(uint16_t type, uint8_t *buf, size_t cap, uint32_t flags,
			  const char *text, uint32_t len, size_t *out_len);
/* Decodes one; unknown flags or a DETOKENIZE length that is not whole
 * ids -> SW_EFORMAT, text over max_text_bytes (DETOKENIZE: more ids than
 * max_ids) -> SW_ETOOLONG. */
int proto_text_req_decode(uint16_t type, const uint8_t *payload, size_t len,
			  const struct proto_limits *lim, struct proto_text_req *out,
			  char *err, size_t errlen);

/* --- embed reply ------------------------------------------------------------ */

struct proto_embedding {
	uint32_t dim;
	const uint8_t *values_le; /* view: (dim) little-endian f32 */
};

/* Value i (< dim) of a decoded embedding; reads the view. */
static inline float proto_embedding_value(const struct proto_embedding *e, uint32_t i)
{
	return proto_getf32(e->values_le + 4 * (size_t)i);
}

size_t proto_embedding_size(uint32_t dim); /* 0 when over u32 */
/* Encodes dim values. Returns 0, -EINVAL (NULL with dim > 0), -ENOSPC or
 * SW_ETOOLONG (size over u32). */
int proto_embedding_encode(uint8_t *buf, size_t cap, const float *values, uint32_t dim,
			   size_t *len);
/* SW_EFORMAT when lengths disagree, SW_ETOOLONG when dim > max_embed_dim. */
int proto_embedding_decode(const uint8_t *payload, size_t len, const struct proto_limits *lim,
			   struct proto_embedding *out, char *err, size_t errlen);

/* --- mem request, stats/mem replies --------------------------------------- */

#define PROTO_MEM_REQ_SIZE 4
#define PROTO_MEM_DUMP_OWNERS 0x1u /* also dump every block's owner to the
				    * server's dump file (path in the reply) */
#define PROTO_MEM_FLAGS_KNOWN PROTO_MEM_DUMP_OWNERS

/* Encodes PROTO_MEM_REQ_SIZE bytes. Returns 0, -EINVAL (unknown flags,
 * NULL) or -ENOSPC. */
int proto_mem_req_encode(uint8_t *buf, size_t cap, uint32_t flags, size_t *len);
/* Copies the flags out. SW_EFORMAT for a wrong length or unknown flags;
 * -EINVAL for NULL arguments. */
int proto_mem_req_decode(const uint8_t *payload, size_t len, uint32_t *flags,
			 char *err, size_t errlen);

/* STATS_REPLY / MEM_REPLY: u32 length + JSON text (a view). */
size_t proto_json_size(uint32_t len); /* 4 + len */
/* Encodes len bytes of JSON (not checked as JSON). Returns 0, -EINVAL or
 * -ENOSPC. */
int proto_json_encode(uint8_t *buf, size_t cap, const char *json, uint32_t len,
		      size_t *out_len);
/* Decodes into a view (out->p into payload). SW_EFORMAT when the length
 * disagrees with the payload, SW_ETOOLONG over max_json_bytes, -EINVAL
 * for NULL arguments. The text is not NUL-terminated. */
int proto_json_decode(const uint8_t *payload, size_t len, const struct proto_limits *lim,
		      struct proto_text *out, char *err, size_t errlen);

#endif
