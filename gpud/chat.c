/* chat.c - chat prompts as text in the Llama 3 and Llama 2 formats (see
 * chat.h). Pure string work: no tokenizer, no allocation.
 */
#include "gpud/chat.h"

#include <errno.h>
#include <string.h>

#include "common/err.h"

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

/* Content with leading and trailing whitespace removed, as both official
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
		sb_str(&b, "<|begin_of_text|>");
		for (size_t i = 0; i < n; i++) {
			sb_str(&b, "<|start_header_id|>");
			sb_str(&b, msgs[i].role);
			sb_str(&b, "<|end_header_id|>\n\n");
			sb_trimmed(&b, msgs[i].content);
			sb_str(&b, "<|eot_id|>");
		}
		if (add_assistant_header)
			sb_str(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
		break;
	case GPUD_CHAT_LLAMA2: {
		const char *sys = NULL;
		for (size_t i = 0; i < n; i++) {
			const char *r = msgs[i].role;
			if (!strcmp(r, "system")) {
				sys = msgs[i].content;
			} else if (!strcmp(r, "user")) {
				sb_str(&b, "<s>[INST] ");
				if (sys) {
					sb_str(&b, "<<SYS>>\n");
					sb_trimmed(&b, sys);
					sb_str(&b, "\n<</SYS>>\n\n");
					sys = NULL;
				}
				sb_trimmed(&b, msgs[i].content);
				sb_str(&b, " [/INST]");
			} else {
				sb_str(&b, " ");
				sb_trimmed(&b, msgs[i].content);
				sb_str(&b, " </s>");
			}
		}
		break;
	}
	default:
		return SW_EUNSUPPORTED;
	}
	if (cap > 0)
		out[b.n < cap ? b.n : cap - 1] = '\0';
	return (long)b.n;
}
