/* frame_test.c - fixed-layout frames (proto/frame.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <sys/socket.h>
#include <unistd.h>

#include "common/err.h"
#include "proto/frame.h"
#include "proto/shm.h"

static char g_err[SW_ERR_MAX];

static struct proto_frame sample(void)
{
	struct proto_frame f;
	proto_frame_init(&f, PROTO_T_SUBMIT, 0x0102030405060708ull);
	f.payload_offset = 0x1000;
	f.payload_length = 0x20;
	return f;
}

/* The documented bytes, field by field, little-endian. */
static void test_encode_layout(void **state)
{
	(void)state;
	struct proto_frame f = sample();
	f.flags = PROTO_F_RING;
	uint8_t b[PROTO_FRAME_SIZE];
	memset(b, 0xAA, sizeof(b));
	proto_frame_encode(&f, b);
	static const uint8_t want[PROTO_FRAME_SIZE] = {
		'S', 'W', 'R', 'M',                              /* magic */
		PROTO_VERSION, 0,                                /* version */
		PROTO_T_SUBMIT, 0,                               /* type */
		1, 0, 0, 0,                                      /* flags */
		0, 0, 0, 0,                                      /* aux */
		8, 7, 6, 5, 4, 3, 2, 1,                          /* request id */
		0, 0x10, 0, 0, 0, 0, 0, 0,                       /* offset */
		0x20, 0, 0, 0, 0, 0, 0, 0,                       /* length */
	};
	assert_memory_equal(b, want, sizeof(want));
	assert_int_equal(PROTO_FRAME_OFF_PAYLOAD_LENGTH + 8, PROTO_FRAME_SIZE);
}

static void test_roundtrip_every_type(void **state)
{
	(void)state;
	for (uint16_t t = 1; t < PROTO_T_LAST; t++) {
		struct proto_frame f, g;
		proto_frame_init(&f, t, 1000u + t);
		f.payload_offset = t * 64u;
		f.payload_length = t;
		if (t == PROTO_T_ERROR)
			f.aux = (uint32_t)-SW_EVERSION;
		uint8_t b[PROTO_FRAME_SIZE];
		proto_frame_encode(&f, b);
		assert_int_equal(proto_frame_decode(b, sizeof(b), &g, g_err, sizeof(g_err)), 0);
		assert_memory_equal(&f, &g, sizeof(f));
		assert_string_not_equal(proto_type_name(t), "?");
	}
	assert_string_equal(proto_type_name(0), "?");
	assert_string_equal(proto_type_name(PROTO_T_LAST), "?");
	assert_string_equal(proto_type_name(PROTO_T_SUBMIT), "SUBMIT");
}

static int decode_bytes(const uint8_t *b, size_t n, struct proto_frame *out)
{
	g_err[0] = '\0';
	return proto_frame_decode(b, n, out, g_err, sizeof(g_err));
}

