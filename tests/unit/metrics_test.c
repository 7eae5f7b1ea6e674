/* metrics_test.c - the Prometheus endpoint over TCP (ephemeral port) and
 * a unix socket: GET /metrics, 404, 400, an oversized head (431), a head
 * that arrives byte by byte, a failing render (500), the connection
 * bound, the idle timeout, close with connections open, bad listen
 * strings, a port in use, a stale unix socket, and no allocation while
 * serving. The loop runs in its own thread; the test is the client. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "gpud/alloc.h"
#include "gpud/metrics.h"
#include "gpud/stats.h"

#define BODY "# HELP gpud_test A test.\n# TYPE gpud_test gauge\ngpud_test 42\n"

struct fixture {
	uv_loop_t loop;
	uv_async_t stop;
	pthread_t thread;
	struct gpud_metrics *m;
	char path[108];
	int fail_render;     /* render returns this when nonzero */
	size_t big;          /* render this many bytes instead of BODY */
	int renders;
};

static int render(void *arg, char *buf, size_t cap, size_t *len)
{
	struct fixture *f = arg;

	f->renders++;
	if (f->fail_render)
		return f->fail_render;
	if (f->big) {
		if (f->big > cap)
			return SW_ETOOLONG;
		for (size_t i = 0; i < f->big; i++)
			buf[i] = (char)('a' + i % 26);
		*len = f->big;
		return 0;
	}
	if (cap < strlen(BODY))
		return SW_ETOOLONG;
	memcpy(buf, BODY, strlen(BODY));
	*len = strlen(BODY);
	return 0;
}

static void on_stop(uv_async_t *a)
{
	struct fixture *f = a->data;

	gpud_metrics_close(f->m);
	uv_close((uv_handle_t *)a, NULL);
}

static void *loop_main(void *arg)
{
	struct fixture *f = arg;

	gpud_alloc_set_role(GPUD_ALLOC_LOOP);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	return NULL;
}

static struct fixture *start_idle(const char *listen_addr, unsigned idle_ms)
{
	struct fixture *f = calloc(1, sizeof(*f));
	char err[SW_ERR_MAX];

	assert_non_null(f);
	assert_int_equal(uv_loop_init(&f->loop), 0);
	assert_int_equal(uv_async_init(&f->loop, &f->stop, on_stop), 0);
	f->stop.data = f;
	if (strncmp(listen_addr, "unix:", 5) == 0)
		snprintf(f->path, sizeof(f->path), "%s", listen_addr + 5);
	if (gpud_metrics_create(&f->m, &f->loop, listen_addr, render, f, err, sizeof(err)) != 0)
		fail_msg("create %s: %s", listen_addr, err);
	if (idle_ms)
		gpud_metrics_set_idle_timeout(f->m, idle_ms);
	assert_int_equal(pthread_create(&f->thread, NULL, loop_main, f), 0);
	return f;
}

static struct fixture *start(const char *listen_addr)
{
	return start_idle(listen_addr, 0);
}

static void stop(struct fixture *f)
{
	assert_int_equal(uv_async_send(&f->stop), 0);
	assert_int_equal(pthread_join(f->thread, NULL), 0);
	assert_true(gpud_metrics_closed(f->m));
	gpud_metrics_destroy(f->m);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	if (f->path[0]) { /* removed on close */
		struct stat st;

		assert_int_equal(lstat(f->path, &st), -1);
	}
	free(f);
}

