/* agentd_queue_test.c - agentd/queue.c against a real Redis: claim and
 * ack (which deletes the entry), the consumer's own pending entries
 * re-read after a restart, XAUTOCLAIM of an idle entry by another
 * consumer, delivery counts, dead-lettering (which deletes the original),
 * result events, the caps of the result and dead-letter streams, the
 * sweep of entries acknowledged without deletion, the lease held by
 * touch, entries deleted under a consumer, a lost group and a lost
 * connection; and, on a private Redis at its maxmemory limit, every
 * write that needs memory refused as SW_EBUSY with nothing changed while
 * acknowledgements and claims go on.
 *
 * Every test uses streams of its own (swarm:it:agentd:<pid>:<n>:*).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "agentd/queue.h"
#include "common/err.h"
#include "tests/integration/agentd_testlib.h"
#include "tests/integration/harness.h"

struct fx {
	char stream[128], dead[128], results[128];
	redisContext *admin;
};

static int counter;
static char err[SW_ERR_MAX];

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

static long long integer(redisContext *c, const char *fmt, const char *a, const char *b)
{
	redisReply *r = cmd(c, fmt, a, b);
	long long v;

	assert_int_equal(r->type, REDIS_REPLY_INTEGER);
	v = r->integer;
	freeReplyObject(r);
	return v;
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	char host[256];
	int port;

	snprintf(f->stream, sizeof(f->stream), "swarm:it:agentd:%d:%d:tasks", (int)getpid(), counter);
	snprintf(f->dead, sizeof(f->dead), "swarm:it:agentd:%d:%d:dead", (int)getpid(), counter);
	snprintf(f->results, sizeof(f->results), "swarm:it:agentd:%d:%d:results", (int)getpid(),
		 counter);
	counter++;
	if (it_parse_redis_url(it_redis_url(), host, sizeof(host), &port) != 0)
		return -1;
	f->admin = redisConnect(host, port);
	if (!f->admin || f->admin->err)
		return -1;
	*state = f;
	return 0;
}

/* The ACL user test_acl_user made ("" when none): gone after the test,
 * whether it passed or not. */
static char acl_user[64];

static int teardown(void **state)
{
	struct fx *f = *state;

	if (acl_user[0]) {
		freeReplyObject(redisCommand(f->admin, "ACL DELUSER %s", acl_user));
		acl_user[0] = '\0';
	}
	at_streams_del(f->admin, f->stream, f->dead, f->results);
	redisFree(f->admin);
	free(f);
	return 0;
}

static struct agent_queue_opts opts(struct fx *f, const char *consumer, uint32_t lease_ms)
{
	return (struct agent_queue_opts){
		.url = it_redis_url(),
		.stream = f->stream,
		.dead_stream = f->dead,
		.results_stream = f->results,
		.consumer = consumer,
		.lease_ms = lease_ms,
		.block_ms = 50,
	};
}

static struct agent_queue *open_opts(const struct agent_queue_opts *o)
{
	struct agent_queue *q;

	if (agent_queue_open(&q, o, err, sizeof(err)) != 0)
		fail_msg("open: %s", err);
	return q;
}

static struct agent_queue *open_q(struct fx *f, const char *consumer, uint32_t lease_ms)
{
	struct agent_queue_opts o = opts(f, consumer, lease_ms);

	return open_opts(&o);
}

/* XLEN of stream (0 when it does not exist). */
static long long xlen(redisContext *c, const char *stream)
{
	redisReply *r = cmd(c, "XLEN %s", stream);
	long long v;

	assert_int_equal(r->type, REDIS_REPLY_INTEGER);
	v = r->integer;
	freeReplyObject(r);
	return v;
}

static void add_to(redisContext *c, const char *stream, const char *task, char id[64])
{
	redisReply *r = cmd(c, "XADD %s * task %s", stream, task);

	assert_int_equal(r->type, REDIS_REPLY_STRING);
	if (id)
		snprintf(id, 64, "%s", r->str);
	freeReplyObject(r);
}

static void add(struct fx *f, const char *task, char id[64])
{
	add_to(f->admin, f->stream, task, id);
}

