/* supervise.c - the supervision loop (see supervise.h).
 *
 * Every handle of a child lives in the child: its process, its beat pipe,
 * its restart timer, the poll handle on an adopted process's pidfd, and
 * the work request of a probe. A child is spawned again only once the
 * handles of its previous process are closed (n_closing == 0).
 */
#include "common/supervise.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <uv.h>

#include "common/log.h"
#include "common/time.h"

#define BEAT_LINE_MAX 256
#define ROTATE_CHECK_MS 1000   /* how often log files are measured */
#define DEFAULT_PROBE_MS 100
#define DEFAULT_LIVE_PROBE_MS 5000
#define CLOSE_RETRY_MS 10      /* a respawn waits this long for handles to close */

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif

struct child {
	struct sw_sup *sup;
	unsigned index;
	const struct sw_sup_child *spec;
	struct sw_sup_info info;
	uv_process_t proc;
	uv_pipe_t beat;
	uv_timer_t restart;
	uv_poll_t watch;          /* adopted: readable once the pidfd's process exits */
	uv_work_t probe_req;
	bool proc_open, beat_open, watch_open, probing;
	bool adopt_poll;          /* adopted without a pidfd: kill(pid, 0) every tick */
	bool killed_hung, killed_start, beaten, ever_ran;
	uint64_t pending_sigs;    /* owed once ready: bit sig - 1 (sw_sup_signal_started) */
	int pidfd;                /* adopted: the pidfd (-1 none) */
	int n_closing;            /* handles whose close callback is pending */
	uint64_t started_ms, last_beat_ms, last_probe_ms;
	uint32_t backoff_ms;      /* the next crash's delay */
	uint64_t *crash_ms;       /* (crash_limit + 1) ring of crash times */
	uint32_t crash_head;      /* crashes recorded since the last reset */
	/* the probe in flight: set before queueing, read after it ran */
	int probe_pid;
	bool probe_live;
	uint64_t probe_gen;
	/* its answer, written on the threadpool's thread and read only by
	 * probe_done (the loop's), which keeps it in probe_err */
	int work_rc;
	char work_err[SW_ERR_MAX];
	char probe_err[SW_ERR_MAX]; /* the last failed probe of this process (loop only) */
	char line[BEAT_LINE_MAX]; /* partial beat line */
	size_t line_len;
};

struct sw_sup {
	const struct sw_sup_opts *o;
	struct sw_sup_policy pol;
	uv_loop_t loop;
	uv_signal_t sig_term, sig_int, sig_hup, sig_usr1;
	uv_timer_t tick, drain_timer;
	struct child *ch;
	uint64_t *crash_times;    /* (n, crash_limit + 1): the children's rings */
	unsigned n;
	uint32_t tick_ms, probe_ms, live_probe_ms;
	uint64_t last_rotate_ms;
	bool draining, killed_all, all_failed, closing;
	bool dirty;               /* the status changed but was not written */
	bool quiet;               /* the first start: one status write at its end */
	const char *noun, *nouns;
};

static const char *const state_names[] = { "starting", "running", "backoff", "failed",
					   "stopped", "waiting" };

static void try_start(struct child *c);

const char *sw_sup_state_name(enum sw_sup_state s)
{
	return (unsigned)s < sizeof(state_names) / sizeof(state_names[0]) ? state_names[s] : "?";
}

const char *sw_sup_run_state(const struct sw_sup *sp)
{
	return sp->all_failed ? "failed" : sp->closing ? "stopped" :
	       sp->draining ? "draining" : "running";
}

const struct sw_sup_info *sw_sup_info(const struct sw_sup *sp, unsigned i)
{
	return &sp->ch[i].info;
}

#define OPS(sp) ((sp)->o->ops)
#define HAS_OP(sp, op) (OPS(sp) && OPS(sp)->op)

/* --- status file ---------------------------------------------------------- */

json_t *sw_sup_info_json(const struct sw_sup *sp, unsigned i)
{
	const struct child *c = &sp->ch[i];
	const struct sw_sup_info *f = &c->info;

	return json_pack("{s:s, s:i, s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s}",
			 "name", c->spec->name, "pid", f->pid, "state",
			 sw_sup_state_name(f->state), "adopted", f->adopted, "spawns",
			 (json_int_t)f->spawns, "restarts", (json_int_t)f->restarts, "crashes",
			 (json_int_t)f->crashes, "recycles", (json_int_t)f->recycles, "hangs",
			 (json_int_t)f->hangs, "started_at", (json_int_t)f->started_at_ms,
			 "exited_at", (json_int_t)f->exited_at_ms, "last_exit", f->last_exit,
			 "error", f->error);
}

json_t *sw_sup_status_doc(const struct sw_sup *sp, const char *key, json_t **arr)
{
	json_t *root = json_pack("{s:i, s:s, s:[]}", "pid", (int)getpid(), "state",
				 sw_sup_run_state(sp), key);

	*arr = root ? json_object_get(root, key) : NULL;
	return root;
}

static json_t *default_status(struct sw_sup *sp)
{
	json_t *arr, *root = sw_sup_status_doc(sp, "children", &arr);

	for (unsigned i = 0; root && i < sp->n; i++)
		json_array_append_new(arr, sw_sup_info_json(sp, i));
	return root;
}

