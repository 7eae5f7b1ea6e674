/* server.h - gpud's front end: the Unix socket, the per-connection shared
 * region and response ring, frame decoding and dispatch (DESIGN §4,
 * proto/README.md). The server knows nothing of models or schedulers: it
 * hands decoded requests to a *service* (struct gpud_service_ops: the
 * daemon in production, a fake in unit tests) and carries the service's
 * replies back to the client.
 *
 * Threads. Everything here runs on one libuv loop thread (the daemon's
 * loop), except the reply functions gpud_sreq_*, which the service calls
 * from any thread (the device workers). A reply is written into the
 * connection's ring under the connection's lock; the loop thread is woken
 * (uv_async) to send the doorbell frames, coalesced: one doorbell per
 * connection per wake-up at most.
 *
 * Memory. Everything is reserved at gpud_server_create: max_connections
 * connection slots (libuv handles, receive buffers, write requests), and
 * max_requests request slots (struct gpud_sreq), each with the storage to
 * decode a SUBMIT (struct proto_submit), a staging buffer of stage_bytes
 * and priv_bytes for the service. A connection's HELLO creates its memfd
 * region (memfd_create + ftruncate + mmap: system calls; the region and
 * ring handles live in the connection slot). Accepting, serving and
 * closing connections, frames, requests and replies allocate nothing
 * (server_test counts it; libuv allocates only for a client that sends
 * descriptors, which is then closed).
 *
 * The process must ignore SIGPIPE (libuv writes doorbells with write(2)).
 *
 * Backpressure, never unbounded queues:
 *  - a SUBMIT or EMBED beyond max_per_connection requests in flight on its
 *    connection, or beyond max_requests in all, is answered at once with
 *    ERROR SW_EBUSY ("busy: N requests in flight on this connection (limit
 *    M)") and costs nothing else;
 *  - a reply the ring cannot take now (the client is slow) goes into the
 *    request's staging buffer (token batches coalesce there) and is
 *    flushed as soon as the ring has room (checked on every reply and by a
 *    timer while anything is staged). When staging is full too, the reply
 *    function returns SW_EBUSY: the service ends the request, and its
 *    final ERROR ("client is not reading its ring") is kept aside (every
 *    slot has room for one final record) and delivered when the client
 *    reads again, or dropped with the connection;
 *  - a request whose final record has waited stall_ms is abandoned and
 *    the connection is closed (a client that never reads);
 *  - errors the server makes itself (limits, decoders, bad frames) wait in
 *    a small queue per connection (8) while the ring is full; a client
 *    that lets that fill is closed. A TOKENIZE/STATS/MEM reply that does
 *    not fit the ring now is answered ERROR SW_EBUSY instead.
 *
 * Errors on the wire: a frame that fails proto_frame_decode is answered
 * with an ERROR for its request id (SW_EFORMAT / SW_EUNSUPPORTED, message
 * naming the field) and counted; after max_bad_frames of them the
 * connection is closed. A payload that fails its decoder, or a request id
 * already in flight on the connection, gets an ERROR for that request
 * only. A version mismatch at HELLO gets ERROR aux = SW_EVERSION and the
 * connection is closed. Frames before HELLO, or descriptors sent by a
 * client, close the connection (descriptors are closed first).
 *
 * A closed connection (EOF, error, or closed by the server) cancels every
 * request it has in flight through ops.cancel at once; their slots return
 * to the pool when the service ends them. The service must end a cancelled
 * request promptly (the scheduler frees its KV blocks right away).
 */
#ifndef GPUD_SERVER_H
#define GPUD_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/msg.h"

struct uv_loop_s;
struct gpud_server;
struct gpud_sreq; /* one request in flight: a slot of the server's pool */

#define GPUD_SERVER_MAX_IDS 64 /* allowed_uids, allowed_gids */

