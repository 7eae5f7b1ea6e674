/* fuzz_http.c - libFuzzer target: gpud-http's parsers of outside bytes
 * (http/api.h, http/parse.h). The first byte picks the target, the rest
 * is the input:
 *   0  chat request JSON        (http_gen_decode, HTTP_CHAT)
 *   1  completion request JSON  (http_gen_decode, HTTP_COMPLETION)
 *   2  embeddings request JSON  (http_embed_decode)
 *   3  the SSE writer           (http_sse_event)
 *   4  a request head           (http_parse_head)
 *
 * Checked invariants (a violation traps):
 *  - a decoder returns 0 or -1; -1 comes with status 400 (or 404/500
 *    never: a client's bytes are a client's mistake) and a message; on
 *    success the request passes proto_submit_size (what gpud-http sends
 *    is always encodable), segments are 1..max_segments, every stop
 *    string is 1..64 bytes, max_tokens >= 1, temperature in [0, 2],
 *    top_p in (0, 1]; the error and chunk JSON built from it parse;
 *  - the SSE event starts with "data: ", ends with "\n\n", carries no CR
 *    and no LF but the framing, and reading it back (the event-stream
 *    rules: lines joined by LF) gives the input with CRLF and CR turned
 *    into LF; the measured size equals the written size;
 *  - the head parser returns -1 with a status in {400, 411, 417, 501, 505}
 *    and a reason, 0, or a length within the input ending in CRLFCRLF,
 *    whose path starts with '/' and lies inside the input.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "http/api.h"
#include "http/parse.h"
#include "tests/fuzz/fuzz.h"

static void check_err(const struct http_err *e)
{
	CHECK(e->status == 400);
	CHECK(e->msg[0] != '\0');
	char *s = http_error_json(e);
	CHECK(s != NULL);
	json_t *j = json_loads(s, 0, NULL);
	CHECK(j != NULL);
	json_decref(j);
	free(s);
}

static void gen(enum http_kind k, const char *p, size_t n)
{
	static struct http_gen g;
	struct http_err e;
	size_t sz;
	char m[256];

	if (http_gen_decode(k, p, n, 64, &g, &e)) {
		check_err(&e);
		return;
	}
	CHECK(g.req.n_segments >= 1 && g.req.n_segments <= 64);
	CHECK(g.req.max_tokens >= 1);
	CHECK(g.req.sampling.temperature >= 0 && g.req.sampling.temperature <= 2);
	CHECK(g.req.sampling.top_p > 0 && g.req.sampling.top_p <= 1);
	for (uint32_t i = 0; i < g.req.n_stop; i++)
		CHECK(g.req.stop[i].len >= 1 && g.req.stop[i].len <= PROTO_MAX_STOP_LEN);
	CHECK(proto_submit_size(&g.req, &sz, m, sizeof(m)) == 0);
	struct proto_done u = { 1, 0, 1, PROTO_STOP_EOG, 0, 0, 0, 0 };
	char *s = http_chunk_json(k, "id", 1, g.model, g.seg[0].text, g.seg[0].len, g.seg[0].text,
				  g.seg[0].len, true, NULL, NULL, NULL);
	/* segment text is valid UTF-8 (it came from JSON): the chunk builds */
	CHECK(s != NULL);
	free(s);
	s = http_completion_json(k, "id", 1, g.model, "", 0, "", 0, NULL, &u);
	CHECK(s != NULL);
	free(s);
	http_gen_free(&g);
}

static void embed(const char *p, size_t n)
{
	struct http_embed x;
	struct http_err e;

	if (http_embed_decode(p, n, &x, &e)) {
		check_err(&e);
		return;
	}
	CHECK(x.n >= 1 && x.n <= HTTP_EMBED_MAX_INPUTS);
	http_embed_free(&x);
}

static void sse(const char *p, size_t n)
{
	size_t need = http_sse_event(NULL, 0, p, n);
	char *out = malloc(need + 1), *back = malloc(n + 1);
	size_t b = 0, i = 0, lines = 0;

	CHECK(out && back);
	CHECK(http_sse_event(out, need, p, n) == need);
	CHECK(need >= 8 && memcmp(out, "data: ", 6) == 0);
	CHECK(out[need - 1] == '\n' && out[need - 2] == '\n');
	/* parse back: lines "data: X\n" until the blank line */
	while (i < need - 1) {
		CHECK(memcmp(out + i, "data: ", 6) == 0);
		i += 6;
		if (lines++)
			back[b++] = '\n';
		while (out[i] != '\n') {
			CHECK(out[i] != '\r');
			back[b++] = out[i++];
		}
		i++;
	}
	CHECK(i == need - 1);
	/* the input with CRLF / CR as LF */
	size_t k = 0;
	for (size_t j = 0; j < n; j++) {
		char c = p[j];
		if (c == '\r') {
			if (j + 1 < n && p[j + 1] == '\n')
				j++;
			c = '\n';
		}
		CHECK(k < b && back[k] == c);
		k++;
	}
	CHECK(k == b);
	free(out);
	free(back);
}

static void head(const char *p, size_t n)
{
	struct http_head h;
	int st = 0;
	const char *why = NULL;
	long r = http_parse_head(p, n, &h, &st, &why);

	if (r < 0) {
		CHECK(r == -1 && why != NULL);
		CHECK(st == 400 || st == 411 || st == 417 || st == 501 || st == 505);
		return;
	}
	if (r == 0)
		return;
	CHECK((size_t)r <= n && r >= 4 && memcmp(p + r - 4, "\r\n\r\n", 4) == 0);
	CHECK(h.path >= p && h.path + h.path_len <= p + r && h.path[0] == '/');
	CHECK(h.minor == 0 || h.minor == 1);
	if (h.auth)
		CHECK(h.auth >= p && h.auth + h.auth_len <= p + r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const char *p = (const char *)data + 1;
	size_t n = size - 1;

	switch (data[0] % 5) {
	case 0: gen(HTTP_CHAT, p, n); break;
	case 1: gen(HTTP_COMPLETION, p, n); break;
	case 2: embed(p, n); break;
	case 3: sse(p, n); break;
	default: head(p, n); break;
	}
	return 0;
}
