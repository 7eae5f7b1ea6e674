/* shm.c - per-connection memfd region, SPSC response ring, fd passing. */
#include "proto/shm.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

/* The indices are shared between processes: they must be lock-free (an
 * address-free lock would live in one process only). */
static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "u64 atomics must be lock-free");
static_assert(sizeof(_Atomic uint64_t) == 8, "atomic u64 size");

/* Region header offsets (all little-endian). */
enum {
	HDR_MAGIC = 0,     /* u32 */
	HDR_VERSION = 4,   /* u16 */
	HDR_RESERVED = 6,  /* u16, 0 */
	HDR_SIZE = 8,      /* u64 */
	HDR_RING_OFF = 16, /* u64 */
	HDR_RING_CAP = 24, /* u64 */
	HDR_REQ_OFF = 32,  /* u64 */
	HDR_REQ_SIZE = 40, /* u64 */
	HDR_END = 48,
};
static_assert(HDR_END <= PROTO_SHM_HEADER, "header fits");

#define RING_HEAD 0  /* offset of head in the ring control block */
#define RING_TAIL 64 /* own cache line */
#define PAD_TYPE 0

struct proto_shm {
	int fd;
	uint8_t *base;
	struct proto_shm_layout lay;
	bool in_storage; /* the caller's memory: not freed */
};

struct proto_ring {
	enum proto_ring_role role;
	_Atomic uint64_t *head; /* shared; written by the producer */
	_Atomic uint64_t *tail; /* shared; written by the consumer */
	uint8_t *data;          /* (cap) bytes */
	uint64_t cap;
	uint64_t pos;      /* private: producer's head / consumer's tail */
	uint64_t reserved; /* producer: reserved record bytes at pos, 0 = none */
	uint64_t res_len;  /* producer: payload bytes asked for by reserve */
	uint64_t peeked;   /* consumer: bytes the peeked record spans, 0 = none */
	bool in_storage;   /* the caller's memory: not freed */
};

static_assert(sizeof(struct proto_shm) <= PROTO_SHM_STORAGE, "PROTO_SHM_STORAGE");
static_assert(sizeof(struct proto_ring) <= PROTO_RING_STORAGE, "PROTO_RING_STORAGE");

static bool storage_ok(const void *storage, size_t len, size_t need)
{
	return storage && len >= need && (uintptr_t)storage % 16 == 0;
}

static bool is_pow2(uint64_t v)
{
	return v && !(v & (v - 1));
}

static uint64_t align_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) & ~(a - 1);
}

static uint64_t page_size(void)
{
	long p = sysconf(_SC_PAGESIZE);
	return p > 0 ? (uint64_t)p : 4096;
}

/* --- region -------------------------------------------------------------- */

