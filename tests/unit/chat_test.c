/* chat_test.c - chat formats of instruct models (gpud/chat.h): recognition
 * of each family from real tokenizer.chat_template texts (short excerpts
 * of the public model files' templates), the exact text of each format,
 * the choice of format and its error, the end-of-turn and BOS metadata,
 * Phi-3's rstrip on special tokens, and end to end a ChatML model (the
 * Qwen2.5 vocabulary) whose prompt tokenizes to its special tokens and
 * whose generation stops at <|im_end|>. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/chat.h"
#include "gpud/engine.h"
#include "gpud/gguf.h"
#include "gpud/gguf_write.h"
#include "gpud/mkmodel.h"
#include "gpud/model.h"
#include "gpud/tokenizer.h"
#include "sw_config.h"

#define VOCAB_DIR SW_SHARED_DIR "/tokenizer/"

/* --- recognition ------------------------------------------------------------ */

/* Excerpts of published templates (as stored in GGUF metadata: the Jinja
 * source, so "\n" inside its string literals is a backslash and an n). */
static const struct {
	const char *what, *text;
	enum gpud_chat_template want;
} templates[] = {
	{ "Meta-Llama-3-8B-Instruct",
	  "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
	  "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content']"
	  " | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content"
	  " %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_heade"
	  "r_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}",
	  GPUD_CHAT_LLAMA3 },
	{ "Llama-3.1/3.2-Instruct",
	  "{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}"
	  "\n{%- endif %}\n{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n{%- if too"
	  "ls is not none %}\n    {{- \"Environment: ipython\\n\" }}\n{%- endif %}\n{{- \"Cutting K"
	  "nowledge Date: December 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}"
	  "\n{{- '<|eom_id|>' }}",
	  GPUD_CHAT_LLAMA3 },
	{ "Llama-2-7b-chat-hf",
	  "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + sys"
	  "tem_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = mes"
	  "sage['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] '"
	  " + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + c"
	  "ontent.strip() + ' ' + eos_token }}{% endif %}",
	  GPUD_CHAT_LLAMA2 },
	{ "Qwen2.5-Instruct",
	  "{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role "
	  "== \"system\" and not loop.first) or (message.role == \"assistant\" and not message.too"
	  "l_calls) %}\n        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im"
	  "_end|>' + '\\n' }}",
	  GPUD_CHAT_CHATML },
	{ "ChatML fine-tune",
	  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['cont"
	  "ent'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start"
	  "|>assistant\\n' }}{% endif %}",
	  GPUD_CHAT_CHATML },
	{ "Phi-3-mini-4k-instruct",
	  "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|us"
	  "er|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif"
	  " (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif "
	  "%}{% endfor %}",
	  GPUD_CHAT_PHI3 },
	{ "Phi-3.5-mini-instruct",
	  "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %"
	  "}{{'<|system|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == 'us"
	  "er' %}{{'<|user|>\\n' + message['content'] + '<|end|>\\n'}}{% elif message['role'] == "
	  "'assistant' %}{{'<|assistant|>\\n' + message['content'] + '<|end|>\\n'}}{% endif %}{% "
	  "endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token "
	  "}}{% endif %}",
	  GPUD_CHAT_PHI3 },
	{ "Mistral-7B-Instruct-v0.2",
	  "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop."
	  "index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistan"
	  "t/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + m"
	  "essage['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['"
	  "content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are"
	  " supported!') }}{% endif %}{% endfor %}",
	  GPUD_CHAT_MISTRAL },
	{ "Mistral tokenizer v1 (Mistral's guide)",
	  "{% if message['role'] == 'user' %}\n        {{ ' [INST] ' + message['content'] + ' [/IN"
	  "ST]' }}\n    {% elif message['role'] == 'assistant' %}\n        {{ ' ' + message['conte"
	  "nt'] + eos_token }}",
	  GPUD_CHAT_MISTRAL_V1 },
	{ "Mistral-7B-Instruct-v0.3",
	  "{%- if loop.last and system_message is defined %}\n            {{- \"[INST] \" + system_"
	  "message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n    "
	  "        {{- \"[INST] \" + message[\"content\"] + \"[/INST]\" }}\n        {%- endif %}\n"
	  "    {%- elif message[\"role\"] == \"assistant\" %}\n        {{- \" \" + message[\"conte"
	  "nt\"]|trim + eos_token}}",
	  GPUD_CHAT_MISTRAL_V3 },
	{ "Mistral-Nemo-Instruct-2407 (tekken)",
	  "{%- if loop.last and system_message is defined %}\n            {{- \"[INST]\" + system_m"
	  "essage + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n        {%- else %}\n     "
	  "       {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}",
	  GPUD_CHAT_MISTRAL_TEKKEN },
	{ "TinyLlama-1.1B-Chat-v1.0 (Zephyr)",
	  "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\\n' + "
	  "message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system"
	  "|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
	  "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.las"
	  "t and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}",
	  GPUD_CHAT_ZEPHYR },
	/* Families gpud does not write: recognized as none. */
	{ "gemma-2-it",
	  "{% for message in messages %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | "
	  "trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn"
	  ">model\\n'}}{% endif %}",
	  GPUD_CHAT_NONE },
	{ "phi-4 (<|im_sep|>)",
	  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '<|im_sep|>'+ message"
	  "['content'] + '<|im_end|>'}}{% endfor %}",
	  GPUD_CHAT_NONE },
	{ "Mistral-Small-24B-Instruct-2501 (v7-tekken)",
	  "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{%- for message in loop_m"
	  "essages %}{%- if message['role'] == 'user' %}{{- '[INST]' + message['content'] + '[/IN"
	  "ST]' }}",
	  GPUD_CHAT_MISTRAL_V7_TEKKEN },
	{ "Mistral-Large-Instruct-2411 (v7)",
	  "{%- if message['role'] == 'user' %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%-"
	  " elif message['role'] == 'system' %}{{- '[SYSTEM_PROMPT] ' + message['content'] + '[/S"
	  "YSTEM_PROMPT]' }}{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'"
	  "] + eos_token }}",
	  GPUD_CHAT_MISTRAL_V7 },
	{ "DeepSeek-R1-Distill-Qwen-1.5B (R1)",
	  "{%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%}{{'<｜User｜>' + message"
	  "['content']}}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] i"
	  "s not none %}{% set content = message['content'] %}{% if '</think>' in content %}{% set"
	  " content = content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + '<"
	  "｜end▁of▁sentence｜>'}}{%- endif %}{% if add_generation_prompt and not ns.is_tool %}{{'<"
	  "｜Assistant｜><think>\\n'}}{% endif %}",
	  GPUD_CHAT_DEEPSEEK_R1 },
	{ "DeepSeek-V3",
	  "{{bos_token}}{{ns.system_prompt}}{%- for message in messages %}{%- if message['role'] "
	  "== 'user' %}{{'<｜User｜>' + message['content']}}{%- endif %}{% set content = message['c"
	  "ontent'] %}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}{%- endfor -%}{% if "
	  "add_generation_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %}",
	  GPUD_CHAT_DEEPSEEK3 },
	{ "empty", "", GPUD_CHAT_NONE },
};

static void test_detect_real_templates(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(templates) / sizeof(templates[0]); i++) {
		enum gpud_chat_template got =
			gpud_chat_detect(templates[i].text, strlen(templates[i].text));
		if (got != templates[i].want)
			fail_msg("%s: detected %s, want %s", templates[i].what, gpud_chat_name(got),
				 gpud_chat_name(templates[i].want));
	}
	assert_int_equal(gpud_chat_detect(NULL, 0), GPUD_CHAT_NONE);
}

