/* proc.h - process helpers for swarmctl: pid files, liveness that survives
 * pid reuse, detached spawning with a log file, stopping with a deadline.
 *
 * A pid file holds "<pid> <start time>\n", the start time being field 22
 * of /proc/<pid>/stat (clock ticks since boot). A process counts as alive
 * only when that pid exists *and* started at that time: a stale pid file
 * whose pid now belongs to someone else reads as dead, and swarmctl never
 * signals a stranger.
 */
#ifndef SWARMCTL_PROC_H
#define SWARMCTL_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Start time of pid in clock ticks since boot, or 0 when it does not
 * exist (or is a zombie). */
uint64_t ctl_proc_start_ticks(pid_t pid);

/* Seconds pid has been running, or -1. */
double ctl_proc_uptime_s(pid_t pid);

/* Writes "<pid> <start>\n" to path atomically (temp + rename). Returns 0
 * or a negated errno. */
int ctl_pidfile_write(const char *path, pid_t pid);

/* Reads path: the pid when the file exists and that process is the one
 * that wrote it (same start time); 0 when the file is missing or stale
 * (a stale file is removed); a negated errno on read errors. */
pid_t ctl_pidfile_live(const char *path);

/* Spawns argv detached: own session (setsid), stdin from /dev/null,
 * stdout and stderr appended to log_path, environment plus the
 * "KEY=VALUE" strings of env (may be NULL). When run_as is not NULL and
 * we are root, drops to that user first (initgroups, setgid, setuid).
 * Returns the pid, or a negated errno (exec failure is reported through a
 * close-on-exec pipe, so a missing binary is an error here, not a dead
 * child later). */
pid_t ctl_spawn(char *const argv[], char *const env[], const char *log_path,
	       const char *run_as);

/* Runs argv to completion (stdout and stderr appended to log_path, or
 * inherited when NULL), as run_as when root. Returns its exit status
 * (0..255), 128 + signal, or a negated errno. */
int ctl_run(char *const argv[], const char *log_path, const char *run_as);

/* Sends sig to pid, waits up to deadline_ms for it to exit (reaping it if
 * it is our child), then SIGKILL and waits 5 s more. Returns 0 when it is
 * gone (*killed says whether SIGKILL was needed), -ESRCH when it was not
 * running, -ETIMEDOUT when even SIGKILL did not end it. */
int ctl_stop_pid(pid_t pid, int sig, uint32_t deadline_ms, bool *killed);

/* Copies the last n lines of the file at path into out (NUL-terminated,
 * at most cap bytes, each line indented by two spaces). "" when the file
 * is missing or empty. */
void ctl_tail(const char *path, unsigned n, char *out, size_t cap);

/* mkdir -p with mode for the directories it creates. Returns 0 or a
 * negated errno. */
int ctl_mkdirs(const char *path, mode_t mode);

#endif