static int shm_create(void *storage, struct proto_shm **out, size_t ring_cap,
		      size_t req_size, char *err, size_t errlen)
{
	if (!out)
		return sw_seterr(err, errlen, -EINVAL, "shm: NULL argument");
	*out = NULL;
	if (!is_pow2(ring_cap) || ring_cap < PROTO_RING_MIN_CAP || ring_cap > PROTO_RING_MAX_CAP)
		return sw_seterr(err, errlen, -EINVAL,
				 "shm: ring capacity %zu is not a power of two in [%u, %u]",
				 ring_cap, PROTO_RING_MIN_CAP, PROTO_RING_MAX_CAP);
	if (req_size == 0 || req_size > PROTO_SHM_MAX_REQ)
		return sw_seterr(err, errlen, -EINVAL, "shm: request area %zu not in [1, %u]",
				 req_size, PROTO_SHM_MAX_REQ);

	struct proto_shm_layout lay;
	lay.ring_off = PROTO_SHM_HEADER;
	lay.ring_cap = ring_cap;
	lay.req_off = lay.ring_off + PROTO_RING_CTL + ring_cap;
	lay.size = align_up(lay.req_off + req_size, page_size());
	lay.req_size = lay.size - lay.req_off;

	struct proto_shm *shm = storage ? storage : calloc(1, sizeof(*shm));
	if (!shm)
		return sw_seterr(err, errlen, -ENOMEM, "shm: out of memory");
	if (storage) {
		memset(shm, 0, sizeof(*shm));
		shm->in_storage = true;
	}
	int rc;
	shm->fd = memfd_create("swarm-conn", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (shm->fd < 0) {
		rc = sw_seterr(err, errlen, -errno, "shm: memfd_create: %s", strerror(errno));
		goto out_free;
	}
	if (ftruncate(shm->fd, (off_t)lay.size) < 0) {
		rc = sw_seterr(err, errlen, -errno, "shm: ftruncate %" PRIu64 ": %s", lay.size,
			       strerror(errno));
		goto out_close;
	}
	void *p = mmap(NULL, lay.size, PROT_READ | PROT_WRITE, MAP_SHARED, shm->fd, 0);
	if (p == MAP_FAILED) {
		rc = sw_seterr(err, errlen, -errno, "shm: mmap %" PRIu64 ": %s", lay.size,
			       strerror(errno));
		goto out_close;
	}
	shm->base = p;
	shm->lay = lay;

	/* A fresh memfd reads as zeroes: only the header needs writing, and
	 * the ring indices start at 0. */
	proto_put32(shm->base + HDR_MAGIC, PROTO_SHM_MAGIC);
	proto_put16(shm->base + HDR_VERSION, PROTO_SHM_VERSION);
	proto_put64(shm->base + HDR_SIZE, lay.size);
	proto_put64(shm->base + HDR_RING_OFF, lay.ring_off);
	proto_put64(shm->base + HDR_RING_CAP, lay.ring_cap);
	proto_put64(shm->base + HDR_REQ_OFF, lay.req_off);
	proto_put64(shm->base + HDR_REQ_SIZE, lay.req_size);
	rc = proto_ring_format(shm->base + lay.ring_off, PROTO_RING_CTL + ring_cap);
	assert(rc == 0);

	if (fcntl(shm->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		rc = sw_seterr(err, errlen, -errno, "shm: F_ADD_SEALS: %s", strerror(errno));
		goto out_unmap;
	}
	*out = shm;
	return 0;

out_unmap:
	munmap(shm->base, lay.size);
out_close:
	close(shm->fd);
out_free:
	if (!shm->in_storage)
		free(shm);
	return rc;
}

int proto_shm_create(struct proto_shm **out, size_t ring_cap, size_t req_size,
		     char *err, size_t errlen)
{
	return shm_create(NULL, out, ring_cap, req_size, err, errlen);
}

int proto_shm_create_in(void *storage, size_t len, struct proto_shm **out, size_t ring_cap,
			size_t req_size, char *err, size_t errlen)
{
	if (!storage_ok(storage, len, sizeof(struct proto_shm))) {
		if (out)
			*out = NULL;
		return sw_seterr(err, errlen, -EINVAL,
				 "shm: handle storage %p (%zu bytes) is NULL, short or misaligned",
				 storage, len);
	}
	return shm_create(storage, out, ring_cap, req_size, err, errlen);
}

/* Checks a layout read from a peer against the real file size. */
static int check_layout(const struct proto_shm_layout *l, uint64_t fsize, char *err,
			size_t errlen)
{
	if (l->size != fsize)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "shm header: size %" PRIu64 " but the file has %" PRIu64,
				 l->size, fsize);
	if (l->ring_off < PROTO_SHM_HEADER || l->ring_off % 64)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "shm header: ring_off %" PRIu64 " inside the header or not "
				 "64-byte aligned", l->ring_off);
	if (!is_pow2(l->ring_cap) || l->ring_cap < PROTO_RING_MIN_CAP ||
	    l->ring_cap > PROTO_RING_MAX_CAP)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "shm header: ring_cap %" PRIu64 " not a power of two in "
				 "[%u, %u]", l->ring_cap, PROTO_RING_MIN_CAP,
				 PROTO_RING_MAX_CAP);
	int rc = proto_span_check(l->ring_off, PROTO_RING_CTL + l->ring_cap, 0, fsize,
				  "shm header: ring", err, errlen);
	if (rc)
		return rc;
	if (l->req_size == 0)
		return sw_seterr(err, errlen, SW_EFORMAT, "shm header: req_size 0");
	rc = proto_span_check(l->req_off, l->req_size, 0, fsize, "shm header: request area",
			      err, errlen);
	if (rc)
		return rc;
	/* Ring and request area must not overlap, in either order. */
	uint64_t ring_end = l->ring_off + PROTO_RING_CTL + l->ring_cap;
	uint64_t req_end = l->req_off + l->req_size;
	if (l->req_off < ring_end && l->ring_off < req_end)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "shm header: request area [%" PRIu64 ", %" PRIu64
				 ") overlaps the ring [%" PRIu64 ", %" PRIu64 ")",
				 l->req_off, req_end, l->ring_off, ring_end);
	if (l->req_off < PROTO_SHM_HEADER)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "shm header: req_off %" PRIu64 " inside the header", l->req_off);
	return 0;
}

