/* agentd_fetch_test.c - agentd/fetch.c against a small HTTP server in a
 * thread of this test (127.0.0.1, a free port) and local files: bodies,
 * size limits (announced and streamed), redirects (followed, looping,
 * into file://), HTTP errors mapped to codes, timeouts, refused
 * connections, schemes, and a JSON POST; the policy (agentd.fetch):
 * the default refuses the server, 127.0.0.1/32 opens it and nothing
 * else of loopback (127.0.0.2, [::1], 0x7f000001, a redirect to
 * 127.0.0.2), file:// only below file_dirs (and not through a symlink
 * out of them). Every packet stays on 127.0.0.1: a refused address is
 * never connected to. */
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
#include <sys/stat.h>
#include <unistd.h>

#include "agentd/fetch.h"
#include "common/err.h"

static int listen_fd = -1;
static int port;
static pthread_t server;
static char posted[256];
static char err[SW_ERR_MAX];
static _Atomic int served;
static struct agent_fetch_policy open_lo; /* 127.0.0.1/32, file_dirs /tmp */

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
	} else if (!strcmp(path, "/to2")) {
		snprintf(hdr, sizeof(hdr), "Location: http://127.0.0.2:%d/ok\r\nContent-Length: 0\r\n",
			 port);
		reply(fd, "302 Found", hdr, "", 0);
	} else if (!strcmp(path, "/tov6")) {
		snprintf(hdr, sizeof(hdr), "Location: http://[::1]:%d/ok\r\nContent-Length: 0\r\n",
			 port);
		reply(fd, "302 Found", hdr, "", 0);
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
		served++;
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
	if (sw_cidr_parse("127.0.0.1/32", &open_lo.allow[0], NULL, 0) != 0)
		return -1;
	open_lo.n_allow = 1;
	snprintf(open_lo.file_dirs[0], sizeof(open_lo.file_dirs[0]), "/tmp");
	open_lo.n_file_dirs = 1;
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

static const struct agent_fetch_opts lo = { .policy = &open_lo };

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

	assert_int_equal(agent_fetch(url("/ok"), &lo, &body, &len, err, sizeof(err)), 0);
	assert_int_equal(len, 10);
	assert_string_equal(body, "hello body");
	free(body);
	assert_int_equal(agent_fetch(url("/redir"), &lo, &body, &len, err, sizeof(err)), 0);
	assert_string_equal(body, "hello body");
	free(body);
	assert_int_equal(agent_fetch(url("/empty"), &lo, &body, &len, err, sizeof(err)), 0);
	assert_int_equal(len, 0);
	assert_string_equal(body, "");
	free(body);
}

static void test_redirect_limits(void **state)
{
	struct agent_fetch_opts o = { .max_redirects = 3, .policy = &open_lo };
	char *body = (char *)1;
	size_t len;

	assert_int_equal(agent_fetch(url("/loop"), &o, &body, &len, err, sizeof(err)), -ELOOP);
	assert_null(body);
	assert_non_null(strstr(err, "more than 3 redirects"));
	o = (struct agent_fetch_opts){ .no_redirects = true, .policy = &open_lo };
	assert_int_equal(agent_fetch(url("/redir"), &o, &body, &len, err, sizeof(err)), -ELOOP);
	assert_non_null(strstr(err, "HTTP 302 redirect not followed"));
	/* A web page may not redirect into the file system. */
	assert_int_equal(agent_fetch(url("/tofile"), &lo, &body, &len, err, sizeof(err)), -EINVAL);
	assert_null(body);
}

static void test_size_limits(void **state)
{
	struct agent_fetch_opts o = { .max_bytes = 1000, .policy = &open_lo };
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
	struct agent_fetch_opts o = { .timeout_ms = 300, .policy = &open_lo };
	char *body;
	size_t len;

	assert_int_equal(agent_fetch(url("/gone"), &lo, &body, &len, err, sizeof(err)),
			 SW_ENOTFOUND);
	assert_non_null(strstr(err, "HTTP 404"));
	assert_int_equal(agent_fetch(url("/busy"), &lo, &body, &len, err, sizeof(err)), -EAGAIN);
	assert_true(agent_fetch_transient(-EAGAIN));
	assert_int_equal(agent_fetch(url("/forbidden"), &lo, &body, &len, err, sizeof(err)), -EIO);
	assert_false(agent_fetch_transient(-EIO));
	assert_int_equal(agent_fetch(url("/slow"), &o, &body, &len, err, sizeof(err)), -ETIMEDOUT);
	assert_non_null(strstr(err, "timed out"));
	assert_true(agent_fetch_transient(-ETIMEDOUT));
	assert_int_equal(agent_fetch("http://127.0.0.1:1/x", &lo, &body, &len, err, sizeof(err)),
			 -ECONNREFUSED);
	assert_non_null(strstr(err, "http://127.0.0.1:1/x: cannot connect"));
	assert_true(agent_fetch_transient(-ECONNREFUSED));
}

