/* server_impl.h - private to the files of gpud's server (gpud/server.h is
 * the contract):
 *
 *   server.c        create, listen, drain, close, destroy, stats
 *   server_work.c   the loop's work list, request slot release, the
 *                   loop's wake-ups (async and staging timer)
 *   server_ring.c   ring writes (replies, staging flushes) and the
 *                   replies the loop makes itself (error records, frames)
 *   server_conn.c   connection life cycle: accept, read, close, reap
 *   server_frame.c  frame handling: HELLO, SUBMIT, EMBED, CANCEL,
 *                   TOKENIZE, STATS, MEM
 *   server_sreq.c   the request handle the service replies through
 *
 * Threads. The loop thread owns the libuv handles and everything marked
 * "loop" below. Device threads call gpud_sreq_*; they touch only what the
 * connection lock guards, then ask the loop for work (a doorbell to send, a
 * connection to reap or close, the staging timer) through the pend list
 * and one uv_async.
 *
 * Locks, in the only order they are ever nested:
 *   1. sconn.lock     one connection: its ring (production), request list,
 *                     staging, error queue, doorbell and state flags
 *   2. slot_lock      the pool of request slots
 *   3. pend_lock      the loop's work list, timer request, backlog count,
 *                     and the right to uv_async_send (cleared at close)
 *   4. stat_lock      counters
 * No service op is called with any lock held: ops.cancel takes the
 * scheduler's lock, whose callbacks call gpud_sreq_*, which take sconn.lock.
 * Functions named *_locked below expect the connection's lock held.
 *
 * Slot lifetime. A request slot belongs to its connection from acceptance
 * until it has ended (gpud_sreq_done/...), its records are in the ring or
 * dropped, and no ops.cancel call is running on it (cancel_pending). Slots
 * are reused only by the loop thread, so a slot the loop is cancelling
 * stays valid for that call even when the service ends it meanwhile. A
 * connection slot is reused only when its handle is closed and it holds no
 * request slot; its mutex lives as long as the server.
 */
#ifndef GPUD_SERVER_IMPL_H
#define GPUD_SERVER_IMPL_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <uv.h>

#include "common/pool.h"
#include "gpud/server.h"
#include "proto/frame.h"
#include "proto/msg.h"
#include "proto/shm.h"

#define RBUF_FRAMES 32 /* frames one read can take */
#define ERRQ_LEN 8     /* loop-made errors waiting for ring room, per connection */
#define ERR_REC_MAX (8 + PROTO_MAX_ERROR_MSG) /* largest ERROR payload */
#define FIN_MAX ERR_REC_MAX                   /* DONE (48) or ERROR */
#define TIMER_MS 2                            /* staging retry period */
#define PEER_GROUPS_MAX 1024 /* supplementary groups of a peer we look at */

static_assert(FIN_MAX >= PROTO_DONE_SIZE, "a DONE fits the final record");

enum conn_state {
	CONN_FREE = 0, /* slot unused */
	CONN_OPEN,     /* accepted, serving */
	CONN_CLOSING,  /* uv_close called */
	CONN_CLOSED,   /* handle closed; waiting for its request slots */
};

struct errrec {
	uint64_t id;
	uint32_t len;
	uint8_t buf[ERR_REC_MAX];
};

struct sconn {
	uv_pipe_t pipe; /* ipc mode: received descriptors become visible */
	uv_write_t wreq;
	struct gpud_server *s;
	uint32_t idx;
	/* loop */
	enum conn_state state;
	bool hello;
	bool wbusy;        /* wreq in flight */
	bool close_after;  /* close once wreq completes */
	bool db_deferred;  /* a doorbell waits for wreq */
	uint16_t dd_type;
	uint64_t dd_id;
	uint32_t bad_frames;
	size_t rlen;
	uint8_t rbuf[RBUF_FRAMES * PROTO_FRAME_SIZE];
	uint8_t wbuf[PROTO_FRAME_SIZE];
	uid_t uid;
	gid_t gid;
	pid_t pid;
	uint64_t serial;
	/* handle storage: a region and its ring cost no malloc */
	_Alignas(16) uint8_t shm_store[PROTO_SHM_STORAGE];
	_Alignas(16) uint8_t ring_store[PROTO_RING_STORAGE];
	/* under lock */
	pthread_mutex_t lock;
	bool open;          /* replies accepted */
	bool handle_closed; /* state == CONN_CLOSED, for other threads */
	bool broken;        /* ring corrupt: the loop closes it */
	struct proto_shm *shm;
	struct proto_ring *ring; /* producer */
	struct proto_shm_layout lay;
	uint8_t *base;
	struct gpud_sreq *reqs; /* slots of this connection */
	uint32_t n_active;      /* accepted, not ended */
	uint32_t n_slots;
	bool db_pending;
	uint16_t db_type;
	uint64_t db_id;
	struct errrec errq[ERRQ_LEN];
	uint32_t errq_head, errq_len;
	/* under pend_lock */
	bool queued;
};

struct gpud_sreq {
	struct sconn *c;
	struct gpud_sreq *prev, *next;
	uint32_t idx;
	uint64_t client_id;
	uint64_t conn_serial;
	pid_t pid;
	/* under c->lock */
	bool active;         /* accepted, not ended */
	bool cancelled;      /* ops.cancel called or being called */
	bool cancel_pending; /* ops.cancel running: slot pinned */
	bool backlogged;     /* counted in s->backlog */
	bool fin_pending;    /* a final record waits for ring room */
	bool fin_in_stage;   /* that record is an embedding in stage */
	uint16_t fin_type;
	uint32_t fin_len;
	uint64_t fin_since_ns;
	size_t stage_len;    /* staged token batches, encoded back to back */
	bool stage_lp;       /* they are TOKENS_LP payloads (flushed one a record) */
	uint8_t *stage;      /* (stage_bytes) */
	void *priv;          /* (priv_bytes) or NULL */
	uint8_t fin[FIN_MAX];
	struct proto_submit sub; /* decode storage (loop) */
};

