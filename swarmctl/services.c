/* services.c - starting, stopping and probing the swarm's processes (see
 * services.h). */
#include "swarmctl/services.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <jansson.h>
#include <libgen.h>
#include <libpq-fe.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/secret.h"
#include "common/time.h"
#include "proto/client.h"
#include "swarmctl/clients.h"
#include "swarmctl/proc.h"

#define REDIS_START_MS 15000
#define PG_START_S 60
#define GPUD_START_MS 180000 /* model load + warm-up of a large model */
#define AGENTD_SETTLE_MS 1500
#define AGENTD_START_MS 30000 /* until its status file names it */
#define PG_PROBE_TIMEOUT_S 5
#define AGENTD_DRAIN_MS 60000 /* workers finish or hand back their tasks */
#define HTTP_START_MS 30000   /* gpud-http: listening and gpud reachable */
#define HTTP_STOP_MS 15000    /* its streams end, its connections close */
#define HTTP_PROBE_MS 2000    /* one GET /health, connect to status line */
#define LOCK_WAIT_MS 60000

/* The built-in model: random weights, byte vocabulary, small enough to run
 * a demo on two cores. Its output is noise; every place that shows text
 * says so. */
static const char *const builtin_model_args[] = {
	"--dim", "128", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--ffn", "384",
	"--vocab", "byte", "--type", "q8_0", "--seed", "20261129", "--context", "4096",
	"--name", "swarm-builtin-random", NULL,
};

/* snprintf that reports truncation: 0 or -ENAMETOOLONG. */
__attribute__((format(printf, 3, 4)))
static int put(char *dst, size_t cap, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(dst, cap, fmt, ap);
	va_end(ap);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

static const char *const names[CTL_N_SERVICES] = { "redis", "postgres", "gpud", "agentd",
						   "gpud-http" };

const char *ctl_service_name(enum ctl_service s)
{
	return (unsigned)s < CTL_N_SERVICES ? names[s] : "?";
}

void ctl_path(const struct ctl_env *e, const char *rel, char *out, size_t cap)
{
	/* state_dir is bounded at init so that every path swarmctl forms in
	 * it fits; a truncation here would be a bug, and shows as ENOENT */
	(void)put(out, cap, "%s/%s", e->state_dir, rel);
}

bool ctl_service_managed(const struct ctl_env *e, enum ctl_service s)
{
	return s == CTL_GPUD || s == CTL_AGENTD || s == CTL_HTTP || e->managed;
}

bool ctl_service_enabled(const struct ctl_env *e, enum ctl_service s)
{
	return s != CTL_HTTP || e->cfg.http.listen[0] != '\0';
}

static bool is_exec(const char *p)
{
	return access(p, X_OK) == 0;
}

/* bin: $env_var, else the build tree's <build>/<dir>/<name> relative to
 * <build>/swarmctl/swarmctl, else next to our executable (an install:
 * <bindir>/<name>, under DESTDIR too), else from PATH. Each agentd finds
 * its own SQL migrations (agentd/sql_dir.h). */
static void find_bin(const char *env_var, const char *dir, const char *name, char *out,
		     size_t cap)
{
	char self[PATH_MAX], cand[PATH_MAX + 64];
	const char *v = getenv(env_var);
	ssize_t n;

	if (v && *v) {
		snprintf(out, cap, "%s", v);
		return;
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		self[n] = '\0';
		char *d = dirname(self);

		(void)put(cand, sizeof(cand), "%s/../%s/%s", d, dir, name);
		if (is_exec(cand)) {
			(void)put(out, cap, "%s", cand);
			return;
		}
		(void)put(cand, sizeof(cand), "%s/%s", d, name);
		if (is_exec(cand)) {
			(void)put(out, cap, "%s", cand);
			return;
		}
	}
	snprintf(out, cap, "%s", name); /* from PATH */
}

/* Whether the program find_bin chose can be run: a path that is
 * executable, or a bare name found in PATH. */
static bool bin_runnable(const char *bin)
{
	const char *path = getenv("PATH");
	char cand[PATH_MAX];

	if (strchr(bin, '/'))
		return is_exec(bin);
	while (path && *path) {
		size_t n = strcspn(path, ":");

		if (n > 0 && snprintf(cand, sizeof(cand), "%.*s/%s", (int)n, path, bin) <
				     (int)sizeof(cand) &&
		    is_exec(cand))
			return true;
		path += n + (path[n] == ':');
	}
	return false;
}

static void find_pg_bindir(char *out, size_t cap)
{
	const char *v = getenv("SWARM_PG_BINDIR");
	DIR *d;
	struct dirent *de;
	long best = -1;

	if (v && *v) {
		snprintf(out, cap, "%s", v);
		return;
	}
	out[0] = '\0';
	d = opendir("/usr/lib/postgresql");
	if (!d)
		return;
	while ((de = readdir(d))) {
		char p[PATH_MAX];
		char *end;
		long ver = strtol(de->d_name, &end, 10);

		if (end == de->d_name || *end || ver <= best)
			continue;
		snprintf(p, sizeof(p), "/usr/lib/postgresql/%s/bin/initdb", de->d_name);
		if (is_exec(p)) {
			best = ver;
			snprintf(out, cap, "/usr/lib/postgresql/%ld/bin", ver);
		}
	}
	closedir(d);
}

static void default_state_dir(char *out, size_t cap)
{
	const char *v = getenv("SWARM_STATE_DIR"), *home = getenv("HOME");

	if (v && *v)
		snprintf(out, cap, "%s", v);
	else if (geteuid() == 0)
		snprintf(out, cap, "/var/lib/swarm");
	else if (home && *home)
		snprintf(out, cap, "%s/.local/state/swarm", home);
	else
		snprintf(out, cap, "/tmp/swarm-%d", (int)geteuid());
}

int ctl_env_init(struct ctl_env *e, const char *config_path, char *err, size_t errlen)
{
	const char *v;
	int rc;

	memset(e, 0, sizeof(*e));
	if (!config_path || !*config_path)
		config_path = getenv("SWARM_CONFIG");
	find_bin("SWARM_GPUD_BIN", "gpud", "gpud", e->gpud_bin, sizeof(e->gpud_bin));
	find_bin("SWARM_AGENTD_BIN", "agentd", "agentd", e->agentd_bin, sizeof(e->agentd_bin));
	find_bin("SWARM_GPUD_HTTP_BIN", "http", "gpud-http", e->http_bin, sizeof(e->http_bin));
	find_pg_bindir(e->pg_bindir, sizeof(e->pg_bindir));
	e->pg_os_user = geteuid() == 0 ? "postgres" : NULL;

	if (config_path && *config_path) {
		e->managed = false;
		if (!realpath(config_path, e->user_config))
			return sw_seterr(err, errlen, -errno, "%s: %s (wrong config path?)",
					 config_path, strerror(errno));
		snprintf(e->config_path, sizeof(e->config_path), "%s", e->user_config);
		rc = sw_config_load_file(e->user_config, &e->cfg, err, errlen);
		if (rc)
			return rc;
		rc = sw_config_apply_env(&e->cfg, err, errlen);
		if (rc)
			return rc;
		rc = sw_config_validate(&e->cfg, SW_CONFIG_NEED_MODEL, err, errlen);
		if (rc)
			return rc;
		rc = sw_secrets_load(&e->cfg, err, errlen);
		if (rc)
			return rc;
		snprintf(e->state_dir, sizeof(e->state_dir), "%s", e->cfg.state_dir);
		return 0;
	}

	/* managed: defaults, then the environment, then our own locations */
	e->managed = true;
	default_state_dir(e->state_dir, sizeof(e->state_dir));
	sw_config_defaults(&e->cfg);
	rc = sw_config_apply_env(&e->cfg, err, errlen);
	if (rc)
		return rc;
	v = getenv("SWARM_MODEL");
	e->builtin_model = !(v && *v);
	if (put(e->cfg.state_dir, sizeof(e->cfg.state_dir), "%s", e->state_dir) ||
	    put(e->config_path, sizeof(e->config_path), "%s/swarm.json", e->state_dir) ||
	    put(e->cfg.redis.url, sizeof(e->cfg.redis.url), "unix://%s/run/redis.sock",
		e->state_dir) ||
	    put(e->cfg.postgres.url, sizeof(e->cfg.postgres.url),
		"host=%s/pg dbname=swarm user=swarm", e->state_dir) ||
	    put(e->cfg.gpud.socket, sizeof(e->cfg.gpud.socket), "%s/run/gpud.sock",
		e->state_dir) ||
	    (e->builtin_model && put(e->cfg.gpud.model, sizeof(e->cfg.gpud.model),
				     "%s/models/builtin.gguf", e->state_dir)))
		return sw_seterr(err, errlen, -ENAMETOOLONG,
				 "state directory %s: too long (a Unix socket path inside it must "
				 "fit in %zu bytes; set SWARM_STATE_DIR to a shorter path)",
				 e->state_dir, sizeof(e->cfg.gpud.socket));
	if (!getenv("SWARM_WORKERS"))
		e->cfg.agentd.workers = 2;
	/* the HTTP front on loopback (no key needed there) unless
	 * SWARM_HTTP_LISTEN names another address, or "" for none; by
	 * default only where gpud-http is installed (asked for, a missing
	 * one is an error at start) */
	if (!getenv("SWARM_HTTP_LISTEN")) {
		if (bin_runnable(e->http_bin))
			snprintf(e->cfg.http.listen, sizeof(e->cfg.http.listen), "%s",
				 CTL_HTTP_LISTEN_DEFAULT);
		else
			e->http_missing = true;
	}
	/* Started by root: Redis, gpud and agentd run as the dedicated user
	 * "swarm" (created on first start), PostgreSQL as postgres;
	 * SWARM_USER names another, SWARM_USER= keeps them root's. */
	if (geteuid() == 0 && !getenv("SWARM_USER"))
		snprintf(e->cfg.user, sizeof(e->cfg.user), "swarm");
	/* Managed Redis and PostgreSQL take no password (Unix sockets in the
	 * state directory): none is read, and none reaches the children. */
	e->cfg.redis.password_file[0] = e->cfg.postgres.password_file[0] = '\0';
	unsetenv(SW_SECRET_REDIS_ENV);
	unsetenv(SW_SECRET_PG_ENV);
	unsetenv("SWARM_REDIS_PASSWORD_FILE");
	unsetenv("SWARM_PG_PASSWORD_FILE");
	return sw_config_validate(&e->cfg, SW_CONFIG_NEED_MODEL, err, errlen);
}

static int write_file(const char *path, const char *text, char *err, size_t errlen)
{
	char tmp[PATH_MAX + 8];
	FILE *f;
	int rc = 0;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "we");
	if (!f)
		return sw_seterr(err, errlen, -errno, "%s: %s", tmp, strerror(errno));
	if (fputs(text, f) < 0 || fputc('\n', f) < 0)
		rc = -EIO;
	if (fclose(f) != 0 && !rc)
		rc = -errno;
	if (!rc && rename(tmp, path) != 0)
		rc = -errno;
	if (rc) {
		unlink(tmp);
		return sw_seterr(err, errlen, rc, "%s: %s", path, strerror(-rc));
	}
	return 0;
}