int proto_shm_attach(struct proto_shm **out, int fd, size_t max_size, char *err, size_t errlen)
{
	if (!out)
		return sw_seterr(err, errlen, -EINVAL, "shm: NULL argument");
	*out = NULL;
	if (fd < 0)
		return sw_seterr(err, errlen, -EINVAL, "shm: bad descriptor %d", fd);
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0)
		return sw_seterr(err, errlen, errno == EINVAL ? -EPERM : -errno,
				 "shm: F_GET_SEALS: %s (not a sealable memfd)", strerror(errno));
	if (!(seals & F_SEAL_SHRINK))
		return sw_seterr(err, errlen, -EPERM, "shm: region not sealed against shrinking");
	struct stat st;
	if (fstat(fd, &st) < 0)
		return sw_seterr(err, errlen, -errno, "shm: fstat: %s", strerror(errno));
	uint64_t fsize = (uint64_t)st.st_size;
	if (st.st_size < 0 || fsize < page_size() || fsize % page_size())
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "shm: size %lld is not a positive page multiple",
				 (long long)st.st_size);
	if (fsize > max_size)
		return sw_seterr(err, errlen, SW_ETOOLONG, "shm: size %" PRIu64 " over the limit %zu",
				 fsize, max_size);

	void *p = mmap(NULL, fsize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		return sw_seterr(err, errlen, -errno, "shm: mmap %" PRIu64 ": %s", fsize,
				 strerror(errno));
	uint8_t hdr[HDR_END];
	proto_copy_in(hdr, p, sizeof(hdr));
	int rc;
	if (proto_get32(hdr + HDR_MAGIC) != PROTO_SHM_MAGIC) {
		rc = sw_seterr(err, errlen, SW_EFORMAT, "shm header: magic 0x%08" PRIx32,
			       proto_get32(hdr + HDR_MAGIC));
		goto out_unmap;
	}
	if (proto_get16(hdr + HDR_VERSION) != PROTO_SHM_VERSION) {
		rc = sw_seterr(err, errlen, SW_EVERSION, "shm header: version %u, expected %d",
			       proto_get16(hdr + HDR_VERSION), PROTO_SHM_VERSION);
		goto out_unmap;
	}
	struct proto_shm_layout lay = {
		.size = proto_get64(hdr + HDR_SIZE),
		.ring_off = proto_get64(hdr + HDR_RING_OFF),
		.ring_cap = proto_get64(hdr + HDR_RING_CAP),
		.req_off = proto_get64(hdr + HDR_REQ_OFF),
		.req_size = proto_get64(hdr + HDR_REQ_SIZE),
	};
	rc = check_layout(&lay, fsize, err, errlen);
	if (rc)
		goto out_unmap;
	struct proto_shm *shm = calloc(1, sizeof(*shm));
	if (!shm) {
		rc = sw_seterr(err, errlen, -ENOMEM, "shm: out of memory");
		goto out_unmap;
	}
	shm->fd = fd;
	shm->base = p;
	shm->lay = lay;
	*out = shm;
	return 0;

out_unmap:
	munmap(p, fsize);
	return rc;
}

void proto_shm_destroy(struct proto_shm *shm)
{
	if (!shm)
		return;
	munmap(shm->base, shm->lay.size);
	close(shm->fd);
	if (!shm->in_storage)
		free(shm);
}

int proto_shm_fd(const struct proto_shm *shm)
{
	return shm->fd;
}

uint8_t *proto_shm_base(const struct proto_shm *shm)
{
	return shm->base;
}

const struct proto_shm_layout *proto_shm_layout(const struct proto_shm *shm)
{
	return &shm->lay;
}

uint8_t *proto_shm_req_area(const struct proto_shm *shm)
{
	return shm->base + shm->lay.req_off;
}

/* --- ring ---------------------------------------------------------------- */

static bool ring_len_ok(void *mem, size_t len, uint64_t *cap)
{
	if (!mem || ((uintptr_t)mem % 64) || len < PROTO_RING_CTL)
		return false;
	*cap = len - PROTO_RING_CTL;
	return is_pow2(*cap) && *cap >= PROTO_RING_MIN_CAP && *cap <= PROTO_RING_MAX_CAP;
}

