/* gpud_harness.c - start and stop a real gpud for integration tests; see
 * gpud_harness.h.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "tests/integration/gpud_harness.h"

#ifndef GPUD_BIN
#error "GPUD_BIN must name the gpud binary (gpud_bin_dep in gpud/meson.build)"
#endif

double gpud_it_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static int write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	int rc = 0;

	if (!f) {
		rc = -errno;
		fprintf(stderr, "gpud_it: %s: %s\n", path, strerror(errno));
		return rc;
	}
	if (fputs(text, f) < 0)
		rc = -EIO;
	if (fclose(f) != 0 && !rc)
		rc = -EIO;
	if (rc)
		fprintf(stderr, "gpud_it: %s: write failed\n", path);
	return rc;
}

/* JSON string literal of s into out (enough for paths: no control bytes
 * expected; quotes and backslashes escaped). */
static void json_quote(const char *s, char *out, size_t outlen)
{
	size_t o = 0;

	if (outlen < 3) {
		if (outlen)
			out[0] = '\0';
		return;
	}
	out[o++] = '"';
	for (; *s && o + 3 < outlen; s++) {
		if (*s == '"' || *s == '\\')
			out[o++] = '\\';
		out[o++] = *s;
	}
	out[o++] = '"';
	out[o] = '\0';
}

int gpud_it_prepare(struct gpud_it *d, const struct gpud_it_opts *o)
{
	static const struct gpud_it_opts none;
	char model_abs[PATH_MAX];
	char q_state[2 * GPUD_IT_PATH_MAX], q_log[2 * GPUD_IT_PATH_MAX];
	char q_sock[2 * GPUD_IT_PATH_MAX], q_model[2 * PATH_MAX];
	const char *model;
	char *text;
	size_t cap;
	int rc;

	if (!o)
		o = &none;
	memset(d, 0, sizeof(*d));
	d->status = -1;
	snprintf(d->dir, sizeof(d->dir), "/tmp/gpud-it-XXXXXX");
	if (!mkdtemp(d->dir)) {
		rc = -errno;
		fprintf(stderr, "gpud_it: mkdtemp: %s\n", strerror(errno));
		d->dir[0] = '\0';
		return rc;
	}
	snprintf(d->config, sizeof(d->config), "%s/gpud.json", d->dir);
	snprintf(d->socket, sizeof(d->socket), "%s/gpud.sock", d->dir);
	snprintf(d->log, sizeof(d->log), "%s/gpud.log", d->dir);
	snprintf(d->out, sizeof(d->out), "%s/gpud.out", d->dir);
	snprintf(d->state, sizeof(d->state), "%s/state", d->dir);

	if (o->raw_config)
		return write_file(d->config, o->raw_config);

	model = o->model ? o->model : GPUD_IT_MODEL;
	if (realpath(model, model_abs))
		model = model_abs;
	json_quote(d->state, q_state, sizeof(q_state));
	json_quote(d->log, q_log, sizeof(q_log));
	json_quote(d->socket, q_sock, sizeof(q_sock));
	json_quote(model, q_model, sizeof(q_model));

	cap = 4096 + strlen(q_model) + (o->gpud_extra ? strlen(o->gpud_extra) : 0) +
	      (o->devices ? strlen(o->devices) : 0);
	text = malloc(cap);
	if (!text)
		return -ENOMEM;
	snprintf(text, cap,
		 "{\n"
		 "  \"state_dir\": %s,\n"
		 "  \"log\": { \"level\": \"info\", \"file\": %s },\n"
		 "  \"gpud\": {\n"
		 "    \"socket\": %s,\n"
		 "    \"model\": %s,\n"
		 "    \"devices\": %s,\n"
		 "    \"threads\": %d%s\n"
		 "    %s\n"
		 "  }\n"
		 "}\n",
		 q_state, q_log, q_sock, q_model, o->devices ? o->devices : "[\"cpu\", \"cpu\"]",
		 o->threads > 0 ? o->threads : 2, o->gpud_extra ? "," : "",
		 o->gpud_extra ? o->gpud_extra : "");
	rc = write_file(d->config, text);
	free(text);
	return rc;
}

