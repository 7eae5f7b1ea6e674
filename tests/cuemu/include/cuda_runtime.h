/* cuda_runtime.h - cuemu's CUDA runtime (tests/cuemu/README.md): the part
 * of the runtime API, the device built-ins and the intrinsics that the
 * CUDA backend uses, so that its .cu files (rewritten by cu2cc.py: a
 * launch `k<<<g, b, shm, s>>>(args)` becomes cuemu_launch(...)) compile as
 * plain C++ and run on the CPU. Semantics follow CUDA where the backend
 * depends on them: stream work runs at the next synchronization, not when
 * enqueued; capture records into a graph; kernels run every thread of a
 * block as a fiber, with __syncthreads and warp shuffles as real barriers.
 * Declarations only, the runtime is cuemu.cc. */
#ifndef CUEMU_CUDA_RUNTIME_H
#define CUEMU_CUDA_RUNTIME_H

#ifndef __cplusplus
#error "cuemu: the CUDA sources compile as C++ (cu2cc.py)"
#endif

#include <driver_types.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

/* --- qualifiers --------------------------------------------------------- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
/* The storage a static __shared__ declaration names (cu2cc.py renames
 * it and declares the variable as a reference into the block's shared
 * memory, cuemu::shared_at): one per host thread, never read or written. */
#define __shared__ static thread_local

/* --- vector types ------------------------------------------------------------
 * Aligned as on the device: with -fsanitize=alignment (the cuemu build) a
 * vector load from a misaligned address stops the run, as it faults on a
 * GPU. */
struct uint3 {
	unsigned x, y, z;
};
struct dim3 {
	unsigned x, y, z;
	constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) int4 {
	int x, y, z, w;
};
struct alignas(16) uint4 {
	unsigned x, y, z, w;
};
struct alignas(16) float4 {
	float x, y, z, w;
};
struct alignas(8) float2 {
	float x, y;
};
struct alignas(8) int2 {
	int x, y;
};
static inline int4 make_int4(int x, int y, int z, int w) { return int4{ x, y, z, w }; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w)
{
	return uint4{ x, y, z, w };
}
static inline float4 make_float4(float x, float y, float z, float w)
{
	return float4{ x, y, z, w };
}
static inline float2 make_float2(float x, float y) { return float2{ x, y }; }

/* The built-in indices of the running thread (set by the fiber scheduler
 * each time it resumes a thread). */
extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
static const int warpSize = 32;

/* --- handles and properties ---------------------------------------------- */
typedef struct CUstream_st *cudaStream_t;
typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUevent_st *cudaEvent_t;

struct cudaDeviceProp {
	char name[256];
	size_t totalGlobalMem, sharedMemPerBlock;
	int major, minor, multiProcessorCount, maxThreadsPerBlock, warpSize;
	int maxGridSize[3], maxThreadsDim[3];
};

/* --- launch attributes (cudaLaunchKernelEx) ------------------------------------
 * The one the backend sets: programmatic dependent launch (sm_90). cuemu
 * runs a stream's kernels one after another, so it changes no order; it
 * checks that a kernel so launched waits (griddepcontrol.wait) in every
 * block: one that ended without waiting could end before its predecessor,
 * and let its successors start too early on a GPU. */
enum cudaLaunchAttributeID {
	cudaLaunchAttributeIgnore = 0,
	cudaLaunchAttributeProgrammaticStreamSerialization = 6,
};

union cudaLaunchAttributeValue {
	char pad[64];
	int programmaticStreamSerializationAllowed;
};

struct cudaLaunchAttribute {
	cudaLaunchAttributeID id;
	union cudaLaunchAttributeValue val;
};

struct cudaLaunchConfig_t {
	dim3 gridDim, blockDim;
	size_t dynamicSmemBytes;
	cudaStream_t stream;
	cudaLaunchAttribute *attrs;
	unsigned numAttrs;
};