int proto_ring_format(void *mem, size_t len)
{
	uint64_t cap;
	if (!ring_len_ok(mem, len, &cap))
		return -EINVAL;
	atomic_init((_Atomic uint64_t *)((uint8_t *)mem + RING_HEAD), 0);
	atomic_init((_Atomic uint64_t *)((uint8_t *)mem + RING_TAIL), 0);
	atomic_thread_fence(memory_order_release);
	return 0;
}

/* head/tail as seen by the side that does not own `other`: the span
 * between them must be a whole number of records inside the ring. */
static bool span_ok(uint64_t head, uint64_t tail, uint64_t cap)
{
	return head - tail <= cap && head % PROTO_RING_ALIGN == 0 && tail % PROTO_RING_ALIGN == 0;
}

static int ring_open(void *storage, struct proto_ring **out, void *mem, size_t len,
		     enum proto_ring_role role, char *err, size_t errlen)
{
	if (!out)
		return sw_seterr(err, errlen, -EINVAL, "ring: NULL argument");
	*out = NULL;
	uint64_t cap;
	if (!ring_len_ok(mem, len, &cap))
		return sw_seterr(err, errlen, -EINVAL,
				 "ring: %zu bytes at %p is not a 64-byte aligned control block "
				 "+ a power-of-two capacity", len, mem);
	if (role != PROTO_RING_PRODUCER && role != PROTO_RING_CONSUMER)
		return sw_seterr(err, errlen, -EINVAL, "ring: bad role %d", (int)role);
	struct proto_ring *r = storage ? storage : calloc(1, sizeof(*r));
	if (!r)
		return sw_seterr(err, errlen, -ENOMEM, "ring: out of memory");
	if (storage) {
		memset(r, 0, sizeof(*r));
		r->in_storage = true;
	}
	r->role = role;
	r->head = (_Atomic uint64_t *)((uint8_t *)mem + RING_HEAD);
	r->tail = (_Atomic uint64_t *)((uint8_t *)mem + RING_TAIL);
	r->data = (uint8_t *)mem + PROTO_RING_CTL;
	r->cap = cap;
	uint64_t head = atomic_load_explicit(r->head, memory_order_acquire);
	uint64_t tail = atomic_load_explicit(r->tail, memory_order_acquire);
	if (!span_ok(head, tail, cap)) {
		if (!r->in_storage)
			free(r);
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "ring: head %" PRIu64 " / tail %" PRIu64 " corrupt (capacity %"
				 PRIu64 ")", head, tail, cap);
	}
	r->pos = role == PROTO_RING_PRODUCER ? head : tail;
	*out = r;
	return 0;
}

int proto_ring_open(struct proto_ring **out, void *mem, size_t len, enum proto_ring_role role,
		    char *err, size_t errlen)
{
	return ring_open(NULL, out, mem, len, role, err, errlen);
}

int proto_shm_ring_in(void *storage, size_t len, struct proto_shm *shm,
		      enum proto_ring_role role, struct proto_ring **out, char *err,
		      size_t errlen)
{
	if (out)
		*out = NULL;
	if (!shm)
		return sw_seterr(err, errlen, -EINVAL, "ring: NULL region");
	if (!storage_ok(storage, len, sizeof(struct proto_ring)))
		return sw_seterr(err, errlen, -EINVAL,
				 "ring: handle storage %p (%zu bytes) is NULL, short or misaligned",
				 storage, len);
	return ring_open(storage, out, shm->base + shm->lay.ring_off,
			 PROTO_RING_CTL + shm->lay.ring_cap, role, err, errlen);
}

int proto_shm_ring(struct proto_shm *shm, enum proto_ring_role role, struct proto_ring **out,
		   char *err, size_t errlen)
{
	if (!shm) {
		if (out)
			*out = NULL;
		return sw_seterr(err, errlen, -EINVAL, "ring: NULL region");
	}
	return proto_ring_open(out, shm->base + shm->lay.ring_off,
			       PROTO_RING_CTL + shm->lay.ring_cap, role, err, errlen);
}

void proto_ring_close(struct proto_ring *r)
{
	if (r && !r->in_storage)
		free(r);
}

size_t proto_ring_capacity(const struct proto_ring *r)
{
	return r->cap;
}

size_t proto_ring_max_payload(const struct proto_ring *r)
{
	return r->cap / 2 - PROTO_RING_HDR;
}

static void put_rec_header(uint8_t *p, uint32_t len, uint16_t type, uint64_t request_id)
{
	proto_put32(p, len);
	proto_put16(p + 4, type);
	proto_put16(p + 6, 0);
	proto_put64(p + 8, request_id);
}

