// cuemu.cc - the CUDA runtime of cuemu (tests/cuemu/README.md):
// the CUDA backend's kernels and API calls run on the CPU, with the
// semantics a first run on a GPU would test.
//
// Memory: every cudaMalloc is its own mapping with an inaccessible page
// after its end (and before its start), filled with 0xff bytes (NaN as
// floats: a read of memory nothing wrote shows). Outside stream work the
// device's mappings are made inaccessible (CUEMU_PROTECT=0 to turn off),
// so host code that dereferences a device pointer stops at once, as it
// would crash on a GPU machine.
//
// Streams: work is queued and runs at the next synchronization of its
// stream (cudaStreamSynchronize, cudaDeviceSynchronize, cudaFree, ...), in
// order, on the synchronizing host thread: host code that reads a result
// or rewrites a buffer before synchronizing sees what it would on a GPU.
// Capture (cudaStreamBeginCapture) records the work into a graph instead;
// a graph launch queues its recorded work, arguments as they were captured.
// Calls a capture forbids (synchronizing the capturing stream, allocating)
// fail and invalidate it.
//
// Kernels: the blocks of a launch run one after another; the threads of a
// block run as fibers (own stacks, switched by cuemu_switch), so that
// __syncthreads and the warp intrinsics are real barriers. A barrier some
// thread can never reach (it exited, or waits at another) stops the kernel
// with a message, as does an access outside any mapping (a SIGSEGV inside
// a kernel): the stream's error is then sticky for the device, as a fault
// is on a GPU. Launch configurations are checked as the device checks
// them (block and grid limits, __launch_bounds__).
#include <cuda_runtime.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuemu/cuemu.h"

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

namespace {

constexpr int MAX_DEV = 16;
constexpr size_t PAGE = 4096;
constexpr size_t GUARD_AFTER = 64 << 10; // inaccessible after each allocation
constexpr size_t FIBER_STACK = 128 << 10;
// a block's shared memory: the 48 KiB a launch may use, room for the
// static variables' alignment, and an inaccessible page after
constexpr size_t SMEM_MAX = 48 << 10, SMEM_MAP = 64 << 10;

/* --- configuration and global state ------------------------------------------ */

struct conf {
	int devices = 1;
	size_t mem = (size_t)8 << 30;
	bool protect = true;
	int sms = 132;     // multiprocessors a device reports (an H100/H200's)
	int occupancy = 0; // a bound on cuemu_occupancy's answers (0: none)
	bool reverse = false; // CUEMU_ORDER=reverse: blocks and threads last first
};

const conf &cfg()
{
	static conf c = [] {
		conf r;
		const char *e;
		if ((e = getenv("CUEMU_DEVICES")))
			r.devices = atoi(e) < 0 ? 0 : atoi(e) > MAX_DEV ? MAX_DEV : atoi(e);
		if ((e = getenv("CUEMU_MEM_MIB")) && atoll(e) > 0)
			r.mem = (size_t)atoll(e) << 20;
		if ((e = getenv("CUEMU_PROTECT")))
			r.protect = strcmp(e, "0") != 0;
		if ((e = getenv("CUEMU_SM")) && atoi(e) > 0)
			r.sms = atoi(e) > 1024 ? 1024 : atoi(e);
		if ((e = getenv("CUEMU_OCCUPANCY")) && atoi(e) > 0)
			r.occupancy = atoi(e) > 32 ? 32 : atoi(e);
		if ((e = getenv("CUEMU_ORDER")) && *e) {
			if (!strcmp(e, "reverse"))
				r.reverse = true;
			else if (strcmp(e, "forward")) {
				fprintf(stderr, "cuemu: CUEMU_ORDER=%s: forward or reverse\n", e);
				abort();
			}
		}
		return r;
	}();
	return c;
}

struct region {
	uintptr_t base;
	size_t size;     // as asked
	uint8_t *map;    // the mapping, guard pages included
	size_t map_len;
	uint8_t *data;   // first page of the accessible part
	size_t data_len; // pages between the guards
	int dev;         // -1: pinned host memory
};

std::mutex mu; // everything below, except what a stream's own thread owns
std::map<uintptr_t, region> regions;
size_t dev_used[MAX_DEV];
cudaError_t sticky[MAX_DEV];
cuemu_stats stats;

thread_local int cur_dev = 0;
thread_local cudaError_t last_err = cudaSuccess;

cudaError_t ret(cudaError_t e)
{
	if (e != cudaSuccess)
		last_err = e;
	return e;
}

void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
void fatal(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("cuemu: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	abort();
}

// The region holding [p, p + n), or nullptr. Caller holds mu (or accepts
// a racy answer: the signal handler, for a message).
const region *find(const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;
	auto it = regions.upper_bound(a);

	if (it == regions.begin())
		return nullptr;
	--it;
	if (a < it->second.base || a + n > it->second.base + it->second.size || a + n < a)
		return nullptr;
	return &it->second;
}

// The region nearest below p (for a fault's message), or nullptr.
const region *near(const void *p)
{
	auto it = regions.upper_bound((uintptr_t)p);

	if (it == regions.begin())
		return nullptr;
	return &(--it)->second;
}

/* --- work: streams, graphs ---------------------------------------------------------- */

// One piece of stream work: its state (a kernel's closure, a copy's
// pointers) held inline, so that queueing and replaying allocate nothing.
constexpr size_t OP_STATE = 384;
// Ops a stream's queue holds from its first use: enqueueing allocates
// nothing until a synchronization finds more (a GPU's driver does not
// allocate per launch either; a queue grown past this keeps its size).
constexpr size_t STREAM_OPS = 1024;

struct op {
	const char *what = "";  // "kernel", "memcpy", "memset"
	const char *name = "";  // a kernel's name
	cudaError_t (*run)(const op &) = nullptr;
	void (*copy)(void *dst, const void *src) = nullptr;
	// a kernel's launch
	dim3 g, b;
	size_t shm = 0;
	bool pdl = false; // launched with programmatic stream serialization
	void (*invoke)(const void *state) = nullptr;
	const void *fn = nullptr; // the kernel's code (CUEMU_KERNELS)
	alignas(16) unsigned char state[OP_STATE];

	op() {}
	op(const op &o) { *this = o; }
	op &operator=(const op &o)
	{
		what = o.what;
		name = o.name;
		run = o.run;
		copy = o.copy;
		g = o.g;
		b = o.b;
		shm = o.shm;
		pdl = o.pdl;
		invoke = o.invoke;
		fn = o.fn;
		if (copy)
			copy(state, o.state);
		return *this;
	}
};

// An op whose state is the trivially copyable st.
template <class T>
op make_op(const char *what, cudaError_t (*run)(const op &), const T &st)
{
	static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= OP_STATE &&
		      alignof(T) <= 16, "cuemu: op state");
	op o;
	o.what = what;
	o.run = run;
	o.copy = [](void *d, const void *s) { memcpy(d, s, sizeof(T)); };
	memcpy(o.state, &st, sizeof(T));
	return o;
}

template <class T>
const T &state_of(const op &o)
{
	return *(const T *)o.state;
}

} // namespace

struct CUgraph_st {
	int dev;
	std::vector<op> ops;
};

struct CUgraphExec_st {
	int dev;
	std::vector<op> ops;
};

struct CUstream_st {
	int dev;
	bool legacy;
	std::vector<op> q; // cleared, never shrunk: no allocation once grown
	CUgraph_st *cap = nullptr; // capturing into
	cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
	std::thread::id cap_thread;
	cudaError_t cap_err = cudaSuccess;
};