/* --- the runtime API (cuemu.cc) ------------------------------------------------ */
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaMalloc(void **p, size_t n);
cudaError_t cudaFree(void *p);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
			    cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s = 0);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
/* Events: a record is stream work that stamps the host's monotonic clock
 * when the stream runs it; elapsed time is between two such stamps (on
 * cuemu, emulator time). Recording on a capturing stream is not modeled
 * (the backend never does): it fails and invalidates the capture. */
cudaError_t cudaEventCreate(cudaEvent_t *ev);
cudaError_t cudaEventDestroy(cudaEvent_t ev);
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t ev);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *ex, cudaGraph_t g,
				 unsigned long long flags = 0);
cudaError_t cudaGraphUpload(cudaGraphExec_t ex, cudaStream_t s);
cudaError_t cudaGraphLaunch(cudaGraphExec_t ex, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t g);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t ex);
/* The CTAs of a kernel of block threads and dyn bytes of dynamic shared
 * memory that one multiprocessor holds at once. A GPU counts the kernel's
 * registers and static shared memory too, the compiler's figures, which
 * cuemu has not: it answers for the H100 it models (2048 threads and 228
 * KB a multiprocessor, at most 32 CTAs) from the threads and dyn alone,
 * or with CUEMU_OCCUPANCY's figure where that is smaller (a device that
 * holds fewer CTAs, such as an RTX 4090). */
cudaError_t cuemu_occupancy(int *n, int block, size_t dyn);
template <class F>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, F, int block,
									 size_t dyn)
{
	return cuemu_occupancy(n, block, dyn);
}

/* --- launches ------------------------------------------------------------------- */
namespace cuemu {
/* A kernel and its arguments as the launch copied them: state (size
 * bytes) is copied with copy and run by invoke. Trivially destructible. */
struct kernel_body {
	void (*invoke)(const void *state);
	void (*copy)(void *dst, const void *src);
	const void *state;
	size_t size, align;
	const void *fn; /* the kernel (an instantiation of a template its own) */
};
/* Enqueues body as a kernel of grid g and blocks b on stream s (checks the
 * configuration as the device does; bound: the kernel's
 * __launch_bounds__, 0 for none). Allocates nothing once the stream's
 * queue has grown to its working size. */
cudaError_t launch(const char *name, unsigned bound, dim3 g, dim3 b, size_t shm, cudaStream_t s,
		   const kernel_body &body, bool pdl = false);
void *dyn_smem(void);
/* Where the block's shared memory holds the static __shared__ variable
 * whose (renamed, untouched) storage is key, n bytes aligned to align:
 * placed after the launch's dynamic shared memory, in the order the
 * launch's threads first reach the declarations, and filled with 0xff by
 * the first thread of each block to pass it, as the launch fills the
 * dynamic part (a GPU's shared memory holds whatever was there, never
 * what this block wrote). cu2cc.py declares each variable as a reference
 * to it (shared_at). */
void *shared_place(const void *key, size_t n, size_t align);
template <class T> T &shared_at(T *key)
{
	return *static_cast<T *>(shared_place(key, sizeof(T), alignof(T)));
}
/* griddepcontrol.wait: marks the block as having waited */
void griddep_wait(void);
void syncthreads(void);
int syncthreads_count(int pred);
void warp_xchg(unsigned mask, const void *in, void *out, size_t n, int src);
/* every lane's 16 bytes v into out[lane] (one barrier): for emulating
 * warp-collective instructions */
void warp_gather(unsigned mask, const uint64_t v[2], uint64_t out[32][2]);
/* ldmatrix.sync.aligned.m8n8.x4.shared.b16: this lane's row address in,
 * its 4 words out (cuemu_ldmatrix_x4) */
void ldmatrix_x4(const void *row, unsigned r[4]);
unsigned warp_vote(unsigned mask, int pred);
void syncwarp(unsigned mask);
unsigned lane(void);
/* cp.async (n bytes; zeros when !full, src unread), cp.async.commit_group
 * and cp.async.wait_group keep: the copies land at the wait that lets
 * their group complete (all but the newest keep groups; copies not yet
 * committed wait), or at the thread's end. */
void cp_async(void *dst, const void *src, unsigned n, bool full);
void cp_commit(void);
void cp_wait(unsigned keep);
/* The race build's memory order of atomics and fences (no-ops
 * otherwise): __threadfence marks the thread fenced; an atomic on p then
 * acquires what earlier atomics on p released, and releases the thread's
 * accesses only when it is fenced (a CUDA atomic is relaxed: it
 * publishes what came before it only behind a fence). */
void race_fence(void);
void race_atomic(void *p);

template <class F, class... T>
struct closure {
	F k;
	std::tuple<T...> args;
};
} // namespace cuemu

