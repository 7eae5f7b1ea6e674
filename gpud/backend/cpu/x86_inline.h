/* x86_inline.h - small AVX2 helpers shared by the int8 kernels
 * (kernels_x86.c, kernels_kq_x86.c). Include after <immintrin.h>, only
 * where GPUD_HAVE_X86; every function carries its target attribute and is
 * inlined into callers that carry at least AVX2+FMA+F16C.
 */
#ifndef GPUD_X86_INLINE_H
#define GPUD_X86_INLINE_H

#include <string.h>

#define GPUD__X86_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

/* acc += the 4 u8 x s8 products of each 32-bit lane, as AVX-VNNI's
 * vpdpbusd. Inline asm: the VNNI intrinsics would need a target attribute
 * that the shared code around it cannot carry. Only run when CPUID says
 * so (gpud_cpu_features() & GPUD_CPU_AVXVNNI). */
GPUD__X86_INLINE __m256i dpbusd_vex(__m256i acc, __m256i a_u8, __m256i b_s8)
{
	__asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(a_u8), "x"(b_s8));
	return acc;
}

/* The 4 bytes at p in every 32-bit lane. */
GPUD__X86_INLINE __m256i bcast4(const int8_t *p)
{
	int32_t v;

	memcpy(&v, p, sizeof(v));
	return _mm256_set1_epi32(v);
}

/* 8x8 transpose of 32-bit elements: out[g] lane r = in[r] lane g. */
GPUD__X86_INLINE void transpose8(const __m256i in[8], __m256i out[8])
{
	__m256i t[8], u[8];

	_Pragma("GCC unroll 4")
	for (int k = 0; k < 4; k++) {
		t[2 * k] = _mm256_unpacklo_epi32(in[2 * k], in[2 * k + 1]);
		t[2 * k + 1] = _mm256_unpackhi_epi32(in[2 * k], in[2 * k + 1]);
	}
	_Pragma("GCC unroll 2")
	for (int k = 0; k < 2; k++) {
		u[4 * k + 0] = _mm256_unpacklo_epi64(t[4 * k + 0], t[4 * k + 2]);
		u[4 * k + 1] = _mm256_unpackhi_epi64(t[4 * k + 0], t[4 * k + 2]);
		u[4 * k + 2] = _mm256_unpacklo_epi64(t[4 * k + 1], t[4 * k + 3]);
		u[4 * k + 3] = _mm256_unpackhi_epi64(t[4 * k + 1], t[4 * k + 3]);
	}
	_Pragma("GCC unroll 4")
	for (int k = 0; k < 4; k++) {
		out[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
		out[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
	}
}

#endif
