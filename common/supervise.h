/* supervise.h - process supervision: one libuv loop keeps a fixed set of
 * child processes alive (DESIGN §6 "Nothing runs unsupervised").
 *
 * The one implementation behind agentd's worker supervisor
 * (agentd/supervisor.c) and swarmctl's managed-mode supervisor
 * (swarmctl/supervise.c, which owns Redis, PostgreSQL, gpud and agentd).
 * It is its own library (sw_sup_dep) because it links libuv; programs that
 * supervise nothing link common_dep alone.
 *
 * A child is one position (a worker slot, a service). Its life:
 *
 *   waiting -> starting -> running -> (exit) -> backoff -> waiting ...
 *                                            -> failed
 *   stopped once the supervisor stops
 *
 *   waiting    due to start; with opts.ordered it starts only once every
 *              earlier child is running, failed or stopped (dependency
 *              order: Redis before agentd);
 *   starting   spawned, not yet ready: ready is the first sw_sup_beat()
 *              or the first ops->probe that succeeds; a child with
 *              neither is ready at once, and so is an adopted process;
 *   running    ready. With a hang limit (child.hang_ms, else
 *              policy.hang_ms), a child that beat once and then stays
 *              silent that long is SIGKILLed: a crash ("hangs"). A child
 *              without a beat pipe beats by answering ops->probe with
 *              live set, asked every opts.live_probe_ms;
 *   backoff    exited; restarted after a delay (below);
 *   failed     more than policy.crash_limit crashes within
 *              policy.crash_window_ms: not restarted, the others keep
 *              running (sw_sup_retry_failed or SIGHUP, when
 *              opts.hup_retries, tries again).
 *
 * Exits: a non-zero exit, a signal, a spawn that fails, a start that
 * times out (child.start_timeout_ms) or an adopted process that vanished
 * is a crash. The delay after a crash starts at backoff_min_ms and doubles
 * up to backoff_max_ms; it goes back to the minimum once a child ran
 * crash_window_ms before crashing. Exit 0 is a recycle with
 * policy.exit0_recycles (restarted at once, or after backoff_min_ms when
 * it ran less than quick_exit_ms, so it cannot spin), else a crash.
 *
 * Stopping, on SIGTERM or SIGINT (the loop handles both):
 *   SW_SUP_STOP_DRAIN    SIGTERM to every child, no more restarts;
 *                        SIGKILL to those still there after drain_ms or
 *                        at a second SIGTERM/SIGINT; returns once all
 *                        are gone;
 *   SW_SUP_STOP_RELEASE  no more restarts; the children keep running and
 *                        the supervisor returns at once (swarmctl stop
 *                        then stops the services in its own order).
 *
 * Adoption: a child whose spec names a live pid (adopt) is watched
 * through a pidfd instead of spawned, so a supervisor that died and came
 * back takes over running services whose parent it is not. Their exit
 * status is unknown ("last_exit": "gone").
 *
 * Logs: every child's stdin is /dev/null; a child with log_path gets
 * stdout and stderr appended (O_APPEND) to that file, opened by the
 * supervisor at each spawn (else it inherits the supervisor's). With opts.log_max_bytes the supervisor checks each such
 * file (and opts.extra_logs) about once a second and rotates one that
 * outgrew the bound by copy and truncate (sw_sup_rotate): the child's
 * descriptor stays valid, nothing it writes blocks on the supervisor, and
 * an adopted child keeps logging whether or not a supervisor runs.
 *
 * Signals to the children: sw_sup_signal_started() sends a signal to
 * every child that has started: at once to a running one, and to one
 * still starting at the moment it becomes ready (until then its handler
 * may not be installed, and a signal such as SIGUSR1 would kill it). With
 * opts.usr1_reopens the loop does that for SIGUSR1 (logrotate): it
 * reopens this process's own log file (sw_log_reopen) and passes SIGUSR1
 * on, so one `kill -USR1` reaches every process that writes a log file.
 * Only for children that handle SIGUSR1 (agentd's workers do; Redis
 * would die of it: a supervisor of such children bounds their output by
 * log_path and log_max_bytes instead).
 *
 * Status: with opts.status_path the supervisor rewrites that file (write
 * to PATH.tmp, then rename) on every change: spawn, ready, exit, restart,
 * failed, stop; and at most once per tick after sw_sup_status_dirty().
 * The document is ops->status's, or by default
 *   {"pid": N, "state": "running"|"draining"|"stopped"|"failed",
 *    "children": [sw_sup_info_json() of each]}.
 *
 * Threads: everything runs on the thread that called sw_sup_run, except
 * ops->probe, which runs on libuv's thread pool.
 */
#ifndef SW_SUPERVISE_H
#define SW_SUPERVISE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

