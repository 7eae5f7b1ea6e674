/* api.c - OpenAI-shaped JSON: request decoding, responses, errors, SSE
 * framing (http/api.h). */
#include "http/api.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/utf8.h"
#include "proto/frame.h"
#include "proto/mask.h"

int http_fail(struct http_err *e, int status, const char *param, const char *code,
	      const char *fmt, ...)
{
	va_list ap;

	e->status = status;
	snprintf(e->param, sizeof(e->param), "%s", param ? param : "");
	snprintf(e->code, sizeof(e->code), "%s", code ? code : "");
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
	va_end(ap);
	return -1;
}

static int bad(struct http_err *e, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static int bad(struct http_err *e, const char *param, const char *fmt, ...)
{
	va_list ap;
	char m[HTTP_MSG_MAX];

	va_start(ap, fmt);
	vsnprintf(m, sizeof(m), fmt, ap);
	va_end(ap);
	return http_fail(e, 400, param, "invalid_value", "%s", m);
}

static json_t *load(const char *body, size_t len, struct http_err *e)
{
	json_error_t je;
	json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);

	if (!root) {
		http_fail(e, 400, NULL, "invalid_json", "invalid JSON body: line %d, column %d: %s",
			  je.line, je.column, je.text);
		return NULL;
	}
	if (!json_is_object(root)) {
		json_decref(root);
		http_fail(e, 400, NULL, "invalid_json", "the body must be a JSON object");
		return NULL;
	}
	return root;
}

/* A member that is present and not null. */
static json_t *member(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_null(v) ? NULL : v;
}

static int number(json_t *root, const char *k, double lo, double hi, double *out,
		  struct http_err *e)
{
	json_t *v = member(root, k);

	if (!v)
		return 0;
	if (!json_is_number(v) || !isfinite(json_number_value(v)) ||
	    json_number_value(v) < lo || json_number_value(v) > hi)
		return bad(e, k, "%s: expected a number in [%g, %g]", k, lo, hi);
	*out = json_number_value(v);
	return 0;
}

static int model_of(json_t *root, const char **model, struct http_err *e)
{
	json_t *v = json_object_get(root, "model");

	if (!json_is_string(v) || !json_string_length(v))
		return http_fail(e, 400, "model", "missing_required_parameter",
				 "model: required, a string naming the served model (GET /v1/models)");
	*model = json_string_value(v);
	return 0;
}

/* Segment text from a string, or from an array of {"type":"text","text"}
 * parts (joined into g->parts). */
static int content_of(struct http_gen *g, json_t *c, const char *param, const char **text,
		      size_t *len, struct http_err *e)
{
	if (json_is_string(c)) {
		*text = json_string_value(c);
		*len = json_string_length(c);
		return 0;
	}
	if (json_is_null(c) || !c) {
		*text = "";
		*len = 0;
		return 0;
	}
	if (!json_is_array(c))
		return bad(e, param, "%s: expected a string or an array of text parts", param);
	size_t total = 0, i;
	json_t *part;
	json_array_foreach(c, i, part) {
		json_t *t = json_object_get(part, "type"), *x = json_object_get(part, "text");
		if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0 ||
		    !json_is_string(x))
			return bad(e, param, "%s[%zu]: only {\"type\": \"text\", \"text\": ...} parts "
				   "are supported", param, i);
		total += json_string_length(x);
	}
	/* g->parts is one buffer for every message's parts: grow it. The
	 * segments already pointing into it are re-pointed by the caller
	 * (content arrays are rare; recompute is simpler than offsets). */
	size_t old = g->parts ? strlen(g->parts) : 0;
	char *np = realloc(g->parts, old + total + 1);
	if (!np)
		return http_fail(e, 500, NULL, NULL, "out of memory");
	if (np != g->parts) {
		for (uint32_t s = 0; s < g->req.n_segments; s++)
			if (g->parts && g->seg[s].text >= g->parts && g->seg[s].text <= g->parts + old)
				g->seg[s].text = np + (g->seg[s].text - g->parts);
	}
	g->parts = np;
	size_t at = old;
	json_array_foreach(c, i, part) {
		json_t *x = json_object_get(part, "text");
		memcpy(np + at, json_string_value(x), json_string_length(x));
		at += json_string_length(x);
	}
	np[at] = '\0';
	*text = np + old;
	*len = total;
	return 0;
}

static int role_of(const char *r)
{
	if (strcmp(r, "system") == 0 || strcmp(r, "developer") == 0)
		return PROTO_ROLE_SYSTEM;
	if (strcmp(r, "user") == 0)
		return PROTO_ROLE_USER;
	if (strcmp(r, "assistant") == 0)
		return PROTO_ROLE_ASSISTANT;
	return -1;
}

static int decode_messages(struct http_gen *g, json_t *root, uint32_t max_segments,
			   struct http_err *e)
{
	json_t *msgs = json_object_get(root, "messages"), *m;
	size_t i;
	char param[HTTP_PARAM_MAX];

	if (!json_is_array(msgs) || json_array_size(msgs) == 0)
		return http_fail(e, 400, "messages", "missing_required_parameter",
				 "messages: required, a non-empty array of {role, content}");
	if (json_array_size(msgs) > max_segments)
		return bad(e, "messages", "messages: at most %u messages (gpud.max_segments)",
			   max_segments);
	json_array_foreach(msgs, i, m) {
		snprintf(param, sizeof(param), "messages[%zu].role", i);
		json_t *r = json_object_get(m, "role");
		if (!json_is_object(m))
			return bad(e, "messages", "messages[%zu]: expected an object", i);
		if (!json_is_string(r))
			return bad(e, param, "%s: required, a string", param);
		int role = role_of(json_string_value(r));
		if (role < 0)
			return bad(e, param, "%s: \"%s\" is not supported (system, developer, user, "
				   "assistant)", param, json_string_value(r));
		const char *text = "";
		size_t len = 0;
		snprintf(param, sizeof(param), "messages[%zu].content", i);
		if (content_of(g, json_object_get(m, "content"), param, &text, &len, e))
			return -1;
		if (len > UINT32_MAX)
			return bad(e, param, "%s: too long", param);
		g->seg[i] = (struct proto_segment){ .text = text, .len = (uint32_t)len,
						    .role = (uint8_t)role };
		g->req.n_segments = (uint32_t)i + 1;
	}
	g->req.flags |= PROTO_SUBMIT_CHAT;
	return 0;
}