static void test_names(void **state)
{
	(void)state;
	static const char *const all[] = { "auto", "llama3", "llama2", "chatml", "mistral",
					   "mistral-v1", "mistral-v3", "mistral-v3-tekken",
					   "mistral-v7", "mistral-v7-tekken", "phi3", "zephyr",
					   "deepseek3", "deepseek-r1" };
	enum gpud_chat_template t = GPUD_CHAT_LLAMA3;

	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		assert_int_equal(gpud_chat_parse(all[i], &t), 0);
		assert_string_equal(gpud_chat_name(t), all[i]);
		assert_non_null(strstr(GPUD_CHAT_NAMES, all[i]));
	}
	assert_int_equal(gpud_chat_parse("auto", &t), 0);
	assert_int_equal(t, GPUD_CHAT_NONE);
	assert_int_equal(gpud_chat_parse("vicuna", &t), -EINVAL);
	assert_int_equal(gpud_chat_parse("", &t), -EINVAL);
	assert_int_equal(gpud_chat_parse("ChatML", &t), -EINVAL); /* exact names */
	assert_int_equal(gpud_chat_parse(NULL, &t), -EINVAL);
	assert_int_equal(t, GPUD_CHAT_NONE); /* unchanged by the failures */
	assert_string_equal(gpud_chat_name((enum gpud_chat_template)99), "?");
	assert_true(gpud_chat_writes_bos(GPUD_CHAT_LLAMA3));
	assert_true(gpud_chat_writes_bos(GPUD_CHAT_MISTRAL_V3));
	assert_true(gpud_chat_writes_bos(GPUD_CHAT_MISTRAL_V7_TEKKEN));
	assert_false(gpud_chat_writes_bos(GPUD_CHAT_CHATML));
	assert_false(gpud_chat_writes_bos(GPUD_CHAT_PHI3));
	assert_false(gpud_chat_writes_bos(GPUD_CHAT_ZEPHYR));
	assert_false(gpud_chat_writes_bos(GPUD_CHAT_DEEPSEEK_R1)); /* the vocab's add_bos_token */
}

/* --- formatting ------------------------------------------------------------- */

static const struct gpud_chat_msg conv[] = {
	{ "system", "Be brief." },
	{ "user", "Hi!" },
	{ "assistant", " Hello. " },
	{ "user", "Bye" },
};

static void want_format(enum gpud_chat_template t, const struct gpud_chat_msg *m, size_t n,
			bool ass, const char *want)
{
	char out[1024];
	long len = gpud_chat_format(t, m, n, ass, out, sizeof(out));

	if (len < 0)
		fail_msg("%s: %ld", gpud_chat_name(t), len);
	if (strcmp(out, want))
		fail_msg("%s:\n got  \"%s\"\n want \"%s\"", gpud_chat_name(t), out, want);
	assert_int_equal(len, (long)strlen(want));
	/* the length alone, without a buffer */
	assert_int_equal(gpud_chat_format(t, m, n, ass, NULL, 0), len);
}

