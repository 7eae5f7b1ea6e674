/* redis_streams_test.c - the Redis Streams commands agentd relies on
 * (DESIGN §6), against a real server: consumer groups, delivery, acks,
 * the pending list, and XAUTOCLAIM of an idle task by a second consumer
 * (how a dead worker's task gets picked up).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <hiredis/hiredis.h>

#include "tests/integration/harness.h"

static char redis_host[256];
static int redis_port;

struct fixture {
	redisContext *c;
	char key[96];   /* a stream of this test only */
};

static redisReply *cmd(redisContext *c, const char *fmt, ...)
{
	va_list ap;
	redisReply *r;

	va_start(ap, fmt);
	r = redisvCommand(c, fmt, ap);
	va_end(ap);
	if (!r)
		fail_msg("redis: %s", c->errstr);
	return r;
}

/* Asserts an error reply whose text starts with prefix, then frees it. */
static void expect_error(redisReply *r, const char *prefix)
{
	assert_int_equal(r->type, REDIS_REPLY_ERROR);
	if (strncmp(r->str, prefix, strlen(prefix)) != 0)
		fail_msg("expected error '%s...', got '%s'", prefix, r->str);
	freeReplyObject(r);
}

static void expect_status(redisReply *r, const char *status)
{
	assert_int_equal(r->type, REDIS_REPLY_STATUS);
	assert_string_equal(r->str, status);
	freeReplyObject(r);
}

static void expect_integer(redisReply *r, long long v)
{
	assert_int_equal(r->type, REDIS_REPLY_INTEGER);
	assert_int_equal(r->integer, v);
	freeReplyObject(r);
}

/* XADD key * task <task>; copies the new entry id into id (32 bytes). */
static void xadd(struct fixture *f, const char *task, char id[32])
{
	redisReply *r = cmd(f->c, "XADD %s * task %s", f->key, task);

	assert_int_equal(r->type, REDIS_REPLY_STRING);
	assert_true(r->len > 0 && r->len < 32);
	memcpy(id, r->str, r->len + 1);
	freeReplyObject(r);
}

/* Checks one stream entry reply: [id, [task, <task>]]. */
static void expect_entry(const redisReply *e, const char *id, const char *task)
{
	assert_int_equal(e->type, REDIS_REPLY_ARRAY);
	assert_int_equal(e->elements, 2);
	assert_string_equal(e->element[0]->str, id);
	assert_int_equal(e->element[1]->type, REDIS_REPLY_ARRAY);
	assert_int_equal(e->element[1]->elements, 2);
	assert_string_equal(e->element[1]->element[0]->str, "task");
	assert_string_equal(e->element[1]->element[1]->str, task);
}

/* The entries of a single-stream XREADGROUP reply. */
static const redisReply *read_entries(const redisReply *r, const char *key)
{
	assert_int_equal(r->type, REDIS_REPLY_ARRAY);
	assert_int_equal(r->elements, 1);
	assert_int_equal(r->element[0]->elements, 2);
	assert_string_equal(r->element[0]->element[0]->str, key);
	return r->element[0]->element[1];
}

static int fixture_setup(void **state)
{
	static unsigned counter;
	struct timeval tv = { .tv_sec = 5 };
	struct fixture *f = test_calloc(1, sizeof(*f));

	if (!f)
		return -1;
	f->c = redisConnectWithTimeout(redis_host, redis_port, tv);
	if (!f->c || f->c->err) {
		fprintf(stderr, "connect %s:%d: %s\n", redis_host, redis_port,
			f->c ? f->c->errstr : "out of memory");
		redisFree(f->c);
		test_free(f);
		return -1;
	}
	snprintf(f->key, sizeof(f->key), "swarm:it:%ld:%ld:%u", (long)getpid(),
		 (long)time(NULL), counter++);
	*state = f;
	return 0;
}

static int fixture_teardown(void **state)
{
	struct fixture *f = *state;
	redisReply *r = redisCommand(f->c, "DEL %s", f->key);

	freeReplyObject(r);
	redisFree(f->c);
	test_free(f);
	return 0;
}