/* A prompt's token ids: a non-empty JSON array whose first member is an
 * integer (the rest are checked as they are stored). */
static bool is_ids(json_t *a)
{
	return json_is_array(a) && json_array_size(a) > 0 &&
	       json_is_integer(json_array_get(a, 0));
}

/* Room in g->idbuf for every id of the arrays among the n values. */
static int ids_reserve(struct http_gen *g, json_t *const *v, size_t n, struct http_err *e)
{
	size_t total = 0;

	for (size_t i = 0; i < n; i++)
		if (is_ids(v[i]))
			total += json_array_size(v[i]);
	if (!total)
		return 0;
	g->idbuf = malloc(4 * total);
	if (!g->idbuf)
		return http_fail(e, 503, NULL, "out_of_memory", "out of memory");
	return 0;
}

/* Stores the ids of a (is_ids) at g->idbuf + *at as segment *seg (each
 * id little-endian; gpud checks them against the vocabulary). */
static int put_ids(struct http_gen *g, json_t *a, size_t *at, struct proto_segment *seg,
		   const char *param, const char *what, struct http_err *e)
{
	uint8_t *p = g->idbuf + *at;
	size_t k;
	json_t *x;

	json_array_foreach(a, k, x) {
		if (!json_is_integer(x) || json_integer_value(x) < 0 ||
		    json_integer_value(x) > INT32_MAX)
			return bad(e, param, "%s[%zu]: expected a token id (an integer >= 0)", what,
				   k);
		proto_put32(p + 4 * k, (uint32_t)json_integer_value(x));
	}
	*seg = (struct proto_segment){ .text = (const char *)p,
				       .len = (uint32_t)(4 * json_array_size(a)),
				       .flags = PROTO_SEG_IDS };
	*at += 4 * json_array_size(a);
	return 0;
}

/* With swarm.segments a standard client may still insist on a prompt: it
 * must then be the segments' concatenation, so both views agree (text
 * for text, the ids when every segment is ids; "" always). */
static int prompt_agrees(struct http_gen *g, json_t *p, bool any_ids, struct http_err *e)
{
	const char *why = any_ids ? "prompt: with swarm.segments of token ids, omit it or give "
				    "their concatenation"
				  : "prompt: with swarm.segments, omit it or give the segments' "
				    "concatenation";
	size_t at = 0, n;

	if (json_is_string(p) && json_string_length(p) == 0)
		return 0;
	if (!any_ids) {
		if (!json_is_string(p))
			return bad(e, "prompt", "prompt: expected a string");
		const char *t = json_string_value(p);
		n = json_string_length(p);
		for (uint32_t k = 0; k < g->req.n_segments; k++) {
			if (at + g->seg[k].len > n || memcmp(t + at, g->seg[k].text, g->seg[k].len))
				return bad(e, "prompt", "%s", why);
			at += g->seg[k].len;
		}
		return at == n ? 0 : bad(e, "prompt", "%s", why);
	}
	for (uint32_t k = 0; k < g->req.n_segments; k++) {
		if (!(g->seg[k].flags & PROTO_SEG_IDS))
			return bad(e, "prompt", "%s", why);
		at += g->seg[k].len / 4;
	}
	if (!is_ids(p) || json_array_size(p) != at)
		return bad(e, "prompt", "%s", why);
	for (size_t k = 0; k < at; k++) {
		json_t *x = json_array_get(p, k);
		if (!json_is_integer(x) ||
		    (json_int_t)proto_get32(g->idbuf + 4 * k) != json_integer_value(x))
			return bad(e, "prompt", "%s", why);
	}
	return 0;
}

static int decode_segments(struct http_gen *g, json_t *p, json_t *segs, uint32_t max_segments,
			   struct http_err *e)
{
	json_t *v[PROTO_MAX_SEGMENTS];
	size_t i, at = 0;
	bool any_ids = false;
	json_t *s;
	char what[48];

	if (!json_is_array(segs) || json_array_size(segs) == 0)
		return bad(e, "swarm.segments", "swarm.segments: expected a non-empty array of "
			   "strings or arrays of token ids");
	if (json_array_size(segs) > max_segments)
		return bad(e, "swarm.segments", "swarm.segments: at most %u segments "
			   "(gpud.max_segments)", max_segments);
	json_array_foreach(segs, i, s) {
		if (!json_is_string(s) && !is_ids(s))
			return bad(e, "swarm.segments", "swarm.segments[%zu]: expected a string or a "
				   "non-empty array of token ids", i);
		v[i] = s;
	}
	if (ids_reserve(g, v, json_array_size(segs), e))
		return -1;
	for (i = 0; i < json_array_size(segs); i++) {
		if (json_is_string(v[i])) {
			g->seg[i] = (struct proto_segment){ .text = json_string_value(v[i]),
							    .len = (uint32_t)json_string_length(v[i]) };
		} else {
			snprintf(what, sizeof(what), "swarm.segments[%zu]", i);
			if (put_ids(g, v[i], &at, &g->seg[i], "swarm.segments", what, e))
				return -1;
			any_ids = true;
		}
		g->req.n_segments = (uint32_t)i + 1;
	}
	g->ids = any_ids;
	return p ? prompt_agrees(g, p, any_ids, e) : 0;
}

/* prompt: a string, an array of token ids, or either alone in an array
 * (one prompt a request); or swarm.segments, each a string or token ids. */
static int decode_prompt(struct http_gen *g, json_t *root, json_t *swarm_segs,
			 uint32_t max_segments, struct http_err *e)
{
	json_t *p = member(root, "prompt");
	size_t at = 0;

	if (swarm_segs)
		return decode_segments(g, p, swarm_segs, max_segments, e);
	if (p && json_is_array(p) && json_array_size(p) == 1 &&
	    (json_is_string(json_array_get(p, 0)) || is_ids(json_array_get(p, 0))))
		p = json_array_get(p, 0);
	if (!p)
		return http_fail(e, 400, "prompt", "missing_required_parameter",
				 "prompt: required, a string or an array of token ids");
	g->req.n_segments = 1;
	if (is_ids(p)) {
		g->ids = true;
		return ids_reserve(g, &p, 1, e) ? -1 : put_ids(g, p, &at, &g->seg[0], "prompt",
								"prompt", e);
	}
	if (!json_is_string(p))
		return bad(e, "prompt", "prompt: expected a string or an array of token ids (one "
			   "prompt a request: arrays of several are not supported)");
	g->seg[0] = (struct proto_segment){ .text = json_string_value(p),
					    .len = (uint32_t)json_string_length(p) };
	return 0;
}