static void test_files(void **state)
{
	struct agent_fetch_opts o = { .max_bytes = 8, .policy = &open_lo };
	char path[] = "/tmp/agentd_fetch_XXXXXX", u[128], *body;
	size_t len;
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, "file text", 9), 9);
	close(fd);
	snprintf(u, sizeof(u), "file://%s", path);
	assert_int_equal(agent_fetch(u, &lo, &body, &len, err, sizeof(err)), 0);
	assert_int_equal(len, 9);
	assert_string_equal(body, "file text");
	free(body);
	assert_int_equal(agent_fetch(u, &o, &body, &len, err, sizeof(err)), SW_ETOOLONG);
	unlink(path);
	assert_int_equal(agent_fetch(u, &lo, &body, &len, err, sizeof(err)), SW_ENOTFOUND);
	assert_non_null(strstr(err, "cannot read file"));
}

static void test_schemes(void **state)
{
	char *body;
	size_t len;

	assert_int_equal(agent_fetch("ftp://x/y", &lo, &body, &len, err, sizeof(err)), -EINVAL);
	assert_string_equal(err,
			    "fetch: ftp://x/y: unsupported scheme \"ftp\" (expected http, https, file)");
	assert_int_equal(agent_fetch("nothing", &lo, &body, &len, err, sizeof(err)), -EINVAL);
	assert_int_equal(agent_fetch(NULL, &lo, &body, &len, err, sizeof(err)), -EINVAL);
	/* POST only to http(s). */
	assert_int_equal(agent_fetch_post_json("file:///tmp/x", "{}", 2, NULL, err, sizeof(err)),
			 -EINVAL);
}

static void test_post(void **state)
{
	static const char json[] = "{\"task_id\":\"t\",\"status\":\"completed\"}";

	assert_int_equal(agent_fetch_post_json(url("/post"), json, strlen(json), &lo, err,
					       sizeof(err)),
			 0);
	assert_string_equal(posted, json);
	assert_int_equal(agent_fetch_post_json(url("/busy"), json, strlen(json), &lo, err,
					       sizeof(err)),
			 -EAGAIN);
}

/* The default policy: the server is loopback, so nothing reaches it. */
static void test_policy_default(void **state)
{
	static const char json[] = "{}";
	char *body = (char *)1, want[256];
	size_t len;
	int before = served;

	assert_int_equal(agent_fetch(url("/ok"), NULL, &body, &len, err, sizeof(err)), -EACCES);
	assert_null(body);
	snprintf(want, sizeof(want),
		 "fetch: http://127.0.0.1:%d/ok: 127.0.0.1 is a loopback address; allow it with "
		 "agentd.fetch.allow_cidrs",
		 port);
	assert_string_equal(err, want);
	assert_false(agent_fetch_transient(-EACCES));
	/* callbacks alike */
	assert_int_equal(agent_fetch_post_json(url("/post"), json, 2, NULL, err, sizeof(err)),
			 -EACCES);
	assert_non_null(strstr(err, "127.0.0.1 is a loopback address"));
	/* a zeroed policy is the default */
	struct agent_fetch_policy none = { 0 };
	struct agent_fetch_opts o = { .policy = &none };

	assert_int_equal(agent_fetch(url("/ok"), &o, &body, &len, err, sizeof(err)), -EACCES);
	assert_int_equal(served, before); /* not one connection */
}

static void expect_refused(const char *u, int code, const char *what)
{
	char *body = (char *)1;
	size_t len;

	err[0] = '\0';
	if (agent_fetch(u, &lo, &body, &len, err, sizeof(err)) != code || !strstr(err, what))
		fail_msg("%s: got \"%s\", expected %d and \"%s\"", u, err, code, what);
	assert_null(body);
}