int ctl_state_prepare(struct ctl_env *e, char *err, size_t errlen)
{
	static const char *const dirs[] = { "", "/run", "/logs", "/redis", "/models" };
	char p[PATH_MAX + 16];
	int rc;

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		snprintf(p, sizeof(p), "%s%s", e->state_dir, dirs[i]);
		rc = ctl_mkdirs(p, 0755);
		if (rc)
			return sw_seterr(err, errlen, rc, "%s: %s", p, strerror(-rc));
	}
	if (e->managed) {
		char *json = sw_config_to_json(&e->cfg);

		if (!json)
			return sw_seterr(err, errlen, -ENOMEM, "out of memory");
		rc = write_file(e->config_path, json, err, errlen);
		free(json);
		if (rc)
			return rc;
	}
	return 0;
}

int ctl_state_lock(struct ctl_env *e, char *err, size_t errlen)
{
	char p[PATH_MAX + 32];
	struct sw_deadline d = sw_deadline_in_ms(LOCK_WAIT_MS);
	int fd;

	ctl_path(e, "swarmctl.lock", p, sizeof(p));
	fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return sw_seterr(err, errlen, -errno, "%s: %s", p, strerror(errno));
	while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		if (errno != EWOULDBLOCK || sw_deadline_expired(d)) {
			close(fd);
			return sw_seterr(err, errlen, SW_EBUSY,
					 "another swarmctl holds %s (start or stop in progress)", p);
		}
		sw_sleep_ms(100);
	}
	return fd;
}