static void test_format_chatml(void **state)
{
	(void)state;
	want_format(GPUD_CHAT_CHATML, conv, 4, true,
		    "<|im_start|>system\nBe brief.<|im_end|>\n"
		    "<|im_start|>user\nHi!<|im_end|>\n"
		    "<|im_start|>assistant\n Hello. <|im_end|>\n"
		    "<|im_start|>user\nBye<|im_end|>\n"
		    "<|im_start|>assistant\n");
	want_format(GPUD_CHAT_CHATML, conv + 1, 1, false, "<|im_start|>user\nHi!<|im_end|>\n");
	want_format(GPUD_CHAT_CHATML, conv, 0, true, "<|im_start|>assistant\n");
}

static void test_format_phi3(void **state)
{
	(void)state;
	want_format(GPUD_CHAT_PHI3, conv, 4, true,
		    "<|system|>\nBe brief.<|end|>\n"
		    "<|user|>\nHi!<|end|>\n"
		    "<|assistant|>\n Hello. <|end|>\n"
		    "<|user|>\nBye<|end|>\n"
		    "<|assistant|>\n");
	want_format(GPUD_CHAT_PHI3, conv + 1, 1, true, "<|user|>\nHi!<|end|>\n<|assistant|>\n");
}

/* Zephyr (TinyLlama-Chat): Phi-3's blocks closed by </s>, the EOS text
 * of the Llama 2 and Mistral vocabularies (a control token: encoded as
 * the EOS id with GPUD_TOK_PARSE_SPECIAL). */
static void test_format_zephyr(void **state)
{
	(void)state;
	want_format(GPUD_CHAT_ZEPHYR, conv, 4, true,
		    "<|system|>\nBe brief.</s>\n"
		    "<|user|>\nHi!</s>\n"
		    "<|assistant|>\n Hello. </s>\n"
		    "<|user|>\nBye</s>\n"
		    "<|assistant|>\n");
	want_format(GPUD_CHAT_ZEPHYR, conv + 1, 1, false, "<|user|>\nHi!</s>\n");
}

static void test_format_mistral(void **state)
{
	(void)state;
	/* Mistral's guide: "<s> [INST] Hello, how are you? [/INST] Fine, and
	 * you?</s> [INST] I'm doing great! [/INST] Glad to hear!</s>" (v1),
	 * "<s>[INST] Hello, how are you?[/INST] Fine, and you?</s>[INST] ..."
	 * (v3), "<s>[INST]Hello, how are you?[/INST]Fine, and you?</s>..."
	 * (v3-tekken); the system text before the first user message. */
	const struct gpud_chat_msg guide[] = {
		{ "user", "Hello, how are you?" },
		{ "assistant", "Fine, and you?" },
		{ "user", "I'm doing great!" },
		{ "assistant", "Glad to hear!" },
	};
	want_format(GPUD_CHAT_MISTRAL_V1, guide, 4, false,
		    "<s> [INST] Hello, how are you? [/INST] Fine, and you?</s> [INST] I'm doing "
		    "great! [/INST] Glad to hear!</s>");
	want_format(GPUD_CHAT_MISTRAL_V3, guide, 4, false,
		    "<s>[INST] Hello, how are you?[/INST] Fine, and you?</s>[INST] I'm doing "
		    "great![/INST] Glad to hear!</s>");
	want_format(GPUD_CHAT_MISTRAL_TEKKEN, guide, 4, false,
		    "<s>[INST]Hello, how are you?[/INST]Fine, and you?</s>[INST]I'm doing "
		    "great![/INST]Glad to hear!</s>");
	want_format(GPUD_CHAT_MISTRAL, guide, 4, false,
		    "<s>[INST] Hello, how are you? [/INST]Fine, and you?</s>[INST] I'm doing "
		    "great! [/INST]Glad to hear!</s>");

	/* A system message: prepended to the next user turn (no system
	 * role); the assistant header is nothing (the model answers after
	 * [/INST]); v3 trims the assistant's text, the others keep it. */
	want_format(GPUD_CHAT_MISTRAL_V3, conv, 4, true,
		    "<s>[INST] Be brief.\n\nHi![/INST] Hello.</s>[INST] Bye[/INST]");
	want_format(GPUD_CHAT_MISTRAL_V1, conv, 4, true,
		    "<s> [INST] Be brief.\n\nHi! [/INST]  Hello. </s> [INST] Bye [/INST]");
	want_format(GPUD_CHAT_MISTRAL_TEKKEN, conv, 2, true, "<s>[INST]Be brief.\n\nHi![/INST]");
	/* A system message alone: deferred, or a turn of its own when the
	 * answer is asked for. */
	want_format(GPUD_CHAT_MISTRAL, conv, 1, false, "");
	want_format(GPUD_CHAT_MISTRAL, conv, 1, true, "<s>[INST] Be brief. [/INST]");
}

/* Mistral v7: a system role where it comes (Mistral's v7 and v7-tekken
 * instruct templates: "<s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...
 * [/INST]...</s>"), v7 with a space after each opening marker and before
 * an answer; the answer follows [/INST]. */
