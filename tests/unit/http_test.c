/* http_test.c - gpud-http's pure parts: the request-head parser (every
 * refusal with its status), the JSON request decoders (parameters,
 * messages to role segments, the swarm mask extension, errors naming the
 * parameter), the response and chunk JSON, the error shape, SSE framing,
 * base64, and the API key file and check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http/api.h"
#include "proto/frame.h"
#include "http/parse.h"
#include "http/server.h"

static long head(const char *s, struct http_head *h, int *st)
{
	const char *why;
	return http_parse_head(s, strlen(s), h, st, &why);
}

static void test_parse_ok(void **state)
{
	(void)state;
	struct http_head h;
	int st = 0;
	const char *r = "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\n"
			"Content-Length:  12 \r\nAuthorization: Bearer k\r\n"
			"Expect: 100-continue\r\n\r\n{\"a\":1}";
	long n = head(r, &h, &st);
	assert_int_equal(n, (long)(strstr(r, "\r\n\r\n") - r + 4));
	assert_string_equal(h.method, "POST");
	assert_true(http_path_is(&h, "/v1/chat/completions"));
	assert_int_equal(h.minor, 1);
	assert_true(h.has_length);
	assert_int_equal(h.content_length, 12);
	assert_true(h.keep_alive);
	assert_true(h.expect_continue);
	assert_int_equal(h.auth_len, 8);
	assert_memory_equal(h.auth, "Bearer k", 8);

	/* incomplete: 0, for every prefix */
	for (size_t i = 0; i < strlen(r) - 10; i++) {
		const char *why;
		if (i < (size_t)n)
			assert_int_equal(http_parse_head(r, i, &h, &st, &why), 0);
	}
	assert_true(head("GET /health HTTP/1.0\r\n\r\n", &h, &st) > 0);
	assert_false(h.keep_alive);
	assert_true(head("GET /health HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &h, &st) > 0);
	assert_true(h.keep_alive);
	assert_true(head("GET /health HTTP/1.1\r\nConnection: foo, close\r\n\r\n", &h, &st) > 0);
	assert_false(h.keep_alive);
	assert_true(head("GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", &h,
			 &st) > 0);
	assert_true(head("\r\nGET / HTTP/1.1\r\n\r\n", &h, &st) > 0);
}

static void test_parse_refusals(void **state)
{
	(void)state;
	static const struct { const char *req; int status; } bad[] = {
		{ "GET /\nHost: a\r\n\r\n", 400 },                      /* bare LF */
		{ "GET / HTTP/1.1\r\nHost a\r\n\r\n", 400 },             /* no colon */
		{ "GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400 },           /* space before colon */
		{ "GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", 400 },         /* obs-fold */
		{ "GET / HTTP/1.1\r\nA: b\x01\r\n\r\n", 400 },           /* control */
		{ "GET / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400 },
		{ "GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400 },
		{ "GET / HTTP/1.1\r\nContent-Length: 1234567890123456\r\n\r\n", 400 },
		{ "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411 },
		{ "GET / HTTP/1.1\r\nExpect: magic\r\n\r\n", 417 },
		{ "GET / HTTP/2.0\r\n\r\n", 505 },
		{ "GET / FTP/1.1\r\n\r\n", 400 },
		{ "GET x HTTP/1.1\r\n\r\n", 400 },                       /* not origin-form */
		{ "GET /a b HTTP/1.1\r\n\r\n", 400 },
		{ "G(T / HTTP/1.1\r\n\r\n", 400 },
		{ "VERYLONGMETHODNAME / HTTP/1.1\r\n\r\n", 501 },
		{ "GET / HTTP/1.1\r\nA: 1\r\nAuthorization: x\r\nAuthorization: y\r\n\r\n", 400 },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct http_head h;
		int st = 0;
		const char *why = NULL;
		long n = http_parse_head(bad[i].req, strlen(bad[i].req), &h, &st, &why);
		if (n != -1 || st != bad[i].status)
			fail_msg("case %zu: got %ld/%d, want -1/%d", i, n, st, bad[i].status);
		assert_non_null(why);
	}
	/* A NUL is refused before the head is complete. */
	struct http_head h;
	int st;
	const char *why;
	assert_int_equal(http_parse_head("GET /\0", 6, &h, &st, &why), -1);
}

static void test_decode_completion(void **state)
{
	(void)state;
	struct http_gen *g = calloc(1, sizeof(*g));
	struct http_err e;
	const char *b = "{\"model\":\"m\",\"prompt\":\"hi\",\"max_tokens\":7,\"temperature\":0.5,"
			"\"top_p\":0.9,\"seed\":42,\"stop\":\"x\",\"stream\":true,"
			"\"stream_options\":{\"include_usage\":true},\"user\":\"ignored\",\"n\":1}";

	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_string_equal(g->model, "m");
	assert_int_equal(g->req.n_segments, 1);
	assert_int_equal(g->req.segments[0].len, 2);
	assert_memory_equal(g->req.segments[0].text, "hi", 2);
	assert_int_equal(g->req.max_tokens, 7);
	assert_true(g->req.sampling.temperature == 0.5f);
	assert_true(g->req.sampling.top_p == 0.9f);
	assert_int_equal(g->req.sampling.seed, 42);
	assert_int_equal(g->req.n_stop, 1);
	assert_memory_equal(g->req.stop[0].p, "x", 1);
	assert_true(g->stream);
	assert_true(g->include_usage);
	assert_false(g->no_reasoning);
	assert_null(g->req.mask);
	assert_int_equal(g->req.flags & PROTO_SUBMIT_CHAT, 0);
	assert_int_equal(g->n, 1);
	http_gen_free(g);
	b = "{\"model\":\"m\",\"prompt\":\"p\",\"n\":16,\"stream\":false}";
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_int_equal(g->n, 16);
	http_gen_free(g);
	b = "{\"model\":\"m\",\"prompt\":\"p\",\"reasoning_format\":\"none\"}";
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_true(g->no_reasoning);
	http_gen_free(g);
	b = "{\"model\":\"m\",\"prompt\":\"p\",\"reasoning_format\":\"deepseek\"}";
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_false(g->no_reasoning);
	http_gen_free(g);

	/* defaults: max_tokens 16, temperature 1, prompt as a one-string array */
	b = "{\"model\":\"m\",\"prompt\":[\"p\"]}";
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_int_equal(g->req.max_tokens, 16);
	assert_true(g->req.sampling.temperature == 1.0f);
	assert_false(g->stream);
	http_gen_free(g);

	/* max_completion_tokens wins */
	b = "{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":5,\"max_completion_tokens\":9}";
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_int_equal(g->req.max_tokens, 9);
	http_gen_free(g);

	/* the swarm extension: segments and visibility */
	b = "{\"model\":\"m\",\"prompt\":\"abc\",\"swarm\":{\"segments\":[\"a\",\"b\",\"c\"],"
	    "\"visibility\":[[0],[1],[0,2],[0,2,3]]}}";
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_int_equal(g->req.n_segments, 3);
	assert_non_null(g->req.mask);
	assert_int_equal(g->req.mask->n_segments, 3);
	assert_int_equal(g->req.mask->rows[1].n, 1);
	assert_int_equal(g->req.mask->rows[1].idx[0], 1);
	assert_int_equal(g->req.mask->rows[3].n, 3);
	assert_int_equal(g->req.mask->rows[3].idx[2], 3);
	size_t sz;
	char m[256];
	assert_int_equal(proto_submit_size(&g->req, &sz, m, sizeof(m)), 0);
	http_gen_free(g);
	free(g);
}

/* Token ids: each prompt shape, swarm.segments mixing ids and text, and
 * what echo asks of gpud for them. */
static void test_decode_token_ids(void **state)
{
	(void)state;
	struct http_gen *g = calloc(1, sizeof(*g));
	struct http_err e;
	const char *ok[] = { "{\"model\":\"m\",\"prompt\":[1,15043,2147483647]}",
			     "{\"model\":\"m\",\"prompt\":[[1,15043,2147483647]]}" };
	size_t sz;
	char m[256];

	for (int k = 0; k < 2; k++) {
		assert_int_equal(http_gen_decode(HTTP_COMPLETION, ok[k], strlen(ok[k]), 64, g, &e),
				 0);
		assert_true(g->ids);
		assert_int_equal(g->req.n_segments, 1);
		assert_int_equal(g->req.segments[0].flags, PROTO_SEG_IDS);
		assert_int_equal(g->req.segments[0].len, 12);
		const uint8_t *p = (const uint8_t *)g->req.segments[0].text;
		assert_int_equal(proto_get32(p), 1);
		assert_int_equal(proto_get32(p + 4), 15043);
		assert_int_equal(proto_get32(p + 8), 2147483647);
		assert_int_equal(g->req.flags, 0);
		assert_int_equal(proto_submit_size(&g->req, &sz, m, sizeof(m)), 0);
		http_gen_free(g);
	}
	/* segments: ids, text, ids; the prompt may be their ids only when
	 * every segment is ids, or "" */
	const char *b = "{\"model\":\"m\",\"prompt\":\"\",\"swarm\":{\"segments\":[[5,6],\"x\","
			"[7]],\"visibility\":[[0],[1],[0,2],[0,1,2,3]]}}";
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_int_equal(g->req.n_segments, 3);
	assert_int_equal(g->req.segments[0].flags, PROTO_SEG_IDS);
	assert_int_equal(g->req.segments[0].len, 8);
	assert_int_equal(g->req.segments[1].flags, 0);
	assert_memory_equal(g->req.segments[1].text, "x", 1);
	assert_int_equal(g->req.segments[2].flags, PROTO_SEG_IDS);
	assert_int_equal(proto_get32((const uint8_t *)g->req.segments[2].text), 7);
	assert_non_null(g->req.mask);
	assert_int_equal(proto_submit_size(&g->req, &sz, m, sizeof(m)), 0);
	http_gen_free(g);
	b = "{\"model\":\"m\",\"prompt\":[5,6,7],\"swarm\":{\"segments\":[[5,6],[7]]}}";
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	http_gen_free(g);
	/* echo of ids asks for the prompt's records (their pieces are its
	 * text), log probabilities or not */
	b = "{\"model\":\"m\",\"prompt\":[5,6],\"echo\":true}";
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_int_equal(g->req.flags, PROTO_SUBMIT_LOGPROBS | PROTO_SUBMIT_PROMPT_LOGPROBS);
	assert_false(g->logprobs);
	http_gen_free(g);
	b = "{\"model\":\"m\",\"prompt\":\"ab\",\"echo\":true}";
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_int_equal(g->req.flags, 0);
	http_gen_free(g);
	free(g);
}

static void test_decode_chat(void **state)
{
	(void)state;
	struct http_gen *g = calloc(1, sizeof(*g));
	struct http_err e;
	const char *b = "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"sys\"},"
			"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
			"{\"type\":\"text\",\"text\":\"bc\"}]},{\"role\":\"assistant\",\"content\":null},"
			"{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"d\"}]}],"
			"\"swarm\":{\"visibility\":[[0],[0,1],[0,1,2],[3],[0,3,4]]}}";

	assert_int_equal(http_gen_decode(HTTP_CHAT, b, strlen(b), 64, g, &e), 0);
	assert_true(g->req.flags & PROTO_SUBMIT_CHAT);
	assert_int_equal(g->req.n_segments, 4);
	assert_int_equal(g->seg[0].role, PROTO_ROLE_SYSTEM);
	assert_int_equal(g->seg[1].role, PROTO_ROLE_USER);
	assert_int_equal(g->seg[1].len, 3);
	assert_memory_equal(g->seg[1].text, "abc", 3);
	assert_int_equal(g->seg[2].role, PROTO_ROLE_ASSISTANT);
	assert_int_equal(g->seg[2].len, 0);
	assert_int_equal(g->seg[3].len, 1);
	assert_memory_equal(g->seg[3].text, "d", 1); /* survives the parts buffer growing */
	assert_memory_equal(g->seg[1].text, "abc", 3);
	assert_int_equal(g->req.max_tokens, 4096);
	assert_non_null(g->req.mask);
	http_gen_free(g);
	free(g);
}

static void expect_400(enum http_kind k, const char *b, const char *param)
{
	struct http_gen *g = calloc(1, sizeof(*g));
	struct http_err e;

	memset(&e, 0, sizeof(e));
	if (http_gen_decode(k, b, strlen(b), 64, g, &e) != -1)
		fail_msg("accepted: %s", b);
	assert_int_equal(e.status, 400);
	if (strcmp(e.param, param) != 0)
		fail_msg("%s: param \"%s\", want \"%s\" (%s)", b, e.param, param, e.msg);
	assert_true(e.msg[0] != '\0');
	http_gen_free(g);
	free(g);
}

/* vLLM's and llama.cpp's sampling extras, and what is refused by name
 * rather than ignored. */
static void test_decode_extras(void **state)
{
	(void)state;
	struct http_gen *g = calloc(1, sizeof(*g));
	struct http_err e;
	const char *b = "{\"model\":\"m\",\"prompt\":\"p\",\"top_k\":40,\"min_p\":0.05,"
			"\"repetition_penalty\":1.3,\"response_format\":{\"type\":\"text\"},"
			"\"tool_choice\":\"none\",\"modalities\":[\"text\"]}";

	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_int_equal(g->req.sampling.top_k, 40);
	assert_true(g->req.sampling.min_p == 0.05f);
	assert_true(g->req.sampling.repeat_penalty == 1.3f);
	assert_int_equal(g->req.sampling.penalty_last_n, 256);
	http_gen_free(g);
	b = "{\"model\":\"m\",\"prompt\":\"p\",\"repeat_penalty\":0.9,\"top_k\":-1}";
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_true(g->req.sampling.repeat_penalty == 0.9f);
	assert_int_equal(g->req.sampling.top_k, -1);
	http_gen_free(g);
	b = "{\"model\":\"m\",\"prompt\":\"p\"}"; /* defaults: every extra off */
	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_true(g->req.sampling.top_k <= 0);
	assert_true(g->req.sampling.min_p == 0.0f);
	assert_true(g->req.sampling.repeat_penalty == 1.0f);
	assert_int_equal(g->req.sampling.penalty_last_n, 0);
	http_gen_free(g);
	free(g);
	const struct {
		const char *extra, *param;
	} bad[] = {
		{ "\"top_k\":2.5", "top_k" },
		{ "\"top_k\":-2", "top_k" },
		{ "\"min_p\":1.5", "min_p" },
		{ "\"repetition_penalty\":0", "repetition_penalty" },
		{ "\"repeat_penalty\":11", "repeat_penalty" },
		{ "\"response_format\":{\"type\":\"json_object\"}", "response_format" },
		{ "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{}}",
		  "response_format" },
		{ "\"response_format\":\"text\"", "response_format" },
		{ "\"functions\":[{\"name\":\"f\"}]", "functions" },
		{ "\"function_call\":\"auto\"", "function_call" },
		{ "\"tool_choice\":\"required\"", "tool_choice" },
		{ "\"tool_choice\":{\"type\":\"function\"}", "tool_choice" },
		{ "\"audio\":{\"voice\":\"alloy\"}", "audio" },
		{ "\"modalities\":[\"text\",\"audio\"]", "modalities" },
		{ "\"modalities\":\"text\"", "modalities" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char body[256];
		snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":\"p\",%s}", bad[i].extra);
		expect_400(HTTP_COMPLETION, body, bad[i].param);
	}
}

/* logit_bias: string keys of token ids to biases in [-100, 100]. */
static void test_decode_bias(void **state)
{
	(void)state;
	struct http_gen *g = calloc(1, sizeof(*g));
	struct http_err e;
	const char *b = "{\"model\":\"m\",\"prompt\":\"p\",\"logit_bias\":{\"50256\":-100,"
			"\"7\":2.5,\"0\":100}}";

	assert_int_equal(http_gen_decode(HTTP_COMPLETION, b, strlen(b), 64, g, &e), 0);
	assert_int_equal(g->req.n_bias, 3);
	assert_int_equal(g->req.bias[0].id, 50256);
	assert_true(g->req.bias[0].bias == -100.0f);
	assert_int_equal(g->req.bias[1].id, 7);
	assert_true(g->req.bias[1].bias == 2.5f);
	assert_int_equal(g->req.bias[2].id, 0);
	size_t sz;
	char m[256];
	assert_int_equal(proto_submit_size(&g->req, &sz, m, sizeof(m)), 0);
	http_gen_free(g);
	b = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
	    "\"logit_bias\":{}}";
	assert_int_equal(http_gen_decode(HTTP_CHAT, b, strlen(b), 64, g, &e), 0);
	assert_int_equal(g->req.n_bias, 0);
	assert_null(g->req.bias);
	http_gen_free(g);
	free(g);
	const char *bad[] = { "[1]", "{\"x\":1}", "{\"-1\":1}", "{\"1a\":1}", "{\"\":1}",
			      "{\" 1\":1}", "{\"2147483648\":1}", "{\"1\":100.5}",
			      "{\"1\":\"1\"}", "{\"1\":true}" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char body[256];
		snprintf(body, sizeof(body), "{\"model\":\"m\",\"prompt\":\"p\",\"logit_bias\":%s}",
			 bad[i]);
		expect_400(HTTP_COMPLETION, body, "logit_bias");
	}
}

/* /tokenize bodies: vLLM's and llama.cpp's names, their defaults. */
static void test_tok_decode(void **state)
{
	(void)state;
	struct http_tok t;
	struct http_err e;
	const char *b = "{\"model\":\"m\",\"prompt\":\"Hello\"}";

	assert_int_equal(http_tok_decode(b, strlen(b), &t, &e), 0);
	assert_string_equal(t.model, "m");
	assert_int_equal(t.len, 5);
	assert_memory_equal(t.text, "Hello", 5);
	assert_true(t.add_special);
	http_tok_free(&t);
	b = "{\"content\":\"\",\"add_special\":false}";
	assert_int_equal(http_tok_decode(b, strlen(b), &t, &e), 0);
	assert_null(t.model);
	assert_int_equal(t.len, 0);
	assert_false(t.add_special);
	http_tok_free(&t);
	b = "{\"prompt\":\"x\",\"add_special_tokens\":false}";
	assert_int_equal(http_tok_decode(b, strlen(b), &t, &e), 0);
	assert_false(t.add_special);
	http_tok_free(&t);
	const struct {
		const char *body, *param;
	} bad[] = {
		{ "{}", "prompt" },
		{ "{\"prompt\":[1]}", "prompt" },
		{ "{\"prompt\":\"x\",\"model\":3}", "model" },
		{ "{\"prompt\":\"x\",\"add_special\":1}", "add_special" },
		{ "{\"prompt\":\"x\",\"messages\":[]}", "messages" },
		{ "[", "" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&e, 0, sizeof(e));
		assert_int_equal(http_tok_decode(bad[i].body, strlen(bad[i].body), &t, &e), -1);
		assert_int_equal(e.status, 400);
		if (strcmp(e.param, bad[i].param))
			fail_msg("%s: param \"%s\", want \"%s\"", bad[i].body, e.param, bad[i].param);
		assert_null(t.root);
	}
}

/* /detokenize bodies. */
static void test_detok_decode(void **state)
{
	(void)state;
	struct http_detok t;
	struct http_err e;
	const char *b = "{\"model\":\"m\",\"tokens\":[1,2,2147483647]}";

	assert_int_equal(http_detok_decode(b, strlen(b), &t, &e), 0);
	assert_string_equal(t.model, "m");
	assert_int_equal(t.n, 3);
	assert_int_equal(t.ids[2], 2147483647);
	assert_true(t.special);
	http_detok_free(&t);
	b = "{\"tokens\":[],\"skip_special_tokens\":true}";
	assert_int_equal(http_detok_decode(b, strlen(b), &t, &e), 0);
	assert_int_equal(t.n, 0);
	assert_false(t.special);
	http_detok_free(&t);
	const struct {
		const char *body, *param;
	} bad[] = {
		{ "{}", "tokens" },
		{ "{\"tokens\":\"1 2\"}", "tokens" },
		{ "{\"tokens\":[1,-1]}", "tokens" },
		{ "{\"tokens\":[1,2.0]}", "tokens" },
		{ "{\"tokens\":[2147483648]}", "tokens" },
		{ "{\"tokens\":[1],\"skip_special_tokens\":0}", "skip_special_tokens" },
		{ "{\"tokens\":[1],\"model\":[]}", "model" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		memset(&e, 0, sizeof(e));
		assert_int_equal(http_detok_decode(bad[i].body, strlen(bad[i].body), &t, &e), -1);
		assert_int_equal(e.status, 400);
		if (strcmp(e.param, bad[i].param))
			fail_msg("%s: param \"%s\", want \"%s\"", bad[i].body, e.param, bad[i].param);
		assert_null(t.root);
		assert_null(t.ids);
	}
}

static void test_decode_errors(void **state)
{
	(void)state;
	expect_400(HTTP_COMPLETION, "{bad", "");
	expect_400(HTTP_COMPLETION, "[1]", "");
	expect_400(HTTP_COMPLETION, "{\"prompt\":\"p\"}", "model");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\"}", "prompt");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":[]}", "prompt");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,-2]}", "prompt");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,\"a\"]}", "prompt");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":[[1],[2]]}", "prompt");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":[[]]}", "prompt");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"a\",1]}", "prompt");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"swarm\":{\"segments\":[[1],[]]}}",
		   "swarm.segments");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"swarm\":{\"segments\":[[1,1.5]]}}",
		   "swarm.segments");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,3],"
		   "\"swarm\":{\"segments\":[[1],[2]]}}", "prompt");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":[1,2],"
		   "\"swarm\":{\"segments\":[[1],\"x\"]}}", "prompt");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\"]}", "prompt");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"n\":0}", "n");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"n\":17}", "n");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"n\":1.5}", "n");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"n\":2,\"stream\":true}",
		   "n");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"best_of\":3}", "best_of");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"reasoning_format\":1}",
		   "reasoning_format");
	expect_400(HTTP_COMPLETION,
		   "{\"model\":\"m\",\"prompt\":\"p\",\"reasoning_format\":\"hidden\"}",
		   "reasoning_format");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"echo\":1}", "echo");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"echo\":true,"
		   "\"stream\":true}", "echo");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
		   "\"echo\":true}", "echo");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
		   "\"max_tokens\":0}", "max_tokens");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"logprobs\":21}", "logprobs");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"logprobs\":true}",
		   "logprobs");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"logprobs\":-1}", "logprobs");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
		   "\"logprobs\":1}", "logprobs");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
		   "\"top_logprobs\":2}", "top_logprobs");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
		   "\"logprobs\":true,\"top_logprobs\":21}", "top_logprobs");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
		   "\"logprobs\":true,\"top_logprobs\":1.5}", "top_logprobs");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"temperature\":2.5}",
		   "temperature");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"temperature\":\"hot\"}",
		   "temperature");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"top_p\":0}", "top_p");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"max_tokens\":0}",
		   "max_tokens");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"max_completion_tokens\":-1}",
		   "max_completion_tokens");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"seed\":1.5}", "seed");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"stop\":[\"\"]}", "stop");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"stop\":[\"1\",\"2\",\"3\","
		   "\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}", "stop");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"stream\":1}", "stream");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"presence_penalty\":3}",
		   "presence_penalty");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"swarm\":1}", "swarm");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"swarm\":{\"mask\":1}}",
		   "swarm");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"swarm\":"
		   "{\"visibility\":[[0]]}}", "swarm.visibility");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"swarm\":"
		   "{\"visibility\":[[0],[0,2]]}}", "swarm.visibility");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"p\",\"swarm\":"
		   "{\"visibility\":[[0],[-1]]}}", "swarm.visibility");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"prompt\":\"xy\",\"swarm\":"
		   "{\"segments\":[\"a\",\"b\"]}}", "prompt");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"swarm\":{\"segments\":[]}}", "swarm.segments");
	expect_400(HTTP_COMPLETION, "{\"model\":\"m\",\"swarm\":{\"segments\":[1]}}", "swarm.segments");
	expect_400(HTTP_CHAT, "{\"model\":\"m\"}", "messages");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[]}", "messages");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[1]}", "messages");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"content\":\"a\"}]}",
		   "messages[0].role");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
		   "{\"role\":\"tool\",\"content\":\"a\"}]}", "messages[1].role");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
		   "[{\"type\":\"image_url\"}]}]}", "messages[0].content");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
		   "messages[0].content");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
		   "\"tools\":[{}]}", "tools");
	expect_400(HTTP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
		   "\"swarm\":{\"segments\":[\"a\"]}}", "swarm.segments");
	/* more messages than max_segments */
	char b[4096] = "{\"model\":\"m\",\"messages\":[";
	for (int i = 0; i < 65; i++)
		strcat(b, i ? ",{\"role\":\"user\",\"content\":\"a\"}" : "{\"role\":\"user\",\"content\":\"a\"}");
	strcat(b, "]}");
	expect_400(HTTP_CHAT, b, "messages");
}