/* swarm.visibility -> the mask descriptor. */
static int decode_visibility(struct http_gen *g, json_t *vis, struct http_err *e)
{
	uint32_t S = g->req.n_segments, used = 0;
	size_t i, j;
	json_t *row, *x;
	char m[HTTP_MSG_MAX];

	if (!json_is_array(vis) || json_array_size(vis) != (size_t)S + 1)
		return bad(e, "swarm.visibility", "swarm.visibility: expected %u rows (one per "
			   "segment and one for the generation), each an array of segment indices",
			   S + 1);
	json_array_foreach(vis, i, row) {
		if (!json_is_array(row) || json_array_size(row) > (size_t)i + 1)
			return bad(e, "swarm.visibility", "swarm.visibility[%zu]: expected an array "
				   "of at most %zu segment indices", i, i + 1);
		g->rows[i].idx = g->idx + used;
		g->rows[i].n = (uint32_t)json_array_size(row);
		json_array_foreach(row, j, x) {
			if (!json_is_integer(x) || json_integer_value(x) < 0 ||
			    json_integer_value(x) > (json_int_t)i)
				return bad(e, "swarm.visibility", "swarm.visibility[%zu][%zu]: expected "
					   "a segment index in [0, %zu] (no forward reference)", i, j, i);
			g->idx[used++] = (uint16_t)json_integer_value(x);
		}
	}
	g->mask.n_segments = S;
	g->mask.rows = g->rows;
	if (proto_mask_validate(&g->mask, 0, m, sizeof(m)))
		return bad(e, "swarm.visibility", "swarm.visibility: %s", m);
	g->req.mask = &g->mask;
	return 0;
}

static int decode_stop(struct http_gen *g, json_t *root, struct http_err *e)
{
	json_t *s = member(root, "stop"), *x;
	size_t i;

	if (!s)
		return 0;
	if (json_is_string(s)) {
		x = s;
		s = json_array();
		json_array_append(s, x);
		json_object_set_new(root, "stop", s); /* keeps the string alive */
	}
	if (!json_is_array(s) || json_array_size(s) > PROTO_MAX_STOP)
		return bad(e, "stop", "stop: expected a string or an array of at most %d strings",
			   PROTO_MAX_STOP);
	json_array_foreach(s, i, x) {
		if (!json_is_string(x) || json_string_length(x) < 1 ||
		    json_string_length(x) > PROTO_MAX_STOP_LEN)
			return bad(e, "stop", "stop[%zu]: expected a string of 1..%d bytes", i,
				   PROTO_MAX_STOP_LEN);
		g->stop[i] = (struct proto_text){ json_string_value(x),
						  (uint32_t)json_string_length(x) };
	}
	g->req.n_stop = (uint32_t)json_array_size(s);
	g->req.stop = g->stop;
	return 0;
}

/* logit_bias: {"token id": bias in [-100, 100]}, at most
 * PROTO_MAX_LOGIT_BIAS entries (gpud checks the ids). */
static int decode_bias(struct http_gen *g, json_t *root, struct http_err *e)
{
	json_t *b = member(root, "logit_bias"), *v;
	const char *k;
	uint32_t n = 0;

	if (!b)
		return 0;
	if (!json_is_object(b))
		return bad(e, "logit_bias", "logit_bias: expected an object of token ids (as "
			   "strings) to biases");
	if (json_object_size(b) > PROTO_MAX_LOGIT_BIAS)
		return bad(e, "logit_bias", "logit_bias: %zu entries, at most %d",
			   json_object_size(b), PROTO_MAX_LOGIT_BIAS);
	json_object_foreach(b, k, v) {
		char *end;
		long id;
		errno = 0;
		id = strtol(k, &end, 10);
		if (!*k || *end || errno || id < 0 || id > INT32_MAX || !(*k >= '0' && *k <= '9'))
			return bad(e, "logit_bias", "logit_bias: key \"%.40s\" is not a token id",
				   k);
		if (!json_is_number(v) || json_number_value(v) < -100 ||
		    json_number_value(v) > 100)
			return bad(e, "logit_bias", "logit_bias[\"%s\"]: expected a number in "
				   "[-100, 100]", k);
		g->bias[n++] = (struct proto_bias){ .id = (int32_t)id,
						    .bias = (float)json_number_value(v) };
	}
	g->req.n_bias = n;
	g->req.bias = n ? g->bias : NULL;
	return 0;
}

/* The samplers' parameters beyond OpenAI's that vLLM and llama.cpp's
 * server take: top_k (<= 0 off), min_p, and the repetition penalty
 * (vLLM's repetition_penalty or llama.cpp's repeat_penalty: a logit of a
 * token in the last 256, prompt included, divided by it when positive,
 * multiplied when negative; 1 off). */
static int decode_extra_sampling(struct http_gen *g, json_t *root, struct http_err *e)
{
	const char *rp = member(root, "repetition_penalty") ? "repetition_penalty"
							     : "repeat_penalty";
	json_t *v = member(root, "top_k");
	double d;

	if (v) {
		if (!json_is_integer(v) || json_integer_value(v) < -1 ||
		    json_integer_value(v) > INT32_MAX)
			return bad(e, "top_k", "top_k: expected an integer (-1 or 0: off)");
		g->req.sampling.top_k = (int32_t)json_integer_value(v);
	}
	d = 0;
	if (number(root, "min_p", 0, 1, &d, e))
		return -1;
	g->req.sampling.min_p = (float)d;
	d = 1;
	if (number(root, rp, 0, 10, &d, e))
		return -1;
	if (d <= 0)
		return bad(e, rp, "%s: expected a number in (0, 10]", rp);
	g->req.sampling.repeat_penalty = (float)d;
	return 0;
}

/* Options that would change the answer in ways gpud cannot give: refused
 * by name rather than ignored (structured output, function calling,
 * audio). Their harmless values pass. */