static void test_format_mistral_v7(void **state)
{
	(void)state;
	want_format(GPUD_CHAT_MISTRAL_V7_TEKKEN, conv, 4, true,
		    "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi![/INST] Hello. </s>"
		    "[INST]Bye[/INST]");
	want_format(GPUD_CHAT_MISTRAL_V7, conv, 4, true,
		    "<s>[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi![/INST]  Hello. </s>"
		    "[INST] Bye[/INST]");
	want_format(GPUD_CHAT_MISTRAL_V7_TEKKEN, conv, 1, true,
		    "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT]");
	want_format(GPUD_CHAT_MISTRAL_V7_TEKKEN, conv, 0, true, "");
}

static void test_format_llama(void **state)
{
	(void)state;
	want_format(GPUD_CHAT_LLAMA3, conv, 2, true,
		    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief."
		    "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
		    "<|start_header_id|>assistant<|end_header_id|>\n\n");
	want_format(GPUD_CHAT_LLAMA2, conv, 4, true,
		    "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi! [/INST] Hello. </s>"
		    "<s>[INST] Bye [/INST]");
}

/* DeepSeek V3 and R1 (their published templates): the system text bare,
 * <｜User｜> before a question, <｜Assistant｜> before an answer and the
 * end-of-sentence text after it; R1 keeps of an answer what follows its
 * last </think> and opens the next one's reasoning. */
static void test_format_deepseek(void **state)
{
	(void)state;
	want_format(GPUD_CHAT_DEEPSEEK3, conv, 4, true,
		    "Be brief.<｜User｜>Hi!<｜Assistant｜> Hello. <｜end▁of▁sentence｜>"
		    "<｜User｜>Bye<｜Assistant｜>");
	want_format(GPUD_CHAT_DEEPSEEK_R1, conv, 4, true,
		    "Be brief.<｜User｜>Hi!<｜Assistant｜> Hello. <｜end▁of▁sentence｜>"
		    "<｜User｜>Bye<｜Assistant｜><think>\n");
	const struct gpud_chat_msg thought[] = {
		{ "user", "2+2?" },
		{ "assistant", "<think>\nfour</think>\n\n4" },
		{ "user", "and </think> 3+3?" },
		{ "assistant", "<think>a</think>b</think>6" },
	};
	want_format(GPUD_CHAT_DEEPSEEK_R1, thought, 4, false,
		    "<｜User｜>2+2?<｜Assistant｜>\n\n4<｜end▁of▁sentence｜>"
		    "<｜User｜>and </think> 3+3?<｜Assistant｜>6<｜end▁of▁sentence｜>");
	/* V3's template keeps the answer whole */
	want_format(GPUD_CHAT_DEEPSEEK3, thought, 2, false,
		    "<｜User｜>2+2?<｜Assistant｜><think>\nfour</think>\n\n4<｜end▁of▁sentence｜>");
	want_format(GPUD_CHAT_DEEPSEEK_R1, conv, 0, true, "<｜Assistant｜><think>\n");
}

/* Every format only appends (the daemon formats one segment at a time as
 * format(prev, cur) minus format(prev)): each prefix of the conversation
 * formats to a prefix of the whole. */
static void test_format_appends(void **state)
{
	(void)state;
	for (int t = GPUD_CHAT_LLAMA3; t <= GPUD_CHAT_DEEPSEEK_R1; t++) {
		char all[1024], part[1024];
		long n = gpud_chat_format((enum gpud_chat_template)t, conv, 4, false, all,
					  sizeof(all));
		assert_true(n > 0);
		for (size_t k = 0; k < 4; k++) {
			long m = gpud_chat_format((enum gpud_chat_template)t, conv, k, false, part,
						  sizeof(part));
			assert_true(m >= 0 && m <= n);
			if (memcmp(all, part, (size_t)m))
				fail_msg("%s: %zu messages are not a prefix", gpud_chat_name(t), k);
		}
	}
	const struct gpud_chat_msg bad[] = { { "tool", "x" } };
	char out[64];
	assert_int_equal(gpud_chat_format(GPUD_CHAT_CHATML, bad, 1, true, out, sizeof(out)),
			 -EINVAL);
	assert_int_equal(gpud_chat_format(GPUD_CHAT_NONE, conv, 1, true, out, sizeof(out)),
			 SW_EUNSUPPORTED);
}

/* --- the choice of format, metadata --------------------------------------- */

struct vocab {
	const char *const *tokens;
	const int32_t *types;
	size_t n;
	const char *chat_template; /* NULL: no key */
	const char *name;          /* general.name, NULL: none */
	int32_t eos, eot, eom;     /* -1: no key */
	int add_eos;               /* -1: no key */
};

static char tmp_path[64];

static struct gpud_tokenizer *build(const struct vocab *v)
{
	struct gpud_gguf_writer *w = NULL;
	struct gpud_gguf *g = NULL;
	struct gpud_tokenizer *t = NULL;
	struct gpud_gguf_str strs[32];
	char err[SW_ERR_MAX] = "";

