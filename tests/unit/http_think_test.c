/* http_think_test.c - the reasoning splitter (http/think.h): each case's
 * text cut into pieces at every one or two places (and byte by byte)
 * sorts into the same reasoning and content as the text whole. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "http/think.h"

struct out {
	char r[256], c[256];
	size_t nr, nc;
};

static void put(char *dst, size_t *n, const char *s, size_t k)
{
	assert_true(k > 0); /* never an empty run */
	assert_true(*n + k < 256);
	memcpy(dst + *n, s, k);
	*n += k;
	dst[*n] = '\0';
}

static void on_reason(void *arg, const char *s, size_t n)
{
	struct out *o = arg;
	put(o->r, &o->nr, s, n);
}

static void on_content(void *arg, const char *s, size_t n)
{
	struct out *o = arg;
	put(o->c, &o->nc, s, n);
}

/* text fed in the pieces cuts[] marks (cuts ascending, n_cuts of them) */
static bool split(const char *text, bool opened, bool detect, const size_t *cuts, size_t n_cuts,
		  struct out *o)
{
	struct http_think t;
	const struct http_think_sink k = { on_reason, on_content, o };
	size_t at = 0, len = strlen(text);

	memset(o, 0, sizeof(*o));
	http_think_init(&t, opened, detect);
	for (size_t i = 0; i <= n_cuts; i++) {
		size_t to = i < n_cuts ? cuts[i] : len;
		http_think_feed(&t, text + at, to - at, &k);
		at = to;
	}
	http_think_end(&t, &k);
	return t.reasoned;
}

/* text cut at cuts[0..n_cuts) sorts into reason and content */
static void check(const char *text, bool opened, bool detect, const size_t *cuts, size_t n_cuts,
		  const char *reason, const char *content, bool reasoned)
{
	struct out o;

	assert_true(split(text, opened, detect, cuts, n_cuts, &o) == reasoned);
	if (strcmp(o.r, reason) || strcmp(o.c, content))
		fail_msg("\"%s\" (opened %d, detect %d) in %zu pieces, cut first at %zu: reasoning "
			 "\"%s\", content \"%s\"; want \"%s\", \"%s\"", text, opened, detect,
			 n_cuts + 1, n_cuts ? cuts[0] : 0, o.r, o.c, reason, content);
}

/* Whole (both cuts at 0), in two or three pieces at every two places,
 * and byte by byte. */
static void want(const char *text, bool opened, bool detect, const char *reason,
		 const char *content, bool reasoned)
{
	size_t len = strlen(text), cuts[256];

	for (size_t a = 0; a <= len; a++)
		for (size_t b = a; b <= len; b++) {
			cuts[0] = a;
			cuts[1] = b;
			check(text, opened, detect, cuts, 2, reason, content, reasoned);
		}
	assert_true(len <= 256);
	for (size_t i = 0; i < len; i++)
		cuts[i] = i;
	check(text, opened, detect, cuts, len, reason, content, reasoned);
}

/* DeepSeek R1: the prompt opened the reasoning. */
static void test_opened(void **state)
{
	(void)state;
	want("Let me see. 2+2 is 4.\n</think>\n\nIt is **4**.", true, false,
	     "Let me see. 2+2 is 4.\n", "It is **4**.", true);
	want("\nhm</think>ok", true, false, "hm", "ok", true);
	/* never closed: all reasoning; a tag's beginning at the end too */
	want("still thinking", true, false, "still thinking", "", true);
	want("still </thi", true, false, "still </thi", "", true);
	/* what looks like the tag and is not stays reasoning */
	want("a<b</x</thinking></think>c", true, false, "a<b</x</thinking>", "c", true);
	want("<</think>x", true, false, "<", "x", true);
	/* a second close is the answer's */
	want("r</think>a</think>b", true, false, "r", "a</think>b", true);
	want("</think>", true, false, "", "", true);
	want("", true, false, "", "", true);
}

/* Qwen3, QwQ: the model opens it, or does not. */
static void test_detect(void **state)
{
	(void)state;
	want("<think>\nOkay.\n</think>\n\nHello!", false, true, "Okay.\n", "Hello!", true);
	want("\n <think>x</think>y", false, true, "x", "y", true);
	want("Hello <think> there", false, true, "", "Hello <think> there", false);
	want("  Hi", false, true, "", "  Hi", false);
	want("<thin", false, true, "", "<thin", false);
	want("<thinking>", false, true, "", "<thinking>", false);
	want("<think>", false, true, "", "", true);
	/* more whitespace than is kept back: the detection gives up */
	want("                    <think>x", false, true, "", "                    <think>x",
	     false);
}

/* No split: everything is content. */
static void test_off(void **state)
{
	(void)state;
	want("<think>a</think>b", false, false, "", "<think>a</think>b", false);
	want("a</think>b", false, false, "", "a</think>b", false);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_opened),
		cmocka_unit_test(test_detect),
		cmocka_unit_test(test_off),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
