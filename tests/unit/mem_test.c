/* mem_test.c - sw_mem_prefault backs exactly the pages of its range (both
 * methods), keeps every byte, stays inside its pages, passes the kernel's
 * errors on; under RLIMIT_AS it needs no address space beyond the
 * reservation; sw_mem_rss reads what a process holds; sw_mem_map_big
 * and sw_mem_drop_file_pages.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/err.h"
#include "common/mem.h"

static size_t ps;

/* A fresh private anonymous mapping of n pages, none of them backed (no
 * transparent huge pages, which would back a neighbour along). */
static uint8_t *fresh(size_t pages)
{
	uint8_t *p = mmap(NULL, pages * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			  -1, 0);

	assert_true(p != MAP_FAILED);
	madvise(p, pages * ps, MADV_NOHUGEPAGE);
	return p;
}

/* mincore's answer for each page of [p, p + pages * ps): 1 resident. */
static void resident(uint8_t *p, size_t pages, unsigned char *vec)
{
	assert_int_equal(mincore(p, pages * ps, vec), 0);
	for (size_t i = 0; i < pages; i++)
		vec[i] &= 1;
}

static int setup(void **state)
{
	(void)state;
	ps = (size_t)sysconf(_SC_PAGESIZE);
	return 0;
}

/* Whether the kernel has MADV_POPULATE_WRITE (probes again). */
static bool have_populate(void)
{
	sw_mem__force_method(0);
	return sw_mem_prefault_method() == SW_MEM_POPULATE;
}

static int back_to_probe(void **state)
{
	(void)state;
	sw_mem__force_method(0);
	return 0;
}

static void test_method(void **state)
{
	(void)state;
	enum sw_mem_method m = sw_mem_prefault_method();

	printf("    this kernel: %s\n", sw_mem_method_name(m));
	assert_true(m == SW_MEM_POPULATE || m == SW_MEM_TOUCH);
	assert_int_equal(sw_mem_prefault_method(), m); /* probed once */
}

/* An unaligned range backs the pages it touches, and only those. */
static void backs_its_pages(enum sw_mem_method m)
{
	enum { PAGES = 64 };
	unsigned char vec[PAGES];
	uint8_t *p = fresh(PAGES);

	sw_mem__force_method(m);
	resident(p, PAGES, vec);
	for (size_t i = 0; i < PAGES; i++)
		assert_int_equal(vec[i], 0);
	/* from 100 bytes into page 1 to 100 bytes into page 11 */
	assert_int_equal(sw_mem_prefault(p + ps + 100, 10 * ps), 0);
	resident(p, PAGES, vec);
	for (size_t i = 0; i < PAGES; i++)
		if (vec[i] != (i >= 1 && i <= 11))
			fail_msg("%s: page %zu resident %d", sw_mem_method_name(m), i, vec[i]);
	/* one byte backs its page */
	assert_int_equal(sw_mem_prefault(p + 40 * ps + ps - 1, 1), 0);
	resident(p, PAGES, vec);
	assert_int_equal(vec[39], 0);
	assert_int_equal(vec[40], 1);
	assert_int_equal(vec[41], 0);
	munmap(p, PAGES * ps);
}

static void test_backs_its_pages(void **state)
{
	(void)state;
	backs_its_pages(SW_MEM_TOUCH);
	if (have_populate())
		backs_its_pages(SW_MEM_POPULATE);
	else
		printf("    MADV_POPULATE_WRITE: not in this kernel, touch only\n");
}

/* Every byte keeps its value: written ones (a debug fill) and fresh zeros. */
static void keeps_bytes(enum sw_mem_method m)
{
	enum { PAGES = 16 };
	uint8_t *p = fresh(PAGES);

	sw_mem__force_method(m);
	for (size_t i = 0; i < PAGES * ps; i += 3 * ps + 7)
		p[i] = 0xDD;
	p[ps] = 0xA5;
	assert_int_equal(sw_mem_prefault(p, PAGES * ps), 0);
	for (size_t i = 0; i < PAGES * ps; i++) {
		uint8_t want = i == ps ? 0xA5 : i % (3 * ps + 7) == 0 ? 0xDD : 0;
		if (p[i] != want)
			fail_msg("%s: byte %zu is %#x, was %#x", sw_mem_method_name(m), i, p[i],
				 want);
	}
	munmap(p, PAGES * ps);
}

static void test_keeps_bytes(void **state)
{
	(void)state;
	keeps_bytes(SW_MEM_TOUCH);
	if (have_populate())
		keeps_bytes(SW_MEM_POPULATE);
}

/* Between two PROT_NONE guard pages: a write outside the range's pages
 * would kill the test. Ranges that start and end on and off a boundary. */