struct gpud_server_params {
	const char *socket_path;     /* required; copied */
	uint32_t max_connections;    /* default 512 (>= 256 always supported) */
	uint32_t max_requests;       /* SUBMIT + EMBED in flight in all; default 1024 */
	uint32_t max_per_connection; /* default 64 */
	size_t ring_bytes;           /* response ring data bytes per connection,
				      * a power of two; default 8 MiB */
	size_t req_bytes;            /* request area per connection; default 4 MiB */
	size_t stage_bytes;          /* per request slot; default 64 KiB */
	size_t priv_bytes;           /* per request slot, for the service
				      * (gpud_sreq_priv), 16-byte aligned; default 0 */
	uint32_t stall_ms;           /* default 10000 */
	uint32_t max_bad_frames;     /* default 16 */
	struct proto_limits limits;  /* decoder limits (0 fields = defaults) */
	/* Who may connect (DESIGN §6a). The socket file is created with
	 * socket_mode (0: 0660) and group socket_gid ((gid_t)-1: the
	 * server's egid, even in a set-group-ID directory) before it
	 * listens. SO_PEERCRED then admits: root
	 * (it can read any process's memory anyway), the server's own euid
	 * (read at accept: the same holds for it), the socket's group when
	 * socket_mode gives the group rw (the admission matches what the
	 * file grants), a uid in allowed_uids, and a peer whose gid or one
	 * of whose supplementary groups (SO_PEERGROUPS) is in allowed_gids.
	 * Anyone else gets an ERROR frame (aux = EACCES, no payload) and the
	 * connection is closed: counted in refused_peer, logged at warn (at
	 * most a line a second, with how many went unlogged). */
	uint32_t socket_mode;
	gid_t socket_gid;
	uint32_t n_allowed_uids, n_allowed_gids;
	uint32_t allowed_uids[GPUD_SERVER_MAX_IDS];
	uint32_t allowed_gids[GPUD_SERVER_MAX_IDS];
};

void gpud_server_params_default(struct gpud_server_params *p);

/* Called on the loop thread. Every function that accepts a request (returns
 * 0) takes on the duty to end it exactly once with gpud_sreq_done,
 * gpud_sreq_embedding or gpud_sreq_error, from any thread, even after a
 * cancel. A refusal (negative return) ends it at once: the server sends
 * ERROR with that code and err's message. Views in the decoded request
 * (segment text, tokenize/embed text) are valid only during the call:
 * the service copies or tokenizes them before returning. */
struct gpud_service_ops {
	int (*submit)(void *svc, struct gpud_sreq *r, const struct proto_submit *req,
		      char *err, size_t errlen);
	int (*embed)(void *svc, struct gpud_sreq *r, const struct proto_text_req *req,
		     char *err, size_t errlen);
	/* Client CANCEL, its connection closed, or gpud_server_cancel_all.
	 * Called at most once per request, never for one that had ended
	 * when the server decided to cancel it; but the service may end it
	 * on another thread while this call runs (the call is made with no
	 * lock held). The slot, and its priv area, stay valid and are not
	 * reused until cancel returns, so the service can check its own
	 * state there. */
	void (*cancel)(void *svc, struct gpud_sreq *r);
	/* Synchronous (quick) requests: the service writes the reply into
	 * caller buffers. tokenize writes at most cap ids and sets *n (return
	 * SW_ETOOLONG when more would be needed). stats and mem write JSON
	 * (not NUL-terminated) into buf and set *len; SW_ETOOLONG when cap is
	 * too small. */
	int (*tokenize)(void *svc, const struct proto_text_req *req, int32_t *ids, uint32_t cap,
			uint32_t *n, char *err, size_t errlen);
	/* detokenize writes the text of req's ids (a view: read each once)
	 * into buf (cap bytes) and sets *len; SW_ETOOLONG when cap is too
	 * small. */
	int (*detokenize)(void *svc, const struct proto_text_req *req, char *buf, size_t cap,
			  size_t *len, char *err, size_t errlen);
	int (*stats)(void *svc, char *buf, size_t cap, size_t *len, char *err, size_t errlen);
	int (*mem)(void *svc, uint32_t flags, char *buf, size_t cap, size_t *len,
		   char *err, size_t errlen);
};

/* Reserves everything (see Memory) on loop (borrowed; the server's handles
 * live on it). Does not listen yet. Returns 0 and *out, or -EINVAL /
 * -ENOMEM with a message; *out NULL on error. */
int gpud_server_create(struct gpud_server **out, struct uv_loop_s *loop,
		       const struct gpud_server_params *p, const struct gpud_service_ops *ops,
		       void *svc, char *err, size_t errlen);

/* Binds and listens. The socket file has its final mode and group before
 * anything can connect: it is bound under a umask that leaves exactly
 * socket_mode, given to socket_gid (lchown), checked (a socket, ours,
 * that mode, that group), and only then listened on. A stale socket file
 * (nothing accepts on it) is replaced; a live one is -EADDRINUSE
 * ("another gpud is listening on PATH"); a group the server may not give
 * the file is -EPERM naming it. Returns 0 or a negated errno with a
 * message (the file is removed again). */
int gpud_server_listen(struct gpud_server *s, char *err, size_t errlen);

