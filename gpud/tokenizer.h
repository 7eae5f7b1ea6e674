/* tokenizer.h - tokenizers read from GGUF metadata.
 *
 * tokenizer.ggml.model = "llama": SentencePiece-style (score-driven merges
 * over UTF-8 characters, byte fallback <0xXX>, leading-space "▁" rules).
 * tokenizer.ggml.model = "gpt2": byte-level BPE (ranked merges) after a
 * pre-tokenizer chosen by tokenizer.ggml.pre (tok_pre.c; llama.cpp's
 * names): "llama-bpe" (Llama 3), "tekken" (Mistral NeMo), "qwen2",
 * "smollm"/"starcoder", "gpt-2", "deepseek-coder", "seed-coder",
 * "default" (also a file without the key) and llama.cpp's aliases of
 * them; another name is refused.
 *
 * A tokenizer is immutable after load and safe to share between threads.
 * Encoding needs working memory proportional to the text; it comes from
 * the caller's arena, so the request path never calls malloc.
 * Chat prompt formatting is in chat.h (included here).
 */
#ifndef GPUD_TOKENIZER_H
#define GPUD_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/chat.h" /* the templates, for gpud_tokenizer_chat_template */

struct gpud_gguf;
struct sw_arena;
struct gpud_tokenizer;

enum {
	GPUD_TOK_ADD_BOS = 1 << 0,       /* prepend BOS when the vocab asks for it */
	GPUD_TOK_PARSE_SPECIAL = 1 << 1, /* "<|eot_id|>" in text becomes the special id */
	GPUD_TOK_ADD_EOS = 1 << 2,       /* append EOS when the vocab asks for it (not
					  * for generation prompts: EOS would end them) */
};

/* Builds a tokenizer from g's metadata (works on vocab-only files). The
 * tokenizer copies what it needs; g may be closed afterwards.
 * Returns 0, or on error (*out NULL, a message naming the key in err):
 * SW_ENOTFOUND (no tokenizer.ggml.model), SW_EUNSUPPORTED (a model other
 * than llama/gpt2, or a tokenizer.ggml.pre other than default, gpt-2,
 * llama-bpe (llama3, llama-v3), starcoder, smollm, qwen2 or
 * deepseek-r1-qwen), SW_EFORMAT (tokens, scores,
 * token_type or merges missing, of the wrong type or length, or malformed),
 * SW_ETOOLONG (a token over 64 KiB), -ENOMEM. */
int gpud_tokenizer_load(struct gpud_tokenizer **out, const struct gpud_gguf *g,
			char *err, size_t errlen);
void gpud_tokenizer_free(struct gpud_tokenizer *t); /* accepts NULL */

int32_t gpud_tokenizer_n_vocab(const struct gpud_tokenizer *t);
int32_t gpud_tokenizer_bos(const struct gpud_tokenizer *t); /* -1 if none */
int32_t gpud_tokenizer_eos(const struct gpud_tokenizer *t); /* -1 if none */
/* True for every end-of-generation token (EOS, EOT, <|eom_id|>, ...). */
bool gpud_tokenizer_is_eog(const struct gpud_tokenizer *t, int32_t id);
/* True when BOS is prepended by default (tokenizer.ggml.add_bos_token;
 * without the key: true for llama and llama-bpe, false for other gpt2)
 * and the vocab has a BOS id. */
bool gpud_tokenizer_add_bos(const struct gpud_tokenizer *t);

/* True when EOS is appended by default (tokenizer.ggml.add_eos_token,
 * false without the key) and the vocab has an EOS id. */
bool gpud_tokenizer_add_eos(const struct gpud_tokenizer *t);

/* Id of the token whose text is exactly text[0..len), or -1. */
int32_t gpud_tokenizer_find(const struct gpud_tokenizer *t, const char *text, size_t len);

/* Upper bound of the scratch arena bytes gpud_tokenizer_encode() needs for
 * len bytes of text (size the request arena with it). */
size_t gpud_tokenizer_scratch_bytes(const struct gpud_tokenizer *t, size_t len);