static void test_claim_and_ack(void **state)
{
	struct fx *f = *state;
	struct agent_queue *q = open_q(f, NULL, 60000);
	struct agent_queue *q2 = open_q(f, "other", 60000); /* group exists: fine */
	struct agent_msg m, m2;
	char id[64], name[300];

	snprintf(name, sizeof(name), ":%d", (int)getpid());
	assert_non_null(strstr(agent_queue_consumer(q), name));
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), SW_ENOTFOUND);
	add(f, "{\"id\":\"a\"}", id);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	assert_string_equal(m.id, id);
	assert_string_equal(m.payload, "{\"id\":\"a\"}");
	assert_int_equal(m.len, 10);
	assert_int_equal(m.deliveries, 1);
	assert_int_equal(m.source, AGENT_MSG_NEW);
	assert_int_equal(at_redis_pending(f->admin, f->stream), 1);
	/* The other consumer does not get it. */
	assert_int_equal(agent_queue_claim(q2, &m2, err, sizeof(err)), SW_ENOTFOUND);
	assert_null(m2.payload);
	assert_int_equal(xlen(f->admin, f->stream), 1);
	assert_int_equal(agent_queue_ack(q, id, err, sizeof(err)), 0);
	assert_int_equal(at_redis_pending(f->admin, f->stream), 0);
	/* Acknowledged means gone: Redis keeps no finished task. */
	assert_int_equal(xlen(f->admin, f->stream), 0);
	assert_int_equal(agent_queue_ack(q, id, err, sizeof(err)), 0); /* idempotent */
	agent_msg_free(&m);
	agent_msg_free(&m);
	agent_msg_free(NULL);
	agent_queue_close(q);
	agent_queue_close(q2);
	agent_queue_close(NULL);
}

static void test_own_pending_after_restart(void **state)
{
	struct fx *f = *state;
	struct agent_queue *q = open_q(f, "w1", 60000);
	struct agent_msg m;
	char a[64], b[64];

	add(f, "A", a);
	add(f, "B", b);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	assert_string_equal(m.id, a);
	agent_msg_free(&m);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	assert_string_equal(m.id, b);
	agent_msg_free(&m);
	agent_queue_close(q); /* "crash": nothing acknowledged */

	q = open_q(f, "w1", 60000);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	assert_string_equal(m.id, a);
	assert_int_equal(m.source, AGENT_MSG_OWN_PENDING);
	assert_int_equal(m.deliveries, 2); /* re-reading history counts */
	assert_int_equal(agent_queue_ack(q, m.id, err, sizeof(err)), 0);
	agent_msg_free(&m);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	assert_string_equal(m.id, b);
	assert_int_equal(m.source, AGENT_MSG_OWN_PENDING);
	agent_msg_free(&m);
	/* Read once: an unacknowledged one is not handed out again at once. */
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), SW_ENOTFOUND);
	assert_int_equal(at_redis_pending(f->admin, f->stream), 1);
	agent_queue_close(q);
}

static void test_autoclaim_idle(void **state)
{
	struct fx *f = *state;
	struct agent_queue *dead = open_q(f, "dead-worker", 100);
	struct agent_queue *live = open_q(f, "live-worker", 100);
	struct agent_msg m;
	char id[64];

	add(f, "T", id);
	assert_int_equal(agent_queue_claim(dead, &m, err, sizeof(err)), 0);
	agent_msg_free(&m);
	agent_queue_close(dead);
	/* Not idle long enough yet: new entries only, and none. */
	assert_int_equal(agent_queue_claim(live, &m, err, sizeof(err)), SW_ENOTFOUND);
	usleep(150 * 1000);
	assert_int_equal(agent_queue_claim(live, &m, err, sizeof(err)), 0);
	assert_string_equal(m.id, id);
	assert_string_equal(m.payload, "T");
	assert_int_equal(m.source, AGENT_MSG_RECLAIMED);
	assert_int_equal(m.deliveries, 2);
	agent_msg_free(&m);
	/* A failed attempt of our own comes back after the lease too. */
	usleep(150 * 1000);
	assert_int_equal(agent_queue_claim(live, &m, err, sizeof(err)), 0);
	assert_string_equal(m.id, id);
	assert_int_equal(m.deliveries, 3);
	agent_msg_free(&m);
	agent_queue_close(live);
}