static void test_group_create(void **state)
{
	struct fixture *f = *state;

	/* Without MKSTREAM a group needs an existing stream. */
	expect_error(cmd(f->c, "XGROUP CREATE %s workers $", f->key), "ERR");
	expect_status(cmd(f->c, "XGROUP CREATE %s workers $ MKSTREAM", f->key), "OK");
	expect_integer(cmd(f->c, "XLEN %s", f->key), 0);
	/* Creating it twice is an error agentd must tolerate at start-up. */
	expect_error(cmd(f->c, "XGROUP CREATE %s workers $ MKSTREAM", f->key),
		     "BUSYGROUP");
}

static void test_deliver_ack_pending(void **state)
{
	struct fixture *f = *state;
	char id[3][32];
	const redisReply *e;
	redisReply *r;

	expect_status(cmd(f->c, "XGROUP CREATE %s workers $ MKSTREAM", f->key), "OK");
	xadd(f, "ingest:1", id[0]);
	xadd(f, "summarize:2", id[1]);
	xadd(f, "answer:3", id[2]);
	assert_true(strcmp(id[0], id[1]) != 0 && strcmp(id[1], id[2]) != 0);

	r = cmd(f->c, "XREADGROUP GROUP workers c1 COUNT 2 STREAMS %s >", f->key);
	e = read_entries(r, f->key);
	assert_int_equal(e->elements, 2);
	expect_entry(e->element[0], id[0], "ingest:1");
	expect_entry(e->element[1], id[1], "summarize:2");
	freeReplyObject(r);

	/* Summary form: count, smallest id, largest id, per-consumer counts. */
	r = cmd(f->c, "XPENDING %s workers", f->key);
	assert_int_equal(r->type, REDIS_REPLY_ARRAY);
	assert_int_equal(r->elements, 4);
	assert_int_equal(r->element[0]->integer, 2);
	assert_string_equal(r->element[1]->str, id[0]);
	assert_string_equal(r->element[2]->str, id[1]);
	assert_int_equal(r->element[3]->elements, 1);
	assert_string_equal(r->element[3]->element[0]->element[0]->str, "c1");
	assert_string_equal(r->element[3]->element[0]->element[1]->str, "2");
	freeReplyObject(r);

	expect_integer(cmd(f->c, "XACK %s workers %s", f->key, id[0]), 1);
	/* A second ack of the same id is a no-op: redelivery stays idempotent. */
	expect_integer(cmd(f->c, "XACK %s workers %s", f->key, id[0]), 0);

	/* Extended form: id, consumer, idle ms, delivery count. */
	r = cmd(f->c, "XPENDING %s workers - + 10", f->key);
	assert_int_equal(r->type, REDIS_REPLY_ARRAY);
	assert_int_equal(r->elements, 1);
	assert_string_equal(r->element[0]->element[0]->str, id[1]);
	assert_string_equal(r->element[0]->element[1]->str, "c1");
	assert_int_equal(r->element[0]->element[3]->integer, 1);
	freeReplyObject(r);

	/* The third entry is still new for the group. */
	r = cmd(f->c, "XREADGROUP GROUP workers c1 STREAMS %s >", f->key);
	e = read_entries(r, f->key);
	assert_int_equal(e->elements, 1);
	expect_entry(e->element[0], id[2], "answer:3");
	freeReplyObject(r);

	/* Nothing left: a blocking-free read returns nil. */
	r = cmd(f->c, "XREADGROUP GROUP workers c1 STREAMS %s >", f->key);
	assert_int_equal(r->type, REDIS_REPLY_NIL);
	freeReplyObject(r);
}

