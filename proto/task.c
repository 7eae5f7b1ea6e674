/* task.c - parsing and validation of the task JSON on swarm:tasks
 * (task.h), with jansson. The workers parse every entry with it; clients
 * may use it to check what they submit. */
#include "proto/task.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "common/err.h"

static const char *const kind_names[] = { "ingest", "summarize", "answer" };

const char *proto_task_kind_name(enum proto_task_kind k)
{
	return (unsigned)k < 3 ? kind_names[k] : "unknown";
}

static const char *json_type_name(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "object";
	case JSON_ARRAY: return "array";
	case JSON_STRING: return "string";
	case JSON_INTEGER: return "integer";
	case JSON_REAL: return "number";
	case JSON_TRUE:
	case JSON_FALSE: return "boolean";
	case JSON_NULL: return "null";
	}
	return "unknown";
}

/* A string field: absent -> *out NULL and 0 (the caller decides whether
 * that is an error); present -> a non-empty string of at most max bytes. */
static int get_string(json_t *root, const char *key, size_t max, const char **out,
		      size_t *len, char *err, size_t errlen)
{
	json_t *v = json_object_get(root, key);
	size_t n;

	*out = NULL;
	if (len)
		*len = 0;
	if (!v)
		return 0;
	if (!json_is_string(v))
		return sw_seterr(err, errlen, SW_ETYPE, "task.%s: expected a string, got %s", key,
				 json_type_name(v));
	n = json_string_length(v);
	if (n == 0)
		return sw_seterr(err, errlen, -EINVAL, "task.%s: must not be empty", key);
	if (n > max)
		return sw_seterr(err, errlen, SW_ETOOLONG, "task.%s: %zu bytes exceeds the limit of %zu",
				 key, n, max);
	if (strlen(json_string_value(v)) != n)
		return sw_seterr(err, errlen, -EINVAL, "task.%s: contains a NUL character", key);
	*out = json_string_value(v);
	if (len)
		*len = n;
	return 0;
}

/* An integer field in [min, max]; absent -> *out = def. */
static int get_int(json_t *root, const char *key, int64_t min, int64_t max, int64_t def,
		   int64_t *out, char *err, size_t errlen)
{
	json_t *v = json_object_get(root, key);
	json_int_t x;

	*out = def;
	if (!v)
		return 0;
	if (!json_is_integer(v))
		return sw_seterr(err, errlen, SW_ETYPE, "task.%s: expected an integer, got %s", key,
				 json_type_name(v));
	x = json_integer_value(v);
	if (x < min || x > max)
		return sw_seterr(err, errlen, -EINVAL,
				 "task.%s: expected an integer in [%lld, %lld], got %lld", key,
				 (long long)min, (long long)max, (long long)x);
	*out = x;
	return 0;
}

static bool id_char_ok(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '_' || c == ':' || c == '-';
}

static int check_url(const char *key, const char *url, bool allow_file, char *err, size_t errlen)
{
	const char *colon = strstr(url, "://");
	size_t n = colon ? (size_t)(colon - url) : 0;

	if (!colon || n == 0)
		return sw_seterr(err, errlen, -EINVAL, "task.%s: not a URL: \"%.64s\"", key, url);
	if ((n == 4 && strncasecmp(url, "http", 4) == 0) ||
	    (n == 5 && strncasecmp(url, "https", 5) == 0) ||
	    (allow_file && n == 4 && strncasecmp(url, "file", 4) == 0))
		return 0;
	return sw_seterr(err, errlen, -EINVAL, "task.%s: unsupported scheme \"%.*s\" (expected %s)",
			 key, (int)(n > 16 ? 16 : n), url,
			 allow_file ? "http, https, file" : "http, https");
}

/* The keys each kind accepts, besides id, kind and callback_url. */
static bool key_allowed(enum proto_task_kind k, const char *key)
{
	static const char *const ingest[] = { "text", "url", "source", NULL };
	static const char *const summarize[] = { "document_id", "text", "url", "source",
						 "max_tokens", NULL };
	static const char *const answer[] = { "question", "top_k", "document_id", "text", "url",
					      "source", "max_tokens", "chunk_mask", NULL };
	const char *const *list = k == PROTO_TASK_INGEST ? ingest :
				  k == PROTO_TASK_SUMMARIZE ? summarize : answer;

	if (!strcmp(key, "id") || !strcmp(key, "kind") || !strcmp(key, "callback_url"))
		return true;
	for (; *list; list++)
		if (!strcmp(*list, key))
			return true;
	return false;
}

