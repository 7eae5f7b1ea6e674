/* fuzz_mask.c - libFuzzer target: bytes -> mask descriptor -> validate,
 * and compile when valid, checking the compiled mask's invariants.
 *
 * Input layout (missing bytes read as 0):
 *   [0] n_segments (0..GPUD_MASK_MAX_SEGMENTS + 2: a few past the limit)
 *   [1] max_segments given to validate
 *   [2] block_tokens - 1 (low 5 bits) and flags: bit 7 = no rows (causal)
 *   then per segment i < S: its token count (0..15)
 *   then per row i <= S: n (0..15) followed by n bytes of indices; an
 *   index byte >= 0xF0 becomes a large value (out of range on purpose).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/err.h"
#include "gpud/mask.h"
#include "tests/fuzz/fuzz.h"

#define MAXS (GPUD_MASK_MAX_SEGMENTS + 3)

struct reader {
	const uint8_t *p;
	size_t n, at;
};

static uint8_t next(struct reader *r)
{
	return r->at < r->n ? r->p[r->at++] : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct proto_mask_row rows[MAXS];
	static uint16_t idx[MAXS][16];
	static uint32_t lens[MAXS];
	static _Alignas(16) uint8_t mem[(MAXS + 1 + MAXS * 15) * sizeof(gpud_segset) + MAXS * 15];
	struct reader r = { data, size, 0 };
	struct proto_mask_desc d;
	struct gpud_mask m, m2;
	char err[SW_ERR_MAX];
	uint32_t s, max, bt, i, j, total = 0;
	bool causal_in;
	int rc;

	s = next(&r) % (GPUD_MASK_MAX_SEGMENTS + 3);
	max = next(&r);
	bt = next(&r);
	causal_in = bt & 0x80;
	bt = 1 + (bt & 31);
	for (i = 0; i < s; i++) {
		lens[i] = next(&r) % 16;
		total += lens[i];
	}
	for (i = 0; i <= s; i++) {
		rows[i].n = next(&r) % 16;
		rows[i].idx = idx[i];
		for (j = 0; j < rows[i].n; j++) {
			uint8_t b = next(&r);
			idx[i][j] = b >= 0xF0 ? (uint16_t)(b * 257) : b;
		}
	}
	d.n_segments = s;
	d.rows = causal_in ? NULL : rows;

	err[0] = 0;
	rc = proto_mask_validate(&d, max, err, sizeof(err));
	CHECK(rc == 0 || rc == SW_ETOOLONG || rc == SW_EFORMAT);
	CHECK(rc == 0 || err[0] != 0); /* every refusal says why */
	if (rc)
		return 0;
	CHECK(s <= GPUD_MASK_MAX_SEGMENTS);

	size_t need = gpud_mask_bytes(s, total, bt);
	CHECK(need <= sizeof(mem));
	rc = gpud_mask_compile(&d, lens, bt, mem, need, &m);
	CHECK(rc == 0); /* valid descriptors always compile */
	CHECK(m.n_segments == s && m.n_prompt == total && m.block_tokens == bt);
	CHECK(m.n_prompt_blocks == (total + bt - 1) / bt);
	/* seg ids in range, in order, with the given lengths */
	uint32_t pos = 0;
	for (i = 0; i < s; i++)
		for (j = 0; j < lens[i]; j++, pos++)
			CHECK(m.seg[pos] == i);
	for (i = 0; i <= s; i++) {
		CHECK(gpud_segset_has(&m.vis[i], i));
		for (j = i + 1; j < 128; j++)
			CHECK(!gpud_segset_has(&m.vis[i], j)); /* nothing forward */
	}
	/* block sets hold exactly the segments of their positions */
	for (uint32_t b = 0; b < m.n_prompt_blocks; b++)
		for (pos = b * bt; pos < (b + 1) * bt; pos++)
			CHECK(gpud_segset_has(&m.block_segs[b], gpud_mask_seg(&m, pos)));
	if (causal_in)
		CHECK(m.causal);
	/* block test + token test == the definition, for small masks (a few
	 * generated positions past the prompt included) */
	if (total <= 64) {
		for (uint32_t q = 0; q < total + 3; q++) {
			unsigned qs = gpud_mask_seg(&m, q);
			for (uint32_t k = 0; k <= q; k++) {
				unsigned ks = gpud_mask_seg(&m, k);
				bool want = ks == qs;
				if (causal_in) {
					want = true;
				} else {
					for (j = 0; j < rows[qs].n; j++)
						want |= rows[qs].idx[j] == ks;
				}
				int bv = gpud_mask_block_vis(&m, qs, k / bt);
				CHECK(bv >= 0 && bv <= 2);
				CHECK((bv == 1 || (bv == 2 && gpud_mask_visible(&m, qs, k))) == want);
			}
		}
	}
	/* deterministic */
	_Alignas(16) static uint8_t mem2[sizeof(mem)];
	CHECK(gpud_mask_compile(&d, lens, bt, mem2, need, &m2) == 0);
	CHECK(m2.hash == m.hash && m2.causal == m.causal);
	CHECK(memcmp(mem, mem2, need) == 0);
	return 0;
}