static void test_touch_holds_lease(void **state)
{
	struct fx *f = *state;
	struct agent_queue *a = open_q(f, "holder", 200);
	struct agent_queue *b = open_q(f, "thief", 200);
	struct agent_msg m, m2;
	char id[64];

	add(f, "long task", id);
	assert_int_equal(agent_queue_claim(a, &m, err, sizeof(err)), 0);
	for (int i = 0; i < 3; i++) {
		usleep(120 * 1000);
		assert_int_equal(agent_queue_touch(a, id, err, sizeof(err)), 0);
		assert_int_equal(agent_queue_claim(b, &m2, err, sizeof(err)), SW_ENOTFOUND);
	}
	/* Touch does not count deliveries. */
	usleep(250 * 1000);
	assert_int_equal(agent_queue_claim(b, &m2, err, sizeof(err)), 0);
	assert_int_equal(m2.deliveries, 2);
	assert_int_equal(agent_queue_touch(a, id, err, sizeof(err)), SW_ENOTFOUND);
	assert_non_null(strstr(err, "no longer held by holder"));
	agent_msg_free(&m);
	agent_msg_free(&m2);
	agent_queue_close(a);
	agent_queue_close(b);
}

static void test_dead_letter_and_results(void **state)
{
	struct fx *f = *state;
	struct agent_queue *q = open_q(f, "w", 60000);
	struct agent_msg m;
	redisReply *r;
	char id[64];

	add(f, "{poison", id);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	assert_int_equal(agent_queue_dead(q, &m, "t-7", "task: invalid JSON", err, sizeof(err)), 0);
	assert_int_equal(at_redis_pending(f->admin, f->stream), 0);
	assert_int_equal(xlen(f->admin, f->stream), 0); /* moved, not copied */
	r = cmd(f->admin, "XRANGE %s - +", f->dead);
	assert_int_equal(r->elements, 1);
	{
		redisReply *fl = r->element[0]->element[1];

		assert_int_equal(fl->elements, 10);
		assert_string_equal(fl->element[0]->str, "task_id");
		assert_string_equal(fl->element[1]->str, "t-7");
		assert_string_equal(fl->element[3]->str, id);
		assert_string_equal(fl->element[5]->str, "1");
		assert_string_equal(fl->element[7]->str, "task: invalid JSON");
		assert_string_equal(fl->element[9]->str, "{poison");
	}
	freeReplyObject(r);
	agent_msg_free(&m);

	assert_int_equal(agent_queue_result(q, "t-8", "completed", "documents/3", 3, NULL, err,
					    sizeof(err)),
			 0);
	r = cmd(f->admin, "XRANGE %s - +", f->results);
	assert_int_equal(r->elements, 1);
	assert_string_equal(r->element[0]->element[1]->element[1]->str, "t-8");
	assert_string_equal(r->element[0]->element[1]->element[3]->str, "completed");
	assert_string_equal(r->element[0]->element[1]->element[5]->str, "documents/3");
	assert_string_equal(r->element[0]->element[1]->element[9]->str, "3"); /* document_id */
	freeReplyObject(r);
	agent_queue_close(q);
}

static void test_deleted_entry_skipped(void **state)
{
	struct fx *f = *state;
	struct agent_queue *q = open_q(f, "w", 60000);
	struct agent_msg m;
	char a[64], b[64];

	add(f, "gone", a);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	agent_msg_free(&m);
	agent_queue_close(q);
	assert_int_equal(integer(f->admin, "XDEL %s %s", f->stream, a), 1);
	add(f, "next", b);
	q = open_q(f, "w", 60000);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	assert_string_equal(m.id, b); /* "gone" acknowledged and skipped */
	assert_string_equal(m.payload, "next");
	assert_int_equal(agent_queue_ack(q, m.id, err, sizeof(err)), 0);
	assert_int_equal(at_redis_pending(f->admin, f->stream), 0);
	agent_msg_free(&m);
	agent_queue_close(q);
}