static void pid_path(const struct ctl_env *e, enum ctl_service s, char *out, size_t cap)
{
	char rel[64];

	snprintf(rel, sizeof(rel), "run/%s.pid", names[s]);
	ctl_path(e, rel, out, cap);
}

static void log_path(const struct ctl_env *e, const char *name, char *out, size_t cap)
{
	char rel[64];

	snprintf(rel, sizeof(rel), "logs/%s.log", name);
	ctl_path(e, rel, out, cap);
}

/* True when pid is a postmaster of the cluster in data: its working
 * directory is the data directory (a postmaster chdirs there), or, where
 * that link is not ours to read, its name is postgres. A pid that a
 * reboot handed to another process is not. */
static bool is_postmaster_of(pid_t pid, const char *data)
{
	char link[64], cwd[PATH_MAX], real[PATH_MAX], comm[32] = "";
	ssize_t n;
	FILE *f;

	snprintf(link, sizeof(link), "/proc/%d/cwd", (int)pid);
	n = readlink(link, cwd, sizeof(cwd) - 1);
	if (n > 0) {
		cwd[n] = '\0';
		return realpath(data, real) && strcmp(cwd, real) == 0;
	}
	snprintf(link, sizeof(link), "/proc/%d/comm", (int)pid);
	f = fopen(link, "re");
	if (!f)
		return false;
	if (!fgets(comm, sizeof(comm), f))
		comm[0] = '\0';
	fclose(f);
	return strcmp(comm, "postgres\n") == 0;
}

/* postmaster.pid's first line: the pid it names (0 when none), whether or
 * not that process lives. */
static pid_t pg_pidfile_pid(const struct ctl_env *e)
{
	char p[PATH_MAX + 32];
	int pid = 0;
	FILE *f;

	ctl_path(e, "pg/data/postmaster.pid", p, sizeof(p));
	f = fopen(p, "re");
	if (!f)
		return 0;
	if (fscanf(f, "%d", &pid) != 1)
		pid = 0;
	fclose(f);
	return pid > 0 ? pid : 0;
}

/* The live postmaster of the managed cluster, or 0. */
static pid_t pg_pid(const struct ctl_env *e)
{
	char data[PATH_MAX + 32];
	pid_t pid = pg_pidfile_pid(e);

	ctl_path(e, "pg/data", data, sizeof(data));
	return pid && ctl_proc_start_ticks(pid) && is_postmaster_of(pid, data) ? pid : 0;
}

pid_t ctl_service_pid(const struct ctl_env *e, enum ctl_service s)
{
	char p[PATH_MAX + 32];
	pid_t pid;

	if (!ctl_service_managed(e, s))
		return 0;
	if (s == CTL_POSTGRES)
		return pg_pid(e);
	pid_path(e, s, p, sizeof(p));
	pid = ctl_pidfile_live(p);
	return pid > 0 ? pid : 0;
}

/* Appends "\nlast lines of LOG:\n<tail>" to a message. */
static int fail_with_log(char *err, size_t errlen, int code, const char *log, const char *fmt,
			 const char *what)
{
	char tail[2 * SW_ERR_MAX]; /* half of CTL_START_ERR_MAX: the rest is for the cause */
	size_t n;

	ctl_tail(log, 12, tail, sizeof(tail));
	sw_seterr(err, errlen, code, fmt, what);
	n = strlen(err);
	if (tail[0] && n < errlen)
		snprintf(err + n, errlen - n, "\nlast lines of %s:\n%s", log, tail);
	return code;
}

/* --- Redis ------------------------------------------------------------- */

static int redis_ping_url(const char *url, char *err, size_t errlen)
{
	redisContext *c;
	redisReply *r;
	int rc = ctl_redis_open(url, 2000, &c, err, errlen);

	if (rc)
		return rc;
	rc = ctl_redis_cmd(c, &r, err, errlen, "PING");
	if (!rc)
		freeReplyObject(r);
	redisFree(c);
	return rc;
}

/* --- PostgreSQL --------------------------------------------------------- */

static int pg_exec(PGconn *c, const char *sql, char *err, size_t errlen)
{
	PGresult *r = PQexec(c, sql);
	int rc = 0;

	if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
		rc = sw_seterr(err, errlen, -EIO, "postgres: %s: %s", sql, PQerrorMessage(c));
	PQclear(r);
	return rc;
}

static int pg_ping_conninfo(const char *conninfo, char *err, size_t errlen)
{
	/* a stored password (common/secret.h) wins over the URL's */
	const char *keys[] = { "dbname", "password", NULL };
	const char *vals[] = { conninfo, sw_secret_pg()[0] ? sw_secret_pg() : NULL, NULL };
	PGconn *c = PQconnectdbParams(keys, vals, 1);
	int rc = 0;

	if (PQstatus(c) != CONNECTION_OK) {
		char redacted[SW_CONFIG_URL_MAX];

		sw_config_redact_url(conninfo, redacted, sizeof(redacted));
		rc = sw_seterr(err, errlen, -ECONNREFUSED, "postgres at %s: %s", redacted,
			       PQerrorMessage(c));
	}
	PQfinish(c);
	return rc;
}

static void pg_quiet(void *arg, const char *msg)
{
	(void)arg;
	(void)msg;
}

/* Creates database swarm and the vector extension when missing. */
static int pg_bootstrap(const struct ctl_env *e, char *err, size_t errlen)
{
	char ci[PATH_MAX + 96];
	PGconn *c;
	PGresult *r;
	int rc = 0;
	bool have;

	/* bounded: the supervisor's stop waits for a probe in flight */
	snprintf(ci, sizeof(ci), "host=%s/pg dbname=postgres user=swarm connect_timeout=%d",
		 e->state_dir, PG_PROBE_TIMEOUT_S);
	c = PQconnectdb(ci);
	if (PQstatus(c) != CONNECTION_OK) {
		rc = sw_seterr(err, errlen, -ECONNREFUSED, "postgres: %s", PQerrorMessage(c));
		PQfinish(c);
		return rc;
	}
	r = PQexec(c, "SELECT 1 FROM pg_database WHERE datname = 'swarm'");
	have = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1;
	PQclear(r);
	if (!have)
		rc = pg_exec(c, "CREATE DATABASE swarm", err, errlen);
	PQfinish(c);
	if (rc)
		return rc;
	snprintf(ci, sizeof(ci), "host=%s/pg dbname=swarm user=swarm connect_timeout=%d",
		 e->state_dir, PG_PROBE_TIMEOUT_S);
	c = PQconnectdb(ci);
	if (PQstatus(c) != CONNECTION_OK) {
		rc = sw_seterr(err, errlen, -ECONNREFUSED, "postgres: %s", PQerrorMessage(c));
		PQfinish(c);
		return rc;
	}
	/* "extension already exists" is not news on every start */
	PQsetNoticeProcessor(c, pg_quiet, NULL);
	rc = pg_exec(c, "CREATE EXTENSION IF NOT EXISTS vector", err, errlen);
	if (rc)
		snprintf(err + strlen(err), errlen - strlen(err),
			 " (pgvector missing? scripts/setup builds it)");
	PQfinish(c);
	return rc;
}

