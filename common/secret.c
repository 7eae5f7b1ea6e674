/* secret.c - passwords from the environment or a private file, held once
 * per process (see secret.h). */
#include "common/secret.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

static char redis_pw[SW_SECRET_MAX];
static char pg_pw[SW_SECRET_MAX];

/* Zeroes n bytes where the compiler may not drop the stores. */
static void wipe(void *p, size_t n)
{
	volatile unsigned char *v = p;

	while (n--)
		*v++ = 0;
}

/* As sw_secret_read_file; a file owned by also_uid is accepted too. */
static int read_file(const char *path, uid_t also_uid, char *out, size_t outlen, char *err,
		     size_t errlen)
{
	char buf[SW_SECRET_MAX + 2];
	struct stat st;
	ssize_t n;
	size_t len = 0;
	int fd, rc = 0;

	if (outlen)
		out[0] = '\0';
	/* symlinks are followed (a mounted secret is usually one); the
	 * checks apply to what is opened */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return sw_seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
	if (fstat(fd, &st) != 0) {
		rc = sw_seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = sw_seterr(err, errlen, -EINVAL, "%s: not a regular file", path);
		goto out_close;
	}
	if (st.st_mode & 077) {
		rc = sw_seterr(err, errlen, -EPERM, "%s: mode %04o lets group or others read the "
			       "password; chmod 600 %s", path, (unsigned)(st.st_mode & 07777), path);
		goto out_close;
	}
	if (st.st_uid != geteuid() && st.st_uid != 0 && st.st_uid != also_uid) {
		rc = sw_seterr(err, errlen, -EPERM, "%s: owned by uid %u, not by this process's "
			       "user (uid %u) or root", path, (unsigned)st.st_uid,
			       (unsigned)geteuid());
		goto out_close;
	}
	while (len < sizeof(buf)) {
		n = read(fd, buf + len, sizeof(buf) - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = sw_seterr(err, errlen, -errno, "%s: %s", path, strerror(errno));
			goto out_wipe;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	if (len && buf[len - 1] == '\n')
		len--;
	if (len && buf[len - 1] == '\r')
		len--;
	if (len >= SW_SECRET_MAX || len >= outlen) {
		rc = sw_seterr(err, errlen, SW_ETOOLONG, "%s: longer than %zu bytes", path,
			       (outlen < SW_SECRET_MAX ? outlen : SW_SECRET_MAX) - 1);
		goto out_wipe;
	}
	if (len == 0) {
		rc = sw_seterr(err, errlen, -EINVAL, "%s: empty", path);
		goto out_wipe;
	}
	if (memchr(buf, '\0', len) || memchr(buf, '\n', len) || memchr(buf, '\r', len)) {
		rc = sw_seterr(err, errlen, -EINVAL, "%s: holds a NUL byte or a line break "
			       "(one password, at most one trailing newline)", path);
		goto out_wipe;
	}
	memcpy(out, buf, len);
	out[len] = '\0';
out_wipe:
	wipe(buf, sizeof(buf));
out_close:
	close(fd);
	return rc;
}

int sw_secret_read_file(const char *path, char *out, size_t outlen, char *err, size_t errlen)
{
	return read_file(path, geteuid(), out, outlen, err, errlen);
}

/* One password: env_var, else file (when set), else "". */
static int resolve(const char *env_var, const char *file, uid_t also_uid, const char *key,
		   char *out, char *err, size_t errlen)
{
	char msg[SW_ERR_MAX];
	const char *v = getenv(env_var);
	int rc;

	if (v && *v) {
		if (strlen(v) >= SW_SECRET_MAX)
			return sw_seterr(err, errlen, SW_ETOOLONG, "%s: longer than %d bytes",
					 env_var, SW_SECRET_MAX - 1);
		snprintf(out, SW_SECRET_MAX, "%s", v);
		return 0;
	}
	out[0] = '\0';
	if (!file[0])
		return 0;
	rc = read_file(file, also_uid, out, SW_SECRET_MAX, msg, sizeof(msg));
	if (rc)
		return sw_seterr(err, errlen, rc, "%s: %s", key, msg);
	return 0;
}

int sw_secrets_load(const struct sw_config *cfg, char *err, size_t errlen)
{
	char r[SW_SECRET_MAX], p[SW_SECRET_MAX], buf[4096];
	struct passwd pw, *res = NULL;
	uid_t also = geteuid();
	int rc;

	/* root may read a file of the service's user (a unit's User=) */
	if (geteuid() == 0 && cfg->user[0] &&
	    getpwnam_r(cfg->user, &pw, buf, sizeof(buf), &res) == 0 && res)
		also = pw.pw_uid;
	rc = resolve(SW_SECRET_REDIS_ENV, cfg->redis.password_file, also, "redis.password_file",
		     r, err, errlen);
	if (!rc)
		rc = resolve(SW_SECRET_PG_ENV, cfg->postgres.password_file, also,
			     "postgres.password_file", p, err, errlen);
	if (!rc) {
		memcpy(redis_pw, r, sizeof(r));
		memcpy(pg_pw, p, sizeof(p));
	}
	wipe(r, sizeof(r));
	wipe(p, sizeof(p));
	return rc;
}

const char *sw_secret_redis(void)
{
	return redis_pw;
}

const char *sw_secret_pg(void)
{
	return pg_pw;
}

void sw_secrets_clear(void)
{
	wipe(redis_pw, sizeof(redis_pw));
	wipe(pg_pw, sizeof(pg_pw));
}
