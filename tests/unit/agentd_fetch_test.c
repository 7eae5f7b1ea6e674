/* agentd_fetch_test.c - agentd/fetch.c against a small HTTP server in a
 * thread of this test (127.0.0.1, a free port) and local files: bodies,
 * size limits (announced and streamed), redirects (followed, looping,
 * into file://), HTTP errors mapped to codes, timeouts, refused
 * connections, schemes, and a JSON POST. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agentd/fetch.h"
#include "common/err.h"

static int listen_fd = -1;
static int port;
static pthread_t server;
static char posted[256];
static char err[SW_ERR_MAX];

static void reply(int fd, const char *status, const char *headers, const char *body, size_t len)
{
	char head[512];
	int n = snprintf(head, sizeof(head), "HTTP/1.1 %s\r\nConnection: close\r\n%s\r\n", status,
			 headers);

	/* MSG_NOSIGNAL: a client that gave up (size cap, timeout) is no SIGPIPE. */
	if (send(fd, head, (size_t)n, MSG_NOSIGNAL) != n)
		return;
	while (len > 0) {
		ssize_t w = send(fd, body, len, MSG_NOSIGNAL);

		if (w <= 0)
			return;
		body += w;
		len -= (size_t)w;
	}
}

static void serve_one(int fd)
{
	char req[4096] = "", path[256] = "", hdr[256];
	static char big[5000];
	size_t got = 0;
	char *end = NULL;
	long clen = 0;

	while (got < sizeof(req) - 1 && !(end = strstr(req, "\r\n\r\n"))) {
		ssize_t r = read(fd, req + got, sizeof(req) - 1 - got);

		if (r <= 0)
			return;
		got += (size_t)r;
		req[got] = '\0';
	}
	if (!end)
		return;
	sscanf(req, "%*s %255s", path);
	if (strstr(req, "Content-Length: "))
		clen = strtol(strstr(req, "Content-Length: ") + 16, NULL, 10);
	if (clen > 0 && clen < (long)sizeof(posted)) {
		size_t have = got - (size_t)(end + 4 - req);

		memcpy(posted, end + 4, have);
		while ((long)have < clen) {
			ssize_t r = read(fd, posted + have, (size_t)clen - have);

			if (r <= 0)
				break;
			have += (size_t)r;
		}
		posted[have] = '\0';
	}

	if (!strcmp(path, "/ok")) {
		reply(fd, "200 OK", "Content-Length: 10\r\n", "hello body", 10);
	} else if (!strcmp(path, "/empty")) {
		reply(fd, "200 OK", "Content-Length: 0\r\n", "", 0);
	} else if (!strcmp(path, "/big")) {
		reply(fd, "200 OK", "Content-Length: 5000\r\n", big, sizeof(big));
	} else if (!strcmp(path, "/stream")) {
		memset(big, 'x', sizeof(big));
		reply(fd, "200 OK", "", big, sizeof(big)); /* no length: cut at the cap */
	} else if (!strcmp(path, "/redir")) {
		reply(fd, "302 Found", "Location: /ok\r\nContent-Length: 0\r\n", "", 0);
	} else if (!strcmp(path, "/loop")) {
		reply(fd, "302 Found", "Location: /loop\r\nContent-Length: 0\r\n", "", 0);
	} else if (!strcmp(path, "/tofile")) {
		reply(fd, "302 Found", "Location: file:///etc/passwd\r\nContent-Length: 0\r\n", "", 0);
	} else if (!strcmp(path, "/gone")) {
		reply(fd, "404 Not Found", "Content-Length: 0\r\n", "", 0);
	} else if (!strcmp(path, "/busy")) {
		reply(fd, "503 Service Unavailable", "Content-Length: 0\r\n", "", 0);
	} else if (!strcmp(path, "/forbidden")) {
		reply(fd, "403 Forbidden", "Content-Length: 0\r\n", "", 0);
	} else if (!strcmp(path, "/slow")) {
		usleep(1500 * 1000);
		reply(fd, "200 OK", "Content-Length: 2\r\n", "ok", 2);
	} else if (!strcmp(path, "/post")) {
		reply(fd, "204 No Content", "", "", 0);
	} else {
		snprintf(hdr, sizeof(hdr), "Content-Length: 0\r\n");
		reply(fd, "400 Bad Request", hdr, "", 0);
	}
}

static void *serve(void *arg)
{
	for (;;) {
		int fd = accept(listen_fd, NULL, NULL);

		if (fd < 0)
			return NULL; /* listen socket shut down */
		serve_one(fd);
		close(fd);
	}
}

static int start_server(void **state)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t alen = sizeof(a);

	listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    listen(listen_fd, 8) != 0 || getsockname(listen_fd, (struct sockaddr *)&a, &alen) != 0)
		return -1;
	port = ntohs(a.sin_port);
	if (agent_fetch_global_init(NULL, 0) != 0)
		return -1;
	return pthread_create(&server, NULL, serve, NULL);
}

static int stop_server(void **state)
{
	shutdown(listen_fd, SHUT_RDWR);
	pthread_join(server, NULL);
	close(listen_fd);
	return 0;
}

static const char *url(const char *path)
{
	static char buf[128];

	snprintf(buf, sizeof(buf), "http://127.0.0.1:%d%s", port, path);
	return buf;
}

static void test_http_ok_and_redirect(void **state)
{
	char *body;
	size_t len;

	assert_int_equal(agent_fetch(url("/ok"), NULL, &body, &len, err, sizeof(err)), 0);
	assert_int_equal(len, 10);
	assert_string_equal(body, "hello body");
	free(body);
	assert_int_equal(agent_fetch(url("/redir"), NULL, &body, &len, err, sizeof(err)), 0);
	assert_string_equal(body, "hello body");
	free(body);
	assert_int_equal(agent_fetch(url("/empty"), NULL, &body, &len, err, sizeof(err)), 0);
	assert_int_equal(len, 0);
	assert_string_equal(body, "");
	free(body);
}

