/* test_desc.h - mask descriptors built row by row, for the tests of the
 * descriptor's rules (proto_mask_test) and of its compilation (mask_test).
 * Header-only: each test gets its own static copies. */
#ifndef TEST_DESC_H
#define TEST_DESC_H

#include <stdint.h>
#include <string.h>

#include "proto/mask.h"

/* Room for the largest descriptor plus a row past the limit. */
struct desc_buf {
	struct proto_mask_row rows[PROTO_MAX_SEGMENTS + 2];
	uint16_t idx[PROTO_MAX_SEGMENTS + 2][PROTO_MAX_SEGMENTS + 2];
	struct proto_mask_desc d;
};

/* An empty descriptor of s segments (s + 1 rows, the last one G's). */
static inline void desc_init(struct desc_buf *b, uint32_t s)
{
	memset(b, 0, sizeof(*b));
	b->d.n_segments = s;
	b->d.rows = b->rows;
	for (uint32_t i = 0; i <= s && i < PROTO_MAX_SEGMENTS + 2; i++)
		b->rows[i].idx = b->idx[i];
}

/* Row row also sees segment v. */
static inline void desc_add(struct desc_buf *b, uint32_t row, uint16_t v)
{
	b->idx[row][b->rows[row].n++] = v;
}

/* Row i sees every j <= i: plain causal written out. */
static inline void desc_all(struct desc_buf *b, uint32_t s)
{
	desc_init(b, s);
	for (uint32_t i = 0; i <= s; i++)
		for (uint32_t j = 0; j <= i; j++)
			desc_add(b, i, (uint16_t)j);
}

#endif
