/* chat.h - chat prompts: a list of role/content messages written as the
 * text a chat model was trained on (Llama 3 headers, Llama 2 [INST]).
 *
 * Only formatting lives here; which template a model uses comes from its
 * tokenizer (gpud_tokenizer_chat_template in tokenizer.h), and the text is
 * then encoded with GPUD_TOK_PARSE_SPECIAL so the markers become their
 * special tokens. Nothing here allocates; safe from any thread.
 */
#ifndef GPUD_CHAT_H
#define GPUD_CHAT_H

#include <stdbool.h>
#include <stddef.h>

enum gpud_chat_template {
	GPUD_CHAT_NONE = 0,
	GPUD_CHAT_LLAMA3 = 1,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
	GPUD_CHAT_LLAMA2 = 2,  /* <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] */
};

struct gpud_chat_msg {
	const char *role; /* "system", "user", "assistant" */
	const char *content;
};

/* Formats msgs as text (to be encoded with GPUD_TOK_PARSE_SPECIAL and
 * without ADD_BOS where the template writes BOS itself). Returns the length
 * needed; writes at most cap bytes (NUL-terminated when room). -EINVAL
 * for a message without role or content or with another role,
 * SW_EUNSUPPORTED for GPUD_CHAT_NONE or an unknown template. */
long gpud_chat_format(enum gpud_chat_template tmpl, const struct gpud_chat_msg *msgs,
		      size_t n, bool add_assistant_header, char *out, size_t cap);

#endif
