/* shm.h - the shared-memory region of one connection, its response ring,
 * and the socket helpers that hand the region over (DESIGN §4).
 *
 * gpud creates one region per connection (a memfd sealed so that it can
 * never shrink or grow, which is what makes every mapping of it safe to
 * touch for as long as it is mapped: no SIGBUS from a peer's ftruncate),
 * passes its descriptor to the client with SCM_RIGHTS, and both sides map
 * it. Layout (offsets in bytes; documented in proto/README.md):
 *
 *   0                 region header (PROTO_SHM_HEADER bytes; written once
 *                     by the creator; an attaching side validates it
 *                     against the file size and keeps its own copy)
 *   ring_off          ring control: head at +0, tail at +64 (own cache
 *                     lines), PROTO_RING_CTL bytes in all
 *   ring_off + 128    ring data, ring_cap bytes (a power of two)
 *   req_off           request area, req_size bytes: the client writes
 *                     request payloads here and names them in frames
 *
 * The ring carries replies from gpud (the single producer) to the client
 * (the single consumer): records of { u32 length, u16 type, u16 flags,
 * u64 request id } followed by the payload padded to 16 bytes. A record
 * never wraps: when it does not fit before the end of the data area the
 * producer writes a padding record (type 0) to the end and starts over at
 * offset 0. head and tail are byte counters that only grow (mod 2^64),
 * C11 atomics with release stores and acquire loads, lock-free across
 * processes. Neither side trusts the index the other one writes: the
 * producer checks the consumer's tail and the consumer checks the head and
 * every record header, so a corrupt peer yields SW_EFORMAT, never an
 * out-of-bounds access. Nothing in the ring blocks: a full ring is SW_EBUSY
 * (gpud backs off), an empty one -EAGAIN.
 *
 * Allocation happens only when a region or ring handle is created (once per
 * connection); pushing and popping records never allocates.
 */
#ifndef PROTO_SHM_H
#define PROTO_SHM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "proto/frame.h"

#define PROTO_SHM_MAGIC 0x48535753u /* "SWSH" */
#define PROTO_SHM_VERSION 1
#define PROTO_SHM_HEADER 128        /* bytes reserved for the header */
#define PROTO_RING_CTL 128          /* head line + tail line */
#define PROTO_RING_HDR 16           /* bytes of a record header */
#define PROTO_RING_ALIGN 16         /* records start on 16-byte boundaries */
#define PROTO_RING_MIN_CAP 256
#define PROTO_RING_MAX_CAP (1u << 30)
#define PROTO_SHM_MAX_REQ (1u << 30)

/* Where things are, in bytes from the start of the region. */
struct proto_shm_layout {
	uint64_t size;     /* whole region (page multiple) */
	uint64_t ring_off; /* ring control; data at ring_off + PROTO_RING_CTL */
	uint64_t ring_cap; /* ring data bytes, power of two */
	uint64_t req_off;  /* request area */
	uint64_t req_size;
};

struct proto_shm;

/* Creates a region with a ring of ring_cap data bytes (a power of two in
 * [PROTO_RING_MIN_CAP, PROTO_RING_MAX_CAP]) and a request area of at least
 * req_size bytes (1..PROTO_SHM_MAX_REQ; rounded up so the region is a page
 * multiple): memfd_create, ftruncate, mmap, header written, ring indices
 * zeroed, then sealed with F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL.
 * The caller owns *out (proto_shm_destroy). Returns 0, -EINVAL (sizes),
 * or a negated errno from the system calls; *out is NULL on error and
 * nothing is left open or mapped. */
int proto_shm_create(struct proto_shm **out, size_t ring_cap, size_t req_size,
		     char *err, size_t errlen);

/* Maps a region received from a peer. Checks before mapping: fd is a
 * memfd-style file with F_SEAL_SHRINK set (-EPERM otherwise: a peer could
 * shrink it under us), its size is a page multiple between one page and
 * max_size (SW_ETOOLONG when larger); after mapping: the header's magic
 * (SW_EFORMAT), version (SW_EVERSION) and a layout that lies inside the
 * file with no overlap (SW_EFORMAT, naming the field). The header is
 * copied; the peer may rewrite it afterwards without effect. On success
 * the region owns fd (closed by destroy); on error the caller still owns
 * fd and *out is NULL. */