/* Draining (SIGTERM): new SUBMIT and EMBED requests are refused with
 * SW_ECLOSED ("gpud is shutting down"); requests in flight go on;
 * TOKENIZE, DETOKENIZE, STATS and MEM are still served. Idempotent. */
void gpud_server_drain(struct gpud_server *s);

/* Cancels every request in flight (ops.cancel on each not yet ended). */
void gpud_server_cancel_all(struct gpud_server *s);

/* Requests accepted and not yet ended. Any thread. */
uint32_t gpud_server_in_flight(const struct gpud_server *s);

/* Stops listening, removes the socket file (when this server bound it),
 * closes every connection (cancelling their requests), and closes the
 * server's handles; after the loop has run them closed (uv_run until no
 * more handles of the server), gpud_server_destroy frees everything. The
 * service must have ended every request by then and stopped its threads:
 * gpud_server_in_flight() reaches 0 inside the last gpud_sreq_* call that
 * ends a request, before that call releases the request's slot, so 0
 * alone does not say that no thread is still in the server. destroy
 * without close (a failed start) closes and runs the loop
 * (UV_RUN_NOWAIT) until the server's handles are closed. */
void gpud_server_close(struct gpud_server *s);
void gpud_server_destroy(struct gpud_server *s); /* accepts NULL */

struct gpud_server_stats {
	uint32_t connections;     /* open now */
	uint32_t connections_high;
	uint64_t accepted;        /* connections accepted */
	uint64_t refused_peer;    /* refused by the SO_PEERCRED check */
	uint64_t refused_conns;   /* closed because max_connections were open */
	uint32_t in_flight;       /* requests accepted, not ended */
	uint32_t in_flight_high;
	uint64_t requests;        /* SUBMIT + EMBED accepted by the service */
	uint64_t busy;            /* refused with SW_EBUSY by the limits */
	uint64_t refused;         /* refused by the service or the decoders */
	uint64_t bad_frames;
	uint64_t frames_in, doorbells_out;
	uint64_t staged;          /* replies that went through staging */
	uint64_t stalled;         /* requests abandoned: client never read */
	size_t stage_high;        /* most staging bytes one request used */
};
void gpud_server_stats(const struct gpud_server *s, struct gpud_server_stats *st);

/* --- the request handle, for the service --------------------------------- */

uint64_t gpud_sreq_client_id(const struct gpud_sreq *r); /* the client's request id */
uint64_t gpud_sreq_conn_id(const struct gpud_sreq *r);   /* connection serial, from 1 */
pid_t gpud_sreq_peer_pid(const struct gpud_sreq *r);
/* priv_bytes of per-request service storage (zeroed when the request is
 * accepted); NULL when priv_bytes is 0. */
void *gpud_sreq_priv(struct gpud_sreq *r);

/* Any thread. Streams a token batch (ids and the text they released).
 * Returns 0; SW_ECLOSED when the connection is gone, SW_EBUSY when the
 * client has stopped reading (ring and staging full): in both cases the
 * service should end the request (the batch is dropped). Also SW_ETOOLONG
 * for a batch larger than one ring record (ring_bytes / 2 - 16) and
 * -EINVAL for NULL data with a nonzero count: the batch is dropped, the
 * request goes on. */
int gpud_sreq_tokens(struct gpud_sreq *r, const int32_t *ids, uint32_t n_ids,
		     const char *text, size_t len);
/* The same for one token with log probabilities, as a TOKENS_LP record
 * (proto_tokens_lp_encode's arrays: the token's entry and n_top
 * alternatives'; lp_flags PROTO_LP_*: the end of generation that ends the
 * request, or a prompt token). Staged records of a request are written
 * one a record. */
int gpud_sreq_tokens_lp(struct gpud_sreq *r, uint32_t n_top, const int32_t *ids,
			const float *lps, const uint16_t *plen, const char *pieces,
			uint32_t pieces_len, const char *text, size_t len, uint32_t lp_flags);

/* Any thread. End the request: DONE with usage, EMBED_REPLY, or ERROR
 * (code negative, msg may be NULL). Exactly one of them per accepted
 * request; r must not be touched afterwards. Never fails (a final record
 * that cannot be written now waits in the slot; one for a closed
 * connection is dropped). */
void gpud_sreq_done(struct gpud_sreq *r, const struct proto_done *usage);
void gpud_sreq_embedding(struct gpud_sreq *r, const float *v, uint32_t dim);
void gpud_sreq_error(struct gpud_sreq *r, int code, const char *msg);

#endif