int proto_ring_reserve(struct proto_ring *r, size_t len, uint8_t **payload)
{
	if (!payload)
		return -EINVAL;
	*payload = NULL;
	if (!r || r->role != PROTO_RING_PRODUCER)
		return -EINVAL;
	r->reserved = 0;
	if (len > proto_ring_max_payload(r))
		return SW_ETOOLONG;
	uint64_t need = PROTO_RING_HDR + align_up(len, PROTO_RING_ALIGN);
	/* The consumer owns tail: never trust it further than span_ok. */
	uint64_t tail = atomic_load_explicit(r->tail, memory_order_acquire);
	if (!span_ok(r->pos, tail, r->cap))
		return SW_EFORMAT;
	uint64_t free_bytes = r->cap - (r->pos - tail);
	uint64_t off = r->pos & (r->cap - 1);
	uint64_t contig = r->cap - off;
	uint64_t pad = need > contig ? contig : 0;
	if (pad + need > free_bytes)
		return SW_EBUSY;
	if (pad) {
		/* Padding to the end of the data area; published with the
		 * record at commit (head moves over both at once). */
		put_rec_header(r->data + off, (uint32_t)(pad - PROTO_RING_HDR), PAD_TYPE, 0);
		off = 0;
	}
	r->reserved = pad + need;
	r->res_len = len;
	*payload = r->data + off + PROTO_RING_HDR;
	return 0;
}

int proto_ring_commit(struct proto_ring *r, uint16_t type, uint64_t request_id, size_t len)
{
	if (!r || r->role != PROTO_RING_PRODUCER || !r->reserved || type == PAD_TYPE ||
	    len > r->res_len)
		return -EINVAL;
	uint64_t off = r->pos & (r->cap - 1);
	uint64_t contig = r->cap - off;
	uint64_t need = r->reserved;
	if (need > contig) { /* a padding record sits at off */
		need -= contig;
		off = 0;
	}
	put_rec_header(r->data + off, (uint32_t)len, type, request_id);
	/* The record is exactly as long as committed, so a smaller len than
	 * reserved gives the unused tail back. */
	uint64_t used = r->reserved - need + PROTO_RING_HDR + align_up(len, PROTO_RING_ALIGN);
	r->pos += used;
	r->reserved = 0;
	atomic_store_explicit(r->head, r->pos, memory_order_release);
	return 0;
}

int proto_ring_push(struct proto_ring *r, uint16_t type, uint64_t request_id,
		    const void *payload, size_t len)
{
	if (type == PAD_TYPE || (len && !payload))
		return -EINVAL;
	uint8_t *dst;
	int rc = proto_ring_reserve(r, len, &dst);
	if (rc)
		return rc;
	if (len)
		memcpy(dst, payload, len);
	return proto_ring_commit(r, type, request_id, len);
}

int proto_ring_peek(struct proto_ring *r, struct proto_record *rec)
{
	if (!r || !rec || r->role != PROTO_RING_CONSUMER)
		return -EINVAL;
	r->peeked = 0;
	for (;;) {
		uint64_t head = atomic_load_explicit(r->head, memory_order_acquire);
		if (!span_ok(head, r->pos, r->cap))
			return SW_EFORMAT;
		uint64_t avail = head - r->pos;
		if (avail == 0)
			return -EAGAIN;
		uint64_t off = r->pos & (r->cap - 1);
		uint64_t contig = r->cap - off;
		uint8_t h[PROTO_RING_HDR];
		proto_copy_in(h, r->data + off, sizeof(h)); /* avail >= 16: span_ok */
		uint32_t len = proto_get32(h);
		uint16_t type = proto_get16(h + 4);
		uint64_t span = PROTO_RING_HDR + align_up(len, PROTO_RING_ALIGN);
		if (span > contig || span > avail)
			return SW_EFORMAT;
		if (type == PAD_TYPE) {
			if (span != contig)
				return SW_EFORMAT; /* padding always runs to the end */
			r->pos += span;
			atomic_store_explicit(r->tail, r->pos, memory_order_release);
			continue;
		}
		rec->type = type;
		rec->flags = proto_get16(h + 6);
		rec->len = len;
		rec->request_id = proto_get64(h + 8);
		rec->payload = r->data + off + PROTO_RING_HDR;
		r->peeked = span;
		return 0;
	}
}