static void test_decode_errors(void **state)
{
	(void)state;
	struct proto_frame f = sample(), g;
	uint8_t b[PROTO_FRAME_SIZE + 1];
	proto_frame_encode(&f, b);

	assert_int_equal(decode_bytes(b, PROTO_FRAME_SIZE - 1, &g), SW_EFORMAT);
	assert_non_null(strstr(g_err, "length 39"));
	assert_int_equal(decode_bytes(b, PROTO_FRAME_SIZE + 1, &g), SW_EFORMAT);
	assert_int_equal(proto_frame_decode(NULL, PROTO_FRAME_SIZE, &g, NULL, 0), -EINVAL);
	assert_int_equal(proto_frame_decode(b, PROTO_FRAME_SIZE, NULL, NULL, 0), -EINVAL);

	/* magic */
	f = sample();
	f.magic ^= 1;
	proto_frame_encode(&f, b);
	assert_int_equal(decode_bytes(b, PROTO_FRAME_SIZE, &g), SW_EFORMAT);
	assert_non_null(strstr(g_err, "magic"));

	/* version: its own code, and the frame is still readable */
	f = sample();
	f.version = PROTO_VERSION + 1;
	proto_frame_encode(&f, b);
	assert_int_equal(decode_bytes(b, PROTO_FRAME_SIZE, &g), SW_EVERSION);
	assert_int_equal(g.version, PROTO_VERSION + 1);
	assert_int_equal(g.type, PROTO_T_SUBMIT);
	assert_int_equal(g.request_id, f.request_id);
	assert_non_null(strstr(g_err, "version 2"));
	/* a bad magic wins over a bad version */
	f.magic = 0;
	proto_frame_encode(&f, b);
	assert_int_equal(decode_bytes(b, PROTO_FRAME_SIZE, &g), SW_EFORMAT);

	/* unknown types: a newer peer; the request id is still there */
	uint16_t bad_types[] = { 0, PROTO_T_LAST, 0xFFFF };
	for (size_t i = 0; i < sizeof(bad_types) / sizeof(bad_types[0]); i++) {
		f = sample();
		f.type = bad_types[i];
		proto_frame_encode(&f, b);
		assert_int_equal(decode_bytes(b, PROTO_FRAME_SIZE, &g), SW_EUNSUPPORTED);
		assert_int_equal(g.request_id, f.request_id);
		assert_non_null(strstr(g_err, "unknown type"));
	}

	/* reserved flag bits */
	f = sample();
	f.flags = 0x80000000u;
	proto_frame_encode(&f, b);
	assert_int_equal(decode_bytes(b, PROTO_FRAME_SIZE, &g), SW_EFORMAT);
	assert_non_null(strstr(g_err, "reserved flag"));

	/* aux only on ERROR */
	f = sample();
	f.aux = 5;
	proto_frame_encode(&f, b);
	assert_int_equal(decode_bytes(b, PROTO_FRAME_SIZE, &g), SW_EFORMAT);
	assert_non_null(strstr(g_err, "aux"));

	/* offset + length overflow */
	f = sample();
	f.payload_offset = UINT64_MAX - 3;
	f.payload_length = 4;
	proto_frame_encode(&f, b);
	assert_int_equal(decode_bytes(b, PROTO_FRAME_SIZE, &g), SW_EFORMAT);
	assert_non_null(strstr(g_err, "overflows"));
	f.payload_length = 3; /* ends exactly at 2^64 - 1: representable */
	proto_frame_encode(&f, b);
	assert_int_equal(decode_bytes(b, PROTO_FRAME_SIZE, &g), 0);
}

static void test_direction(void **state)
{
	(void)state;
	int from_client = 0;
	for (uint16_t t = 0; t <= PROTO_T_LAST; t++)
		from_client += proto_type_from_client(t);
	assert_int_equal(from_client, 8);
	assert_true(proto_type_from_client(PROTO_T_SUBMIT));
	assert_true(proto_type_from_client(PROTO_T_DETOKENIZE));
	assert_false(proto_type_from_client(PROTO_T_DETOKENIZE_REPLY));
	assert_string_equal(proto_type_name(PROTO_T_DETOKENIZE_REPLY), "DETOKENIZE_REPLY");
	assert_true(proto_type_from_client(PROTO_T_HELLO));
	assert_false(proto_type_from_client(PROTO_T_TOKENS));
	assert_false(proto_type_from_client(PROTO_T_ERROR));
	assert_false(proto_type_from_client(0));
}

