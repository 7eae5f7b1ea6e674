/* supervisor.c - agentd's supervisor: a libuv loop over N worker slots.
 *
 * A slot is one worker position. Its life: starting (spawned, no beat
 * yet) -> running (beating) -> exit -> backoff (timer) -> starting ... or
 * failed, or stopped during a drain. All handles of a slot live in the
 * slot; a slot is respawned only once its previous handles are closed
 * (n_closing == 0).
 */
#include "agentd/supervisor.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <uv.h>

#include "common/err.h"
#include "common/log.h"
#include "common/time.h"
#include "sw_config.h"

#define HB_LINE_MAX 256

enum slot_state {
	SLOT_STARTING,
	SLOT_RUNNING,
	SLOT_BACKOFF,
	SLOT_FAILED,
	SLOT_STOPPED,
};

static const char *const slot_state_names[] = { "starting", "running", "backoff", "failed",
						"stopped" };

struct sup;

struct slot {
	struct sup *sup;
	int index;
	enum slot_state state;
	uv_process_t proc;
	uv_pipe_t hb;
	uv_timer_t restart;
	bool proc_open, hb_open, killed_hung;
	bool reopen_pending;      /* owes a SIGUSR1 at its first beat */
	int n_closing;            /* handles whose close callback is pending */
	int pid;                  /* 0 when none */
	uint64_t started_ms, last_beat_ms;
	uint32_t backoff_ms;      /* next crash delay */
	uint64_t *crash_ms;       /* (crash_limit + 1) ring of crash times */
	uint32_t crash_head;      /* crashes recorded so far */
	uint64_t spawns, crashes, recycles, hangs, done;
	char activity[16];        /* idle, busy or drain from the last beat; "" */
	char last_exit[32];
	char line[HB_LINE_MAX];   /* partial heartbeat line */
	size_t line_len;
};

struct sup {
	const struct agent_sup_opts *o;
	const struct sw_config *cfg;
	uv_loop_t loop;
	uv_signal_t sig_term, sig_int, sig_usr1;
	uv_timer_t tick, drain_timer;
	struct slot *slots;
	uint64_t *crash_times;    /* (n, crash_limit + 1): the slots' rings */
	uint32_t n;
	uint32_t drain_ms, hang_ms, tick_ms;
	bool draining, killed_all, all_failed, closing;
	bool dirty;               /* a beat changed what the status file shows */
	char exe[PATH_MAX];
	char status_path[PATH_MAX];
	char sql_dir[PATH_MAX];
};

static void spawn_slot(struct slot *s);

/* --- status file ---------------------------------------------------------- */

static void write_status(struct sup *sp)
{
	const char *state = sp->all_failed ? "failed" : sp->closing ? "stopped" :
			    sp->draining ? "draining" : "running";
	json_t *root, *arr;
	char tmp[PATH_MAX + 8];

	sp->dirty = false;
	if (!sp->status_path[0])
		return;
	root = json_object();
	arr = json_array();
	if (!root || !arr)
		goto out_free;
	json_object_set_new(root, "pid", json_integer(getpid()));
	json_object_set_new(root, "state", json_string(state));
	for (uint32_t i = 0; i < sp->n; i++) {
		const struct slot *s = &sp->slots[i];

		json_array_append_new(arr, json_pack("{s:i, s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:s, s:s}",
						     "slot", s->index, "pid", s->pid, "state",
						     slot_state_names[s->state], "spawns",
						     (json_int_t)s->spawns, "crashes",
						     (json_int_t)s->crashes, "recycles",
						     (json_int_t)s->recycles, "hangs",
						     (json_int_t)s->hangs, "done",
						     (json_int_t)s->done, "last_exit",
						     s->last_exit, "activity", s->activity));
	}
	json_object_set(root, "workers", arr);
	snprintf(tmp, sizeof(tmp), "%s.tmp", sp->status_path);
	if (json_dump_file(root, tmp, JSON_COMPACT) != 0 || rename(tmp, sp->status_path) != 0)
		log_warn("cannot write %s: %m", sp->status_path);
out_free:
	json_decref(arr);
	json_decref(root);
}