static int refuse_unsupported_extras(json_t *root, struct http_err *e)
{
	json_t *v = member(root, "response_format"), *m;
	size_t i;

	if (v && !(json_is_object(v) && json_is_string(member(v, "type")) &&
		   !strcmp(json_string_value(member(v, "type")), "text")))
		return bad(e, "response_format", "response_format: only {\"type\": \"text\"} is "
			   "supported (no JSON mode or schema)");
	if (member(root, "functions") || member(root, "function_call"))
		return bad(e, member(root, "functions") ? "functions" : "function_call",
			   "%s: not supported (function calling)",
			   member(root, "functions") ? "functions" : "function_call");
	v = member(root, "tool_choice");
	if (v && !(json_is_string(v) && (!strcmp(json_string_value(v), "none") ||
					 !strcmp(json_string_value(v), "auto"))))
		return bad(e, "tool_choice", "tool_choice: only \"none\" or \"auto\" (no tools "
			   "are supported)");
	if (member(root, "audio"))
		return bad(e, "audio", "audio: not supported");
	v = member(root, "modalities");
	if (v && !json_is_array(v))
		return bad(e, "modalities", "modalities: expected [\"text\"]");
	json_array_foreach(v, i, m)
		if (!json_is_string(m) || strcmp(json_string_value(m), "text"))
			return bad(e, "modalities", "modalities: only \"text\"");
	return 0;
}

/* n: choices, 1..HTTP_MAX_N; more than one are not streamed. */
static int decode_n(struct http_gen *g, json_t *root, struct http_err *e)
{
	json_t *v = member(root, "n");

	g->n = 1;
	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 1 ||
	    json_integer_value(v) > HTTP_MAX_N)
		return bad(e, "n", "n: expected an integer in [1, %d]", HTTP_MAX_N);
	g->n = (uint32_t)json_integer_value(v);
	if (g->n > 1 && g->stream)
		return bad(e, "n", "n: more than one choice is not streamed (send one request a "
			   "choice, or stream false)");
	return 0;
}

static int refuse_unsupported(json_t *root, struct http_err *e)
{
	json_t *v;

	v = member(root, "best_of");
	if (v && !(json_is_integer(v) && json_integer_value(v) == 1))
		return bad(e, "best_of", "best_of: only 1 is supported");
	v = member(root, "tools");
	if (v && !(json_is_array(v) && json_array_size(v) == 0))
		return bad(e, "tools", "tools: not supported");
	v = member(root, "suffix");
	if (v && !(json_is_string(v) && json_string_length(v) == 0))
		return bad(e, "suffix", "suffix: not supported");
	return 0;
}

/* Chat: logprobs true|false and top_logprobs 0..20 (only with logprobs);
 * completions: logprobs 0..20, the alternatives a token (0: the
 * token's own only). */
static int decode_logprobs(struct http_gen *g, json_t *root, struct http_err *e)
{
	json_t *v = member(root, "logprobs"), *t = member(root, "top_logprobs");
	json_int_t n = 0;

	if (g->kind == HTTP_CHAT) {
		if (v && !json_is_boolean(v))
			return bad(e, "logprobs", "logprobs: expected true or false");
		g->logprobs = json_is_true(v);
		if (t) {
			if (!json_is_integer(t) || json_integer_value(t) < 0 ||
			    json_integer_value(t) > PROTO_MAX_TOP_LOGPROBS)
				return bad(e, "top_logprobs",
					   "top_logprobs: expected an integer in [0, %d]",
					   PROTO_MAX_TOP_LOGPROBS);
			n = json_integer_value(t);
			if (n && !g->logprobs)
				return bad(e, "top_logprobs", "top_logprobs: only with logprobs: "
					   "true");
		}
	} else if (v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > PROTO_MAX_TOP_LOGPROBS)
			return bad(e, "logprobs", "logprobs: expected an integer in [0, %d] (the "
				   "alternatives a token)", PROTO_MAX_TOP_LOGPROBS);
		g->logprobs = true;
		n = json_integer_value(v);
	}
	g->top_logprobs = (uint32_t)n;
	if (g->logprobs)
		g->req.flags |= PROTO_SUBMIT_LOGPROBS | g->top_logprobs << PROTO_SUBMIT_TOP_SHIFT;
	return 0;
}

/* Completions' echo: the prompt before the answer and, with logprobs, the
 * prompt's tokens' log probabilities before the answer's; max_tokens 0
 * then scores the prompt alone (gpud generates nothing). Not streamed. A
 * prompt with token ids echoes the text of its tokens. */
static int decode_echo(struct http_gen *g, json_t *root, bool zero_max, struct http_err *e)
{
	json_t *v = member(root, "echo");

	if (v && !json_is_boolean(v))
		return bad(e, "echo", "echo: expected true or false");
	if (json_is_true(v) && g->kind == HTTP_CHAT)
		return bad(e, "echo", "echo: for completions only");
	g->echo = json_is_true(v);
	if (!g->echo && zero_max)
		return bad(e, "max_tokens", "max_tokens: 0 only with echo (to score the prompt)");
	if (g->echo && g->stream)
		return bad(e, "echo", "echo: not with stream");
	if (g->echo && g->logprobs)
		g->req.flags |= PROTO_SUBMIT_PROMPT_LOGPROBS;
	if (g->echo && g->ids)
		/* a prompt of token ids has no text here: its echo is the
		 * prompt tokens' pieces, which come with their log
		 * probabilities (dropped when not asked for) */
		g->req.flags |= PROTO_SUBMIT_LOGPROBS | PROTO_SUBMIT_PROMPT_LOGPROBS;
	if (zero_max)
		/* gpud's way to generate nothing: the prompt's log
		 * probabilities alone (dropped when not asked for) */
		g->req.flags |= PROTO_SUBMIT_LOGPROBS | PROTO_SUBMIT_PROMPT_LOGPROBS |
				PROTO_SUBMIT_PROMPT_ONLY;
	return 0;
}

int http_gen_decode(enum http_kind kind, const char *body, size_t len, uint32_t max_segments,
		    struct http_gen *g, struct http_err *e)
{
	json_t *root, *v, *swarm;
	bool zero_max = false;
	double d;

