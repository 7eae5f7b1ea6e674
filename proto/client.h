/* client.h - the gpud client library (DESIGN §4; wire format in
 * proto/README.md). agentd, swarmctl, the load tool and the tests talk to
 * gpud through this and nothing else.
 *
 * A connection is a Unix stream socket plus the shared-memory region gpud
 * passes at HELLO. One background reader thread per connection waits on
 * the socket for doorbell frames, drains the response ring and dispatches
 * each record to the request it belongs to (by request id). Requests are
 * written into the region's request area; the library keeps a small table
 * of the spans in use and frees a span at the first reply record for its
 * request (the protocol's lending rule). When the area has no room for a
 * new request, the caller waits until earlier requests free theirs (or the
 * connection's timeout passes: SW_EBUSY).
 *
 * Thread safety: every function may be called from any thread, concurrently,
 * on the same connection (one mutex guards the socket's send side, the area
 * table and the request table). Callbacks run on the reader thread, one at
 * a time, in the order the records arrive; they must not call
 * proto_client_close on their own connection, and should be quick (they
 * hold up every other request of the connection). They may call
 * proto_client_cancel and proto_client_submit; a submit from a callback
 * never waits for room (the room is freed by the thread it runs on): it
 * returns SW_EBUSY at once when the table or the request area is full.
 * The blocking helpers (generate, tokenize, embed, stats, mem) called from
 * a callback would wait for the thread they run on: they return -EDEADLK.
 *
 * Errors: functions return 0 or a negative code (common/err.h) with a
 * message in err. Codes from gpud's ERROR replies are passed through
 * unchanged (SW_EBUSY: gpud's queue limits; SW_ETOOLONG: the request can
 * never fit; SW_EFORMAT / -EINVAL: a bad request; SW_ECANCELED). When the
 * connection breaks (gpud exits or restarts, the socket fails, the ring is
 * corrupt) every request in flight ends with SW_ECLOSED, exactly once, and
 * every later call returns SW_ECLOSED at once; reconnecting means closing
 * this connection and opening a new one (the caller's retry policy).
 *
 * Memory: connect allocates the connection (request table for max_inflight
 * requests, a receive buffer); submit with callbacks allocates nothing;
 * the blocking helpers return malloc'd results the caller frees.
 */
#ifndef PROTO_CLIENT_H
#define PROTO_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"

struct proto_client;

struct proto_client_opts {
	uint32_t timeout_ms;   /* connect + HELLO, waiting for request-area
				* room, and each blocking call's wait for its
				* reply; 0 = wait forever. Default 0. */
	uint32_t max_inflight; /* requests in flight at once on this
				* connection (submit waits for a free entry
				* like for area room); default 256 */
	size_t max_region;     /* largest region accepted from gpud;
				* default 1 GiB */
};

void proto_client_opts_default(struct proto_client_opts *o);

/* Connects to gpud at socket_path: connect, HELLO, HELLO_REPLY with the
 * region's descriptor, attach (seal, size and header checks), start the
 * reader thread. opts NULL = defaults. Returns 0 and *out, or:
 *   -ENOENT / -ECONNREFUSED   nothing listens there ("gpud not running?"
 *                             in the message, with the path);
 *   SW_EVERSION               gpud speaks another protocol version (the
 *                             message names both versions);
 *   SW_EFORMAT / -EPERM       a bad reply or region;
 *   SW_ETOOLONG               the region is larger than opts.max_region;
 *   SW_EBUSY                  timeout_ms passed;
 *   other negated errnos.
 * *out is NULL on error and nothing stays open. */
int proto_client_connect(struct proto_client **out, const char *socket_path,
			 const struct proto_client_opts *opts, char *err, size_t errlen);

/* Closes the connection: requests still in flight end with SW_ECLOSED
 * (their on_done runs, on the calling thread, before close returns),
 * blocking calls in other threads return SW_ECLOSED, then the reader
 * thread is joined and everything freed. gpud cancels the connection's
 * requests when it sees the socket close. Accepts NULL. Must not be called
 * from a callback of this connection, nor concurrently with itself. */
void proto_client_close(struct proto_client *c);

/* False once the connection has broken (see Errors). */
bool proto_client_alive(const struct proto_client *c);

/* The server's process id (SO_PEERCRED), for logs. */
int proto_client_server_pid(const struct proto_client *c);

/* --- generation ------------------------------------------------------------ */

