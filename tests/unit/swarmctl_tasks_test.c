/* swarmctl_tasks_test.c - the task JSON swarmctl submits is what the
 * workers' parser accepts (proto/task.h): one task per input, the input
 * inside the summarize or answer (text inline or URL), with every input
 * error caught before anything is queued; task ids; the summary count
 * behind the progress bar. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "proto/task.h"
#include "swarmctl/tasks.h"

static char dir[] = "/tmp/swarmctl_tasks_test.XXXXXX";

static void write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

static void path_in(char *out, size_t cap, const char *name)
{
	assert_true((size_t)snprintf(out, cap, "%s/%s", dir, name) < cap);
}

/* Parses json with the workers' parser; the caller frees the task. */
static void parse_ok(const char *json, struct proto_task *t)
{
	char err[SW_ERR_MAX] = "";
	int rc = proto_task_parse(json, strlen(json), t, err, sizeof(err));

	if (rc)
		print_error("proto_task_parse: %s\n", err);
	assert_int_equal(rc, 0);
}

static void test_ingest_file(void **state)
{
	const char text[] = "The tide comes in twice a day.\nIt goes out twice too.\n";
	char p[PATH_MAX], real[PATH_MAX], err[SW_ERR_MAX];
	struct proto_task t;
	char *json;

	(void)state;
	path_in(p, sizeof(p), "tides.txt");
	write_file(p, text, strlen(text));
	assert_int_equal(ctl_task_json("ing-1", "ingest", p, NULL, 0, &json, err, sizeof(err)), 0);
	parse_ok(json, &t);
	assert_string_equal(t.id, "ing-1");
	assert_int_equal(t.kind, PROTO_TASK_INGEST);
	assert_int_equal(t.text_len, strlen(text));
	assert_memory_equal(t.text, text, strlen(text));
	assert_null(t.url);
	assert_non_null(realpath(p, real));
	assert_string_equal(t.source, real);
	proto_task_free(&t);
	free(json);
}

static void test_ingest_url(void **state)
{
	char err[SW_ERR_MAX];
	struct proto_task t;
	char *json;

	(void)state;
	assert_int_equal(ctl_task_json("ing-2", "ingest", "https://example.org/a.txt", NULL, 0,
				       &json, err, sizeof(err)), 0);
	parse_ok(json, &t);
	assert_string_equal(t.url, "https://example.org/a.txt");
	assert_null(t.text);
	proto_task_free(&t);
	free(json);
}

static void test_ingest_errors(void **state)
{
	char p[PATH_MAX], err[SW_ERR_MAX], *json = (char *)1, *big;
	const unsigned char bad_utf8[] = { 'o', 'k', 0xff, 0xfe, '\n' };
	size_t n = PROTO_TASK_MAX_TEXT + 1;

	(void)state;
	path_in(p, sizeof(p), "missing.txt");
	assert_int_equal(ctl_task_json("x", "ingest", p, NULL, 0, &json, err, sizeof(err)),
			 -ENOENT);
	assert_null(json);
	assert_non_null(strstr(err, "missing.txt"));

	path_in(p, sizeof(p), "empty.txt");
	write_file(p, "", 0);
	assert_int_equal(ctl_task_json("x", "ingest", p, NULL, 0, &json, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "empty"));

	path_in(p, sizeof(p), "latin1.txt");
	write_file(p, bad_utf8, sizeof(bad_utf8));
	assert_int_equal(ctl_task_json("x", "ingest", p, NULL, 0, &json, err, sizeof(err)),
			 SW_EFORMAT);
	assert_non_null(strstr(err, "UTF-8"));

	path_in(p, sizeof(p), "big.txt");
	big = malloc(n);
	assert_non_null(big);
	memset(big, 'a', n);
	write_file(p, big, n);
	free(big);
	assert_int_equal(ctl_task_json("x", "ingest", p, NULL, 0, &json, err, sizeof(err)),
			 SW_ETOOLONG);
	assert_null(json);

	/* a directory cannot be read as text */
	assert_int_not_equal(ctl_task_json("x", "ingest", dir, NULL, 0, &json, err, sizeof(err)),
			     0);
	assert_null(json);

	big = malloc(PROTO_TASK_MAX_URL + 32);
	assert_non_null(big);
	strcpy(big, "https://example.org/");
	memset(big + 20, 'a', PROTO_TASK_MAX_URL);
	big[PROTO_TASK_MAX_URL + 20] = '\0';
	assert_int_equal(ctl_task_json("x", "ingest", big, NULL, 0, &json, err, sizeof(err)),
			 SW_ETOOLONG);
	free(big);
}