static void test_autoclaim_idle(void **state)
{
	struct fixture *f = *state;
	char id[2][32];
	const redisReply *e;
	redisReply *r;

	expect_status(cmd(f->c, "XGROUP CREATE %s workers $ MKSTREAM", f->key), "OK");
	xadd(f, "ingest:7", id[0]);
	xadd(f, "ingest:8", id[1]);

	/* c1 takes both, finishes the first, then "dies" holding the second. */
	r = cmd(f->c, "XREADGROUP GROUP workers c1 COUNT 2 STREAMS %s >", f->key);
	assert_int_equal(read_entries(r, f->key)->elements, 2);
	freeReplyObject(r);
	expect_integer(cmd(f->c, "XACK %s workers %s", f->key, id[0]), 1);

	/* A lease of an hour has not expired: nothing is claimed. */
	r = cmd(f->c, "XAUTOCLAIM %s workers c2 3600000 0-0 COUNT 10", f->key);
	assert_int_equal(r->type, REDIS_REPLY_ARRAY);
	assert_true(r->elements >= 2);
	assert_string_equal(r->element[0]->str, "0-0");
	assert_int_equal(r->element[1]->elements, 0);
	freeReplyObject(r);

	/* After 50 ms the entry has been idle for at least 50 ms, so a 20 ms
	 * lease has certainly expired (no timing is asserted). */
	usleep(50 * 1000);
	r = cmd(f->c, "XAUTOCLAIM %s workers c2 20 0-0 COUNT 10", f->key);
	assert_int_equal(r->type, REDIS_REPLY_ARRAY);
	assert_string_equal(r->element[0]->str, "0-0"); /* scan complete */
	e = r->element[1];
	assert_int_equal(e->elements, 1);
	expect_entry(e->element[0], id[1], "ingest:8");
	if (r->elements >= 3) /* Redis >= 7: ids deleted meanwhile */
		assert_int_equal(r->element[2]->elements, 0);
	freeReplyObject(r);

	/* Now c2 owns it, delivered twice. */
	r = cmd(f->c, "XPENDING %s workers - + 10", f->key);
	assert_int_equal(r->elements, 1);
	assert_string_equal(r->element[0]->element[0]->str, id[1]);
	assert_string_equal(r->element[0]->element[1]->str, "c2");
	assert_int_equal(r->element[0]->element[3]->integer, 2);
	freeReplyObject(r);

	/* c2 sees it in its own history (id 0), c1 no longer does. */
	r = cmd(f->c, "XREADGROUP GROUP workers c2 STREAMS %s 0", f->key);
	e = read_entries(r, f->key);
	assert_int_equal(e->elements, 1);
	expect_entry(e->element[0], id[1], "ingest:8");
	freeReplyObject(r);
	r = cmd(f->c, "XREADGROUP GROUP workers c1 STREAMS %s 0", f->key);
	assert_int_equal(read_entries(r, f->key)->elements, 0);
	freeReplyObject(r);

	/* The dead consumer holds nothing any more: deleting it drops 0. */
	expect_integer(cmd(f->c, "XGROUP DELCONSUMER %s workers c1", f->key), 0);
	expect_integer(cmd(f->c, "XACK %s workers %s", f->key, id[1]), 1);
	r = cmd(f->c, "XPENDING %s workers", f->key);
	assert_int_equal(r->element[0]->integer, 0);
	freeReplyObject(r);
}

static void test_errors(void **state)
{
	struct fixture *f = *state;

	/* Reading through a group that does not exist. */
	expect_status(cmd(f->c, "XGROUP CREATE %s workers $ MKSTREAM", f->key), "OK");
	expect_error(cmd(f->c, "XREADGROUP GROUP nogroup c1 STREAMS %s >", f->key),
		     "NOGROUP");
	expect_error(cmd(f->c, "XACK %s workers not-an-id", f->key), "ERR");
	expect_error(cmd(f->c, "XAUTOCLAIM %s workers c2 soon 0-0", f->key),
		     "ERR Invalid min-idle-time");
	/* A stream command on a key of another type. */
	expect_integer(cmd(f->c, "DEL %s", f->key), 1);
	expect_status(cmd(f->c, "SET %s plain", f->key), "OK");
	expect_error(cmd(f->c, "XADD %s * task x", f->key), "WRONGTYPE");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_group_create,
						fixture_setup, fixture_teardown),
		cmocka_unit_test_setup_teardown(test_deliver_ack_pending,
						fixture_setup, fixture_teardown),
		cmocka_unit_test_setup_teardown(test_autoclaim_idle,
						fixture_setup, fixture_teardown),
		cmocka_unit_test_setup_teardown(test_errors,
						fixture_setup, fixture_teardown),
	};
	int rc = it_start(IT_REDIS);

	if (rc != 0)
		return rc;
	if (it_parse_redis_url(it_redis_url(), redis_host, sizeof(redis_host),
			       &redis_port) != 0)
		return IT_EXIT_FAIL;
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	it_stop();
	return rc;
}