static void test_span_check(void **state)
{
	(void)state;
	/* area [100, 200) */
	assert_int_equal(proto_span_check(100, 100, 100, 100, "x", NULL, 0), 0);
	assert_int_equal(proto_span_check(150, 50, 100, 100, "x", NULL, 0), 0);
	assert_int_equal(proto_span_check(200, 0, 100, 100, "x", NULL, 0), 0);
	assert_int_equal(proto_span_check(150, 51, 100, 100, "x", g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "x: offset 150 + length 51"));
	assert_int_equal(proto_span_check(99, 1, 100, 100, "x", NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_span_check(201, 0, 100, 100, "x", NULL, 0), SW_EFORMAT);
	/* lengths that would wrap an unchecked off + len */
	assert_int_equal(proto_span_check(150, UINT64_MAX, 100, 100, "x", NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_span_check(UINT64_MAX, 2, 100, 100, "x", NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_span_check(0, 0, UINT64_MAX, 2, "x", NULL, 0), SW_EFORMAT);
	assert_int_equal(proto_span_check(UINT64_MAX - 1, 1, UINT64_MAX - 1, 1, NULL, NULL, 0),
			 0);
}

static void test_payload(void **state)
{
	(void)state;
	static uint8_t region[4096];
	const void *p = (void *)1;
	struct proto_frame f = sample(); /* offset 0x1000, length 0x20 */

	/* request area [1024, 4096) */
	f.payload_offset = 1024;
	assert_int_equal(proto_frame_payload(&f, region, 1024, 3072, &p, NULL, 0), 0);
	assert_ptr_equal(p, region + 1024);
	f.payload_offset = 4096 - 0x20;
	assert_int_equal(proto_frame_payload(&f, region, 1024, 3072, &p, NULL, 0), 0);
	assert_ptr_equal(p, region + 4096 - 0x20);
	f.payload_offset = 4096 - 0x1f;
	assert_int_equal(proto_frame_payload(&f, region, 1024, 3072, &p, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_null(p);
	assert_non_null(strstr(g_err, "frame SUBMIT: payload"));
	/* below the request area: the header and the ring are not payload */
	f.payload_offset = 0;
	assert_int_equal(proto_frame_payload(&f, region, 1024, 3072, &p, NULL, 0), SW_EFORMAT);

	/* no payload: offset must be 0 too */
	f.payload_length = 0;
	f.payload_offset = 0;
	p = (void *)1;
	assert_int_equal(proto_frame_payload(&f, region, 1024, 3072, &p, NULL, 0), 0);
	assert_null(p);
	f.payload_offset = 2000;
	assert_int_equal(proto_frame_payload(&f, region, 1024, 3072, &p, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "without a payload"));

	/* ring payloads name nothing in the region */
	proto_frame_init(&f, PROTO_T_TOKENS, 9);
	f.flags = PROTO_F_RING;
	assert_int_equal(proto_frame_payload(&f, region, 1024, 3072, &p, NULL, 0), 0);
	assert_null(p);
	f.payload_length = 16;
	assert_int_equal(proto_frame_payload(&f, region, 1024, 3072, &p, g_err, sizeof(g_err)),
			 SW_EFORMAT);
	assert_non_null(strstr(g_err, "ring"));

	assert_int_equal(proto_frame_payload(&f, region, 0, 1, NULL, NULL, 0), -EINVAL);
	assert_int_equal(proto_frame_payload(NULL, region, 0, 1, &p, NULL, 0), -EINVAL);
	assert_int_equal(proto_frame_payload(&f, NULL, 0, 1, &p, NULL, 0), -EINVAL);
}

static void test_le_helpers(void **state)
{
	(void)state;
	uint8_t b[8];
	proto_put64(b, 0x1122334455667788ull);
	assert_int_equal(b[0], 0x88);
	assert_int_equal(b[7], 0x11);
	assert_true(proto_get64(b) == 0x1122334455667788ull);
	proto_put16(b, 0xBEEF);
	assert_int_equal(proto_get16(b), 0xBEEF);
	proto_putf32(b, -1.5f);
	assert_true(proto_getf32(b) == -1.5f);
	assert_int_equal(proto_get32(b), 0xBFC00000u);
}

/* DESIGN §4: a version mismatch -> an error frame carrying SW_EVERSION,
 * then the server closes. Played over a real socketpair. */
static void test_version_mismatch_flow(void **state)
{
	(void)state;
	int sv[2]; /* [0] client, [1] server */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	struct proto_frame hello, got;
	proto_frame_init(&hello, PROTO_T_HELLO, 0);
	hello.version = PROTO_VERSION + 1; /* a newer client */
	assert_int_equal(proto_send_frame(sv[0], &hello, -1), 0);

	uint8_t b[PROTO_FRAME_SIZE];
	assert_int_equal(proto_recv_frame(sv[1], b, NULL), 0);
	assert_int_equal(proto_frame_decode(b, sizeof(b), &got, g_err, sizeof(g_err)),
			 SW_EVERSION);
	struct proto_frame reply;
	proto_frame_init(&reply, PROTO_T_ERROR, got.request_id);
	reply.aux = (uint32_t)-SW_EVERSION;
	assert_int_equal(proto_send_frame(sv[1], &reply, -1), 0);
	close(sv[1]);

	int fd;
	assert_int_equal(proto_recv_frame(sv[0], b, &fd), 0);
	assert_int_equal(fd, -1);
	/* this test's "client" speaks the same code, so the reply decodes;
	 * a real newer client gets SW_EVERSION from decode, the same answer */
	assert_int_equal(proto_frame_decode(b, sizeof(b), &got, NULL, 0), 0);
	assert_int_equal(got.type, PROTO_T_ERROR);
	assert_int_equal(-(int)got.aux, SW_EVERSION);
	assert_string_equal(sw_errname(-(int)got.aux), "SW_EVERSION");
	assert_int_equal(proto_recv_frame(sv[0], b, &fd), SW_ECLOSED);
	close(sv[0]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_encode_layout),
		cmocka_unit_test(test_roundtrip_every_type),
		cmocka_unit_test(test_decode_errors),
		cmocka_unit_test(test_direction),
		cmocka_unit_test(test_span_check),
		cmocka_unit_test(test_payload),
		cmocka_unit_test(test_le_helpers),
		cmocka_unit_test(test_version_mismatch_flow),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
