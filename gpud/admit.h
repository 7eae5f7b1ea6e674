/* admit.h - admission of a SUBMIT: proto's wire types (proto/msg.h)
 * checked against gpud's configuration and converted to gpud's own.
 *
 * proto_submit_decode has already checked the format (counts, lengths,
 * the descriptor's shape against the server's decoder limits); this is
 * where gpud applies what is its own to decide: the configured segment
 * maximum, the sampler's ranges, and the form its scheduler takes (gpud
 * sampler parameters, NUL-terminated stop strings). The mask descriptor
 * stays proto's type: gpud compiles it as it came (gpud/mask.h). Nothing
 * here allocates.
 */
#ifndef GPUD_ADMIT_H
#define GPUD_ADMIT_H

#include <stddef.h>
#include <stdint.h>

#include "gpud/sampler.h"
#include "proto/msg.h"

/* A SUBMIT as gpud takes it, before tokenization. Plain value type (about
 * 600 bytes); stop[] points into the struct's own stop_buf. */
struct gpud_admit {
	const struct proto_mask_desc *mask;  /* validated, borrowed from the
					      * request; NULL: causal */
	struct gpud_sampler_params sampling; /* checked */
	uint32_t max_tokens;
	uint32_t n_stop;
	const char *stop[PROTO_MAX_STOP];    /* (n_stop) into stop_buf */
	char stop_buf[PROTO_MAX_STOP][PROTO_MAX_STOP_LEN + 1];
	uint32_t n_bias;                     /* logit biases, split (unchecked:
					      * the scheduler knows the vocabulary) */
	int32_t bias_id[PROTO_MAX_LOGIT_BIAS];
	float bias[PROTO_MAX_LOGIT_BIAS];
};

/* gpud's sampler parameters for the wire's (a field-by-field copy,
 * unchecked). */
void gpud_sampling_from_proto(struct gpud_sampler_params *out, const struct proto_sampling *in);

/* Checks q (a decoded request) against gpud's limits, max_segments being
 * gpud.max_segments, and fills *out; q's mask stays borrowed by out.
 * Returns 0, or the error the client gets, with its message:
 *   -EINVAL       sampling parameters out of range; no segments;
 *   SW_ETOOLONG   more segments than max_segments, too many stop
 *                 strings or logit biases;
 *   SW_EFORMAT    a descriptor for another number of segments, or one
 *                 that breaks the rules of proto_mask_validate (which
 *                 also gives -EINVAL for a row without its indices).
 * On error *out is unspecified. */
int gpud_admit_submit(const struct proto_submit_req *q, uint32_t max_segments,
		      struct gpud_admit *out, char *err, size_t errlen);

#endif