	assert_true(v->n <= 32);
	assert_int_equal(gpud_gguf_writer_new(&w), 0);
	assert_int_equal(gpud_gguf_w_str(w, "general.architecture", "llama"), 0);
	if (v->name)
		assert_int_equal(gpud_gguf_w_str(w, "general.name", v->name), 0);
	assert_int_equal(gpud_gguf_w_str(w, "tokenizer.ggml.model", "llama"), 0);
	for (size_t i = 0; i < v->n; i++)
		strs[i] = (struct gpud_gguf_str){ v->tokens[i], strlen(v->tokens[i]) };
	assert_int_equal(gpud_gguf_w_arr_str(w, "tokenizer.ggml.tokens", strs, v->n), 0);
	assert_int_equal(gpud_gguf_w_arr(w, "tokenizer.ggml.token_type", GPUD_GGUF_I32, v->types,
					 v->n), 0);
	if (v->chat_template)
		assert_int_equal(gpud_gguf_w_str(w, "tokenizer.chat_template", v->chat_template),
				 0);
	if (v->eos >= 0)
		assert_int_equal(gpud_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos),
				 0);
	if (v->eot >= 0)
		assert_int_equal(gpud_gguf_w_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)v->eot),
				 0);
	if (v->eom >= 0)
		assert_int_equal(gpud_gguf_w_u32(w, "tokenizer.ggml.eom_token_id", (uint32_t)v->eom),
				 0);
	if (v->add_eos >= 0)
		assert_int_equal(gpud_gguf_w_bool(w, "tokenizer.ggml.add_eos_token", v->add_eos), 0);
	snprintf(tmp_path, sizeof(tmp_path), "/tmp/chat_test.%d.gguf", (int)getpid());
	assert_int_equal(gpud_gguf_w_write(w, tmp_path, err, sizeof(err)), 0);
	gpud_gguf_writer_free(w);
	assert_int_equal(gpud_gguf_open(&g, tmp_path, err, sizeof(err)), 0);
	unlink(tmp_path);
	if (gpud_tokenizer_load(&t, g, err, sizeof(err)) != 0)
		fail_msg("%s", err);
	gpud_gguf_close(g);
	return t;
}

static const char *const toks[] = { "<unk>", "<s>", "</s>", "▁a", "<|user|>", "<|end|>",
				    "<|assistant|>", "<|eot_id|>", "<|eom_id|>", "<|x|>", "b" };
static const int32_t types[] = { 2, 3, 3, 1, 4, 4, 4, 3, 3, 3, 1 };

static void test_resolve(void **state)
{
	(void)state;
	struct vocab v = { toks, types, 11, "{{ '<start_of_turn>' }}", NULL, -1, -1, -1, -1 };
	struct gpud_tokenizer *t = build(&v);
	enum gpud_chat_template got = GPUD_CHAT_LLAMA3;
	char err[SW_ERR_MAX] = "";

	/* Unrecognized: the error says so and names both ways to choose. */
	assert_int_equal(gpud_tokenizer_chat_template(t), GPUD_CHAT_NONE);
	assert_int_equal(gpud_tokenizer_chat_resolve(t, GPUD_CHAT_NONE, &got, err, sizeof(err)),
			 SW_EUNSUPPORTED);
	assert_int_equal(got, GPUD_CHAT_NONE);
	assert_string_equal(err, "chat formatting: the model's tokenizer.chat_template is not one "
			    "gpud recognizes; choose a format with --chat-format (or config "
			    "gpud.chat_format): auto, llama3, llama2, chatml, mistral, mistral-v1, "
			    "mistral-v3, mistral-v3-tekken, mistral-v7, mistral-v7-tekken, phi3, "
			    "zephyr, deepseek3, deepseek-r1");
	/* A choice wins. */
	assert_int_equal(gpud_tokenizer_chat_resolve(t, GPUD_CHAT_PHI3, &got, err, sizeof(err)),
			 0);
	assert_int_equal(got, GPUD_CHAT_PHI3);
	assert_int_equal(gpud_tokenizer_chat_resolve(t, GPUD_CHAT_MISTRAL, &got, err, sizeof(err)),
			 0);
	assert_int_equal(got, GPUD_CHAT_MISTRAL);
	gpud_tokenizer_free(t);

	/* No template at all. */
	v.chat_template = NULL;
	t = build(&v);
	assert_int_equal(gpud_tokenizer_chat_resolve(t, GPUD_CHAT_NONE, &got, err, sizeof(err)),
			 SW_EUNSUPPORTED);
	assert_non_null(strstr(err, "the model has no tokenizer.chat_template; choose a format "
			       "with --chat-format (or config gpud.chat_format)"));
	gpud_tokenizer_free(t);

	/* "mistral" keeps the file's own Mistral variant; "auto" takes it. */
	v.chat_template = "{{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}";
	t = build(&v);
	assert_int_equal(gpud_tokenizer_chat_resolve(t, GPUD_CHAT_MISTRAL, &got, err, sizeof(err)),
			 0);
	assert_int_equal(got, GPUD_CHAT_MISTRAL_TEKKEN);
	assert_int_equal(gpud_tokenizer_chat_resolve(t, GPUD_CHAT_NONE, &got, err, sizeof(err)), 0);
	assert_int_equal(got, GPUD_CHAT_MISTRAL_TEKKEN);
	assert_int_equal(gpud_tokenizer_chat_resolve(t, GPUD_CHAT_MISTRAL_V1, &got, err,
						     sizeof(err)), 0);
	assert_int_equal(got, GPUD_CHAT_MISTRAL_V1);
	gpud_tokenizer_free(t);
	v.chat_template = "{{- '[SYSTEM_PROMPT]' + m + '[/SYSTEM_PROMPT]' }}{{- '[INST]' + "
			  "c + '[/INST]' }}";
	t = build(&v);
	assert_int_equal(gpud_tokenizer_chat_resolve(t, GPUD_CHAT_MISTRAL, &got, err, sizeof(err)),
			 0);
	assert_int_equal(got, GPUD_CHAT_MISTRAL_V7_TEKKEN);
	gpud_tokenizer_free(t);
}

