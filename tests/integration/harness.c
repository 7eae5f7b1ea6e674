/* harness.c - finds or starts the servers of an integration test.
 *
 * Starting is delegated to scripts/lib/test-servers.sh, the same code
 * scripts/test uses, so there is one way servers are set up.
 */
#include "tests/integration/harness.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "sw_config.h"

#define REDIS_VAR "SWARM_TEST_REDIS_URL"
#define PG_VAR "SWARM_TEST_PG_URL"

static char started_dir[PATH_MAX]; /* non-empty while we own servers */
static unsigned started;           /* IT_* bits we started */

bool it_ci(void)
{
	const char *ci = getenv("CI");

	return ci && strcmp(ci, "true") == 0;
}

static const char *env_url(const char *name)
{
	const char *v = getenv(name);

	return v && v[0] ? v : NULL;
}

const char *it_redis_url(void)
{
	return env_url(REDIS_VAR);
}

const char *it_pg_url(void)
{
	return env_url(PG_VAR);
}

/* Prints why a server is missing and returns the exit status to use. */
__attribute__((format(printf, 1, 2)))
static int unavailable(const char *fmt, ...)
{
	va_list ap;

	fputs("harness: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (it_ci()) {
		fputs(" -- failing (CI=true)\n", stderr);
		return IT_EXIT_FAIL;
	}
	fputs(" -- skipping (exit 77)\n", stderr);
	return IT_EXIT_SKIP;
}

int it_parse_redis_url(const char *url, char *host, size_t hostlen, int *port)
{
	static const char scheme[] = "redis://";
	const char *h, *end;
	size_t n;

	if (!url || strncmp(url, scheme, sizeof(scheme) - 1) != 0)
		return -EINVAL;
	h = url + sizeof(scheme) - 1;
	if (*h == '[') { /* [v6 address] */
		end = strchr(++h, ']');
		if (!end)
			return -EINVAL;
		n = (size_t)(end - h);
		end++;
	} else {
		n = strcspn(h, ":/@");
		end = h + n;
	}
	if (n == 0 || n >= hostlen || *end == '@')
		return -EINVAL;
	memcpy(host, h, n);
	host[n] = '\0';

	*port = 6379;
	if (*end == ':') {
		char *stop;
		long p;

		errno = 0;
		p = strtol(end + 1, &stop, 10);
		if (errno || stop == end + 1 || p < 1 || p > 65535)
			return -EINVAL;
		*port = (int)p;
		end = stop;
	}
	if (*end != '\0' && *end != '/')
		return -EINVAL;
	return 0;
}

bool it_redis_ping(const char *host, int port)
{
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM };
	struct addrinfo *res, *ai;
	struct timeval tv = { .tv_sec = 2 };
	char portstr[16], reply[64];
	bool ok = false;

	snprintf(portstr, sizeof(portstr), "%d", port);
	if (getaddrinfo(host, portstr, &hints, &res) != 0)
		return false;
	for (ai = res; ai && !ok; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
				ai->ai_protocol);
		size_t got = 0;
		ssize_t r;

		if (fd < 0)
			continue;
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
		    write(fd, "PING\r\n", 6) == 6) {
			while (got < sizeof(reply) - 1 &&
			       (r = read(fd, reply + got, sizeof(reply) - 1 - got)) > 0) {
				got += (size_t)r;
				if (memchr(reply, '\n', got))
					break;
			}
			reply[got] = '\0';
			ok = strncmp(reply, "+PONG\r\n", 7) == 0;
		}
		close(fd);
	}
	freeaddrinfo(res);
	return ok;
}

/* Runs test-servers.sh with argv, its stdout into out (NUL-terminated).
 * Returns its exit status, or -1 when it could not run. */
