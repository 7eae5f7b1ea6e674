/* chunk.c - token-aware chunking with overlap. */
#include "agentd/chunk.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

struct unit {
	size_t off, len;
	uint32_t n;
};

struct units {
	struct unit *v;
	size_t n, cap;
};

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

static bool all_space(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (!is_space(s[i]))
			return false;
	return true;
}

static int push(struct units *u, size_t off, size_t len, uint32_t n)
{
	if (u->n == u->cap) {
		size_t cap = u->cap ? u->cap * 2 : 64;
		struct unit *v = realloc(u->v, cap * sizeof(*v));

		if (!v)
			return -ENOMEM;
		u->v = v;
		u->cap = cap;
	}
	u->v[u->n++] = (struct unit){ off, len, n };
	return 0;
}

/* The start of a word nearest the middle of s[0, len) that has a word
 * before it (a space before, not a space at, some non-space earlier), or
 * 0 when there is none: one word, with or without whitespace around it.
 * Cutting there leaves the whitespace run with the first half. */
static size_t cut_point(const char *s, size_t len)
{
	size_t first = 0, mid = len / 2;

	while (first < len && is_space(s[first]))
		first++;
	for (size_t d = 0; mid + d < len || mid > first + d; d++) {
		size_t hi = mid + d, lo = mid - d;

		if (hi < len && hi > first && is_space(s[hi - 1]) && !is_space(s[hi]))
			return hi;
		if (mid >= d && lo > first && lo < len && is_space(s[lo - 1]) && !is_space(s[lo]))
			return lo;
	}
	return 0;
}

/* Counts one span and adds it, halving it at the word start nearest its
 * middle while it is over budget. */
static int add_span(const char *text, size_t off, size_t len, uint32_t max, agent_count_fn count,
		    void *arg, struct units *u)
{
	size_t mid;
	uint32_t n;
	int rc;

	rc = count(arg, text + off, len, &n);
	if (rc)
		return rc;
	if (n <= max)
		return push(u, off, len, n);
	mid = cut_point(text + off, len);
	if (mid == 0)
		return push(u, off, len, n); /* one unbreakable word */
	rc = add_span(text, off, mid, max, count, arg, u);
	if (rc)
		return rc;
	return add_span(text, off + mid, len - mid, max, count, arg, u);
}

/* Units end after a newline, or after [.!?] followed by whitespace, and
 * take the whitespace that follows. */
static int split_units(const char *text, size_t len, uint32_t max, agent_count_fn count,
		       void *arg, struct units *u)
{
	size_t start = 0, i = 0;
	int rc;

	while (i < len) {
		char c = text[i++];
		bool end = c == '\n' ||
			   ((c == '.' || c == '!' || c == '?') && i < len && is_space(text[i]));

		if (!end && i < len)
			continue;
		while (i < len && is_space(text[i]))
			i++;
		if (all_space(text + start, i - start)) {
			if (u->n) /* leading or repeated blanks join the previous unit */
				u->v[u->n - 1].len = i - u->v[u->n - 1].off;
			start = i;
			continue;
		}
		rc = add_span(text, start, i - start, max, count, arg, u);
		if (rc)
			return rc;
		start = i;
	}
	return 0;
}

int agent_chunk_text(const char *text, size_t len, uint32_t max_tokens, uint32_t overlap,
		     agent_count_fn count, void *arg, struct agent_chunk **out, size_t *n_out,
		     char *err, size_t errlen)
{
	struct units u = { 0 };
	struct agent_chunk *c = NULL;
	size_t nc = 0, i = 0;
	int rc;

	*out = NULL;
	*n_out = 0;
	if (max_tokens == 0 || overlap >= max_tokens)
		return sw_seterr(err, errlen, -EINVAL,
				 "chunk: need 0 <= overlap < max_tokens, got overlap %u, max %u",
				 overlap, max_tokens);
	rc = split_units(text, len, max_tokens, count, arg, &u);
	if (rc) {
		sw_seterr(err, errlen, rc, "chunk: counting tokens failed: %s", sw_strerror(rc));
		goto out;
	}
	if (u.n == 0)
		goto out;
	c = calloc(u.n, sizeof(*c)); /* at most one chunk per unit */
	if (!c) {
		rc = sw_seterr(err, errlen, -ENOMEM, "chunk: out of memory");
		goto out;
	}
	while (i < u.n) {
		size_t j = i, k;
		uint32_t sum = 0, s = 0;

		while (j < u.n && (j == i || sum + u.v[j].n <= max_tokens))
			sum += u.v[j++].n;
		c[nc++] = (struct agent_chunk){
			.off = u.v[i].off,
			.len = u.v[j - 1].off + u.v[j - 1].len - u.v[i].off,
			.n_tokens = sum,
		};
		if (j == u.n)
			break;
		for (k = j; k - 1 > i && s + u.v[k - 1].n <= overlap; k--)
			s += u.v[k - 1].n;
		i = k;
	}
	*out = c;
	*n_out = nc;
	c = NULL;
out:
	free(c);
	free(u.v);
	return rc;
}
