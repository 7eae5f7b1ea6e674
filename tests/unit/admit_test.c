/* admit_test.c - a SUBMIT's wire types checked against gpud's limits and
 * converted (gpud/admit.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "gpud/admit.h"

static char g_err[SW_ERR_MAX];
static uint8_t g_buf[4096];
static struct proto_submit g_sub;
static struct gpud_admit g_adm;

/* Three chat segments, block attention, two stop strings. */
struct req {
	struct proto_segment seg[3];
	uint16_t idx[4][3];
	struct proto_mask_row rows[4];
	struct proto_mask_desc mask;
	struct proto_text stop[2];
	struct proto_submit_req q;
};

static void req_init(struct req *r)
{
	static const uint16_t vis[4][3] = { { 0 }, { 0, 1 }, { 0, 2 }, { 1, 2, 3 } };
	static const uint32_t nvis[4] = { 1, 2, 2, 3 };

	memset(r, 0, sizeof(*r));
	r->seg[0] = (struct proto_segment){ "sys", 3, PROTO_ROLE_SYSTEM, 0 };
	r->seg[1] = (struct proto_segment){ "one", 3, PROTO_ROLE_USER, 0 };
	r->seg[2] = (struct proto_segment){ "two", 3, PROTO_ROLE_USER, 0 };
	for (int i = 0; i < 4; i++) {
		memcpy(r->idx[i], vis[i], sizeof(vis[i]));
		r->rows[i] = (struct proto_mask_row){ r->idx[i], nvis[i] };
	}
	r->mask = (struct proto_mask_desc){ 3, r->rows };
	r->stop[0] = (struct proto_text){ "\n\n", 2 };
	r->stop[1] = (struct proto_text){ "User:", 5 };
	r->q = (struct proto_submit_req){
		.n_segments = 3, .segments = r->seg, .mask = &r->mask, .max_tokens = 77,
		.flags = PROTO_SUBMIT_CHAT, .n_stop = 2, .stop = r->stop,
	};
	proto_sampling_default(&r->q.sampling);
}

static int admit(const struct proto_submit_req *q, uint32_t max_segments)
{
	g_err[0] = '\0';
	return gpud_admit_submit(q, max_segments, &g_adm, g_err, sizeof(g_err));
}

static void expect(const struct proto_submit_req *q, int rc, const char *msg)
{
	int got = admit(q, 64);
	if (got != rc || !strstr(g_err, msg))
		fail_msg("rc %s, '%s' (wanted %s, '%s')", sw_errname(got), g_err, sw_errname(rc),
			 msg);
}

static void test_sampling_converted(void **state)
{
	(void)state;
	const struct proto_sampling in = {
		.temperature = 0.7f, .top_k = 40, .top_p = 0.9f, .min_p = 0.05f,
		.seed = 0xDEADBEEFCAFEull, .penalty_last_n = 64, .repeat_penalty = 1.1f,
		.frequency_penalty = 0.25f, .presence_penalty = -0.5f,
	};
	struct gpud_sampler_params out;
	gpud_sampling_from_proto(&out, &in);
	assert_true(out.temperature == in.temperature && out.top_k == in.top_k &&
		    out.top_p == in.top_p && out.min_p == in.min_p && out.seed == in.seed &&
		    out.penalty_last_n == in.penalty_last_n &&
		    out.repeat_penalty == in.repeat_penalty &&
		    out.frequency_penalty == in.frequency_penalty &&
		    out.presence_penalty == in.presence_penalty);

	/* the wire's defaults are gpud's defaults */
	struct proto_sampling pd;
	struct gpud_sampler_params gd;
	proto_sampling_default(&pd);
	gpud_sampling_from_proto(&out, &pd);
	gpud_sampler_params_default(&gd);
	assert_memory_equal(&out, &gd, sizeof(gd));
}