namespace {

CUstream_st legacy_streams[MAX_DEV];
std::vector<CUstream_st *> streams[MAX_DEV]; // created ones, per device

thread_local CUstream_st *tl_capture; // this thread's capturing stream

CUstream_st *resolve(cudaStream_t s)
{
	if (s)
		return s;
	CUstream_st *l = &legacy_streams[cur_dev];
	l->dev = cur_dev;
	l->legacy = true;
	return l;
}

// A call a capture in progress forbids (ThreadLocal and Global modes):
// fails and invalidates the capture.
bool capture_forbids(const char *call)
{
	if (!tl_capture || tl_capture->mode == cudaStreamCaptureModeRelaxed)
		return false;
	fprintf(stderr, "cuemu: %s during stream capture: not permitted, the capture is invalidated\n",
		call);
	tl_capture->cap_err = cudaErrorStreamCaptureInvalidated;
	return true;
}

cudaError_t enqueue(CUstream_st *s, const op &o)
{
	if (s->cap) {
		if (s->mode != cudaStreamCaptureModeRelaxed && s->cap_thread != std::this_thread::get_id())
			return ret(cudaErrorStreamCaptureWrongThread);
		s->cap->ops.push_back(o);
		return cudaSuccess;
	}
	if (!s->q.capacity())
		s->q.reserve(STREAM_OPS);
	s->q.push_back(o);
	return cudaSuccess;
}

void set_protection(int dev, bool on)
{
	if (!cfg().protect)
		return;
	std::lock_guard<std::mutex> g(mu);
	for (auto &kv : regions) {
		const region &r = kv.second;
		if (r.dev == dev && mprotect(r.data, r.data_len, on ? PROT_NONE : PROT_READ | PROT_WRITE))
			fatal("mprotect: %s", strerror(errno));
	}
}

// Failures on demand, for tests of what a failing device does to the
// program that uses it (CUEMU_INJECT_DIR=DIR): a kernel of device N that
// runs while DIR/fault.N exists faults (an illegal address, sticky as on
// a GPU); while DIR/hang.N exists it does not end, and the thread that
// synchronizes waits in it, as on a hung GPU, until the file goes.
cudaError_t injected(int dev, const op &o)
{
	static const char *dir = getenv("CUEMU_INJECT_DIR");
	char path[4096];

	if (!dir || strcmp(o.what, "kernel") != 0)
		return cudaSuccess;
	snprintf(path, sizeof(path), "%s/hang.%d", dir, dev);
	if (access(path, F_OK) == 0) {
		fprintf(stderr, "cuemu: kernel %s on device %d hangs while %s exists\n", o.name, dev,
			path);
		while (access(path, F_OK) == 0)
			usleep(20000);
	}
	snprintf(path, sizeof(path), "%s/fault.%d", dir, dev);
	if (access(path, F_OK) == 0) {
		fprintf(stderr, "cuemu: kernel %s on device %d: illegal address (injected: %s)\n",
			o.name, dev, path);
		std::lock_guard<std::mutex> lk(mu);
		stats.faults++;
		return cudaErrorIllegalAddress;
	}
	return cudaSuccess;
}

// Runs the stream's queued work in order; a failure is sticky for the
// device (the rest of the queue is dropped, as a faulted context's).
cudaError_t flush(CUstream_st *s)
{
	cudaError_t e;

	if (s->q.empty())
		return sticky[s->dev];
	set_protection(s->dev, false);
	e = sticky[s->dev];
	for (size_t i = 0; e == cudaSuccess && i < s->q.size(); i++) {
		e = injected(s->dev, s->q[i]);
		if (e == cudaSuccess)
			e = s->q[i].run(s->q[i]);
		if (e != cudaSuccess) {
			std::lock_guard<std::mutex> g(mu);
			sticky[s->dev] = e;
		}
	}
	s->q.clear();
	set_protection(s->dev, true);
	return e;
}

cudaError_t flush_device(int dev)
{
	cudaError_t e = flush(&legacy_streams[dev]);
	std::vector<CUstream_st *> ss;
	{
		std::lock_guard<std::mutex> g(mu);
		ss = streams[dev];
	}
	for (CUstream_st *s : ss) {
		cudaError_t e2 = flush(s);
		if (e == cudaSuccess)
			e = e2;
	}
	return e;
}

cudaError_t check_dev(void)
{
	if (cfg().devices == 0)
		return cudaErrorNoDevice;
	return sticky[cur_dev];
}

/* --- fibers ----------------------------------------------------------------------------- */

extern "C" void cuemu_switch(void **save_sp, void *to_sp);

/* --- ThreadSanitizer: the races a block's threads may run ------------------------------
 * In a -Db_sanitize=thread build (CUEMU_TSAN), each thread of a block is a
 * ThreadSanitizer fiber, and the switches between them establish no order
 * (no_sync): what orders two threads of a block is what orders them on a
 * GPU, a __syncthreads, or a __syncwarp between lanes of a warp (each a
 * release at arrival and an acquire past it, into an object of the
 * barrier's generation's parity: a thread that has passed barrier k may
 * arrive at k + 1 before the others have left k, and must not hand them
 * what it did in between); shuffles, votes and the warp-collective matrix
 * instructions order no memory (warp_barrier). So a read of shared or global memory that
 * another thread of the block writes with no barrier between them is
 * reported as a data race, whichever order the threads ran in: racecheck's
 * hazards, found on the CPU. Blocks of one launch are not ordered, as a
 * GPU runs them side by side: the host releases to each block's start
 * but acquires their ends only at the launch's end, and the blocks run
 * on two sets of fibers, each with its own stacks and barrier objects, so
 * that only atomics order a block of one set against a block of the
 * other, and only as a GPU's do (race_atomic: relaxed, releasing behind a
 * __threadfence). A fiber that ran a block carries that block's order
 * into the next it runs, so blocks of one set go unchecked against each
 * other; which blocks a set runs changes from one launch of a kernel on a
 * grid of that size to the next (colouring_of): a checkerboard over the
 * grid first, then each bit of the block's index in turn, so that every
 * two blocks of a grid are checked against each other within the first
 * 1 + log2(blocks) launches of that kernel and grid. A block's shared
 * memory is mapped again at its start, which makes ThreadSanitizer forget
 * what the block before did there.
 * Launches are ordered: the host acquires every block's end before the
 * next. This file itself
 * is built without instrumentation (its bookkeeping is the emulator's, not
 * the kernel's); the accesses it makes for a kernel (cp.async's copies,
 * ldmatrix's reads) are reported to ThreadSanitizer by hand. */
#ifdef CUEMU_TSAN
extern "C" {
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
void __tsan_read_range(const void *addr, unsigned long size);
void __tsan_write_range(void *addr, unsigned long size);
void __tsan_ignore_thread_begin(void);
void __tsan_ignore_thread_end(void);
}
void *race_fiber_new(void) { return __tsan_create_fiber(0); }
void *race_current(void) { return __tsan_get_current_fiber(); }
void race_switch(void *to) { __tsan_switch_to_fiber(to, 1 /* no_sync */); }
void race_release(void *sync) { __tsan_release(sync); }
void race_acquire(void *sync) { __tsan_acquire(sync); }
void race_read(const void *p, size_t n) { __tsan_read_range(p, n); }
void race_write(void *p, size_t n) { __tsan_write_range(p, n); }
// a fill that is the emulator's, not a thread's access (shared_place)
void race_unseen_fill(void *p, int v, size_t n)
{
	__tsan_ignore_thread_begin();
	memset(p, v, n);
	__tsan_ignore_thread_end();
}
// A block's shared memory as new: its first n bytes (the pages blocks
// touched since) mapped again in place (the interceptor forgets what
// earlier blocks' threads did there; the host's is the last access,
// which every thread of the block is ordered after).
void race_fresh_smem(void *p, size_t n)
{
	if (n && mmap(p, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
	    p)
		fatal("mmap of a block's shared memory in place: %s", strerror(errno));
}
#else
void *race_fiber_new(void) { return nullptr; }
void *race_current(void) { return nullptr; }
void race_switch(void *) {}
void race_release(void *) {}
void race_acquire(void *) {}
void race_read(const void *, size_t) {}
void race_write(void *, size_t) {}
void race_unseen_fill(void *p, int v, size_t n) { memset(p, v, n); }
void race_fresh_smem(void *, size_t) {}
#endif

#if defined(__x86_64__)
// Saves the callee-saved general registers on the current stack, stores
// its pointer in *save_sp, and resumes the stack to_sp saved the same way
// (or prepared by fiber_prepare). The ABI's callee-saved floating-point
// state, MXCSR's control bits and the x87 control word, is not switched:
// every fiber of a host thread runs with that thread's (a kernel has no
// rounding mode or exception mask of its own to set), and stmxcsr/fnstcw
// and ldmxcsr/fldcw at every switch made a backend_cmp run 7% slower
// (2026-12-07).
asm(".text\n"
    ".globl cuemu_switch\n"
    ".type cuemu_switch,@function\n"
    "cuemu_switch:\n"
    "\tpushq %rbp\n"
    "\tpushq %rbx\n"
    "\tpushq %r12\n"
    "\tpushq %r13\n"
    "\tpushq %r14\n"
    "\tpushq %r15\n"
    "\tmovq %rsp, (%rdi)\n"
    "\tmovq %rsi, %rsp\n"
    "\tpopq %r15\n"
    "\tpopq %r14\n"
    "\tpopq %r13\n"
    "\tpopq %r12\n"
    "\tpopq %rbx\n"
    "\tpopq %rbp\n"
    "\tret\n"
    ".size cuemu_switch,.-cuemu_switch\n");
#else
#error "cuemu: the fiber switch is written for x86-64"
#endif

enum fstate { F_RUN, F_BAR, F_WARP, F_DONE };

// A thread's cp.async copies in flight: made when a cp.async.wait_group
// lets them complete (or the thread ends), not when issued, so that a
// kernel reading shared memory before its wait reads what was there, as
// it can on a GPU. group: the commit group, CP_OPEN before the commit.
// CP_MAX: a GPU has no such bound (a thread's copies wait for room), so
// it is what our kernels issue at most: attention's decode CTA of one
// warp (one query head a KV head) stages a chunk's K and V together, 256
// copies a thread at head_dim 128.
constexpr unsigned CP_MAX = 512, CP_OPEN = ~0u;
struct cp_op {
	void *dst;
	const void *src; // nullptr: zeros
	unsigned n, group;
};

struct fiber {
	void *sp;
	uint8_t *stack; // FIBER_STACK bytes above a guard page
	unsigned color; // bytes left unused at the stack's top (fibers_for)
	fstate st;
	uint3 tid;
	unsigned lin;
	void *race; // its ThreadSanitizer fiber (CUEMU_TSAN)
	unsigned n_cp, cp_groups; // copies in flight, groups committed
	bool fenced; // ran __threadfence in this block (race_atomic)
	cp_op *cp; // CP_MAX of them, apart: a round reads every fiber's fields above
	           // (a 12 KB array among them put each on a page of its own)
};

// Completes f's copies of the groups before the newest keep (all, with
// keep ~0u: the thread's end), in the order they were issued.
void cp_complete(fiber &f, unsigned keep)
{
	unsigned n = 0;

	for (unsigned i = 0; i < f.n_cp; i++) {
		cp_op &o = f.cp[i];
		if (keep == ~0u || (o.group != CP_OPEN && o.group + keep < f.cp_groups)) {
			if (o.src) {
				race_read(o.src, o.n);
				memcpy(o.dst, o.src, o.n);
			} else {
				memset(o.dst, 0, o.n);
			}
			race_write(o.dst, o.n);
		} else {
			f.cp[n++] = o;
		}
	}
	f.n_cp = n;
}

// Sets of fibers a launch's blocks take turns with: one, or under
// ThreadSanitizer two, so that blocks of different colours (colouring_of)
// are run by different ThreadSanitizer fibers, ordered by nothing but
// atomics.
#ifdef CUEMU_TSAN
constexpr unsigned SETS = 2;
#else
constexpr unsigned SETS = 1;
#endif

// A warp's barrier and exchange slots. An exchange writes the slots of
// its barrier generation's parity and reads them after the barrier: no
// lane can write that parity again before every lane has passed the next
// barrier, so one barrier per exchange suffices.
struct warp_t {
	unsigned count, gen, n;
	uint64_t slot[2][32][2]; /* a lane's 16 bytes, double-buffered */
	char race[SETS][2]; /* the barrier's ThreadSanitizer objects, by fiber set and
			     * generation parity */
};

// One host thread's kernel runner: the block in flight and its fibers.
struct runner {
	std::vector<fiber> f;
	unsigned n = 0, cur = 0;
	void *sched_sp = nullptr;
	void (*invoke)(const void *state) = nullptr;
	const void *state = nullptr;
	uint64_t progress = 0;
	unsigned bar_count = 0, bar_gen = 0;
	int bar_acc = 0, bar_result = 0; /* __syncthreads_count: this barrier's, the last's */
	/* ThreadSanitizer's objects (CUEMU_TSAN): __syncthreads by fiber set and
	 * generation parity, a block's start (the host's release) and end (the
	 * threads') */
	char race_bar[SETS][2] = {}, race_start = 0, race_end = 0;
	std::vector<fiber> f_other; /* the other set's fibers (SETS 2) */
	unsigned set = 0;           /* the set whose fibers f holds */
	void *race_host = nullptr; /* the host thread's fiber */
	warp_t w[32];
	uint8_t *smem = nullptr; /* the block's shared memory: dynamic, then static */
	size_t smem_top = 0;     /* where the launch's next static variable goes */
	size_t smem_used = 0;    /* pages of it blocks touched since its last renewal */
	uint64_t block_gen = 0; /* blocks run by this thread: shared_place's key */
	uint64_t launch_gen = 0; /* launches run by this thread */
	struct colouring_t {
		const void *fn;  /* a kernel */
		uint64_t nb;     /* launched on a grid of nb blocks */
		uint64_t n;      /* that many times by this thread */
		uint64_t mask;   /* the colourings those launches took */
	} colouring[1024] = {}; /* (SETS 2) which colouring a kernel's next launch takes */
	unsigned n_colouring = 0;
	struct fresh_t {
		const void *p; /* the variable's storage (its name) */
		size_t off;    /* where it is in smem, this launch */
		uint64_t gen, lgen; /* the block that filled it, the launch that placed it */
	} fresh[64] = {}; /* the static __shared__ variables shared_place placed */
	size_t shm = 0, static_shm = 0; /* the launch's dynamic and static shared memory */
	const char *kernel = "";
	bool waited = false; /* the block ran griddepcontrol.wait */
	bool active = false;
	bool reverse = cfg().reverse; /* CUEMU_ORDER=reverse, read once */
	sigjmp_buf jb;
	void *fault_addr = nullptr;
	bool alt_stack = false;
};

thread_local runner *R;

void *next_of(runner *r);

// A block that stopped (a fault, a deadlock): its threads' accesses
// ordered before what the host does next (it frees or reuses what they
// touched), each thread's release made in its own name.
void race_abandon(runner *r)
{
#ifdef CUEMU_TSAN
	for (unsigned i = 0; i < r->n; i++) {
		race_switch(r->f[i].race);
		race_release(&r->race_end);
	}
	race_switch(r->race_host);
	race_acquire(&r->race_end);
#else
	(void)r;
#endif
}

// The switch from the current fiber to the next of the round (or the
// scheduler), told to ThreadSanitizer first.
void switch_next(runner *r)
{
	void **me = &r->f[r->cur].sp;
	void *to = next_of(r);

	race_switch(to == r->sched_sp ? r->race_host : r->f[r->cur].race);
	cuemu_switch(me, to);
}

[[noreturn]] void fiber_main(void)
{
	runner *r = R;

	race_acquire(&r->race_start); /* what the host did before the block */
	r->invoke(r->state);
	cp_complete(r->f[r->cur], ~0u); /* a GPU's copies land whether waited for or not */
	race_release(&r->race_end);
	r->f[r->cur].st = F_DONE;
	r->progress++;
	switch_next(r);
	fatal("a finished fiber was resumed");
}

void fiber_prepare(fiber &f)
{
	uintptr_t top = ((uintptr_t)f.stack + FIBER_STACK - f.color) & ~(uintptr_t)15;
	uint64_t *sp = (uint64_t *)top;

	*--sp = 0;                      // fiber_main's (absent) return address
	*--sp = (uint64_t)&fiber_main;  // cuemu_switch's ret
	for (int i = 0; i < 6; i++)
		*--sp = 0;              // rbp rbx r12 r13 r14 r15
	f.sp = sp;
}

// Where fiber cur goes when it waits or ends: the next live fiber of the
// round, or the scheduler after the last (a round's end is where it checks
// for progress). A round takes the threads in order, thread 0 first, or
// with CUEMU_ORDER=reverse the last first: a thread that reads shared
// memory another wrote without a barrier between them reads the old value
// in one of the two orders.
void *next_of(runner *r)
{
	if (r->reverse) {
		for (unsigned i = r->cur; i-- > 0;)
			if (r->f[i].st != F_DONE) {
				r->cur = i;
				threadIdx = r->f[i].tid;
				return r->f[i].sp;
			}
		return r->sched_sp;
	}
	for (unsigned i = r->cur + 1; i < r->n; i++)
		if (r->f[i].st != F_DONE) {
			r->cur = i;
			threadIdx = r->f[i].tid;
			return r->f[i].sp;
		}
	return r->sched_sp;
}

void yield(void)
{
	switch_next(R);
}

runner *need_runner(const char *what)
{
	if (!R || !R->active)
		fatal("%s called outside a kernel", what);
	return R;
}

void kernel_fault(int sig, siginfo_t *si, void *uc);

#ifdef CUEMU_TSAN
// A forked child: its ThreadSanitizer knows no fiber its parent made (it
// would report what the child's kernels do as races with the parent), so
// the thread that forked gets fibers of its own.
void race_after_fork(void)
{
	if (R) {
		for (auto &f : R->f)
			f.race = race_fiber_new();
		for (auto &f : R->f_other)
			f.race = race_fiber_new();
	}
}
#endif

void ensure_runner(void)
{
#ifdef CUEMU_TSAN
	static std::once_flag once;
	std::call_once(once, [] { pthread_atfork(nullptr, nullptr, race_after_fork); });
#endif
	if (!R) {
		R = new runner();
		// a launch allocates nothing on the heap: room for the largest
		// block's fibers (their stacks are mmapped as blocks first need
		// them) and a block's shared memory, from the start
		R->f.reserve(1024);
		R->f_other.reserve(SETS > 1 ? 1024 : 0);
		void *m = mmap(nullptr, SMEM_MAP + PAGE, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			fatal("mmap of a block's shared memory: %s", strerror(errno));
		R->smem = (uint8_t *)m;
		mprotect(R->smem + SMEM_MAP, PAGE, PROT_NONE); // an overrun faults
	}
	if (!R->alt_stack) {
		// the fault handler runs here: a fiber's own stack may be what overflowed
		stack_t ss;
		ss.ss_sp = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
				-1, 0);
		if (ss.ss_sp == MAP_FAILED)
			fatal("mmap of the signal stack: %s", strerror(errno));
		ss.ss_size = 1 << 16;
		ss.ss_flags = 0;
		if (sigaltstack(&ss, nullptr))
			fatal("sigaltstack: %s", strerror(errno));
		R->alt_stack = true;
	}
}

void fibers_of(std::vector<fiber> &v, unsigned n)
{
	while (v.size() < n) {
		fiber f = {};
		uint8_t *m = (uint8_t *)mmap(nullptr, FIBER_STACK + PAGE, PROT_READ | PROT_WRITE,
					     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (m == MAP_FAILED)
			fatal("mmap of a fiber stack: %s", strerror(errno));
		mprotect(m, PAGE, PROT_NONE); // overflow faults
		f.stack = m + PAGE;
		f.color = (unsigned)(v.size() % 64) * 64;
		f.cp = new cp_op[CP_MAX];
		f.race = race_fiber_new();
		v.push_back(f);
	}
}

// Every set's first n fibers (each set's own stacks: a kernel's locals
// are a ThreadSanitizer fiber's accesses).
void fibers_for(unsigned n)
{
	fibers_of(R->f, n);
	if (SETS > 1)
		fibers_of(R->f_other, n);
}

std::string dims(uint3 d)
{
	return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

std::string fault_where(const void *addr)
{
	std::lock_guard<std::mutex> g(mu);
	const region *r = near(addr);
	char b[256];

	if (!r) {
		snprintf(b, sizeof(b), "%p: no device or pinned memory there", addr);
		return b;
	}
	uintptr_t a = (uintptr_t)addr;
	if (a >= r->base + r->size)
		snprintf(b, sizeof(b), "%p: %zu bytes past the end of a %s region of %zu bytes", addr,
			 (size_t)(a - r->base - r->size), r->dev < 0 ? "pinned host" : "device",
			 r->size);
	else
		snprintf(b, sizeof(b), "%p: inside a %s region of %zu bytes at offset %zu", addr,
			 r->dev < 0 ? "pinned host" : "device", r->size, (size_t)(a - r->base));
	return b;
}

/* --- CUEMU_KERNELS=FILE: which kernels a run launched ------------------------------
 * Each kernel (each instantiation of a template apart) with its launches
 * and blocks, appended to FILE at exit, a line each: "LAUNCHES BLOCKS
 * OBJECT OFFSET NAME", OBJECT and OFFSET where its code is (for
 * addr2line), NAME as the launch wrote it. tests/cuemu/kernels reads
 * them: what a set of runs covers, what one covers that another does not.
 * A fixed table, so that a launch allocates nothing. */
struct kernel_count {
	const void *fn;
	const char *name;
	uint64_t launches, blocks;
	uint64_t max_nb, paired_nb; /* the race build's (colouring_of), else 0 */
};
kernel_count kcounts[1024];
unsigned n_kcounts;
bool kcounts_full;

void kernels_write(void)
{
	const char *path = getenv("CUEMU_KERNELS");
	FILE *f = path ? fopen(path, "a") : nullptr;

	if (!f) {
		if (path)
			fprintf(stderr, "cuemu: CUEMU_KERNELS=%s: %s\n", path, strerror(errno));
		return;
	}
	/* every line in one write at fclose: processes that end together
	 * append whole lines, never parts of each other's */
	setvbuf(f, nullptr, _IOFBF, 1 << 22);
	/* the program's own path whatever its argv[0] and working directory
	 * were: the kernels are in it (cuemu is linked in beside them) */
	char exe[4096];
	ssize_t m = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	Dl_info self;
	exe[m > 0 ? m : 0] = 0;
	if (!dladdr((const void *)&kernels_write, &self))
		self.dli_fbase = nullptr;
	std::lock_guard<std::mutex> g(mu);
	for (unsigned i = 0; i < n_kcounts; i++) {
		const kernel_count &c = kcounts[i];
		Dl_info di;
		if (!dladdr(c.fn, &di) || !di.dli_fname)
			di = Dl_info{ "?", nullptr, nullptr, nullptr };
		const char *obj = di.dli_fbase && di.dli_fbase == self.dli_fbase && exe[0] ? exe
											  : di.dli_fname;
		fprintf(f, "%llu %llu %llu %llu %s 0x%llx %s\n", (unsigned long long)c.launches,
			(unsigned long long)c.blocks, (unsigned long long)c.max_nb,
			(unsigned long long)c.paired_nb, obj,
			(unsigned long long)((uintptr_t)c.fn - (uintptr_t)di.dli_fbase), c.name);
	}
	if (kcounts_full)
		fprintf(f, "0 0 0 0 ? 0x0 (cuemu: more kernels than CUEMU_KERNELS counts)\n");
	fclose(f);
}

void kernels_count(const void *fn, const char *name, uint64_t blocks, uint64_t max_nb,
		   uint64_t paired_nb)
{
	static const bool on = [] {
		if (!getenv("CUEMU_KERNELS"))
			return false;
		atexit(kernels_write);
		return true;
	}();
	if (!on)
		return;
	std::lock_guard<std::mutex> g(mu);
	unsigned i = 0;
	while (i < n_kcounts && kcounts[i].fn != fn)
		i++;
	if (i == n_kcounts) {
		if (i == sizeof(kcounts) / sizeof(kcounts[0])) {
			kcounts_full = true;
			return;
		}
		kcounts[n_kcounts++] = kernel_count{ fn, name, 0, 0, 0, 0 };
	}
	kcounts[i].launches++;
	kcounts[i].blocks += blocks;
	kcounts[i].max_nb = std::max(kcounts[i].max_nb, max_nb);
	kcounts[i].paired_nb = std::max(kcounts[i].paired_nb, paired_nb);
}

// The colouring of a launch's blocks into the two fiber sets (SETS 2),
// which changes from one launch of a kernel on a grid of that size to the
// next: the first a checkerboard over the grid (neighbours along any axis
// apart), then for each bit of the block's linear index in turn, that
// bit, then the checkerboard again. Any two blocks of a grid differ in
// some bit, so they run on different sets, unordered, in one of the first
// 1 + log2(blocks) launches of that kernel and grid; blocks of one set
// are ordered (a fiber carries what its block did into the next), so one
// colouring alone leaves pairs unchecked. Returns 0 (the checkerboard) or
// 1 + the bit; *paired is nb once every colouring of the grid has run
// (CUEMU_KERNELS reports it), else 0. Not inlined: run_kernel's
// sigsetjmp would have its locals in registers.
static __attribute__((noinline)) unsigned colouring_of(runner *r, const void *fn, uint64_t nb,
						       uint64_t *paired)
{
	unsigned i = 0, bits = 0, c;

	*paired = 0;
	if (SETS < 2)
		return 0;
	while (i < r->n_colouring && (r->colouring[i].fn != fn || r->colouring[i].nb != nb))
		i++;
	if (i == r->n_colouring) {
		if (i == sizeof(r->colouring) / sizeof(r->colouring[0]))
			return 0; // more kernels and grids than the table: checkerboards
		r->colouring[r->n_colouring++] = runner::colouring_t{ fn, nb, 0, 0 };
	}
	runner::colouring_t &k = r->colouring[i];
	while (bits < 63 && (nb - 1) >> bits)
		bits++;
	c = (unsigned)(k.n++ % (1 + bits));
	k.mask |= 1ull << c;
	if (k.mask == (2ull << bits) - 1)
		*paired = nb;
	return c;
}

// Runs one launch: every block, each block's threads as fibers.
cudaError_t run_kernel(const op &k)
{
	ensure_runner();
	runner *r = R;
	const char *name = k.name;
	dim3 g = k.g, b = k.b;
	unsigned n = b.x * b.y * b.z;

	fibers_for(n);
	r->race_host = race_current();
	r->n = n;
	r->invoke = k.invoke;
	r->state = k.state;
	r->kernel = name;
	r->launch_gen++;
	r->shm = k.shm;
	r->static_shm = 0;
	r->smem_top = (k.shm + 15) & ~(size_t)15;
	r->smem_used = std::max(r->smem_used, (r->smem_top + PAGE - 1) & ~(PAGE - 1));
	gridDim = g;
	blockDim = b;
	{
		std::lock_guard<std::mutex> lk(mu);
		stats.launches++;
	}
	const uint64_t nb = (uint64_t)g.x * g.y * g.z;
	uint64_t paired;
	const unsigned colouring = colouring_of(r, k.fn, nb, &paired);
	kernels_count(k.fn, name, nb, SETS > 1 ? nb : 0, paired);
	// the blocks one after the other, block (0,0,0) first, or with
	// CUEMU_ORDER=reverse the last first: what a grid computes must not
	// depend on which of its blocks ends first (a split-K sum made by the
	// block that arrives last, say)
	for (uint64_t bi = 0; bi < nb; bi++) {
		const uint64_t lb = r->reverse ? nb - 1 - bi : bi;
		const unsigned bx = (unsigned)(lb % g.x), by = (unsigned)(lb / g.x % g.y),
			       bz = (unsigned)(lb / ((uint64_t)g.x * g.y));
		blockIdx = uint3{ bx, by, bz };
		const unsigned set = colouring ? (unsigned)(lb >> (colouring - 1)) & 1
					       : (bx + by + bz) & 1;
		if (SETS > 1 && r->set != set) {
			// the launch's colouring (colouring_of): blocks of
			// different colours run on different fibers
			std::swap(r->f, r->f_other);
			r->set ^= 1;
		}
		// a block's shared memory as a GPU's holds it: nothing the
		// block before left (0xff bytes, NaN as floats; static
		// __shared__ variables likewise, shared_place)
		r->block_gen++;
		race_fresh_smem(r->smem, r->smem_used);
		r->smem_used = (r->smem_top + PAGE - 1) & ~(PAGE - 1);
		if (k.shm)
			memset(r->smem, 0xff, k.shm);
		r->bar_count = r->bar_gen = 0;
		r->bar_acc = r->bar_result = 0;
		r->waited = false;
		for (unsigned w = 0; w * 32 < n; w++) {
			r->w[w].count = r->w[w].gen = 0;
			r->w[w].n = n - w * 32 < 32 ? n - w * 32 : 32;
		}
		for (unsigned i = 0; i < n; i++) {
			fiber &f = r->f[i];
			f.st = F_RUN;
			f.lin = i;
			f.n_cp = f.cp_groups = 0;
			f.fenced = false;
			f.tid = uint3{ i % b.x, (i / b.x) % b.y, i / (b.x * b.y) };
			fiber_prepare(f);
		}
		r->active = true;
		race_release(&r->race_start);
		if (sigsetjmp(r->jb, 1)) {
			r->active = false;
			race_abandon(r);
			fprintf(stderr,
				"cuemu: kernel %s, block %s, thread %s: illegal address %s\n",
				name, dims(blockIdx).c_str(), dims(r->f[r->cur].tid).c_str(),
				fault_where(r->fault_addr).c_str());
			std::lock_guard<std::mutex> lk(mu);
			stats.faults++;
			return cudaErrorIllegalAddress;
		}
		for (;;) {
			uint64_t p0 = r->progress;
			unsigned first = 0;
			if (r->reverse) {
				first = n;
				while (first > 0 && r->f[first - 1].st == F_DONE)
					first--;
				first = first ? first - 1 : n;
			} else {
				while (first < n && r->f[first].st == F_DONE)
					first++;
			}
			if (first == n)
				break;
			// a round: the live fibers in the run's order (next_of),
			// each passing on to the next (yield, fiber_main), the
			// last back here
			r->cur = first;
			threadIdx = r->f[first].tid;
			race_switch(r->f[first].race);
			cuemu_switch(&r->sched_sp, r->f[first].sp);
			if (r->progress == p0) {
				unsigned done = 0, bar = 0, warp = 0;
				for (unsigned i = 0; i < n; i++) {
					done += r->f[i].st == F_DONE;
					bar += r->f[i].st == F_BAR;
					warp += r->f[i].st == F_WARP;
				}
				r->active = false;
				race_abandon(r);
				fprintf(stderr,
					"cuemu: kernel %s, block %s: deadlock: %u threads wait at "
					"__syncthreads, %u at a warp-synchronous call, %u have "
					"exited (a barrier not every thread reaches)\n",
					name, dims(blockIdx).c_str(), bar, warp, done);
				std::lock_guard<std::mutex> lk(mu);
				stats.faults++;
				return cudaErrorLaunchFailure;
			}
		}
		r->active = false;
		if (k.pdl && !r->waited) {
			race_acquire(&r->race_end);
			// on a GPU its successor, allowed to start early by
			// it, would wait for it only: not for its predecessor
			fprintf(stderr,
				"cuemu: kernel %s, block %s: launched with programmatic "
				"stream serialization, ended without griddepcontrol.wait\n",
				name, dims(blockIdx).c_str());
			std::lock_guard<std::mutex> lk(mu);
			stats.faults++;
			return cudaErrorLaunchFailure;
		}
	}
	// the launch's end orders its blocks before what the host does next
	// (the next launch); one block before another, nothing but atomics
	race_acquire(&r->race_end);
	return cudaSuccess;
}

void kernel_fault(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	if (R && R->active) {
		R->fault_addr = si->si_addr;
		R->active = false;
		race_switch(R->race_host); /* the jump lands on the host's stack */
		siglongjmp(R->jb, 1);
	}
	const region *r = near(si->si_addr);
	if (r && r->dev >= 0 && (uintptr_t)si->si_addr < (uintptr_t)r->map + r->map_len) {
		char b[200];
		int k = snprintf(b, sizeof(b),
				 "cuemu: host code touched device memory at %p (a cudaMalloc'd "
				 "region of %zu bytes): a device pointer dereferenced on the host\n",
				 si->si_addr, r->size);
		if (write(2, b, (size_t)k) < 0) {
		}
	}
	signal(sig, SIG_DFL); // the fault repeats, now fatal
}

void install_handler(void)
{
	static std::once_flag once;
	std::call_once(once, [] {
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_sigaction = kernel_fault;
		sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
		sigemptyset(&sa.sa_mask);
		sigaction(SIGSEGV, &sa, nullptr);
		sigaction(SIGBUS, &sa, nullptr);
	});
}

warp_t &my_warp(runner *r, unsigned mask, const char *what)
{
	fiber &me = r->f[r->cur];
	warp_t &w = r->w[me.lin / 32];
	unsigned want = w.n == 32 ? 0xffffffffu : (1u << w.n) - 1;

	if (mask != want)
		fatal("kernel %s: %s with mask %#x in a warp of %u threads: cuemu models full-warp "
		      "masks only", r->kernel, what, mask, w.n);
	return w;
}

// A warp's barrier. With order (__syncwarp), it orders the lanes' memory
// accesses for ThreadSanitizer; shuffles, votes and the warp-collective
// matrix instructions do not (CUDA: only __syncwarp orders memory among a
// warp's threads), so a lane reading shared memory its neighbour wrote
// with only a shuffle between them is reported.
void warp_barrier(runner *r, warp_t &w, bool order = false)
{
	fiber &me = r->f[r->cur];

	r->progress++;
	unsigned g = w.gen;
	if (order)
		race_release(&w.race[r->set][g & 1]);
	if (++w.count == w.n) {
		w.count = 0;
		w.gen++;
	} else {
		me.st = F_WARP;
		while (w.gen == g)
			yield();
		me.st = F_RUN;
	}
	if (order)
		race_acquire(&w.race[r->set][g & 1]);
}

// A shuffle's n bytes (1, 2, 4 or 8) to or from an exchange slot: a copy
// of a constant size, which the compiler makes a move, not a call that
// ThreadSanitizer would take for the thread's access
void copy_small(void *dst, const void *src, size_t n)
{
	switch (n) {
	case 1: memcpy(dst, src, 1); break;
	case 2: memcpy(dst, src, 2); break;
	case 4: memcpy(dst, src, 4); break;
	case 8: memcpy(dst, src, 8); break;
	default: fatal("a warp exchange of %zu bytes", n);
	}
}

} // namespace

/* --- device-side entry points ---------------------------------------------------------- */

namespace cuemu {

cudaError_t launch(const char *name, unsigned bound, dim3 g, dim3 b, size_t shm, cudaStream_t s,
		   const kernel_body &body, bool pdl)
{
	cudaError_t e = check_dev();
	CUstream_st *st;
	uint64_t n = (uint64_t)b.x * b.y * b.z;

	if (e != cudaSuccess)
		return ret(e);
	st = resolve(s);
	if (st->dev != cur_dev) {
		fprintf(stderr, "cuemu: kernel %s launched on a stream of device %d while device %d "
			"is current\n", name, st->dev, cur_dev);
		return ret(cudaErrorInvalidResourceHandle);
	}
	if (!g.x || !g.y || !g.z || !n || b.x > 1024 || b.y > 1024 || b.z > 64 || n > 1024 ||
	    g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
		fprintf(stderr, "cuemu: kernel %s: invalid configuration: grid (%u,%u,%u), block "
			"(%u,%u,%u)\n", name, g.x, g.y, g.z, b.x, b.y, b.z);
		return ret(cudaErrorInvalidConfiguration);
	}
	if (bound && n > bound) {
		fprintf(stderr, "cuemu: kernel %s: %llu threads per block above its "
			"__launch_bounds__(%u)\n", name, (unsigned long long)n, bound);
		return ret(cudaErrorLaunchOutOfResources);
	}
	if (shm > 48 * 1024) {
		fprintf(stderr, "cuemu: kernel %s: %zu bytes of dynamic shared memory (above 48 KiB "
			"needs cudaFuncSetAttribute)\n", name, shm);
		return ret(cudaErrorInvalidValue);
	}
	if (body.size > OP_STATE || body.align > 16) {
		fprintf(stderr, "cuemu: kernel %s: %zu bytes of arguments (cuemu holds %zu)\n", name,
			body.size, OP_STATE);
		return ret(cudaErrorInvalidValue);
	}
	install_handler();
	op o;
	o.what = "kernel";
	o.name = name;
	o.run = run_kernel;
	o.copy = body.copy;
	o.g = g;
	o.b = b;
	o.shm = shm;
	o.pdl = pdl;
	o.invoke = body.invoke;
	o.fn = body.fn;
	body.copy(o.state, body.state);
	return ret(enqueue(st, o));
}

void griddep_wait(void)
{
	need_runner("griddepcontrol.wait")->waited = true;
}

void *dyn_smem(void)
{
	return need_runner("extern __shared__")->smem;
}

void *shared_place(const void *key, size_t n, size_t align)
{
	runner *r = need_runner("__shared__");
	runner::fresh_t *e = nullptr, *free_e = nullptr;

	for (auto &f : r->fresh) {
		if (f.p == key) {
			e = &f;
			break;
		}
		if (!free_e && f.lgen != r->launch_gen)
			free_e = &f; /* another launch's */
	}
	if (!e) {
		if (!free_e)
			fatal("kernel %s: more than %zu __shared__ variables", r->kernel,
			      sizeof(r->fresh) / sizeof(r->fresh[0]));
		e = free_e;
		*e = runner::fresh_t{ key, 0, 0, 0 };
	}
	if (e->lgen != r->launch_gen) {
		// placed once a launch, after the dynamic part and the variables
		// placed before it. With the dynamic, at most 48 KiB (no kernel
		// opts in to more), or a GPU refuses the launch
		e->lgen = r->launch_gen;
		r->static_shm += n;
		if (r->static_shm + r->shm > SMEM_MAX)
			fatal("kernel %s: %zu bytes of static and %zu of dynamic shared memory, "
			      "above the 48 KiB of a block (too many resources requested for launch)",
			      r->kernel, r->static_shm, r->shm);
		if (align < 16)
			align = 16;
		e->off = (r->smem_top + align - 1) & ~(align - 1);
		if (e->off + n > SMEM_MAP)
			fatal("kernel %s: its __shared__ variables, aligned, past cuemu's %zu bytes",
			      r->kernel, SMEM_MAP);
		r->smem_top = e->off + n;
		r->smem_used = std::max(r->smem_used, (r->smem_top + PAGE - 1) & ~(PAGE - 1));
	}
	uint8_t *p = r->smem + e->off;
	if (e->gen != r->block_gen) {
		e->gen = r->block_gen; /* this block's first thread here */
		race_unseen_fill(p, 0xff, n);
	}
	return p;
}

int syncthreads_count(int pred)
{
	runner *r = need_runner("__syncthreads");
	fiber &me = r->f[r->cur];

	r->progress++;
	r->bar_acc += pred != 0;
	unsigned g = r->bar_gen;
	race_release(&r->race_bar[r->set][g & 1]);
	if (++r->bar_count == r->n) {
		r->bar_count = 0;
		r->bar_result = r->bar_acc;
		r->bar_acc = 0;
		r->bar_gen++;
		race_acquire(&r->race_bar[r->set][g & 1]);
		return r->bar_result;
	}
	me.st = F_BAR;
	while (r->bar_gen == g)
		yield();
	me.st = F_RUN;
	race_acquire(&r->race_bar[r->set][g & 1]);
	/* the next barrier cannot complete before this thread reaches it */
	return r->bar_result;
}

void syncthreads(void)
{
	syncthreads_count(0);
}

void syncwarp(unsigned mask)
{
	runner *r = need_runner("__syncwarp");
	warp_barrier(r, my_warp(r, mask, "__syncwarp"), true);
}

unsigned lane(void)
{
	runner *r = need_runner("a warp intrinsic");
	return r->f[r->cur].lin % 32;
}

void cp_async(void *dst, const void *src, unsigned n, bool full)
{
	runner *r = need_runner("cp.async");
	fiber &f = r->f[r->cur];

	if (f.n_cp == CP_MAX)
		fatal("cuemu: kernel %s: a thread with more than %u cp.async copies in flight",
		      r->kernel, CP_MAX);
	// as the PTX ISA has it: a cp-size of 4, 8 or 16 bytes, both addresses
	// aligned to it, the source too when nothing is read from it (src-size
	// 0): a GPU faults with a misaligned address where the emulator would
	// have copied
	if (n != 4 && n != 8 && n != 16)
		fatal("cuemu: kernel %s: cp.async of %u bytes (4, 8 or 16)", r->kernel, n);
	if (((uintptr_t)dst | (uintptr_t)src) & (n - 1))
		fatal("cuemu: kernel %s: cp.async of %u bytes from %p to %p: not %u-byte aligned%s",
		      r->kernel, n, src, dst, n, full ? "" : " (a zero fill: the source unread)");
	f.cp[f.n_cp++] = cp_op{ dst, full ? src : nullptr, n, CP_OPEN };
}

void race_fence(void)
{
	runner *r = need_runner("__threadfence");
	r->f[r->cur].fenced = true;
}

// After an atomic on p (relaxed under ThreadSanitizer): what atomics on
// p released is the thread's to see, as the value it read came from
// them; its own accesses go with it only behind a fence, as on a GPU,
// where stores before a relaxed atomic may reach memory after it (the
// "last block" reduction's __threadfence before its counter). A fence
// counts for every later atomic of the block's thread: one fence, then
// stores, then an atomic, is taken for fenced.
void race_atomic(void *p)
{
	runner *r = need_runner("an atomic");

	race_acquire(p);
	if (r->f[r->cur].fenced)
		race_release(p);
}

void cp_commit(void)
{
	runner *r = need_runner("cp.async.commit_group");
	fiber &f = r->f[r->cur];

	for (unsigned i = 0; i < f.n_cp; i++)
		if (f.cp[i].group == CP_OPEN)
			f.cp[i].group = f.cp_groups;
	f.cp_groups++;
}

void cp_wait(unsigned keep)
{
	runner *r = need_runner("cp.async.wait_group");

	cp_complete(r->f[r->cur], keep);
}

void warp_xchg(unsigned mask, const void *in, void *out, size_t n, int src)
{
	runner *r = need_runner("__shfl_sync");
	warp_t &w = my_warp(r, mask, "__shfl_sync");
	unsigned l = r->f[r->cur].lin % 32;

	unsigned par = w.gen & 1;

	w.slot[par][l][0] = w.slot[par][l][1] = 0;
	copy_small(w.slot[par][l], in, n);
	warp_barrier(r, w);
	if (src < 0 || (unsigned)src >= w.n)
		src = (int)l;
	copy_small(out, w.slot[par][src], n);
}

void warp_gather(unsigned mask, const uint64_t v[2], uint64_t out[32][2])
{
	runner *r = need_runner("a warp-collective");
	warp_t &w = my_warp(r, mask, "a warp-collective");
	unsigned l = r->f[r->cur].lin % 32;

	unsigned par = w.gen & 1;

	w.slot[par][l][0] = v[0];
	w.slot[par][l][1] = v[1];
	warp_barrier(r, w);
	for (unsigned i = 0; i < 32; i++)
		for (unsigned k = 0; k < 2; k++)
			out[i][k] = i < w.n ? w.slot[par][i][k] : 0;
}

void ldmatrix_x4(const void *row, unsigned r[4])
{
	uint64_t mine[2] = { (uint64_t)(uintptr_t)row, 0 }, all[32][2];
	unsigned l = lane();

	if ((uintptr_t)row & 15)
		fatal("cuemu: ldmatrix: lane %u's row address %p is not 16-byte aligned", l, row);
	warp_gather(0xffffffffu, mine, all);
	for (unsigned i = 0; i < 4; i++) {
		const unsigned *p = (const unsigned *)(uintptr_t)all[8 * i + l / 4][0];
		if (!p)
			fatal("cuemu: ldmatrix: lane %u of a partial warp", 8 * i + l / 4);
		race_read(&p[l % 4], 4); /* the warp's read, this lane's share */
		r[i] = p[l % 4];
	}
}

unsigned warp_vote(unsigned mask, int pred)
{
	runner *r = need_runner("a warp vote");
	warp_t &w = my_warp(r, mask, "a warp vote");
	unsigned l = r->f[r->cur].lin % 32, v = 0;

	unsigned par = w.gen & 1;

	w.slot[par][l][0] = pred != 0;
	warp_barrier(r, w);
	for (unsigned i = 0; i < w.n; i++)
		v |= (unsigned)w.slot[par][i][0] << i;
	return v;
}

} // namespace cuemu

/* --- the runtime API ---------------------------------------------------------------------- */

extern "C" cuemu_stats cuemu_get_stats(void)
{
	std::lock_guard<std::mutex> g(mu);
	return stats;
}

cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_err;

	last_err = cudaSuccess;
	if (e == cudaSuccess && cfg().devices)
		e = sticky[cur_dev];
	return e;
}

cudaError_t cudaPeekAtLastError(void)
{
	return last_err != cudaSuccess ? last_err : cfg().devices ? sticky[cur_dev] : cudaSuccess;
}

const char *cudaGetErrorName(cudaError_t e)
{
	switch (e) {
#define N(x) case x: return #x;
	N(cudaSuccess) N(cudaErrorInvalidValue) N(cudaErrorMemoryAllocation)
	N(cudaErrorInitializationError) N(cudaErrorInvalidConfiguration)
	N(cudaErrorInvalidDevicePointer) N(cudaErrorInvalidMemcpyDirection)
	N(cudaErrorInsufficientDriver) N(cudaErrorCallRequiresNewerDriver)
	N(cudaErrorDevicesUnavailable) N(cudaErrorInvalidDeviceFunction) N(cudaErrorNoDevice)
	N(cudaErrorInvalidDevice) N(cudaErrorInvalidResourceHandle) N(cudaErrorIllegalState)
	N(cudaErrorNotReady) N(cudaErrorIllegalAddress) N(cudaErrorLaunchOutOfResources)
	N(cudaErrorMisalignedAddress) N(cudaErrorLaunchFailure) N(cudaErrorNotPermitted) N(cudaErrorNotSupported)
	N(cudaErrorSystemDriverMismatch) N(cudaErrorStreamCaptureUnsupported)
	N(cudaErrorStreamCaptureInvalidated) N(cudaErrorStreamCaptureUnmatched)
	N(cudaErrorStreamCaptureImplicit) N(cudaErrorStreamCaptureWrongThread)
	N(cudaErrorECCUncorrectable) N(cudaErrorNvlinkUncorrectable) N(cudaErrorLaunchTimeout)
	N(cudaErrorAssert) N(cudaErrorHardwareStackError) N(cudaErrorIllegalInstruction)
	N(cudaErrorInvalidAddressSpace) N(cudaErrorInvalidPc) N(cudaErrorExternalDevice)
	N(cudaErrorUnknown)
#undef N
	}
	return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorInvalidDevicePointer: return "invalid device pointer";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	case cudaErrorInvalidDevice: return "invalid device ordinal";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorIllegalState: return "operation not permitted when stream is capturing";
	case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
	case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
	case cudaErrorMisalignedAddress: return "misaligned address";
	case cudaErrorLaunchFailure: return "unspecified launch failure";
	case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
	case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
	case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
	default: return cudaGetErrorName(e);
	}
}

cudaError_t cudaGetDeviceCount(int *n)
{
	*n = cfg().devices;
	return cfg().devices ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int dev)
{
	if (cfg().devices == 0)
		return ret(cudaErrorNoDevice);
	if (dev < 0 || dev >= cfg().devices)
		return ret(cudaErrorInvalidDevice);
	cur_dev = dev;
	return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev)
{
	*dev = cur_dev;
	return cfg().devices ? cudaSuccess : ret(cudaErrorNoDevice);
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev)
{
	if (dev < 0 || dev >= cfg().devices)
		return ret(cfg().devices ? cudaErrorInvalidDevice : cudaErrorNoDevice);
	memset(p, 0, sizeof(*p));
	snprintf(p->name, sizeof(p->name), "cuemu %d (CUDA on the CPU, tests/cuemu)", dev);
	p->totalGlobalMem = cfg().mem;
	p->sharedMemPerBlock = 48 * 1024;
	p->major = 9;
	p->minor = 0;
	p->multiProcessorCount = cfg().sms; /* the figure kernels size grids by */
	p->maxThreadsPerBlock = 1024;
	p->warpSize = 32;
	p->maxGridSize[0] = 0x7fffffff;
	p->maxGridSize[1] = p->maxGridSize[2] = 65535;
	p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
	p->maxThreadsDim[2] = 64;
	return cudaSuccess;
}

cudaError_t cuemu_occupancy(int *n, int block, size_t dyn)
{
	cudaError_t e = check_dev();
	int k;

	if (e != cudaSuccess)
		return ret(e);
	if (!n || block <= 0 || block > 1024 || dyn > 227 * 1024)
		return ret(cudaErrorInvalidValue);
	k = 2048 / block < 32 ? 2048 / block : 32;
	if (dyn && (int)(228 * 1024 / (dyn + 1024)) < k)
		k = (int)(228 * 1024 / (dyn + 1024));
	if (cfg().occupancy && cfg().occupancy < k)
		k = cfg().occupancy;
	*n = k;
	return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot)
{
	cudaError_t e = check_dev();

	if (e != cudaSuccess)
		return ret(e);
	std::lock_guard<std::mutex> g(mu);
	*tot = cfg().mem;
	*fr = cfg().mem - dev_used[cur_dev];
	return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
	cudaError_t e = check_dev();

	if (e != cudaSuccess)
		return ret(e);
	if (capture_forbids("cudaDeviceSynchronize"))
		return ret(cudaErrorStreamCaptureUnsupported);
	return ret(flush_device(cur_dev));
}

namespace {

cudaError_t map_region(void **p, size_t n, int dev)
{
	size_t data, len;
	uint8_t *m;

	if (!n)
		n = 1;
	data = (n + PAGE - 1) / PAGE * PAGE;
	len = PAGE + data + GUARD_AFTER;
	if (dev >= 0) {
		std::lock_guard<std::mutex> g(mu);
		if (dev_used[dev] + n > cfg().mem)
			return cudaErrorMemoryAllocation;
		dev_used[dev] += n;
	}
	m = (uint8_t *)mmap(nullptr, len, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		std::lock_guard<std::mutex> g(mu);
		if (dev >= 0)
			dev_used[dev] -= n;
		return cudaErrorMemoryAllocation;
	}
	mprotect(m, PAGE, PROT_NONE);
	mprotect(m + PAGE + data, GUARD_AFTER, PROT_NONE);
	// the end flush with the guard (256-byte aligned, as cudaMalloc's)
	uintptr_t base = ((uintptr_t)m + PAGE + data - n) & ~(uintptr_t)255;
	memset(m + PAGE, 0xff, data);
	region r = { base, n, m, len, m + PAGE, data, dev };
	std::lock_guard<std::mutex> g(mu);
	if (dev >= 0 && cfg().protect && mprotect(r.data, r.data_len, PROT_NONE))
		fatal("mprotect: %s", strerror(errno));
	regions[base] = r;
	if (dev >= 0)
		stats.device_allocs++;
	else
		stats.host_allocs++;
	*p = (void *)base;
	return cudaSuccess;
}

cudaError_t unmap_region(void *p, bool host)
{
	std::lock_guard<std::mutex> g(mu);
	auto it = regions.find((uintptr_t)p);

	if (it == regions.end() || (it->second.dev < 0) != host)
		return cudaErrorInvalidValue;
	if (!host) {
		dev_used[it->second.dev] -= it->second.size;
		stats.device_frees++;
	}
	munmap(it->second.map, it->second.map_len);
	regions.erase(it);
	return cudaSuccess;
}

} // namespace

// CUEMU_INJECT_DIR=DIR: while DIR/nomem.N exists, cudaMalloc on device N
// fails as when another process took its memory after the program looked.
bool nomem_injected(int dev)
{
	static const char *dir = getenv("CUEMU_INJECT_DIR");
	char path[4096];

	if (!dir)
		return false;
	snprintf(path, sizeof(path), "%s/nomem.%d", dir, dev);
	if (access(path, F_OK) != 0)
		return false;
	fprintf(stderr, "cuemu: cudaMalloc on device %d: out of memory (injected: %s)\n", dev,
		path);
	return true;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
	cudaError_t e = check_dev();

	*p = nullptr;
	if (e != cudaSuccess)
		return ret(e);
	if (capture_forbids("cudaMalloc"))
		return ret(cudaErrorStreamCaptureUnsupported);
	if (nomem_injected(cur_dev))
		return ret(cudaErrorMemoryAllocation);
	return ret(map_region(p, n, cur_dev));
}

cudaError_t cudaFree(void *p)
{
	cudaError_t e;
	int dev;

	if (!p)
		return cudaSuccess;
	if (capture_forbids("cudaFree"))
		return ret(cudaErrorStreamCaptureUnsupported);
	{
		std::lock_guard<std::mutex> g(mu);
		const region *r = find(p, 1);
		if (!r || r->dev < 0 || r->base != (uintptr_t)p)
			return ret(cudaErrorInvalidValue);
		e = sticky[r->dev];
		dev = r->dev;
	}
	flush_device(dev); // cudaFree synchronizes the memory's device
	cudaError_t e2 = unmap_region(p, false);
	return ret(e2 != cudaSuccess ? e2 : e);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags)
{
	(void)flags;
	*p = nullptr;
	if (capture_forbids("cudaHostAlloc"))
		return ret(cudaErrorStreamCaptureUnsupported);
	return ret(map_region(p, n, -1));
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
	return cudaHostAlloc(p, n, cudaHostAllocDefault);
}

cudaError_t cudaFreeHost(void *p)
{
	if (!p)
		return cudaSuccess;
	return ret(unmap_region(p, true));
}

namespace {

struct copy_st {
	void *dst;
	const void *src;
	size_t n;
};

cudaError_t run_copy(const op &o)
{
	const copy_st &c = state_of<copy_st>(o);
	memmove(c.dst, c.src, c.n);
	return cudaSuccess;
}

struct set_st {
	void *p;
	int v;
	size_t n;
};

cudaError_t run_set(const op &o)
{
	const set_st &c = state_of<set_st>(o);
	memset(c.p, c.v, c.n);
	return cudaSuccess;
}

// Checks a copy's ranges for its kind; returns the effective kind.
cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind &kind)
{
	std::lock_guard<std::mutex> g(mu);
	const region *d = find(dst, n ? n : 1), *s = find(src, n ? n : 1);
	bool dd = d && d->dev >= 0, sd = s && s->dev >= 0;

	if (kind == cudaMemcpyDefault)
		kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
			  : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
	bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
	bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
	if (want_dd != dd || want_sd != sd) {
		fprintf(stderr, "cuemu: cudaMemcpy kind %d from %p to %p (%zu bytes): %s is not %s\n",
			(int)kind, src, dst, n, want_dd != dd ? "the destination" : "the source",
			(want_dd != dd ? want_dd : want_sd) ? "inside one device allocation"
							    : "host memory");
		return cudaErrorInvalidValue;
	}
	if ((dd && d->dev != cur_dev) || (sd && s->dev != cur_dev)) {
		fprintf(stderr, "cuemu: cudaMemcpy with memory of another device than the current\n");
		return cudaErrorInvalidValue;
	}
	return cudaSuccess;
}

bool pinned(const void *p, size_t n)
{
	std::lock_guard<std::mutex> g(mu);
	const region *r = find(p, n ? n : 1);
	return r && r->dev < 0;
}

} // namespace

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
			    cudaStream_t s)
{
	cudaError_t e = check_dev();
	CUstream_st *st;

	if (e != cudaSuccess)
		return ret(e);
	if ((e = check_copy(dst, src, n, kind)) != cudaSuccess)
		return ret(e);
	st = resolve(s);
	if (st->dev != cur_dev)
		return ret(cudaErrorInvalidResourceHandle);
	if (!n)
		return cudaSuccess;
	if ((kind == cudaMemcpyHostToDevice && !pinned(src, n)) ||
	    (kind == cudaMemcpyDeviceToHost && !pinned(dst, n))) {
		// With pageable memory the copy is done, in stream order, when the
		// call returns (CUDA stages it): the stream's work first, then it.
		if (st->cap) {
			fprintf(stderr, "cuemu: cudaMemcpyAsync with pageable memory during capture: "
				"not permitted, the capture is invalidated\n");
			st->cap_err = cudaErrorStreamCaptureInvalidated;
			return ret(cudaErrorStreamCaptureUnsupported);
		}
		if ((e = flush(st)) != cudaSuccess)
			return ret(e);
		set_protection(st->dev, false);
		memcpy(dst, src, n);
		set_protection(st->dev, true);
		return cudaSuccess;
	}
	return ret(enqueue(st, make_op("memcpy", run_copy, copy_st{ dst, src, n })));
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
	cudaError_t e = check_dev();

	if (e != cudaSuccess)
		return ret(e);
	if (capture_forbids("cudaMemcpy"))
		return ret(cudaErrorStreamCaptureUnsupported);
	if ((e = flush_device(cur_dev)) != cudaSuccess)
		return ret(e);
	if ((e = cudaMemcpyAsync(dst, src, n, kind, nullptr)) != cudaSuccess)
		return e;
	return ret(flush_device(cur_dev));
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
	cudaError_t e = check_dev();
	CUstream_st *st;

	if (e != cudaSuccess)
		return ret(e);
	{
		std::lock_guard<std::mutex> g(mu);
		const region *r = find(p, n ? n : 1);
		if (!r || r->dev != cur_dev) {
			fprintf(stderr, "cuemu: cudaMemsetAsync of %zu bytes at %p: not inside one "
				"allocation of the current device\n", n, p);
			return ret(cudaErrorInvalidValue);
		}
	}
	st = resolve(s);
	if (st->dev != cur_dev)
		return ret(cudaErrorInvalidResourceHandle);
	return ret(enqueue(st, make_op("memset", run_set, set_st{ p, v, n })));
}