static void stays_inside(enum sw_mem_method m)
{
	enum { PAGES = 8 };
	uint8_t *g = fresh(PAGES + 2), *p = g + ps;

	sw_mem__force_method(m);
	assert_int_equal(mprotect(g, ps, PROT_NONE), 0);
	assert_int_equal(mprotect(g + (PAGES + 1) * ps, ps, PROT_NONE), 0);
	assert_int_equal(sw_mem_prefault(p, PAGES * ps), 0);
	assert_int_equal(sw_mem_prefault(p + 1, PAGES * ps - 1), 0);
	assert_int_equal(sw_mem_prefault(p, PAGES * ps - 1), 0);
	assert_int_equal(sw_mem_prefault(p + PAGES * ps - 1, 1), 0);
	assert_int_equal(sw_mem_prefault(p + 5, 1), 0);
	munmap(g, (PAGES + 2) * ps);
}

static void test_stays_inside(void **state)
{
	(void)state;
	stays_inside(SW_MEM_TOUCH);
	if (have_populate())
		stays_inside(SW_MEM_POPULATE);
}

static void test_bad_arguments(void **state)
{
	(void)state;
	uint8_t b[8];

	assert_int_equal(sw_mem_prefault(NULL, 0), 0);
	assert_int_equal(sw_mem_prefault(b, 0), 0);
	assert_int_equal(sw_mem_prefault(NULL, 1), -EINVAL);
	assert_int_equal(sw_mem_prefault((void *)(UINTPTR_MAX - 10), 100), -EINVAL);
	/* a stack buffer is private and writable: fine */
	assert_int_equal(sw_mem_prefault(b, sizeof(b)), 0);
}

/* The kernel's refusals come back as its errno (MADV_POPULATE_WRITE only:
 * a write per page cannot see them, it would fault). */
static void test_kernel_errors(void **state)
{
	(void)state;
	uint8_t *p;
	int rc;

	if (!have_populate()) {
		printf("    MADV_POPULATE_WRITE: not in this kernel, skipped\n");
		return;
	}
	/* a hole in the range: the kernel's "not mapped" ENOMEM */
	p = fresh(4);
	assert_int_equal(munmap(p + 2 * ps, ps), 0);
	rc = sw_mem_prefault(p, 4 * ps);
	printf("    range with a hole: %s\n", sw_errname(rc));
	assert_int_equal(rc, -ENOMEM);
	munmap(p, 2 * ps);
	munmap(p + 3 * ps, ps);
	/* read-only: cannot be populated for writing */
	p = fresh(2);
	assert_int_equal(mprotect(p, 2 * ps, PROT_READ), 0);
	rc = sw_mem_prefault(p, 2 * ps);
	printf("    read-only mapping: %s\n", sw_errname(rc));
	assert_true(rc == -EINVAL || rc == -EFAULT);
	munmap(p, 2 * ps);
	/* forcing a method the kernel lacks would fail, never fall over: here
	 * it has it, so forcing it changes nothing */
	sw_mem__force_method(SW_MEM_POPULATE);
	p = fresh(1);
	assert_int_equal(sw_mem_prefault(p, ps), 0);
	munmap(p, ps);
}

/* The address-space size of this process (VmSize), in bytes. */
static uint64_t vm_size(void)
{
	char text[4096];
	FILE *f = fopen("/proc/self/status", "r");
	size_t n;
	char *s;

	assert_non_null(f);
	n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	text[n] = '\0';
	s = strstr(text, "VmSize:");
	assert_non_null(s);
	return strtoull(s + 7, NULL, 10) * 1024;
}

/* RLIMIT_AS limits mappings, which a pool makes when it is reserved:
 * backing it afterwards needs no address space, so under a limit the
 * reservation is what fails (cleanly: NULL), never the prefault. In a
 * child, so the limit stays there. */
static void test_rlimit_as(void **state)
{
	(void)state;
	pid_t pid;
	int st;

	if (getenv("SWARM_UNDER_VALGRIND")) {
		printf("    under valgrind (its own mappings count): skipped\n");
		return;
	}
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	printf("    a sanitizer maps terabytes of shadow (RLIMIT_AS refuses its own allocator): skipped\n");
	return;
#endif
	fflush(stdout);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		size_t mib = 1u << 20;
		struct rlimit rl;
		uint8_t *a, *b;

		a = malloc(32 * mib); /* reserved before the limit */
		if (!a)
			_exit(10);
		rl.rlim_cur = rl.rlim_max = vm_size() + 16 * mib;
		if (setrlimit(RLIMIT_AS, &rl) != 0)
			_exit(11);
		if (sw_mem_prefault(a, 32 * mib) != 0) /* backed under the limit */
			_exit(12);
		b = malloc(64 * mib); /* a second pool: over the limit */
		if (b)
			_exit(13);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	if (WEXITSTATUS(st) != 0)
		fail_msg("child under RLIMIT_AS exited %d", WEXITSTATUS(st));
}