static void test_redirect_limits(void **state)
{
	struct agent_fetch_opts o = { .max_redirects = 3 };
	char *body = (char *)1;
	size_t len;

	assert_int_equal(agent_fetch(url("/loop"), &o, &body, &len, err, sizeof(err)), -ELOOP);
	assert_null(body);
	assert_non_null(strstr(err, "more than 3 redirects"));
	o = (struct agent_fetch_opts){ .no_redirects = true };
	assert_int_equal(agent_fetch(url("/redir"), &o, &body, &len, err, sizeof(err)), -ELOOP);
	assert_non_null(strstr(err, "HTTP 302 redirect not followed"));
	/* A web page may not redirect into the file system. */
	assert_int_equal(agent_fetch(url("/tofile"), NULL, &body, &len, err, sizeof(err)), -EINVAL);
	assert_null(body);
}

static void test_size_limits(void **state)
{
	struct agent_fetch_opts o = { .max_bytes = 1000 };
	char *body;
	size_t len;

	assert_int_equal(agent_fetch(url("/big"), &o, &body, &len, err, sizeof(err)), SW_ETOOLONG);
	assert_non_null(strstr(err, "larger than the limit of 1000 bytes"));
	assert_int_equal(agent_fetch(url("/stream"), &o, &body, &len, err, sizeof(err)), SW_ETOOLONG);
	assert_null(body);
	o.max_bytes = 5000; /* exactly the size is fine */
	assert_int_equal(agent_fetch(url("/stream"), &o, &body, &len, err, sizeof(err)), 0);
	assert_int_equal(len, 5000);
	free(body);
}

static void test_http_errors(void **state)
{
	struct agent_fetch_opts o = { .timeout_ms = 300 };
	char *body;
	size_t len;

	assert_int_equal(agent_fetch(url("/gone"), NULL, &body, &len, err, sizeof(err)),
			 SW_ENOTFOUND);
	assert_non_null(strstr(err, "HTTP 404"));
	assert_int_equal(agent_fetch(url("/busy"), NULL, &body, &len, err, sizeof(err)), -EAGAIN);
	assert_true(agent_fetch_transient(-EAGAIN));
	assert_int_equal(agent_fetch(url("/forbidden"), NULL, &body, &len, err, sizeof(err)), -EIO);
	assert_false(agent_fetch_transient(-EIO));
	assert_int_equal(agent_fetch(url("/slow"), &o, &body, &len, err, sizeof(err)), -ETIMEDOUT);
	assert_non_null(strstr(err, "timed out"));
	assert_true(agent_fetch_transient(-ETIMEDOUT));
	assert_int_equal(agent_fetch("http://127.0.0.1:1/x", NULL, &body, &len, err, sizeof(err)),
			 -ECONNREFUSED);
	assert_non_null(strstr(err, "http://127.0.0.1:1/x: cannot connect"));
	assert_true(agent_fetch_transient(-ECONNREFUSED));
}

static void test_files(void **state)
{
	struct agent_fetch_opts o = { .max_bytes = 8 };
	char path[] = "/tmp/agentd_fetch_XXXXXX", u[128], *body;
	size_t len;
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, "file text", 9), 9);
	close(fd);
	snprintf(u, sizeof(u), "file://%s", path);
	assert_int_equal(agent_fetch(u, NULL, &body, &len, err, sizeof(err)), 0);
	assert_int_equal(len, 9);
	assert_string_equal(body, "file text");
	free(body);
	assert_int_equal(agent_fetch(u, &o, &body, &len, err, sizeof(err)), SW_ETOOLONG);
	unlink(path);
	assert_int_equal(agent_fetch(u, NULL, &body, &len, err, sizeof(err)), SW_ENOTFOUND);
	assert_non_null(strstr(err, "cannot read file"));
}

static void test_schemes(void **state)
{
	char *body;
	size_t len;

	assert_int_equal(agent_fetch("ftp://x/y", NULL, &body, &len, err, sizeof(err)), -EINVAL);
	assert_string_equal(err,
			    "fetch: ftp://x/y: unsupported scheme \"ftp\" (expected http, https, file)");
	assert_int_equal(agent_fetch("nothing", NULL, &body, &len, err, sizeof(err)), -EINVAL);
	assert_int_equal(agent_fetch(NULL, NULL, &body, &len, err, sizeof(err)), -EINVAL);
	/* POST only to http(s). */
	assert_int_equal(agent_fetch_post_json("file:///tmp/x", "{}", 2, NULL, err, sizeof(err)),
			 -EINVAL);
}

static void test_post(void **state)
{
	static const char json[] = "{\"task_id\":\"t\",\"status\":\"completed\"}";

	assert_int_equal(agent_fetch_post_json(url("/post"), json, strlen(json), NULL, err,
					       sizeof(err)),
			 0);
	assert_string_equal(posted, json);
	assert_int_equal(agent_fetch_post_json(url("/busy"), json, strlen(json), NULL, err,
					       sizeof(err)),
			 -EAGAIN);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_http_ok_and_redirect),
		cmocka_unit_test(test_redirect_limits),
		cmocka_unit_test(test_size_limits),
		cmocka_unit_test(test_http_errors),
		cmocka_unit_test(test_files),
		cmocka_unit_test(test_schemes),
		cmocka_unit_test(test_post),
	};

	return cmocka_run_group_tests(tests, start_server, stop_server);
}