cudaError_t cudaMemset(void *p, int v, size_t n)
{
	cudaError_t e = cudaMemsetAsync(p, v, n, nullptr);
	return e != cudaSuccess ? e : ret(flush_device(cur_dev));
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	cudaError_t e = check_dev();

	(void)flags;
	if (e != cudaSuccess)
		return ret(e);
	CUstream_st *st = new CUstream_st();
	st->dev = cur_dev;
	st->legacy = false;
	st->q.reserve(STREAM_OPS);
	std::lock_guard<std::mutex> g(mu);
	streams[cur_dev].push_back(st);
	*s = st;
	return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
	return cudaStreamCreateWithFlags(s, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	if (!s)
		return ret(cudaErrorInvalidResourceHandle);
	flush(s);
	std::lock_guard<std::mutex> g(mu);
	auto &v = streams[s->dev];
	for (size_t i = 0; i < v.size(); i++)
		if (v[i] == s) {
			v.erase(v.begin() + (long)i);
			break;
		}
	delete s->cap;
	delete s;
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	CUstream_st *st = resolve(s);

	if (st->cap) {
		fprintf(stderr, "cuemu: cudaStreamSynchronize of a capturing stream: not permitted, "
			"the capture is invalidated\n");
		st->cap_err = cudaErrorStreamCaptureInvalidated;
		return ret(cudaErrorStreamCaptureUnsupported);
	}
	if (capture_forbids("cudaStreamSynchronize"))
		return ret(cudaErrorStreamCaptureUnsupported);
	return ret(flush(st));
}

// --- events -----------------------------------------------------------------

struct CUevent_st {
	int dev;
	CUstream_st *stream = nullptr; // of the last record (nullptr: never recorded)
	uint64_t pending = 0;          // records queued and not yet run
	double ms = 0;                 // the clock when the last record ran
};

namespace {

struct ev_st {
	CUevent_st *ev;
};

cudaError_t run_event(const op &o)
{
	CUevent_st *ev = state_of<ev_st>(o).ev;
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	ev->ms = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
	ev->pending--;
	return cudaSuccess;
}

} // namespace

cudaError_t cudaEventCreate(cudaEvent_t *ev)
{
	cudaError_t e = check_dev();

	if (e != cudaSuccess)
		return ret(e);
	if (!ev)
		return ret(cudaErrorInvalidValue);
	*ev = new CUevent_st();
	(*ev)->dev = cur_dev;
	return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
	if (!ev)
		return ret(cudaErrorInvalidResourceHandle);
	if (ev->pending && ev->stream)
		flush(ev->stream); // its queued records write it
	delete ev;
	return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
	if (!ev)
		return ret(cudaErrorInvalidResourceHandle);
	cudaError_t e = check_dev();
	if (e != cudaSuccess)
		return ret(e);
	CUstream_st *st = resolve(s);
	if (st->dev != ev->dev) // a stream of another device than the event's
		return ret(cudaErrorInvalidResourceHandle);
	if (st->cap) {
		fprintf(stderr, "cuemu: cudaEventRecord on a capturing stream: not modeled, the "
			"capture is invalidated\n");
		st->cap_err = cudaErrorStreamCaptureInvalidated;
		return ret(cudaErrorStreamCaptureUnsupported);
	}
	if ((e = enqueue(st, make_op("event", run_event, ev_st{ ev }))) != cudaSuccess)
		return e;
	ev->stream = st;
	ev->pending++;
	return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t ev)
{
	if (!ev)
		return ret(cudaErrorInvalidResourceHandle);
	if (ev->pending && ev->stream)
		return ret(flush(ev->stream));
	return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	if (!ms || !start || !end)
		return ret(cudaErrorInvalidValue);
	if (!start->stream || !end->stream)
		return ret(cudaErrorInvalidResourceHandle);
	if (start->pending || end->pending)
		return ret(cudaErrorNotReady);
	*ms = (float)(end->ms - start->ms);
	return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
	cudaError_t e = check_dev();

	if (e != cudaSuccess)
		return ret(e);
	if (!s) // the legacy stream cannot be captured
		return ret(cudaErrorStreamCaptureUnsupported);
	if (s->cap || tl_capture)
		return ret(cudaErrorIllegalState);
	s->cap = new CUgraph_st{ s->dev, {} };
	s->mode = mode;
	s->cap_thread = std::this_thread::get_id();
	s->cap_err = cudaSuccess;
	if (mode != cudaStreamCaptureModeRelaxed)
		tl_capture = s;
	return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
	*g = nullptr;
	if (!s || !s->cap)
		return ret(cudaErrorIllegalState);
	if (s->mode != cudaStreamCaptureModeRelaxed && s->cap_thread != std::this_thread::get_id())
		return ret(cudaErrorStreamCaptureWrongThread);
	CUgraph_st *graph = s->cap;
	cudaError_t e = s->cap_err;
	s->cap = nullptr;
	if (tl_capture == s)
		tl_capture = nullptr;
	if (e != cudaSuccess) {
		delete graph;
		return ret(cudaErrorStreamCaptureInvalidated);
	}
	*g = graph;
	return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *ex, cudaGraph_t g, unsigned long long flags)
{
	(void)flags;
	*ex = nullptr;
	if (!g)
		return ret(cudaErrorInvalidValue);
	if (capture_forbids("cudaGraphInstantiate"))
		return ret(cudaErrorStreamCaptureUnsupported);
	*ex = new CUgraphExec_st{ g->dev, g->ops };
	return cudaSuccess;
}

cudaError_t cudaGraphUpload(cudaGraphExec_t ex, cudaStream_t s)
{
	if (!ex || resolve(s)->dev != ex->dev)
		return ret(cudaErrorInvalidResourceHandle);
	return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t ex, cudaStream_t s)
{
	cudaError_t e = check_dev();
	CUstream_st *st;

	if (e != cudaSuccess)
		return ret(e);
	st = resolve(s);
	if (!ex || st->dev != ex->dev || st->dev != cur_dev)
		return ret(cudaErrorInvalidResourceHandle);
	{
		std::lock_guard<std::mutex> g(mu);
		stats.graph_launches++;
	}
	for (const op &o : ex->ops) {
		if (st->cap) {
			st->cap->ops.push_back(o);
		} else {
			if (!st->q.capacity())
				st->q.reserve(STREAM_OPS);
			st->q.push_back(o);
		}
	}
	return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
	delete g;
	return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t ex)
{
	delete ex;
	return cudaSuccess;
}