static void test_embed_decode(void **state)
{
	(void)state;
	struct http_embed x;
	struct http_err e;
	const char *b = "{\"model\":\"m\",\"input\":[\"a\",\"bc\"],\"encoding_format\":\"base64\"}";

	assert_int_equal(http_embed_decode(b, strlen(b), &x, &e), 0);
	assert_int_equal(x.n, 2);
	assert_int_equal(x.len[1], 2);
	assert_true(x.base64);
	http_embed_free(&x);
	b = "{\"model\":\"m\",\"input\":\"a\"}";
	assert_int_equal(http_embed_decode(b, strlen(b), &x, &e), 0);
	assert_int_equal(x.n, 1);
	assert_false(x.base64);
	http_embed_free(&x);
	static const char *bad[][2] = {
		{ "{\"model\":\"m\"}", "input" },
		{ "{\"model\":\"m\",\"input\":[]}", "input" },
		{ "{\"model\":\"m\",\"input\":[[1,2]]}", "input" },
		{ "{\"model\":\"m\",\"input\":\"a\",\"encoding_format\":\"hex\"}", "encoding_format" },
		{ "{\"model\":\"m\",\"input\":\"a\",\"dimensions\":8}", "dimensions" },
		{ "{\"input\":\"a\"}", "model" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		assert_int_equal(http_embed_decode(bad[i][0], strlen(bad[i][0]), &x, &e), -1);
		assert_int_equal(e.status, 400);
		assert_string_equal(e.param, bad[i][1]);
	}
}

static void gen_free(struct http_gen *g)
{
	http_gen_free(g);
	free(g);
}

/* logprobs, top_logprobs and echo reach the submit flags. */
static void test_decode_logprobs(void **state)
{
	(void)state;
	static const struct {
		enum http_kind kind;
		const char *extra;
		bool on;
		uint32_t top;
	} cases[] = {
		{ HTTP_CHAT, "", false, 0 },
		{ HTTP_CHAT, ",\"logprobs\":false", false, 0 },
		{ HTTP_CHAT, ",\"logprobs\":true", true, 0 },
		{ HTTP_CHAT, ",\"logprobs\":true,\"top_logprobs\":20", true, 20 },
		{ HTTP_CHAT, ",\"logprobs\":false,\"top_logprobs\":0", false, 0 },
		{ HTTP_CHAT, ",\"logprobs\":null,\"top_logprobs\":null", false, 0 },
		{ HTTP_COMPLETION, "", false, 0 },
		{ HTTP_COMPLETION, ",\"logprobs\":null", false, 0 },
		{ HTTP_COMPLETION, ",\"logprobs\":0", true, 0 },
		{ HTTP_COMPLETION, ",\"logprobs\":5", true, 5 },
		{ HTTP_COMPLETION, ",\"logprobs\":1,\"echo\":true", true, 1 },
		{ HTTP_COMPLETION, ",\"logprobs\":1,\"echo\":true,\"max_tokens\":0", true, 1 },
		{ HTTP_COMPLETION, ",\"echo\":true,\"max_tokens\":0", false, 0 },
		{ HTTP_COMPLETION, ",\"echo\":true", false, 0 },
	};
	static const uint32_t echo_flags[] = {
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, PROTO_SUBMIT_PROMPT_LOGPROBS,
		PROTO_SUBMIT_PROMPT_LOGPROBS | PROTO_SUBMIT_PROMPT_ONLY,
		PROTO_SUBMIT_LOGPROBS | PROTO_SUBMIT_PROMPT_LOGPROBS | PROTO_SUBMIT_PROMPT_ONLY, 0,
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct http_gen *g = calloc(1, sizeof(*g));
		struct http_err e;
		char b[256];
		snprintf(b, sizeof(b), cases[i].kind == HTTP_CHAT ?
			 "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]%s}" :
			 "{\"model\":\"m\",\"prompt\":\"a\"%s}", cases[i].extra);
		assert_int_equal(http_gen_decode(cases[i].kind, b, strlen(b), 64, g, &e), 0);
		assert_int_equal(g->logprobs, cases[i].on);
		assert_int_equal(g->top_logprobs, cases[i].top);
		assert_int_equal(g->echo, strstr(cases[i].extra, "echo") != NULL);
		assert_int_equal(g->req.flags & (PROTO_SUBMIT_PROMPT_LOGPROBS | PROTO_SUBMIT_PROMPT_ONLY),
				 echo_flags[i] & (PROTO_SUBMIT_PROMPT_LOGPROBS | PROTO_SUBMIT_PROMPT_ONLY));
		if (echo_flags[i] & PROTO_SUBMIT_PROMPT_ONLY) {
			assert_int_equal(g->req.max_tokens, 0);
			gen_free(g);
			continue;
		}
		assert_int_equal(!!(g->req.flags & PROTO_SUBMIT_LOGPROBS), cases[i].on);
		assert_int_equal(PROTO_SUBMIT_TOP(g->req.flags), cases[i].top);
		assert_int_equal(!!(g->req.flags & PROTO_SUBMIT_CHAT), cases[i].kind == HTTP_CHAT);
		http_gen_free(g);
		free(g);
	}
}

/* Two TOKENS_LP records (the second's token the EOG that ended the
 * request), collected, then shaped as chat's and completions' logprobs. */
static void test_logprobs_json(void **state)
{
	(void)state;
	static uint8_t rec[2][512];
	/* token 5 " é" (whole UTF-8) with alternatives 6 "\xc3" (a part) and
	 * 7 " e" at -inf; then the EOG token 2 */
	const int32_t ids0[3] = { 5, 6, 7 }, ids1[3] = { 2, 5, 6 };
	const float lps0[3] = { -0.25f, -1.5f, -INFINITY }, lps1[3] = { -0.125f, -3, -4 };
	const uint16_t pl0[3] = { 3, 1, 2 }, pl1[3] = { 5, 3, 1 };
	struct proto_tokens t[2];
	size_t len[2];
	struct http_lpbuf b = { .max = 1 << 20 };

	assert_int_equal(proto_tokens_lp_encode(rec[0], sizeof(rec[0]), 1, 2, ids0, lps0, pl0,
						" \xc3\xa9\xc3 e", 6, " \xc3\xa9", 3, 0, &len[0]), 0);
	assert_int_equal(proto_tokens_lp_encode(rec[1], sizeof(rec[1]), 1, 2, ids1, lps1, pl1,
						"</s> \xc3\xa9\xc3", 9, NULL, 0, PROTO_LP_EOG,
						&len[1]), 0);
	for (int k = 0; k < 2; k++) {
		assert_int_equal(proto_tokens_lp_decode(rec[k], len[k], NULL, &t[k], NULL, 0), 0);
		assert_int_equal(http_lp_collect(&b, &t[k]), 0);
	}
	size_t one = b.n; /* the EOG token added nothing */
	assert_int_equal(one, 1 + 3 * 6 + 6);
	/* a plain batch adds nothing; a bound too small changes nothing */
	struct proto_tokens plain = { 0 };
	assert_int_equal(http_lp_collect(&b, &plain), 0);
	b.max = b.n + 10;
	assert_int_equal(http_lp_collect(&b, &t[0]), -1);
	assert_int_equal(b.n, one);
	/* another buffer's entries appended within the same bound */
	{
		struct http_lpbuf a = { .max = 2 * one };
		assert_int_equal(http_lpbuf_append(&a, b.p, one), 0);
		assert_int_equal(http_lpbuf_append(&a, b.p, one), 0);
		assert_int_equal(http_lpbuf_append(&a, b.p, 1), -1);
		assert_int_equal(a.n, 2 * one);
		assert_memory_equal(a.p + one, b.p, one);
		free(a.p);
	}

	size_t off = 0;
	json_t *o = http_logprobs_json(HTTP_CHAT, b.p, b.n, &off);
	char *s = json_dumps(o, JSON_COMPACT);
	assert_string_equal(s, "{\"content\":[{\"token\":\" \u00e9\",\"logprob\":-0.25,"
			       "\"bytes\":[32,195,169],\"top_logprobs\":[{\"token\":\"bytes:\\\\xc3\","
			       "\"logprob\":-1.5,\"bytes\":[195]},{\"token\":\" e\",\"logprob\":"
			       "-9999.0,\"bytes\":[32,101]}]}],\"refusal\":null}");
	free(s);
	json_decref(o);
	/* completions: the offsets go on from where the last chunk ended */
	off = 10;
	o = http_logprobs_json(HTTP_COMPLETION, b.p, b.n, &off);
	s = json_dumps(o, JSON_COMPACT);
	assert_string_equal(s, "{\"tokens\":[\" \u00e9\"],\"token_logprobs\":[-0.25],"
			       "\"top_logprobs\":[{\"bytes:\\\\xc3\":-1.5,\" e\":-9999.0}],"
			       "\"text_offset\":[10]}");
	assert_int_equal(off, 12); /* " é": two characters */
	free(s);
	json_decref(o);
	/* nothing collected: empty lists */
	o = http_logprobs_json(HTTP_CHAT, NULL, 0, &off);
	s = json_dumps(o, JSON_COMPACT);
	assert_string_equal(s, "{\"content\":[],\"refusal\":null}");
	free(s);
	json_decref(o);
	/* a prompt's first token (echo): no number, no alternatives; null */
	{
		static uint8_t pr[256];
		const int32_t pids[3] = { 1, -1, -1 };
		const float plps[3] = { NAN, NAN, NAN };
		const uint16_t ppl[3] = { 0, 0, 0 };
		struct proto_tokens pt;
		struct http_lpbuf pb = { .max = 1 << 20 };
		size_t plen_ = 0, poff = 0;

		assert_int_equal(proto_tokens_lp_encode(pr, sizeof(pr), 1, 2, pids, plps, ppl, NULL, 0,
							NULL, 0, PROTO_LP_PROMPT, &plen_), 0);
		assert_int_equal(proto_tokens_lp_decode(pr, plen_, NULL, &pt, NULL, 0), 0);
		assert_int_equal(http_lp_collect(&pb, &pt), 0);
		assert_int_equal(http_lp_collect(&pb, &t[0]), 0);
		o = http_logprobs_json(HTTP_COMPLETION, pb.p, pb.n, &poff);
		s = json_dumps(o, JSON_COMPACT);
		assert_string_equal(s, "{\"tokens\":[\"\",\" \u00e9\"],\"token_logprobs\":[null,-0.25],"
				       "\"top_logprobs\":[null,{\"bytes:\\\\xc3\":-1.5,\" e\":-9999.0}],"
				       "\"text_offset\":[0,0]}");
		free(s);
		json_decref(o);
		free(pb.p);
	}
	/* in a response and a chunk */
	struct proto_done u = { .generated_tokens = 2, .stop_reason = PROTO_STOP_EOG };
	s = http_completion_json(HTTP_CHAT, "c", 1, "m", " \xc3\xa9", 3, NULL, 0,
				 http_logprobs_json(HTTP_CHAT, b.p, b.n, &off), &u);
	assert_non_null(strstr(s, "\"logprobs\":{\"content\":[{\"token\":\" \u00e9\""));
	free(s);
	s = http_chunk_json(HTTP_COMPLETION, "c", 1, "m", " \xc3\xa9", 3, NULL, 0, false, NULL,
			    http_logprobs_json(HTTP_COMPLETION, b.p, b.n, &off), NULL);
	assert_non_null(strstr(s, "\"logprobs\":{\"tokens\":[\" \u00e9\"]"));
	free(s);
	/* the usage chunk drops what it was given */
	s = http_chunk_json(HTTP_COMPLETION, "c", 1, "m", "", 0, NULL, 0, false, NULL,
			    http_logprobs_json(HTTP_COMPLETION, b.p, b.n, &off), &u);
	assert_non_null(strstr(s, "\"choices\":[]"));
	free(s);
	free(b.p);
}

static void test_json_out(void **state)
{
	(void)state;
	struct proto_done u = { .prompt_tokens = 5, .cached_prompt_tokens = 2,
				.generated_tokens = 3, .stop_reason = PROTO_STOP_MAX_TOKENS };
	char *s = http_completion_json(HTTP_CHAT, "chatcmpl-1", 7, "m", "hi \"x\"\n", 7, NULL, 0, NULL,
				       &u);
	assert_string_equal(s, "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":7,"
			       "\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
			       "\"assistant\",\"content\":\"hi \\\"x\\\"\\n\"},\"logprobs\":null,"
			       "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":5,"
			       "\"completion_tokens\":3,\"total_tokens\":8,\"prompt_tokens_details\":"
			       "{\"cached_tokens\":2}}}");
	free(s);
	u.stop_reason = PROTO_STOP_EOG;
	s = http_completion_json(HTTP_COMPLETION, "cmpl-1", 7, "m", "ab", 2, NULL, 0, NULL, &u);
	assert_non_null(strstr(s, "\"object\":\"text_completion\""));
	assert_non_null(strstr(s, "\"text\":\"ab\""));
	assert_non_null(strstr(s, "\"finish_reason\":\"stop\""));
	free(s);
	assert_string_equal(http_finish_reason(PROTO_STOP_STRING), "stop");
	/* a reasoning model's answer: reasoning_content beside the content */
	s = http_completion_json(HTTP_CHAT, "chatcmpl-2", 7, "m", "4", 1, "2+2", 3, NULL, &u);
	assert_non_null(strstr(s, "\"message\":{\"role\":\"assistant\",\"content\":\"4\","
				  "\"reasoning_content\":\"2+2\"}"));
	free(s);
	s = http_chunk_json(HTTP_CHAT, "c", 1, "m", "", 0, NULL, 0, true, NULL, NULL, NULL);
	assert_non_null(strstr(s, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}"));
	assert_non_null(strstr(s, "\"finish_reason\":null"));
	free(s);
	s = http_chunk_json(HTTP_CHAT, "c", 1, "m", NULL, 0, "hm", 2, false, NULL, NULL, NULL);
	assert_non_null(strstr(s, "\"delta\":{\"reasoning_content\":\"hm\"}"));
	free(s);
	s = http_chunk_json(HTTP_CHAT, "c", 1, "m", "ok", 2, "m.", 2, false, NULL, NULL, NULL);
	assert_non_null(strstr(s, "\"delta\":{\"content\":\"ok\",\"reasoning_content\":\"m.\"}"));
	free(s);
	s = http_chunk_json(HTTP_CHAT, "c", 1, "m", "", 0, NULL, 0, false, "stop", NULL, NULL);
	assert_non_null(strstr(s, "\"delta\":{}"));
	assert_non_null(strstr(s, "\"finish_reason\":\"stop\""));
	free(s);
	s = http_chunk_json(HTTP_COMPLETION, "c", 1, "m", "", 0, NULL, 0, false, NULL, NULL, &u);
	assert_non_null(strstr(s, "\"choices\":[]"));
	assert_non_null(strstr(s, "\"usage\":{"));
	free(s);

	/* invalid UTF-8 (a batch ending inside a character) becomes U+FFFD */
	s = http_chunk_json(HTTP_COMPLETION, "c", 1, "m", "a\xe2\x82", 3, NULL, 0, false, NULL, NULL,
			    NULL);
	assert_non_null(s);
	assert_non_null(strstr(s, "\"text\":\"a\xef\xbf\xbd\xef\xbf\xbd\""));
	free(s);

	struct http_err e;
	/* a message quoting the client's invalid bytes still makes JSON */
	http_fail(&e, 400, NULL, NULL, "near '\xff\xfe'");
	s = http_error_json(&e);
	assert_non_null(s);
	assert_non_null(strstr(s, "near '?" "?'"));
	free(s);
	http_fail(&e, 429, NULL, "busy", "slow %d", 1);
	s = http_error_json(&e);
	assert_string_equal(s, "{\"error\":{\"message\":\"slow 1\",\"type\":\"rate_limit_error\","
			       "\"param\":null,\"code\":\"busy\"}}");
	free(s);
	http_fail(&e, 400, "n", NULL, "x");
	s = http_error_json(&e);
	assert_non_null(strstr(s, "\"type\":\"invalid_request_error\",\"param\":\"n\",\"code\":null"));
	free(s);
}

static void test_sse(void **state)
{
	(void)state;
	char out[256];
	static const struct { const char *in; const char *want; } cases[] = {
		{ "{}", "data: {}\n\n" },
		{ "", "data: \n\n" },
		{ "a\nb", "data: a\ndata: b\n\n" },
		{ "a\r\nb\rc", "data: a\ndata: b\ndata: c\n\n" },
		{ "a\n", "data: a\ndata: \n\n" },
		{ "\n\n", "data: \ndata: \ndata: \n\n" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t n = http_sse_event(out, sizeof(out), cases[i].in, strlen(cases[i].in));
		assert_int_equal(n, strlen(cases[i].want));
		assert_memory_equal(out, cases[i].want, n);
		assert_int_equal(http_sse_event(NULL, 0, cases[i].in, strlen(cases[i].in)), n);
		/* a short buffer gets a prefix, never more */
		memset(out, '#', sizeof(out));
		http_sse_event(out, 3, cases[i].in, strlen(cases[i].in));
		assert_int_equal(out[3], '#');
	}
}

static void test_base64(void **state)
{
	(void)state;
	char out[16];
	assert_int_equal(http_base64((const uint8_t *)"", 0, out), 0);
	http_base64((const uint8_t *)"f", 1, out);
	assert_string_equal(out, "Zg==");
	http_base64((const uint8_t *)"fo", 2, out);
	assert_string_equal(out, "Zm8=");
	http_base64((const uint8_t *)"foo", 3, out);
	assert_string_equal(out, "Zm9v");
	http_base64((const uint8_t *)"foobar", 6, out);
	assert_string_equal(out, "Zm9vYmFy");
}

static void test_keys(void **state)
{
	(void)state;
	char path[] = "/tmp/http-keys-XXXXXX", err[1024];
	char **keys;
	size_t n;
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, "# c\n  sk-a  \n\nsk-b\r\n", 20), 20);
	close(fd);
	chmod(path, 0640);
	assert_int_equal(http_keys_load(path, geteuid(), &keys, &n, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "0600"));
	chmod(path, 0600);
	assert_int_equal(http_keys_load(path, geteuid(), &keys, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 2);
	assert_string_equal(keys[0], "sk-a");
	assert_string_equal(keys[1], "sk-b");
	assert_true(http_keys_check(keys, "Bearer sk-a", 11));
	assert_true(http_keys_check(keys, "bearer sk-b", 11));
	assert_false(http_keys_check(keys, "Bearer sk-", 10));
	assert_false(http_keys_check(keys, "Bearer sk-ab", 12));
	assert_false(http_keys_check(keys, "Basic sk-a", 10));
	assert_false(http_keys_check(keys, NULL, 0));
	http_keys_free(keys);
	/* as root: a file of another user only when it is the configured one */
	if (geteuid() == 0 && chown(path, 65534, 65534) == 0) {
		assert_int_equal(http_keys_load(path, geteuid(), &keys, &n, err, sizeof(err)), -EPERM);
		assert_int_equal(http_keys_load(path, 65534, &keys, &n, err, sizeof(err)), 0);
		http_keys_free(keys);
		assert_int_equal(chown(path, 0, 0), 0);
	}
	fd = open(path, O_WRONLY | O_TRUNC);
	assert_int_equal(write(fd, "# only a comment\n", 17), 17);
	close(fd);
	assert_int_equal(http_keys_load(path, geteuid(), &keys, &n, err, sizeof(err)), -EINVAL);
	unlink(path);
	assert_int_equal(http_keys_load("/nonexistent/keys", geteuid(), &keys, &n, err, sizeof(err)), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_ok),
		cmocka_unit_test(test_parse_refusals),
		cmocka_unit_test(test_decode_completion),
		cmocka_unit_test(test_decode_token_ids),
		cmocka_unit_test(test_decode_bias),
		cmocka_unit_test(test_decode_extras),
		cmocka_unit_test(test_tok_decode),
		cmocka_unit_test(test_detok_decode),
		cmocka_unit_test(test_decode_chat),
		cmocka_unit_test(test_decode_errors),
		cmocka_unit_test(test_embed_decode),
		cmocka_unit_test(test_decode_logprobs),
		cmocka_unit_test(test_logprobs_json),
		cmocka_unit_test(test_json_out),
		cmocka_unit_test(test_sse),
		cmocka_unit_test(test_base64),
		cmocka_unit_test(test_keys),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