static int dial(struct fixture *f)
{
	struct timeval tv = { .tv_sec = 20 }; /* a hang fails instead of blocking forever */
	int fd;

	if (f->path[0]) {
		struct sockaddr_un sa = { .sun_family = AF_UNIX };

		strcpy(sa.sun_path, f->path);
		fd = socket(AF_UNIX, SOCK_STREAM, 0);
		assert_true(fd >= 0);
		assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	} else {
		struct sockaddr_in sa = {
			.sin_family = AF_INET,
			.sin_port = htons((uint16_t)gpud_metrics_port(f->m)),
			.sin_addr.s_addr = htonl(INADDR_LOOPBACK),
		};

		fd = socket(AF_INET, SOCK_STREAM, 0);
		assert_true(fd >= 0);
		assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	}
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

static void send_all(int fd, const char *s, size_t n)
{
	while (n > 0) {
		ssize_t w = send(fd, s, n, MSG_NOSIGNAL);

		assert_true(w > 0);
		s += w;
		n -= (size_t)w;
	}
}

/* Reads until EOF; returns the length (out is NUL-terminated). A reset
 * fails the test unless reset_ok (then it ends the read). */
static size_t read_all_r(int fd, char *out, size_t cap, bool reset_ok)
{
	size_t n = 0;

	for (;;) {
		ssize_t r = recv(fd, out + n, cap - 1 - n, 0);

		if (r == 0 || (r < 0 && errno == ECONNRESET && reset_ok))
			break;
		if (r < 0)
			fail_msg("recv: %s", strerror(errno));
		n += (size_t)r;
		assert_true(n < cap - 1);
	}
	out[n] = 0;
	return n;
}

static size_t read_all(int fd, char *out, size_t cap)
{
	return read_all_r(fd, out, cap, false);
}

static char resp[512 * 1024];

/* One request, the whole response; returns the status code. */
static int request(struct fixture *f, const char *req, const char **body, size_t *body_len)
{
	int fd = dial(f), code = 0;
	size_t n;
	char *sep;

	send_all(fd, req, strlen(req));
	n = read_all(fd, resp, sizeof(resp));
	close(fd);
	assert_true(n > 12);
	assert_int_equal(sscanf(resp, "HTTP/1.0 %d ", &code), 1);
	sep = strstr(resp, "\r\n\r\n");
	assert_non_null(sep);
	if (body) {
		*body = sep + 4;
		*body_len = n - (size_t)(sep + 4 - resp);
	}
	return code;
}

static void check_get(struct fixture *f)
{
	const char *body;
	size_t len;
	char cl[64];

	assert_int_equal(request(f, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &body, &len), 200);
	assert_non_null(strstr(resp, "\r\nContent-Type: text/plain; version=0.0.4"));
	snprintf(cl, sizeof(cl), "\r\nContent-Length: %zu\r\n", strlen(BODY));
	assert_non_null(strstr(resp, cl));
	assert_int_equal(len, strlen(BODY));
	assert_memory_equal(body, BODY, len);
}

static void test_tcp_get(void **state)
{
	struct fixture *f = start("127.0.0.1:0");
	struct gpud_metrics_counts c;
	const char *body;
	size_t len;

	(void)state;
	assert_true(gpud_metrics_port(f->m) > 0);
	check_get(f);
	/* a query string is fine, bare LF line ends too */
	assert_int_equal(request(f, "GET /metrics?x=1 HTTP/1.0\n\n", &body, &len), 200);
	assert_int_equal(len, strlen(BODY));
	/* everything else: 404 */
	assert_int_equal(request(f, "GET / HTTP/1.0\r\n\r\n", NULL, NULL), 404);
	assert_int_equal(request(f, "GET /metricsx HTTP/1.0\r\n\r\n", NULL, NULL), 404);
	assert_int_equal(request(f, "POST /metrics HTTP/1.0\r\n\r\n", NULL, NULL), 404);
	/* not a request line: 400 */
	assert_int_equal(request(f, "\r\n\r\n", NULL, NULL), 400);
	assert_int_equal(request(f, "GET /metrics\r\n\r\n", NULL, NULL), 400);
	assert_int_equal(request(f, "GET /metrics FTP/1.0\r\n\r\n", NULL, NULL), 400);
	gpud_metrics_counts(f->m, &c); /* the replies are read: the loop counted */
	assert_int_equal(c.ok, 2);
	assert_int_equal(c.not_found, 3);
	assert_int_equal(c.bad_request, 3);
	assert_int_equal(c.too_large + c.failed + c.refused, 0);
	assert_int_equal(f->renders, 2);
	stop(f);
}

static void test_slow_and_oversized(void **state)
{
	struct fixture *f = start("127.0.0.1:0");
	const char *req = "GET /metrics HTTP/1.0\r\nUser-Agent: slow\r\n\r\n";
	char *huge;
	int fd, code = 0;
	size_t n;

	(void)state;
	/* byte by byte */
	fd = dial(f);
	for (size_t i = 0; req[i]; i++) {
		send_all(fd, req + i, 1);
		usleep(1000);
	}
	n = read_all(fd, resp, sizeof(resp));
	close(fd);
	assert_true(n > 0);
	assert_int_equal(sscanf(resp, "HTTP/1.0 %d ", &code), 1);
	assert_int_equal(code, 200);

	/* a head that never ends within the limit: 431, even though the
	 * client sent more than the server read */
	huge = malloc(GPUD_METRICS_HEAD_MAX + 4096);
	assert_non_null(huge);
	memcpy(huge, "GET /metrics HTTP/1.0\r\nX: ", 26);
	memset(huge + 26, 'a', GPUD_METRICS_HEAD_MAX + 4096 - 27);
	huge[GPUD_METRICS_HEAD_MAX + 4096 - 1] = 0;
	assert_int_equal(request(f, huge, NULL, NULL), 431);
	/* exactly at the limit with the end in the last bytes: served */
	memset(huge + 26, 'a', GPUD_METRICS_HEAD_MAX - 26 - 4);
	memcpy(huge + GPUD_METRICS_HEAD_MAX - 4, "\r\n\r\n", 5);
	assert_int_equal(strlen(huge), GPUD_METRICS_HEAD_MAX);
	assert_int_equal(request(f, huge, NULL, NULL), 200);
	free(huge);
	check_get(f); /* still serving */
	stop(f);
}

static void test_render_failure_and_big_body(void **state)
{
	struct fixture *f = start("127.0.0.1:0");
	const char *body;
	size_t len;

	(void)state;
	f->fail_render = SW_ETOOLONG; /* the loop thread only reads it inside render */
	assert_int_equal(request(f, "GET /metrics HTTP/1.0\r\n\r\n", NULL, NULL), 500);
	f->fail_render = 0;
	f->big = 200 * 1024; /* several socket writes */
	assert_int_equal(request(f, "GET /metrics HTTP/1.0\r\n\r\n", &body, &len), 200);
	assert_int_equal(len, 200 * 1024);
	for (size_t i = 0; i < len; i++)
		if (body[i] != (char)('a' + i % 26))
			fail_msg("body differs at %zu", i);
	f->big = 0;
	stop(f);
}

static void test_unix(void **state)
{
	char addr[128], path[100];
	struct fixture *f;
	struct stat st;
	int fd;

	(void)state;
	snprintf(path, sizeof(path), "/tmp/memstat-metrics-%d.sock", (int)getpid());
	unlink(path);
	/* a stale socket file from a dead process is replaced */
	{
		struct sockaddr_un sa = { .sun_family = AF_UNIX };

		strcpy(sa.sun_path, path);
		fd = socket(AF_UNIX, SOCK_STREAM, 0);
		assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		close(fd); /* file stays, nobody listens */
	}
	snprintf(addr, sizeof(addr), "unix:%s", path);
	f = start(addr);
	assert_int_equal(gpud_metrics_port(f->m), 0);
	assert_int_equal(lstat(path, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0660);
	check_get(f);
	assert_int_equal(request(f, "GET /nope HTTP/1.0\r\n\r\n", NULL, NULL), 404);

	/* a second endpoint on the same live socket is refused */
	{
		struct gpud_metrics *m2 = (struct gpud_metrics *)0x1;
		uv_loop_t loop2;
		char err[SW_ERR_MAX];

		assert_int_equal(uv_loop_init(&loop2), 0);
		assert_int_equal(gpud_metrics_create(&m2, &loop2, addr, render, NULL, err,
						     sizeof(err)),
				 -EADDRINUSE);
		assert_null(m2);
		assert_non_null(strstr(err, "in use"));
		assert_int_equal(uv_loop_close(&loop2), 0);
	}
	stop(f);
}

static void test_bad_listen(void **state)
{
	static const char *const bad[] = {
		"", "0.0.0.0:9464", "10.1.2.3:80", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536",
		"127.0.0.1:-1", "127.0.0.1:80x", "127.0.0.1:000080", "localhost:9464",
		"[::1]:9464", "unix:", " 127.0.0.1:1", "tcp://127.0.0.1:1",
	};
	struct gpud_metrics *m = NULL, *m2 = NULL;
	char err[SW_ERR_MAX], addr[64], longpath[200];
	uv_loop_t loop;

	(void)state;
	assert_int_equal(uv_loop_init(&loop), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		m = (struct gpud_metrics *)0x1;
		err[0] = 0;
		if (gpud_metrics_create(&m, &loop, bad[i], render, NULL, err, sizeof(err)) !=
		    -EINVAL)
			fail_msg("\"%s\" was not refused", bad[i]);
		assert_null(m);
		assert_true(strlen(err) > 0);
	}
	memset(longpath, 'p', sizeof(longpath) - 1);
	memcpy(longpath, "unix:/", 6);
	longpath[sizeof(longpath) - 1] = 0;
	assert_int_equal(gpud_metrics_create(&m, &loop, longpath, render, NULL, err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(gpud_metrics_create(&m, &loop, "127.0.0.1:0", NULL, NULL, err,
					     sizeof(err)),
			 -EINVAL);
	assert_int_equal(gpud_metrics_create(&m, NULL, "127.0.0.1:0", render, NULL, NULL, 0),
			 -EINVAL);
	assert_int_equal(gpud_metrics_create(NULL, &loop, "127.0.0.1:0", render, NULL, NULL, 0),
			 -EINVAL);
	/* a unix path in a directory that does not exist */
	assert_int_equal(gpud_metrics_create(&m, &loop, "unix:/nonexistent-dir/x.sock", render,
					     NULL, err, sizeof(err)),
			 -ENOENT);
	/* a port in use */
	assert_int_equal(gpud_metrics_create(&m, &loop, "127.0.0.1:0", render, NULL, err,
					     sizeof(err)),
			 0);
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", gpud_metrics_port(m));
	assert_int_equal(gpud_metrics_create(&m2, &loop, addr, render, NULL, err, sizeof(err)),
			 -EADDRINUSE);
	assert_null(m2);
	gpud_metrics_close(m);
	gpud_metrics_close(m); /* idempotent */
	assert_false(gpud_metrics_closed(m));
	assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);
	assert_true(gpud_metrics_closed(m));
	gpud_metrics_destroy(m);
	gpud_metrics_destroy(NULL);
	assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_connection_bound_and_idle(void **state)
{
	struct fixture *f = start("127.0.0.1:0");
	int idle[GPUD_METRICS_MAX_CONNS], extra;
	char c;

	(void)state;
	/* fill every slot with a connection that says nothing */
	for (int i = 0; i < GPUD_METRICS_MAX_CONNS; i++)
		idle[i] = dial(f);
	/* one GET through every slot's first byte so each is surely accepted */
	for (int i = 0; i < GPUD_METRICS_MAX_CONNS; i++)
		send_all(idle[i], "G", 1);
	/* the next is accepted and closed at once: EOF (or a reset) */
	extra = dial(f);
	assert_true(recv(extra, &c, 1, 0) <= 0);
	close(extra);
	/* a slot frees up: serving again (once the loop has seen the close:
	 * until then a new connection may still be the one over the limit) */
	close(idle[0]);
	for (int tries = 0;; tries++) {
		int fd = dial(f), code = 0;
		size_t n;

		if (send(fd, "GET /metrics HTTP/1.0\r\n\r\n", 25, MSG_NOSIGNAL) != 25) {
			n = 0; /* closed before the request went out */
		} else {
			n = read_all_r(fd, resp, sizeof(resp), true); /* refused: EOF or reset */
		}
		close(fd);
		if (n > 0) {
			assert_int_equal(sscanf(resp, "HTTP/1.0 %d ", &code), 1);
			assert_int_equal(code, 200);
			break;
		}
		assert_true(tries < 1000);
		usleep(10000);
	}
	for (int i = 1; i < GPUD_METRICS_MAX_CONNS; i++)
		close(idle[i]);
	stop(f);

	/* the idle timeout closes a silent connection */
	f = start_idle("127.0.0.1:0", 50);
	extra = dial(f);
	assert_int_equal(recv(extra, &c, 1, 0), 0);
	close(extra);
	check_get(f);
	stop(f);
}

static void test_close_with_open_connections(void **state)
{
	struct fixture *f = start("127.0.0.1:0");
	int fd[3];
	char c;

	(void)state;
	for (int i = 0; i < 3; i++)
		fd[i] = dial(f);
	check_get(f); /* the three are accepted by now (the loop is FIFO) */
	stop(f);      /* closes them: the clients see EOF */
	for (int i = 0; i < 3; i++) {
		assert_true(recv(fd[i], &c, 1, 0) <= 0);
		close(fd[i]);
	}
}

/* The daemon's use: the body is gpud_stats_prometheus of a snapshot; the
 * largest snapshot there can be fits the body buffer. */
static struct gpud_stats_snapshot snap;

static int render_stats(void *arg, char *buf, size_t cap, size_t *len)
{
	(void)arg;
	return gpud_stats_prometheus(&snap, buf, cap, len);
}

static void test_stats_body(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	static char want[GPUD_METRICS_BODY_MAX];
	const char *body;
	size_t len, want_len;
	char err[SW_ERR_MAX];

	(void)state;
	memset(&snap, 0, sizeof(snap));
	snap.version = "0.4.0";
	gpud_stats_fill_alloc(&snap);
	snap.n_devices = GPUD_STATS_MAX_DEVICES;
	snap.n_pools = GPUD_STATS_MAX_POOLS;
	snap.n_caches = GPUD_STATS_MAX_CACHES;
	for (int i = 0; i < GPUD_STATS_MAX_POOLS; i++) {
		memset(snap.pools[i].name, '"', sizeof(snap.pools[i].name)); /* 2 bytes each */
		snap.pools[i].unit = "blocks";
		snap.pools[i].used = UINT64_MAX;
	}
	for (int i = 0; i < GPUD_STATS_MAX_CACHES; i++)
		memset(snap.caches[i].name, '\\', sizeof(snap.caches[i].name));
	for (int i = 0; i < GPUD_STATS_MAX_DEVICES; i++)
		memset(snap.devices[i].name, '\n', sizeof(snap.devices[i].name));
	assert_int_equal(gpud_stats_prometheus(&snap, want, sizeof(want), &want_len), 0);
	print_message("largest Prometheus body: %zu bytes of %d\n", want_len,
		      GPUD_METRICS_BODY_MAX);

	assert_non_null(f);
	assert_int_equal(uv_loop_init(&f->loop), 0);
	assert_int_equal(uv_async_init(&f->loop, &f->stop, on_stop), 0);
	f->stop.data = f;
	if (gpud_metrics_create(&f->m, &f->loop, "127.0.0.1:0", render_stats, NULL, err,
				sizeof(err)) != 0)
		fail_msg("create: %s", err);
	assert_int_equal(pthread_create(&f->thread, NULL, loop_main, f), 0);
	assert_int_equal(request(f, "GET /metrics HTTP/1.0\r\n\r\n", &body, &len), 200);
	assert_int_equal(len, want_len);
	assert_memory_equal(body, want, len);
	stop(f);
}

static void test_no_allocation(void **state)
{
	struct fixture *f = start("127.0.0.1:0");
	struct gpud_alloc_counts a, b;

	(void)state;
	if (!gpud_alloc_hooked()) {
		stop(f);
		skip(); /* valgrind bypasses the wrappers: nothing to count with */
	}
	check_get(f); /* warm-up */
	gpud_alloc_counts(&a);
	for (int i = 0; i < 20; i++) {
		check_get(f);
		assert_int_equal(request(f, "GET /x HTTP/1.0\r\n\r\n", NULL, NULL), 404);
	}
	gpud_alloc_counts(&b);
	assert_int_equal(b.host_allocs[GPUD_ALLOC_LOOP] - a.host_allocs[GPUD_ALLOC_LOOP], 0);
	stop(f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tcp_get),
		cmocka_unit_test(test_slow_and_oversized),
		cmocka_unit_test(test_render_failure_and_big_body),
		cmocka_unit_test(test_unix),
		cmocka_unit_test(test_bad_listen),
		cmocka_unit_test(test_connection_bound_and_idle),
		cmocka_unit_test(test_close_with_open_connections),
		cmocka_unit_test(test_stats_body),
		cmocka_unit_test(test_no_allocation),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