/* 127.0.0.1/32 opens that address only. */
static void test_policy_allow_list(void **state)
{
	char u[128], want[256], *body;
	size_t len;
	int before;

	assert_int_equal(agent_fetch(url("/ok"), &lo, &body, &len, err, sizeof(err)), 0);
	assert_string_equal(body, "hello body");
	free(body);

	/* an error names the URL, never its password (it reaches logs and rows) */
	snprintf(u, sizeof(u), "http://user:s3cret@127.0.0.1:%d/gone", port);
	assert_int_equal(agent_fetch(u, &lo, &body, &len, err, sizeof(err)), SW_ENOTFOUND);
	assert_non_null(strstr(err, "user:***@127.0.0.1"));
	assert_null(strstr(err, "s3cret"));
	before = served;
	snprintf(u, sizeof(u), "http://127.0.0.2:%d/ok", port);
	expect_refused(u, -EACCES, "127.0.0.2 is a loopback address; allow it with "
				   "agentd.fetch.allow_cidrs");
	snprintf(u, sizeof(u), "http://user:s3cret@127.0.0.2:%d/ok", port);
	expect_refused(u, -EACCES, "fetch: http://user:***@127.0.0.2:");
	assert_null(strstr(err, "s3cret"));
	snprintf(u, sizeof(u), "http://[::1]:%d/ok", port);
	expect_refused(u, -EACCES, ": ::1 is a loopback address; allow it with "
				   "agentd.fetch.allow_cidrs");
	snprintf(u, sizeof(u), "http://[::ffff:127.0.0.2]:%d/ok", port);
	expect_refused(u, -EACCES, "::ffff:127.0.0.2 is a loopback address");
	snprintf(u, sizeof(u), "http://0x7f000001:%d/ok", port);
	expect_refused(u, -EINVAL, "host \"0x7f000001\" is an IPv4 address in a non-standard form "
				   "(write it as a.b.c.d: 127.0.0.1)");
	snprintf(u, sizeof(u), "http://user@2130706433:%d/ok", port);
	expect_refused(u, -EINVAL, "host \"2130706433\" is an IPv4 address in a non-standard");
	snprintf(u, sizeof(u), "http://127.1:%d/ok", port);
	expect_refused(u, -EINVAL, "host \"127.1\" is an IPv4 address in a non-standard");
	snprintf(u, sizeof(u), "http://%%30x7f000001:%d/ok", port); /* libcurl decodes it */
	expect_refused(u, -EINVAL, "host \"0x7f000001\" is an IPv4 address in a non-standard");
	snprintf(u, sizeof(u), "http://0177.0.0.1:%d/ok", port);
	expect_refused(u, -EINVAL, "host \"0177.0.0.1\" is an IPv4 address in a non-standard");
	/* A redirect is checked at its hop. */
	snprintf(want, sizeof(want),
		 "fetch: %s: redirected to http://127.0.0.2:%d/ok: 127.0.0.2 is a loopback "
		 "address; allow it with agentd.fetch.allow_cidrs",
		 url("/to2"), port);
	expect_refused(url("/to2"), -EACCES, want);
	expect_refused(url("/tov6"), -EACCES, ": ::1 is a loopback address");
	assert_int_equal(served, before + 2); /* the two redirecting hops only */

	/* localhost: libcurl resolves it itself to ::1 and 127.0.0.1; the
	 * rule is about addresses, so ::1 is refused and the fetch goes to
	 * 127.0.0.1, the allowed one. */
	snprintf(u, sizeof(u), "http://localhost:%d/ok", port);
	assert_int_equal(agent_fetch(u, &lo, &body, &len, err, sizeof(err)), 0);
	assert_string_equal(body, "hello body");
	free(body);
	assert_int_equal(served, before + 3);
	/* With nothing allowed, localhost is refused, naming an address. */
	assert_int_equal(agent_fetch(u, NULL, &body, &len, err, sizeof(err)), -EACCES);
	assert_non_null(strstr(err, " is a loopback address; allow it with"));
	assert_int_equal(served, before + 3);
}