int gpud_it_spawn(struct gpud_it *d, const char *const *extra_args)
{
	const char *argv[32];
	int n = 0;
	pid_t parent = getpid();
	pid_t pid;

	argv[n++] = GPUD_BIN;
	argv[n++] = "serve";
	argv[n++] = "--config";
	argv[n++] = d->config;
	for (int i = 0; extra_args && extra_args[i] && n < 31; i++)
		argv[n++] = extra_args[i];
	argv[n] = NULL;

	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		int rc = -errno;

		fprintf(stderr, "gpud_it: fork: %s\n", strerror(errno));
		return rc;
	}
	if (pid == 0) {
		int fd;

		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(127);
		fd = open(d->out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		if (fd >= 0) {
			dup2(fd, STDOUT_FILENO);
			dup2(fd, STDERR_FILENO);
		}
		fd = open("/dev/null", O_RDONLY);
		if (fd >= 0)
			dup2(fd, STDIN_FILENO);
		execv(argv[0], (char *const *)argv);
		fprintf(stderr, "gpud_it: exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	setpgid(pid, pid); /* also here: no race with the first kill */
	d->pid = pid;
	d->status = -1;
	return 0;
}

/* Exit code of a wait status: 0..255, or 128 + signal. */
static int exit_code(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 128 + WTERMSIG(status);
	return -1;
}

bool gpud_it_running(struct gpud_it *d)
{
	int st;
	pid_t r;

	if (d->pid <= 0)
		return false;
	r = waitpid(d->pid, &st, WNOHANG);
	if (r == d->pid) {
		d->status = st;
		d->pid = 0;
		return false;
	}
	return r == 0;
}

static void tail_file(const char *path, int lines)
{
	FILE *f = fopen(path, "r");
	char *buf;
	long size, from;
	size_t n, start;
	int seen = 0;

	if (!f) {
		fprintf(stderr, "    (%s: %s)\n", path, strerror(errno));
		return;
	}
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	from = size > (1l << 20) ? size - (1l << 20) : 0; /* the last MiB is plenty */
	fseek(f, from, SEEK_SET);
	buf = malloc((size_t)(size - from) + 1);
	if (!buf) {
		fclose(f);
		return;
	}
	n = fread(buf, 1, (size_t)(size - from), f);
	fclose(f);
	buf[n] = '\0';
	/* back from the end over `lines` newlines (a final one not counted) */
	start = n;
	if (start > 0 && buf[start - 1] == '\n')
		start--;
	while (start > 0) {
		if (buf[start - 1] == '\n' && ++seen == lines)
			break;
		start--;
	}
	if (n == 0)
		fprintf(stderr, "    (%s is empty)\n", path);
	fwrite(buf + start, 1, n - start, stderr);
	if (n > 0 && buf[n - 1] != '\n')
		fputc('\n', stderr);
	free(buf);
}

void gpud_it_print_tail(const struct gpud_it *d, const char *what, int lines)
{
	if (!d->dir[0])
		return;
	fprintf(stderr, "---- gpud (%s): last %d lines of %s ----\n", what, lines, d->log);
	tail_file(d->log, lines);
	fprintf(stderr, "---- gpud (%s): last %d lines of %s ----\n", what, lines, d->out);
	tail_file(d->out, lines);
	fprintf(stderr, "---- end of gpud output ----\n");
}

struct proto_client *gpud_it_connect(const struct gpud_it *d)
{
	struct proto_client_opts o;
	struct proto_client *c = NULL;
	char err[SW_ERR_MAX] = "";
	int rc;

	proto_client_opts_default(&o);
	o.timeout_ms = 120000;
	rc = proto_client_connect(&c, d->socket, &o, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "gpud_it: connect %s: %s (%s)\n", d->socket, err,
			sw_errname(rc));
		return NULL;
	}
	return c;
}

json_t *gpud_it_stats(struct proto_client *c, bool mem)
{
	char err[SW_ERR_MAX] = "";
	char *text = NULL;
	json_error_t jerr;
	json_t *root;
	int rc;

	rc = mem ? proto_client_mem(c, 0, &text, err, sizeof(err)) :
		   proto_client_stats(c, &text, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "gpud_it: %s: %s (%s)\n", mem ? "mem" : "stats", err,
			sw_errname(rc));
		return NULL;
	}
	root = json_loads(text, 0, &jerr);
	if (!root)
		fprintf(stderr, "gpud_it: stats reply is not JSON: line %d: %s\n%.2000s\n",
			jerr.line, jerr.text, text);
	free(text);
	return root;
}

