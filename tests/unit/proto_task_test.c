/* proto_task_test.c - task JSON validation (proto/task.h): each kind
 * parsed with its defaults, summarize and answer with their document
 * inline, by URL or by id (every valid and invalid combination), and one
 * test per error with the exact message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/task.h"
#include "common/err.h"

static char err[SW_ERR_MAX];

/* Parses s and expects code with exactly msg; returns nothing. */
static void expect_error(const char *s, int code, const char *msg)
{
	struct proto_task t;
	int rc = proto_task_parse(s, strlen(s), &t, err, sizeof(err));

	if (rc != code)
		fail_msg("%s: expected %s, got %s (%s)", s, sw_errname(code), sw_errname(rc), err);
	if (msg)
		assert_string_equal(err, msg);
	proto_task_free(&t);
}

static void test_ingest_text(void **state)
{
	static const char s[] = "{\"id\":\"doc-1\",\"kind\":\"ingest\",\"text\":\"hello world\"}";
	struct proto_task t;

	assert_int_equal(proto_task_parse(s, strlen(s), &t, err, sizeof(err)), 0);
	assert_string_equal(t.id, "doc-1");
	assert_int_equal(t.kind, PROTO_TASK_INGEST);
	assert_string_equal(t.text, "hello world");
	assert_int_equal(t.text_len, 11);
	assert_null(t.url);
	assert_string_equal(t.source, "inline");
	assert_null(t.callback_url);
	proto_task_free(&t);
	assert_null(t.root);
	proto_task_free(&t); /* twice is fine */
	proto_task_free(NULL);
}

static void test_ingest_url(void **state)
{
	static const char s[] = "{\"id\":\"a:b_c.d\",\"kind\":\"ingest\",\"url\":\"file:///tmp/x\","
				"\"callback_url\":\"https://cb.example/done\"}";
	struct proto_task t;

	assert_int_equal(proto_task_parse(s, strlen(s), &t, err, sizeof(err)), 0);
	assert_string_equal(t.url, "file:///tmp/x");
	assert_string_equal(t.source, "file:///tmp/x");
	assert_string_equal(t.callback_url, "https://cb.example/done");
	proto_task_free(&t);
}

static void test_summarize_and_answer(void **state)
{
	static const char s1[] = "{\"id\":\"s\",\"kind\":\"summarize\",\"document_id\":7}";
	static const char s2[] = "{\"id\":\"q\",\"kind\":\"answer\",\"question\":\"why?\","
				 "\"top_k\":3,\"max_tokens\":64}";
	static const char s3[] = "{\"id\":\"q\",\"kind\":\"answer\",\"question\":\"how?\",\"document_id\":2}";
	struct proto_task t;

	assert_int_equal(proto_task_parse(s1, strlen(s1), &t, err, sizeof(err)), 0);
	assert_int_equal(t.kind, PROTO_TASK_SUMMARIZE);
	assert_int_equal(t.document_id, 7);
	assert_int_equal(t.max_tokens, PROTO_TASK_DEFAULT_MAX_TOKENS);
	proto_task_free(&t);

	assert_int_equal(proto_task_parse(s2, strlen(s2), &t, err, sizeof(err)), 0);
	assert_int_equal(t.kind, PROTO_TASK_ANSWER);
	assert_string_equal(t.question, "why?");
	assert_int_equal(t.question_len, 4);
	assert_int_equal(t.top_k, 3);
	assert_int_equal(t.max_tokens, 64);
	assert_int_equal(t.document_id, 0);
	proto_task_free(&t);

	assert_int_equal(proto_task_parse(s3, strlen(s3), &t, err, sizeof(err)), 0);
	assert_int_equal(t.top_k, PROTO_TASK_DEFAULT_TOP_K);
	assert_int_equal(t.document_id, 2);
	assert_int_equal(t.chunk_mask, PROTO_TASK_CHUNKS_DEFAULT);
	proto_task_free(&t);

	/* chunk_mask: "self" or "system", answer only */
	{
		static const char s4[] = "{\"id\":\"q\",\"kind\":\"answer\",\"question\":\"?\","
					 "\"chunk_mask\":\"self\"}";
		static const char s5[] = "{\"id\":\"q\",\"kind\":\"answer\",\"question\":\"?\","
					 "\"chunk_mask\":\"system\"}";
		assert_int_equal(proto_task_parse(s4, strlen(s4), &t, err, sizeof(err)), 0);
		assert_int_equal(t.chunk_mask, PROTO_TASK_CHUNKS_SELF);
		proto_task_free(&t);
		assert_int_equal(proto_task_parse(s5, strlen(s5), &t, err, sizeof(err)), 0);
		assert_int_equal(t.chunk_mask, PROTO_TASK_CHUNKS_SYSTEM);
		proto_task_free(&t);
	}
	assert_string_equal(proto_task_kind_name(PROTO_TASK_ANSWER), "answer");
	assert_string_equal(proto_task_kind_name((enum proto_task_kind)9), "unknown");
}

