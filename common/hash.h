/* hash.h - fast 64-bit non-cryptographic hashing (cache keys, not security).
 *
 * sw_hash64 processes 32 bytes per round with four independent lanes of
 * multiply-rotate mixing, then a final avalanche. Results are identical on
 * every host (input words are read little-endian) and any alignment; they
 * are cache keys only and are never stored, so the function may change.
 */
#ifndef SW_HASH_H
#define SW_HASH_H

#include <stddef.h>
#include <stdint.h>

/* Hashes len bytes at data (any alignment; data may be NULL when len is 0)
 * with seed. Never fails. */
uint64_t sw_hash64(const void *data, size_t len, uint64_t seed);

/* Combines two hashes order-dependently (parent-chained prefix keys). */
static inline uint64_t sw_hash_combine(uint64_t a, uint64_t b)
{
	uint64_t x = a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	return x;
}

#endif
