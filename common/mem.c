/* mem.c - backing reserved memory at once, and reading a process's RSS
 * (common/mem.h). */
#include "common/mem.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/err.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 uapi; older headers lack it */
#endif

static _Atomic int method; /* 0: not probed yet, else enum sw_mem_method */

static size_t page_size(void)
{
	static _Atomic size_t cached;
	size_t ps = atomic_load_explicit(&cached, memory_order_relaxed);

	if (!ps) {
		long v = sysconf(_SC_PAGESIZE);
		ps = v > 0 ? (size_t)v : 4096;
		atomic_store_explicit(&cached, ps, memory_order_relaxed);
	}
	return ps;
}

/* madvise(MADV_POPULATE_WRITE) over whole pages; 0 or a negated errno. */
static int populate(uintptr_t start, uintptr_t end)
{
	int rc;

	do
		rc = madvise((void *)start, end - start, MADV_POPULATE_WRITE);
	while (rc != 0 && errno == EINTR);
	return rc ? -errno : 0;
}

/* Whether this kernel has MADV_POPULATE_WRITE, asked on a page of our own:
 * EINVAL on the caller's memory could also mean an unfit mapping. */
static enum sw_mem_method probe(void)
{
	size_t ps = page_size();
	void *pg = mmap(NULL, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	enum sw_mem_method m = SW_MEM_TOUCH;

	if (pg == MAP_FAILED)
		return SW_MEM_TOUCH; /* decide on the next call */
	if (populate((uintptr_t)pg, (uintptr_t)pg + ps) == 0)
		m = SW_MEM_POPULATE;
	munmap(pg, ps);
	atomic_store(&method, (int)m);
	return m;
}

enum sw_mem_method sw_mem_prefault_method(void)
{
	int m = atomic_load(&method);

	return m ? (enum sw_mem_method)m : probe();
}

const char *sw_mem_method_name(enum sw_mem_method m)
{
	return m == SW_MEM_POPULATE ? "MADV_POPULATE_WRITE" : "a write per page";
}

void sw_mem__force_method(enum sw_mem_method m)
{
	atomic_store(&method, (int)m);
}

/* One write fault per page, each inside [p, p + n): the first byte, then
 * the first byte of every later page. OR with 0 stores back what is there
 * (a plain store of 0 would wipe a debug fill). */
static void touch(uint8_t *p, size_t n)
{
	size_t ps = page_size();
	uintptr_t a = (uintptr_t)p, end = a + n;

	for (uintptr_t q = a; q < end; q = (q | (ps - 1)) + 1)
		__atomic_fetch_or((uint8_t *)q, 0, __ATOMIC_RELAXED);
}

int sw_mem_prefault(void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p, ps = page_size();

	if (n == 0)
		return 0;
	if (!p || n > UINTPTR_MAX - a)
		return -EINVAL;
	if (sw_mem_prefault_method() == SW_MEM_TOUCH) {
		touch(p, n);
		return 0;
	}
	/* Whole pages: populating a page shared with a neighbour writes
	 * nothing, it only backs it. */
	return populate(a & ~(ps - 1), ((a + n - 1) | (ps - 1)) + 1);
}

/* The value in kB of "key:" in a /proc status text, in bytes. */
static int status_field(const char *text, const char *key, uint64_t *out)
{
	const char *s = strstr(text, key);
	char *end;
	unsigned long long kb;

	if (!s)
		return SW_EFORMAT;
	s += strlen(key);
	kb = strtoull(s, &end, 10);
	if (end == s)
		return SW_EFORMAT;
	*out = (uint64_t)kb * 1024;
	return 0;
}

int sw_mem_rss(pid_t pid, struct sw_mem_rss *out)
{
	char path[64], text[4096];
	ssize_t len = 0, r;
	int fd, rc;

	memset(out, 0, sizeof(*out));
	if (pid > 0)
		snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	else
		snprintf(path, sizeof(path), "/proc/self/status");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (len < (ssize_t)sizeof(text) - 1 &&
	       (r = read(fd, text + len, sizeof(text) - 1 - (size_t)len)) != 0) {
		if (r < 0) {
			if (errno == EINTR)
				continue;
			rc = -errno;
			close(fd);
			return rc;
		}
		len += r;
	}
	close(fd);
	text[len] = '\0';
	if ((rc = status_field(text, "\nVmRSS:", &out->rss)) ||
	    (rc = status_field(text, "\nRssAnon:", &out->anon)) ||
	    (rc = status_field(text, "\nRssFile:", &out->file)) ||
	    (rc = status_field(text, "\nRssShmem:", &out->shmem))) {
		memset(out, 0, sizeof(*out));
		return rc;
	}
	return 0;
}

#define BIG_ALIGN ((size_t)2 << 20)

static size_t big_size(size_t n)
{
	return (n + BIG_ALIGN - 1) / BIG_ALIGN * BIG_ALIGN;
}

void *sw_mem_map_big(size_t n)
{
	size_t len = big_size(n), head;
	uint8_t *p, *a;

	if (!n) {
		errno = EINVAL;
		return NULL;
	}
	/* Over-map by one alignment unit and trim both ends. */
	p = mmap(NULL, len + BIG_ALIGN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		 0);
	if (p == MAP_FAILED)
		return NULL;
	a = (uint8_t *)(((uintptr_t)p + BIG_ALIGN - 1) & ~(uintptr_t)(BIG_ALIGN - 1));
	head = (size_t)(a - p);
	if (head)
		munmap(p, head);
	if (BIG_ALIGN - head)
		munmap(a + len, BIG_ALIGN - head);
#ifdef MADV_HUGEPAGE
	/* Advice only: without THP the pages are small, nothing else changes. */
	(void)madvise(a, len, MADV_HUGEPAGE);
#endif
	return a;
}

void sw_mem_unmap_big(void *p, size_t n)
{
	if (p)
		munmap(p, big_size(n));
}

int sw_mem_drop_file_pages(const void *p, size_t n)
{
	long ps = sysconf(_SC_PAGESIZE);
	uintptr_t lo, hi;

	if (ps <= 0 || !p)
		return -EINVAL;
	lo = ((uintptr_t)p + (uintptr_t)ps - 1) & ~(uintptr_t)(ps - 1);
	hi = ((uintptr_t)p + n) & ~(uintptr_t)(ps - 1);
	if (hi <= lo)
		return 0;
	return madvise((void *)lo, hi - lo, MADV_DONTNEED) ? -errno : 0;
}