/* Exactly the limit is accepted, by swarmctl and by agentd. */
static void test_ingest_at_limit(void **state)
{
	char p[PATH_MAX], err[SW_ERR_MAX], *json, *big;
	struct proto_task t;

	(void)state;
	path_in(p, sizeof(p), "limit.txt");
	big = malloc(PROTO_TASK_MAX_TEXT);
	assert_non_null(big);
	memset(big, 'b', PROTO_TASK_MAX_TEXT);
	write_file(p, big, PROTO_TASK_MAX_TEXT);
	free(big);
	assert_int_equal(ctl_task_json("lim", "ingest", p, NULL, 0, &json, err, sizeof(err)), 0);
	parse_ok(json, &t);
	assert_int_equal(t.text_len, PROTO_TASK_MAX_TEXT);
	proto_task_free(&t);
	free(json);
	unlink(p);
}

/* summarize and answer carry their input: one task each. */
static void test_task_with_input(void **state)
{
	const char text[] = "Sourdough keeps because it is acidic.\n";
	char p[PATH_MAX], real[PATH_MAX], err[SW_ERR_MAX];
	struct proto_task t;
	char *json;

	(void)state;
	path_in(p, sizeof(p), "tides.txt");
	write_file(p, text, strlen(text));
	assert_int_equal(ctl_task_json("sum-1", "summarize", p, NULL, 64, &json, err, sizeof(err)),
			 0);
	parse_ok(json, &t);
	assert_string_equal(t.id, "sum-1");
	assert_int_equal(t.kind, PROTO_TASK_SUMMARIZE);
	assert_true(proto_task_has_document(&t));
	assert_memory_equal(t.text, text, strlen(text));
	assert_int_equal(t.document_id, 0);
	assert_non_null(realpath(p, real));
	assert_string_equal(t.source, real);
	assert_int_equal(t.max_tokens, 64);
	proto_task_free(&t);
	free(json);

	assert_int_equal(ctl_task_json("sum-2", "summarize", "https://example.org/a.txt", NULL, 0,
				       &json, err, sizeof(err)), 0);
	parse_ok(json, &t);
	assert_string_equal(t.url, "https://example.org/a.txt");
	assert_null(t.text);
	assert_int_equal(t.max_tokens, PROTO_TASK_DEFAULT_MAX_TOKENS);
	proto_task_free(&t);
	free(json);

	assert_int_equal(ctl_task_json("ask-1", "answer", p, "Why \"keep\"?\n", 16, &json, err,
				       sizeof(err)), 0);
	parse_ok(json, &t);
	assert_int_equal(t.kind, PROTO_TASK_ANSWER);
	assert_string_equal(t.question, "Why \"keep\"?\n");
	assert_memory_equal(t.text, text, strlen(text));
	assert_int_equal(t.max_tokens, 16);
	proto_task_free(&t);
	free(json);

	/* ingest takes no max_tokens: it is left out */
	assert_int_equal(ctl_task_json("ing-1", "ingest", p, NULL, 64, &json, err, sizeof(err)), 0);
	assert_null(strstr(json, "max_tokens"));
	parse_ok(json, &t);
	proto_task_free(&t);
	free(json);
}