/* --- closing -------------------------------------------------------------- */

static void on_slot_closed(uv_handle_t *h)
{
	struct slot *s = h->data;

	s->n_closing--;
}

static void close_slot_handle(struct slot *s, uv_handle_t *h)
{
	if (uv_is_closing(h))
		return;
	s->n_closing++;
	uv_close(h, on_slot_closed);
}

static bool any_process(const struct sup *sp)
{
	for (uint32_t i = 0; i < sp->n; i++)
		if (sp->slots[i].proc_open)
			return true;
	return false;
}

static void on_noop_close(uv_handle_t *h)
{
	(void)h;
}

/* Closes every handle; uv_run returns once the close callbacks ran. */
static void close_all(struct sup *sp)
{
	if (sp->closing)
		return;
	sp->closing = true;
	uv_close((uv_handle_t *)&sp->sig_term, on_noop_close);
	uv_close((uv_handle_t *)&sp->sig_int, on_noop_close);
	uv_close((uv_handle_t *)&sp->sig_usr1, on_noop_close);
	uv_close((uv_handle_t *)&sp->tick, on_noop_close);
	uv_close((uv_handle_t *)&sp->drain_timer, on_noop_close);
	for (uint32_t i = 0; i < sp->n; i++) {
		struct slot *s = &sp->slots[i];

		close_slot_handle(s, (uv_handle_t *)&s->restart);
		if (s->hb_open) {
			close_slot_handle(s, (uv_handle_t *)&s->hb);
			s->hb_open = false;
		}
	}
	write_status(sp);
}

static void maybe_finish(struct sup *sp)
{
	if (sp->draining && !any_process(sp)) {
		log_info("drained: every worker has exited");
		close_all(sp);
	}
}

/* --- heartbeats ----------------------------------------------------------- */

static void on_hb_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	static char scratch[4096]; /* one loop thread: a read is consumed at once */

	(void)h;
	(void)suggested;
	*buf = uv_buf_init(scratch, sizeof(scratch));
}

static void parse_beat(struct slot *s, const char *line)
{
	int pid;
	char state[16], entry[80];
	unsigned long long done;

	if (sscanf(line, "hb %d %15s %llu %79s", &pid, state, &done, entry) != 4) {
		log_warn("worker %d (pid %d): bad heartbeat line \"%.60s\"", s->index, s->pid, line);
		return;
	}
	s->last_beat_ms = sw_now_ms();
	if (s->done != done || strcmp(s->activity, state) != 0) {
		s->done = done;
		snprintf(s->activity, sizeof(s->activity), "%s", state);
		s->sup->dirty = true;
	}
	if (s->state == SLOT_STARTING) {
		s->state = SLOT_RUNNING;
		log_debug("worker %d (pid %d): first heartbeat (%s)", s->index, s->pid, state);
		if (s->reopen_pending)
			uv_process_kill(&s->proc, SIGUSR1);
		s->reopen_pending = false;
		write_status(s->sup);
	}
}

static void on_hb_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
	struct slot *s = stream->data;

	if (nread < 0) {
		/* EOF: the worker closed its end (it is exiting); the exit
		 * callback closes the handle. */
		uv_read_stop(stream);
		return;
	}
	for (ssize_t i = 0; i < nread; i++) {
		char c = buf->base[i];

		if (c == '\n') {
			s->line[s->line_len] = '\0';
			parse_beat(s, s->line);
			s->line_len = 0;
		} else if (s->line_len + 1 < sizeof(s->line)) {
			s->line[s->line_len++] = c;
		}
	}
}

/* --- exits and restarts --------------------------------------------------- */

/* Records a crash of s at now; returns the crashes within the window
 * ending now, this one included (at most crash_limit + 1: all the limit
 * test needs). */
