/* agentd_chunk_test.c - token-aware chunking with overlap, with a fake
 * tokenizer that counts whitespace-separated words. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentd/chunk.h"
#include "common/err.h"

static int calls;

static int count_words(void *arg, const char *s, size_t len, uint32_t *n)
{
	bool in = false;

	calls++;
	*n = 0;
	for (size_t i = 0; i < len; i++) {
		bool sp = s[i] == ' ' || s[i] == '\n' || s[i] == '\t';

		if (!sp && !in)
			(*n)++;
		in = !sp;
	}
	return 0;
}

static int count_fails(void *arg, const char *s, size_t len, uint32_t *n)
{
	return SW_ECLOSED;
}

static char err[SW_ERR_MAX];

/* The text of chunk i as a NUL-terminated copy in buf. */
static const char *span(const char *text, const struct agent_chunk *c, char *buf, size_t len)
{
	snprintf(buf, len, "%.*s", (int)c->len, text + c->off);
	return buf;
}

static void test_fits_in_one(void **state)
{
	static const char text[] = "One two. Three four five.";
	struct agent_chunk *c;
	size_t n;

	assert_int_equal(agent_chunk_text(text, strlen(text), 10, 2, count_words, NULL, &c, &n,
					  err, sizeof(err)),
			 0);
	assert_int_equal(n, 1);
	assert_int_equal(c[0].off, 0);
	assert_int_equal(c[0].len, strlen(text));
	assert_int_equal(c[0].n_tokens, 5);
	free(c);
}

static void test_sentences_with_overlap(void **state)
{
	/* Five sentences of 3 words; budget 7 -> two sentences per chunk,
	 * overlap 3 -> each chunk repeats the previous one's last sentence. */
	static const char text[] = "a1 a2 a3. b1 b2 b3. c1 c2 c3. d1 d2 d3. e1 e2 e3.";
	struct agent_chunk *c;
	char buf[128];
	size_t n;

	assert_int_equal(agent_chunk_text(text, strlen(text), 7, 3, count_words, NULL, &c, &n, err,
					  sizeof(err)),
			 0);
	assert_int_equal(n, 4);
	assert_string_equal(span(text, &c[0], buf, sizeof(buf)), "a1 a2 a3. b1 b2 b3. ");
	assert_string_equal(span(text, &c[1], buf, sizeof(buf)), "b1 b2 b3. c1 c2 c3. ");
	assert_string_equal(span(text, &c[2], buf, sizeof(buf)), "c1 c2 c3. d1 d2 d3. ");
	assert_string_equal(span(text, &c[3], buf, sizeof(buf)), "d1 d2 d3. e1 e2 e3.");
	for (size_t i = 0; i < n; i++)
		assert_int_equal(c[i].n_tokens, 6);
	free(c);

	/* No overlap: disjoint chunks covering the text in order. */
	assert_int_equal(agent_chunk_text(text, strlen(text), 7, 0, count_words, NULL, &c, &n, err,
					  sizeof(err)),
			 0);
	assert_int_equal(n, 3);
	assert_int_equal(c[0].off, 0);
	for (size_t i = 1; i < n; i++)
		assert_int_equal(c[i].off, c[i - 1].off + c[i - 1].len);
	assert_int_equal(c[n - 1].off + c[n - 1].len, strlen(text));
	free(c);
}

static void test_long_sentence_is_split(void **state)
{
	char text[1024];
	struct agent_chunk *c;
	size_t n, off = 0;

	for (int i = 0; i < 40; i++)
		off += (size_t)snprintf(text + off, sizeof(text) - off, "w%d ", i);
	assert_int_equal(agent_chunk_text(text, off, 8, 0, count_words, NULL, &c, &n, err,
					  sizeof(err)),
			 0);
	assert_true(n >= 5);
	for (size_t i = 0; i < n; i++) {
		assert_true(c[i].n_tokens <= 8);
		assert_true(c[i].n_tokens > 0);
		/* Cuts fall at word starts. */
		assert_true(c[i].off == 0 || text[c[i].off - 1] == ' ');
	}
	assert_int_equal(c[n - 1].off + c[n - 1].len, off);
	free(c);
}

/* One token per non-blank byte: lets a single word exceed the budget. */
static int count_bytes(void *arg, const char *s, size_t len, uint32_t *n)
{
	*n = 0;
	for (size_t i = 0; i < len; i++)
		*n += s[i] != ' ';
	return 0;
}

