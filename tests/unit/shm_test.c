/* shm_test.c - memfd region, response ring, fd passing (proto/shm.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "proto/shm.h"

#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

/* Record counts of the stress tests: a million through one ring natively;
 * a tenth under valgrind, which runs threads one at a time and would
 * otherwise take most of a minute. */
static uint64_t scaled(uint64_t n)
{
	return RUNNING_ON_VALGRIND || getenv("SWARM_UNDER_VALGRIND") ? n / 10 : n;
}

static char g_err[SW_ERR_MAX];

/* Open descriptors of this process (to prove nothing leaks). */
static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	assert_non_null(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* --- region ------------------------------------------------------------- */

static void test_create_layout_and_seals(void **state)
{
	(void)state;
	struct proto_shm *shm;
	assert_int_equal(proto_shm_create(&shm, 4096, 10000, g_err, sizeof(g_err)), 0);
	const struct proto_shm_layout *l = proto_shm_layout(shm);
	long pg = sysconf(_SC_PAGESIZE);
	assert_int_equal(l->ring_off, PROTO_SHM_HEADER);
	assert_int_equal(l->ring_cap, 4096);
	assert_int_equal(l->req_off, PROTO_SHM_HEADER + PROTO_RING_CTL + 4096);
	assert_true(l->req_size >= 10000);
	assert_int_equal(l->size % (uint64_t)pg, 0);
	assert_int_equal(l->req_off + l->req_size, l->size);
	assert_ptr_equal(proto_shm_req_area(shm), proto_shm_base(shm) + l->req_off);

	int fd = proto_shm_fd(shm);
	int seals = fcntl(fd, F_GET_SEALS);
	assert_true(seals & F_SEAL_SHRINK);
	assert_true(seals & F_SEAL_GROW);
	assert_true(seals & F_SEAL_SEAL);
	assert_false(seals & F_SEAL_WRITE);
	/* The seals hold: nobody can shrink, grow or unseal it. */
	assert_int_equal(ftruncate(fd, (off_t)(l->size - (uint64_t)pg)), -1);
	assert_int_equal(errno, EPERM);
	assert_int_equal(ftruncate(fd, (off_t)(l->size + (uint64_t)pg)), -1);
	assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);

	/* A second mapping through attach sees the same bytes. */
	int fd2 = dup(fd);
	struct proto_shm *peer;
	assert_int_equal(proto_shm_attach(&peer, fd2, 1 << 20, g_err, sizeof(g_err)), 0);
	assert_memory_equal(proto_shm_layout(peer), l, sizeof(*l));
	assert_ptr_not_equal(proto_shm_base(peer), proto_shm_base(shm));
	memcpy(proto_shm_req_area(shm), "hello", 5);
	assert_memory_equal(proto_shm_req_area(peer), "hello", 5);
	/* Rewriting the shared header later changes nothing on this side. */
	proto_put64(proto_shm_base(shm) + 16, 12345);
	assert_int_equal(proto_shm_layout(peer)->ring_off, PROTO_SHM_HEADER);
	proto_shm_destroy(peer);
	proto_shm_destroy(shm);
	proto_shm_destroy(NULL);
}

static void test_create_errors(void **state)
{
	(void)state;
	struct proto_shm *shm = (void *)1;
	int before = count_fds();
	assert_int_equal(proto_shm_create(&shm, 3000, 4096, g_err, sizeof(g_err)), -EINVAL);
	assert_null(shm);
	assert_non_null(strstr(g_err, "power of two"));
	assert_int_equal(proto_shm_create(&shm, 128, 4096, NULL, 0), -EINVAL);
	assert_int_equal(proto_shm_create(&shm, (size_t)PROTO_RING_MAX_CAP * 2, 4096, NULL, 0),
			 -EINVAL);
	assert_int_equal(proto_shm_create(&shm, 4096, 0, NULL, 0), -EINVAL);
	assert_int_equal(proto_shm_create(&shm, 4096, (size_t)PROTO_SHM_MAX_REQ + 1, NULL, 0),
			 -EINVAL);
	assert_int_equal(proto_shm_create(NULL, 4096, 4096, NULL, 0), -EINVAL);
	assert_int_equal(count_fds(), before);
}