static void test_not_json(void **state)
{
	expect_error("{\"id\": \"x\",", SW_EFORMAT, NULL);
	assert_non_null(strstr(err, "task: invalid JSON at line 1, column"));
	expect_error("", SW_EFORMAT, NULL);
}

static void test_not_object(void **state)
{
	expect_error("[1,2]", SW_EFORMAT, "task: expected an object, got array");
}

static void test_duplicate_key(void **state)
{
	expect_error("{\"id\":\"a\",\"id\":\"b\"}", SW_EFORMAT, NULL);
	assert_non_null(strstr(err, "duplicate"));
}

static void test_missing_id_keeps_no_id(void **state)
{
	struct proto_task t;
	static const char s[] = "{\"kind\":\"ingest\",\"text\":\"x\"}";

	assert_int_equal(proto_task_parse(s, strlen(s), &t, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "task.id: missing");
	assert_null(t.id);
	proto_task_free(&t);
}

static void test_bad_id(void **state)
{
	char big[300];

	expect_error("{\"id\":7,\"kind\":\"ingest\"}", SW_ETYPE, "task.id: expected a string, got integer");
	expect_error("{\"id\":\"\",\"kind\":\"ingest\"}", -EINVAL, "task.id: must not be empty");
	expect_error("{\"id\":\"a b\",\"kind\":\"ingest\"}", -EINVAL,
		     "task.id: character 1 is not one of [A-Za-z0-9._:-]");
	/* jansson refuses \u0000 in any string: no NUL reaches PostgreSQL. */
	expect_error("{\"id\":\"a\\u0000b\",\"kind\":\"ingest\"}", SW_EFORMAT, NULL);
	assert_non_null(strstr(err, "is not allowed"));
	snprintf(big, sizeof(big), "{\"id\":\"%0200d\",\"kind\":\"ingest\"}", 1);
	expect_error(big, SW_ETOOLONG, "task.id: 200 bytes exceeds the limit of 128");
}

static void test_unknown_kind_keeps_id(void **state)
{
	static const char s[] = "{\"id\":\"t9\",\"kind\":\"sumarize\",\"document_id\":1}";
	struct proto_task t;

	assert_int_equal(proto_task_parse(s, strlen(s), &t, err, sizeof(err)), -EINVAL);
	assert_string_equal(err,
			    "task.kind: unknown kind \"sumarize\" (expected ingest, summarize, answer)");
	assert_string_equal(t.id, "t9"); /* the failure can be stored under it */
	proto_task_free(&t);
}

static void test_kind_missing_or_wrong_type(void **state)
{
	expect_error("{\"id\":\"t\"}", -EINVAL, "task.kind: missing");
	expect_error("{\"id\":\"t\",\"kind\":[]}", SW_ETYPE, "task.kind: expected a string, got array");
}

static void test_unknown_key(void **state)
{
	expect_error("{\"id\":\"t\",\"kind\":\"ingest\",\"text\":\"x\",\"colour\":1}", -EINVAL,
		     "task.colour: unknown key for kind ingest");
	/* A key of another kind is unknown here too. */
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"document_id\":1,\"question\":\"q\"}",
		     -EINVAL, "task.question: unknown key for kind summarize");
}

static void test_ingest_text_and_url(void **state)
{
	expect_error("{\"id\":\"t\",\"kind\":\"ingest\"}", -EINVAL,
		     "task: kind ingest needs exactly one of text and url (neither given)");
	expect_error("{\"id\":\"t\",\"kind\":\"ingest\",\"text\":\"a\",\"url\":\"http://x/\"}", -EINVAL,
		     "task: kind ingest needs exactly one of text and url (both given)");
	expect_error("{\"id\":\"t\",\"kind\":\"ingest\",\"text\":5}", SW_ETYPE,
		     "task.text: expected a string, got integer");
}