static int parse_kind(json_t *root, enum proto_task_kind *kind, char *err, size_t errlen)
{
	const char *s;
	int rc;

	rc = get_string(root, "kind", 64, &s, NULL, err, errlen);
	if (rc == SW_ETOOLONG)
		return sw_seterr(err, errlen, -EINVAL,
				 "task.kind: unknown kind (expected ingest, summarize, answer)");
	if (rc)
		return rc;
	if (!s)
		return sw_seterr(err, errlen, -EINVAL, "task.kind: missing");
	for (int i = 0; i < 3; i++)
		if (!strcmp(s, kind_names[i])) {
			*kind = (enum proto_task_kind)i;
			return 0;
		}
	return sw_seterr(err, errlen, -EINVAL,
			 "task.kind: unknown kind \"%s\" (expected ingest, summarize, answer)", s);
}

/* "document_id and text", "text and url", "document_id, text and url":
 * the inputs present, for the error that says there are too many. */
static const char *inputs_given(const struct proto_task *t, char *buf, size_t len)
{
	const char *names[3];
	int n = 0;

	if (t->document_id)
		names[n++] = "document_id";
	if (t->text)
		names[n++] = "text";
	if (t->url)
		names[n++] = "url";
	if (n == 3)
		snprintf(buf, len, "%s, %s and %s", names[0], names[1], names[2]);
	else if (n == 2)
		snprintf(buf, len, "%s and %s", names[0], names[1]);
	else
		snprintf(buf, len, "%s", n ? names[0] : "none");
	return buf;
}

/* The document a task names: text, url, source and (summarize, answer)
 * document_id, each checked alone; parse_fields checks the combination. */
static int parse_document(json_t *root, struct proto_task *t, char *err, size_t errlen)
{
	int rc;

	rc = get_string(root, "text", PROTO_TASK_MAX_TEXT, &t->text, &t->text_len, err, errlen);
	if (!rc)
		rc = get_string(root, "url", PROTO_TASK_MAX_URL, &t->url, NULL, err, errlen);
	if (!rc)
		rc = get_string(root, "source", PROTO_TASK_MAX_URL, &t->source, NULL, err, errlen);
	if (!rc && t->kind != PROTO_TASK_INGEST)
		rc = get_int(root, "document_id", 1, INT64_MAX, 0, &t->document_id, err, errlen);
	if (!rc && t->url)
		rc = check_url("url", t->url, true, err, errlen);
	return rc;
}