	memset(g, 0, offsetof(struct http_gen, seg));
	g->kind = kind;
	if (max_segments == 0 || max_segments > PROTO_MAX_SEGMENTS)
		max_segments = PROTO_MAX_SEGMENTS;
	root = load(body, len, e);
	if (!root)
		return -1;
	g->root = root;
	if (model_of(root, &g->model, e) || refuse_unsupported(root, e) ||
	    refuse_unsupported_extras(root, e))
		goto fail;
	swarm = member(root, "swarm");
	if (swarm && !json_is_object(swarm)) {
		bad(e, "swarm", "swarm: expected an object {\"segments\", \"visibility\"}");
		goto fail;
	}
	if (kind == HTTP_CHAT) {
		if (swarm && member(swarm, "segments")) {
			bad(e, "swarm.segments", "swarm.segments: not for chat (the messages are the "
			    "segments)");
			goto fail;
		}
		if (decode_messages(g, root, max_segments, e))
			goto fail;
	} else if (decode_prompt(g, root, swarm ? member(swarm, "segments") : NULL, max_segments,
				 e)) {
		goto fail;
	}
	if (swarm && member(swarm, "visibility") &&
	    decode_visibility(g, member(swarm, "visibility"), e))
		goto fail;
	if (swarm) {
		const char *k;
		json_t *x;
		json_object_foreach(swarm, k, x) {
			if (strcmp(k, "segments") && strcmp(k, "visibility")) {
				bad(e, "swarm", "swarm.%s: unknown member (segments, visibility)", k);
				goto fail;
			}
		}
	}

	proto_sampling_default(&g->req.sampling);
	/* OpenAI's default temperature is 1; a request without one samples. */
	g->req.sampling.temperature = 1.0f;
	d = 1.0;
	if (number(root, "temperature", 0, 2, &d, e))
		goto fail;
	g->req.sampling.temperature = (float)d;
	d = 1.0;
	if (number(root, "top_p", 0, 1, &d, e))
		goto fail;
	if (d <= 0) {
		bad(e, "top_p", "top_p: expected a number in (0, 1]");
		goto fail;
	}
	g->req.sampling.top_p = (float)d;
	d = 0;
	if (number(root, "presence_penalty", -2, 2, &d, e))
		goto fail;
	g->req.sampling.presence_penalty = (float)d;
	d = 0;
	if (number(root, "frequency_penalty", -2, 2, &d, e))
		goto fail;
	g->req.sampling.frequency_penalty = (float)d;
	if (decode_extra_sampling(g, root, e))
		goto fail;
	if (g->req.sampling.presence_penalty != 0 || g->req.sampling.frequency_penalty != 0 ||
	    g->req.sampling.repeat_penalty != 1)
		g->req.sampling.penalty_last_n = 256;
	v = member(root, "seed");
	if (v) {
		if (!json_is_integer(v)) {
			bad(e, "seed", "seed: expected an integer");
			goto fail;
		}
		g->req.sampling.seed = (uint64_t)json_integer_value(v);
	}
	g->req.max_tokens = kind == HTTP_COMPLETION ? 16 : 4096; /* OpenAI's defaults */
	const char *mt = member(root, "max_completion_tokens") ? "max_completion_tokens"
							       : "max_tokens";
	v = member(root, mt);
	if (v) {
		/* 0: a completion's echo scoring its prompt (decode_echo) */
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    (json_integer_value(v) == 0 && kind == HTTP_CHAT) ||
		    json_integer_value(v) > (json_int_t)HTTP_MAX_TOKENS_CAP) {
			bad(e, mt, "%s: expected an integer in [1, %u]", mt, HTTP_MAX_TOKENS_CAP);
			goto fail;
		}
		g->req.max_tokens = (uint32_t)json_integer_value(v);
		zero_max = g->req.max_tokens == 0;
	}
	if (decode_stop(g, root, e))
		goto fail;
	v = member(root, "stream");
	if (v && !json_is_boolean(v)) {
		bad(e, "stream", "stream: expected true or false");
		goto fail;
	}
	g->stream = json_is_true(v);
	v = member(root, "stream_options");
	if (v) {
		json_t *iu = member(v, "include_usage");
		if (!json_is_object(v) || (iu && !json_is_boolean(iu))) {
			bad(e, "stream_options", "stream_options: expected {\"include_usage\": bool}");
			goto fail;
		}
		g->include_usage = json_is_true(iu);
	}
	/* llama.cpp's name for it: "none" keeps a reasoning model's <think>
	 * text in the content; "auto" and "deepseek" split it (the default) */
	v = member(root, "reasoning_format");
	if (v) {
		const char *f = json_is_string(v) ? json_string_value(v) : "";
		if (strcmp(f, "none") && strcmp(f, "auto") && strcmp(f, "deepseek")) {
			bad(e, "reasoning_format", "reasoning_format: expected \"none\", \"auto\" or "
			    "\"deepseek\"");
			goto fail;
		}
		g->no_reasoning = !strcmp(f, "none");
	}
	if (decode_logprobs(g, root, e) || decode_echo(g, root, zero_max, e) ||
	    decode_bias(g, root, e) || decode_n(g, root, e))
		goto fail;
	g->req.segments = g->seg;
	return 0;
fail:
	http_gen_free(g);
	return -1;
}

void http_gen_free(struct http_gen *g)
{
	json_decref(g->root);
	free(g->parts);
	free(g->idbuf);
	g->root = NULL;
	g->parts = NULL;
	g->idbuf = NULL;
}

int http_embed_decode(const char *body, size_t len, struct http_embed *x, struct http_err *e)
{
	json_t *in, *v;
	size_t i;

	memset(x, 0, sizeof(*x));
	x->root = load(body, len, e);
	if (!x->root)
		return -1;
	if (model_of(x->root, &x->model, e))
		goto fail;
	in = member(x->root, "input");
	if (!in) {
		http_fail(e, 400, "input", "missing_required_parameter",
			  "input: required, a string or an array of strings");
		goto fail;
	}
	if (json_is_string(in)) {
		x->text[0] = json_string_value(in);
		x->len[0] = (uint32_t)json_string_length(in);
		x->n = 1;
	} else if (json_is_array(in) && json_array_size(in) >= 1 &&
		   json_array_size(in) <= HTTP_EMBED_MAX_INPUTS) {
		json_array_foreach(in, i, v) {
			if (!json_is_string(v)) {
				bad(e, "input", "input[%zu]: expected a string (token arrays are not "
				    "supported)", i);
				goto fail;
			}
			x->text[i] = json_string_value(v);
			x->len[i] = (uint32_t)json_string_length(v);
		}
		x->n = (uint32_t)json_array_size(in);
	} else {
		bad(e, "input", "input: expected a string or an array of 1..%d strings",
		    HTTP_EMBED_MAX_INPUTS);
		goto fail;
	}
	v = member(x->root, "encoding_format");
	if (v) {
		if (json_is_string(v) && strcmp(json_string_value(v), "float") == 0) {
			x->base64 = false;
		} else if (json_is_string(v) && strcmp(json_string_value(v), "base64") == 0) {
			x->base64 = true;
		} else {
			bad(e, "encoding_format", "encoding_format: expected \"float\" or \"base64\"");
			goto fail;
		}
	}
	if (member(x->root, "dimensions")) {
		bad(e, "dimensions", "dimensions: not supported (the model's own size is used)");
		goto fail;
	}
	return 0;
fail:
	http_embed_free(x);
	return -1;
}

