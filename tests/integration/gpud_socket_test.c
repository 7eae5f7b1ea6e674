/* gpud_socket_test.c - the trust boundary of gpud's socket, against a real
 * `gpud serve` (tests/integration/gpud_harness.h):
 *
 *  1. the socket file has the configured mode and group as soon as gpud
 *     is up; a peer whose uid the configuration does not admit (a child
 *     that became nobody, 65534) is refused at accept with the client
 *     library's -EACCES message, logged and counted, while an admitted
 *     non-root peer (65533) generates; a configuration that lists nobody
 *     admits it;
 *  2. an unknown socket group is a configuration error `gpud serve
 *     --check` names;
 *  3. a hostile client rewrites its request area while gpud decodes and
 *     tokenizes it (a thread flipping bytes over it while the client
 *     submits in a loop, and now and then garbage in its ring's consumer
 *     index, which gpud answers by closing that connection): gpud does
 *     not crash, and an honest client
 *     running at the same time gets exactly the outputs it gets alone
 *     (greedy sampling).
 *
 * The peer tests need root (to become other users): they skip otherwise.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "proto/client.h"
#include "proto/frame.h"
#include "tests/integration/gpud_harness.h"

#define NOBODY 65534
#define OTHER 65533 /* a uid no account has: admitted by number */

/* --- peers as other users ------------------------------------------------ */

/* In a child: become uid/gid (no supplementary groups), connect with the
 * client library and generate a few tokens. Exit 0 when it generated,
 * 13 when refused with -EACCES and the message that names the rule, 1
 * otherwise (with a line on stderr). */
static int as_user(const char *sock, uid_t uid, gid_t gid)
{
	struct proto_client_opts o;
	struct proto_client *c = NULL;
	struct proto_client_result res = { 0 };
	char err[SW_ERR_MAX] = "";
	int rc;

	if (setgroups(0, NULL) || setgid(gid) || setuid(uid)) {
		fprintf(stderr, "child: cannot become %u/%u: %s\n", (unsigned)uid, (unsigned)gid,
			strerror(errno));
		return 1;
	}
	proto_client_opts_default(&o);
	o.timeout_ms = 60000;
	rc = proto_client_connect(&c, sock, &o, err, sizeof(err));
	if (rc == -EACCES && strstr(err, "refused this client") &&
	    strstr(err, "gpud.allowed_uids")) {
		printf("    uid %u: %s\n", (unsigned)uid, err);
		return 13;
	}
	if (rc) {
		fprintf(stderr, "child %u: connect: %s (%s)\n", (unsigned)uid, err, sw_errname(rc));
		return 1;
	}
	struct proto_segment seg = { .text = "Once upon a time", .len = 16 };
	struct proto_submit_req req = { .n_segments = 1, .segments = &seg, .max_tokens = 4 };
	proto_sampling_default(&req.sampling);
	rc = proto_client_generate(c, &req, &res, err, sizeof(err));
	if (rc == 0)
		printf("    uid %u: generated \"%s\"\n", (unsigned)uid, res.text);
	else
		fprintf(stderr, "child %u: generate: %s (%s)\n", (unsigned)uid, err, sw_errname(rc));
	proto_client_result_free(&res);
	proto_client_close(c);
	return rc ? 1 : 0;
}