static void expect_refused_o(const char *u, const struct agent_fetch_opts *o, int code,
			     const char *what)
{
	char *body = (char *)1;
	size_t len;

	err[0] = '\0';
	if (agent_fetch(u, o, &body, &len, err, sizeof(err)) != code || !strstr(err, what))
		fail_msg("%s: got \"%s\", expected %d and \"%s\"", u, err, code, what);
	assert_null(body);
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_policy_files(void **state)
{
	char root[] = "/tmp/agentd_fetch_dirs_XXXXXX", p[512], u[640], want[1024], *body;
	struct agent_fetch_policy pol = { .n_file_dirs = 1 };
	struct agent_fetch_opts o = { .policy = &pol };
	size_t len;

	assert_non_null(mkdtemp(root));
	snprintf(p, sizeof(p), "%s/docs", root);
	assert_int_equal(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/docs/sub", root);
	assert_int_equal(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/docs2", root);
	assert_int_equal(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/docs/a.txt", root);
	write_file(p, "inside");
	snprintf(p, sizeof(p), "%s/docs2/b.txt", root);
	write_file(p, "outside");
	snprintf(p, sizeof(p), "%s/docs/out", root); /* a symlink out of docs */
	assert_int_equal(symlink("../docs2/b.txt", p), 0);
	snprintf(p, sizeof(p), "%s/docs/in", root);  /* one that stays inside */
	assert_int_equal(symlink("sub/../a.txt", p), 0);
	snprintf(p, sizeof(p), "%s/docs/fifo", root);
	assert_int_equal(mkfifo(p, 0600), 0);
	snprintf(pol.file_dirs[0], sizeof(pol.file_dirs[0]), "%s/docs/", root);

	/* Inside, by several spellings. */
	snprintf(u, sizeof(u), "file://%s/docs/a.txt", root);
	assert_int_equal(agent_fetch(u, &o, &body, &len, err, sizeof(err)), 0);
	assert_string_equal(body, "inside");
	free(body);
	snprintf(u, sizeof(u), "file://localhost%s/docs/sub/../%%61.txt?q#f", root);
	assert_int_equal(agent_fetch(u, &o, &body, &len, err, sizeof(err)), 0);
	assert_string_equal(body, "inside");
	free(body);
	snprintf(u, sizeof(u), "file://%s/docs/in", root);
	assert_int_equal(agent_fetch(u, &o, &body, &len, err, sizeof(err)), 0);
	assert_string_equal(body, "inside");
	free(body);

	/* Outside: a sibling sharing the prefix, .., a symlink out. */
	snprintf(u, sizeof(u), "file://%s/docs2/b.txt", root);
	snprintf(want, sizeof(want),
		 "fetch: %s: %s/docs2/b.txt is not under a directory of agentd.fetch.file_dirs", u,
		 root);
	expect_refused_o(u, &o, -EACCES, want);
	snprintf(u, sizeof(u), "file://%s/docs/../docs2/b.txt", root);
	expect_refused_o(u, &o, -EACCES, "/docs2/b.txt is not under a directory of");
	snprintf(u, sizeof(u), "file://%s/docs/%%2e%%2e/docs2/b.txt", root);
	expect_refused_o(u, &o, -EACCES, "/docs2/b.txt is not under a directory of");
	snprintf(u, sizeof(u), "file://%s/docs/out", root);
	expect_refused_o(u, &o, -EACCES, "/docs2/b.txt is not under a directory of");
	expect_refused_o("file:///etc/passwd", &o, -EACCES,
			 "fetch: file:///etc/passwd: /etc/passwd is not under a directory of "
			 "agentd.fetch.file_dirs");
	/* A missing file: not found inside; outside, not even that is said. */
	snprintf(u, sizeof(u), "file://%s/docs/missing.txt", root);
	expect_refused_o(u, &o, SW_ENOTFOUND, "cannot read file: No such file or directory");
	expect_refused_o("file:///etc/no-such-file", &o, -EACCES,
			 "/etc/no-such-file is not under a directory of");
	snprintf(u, sizeof(u), "file://%s/docs/../nope/x", root);
	expect_refused_o(u, &o, -EACCES, "/nope/x is not under a directory of");
	/* Not a regular file; hosts; escapes. */
	snprintf(u, sizeof(u), "file://%s/docs/fifo", root);
	expect_refused_o(u, &o, -EINVAL, "not a regular file");
	snprintf(u, sizeof(u), "file://%s/docs/sub", root);
	expect_refused_o(u, &o, -EINVAL, "not a regular file");
	snprintf(u, sizeof(u), "file://otherhost%s/docs/a.txt", root);
	expect_refused_o(u, &o, -EINVAL, "a file URL names no host (file:///path)");
	snprintf(u, sizeof(u), "file://%s/docs/a%%00.txt", root);
	expect_refused_o(u, &o, -EINVAL, "bad %-escape in the path");
	snprintf(u, sizeof(u), "file://%s/docs/a%%zz", root);
	expect_refused_o(u, &o, -EINVAL, "bad %-escape in the path");
	/* No directories: file:// is off. */
	snprintf(u, sizeof(u), "file://%s/docs/a.txt", root);
	snprintf(want, sizeof(want),
		 "fetch: %s: file:// is off (list the directories it may read in "
		 "agentd.fetch.file_dirs)",
		 u);
	expect_refused_o(u, NULL, -EACCES, want);
	/* A configured directory that is itself a symlink works. */
	snprintf(p, sizeof(p), "%s/alias", root);
	assert_int_equal(symlink("docs", p), 0);
	snprintf(pol.file_dirs[0], sizeof(pol.file_dirs[0]), "%s/alias", root);
	snprintf(u, sizeof(u), "file://%s/docs/a.txt", root);
	assert_int_equal(agent_fetch(u, &o, &body, &len, err, sizeof(err)), 0);
	free(body);
	snprintf(u, sizeof(u), "file://%s/alias/a.txt", root);
	assert_int_equal(agent_fetch(u, &o, &body, &len, err, sizeof(err)), 0);
	free(body);

	snprintf(p, sizeof(p), "rm -rf '%s'", root);
	assert_int_equal(system(p), 0);
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
		cmocka_unit_test(test_policy_default),
		cmocka_unit_test(test_policy_allow_list),
		cmocka_unit_test(test_policy_files),
	};

	return cmocka_run_group_tests(tests, start_server, stop_server);
}