static uint32_t record_crash(struct slot *s, uint64_t now)
{
	const uint32_t ring = s->sup->cfg->agentd.crash_limit + 1;
	const uint32_t window = s->sup->cfg->agentd.crash_window_ms;
	uint32_t n = 0, have;

	s->crashes++;
	s->crash_ms[s->crash_head % ring] = now;
	s->crash_head++;
	have = s->crash_head < ring ? s->crash_head : ring;
	for (uint32_t i = 0; i < have; i++) {
		uint64_t t = s->crash_ms[(s->crash_head - 1 - i) % ring];

		if (now - t > window)
			break;
		n++;
	}
	return n;
}

static void on_restart_timer(uv_timer_t *t)
{
	struct slot *s = t->data;

	if (s->sup->draining || s->state != SLOT_BACKOFF)
		return;
	if (s->n_closing > 0) { /* the last process's handles are still closing */
		uv_timer_start(&s->restart, on_restart_timer, 10, 0);
		return;
	}
	spawn_slot(s);
}

static void all_failed_check(struct sup *sp)
{
	for (uint32_t i = 0; i < sp->n; i++)
		if (sp->slots[i].state != SLOT_FAILED)
			return;
	log_error("every worker (%u) has failed; agentd stops", sp->n);
	sp->all_failed = true;
	close_all(sp);
}

static void on_worker_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
	struct slot *s = p->data;
	struct sup *sp = s->sup;
	const struct sw_config *cfg = sp->cfg;
	uint64_t now = sw_now_ms(), ran = now - s->started_ms;
	int pid = s->pid;
	bool crash = term_signal != 0 || exit_status != 0;

	if (term_signal)
		snprintf(s->last_exit, sizeof(s->last_exit), "signal %d", term_signal);
	else
		snprintf(s->last_exit, sizeof(s->last_exit), "exit %d", (int)exit_status);
	close_slot_handle(s, (uv_handle_t *)&s->proc);
	s->proc_open = false;
	if (s->hb_open) {
		close_slot_handle(s, (uv_handle_t *)&s->hb);
		s->hb_open = false;
	}
	s->pid = 0;
	s->line_len = 0;
	s->activity[0] = '\0';

	if (sp->draining) {
		log_info("worker %d (pid %d): %s after %" PRIu64 " ms (drain)", s->index, pid,
			 s->last_exit, ran);
		s->state = SLOT_STOPPED;
		write_status(sp);
		maybe_finish(sp);
		return;
	}
	if (!crash && !s->killed_hung) {
		/* A clean exit right after the start is no recycle (a worker
		 * that has nothing to do and says so): wait the minimum backoff
		 * instead of spinning. */
		uint32_t delay = ran < AGENT_SUP_QUICK_EXIT_MS ? cfg->agentd.restart_backoff_min_ms : 0;

		s->recycles++;
		log_info("worker %d (pid %d): exit 0 after %" PRIu64 " ms, %" PRIu64
			 " tasks done: recycled, restarting %s",
			 s->index, pid, ran, s->done, delay ? "after the minimum backoff" : "now");
		s->state = SLOT_BACKOFF;
		uv_timer_start(&s->restart, on_restart_timer, delay, 0);
		write_status(sp);
		return;
	}

	if (ran >= cfg->agentd.crash_window_ms)
		s->backoff_ms = cfg->agentd.restart_backoff_min_ms; /* it had been healthy */
	if (record_crash(s, now) > cfg->agentd.crash_limit) {
		s->state = SLOT_FAILED;
		log_error("worker %d (pid %d): %s; more than %u crashes within %u ms: marked failed, "
			  "not restarted",
			  s->index, pid, s->last_exit, cfg->agentd.crash_limit,
			  cfg->agentd.crash_window_ms);
		write_status(sp);
		all_failed_check(sp);
		return;
	}
	log_warn("worker %d (pid %d): %s%s after %" PRIu64 " ms; restarting in %u ms", s->index,
		 pid, s->last_exit, s->killed_hung ? " (killed: hung)" : "", ran, s->backoff_ms);
	s->state = SLOT_BACKOFF;
	uv_timer_start(&s->restart, on_restart_timer, s->backoff_ms, 0);
	s->backoff_ms = s->backoff_ms > cfg->agentd.restart_backoff_max_ms / 2 ?
				cfg->agentd.restart_backoff_max_ms :
				s->backoff_ms * 2;
	write_status(sp);
}

