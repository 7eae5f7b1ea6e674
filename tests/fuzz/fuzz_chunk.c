/* fuzz_chunk.c - libFuzzer target: bytes -> agent_chunk_text, agentd's
 * ingest chunker (agentd/chunk.h), over the text of any fetched document.
 *
 * Input: byte 0 picks max_tokens (1..64), byte 1 the overlap (0..max,
 * max itself being the invalid case), byte 2 a counter call that fails
 * (0: none); the rest is the text. The token counter is additive (a token
 * per byte that is not whitespace), so the count of a chunk's span is
 * exactly the sum over its units that the chunker reports.
 *
 * Checked invariants, from chunk.h's contract (a violation traps):
 *  - overlap >= max_tokens is -EINVAL; a failing counter's code is passed
 *    through; on any error *out is NULL, *n_out 0, and the message starts
 *    "chunk: ";
 *  - an empty or all-whitespace text gives no chunk (NULL, 0);
 *  - chunks lie inside the text, are not empty, start strictly further
 *    each time, and leave no gap (the next starts at or before the end of
 *    the previous one): together they cover the text from the first
 *    non-whitespace byte to its end, in order, and what precedes the first
 *    chunk is whitespace;
 *  - a chunk starts at the text's start or after whitespace, and ends at
 *    the text's end or after whitespace: cuts fall on ASCII bytes, never
 *    inside a UTF-8 sequence;
 *  - n_tokens is the count of the chunk's span; a chunk over max_tokens is
 *    one unbreakable word (whitespace may only lead the text's first
 *    chunk and trail any chunk);
 *  - the span two chunks share holds at most overlap tokens.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "agentd/chunk.h"
#include "common/err.h"
#include "tests/fuzz/fuzz.h"

struct counter {
	unsigned calls, fail_at;
};

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static uint32_t tokens(const char *s, size_t len)
{
	uint32_t n = 0;

	for (size_t i = 0; i < len; i++)
		n += !is_space(s[i]);
	return n;
}

static int count(void *arg, const char *text, size_t len, uint32_t *n)
{
	struct counter *c = arg;

	if (++c->calls == c->fail_at)
		return -EIO;
	*n = tokens(text, len);
	return 0;
}

static void check_chunks(const char *text, size_t len, uint32_t max, uint32_t overlap,
			 const struct agent_chunk *c, size_t n)
{
	size_t first = 0;

	while (first < len && is_space(text[first]))
		first++;
	if (first == len) {
		CHECK(n == 0 && c == NULL);
		return;
	}
	CHECK(n >= 1 && c != NULL);
	CHECK(c[0].off <= first);
	CHECK(tokens(text, c[0].off) == 0);
	CHECK(c[n - 1].off + c[n - 1].len == len);
	for (size_t i = 0; i < n; i++) {
		size_t off = c[i].off, end = c[i].off + c[i].len;

		CHECK(c[i].len >= 1 && end <= len && end > off);
		CHECK(off == 0 || is_space(text[off - 1]));
		CHECK(end == len || is_space(text[end - 1]));
		CHECK(c[i].n_tokens == tokens(text + off, c[i].len));
		if (c[i].n_tokens > max) {
			size_t w = off;

			while (w < end && is_space(text[w])) /* the first chunk's */
				w++;
			while (w < end && !is_space(text[w]))
				w++;
			CHECK(tokens(text + w, end - w) == 0);
		}
		if (i + 1 < n) {
			CHECK(c[i + 1].off > off);
			CHECK(c[i + 1].off <= end);
			CHECK(tokens(text + c[i + 1].off, end - c[i + 1].off) <= overlap);
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct agent_chunk *c = (struct agent_chunk *)&c; /* must be overwritten */
	struct counter counter = { 0 };
	char err[SW_ERR_MAX];
	uint32_t max, overlap;
	const char *text;
	size_t len, n = 7;
	char *copy;
	int rc;

	if (size < 3)
		return 0;
	max = 1 + data[0] % 64;
	overlap = data[1] % (max + 1);
	counter.fail_at = data[2];
	len = size - 3;
	/* An exact-size copy, so reading past the text is caught. */
	copy = malloc(len ? len : 1);
	if (!copy)
		return 0;
	memcpy(copy, data + 3, len);
	text = copy;
	rc = agent_chunk_text(text, len, max, overlap, count, &counter, &c, &n, err, sizeof(err));
	if (overlap >= max) {
		CHECK(rc == -EINVAL);
	} else if (counter.fail_at && counter.calls >= counter.fail_at) {
		CHECK(rc == -EIO);
	} else {
		CHECK(rc == 0);
		check_chunks(text, len, max, overlap, c, n);
	}
	if (rc) {
		CHECK(c == NULL && n == 0);
		CHECK(strncmp(err, "chunk: ", 7) == 0);
	}
	free(c);
	free(copy);
	return 0;
}