/* A memfd of size bytes with a header that header() may spoil. */
static int forged_region(size_t size, bool seal, void (*spoil)(uint8_t *base))
{
	struct proto_shm *shm;
	assert_int_equal(proto_shm_create(&shm, 4096, 4096, NULL, 0), 0);
	uint8_t hdr[PROTO_SHM_HEADER];
	memcpy(hdr, proto_shm_base(shm), sizeof(hdr));
	proto_shm_destroy(shm);

	int fd = memfd_create("forged", MFD_CLOEXEC | (seal ? MFD_ALLOW_SEALING : 0));
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)size), 0);
	uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	memcpy(p, hdr, sizeof(hdr));
	proto_put64(p + 8, size);
	if (spoil)
		spoil(p);
	munmap(p, size);
	if (seal)
		assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
	return fd;
}

static void spoil_magic(uint8_t *p) { p[0] ^= 1; }
static void spoil_version(uint8_t *p) { proto_put16(p + 4, PROTO_SHM_VERSION + 1); }
static void spoil_size(uint8_t *p) { proto_put64(p + 8, proto_get64(p + 8) + 4096); }
static void spoil_ring_cap(uint8_t *p) { proto_put64(p + 24, 3000); }
static void spoil_ring_big(uint8_t *p) { proto_put64(p + 24, 1u << 20); }
static void spoil_ring_off(uint8_t *p) { proto_put64(p + 16, 64); }
static void spoil_req_overlap(uint8_t *p) { proto_put64(p + 32, PROTO_SHM_HEADER + 256); }
static void spoil_req_past(uint8_t *p) { proto_put64(p + 40, UINT64_MAX - 100); }
static void spoil_req_zero(uint8_t *p) { proto_put64(p + 40, 0); }