void http_embed_free(struct http_embed *x)
{
	json_decref(x->root);
	x->root = NULL;
}

/* A body whose "model" may be left out (the served one): the parsed JSON
 * and *model (NULL when absent), or NULL with *e filled. */
static json_t *load_optional_model(const char *body, size_t len, const char **model,
				   struct http_err *e)
{
	json_t *root = load(body, len, e), *v;

	if (!root)
		return NULL;
	v = member(root, "model");
	if (v && !json_is_string(v)) {
		json_decref(root);
		bad(e, "model", "model: expected a string");
		return NULL;
	}
	*model = json_string_value(v);
	return root;
}

int http_tok_decode(const char *body, size_t len, struct http_tok *t, struct http_err *e)
{
	json_t *v, *a;
	const char *k;

	memset(t, 0, sizeof(*t));
	t->root = load_optional_model(body, len, &t->model, e);
	if (!t->root)
		return -1;
	k = member(t->root, "prompt") ? "prompt" : "content";
	v = member(t->root, k);
	if (!v || !json_is_string(v)) {
		http_fail(e, 400, "prompt", v ? "invalid_value" : "missing_required_parameter",
			  "%s: required, a string (or \"content\", as llama.cpp names it)", k);
		goto fail;
	}
	if (member(t->root, "messages")) {
		bad(e, "messages", "messages: not supported (tokenize a prompt's text)");
		goto fail;
	}
	t->text = json_string_value(v);
	t->len = (uint32_t)json_string_length(v);
	k = member(t->root, "add_special") ? "add_special" : "add_special_tokens";
	a = member(t->root, k);
	if (a && !json_is_boolean(a)) {
		bad(e, k, "%s: expected true or false", k);
		goto fail;
	}
	t->add_special = !a || json_is_true(a);
	return 0;
fail:
	http_tok_free(t);
	return -1;
}

void http_tok_free(struct http_tok *t)
{
	json_decref(t->root);
	t->root = NULL;
}

int http_detok_decode(const char *body, size_t len, struct http_detok *t, struct http_err *e)
{
	json_t *v, *x;
	size_t i;

	memset(t, 0, sizeof(*t));
	t->root = load_optional_model(body, len, &t->model, e);
	if (!t->root)
		return -1;
	v = member(t->root, "tokens");
	if (!v || !json_is_array(v)) {
		http_fail(e, 400, "tokens", v ? "invalid_value" : "missing_required_parameter",
			  "tokens: required, an array of token ids");
		goto fail;
	}
	t->ids = malloc(json_array_size(v) ? json_array_size(v) * sizeof(*t->ids) : 1);
	if (!t->ids) {
		http_fail(e, 503, NULL, "out_of_memory", "out of memory");
		goto fail;
	}
	json_array_foreach(v, i, x) {
		if (!json_is_integer(x) || json_integer_value(x) < 0 ||
		    json_integer_value(x) > INT32_MAX) {
			bad(e, "tokens", "tokens[%zu]: expected a token id (an integer >= 0)", i);
			goto fail;
		}
		t->ids[i] = (int32_t)json_integer_value(x);
	}
	t->n = (uint32_t)json_array_size(v);
	v = member(t->root, "skip_special_tokens");
	if (v && !json_is_boolean(v)) {
		bad(e, "skip_special_tokens", "skip_special_tokens: expected true or false");
		goto fail;
	}
	t->special = !json_is_true(v);
	return 0;
fail:
	http_detok_free(t);
	return -1;
}

void http_detok_free(struct http_detok *t)
{
	json_decref(t->root);
	free(t->ids);
	t->root = NULL;
	t->ids = NULL;
}

const char *http_finish_reason(uint32_t stop_reason)
{
	return stop_reason == PROTO_STOP_MAX_TOKENS ? "length" : "stop";
}

/* dst = src with every byte that is not part of valid UTF-8 as '?'
 * (messages quote the client's bytes, and JSON strings must be UTF-8). */
static void utf8_clean(char *dst, const char *src, size_t cap)
{
	size_t n = strlen(src), i = 0, o = 0;

	while (i < n && o + 4 < cap) {
		size_t l = sw_utf8_char((const unsigned char *)src + i, n - i);
		if (l == 0) {
			dst[o++] = '?';
			i++;
			continue;
		}
		memcpy(dst + o, src + i, l);
		o += l;
		i += l;
	}
	dst[o] = '\0';
}

/* A JSON string of t[0, n): generated text is UTF-8, but should a
 * batch ever end inside a character, its invalid bytes become U+FFFD
 * instead of failing the response. NULL when out of memory. */
static json_t *text_json(const char *t, size_t n)
{
	json_t *v = json_stringn(t, n);
	char *c;
	size_t i = 0, o = 0;

	if (v || (n && !t))
		return v;
	c = malloc(3 * n + 1);
	if (!c)
		return NULL;
	while (i < n) {
		size_t l = sw_utf8_char((const unsigned char *)t + i, n - i);
		if (l == 0) {
			memcpy(c + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
			continue;
		}
		memcpy(c + o, t + i, l);
		o += l;
		i += l;
	}
	v = json_stringn(c, o);
	free(c);
	return v;
}

static json_t *usage_json(const struct proto_done *u)
{
	return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)u->prompt_tokens,
			 "completion_tokens", (json_int_t)u->generated_tokens, "total_tokens",
			 (json_int_t)u->prompt_tokens + (json_int_t)u->generated_tokens,
			 "prompt_tokens_details", "cached_tokens",
			 (json_int_t)u->cached_prompt_tokens);
}

static char *dump(json_t *o)
{
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return s;
}

/* --- log probabilities ------------------------------------------------------ */

/* Room for need more bytes within b->max; -1 when over it or out of
 * memory. */