static int run_script(char *const argv[], char *out, size_t outlen)
{
	int pfd[2], status;
	size_t got = 0;
	ssize_t r;
	pid_t pid;

	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -1;
	pid = fork();
	if (pid < 0) {
		close(pfd[0]);
		close(pfd[1]);
		return -1;
	}
	if (pid == 0) {
		if (dup2(pfd[1], STDOUT_FILENO) < 0)
			_exit(127);
		execv(argv[0], argv);
		_exit(127);
	}
	close(pfd[1]);
	while (got < outlen - 1 &&
	       ((r = read(pfd[0], out + got, outlen - 1 - got)) > 0 ||
		(r < 0 && errno == EINTR)))
		if (r > 0)
			got += (size_t)r;
	out[got] = '\0';
	close(pfd[0]);
	while (waitpid(pid, &status, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Starts private servers for the bits in `which` and exports their URLs.
 * Returns 0, or -1 after printing why. */
static int start_private(unsigned which)
{
	char script[PATH_MAX], owner[32], out[4096];
	const char *tmp = getenv("TMPDIR");
	char *line, *save;
	int rc;

	snprintf(script, sizeof(script), "%s/scripts/lib/test-servers.sh",
		 SW_SOURCE_ROOT);
	if (access(script, X_OK) != 0) {
		fprintf(stderr, "harness: %s: %s\n", script, strerror(errno));
		return -1;
	}
	snprintf(started_dir, sizeof(started_dir), "%s/swarm-it.XXXXXX",
		 tmp && tmp[0] ? tmp : "/tmp");
	if (!mkdtemp(started_dir)) {
		fprintf(stderr, "harness: mkdtemp %s: %s\n", started_dir,
			strerror(errno));
		started_dir[0] = '\0';
		return -1;
	}
	snprintf(owner, sizeof(owner), "%ld", (long)getpid());
	char *argv[] = {
		script, "start", "-o", owner, "-s",
		which == (IT_REDIS | IT_PG) ? "redis,pg" :
		which == IT_REDIS ? "redis" : "pg",
		started_dir, NULL,
	};
	rc = run_script(argv, out, sizeof(out));
	if (rc != 0) {
		fprintf(stderr, "harness: test-servers.sh start failed (%d)\n", rc);
		it_stop(); /* removes the directory and the watcher */
		return -1;
	}
	started = which;
	atexit(it_stop);
	for (line = strtok_r(out, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		char *eq = strchr(line, '=');

		if (!eq)
			continue;
		*eq = '\0';
		setenv(line, eq + 1, 1);
	}
	return 0;
}

void it_stop(void)
{
	char script[PATH_MAX], out[256];

	if (!started_dir[0])
		return;
	snprintf(script, sizeof(script), "%s/scripts/lib/test-servers.sh",
		 SW_SOURCE_ROOT);
	char *argv[] = { script, "stop", started_dir, NULL };
	if (run_script(argv, out, sizeof(out)) != 0)
		fprintf(stderr, "harness: stopping servers in %s failed\n",
			started_dir);
	if (started & IT_REDIS) {
		unsetenv(REDIS_VAR);
		unsetenv("SWARM_TEST_REDIS_SOCKET");
	}
	if (started & IT_PG) {
		unsetenv(PG_VAR);
		unsetenv("SWARM_TEST_PG_SOCKET_DIR");
	}
	started = 0;
	started_dir[0] = '\0';
}

int it_start(unsigned need)
{
	unsigned missing = 0;
	char host[256];
	int port;

	if ((need & IT_REDIS) && !it_redis_url())
		missing |= IT_REDIS;
	if ((need & IT_PG) && !it_pg_url())
		missing |= IT_PG;
	if (missing && start_private(missing) != 0)
		return unavailable("%s not set and no private server could be started",
				   missing & IT_REDIS ? REDIS_VAR : PG_VAR);

	if (need & IT_REDIS) {
		const char *url = it_redis_url();

		if (!url || it_parse_redis_url(url, host, sizeof(host), &port) != 0)
			return unavailable("%s=%s: not a redis://HOST:PORT URL",
					   REDIS_VAR, url ? url : "");
		if (!it_redis_ping(host, port))
			return unavailable("no Redis answers PING at %s", url);
	}
	if (need & IT_PG) {
		const char *url = it_pg_url();

		if (!url || PQping(url) != PQPING_OK)
			return unavailable("no PostgreSQL accepts connections at %s",
					   url ? url : "(unset)");
	}
	return 0;
}