namespace cuemu {
/* A launch of k with arguments a: converted to the kernel's parameter
 * types and copied at the launch, as CUDA does; the kernel runs when the
 * stream's work does. */
template <class... P, class... A>
cudaError_t launch_args(const char *name, unsigned bound, dim3 g, dim3 b, size_t shm,
			cudaStream_t s, bool pdl, void (*k)(P...), A &&...a)
{
	typedef closure<void (*)(P...), typename std::decay<P>::type...> C;
	static_assert(std::is_trivially_destructible<C>::value,
		      "cuemu: kernel arguments must be trivially destructible");
	C c{ k, std::tuple<typename std::decay<P>::type...>(std::forward<A>(a)...) };
	kernel_body body = {
		[](const void *p) {
			const C *x = (const C *)p;
			std::apply(x->k, x->args);
		},
		[](void *d, const void *src) { new (d) C(*(const C *)src); },
		&c, sizeof(C), alignof(C), reinterpret_cast<const void *>(k),
	};

	return launch(name, bound, g, b, shm, s, body, pdl);
}
} // namespace cuemu

/* cu2cc.py's form of k<<<g, b, shm, s>>>(args...). */
template <class... P, class... A>
cudaError_t cuemu_launch(const char *name, unsigned bound, dim3 g, dim3 b, size_t shm,
			 cudaStream_t s, void (*k)(P...), A &&...a)
{
	return cuemu::launch_args(name, bound, g, b, shm, s, false, k, std::forward<A>(a)...);
}

/* cu2cc.py's form of cudaLaunchKernelEx(cfg, k, args...): cuemu_launch
 * with the configuration's attributes checked (an unknown one is refused,
 * as this emulator does not implement it). */
template <class... P, class... A>
cudaError_t cuemu_launch_ex(const char *name, unsigned bound, const cudaLaunchConfig_t *cfg,
			    void (*k)(P...), A &&...a)
{
	bool pdl = false;

	for (unsigned i = 0; i < cfg->numAttrs; i++) {
		if (cfg->attrs[i].id == cudaLaunchAttributeProgrammaticStreamSerialization)
			pdl = cfg->attrs[i].val.programmaticStreamSerializationAllowed != 0;
		else if (cfg->attrs[i].id != cudaLaunchAttributeIgnore)
			return cudaErrorNotSupported;
	}
	return cuemu::launch_args(name, bound, cfg->gridDim, cfg->blockDim, cfg->dynamicSmemBytes,
				  cfg->stream, pdl, k, std::forward<A>(a)...);
}

/* griddepcontrol (PTX, sm_90): launch_dependents changes nothing here (a
 * stream's kernels run in order); wait is recorded for the check above. */
static inline void cuemu_griddepcontrol_launch_dependents(void) {}
static inline void cuemu_griddepcontrol_wait(void) { cuemu::griddep_wait(); }

/* --- synchronization and warp intrinsics ------------------------------------- */
static inline void __syncthreads(void) { cuemu::syncthreads(); }
static inline int __syncthreads_count(int pred) { return cuemu::syncthreads_count(pred); }
static inline int __syncthreads_or(int pred) { return cuemu::syncthreads_count(pred) != 0; }
static inline int __syncthreads_and(int pred)
{
	return cuemu::syncthreads_count(pred) == (int)(blockDim.x * blockDim.y * blockDim.z);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu) { cuemu::syncwarp(mask); }