static void test_bad_urls(void **state)
{
	expect_error("{\"id\":\"t\",\"kind\":\"ingest\",\"url\":\"ftp://x/y\"}", -EINVAL,
		     "task.url: unsupported scheme \"ftp\" (expected http, https, file)");
	expect_error("{\"id\":\"t\",\"kind\":\"ingest\",\"url\":\"example.com\"}", -EINVAL,
		     "task.url: not a URL: \"example.com\"");
	expect_error("{\"id\":\"t\",\"kind\":\"ingest\",\"text\":\"x\",\"callback_url\":\"file:///etc/passwd\"}",
		     -EINVAL, "task.callback_url: unsupported scheme \"file\" (expected http, https)");
}

/* head ("{...\"text\":\""), PROTO_TASK_MAX_TEXT + 1 bytes of text, then
 * "\"}": a task whose text is one byte over the limit. *len: its length. */
static char *text_over_limit(const char *head, size_t *len)
{
	size_t hl = strlen(head);
	char *s;

	*len = hl + PROTO_TASK_MAX_TEXT + 1 + 2;
	s = malloc(*len + 1);
	if (!s)
		abort();
	memset(s, 'a', *len);
	memcpy(s, head, hl);
	memcpy(s + *len - 2, "\"}", 3);
	return s;
}

/* s (a task with id "t") is refused for its text's size, the id read. */
static void expect_text_too_long(const char *s, size_t len)
{
	struct proto_task t;
	char msg[128];

	assert_int_equal(proto_task_parse(s, len, &t, err, sizeof(err)), SW_ETOOLONG);
	snprintf(msg, sizeof(msg), "task.text: %u bytes exceeds the limit of %u",
		 PROTO_TASK_MAX_TEXT + 1, PROTO_TASK_MAX_TEXT);
	assert_string_equal(err, msg);
	assert_string_equal(t.id, "t");
	proto_task_free(&t);
}

static void test_oversized(void **state)
{
	size_t len;
	char *s = text_over_limit("{\"id\":\"t\",\"kind\":\"ingest\",\"text\":\"", &len), msg[128];
	struct proto_task t;

	expect_text_too_long(s, len);

	/* The payload itself, before any parsing. */
	assert_int_equal(proto_task_parse(s, PROTO_TASK_MAX_BYTES + 1, &t, err, sizeof(err)),
			 SW_ETOOLONG);
	snprintf(msg, sizeof(msg), "task: %u bytes exceeds the limit of %u",
		 PROTO_TASK_MAX_BYTES + 1, PROTO_TASK_MAX_BYTES);
	assert_string_equal(err, msg);
	proto_task_free(&t);
	free(s);
}

static void test_summarize_errors(void **state)
{
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\"}", -EINVAL,
		     "task: kind summarize needs exactly one of document_id, text and url (none "
		     "given)");
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"document_id\":\"7\"}", SW_ETYPE,
		     "task.document_id: expected an integer, got string");
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"document_id\":0}", -EINVAL,
		     "task.document_id: expected an integer in [1, 9223372036854775807], got 0");
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"document_id\":1,\"max_tokens\":1.5}",
		     SW_ETYPE, "task.max_tokens: expected an integer, got number");
}

static void test_answer_errors(void **state)
{
	char big[PROTO_TASK_MAX_QUESTION + 100];

	expect_error("{\"id\":\"t\",\"kind\":\"answer\"}", -EINVAL,
		     "task.question: required for kind answer");
	expect_error("{\"id\":\"t\",\"kind\":\"answer\",\"question\":null}", SW_ETYPE,
		     "task.question: expected a string, got null");
	expect_error("{\"id\":\"t\",\"kind\":\"answer\",\"question\":\"q\",\"top_k\":33}", -EINVAL,
		     "task.top_k: expected an integer in [1, 32], got 33");
	expect_error("{\"id\":\"t\",\"kind\":\"answer\",\"question\":\"q\",\"top_k\":true}", SW_ETYPE,
		     "task.top_k: expected an integer, got boolean");
	expect_error("{\"id\":\"t\",\"kind\":\"answer\",\"question\":\"q\",\"chunk_mask\":\"all\"}",
		     -EINVAL, "task.chunk_mask: expected \"system\" or \"self\", got \"all\"");
	expect_error("{\"id\":\"t\",\"kind\":\"answer\",\"question\":\"q\",\"chunk_mask\":true}",
		     SW_ETYPE, "task.chunk_mask: expected a string, got boolean");
	expect_error("{\"id\":\"t\",\"kind\":\"answer\",\"question\":\"q\",\"max_tokens\":0}", -EINVAL,
		     "task.max_tokens: expected an integer in [1, 4096], got 0");
	snprintf(big, sizeof(big), "{\"id\":\"t\",\"kind\":\"answer\",\"question\":\"%0*d\"}",
		 PROTO_TASK_MAX_QUESTION + 1, 0);
	expect_error(big, SW_ETOOLONG, "task.question: 4097 bytes exceeds the limit of 4096");
}

