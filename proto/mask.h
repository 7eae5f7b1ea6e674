/* mask.h - the attention mask descriptor, a wire type (DESIGN §3; byte
 * layout in proto/README.md §4.1).
 *
 * A request is segments s0..s(S-1) followed by the implicit generation
 * segment G, which has index S. The descriptor lists, for each row i in
 * 0..S (row S is G), the segments whose tokens the tokens of segment i may
 * see. A segment always sees itself, so a row may leave itself out. No
 * descriptor (rows NULL) means plain causal attention.
 *
 * Clients fill it; proto_submit_encode writes it and proto_submit_decode
 * reads it back; gpud checks it against its configured maximum and
 * compiles it (gpud/mask.h).
 */
#ifndef PROTO_MASK_H
#define PROTO_MASK_H

#include <stdint.h>

/* Hard limit of the format: 127 segments plus G (a consumer's bitsets are
 * 128 wide). A configured maximum (gpud.max_segments, struct proto_limits)
 * may be lower. */
#define PROTO_MAX_SEGMENTS 127

/* Row i: the visible segments, indices into 0..i. */
struct proto_mask_row {
	const uint16_t *idx; /* (n), borrowed */
	uint32_t n;
};

struct proto_mask_desc {
	uint32_t n_segments;               /* S, not counting G */
	const struct proto_mask_row *rows; /* (S + 1) rows, or NULL: causal */
};

#endif