static void test_attach_errors(void **state)
{
	(void)state;
	struct proto_shm *shm = (void *)1;
	size_t size = 3 * 4096;
	int before = count_fds();

	/* the forged region is fine as long as nothing is spoiled */
	int fd = forged_region(size, true, NULL);
	assert_int_equal(proto_shm_attach(&shm, fd, 1 << 20, g_err, sizeof(g_err)), 0);
	proto_shm_destroy(shm);

	struct {
		void (*spoil)(uint8_t *);
		int rc;
		const char *msg;
	} cases[] = {
		{ spoil_magic, SW_EFORMAT, "magic" },
		{ spoil_version, SW_EVERSION, "version" },
		{ spoil_size, SW_EFORMAT, "size" },
		{ spoil_ring_cap, SW_EFORMAT, "ring_cap" },
		{ spoil_ring_big, SW_EFORMAT, "ring" },
		{ spoil_ring_off, SW_EFORMAT, "ring_off" },
		{ spoil_req_overlap, SW_EFORMAT, "overlaps" },
		{ spoil_req_past, SW_EFORMAT, "request area" },
		{ spoil_req_zero, SW_EFORMAT, "req_size" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		fd = forged_region(size, true, cases[i].spoil);
		g_err[0] = '\0';
		assert_int_equal(proto_shm_attach(&shm, fd, 1 << 20, g_err, sizeof(g_err)),
				 cases[i].rc);
		assert_null(shm);
		if (!strstr(g_err, cases[i].msg))
			fail_msg("case %zu: '%s' lacks '%s'", i, g_err, cases[i].msg);
		close(fd); /* still ours after a failed attach */
	}

	/* not sealed against shrinking */
	fd = forged_region(size, false, NULL);
	assert_int_equal(proto_shm_attach(&shm, fd, 1 << 20, g_err, sizeof(g_err)), -EPERM);
	close(fd);
	/* larger than we accept */
	fd = forged_region(size, true, NULL);
	assert_int_equal(proto_shm_attach(&shm, fd, size - 1, g_err, sizeof(g_err)), SW_ETOOLONG);
	close(fd);
	/* not a page multiple */
	fd = forged_region(size + 8, true, NULL);
	assert_int_equal(proto_shm_attach(&shm, fd, 1 << 20, g_err, sizeof(g_err)), SW_EFORMAT);
	close(fd);
	/* a pipe is no region */
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	assert_int_equal(proto_shm_attach(&shm, pfd[0], 1 << 20, g_err, sizeof(g_err)), -EPERM);
	close(pfd[0]);
	close(pfd[1]);
	assert_int_equal(proto_shm_attach(&shm, -1, 1 << 20, NULL, 0), -EINVAL);
	assert_int_equal(proto_shm_attach(NULL, 0, 1 << 20, NULL, 0), -EINVAL);
	assert_int_equal(count_fds(), before);
}

/* --- ring, one thread ----------------------------------------------------- */

struct ring_pair {
	struct proto_shm *shm;
	struct proto_ring *prod, *cons;
};

static void pair_open(struct ring_pair *rp, size_t cap)
{
	assert_int_equal(proto_shm_create(&rp->shm, cap, 4096, g_err, sizeof(g_err)), 0);
	assert_int_equal(proto_shm_ring(rp->shm, PROTO_RING_PRODUCER, &rp->prod, g_err,
					sizeof(g_err)), 0);
	assert_int_equal(proto_shm_ring(rp->shm, PROTO_RING_CONSUMER, &rp->cons, g_err,
					sizeof(g_err)), 0);
}

static void pair_close(struct ring_pair *rp)
{
	proto_ring_close(rp->prod);
	proto_ring_close(rp->cons);
	proto_shm_destroy(rp->shm);
}

static _Atomic uint64_t *ring_index(struct ring_pair *rp, int which)
{
	const struct proto_shm_layout *l = proto_shm_layout(rp->shm);
	return (_Atomic uint64_t *)(proto_shm_base(rp->shm) + l->ring_off + (which ? 64 : 0));
}

static void test_ring_basic(void **state)
{
	(void)state;
	struct ring_pair rp;
	pair_open(&rp, 256);
	struct proto_record rec;
	assert_int_equal(proto_ring_capacity(rp.prod), 256);
	assert_int_equal(proto_ring_max_payload(rp.prod), 128 - PROTO_RING_HDR);
	assert_int_equal(proto_ring_peek(rp.cons, &rec), -EAGAIN);

	assert_int_equal(proto_ring_push(rp.prod, PROTO_T_TOKENS, 7, "abc", 3), 0);
	assert_int_equal(proto_ring_push(rp.prod, PROTO_T_DONE, 8, NULL, 0), 0);
	assert_int_equal(proto_ring_peek(rp.cons, &rec), 0);
	assert_int_equal(rec.type, PROTO_T_TOKENS);
	assert_int_equal(rec.request_id, 7);
	assert_int_equal(rec.len, 3);
	assert_memory_equal(rec.payload, "abc", 3);
	/* peek again: the same record until it is consumed */
	assert_int_equal(proto_ring_peek(rp.cons, &rec), 0);
	assert_int_equal(rec.request_id, 7);
	assert_int_equal(proto_ring_consume(rp.cons), 0);
	assert_int_equal(proto_ring_consume(rp.cons), -EINVAL); /* nothing peeked */
	char buf[8];
	assert_int_equal(proto_ring_pop(rp.cons, &rec, buf, sizeof(buf)), 0);
	assert_int_equal(rec.type, PROTO_T_DONE);
	assert_int_equal(rec.len, 0);
	assert_int_equal(proto_ring_pop(rp.cons, &rec, buf, sizeof(buf)), -EAGAIN);

	/* too long for the ring; exactly the maximum fits */
	uint8_t big[256];
	memset(big, 0x5a, sizeof(big));
	size_t max = proto_ring_max_payload(rp.prod);
	assert_int_equal(proto_ring_push(rp.prod, 1, 1, big, max + 1), SW_ETOOLONG);
	assert_int_equal(proto_ring_push(rp.prod, 1, 1, big, max), 0);
	/* a small buffer leaves the record in place */
	assert_int_equal(proto_ring_pop(rp.cons, &rec, buf, sizeof(buf)), SW_ETOOLONG);
	assert_int_equal(rec.len, max);
	assert_int_equal(proto_ring_consume(rp.cons), -EINVAL);
	assert_int_equal(proto_ring_pop(rp.cons, &rec, big, sizeof(big)), 0);
	assert_int_equal(rec.len, max);

	/* full: SW_EBUSY, and nothing changes until the consumer moves */
	int pushed = 0;
	while (proto_ring_push(rp.prod, 2, (uint64_t)pushed, "0123456789", 10) == 0)
		pushed++;
	/* 32 bytes each from offset 176: one 16-byte padding record at the
	 * wrap leaves room for 7 */
	assert_int_equal(pushed, 7);
	assert_int_equal(proto_ring_push(rp.prod, 2, 99, "x", 1), SW_EBUSY);
	assert_int_equal(proto_ring_pop(rp.cons, &rec, buf, sizeof(buf)), SW_ETOOLONG);
	char b16[16];
	for (int i = 0; i < pushed; i++) {
		assert_int_equal(proto_ring_pop(rp.cons, &rec, b16, sizeof(b16)), 0);
		assert_int_equal(rec.request_id, (uint64_t)i);
		assert_memory_equal(rec.payload, "0123456789", 10);
	}
	assert_int_equal(proto_ring_peek(rp.cons, &rec), -EAGAIN);

	/* roles and arguments */
	uint8_t *p;
	assert_int_equal(proto_ring_push(rp.cons, 1, 1, "x", 1), -EINVAL);
	assert_int_equal(proto_ring_peek(rp.prod, &rec), -EINVAL);
	assert_int_equal(proto_ring_push(rp.prod, 0, 1, "x", 1), -EINVAL); /* type 0 is padding */
	assert_int_equal(proto_ring_push(rp.prod, 1, 1, NULL, 1), -EINVAL);
	assert_int_equal(proto_ring_commit(rp.prod, 1, 1, 0), -EINVAL);     /* no reservation */
	assert_int_equal(proto_ring_reserve(rp.prod, 16, NULL), -EINVAL);
	assert_int_equal(proto_ring_reserve(rp.cons, 16, &p), -EINVAL);
	assert_null(p);
	proto_ring_close(NULL);
	pair_close(&rp);
}

/* reserve/commit in place, a shorter commit, and the padding record. */
static void test_ring_reserve_and_wrap(void **state)
{
	(void)state;
	struct ring_pair rp;
	pair_open(&rp, 256);
	struct proto_record rec;
	uint8_t *p;
	assert_int_equal(proto_ring_reserve(rp.prod, 100, &p), 0);
	assert_int_equal((uintptr_t)p % PROTO_RING_ALIGN, 0);
	memcpy(p, "in place", 8);
	assert_int_equal(proto_ring_peek(rp.cons, &rec), -EAGAIN); /* not yet published */
	assert_int_equal(proto_ring_commit(rp.prod, PROTO_T_TOKENS, 3, 101), -EINVAL);
	assert_int_equal(proto_ring_commit(rp.prod, PROTO_T_TOKENS, 3, 8), 0);
	assert_int_equal(proto_ring_commit(rp.prod, PROTO_T_TOKENS, 3, 8), -EINVAL); /* once */
	/* the unused part of the reservation went back: head moved 16 + 16 */
	assert_int_equal(atomic_load(ring_index(&rp, 0)), 32);
	assert_int_equal(proto_ring_pop(rp.cons, &rec, NULL, 0), SW_ETOOLONG);
	char buf[128];
	assert_int_equal(proto_ring_pop(rp.cons, &rec, buf, sizeof(buf)), 0);
	assert_memory_equal(buf, "in place", 8);

	/* Walk a max-size record around every 16-byte position: padding is
	 * written whenever it does not fit before the end. */
	size_t max = proto_ring_max_payload(rp.prod);
	uint8_t src[128], dst[128];
	for (int round = 0; round < 64; round++) {
		for (size_t i = 0; i < max; i++)
			src[i] = (uint8_t)(round * 7 + i);
		assert_int_equal(proto_ring_push(rp.prod, 5, (uint64_t)round, src, max), 0);
		assert_int_equal(proto_ring_pop(rp.cons, &rec, dst, sizeof(dst)), 0);
		assert_int_equal(rec.request_id, (uint64_t)round);
		assert_memory_equal(dst, src, max);
		/* then a 0-byte record to shift the position by 16 */
		assert_int_equal(proto_ring_push(rp.prod, 6, 0, NULL, 0), 0);
		assert_int_equal(proto_ring_pop(rp.cons, &rec, dst, sizeof(dst)), 0);
		assert_int_equal(rec.type, 6);
	}
	pair_close(&rp);
}

/* Neither side trusts the other's index or the record headers. */
static void test_ring_corruption(void **state)
{
	(void)state;
	struct ring_pair rp;
	struct proto_record rec;
	uint8_t *p;
	pair_open(&rp, 256);
	_Atomic uint64_t *head = ring_index(&rp, 0), *tail = ring_index(&rp, 1);

	/* consumer's tail beyond the producer's head */
	atomic_store(tail, 64);
	assert_int_equal(proto_ring_reserve(rp.prod, 1, &p), SW_EFORMAT);
	assert_null(p);
	atomic_store(tail, 0);
	/* misaligned tail */
	assert_int_equal(proto_ring_push(rp.prod, 1, 1, "a", 1), 0);
	atomic_store(tail, 8);
	assert_int_equal(proto_ring_push(rp.prod, 1, 1, "a", 1), SW_EFORMAT);
	atomic_store(tail, 0);

	/* producer's head more than a ring ahead */
	atomic_store(head, 512);
	assert_int_equal(proto_ring_peek(rp.cons, &rec), SW_EFORMAT);
	atomic_store(head, 24);
	assert_int_equal(proto_ring_peek(rp.cons, &rec), SW_EFORMAT);
	atomic_store(head, 32);

	/* a record longer than what was published */
	uint8_t *data = proto_shm_base(rp.shm) + proto_shm_layout(rp.shm)->ring_off +
			PROTO_RING_CTL;
	proto_put32(data, 100);
	assert_int_equal(proto_ring_peek(rp.cons, &rec), SW_EFORMAT);
	proto_put32(data, UINT32_MAX);
	assert_int_equal(proto_ring_peek(rp.cons, &rec), SW_EFORMAT);
	/* padding that stops short of the end */
	proto_put32(data, 0);
	proto_put16(data + 4, 0);
	assert_int_equal(proto_ring_peek(rp.cons, &rec), SW_EFORMAT);
	/* restore: a valid record again */
	proto_put32(data, 1);
	proto_put16(data + 4, 1);
	assert_int_equal(proto_ring_peek(rp.cons, &rec), 0);
	assert_int_equal(proto_ring_consume(rp.cons), 0);

	/* opening on corrupt indices fails */
	struct proto_ring *r = (void *)1;
	atomic_store(head, 1000);
	assert_int_equal(proto_shm_ring(rp.shm, PROTO_RING_CONSUMER, &r, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_null(r);
	atomic_store(head, 32);

	/* bad ring blocks */
	static _Alignas(64) uint8_t mem[PROTO_RING_CTL + 512];
	assert_int_equal(proto_ring_format(mem, sizeof(mem)), 0);
	assert_int_equal(proto_ring_format(mem, sizeof(mem) - 16), -EINVAL);
	assert_int_equal(proto_ring_format(mem + 8, sizeof(mem) - 64), -EINVAL);
	assert_int_equal(proto_ring_format(NULL, sizeof(mem)), -EINVAL);
	assert_int_equal(proto_ring_open(&r, mem, 100, PROTO_RING_PRODUCER, NULL, 0), -EINVAL);
	assert_int_equal(proto_ring_open(&r, mem, sizeof(mem), 0, NULL, 0), -EINVAL);
	assert_int_equal(proto_ring_open(&r, mem, sizeof(mem), PROTO_RING_PRODUCER, NULL, 0), 0);
	proto_ring_close(r);
	assert_int_equal(proto_shm_ring(NULL, PROTO_RING_PRODUCER, &r, NULL, 0), -EINVAL);
	pair_close(&rp);
}

/* --- ring, two threads / two processes ------------------------------------- */

/* Record n: type 1 + n % 14, request id n * 3 + 1, n * 37 % 97 bytes
 * (0..96, so records take 1..7 lines of 16) of (n + i) * 131 mod 256. */
static size_t rec_len(uint64_t n)
{
	return (size_t)(n * 37 % 97);
}

static void rec_fill(uint64_t n, uint8_t *p)
{
	for (size_t i = 0, l = rec_len(n); i < l; i++)
		p[i] = (uint8_t)((n + i) * 131);
}

static bool rec_check(uint64_t n, const struct proto_record *r)
{
	if (r->type != 1 + n % 14 || r->request_id != n * 3 + 1 || r->len != rec_len(n))
		return false;
	for (size_t i = 0; i < r->len; i++)
		if (r->payload[i] != (uint8_t)((n + i) * 131))
			return false;
	return true;
}

struct producer_arg {
	struct proto_ring *ring;
	uint64_t n;
	uint64_t busy; /* times the ring was full */
	int rc;
};

static void *producer(void *arg)
{
	struct producer_arg *a = arg;
	for (uint64_t n = 0; n < a->n; n++) {
		for (;;) {
			uint8_t *p;
			int rc = proto_ring_reserve(a->ring, rec_len(n), &p);
			if (rc == SW_EBUSY) {
				a->busy++;
				sched_yield();
				continue;
			}
			if (rc == 0) {
				rec_fill(n, p);
				rc = proto_ring_commit(a->ring, (uint16_t)(1 + n % 14), n * 3 + 1,
						       rec_len(n));
			}
			if (rc) {
				a->rc = rc;
				return NULL;
			}
			break;
		}
	}
	return NULL;
}

/* Consumes n records; returns 0 or the first bad record number + 1. */
static uint64_t consume_all(struct proto_ring *ring, uint64_t n, uint64_t *empty)
{
	for (uint64_t i = 0; i < n; i++) {
		struct proto_record r;
		int rc;
		while ((rc = proto_ring_peek(ring, &r)) == -EAGAIN) {
			(*empty)++;
			sched_yield();
		}
		if (rc || !rec_check(i, &r) || proto_ring_consume(ring))
			return i + 1;
	}
	return 0;
}

static void test_ring_two_threads(void **state)
{
	(void)state;
	const uint64_t n = scaled(1000000);
	struct ring_pair rp;
	pair_open(&rp, 4096);
	struct producer_arg pa = { .ring = rp.prod, .n = n };
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, producer, &pa), 0);
	uint64_t empty = 0;
	uint64_t bad = consume_all(rp.cons, n, &empty);
	assert_int_equal(pthread_join(t, NULL), 0);
	if (bad)
		fail_msg("record %llu wrong", (unsigned long long)(bad - 1));
	assert_int_equal(pa.rc, 0);
	struct proto_record r;
	assert_int_equal(proto_ring_peek(rp.cons, &r), -EAGAIN);
	print_message("%llu records through a 4 KiB ring: producer found it full %llu times, "
		      "consumer empty %llu times\n", (unsigned long long)n,
		      (unsigned long long)pa.busy, (unsigned long long)empty);
	pair_close(&rp);
}

/* The region travels to a child over a socketpair (SCM_RIGHTS); the child
 * attaches its own mapping and consumes while the parent produces. */
static void test_ring_two_processes(void **state)
{
	(void)state;
	const uint64_t n = scaled(200000);
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(sv[0]);
		uint8_t b[PROTO_FRAME_SIZE];
		int fd;
		struct proto_frame f;
		struct proto_shm *shm;
		struct proto_ring *ring;
		if (proto_recv_frame(sv[1], b, &fd) || fd < 0 ||
		    proto_frame_decode(b, sizeof(b), &f, NULL, 0) || f.type != PROTO_T_HELLO_REPLY)
			_exit(2);
		if (proto_shm_attach(&shm, fd, 1 << 20, NULL, 0) ||
		    proto_shm_layout(shm)->size != f.payload_length)
			_exit(3);
		if (proto_shm_ring(shm, PROTO_RING_CONSUMER, &ring, NULL, 0))
			_exit(4);
		uint64_t empty = 0;
		if (consume_all(ring, n, &empty))
			_exit(5);
		proto_ring_close(ring);
		proto_shm_destroy(shm);
		_exit(0);
	}
	close(sv[1]);
	struct proto_shm *shm;
	struct proto_ring *ring;
	assert_int_equal(proto_shm_create(&shm, 8192, 4096, NULL, 0), 0);
	assert_int_equal(proto_shm_ring(shm, PROTO_RING_PRODUCER, &ring, NULL, 0), 0);
	struct proto_frame f;
	proto_frame_init(&f, PROTO_T_HELLO_REPLY, 0);
	f.payload_length = proto_shm_layout(shm)->size;
	assert_int_equal(proto_send_frame(sv[0], &f, proto_shm_fd(shm)), 0);
	struct producer_arg pa = { .ring = ring, .n = n };
	producer(&pa);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_int_equal(pa.rc, 0);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	proto_ring_close(ring);
	proto_shm_destroy(shm);
	close(sv[0]);
}

