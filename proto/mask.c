/* mask.c - the mask descriptor's validation (proto/mask.h). */
#include "proto/mask.h"

#include <errno.h>

#include "common/err.h"

int proto_mask_validate(const struct proto_mask_desc *desc, uint32_t max_segments,
			char *err, size_t errlen)
{
	uint32_t max = max_segments;
	uint32_t s;

	if (max == 0 || max > PROTO_MAX_SEGMENTS)
		max = PROTO_MAX_SEGMENTS;
	if (!desc)
		return sw_seterr(err, errlen, -EINVAL, "mask: no descriptor");
	s = desc->n_segments;
	if (s > max)
		return sw_seterr(err, errlen, SW_ETOOLONG,
				 "mask: %u segments exceed the maximum of %u", s, max);
	if (!desc->rows)
		return 0;
	for (uint32_t i = 0; i <= s; i++) {
		const struct proto_mask_row *r = &desc->rows[i];

		if (r->n > 0 && !r->idx)
			return sw_seterr(err, errlen, -EINVAL,
					 "mask: row %u: %u indices but no index array", i, r->n);
		for (uint32_t j = 0; j < r->n; j++) {
			uint32_t v = r->idx[j];

			if (v > s)
				return sw_seterr(err, errlen, SW_EFORMAT,
						 "mask: row %u, entry %u: segment %u out of range (0..%u)",
						 i, j, v, s);
			if (v > i)
				return sw_seterr(err, errlen, SW_EFORMAT,
						 "mask: row %u, entry %u: forward reference to segment %u",
						 i, j, v);
		}
	}
	return 0;
}