/* stream-node-max-entries: how far past its cap an XADD MAXLEN ~ may
 * leave a stream (it trims whole nodes only). */
static long long node_entries(redisContext *c)
{
	redisReply *r = cmd(c, "CONFIG GET stream-node-max-entries");
	long long n;

	assert_int_equal(r->type, REDIS_REPLY_ARRAY);
	assert_int_equal(r->elements, 2);
	n = atoll(r->element[1]->str);
	freeReplyObject(r);
	return n;
}

static void test_streams_capped(void **state)
{
	struct fx *f = *state;
	struct agent_queue_opts o = opts(f, "w", 60000);
	struct agent_queue *q;
	long long slack = node_entries(f->admin), n;
	struct agent_msg m;
	char id[32];

	o.results_maxlen = 50;
	o.dead_maxlen = 20;
	q = open_opts(&o);
	for (int i = 0; i < 600; i++) {
		snprintf(id, sizeof(id), "t-%d", i);
		assert_int_equal(agent_queue_result(q, id, "completed", "documents/1", i + 1, NULL,
						    err, sizeof(err)),
				 0);
	}
	n = xlen(f->admin, f->results);
	assert_true(n >= 50 && n <= 50 + slack);
	{
		/* a capped event is whole: the newest one ends with its document */
		redisReply *r = cmd(f->admin, "XREVRANGE %s + - COUNT 1", f->results);

		assert_int_equal(r->elements, 1);
		assert_int_equal(r->element[0]->element[1]->elements, 10);
		assert_string_equal(r->element[0]->element[1]->element[1]->str, "t-599");
		assert_string_equal(r->element[0]->element[1]->element[8]->str, "document_id");
		assert_string_equal(r->element[0]->element[1]->element[9]->str, "600");
		freeReplyObject(r);
	}
	for (int i = 0; i < 150; i++) {
		add(f, "{poison", NULL);
		assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
		assert_int_equal(agent_queue_dead(q, &m, "t", "bad", err, sizeof(err)), 0);
		agent_msg_free(&m);
	}
	n = xlen(f->admin, f->dead);
	assert_true(n >= 20 && n <= 20 + slack);
	assert_int_equal(xlen(f->admin, f->stream), 0);
	agent_queue_close(q);

	/* 0: not capped. */
	o.results_maxlen = 0;
	q = open_opts(&o);
	for (int i = 0; i < 300; i++)
		assert_int_equal(agent_queue_result(q, "t", "failed", NULL, 0, "e", err, sizeof(err)),
				 0);
	assert_true(xlen(f->admin, f->results) >= 300);
	agent_queue_close(q);
}

/* Entries acknowledged without XDEL (an older agentd, a tool that only
 * XACKs) go at the sweep; pending and undelivered ones stay, for every
 * group of the stream. */
static void test_sweep(void **state)
{
	struct fx *f = *state;
	struct agent_queue *q = open_q(f, "w", 60000);
	char a[64], b[64], c[64], d[64], e[64];
	struct agent_msg m;
	uint64_t removed = 9;
	redisReply *r;

	assert_int_equal(agent_queue_sweep(q, &removed, err, sizeof(err)), 0);
	assert_int_equal(removed, 0); /* an empty stream */
	add(f, "A", a);
	add(f, "B", b);
	add(f, "C", c);
	add(f, "D", d);
	add(f, "E", e);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
		agent_msg_free(&m);
	}
	assert_int_equal(integer(f->admin, "XACK %s agents %s", f->stream, a), 1);
	assert_int_equal(integer(f->admin, "XACK %s agents %s", f->stream, c), 1);
	/* B is pending: only A is below it. */
	assert_int_equal(agent_queue_sweep(q, &removed, err, sizeof(err)), 0);
	assert_int_equal(removed, 1);
	assert_int_equal(xlen(f->admin, f->stream), 4);
	assert_int_equal(integer(f->admin, "XACK %s agents %s", f->stream, b), 1);
	/* Nothing pending: everything delivered goes, D and E were not. */
	assert_int_equal(agent_queue_sweep(q, &removed, err, sizeof(err)), 0);
	assert_int_equal(removed, 2);
	r = cmd(f->admin, "XRANGE %s - +", f->stream);
	assert_int_equal(r->elements, 2);
	assert_string_equal(r->element[0]->element[0]->str, d);
	freeReplyObject(r);
	/* Another group that has read nothing keeps everything. */
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	assert_int_equal(agent_queue_ack(q, m.id, err, sizeof(err)), 0);
	agent_msg_free(&m);
	r = cmd(f->admin, "XGROUP CREATE %s other 0", f->stream);
	freeReplyObject(r);
	assert_int_equal(integer(f->admin, "XACK %s agents %s", f->stream, e), 0);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	assert_string_equal(m.id, e);
	assert_int_equal(integer(f->admin, "XACK %s agents %s", f->stream, e), 1); /* old style */
	agent_msg_free(&m);
	assert_int_equal(agent_queue_sweep(q, &removed, err, sizeof(err)), 0);
	assert_int_equal(removed, 0);
	assert_int_equal(xlen(f->admin, f->stream), 1);
	agent_queue_close(q);
}