/* --- spawning ------------------------------------------------------------- */

static void spawn_slot(struct slot *s)
{
	struct sup *sp = s->sup;
	uv_process_options_t po = { 0 };
	uv_stdio_container_t stdio[4];
	char *args[9];
	int n = 0, rc;

	args[n++] = "agentd";
	args[n++] = "worker";
	args[n++] = "--config";
	args[n++] = (char *)sp->o->config_path;
	args[n++] = "--heartbeat-fd";
	args[n++] = "3";
	if (sp->sql_dir[0]) {
		args[n++] = "--sql-dir";
		args[n++] = sp->sql_dir;
	}
	args[n] = NULL;

	rc = uv_pipe_init(&sp->loop, &s->hb, 0);
	if (rc)
		goto out_retry;
	s->hb.data = s;
	s->hb_open = true;
	stdio[0].flags = UV_IGNORE;
	stdio[1].flags = UV_INHERIT_FD;
	stdio[1].data.fd = 1;
	stdio[2].flags = UV_INHERIT_FD;
	stdio[2].data.fd = 2;
	stdio[3].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
	stdio[3].data.stream = (uv_stream_t *)&s->hb;
	po.file = sp->exe;
	po.args = args;
	po.exit_cb = on_worker_exit;
	po.stdio = stdio;
	po.stdio_count = 4;
	s->proc.data = s;
	rc = uv_spawn(&sp->loop, &s->proc, &po);
	if (rc) {
		/* uv_spawn's handle must be closed even on failure */
		close_slot_handle(s, (uv_handle_t *)&s->proc);
		close_slot_handle(s, (uv_handle_t *)&s->hb);
		s->hb_open = false;
		goto out_retry;
	}
	s->proc_open = true;
	s->pid = s->proc.pid;
	s->spawns++;
	s->started_ms = s->last_beat_ms = sw_now_ms();
	s->killed_hung = false;
	s->line_len = 0;
	s->state = SLOT_STARTING;
	rc = uv_read_start((uv_stream_t *)&s->hb, on_hb_alloc, on_hb_read);
	if (rc)
		log_warn("worker %d: reading heartbeats: %s (it will look hung)", s->index,
			 uv_strerror(rc));
	log_info("worker %d: spawned pid %d (spawn %" PRIu64 ")", s->index, s->pid, s->spawns);
	write_status(sp);
	return;

out_retry:
	/* Spawning itself failed (fd or process limits): count it as a crash
	 * so a persistent failure ends as failed instead of a busy loop. */
	snprintf(s->last_exit, sizeof(s->last_exit), "spawn: %s", uv_err_name(rc));
	log_error("worker %d: cannot spawn %s: %s", s->index, sp->exe, uv_strerror(rc));
	s->started_ms = sw_now_ms();
	s->state = SLOT_BACKOFF;
	if (record_crash(s, sw_now_ms()) > sp->cfg->agentd.crash_limit) {
		s->state = SLOT_FAILED;
		log_error("worker %d: marked failed (%s)", s->index, s->last_exit);
		write_status(sp);
		all_failed_check(sp);
		return;
	}
	uv_timer_start(&s->restart, on_restart_timer, s->backoff_ms, 0);
	s->backoff_ms = s->backoff_ms > sp->cfg->agentd.restart_backoff_max_ms / 2 ?
				sp->cfg->agentd.restart_backoff_max_ms :
				s->backoff_ms * 2;
	write_status(sp);
}

/* --- timers and signals --------------------------------------------------- */

static void on_tick(uv_timer_t *t)
{
	struct sup *sp = t->data;
	uint64_t now = sw_now_ms();

	if (sp->dirty)
		write_status(sp); /* beats: at most once a tick */

	for (uint32_t i = 0; i < sp->n; i++) {
		struct slot *s = &sp->slots[i];

		/* A stopped (SIGSTOP) worker is hung as well: SIGKILL works on it. */
		if (s->state != SLOT_RUNNING || !s->proc_open || s->killed_hung)
			continue;
		if (now - s->last_beat_ms <= sp->hang_ms)
			continue;
		log_error("worker %d (pid %d): no heartbeat for %" PRIu64 " ms (limit %u): hung, "
			  "killing it",
			  s->index, s->pid, now - s->last_beat_ms, sp->hang_ms);
		s->killed_hung = true;
		s->hangs++;
		uv_process_kill(&s->proc, SIGKILL);
	}
}