/* --- socket helpers ----------------------------------------------------------- */

static void test_fd_passing(void **state)
{
	(void)state;
	int before = count_fds();
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	struct proto_shm *shm;
	assert_int_equal(proto_shm_create(&shm, 256, 4096, NULL, 0), 0);
	struct proto_frame f, g;
	proto_frame_init(&f, PROTO_T_HELLO_REPLY, 0);
	f.payload_length = proto_shm_layout(shm)->size;
	assert_int_equal(proto_send_frame(sv[0], &f, proto_shm_fd(shm)), 0);
	uint8_t b[PROTO_FRAME_SIZE];
	int fd = -5;
	assert_int_equal(proto_recv_frame(sv[1], b, &fd), 0);
	assert_int_equal(proto_frame_decode(b, sizeof(b), &g, NULL, 0), 0);
	assert_memory_equal(&f, &g, sizeof(f));
	assert_true(fd >= 0);
	assert_int_not_equal(fd, proto_shm_fd(shm));
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	struct stat s1, s2;
	assert_int_equal(fstat(fd, &s1), 0);
	assert_int_equal(fstat(proto_shm_fd(shm), &s2), 0);
	assert_int_equal(s1.st_ino, s2.st_ino);
	struct proto_shm *peer;
	assert_int_equal(proto_shm_attach(&peer, fd, 1 << 20, NULL, 0), 0);
	memcpy(proto_shm_req_area(peer), "from the client", 15);
	assert_memory_equal(proto_shm_req_area(shm), "from the client", 15);
	proto_shm_destroy(peer);

	/* a frame without a descriptor; fd NULL */
	proto_frame_init(&f, PROTO_T_STATS, 4);
	assert_int_equal(proto_send_frame(sv[1], &f, -1), 0);
	assert_int_equal(proto_recv_frame(sv[0], b, &fd), 0);
	assert_int_equal(fd, -1);
	/* a descriptor nobody asked for is closed */
	assert_int_equal(proto_send_frame(sv[1], &f, proto_shm_fd(shm)), 0);
	assert_int_equal(proto_recv_frame(sv[0], b, NULL), 0);

	proto_shm_destroy(shm);
	close(sv[0]);
	close(sv[1]);
	assert_int_equal(count_fds(), before);
}