template <class T>
static inline T cuemu_shfl(unsigned mask, T v, int src)
{
	static_assert(sizeof(T) <= 8, "cuemu: shuffles of up to 8 bytes");
	T out;
	cuemu::warp_xchg(mask, &v, &out, sizeof(T), src);
	return out;
}

template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32)
{
	int l = (int)cuemu::lane();
	return cuemu_shfl(mask, v, (l & ~(width - 1)) + (src & (width - 1)));
}

template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lm, int width = 32)
{
	int l = (int)cuemu::lane(), s = l ^ lm;
	if ((s & ~(width - 1)) != (l & ~(width - 1)))
		s = l; /* outside the lane's segment: its own value */
	return cuemu_shfl(mask, v, s);
}

template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32)
{
	int l = (int)cuemu::lane(), s = l + (int)d;
	if ((s & ~(width - 1)) != (l & ~(width - 1)))
		s = l;
	return cuemu_shfl(mask, v, s);
}

template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32)
{
	int l = (int)cuemu::lane(), s = l - (int)d;
	if (s < 0 || (s & ~(width - 1)) != (l & ~(width - 1)))
		s = l;
	return cuemu_shfl(mask, v, s);
}

static inline unsigned __ballot_sync(unsigned mask, int pred) { return cuemu::warp_vote(mask, pred); }
static inline int __any_sync(unsigned mask, int pred) { return cuemu::warp_vote(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred)
{
	return cuemu::warp_vote(mask, pred) == cuemu::warp_vote(mask, 1);
}

/* --- tensor cores -------------------------------------------------------------------
 * mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 d, a, b, c as the PTX ISA
 * lays out its fragments (g = lane / 4, t = lane % 4; four int8 per
 * register, lowest byte first): a0 = A[g][4t..4t+3], a1 = A[g+8][4t..4t+3];
 * b0 = B[4t..4t+3][g]; c and d: [0], [1] = C[g][2t], C[g][2t+1] and [2],
 * [3] = C[g+8][2t], C[g+8][2t+1]. A warp-collective, as on the GPU; kernels
 * reach it through their wrapper, which is the PTX instruction under nvcc.
 * d may be c. */
static inline int __dp4a(int a, int b, int c);
static inline void cuemu_mma_s8_m16n8k16(int d[4], unsigned a0, unsigned a1, unsigned b0,
					 const int c[4])
{
	int l = (int)cuemu::lane(), g = l >> 2, t = l & 3;
	uint64_t mine[2] = { a0 | (uint64_t)a1 << 32, b0 }, all[32][2];
	int out[4];

	cuemu::warp_gather(0xffffffffu, mine, all); /* every lane's a0, a1 and b0 */
	for (int h = 0; h < 2; h++) /* rows g, g + 8 */
		for (int e = 0; e < 2; e++) { /* columns 2t, 2t + 1 */
			int acc = c[2 * h + e], n = 2 * t + e;
			for (int k = 0; k < 4; k++) /* A[row][4k..] is lane g*4+k's; B[4k..][n] lane n*4+k's */
				acc = __dp4a((int)(unsigned)(all[g * 4 + k][0] >> (32 * h)),
					     (int)(unsigned)all[n * 4 + k][1], acc);
			out[2 * h + e] = acc;
		}
	for (int i = 0; i < 4; i++)
		d[i] = out[i];
}

/* ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0, r1, r2, r3}, [row]: lane l
 * gives the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte
 * aligned); r[i] of lane l is word l % 4 of row l / 4 of matrix i. A
 * warp-collective, as on the GPU. */
static inline void cuemu_ldmatrix_x4(unsigned r[4], const void *row) { cuemu::ldmatrix_x4(row, r); }

/* --- atomics and fences ------------------------------------------------------------
 * Blocks run one at a time on the stream's thread, devices on their own:
 * the builtins keep them atomic anyway. Under ThreadSanitizer they are
 * relaxed (atomic, ordering nothing), and the order a GPU gives them is
 * cuemu's to tell: race_atomic after each (an acquire, and a release
 * only behind a __threadfence), race_fence in __threadfence. */
#ifdef __SANITIZE_THREAD__
#define CUEMU_ATOMIC_ORDER __ATOMIC_RELAXED
#define CUEMU_ATOMIC_DONE(p) cuemu::race_atomic(p)
#else
#define CUEMU_ATOMIC_ORDER __ATOMIC_SEQ_CST
#define CUEMU_ATOMIC_DONE(p) ((void)0)
#endif
static inline unsigned atomicAdd(unsigned *p, unsigned v)
{
	unsigned o = __atomic_fetch_add(p, v, CUEMU_ATOMIC_ORDER);
	CUEMU_ATOMIC_DONE(p);
	return o;
}
static inline int atomicAdd(int *p, int v)
{
	int o = __atomic_fetch_add(p, v, CUEMU_ATOMIC_ORDER);
	CUEMU_ATOMIC_DONE(p);
	return o;
}
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
	unsigned long long o = __atomic_fetch_add(p, v, CUEMU_ATOMIC_ORDER);
	CUEMU_ATOMIC_DONE(p);
	return o;
}
static inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v)
{
	unsigned long long o = __atomic_load_n(p, CUEMU_ATOMIC_ORDER);

	while (o < v && !__atomic_compare_exchange_n(p, &o, v, false, CUEMU_ATOMIC_ORDER,
						     CUEMU_ATOMIC_ORDER))
		;
	CUEMU_ATOMIC_DONE(p);
	return o;
}
#ifdef __SANITIZE_THREAD__
/* ThreadSanitizer models no fence (gcc warns of one): cuemu marks the
 * thread fenced for its next atomics (race_atomic) */