int proto_ring_consume(struct proto_ring *r)
{
	if (!r || r->role != PROTO_RING_CONSUMER || !r->peeked)
		return -EINVAL;
	r->pos += r->peeked;
	r->peeked = 0;
	atomic_store_explicit(r->tail, r->pos, memory_order_release);
	return 0;
}

int proto_ring_pop(struct proto_ring *r, struct proto_record *rec, void *buf, size_t cap)
{
	int rc = proto_ring_peek(r, rec);
	if (rc)
		return rc;
	if (rec->len > cap || (rec->len && !buf)) {
		r->peeked = 0;
		return SW_ETOOLONG;
	}
	proto_copy_in(buf, rec->payload, rec->len);
	rec->payload = buf;
	return proto_ring_consume(r);
}

/* --- socket helpers ------------------------------------------------------ */

static int wait_fd(int sock, short events)
{
	struct pollfd pfd = { .fd = sock, .events = events };
	for (;;) {
		int n = poll(&pfd, 1, -1);
		if (n >= 0)
			return 0;
		if (errno != EINTR)
			return -errno;
	}
}

int proto_send_frame(int sock, const struct proto_frame *f, int fd)
{
	if (!f || sock < 0)
		return -EINVAL;
	uint8_t buf[PROTO_FRAME_SIZE];
	proto_frame_encode(f, buf);
	size_t sent = 0;
	while (sent < sizeof(buf)) {
		struct iovec iov = { .iov_base = buf + sent, .iov_len = sizeof(buf) - sent };
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int))];
		} ctl;
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		if (fd >= 0 && sent == 0) { /* the descriptor rides on the first byte */
			memset(&ctl, 0, sizeof(ctl));
			mh.msg_control = ctl.b;
			mh.msg_controllen = sizeof(ctl.b);
			struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &fd, sizeof(int));
		}
		ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);
		if (n > 0) {
			sent += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			if (sent == 0)
				return -EAGAIN;
			int rc = wait_fd(sock, POLLOUT);
			if (rc)
				return rc;
			continue;
		}
		if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
			return SW_ECLOSED;
		return n < 0 ? -errno : -EIO;
	}
	return 0;
}

/* Takes the descriptors out of a received control message: the first one
 * to *keep (when keep is not NULL and none is kept yet), every other one
 * closed. Returns the number of descriptors seen. */
static int take_fds(struct msghdr *mh, int *keep)
{
	int seen = 0;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (keep && *keep < 0)
				*keep = fd;
			else
				close(fd);
			seen++;
		}
	}
	return seen;
}

int proto_recv_frame(int sock, uint8_t buf[PROTO_FRAME_SIZE], int *fd)
{
	int got_fd = -1;
	int nfds = 0;
	bool truncated = false;
	if (fd)
		*fd = -1;
	if (!buf || sock < 0)
		return -EINVAL;
	size_t got = 0;
	int rc = 0;
	while (got < PROTO_FRAME_SIZE) {
		struct iovec iov = { .iov_base = buf + got, .iov_len = PROTO_FRAME_SIZE - got };
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(4 * sizeof(int))];
		} ctl;
		struct msghdr mh = {
			.msg_iov = &iov,
			.msg_iovlen = 1,
			.msg_control = ctl.b,
			.msg_controllen = sizeof(ctl.b),
		};
		ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			if (got == 0) {
				rc = -EAGAIN;
				goto out;
			}
			rc = wait_fd(sock, POLLIN);
			if (rc)
				goto out;
			continue;
		}
		if (n < 0) {
			rc = errno == ECONNRESET ? SW_ECLOSED : -errno;
			goto out;
		}
		nfds += take_fds(&mh, &got_fd);
		if (mh.msg_flags & MSG_CTRUNC)
			truncated = true;
		if (n == 0) {
			rc = got == 0 ? SW_ECLOSED : SW_EFORMAT;
			goto out;
		}
		got += (size_t)n;
	}
	if (nfds > 1 || truncated)
		rc = SW_EFORMAT;
out:
	if (rc == 0 && fd)
		*fd = got_fd;
	else if (got_fd >= 0)
		close(got_fd);
	return rc;
}

int proto_peercred(int sock, uid_t *uid, gid_t *gid, pid_t *pid)
{
	struct ucred cr;
	socklen_t len = sizeof(cr);
	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
		return -errno;
	if (len != sizeof(cr))
		return -EIO;
	if (uid)
		*uid = cr.uid;
	if (gid)
		*gid = cr.gid;
	if (pid)
		*pid = cr.pid;
	return 0;
}
