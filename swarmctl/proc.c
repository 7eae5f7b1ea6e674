/* proc.c - process helpers for swarmctl (see proc.h). */
#include "swarmctl/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/time.h"

extern char **environ;

uint64_t ctl_proc_start_ticks(pid_t pid)
{
	char path[64], buf[1024];
	unsigned long long start = 0;
	char state;
	const char *p;
	ssize_t n;
	int fd;

	if (pid <= 0)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	/* comm may contain spaces and parentheses: fields resume after the
	 * last ')'. Then: state (field 3) ... starttime (field 22). */
	p = strrchr(buf, ')');
	if (!p || sscanf(p + 1, " %c", &state) != 1 || state == 'Z' || state == 'X')
		return 0;
	p += 2;
	for (int field = 3; field < 22; field++) {
		p = strchr(p, ' ');
		if (!p)
			return 0;
		p++;
	}
	if (sscanf(p, "%llu", &start) != 1)
		return 0;
	return start ? start : 1;
}

double ctl_proc_uptime_s(pid_t pid)
{
	uint64_t start = ctl_proc_start_ticks(pid);
	double up;
	long hz = sysconf(_SC_CLK_TCK);
	FILE *f;

	if (!start || hz <= 0)
		return -1;
	f = fopen("/proc/uptime", "re");
	if (!f)
		return -1;
	if (fscanf(f, "%lf", &up) != 1)
		up = -1;
	fclose(f);
	if (up < 0)
		return -1;
	up -= (double)start / (double)hz;
	return up < 0 ? 0 : up;
}

int ctl_pidfile_write(const char *path, pid_t pid)
{
	char tmp[4096];
	FILE *f;
	int err = 0;

	if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
		return -ENAMETOOLONG;
	f = fopen(tmp, "we");
	if (!f)
		return -errno;
	if (fprintf(f, "%d %llu\n", (int)pid, (unsigned long long)ctl_proc_start_ticks(pid)) < 0)
		err = -EIO;
	if (fclose(f) != 0 && !err)
		err = -errno;
	if (!err && rename(tmp, path) != 0)
		err = -errno;
	if (err)
		unlink(tmp);
	return err;
}

pid_t ctl_pidfile_live(const char *path)
{
	unsigned long long start = 0;
	int pid = 0, n;
	FILE *f = fopen(path, "re");

	if (!f)
		return errno == ENOENT ? 0 : -errno;
	n = fscanf(f, "%d %llu", &pid, &start);
	fclose(f);
	if (n == 2 && pid > 0 && start && ctl_proc_start_ticks(pid) == start)
		return pid;
	unlink(path); /* stale: the process is gone or the pid was reused */
	return 0;
}

/* In the child: become run_as (when root). Returns 0 or a negated errno. */
static int drop_to(const char *run_as)
{
	struct passwd *pw;

	if (!run_as || geteuid() != 0)
		return 0;
	pw = getpwnam(run_as);
	if (!pw)
		return -ENOENT;
	if (initgroups(pw->pw_name, pw->pw_gid) != 0 || setgid(pw->pw_gid) != 0 ||
	    setuid(pw->pw_uid) != 0)
		return -errno;
	return 0;
}

/* In the child: stdin from /dev/null, stdout+stderr to log (or kept). */
static int redirect(const char *log_path)
{
	int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);

	if (fd < 0 || dup2(fd, 0) < 0)
		return -errno;
	close(fd);
	if (!log_path)
		return 0;
	fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
	if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
		return -errno;
	close(fd);
	return 0;
}