static void test_recv_errors(void **state)
{
	(void)state;
	int before = count_fds();
	int sv[2];
	uint8_t b[PROTO_FRAME_SIZE];
	int fd;
	struct proto_frame f;
	proto_frame_init(&f, PROTO_T_CANCEL, 1);

	/* two descriptors with one frame: refused, both closed */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	int two[2] = { dup(0), dup(1) };
	proto_frame_encode(&f, b);
	struct iovec iov = { b, sizeof(b) };
	union {
		struct cmsghdr h;
		char c[CMSG_SPACE(2 * sizeof(int))];
	} ctl;
	memset(&ctl, 0, sizeof(ctl));
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.c,
			     .msg_controllen = sizeof(ctl.c) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(2 * sizeof(int));
	memcpy(CMSG_DATA(c), two, sizeof(two));
	assert_int_equal(sendmsg(sv[0], &mh, 0), (ssize_t)sizeof(b));
	close(two[0]);
	close(two[1]);
	fd = 7;
	assert_int_equal(proto_recv_frame(sv[1], b, &fd), SW_EFORMAT);
	assert_int_equal(fd, -1);

	/* non-blocking and nothing there */
	assert_int_equal(fcntl(sv[1], F_SETFL, O_NONBLOCK), 0);
	assert_int_equal(proto_recv_frame(sv[1], b, &fd), -EAGAIN);
	assert_int_equal(fcntl(sv[1], F_SETFL, 0), 0);

	/* half a frame, then the peer goes away */
	assert_int_equal(write(sv[0], b, 10), 10);
	close(sv[0]);
	assert_int_equal(proto_recv_frame(sv[1], b, &fd), SW_EFORMAT);
	/* clean end of stream */
	assert_int_equal(proto_recv_frame(sv[1], b, &fd), SW_ECLOSED);
	/* writing to a closed peer */
	assert_int_equal(proto_send_frame(sv[1], &f, -1), SW_ECLOSED);
	close(sv[1]);

	assert_int_equal(proto_send_frame(-1, &f, -1), -EINVAL);
	assert_int_equal(proto_send_frame(0, NULL, -1), -EINVAL);
	assert_int_equal(proto_recv_frame(-1, b, &fd), -EINVAL);
	assert_int_equal(count_fds(), before);
}

