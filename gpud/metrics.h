/* metrics.h - the optional Prometheus endpoint (off by default).
 *
 * A minimal HTTP/1.0 responder on the server's libuv loop: it reads one
 * request head (at most GPUD_METRICS_HEAD_MAX bytes, else 431), answers
 * "GET /metrics" with 200 and the text the render callback writes
 * (Content-Type: text/plain; version=0.0.4), anything else with 404, a
 * request line it cannot parse with 400, then closes the connection.
 *
 * It listens only on 127.0.0.1 or a unix socket: the endpoint is not
 * authenticated. At most GPUD_METRICS_MAX_CONNS connections are served at
 * once; more are accepted and closed at once. A connection idle for the
 * idle timeout (default GPUD_METRICS_IDLE_MS) is closed.
 *
 * All memory (connection slots, request buffers, one response body
 * buffer of GPUD_METRICS_BODY_MAX bytes) is reserved by
 * gpud_metrics_create; serving a request allocates nothing. Concurrent
 * requests share one rendered body: a request that arrives while an
 * earlier response is still being written gets that same rendering.
 *
 * Threading: everything runs on the loop's thread. Create may be called
 * before the loop runs, from the thread that will run it.
 */
#ifndef GPUD_METRICS_H
#define GPUD_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include <uv.h>

#define GPUD_METRICS_MAX_CONNS 16
#define GPUD_METRICS_HEAD_MAX 8192
#define GPUD_METRICS_BODY_MAX (256 * 1024) /* > the largest gpud_stats_prometheus output */
#define GPUD_METRICS_IDLE_MS 5000

struct gpud_metrics;

/* Writes the body into buf (cap bytes), sets *len; returns 0 or a
 * negative code (the client then gets 500). Runs on the loop thread. */
typedef int (*gpud_metrics_render_fn)(void *arg, char *buf, size_t cap, size_t *len);

/* Listens on listen_addr: "127.0.0.1:PORT" (PORT 0 picks a free port; see
 * gpud_metrics_port) or "unix:/path" (a stale socket file nobody listens
 * on is replaced; the file gets mode 0660 and is removed on close).
 * Other addresses are refused with -EINVAL: the endpoint is
 * unauthenticated. On success *out owns the reserved memory and the
 * listening handle. On error returns a negative code (-EINVAL, -ENOMEM,
 * a negated errno from socket/bind/listen), writes a message into err and
 * sets *out to NULL; nothing is left registered on the loop. */
int gpud_metrics_create(struct gpud_metrics **out, uv_loop_t *loop, const char *listen_addr,
			gpud_metrics_render_fn render, void *arg, char *err, size_t errlen);

/* The bound TCP port (useful after binding port 0); 0 for unix sockets. */
int gpud_metrics_port(const struct gpud_metrics *m);

/* Idle timeout per connection (ms, > 0); affects connections accepted
 * afterwards. Loop thread. */
void gpud_metrics_set_idle_timeout(struct gpud_metrics *m, unsigned ms);

/* Requests served by status so far (200, 404, 400, 431, 500) and
 * connections refused for lack of a slot. */
struct gpud_metrics_counts {
	unsigned long ok, not_found, bad_request, too_large, failed, refused;
};
void gpud_metrics_counts(const struct gpud_metrics *m, struct gpud_metrics_counts *c);

/* Starts closing the listener and every connection (loop thread;
 * idempotent). The handles finish closing while the loop runs; then
 * gpud_metrics_closed() is true and uv_run stops counting them. */
void gpud_metrics_close(struct gpud_metrics *m);
bool gpud_metrics_closed(const struct gpud_metrics *m);

/* Frees m. Call after gpud_metrics_close once the loop has run the close
 * callbacks (gpud_metrics_closed true, e.g. after uv_run returned). If
 * handles are still open the memory is deliberately left allocated
 * (the loop still points into it) - a bug in the caller, never a crash.
 * NULL is fine. */
void gpud_metrics_destroy(struct gpud_metrics *m);

#endif