/* A worker that dies between the XDEL and the XACK of its
 * acknowledgement leaves a deleted entry pending: the next XAUTOCLAIM
 * drops it, and nothing is handed out twice. */
static void test_deleted_pending_dropped(void **state)
{
	struct fx *f = *state;
	struct agent_queue *dead = open_q(f, "died", 100);
	struct agent_queue *live = open_q(f, "live", 100);
	struct agent_msg m;
	char a[64], b[64];

	add(f, "A", a);
	assert_int_equal(agent_queue_claim(dead, &m, err, sizeof(err)), 0);
	agent_msg_free(&m);
	agent_queue_close(dead);
	assert_int_equal(integer(f->admin, "XDEL %s %s", f->stream, a), 1);
	add(f, "B", b);
	usleep(150 * 1000);
	assert_int_equal(agent_queue_claim(live, &m, err, sizeof(err)), 0);
	assert_string_equal(m.id, b);
	assert_int_equal(at_redis_pending(f->admin, f->stream), 1); /* B only */
	assert_int_equal(agent_queue_ack(live, m.id, err, sizeof(err)), 0);
	agent_msg_free(&m);
	assert_int_equal(at_redis_pending(f->admin, f->stream), 0);
	assert_int_equal(xlen(f->admin, f->stream), 0);
	agent_queue_close(live);
}

/* A private Redis at maxmemory (noeviction, Redis's default policy):
 * writes that need memory are SW_EBUSY and change nothing; what frees
 * memory (XDEL + XACK) and what a worker needs to go on (claims, an
 * existing group) still work. */