/* --- the service user ---------------------------------------------------- */

/* Managed mode as root with `user` set (SWARM_USER): Redis, gpud and
 * agentd run as that user, PostgreSQL as postgres. 1 with its ids, 0 when
 * everything runs as we do, -ENOENT when the user does not exist. */
static int service_user(const struct ctl_env *e, uid_t *uid, gid_t *gid)
{
	struct passwd *pw;

	if (!e->managed || geteuid() != 0 || !e->cfg.user[0])
		return 0;
	pw = getpwnam(e->cfg.user);
	if (!pw)
		return -ENOENT;
	if (pw->pw_uid == 0)
		return 0;
	*uid = pw->pw_uid;
	*gid = pw->pw_gid;
	return 1;
}

/* chown -R path uid:gid, without following symlinks. */
static int chown_tree(const char *path, uid_t uid, gid_t gid)
{
	struct dirent *de;
	DIR *d;
	int rc = 0;

	if (lchown(path, uid, gid) != 0)
		return errno == ENOENT ? 0 : -errno;
	d = opendir(path);
	if (!d)
		return errno == ENOTDIR ? 0 : -errno;
	while (!rc && (de = readdir(d))) {
		char p[PATH_MAX];

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (snprintf(p, sizeof(p), "%s/%s", path, de->d_name) >= (int)sizeof(p))
			rc = -ENAMETOOLONG;
		else if (de->d_type == DT_DIR)
			rc = chown_tree(p, uid, gid);
		else if (lchown(p, uid, gid) != 0 && errno != ENOENT)
			rc = -errno;
	}
	closedir(d);
	return rc;
}

/* The service user exists (created as a system user, like PostgreSQL's
 * package does, when missing) and may use what it needs: Redis's data,
 * and in the state directory and run/ (root's, mode 1770/1775: the sticky
 * bit keeps it from replacing root's pid files and swarm.json) its own
 * files from an earlier run (sockets, agentd's status, gpud's dumps);
 * PostgreSQL's socket directory is its group's
 * (mode 0750; the socket itself is then 0777). */
static int prepare_service_user(struct ctl_env *e, char *err, size_t errlen)
{
	static const char *const own[] = { "agentd.status.json", "agentd.status.json.tmp",
					   "run/gpud.sock", "run/redis.sock" };
	char p[PATH_MAX + 64], log[PATH_MAX + 32];
	uid_t uid;
	gid_t gid;
	int rc = service_user(e, &uid, &gid);

	if (rc == -ENOENT) {
		char *argv[] = { "useradd", "--system", "--user-group", "--no-create-home",
				 "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin",
				 e->cfg.user, NULL };

		log_path(e, "supervisor", log, sizeof(log));
		/* Another swarmctl (a second state directory) may be adding the
		 * same user: useradd then fails on its lock of /etc/passwd, or
		 * finds the user. Tried again while the user is still missing. */
		for (int tries = 1; rc == -ENOENT && tries <= 10; tries++) {
			if (tries > 1)
				sw_sleep_ms(200);
			ctl_run(argv, log, NULL);
			rc = service_user(e, &uid, &gid);
		}
		if (rc == -ENOENT)
			return fail_with_log(err, errlen, -EIO, log, "%s failed", "useradd");
	}
	if (rc < 0)
		return sw_seterr(err, errlen, rc, "user %s: no such user", e->cfg.user);
	if (rc == 0)
		return 0;
	ctl_path(e, "redis", p, sizeof(p));
	rc = chown_tree(p, uid, gid);
	for (size_t i = 0; !rc && i < sizeof(own) / sizeof(own[0]); i++) {
		ctl_path(e, own[i], p, sizeof(p));
		if (lchown(p, uid, gid) != 0 && errno != ENOENT)
			rc = -errno;
	}
	/* gpud's block-owner dumps (gpud-blocks-N.json), rewritten in place */
	DIR *d = rc ? NULL : opendir(e->state_dir);
	for (struct dirent *de; d && !rc && (de = readdir(d));) {
		if (strncmp(de->d_name, "gpud-blocks-", 12) != 0 || de->d_type != DT_REG)
			continue;
		if (snprintf(p, sizeof(p), "%s/%s", e->state_dir, de->d_name) < (int)sizeof(p) &&
		    lchown(p, uid, gid) != 0 && errno != ENOENT)
			rc = -errno;
	}
	if (d)
		closedir(d);
	if (!rc && (chown(e->state_dir, 0, gid) != 0 || chmod(e->state_dir, 01775) != 0))
		rc = -errno;
	ctl_path(e, "run", p, sizeof(p));
	if (!rc && (chown(p, 0, gid) != 0 || chmod(p, 01770) != 0))
		rc = -errno;
	if (rc)
		return sw_seterr(err, errlen, rc, "%s: giving user %s its files: %s", p,
				 e->cfg.user, strerror(-rc));
	return 0;
}

/* As root, PostgreSQL runs as another user, who must be able to reach
 * path: every directory above it searchable by that user. A private
 * mktemp -d state directory is the usual way to get this wrong. */
static int check_traversable(const char *path, const struct passwd *pw, char *err,
			     size_t errlen)
{
	char p[PATH_MAX + 64];
	struct stat st;

	snprintf(p, sizeof(p), "%s", path);
	for (char *slash = strrchr(p, '/'); slash && slash != p; slash = strrchr(p, '/')) {
		bool ok;

		*slash = '\0';
		if (stat(p, &st) != 0)
			return sw_seterr(err, errlen, -errno, "%s: %s", p, strerror(errno));
		ok = st.st_uid == pw->pw_uid ? (st.st_mode & S_IXUSR)
		     : st.st_gid == pw->pw_gid ? (st.st_mode & S_IXGRP)
		     : (st.st_mode & S_IXOTH);
		if (!ok)
			return sw_seterr(err, errlen, -EACCES, "PostgreSQL runs as the user %s "
					 "(it refuses root), who cannot enter %s (mode %03o): chmod "
					 "o+x %s, or choose another SWARM_STATE_DIR", pw->pw_name, p,
					 (unsigned)(st.st_mode & 0777), p);
	}
	return 0;
}