static void test_unbreakable_word(void **state)
{
	/* A word longer than the budget cannot be split: it stays one chunk,
	 * over budget, rather than being cut mid-word. */
	static const char text[] = "ab. xxxxxxxxxx";
	struct agent_chunk *c;
	char buf[64];
	size_t n;

	assert_int_equal(agent_chunk_text(text, strlen(text), 4, 0, count_bytes, NULL, &c, &n, err,
					  sizeof(err)),
			 0);
	assert_int_equal(n, 2);
	assert_int_equal(c[0].n_tokens, 3);
	assert_string_equal(span(text, &c[1], buf, sizeof(buf)), "xxxxxxxxxx");
	assert_int_equal(c[1].n_tokens, 10);
	free(c);
}

static void test_split_before_trailing_blanks(void **state)
{
	/* Two words over budget whose nearest whitespace to the middle is the
	 * trailing run: the cut still goes at the word start before it (it
	 * used to give up and keep the unit whole, over budget; found by
	 * tests/fuzz/fuzz_chunk.c, corpus/chunk/blanks). */
	static const char text[] = "then text.\n\n\n   ";
	struct agent_chunk *c;
	char buf[64];
	size_t n;

	assert_int_equal(agent_chunk_text(text, strlen(text), 7, 0, count_bytes, NULL, &c, &n, err,
					  sizeof(err)),
			 0);
	assert_int_equal(n, 2);
	assert_string_equal(span(text, &c[0], buf, sizeof(buf)), "then ");
	assert_int_equal(c[0].n_tokens, 4);
	assert_int_equal(c[1].off, 5);
	assert_int_equal(c[1].len, strlen(text) - 5);
	assert_int_equal(c[1].n_tokens, 8); /* count_bytes counts newlines */
	free(c);
}

static void test_paragraphs_and_blanks(void **state)
{
	static const char text[] = "\n\n  first line\n\n\nsecond line\n   \n";
	struct agent_chunk *c;
	char buf[64];
	size_t n;

	assert_int_equal(agent_chunk_text(text, strlen(text), 2, 0, count_words, NULL, &c, &n, err,
					  sizeof(err)),
			 0);
	assert_int_equal(n, 2);
	/* Leading blanks belong to no chunk; trailing ones to the last unit. */
	assert_string_equal(span(text, &c[0], buf, sizeof(buf)), "first line\n\n\n");
	assert_string_equal(span(text, &c[1], buf, sizeof(buf)), "second line\n   \n");
	free(c);
}

static void test_empty(void **state)
{
	struct agent_chunk *c = (void *)1;
	size_t n = 9;

	assert_int_equal(agent_chunk_text("", 0, 8, 0, count_words, NULL, &c, &n, err, sizeof(err)),
			 0);
	assert_null(c);
	assert_int_equal(n, 0);
	assert_int_equal(agent_chunk_text(" \n\t ", 4, 8, 0, count_words, NULL, &c, &n, err,
					  sizeof(err)),
			 0);
	assert_null(c);
	assert_int_equal(n, 0);
}

static void test_errors(void **state)
{
	struct agent_chunk *c;
	size_t n;

	assert_int_equal(agent_chunk_text("a b", 3, 0, 0, count_words, NULL, &c, &n, err,
					  sizeof(err)),
			 -EINVAL);
	assert_int_equal(agent_chunk_text("a b", 3, 4, 4, count_words, NULL, &c, &n, err,
					  sizeof(err)),
			 -EINVAL);
	assert_string_equal(err, "chunk: need 0 <= overlap < max_tokens, got overlap 4, max 4");
	assert_int_equal(agent_chunk_text("a b. c d.", 9, 4, 0, count_fails, NULL, &c, &n, err,
					  sizeof(err)),
			 SW_ECLOSED);
	assert_null(c);
	assert_non_null(strstr(err, "counting tokens failed"));
}

static void test_overlap_always_advances(void **state)
{
	/* Overlap as large as a chunk allows must still make progress. */
	static const char text[] = "a. b. c. d. e. f. g.";
	struct agent_chunk *c;
	size_t n;

	calls = 0;
	assert_int_equal(agent_chunk_text(text, strlen(text), 2, 1, count_words, NULL, &c, &n, err,
					  sizeof(err)),
			 0);
	assert_int_equal(n, 6);
	for (size_t i = 1; i < n; i++)
		assert_true(c[i].off > c[i - 1].off);
	assert_int_equal(calls, 7); /* one count per sentence */
	free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fits_in_one),
		cmocka_unit_test(test_sentences_with_overlap),
		cmocka_unit_test(test_long_sentence_is_split),
		cmocka_unit_test(test_unbreakable_word),
		cmocka_unit_test(test_split_before_trailing_blanks),
		cmocka_unit_test(test_paragraphs_and_blanks),
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_overlap_always_advances),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