static int parse_fields(json_t *root, struct proto_task *t, char *err, size_t errlen)
{
	const char *key;
	char given[64];
	json_t *v;
	int64_t x;
	int n_inputs, rc;

	json_object_foreach(root, key, v) {
		if (!key_allowed(t->kind, key))
			return sw_seterr(err, errlen, -EINVAL, "task.%s: unknown key for kind %s",
					 key, kind_names[t->kind]);
	}
	rc = get_string(root, "callback_url", PROTO_TASK_MAX_URL, &t->callback_url, NULL, err,
			errlen);
	if (!rc && t->callback_url)
		rc = check_url("callback_url", t->callback_url, false, err, errlen);
	if (rc)
		return rc;
	if (t->kind == PROTO_TASK_ANSWER) { /* the question first: it is what answer is about */
		rc = get_string(root, "question", PROTO_TASK_MAX_QUESTION, &t->question,
				&t->question_len, err, errlen);
		if (rc)
			return rc;
		if (!t->question)
			return sw_seterr(err, errlen, -EINVAL, "task.question: required for kind answer");
	}
	rc = parse_document(root, t, err, errlen);
	if (rc)
		return rc;
	n_inputs = !!t->text + !!t->url + !!t->document_id;

	switch (t->kind) {
	case PROTO_TASK_INGEST:
		if (n_inputs != 1)
			return sw_seterr(err, errlen, -EINVAL,
					 "task: kind ingest needs exactly one of text and url (%s)",
					 t->text ? "both given" : "neither given");
		break;
	case PROTO_TASK_SUMMARIZE:
		if (n_inputs != 1)
			return sw_seterr(err, errlen, -EINVAL,
					 "task: kind summarize needs exactly one of document_id, "
					 "text and url (%s given)",
					 inputs_given(t, given, sizeof(given)));
		break;
	case PROTO_TASK_ANSWER:
		if (n_inputs > 1)
			return sw_seterr(err, errlen, -EINVAL,
					 "task: kind answer takes at most one of document_id, text "
					 "and url (%s given)",
					 inputs_given(t, given, sizeof(given)));
		rc = get_int(root, "top_k", 1, PROTO_TASK_MAX_TOP_K, PROTO_TASK_DEFAULT_TOP_K, &x,
			     err, errlen);
		if (rc)
			return rc;
		t->top_k = (uint32_t)x;
		{
			const char *cm;

			rc = get_string(root, "chunk_mask", 16, &cm, NULL, err, errlen);
			if (rc)
				return rc;
			if (cm && !strcmp(cm, "system"))
				t->chunk_mask = PROTO_TASK_CHUNKS_SYSTEM;
			else if (cm && !strcmp(cm, "self"))
				t->chunk_mask = PROTO_TASK_CHUNKS_SELF;
			else if (cm)
				return sw_seterr(err, errlen, -EINVAL,
						 "task.chunk_mask: expected \"system\" or \"self\", "
						 "got \"%s\"", cm);
		}
		break;
	default:
		return -EINVAL;
	}
	if (t->source && !proto_task_has_document(t))
		return sw_seterr(err, errlen, -EINVAL, "task.source: only with text or url");
	if (proto_task_has_document(t) && !t->source)
		t->source = t->url ? t->url : "inline";
	if (t->kind != PROTO_TASK_INGEST) {
		rc = get_int(root, "max_tokens", 1, PROTO_TASK_MAX_TOKENS,
			     PROTO_TASK_DEFAULT_MAX_TOKENS, &x, err, errlen);
		if (rc)
			return rc;
		t->max_tokens = (uint32_t)x;
	}
	return 0;
}

int proto_task_parse(const char *json, size_t len, struct proto_task *t, char *err,
		     size_t errlen)
{
	json_error_t jerr;
	json_t *root;
	const char *id;
	int rc;

	memset(t, 0, sizeof(*t));
	if (!json)
		return sw_seterr(err, errlen, -EINVAL, "task: no payload");
	if (len > PROTO_TASK_MAX_BYTES)
		return sw_seterr(err, errlen, SW_ETOOLONG, "task: %zu bytes exceeds the limit of %u",
				 len, PROTO_TASK_MAX_BYTES);
	root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root) {
		if (json_error_code(&jerr) == json_error_out_of_memory)
			return sw_seterr(err, errlen, -ENOMEM, "task: out of memory");
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "task: invalid JSON at line %d, column %d: %s", jerr.line,
				 jerr.column, jerr.text);
	}
	t->root = root;
	if (!json_is_object(root))
		return sw_seterr(err, errlen, SW_EFORMAT, "task: expected an object, got %s",
				 json_type_name(root));

	rc = get_string(root, "id", PROTO_TASK_MAX_ID, &id, NULL, err, errlen);
	if (rc)
		return rc;
	if (!id)
		return sw_seterr(err, errlen, -EINVAL, "task.id: missing");
	for (const char *p = id; *p; p++)
		if (!id_char_ok(*p))
			return sw_seterr(err, errlen, -EINVAL,
					 "task.id: character %ld is not one of [A-Za-z0-9._:-]",
					 (long)(p - id));
	t->id = id;

	rc = parse_kind(root, &t->kind, err, errlen);
	if (rc)
		return rc;
	return parse_fields(root, t, err, errlen);
}

void proto_task_free(struct proto_task *t)
{
	if (!t)
		return;
	json_decref(t->root);
	memset(t, 0, sizeof(*t));
}