/* What proto_submit_decode hands gpud, gpud admits as it is. */
static void test_admit_decoded(void **state)
{
	(void)state;
	struct req r;
	size_t len;
	req_init(&r);
	r.q.sampling.temperature = 0.5f;
	r.q.sampling.seed = 99;
	assert_int_equal(proto_submit_encode(&r.q, g_buf, sizeof(g_buf), &len, g_err,
					     sizeof(g_err)), 0);
	assert_int_equal(proto_submit_decode(g_buf, len, NULL, &g_sub, g_err, sizeof(g_err)), 0);
	memset(&g_adm, 0xAB, sizeof(g_adm));
	assert_int_equal(admit(&g_sub.req, 64), 0);
	assert_ptr_equal(g_adm.mask, g_sub.req.mask);
	assert_true(g_adm.sampling.temperature == 0.5f);
	assert_int_equal(g_adm.sampling.seed, 99);
	assert_int_equal(g_adm.max_tokens, 77);
	assert_int_equal(g_adm.n_stop, 2);
	assert_string_equal(g_adm.stop[0], "\n\n");
	assert_string_equal(g_adm.stop[1], "User:");
	assert_ptr_equal(g_adm.stop[1], g_adm.stop_buf[1]);

	/* rows NULL: no descriptor, plain causal */
	r.mask.rows = NULL;
	r.q.n_stop = 0;
	assert_int_equal(admit(&r.q, 64), 0);
	assert_null(g_adm.mask);
	assert_int_equal(g_adm.n_stop, 0);
	r.q.mask = NULL;
	assert_int_equal(admit(&r.q, 64), 0);
	assert_null(g_adm.mask);

	/* a stop string of the largest length keeps every byte */
	char longest[PROTO_MAX_STOP_LEN];
	memset(longest, 'z', sizeof(longest));
	r.stop[0] = (struct proto_text){ longest, PROTO_MAX_STOP_LEN };
	r.q.n_stop = 1;
	assert_int_equal(admit(&r.q, 64), 0);
	assert_int_equal(strlen(g_adm.stop[0]), PROTO_MAX_STOP_LEN);
}

static void test_admit_refused(void **state)
{
	(void)state;
	struct req r;

	req_init(&r);
	r.q.sampling.min_p = 2.0f;
	expect(&r.q, -EINVAL, "sampler: min_p must be in [0, 1]");
	req_init(&r);
	r.q.sampling.top_p = 0.0f;
	expect(&r.q, -EINVAL, "sampler: top_p");

	req_init(&r);
	r.q.n_segments = 0;
	r.q.mask = NULL;
	expect(&r.q, -EINVAL, "submit: no segments");

	/* the configured maximum, not the wire's */
	static struct proto_segment many[65];
	req_init(&r);
	for (int i = 0; i < 65; i++)
		many[i] = (struct proto_segment){ "x", 1, PROTO_ROLE_USER, 0 };
	r.q.n_segments = 65;
	r.q.segments = many;
	r.q.mask = NULL;
	expect(&r.q, SW_ETOOLONG, "submit: 65 segments, at most 64 (gpud.max_segments)");
	assert_int_equal(admit(&r.q, 127), 0);

	req_init(&r);
	r.mask.n_segments = 2;
	expect(&r.q, SW_EFORMAT, "mask: descriptor for 2 segments, request has 3");
	req_init(&r);
	r.idx[1][1] = 2;
	expect(&r.q, SW_EFORMAT, "mask: row 1, entry 1: forward reference to segment 2");
	req_init(&r);
	r.idx[3][2] = 4;
	expect(&r.q, SW_EFORMAT, "mask: row 3, entry 2: segment 4 out of range (0..3)");

	req_init(&r);
	r.q.n_stop = PROTO_MAX_STOP + 1;
	expect(&r.q, SW_ETOOLONG, "submit: 9 stop strings, at most 8");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sampling_converted),
		cmocka_unit_test(test_admit_decoded),
		cmocka_unit_test(test_admit_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