static void test_maxmemory(void **state)
{
	struct fx *f = *state;
	struct agent_queue_opts o = opts(f, "w", 60000), o2;
	struct agent_queue *q, *q2, *q3;
	struct at_redis srv;
	redisContext *admin;
	struct agent_msg ma, mb, mc;
	char a[64], b[64], c[64], policy[64];
	uint64_t max = 9;
	redisReply *r;

	if (at_redis_start(&srv, "/tmp/agentd-redis-XXXXXX") != 0) {
		at_redis_stop(&srv);
		fail_msg("cannot start a private Redis");
	}
	admin = redisConnect(srv.host, srv.port);
	assert_true(admin && !admin->err);
	o.url = srv.url;
	o.results_maxlen = 100;
	o.dead_maxlen = 100;
	q = open_opts(&o);
	add_to(admin, f->stream, "A", a);
	add_to(admin, f->stream, "B", b);
	add_to(admin, f->stream, "C", c);
	assert_int_equal(agent_queue_claim(q, &ma, err, sizeof(err)), 0);
	assert_int_equal(agent_queue_claim(q, &mb, err, sizeof(err)), 0);

	assert_int_equal(agent_queue_memory_policy(q, &max, policy, sizeof(policy), err,
						   sizeof(err)),
			 0);
	assert_true(max == 0);
	assert_string_equal(policy, "noeviction"); /* Redis's default */
	/* What agentd warns about (at a limit Redis would evict the stream). */
	freeReplyObject(cmd(admin, "CONFIG SET maxmemory-policy allkeys-lru"));
	freeReplyObject(cmd(admin, "CONFIG SET maxmemory 1000000000"));
	assert_int_equal(agent_queue_memory_policy(q, &max, policy, sizeof(policy), err,
						   sizeof(err)),
			 0);
	assert_true(max == 1000000000);
	assert_string_equal(policy, "allkeys-lru");
	freeReplyObject(cmd(admin, "CONFIG SET maxmemory-policy noeviction"));
	freeReplyObject(cmd(admin, "CONFIG SET maxmemory 1"));
	r = cmd(admin, "XADD %s * task D", f->stream);
	assert_int_equal(r->type, REDIS_REPLY_ERROR);
	freeReplyObject(r);

	assert_int_equal(agent_queue_result(q, "t-1", "completed", "documents/1", 1, NULL, err,
					    sizeof(err)),
			 SW_EBUSY);
	assert_non_null(strstr(err, "OOM command not allowed"));
	assert_non_null(strstr(err, "maxmemory"));
	assert_int_equal(xlen(admin, f->results), 0);
	/* The dead-letter transaction is refused whole: B stays pending. */
	assert_int_equal(agent_queue_dead(q, &mb, "t-2", "bad", err, sizeof(err)), SW_EBUSY);
	assert_non_null(strstr(err, "OOM command not allowed"));
	assert_int_equal(xlen(admin, f->dead), 0);
	assert_int_equal(at_redis_pending(admin, f->stream), 2);
	/* The connection is still in step after the refused pipeline. */
	assert_int_equal(agent_queue_holds(q, mb.id, err, sizeof(err)), 0);
	/* Acknowledging frees memory and needs none. */
	assert_int_equal(agent_queue_ack(q, ma.id, err, sizeof(err)), 0);
	assert_int_equal(xlen(admin, f->stream), 2);
	assert_int_equal(at_redis_pending(admin, f->stream), 1);
	/* A worker starting now finds its group and claims. */
	o2 = o;
	o2.consumer = "w2";
	q2 = open_opts(&o2);
	assert_int_equal(agent_queue_claim(q2, &mc, err, sizeof(err)), 0);
	assert_string_equal(mc.id, c);
	/* ... but a group that does not exist cannot be made. */
	o2.stream = "swarm:it:agentd:nogroup";
	assert_int_equal(agent_queue_open(&q3, &o2, err, sizeof(err)), SW_EBUSY);
	assert_null(q3);
	assert_non_null(strstr(err, "maxmemory"));

	freeReplyObject(cmd(admin, "CONFIG SET maxmemory 0"));
	assert_int_equal(agent_queue_dead(q, &mb, "t-2", "bad", err, sizeof(err)), 0);
	assert_int_equal(xlen(admin, f->dead), 1);
	assert_int_equal(agent_queue_result(q, "t-1", "completed", "documents/1", 1, NULL, err,
					    sizeof(err)),
			 0);
	assert_int_equal(xlen(admin, f->results), 1);
	assert_int_equal(agent_queue_ack(q2, mc.id, err, sizeof(err)), 0);
	assert_int_equal(xlen(admin, f->stream), 0);
	assert_int_equal(at_redis_pending(admin, f->stream), 0);
	agent_msg_free(&ma);
	agent_msg_free(&mb);
	agent_msg_free(&mc);
	agent_queue_close(q);
	agent_queue_close(q2);
	redisFree(admin);
	at_redis_stop(&srv);
}

/* Kills the connection of consumer name (CLIENT SETNAME agentd:<name>),
 * and no other client of the server. */