static int lpbuf_room(struct http_lpbuf *b, size_t need)
{
	if (b->n + need > b->max)
		return -1;
	if (b->n + need > b->cap) {
		size_t nc = b->cap ? b->cap : 4096;
		while (nc < b->n + need)
			nc *= 2;
		char *np = realloc(b->p, nc);
		if (!np)
			return -1;
		b->p = np;
		b->cap = nc;
	}
	return 0;
}

int http_lpbuf_append(struct http_lpbuf *b, const char *p, size_t n)
{
	if (lpbuf_room(b, n))
		return -1;
	if (n)
		memcpy(b->p + b->n, p, n);
	b->n += n;
	return 0;
}

int http_lp_collect(struct http_lpbuf *b, const struct proto_tokens *t)
{
	struct proto_lp_iter it;
	struct proto_lp_entry le;
	size_t n0 = b->n;
	uint32_t last = t->eog ? t->n_ids - 1 : UINT32_MAX;

	if (!t->logprobs)
		return 0;
	proto_lp_iter_init(&it, t);
	while (proto_lp_next(&it, &le)) {
		if (le.token == last)
			continue;
		if (lpbuf_room(b, (le.rank == 0 ? 1 : 0) + 6 + le.piece_len))
			goto fail;
		if (le.rank == 0)
			b->p[b->n++] = (char)t->n_top;
		uint16_t pl = (uint16_t)le.piece_len;
		memcpy(b->p + b->n, &le.logprob, 4);
		memcpy(b->p + b->n + 4, &pl, 2);
		memcpy(b->p + b->n + 6, le.piece, le.piece_len);
		b->n += 6 + le.piece_len;
	}
	return 0;
fail:
	b->n = n0;
	return -1;
}

/* One entry of an http_lpbuf at *at (advanced); false past the end. */
static bool lp_entry(const char *p, size_t n, size_t *at, float *lp, const char **piece,
		     uint16_t *len)
{
	if (n - *at < 6)
		return false;
	memcpy(lp, p + *at, 4);
	memcpy(len, p + *at + 4, 2);
	if (n - *at - 6 < *len)
		return false;
	*piece = p + *at + 6;
	*at += 6 + *len;
	return true;
}

/* The piece as a JSON string: itself when it is whole UTF-8, else
 * "bytes:\xNN..." for each byte. */
static json_t *piece_json(const char *s, size_t n)
{
	char b[6 + 4 * 256 + 1];
	size_t o;

	if (sw_utf8_invalid_at((const unsigned char *)s, n) == n)
		return json_stringn(s, n);
	memcpy(b, "bytes:", 6);
	o = 6;
	for (size_t i = 0; i < n && o + 4 < sizeof(b); i++)
		o += (size_t)snprintf(b + o, sizeof(b) - o, "\\x%02x", (unsigned char)s[i]);
	return json_stringn(b, o);
}

static json_t *bytes_json(const char *s, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < n; i++)
		if (json_array_append_new(a, json_integer((unsigned char)s[i]))) {
			json_decref(a);
			return NULL;
		}
	return a;
}

/* JSON cannot carry -inf: OpenAI's -9999 stands for it. NaN (the
 * prompt's first token, which has none) is null. */
static json_t *lp_json(float lp)
{
	return isnan(lp) ? json_null() : json_real(isfinite(lp) ? (double)lp : -9999.0);
}

/* Characters a piece starts: bytes that are not UTF-8 continuations. */
static size_t chars_of(const char *s, size_t n)
{
	size_t c = 0;

	for (size_t i = 0; i < n; i++)
		c += ((unsigned char)s[i] & 0xc0) != 0x80;
	return c;
}

json_t *http_logprobs_json(enum http_kind kind, const char *p, size_t n, size_t *offset)
{
	json_t *content = NULL, *tokens = NULL, *tlps = NULL, *tops = NULL, *offs = NULL, *o;
	size_t at = 0;

	if (kind == HTTP_CHAT) {
		content = json_array();
		o = json_pack("{s:o, s:n}", "content", content, "refusal");
	} else {
		o = json_pack("{s:o, s:o, s:o, s:o}", "tokens", tokens = json_array(),
			      "token_logprobs", tlps = json_array(), "top_logprobs",
			      tops = json_array(), "text_offset", offs = json_array());
	}
	if (!o)
		return NULL;
	while (at < n) {
		unsigned n_alt = (unsigned char)p[at++];
		const char *piece;
		uint16_t len;
		float lp;
		json_t *alts = kind == HTTP_CHAT ? json_array() : json_object(), *tok;

		if (!alts || !lp_entry(p, n, &at, &lp, &piece, &len))
			goto fail_alts;
		if (isnan(lp)) {
			/* the prompt's first token: no number, no alternatives */
			json_decref(alts);
			alts = kind == HTTP_CHAT ? json_array() : json_null();
			if (!alts)
				goto fail;
			for (unsigned k = 0; k < n_alt; k++) {
				float x;
				const char *q;
				uint16_t ql;
				if (!lp_entry(p, n, &at, &x, &q, &ql))
					goto fail_alts;
			}
			n_alt = 0;
		}
		if (kind == HTTP_CHAT) {
			tok = json_pack("{s:o, s:o, s:o, s:o}", "token", piece_json(piece, len),
					"logprob", lp_json(lp), "bytes", bytes_json(piece, len),
					"top_logprobs", alts);
			if (!tok || json_array_append_new(content, tok))
				goto fail;
		} else {
			if (json_array_append_new(tops, alts) || /* owns alts from here */
			    json_array_append_new(tokens, piece_json(piece, len)) ||
			    json_array_append_new(tlps, lp_json(lp)) ||
			    json_array_append_new(offs, json_integer((json_int_t)*offset)))
				goto fail;
			*offset += chars_of(piece, len);
		}
		for (unsigned k = 0; k < n_alt; k++) {
			if (!lp_entry(p, n, &at, &lp, &piece, &len))
				goto fail;
			if (kind == HTTP_CHAT) {
				json_t *a = json_pack("{s:o, s:o, s:o}", "token",
						      piece_json(piece, len), "logprob",
						      lp_json(lp), "bytes", bytes_json(piece, len));
				if (!a || json_array_append_new(alts, a))
					goto fail;
			} else {
				json_t *key = piece_json(piece, len);
				/* two alternatives with one text keep the likelier */
				if (!key || (!json_object_get(alts, json_string_value(key)) &&
					     json_object_set_new(alts, json_string_value(key),
								 lp_json(lp)))) {
					json_decref(key);
					goto fail;
				}
				json_decref(key);
			}
		}
		continue;
fail_alts:
		json_decref(alts);
		goto fail;
	}
	return o;
fail:
	json_decref(o);
	return NULL;
}