static void write_status(struct sw_sup *sp)
{
	const char *path = sp->o->status_path;
	char tmp[PATH_MAX + 8];
	json_t *doc;

	if (sp->quiet) {
		sp->dirty = true;
		return;
	}
	sp->dirty = false;
	if (!path || !path[0])
		return;
	doc = HAS_OP(sp, status) ? OPS(sp)->status(sp, sp->o->user) : default_status(sp);
	if (!doc)
		return;
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if (json_dump_file(doc, tmp, JSON_COMPACT) != 0 || rename(tmp, path) != 0)
		log_warn("cannot write %s: %m", path);
	json_decref(doc);
}

void sw_sup_status_dirty(struct sw_sup *sp)
{
	sp->dirty = true;
}

/* --- closing -------------------------------------------------------------- */

static void on_child_closed(uv_handle_t *h)
{
	struct child *c = h->data;

	c->n_closing--;
}

static void close_child_handle(struct child *c, uv_handle_t *h)
{
	if (uv_is_closing(h))
		return;
	c->n_closing++;
	uv_close(h, on_child_closed);
}

static void on_watch_closed(uv_handle_t *h)
{
	struct child *c = h->data;

	if (c->pidfd >= 0)
		close(c->pidfd);
	c->pidfd = -1;
	c->n_closing--;
}

/* Closes whatever watches c's process (not the process itself). */
static void close_process_handles(struct child *c)
{
	if (c->proc_open) {
		close_child_handle(c, (uv_handle_t *)&c->proc);
		c->proc_open = false;
	}
	if (c->beat_open) {
		close_child_handle(c, (uv_handle_t *)&c->beat);
		c->beat_open = false;
	}
	if (c->watch_open) {
		c->n_closing++;
		uv_close((uv_handle_t *)&c->watch, on_watch_closed);
		c->watch_open = false;
	}
	c->adopt_poll = false;
}

static bool has_process(const struct child *c)
{
	return c->proc_open || c->watch_open || c->adopt_poll;
}

static bool any_process(const struct sw_sup *sp)
{
	for (unsigned i = 0; i < sp->n; i++)
		if (has_process(&sp->ch[i]))
			return true;
	return false;
}

/* Returns 0, or a negative code when there is no process or the
 * signal could not be sent. */
static int signal_child(struct child *c, int sig)
{
	if (c->proc_open)
		return uv_process_kill(&c->proc, sig); /* SIGKILL ends a stopped one too */
	if (c->watch_open)
		return syscall(SYS_pidfd_send_signal, c->pidfd, sig, NULL, 0) == 0 ? 0 : -errno;
	if (c->adopt_poll && c->info.pid > 0)
		return kill(c->info.pid, sig) == 0 ? 0 : -errno;
	return -ESRCH;
}

static void kill_all(struct sw_sup *sp, int sig)
{
	for (unsigned i = 0; i < sp->n; i++)
		signal_child(&sp->ch[i], sig);
}

static void on_noop_close(uv_handle_t *h)
{
	(void)h;
}

/* Closes every handle; uv_run returns once the close callbacks ran. A
 * process still running is released (STOP_RELEASE), or was killed before. */
static void close_all(struct sw_sup *sp)
{
	if (sp->closing)
		return;
	sp->closing = true;
	uv_close((uv_handle_t *)&sp->sig_term, on_noop_close);
	uv_close((uv_handle_t *)&sp->sig_int, on_noop_close);
	if (sp->o->hup_retries)
		uv_close((uv_handle_t *)&sp->sig_hup, on_noop_close);
	if (sp->o->usr1_reopens)
		uv_close((uv_handle_t *)&sp->sig_usr1, on_noop_close);
	uv_close((uv_handle_t *)&sp->tick, on_noop_close);
	uv_close((uv_handle_t *)&sp->drain_timer, on_noop_close);
	for (unsigned i = 0; i < sp->n; i++) {
		struct child *c = &sp->ch[i];

		close_child_handle(c, (uv_handle_t *)&c->restart);
		if (c->info.state == SW_SUP_BACKOFF || c->info.state == SW_SUP_WAITING)
			c->info.state = SW_SUP_STOPPED;
		if (sp->o->stop == SW_SUP_STOP_RELEASE) {
			close_process_handles(c);
		} else if (c->beat_open) {
			close_child_handle(c, (uv_handle_t *)&c->beat);
			c->beat_open = false;
		}
	}
	write_status(sp);
}

static void maybe_finish(struct sw_sup *sp)
{
	if (sp->draining && !any_process(sp)) {
		log_info("drained: every %s has exited", sp->noun);
		close_all(sp);
	}
}

/* --- readiness, beats and order ------------------------------------------- */

/* With opts.ordered, child c starts once no earlier child is on its way
 * up (starting, in backoff or waiting itself). */
static bool may_start(const struct child *c)
{
	const struct sw_sup *sp = c->sup;

	if (!sp->o->ordered)
		return true;
	for (unsigned j = 0; j < c->index; j++) {
		enum sw_sup_state s = sp->ch[j].info.state;

		if (s == SW_SUP_STARTING || s == SW_SUP_BACKOFF || s == SW_SUP_WAITING)
			return false;
	}
	return true;
}

/* Starts the waiting children that may start now, in order. */
static void kick(struct sw_sup *sp)
{
	for (unsigned i = 0; i < sp->n && !sp->closing && !sp->draining; i++)
		if (sp->ch[i].info.state == SW_SUP_WAITING)
			try_start(&sp->ch[i]);
}

