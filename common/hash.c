/* hash.c - sw_hash64: four 64-bit lanes over 32-byte stripes.
 *
 * Each lane folds in one 8-byte word per stripe with a multiply, a rotate
 * and a second multiply, so the lanes run independently and the CPU can
 * overlap them. The lanes are merged, the length and the tail (< 32 bytes)
 * are mixed in, and a final xorshift-multiply avalanche spreads every input
 * bit over the whole result. Not for security: keys are cache keys only.
 */
#include "common/hash.h"

#include <string.h>

/* Odd constants with well-spread bits (golden ratio and friends). */
#define K0 0x9e3779b97f4a7c15ULL
#define K1 0xc2b2ae3d27d4eb4fULL
#define K2 0x165667b19e3779f9ULL
#define K3 0xd6e8feb86659fd93ULL
#define K4 0xa0761d6478bd642fULL

static inline uint64_t rotl64(uint64_t x, int r)
{
	return (x << r) | (x >> (64 - r));
}

static inline uint64_t read64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v)); /* unaligned-safe; compiles to one load */
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	v = __builtin_bswap64(v);
#endif
	return v;
}

static inline uint32_t read32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof(v));
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	v = __builtin_bswap32(v);
#endif
	return v;
}

/* One lane step: the multiply spreads low bits up, the rotate brings high
 * bits back down so the next multiply can spread them again. */
static inline uint64_t lane(uint64_t acc, uint64_t word)
{
	acc += word * K1;
	acc = rotl64(acc, 31);
	return acc * K0;
}

static inline uint64_t avalanche(uint64_t h)
{
	h ^= h >> 32;
	h *= K3;
	h ^= h >> 29;
	h *= K2;
	h ^= h >> 32;
	return h;
}

uint64_t sw_hash64(const void *data, size_t len, uint64_t seed)
{
	const uint8_t *p = data;
	const uint8_t *end;
	uint64_t h;

	if (len == 0) /* same value as the general path; avoids NULL + 0 */
		return avalanche(seed + K2);
	end = p + len;

	if (len >= 32) {
		uint64_t a = seed + K0 + K1;
		uint64_t b = seed + K1;
		uint64_t c = seed ^ K4;
		uint64_t d = seed - K0;
		const uint8_t *last = end - 32;

		do {
			a = lane(a, read64(p));
			b = lane(b, read64(p + 8));
			c = lane(c, read64(p + 16));
			d = lane(d, read64(p + 24));
			p += 32;
		} while (p <= last);

		/* Merge with different rotations so swapping two stripes' words
		 * between lanes does not cancel out. */
		h = rotl64(a, 1) + rotl64(b, 7) + rotl64(c, 12) + rotl64(d, 18);
		h = (h ^ lane(0, a)) * K0 + K3;
		h = (h ^ lane(0, b)) * K0 + K3;
		h = (h ^ lane(0, c)) * K0 + K3;
		h = (h ^ lane(0, d)) * K0 + K3;
	} else {
		h = seed + K2;
	}

	h += (uint64_t)len;

	while (end - p >= 8) {
		h ^= lane(0, read64(p));
		h = rotl64(h, 27) * K0 + K3;
		p += 8;
	}
	if (end - p >= 4) {
		h ^= (uint64_t)read32(p) * K0;
		h = rotl64(h, 23) * K1 + K2;
		p += 4;
	}
	while (p < end) {
		h ^= (uint64_t)*p * K4;
		h = rotl64(h, 11) * K0;
		p++;
	}
	return avalanche(h);
}
