/* fuzz_task.c - libFuzzer target: bytes -> proto_task_parse, the task JSON
 * that anyone who can write to Redis puts on swarm:tasks (proto/task.h).
 * The whole input is the payload, so the seeds are plain JSON files.
 *
 * Checked invariants (a violation traps):
 *  - the result is 0 or one of the codes task.h lists, and an error comes
 *    with a NUL-terminated message that names the task ("task: ..." or
 *    "task.<field>: ...");
 *  - a smaller error buffer changes nothing but the message's length: same
 *    code, the message cut at the buffer's end;
 *  - on success every string is NUL-terminated within its PROTO_TASK_MAX_*
 *    limit and agrees with its length field, the id is 1..128 bytes of
 *    [A-Za-z0-9._:-], the kind is one of the three, the fields of the other
 *    kinds are unset, the document is given as each kind allows (ingest:
 *    text or url; summarize: exactly one of document_id, text and url;
 *    answer: at most one) with a source exactly when text or url is
 *    there, and integers lie in their ranges; URLs have the schemes the
 *    header allows;
 *  - on error t->id is NULL or a valid id;
 *  - proto_task_free zeroes the task, and afterwards nothing is left
 *    allocated (LeakSanitizer checks in the libFuzzer build).
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"
#include "proto/task.h"
#include "tests/fuzz/fuzz.h"

/* s is NUL-terminated within max bytes and not empty; returns its length. */
static size_t bounded(const char *s, size_t max)
{
	size_t n;

	CHECK(s != NULL);
	n = strnlen(s, max + 1);
	CHECK(n >= 1 && n <= max);
	return n;
}

static bool has_scheme(const char *url, const char *scheme)
{
	size_t n = strlen(scheme);

	return strncasecmp(url, scheme, n) == 0 && strncmp(url + n, "://", 3) == 0;
}

static void check_id(const char *id)
{
	size_t n = bounded(id, PROTO_TASK_MAX_ID);

	for (size_t i = 0; i < n; i++)
		CHECK(strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:-",
			     id[i]) != NULL);
}

static bool code_listed(int rc)
{
	return rc == SW_ETOOLONG || rc == SW_EFORMAT || rc == SW_ETYPE || rc == -EINVAL ||
	       rc == -ENOMEM;
}

static void check_ok(const struct proto_task *t)
{
	CHECK(t->root != NULL);
	check_id(t->id);
	CHECK(strcmp(proto_task_kind_name(t->kind), "unknown") != 0);
	if (t->callback_url) {
		bounded(t->callback_url, PROTO_TASK_MAX_URL);
		CHECK(has_scheme(t->callback_url, "http") || has_scheme(t->callback_url, "https"));
	}
	/* The document: text or url (with a source), or neither. */
	CHECK(!(t->text && t->url));
	if (t->text) {
		CHECK(bounded(t->text, PROTO_TASK_MAX_TEXT) == t->text_len);
	} else {
		CHECK(t->text_len == 0);
	}
	if (t->url) {
		bounded(t->url, PROTO_TASK_MAX_URL);
		CHECK(has_scheme(t->url, "http") || has_scheme(t->url, "https") ||
		      has_scheme(t->url, "file"));
	}
	if (t->text || t->url)
		bounded(t->source, PROTO_TASK_MAX_URL); /* "inline" by default */
	else
		CHECK(!t->source);
	CHECK(proto_task_has_document(t) == (t->text || t->url));
	switch (t->kind) {
	case PROTO_TASK_INGEST:
		CHECK(t->text || t->url);
		CHECK(!t->question && t->question_len == 0 && t->document_id == 0 &&
		      t->top_k == 0 && t->max_tokens == 0);
		break;
	case PROTO_TASK_SUMMARIZE:
		/* exactly one of document_id, text and url */
		CHECK((t->document_id >= 1) + !!t->text + !!t->url == 1);
		CHECK(t->document_id >= 0);
		CHECK(t->max_tokens >= 1 && t->max_tokens <= PROTO_TASK_MAX_TOKENS);
		CHECK(!t->question && t->question_len == 0 && t->top_k == 0);
		break;
	case PROTO_TASK_ANSWER:
		CHECK(bounded(t->question, PROTO_TASK_MAX_QUESTION) == t->question_len);
		/* at most one of document_id, text and url */
		CHECK(t->document_id >= 0);
		CHECK((t->document_id >= 1) + !!t->text + !!t->url <= 1);
		CHECK(t->top_k >= 1 && t->top_k <= PROTO_TASK_MAX_TOP_K);
		CHECK(t->max_tokens >= 1 && t->max_tokens <= PROTO_TASK_MAX_TOKENS);
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct proto_task zero;
	struct proto_task t;
	char err[SW_ERR_MAX], small[16];
	int rc, rc2;

	/* Fill patterns, so a message that is never written is noticed. */
	memset(err, 0x5a, sizeof(err));
	memset(small, 0x5a, sizeof(small));
	rc = proto_task_parse((const char *)data, size, &t, err, sizeof(err));
	if (rc == 0) {
		check_ok(&t);
	} else {
		CHECK(code_listed(rc));
		CHECK(memchr(err, '\0', sizeof(err)) != NULL);
		CHECK(strncmp(err, "task.", 5) == 0 || strncmp(err, "task: ", 6) == 0);
		if (t.id)
			check_id(t.id);
	}
	proto_task_free(&t);
	CHECK(memcmp(&t, &zero, sizeof(t)) == 0);

	rc2 = proto_task_parse((const char *)data, size, &t, small, sizeof(small));
	CHECK(rc2 == rc);
	if (rc) {
		CHECK(memchr(small, '\0', sizeof(small)) != NULL);
		CHECK(strncmp(small, err, strlen(small)) == 0);
		CHECK(strlen(small) == strlen(err) || strlen(small) == sizeof(small) - 1);
	}
	proto_task_free(&t);
	return 0;
}