static void become_ready(struct child *c)
{
	struct sw_sup *sp = c->sup;

	c->info.state = SW_SUP_RUNNING;
	c->info.error[0] = '\0';
	c->last_beat_ms = sw_now_ms();
	c->beaten = true; /* the hang clock runs from here */
	log_debug("%s (pid %d): ready after %" PRIu64 " ms", c->spec->name, c->info.pid,
		  c->last_beat_ms - c->started_ms);
	for (int sig = 1; c->pending_sigs && sig <= 64; sig++) {
		if (!(c->pending_sigs & (UINT64_C(1) << (sig - 1))))
			continue;
		c->pending_sigs &= ~(UINT64_C(1) << (sig - 1));
		if (signal_child(c, sig) != 0)
			log_warn("%s (pid %d): cannot send it signal %d", c->spec->name, c->info.pid,
				 sig);
	}
	write_status(sp);
	kick(sp);
}

void sw_sup_beat(struct sw_sup *sp, unsigned i)
{
	struct child *c = &sp->ch[i];

	c->last_beat_ms = sw_now_ms();
	c->beaten = true;
	if (c->info.state == SW_SUP_STARTING && has_process(c))
		become_ready(c);
}

static void on_beat_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	static char scratch[4096]; /* one loop thread: a read is consumed at once */

	(void)h;
	(void)suggested;
	*buf = uv_buf_init(scratch, sizeof(scratch));
}

static void on_beat_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
	struct child *c = stream->data;
	struct sw_sup *sp = c->sup;

	if (nread < 0) {
		/* EOF: the child closed its end (it is exiting); the exit
		 * callback closes the handle. */
		uv_read_stop(stream);
		return;
	}
	for (ssize_t k = 0; k < nread; k++) {
		char ch = buf->base[k];

		if (ch == '\n') {
			c->line[c->line_len] = '\0';
			c->line_len = 0;
			if (HAS_OP(sp, on_line))
				OPS(sp)->on_line(sp, c->index, c->line, sp->o->user);
			else
				sw_sup_beat(sp, c->index);
		} else if (c->line_len + 1 < sizeof(c->line)) {
			c->line[c->line_len++] = ch;
		}
	}
}

/* --- probes --------------------------------------------------------------- */

static void probe_work(uv_work_t *w)
{
	struct child *c = w->data;
	struct sw_sup *sp = c->sup;

	c->work_err[0] = '\0';
	c->work_rc = OPS(sp)->probe(sp->o->user, c->index, c->probe_pid, c->probe_live,
				    c->work_err, sizeof(c->work_err));
}

static void probe_done(uv_work_t *w, int status)
{
	struct child *c = w->data;

	c->probing = false;
	if (status != 0 || c->sup->closing || c->sup->draining)
		return;
	if (c->probe_gen != c->info.spawns || c->probe_pid != c->info.pid || !has_process(c))
		return; /* an answer about an earlier process */
	snprintf(c->probe_err, sizeof(c->probe_err), "%s", c->work_rc ? c->work_err : "");
	if (c->work_rc != 0)
		return; /* probe_err says why; the start or hang clock decides */
	if (c->probe_live && c->info.state == SW_SUP_RUNNING)
		c->last_beat_ms = sw_now_ms();
	else if (!c->probe_live && c->info.state == SW_SUP_STARTING)
		become_ready(c);
}

static void start_probe(struct child *c, uint64_t now, bool live)
{
	struct sw_sup *sp = c->sup;

	if (c->probing || now - c->last_probe_ms < (live ? sp->live_probe_ms : sp->probe_ms))
		return;
	c->last_probe_ms = now;
	c->probe_live = live;
	c->probe_pid = c->info.pid;
	c->probe_gen = c->info.spawns;
	c->probe_req.data = c;
	if (uv_queue_work(&sp->loop, &c->probe_req, probe_work, probe_done) == 0)
		c->probing = true;
}

/* --- exits and restarts --------------------------------------------------- */

/* Records a crash of c at now; returns the crashes within the window
 * ending now, this one included (at most crash_limit + 1: all the limit
 * test needs). */
static uint32_t record_crash(struct child *c, uint64_t now)
{
	const struct sw_sup_policy *p = &c->sup->pol;
	const uint32_t ring = p->crash_limit + 1;
	uint32_t n = 0, have;

	c->info.crashes++;
	c->crash_ms[c->crash_head % ring] = now;
	c->crash_head++;
	have = c->crash_head < ring ? c->crash_head : ring;
	for (uint32_t k = 0; k < have; k++) {
		uint64_t t = c->crash_ms[(c->crash_head - 1 - k) % ring];

		if (now - t > p->crash_window_ms)
			break;
		n++;
	}
	return n;
}

static void double_backoff(struct child *c)
{
	const struct sw_sup_policy *p = &c->sup->pol;

	c->backoff_ms = c->backoff_ms > p->backoff_max_ms / 2 ? p->backoff_max_ms :
								 c->backoff_ms * 2;
}

static void on_restart_timer(uv_timer_t *t)
{
	struct child *c = t->data;

	if (c->sup->draining || c->sup->closing)
		return;
	if (c->info.state == SW_SUP_BACKOFF || c->info.state == SW_SUP_WAITING)
		try_start(c);
}

static void all_failed_check(struct sw_sup *sp)
{
	if (!sp->o->exit_when_all_failed)
		return;
	for (unsigned i = 0; i < sp->n; i++)
		if (sp->ch[i].info.state != SW_SUP_FAILED)
			return;
	log_error("every %s (%u) has failed; stopping", sp->noun, sp->n);
	sp->all_failed = true;
	close_all(sp);
}

