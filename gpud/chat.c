/* chat.c - chat prompts as text in the Llama 3, Llama 2, ChatML, Mistral
 * (v1 to v7), Phi-3, Zephyr and DeepSeek (V3, R1) formats, and the
 * recognition of those families from a tokenizer.chat_template text (see
 * chat.h). Pure string work: no tokenizer, no allocation.
 *
 * The formats follow each family's published template: Llama 3 and
 * Llama 2 trim message content (their templates do); ChatML and Phi-3
 * write it as is; Mistral's spacing around [INST]/[/INST] differs by
 * tokenizer version (v1, v3, v3-tekken, as Mistral's tokenization guide
 * writes them; the HF template of Mistral 7B v0.1/v0.2 is its own
 * variant), and only v3 trims the assistant's text. DeepSeek R1's
 * template drops an earlier answer's reasoning (the text up to its last
 * </think>) and opens the new answer with "<think>\n".
 */
#include "gpud/chat.h"

#include <errno.h>
#include <string.h>

#include "common/err.h"

/* --- recognition ------------------------------------------------------------ */

/* DeepSeek's markers: fullwidth vertical lines (U+FF5C) and, in the end
 * of sentence, lower one-eighth blocks (U+2581) for spaces. */
#define DS_USER "<\xef\xbd\x9cUser\xef\xbd\x9c>"
#define DS_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define DS_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"

static bool has(const char *s, size_t len, const char *lit)
{
	return memmem(s, len, lit, strlen(lit)) != NULL;
}

/* lit quoted with ' or " (a Jinja string literal). */
static bool has_quoted(const char *s, size_t len, const char *lit)
{
	char buf[32];
	size_t n = strlen(lit);

	if (n + 2 > sizeof(buf))
		return false;
	memcpy(buf + 1, lit, n);
	buf[0] = buf[n + 1] = '\'';
	if (memmem(s, len, buf, n + 2))
		return true;
	buf[0] = buf[n + 1] = '"';
	return memmem(s, len, buf, n + 2) != NULL;
}

/* The Mistral variant from how the template spells its markers. */
static enum gpud_chat_template mistral_variant(const char *s, size_t len)
{
	if (has_quoted(s, len, " [INST] "))
		return GPUD_CHAT_MISTRAL_V1;
	if (has_quoted(s, len, "[INST]"))
		return GPUD_CHAT_MISTRAL_TEKKEN;
	if (has_quoted(s, len, "[/INST]"))
		return GPUD_CHAT_MISTRAL_V3; /* "[INST] " ... "[/INST]" */
	return GPUD_CHAT_MISTRAL;            /* "[INST] " ... " [/INST]" */
}

enum gpud_chat_template gpud_chat_detect(const char *s, size_t len)
{
	if (!s)
		return GPUD_CHAT_NONE;
	if (has(s, len, "<|start_header_id|>") && has(s, len, "<|end_header_id|>"))
		return GPUD_CHAT_LLAMA3;
	if (has(s, len, "<|im_start|>"))
		return has(s, len, "<|im_sep|>") ? GPUD_CHAT_NONE : GPUD_CHAT_CHATML;
	if (has(s, len, "<|user|>") && has(s, len, "<|assistant|>") && has(s, len, "<|end|>"))
		return GPUD_CHAT_PHI3;
	if (has(s, len, "<|user|>") && has(s, len, "<|assistant|>") &&
	    (has(s, len, "eos_token") || has(s, len, "</s>")))
		return GPUD_CHAT_ZEPHYR;
	if (has(s, len, "[INST]") && has(s, len, "[/INST]")) {
		if (has(s, len, "<<SYS>>"))
			return GPUD_CHAT_LLAMA2;
		if (has(s, len, "[SYSTEM_PROMPT]")) /* Mistral v7: a system role */
			return has_quoted(s, len, "[INST] ") ||
					       has_quoted(s, len, "[SYSTEM_PROMPT] ")
				       ? GPUD_CHAT_MISTRAL_V7
				       : GPUD_CHAT_MISTRAL_V7_TEKKEN;
		return mistral_variant(s, len);
	}
	if (has(s, len, DS_USER) && has(s, len, DS_ASSISTANT))
		return has(s, len, DS_ASSISTANT "<think>") ? GPUD_CHAT_DEEPSEEK_R1 : GPUD_CHAT_DEEPSEEK3;
	return GPUD_CHAT_NONE;
}