static void kill_client(struct fx *f, const char *name)
{
	redisReply *r = cmd(f->admin, "CLIENT LIST");
	char needle[300];
	const char *line;
	long long id = -1;

	snprintf(needle, sizeof(needle), " name=agentd:%s ", name);
	assert_int_equal(r->type, REDIS_REPLY_STRING);
	line = strstr(r->str, needle);
	assert_non_null(line);
	while (line > r->str && line[-1] != '\n')
		line--;
	assert_int_equal(sscanf(line, "id=%lld", &id), 1);
	freeReplyObject(r);
	r = cmd(f->admin, "CLIENT KILL ID %lld", id);
	assert_int_equal(r->integer, 1);
	freeReplyObject(r);
}

static void test_lost_group_and_connection(void **state)
{
	struct fx *f = *state;
	struct agent_queue *q;
	struct agent_msg m;
	redisReply *r;
	char name[64];

	snprintf(name, sizeof(name), "killme-%d", (int)getpid());
	q = open_q(f, name, 60000);
	r = cmd(f->admin, "XGROUP DESTROY %s agents", f->stream);
	freeReplyObject(r);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), SW_ENOTFOUND);
	add(f, "after", NULL);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	assert_string_equal(m.payload, "after");
	agent_msg_free(&m);

	kill_client(f, name);
	assert_int_equal(agent_queue_ack(q, "0-1", err, sizeof(err)), SW_ECLOSED);
	assert_non_null(strstr(err, "redis: "));
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), SW_ECLOSED);
	assert_int_equal(agent_queue_reconnect(q, err, sizeof(err)), 0);
	assert_int_equal(agent_queue_reconnect(q, err, sizeof(err)), 0);
	assert_int_equal(agent_queue_ack(q, "0-1", err, sizeof(err)), 0);
	agent_queue_close(q);
}

static void test_prune_idle_consumers(void **state)
{
	struct fx *f = *state;
	struct agent_queue *gone = open_q(f, "gone", 60000);
	struct agent_queue *busy = open_q(f, "busy", 60000);
	struct agent_queue *me = open_q(f, "me", 60000);
	struct agent_msg m;
	unsigned removed = 9;
	redisReply *r;

	add(f, "one", NULL);
	add(f, "two", NULL);
	assert_int_equal(agent_queue_claim(gone, &m, err, sizeof(err)), 0);
	assert_int_equal(agent_queue_ack(gone, m.id, err, sizeof(err)), 0); /* nothing pending */
	agent_msg_free(&m);
	assert_int_equal(agent_queue_claim(busy, &m, err, sizeof(err)), 0); /* one pending */
	agent_msg_free(&m);
	/* me becomes a consumer by reading (nothing is left). */
	assert_int_equal(agent_queue_claim(me, &m, err, sizeof(err)), SW_ENOTFOUND);
	agent_queue_close(gone);
	agent_queue_close(busy);
	/* Nobody has been silent for a minute yet. */
	assert_int_equal(agent_queue_prune(me, 60000, &removed, err, sizeof(err)), 0);
	assert_int_equal(removed, 0);
	usleep(150 * 1000);
	assert_int_equal(agent_queue_prune(me, 100, &removed, err, sizeof(err)), 0);
	assert_int_equal(removed, 1);
	r = cmd(f->admin, "XINFO CONSUMERS %s agents", f->stream);
	assert_int_equal(r->elements, 2); /* busy (it holds an entry) and me */
	freeReplyObject(r);
	assert_int_equal(at_redis_pending(f->admin, f->stream), 1);
	agent_queue_close(me);
}

/* A Redis 6 ACL user in the URL, its password percent-encoded (it holds
 * '/', '@', '%' and ':'): the queue authenticates as that user (AUTH user
 * password), works on the keys the user may touch, and a wrong password is
 * refused with Redis's reason and without the password. */