static void mark_failed(struct child *c, int pid)
{
	struct sw_sup *sp = c->sup;

	c->info.state = SW_SUP_FAILED;
	if (pid)
		log_error("%s (pid %d): %s; more than %u crashes within %u ms: marked failed, "
			  "not restarted",
			  c->spec->name, pid, c->info.last_exit, sp->pol.crash_limit,
			  sp->pol.crash_window_ms);
	else
		log_error("%s: marked failed (%s)", c->spec->name, c->info.last_exit);
	write_status(sp);
	all_failed_check(sp);
	kick(sp); /* those waiting behind it go on without it */
}

/* c's process is gone: known says whether we have its exit status (an
 * adopted process's we do not). Decides what comes next. */
static void child_gone(struct child *c, int64_t exit_status, int term_signal, bool known)
{
	struct sw_sup *sp = c->sup;
	const struct sw_sup_policy *p = &sp->pol;
	uint64_t now = sw_now_ms(), ran = now - c->started_ms;
	bool crash = !known || term_signal != 0 || exit_status != 0;
	bool was_starting = c->info.state == SW_SUP_STARTING;
	int pid = c->info.pid;
	char note[64] = "";

	if (!known)
		snprintf(c->info.last_exit, sizeof(c->info.last_exit), "gone");
	else if (term_signal)
		snprintf(c->info.last_exit, sizeof(c->info.last_exit), "signal %d", term_signal);
	else
		snprintf(c->info.last_exit, sizeof(c->info.last_exit), "exit %d", (int)exit_status);
	close_process_handles(c);
	c->info.pid = 0;
	c->info.exited_at_ms = sw_realtime_ms();
	c->line_len = 0;
	if (HAS_OP(sp, on_exit))
		OPS(sp)->on_exit(sp, c->index, pid, sp->o->user);

	if (sp->draining || sp->closing) {
		log_info("%s (pid %d): %s after %" PRIu64 " ms (drain)", c->spec->name, pid,
			 c->info.last_exit, ran);
		c->info.state = SW_SUP_STOPPED;
		write_status(sp);
		maybe_finish(sp);
		return;
	}
	if (c->killed_start) {
		crash = true; /* info.error says why it was killed */
	} else if (was_starting && crash) {
		snprintf(c->info.error, sizeof(c->info.error), "%s during start-up%s%.960s",
			 c->info.last_exit, c->probe_err[0] ? ": " : "", c->probe_err);
	}
	if (!crash && !c->killed_hung && p->exit0_recycles) {
		/* A clean exit right after the start is no recycle (a child
		 * that has nothing to do and says so): wait the minimum
		 * backoff instead of spinning. */
		uint32_t delay = ran < p->quick_exit_ms ? p->backoff_min_ms : 0;

		if (HAS_OP(sp, exit_note))
			OPS(sp)->exit_note(sp->o->user, c->index, note, sizeof(note));
		c->info.recycles++;
		log_info("%s (pid %d): exit 0 after %" PRIu64 " ms%s: recycled, restarting %s",
			 c->spec->name, pid, ran, note,
			 delay ? "after the minimum backoff" : "now");
		c->info.state = SW_SUP_BACKOFF;
		uv_timer_start(&c->restart, on_restart_timer, delay, 0);
		write_status(sp);
		return;
	}

	if (ran >= p->crash_window_ms)
		c->backoff_ms = p->backoff_min_ms; /* it had been healthy */
	if (record_crash(c, now) > p->crash_limit) {
		mark_failed(c, pid);
		return;
	}
	log_warn("%s (pid %d): %s%s after %" PRIu64 " ms; restarting in %u ms", c->spec->name,
		 pid, c->info.last_exit,
		 c->killed_hung ? " (killed: hung)" : c->killed_start ? " (killed: not ready)" :
		 !known ? " (adopted: its exit status is not ours to read)" : "",
		 ran, c->backoff_ms);
	c->info.state = SW_SUP_BACKOFF;
	uv_timer_start(&c->restart, on_restart_timer, c->backoff_ms, 0);
	double_backoff(c);
	write_status(sp);
}

static void on_proc_exit(uv_process_t *proc, int64_t exit_status, int term_signal)
{
	child_gone(proc->data, exit_status, term_signal, true);
}

static void on_watch(uv_poll_t *h, int status, int events)
{
	(void)status;
	(void)events;
	child_gone(h->data, 0, 0, false);
}

/* --- spawning and adopting ------------------------------------------------ */

/* Spawning itself failed (before_spawn, the log file, fd or process
 * limits, a missing executable): a crash, so a persistent failure ends as
 * failed instead of a busy loop. */
static void spawn_failed(struct child *c, int rc, const char *why)
{
	struct sw_sup *sp = c->sup;
	char name[24];

	uv_err_name_r(rc, name, sizeof(name));
	snprintf(c->info.last_exit, sizeof(c->info.last_exit), "spawn: %s", name);
	snprintf(c->info.error, sizeof(c->info.error), "%s", why);
	log_error("%s: cannot spawn %s: %s", c->spec->name, c->spec->file, why);
	c->started_ms = sw_now_ms();
	c->info.exited_at_ms = sw_realtime_ms();
	c->info.state = SW_SUP_BACKOFF;
	if (record_crash(c, sw_now_ms()) > sp->pol.crash_limit) {
		mark_failed(c, 0);
		return;
	}
	uv_timer_start(&c->restart, on_restart_timer, c->backoff_ms, 0);
	double_backoff(c);
	write_status(sp);
}

