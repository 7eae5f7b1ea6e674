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
 * compiles it (gpud/mask.h). proto_mask_validate is the one place the rule
 * is written down, and every one of them calls it.
 */
#ifndef PROTO_MASK_H
#define PROTO_MASK_H

#include <stddef.h>
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

/* Checks desc against max_segments (0 or a value over PROTO_MAX_SEGMENTS
 * means PROTO_MAX_SEGMENTS): segment count in range, every index in range
 * (<= S), no forward reference (an index > i in row i). Duplicate indices
 * are allowed; rows == NULL is valid. Returns 0, SW_ETOOLONG (too many
 * segments), SW_EFORMAT (an index out of range or forward), or -EINVAL
 * (desc NULL, or a row with n > 0 and idx NULL), with a message naming the
 * row and entry ("mask: row 3, entry 1: forward reference to segment 5").
 * Nothing is modified. */
int proto_mask_validate(const struct proto_mask_desc *desc, uint32_t max_segments,
			char *err, size_t errlen);

#endif