static void test_partial_frames(void **state)
{
	(void)state;
	/* a frame that arrives a byte at a time is still one frame */
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	struct proto_frame f, g;
	proto_frame_init(&f, PROTO_T_EMBED, 77);
	uint8_t b[PROTO_FRAME_SIZE], r[PROTO_FRAME_SIZE];
	proto_frame_encode(&f, b);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(sv[1]);
		for (size_t i = 0; i < sizeof(b); i++) {
			if (write(sv[0], b + i, 1) != 1)
				_exit(1);
			usleep(200);
		}
		_exit(0);
	}
	close(sv[0]);
	assert_int_equal(proto_recv_frame(sv[1], r, NULL), 0);
	assert_int_equal(proto_frame_decode(r, sizeof(r), &g, NULL, 0), 0);
	assert_int_equal(g.request_id, 77);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(sv[1]);
}

static void test_peercred(void **state)
{
	(void)state;
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	uid_t uid;
	gid_t gid;
	pid_t pid;
	assert_int_equal(proto_peercred(sv[0], &uid, &gid, &pid), 0);
	assert_int_equal(uid, getuid());
	assert_int_equal(gid, getgid());
	assert_int_equal(pid, getpid());
	assert_int_equal(proto_peercred(sv[1], NULL, NULL, NULL), 0);
	close(sv[0]);
	close(sv[1]);
	assert_int_equal(proto_peercred(-1, &uid, NULL, NULL), -EBADF);
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	assert_int_equal(proto_peercred(pfd[0], &uid, NULL, NULL), -ENOTSOCK);
	close(pfd[0]);
	close(pfd[1]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_layout_and_seals),
		cmocka_unit_test(test_create_errors),
		cmocka_unit_test(test_attach_errors),
		cmocka_unit_test(test_ring_basic),
		cmocka_unit_test(test_ring_reserve_and_wrap),
		cmocka_unit_test(test_ring_corruption),
		cmocka_unit_test(test_ring_two_threads),
		cmocka_unit_test(test_ring_two_processes),
		cmocka_unit_test(test_fd_passing),
		cmocka_unit_test(test_recv_errors),
		cmocka_unit_test(test_partial_frames),
		cmocka_unit_test(test_peercred),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