static void test_rss(void **state)
{
	(void)state;
	enum { PAGES = 4096 };
	struct sw_mem_rss before, after, other;
	uint8_t *p = fresh(PAGES);

	assert_int_equal(sw_mem_rss(0, &before), 0);
	assert_true(before.rss > 0);
	assert_true(before.anon + before.file + before.shmem == before.rss);
	assert_int_equal(sw_mem_prefault(p, PAGES * ps), 0);
	assert_int_equal(sw_mem_rss(getpid(), &after), 0);
	printf("    RssAnon %llu -> %llu KiB after backing %zu KiB\n",
	       (unsigned long long)(before.anon >> 10), (unsigned long long)(after.anon >> 10),
	       PAGES * ps >> 10);
	/* the other 2% is whatever else this process did meanwhile */
	assert_true(after.anon >= before.anon + PAGES * ps * 98 / 100);
	munmap(p, PAGES * ps);

	assert_int_equal(sw_mem_rss(1 << 30, &other), -ENOENT); /* beyond pid_max */
	assert_true(other.rss == 0 && other.anon == 0);
}

/* sw_mem_map_big: 2 MiB aligned, n rounded up, writable and zero, freed
 * whole; n 0 refused. */
static void test_map_big(void **state)
{
	(void)state;
	const size_t n = 5 * ps + 3, mib2 = (size_t)2 << 20;
	uint8_t *p = sw_mem_map_big(n);

	assert_non_null(p);
	assert_int_equal((uintptr_t)p % mib2, 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(p[i], 0);
	memset(p, 0x5a, mib2); /* the whole rounded size is the caller's */
	assert_int_equal(p[mib2 - 1], 0x5a);
	sw_mem_unmap_big(p, n);
	errno = 0;
	assert_null(sw_mem_map_big(0));
	assert_int_equal(errno, EINVAL);
	sw_mem_unmap_big(NULL, 1); /* accepted */
}

/* Rss of the mapping that holds p, from /proc/self/smaps, in bytes
 * (mincore would tell the page cache's residency, not the process's). The
 * kernel may have merged the mapping with a neighbour (valgrind places
 * mappings side by side): callers compare differences. */
static size_t vma_rss(const void *p)
{
	char line[256];
	FILE *f = fopen("/proc/self/smaps", "r");
	bool in = false;
	size_t kb = (size_t)-1;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;

		if (!in) {
			in = sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && lo <= (uintptr_t)p &&
			     (uintptr_t)p < hi;
			continue;
		}
		if (sscanf(line, "Rss: %zu kB", &kb) == 1)
			break;
	}
	fclose(f);
	assert_true(kb != (size_t)-1);
	return kb << 10;
}

/* sw_mem_drop_file_pages: the whole pages inside the range leave the
 * process's RSS, the bytes read back the same afterwards, and partial
 * pages at either end are left alone. */
static void test_drop_file_pages(void **state)
{
	(void)state;
	enum { PAGES = 64 };
	char path[] = "/tmp/sw-mem-test-XXXXXX";
	int fd = mkstemp(path);
	uint8_t *buf = malloc(PAGES * ps), *m;
	size_t full;

	assert_true(fd >= 0 && buf);
	for (size_t i = 0; i < PAGES * ps; i++)
		buf[i] = (uint8_t)(i * 7 + 1);
	assert_int_equal(write(fd, buf, PAGES * ps), (ssize_t)(PAGES * ps));
	m = mmap(NULL, PAGES * ps, PROT_READ, MAP_PRIVATE, fd, 0);
	assert_true(m != MAP_FAILED);
	assert_memory_equal(m, buf, PAGES * ps); /* every page mapped in */
	full = vma_rss(m);
	assert_true(full >= PAGES * ps);
	/* from the middle of page 1 to the middle of page 9: pages 2..8 */
	assert_int_equal(sw_mem_drop_file_pages(m + ps + ps / 2, 8 * ps), 0);
	assert_int_equal(full - vma_rss(m), 7 * ps);
	assert_memory_equal(m, buf, PAGES * ps); /* read back from the page cache */
	assert_int_equal(vma_rss(m), full);
	assert_int_equal(sw_mem_drop_file_pages(m, ps / 2), 0); /* no whole page */
	assert_int_equal(sw_mem_drop_file_pages(NULL, ps), -EINVAL);
	munmap(m, PAGES * ps);
	close(fd);
	unlink(path);
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_map_big),
		cmocka_unit_test(test_drop_file_pages),
		cmocka_unit_test_teardown(test_method, back_to_probe),
		cmocka_unit_test_teardown(test_backs_its_pages, back_to_probe),
		cmocka_unit_test_teardown(test_keeps_bytes, back_to_probe),
		cmocka_unit_test_teardown(test_stays_inside, back_to_probe),
		cmocka_unit_test_teardown(test_bad_arguments, back_to_probe),
		cmocka_unit_test_teardown(test_kernel_errors, back_to_probe),
		cmocka_unit_test(test_rlimit_as),
		cmocka_unit_test(test_rss),
	};

	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests(tests, setup, NULL);
}