static int run_as(const char *sock, uid_t uid, gid_t gid)
{
	int st;
	pid_t pid;

	fflush(stdout);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int rc = as_user(sock, uid, gid);
		fflush(stdout);
		_exit(rc);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

static int64_t stat_int(const struct gpud_it *d, const char *path)
{
	struct proto_client *c = gpud_it_connect(d);
	json_t *j;
	int64_t v = -1;

	assert_non_null(c);
	assert_non_null(j = gpud_it_stats(c, false));
	assert_int_equal(gpud_it_jint(j, path, &v), 0);
	json_decref(j);
	proto_client_close(c);
	return v;
}

/* Starts gpud with extra gpud keys, and lets other users through the
 * test's private directory (0700) to the socket, so that only the
 * socket's own mode and gpud's check decide. */
static void start_open(struct gpud_it *d, const char *extra)
{
	struct gpud_it_opts o = { .gpud_extra = extra };

	assert_int_equal(gpud_it_start(d, &o), 0);
	assert_int_equal(chmod(d->dir, 0711), 0);
}

static void test_peer_check(void **state)
{
	struct gpud_it_fix *f = *state;
	struct stat st;

	if (geteuid() != 0) {
		printf("    not root: cannot become another user\n");
		f->done = true;
		skip();
	}
	/* Mode 0606: the file lets everyone in (other rw), not the group. */
	start_open(&f->d[0], "\"kv_blocks\": 256, \"socket_mode\": \"0606\", "
			     "\"socket_group\": \"4242\", \"allowed_uids\": [65533]");
	assert_int_equal(lstat(f->d[0].socket, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	printf("    socket: mode %04o, uid %u, gid %u\n", (unsigned)(st.st_mode & 07777),
	       (unsigned)st.st_uid, (unsigned)st.st_gid);
	assert_int_equal(st.st_mode & 07777, 0606);
	assert_int_equal(st.st_gid, 4242);
	assert_int_equal(st.st_uid, 0);

	assert_int_equal(run_as(f->d[0].socket, NOBODY, NOBODY), 13);
	assert_int_equal(run_as(f->d[0].socket, OTHER, OTHER), 0);
	assert_int_equal(stat_int(&f->d[0], "connections.refused_peer"), 1);
	assert_true(gpud_it_file_has(f->d[0].log, "refused peer pid"));
	assert_true(gpud_it_file_has(f->d[0].log, "uid 65534 gid 65534"));
	/* Refused peers in a burst: one log line a second, every one counted. */
	for (int i = 0; i < 5; i++)
		assert_int_equal(run_as(f->d[0].socket, NOBODY, NOBODY), 13);
	assert_int_equal(stat_int(&f->d[0], "connections.refused_peer"), 6);
	assert_int_equal(gpud_it_stop(&f->d[0], SIGTERM, 60000), 0);
	gpud_it_free(&f->d[0]);

	/* The same peer, now listed by name. */
	start_open(&f->d[0], "\"kv_blocks\": 256, \"socket_mode\": \"0606\", "
			     "\"allowed_uids\": [\"nobody\"]");
	assert_int_equal(lstat(f->d[0].socket, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0606);
	assert_int_equal(st.st_gid, getegid()); /* socket_group "": gpud's own */
	assert_int_equal(run_as(f->d[0].socket, NOBODY, NOBODY), 0);
	assert_int_equal(run_as(f->d[0].socket, OTHER, OTHER), 13);
	assert_int_equal(stat_int(&f->d[0], "connections.refused_peer"), 1);
	assert_int_equal(gpud_it_stop(&f->d[0], SIGTERM, 60000), 0);
	gpud_it_free(&f->d[0]);

	/* By group: the socket's group with a mode that gives it rw (the
	 * file's 0660 lets nobody in through its gid alone). */
	start_open(&f->d[0], "\"kv_blocks\": 256, \"socket_group\": \"nogroup\"");
	assert_int_equal(lstat(f->d[0].socket, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0660);
	assert_int_equal(st.st_gid, NOBODY);
	assert_int_equal(run_as(f->d[0].socket, NOBODY, NOBODY), 0);
	assert_int_equal(stat_int(&f->d[0], "connections.refused_peer"), 0);
	assert_int_equal(gpud_it_stop(&f->d[0], SIGTERM, 60000), 0);
	f->done = true;
}

static void test_check_socket_keys(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = { .gpud_extra = "\"socket_group\": \"no-such-group-i13\"" };
	const char *args[] = { "serve", "--check", "--config", f->d[0].config, NULL };
	char out[4096];
	int rc;

	assert_int_equal(gpud_it_prepare(&f->d[0], &o), 0);
	rc = gpud_it_run_cmd(args, out, sizeof(out), 60000);
	printf("    unknown socket group -> exit %d: %s", rc, out);
	assert_int_equal(rc, 1);
	assert_non_null(strstr(out, "gpud.socket_group: no group named \"no-such-group-i13\""));
	gpud_it_free(&f->d[0]);

	o.gpud_extra = "\"socket_mode\": \"0644\"";
	assert_int_equal(gpud_it_prepare(&f->d[0], &o), 0);
	rc = gpud_it_run_cmd(args, out, sizeof(out), 60000);
	printf("    socket_mode 0644 -> exit %d: %s", rc, out);
	assert_int_equal(rc, 0); /* owner rw: fine (the group may not connect) */
	gpud_it_free(&f->d[0]);

	o.gpud_extra = "\"socket_mode\": \"0444\"";
	assert_int_equal(gpud_it_prepare(&f->d[0], &o), 0);
	rc = gpud_it_run_cmd(args, out, sizeof(out), 60000);
	printf("    socket_mode 0444 -> exit %d: %s", rc, out);
	assert_int_equal(rc, 1);
	assert_non_null(strstr(out, "gpud.socket_mode: expected an octal mode string"));
	f->done = true;
}

/* --- a client that rewrites its request area ---------------------------- */

#define HONEST_PROMPTS 6
#define HONEST_TOKENS 24
#define HOSTILE_MIN 300   /* submits the hostile client makes at least */
#define LONG_TEXT 1000    /* bytes of its long prompt (no spaces; fits the context) */

static const char *const honest_prompts[HONEST_PROMPTS] = {
	"Once upon a time",
	"The little dog",
	"Lily and Tom went to the park",
	"One day, a big",
	"She saw a bird in the tree and",
	"Tim had a red ball. He",
};

struct outputs {
	char text[HONEST_PROMPTS][1024];
	int32_t ids[HONEST_PROMPTS][HONEST_TOKENS];
	uint32_t n_ids[HONEST_PROMPTS];
};

/* The honest client: every prompt once, greedy, on one connection. */
static void honest_run(const struct gpud_it *d, struct outputs *out)
{
	struct proto_client *c = gpud_it_connect(d);
	char err[SW_ERR_MAX];

	assert_non_null(c);
	memset(out, 0, sizeof(*out));
	for (int i = 0; i < HONEST_PROMPTS; i++) {
		struct proto_segment seg = { .text = honest_prompts[i],
					     .len = (uint32_t)strlen(honest_prompts[i]) };
		struct proto_submit_req req = { .n_segments = 1, .segments = &seg,
						.max_tokens = HONEST_TOKENS };
		struct proto_client_result res = { 0 };
		int rc;

		proto_sampling_default(&req.sampling); /* temperature 0: greedy */
		rc = proto_client_generate(c, &req, &res, err, sizeof(err));
		if (rc)
			fail_msg("honest prompt %d: %s (%s)", i, err, sw_errname(rc));
		snprintf(out->text[i], sizeof(out->text[i]), "%s", res.text);
		assert_true(res.n_ids <= HONEST_TOKENS);
		memcpy(out->ids[i], res.ids, res.n_ids * sizeof(int32_t));
		out->n_ids[i] = res.n_ids;
		proto_client_result_free(&res);
	}
	proto_client_close(c);
}

/* The request area of the one connection this process has: the memfd
 * mapping named in /proc/self/maps, its layout from the region header
 * (proto/README.md §3); *tail gets the ring's consumer index, which the
 * client writes too. */
static uint8_t *find_request_area(size_t *size, uint8_t **tail)
{
	FILE *fp = fopen("/proc/self/maps", "re");
	char line[512];
	uint8_t *base = NULL;

	if (!fp)
		return NULL;
	while (fgets(line, sizeof(line), fp)) {
		unsigned long lo;
		if (strstr(line, "/memfd:swarm-conn") && sscanf(line, "%lx-", &lo) == 1) {
			base = (uint8_t *)lo;
			break;
		}
	}
	fclose(fp);
	if (!base)
		return NULL;
	*size = (size_t)proto_get64(base + 40);
	*tail = base + proto_get64(base + 16) + 64;
	return base + proto_get64(base + 32);
}

struct flipper {
	uint8_t *area;
	uint8_t *tail;      /* the ring's consumer index */
	uint64_t tails;     /* times it was overwritten */
	size_t span;        /* bytes at the start of the area the requests use */
	atomic_bool stop;
	uint64_t flips;
};

/* Flips bytes over the payloads the submitter writes, in bursts of 1 to
 * 64 with pauses of up to 100 us between them (so that some requests
 * decode with a few bytes changed, some with their tables torn, some
 * while gpud reads them): a quarter in the header and tables, the rest
 * anywhere; half of them become spaces (what makes a SentencePiece
 * encoder's text longer). Once in 2048 bursts it also writes garbage
 * into the ring's consumer index (gpud must close that connection, and
 * only that one; the hostile client then connects again). */
/* Racing the encoder in this process is the point: not for
 * ThreadSanitizer to report (its writes go unrecorded). */
__attribute__((no_sanitize_thread))
static void *flip_main(void *arg)
{
	struct flipper *fl = arg;
	uint64_t x = 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();

	while (!atomic_load_explicit(&fl->stop, memory_order_relaxed)) {
		struct timespec pause = { 0, (long)((x >> 24) % 100000) };
		int burst = 1 + (int)((x >> 4) & 63);
		nanosleep(&pause, NULL);
		if (((x >> 32) & 2047) == 0) {
			memcpy(fl->tail, &x, sizeof(x));
			fl->tails++;
		}
		for (int k = 0; k < burst; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			size_t at = (x >> 8) & 3 ? (size_t)(x >> 16) % fl->span : (size_t)(x >> 16) % 128;
			volatile uint8_t *p = fl->area + at;
			*p = (x & 1) ? ' ' : (uint8_t)(x >> 40);
			fl->flips++;
		}
	}
	return NULL;
}

/* The hostile child: one connection, a flipping thread over its request
 * area, and submits in a loop (a long prompt, then a short one of two
 * segments with a stop string) until the parent closes ctl and at least HOSTILE_MIN
 * were made. Writes a byte to ready after the first. Exit 0, or 1 when it
 * could not even start. Prints what gpud answered. */
static int hostile(const char *sock, int ready, int ctl)
{
	struct proto_client_opts o;
	struct proto_client *c = NULL;
	struct flipper fl = { 0 };
	pthread_t th;
	char err[SW_ERR_MAX], last[SW_ERR_MAX] = "", *text = malloc(LONG_TEXT);
	uint64_t n = 0, ok = 0, failed = 0, reconnects = 0;
	int shown = 0;
	bool started = false;
	int rc;

	if (!text)
		return 1;
	for (size_t i = 0; i < LONG_TEXT; i++)
		text[i] = "abcdefghij"[i % 10];
	proto_client_opts_default(&o);
	o.timeout_ms = 60000;
	if (proto_client_connect(&c, sock, &o, err, sizeof(err))) {
		fprintf(stderr, "hostile: connect: %s\n", err);
		return 1;
	}
	fl.area = find_request_area(&fl.span, &fl.tail);
	if (!fl.area) {
		fprintf(stderr, "hostile: no request area in /proc/self/maps\n");
		return 1;
	}
	fl.span = fl.span < LONG_TEXT + 4096 ? fl.span : LONG_TEXT + 4096;
	if (pthread_create(&th, NULL, flip_main, &fl))
		return 1;
	fcntl(ctl, F_SETFL, O_NONBLOCK);
	for (;;) {
		char b;
		if (n >= HOSTILE_MIN && read(ctl, &b, 1) == 0)
			break; /* the parent is done */
		struct proto_segment segs[2] = {
			{ .text = "The cat sat", .len = 11 },
			{ .text = " on the mat", .len = 11 },
		};
		struct proto_text stop = { .p = "The end", .len = 7 };
		struct proto_submit_req req = { .max_tokens = 2 };
		struct proto_client_result res = { 0 };

		proto_sampling_default(&req.sampling);
		if (n % 2 == 0) {
			segs[0] = (struct proto_segment){ .text = text, .len = LONG_TEXT };
			req.n_segments = 1;
		} else {
			req.n_segments = 2;
			req.n_stop = 1;
			req.stop = &stop;
		}
		req.segments = segs;
		rc = proto_client_generate(c, &req, &res, err, sizeof(err));
		proto_client_result_free(&res);
		if (rc && shown < 4 && strncmp(err, last, 24) != 0) {
			printf("    hostile: %s: %.100s\n", sw_errname(rc), err);
			snprintf(last, sizeof(last), "%s", err);
			shown++;
		}
		n++;
		rc ? failed++ : ok++;
		if (!started) {
			started = true;
			if (write(ready, "r", 1) != 1)
				return 1;
		}
		if (!proto_client_alive(c)) {
			/* Whatever broke it, a hostile client just comes back
			 * (the flipper stops first: close unmaps the region). */
			atomic_store(&fl.stop, true);
			pthread_join(th, NULL);
			atomic_store(&fl.stop, false);
			proto_client_close(c);
			c = NULL;
			reconnects++;
			if (proto_client_connect(&c, sock, &o, err, sizeof(err))) {
				fprintf(stderr, "hostile: reconnect: %s\n", err);
				return 1;
			}
			fl.area = find_request_area(&fl.span, &fl.tail);
			if (!fl.area)
				return 1;
			fl.span = fl.span < LONG_TEXT + 4096 ? fl.span : LONG_TEXT + 4096;
			if (pthread_create(&th, NULL, flip_main, &fl))
				return 1;
		}
	}
	atomic_store(&fl.stop, true);
	pthread_join(th, NULL);
	printf("    hostile client: %" PRIu64 " submits (%" PRIu64 " generated, %" PRIu64
	       " failed), %" PRIu64 " reconnects, %" PRIu64 " bytes flipped, ring index "
	       "overwritten %" PRIu64 " times\n", n, ok, failed, reconnects, fl.flips, fl.tails);
	proto_client_close(c);
	free(text);
	return 0;
}

static void test_hostile_client(void **state)
{
	struct gpud_it_fix *f = *state;
	struct gpud_it_opts o = { .gpud_extra = "\"kv_blocks\": 512" };
	struct outputs *alone = calloc(1, sizeof(*alone)), *beside = calloc(1, sizeof(*beside));
	int ready[2], ctl[2], st;
	char b;
	pid_t pid;

	assert_non_null(alone);
	assert_non_null(beside);
	assert_int_equal(gpud_it_start(&f->d[0], &o), 0);
	honest_run(&f->d[0], alone);

	assert_int_equal(pipe(ready), 0);
	assert_int_equal(pipe(ctl), 0);
	fflush(stdout);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(ready[0]);
		close(ctl[1]);
		int rc = hostile(f->d[0].socket, ready[1], ctl[0]);
		fflush(stdout);
		_exit(rc);
	}
	close(ready[1]);
	close(ctl[0]);
	assert_int_equal(read(ready[0], &b, 1), 1); /* it is submitting */
	honest_run(&f->d[0], beside);
	close(ctl[1]); /* done: it stops after HOSTILE_MIN submits */
	assert_int_equal(waitpid(pid, &st, 0), pid);
	close(ready[0]);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);

	for (int i = 0; i < HONEST_PROMPTS; i++) {
		if (strcmp(alone->text[i], beside->text[i]) != 0)
			fail_msg("prompt %d: alone \"%s\", beside the hostile client \"%s\"", i,
				 alone->text[i], beside->text[i]);
		assert_int_equal(alone->n_ids[i], beside->n_ids[i]);
		assert_memory_equal(alone->ids[i], beside->ids[i],
				    alone->n_ids[i] * sizeof(int32_t));
	}
	printf("    honest client: %d prompts, the same %d-token outputs alone and beside it "
	       "(\"%s\" ...)\n", HONEST_PROMPTS, HONEST_TOKENS, alone->text[0]);

	/* gpud is still well: it answers, and a fresh honest run agrees. */
	assert_true(gpud_it_running(&f->d[0]));
	honest_run(&f->d[0], beside);
	assert_memory_equal(alone, beside, sizeof(*alone));
	{
		struct proto_client *c = gpud_it_connect(&f->d[0]);
		json_t *j;
		int64_t refused = -1, completed = -1, since = -1;

		assert_non_null(c);
		assert_non_null(j = gpud_it_stats(c, false));
		gpud_it_jint(j, "requests.refused", &refused);
		gpud_it_jint(j, "requests.completed", &completed);
		gpud_it_jint(j, "alloc.since_warmup.host", &since);
		printf("    gpud after: %" PRId64 " requests completed, %" PRId64 " refused, %"
		       PRId64 " host allocations since warm-up\n", completed, refused, since);
		json_decref(j);
		proto_client_close(c);
	}
	assert_int_equal(gpud_it_stop(&f->d[0], SIGTERM, 60000), 0);
	free(alone);
	free(beside);
	f->done = true;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		GPUD_IT_FIX_TEST(test_peer_check),
		GPUD_IT_FIX_TEST(test_check_socket_keys),
		GPUD_IT_FIX_TEST(test_hostile_client),
	};

	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