static inline void __threadfence(void)
{
	__asm__ __volatile__("mfence" ::: "memory");
	cuemu::race_fence();
}
#else
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
#endif
/* a load that skips L1 (ld.global.cg): one coherent memory here */
template <class T> static inline T __ldcg(const T *p) { return *p; }

/* --- arithmetic intrinsics ------------------------------------------------------
 * The cuemu build compiles with -ffp-contract=off: a*b+c stays two
 * roundings unless written fmaf, as the _rn intrinsics require. */
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b)
{
	return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
static inline float __uint_as_float(unsigned u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline unsigned __float_as_uint(float f)
{
	unsigned u;
	memcpy(&u, &f, 4);
	return u;
}
static inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }
static inline int __float_as_int(float f) { return (int)__float_as_uint(f); }

/* Four signed byte products summed into c. */
static inline int __dp4a(int a, int b, int c)
{
	for (int i = 0; i < 4; i++)
		c += (int)(int8_t)(uint8_t)((unsigned)a >> (8 * i)) *
		     (int)(int8_t)(uint8_t)((unsigned)b >> (8 * i));
	return c;
}

/* Per-byte a - b, each byte modulo 256. */
static inline unsigned __vsub4(unsigned a, unsigned b)
{
	unsigned r = 0;
	for (int i = 0; i < 4; i++)
		r |= ((((a >> (8 * i)) & 0xffu) - ((b >> (8 * i)) & 0xffu)) & 0xffu) << (8 * i);
	return r;
}

/* --- fp16 and bf16 (the bits of IEEE binary16 and of bfloat16) ----------------- */
struct __half {
	unsigned short x;
};
struct __nv_bfloat16 {
	unsigned short x;
};

static inline __half __ushort_as_half(unsigned short u) { return __half{ u }; }
static inline unsigned short __half_as_ushort(__half h) { return h.x; }

static inline float __half2float(__half h)
{
	unsigned s = (unsigned)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1fu, m = h.x & 0x3ffu;

	if (e == 0) { /* zero or subnormal: m * 2^-24, exact */
		float f = (float)m * 0x1p-24f;
		return s ? -f : f;
	}
	if (e == 31)
		return __uint_as_float(s | 0x7f800000u | (m << 13));
	return __uint_as_float(s | ((e + 112) << 23) | (m << 13));
}

/* Round to nearest even, overflow to infinity, NaN kept quiet. */
static inline __half __float2half_rn(float f)
{
	unsigned u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;

	if (a > 0x7f800000u)
		return __half{ (unsigned short)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)) };
	if (a >= 0x477ff000u) /* >= 65520: rounds to infinity */
		return __half{ (unsigned short)(sign | 0x7c00u) };
	if (a < 0x38800000u) { /* below 2^-14: a subnormal half, m * 2^-24 */
		float m = nearbyintf(__uint_as_float(a) * 0x1p24f);
		return __half{ (unsigned short)(sign | (unsigned)m) };
	}
	unsigned h = ((a >> 23) - 112) << 10 | ((a >> 13) & 0x3ffu), rb = a & 0x1fffu;
	if (rb > 0x1000u || (rb == 0x1000u && (h & 1)))
		h++;
	return __half{ (unsigned short)(sign | h) };
}

static inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((unsigned)b.x << 16); }

static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
	unsigned u = __float_as_uint(f);

	if ((u & 0x7fffffffu) > 0x7f800000u)
		return __nv_bfloat16{ (unsigned short)((u >> 16) | 0x40u) };
	u += 0x7fffu + ((u >> 16) & 1u);
	return __nv_bfloat16{ (unsigned short)(u >> 16) };
}

/* mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 d, a, b, c
 * (bf16: the bfloat16 form) as the PTX ISA lays out its fragments (g =
 * lane / 4, t = lane % 4; two halves per register, the lower column
 * first): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][8+2t..],
 * a[3] = A[g+8][8+2t..]; b[0] = B[2t..2t+1][g], b[1] = B[8+2t..][g]; c and
 * d as cuemu_mma_s8_m16n8k16's. The products are exact in fp32; each sum
 * adds them in k order. d may be c. */
static inline void cuemu_mma_h_m16n8k16(float d[4], const unsigned a[4], const unsigned b[2],
					bool bf16)
{
	int l = (int)cuemu::lane(), g = l >> 2, t = l & 3;
	uint64_t ma[2] = { a[0] | (uint64_t)a[1] << 32, a[2] | (uint64_t)a[3] << 32 };
	uint64_t mb[2] = { b[0] | (uint64_t)b[1] << 32, 0 }, aa[32][2], bb[32][2];
	float out[4];
	auto val = [bf16](unsigned word, int half) {
		unsigned short u = (unsigned short)(word >> (16 * half));
		return bf16 ? __bfloat162float(__nv_bfloat16{ u }) : __half2float(__half{ u });
	};

	cuemu::warp_gather(0xffffffffu, ma, aa);
	cuemu::warp_gather(0xffffffffu, mb, bb);
	for (int h = 0; h < 2; h++) /* rows g, g + 8 */
		for (int e = 0; e < 2; e++) { /* columns 2t, 2t + 1 */
			float acc = 0.0f;
			int n = 2 * t + e;

			for (int k = 0; k < 16; k++) {
				int kh = k >> 3, kl = (k & 7) >> 1; /* A: lane g*4 + kl, register h + 2 kh */
				unsigned aw = (unsigned)(aa[g * 4 + kl][kh] >> (32 * h));
				unsigned bw = (unsigned)(bb[n * 4 + kl][0] >> (32 * kh));
				acc += val(aw, k & 1) * val(bw, k & 1);
			}
			out[2 * h + e] = acc;
		}
	for (int i = 0; i < 4; i++)
		d[i] += out[i];
}

#endif