static const char *const names[] = {
	[GPUD_CHAT_NONE] = "auto",
	[GPUD_CHAT_LLAMA3] = "llama3",
	[GPUD_CHAT_LLAMA2] = "llama2",
	[GPUD_CHAT_CHATML] = "chatml",
	[GPUD_CHAT_MISTRAL] = "mistral",
	[GPUD_CHAT_MISTRAL_V1] = "mistral-v1",
	[GPUD_CHAT_MISTRAL_V3] = "mistral-v3",
	[GPUD_CHAT_MISTRAL_TEKKEN] = "mistral-v3-tekken",
	[GPUD_CHAT_PHI3] = "phi3",
	[GPUD_CHAT_ZEPHYR] = "zephyr",
	[GPUD_CHAT_MISTRAL_V7] = "mistral-v7",
	[GPUD_CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
	[GPUD_CHAT_DEEPSEEK3] = "deepseek3",
	[GPUD_CHAT_DEEPSEEK_R1] = "deepseek-r1",
};

int gpud_chat_parse(const char *name, enum gpud_chat_template *out)
{
	for (size_t i = 0; name && i < sizeof(names) / sizeof(names[0]); i++) {
		if (!strcmp(name, names[i])) {
			*out = (enum gpud_chat_template)i;
			return 0;
		}
	}
	return -EINVAL;
}

const char *gpud_chat_name(enum gpud_chat_template t)
{
	return (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}

bool gpud_chat_writes_bos(enum gpud_chat_template t)
{
	return t == GPUD_CHAT_LLAMA3 || t == GPUD_CHAT_LLAMA2 || gpud_chat_is_mistral(t);
}

bool gpud_chat_is_mistral(enum gpud_chat_template t)
{
	return t == GPUD_CHAT_MISTRAL || t == GPUD_CHAT_MISTRAL_V1 || t == GPUD_CHAT_MISTRAL_V3 ||
	       t == GPUD_CHAT_MISTRAL_TEKKEN || t == GPUD_CHAT_MISTRAL_V7 ||
	       t == GPUD_CHAT_MISTRAL_V7_TEKKEN;
}

/* --- formatting ------------------------------------------------------------- */

struct sbuf {
	char *p;
	size_t cap, n;
};

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
	if (b->n < b->cap) {
		size_t k = b->cap - b->n < n ? b->cap - b->n : n;
		memcpy(b->p + b->n, s, k);
	}
	b->n += n;
}

static void sb_str(struct sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static bool ascii_space(char c)
{
	return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Content with leading and trailing whitespace removed, as the Llama
 * templates do (Jinja trim / Python strip; ASCII whitespace only here). */
static void sb_trimmed(struct sbuf *b, const char *s)
{
	size_t n = strlen(s);
	while (n > 0 && ascii_space(*s)) {
		s++;
		n--;
	}
	while (n > 0 && ascii_space(s[n - 1]))
		n--;
	sb_put(b, s, n);
}

static void fmt_llama3(struct sbuf *b, const struct gpud_chat_msg *msgs, size_t n, bool ass)
{
	sb_str(b, "<|begin_of_text|>");
	for (size_t i = 0; i < n; i++) {
		sb_str(b, "<|start_header_id|>");
		sb_str(b, msgs[i].role);
		sb_str(b, "<|end_header_id|>\n\n");
		sb_trimmed(b, msgs[i].content);
		sb_str(b, "<|eot_id|>");
	}
	if (ass)
		sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void fmt_llama2(struct sbuf *b, const struct gpud_chat_msg *msgs, size_t n)
{
	const char *sys = NULL;

	for (size_t i = 0; i < n; i++) {
		const char *r = msgs[i].role;
		if (!strcmp(r, "system")) {
			sys = msgs[i].content;
		} else if (!strcmp(r, "user")) {
			sb_str(b, "<s>[INST] ");
			if (sys) {
				sb_str(b, "<<SYS>>\n");
				sb_trimmed(b, sys);
				sb_str(b, "\n<</SYS>>\n\n");
				sys = NULL;
			}
			sb_trimmed(b, msgs[i].content);
			sb_str(b, " [/INST]");
		} else {
			sb_str(b, " ");
			sb_trimmed(b, msgs[i].content);
			sb_str(b, " </s>");
		}
	}
}

/* ChatML, Phi-3 and Zephyr: one block per message, no BOS, content as
 * is. Zephyr closes a block with the EOS token's text, which for the
 * llama-architecture models that use it (TinyLlama-Chat, Zephyr-7B:
 * Llama 2 and Mistral vocabularies) is </s>. */
static void fmt_blocks(struct sbuf *b, const struct gpud_chat_msg *msgs, size_t n, bool ass,
		       enum gpud_chat_template t)
{
	const bool chatml = t == GPUD_CHAT_CHATML;

	for (size_t i = 0; i < n; i++) {
		sb_str(b, chatml ? "<|im_start|>" : "<|");
		sb_str(b, msgs[i].role);
		sb_str(b, chatml ? "\n" : "|>\n");
		sb_str(b, msgs[i].content);
		sb_str(b, chatml ? "<|im_end|>\n" : t == GPUD_CHAT_PHI3 ? "<|end|>\n" : "</s>\n");
	}
	if (ass)
		sb_str(b, chatml ? "<|im_start|>assistant\n" : "<|assistant|>\n");
}

struct mistral_style {
	const char *open, *close, *ass; /* before a user turn, after it, before an answer */
	bool trim_ass;
};

static const struct mistral_style mistral_styles[] = {
	[0] = { "[INST] ", " [/INST]", "", false },   /* GPUD_CHAT_MISTRAL */
	[1] = { " [INST] ", " [/INST]", " ", false }, /* v1 */
	[2] = { "[INST] ", "[/INST]", " ", true },    /* v3 */
	[3] = { "[INST]", "[/INST]", "", false },     /* v3-tekken */
};

/* Mistral: no system role; the system text goes before the next user
 * message, separated by a blank line (with add_assistant_header and no
 * user message after it, it is the user turn). BOS once, before the
 * first turn. */
static void fmt_mistral(struct sbuf *b, enum gpud_chat_template tmpl,
			const struct gpud_chat_msg *msgs, size_t n, bool ass)
{
	const struct mistral_style *st = &mistral_styles[tmpl - GPUD_CHAT_MISTRAL];
	const char *sys = NULL;
	bool bos = false;

	for (size_t i = 0; i < n; i++) {
		const char *r = msgs[i].role;
		if (!strcmp(r, "system")) {
			sys = msgs[i].content;
			continue;
		}
		if (!bos) {
			sb_str(b, "<s>");
			bos = true;
		}
		if (!strcmp(r, "user")) {
			sb_str(b, st->open);
			if (sys) {
				sb_str(b, sys);
				sb_str(b, "\n\n");
				sys = NULL;
			}
			sb_str(b, msgs[i].content);
			sb_str(b, st->close);
		} else {
			sb_str(b, st->ass);
			if (st->trim_ass)
				sb_trimmed(b, msgs[i].content);
			else
				sb_str(b, msgs[i].content);
			sb_str(b, "</s>");
		}
	}
	if (ass && sys) {
		if (!bos)
			sb_str(b, "<s>");
		sb_str(b, st->open);
		sb_str(b, sys);
		sb_str(b, st->close);
	}
}

/* Mistral v7 (Mistral's "v7" and "v7-tekken" instruct templates): a
 * system role of its own, written where it comes; v7 puts a space after
 * each opening marker and before an answer, v7-tekken none. BOS once,
 * first. */
static void fmt_mistral_v7(struct sbuf *b, enum gpud_chat_template tmpl,
			   const struct gpud_chat_msg *msgs, size_t n)
{
	const char *sp = tmpl == GPUD_CHAT_MISTRAL_V7 ? " " : "";

	if (n > 0)
		sb_str(b, "<s>");
	for (size_t i = 0; i < n; i++) {
		const char *r = msgs[i].role;
		if (!strcmp(r, "system")) {
			sb_str(b, "[SYSTEM_PROMPT]");
			sb_str(b, sp);
			sb_str(b, msgs[i].content);
			sb_str(b, "[/SYSTEM_PROMPT]");
		} else if (!strcmp(r, "user")) {
			sb_str(b, "[INST]");
			sb_str(b, sp);
			sb_str(b, msgs[i].content);
			sb_str(b, "[/INST]");
		} else {
			sb_str(b, sp);
			sb_str(b, msgs[i].content);
			sb_str(b, "</s>");
		}
	}
}

/* DeepSeek V3 and R1: no BOS (the vocab adds it), the system text bare
 * where it comes, a user turn after <｜User｜>, an answer after
 * <｜Assistant｜> closed by the end-of-sentence token's text. R1 keeps of
 * an earlier answer only what follows its last </think>, and the header
 * of the answer asked for opens its reasoning. */
static void fmt_deepseek(struct sbuf *b, enum gpud_chat_template tmpl,
			 const struct gpud_chat_msg *msgs, size_t n, bool ass)
{
	const bool r1 = tmpl == GPUD_CHAT_DEEPSEEK_R1;

	for (size_t i = 0; i < n; i++) {
		const char *r = msgs[i].role, *c = msgs[i].content;
		if (!strcmp(r, "system")) {
			sb_str(b, c);
		} else if (!strcmp(r, "user")) {
			sb_str(b, DS_USER);
			sb_str(b, c);
		} else {
			for (const char *t; r1 && (t = strstr(c, "</think>"));)
				c = t + strlen("</think>");
			sb_str(b, DS_ASSISTANT);
			sb_str(b, c);
			sb_str(b, DS_EOS);
		}
	}
	if (ass)
		sb_str(b, r1 ? DS_ASSISTANT "<think>\n" : DS_ASSISTANT);
}

long gpud_chat_format(enum gpud_chat_template tmpl, const struct gpud_chat_msg *msgs, size_t n,
		      bool add_assistant_header, char *out, size_t cap)
{
	struct sbuf b = { .p = out, .cap = cap };

	for (size_t i = 0; i < n; i++) {
		const char *r = msgs[i].role;
		if (!r || !msgs[i].content ||
		    (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")))
			return -EINVAL;
	}
	switch (tmpl) {
	case GPUD_CHAT_LLAMA3:
		fmt_llama3(&b, msgs, n, add_assistant_header);
		break;
	case GPUD_CHAT_LLAMA2:
		fmt_llama2(&b, msgs, n);
		break;
	case GPUD_CHAT_CHATML:
	case GPUD_CHAT_PHI3:
	case GPUD_CHAT_ZEPHYR:
		fmt_blocks(&b, msgs, n, add_assistant_header, tmpl);
		break;
	case GPUD_CHAT_MISTRAL:
	case GPUD_CHAT_MISTRAL_V1:
	case GPUD_CHAT_MISTRAL_V3:
	case GPUD_CHAT_MISTRAL_TEKKEN:
		fmt_mistral(&b, tmpl, msgs, n, add_assistant_header);
		break;
	case GPUD_CHAT_MISTRAL_V7:
	case GPUD_CHAT_MISTRAL_V7_TEKKEN:
		fmt_mistral_v7(&b, tmpl, msgs, n);
		break;
	case GPUD_CHAT_DEEPSEEK3:
	case GPUD_CHAT_DEEPSEEK_R1:
		fmt_deepseek(&b, tmpl, msgs, n, add_assistant_header);
		break;
	default:
		return SW_EUNSUPPORTED;
	}
	if (cap > 0)
		out[b.n < cap ? b.n : cap - 1] = '\0';
	return (long)b.n;
}
