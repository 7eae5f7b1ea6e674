/* admit.c - a SUBMIT's wire types checked and converted (gpud/admit.h).
 * gpud's limits may be wider than the wire's, never narrower: the asserts
 * below say where the two must agree. */
#include "gpud/admit.h"

#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "gpud/mask.h"

_Static_assert(PROTO_MAX_STOP <= GPUD_STOP_MAX_STRINGS, "every stop string fits gpud_stop");
_Static_assert(PROTO_MAX_STOP_LEN <= GPUD_STOP_MAX_LEN, "every stop string fits gpud_stop");
/* DONE carries gpud's stop reason as it is. */
_Static_assert((int)PROTO_STOP_EOG == (int)GPUD_STOP_EOG &&
		       (int)PROTO_STOP_STRING == (int)GPUD_STOP_STRING &&
		       (int)PROTO_STOP_MAX_TOKENS == (int)GPUD_STOP_MAX_TOKENS,
	       "the wire's stop reasons are gpud's");

void gpud_sampling_from_proto(struct gpud_sampler_params *out, const struct proto_sampling *in)
{
	*out = (struct gpud_sampler_params){
		.temperature = in->temperature,
		.top_k = in->top_k,
		.top_p = in->top_p,
		.min_p = in->min_p,
		.seed = in->seed,
		.penalty_last_n = in->penalty_last_n,
		.repeat_penalty = in->repeat_penalty,
		.frequency_penalty = in->frequency_penalty,
		.presence_penalty = in->presence_penalty,
	};
}

int gpud_admit_submit(const struct proto_submit_req *q, uint32_t max_segments,
		      struct gpud_admit *out, char *err, size_t errlen)
{
	const struct proto_mask_desc *desc = q->mask && q->mask->rows ? q->mask : NULL;
	int rc;

	gpud_sampling_from_proto(&out->sampling, &q->sampling);
	rc = gpud_sampler_params_check(&out->sampling, err, errlen);
	if (rc)
		return rc;
	if (q->n_segments == 0)
		return sw_seterr(err, errlen, -EINVAL, "submit: no segments");
	if (q->n_segments > max_segments)
		return sw_seterr(err, errlen, SW_ETOOLONG,
				 "submit: %u segments, at most %u (gpud.max_segments)", q->n_segments,
				 max_segments);
	if (desc) {
		if (desc->n_segments != q->n_segments)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "mask: descriptor for %u segments, request has %u",
					 desc->n_segments, q->n_segments);
		rc = proto_mask_validate(desc, max_segments, err, errlen);
		if (rc)
			return rc;
	}
	if (q->n_stop > PROTO_MAX_STOP)
		return sw_seterr(err, errlen, SW_ETOOLONG, "submit: %u stop strings, at most %d",
				 q->n_stop, PROTO_MAX_STOP);
	out->mask = desc;
	out->max_tokens = q->max_tokens;
	out->n_stop = q->n_stop;
	for (uint32_t i = 0; i < q->n_stop; i++) {
		uint32_t len = q->stop[i].len;
		if (len > PROTO_MAX_STOP_LEN)
			len = PROTO_MAX_STOP_LEN;
		memcpy(out->stop_buf[i], q->stop[i].p, len);
		out->stop_buf[i][len] = '\0';
		out->stop[i] = out->stop_buf[i];
	}
	if (q->n_bias > PROTO_MAX_LOGIT_BIAS)
		return sw_seterr(err, errlen, SW_ETOOLONG, "submit: %u logit biases, at most %d",
				 q->n_bias, PROTO_MAX_LOGIT_BIAS);
	out->n_bias = q->n_bias;
	for (uint32_t i = 0; i < q->n_bias; i++) {
		out->bias_id[i] = q->bias[i].id;
		out->bias[i] = q->bias[i].bias;
	}
	return 0;
}
