/* chat.h - chat prompts: a list of role/content messages written as the
 * text an instruct model was trained on, for the families gpud knows
 * (Llama 3, Llama 2, ChatML, Mistral, Phi-3, Zephyr, DeepSeek), and the recognition of a
 * family from a model's tokenizer.chat_template text.
 *
 * There is no Jinja engine: a template is recognized by the markers its
 * family writes (gpud_chat_detect), and the family's format is then
 * written here by hand. Which format a model uses is decided by the
 * tokenizer (gpud_tokenizer_chat_resolve in tokenizer.h: the detected
 * one, or the one the user chose with --chat-format / gpud.chat_format);
 * the text is then encoded with GPUD_TOK_PARSE_SPECIAL so the markers
 * become their special tokens. Nothing here allocates; safe from any
 * thread.
 */
#ifndef GPUD_CHAT_H
#define GPUD_CHAT_H

#include <stdbool.h>
#include <stddef.h>

enum gpud_chat_template {
	GPUD_CHAT_NONE = 0,    /* unknown; as a choice: auto (detect) */
	GPUD_CHAT_LLAMA3 = 1,  /* <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
	GPUD_CHAT_LLAMA2 = 2,  /* <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s> */
	GPUD_CHAT_CHATML = 3,  /* <|im_start|>role\n...<|im_end|>\n (Qwen, many fine-tunes) */
	GPUD_CHAT_MISTRAL = 4, /* <s>[INST] ... [/INST]...</s> (Mistral 7B v0.1/v0.2 HF template) */
	GPUD_CHAT_MISTRAL_V1 = 5,     /* <s> [INST] ... [/INST] ...</s> (tokenizer v1) */
	GPUD_CHAT_MISTRAL_V3 = 6,     /* <s>[INST] ...[/INST] ...</s> (tokenizer v3) */
	GPUD_CHAT_MISTRAL_TEKKEN = 7, /* <s>[INST]...[/INST]...</s> (v3-tekken: Nemo) */
	GPUD_CHAT_PHI3 = 8,    /* <|user|>\n...<|end|>\n<|assistant|>\n */
	GPUD_CHAT_ZEPHYR = 9,  /* <|user|>\n...</s>\n<|assistant|>\n (Zephyr, TinyLlama-Chat) */
	GPUD_CHAT_MISTRAL_V7 = 10, /* <s>[SYSTEM_PROMPT] ...[/SYSTEM_PROMPT][INST] ...[/INST] ...</s>
				    * (Mistral Large 2411) */
	GPUD_CHAT_MISTRAL_V7_TEKKEN = 11, /* <s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]...</s>
					   * (Mistral Small 3) */
	GPUD_CHAT_DEEPSEEK3 = 12,   /* <｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜> (V3) */
	GPUD_CHAT_DEEPSEEK_R1 = 13, /* the same, the answer opening a <think> block and earlier
				     * answers' reasoning dropped (DeepSeek R1 and its Qwen2 and
				     * Llama distills) */
};

/* Names of the choices, for --chat-format and gpud.chat_format. */
#define GPUD_CHAT_NAMES "auto, llama3, llama2, chatml, mistral, mistral-v1, mistral-v3, " \
	"mistral-v3-tekken, mistral-v7, mistral-v7-tekken, phi3, zephyr, deepseek3, deepseek-r1"

struct gpud_chat_msg {
	const char *role; /* "system", "user", "assistant" */
	const char *content;
};

/* The family whose format a tokenizer.chat_template text (len bytes, no
 * NUL needed) writes, recognized by its markers: Llama 3 headers
 * (<|start_header_id|>, <|end_header_id|>), ChatML <|im_start|> (not
 * Phi-4's <|im_sep|>), Phi-3 <|user|>/<|assistant|>/<|end|>, Zephyr
 * <|user|>/<|assistant|> closed by the EOS token ("eos_token" or "</s>";
 * TinyLlama-Chat), [INST] with
 * <<SYS>> (Llama 2) or without (Mistral; the variant from the spacing
 * around [INST] and [/INST], and v7 by its [SYSTEM_PROMPT]), DeepSeek's
 * <｜User｜>/<｜Assistant｜> (R1 when the answer's header opens <think>).
 * GPUD_CHAT_NONE when none matches. */
enum gpud_chat_template gpud_chat_detect(const char *tmpl, size_t len);

/* Parses a choice name (GPUD_CHAT_NAMES; "auto" gives GPUD_CHAT_NONE).
 * Returns 0, or -EINVAL for another name (*out unchanged). */
int gpud_chat_parse(const char *name, enum gpud_chat_template *out);

/* The choice name of t ("auto" for GPUD_CHAT_NONE, "?" out of range). */
const char *gpud_chat_name(enum gpud_chat_template t);

/* True when the format writes BOS itself (Llama 3, Llama 2, Mistral);
 * for the others (ChatML, Phi-3, Zephyr, DeepSeek) BOS is the vocab's to add, as
 * tokenizer.ggml.add_bos_token says (GPUD_TOK_ADD_BOS). */
bool gpud_chat_writes_bos(enum gpud_chat_template t);

/* True for the Mistral variants (v7 included). */
bool gpud_chat_is_mistral(enum gpud_chat_template t);

/* Formats msgs as text (to be encoded with GPUD_TOK_PARSE_SPECIAL, and
 * with ADD_BOS only where gpud_chat_writes_bos is false). A family without a system role (Mistral)
 * prepends the system text and a blank line to the next user message;
 * Llama 2 wraps it in <<SYS>>; DeepSeek writes it bare where it comes
 * (its template writes the last system message's text right after BOS:
 * the same text when, as clients send it, the system message is first).
 * Returns the length needed; writes at most
 * cap bytes (NUL-terminated when room). -EINVAL for a message without
 * role or content or with another role, SW_EUNSUPPORTED for
 * GPUD_CHAT_NONE or an unknown template.
 * Formatting only appends: the text of msgs[0..k) is a prefix of that of
 * msgs[0..n) for k < n (without the assistant header), which the daemon's
 * per-segment formatting relies on. */
long gpud_chat_format(enum gpud_chat_template tmpl, const struct gpud_chat_msg *msgs,
		      size_t n, bool add_assistant_header, char *out, size_t cap);

#endif
