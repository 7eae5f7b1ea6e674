/* api.h - the OpenAI-shaped JSON of gpud-http: request decoding, response
 * and error encoding, server-sent-event framing. Pure (jansson and the
 * caller's memory; no sockets), so the unit tests and the fuzz target
 * drive it directly.
 *
 * Requests:
 *   chat        POST /v1/chat/completions: messages (each a segment with
 *               its role, so gpud formats them with the model's chat
 *               template exactly as `gpud generate --chat` does)
 *   completion  POST /v1/completions: prompt (one string), or the swarm
 *               extension's segments
 *   embeddings  POST /v1/embeddings: input, a string or an array of them
 * Parameters: model (required, must be the served model), max_tokens /
 * max_completion_tokens, temperature [0, 2], top_p (0, 1], seed,
 * stop (string or up to PROTO_MAX_STOP strings of 1..64 bytes),
 * presence_penalty / frequency_penalty [-2, 2], n = 1 only, stream,
 * stream_options.include_usage, log probabilities of the generated
 * tokens (chat: logprobs true and top_logprobs 0..20; completions:
 * logprobs 0..20), completions' echo (the prompt and, with logprobs, its
 * tokens' log probabilities before the answer's; max_tokens 0 scores the
 * prompt alone; not streamed). Members no client of ours needs (user,
 * logit_bias = {}, ...) are ignored; ones that would change the answer
 * and are not supported (n > 1, tools, best_of > 1) are refused with 400
 * naming them.
 *
 * The swarm extension (DESIGN §3, README "HTTP API"):
 *   "swarm": {"segments": ["sys", "chunk", "question"],
 *             "visibility": [[0], [0, 1], [0, 2], [0, 2]]}
 * segments (completions only; chat's segments are its messages) and
 * visibility: S + 1 rows of segment indices, row i (and row S for the
 * generation) naming the segments it may see; a row always sees itself.
 * Without visibility the request is plain causal.
 */
#ifndef HTTP_API_H
#define HTTP_API_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"

#define HTTP_PARAM_MAX 64
#define HTTP_MSG_MAX 256
#define HTTP_EMBED_MAX_INPUTS 256
#define HTTP_MAX_TOKENS_CAP 1000000u
#define HTTP_MAX_N 16 /* choices a request ("n") */

/* A client mistake: the status and the OpenAI error fields. */
struct http_err {
	int status;                     /* 400, 404, ... */
	char param[HTTP_PARAM_MAX];     /* "" = null */
	char code[32];                  /* "" = null */
	char msg[HTTP_MSG_MAX];
};

enum http_kind {
	HTTP_CHAT = 1,
	HTTP_COMPLETION = 2,
};

/* A decoded generation request. Holds its parsed JSON: strings point into
 * it. Large (the mask storage): allocate it. Free with http_gen_free. */
struct http_gen {
	enum http_kind kind;
	json_t *root;
	char *parts;                    /* joined content parts (owned), or NULL */
	uint8_t *idbuf;                 /* token-id segments' ids (owned), or NULL */
	const char *model;
	bool stream;
	bool include_usage;
	bool no_reasoning;              /* reasoning_format "none": no split (think.h) */
	bool logprobs;                  /* log probabilities wanted (req.flags too) */
	bool echo;                      /* completions: the prompt before the answer */
	bool ids;                       /* a segment is token ids (PROTO_SEG_IDS) */
	uint32_t top_logprobs;          /* alternatives a token, <= PROTO_MAX_TOP_LOGPROBS */
	uint32_t n;                     /* choices, 1..HTTP_MAX_N (not streamed when > 1):
					 * choice i draws with seed + i */
	struct proto_submit_req req;    /* points into the members below */
	struct proto_segment seg[PROTO_MAX_SEGMENTS];
	struct proto_mask_desc mask;
	struct proto_mask_row rows[PROTO_MAX_SEGMENTS + 1];
	uint16_t idx[PROTO_MAX_MASK_IDX];
	struct proto_text stop[PROTO_MAX_STOP];
	struct proto_bias bias[PROTO_MAX_LOGIT_BIAS];
};

/* Decodes a request body of len bytes (not NUL-terminated) as kind.
 * max_segments bounds the segments (gpud.max_segments). Returns 0, or -1
 * with *e filled (400, the param named). g must be zeroed or freed
 * before; on error it holds nothing to free (http_gen_free is harmless). */
int http_gen_decode(enum http_kind kind, const char *body, size_t len, uint32_t max_segments,
		    struct http_gen *g, struct http_err *e);

/* Releases what g holds and zeroes its pointers. */
void http_gen_free(struct http_gen *g);

/* A decoded embeddings request. */
struct http_embed {
	json_t *root;
	const char *model;
	bool base64;
	uint32_t n;
	const char *text[HTTP_EMBED_MAX_INPUTS];
	uint32_t len[HTTP_EMBED_MAX_INPUTS];
};

int http_embed_decode(const char *body, size_t len, struct http_embed *x, struct http_err *e);
void http_embed_free(struct http_embed *x);

/* A decoded /tokenize request, in vLLM's shape ("prompt",
 * "add_special_tokens") or llama.cpp's ("content", "add_special"). */