/* Everything PostgreSQL needs before its first start: its directory
 * (owned by the postgres user when we are root), and a cluster (initdb). */
static int prepare_postgres(struct ctl_env *e, char *err, size_t errlen)
{
	char pgdir[PATH_MAX + 32], data[PATH_MAX + 32], log[PATH_MAX + 32], ver[PATH_MAX + 48];
	char initdb[PATH_MAX + 16];
	struct stat st;
	int rc;

	if (!e->pg_bindir[0])
		return sw_seterr(err, errlen, -ENOENT, "PostgreSQL server binaries not found in "
				 "/usr/lib/postgresql/*/bin (scripts/setup installs them; or set "
				 "SWARM_PG_BINDIR)");
	ctl_path(e, "pg", pgdir, sizeof(pgdir));
	ctl_path(e, "pg/data", data, sizeof(data));
	log_path(e, "postgres", log, sizeof(log));
	snprintf(initdb, sizeof(initdb), "%s/initdb", e->pg_bindir);
	snprintf(ver, sizeof(ver), "%s/PG_VERSION", data);

	rc = ctl_mkdirs(pgdir, 0755);
	if (rc)
		return sw_seterr(err, errlen, rc, "%s: %s", pgdir, strerror(-rc));
	if (e->pg_os_user) {
		struct passwd *pw = getpwnam(e->pg_os_user);

		if (!pw)
			return sw_seterr(err, errlen, -ENOENT, "no '%s' user to run PostgreSQL as "
					 "(it refuses to run as root)", e->pg_os_user);
		rc = check_traversable(pgdir, pw, err, errlen);
		if (rc)
			return rc;
		uid_t su, pg_uid = pw->pw_uid; /* pw is getpwnam's: service_user reuses it */
		gid_t sg = pw->pw_gid;

		/* with a service user: its group reaches the socket, no one else */
		if (service_user(e, &su, &sg) == 1 && chmod(pgdir, 0750) != 0)
			return sw_seterr(err, errlen, -errno, "chmod %s: %s", pgdir,
					 strerror(errno));
		if (chown(pgdir, pg_uid, sg) != 0)
			return sw_seterr(err, errlen, -errno, "chown %s: %s", pgdir,
					 strerror(errno));
	}
	if (stat(ver, &st) != 0) {
		char *argv[] = { initdb, "-D", data, "-U", "swarm", "--auth=trust", "-E", "UTF8",
				 "--no-locale", NULL };

		rc = ctl_run(argv, log, e->pg_os_user);
		if (rc != 0)
			return fail_with_log(err, errlen, -EIO, log, "%s failed", "initdb");
	}
	return 0;
}

static int stop_postgres(struct ctl_env *e, bool *killed, char *err, size_t errlen)
{
	char data[PATH_MAX + 32], pgctl[PATH_MAX + 16], log[PATH_MAX + 32];
	pid_t pid = pg_pid(e);
	int rc;

	if (!pid)
		return 0;
	ctl_path(e, "pg/data", data, sizeof(data));
	snprintf(pgctl, sizeof(pgctl), "%s/pg_ctl", e->pg_bindir);
	char *argv[] = { pgctl, "-D", data, "-m", "fast", "-w", "-t", "30", "stop", NULL };

	log_path(e, "postgres", log, sizeof(log));
	rc = ctl_run(argv, log, e->pg_os_user);
	if (rc == 0 && !pg_pid(e))
		return 0;
	rc = ctl_stop_pid(pid, SIGQUIT, 5000, killed);
	if (rc && rc != -ESRCH)
		return sw_seterr(err, errlen, rc, "postgres (pid %d) did not stop", (int)pid);
	return 0;
}

/* --- gpud and agentd ---------------------------------------------------- */

static int ensure_builtin_model(struct ctl_env *e, char *err, size_t errlen)
{
	char log[PATH_MAX + 32], tmp[PATH_MAX + 16];
	const char *argv[64];
	size_t n = 0;
	struct stat st;
	int rc;

	if (!e->builtin_model || stat(e->cfg.gpud.model, &st) == 0)
		return 0;
	log_path(e, "model", log, sizeof(log));
	snprintf(tmp, sizeof(tmp), "%s.part", e->cfg.gpud.model);
	argv[n++] = e->gpud_bin;
	argv[n++] = "mkmodel";
	argv[n++] = "--out";
	argv[n++] = tmp;
	for (size_t i = 0; builtin_model_args[i]; i++)
		argv[n++] = builtin_model_args[i];
	argv[n] = NULL;
	rc = ctl_run((char *const *)argv, log, NULL);
	if (rc != 0)
		return fail_with_log(err, errlen, -EIO, log, "%s failed", "gpud mkmodel");
	if (rename(tmp, e->cfg.gpud.model) != 0)
		return sw_seterr(err, errlen, -errno, "%s: %s", e->cfg.gpud.model,
				 strerror(errno));
	return 0;
}

/* gpud is up when its socket answers a stats request. */
static int gpud_probe(const struct ctl_env *e, char *err, size_t errlen)
{
	struct proto_client_opts o;
	struct proto_client *c;
	char *json = NULL;
	int rc;

	proto_client_opts_default(&o);
	o.timeout_ms = 2000;
	rc = proto_client_connect(&c, e->cfg.gpud.socket, &o, err, errlen);
	if (rc)
		return rc;
	rc = proto_client_stats(c, &json, err, errlen);
	free(json);
	proto_client_close(c);
	return rc;
}

/* --- gpud-http ------------------------------------------------------------ */

/* Where to reach a listener on listen ("HOST:PORT"): the wildcard
 * addresses are reached on loopback. */
static int http_target(const char *listen, char *host, size_t hostlen, char *port,
		       size_t portlen, char *err, size_t errlen)
{
	uint16_t p;
	int rc = sw_config_split_hostport(listen, host, hostlen, &p, err, errlen);

	if (rc)
		return rc;
	if (!strcmp(host, "0.0.0.0") || !host[0])
		snprintf(host, hostlen, "127.0.0.1");
	else if (!strcmp(host, "::"))
		snprintf(host, hostlen, "::1");
	snprintf(port, portlen, "%u", (unsigned)p);
	return 0;
}