/* summarize and answer with the document inline or by URL: one task
 * that ingests and then summarizes or answers. */
static void test_document_inline(void **state)
{
	static const char s1[] = "{\"id\":\"s\",\"kind\":\"summarize\",\"text\":\"a b c.\","
				 "\"max_tokens\":32}";
	static const char s2[] = "{\"id\":\"s\",\"kind\":\"summarize\","
				 "\"url\":\"https://example.org/a.txt\",\"source\":\"web\"}";
	static const char s3[] = "{\"id\":\"q\",\"kind\":\"answer\",\"question\":\"why?\","
				 "\"text\":\"because.\",\"top_k\":2}";
	static const char s4[] = "{\"id\":\"q\",\"kind\":\"answer\",\"question\":\"why?\","
				 "\"url\":\"file:///srv/a.txt\",\"callback_url\":\"http://cb/x\"}";
	struct proto_task t;

	assert_int_equal(proto_task_parse(s1, strlen(s1), &t, err, sizeof(err)), 0);
	assert_int_equal(t.kind, PROTO_TASK_SUMMARIZE);
	assert_string_equal(t.text, "a b c.");
	assert_int_equal(t.text_len, 6);
	assert_null(t.url);
	assert_int_equal(t.document_id, 0);
	assert_string_equal(t.source, "inline");
	assert_int_equal(t.max_tokens, 32);
	assert_true(proto_task_has_document(&t));
	proto_task_free(&t);

	assert_int_equal(proto_task_parse(s2, strlen(s2), &t, err, sizeof(err)), 0);
	assert_null(t.text);
	assert_string_equal(t.url, "https://example.org/a.txt");
	assert_string_equal(t.source, "web");
	assert_int_equal(t.max_tokens, PROTO_TASK_DEFAULT_MAX_TOKENS);
	proto_task_free(&t);

	assert_int_equal(proto_task_parse(s3, strlen(s3), &t, err, sizeof(err)), 0);
	assert_int_equal(t.kind, PROTO_TASK_ANSWER);
	assert_string_equal(t.question, "why?");
	assert_string_equal(t.text, "because.");
	assert_string_equal(t.source, "inline");
	assert_int_equal(t.top_k, 2);
	assert_int_equal(t.document_id, 0);
	proto_task_free(&t);

	assert_int_equal(proto_task_parse(s4, strlen(s4), &t, err, sizeof(err)), 0);
	assert_string_equal(t.url, "file:///srv/a.txt");
	assert_string_equal(t.source, "file:///srv/a.txt"); /* the URL by default */
	assert_string_equal(t.callback_url, "http://cb/x");
	proto_task_free(&t);
}

/* The document forms without text or url: no source, no document. */
static void test_document_by_id(void **state)
{
	static const char s1[] = "{\"id\":\"s\",\"kind\":\"summarize\",\"document_id\":3}";
	static const char s2[] = "{\"id\":\"q\",\"kind\":\"answer\",\"question\":\"q\"}";
	struct proto_task t;

	assert_int_equal(proto_task_parse(s1, strlen(s1), &t, err, sizeof(err)), 0);
	assert_false(proto_task_has_document(&t));
	assert_null(t.source);
	proto_task_free(&t);
	assert_int_equal(proto_task_parse(s2, strlen(s2), &t, err, sizeof(err)), 0);
	assert_false(proto_task_has_document(&t));
	assert_null(t.source);
	assert_int_equal(t.document_id, 0);
	proto_task_free(&t);
}

