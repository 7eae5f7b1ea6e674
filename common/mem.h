/* mem.h - making a start-up reservation real (DESIGN §2, "Reserve once").
 *
 * A large malloc, calloc or aligned_alloc is a fresh anonymous mapping:
 * the kernel backs its pages only when they are first written. A pool
 * "reserved" at start-up that way makes the process's RSS climb for hours
 * as the pool fills, and a machine short of memory fails then (the OOM
 * killer) instead of at start. sw_mem_prefault() backs such memory at
 * once, where it is reserved; sw_mem_rss() reads what a process holds, so
 * start-up can log it and tests can check it against the plan.
 *
 * Not for file-backed mappings (model weights: the page cache backs them,
 * shared with every process that maps the file) nor for device memory.
 */
#ifndef SW_MEM_H
#define SW_MEM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Backs every page of [p, p + n) with memory now, without changing a byte
 * of it: madvise(MADV_POPULATE_WRITE) where the kernel has it (Linux
 * 5.14+), else one write per page that stores back the byte it read (an
 * atomic OR with 0), only inside [p, p + n). p need not be page-aligned:
 * the pages the range touches are backed, bytes outside it untouched.
 * The memory must be the caller's own, mapped private and writable (what
 * malloc and its kin return). Call it at creation, never on a step path:
 * it costs a page fault per page (a few hundred ms per GiB).
 * Returns 0 (also for n == 0), -EINVAL when p is NULL and n > 0, or the
 * kernel's answer as a negated errno: -EINVAL for a mapping it cannot
 * populate (read-only, device memory), -ENOMEM when it cannot back the
 * pages (out of memory, a memory cgroup's limit; also a range that is
 * not entirely mapped), -EFAULT when a page would raise SIGBUS, -EINTR
 * when a fatal signal interrupted it. Pages backed before a failure stay
 * backed. Without MADV_POPULATE_WRITE no failure is seen: a machine
 * without the memory answers with the OOM killer, during start-up. */
int sw_mem_prefault(void *p, size_t n);

/* How sw_mem_prefault backs pages. */
enum sw_mem_method {
	SW_MEM_POPULATE = 1, /* madvise(MADV_POPULATE_WRITE) */
	SW_MEM_TOUCH = 2,    /* a write per page (kernels before 5.14) */
};

/* The method sw_mem_prefault uses in this process (probed once, on a page
 * of its own, so that a mapping's EINVAL is not taken for an old kernel). */
enum sw_mem_method sw_mem_prefault_method(void);

/* "MADV_POPULATE_WRITE" or "a write per page", for logs. */
const char *sw_mem_method_name(enum sw_mem_method m);

/* Tests only: forces method m from now on (SW_MEM_POPULATE where the
 * kernel lacks it makes every prefault fail with -EINVAL); 0 probes again. */
void sw_mem__force_method(enum sw_mem_method m);

/* A large private anonymous mapping for data every step streams through
 * (the CPU backend's packed weights): n rounded up to 2 MiB, 2 MiB
 * aligned, with transparent huge pages asked for (MADV_HUGEPAGE; where
 * THP is off the mapping just has small pages). Huge pages take a 4 KiB
 * page fault, a TLB miss and a stop of the hardware prefetcher at every
 * 4 KiB of a weight stream away. Not backed until written: fill it or
 * sw_mem_prefault() it at once. Returns NULL (errno set) on failure; free
 * with sw_mem_unmap_big(p, n) (the same n). */
void *sw_mem_map_big(size_t n);
void sw_mem_unmap_big(void *p, size_t n);

/* Gives back this process's hold on the whole pages inside [p, p + n) of
 * a read-only file mapping (madvise MADV_DONTNEED): they leave its RSS but
 * stay in the page cache, and a later read maps them again. For weights a
 * process has copied elsewhere and will not read again. Returns 0 or a
 * negated errno. */
int sw_mem_drop_file_pages(const void *p, size_t n);

/* Resident memory of a process, from /proc/PID/status, in bytes. */
struct sw_mem_rss {
	uint64_t rss;   /* VmRSS: everything resident */
	uint64_t anon;  /* RssAnon: private anonymous (heap, pools) */
	uint64_t file;  /* RssFile: file-backed (binaries, mapped weights) */
	uint64_t shmem; /* RssShmem: shared memory (memfd rings) */
};

/* Reads pid's resident memory (0: this process) into *out. No allocation
 * (open/read into a stack buffer). Returns 0, a negated errno from
 * open/read (-ENOENT: no such process), or SW_EFORMAT when a field is
 * missing; *out is then zeroed. */
int sw_mem_rss(pid_t pid, struct sw_mem_rss *out);

#endif