/* One connection to ai: sends GET /health and reads the status line into
 * *status, all before deadline. Returns 0 or a negative code. */
static int http_health_at(const struct addrinfo *ai, const char *host, struct sw_deadline d,
			  int *status)
{
	char req[SW_CONFIG_HOSTPORT_MAX + 96], line[256];
	size_t have = 0, sent = 0, len;
	int fd, rc = -ETIMEDOUT;

	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    ai->ai_protocol);
	if (fd < 0)
		return -errno;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
		rc = -errno;
		goto out;
	}
	len = (size_t)snprintf(req, sizeof(req), "GET /health HTTP/1.1\r\nHost: %s\r\n"
			       "Connection: close\r\n\r\n", host);
	while (!sw_deadline_expired(d)) {
		struct pollfd pf = { .fd = fd, .events = sent < len ? POLLOUT : POLLIN };
		ssize_t k;

		if (poll(&pf, 1, sw_deadline_poll_ms(d)) < 0 && errno != EINTR) {
			rc = -errno;
			break;
		}
		if (!pf.revents)
			continue;
		if (sent < len) {
			k = send(fd, req + sent, len - sent, MSG_NOSIGNAL);
			if (k < 0 && errno != EAGAIN && errno != EINTR) {
				rc = -errno;
				break;
			}
			sent += k > 0 ? (size_t)k : 0;
			continue;
		}
		k = recv(fd, line + have, sizeof(line) - 1 - have, 0);
		if (k < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (k <= 0) {
			rc = k == 0 ? -ECONNRESET : -errno;
			break;
		}
		have += (size_t)k;
		line[have] = '\0';
		if (strchr(line, '\n') || have == sizeof(line) - 1) {
			unsigned code;

			rc = sscanf(line, "HTTP/1.%*1[01] %3u", &code) == 1 ? 0 : -EPROTO;
			*status = rc ? 0 : (int)code;
			break;
		}
	}
out:
	close(fd);
	return rc;
}

/* GET /health on http.listen: 0 with the status in *status, or a negative
 * code with the reason (nothing answers in HTTP within HTTP_PROBE_MS). */
static int http_health(const struct ctl_env *e, int *status, char *err, size_t errlen)
{
	char host[SW_CONFIG_HOSTPORT_MAX], port[8];
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
	struct addrinfo *res = NULL, *ai;
	struct sw_deadline d = sw_deadline_in_ms(HTTP_PROBE_MS);
	int rc;

	if (!e->cfg.http.listen[0])
		return sw_seterr(err, errlen, -ENOENT, "http.listen is not set");
	rc = http_target(e->cfg.http.listen, host, sizeof(host), port, sizeof(port), err, errlen);
	if (rc)
		return rc;
	rc = getaddrinfo(host, port, &hints, &res);
	if (rc)
		return sw_seterr(err, errlen, -EHOSTUNREACH, "gpud-http at %s: %s",
				 e->cfg.http.listen, gai_strerror(rc));
	rc = -EHOSTUNREACH;
	for (ai = res; ai && rc && !sw_deadline_expired(d); ai = ai->ai_next)
		rc = http_health_at(ai, host, d, status);
	freeaddrinfo(res);
	if (rc)
		return sw_seterr(err, errlen, rc, "gpud-http: no HTTP answer on %s: %s",
				 e->cfg.http.listen, strerror(-rc));
	return 0;
}

/* gpud-http is ready when GET /health says 200 (it reaches gpud). */
static int http_probe(const struct ctl_env *e, char *err, size_t errlen)
{
	int status = 0, rc = http_health(e, &status, err, errlen);

	if (rc)
		return rc;
	if (status != 200)
		return sw_seterr(err, errlen, -EAGAIN, "gpud-http on %s: GET /health: %d",
				 e->cfg.http.listen, status);
	return 0;
}

/* gpud-http answers at all: any status (503 while gpud is away). */
static int http_alive(const struct ctl_env *e, char *err, size_t errlen)
{
	int status = 0;

	return http_health(e, &status, err, errlen);
}

static int start_daemon(struct ctl_env *e, enum ctl_service s, char *err, size_t errlen)
{
	char log[PATH_MAX + 32], pidf[PATH_MAX + 32];
	const char *bin = s == CTL_GPUD ? e->gpud_bin : s == CTL_HTTP ? e->http_bin : e->agentd_bin;
	struct sw_deadline d = sw_deadline_in_ms(s == CTL_GPUD   ? GPUD_START_MS
						 : s == CTL_HTTP ? HTTP_START_MS
								 : AGENTD_SETTLE_MS);
	pid_t pid;
	int rc;

	if (s == CTL_GPUD) {
		rc = ensure_builtin_model(e, err, errlen);
		if (rc)
			return rc;
	}
	log_path(e, names[s], log, sizeof(log));
	pid_path(e, s, pidf, sizeof(pidf));
	char *gpud_argv[] = { (char *)bin, "serve", "--config", e->config_path, NULL };
	char *agentd_argv[] = { (char *)bin, "--config", e->config_path, NULL };

	/* agentd and gpud-http take the same command line */
	pid = ctl_spawn(s == CTL_GPUD ? gpud_argv : agentd_argv, NULL, log, NULL);
	if (pid < 0)
		return sw_seterr(err, errlen, pid, "%s: %s (not built? run ninja -C build)", bin,
				 strerror(-pid));
	rc = ctl_pidfile_write(pidf, pid);
	if (rc) {
		ctl_stop_pid(pid, SIGTERM, 5000, NULL);
		return sw_seterr(err, errlen, rc, "%s: %s", pidf, strerror(-rc));
	}
	for (;;) {
		char perr[SW_ERR_MAX];

		if (!ctl_proc_start_ticks(pid)) {
			unlink(pidf);
			return fail_with_log(err, errlen, -ECHILD, log, "%s exited during start-up",
					     names[s]);
		}
		if (s == CTL_GPUD && gpud_probe(e, perr, sizeof(perr)) == 0)
			return 0;
		if (s == CTL_HTTP && http_probe(e, perr, sizeof(perr)) == 0)
			return 0;
		if (sw_deadline_expired(d)) {
			if (s == CTL_AGENTD)
				return 0; /* alive after its settling time */
			ctl_stop_pid(pid, SIGTERM, 5000, NULL);
			unlink(pidf);
			return fail_with_log(err, errlen, -ETIMEDOUT, log, s == CTL_HTTP ?
					     "%s did not answer GET /health with 200 in time" :
					     "%s did not answer on its socket in time", names[s]);
		}
		sw_sleep_ms(100);
	}
}