static void test_acl_user(void **state)
{
	struct fx *f = *state;
	struct agent_queue_opts o = opts(f, "acl", 60000);
	struct agent_queue *q;
	struct agent_msg m;
	redisReply *r;
	char url[512], host[256], id[64], want[128];
	bool seen = false;
	int port;

	assert_int_equal(it_parse_redis_url(it_redis_url(), host, sizeof(host), &port), 0);
	snprintf(acl_user, sizeof(acl_user), "swarm-it-acl-%d", (int)getpid());
	freeReplyObject(cmd(f->admin, "ACL SETUSER %s reset on >%s ~swarm:it:* +@all", acl_user,
			    "a/b@c%d:e"));
	snprintf(url, sizeof(url), "redis://%s:a%%2Fb%%40c%%25d%%3Ae@%s:%d/0", acl_user, host,
		 port);
	o.url = url;
	q = open_opts(&o);
	add(f, "{\"id\":\"acl\"}", id);
	assert_int_equal(agent_queue_claim(q, &m, err, sizeof(err)), 0);
	assert_string_equal(m.id, id);
	assert_int_equal(agent_queue_ack(q, id, err, sizeof(err)), 0);
	agent_msg_free(&m);
	/* the queue's connection is the user's: CLIENT LIST names both */
	snprintf(want, sizeof(want), " user=%s ", acl_user);
	r = cmd(f->admin, "CLIENT LIST");
	for (char *line = strtok(r->str, "\n"); line; line = strtok(NULL, "\n"))
		seen |= strstr(line, " name=agentd:acl ") && strstr(line, want);
	freeReplyObject(r);
	assert_true(seen);
	agent_queue_close(q);

	snprintf(url, sizeof(url), "redis://%s:wr%%2Fong@%s:%d/0", acl_user, host, port);
	assert_int_equal(agent_queue_open(&q, &o, err, sizeof(err)), -EIO);
	assert_null(q);
	assert_non_null(strstr(err, "WRONGPASS"));
	assert_null(strstr(err, "wr/ong"));
	assert_null(strstr(err, "wr%2Fong"));
	/* the user's key rules hold: a stream outside swarm:it:* is refused */
	snprintf(url, sizeof(url), "redis://%s:a%%2Fb%%40c%%25d%%3Ae@%s:%d/0", acl_user, host,
		 port);
	o.stream = "swarm:acl-outside:tasks";
	assert_int_not_equal(agent_queue_open(&q, &o, err, sizeof(err)), 0);
	assert_null(q);
	assert_non_null(strstr(err, "NOPERM"));
}

static void test_open_errors(void **state)
{
	struct agent_queue_opts o = { .url = "http://x" };
	struct agent_queue *q;

	assert_int_equal(agent_queue_open(&q, &o, err, sizeof(err)), -EINVAL);
	assert_null(q);
	o.url = "redis://127.0.0.1:notaport";
	assert_int_equal(agent_queue_open(&q, &o, err, sizeof(err)), -EINVAL);
	o.url = NULL;
	assert_int_equal(agent_queue_open(&q, &o, err, sizeof(err)), -EINVAL);
	o.url = "redis://127.0.0.1:1";
	o.timeout_ms = 500;
	assert_int_equal(agent_queue_open(&q, &o, err, sizeof(err)), SW_ECLOSED);
	assert_non_null(strstr(err, "cannot connect to 127.0.0.1:1"));
	o.url = "unix:///nonexistent/redis.sock";
	assert_int_equal(agent_queue_open(&q, &o, err, sizeof(err)), SW_ECLOSED);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_claim_and_ack, setup, teardown),
		cmocka_unit_test_setup_teardown(test_own_pending_after_restart, setup, teardown),
		cmocka_unit_test_setup_teardown(test_autoclaim_idle, setup, teardown),
		cmocka_unit_test_setup_teardown(test_touch_holds_lease, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dead_letter_and_results, setup, teardown),
		cmocka_unit_test_setup_teardown(test_deleted_entry_skipped, setup, teardown),
		cmocka_unit_test_setup_teardown(test_streams_capped, setup, teardown),
		cmocka_unit_test_setup_teardown(test_sweep, setup, teardown),
		cmocka_unit_test_setup_teardown(test_deleted_pending_dropped, setup, teardown),
		cmocka_unit_test_setup_teardown(test_maxmemory, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lost_group_and_connection, setup, teardown),
		cmocka_unit_test_setup_teardown(test_prune_idle_consumers, setup, teardown),
		cmocka_unit_test_setup_teardown(test_acl_user, setup, teardown),
		cmocka_unit_test(test_open_errors),
	};
	int rc = it_start(IT_REDIS);

	if (rc)
		return rc;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