static void test_end_tokens(void **state)
{
	(void)state;
	/* eom_token_id and eot_token_id end generation; <|x|> (control, no
	 * key, no family marker) does not; the family end markers do by
	 * name even without the keys (<|end|>, <|eot_id|>, <|eom_id|>). */
	struct vocab v = { toks, types, 11, NULL, NULL, -1, 9, 9, -1 };
	struct gpud_tokenizer *t = build(&v);
	assert_true(gpud_tokenizer_is_eog(t, 9));
	assert_true(gpud_tokenizer_is_eog(t, 5));
	assert_true(gpud_tokenizer_is_eog(t, 7));
	assert_true(gpud_tokenizer_is_eog(t, 8));
	assert_false(gpud_tokenizer_is_eog(t, 4));
	assert_false(gpud_tokenizer_is_eog(t, 10));
	gpud_tokenizer_free(t);

	v.eot = -1;
	v.eom = 9;
	t = build(&v);
	assert_true(gpud_tokenizer_is_eog(t, 9)); /* eom alone */
	assert_false(gpud_tokenizer_add_eos(t));
	gpud_tokenizer_free(t);

	/* add_eos_token: EOS appended with GPUD_TOK_ADD_EOS only. */
	v.eom = -1;
	v.eos = 2;
	v.add_eos = 1;
	t = build(&v);
	assert_true(gpud_tokenizer_add_eos(t));
	struct sw_arena ar;
	int32_t ids[16];
	size_t n = 0;
	assert_int_equal(sw_arena_init(&ar, 1 << 16), 0);
	assert_int_equal(gpud_tokenizer_encode(t, "b", 1, GPUD_TOK_ADD_EOS, ids, 16, &n, &ar), 0);
	assert_int_equal(ids[n - 1], 2);
	size_t n2 = 0;
	assert_int_equal(gpud_tokenizer_encode(t, "b", 1, 0, ids, 16, &n2, &ar), 0);
	assert_int_equal(n2, n - 1);
	sw_arena_destroy(&ar);
	gpud_tokenizer_free(t);
}

/* A DeepSeek R1 distill's vocab: the markers are user-defined tokens (its
 * added tokens that are not special), the end of sentence a control one
 * and EOS. The template is recognized, the formatted prompt encodes each
 * marker to its token, and the end of sentence ends generation. */
static void test_deepseek_vocab(void **state)
{
	(void)state;
	static const char *const ds[] = { "<unk>", "<｜begin▁of▁sentence｜>",
					  "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
					  "<think>", "▁a", "▁b", "▁\n" };
	static const int32_t ds_types[] = { 2, 3, 3, 4, 4, 4, 1, 1, 1 };
	struct vocab v = { ds, ds_types, 9,
			   "{{'<｜User｜>' + message['content']}}{{'<｜Assistant｜><think>\\n'}}",
			   NULL, 2, -1, -1, -1 };
	struct gpud_tokenizer *t = build(&v);
	enum gpud_chat_template tmpl = GPUD_CHAT_NONE;
	char err[SW_ERR_MAX] = "", prompt[256];

	assert_int_equal(gpud_tokenizer_chat_resolve(t, GPUD_CHAT_NONE, &tmpl, err, sizeof(err)),
			 0);
	assert_int_equal(tmpl, GPUD_CHAT_DEEPSEEK_R1);
	assert_true(gpud_tokenizer_is_eog(t, 2));
	const struct gpud_chat_msg m[] = { { "user", "a" }, { "assistant", "b" }, { "user", "a" } };
	long len = gpud_chat_format(tmpl, m, 3, true, prompt, sizeof(prompt));
	assert_true(len > 0 && (size_t)len < sizeof(prompt));

	struct sw_arena ar;
	int32_t ids[32];
	size_t n = 0;
	assert_int_equal(sw_arena_init(&ar, 1 << 16), 0);
	assert_int_equal(gpud_tokenizer_encode(t, prompt, (size_t)len, GPUD_TOK_PARSE_SPECIAL, ids,
					       32, &n, &ar), 0);
	/* <｜User｜> a <｜Assistant｜> b <｜end▁of▁sentence｜> <｜User｜> a
	 * <｜Assistant｜> <think> \n: each plain run between markers a
	 * SentencePiece sentence of its own ("▁a"; the vocab is SentencePiece's
	 * here, BPE in the real files: the markers are matched before either). */
	const int32_t want[] = { 3, 6, 4, 7, 2, 3, 6, 4, 5, 8 };
	assert_int_equal(n, sizeof(want) / sizeof(want[0]));
	assert_memory_equal(ids, want, sizeof(want));
	sw_arena_destroy(&ar);
	gpud_tokenizer_free(t);
}

/* rstrip: a Phi-3 file's special tokens drop the whitespace after them
 * (as its HF added tokens say and llama.cpp does); other files keep it. */