int ctl_service_start(struct ctl_env *e, enum ctl_service s, char *err, size_t errlen)
{
	if (!ctl_service_managed(e, s))
		return ctl_service_ping(e, s, err, errlen);
	if (ctl_service_pid(e, s))
		return 0;
	if (e->managed)
		return sw_seterr(err, errlen, -ENOTSUP, "%s: managed services are started by the "
				 "supervisor (swarmctl start)", names[s]);
	if (s != CTL_GPUD && s != CTL_AGENTD && s != CTL_HTTP)
		return sw_seterr(err, errlen, -EINVAL, "unknown service %d", (int)s);
	if (!ctl_service_enabled(e, s))
		return sw_seterr(err, errlen, -ENOENT, "%s: http.listen is not set", names[s]);
	return start_daemon(e, s, err, errlen);
}

/* --- managed services under the supervisor ------------------------------ */

int ctl_managed_prepare(struct ctl_env *e, char *err, size_t errlen)
{
	int rc;

	if (!e->managed)
		return sw_seterr(err, errlen, -EINVAL, "not in managed mode");
	rc = prepare_service_user(e, err, errlen);
	if (rc)
		return rc;
	rc = prepare_postgres(e, err, errlen);
	if (rc)
		return rc;
	return ensure_builtin_model(e, err, errlen);
}

/* Appends a copy of str to c's argv. */
static int push_arg(struct ctl_command *c, size_t *argc, const char *str)
{
	size_t len = strlen(str) + 1;

	if (*argc + 1 >= sizeof(c->argv) / sizeof(c->argv[0]) ||
	    c->used + len > sizeof(c->buf))
		return -ENAMETOOLONG;
	memcpy(c->buf + c->used, str, len);
	c->argv[(*argc)++] = c->buf + c->used;
	c->argv[*argc] = NULL;
	c->used += len;
	return 0;
}

int ctl_service_command(const struct ctl_env *e, enum ctl_service s, struct ctl_command *c,
			char *err, size_t errlen)
{
	char a[PATH_MAX + 64], b[PATH_MAX + 64], mem[32];
	size_t n = 0;
	int rc = 0;

	memset(c, 0, sizeof(*c));
	log_path(e, ctl_service_name(s), c->log, sizeof(c->log));
	switch (s) {
	case CTL_REDIS:
		/* foreground, Unix socket only, AOF; a full Redis refuses
		 * writes (a submit fails) rather than evicting stream entries */
		ctl_path(e, "run/redis.sock", a, sizeof(a));
		ctl_path(e, "redis", b, sizeof(b));
		snprintf(mem, sizeof(mem), "%llu", (unsigned long long)e->cfg.redis.maxmemory);
		{
			const char *argv[] = { "redis-server", "--port", "0", "--unixsocket", a,
					       "--unixsocketperm", "770", "--dir", b,
					       "--appendonly", "yes", "--appendfsync", "everysec",
					       "--save", "", "--daemonize", "no", "--maxmemory", mem,
					       "--maxmemory-policy", "noeviction", NULL };

			for (size_t i = 0; argv[i] && !rc; i++)
				rc = push_arg(c, &n, argv[i]);
		}
		if (service_user(e, &c->uid, &c->gid) == 1)
			c->set_ids = true; /* gpud and agentd switch by themselves */
		c->start_timeout_ms = REDIS_START_MS;
		break;
	case CTL_POSTGRES:
		/* the postmaster itself, not pg_ctl's daemon: its exit is the
		 * supervisor's child's exit */
		if (!e->pg_bindir[0])
			return sw_seterr(err, errlen, -ENOENT, "PostgreSQL server binaries not found");
		snprintf(a, sizeof(a), "%s/postgres", e->pg_bindir);
		rc = push_arg(c, &n, a);
		ctl_path(e, "pg/data", a, sizeof(a));
		ctl_path(e, "pg", b, sizeof(b));
		{
			uid_t su;
			gid_t sg;
			/* a service user reaches the socket through pg/'s group (0750) */
			const char *perm = service_user(e, &su, &sg) == 1
						   ? "unix_socket_permissions=0777"
						   : "unix_socket_permissions=0770";
			const char *argv[] = { "-D", a, "-k", b, "-c", "listen_addresses=", "-c",
					       perm, NULL };

			for (size_t i = 0; argv[i] && !rc; i++)
				rc = push_arg(c, &n, argv[i]);
		}
		if (e->pg_os_user) {
			struct passwd *pw = getpwnam(e->pg_os_user);

			if (!pw)
				return sw_seterr(err, errlen, -ENOENT, "no '%s' user to run "
						 "PostgreSQL as", e->pg_os_user);
			c->set_ids = true;
			c->uid = pw->pw_uid;
			c->gid = pw->pw_gid;
		}
		c->start_timeout_ms = PG_START_S * 1000;
		break;
	case CTL_GPUD:
		rc = push_arg(c, &n, e->gpud_bin);
		rc = rc ? rc : push_arg(c, &n, "serve");
		rc = rc ? rc : push_arg(c, &n, "--config");
		rc = rc ? rc : push_arg(c, &n, e->config_path);
		c->start_timeout_ms = GPUD_START_MS;
		break;
	case CTL_AGENTD:
		rc = push_arg(c, &n, e->agentd_bin);
		rc = rc ? rc : push_arg(c, &n, "--config");
		rc = rc ? rc : push_arg(c, &n, e->config_path);
		c->start_timeout_ms = AGENTD_START_MS;
		break;
	case CTL_HTTP:
		/* a gpud client like agentd; as root, the service user's from
		 * the start (no port below 1024 to bind first) */
		rc = push_arg(c, &n, e->http_bin);
		rc = rc ? rc : push_arg(c, &n, "--config");
		rc = rc ? rc : push_arg(c, &n, e->config_path);
		if (service_user(e, &c->uid, &c->gid) == 1)
			c->set_ids = true;
		c->start_timeout_ms = HTTP_START_MS;
		break;
	default:
		return sw_seterr(err, errlen, -EINVAL, "unknown service %d", (int)s);
	}
	if (rc)
		return sw_seterr(err, errlen, rc, "%s: command line too long", names[s]);
	return 0;
}