static void test_document_combinations(void **state)
{
	/* summarize: exactly one of the three */
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"document_id\":1,\"text\":\"x\"}",
		     -EINVAL, "task: kind summarize needs exactly one of document_id, text and url "
		     "(document_id and text given)");
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"text\":\"x\",\"url\":\"http://h/\"}",
		     -EINVAL, "task: kind summarize needs exactly one of document_id, text and url "
		     "(text and url given)");
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"document_id\":2,"
		     "\"url\":\"http://h/\"}",
		     -EINVAL, "task: kind summarize needs exactly one of document_id, text and url "
		     "(document_id and url given)");
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"document_id\":2,\"text\":\"x\","
		     "\"url\":\"http://h/\"}",
		     -EINVAL, "task: kind summarize needs exactly one of document_id, text and url "
		     "(document_id, text and url given)");
	/* answer: at most one */
	expect_error("{\"id\":\"t\",\"kind\":\"answer\",\"question\":\"q\",\"document_id\":1,"
		     "\"text\":\"x\"}",
		     -EINVAL, "task: kind answer takes at most one of document_id, text and url "
		     "(document_id and text given)");
	expect_error("{\"id\":\"t\",\"kind\":\"answer\",\"question\":\"q\",\"text\":\"x\","
		     "\"url\":\"https://h/\"}",
		     -EINVAL, "task: kind answer takes at most one of document_id, text and url "
		     "(text and url given)");
	/* the question is still required, and checked first */
	expect_error("{\"id\":\"t\",\"kind\":\"answer\",\"text\":\"x\",\"url\":\"https://h/\"}",
		     -EINVAL, "task.question: required for kind answer");
	/* source belongs to a text or a URL */
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"document_id\":1,\"source\":\"s\"}",
		     -EINVAL, "task.source: only with text or url");
	expect_error("{\"id\":\"t\",\"kind\":\"answer\",\"question\":\"q\",\"source\":\"s\"}",
		     -EINVAL, "task.source: only with text or url");
	/* ingest still takes no document_id */
	expect_error("{\"id\":\"t\",\"kind\":\"ingest\",\"text\":\"x\",\"document_id\":1}",
		     -EINVAL, "task.document_id: unknown key for kind ingest");
	/* each field is checked as for ingest */
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"url\":\"ftp://h/x\"}", -EINVAL,
		     "task.url: unsupported scheme \"ftp\" (expected http, https, file)");
	expect_error("{\"id\":\"t\",\"kind\":\"answer\",\"question\":\"q\",\"text\":\"\"}",
		     -EINVAL, "task.text: must not be empty");
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"text\":[\"x\"]}", SW_ETYPE,
		     "task.text: expected a string, got array");
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"text\":\"x\",\"source\":7}", SW_ETYPE,
		     "task.source: expected a string, got integer");
	expect_error("{\"id\":\"t\",\"kind\":\"summarize\",\"text\":\"x\",\"top_k\":2}", -EINVAL,
		     "task.top_k: unknown key for kind summarize");
}

/* The text limit holds for summarize and answer as it does for ingest. */
static void test_document_oversized(void **state)
{
	static const char *const heads[] = {
		"{\"id\":\"t\",\"kind\":\"summarize\",\"text\":\"",
		"{\"id\":\"t\",\"kind\":\"answer\",\"question\":\"q\",\"text\":\"",
	};
	for (size_t h = 0; h < 2; h++) {
		size_t len;
		char *s = text_over_limit(heads[h], &len);
		struct proto_task t;

		expect_text_too_long(s, len);
		/* exactly the limit is accepted */
		memcpy(s + len - 3, "\"}", 3);
		assert_int_equal(proto_task_parse(s, len - 1, &t, err, sizeof(err)), 0);
		assert_int_equal(t.text_len, PROTO_TASK_MAX_TEXT);
		proto_task_free(&t);
		free(s);
	}
}

static void test_null_payload(void **state)
{
	struct proto_task t;

	assert_int_equal(proto_task_parse(NULL, 0, &t, err, sizeof(err)), -EINVAL);
	proto_task_free(&t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ingest_text),
		cmocka_unit_test(test_ingest_url),
		cmocka_unit_test(test_summarize_and_answer),
		cmocka_unit_test(test_not_json),
		cmocka_unit_test(test_not_object),
		cmocka_unit_test(test_duplicate_key),
		cmocka_unit_test(test_missing_id_keeps_no_id),
		cmocka_unit_test(test_bad_id),
		cmocka_unit_test(test_unknown_kind_keeps_id),
		cmocka_unit_test(test_kind_missing_or_wrong_type),
		cmocka_unit_test(test_unknown_key),
		cmocka_unit_test(test_ingest_text_and_url),
		cmocka_unit_test(test_bad_urls),
		cmocka_unit_test(test_oversized),
		cmocka_unit_test(test_summarize_errors),
		cmocka_unit_test(test_answer_errors),
		cmocka_unit_test(test_document_inline),
		cmocka_unit_test(test_document_by_id),
		cmocka_unit_test(test_document_combinations),
		cmocka_unit_test(test_document_oversized),
		cmocka_unit_test(test_null_payload),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