/* The answer over every document: no input, no document_id. */
static void test_answer_over_every_document(void **state)
{
	char err[SW_ERR_MAX];
	struct proto_task t;
	char *json;

	(void)state;
	assert_int_equal(ctl_task_json("ask-2", "answer", NULL, "Which one?", 0, &json, err,
				       sizeof(err)), 0);
	assert_null(strstr(json, "document_id"));
	parse_ok(json, &t);
	assert_false(proto_task_has_document(&t));
	assert_int_equal(t.document_id, 0);
	assert_int_equal(t.max_tokens, PROTO_TASK_DEFAULT_MAX_TOKENS);
	proto_task_free(&t);
	free(json);
}

/* What makes no task is refused before anything is queued. */
static void test_task_json_errors(void **state)
{
	char err[SW_ERR_MAX], *json = (char *)1;

	(void)state;
	assert_int_equal(ctl_task_json("x", "summarize", NULL, NULL, 0, &json, err, sizeof(err)),
			 -EINVAL);
	assert_null(json);
	assert_string_equal(err, "kind summarize needs an input");
	assert_int_equal(ctl_task_json("x", "ingest", NULL, NULL, 0, &json, err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(ctl_task_json("x", "answer", NULL, NULL, 0, &json, err, sizeof(err)),
			 -EINVAL);
	assert_string_equal(err, "a question goes with kind answer only");
	assert_int_equal(ctl_task_json("x", "summarize", "https://h/", "q", 0, &json, err,
				       sizeof(err)), -EINVAL);
	assert_int_equal(ctl_task_json("x", "sumarize", "https://h/", NULL, 0, &json, err,
				       sizeof(err)), -EINVAL);
	assert_string_equal(err, "unknown kind \"sumarize\"");
	assert_null(json);
}

static void test_task_id(void **state)
{
	char a[96], b[96], err[SW_ERR_MAX];
	struct proto_task t;
	char *json;

	(void)state;
	ctl_task_id(a, sizeof(a), "sum", 0);
	ctl_task_id(b, sizeof(b), "sum", 1);
	assert_string_not_equal(a, b);
	assert_int_equal(strncmp(a, "sum-", 4), 0);
	assert_int_equal(a[strlen(a) - 1], '1');
	assert_int_equal(b[strlen(b) - 1], '2');
	assert_true(strlen(a) <= PROTO_TASK_MAX_ID);
	assert_int_equal(strspn(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
				"0123456789._:-"), strlen(a));
	/* agentd accepts it */
	assert_int_equal(ctl_task_json(a, "summarize", "https://example.org/", NULL, 0, &json, err,
				       sizeof(err)), 0);
	parse_ok(json, &t);
	assert_string_equal(t.id, a);
	proto_task_free(&t);
	free(json);
}

static void test_expected_summaries(void **state)
{
	(void)state;
	assert_int_equal(ctl_expected_summaries(0, 4), 1);
	assert_int_equal(ctl_expected_summaries(1, 4), 1);
	assert_int_equal(ctl_expected_summaries(4, 4), 5);   /* 4 + 1 */
	assert_int_equal(ctl_expected_summaries(5, 4), 8);   /* 5 + 2 + 1 */
	assert_int_equal(ctl_expected_summaries(9, 4), 13);  /* 9 + 3 + 1 */
	assert_int_equal(ctl_expected_summaries(51, 4), 69); /* 51 + 13 + 4 + 1 */
	assert_int_equal(ctl_expected_summaries(3, 1), 3);
}

static int setup(void **state)
{
	(void)state;
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	static const char *const names[] = { "tides.txt", "empty.txt", "latin1.txt", "big.txt",
					     "limit.txt" };
	char p[PATH_MAX];

	(void)state;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		unlink(p);
	}
	return rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ingest_file),
		cmocka_unit_test(test_ingest_url),
		cmocka_unit_test(test_ingest_errors),
		cmocka_unit_test(test_ingest_at_limit),
		cmocka_unit_test(test_task_with_input),
		cmocka_unit_test(test_answer_over_every_document),
		cmocka_unit_test(test_task_json_errors),
		cmocka_unit_test(test_task_id),
		cmocka_unit_test(test_expected_summaries),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