struct http_tok {
	json_t *root;
	const char *model;  /* NULL when not given */
	const char *text;
	uint32_t len;
	bool add_special;   /* BOS as the vocabulary asks; default true (the
			     * ids /v1/completions would feed for the text) */
};

int http_tok_decode(const char *body, size_t len, struct http_tok *t, struct http_err *e);
void http_tok_free(struct http_tok *t);

/* A decoded /detokenize request: {"tokens": [ids]} (vLLM and llama.cpp),
 * "skip_special_tokens" (default false: control tokens by their text, as
 * both write them). */
struct http_detok {
	json_t *root;
	const char *model;  /* NULL when not given */
	int32_t *ids;       /* (n), malloc'd */
	uint32_t n;
	bool special;
};

int http_detok_decode(const char *body, size_t len, struct http_detok *t, struct http_err *e);
void http_detok_free(struct http_detok *t);

/* "stop" (end of generation, a stop string) or "length" (max_tokens or
 * the context) for a proto_stop_reason. */
const char *http_finish_reason(uint32_t stop_reason);

/* The JSON bodies below are malloc'd NUL-terminated strings (NULL when out
 * of memory). id is "chatcmpl-..." or "cmpl-...". */

/* Log probabilities as gpud-http collects them for a response: for each
 * token, u8 n_alt, then 1 + n_alt entries {f32 logprob, u16 piece_len,
 * piece bytes} (host byte order; the token's own first, then its
 * alternatives likeliest first). */
struct http_lpbuf {
	char *p;
	size_t n, cap, max; /* max: the bound n may grow to */
};

/* Appends n bytes (another buffer's entries); -1 when that would pass
 * b->max or memory is out (b unchanged). */
int http_lpbuf_append(struct http_lpbuf *b, const char *p, size_t n);

/* Appends t's entries (a TOKENS_LP batch; nothing for plain TOKENS),
 * leaving out the end-of-generation token t flags. Returns 0, or -1 when
 * out of memory or over b->max (b is then unchanged). */
int http_lp_collect(struct http_lpbuf *b, const struct proto_tokens *t);

/* The choice's "logprobs" object for the tokens in p[0, n) (an
 * http_lpbuf's bytes): chat {"content": [{"token", "logprob", "bytes",
 * "top_logprobs": [...]}], "refusal": null}; completions {"tokens",
 * "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"},
 * the offsets counted in characters from *offset, which advances (a
 * stream's chunks go on where the last ended). A piece that is not whole
 * UTF-8 is named "bytes:\xNN..." as OpenAI does; a log probability of
 * -inf is -9999. NULL when out of memory. */
json_t *http_logprobs_json(enum http_kind kind, const char *p, size_t n, size_t *offset);

/* One choice of a whole (non-streamed) completion, at index; for chat
 * with reason non-NULL, the message's reasoning_content too (a reasoning
 * model's, http/think.h). logprobs (http_logprobs_json's; the reference
 * is taken, NULL for null) is the choice's; stop_reason its
 * proto_stop_reason. NULL when out of memory. */
json_t *http_choice_json(enum http_kind kind, uint32_t index, const char *text, size_t text_len,
			 const char *reason, size_t reason_len, json_t *logprobs,
			 uint32_t stop_reason);

/* A whole completion of the choices (an array; the reference is taken)
 * and the request's usage. */
char *http_completion_choices_json(enum http_kind kind, const char *id, long created,
				   const char *model, json_t *choices,
				   const struct proto_done *usage);

/* A whole completion of one choice (the two above). */
char *http_completion_json(enum http_kind kind, const char *id, long created, const char *model,
			   const char *text, size_t text_len, const char *reason,
			   size_t reason_len, json_t *logprobs, const struct proto_done *usage);

/* A streamed chunk: text (may be empty), for chat reason_len bytes of
 * reasoning (delta.reasoning_content, when not 0) and, when finish is
 * non-NULL, the finish reason; role_first adds delta.role (chat's first
 * chunk); logprobs as for http_completion_json. With usage non-NULL: the
 * final usage chunk (choices empty). */
char *http_chunk_json(enum http_kind kind, const char *id, long created, const char *model,
		      const char *text, size_t text_len, const char *reason, size_t reason_len,
		      bool role_first, const char *finish, json_t *logprobs,
		      const struct proto_done *usage);

/* {"error": {"message", "type", "param", "code"}} for e (type derived from
 * the status). */
char *http_error_json(const struct http_err *e);

/* Fills *e. Returns -1 (for `return http_fail(...)`). */
int http_fail(struct http_err *e, int status, const char *param, const char *code,
	      const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Writes one server-sent event carrying data[0, len) into out (cap bytes):
 * "data: " and each line of data (split at CRLF, CR or LF, which the
 * event format cannot carry inside a field) then "\n", and a blank line
 * ending the event. Returns the bytes the event needs (as snprintf: when
 * that is > cap, out holds a prefix; nothing is NUL-terminated). */
size_t http_sse_event(char *out, size_t cap, const char *data, size_t len);

/* Standard base64 of n bytes into out (4 * ceil(n / 3) + 1 bytes, NUL
 * added). Returns the length. */
size_t http_base64(const uint8_t *in, size_t n, char *out);

#endif