int proto_shm_attach(struct proto_shm **out, int fd, size_t max_size,
		     char *err, size_t errlen);

/* Unmaps and closes. Accepts NULL. Ring handles opened on the region must
 * be closed first. */
void proto_shm_destroy(struct proto_shm *shm);

/* Handle storage a caller can reserve up front (gpud reserves one per
 * connection slot), so that creating a region and opening its ring make
 * no heap allocation: bytes, 16-byte aligned. */
#define PROTO_SHM_STORAGE 64
#define PROTO_RING_STORAGE 96

/* As proto_shm_create, with the handle built in storage (len >=
 * PROTO_SHM_STORAGE bytes, 16-byte aligned, owned by the caller and kept
 * until proto_shm_destroy, which then unmaps and closes but frees
 * nothing). -EINVAL for storage that is NULL, short or misaligned. */
int proto_shm_create_in(void *storage, size_t len, struct proto_shm **out, size_t ring_cap,
			size_t req_size, char *err, size_t errlen);

/* The descriptor (owned by the region: dup it to keep it). */
int proto_shm_fd(const struct proto_shm *shm);
/* Start of the mapping; valid until destroy. */
uint8_t *proto_shm_base(const struct proto_shm *shm);
/* This side's validated copy of the layout (never re-read from the
 * region). */
const struct proto_shm_layout *proto_shm_layout(const struct proto_shm *shm);
/* base + req_off: where the client writes request payloads. */
uint8_t *proto_shm_req_area(const struct proto_shm *shm);

/* --- response ring ------------------------------------------------------ */

enum proto_ring_role {
	PROTO_RING_PRODUCER = 1, /* gpud */
	PROTO_RING_CONSUMER = 2, /* the client */
};

/* A record as peek/pop return it. payload is a view into the ring, valid
 * until proto_ring_consume() (peek) or a copy in the caller's buffer (pop);
 * the header fields are copies. */
struct proto_record {
	uint16_t type;          /* enum proto_type; never 0 (padding is skipped) */
	uint16_t flags;         /* 0 (reserved) */
	uint32_t len;           /* payload bytes */
	uint64_t request_id;
	const uint8_t *payload; /* (len) bytes */
};

struct proto_ring;

/* Zeroes head and tail of a ring block (PROTO_RING_CTL + cap bytes at mem)
 * for a fresh ring; proto_shm_create does this for its ring. Only while no
 * handle is open on it. Returns 0 or -EINVAL (NULL, bad size). */
int proto_ring_format(void *mem, size_t len);

/* Opens one side of the ring block at mem (len = PROTO_RING_CTL + cap, cap
 * a power of two in [PROTO_RING_MIN_CAP, PROTO_RING_MAX_CAP], mem 64-byte
 * aligned). The handle starts from the current shared indices (the
 * producer from head, the consumer from tail), checking them as it would
 * on every call. One producer and one consumer handle at a time, in any
 * processes. Returns 0, -EINVAL, -ENOMEM or SW_EFORMAT (corrupt indices);
 * *out is NULL on error. */
int proto_ring_open(struct proto_ring **out, void *mem, size_t len, enum proto_ring_role role,
		    char *err, size_t errlen);

/* Same on a region's ring. */
int proto_shm_ring(struct proto_shm *shm, enum proto_ring_role role, struct proto_ring **out,
		   char *err, size_t errlen);

/* As proto_shm_ring, with the handle in storage (len >=
 * PROTO_RING_STORAGE bytes, 16-byte aligned, owned by the caller until
 * proto_ring_close, which then frees nothing). */
int proto_shm_ring_in(void *storage, size_t len, struct proto_shm *shm,
		      enum proto_ring_role role, struct proto_ring **out, char *err,
		      size_t errlen);

/* Frees the handle (the shared ring is untouched). Accepts NULL. */
void proto_ring_close(struct proto_ring *r);