int gpud_it_wait_ready(struct gpud_it *d, uint32_t timeout_ms)
{
	double t0 = gpud_it_now();
	double deadline = t0 + timeout_ms / 1000.0;

	for (;;) {
		struct proto_client_opts o;
		struct proto_client *c = NULL;
		char err[SW_ERR_MAX];

		if (!gpud_it_running(d)) {
			fprintf(stderr, "gpud_it: gpud exited before answering (exit %d)\n",
				d->status >= 0 ? exit_code(d->status) : -1);
			gpud_it_print_tail(d, "exited at start", 40);
			return -ECHILD;
		}
		proto_client_opts_default(&o);
		o.timeout_ms = 5000;
		if (proto_client_connect(&c, d->socket, &o, err, sizeof(err)) == 0) {
			char *text = NULL;
			int rc = proto_client_stats(c, &text, err, sizeof(err));

			free(text);
			proto_client_close(c);
			if (rc == 0) {
				d->ready_s = gpud_it_now() - t0;
				return 0;
			}
		}
		if (gpud_it_now() > deadline) {
			fprintf(stderr, "gpud_it: gpud did not answer STATS on %s within %u ms\n",
				d->socket, timeout_ms);
			gpud_it_print_tail(d, "not ready", 40);
			return -ETIMEDOUT;
		}
		sleep_ms(20);
	}
}

int gpud_it_start(struct gpud_it *d, const struct gpud_it_opts *o)
{
	int rc = gpud_it_prepare(d, o);

	if (rc)
		return rc;
	rc = gpud_it_spawn(d, NULL);
	if (rc)
		return rc;
	if (o && o->no_wait)
		return 0;
	rc = gpud_it_wait_ready(d, o && o->ready_ms ? o->ready_ms : 30000);
	if (rc && d->pid > 0) {
		kill(-d->pid, SIGKILL);
		waitpid(d->pid, &d->status, 0);
		d->pid = 0;
	}
	return rc;
}

int gpud_it_wait_exit(struct gpud_it *d, uint32_t timeout_ms)
{
	double deadline = gpud_it_now() + timeout_ms / 1000.0;

	for (;;) {
		if (!gpud_it_running(d))
			return d->status >= 0 ? exit_code(d->status) : -ECHILD;
		if (gpud_it_now() > deadline)
			return -ETIMEDOUT;
		sleep_ms(10);
	}
}

int gpud_it_stop(struct gpud_it *d, int sig, uint32_t timeout_ms)
{
	int rc;

	if (d->pid <= 0)
		return d->status >= 0 ? exit_code(d->status) : -ECHILD;
	kill(d->pid, sig);
	rc = gpud_it_wait_exit(d, timeout_ms);
	if (rc == -ETIMEDOUT) {
		fprintf(stderr, "gpud_it: gpud did not exit within %u ms of signal %d; killing it\n",
			timeout_ms, sig);
		gpud_it_print_tail(d, "did not stop", 40);
		kill(-d->pid, SIGKILL);
		waitpid(d->pid, &d->status, 0);
		d->pid = 0;
	}
	return rc;
}

static void remove_tree(const char *path)
{
	DIR *dir = opendir(path);
	struct dirent *e;
	char sub[PATH_MAX];

	if (!dir) {
		unlink(path);
		return;
	}
	while ((e = readdir(dir))) {
		struct stat st;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
		if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode))
			remove_tree(sub);
		else
			unlink(sub);
	}
	closedir(dir);
	rmdir(path);
}

void gpud_it_free(struct gpud_it *d)
{
	if (!d)
		return;
	if (d->pid > 0) {
		kill(-d->pid, SIGKILL);
		waitpid(d->pid, &d->status, 0);
		d->pid = 0;
	}
	if (d->dir[0] && !getenv("GPUD_IT_KEEP"))
		remove_tree(d->dir);
	d->dir[0] = '\0';
}