static void test_strip(void **state)
{
	(void)state;
	struct sw_arena ar;
	int32_t a[64], b[64];
	size_t na = 0, nb = 0;
	const char *text = "<|user|>\n a<|end|>  \n<|assistant|>";

	assert_int_equal(sw_arena_init(&ar, 1 << 16), 0);
	struct vocab v = { toks, types, 11, NULL, "Phi3", -1, -1, -1, -1 };
	struct gpud_tokenizer *t = build(&v);
	assert_int_equal(gpud_tokenizer_encode(t, text, strlen(text), GPUD_TOK_PARSE_SPECIAL, a,
					       64, &na, &ar), 0);
	const int32_t want[] = { 4, 3, 5, 6 }; /* <|user|> ▁a <|end|> <|assistant|> */
	assert_int_equal(na, 4);
	assert_memory_equal(a, want, sizeof(want));
	gpud_tokenizer_free(t);

	v.name = "Llama";
	t = build(&v);
	assert_int_equal(gpud_tokenizer_encode(t, text, strlen(text), GPUD_TOK_PARSE_SPECIAL, b,
					       64, &nb, &ar), 0);
	assert_true(nb > na); /* the whitespace is text here */
	gpud_tokenizer_free(t);

	/* The shared Phi-3 vocabulary (general.name "Phi3", Phi-3's
	 * template): its chat prompt is exactly the marker tokens around
	 * the text, as llama.cpp tokenizes it. */
	t = NULL;
	struct gpud_gguf *g = NULL;
	char err[SW_ERR_MAX];
	assert_int_equal(gpud_gguf_open(&g, VOCAB_DIR "ggml-vocab-phi-3.gguf", err, sizeof(err)),
			 0);
	assert_int_equal(gpud_tokenizer_load(&t, g, err, sizeof(err)), 0);
	gpud_gguf_close(g);
	assert_int_equal(gpud_tokenizer_chat_template(t), GPUD_CHAT_PHI3);
	const struct gpud_chat_msg m[] = { { "user", "Hello" } };
	char prompt[128];
	long len = gpud_chat_format(GPUD_CHAT_PHI3, m, 1, true, prompt, sizeof(prompt));
	assert_int_equal(gpud_tokenizer_encode(t, prompt, (size_t)len, GPUD_TOK_PARSE_SPECIAL, a,
					       64, &na, &ar), 0);
	int32_t user = gpud_tokenizer_find(t, "<|user|>", 8);
	int32_t end = gpud_tokenizer_find(t, "<|end|>", 7);
	int32_t ass = gpud_tokenizer_find(t, "<|assistant|>", 13);
	int32_t hello = gpud_tokenizer_find(t, "▁Hello", strlen("▁Hello"));
	assert_true(user >= 0 && end >= 0 && ass >= 0 && hello >= 0);
	const int32_t want3[] = { user, hello, end, ass };
	assert_int_equal(na, 4);
	assert_memory_equal(a, want3, sizeof(want3));
	assert_true(gpud_tokenizer_is_eog(t, end));
	gpud_tokenizer_free(t);
	sw_arena_destroy(&ar);
}

/* --- end to end: a ChatML model ------------------------------------------- */

static char model_path[64];

/* Overwrites a tensor's bytes in the file (F32 data, GGUF offsets). */
static void patch_tensor(const char *path, const char *name, const float *data, size_t n)
{
	struct gpud_gguf *g = NULL;
	char err[SW_ERR_MAX];

	assert_int_equal(gpud_gguf_open(&g, path, err, sizeof(err)), 0);
	const struct gpud_gguf_tensor *tt = gpud_gguf_find_tensor(g, name);
	assert_non_null(tt);
	assert_int_equal(tt->type, GPUD_TYPE_F32);
	assert_int_equal(tt->nbytes, n * sizeof(float));
	uint64_t off = gpud_gguf_data_offset(g) + tt->offset;
	gpud_gguf_close(g);
	FILE *f = fopen(path, "r+b");
	assert_non_null(f);
	assert_int_equal(fseek(f, (long)off, SEEK_SET), 0);
	assert_int_equal(fwrite(data, sizeof(float), n, f), n);
	assert_int_equal(fclose(f), 0);
}

static int collect(void *arg, const char *text, size_t len)
{
	size_t *total = arg;
	(void)text;
	*total += len;
	return 0;
}

/* A model with the Qwen2.5 vocabulary (ChatML template, <|im_end|> its
 * EOS) whose weights make <|im_end|> the greedy choice: every token's
 * embedding has 100 in dimension 0 (the rest of the residual stream
 * stays small), and the output matrix is zero but for <|im_end|>'s row,
 * which reads dimension 0. `gpud generate --chat` formats the prompt
 * with ChatML, tokenizes its markers as special tokens and stops at the
 * first <|im_end|>. */