struct gpud_server {
	uv_loop_t *loop;
	struct gpud_server_params p;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct gpud_service_ops ops;
	void *svc;
	/* loop */
	uv_pipe_t listener;
	uv_pipe_t refuse; /* accepts and closes a connection over the limit */
	uv_async_t async;
	uv_timer_t timer;
	uv_poll_t widen;  /* see reserve_watchers (server.c) */
	int handles;      /* handles of ours not yet closed */
	bool bound, listening, closed, draining;
	bool refuse_busy, accept_pending;
	gid_t sock_gid;     /* the socket file's group, set at listen */
	bool group_rw;      /* socket_mode gives that group rw: it is admitted */
	uint64_t refuse_log_ns;   /* last refused-peer log line */
	uint64_t refuse_unlogged; /* refused since, not logged */
	gid_t peer_groups[PEER_GROUPS_MAX]; /* SO_PEERGROUPS scratch (loop) */
	uint32_t next_conn; /* where the free-slot search starts */
	uint64_t next_serial;
	struct sconn *conns;          /* (max_connections) */
	struct gpud_sreq **scratch;   /* (max_requests): cancel batches */
	uint32_t *work;               /* (max_connections): pend list copy */
	uint8_t *reply;               /* (reply_cap): sync replies */
	size_t reply_cap;
	size_t ring_max;              /* largest record payload in a ring */
	size_t stage_cap;             /* token staging bound per request */
	/* request slots */
	uint8_t *slot_mem;
	size_t slot_size;
	pthread_mutex_t slot_lock;
	struct sw_pool *slots;
	atomic_uint in_flight;
	/* under pend_lock */
	pthread_mutex_t pend_lock;
	uint32_t *pend; /* (max_connections) */
	uint32_t n_pend;
	uint64_t backlog; /* staged/pending items in all */
	bool timer_wanted, timer_on;
	bool async_live;
	/* under stat_lock */
	pthread_mutex_t stat_lock;
	struct gpud_server_stats st;
};

#define STAT(s, stmt)                              \
	do {                                       \
		pthread_mutex_lock(&(s)->stat_lock);   \
		stmt;                              \
		pthread_mutex_unlock(&(s)->stat_lock); \
	} while (0)

static inline struct gpud_sreq *gpud__slot_at(struct gpud_server *s, uint32_t i)
{
	return (struct gpud_sreq *)(s->slot_mem + (size_t)i * s->slot_size);
}

/* --- server_work.c: the loop's work list and request slots ---------------- */

void gpud__queue_conn(struct sconn *c);
/* Counts d items waiting for ring room (staged, pending, queued errors);
 * the first one starts the staging timer. Any thread. */
void gpud__backlog_add(struct gpud_server *s, int d);
void gpud__doorbell_locked(struct sconn *c, uint16_t type, uint64_t id);
void gpud__update_backlog_locked(struct gpud_sreq *r);
void gpud__maybe_release_locked(struct gpud_sreq *r);
void gpud__end_active_locked(struct gpud_sreq *r);
/* The uv_async callback: doorbells, broken rings, reaps the pend list
 * asked for; starts the staging timer. */
void gpud__on_async(uv_async_t *h);

/* --- server_ring.c: ring writes and loop-made replies (c->lock held for
 * the *_locked ones) -------------------------------------------------------- */

int gpud__ring_fail_locked(struct sconn *c, int rc);
int gpud__ring_push_locked(struct sconn *c, uint16_t type, uint64_t id, const void *p,
			   size_t len);
int gpud__flush_req_locked(struct sconn *c, struct gpud_sreq *r);
uint32_t gpud__flush_conn_locked(struct sconn *c, uint64_t now_ns);
void gpud__conn_error(struct sconn *c, uint64_t id, int code, const char *msg);
/* Sends one frame on the socket (loop). A frame that cannot go out at
 * once waits in wbuf (one write in flight per connection; doorbells that
 * come meanwhile are coalesced into one). close_after: close c once the
 * frame is out. Returns 0 or a libuv error. */
int gpud__send_frame(struct sconn *c, const struct proto_frame *f, bool close_after);
void gpud__send_doorbell(struct sconn *c, uint16_t type, uint64_t id);

/* --- server_conn.c: connection life cycle (loop) ---------------------------- */

void gpud__cancel_batch(struct gpud_server *s, struct gpud_sreq **reqs, uint32_t n);
void gpud__collect_cancels_locked(struct sconn *c, uint32_t *n);
/* Returns a closed connection with no request slot left to the free
 * slots: the region is unmapped. */
void gpud__reap_conn(struct sconn *c);
void gpud__close_conn(struct sconn *c, const char *why);
/* Accepts one connection from the listener into a free slot, or refuses
 * it when max_connections are open. */
void gpud__accept_one(struct gpud_server *s);
/* The listener's callback. */
void gpud__on_connection(uv_stream_t *server, int status);

/* --- server_frame.c: frame handling (loop) ---------------------------------- */

/* Handles one received frame (PROTO_FRAME_SIZE bytes at raw). */
void gpud__handle_frame(struct sconn *c, const uint8_t *raw);

#endif