int gpud_it_run_cmd(const char *const *args, char *out, size_t outlen, uint32_t timeout_ms)
{
	const char *argv[32];
	int pfd[2];
	int n = 0, st;
	size_t used = 0;
	double deadline = gpud_it_now() + timeout_ms / 1000.0;
	pid_t pid;

	argv[n++] = GPUD_BIN;
	for (int i = 0; args && args[i] && n < 31; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	if (outlen)
		out[0] = '\0';
	if (pipe2(pfd, O_CLOEXEC) < 0)
		return -errno;
	fflush(stdout);
	fflush(stderr);
	pid = fork();
	if (pid < 0) {
		int rc = -errno;

		close(pfd[0]);
		close(pfd[1]);
		return rc;
	}
	if (pid == 0) {
		int fd = open("/dev/null", O_RDONLY);

		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (fd >= 0)
			dup2(fd, STDIN_FILENO);
		dup2(pfd[1], STDOUT_FILENO);
		dup2(pfd[1], STDERR_FILENO);
		execv(argv[0], (char *const *)argv);
		_exit(127);
	}
	close(pfd[1]);
	for (;;) {
		struct pollfd p = { .fd = pfd[0], .events = POLLIN };
		int left = (int)((deadline - gpud_it_now()) * 1000);
		char buf[1024];
		ssize_t r;

		if (left <= 0) {
			kill(pid, SIGKILL);
			break;
		}
		if (poll(&p, 1, left) <= 0)
			continue;
		r = read(pfd[0], buf, sizeof(buf));
		if (r <= 0)
			break;
		for (ssize_t i = 0; i < r && used + 1 < outlen; i++)
			out[used++] = buf[i];
		if (outlen)
			out[used] = '\0';
	}
	close(pfd[0]);
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return exit_code(st);
}

bool gpud_it_file_has(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	char *buf;
	long size;
	bool found = false;

	if (!f)
		return false;
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)size + 1);
	if (buf) {
		size_t n = fread(buf, 1, (size_t)size, f);

		buf[n] = '\0';
		found = strstr(buf, needle) != NULL;
		free(buf);
	}
	fclose(f);
	return found;
}

json_t *gpud_it_jget(json_t *root, const char *path)
{
	const char *p = path;
	json_t *cur = root;

	while (cur && *p) {
		char key[128];
		size_t n = 0;

		while (*p && *p != '.' && *p != '[' && n + 1 < sizeof(key))
			key[n++] = *p++;
		key[n] = '\0';
		if (n)
			cur = json_object_get(cur, key);
		while (cur && *p == '[') {
			char *end;
			unsigned long i = strtoul(p + 1, &end, 10);

			if (*end != ']')
				return NULL;
			cur = json_array_get(cur, i);
			p = end + 1;
		}
		if (*p == '.')
			p++;
	}
	return cur;
}

int gpud_it_jint(json_t *root, const char *path, int64_t *v)
{
	json_t *j = gpud_it_jget(root, path);

	if (!j)
		return -ENOENT;
	if (json_is_integer(j)) {
		*v = json_integer_value(j);
		return 0;
	}
	if (json_is_real(j)) {
		double x = json_real_value(j);

		if (x == (double)(int64_t)x) {
			*v = (int64_t)x;
			return 0;
		}
	}
	return -EINVAL;
}

json_t *gpud_it_named(json_t *arr, const char *name)
{
	size_t i;
	json_t *e;

	if (!json_is_array(arr))
		return NULL;
	json_array_foreach(arr, i, e) {
		const char *n = json_string_value(json_object_get(e, "name"));

		if (n && !strcmp(n, name))
			return e;
	}
	return NULL;
}

int gpud_it_fix_setup(void **state)
{
	struct gpud_it_fix *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	f->d[0].status = f->d[1].status = -1;
	*state = f;
	return 0;
}

int gpud_it_fix_teardown(void **state)
{
	struct gpud_it_fix *f = *state;

	for (int i = 0; i < 2; i++) {
		if (!f->done && f->d[i].dir[0])
			gpud_it_print_tail(&f->d[i], "test failed", 60);
		gpud_it_free(&f->d[i]);
	}
	free(f);
	return 0;
}