/* agentd is up once its supervisor wrote agentd.status.json under its
 * own pid (a file from an earlier agentd names another). */
static int agentd_probe(const struct ctl_env *e, pid_t pid, char *err, size_t errlen)
{
	char p[PATH_MAX + 32];
	json_t *st;
	json_int_t have;
	int fd;

	/* close-on-exec: the supervisor may spawn while this thread reads */
	ctl_path(e, "agentd.status.json", p, sizeof(p));
	fd = open(p, O_RDONLY | O_CLOEXEC);
	st = fd >= 0 ? json_loadfd(fd, 0, NULL) : NULL;
	if (fd >= 0)
		close(fd);
	have = json_integer_value(json_object_get(st, "pid"));
	json_decref(st);
	if (have != (json_int_t)pid)
		return sw_seterr(err, errlen, -EAGAIN, "agentd (pid %d) has not written %s yet",
				 (int)pid, p);
	return 0;
}

/* Redis answers at all: any reply, an error reply (LOADING, OOM) too. */
static int redis_alive(const char *url, char *err, size_t errlen)
{
	int rc = redis_ping_url(url, err, errlen);

	return rc == -EIO ? 0 : rc;
}

/* The postmaster answers at all: accepting connections, or refusing them
 * (starting up, in recovery, too many clients) is alive; no answer is
 * not. */
static int pg_alive(const struct ctl_env *e, char *err, size_t errlen)
{
	char ci[PATH_MAX + 96];

	snprintf(ci, sizeof(ci), "host=%s/pg dbname=swarm user=swarm connect_timeout=%d",
		 e->state_dir, PG_PROBE_TIMEOUT_S);
	if (PQping(ci) != PQPING_NO_RESPONSE)
		return 0;
	return sw_seterr(err, errlen, -ECONNREFUSED, "postgres: no answer on %s/pg",
			 e->state_dir);
}

int ctl_service_ready(const struct ctl_env *e, enum ctl_service s, pid_t pid, bool live,
		      char *err, size_t errlen)
{
	if (live) {
		switch (s) {
		case CTL_REDIS:
			return redis_alive(e->cfg.redis.url, err, errlen);
		case CTL_POSTGRES:
			return pg_alive(e, err, errlen);
		case CTL_GPUD:
			return gpud_probe(e, err, errlen);
		case CTL_HTTP:
			return http_alive(e, err, errlen);
		default:
			return 0; /* agentd's supervisor watches its workers; nothing to ask */
		}
	}
	switch (s) {
	case CTL_REDIS:
		return redis_ping_url(e->cfg.redis.url, err, errlen);
	case CTL_POSTGRES:
		return pg_bootstrap(e, err, errlen); /* the database and pgvector too */
	case CTL_GPUD:
		return gpud_probe(e, err, errlen);
	case CTL_AGENTD:
		return agentd_probe(e, pid, err, errlen);
	case CTL_HTTP:
		return http_probe(e, err, errlen);
	default:
		return sw_seterr(err, errlen, -EINVAL, "unknown service %d", (int)s);
	}
}

int ctl_service_clear_stale(const struct ctl_env *e, enum ctl_service s, char *err,
			    size_t errlen)
{
	char p[PATH_MAX + 48];
	pid_t pid;

	if (s != CTL_POSTGRES)
		return 0;
	pid = pg_pidfile_pid(e);
	if (!pid || !ctl_proc_start_ticks(pid))
		return 0; /* none, or a dead pid: PostgreSQL handles that itself */
	if (pg_pid(e))
		return sw_seterr(err, errlen, -EBUSY, "a postmaster (pid %d) already runs on %s/pg/data",
				 (int)pid, e->state_dir);
	/* The pid now belongs to another process (a reboot): PostgreSQL would
	 * take it for a live postmaster and refuse to start. */
	ctl_path(e, "pg/data/postmaster.pid", p, sizeof(p));
	if (unlink(p) != 0 && errno != ENOENT)
		return sw_seterr(err, errlen, -errno, "%s: %s", p, strerror(errno));
	ctl_path(e, "pg/.s.PGSQL.5432.lock", p, sizeof(p));
	unlink(p);
	return 1;
}

void ctl_service_log_path(const struct ctl_env *e, const char *name, char *out, size_t cap)
{
	log_path(e, name, out, cap);
}

int ctl_service_stop(struct ctl_env *e, enum ctl_service s, bool *killed, char *err,
		    size_t errlen)
{
	char pidf[PATH_MAX + 32];
	uint32_t deadline_ms;
	pid_t pid;
	int rc;

	if (killed)
		*killed = false;
	if (!ctl_service_managed(e, s))
		return 0;
	if (s == CTL_POSTGRES)
		return stop_postgres(e, killed, err, errlen);
	pid = ctl_service_pid(e, s);
	if (!pid)
		return 0;
	switch (s) {
	case CTL_GPUD:
		deadline_ms = e->cfg.gpud.shutdown_deadline_ms + 5000;
		break;
	case CTL_AGENTD:
		deadline_ms = AGENTD_DRAIN_MS;
		break;
	case CTL_HTTP:
		deadline_ms = HTTP_STOP_MS;
		break;
	default:
		deadline_ms = 10000;
		break;
	}
	rc = ctl_stop_pid(pid, SIGTERM, deadline_ms, killed);
	pid_path(e, s, pidf, sizeof(pidf));
	if (rc == 0 || rc == -ESRCH) {
		unlink(pidf);
		return 0;
	}
	return sw_seterr(err, errlen, rc, "%s (pid %d) did not stop: %s", names[s], (int)pid,
			 strerror(-rc));
}

int ctl_service_ping(const struct ctl_env *e, enum ctl_service s, char *err, size_t errlen)
{
	switch (s) {
	case CTL_REDIS:
		return redis_ping_url(e->cfg.redis.url, err, errlen);
	case CTL_POSTGRES:
		return pg_ping_conninfo(e->cfg.postgres.url, err, errlen);
	case CTL_GPUD:
		return gpud_probe(e, err, errlen);
	case CTL_HTTP:
		return http_probe(e, err, errlen);
	default:
		return ctl_service_pid(e, s) ? 0 : sw_seterr(err, errlen, -ESRCH, "not running");
	}
}