enum sw_sup_state {
	SW_SUP_STARTING = 0,
	SW_SUP_RUNNING = 1,
	SW_SUP_BACKOFF = 2,
	SW_SUP_FAILED = 3,
	SW_SUP_STOPPED = 4,
	SW_SUP_WAITING = 5,
};

enum sw_sup_stop {
	SW_SUP_STOP_DRAIN = 0,
	SW_SUP_STOP_RELEASE = 1,
};

struct sw_sup_policy {
	uint32_t backoff_min_ms;    /* first restart delay after a crash (>= 1) */
	uint32_t backoff_max_ms;    /* the doubling stops here (>= min) */
	uint32_t crash_window_ms;   /* crashes counted over this window ... */
	uint32_t crash_limit;       /* ... more than this many: failed (>= 1) */
	uint32_t hang_ms;           /* silent this long after a beat: killed; 0 = off */
	uint32_t drain_ms;          /* SW_SUP_STOP_DRAIN: SIGKILL after this */
	uint32_t quick_exit_ms;     /* a recycle sooner than this waits backoff_min_ms */
	bool exit0_recycles;        /* exit 0 is a recycle, not a crash */
};

/* One child. Strings are borrowed for the whole run. */
struct sw_sup_child {
	const char *name;           /* in log lines and the status: "worker 0", "redis" */
	const char *file;           /* the executable; a name without '/' is looked up in PATH */
	char *const *argv;          /* NULL-terminated; argv[0] is what ps shows */
	const char *log_path;       /* NULL: inherit stdout and stderr */
	bool beat_pipe;             /* fd 3: a pipe whose lines go to ops->on_line */
	bool detached;              /* its own session (setsid) */
	bool set_ids;               /* run as uid/gid (supplementary groups dropped) */
	uid_t uid;
	gid_t gid;
	uint32_t start_timeout_ms;  /* not ready this long after a spawn: killed, a
				     * crash; 0 = wait for ever */
	uint32_t hang_ms;           /* 0 = policy.hang_ms */
	pid_t adopt;                /* > 0: watch this running process (first start only) */
};

/* A child as the status shows it; read with sw_sup_info(). */
struct sw_sup_info {
	enum sw_sup_state state;
	int pid;                    /* 0 when none */
	bool adopted;               /* the process was found running, not spawned */
	uint64_t spawns;            /* successful spawns */
	uint64_t restarts;          /* spawns after an exit (adoption is no restart) */
	uint64_t crashes, recycles, hangs;
	uint64_t started_at_ms;     /* wall clock (sw_realtime_ms) of the spawn; 0 = never
				     * or adopted */
	uint64_t exited_at_ms;      /* wall clock of the last exit; 0 = none */
	char last_exit[32];         /* "exit 1", "signal 9", "spawn: ENOENT", "gone", "" */
	char error[SW_ERR_MAX];     /* why the last start failed (probe, timeout); "" */
};

struct sw_sup;

/* Hooks; every one is optional. All but probe run on the loop thread and
 * may call the sw_sup_* functions below. */
struct sw_sup_ops {
	/* A line (without its newline, at most 255 bytes) read from child
	 * i's beat pipe. */
	void (*on_line)(struct sw_sup *sup, unsigned i, const char *line, void *user);
	/* Before each spawn of child i (stale lock files...). Non-zero: the
	 * spawn fails like an exec failure, with err as its reason. */
	int (*before_spawn)(void *user, unsigned i, char *err, size_t errlen);
	/* Child i has a new process (spawned or adopted): info->pid. */
	void (*on_start)(struct sw_sup *sup, unsigned i, void *user);
	/* Child i's process pid exited; info->last_exit says how. Called
	 * before the restart decision. */
	void (*on_exit)(struct sw_sup *sup, unsigned i, int pid, void *user);
	/* live false: is child i (process pid) ready? Asked every probe_ms
	 * while it is starting. live true: is it still answering? Asked
	 * every live_probe_ms while it runs, when it has a hang limit and no
	 * beat pipe; a yes is a beat. 0 yes, else a negative code with the
	 * reason in err. Runs on libuv's thread pool (one call in flight per
	 * child): touch only what is safe from another thread, and bound
	 * every wait (a stop waits for a probe in flight). */
	int (*probe)(void *user, unsigned i, int pid, bool live, char *err, size_t errlen);
	/* Appends to an exit's log line (", 14 tasks done"); out holds cap. */
	void (*exit_note)(void *user, unsigned i, char *out, size_t cap);
	/* The status document (a new reference), or NULL to skip this write. */
	json_t *(*status)(struct sw_sup *sup, void *user);
};