/* Data bytes of the ring. */
size_t proto_ring_capacity(const struct proto_ring *r);
/* Largest payload one record can carry: capacity / 2 - PROTO_RING_HDR
 * (bounding records to half the ring is what guarantees that an empty
 * ring always takes any legal record, padding included). */
size_t proto_ring_max_payload(const struct proto_ring *r);

/* Producer: reserves room for a len-byte payload and points *payload at
 * it (contiguous, 16-byte aligned, inside the ring), so a reply can be
 * encoded in place. Writes a padding record first when needed. Nothing
 * is visible to the consumer until proto_ring_commit. A second reserve
 * replaces the first. Returns 0; SW_EBUSY when the ring lacks room now
 * (retry after the consumer catches up); SW_ETOOLONG when len exceeds
 * proto_ring_max_payload; SW_EFORMAT when the consumer's tail is corrupt
 * (drop the connection); -EINVAL for a consumer handle or NULL. *payload
 * is NULL on error. Never allocates. */
int proto_ring_reserve(struct proto_ring *r, size_t len, uint8_t **payload);

/* Producer: publishes the reserved record with its header (len <= the
 * reserved length). Returns 0 or -EINVAL (no reservation, len too large,
 * type 0); nothing is published on error. */
int proto_ring_commit(struct proto_ring *r, uint16_t type, uint64_t request_id, size_t len);

/* Producer: reserve + copy + commit. Same returns as reserve; -EINVAL for
 * type 0. */
int proto_ring_push(struct proto_ring *r, uint16_t type, uint64_t request_id,
		    const void *payload, size_t len);

/* Consumer: the oldest record, without releasing it (padding is skipped
 * and released). Returns 0; -EAGAIN when the ring is empty; SW_EFORMAT
 * when the producer's head or a record header is corrupt (the ring is
 * then unusable); -EINVAL for a producer handle or NULL. */
int proto_ring_peek(struct proto_ring *r, struct proto_record *rec);

/* Consumer: releases the record the last successful peek returned, so
 * the producer may reuse its bytes. Returns 0 or -EINVAL (nothing
 * peeked). */
int proto_ring_consume(struct proto_ring *r);

/* Consumer: peek, copy the payload into buf (cap bytes), consume; rec's
 * payload then points at buf. SW_ETOOLONG when cap is too small (the
 * record stays in the ring; rec->len says how much is needed). Other
 * returns as peek. */
int proto_ring_pop(struct proto_ring *r, struct proto_record *rec, void *buf, size_t cap);

/* --- socket helpers ----------------------------------------------------- */

/* Sends the frame f (encoded) on a connected Unix stream socket, with fd
 * attached through SCM_RIGHTS when fd >= 0 (the caller keeps its copy).
 * Uses MSG_NOSIGNAL; retries EINTR; finishes a partial send (waiting with
 * poll on a non-blocking socket). Returns 0, -EAGAIN (non-blocking socket,
 * nothing sent), SW_ECLOSED (peer gone: EPIPE, ECONNRESET) or a negated
 * errno. */
int proto_send_frame(int sock, const struct proto_frame *f, int fd);

/* Receives exactly one frame's bytes into buf (blocking; waits with poll
 * on a non-blocking socket once a first byte has arrived) and decodes
 * nothing: pass buf to proto_frame_decode. A descriptor that arrives with
 * it is stored in *fd (close-on-exec) when fd is not NULL, else closed;
 * *fd is -1 when none came. Any extra descriptors, and a truncated control
 * message, make it SW_EFORMAT (every received descriptor closed).
 * Returns 0; SW_ECLOSED on end of file before the first byte; SW_EFORMAT
 * on end of file inside a frame; -EAGAIN (non-blocking, no data); or a
 * negated errno. For clients and tests; gpud reads frames through its
 * event loop. */
int proto_recv_frame(int sock, uint8_t buf[PROTO_FRAME_SIZE], int *fd);

/* The peer's credentials (SO_PEERCRED) on a connected Unix socket. Any
 * out pointer may be NULL. Returns 0 or a negated errno. */
int proto_peercred(int sock, uid_t *uid, gid_t *gid, pid_t *pid);

#endif