/* fork + exec with errors reported through a CLOEXEC pipe. detach: setsid. */
static pid_t spawn(char *const argv[], char *const env[], const char *log_path,
		   const char *run_as, bool detach)
{
	int pfd[2], child_err = 0;
	pid_t pid;
	ssize_t n;

	if (pipe2(pfd, O_CLOEXEC) != 0)
		return -errno;
	pid = fork();
	if (pid < 0) {
		int e = -errno;

		close(pfd[0]);
		close(pfd[1]);
		return e;
	}
	if (pid == 0) {
		int e = 0;

		close(pfd[0]);
		if (detach && setsid() < 0)
			e = -errno;
		if (!e)
			e = redirect(log_path);
		if (!e && log_path && run_as && geteuid() == 0) {
			/* the log must stay writable after dropping privileges */
			struct passwd *pw = getpwnam(run_as);

			if (pw && chown(log_path, pw->pw_uid, pw->pw_gid) != 0)
				e = -errno;
		}
		if (!e)
			e = drop_to(run_as);
		for (size_t i = 0; !e && env && env[i]; i++)
			if (putenv(env[i]) != 0)
				e = -errno;
		signal(SIGPIPE, SIG_DFL);
		if (!e) {
			execvp(argv[0], argv);
			e = -errno;
		}
		if (write(pfd[1], &e, sizeof(e)) < 0) {
			/* nothing more to report */
		}
		_exit(127);
	}
	close(pfd[1]);
	do
		n = read(pfd[0], &child_err, sizeof(child_err));
	while (n < 0 && errno == EINTR);
	close(pfd[0]);
	if (n == (ssize_t)sizeof(child_err) && child_err < 0) {
		waitpid(pid, NULL, 0);
		return child_err;
	}
	return pid;
}

pid_t ctl_spawn(char *const argv[], char *const env[], const char *log_path, const char *run_as)
{
	return spawn(argv, env, log_path, run_as, true);
}

int ctl_run(char *const argv[], const char *log_path, const char *run_as)
{
	pid_t pid = spawn(argv, NULL, log_path, run_as, false);
	int st;

	if (pid < 0)
		return pid;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return 128 + WTERMSIG(st);
}

/* True once pid is gone (reaped when it is our child). */
static bool gone(pid_t pid, uint64_t start)
{
	int st;

	if (waitpid(pid, &st, WNOHANG) == pid)
		return true;
	return ctl_proc_start_ticks(pid) != start;
}

static bool wait_gone(pid_t pid, uint64_t start, uint32_t ms)
{
	struct sw_deadline d = sw_deadline_in_ms(ms);

	while (!gone(pid, start)) {
		if (sw_deadline_expired(d))
			return false;
		sw_sleep_ms(20);
	}
	return true;
}

int ctl_stop_pid(pid_t pid, int sig, uint32_t deadline_ms, bool *killed)
{
	uint64_t start = ctl_proc_start_ticks(pid);

	if (killed)
		*killed = false;
	if (!start)
		return -ESRCH;
	if (kill(pid, sig) != 0)
		return errno == ESRCH ? -ESRCH : -errno;
	if (wait_gone(pid, start, deadline_ms))
		return 0;
	if (killed)
		*killed = true;
	kill(pid, SIGKILL);
	return wait_gone(pid, start, 5000) ? 0 : -ETIMEDOUT;
}

void ctl_tail(const char *path, unsigned n, char *out, size_t cap)
{
	char buf[8192];
	size_t len = 0, o = 0;
	unsigned lines = 0;
	off_t size;
	int fd;
	ssize_t r;
	const char *p;

	if (cap == 0)
		return;
	out[0] = '\0';
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	size = lseek(fd, 0, SEEK_END);
	if (size > 0) {
		off_t from = size > (off_t)sizeof(buf) - 1 ? size - (off_t)sizeof(buf) + 1 : 0;

		r = pread(fd, buf, sizeof(buf) - 1, from);
		len = r > 0 ? (size_t)r : 0;
	}
	close(fd);
	while (len && buf[len - 1] == '\n')
		len--;
	buf[len] = '\0';
	p = buf + len;
	while (p > buf && lines < n) {
		p--;
		if (*p == '\n')
			lines++;
	}
	if (*p == '\n')
		p++;
	while (*p && o + 4 < cap) {
		if (p == buf || p[-1] == '\n') {
			out[o++] = ' ';
			out[o++] = ' ';
		}
		out[o++] = *p++;
	}
	out[o] = '\0';
}

int ctl_mkdirs(const char *path, mode_t mode)
{
	char buf[4096];
	size_t len = strlen(path);

	if (len == 0 || len >= sizeof(buf))
		return -EINVAL;
	memcpy(buf, path, len + 1);
	for (char *p = buf + 1; ; p++) {
		if (*p == '/' || *p == '\0') {
			char c = *p;

			*p = '\0';
			if (mkdir(buf, mode) != 0 && errno != EEXIST)
				return -errno;
			*p = c;
			if (!c)
				break;
		}
	}
	return 0;
}