/* Streaming callbacks of one submitted request. */
struct proto_client_events {
	/* A batch of generated tokens (ids and the text they released; stop
	 * strings never appear); with PROTO_SUBMIT_LOGPROBS t->logprobs is set
 * and proto_lp_next walks the log probabilities. The views are valid
 * during the call only.
	 * Return non-zero to cancel the request (it then ends with
	 * SW_ECANCELED, or normally if it finished first). May be NULL. */
	int (*on_tokens)(void *arg, uint64_t request_id, const struct proto_tokens *t);
	/* Exactly once per accepted request: status 0 with the usage, or a
	 * negative code with gpud's message (usage then NULL). msg is ""
	 * on success; valid during the call. Required. */
	void (*on_done)(void *arg, uint64_t request_id, int status,
			const struct proto_done *usage, const char *msg);
	void *arg;
};

/* Submits a generation request (segments, optional mask descriptor,
 * sampling, max_tokens, stop strings, chat flag: struct proto_submit_req
 * in proto/msg.h). The request is encoded into the request area and the
 * SUBMIT frame sent; replies arrive through ev on the reader thread.
 * Returns 0 and the request id in *request_id (may be NULL) - then on_done
 * runs exactly once, possibly before submit returns - or, with no callback
 * ever: -EINVAL / SW_EFORMAT / SW_ETOOLONG (the request fails the codec's
 * checks or is larger than the request area), SW_EBUSY (timeout waiting
 * for room), SW_ECLOSED. */
int proto_client_submit(struct proto_client *c, const struct proto_submit_req *req,
			const struct proto_client_events *ev, uint64_t *request_id,
			char *err, size_t errlen);

/* Asks gpud to cancel request_id. The request still ends through its
 * on_done (SW_ECANCELED, or its normal end if that came first). Returns 0,
 * SW_ENOTFOUND (no such request in flight on this connection: already
 * done), SW_ECLOSED. */
int proto_client_cancel(struct proto_client *c, uint64_t request_id);

/* The collected result of a blocking generation. */
struct proto_client_result {
	char *text;            /* malloc'd, NUL-terminated generated text */
	size_t text_len;
	int32_t *ids;          /* malloc'd (n_ids) generated token ids */
	uint32_t n_ids;
	struct proto_done usage;
};

/* Submits and waits for the end: text and ids collected in *res (free with
 * proto_client_result_free). Returns 0, or the request's error code with
 * gpud's message in err (res then holds what arrived before the error, so
 * a caller may keep partial output), or a submit error, or SW_EBUSY when
 * timeout_ms passed (the request is then cancelled). -ENOMEM when the
 * result cannot be stored. */
int proto_client_generate(struct proto_client *c, const struct proto_submit_req *req,
			  struct proto_client_result *res, char *err, size_t errlen);

/* Frees what a result holds and zeroes it. Accepts NULL and a zeroed
 * result. */
void proto_client_result_free(struct proto_client_result *res);

/* --- other requests (all blocking) ---------------------------------------- */

/* Tokenizes len bytes of text with gpud's tokenizer (flags
 * PROTO_TOK_ADD_BOS / PROTO_TOK_PARSE_SPECIAL). *ids is malloc'd (the
 * caller frees it; NULL when *n is 0). Returns 0 or an error as above. */
int proto_client_tokenize(struct proto_client *c, const char *text, size_t len, uint32_t flags,
			  int32_t **ids, uint32_t *n, char *err, size_t errlen);

/* The text of n token ids (flags PROTO_DETOK_SPECIAL: control tokens by
 * their text), as gpud's decoder writes it: the space a SentencePiece
 * vocabulary puts before the first word is dropped, and bytes that are
 * not whole UTF-8 become U+FFFD. *text is malloc'd and NUL-terminated
 * (*len bytes before the NUL). Returns 0 or an error as above (an id
 * outside the vocabulary: -EINVAL naming it). */
int proto_client_detokenize(struct proto_client *c, const int32_t *ids, uint32_t n,
			    uint32_t flags, char **text, size_t *len, char *err, size_t errlen);

/* Embedding of a text (mean-pooled, L2-normalized, the model's dim
 * floats). *vec is malloc'd. Returns 0 or an error as above. */
int proto_client_embed(struct proto_client *c, const char *text, size_t len,
		       float **vec, uint32_t *dim, char *err, size_t errlen);

/* gpud's stats (STATS_REPLY) or memory report (MEM_REPLY; flags
 * PROTO_MEM_DUMP_OWNERS) as a malloc'd NUL-terminated JSON string. */
int proto_client_stats(struct proto_client *c, char **json, char *err, size_t errlen);
int proto_client_mem(struct proto_client *c, uint32_t flags, char **json,
		     char *err, size_t errlen);

#endif
