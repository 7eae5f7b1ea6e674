/* think.h - a reasoning model's answer split into its reasoning and its
 * content, as the OpenAI-compatible servers of such models return them
 * (message.reasoning_content beside message.content; in a stream, deltas
 * of either).
 *
 * Two kinds of models think aloud before they answer: those whose chat
 * prompt opens the reasoning itself (DeepSeek R1 and its distills: the
 * prompt ends "<｜Assistant｜><think>\n", gpud's "deepseek-r1" format), so
 * that their text is reasoning until "</think>"; and those that open it
 * themselves (Qwen3, QwQ: the text begins "<think>"). The splitter takes
 * the generated text in pieces as they come and sorts every byte: the
 * tags go, the whitespace before the reasoning and between "</think>"
 * and the answer goes, and nothing else is dropped or reordered. A piece that ends inside a tag
 * keeps those bytes back until the next piece (or the end) says what
 * they are. Pure: no allocation, no I/O.
 */
#ifndef HTTP_THINK_H
#define HTTP_THINK_H

#include <stdbool.h>
#include <stddef.h>

enum http_think_mode {
	HTTP_THINK_OFF,     /* no split: everything is content */
	HTTP_THINK_DETECT,  /* reasoning if the text begins (after whitespace) with <think> */
	HTTP_THINK_REASON,  /* reasoning until </think> */
	HTTP_THINK_GAP,     /* past </think>: whitespace before the answer dropped */
	HTTP_THINK_CONTENT, /* the answer */
};

struct http_think {
	enum http_think_mode mode;
	bool reasoned;  /* some text was sorted as reasoning, or a tag was seen */
	char hold[16];  /* bytes kept back: a tag's beginning, or DETECT's whitespace */
	size_t n_hold;
	size_t tag;     /* DETECT: bytes of <think> among them */
	bool lead;      /* REASON: whitespace before the reasoning is dropped */
};

/* The two outputs of a piece: where the caller's bytes go. Each is called
 * with consecutive runs, never with an empty one. */
struct http_think_sink {
	void (*reason)(void *arg, const char *s, size_t n);
	void (*content)(void *arg, const char *s, size_t n);
	void *arg;
};

/* opened: the prompt opened the reasoning (REASON); otherwise detect
 * tells whether to look for a leading <think> (DETECT) or not (OFF). */
void http_think_init(struct http_think *t, bool opened, bool detect);
/* Sorts n bytes of text into the sink. */
void http_think_feed(struct http_think *t, const char *s, size_t n,
		     const struct http_think_sink *k);
/* The text ended: bytes kept back go where they were headed (a tag's
 * beginning that never finished is text after all). */
void http_think_end(struct http_think *t, const struct http_think_sink *k);

#endif
