/* log.c - leveled, line-atomic logging to stderr or a file.
 *
 * A line is formatted into a stack buffer and handed to the kernel with one
 * write(2), so lines from threads and from processes sharing the file
 * (O_APPEND) never interleave. The mutex only guards the target fd against
 * a concurrent open/reopen; formatting happens outside it.
 */
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LOG_LINE_MAX 4096
#define LOG_TAG_MAX 32

int sw_log_level = SW_LOG_INFO;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static int log_fd = -1;            /* -1: stderr */
static char log_path[PATH_MAX];    /* "" when logging to stderr */
static char log_tag[LOG_TAG_MAX] = "swarm";
/* Set by the SIGUSR1 handler (on whichever thread takes the signal), taken
 * by the next line logged on any thread: an atomic, lock-free. */
static atomic_int log_reopen_pending;

static const char *const level_names[] = { "error", "warn", "info", "debug" };
static const char level_letters[] = "EWID";

void sw_log_init(const char *tag, enum sw_log_level level)
{
	pthread_mutex_lock(&log_lock);
	snprintf(log_tag, sizeof(log_tag), "%s", tag ? tag : "swarm");
	pthread_mutex_unlock(&log_lock);
	sw_log_level = level;
}

int sw_log_fd(void)
{
	int fd;

	pthread_mutex_lock(&log_lock);
	fd = log_fd >= 0 ? log_fd : STDERR_FILENO;
	pthread_mutex_unlock(&log_lock);
	return fd;
}

static int open_log_file(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);

	return fd < 0 ? -errno : fd;
}

int sw_log_open(const char *path)
{
	int fd = -1;

	if (path) {
		if (strlen(path) >= sizeof(log_path))
			return -ENAMETOOLONG;
		fd = open_log_file(path);
		if (fd < 0)
			return fd;
	}

	pthread_mutex_lock(&log_lock);
	if (log_fd >= 0)
		close(log_fd);
	log_fd = fd;
	snprintf(log_path, sizeof(log_path), "%s", path ? path : "");
	pthread_mutex_unlock(&log_lock);
	return 0;
}

/* Caller holds log_lock. On failure the old fd stays, so lines keep going
 * to the (renamed) old file rather than being lost. */
static int reopen_locked(void)
{
	if (!log_path[0])
		return 0;
	int fd = open_log_file(log_path);
	if (fd < 0)
		return fd;
	if (log_fd >= 0)
		close(log_fd);
	log_fd = fd;
	return 0;
}

int sw_log_reopen(void)
{
	pthread_mutex_lock(&log_lock);
	int rc = reopen_locked();
	pthread_mutex_unlock(&log_lock);
	return rc;
}

static void on_sigusr1(int sig)
{
	(void)sig;
	log_reopen_pending = 1;
}

int sw_log_install_sigusr1(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_sigusr1;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGUSR1, &sa, NULL) < 0)
		return -errno;
	return 0;
}

int sw_log_level_parse(const char *s)
{
	if (!s)
		return -1;
	for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++)
		if (strcasecmp(s, level_names[i]) == 0)
			return (int)i;
	if (strcasecmp(s, "warning") == 0)
		return SW_LOG_WARN;
	return -1;
}

const char *sw_log_level_name(int level)
{
	if (level < SW_LOG_ERROR || level > SW_LOG_DEBUG)
		return "unknown";
	return level_names[level];
}

/* Writes all of buf with as few write(2) calls as the kernel allows: one
 * for any regular file or pipe line under PIPE_BUF. */
static void write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, buf, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return; /* nowhere left to report it */
		}
		buf += n;
		len -= (size_t)n;
	}
}

void sw_log_write(enum sw_log_level level, const char *func, const char *fmt, ...)
{
	char line[LOG_LINE_MAX];
	struct timespec ts;
	struct tm tm;
	size_t len;
	int n;
	int saved_errno = errno; /* callers log right after a failing call */

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	char letter = (level >= SW_LOG_ERROR && level <= SW_LOG_DEBUG) ? level_letters[level] : '?';

	/* log_tag only changes in sw_log_init, called at start-up. */
	n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %c %s[%ld] %s: ",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
		     tm.tm_sec, ts.tv_nsec / 1000000, letter, log_tag, (long)getpid(),
		     func ? func : "?");
	len = n < 0 ? 0 : (size_t)n;
	if (len >= sizeof(line) - 1)
		len = sizeof(line) - 2;

	va_list ap;
	va_start(ap, fmt);
	errno = saved_errno; /* so %m works */
	n = vsnprintf(line + len, sizeof(line) - len, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t)n >= sizeof(line) - len) {
		/* Truncated: mark it, keeping the last byte for '\n'. */
		len = sizeof(line) - 1;
		memcpy(line + len - 3, "...", 3);
	} else {
		len += (size_t)n;
	}
	/* Drop a trailing newline the caller added; we add exactly one. */
	if (len > 0 && line[len - 1] == '\n')
		len--;
	line[len++] = '\n';

	pthread_mutex_lock(&log_lock);
	if (atomic_exchange(&log_reopen_pending, 0))
		reopen_locked();
	write_all(log_fd >= 0 ? log_fd : STDERR_FILENO, line, len);
	pthread_mutex_unlock(&log_lock);
	errno = saved_errno;
}