json_t *http_choice_json(enum http_kind kind, uint32_t index, const char *text, size_t text_len,
			 const char *reason, size_t reason_len, json_t *logprobs,
			 uint32_t stop_reason)
{
	json_t *choice;

	if (kind == HTTP_CHAT) {
		choice = json_pack("{s:I, s:{s:s, s:o}, s:o, s:s}", "index", (json_int_t)index,
				   "message", "role", "assistant", "content",
				   text_json(text, text_len), "logprobs",
				   logprobs ? logprobs : json_null(), "finish_reason",
				   http_finish_reason(stop_reason));
		if (choice && reason &&
		    json_object_set_new(json_object_get(choice, "message"), "reasoning_content",
					text_json(reason, reason_len))) {
			json_decref(choice);
			return NULL;
		}
		return choice;
	}
	return json_pack("{s:o, s:I, s:o, s:s}", "text", text_json(text, text_len), "index",
			 (json_int_t)index, "logprobs", logprobs ? logprobs : json_null(),
			 "finish_reason", http_finish_reason(stop_reason));
}

char *http_completion_choices_json(enum http_kind kind, const char *id, long created,
				   const char *model, json_t *choices,
				   const struct proto_done *usage)
{
	if (!choices)
		return NULL;
	return dump(json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", id, "object",
			      kind == HTTP_CHAT ? "chat.completion" : "text_completion", "created",
			      (json_int_t)created, "model", model, "choices", choices, "usage",
			      usage_json(usage)));
}

char *http_completion_json(enum http_kind kind, const char *id, long created, const char *model,
			   const char *text, size_t text_len, const char *reason,
			   size_t reason_len, json_t *logprobs, const struct proto_done *usage)
{
	json_t *choice = http_choice_json(kind, 0, text, text_len, reason, reason_len, logprobs,
					  usage->stop_reason);

	return choice ? http_completion_choices_json(kind, id, created, model,
						     json_pack("[o]", choice), usage)
		      : NULL;
}

char *http_chunk_json(enum http_kind kind, const char *id, long created, const char *model,
		      const char *text, size_t text_len, const char *reason, size_t reason_len,
		      bool role_first, const char *finish, json_t *logprobs,
		      const struct proto_done *usage)
{
	json_t *o = json_pack("{s:s, s:s, s:I, s:s}", "id", id, "object",
			      kind == HTTP_CHAT ? "chat.completion.chunk" : "text_completion",
			      "created", (json_int_t)created, "model", model);
	json_t *choices = json_array(), *choice = NULL;

	if (!logprobs)
		logprobs = json_null();
	if (!o || !choices)
		goto oom;
	if (usage) {
		json_decref(logprobs);
		logprobs = NULL;
		if (json_object_set_new(o, "choices", choices) ||
		    json_object_set_new(o, "usage", usage_json(usage)))
			goto oom_o;
		return dump(o);
	}
	if (kind == HTTP_CHAT) {
		json_t *delta = json_object();
		if (!delta)
			goto oom;
		if (role_first)
			json_object_set_new(delta, "role", json_string("assistant"));
		if (text_len || role_first)
			json_object_set_new(delta, "content", text_json(text, text_len));
		if (reason_len)
			json_object_set_new(delta, "reasoning_content", text_json(reason, reason_len));
		choice = json_pack("{s:i, s:o, s:o}", "index", 0, "delta", delta, "logprobs",
				   logprobs);
	} else {
		choice = json_pack("{s:o, s:i, s:o}", "text", text_json(text, text_len), "index", 0,
				   "logprobs", logprobs);
	}
	logprobs = NULL; /* json_pack's "o" took it, even on failure */
	if (!choice)
		goto oom;
	json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
	if (json_array_append_new(choices, choice) || json_object_set_new(o, "choices", choices))
		goto oom_o;
	return dump(o);
oom:
	json_decref(choices);
oom_o:
	json_decref(o);
	json_decref(logprobs);
	return NULL;
}

static const char *err_type(int status)
{
	switch (status) {
	case 401: return "authentication_error";
	case 403: return "permission_error";
	case 404: return "not_found_error";
	case 429: return "rate_limit_error";
	case 503: return "service_unavailable";
	default: return status >= 500 ? "server_error" : "invalid_request_error";
	}
}

char *http_error_json(const struct http_err *e)
{
	char msg[HTTP_MSG_MAX], param[HTTP_PARAM_MAX];

	utf8_clean(msg, e->msg, sizeof(msg));
	utf8_clean(param, e->param, sizeof(param));
	return dump(json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", msg, "type",
			      err_type(e->status), "param",
			      param[0] ? json_string(param) : json_null(), "code",
			      e->code[0] ? json_string(e->code) : json_null()));
}

size_t http_sse_event(char *out, size_t cap, const char *data, size_t len)
{
	size_t n = 0, i = 0;

#define PUT(c)                          \
	do {                            \
		char ch_ = (c);         \
		if (n < cap)            \
			out[n] = ch_;   \
		n++;                    \
	} while (0)
	for (;;) {
		for (const char *k = "data: "; *k; k++)
			PUT(*k);
		while (i < len && data[i] != '\r' && data[i] != '\n')
			PUT(data[i++]);
		PUT('\n');
		if (i >= len)
			break;
		if (data[i] == '\r' && i + 1 < len && data[i + 1] == '\n')
			i++;
		i++;
		if (i >= len) { /* a trailing line break: an empty last line */
			for (const char *k = "data: "; *k; k++)
				PUT(*k);
			PUT('\n');
			break;
		}
	}
	PUT('\n');
#undef PUT
	return n;
}

size_t http_base64(const uint8_t *in, size_t n, char *out)
{
	static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t o = 0, i;

	for (i = 0; i + 2 < n; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
		out[o++] = t[v >> 18];
		out[o++] = t[(v >> 12) & 63];
		out[o++] = t[(v >> 6) & 63];
		out[o++] = t[v & 63];
	}
	if (i < n) {
		uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);
		out[o++] = t[v >> 18];
		out[o++] = t[(v >> 12) & 63];
		out[o++] = i + 1 < n ? t[(v >> 6) & 63] : '=';
		out[o++] = '=';
	}
	out[o] = '\0';
	return o;
}