struct sw_sup_opts {
	const struct sw_sup_child *children;
	unsigned n_children;                /* >= 1 */
	struct sw_sup_policy policy;
	const struct sw_sup_ops *ops;       /* NULL = none */
	void *user;                         /* passed to every hook */
	const char *noun, *nouns;           /* log lines: "worker"/"workers" (default
					     * "child"/"children") */
	const char *status_path;            /* NULL or "": no status file */
	enum sw_sup_stop stop;
	bool ordered;                       /* start child i after 0..i-1 (above) */
	bool exit_when_all_failed;          /* return -EIO once every child failed */
	bool hup_retries;                   /* SIGHUP: sw_sup_retry_failed */
	uint32_t probe_ms;                  /* probe period while starting; 0 = 100 */
	uint32_t live_probe_ms;             /* while running (above); 0 = 5000 */
	uint64_t log_max_bytes;             /* rotate log files past this; 0 = never */
	unsigned log_keep;                  /* rotated copies kept: PATH.1 .. PATH.keep */
	const char *const *extra_logs;      /* NULL-terminated; more files to bound */
	bool usr1_reopens;                  /* SIGUSR1: sw_log_reopen() here, and
					     * sw_sup_signal_started(SIGUSR1) */
};

/* Runs the supervisor until it stops (SIGTERM/SIGINT, above) or, with
 * exit_when_all_failed, until every child failed. Installs its own
 * SIGTERM and SIGINT handling (with hup_retries SIGHUP's, with
 * usr1_reopens SIGUSR1's) for the duration and ignores SIGPIPE; a
 * SIGUSR1 handler installed before (sw_log_install_sigusr1) is replaced
 * meanwhile. Returns 0 after a stop, -EIO when every
 * child failed, or a negative code when the loop could not be set up
 * (message in err in both error cases; -EINVAL for bad options). With
 * SW_SUP_STOP_DRAIN no child process is left behind by a return: those
 * still running are SIGKILLed and reaped. With SW_SUP_STOP_RELEASE the
 * running ones are left running. */
int sw_sup_run(const struct sw_sup_opts *o, char *err, size_t errlen);

/* Child i's current view (valid until the hook returns; i < n_children). */
const struct sw_sup_info *sw_sup_info(const struct sw_sup *sup, unsigned i);

/* Child i is alive (from its beat pipe): a starting child becomes running
 * (the status is rewritten), and its hang clock restarts. */
void sw_sup_beat(struct sw_sup *sup, unsigned i);

/* Something the status shows changed (not a state): rewrite the status
 * file at the next tick rather than now. */
void sw_sup_status_dirty(struct sw_sup *sup);

/* Sends signal sig (1..64) to every child that has started: now to each
 * running one (ready, or adopted), and to each one still starting at the
 * moment it becomes ready; a child that dies before it is ready, or is
 * being killed (hung, not ready in time), is owed nothing. A child in
 * backoff, waiting, failed or stopped has no process and gets nothing.
 * Returns how many were signalled now; *later (may be NULL) is set to how
 * many get it once ready. A bad sig: 0, nothing sent. */
unsigned sw_sup_signal_started(struct sw_sup *sup, int sig, unsigned *later);

/* Every failed child starts again from a clean crash count (in order,
 * with opts.ordered). Returns how many were failed. */
unsigned sw_sup_retry_failed(struct sw_sup *sup);

/* The supervisor's own state: "running", "draining", "stopped" or
 * "failed" (every child failed). Static string. */
const char *sw_sup_run_state(const struct sw_sup *sup);

/* "starting", "running", "backoff", "failed", "stopped", "waiting";
 * "?" for anything else. Static string. */
const char *sw_sup_state_name(enum sw_sup_state s);

/* {"name", "pid", "state", "adopted", "spawns", "restarts", "crashes",
 * "recycles", "hangs", "started_at" (ms since the epoch; 0 = never or
 * adopted), "exited_at", "last_exit", "error"}; a new reference, NULL
 * when out of memory. */
json_t *sw_sup_info_json(const struct sw_sup *sup, unsigned i);

/* The start of a status document: {"pid": this process, "state":
 * sw_sup_run_state(sup), key: []}, *arr being that empty array (borrowed)
 * for the caller to fill. A new reference; NULL when out of memory
 * (nothing to free). */
json_t *sw_sup_status_doc(const struct sw_sup *sup, const char *key, json_t **arr);

/* Bounds the log file at path by copy and truncate: when it holds more
 * than max_bytes, PATH.(k) becomes PATH.(k+1) for k = keep-1 .. 1
 * (PATH.keep is dropped), PATH is copied to PATH.1, and PATH is
 * truncated to 0 in place, so a writer with an O_APPEND descriptor goes
 * on writing at its new end. keep = 0 only truncates. Bytes written
 * between the last copy and the truncate are lost (a window of
 * microseconds; the copy is repeated while the file keeps growing).
 * Returns 1 when it rotated, 0 when the file is within the bound or
 * missing, or a negated errno (nothing truncated then). */
int sw_sup_rotate(const char *path, uint64_t max_bytes, unsigned keep);

#endif