static void test_chatml_model(void **state)
{
	(void)state;
	struct gpud_mkmodel_params p;
	char err[SW_ERR_MAX] = "";
	const uint32_t dim = 32;

	snprintf(model_path, sizeof(model_path), "/tmp/chat_test_qwen.%d.gguf", (int)getpid());
	gpud_mkmodel_params_default(&p);
	p.out = model_path;
	p.dim = dim;
	p.n_layers = 1;
	p.n_heads = 2;
	p.n_kv_heads = 1;
	p.ffn_dim = 32;
	p.n_ctx = 64;
	p.type = GPUD_TYPE_F32;
	p.tied = false;
	p.vocab_from = VOCAB_DIR "ggml-vocab-qwen2.gguf";
	if (gpud_mkmodel(&p, err, sizeof(err)) != 0)
		fail_msg("mkmodel: %s", err);

	struct gpud_gguf *g = NULL;
	assert_int_equal(gpud_gguf_open(&g, model_path, err, sizeof(err)), 0);
	const struct gpud_gguf_tensor *emb = gpud_gguf_find_tensor(g, "token_embd.weight");
	assert_non_null(emb);
	size_t n_vocab = (size_t)emb->ne[1], n = n_vocab * dim;
	float *w = malloc(n * sizeof(float));
	assert_non_null(w);
	memcpy(w, emb->data, n * sizeof(float));
	gpud_gguf_close(g);
	for (size_t i = 0; i < n_vocab; i++)
		w[i * dim] = 100.0f;
	patch_tensor(model_path, "token_embd.weight", w, n);

	struct gpud_model *m = NULL;
	if (gpud_model_load(&m, model_path, err, sizeof(err)) != 0)
		fail_msg("%s", err);
	const struct gpud_tokenizer *tok = gpud_model_tokenizer(m);
	int32_t im_start = gpud_tokenizer_find(tok, "<|im_start|>", 12);
	int32_t im_end = gpud_tokenizer_find(tok, "<|im_end|>", 10);
	assert_int_equal(im_start, 151644);
	assert_int_equal(im_end, 151645);
	assert_true(gpud_tokenizer_is_eog(tok, im_end));
	assert_false(gpud_tokenizer_add_bos(tok)); /* Qwen: no BOS */
	gpud_model_free(m);

	memset(w, 0, n * sizeof(float));
	w[(size_t)im_end * dim] = 1.0f;
	patch_tensor(model_path, "output.weight", w, n);
	free(w);

	assert_int_equal(gpud_model_load(&m, model_path, err, sizeof(err)), 0);
	tok = gpud_model_tokenizer(m);
	enum gpud_chat_template tmpl;
	assert_int_equal(gpud_tokenizer_chat_resolve(tok, GPUD_CHAT_NONE, &tmpl, err, sizeof(err)),
			 0);
	assert_int_equal(tmpl, GPUD_CHAT_CHATML);

	/* The prompt's markers are the special tokens; plain text they are not. */
	const struct gpud_chat_msg msg[] = { { "system", "Be brief." }, { "user", "Hi" } };
	char prompt[256];
	long len = gpud_chat_format(tmpl, msg, 2, true, prompt, sizeof(prompt));
	assert_true(len > 0 && (size_t)len < sizeof(prompt));
	struct sw_arena ar;
	int32_t ids[64];
	size_t nid = 0;
	assert_int_equal(sw_arena_init(&ar, gpud_tokenizer_scratch_bytes(tok, (size_t)len)), 0);
	assert_int_equal(gpud_tokenizer_encode(tok, prompt, (size_t)len, GPUD_TOK_PARSE_SPECIAL,
					       ids, 64, &nid, &ar), 0);
	assert_int_equal(ids[0], im_start);
	size_t n_start = 0, n_end = 0;
	for (size_t i = 0; i < nid; i++) {
		n_start += ids[i] == im_start;
		n_end += ids[i] == im_end;
	}
	assert_int_equal(n_start, 3); /* system, user, the assistant header */
	assert_int_equal(n_end, 2);
	assert_int_equal(gpud_tokenizer_encode(tok, prompt, (size_t)len, 0, ids, 64, &nid, &ar), 0);
	for (size_t i = 0; i < nid; i++)
		assert_true(ids[i] != im_start && ids[i] != im_end);
	sw_arena_destroy(&ar);

	/* Generation ends at <|im_end|>: its first token, no text. */
	struct gpud_engine_params ep;
	struct gpud_engine *e = NULL;
	struct gpud_gen_params gp;
	struct gpud_gen_result res;
	size_t text = 0;
	gpud_engine_params_default(&ep);
	ep.max_seqs = 1;
	ep.n_ctx = 64;
	ep.n_threads = 1;
	if (gpud_engine_create(&e, m, &ep, err, sizeof(err)) != 0)
		fail_msg("%s", err);
	gpud_gen_params_default(&gp);
	gp.max_tokens = 8;
	gp.parse_special = true;
	gp.no_bos = gpud_chat_writes_bos(tmpl);
	if (gpud_engine_generate(e, prompt, (size_t)len, &gp, collect, &text, &res, err,
				 sizeof(err)) != 0)
		fail_msg("%s", err);
	assert_int_equal(res.reason, GPUD_STOP_EOG);
	assert_int_equal(res.n_gen, 1);
	assert_int_equal(text, 0);
	gpud_engine_destroy(e);
	gpud_model_free(m);
	unlink(model_path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_detect_real_templates),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_format_chatml),
		cmocka_unit_test(test_format_phi3),
		cmocka_unit_test(test_format_zephyr),
		cmocka_unit_test(test_format_mistral),
		cmocka_unit_test(test_format_mistral_v7),
		cmocka_unit_test(test_format_llama),
		cmocka_unit_test(test_format_deepseek),
		cmocka_unit_test(test_format_appends),
		cmocka_unit_test(test_resolve),
		cmocka_unit_test(test_end_tokens),
		cmocka_unit_test(test_deepseek_vocab),
		cmocka_unit_test(test_strip),
		cmocka_unit_test(test_chatml_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