static void kill_all(struct sup *sp, int sig)
{
	for (uint32_t i = 0; i < sp->n; i++) {
		struct slot *s = &sp->slots[i];

		if (s->proc_open)
			uv_process_kill(&s->proc, sig); /* SIGKILL ends a stopped one too */
	}
}

static void on_drain_deadline(uv_timer_t *t)
{
	struct sup *sp = t->data;

	if (!any_process(sp))
		return;
	log_warn("drain deadline (%u ms) passed: killing the workers still running (their "
		 "entries stay pending and are reclaimed after the lease)",
		 sp->drain_ms);
	sp->killed_all = true;
	kill_all(sp, SIGKILL);
}

static const char *sig_name(int signum)
{
	return signum == SIGTERM ? "SIGTERM" : signum == SIGINT ? "SIGINT" : "signal";
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct sup *sp = h->data;

	if (sp->closing)
		return;
	if (sp->draining) {
		if (!sp->killed_all) {
			log_warn("%s again: killing the workers now", sig_name(signum));
			sp->killed_all = true;
			kill_all(sp, SIGKILL);
		}
		return;
	}
	sp->draining = true;
	log_info("%s: draining %u workers (deadline %u ms)", sig_name(signum), sp->n,
		 sp->drain_ms);
	for (uint32_t i = 0; i < sp->n; i++) {
		struct slot *s = &sp->slots[i];

		uv_timer_stop(&s->restart);
		if (!s->proc_open && s->state != SLOT_FAILED)
			s->state = SLOT_STOPPED;
	}
	kill_all(sp, SIGTERM);
	uv_timer_start(&sp->drain_timer, on_drain_deadline, sp->drain_ms, 0);
	write_status(sp);
	maybe_finish(sp);
}

/* SIGUSR1 (logrotate): reopen our log and have every worker reopen its.
 * A worker signals readiness with its first beat; before that its
 * handler may not be installed yet and SIGUSR1 would kill it, so it gets
 * the signal with that beat. */
static void on_usr1(uv_signal_t *h, int signum)
{
	struct sup *sp = h->data;
	uint32_t now = 0, later = 0;
	int rc = sw_log_reopen();

	(void)signum;
	for (uint32_t i = 0; i < sp->n; i++) {
		struct slot *s = &sp->slots[i];

		if (s->proc_open && s->state == SLOT_RUNNING)
			now += uv_process_kill(&s->proc, SIGUSR1) == 0;
		else if (s->proc_open) {
			s->reopen_pending = true;
			later++;
		}
	}
	if (rc)
		log_error("SIGUSR1: cannot reopen the log: %s", sw_strerror(rc));
	else
		log_info("SIGUSR1: log reopened; forwarded to %u workers (%u more at their first "
			 "heartbeat)", now, later);
}

/* --- the run -------------------------------------------------------------- */

