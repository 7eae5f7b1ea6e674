/* tokenizer.c - the tokenizer's public face: accessors and the encoding
 * entry point (special tokens, then runs of plain text handed to the
 * SentencePiece or byte-level BPE encoder).
 *
 * The module's files: tok_load.c builds the tables from GGUF metadata,
 * tok_spm.c and tok_bpe.c encode a run of plain text (tok_pre.c cutting it
 * into BPE pre-tokens), tok_decode.c turns
 * ids back into text, chat.c formats chat prompts; tokenizer_impl.h is
 * what they share.
 *
 * Behaviour follows llama.cpp's tokenizer (the reference the shared test
 * vectors come from): SentencePiece merges pick the highest score, leftmost
 * on ties; BPE merges pick the lowest rank, leftmost on ties; pre-tokenizer
 * regexes are hand-written matchers over code points.
 */
#include <string.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/tokenizer.h"
#include "gpud/tokenizer_impl.h"

int32_t gpud_tokenizer_n_vocab(const struct gpud_tokenizer *t) { return t->n_vocab; }
int32_t gpud_tokenizer_bos(const struct gpud_tokenizer *t) { return t->bos; }
int32_t gpud_tokenizer_eos(const struct gpud_tokenizer *t) { return t->eos; }
bool gpud_tokenizer_add_bos(const struct gpud_tokenizer *t) { return t->add_bos && t->bos >= 0; }

bool gpud_tokenizer_is_eog(const struct gpud_tokenizer *t, int32_t id)
{
	return id >= 0 && id < t->n_vocab && (t->tok[id].flags & TF_EOG);
}

bool gpud_tokenizer_strips_first_space(const struct gpud_tokenizer *t)
{
	return t->kind == KIND_SPM && t->add_space_prefix;
}

int32_t gpud_tokenizer_find(const struct gpud_tokenizer *t, const char *text, size_t len)
{
	int32_t id = vocab_lookup(t, text, len);
	return id < t->n_vocab ? id : -1;
}

enum gpud_chat_template gpud_tokenizer_chat_template(const struct gpud_tokenizer *t)
{
	return t->chat;
}

bool gpud_tokenizer_add_eos(const struct gpud_tokenizer *t) { return t->add_eos && t->eos >= 0; }

int gpud_tokenizer_chat_resolve(const struct gpud_tokenizer *t, enum gpud_chat_template choice,
				enum gpud_chat_template *out, char *err, size_t errlen)
{
	*out = choice;
	if (choice == GPUD_CHAT_MISTRAL && gpud_chat_is_mistral(t->chat))
		*out = t->chat; /* "mistral": the file's own spacing */
	if (choice != GPUD_CHAT_NONE)
		return 0;
	*out = t->chat;
	if (t->chat != GPUD_CHAT_NONE)
		return 0;
	return sw_seterr(err, errlen, SW_EUNSUPPORTED,
			 "chat formatting: %s; choose a format with --chat-format "
			 "(or config gpud.chat_format): %s",
			 t->chat_text ? "the model's tokenizer.chat_template is not one gpud "
					"recognizes" : "the model has no tokenizer.chat_template",
			 GPUD_CHAT_NAMES);
}

/* --- encoding: entry point ------------------------------------------------- */

/* isspace in the C locale (what lstrip/rstrip drop). */
static bool is_space(char c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Longest special token whose text starts at text[i], or -1. Without
 * all, only the user-defined tokens plain text may hold (mergeable()). */
static int32_t match_special(const struct gpud_tokenizer *t, const char *text, size_t len,
			     size_t i, bool all)
{
	uint8_t b = (uint8_t)text[i];
	for (uint32_t k = t->special_start[b]; k < t->special_start[b + 1]; k++) {
		int32_t id = t->special[k];
		const struct tok_entry *e = &t->tok[id];
		if (!all && !(e->type == TT_USER && mergeable(t, id)))
			continue;
		if (e->len <= len - i && memcmp(t->blob + e->off, text + i, e->len) == 0)
			return id;
	}
	return -1;
}

/* Encodes text between special tokens. As in llama.cpp, every such run
 * starts a new SentencePiece "sentence" and gets the space prefix. */
static int encode_run(const struct gpud_tokenizer *t, const char *text, size_t len,
		      struct emit *o, struct sw_arena *ar)
{
	size_t mark = sw_arena_mark(ar);
	int rc;

	if (len == 0)
		return 0;
	if (t->kind == KIND_SPM)
		rc = gpud__tok_spm_encode(t, text, len, t->add_space_prefix, o, ar);
	else
		rc = gpud__tok_bpe_encode(t, text, len, o, ar);
	sw_arena_rewind(ar, mark);
	return rc;
}

size_t gpud_tokenizer_scratch_bytes(const struct gpud_tokenizer *t, size_t len)
{
	size_t slack = 8 * 64;
	if (t->kind == KIND_SPM)
		return gpud__tok_spm_scratch(len) + slack;
	return gpud__tok_bpe_scratch(len) + slack;
}

int gpud_tokenizer_encode(const struct gpud_tokenizer *t, const char *text, size_t len,
			  unsigned flags, int32_t *ids, size_t cap, size_t *n_out,
			  struct sw_arena *scratch)
{
	struct emit o = { .ids = ids, .cap = cap, .n = 0 };
	size_t mark = sw_arena_mark(scratch);
	size_t run = 0;
	int rc = 0;

	if (len > UINT32_MAX / 4) {
		*n_out = 0;
		return SW_ETOOLONG;
	}
	if ((flags & GPUD_TOK_ADD_BOS) && gpud_tokenizer_add_bos(t))
		emit(&o, t->bos);
	/* User-defined tokens (Qwen2's <tool_call>) are matched in plain
	 * text too, as llama.cpp does: merges could not build them. */
	bool all = flags & GPUD_TOK_PARSE_SPECIAL;
	if (all || t->plain_user) {
		for (size_t i = 0; i < len;) {
			if (!all && !t->plain_first[(uint8_t)text[i]]) {
				i++; /* the common case in plain text: no candidate */
				continue;
			}
			int32_t id = match_special(t, text, len, i, all);
			if (id < 0) {
				i++;
				continue;
			}
			size_t end = i;
			if (t->tok[id].flags & TF_LSTRIP)
				while (end > run && is_space(text[end - 1]))
					end--;
			rc = encode_run(t, text + run, end - run, &o, scratch);
			if (rc)
				goto out;
			emit(&o, id);
			i += t->tok[id].len;
			if (t->tok[id].flags & TF_RSTRIP)
				while (i < len && is_space(text[i]))
					i++;
			run = i;
		}
	}
	rc = encode_run(t, text + run, len - run, &o, scratch);
	if (!rc && (flags & GPUD_TOK_ADD_EOS) && t->add_eos && t->eos >= 0)
		emit(&o, t->eos);
out:
	sw_arena_rewind(scratch, mark);
	if (rc) {
		*n_out = 0;
		return rc;
	}
	*n_out = o.n;
	return o.n > cap ? SW_ETOOLONG : 0;
}
