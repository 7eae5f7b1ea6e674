/* daemon_signal.c - signals and shutdown of `gpud serve`, on the loop
 * thread: SIGTERM/SIGINT drain (the server refuses new requests, a timer
 * closes everything once none is in flight, a deadline cancels what is
 * left), a second one cancels at once, SIGUSR1 reopens the log; a failed
 * device drains the same way (gpud__check_failures); and the timer that
 * samples the server's slot pools for the watchdog and looks for failed
 * devices.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <uv.h>

#include "common/err.h"
#include "common/log.h"
#include "gpud/daemon_impl.h"
#include "gpud/memwatch.h"
#include "gpud/metrics.h"
#include "gpud/server.h"

static void on_close_noop(uv_handle_t *h)
{
	(void)h;
}

void gpud__finish(struct gpud_daemon *d)
{
	if (d->finishing)
		return;
	d->finishing = true;
	if (d->server)
		gpud_server_close(d->server);
	if (d->handles_ok) {
		uv_timer_stop(&d->poll_timer);
		uv_timer_stop(&d->deadline_timer);
		uv_timer_stop(&d->sample_timer);
		uv_close((uv_handle_t *)&d->sample_timer, on_close_noop);
		uv_close((uv_handle_t *)&d->sig_term, on_close_noop);
		uv_close((uv_handle_t *)&d->sig_int, on_close_noop);
		uv_close((uv_handle_t *)&d->sig_usr1, on_close_noop);
		uv_close((uv_handle_t *)&d->poll_timer, on_close_noop);
		uv_close((uv_handle_t *)&d->deadline_timer, on_close_noop);
	}
	if (d->metrics)
		gpud_metrics_close(d->metrics);
}

/* The server's slot pools feed the watchdog like the devices' pools do:
 * a request or connection slot that never comes back shows as a rising
 * trough. */
void gpud__on_sample(uv_timer_t *t)
{
	struct gpud_daemon *d = t->data;
	struct gpud_server_stats ss;
	uint64_t now = now_ms();

	gpud__check_failures(d);

	gpud_server_stats(d->server, &ss);
	pthread_mutex_lock(&d->watch_lock);
	gpud_memwatch_sample(d->watch, d->wd_req, now, ss.in_flight);
	gpud_memwatch_sample(d->watch, d->wd_conn, now, ss.connections);
	pthread_mutex_unlock(&d->watch_lock);
}

static void on_poll(uv_timer_t *t)
{
	struct gpud_daemon *d = t->data;

	if (gpud_server_in_flight(d->server) == 0) {
		log_info("no request in flight: closing the server");
		gpud__finish(d);
	}
}

static void on_deadline(uv_timer_t *t)
{
	struct gpud_daemon *d = t->data;
	uint32_t n = gpud_server_in_flight(d->server);

	if (n) {
		log_warn("shutdown deadline (%u ms) passed: cancelling %u requests",
			 d->cfg.gpud.shutdown_deadline_ms, n);
		gpud_server_cancel_all(d->server);
	}
}

static const char *sig_name(int signum)
{
	return signum == SIGTERM ? "SIGTERM" : signum == SIGINT ? "SIGINT" : "signal";
}

void gpud__on_signal(uv_signal_t *h, int signum)
{
	struct gpud_daemon *d = h->data;

	if (signum == SIGUSR1) {
		int rc = sw_log_reopen();
		if (rc)
			log_error("SIGUSR1: cannot reopen the log: %s", sw_strerror(rc));
		else
			log_info("SIGUSR1: log reopened");
		return;
	}
	if (atomic_load(&d->draining)) {
		log_warn("%s again: cancelling the %u requests in flight", sig_name(signum),
			 gpud_server_in_flight(d->server));
		gpud_server_cancel_all(d->server);
		return;
	}
	gpud__drain(d, sig_name(signum));
}

void gpud__drain(struct gpud_daemon *d, const char *why)
{
	if (atomic_load(&d->draining))
		return;
	atomic_store(&d->draining, true);
	log_info("%s: draining (%u requests in flight, deadline %u ms)", why,
		 gpud_server_in_flight(d->server), d->cfg.gpud.shutdown_deadline_ms);
	gpud_server_drain(d->server);
	uv_timer_start(&d->deadline_timer, on_deadline, d->cfg.gpud.shutdown_deadline_ms, 0);
	uv_timer_start(&d->poll_timer, on_poll, 0, POLL_MS);
}