static int sup_init(struct sup *sp, const struct agent_sup_opts *o, char *err, size_t errlen)
{
	const struct sw_config *cfg = o->cfg;
	int rc;

	sp->o = o;
	sp->cfg = cfg;
	sp->n = cfg->agentd.workers;
	sp->drain_ms = o->drain_ms;
	if (!sp->drain_ms) {
		sp->drain_ms = cfg->agentd.lease_ms;
		if (sp->drain_ms < AGENT_SUP_DRAIN_MIN_MS)
			sp->drain_ms = AGENT_SUP_DRAIN_MIN_MS;
		if (sp->drain_ms > AGENT_SUP_DRAIN_MAX_MS)
			sp->drain_ms = AGENT_SUP_DRAIN_MAX_MS;
	}
	sp->hang_ms = o->hang_ms ? o->hang_ms : AGENT_SUP_HANG_BEATS * cfg->agentd.heartbeat_ms;
	sp->tick_ms = sp->hang_ms / 4 ? sp->hang_ms / 4 : 1;
	if (sp->tick_ms > 1000)
		sp->tick_ms = 1000;
	if (o->exe) {
		if (snprintf(sp->exe, sizeof(sp->exe), "%s", o->exe) >= (int)sizeof(sp->exe))
			return sw_seterr(err, errlen, -ENAMETOOLONG, "executable path too long");
	} else {
		/* The path this binary was started from (valgrind maps the
		 * link to its client; /proc/self/exe itself would be the tool). */
		ssize_t n = readlink("/proc/self/exe", sp->exe, sizeof(sp->exe) - 1);

		if (n <= 0 || n >= (ssize_t)sizeof(sp->exe) - 1)
			snprintf(sp->exe, sizeof(sp->exe), "/proc/self/exe");
		else
			sp->exe[n] = '\0';
	}
	if (o->sql_dir && snprintf(sp->sql_dir, sizeof(sp->sql_dir), "%s", o->sql_dir) >=
				  (int)sizeof(sp->sql_dir))
		return sw_seterr(err, errlen, -ENAMETOOLONG, "--sql-dir too long");
	if (o->status_path) {
		snprintf(sp->status_path, sizeof(sp->status_path), "%s", o->status_path);
	} else if (cfg->state_dir[0]) {
		if (mkdir(cfg->state_dir, 0750) != 0 && errno != EEXIST)
			return sw_seterr(err, errlen, -errno, "%s: %s", cfg->state_dir,
					 strerror(errno));
		if (snprintf(sp->status_path, sizeof(sp->status_path), "%s/%s", cfg->state_dir,
			     AGENT_SUP_STATUS_FILE) >= (int)sizeof(sp->status_path))
			return sw_seterr(err, errlen, -ENAMETOOLONG, "state_dir too long");
	}
	sp->slots = calloc(sp->n, sizeof(*sp->slots));
	sp->crash_times = calloc((size_t)sp->n * (cfg->agentd.crash_limit + 1), sizeof(uint64_t));
	if (!sp->slots || !sp->crash_times) {
		rc = sw_seterr(err, errlen, -ENOMEM, "out of memory");
		goto out_free;
	}
	rc = uv_loop_init(&sp->loop);
	if (rc) {
		rc = sw_seterr(err, errlen, -EIO, "uv_loop_init: %s", uv_strerror(rc));
		goto out_free;
	}
	uv_signal_init(&sp->loop, &sp->sig_term);
	uv_signal_init(&sp->loop, &sp->sig_int);
	uv_signal_init(&sp->loop, &sp->sig_usr1);
	uv_timer_init(&sp->loop, &sp->tick);
	uv_timer_init(&sp->loop, &sp->drain_timer);
	sp->sig_term.data = sp->sig_int.data = sp->sig_usr1.data = sp;
	sp->tick.data = sp->drain_timer.data = sp;
	for (uint32_t i = 0; i < sp->n; i++) {
		struct slot *s = &sp->slots[i];

		s->sup = sp;
		s->index = (int)i;
		s->backoff_ms = cfg->agentd.restart_backoff_min_ms;
		s->crash_ms = sp->crash_times + (size_t)i * (cfg->agentd.crash_limit + 1);
		uv_timer_init(&sp->loop, &s->restart);
		s->restart.data = s;
	}
	return 0;

out_free:
	free(sp->crash_times);
	free(sp->slots);
	sp->crash_times = NULL;
	sp->slots = NULL;
	return rc;
}