/* Encodes len bytes of text, which must not change during the call (it is
 * read more than once: never pass memory a client can write, such as a
 * request area, but a copy of it). Writes at most cap ids and sets *n_out to the
 * number the text needs; returns 0, or SW_ETOOLONG when *n_out > cap (ids
 * then holds the first cap), or -ENOMEM when the arena is too small
 * (*n_out is then 0). Working memory comes from scratch and is released
 * before returning; nothing is allocated with malloc.
 * Special tokens: with GPUD_TOK_PARSE_SPECIAL, the texts of control,
 * user-defined and unknown tokens are matched first (longest match at the
 * leftmost position) and emitted as their ids. Without it, only
 * user-defined tokens that are not end-of-generation (Qwen2's <tool_call>)
 * are matched so, as in llama.cpp; other such text is ordinary text, and
 * merges never produce control, unknown, byte, unused or
 * end-of-generation tokens. A matched special token with lstrip (rstrip)
 * drops the whitespace before (after) it; GGUF carries no such flags, so
 * they follow the model as llama.cpp does: Phi-3 files have rstrip on
 * their special tokens (see tok_load.c). Invalid UTF-8 is kept byte for
 * byte (byte fallback); a byte the vocab cannot spell becomes the unknown
 * token when the vocab has one, else it is dropped. With ADD_EOS, EOS is
 * appended when the vocab asks for it. len above 1 GiB: SW_ETOOLONG. */
int gpud_tokenizer_encode(const struct gpud_tokenizer *t, const char *text, size_t len,
			  unsigned flags, int32_t *ids, size_t cap, size_t *n_out,
			  struct sw_arena *scratch);

/* Raw bytes of one token as it appears in decoded text (byte tokens give
 * their byte, "▁" becomes a space, byte-level BPE is unmapped). Control
 * tokens give "" unless special is set. Returns the length, or a negative
 * code for an invalid id. out need not be NUL-terminated. */
int gpud_tokenizer_piece(const struct gpud_tokenizer *t, int32_t id, bool special,
			 char *out, size_t cap);

/* True when decoding drops the space a SentencePiece vocabulary's encoder
 * puts before the first word (its space prefix): the first text piece of a
 * sequence then loses one leading space, as gpud_detok_push does. */
bool gpud_tokenizer_strips_first_space(const struct gpud_tokenizer *t);

/* Streaming detokenizer: holds back an incomplete UTF-8 sequence until the
 * token that completes it arrives, so no partial character is ever emitted.
 * Also strips the leading space SentencePiece adds to the first token. */
struct gpud_detok {
	uint8_t pending[8];
	uint8_t n_pending;
	bool started;
	bool special; /* control tokens by their text (set after init); else none */
};
/* Starts decoding a sequence from its beginning: the first piece's leading
 * space (the one SentencePiece adds) is dropped. */
void gpud_detok_init(struct gpud_detok *d);
/* Starts decoding tokens that continue earlier text (generation after a
 * prompt): nothing is dropped, so "Once upon a" + "▁time" keeps its space. */
void gpud_detok_init_continuation(struct gpud_detok *d);
/* Appends the text of id to out (cap bytes); returns bytes written or a
 * negative code. Invalid UTF-8 from the model is replaced by U+FFFD. */
int gpud_detok_push(const struct gpud_tokenizer *t, struct gpud_detok *d, int32_t id,
		    char *out, size_t cap);
/* Flushes what is held back at the end of generation (as U+FFFD). */
int gpud_detok_flush(struct gpud_detok *d, char *out, size_t cap);

/* The chat format the model's tokenizer.chat_template text is recognized
 * as (gpud_chat_detect) or, without that key, its vocabulary implies
 * (Llama 3 header tokens); GPUD_CHAT_NONE when neither. */
enum gpud_chat_template gpud_tokenizer_chat_template(const struct gpud_tokenizer *t);

/* The format to use for chat requests: choice (from --chat-format or
 * gpud.chat_format) unless it is GPUD_CHAT_NONE (auto), then the
 * detected one; the choice "mistral" keeps the file's own Mistral
 * variant when it has one. Returns 0 with *out set, or SW_EUNSUPPORTED
 * (*out GPUD_CHAT_NONE) with a message in err that says whether the
 * template was missing or unrecognized and names --chat-format, config
 * gpud.chat_format and the values. */
int gpud_tokenizer_chat_resolve(const struct gpud_tokenizer *t, enum gpud_chat_template choice,
				enum gpud_chat_template *out, char *err, size_t errlen);

#endif