static void started(struct child *c)
{
	struct sw_sup *sp = c->sup;

	c->started_ms = c->last_beat_ms = sw_now_ms();
	c->last_probe_ms = 0;
	c->killed_hung = c->killed_start = c->beaten = false;
	c->pending_sigs = 0;
	c->line_len = 0;
	c->probe_err[0] = '\0';
	if (HAS_OP(sp, on_start))
		OPS(sp)->on_start(sp, c->index, sp->o->user);
}

static void spawn_child(struct child *c)
{
	struct sw_sup *sp = c->sup;
	const struct sw_sup_child *s = c->spec;
	uv_process_options_t po = { 0 };
	uv_stdio_container_t stdio[4];
	char why[SW_ERR_MAX] = "";
	int rc, logfd = -1;

	if (HAS_OP(sp, before_spawn)) {
		rc = OPS(sp)->before_spawn(sp->o->user, c->index, why, sizeof(why));
		if (rc) {
			spawn_failed(c, rc < 0 ? rc : -EIO, why);
			return;
		}
	}
	if (s->log_path) {
		logfd = open(s->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
		if (logfd < 0) {
			rc = -errno;
			snprintf(why, sizeof(why), "%s: %s", s->log_path, strerror(errno));
			spawn_failed(c, rc, why);
			return;
		}
	}
	stdio[0].flags = UV_IGNORE; /* /dev/null */
	for (int fd = 1; fd <= 2; fd++) {
		stdio[fd].flags = UV_INHERIT_FD;
		stdio[fd].data.fd = logfd >= 0 ? logfd : fd;
	}
	po.stdio_count = 3;
	if (s->beat_pipe) {
		rc = uv_pipe_init(&sp->loop, &c->beat, 0);
		if (rc) {
			if (logfd >= 0)
				close(logfd);
			spawn_failed(c, rc, uv_strerror(rc));
			return;
		}
		c->beat.data = c;
		c->beat_open = true;
		stdio[3].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
		stdio[3].data.stream = (uv_stream_t *)&c->beat;
		po.stdio_count = 4;
	}
	po.file = s->file;
	po.args = (char **)s->argv;
	po.exit_cb = on_proc_exit;
	po.stdio = stdio;
	if (s->detached)
		po.flags |= UV_PROCESS_DETACHED;
	if (s->set_ids) {
		po.flags |= UV_PROCESS_SETUID | UV_PROCESS_SETGID;
		po.uid = s->uid;
		po.gid = s->gid;
	}
	c->proc.data = c;
	rc = uv_spawn(&sp->loop, &c->proc, &po);
	if (logfd >= 0)
		close(logfd);
	if (rc) {
		/* uv_spawn's handle must be closed even on failure */
		close_child_handle(c, (uv_handle_t *)&c->proc);
		if (c->beat_open) {
			close_child_handle(c, (uv_handle_t *)&c->beat);
			c->beat_open = false;
		}
		spawn_failed(c, rc, uv_strerror(rc));
		return;
	}
	c->proc_open = true;
	if (c->ever_ran)
		c->info.restarts++;
	c->ever_ran = true;
	c->info.pid = c->proc.pid;
	c->info.adopted = false;
	c->info.spawns++;
	c->info.started_at_ms = sw_realtime_ms();
	c->info.state = SW_SUP_STARTING;
	started(c);
	if (c->beat_open) {
		rc = uv_read_start((uv_stream_t *)&c->beat, on_beat_alloc, on_beat_read);
		if (rc)
			log_warn("%s: reading its beats: %s (it will never be ready)", s->name,
				 uv_strerror(rc));
	}
	log_info("%s: spawned pid %d (spawn %" PRIu64 ")", s->name, c->info.pid, c->info.spawns);
	if (!s->beat_pipe && !HAS_OP(sp, probe))
		become_ready(c); /* nothing to wait for */
	else
		write_status(sp);
}

/* Watches the running process pid as child c. Returns 0, or -ESRCH when
 * it is gone (then c is to be spawned). */
static int adopt_child(struct child *c, pid_t pid)
{
	struct sw_sup *sp = c->sup;
	int fd = (int)syscall(SYS_pidfd_open, pid, 0);

	if (fd < 0) {
		if (errno == ESRCH || kill(pid, 0) != 0)
			return -ESRCH;
		/* no pidfds (kernel < 5.3): look each tick; pid reuse in
		 * between would go unnoticed */
		log_warn("%s: pidfd_open(%d): %m; checking it every tick instead",
			 c->spec->name, (int)pid);
		c->adopt_poll = true;
	} else if (uv_poll_init(&sp->loop, &c->watch, fd) != 0) {
		close(fd);
		c->adopt_poll = true;
	} else {
		c->pidfd = fd;
		c->watch.data = c;
		c->watch_open = true;
		uv_poll_start(&c->watch, UV_READABLE, on_watch);
	}
	c->ever_ran = true;
	c->info.pid = pid;
	c->info.adopted = true;
	c->info.started_at_ms = 0;
	c->info.state = SW_SUP_RUNNING;
	started(c);
	c->beaten = true; /* the hang clock runs from the adoption */
	log_info("%s: adopted running pid %d", c->spec->name, (int)pid);
	write_status(sp);
	return 0;
}

static void try_start(struct child *c)
{
	struct sw_sup *sp = c->sup;

	if (sp->draining || sp->closing)
		return;
	if (c->n_closing > 0) { /* the last process's handles are still closing */
		uv_timer_start(&c->restart, on_restart_timer, CLOSE_RETRY_MS, 0);
		return;
	}
	if (!may_start(c)) {
		if (c->info.state != SW_SUP_WAITING) {
			c->info.state = SW_SUP_WAITING;
			write_status(sp);
		}
		return;
	}
	spawn_child(c);
}

unsigned sw_sup_signal_started(struct sw_sup *sp, int sig, unsigned *later)
{
	unsigned now = 0, owed = 0;

	if (later)
		*later = 0;
	if (sig < 1 || sig > 64)
		return 0;
	for (unsigned i = 0; i < sp->n; i++) {
		struct child *c = &sp->ch[i];

		if (!has_process(c) || c->killed_hung || c->killed_start)
			continue;
		if (c->info.state == SW_SUP_RUNNING) {
			if (signal_child(c, sig) == 0)
				now++;
		} else if (c->info.state == SW_SUP_STARTING) {
			c->pending_sigs |= UINT64_C(1) << (sig - 1);
			owed++;
		}
	}
	if (later)
		*later = owed;
	return now;
}

unsigned sw_sup_retry_failed(struct sw_sup *sp)
{
	unsigned n = 0;

	for (unsigned i = 0; i < sp->n; i++) {
		struct child *c = &sp->ch[i];

		if (c->info.state != SW_SUP_FAILED)
			continue;
		c->crash_head = 0;
		c->backoff_ms = sp->pol.backoff_min_ms;
		c->info.state = SW_SUP_WAITING;
		n++;
	}
	if (n) {
		write_status(sp);
		kick(sp);
	}
	return n;
}

/* --- timers and signals --------------------------------------------------- */

static void rotate_logs(struct sw_sup *sp)
{
	const struct sw_sup_opts *o = sp->o;

	for (unsigned i = 0; i < sp->n; i++) {
		const char *path = sp->ch[i].spec->log_path;
		int rc;

		/* two children may share a file: the first rotation wins */
		if (!path)
			continue;
		rc = sw_sup_rotate(path, o->log_max_bytes, o->log_keep);
		if (rc < 0)
			log_warn("rotating %s: %s", path, strerror(-rc));
		else if (rc > 0)
			log_info("rotated %s (over %" PRIu64 " bytes)", path, o->log_max_bytes);
	}
	for (size_t k = 0; o->extra_logs && o->extra_logs[k]; k++) {
		int rc = sw_sup_rotate(o->extra_logs[k], o->log_max_bytes, o->log_keep);

		if (rc > 0)
			log_info("rotated %s (over %" PRIu64 " bytes)", o->extra_logs[k],
				 o->log_max_bytes);
	}
}

static void on_tick(uv_timer_t *t)
{
	struct sw_sup *sp = t->data;
	const struct sw_sup_policy *p = &sp->pol;
	uint64_t now = sw_now_ms();
	uint32_t hang;

	if (sp->dirty)
		write_status(sp); /* beats: at most once a tick */
	for (unsigned i = 0; i < sp->n && !sp->closing; i++) {
		struct child *c = &sp->ch[i];

		if (c->adopt_poll && kill(c->info.pid, 0) != 0 && errno == ESRCH) {
			child_gone(c, 0, 0, false);
			continue;
		}
		if (c->info.state == SW_SUP_STARTING && c->proc_open && !c->killed_start) {
			if (HAS_OP(sp, probe))
				start_probe(c, now, false);
			if (c->spec->start_timeout_ms &&
			    now - c->started_ms > c->spec->start_timeout_ms) {
				/* the last probe's answer; none yet when the first
				 * one is still out (a probe that hangs, a slow host) */
				const char *why = c->probe_err;

				if (!why[0] && c->probing)
					why = "its readiness probe has not answered";

				snprintf(c->info.error, sizeof(c->info.error),
					 "not ready within %u ms%s%.960s", c->spec->start_timeout_ms,
					 why[0] ? ": " : "", why);
				log_error("%s (pid %d): %s: killing it", c->spec->name, c->info.pid,
					  c->info.error);
				c->killed_start = true;
				uv_process_kill(&c->proc, SIGKILL);
			}
			continue;
		}
		hang = c->spec->hang_ms ? c->spec->hang_ms : p->hang_ms;
		if (!hang || c->info.state != SW_SUP_RUNNING || !has_process(c) || c->killed_hung ||
		    (!c->spec->beat_pipe && !HAS_OP(sp, probe)))
			continue; /* no limit, or nothing that could beat */
		if (!c->spec->beat_pipe && HAS_OP(sp, probe))
			start_probe(c, now, true);
		/* A stopped (SIGSTOP) child is hung as well: SIGKILL works on it. */
		if (!c->beaten || now - c->last_beat_ms <= hang)
			continue;
		log_error("%s (pid %d): no %s for %" PRIu64 " ms (limit %u)%s%.900s: hung, killing it",
			  c->spec->name, c->info.pid, c->spec->beat_pipe ? "heartbeat" : "answer",
			  now - c->last_beat_ms, hang, c->probe_err[0] ? ", last: " : "",
			  c->probe_err);
		c->killed_hung = true;
		c->info.hangs++;
		signal_child(c, SIGKILL);
	}
	if (sp->o->log_max_bytes && now - sp->last_rotate_ms >= ROTATE_CHECK_MS) {
		sp->last_rotate_ms = now;
		rotate_logs(sp);
	}
}

static void on_drain_deadline(uv_timer_t *t)
{
	struct sw_sup *sp = t->data;

	if (!any_process(sp))
		return;
	log_warn("drain deadline (%u ms) passed: killing the %s still running", sp->pol.drain_ms,
		 sp->nouns);
	sp->killed_all = true;
	kill_all(sp, SIGKILL);
}

static const char *sig_name(int signum)
{
	return signum == SIGTERM ? "SIGTERM" : signum == SIGINT ? "SIGINT" :
	       signum == SIGHUP ? "SIGHUP" : "signal";
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct sw_sup *sp = h->data;

	if (sp->closing)
		return;
	if (signum == SIGHUP) {
		unsigned n = sp->draining ? 0 : sw_sup_retry_failed(sp);

		log_info("SIGHUP: %u failed %s to start again", n, n == 1 ? sp->noun : sp->nouns);
		return;
	}
	if (sp->draining) {
		if (!sp->killed_all) {
			log_warn("%s again: killing the %s now", sig_name(signum), sp->nouns);
			sp->killed_all = true;
			kill_all(sp, SIGKILL);
		}
		return;
	}
	if (sp->o->stop == SW_SUP_STOP_RELEASE) {
		log_info("%s: stopping; the running %s are left running", sig_name(signum),
			 sp->nouns);
		close_all(sp);
		return;
	}
	sp->draining = true;
	log_info("%s: draining %u %s (deadline %u ms)", sig_name(signum), sp->n, sp->nouns,
		 sp->pol.drain_ms);
	for (unsigned i = 0; i < sp->n; i++) {
		struct child *c = &sp->ch[i];

		uv_timer_stop(&c->restart);
		if (!has_process(c) && c->info.state != SW_SUP_FAILED)
			c->info.state = SW_SUP_STOPPED;
	}
	kill_all(sp, SIGTERM);
	uv_timer_start(&sp->drain_timer, on_drain_deadline, sp->pol.drain_ms, 0);
	write_status(sp);
	maybe_finish(sp);
}

/* SIGUSR1 (opts.usr1_reopens): logrotate moved the log files. */
static void on_usr1(uv_signal_t *h, int signum)
{
	struct sw_sup *sp = h->data;
	unsigned now, later;
	int rc;

	(void)signum;
	if (sp->closing)
		return;
	rc = sw_log_reopen();
	now = sw_sup_signal_started(sp, SIGUSR1, &later);
	if (rc)
		log_error("SIGUSR1: cannot reopen the log: %s", sw_strerror(rc));
	else
		log_info("SIGUSR1: log reopened; forwarded to %u %s (%u more once ready)", now,
			 now == 1 ? sp->noun : sp->nouns, later);
}

/* --- the run -------------------------------------------------------------- */

static int check_opts(const struct sw_sup_opts *o, char *err, size_t errlen)
{
	const struct sw_sup_policy *p = &o->policy;

	if (!o->children || o->n_children == 0)
		return sw_seterr(err, errlen, -EINVAL, "nothing to supervise");
	if (p->backoff_min_ms == 0 || p->backoff_min_ms > p->backoff_max_ms)
		return sw_seterr(err, errlen, -EINVAL, "backoff: expected 1 <= min (%u) <= max (%u)",
				 p->backoff_min_ms, p->backoff_max_ms);
	if (p->crash_limit == 0 || p->crash_limit > 100000)
		return sw_seterr(err, errlen, -EINVAL, "crash_limit: expected 1..100000, got %u",
				 p->crash_limit);
	for (unsigned i = 0; i < o->n_children; i++) {
		const struct sw_sup_child *s = &o->children[i];

		if (!s->name || !s->file || !s->argv || !s->argv[0])
			return sw_seterr(err, errlen, -EINVAL,
					 "child %u: name, file and argv are required", i);
	}
	return 0;
}

static int sup_init(struct sw_sup *sp, const struct sw_sup_opts *o, char *err, size_t errlen)
{
	const uint32_t ring = o->policy.crash_limit + 1;
	int rc = check_opts(o, err, errlen);

	if (rc)
		return rc;
	sp->o = o;
	sp->pol = o->policy;
	sp->n = o->n_children;
	sp->noun = o->noun ? o->noun : "child";
	sp->nouns = o->nouns ? o->nouns : "children";
	sp->probe_ms = o->probe_ms ? o->probe_ms : DEFAULT_PROBE_MS;
	sp->live_probe_ms = o->live_probe_ms ? o->live_probe_ms : DEFAULT_LIVE_PROBE_MS;
	sp->tick_ms = 1000;
	for (unsigned i = 0; i <= sp->n; i++) {
		uint32_t hang = i < sp->n ? o->children[i].hang_ms : sp->pol.hang_ms;

		if (hang && hang / 4 < sp->tick_ms)
			sp->tick_ms = hang / 4 ? hang / 4 : 1;
	}
	if (o->ops && o->ops->probe && sp->probe_ms < sp->tick_ms)
		sp->tick_ms = sp->probe_ms;
	sp->ch = calloc(sp->n, sizeof(*sp->ch));
	sp->crash_times = calloc((size_t)sp->n * ring, sizeof(uint64_t));
	if (!sp->ch || !sp->crash_times) {
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
	if (o->hup_retries)
		uv_signal_init(&sp->loop, &sp->sig_hup);
	if (o->usr1_reopens)
		uv_signal_init(&sp->loop, &sp->sig_usr1);
	uv_timer_init(&sp->loop, &sp->tick);
	uv_timer_init(&sp->loop, &sp->drain_timer);
	sp->sig_term.data = sp->sig_int.data = sp->sig_hup.data = sp->sig_usr1.data = sp;
	sp->tick.data = sp->drain_timer.data = sp;
	for (unsigned i = 0; i < sp->n; i++) {
		struct child *c = &sp->ch[i];

		c->sup = sp;
		c->index = i;
		c->spec = &o->children[i];
		c->pidfd = -1;
		c->info.state = SW_SUP_WAITING;
		c->backoff_ms = sp->pol.backoff_min_ms;
		c->crash_ms = sp->crash_times + (size_t)i * ring;
		uv_timer_init(&sp->loop, &c->restart);
		c->restart.data = c;
	}
	return 0;

out_free:
	free(sp->crash_times);
	free(sp->ch);
	sp->crash_times = NULL;
	sp->ch = NULL;
	return rc;
}

int sw_sup_run(const struct sw_sup_opts *o, char *err, size_t errlen)
{
	struct sw_sup sp = { 0 };
	int rc;

	rc = sup_init(&sp, o, err, errlen);
	if (rc)
		return rc;
	uv_signal_start(&sp.sig_term, on_signal, SIGTERM);
	uv_signal_start(&sp.sig_int, on_signal, SIGINT);
	if (o->hup_retries)
		uv_signal_start(&sp.sig_hup, on_signal, SIGHUP);
	if (o->usr1_reopens)
		uv_signal_start(&sp.sig_usr1, on_usr1, SIGUSR1);
	signal(SIGPIPE, SIG_IGN);
	uv_timer_start(&sp.tick, on_tick, sp.tick_ms, sp.tick_ms);

	/* The first start: adopt what runs, then start the rest in order;
	 * one status write at the end instead of one per child. */
	sp.quiet = true;
	for (unsigned i = 0; i < sp.n; i++)
		if (o->children[i].adopt > 0)
			adopt_child(&sp.ch[i], o->children[i].adopt);
	kick(&sp);
	sp.quiet = false;
	write_status(&sp);
	if (!sp.closing)
		uv_run(&sp.loop, UV_RUN_DEFAULT);

	/* The loop only ends once close_all ran. With STOP_DRAIN a process
	 * still watched then (cannot happen, but be safe) is killed and
	 * reaped by libuv's close. */
	if (any_process(&sp)) {
		kill_all(&sp, SIGKILL);
		for (unsigned i = 0; i < sp.n; i++)
			close_process_handles(&sp.ch[i]);
	}
	uv_run(&sp.loop, UV_RUN_DEFAULT);
	rc = uv_loop_close(&sp.loop);
	if (rc)
		log_warn("uv_loop_close: %s", uv_strerror(rc));
	rc = sp.all_failed ? sw_seterr(err, errlen, -EIO, "every %s failed (see the log)", sp.noun)
			   : 0;
	free(sp.crash_times);
	free(sp.ch);
	return rc;
}

/* --- bounded log files ---------------------------------------------------- */

/* Copies from in (from offset *off to its end) to out; returns 0 or a
 * negated errno. */
static int copy_rest(int in, int out, off_t *off)
{
	char buf[16384];

	for (;;) {
		ssize_t n = pread(in, buf, sizeof(buf), *off), w = 0;

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return 0;
		while (w < n) {
			ssize_t k = write(out, buf + w, (size_t)(n - w));

			if (k < 0) {
				if (errno == EINTR)
					continue;
				return -errno;
			}
			w += k;
		}
		*off += n;
	}
}

int sw_sup_rotate(const char *path, uint64_t max_bytes, unsigned keep)
{
	char from[PATH_MAX + 16], to[PATH_MAX + 16];
	struct stat st;
	off_t off = 0;
	int in, out, rc = 0;

	if (stat(path, &st) != 0)
		return errno == ENOENT ? 0 : -errno;
	if ((uint64_t)st.st_size <= max_bytes)
		return 0;
	in = open(path, O_RDWR | O_CLOEXEC);
	if (in < 0)
		return -errno;
	if (keep > 0) {
		for (unsigned k = keep; k > 1; k--) {
			snprintf(from, sizeof(from), "%s.%u", path, k - 1);
			snprintf(to, sizeof(to), "%s.%u", path, k);
			if (rename(from, to) != 0 && errno != ENOENT) {
				rc = -errno;
				goto out_close;
			}
		}
		snprintf(from, sizeof(from), "%s.1.tmp", path);
		snprintf(to, sizeof(to), "%s.1", path);
		out = open(from, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, st.st_mode & 0777);
		if (out < 0) {
			rc = -errno;
			goto out_close;
		}
		/* again while the writer keeps appending: the window for a
		 * lost line is the last pass's, not the whole copy's */
		for (int pass = 0; pass < 4 && !rc; pass++) {
			off_t before = off;

			rc = copy_rest(in, out, &off);
			if (off == before)
				break;
		}
		if (close(out) != 0 && !rc)
			rc = -errno;
		if (!rc && rename(from, to) != 0)
			rc = -errno;
		if (rc) {
			unlink(from);
			goto out_close;
		}
	}
	if (ftruncate(in, 0) != 0)
		rc = -errno;
out_close:
	close(in);
	return rc ? rc : 1;
}