int agent_sup_run(const struct agent_sup_opts *o, char *err, size_t errlen)
{
	struct sup sp = { 0 };
	char pid[32];
	int rc;

	rc = sup_init(&sp, o, err, errlen);
	if (rc)
		return rc;
	/* `agentd worker` asks for a drain when this process dies. */
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	setenv("SWARM_SUPERVISOR_PID", pid, 1);
	uv_signal_start(&sp.sig_term, on_signal, SIGTERM);
	uv_signal_start(&sp.sig_int, on_signal, SIGINT);
	uv_signal_start(&sp.sig_usr1, on_usr1, SIGUSR1);
	signal(SIGPIPE, SIG_IGN);
	uv_timer_start(&sp.tick, on_tick, sp.tick_ms, sp.tick_ms);
	log_info("supervising %u workers (%s worker --config %s; backoff %u..%u ms, %u crashes "
		 "per %u ms, hang after %u ms silent, drain %u ms, status %s)",
		 sp.n, sp.exe, o->config_path, o->cfg->agentd.restart_backoff_min_ms,
		 o->cfg->agentd.restart_backoff_max_ms, o->cfg->agentd.crash_limit,
		 o->cfg->agentd.crash_window_ms, sp.hang_ms, sp.drain_ms,
		 sp.status_path[0] ? sp.status_path : "(none)");
	for (uint32_t i = 0; i < sp.n && !sp.closing; i++)
		spawn_slot(&sp.slots[i]);
	uv_run(&sp.loop, UV_RUN_DEFAULT);

	/* The loop only ends once close_all ran; a process still open then
	 * (every worker failed while one was mid-restart cannot happen, but
	 * be safe) is killed and reaped by libuv's close. */
	if (any_process(&sp)) {
		kill_all(&sp, SIGKILL);
		for (uint32_t i = 0; i < sp.n; i++)
			if (sp.slots[i].proc_open)
				close_slot_handle(&sp.slots[i], (uv_handle_t *)&sp.slots[i].proc);
		uv_run(&sp.loop, UV_RUN_DEFAULT);
	}
	rc = uv_loop_close(&sp.loop);
	if (rc)
		log_warn("uv_loop_close: %s", uv_strerror(rc));
	unsetenv("SWARM_SUPERVISOR_PID");
	rc = sp.all_failed ? sw_seterr(err, errlen, -EIO, "every worker failed (see the log)") : 0;
	free(sp.crash_times);
	free(sp.slots);
	return rc;
}

/* --- the command ---------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f, "usage: agentd --config FILE [--sql-dir DIR] [-n]\n"
		   "       agentd worker --config FILE [--heartbeat-fd N] [--sql-dir DIR] [-n]\n");
}

int agent_supervisor_main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "sql-dir", required_argument, NULL, 's' },
		{ "check", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	struct agent_sup_opts o = { 0 };
	struct sw_config cfg;
	const char *config = NULL;
	char err[SW_ERR_MAX], *json;
	bool check = false;
	int c, rc;

	optind = 1;
	while ((c = getopt_long(argc, argv, "c:s:nh", longopts, NULL)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 's': o.sql_dir = optarg; break;
		case 'n': check = true; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!config || optind != argc) {
		usage(stderr);
		return 2;
	}
	if (sw_config_load_file(config, &cfg, err, sizeof(err)) != 0 ||
	    sw_config_apply_env(&cfg, err, sizeof(err)) != 0 ||
	    sw_config_validate(&cfg, 0, err, sizeof(err)) != 0) {
		fprintf(stderr, "agentd: %s\n", err);
		return 1;
	}
	if (check) {
		printf("configuration OK\n");
		return 0;
	}
	sw_log_init("agentd", (enum sw_log_level)cfg.log.level);
	if (cfg.log.file[0] && sw_log_open(cfg.log.file) != 0)
		fprintf(stderr, "agentd: cannot open log file %s; logging to stderr\n",
			cfg.log.file);
	sw_log_install_sigusr1();
	log_info("agentd %s supervisor (libuv %s)", SW_VERSION, uv_version_string());
	json = sw_config_to_json(&cfg); /* passwords redacted */
	if (json)
		log_info("effective configuration: %s", json);
	free(json);
	o.cfg = &cfg;
	o.config_path = config;
	rc = agent_sup_run(&o, err, sizeof(err));
	if (rc) {
		log_error("%s", err);
		return 1;
	}
	log_info("agentd supervisor: exit 0");
	return 0;
}
