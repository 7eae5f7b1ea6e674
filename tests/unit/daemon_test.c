/* daemon_test.c - the daemon's pure pieces: memory plan arithmetic and its
 * messages, byte formatting, segment tokenization (plain and chat) with
 * stories260K. (The scratch figure the plan uses: backend_test.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/backend.h"
#include "gpud/backend/cuda/cuda.h"
#include "gpud/daemon.h"
#include "gpud/engine.h"
#include "gpud/model.h"
#include "gpud/tokenizer.h"
#include "proto/frame.h"
#include "proto/msg.h"
#include "sw_config.h"

#define MODEL SW_SHARED_DIR "/models/stories260K.gguf"
#define GiB (1ull << 30)
#define MiB (1ull << 20)

static char err[SW_ERR_MAX];

static const struct sw_config_device cpu2[2] = { { SW_DEVICE_CPU, 0, 0 }, { SW_DEVICE_CPU, 0, 1 } };

static struct gpud_plan_in base_in(void)
{
	return (struct gpud_plan_in){
		.n_devices = 1,
		.devices = cpu2,
		.host_ram = 16 * GiB,
		.memory_fraction = 0.5,
		.weight_bytes = 2 * GiB,
		.kv_block_bytes = 1 * MiB,
		.kv_blocks = 0,
		.max_seqs = 4,
		.n_ctx = 1024,
		.block_tokens = 16,
		.scratch_bytes = 512 * MiB,
		.mask_bytes = 64 * MiB,
		.host_bytes = 448 * MiB,
	};
}

static void test_fmt_bytes(void **state)
{
	char b[32];
	(void)state;
	gpud_fmt_bytes(0, b, sizeof(b));
	assert_string_equal(b, "0 B");
	gpud_fmt_bytes(1023, b, sizeof(b));
	assert_string_equal(b, "1023 B");
	gpud_fmt_bytes(1536, b, sizeof(b));
	assert_string_equal(b, "1.5 KiB");
	gpud_fmt_bytes(12ull * GiB + GiB / 2, b, sizeof(b));
	assert_string_equal(b, "12.5 GiB");
	gpud_fmt_bytes(3ull << 40, b, sizeof(b));
	assert_string_equal(b, "3.0 TiB");
}

static void test_plan_derive(void **state)
{
	struct gpud_plan_in in = base_in();
	struct gpud_plan p;
	(void)state;

	/* 8 GiB budget - (2 GiB + 448 MiB + 576 MiB) = 5 GiB of KV room, but
	 * 4 full contexts need only 4 x 64 blocks: capped. */
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), 0);
	assert_true(p.total == 8 * GiB);
	assert_true(p.fixed == 3 * GiB);
	assert_true(p.kv_room == 5 * GiB);
	assert_int_equal(p.kv_blocks_full, 256);
	assert_int_equal(p.kv_blocks, 256);
	assert_true(p.kv_bytes == 256 * MiB);
	assert_true(p.used == 3 * GiB + 256 * MiB);

	/* Without the cap the room decides: 5 GiB / 1 MiB. */
	in.max_seqs = 1000;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), 0);
	assert_int_equal(p.kv_blocks, 5120);
	assert_true(p.used <= p.total);

	/* Two cpu devices share RAM: weights once, fixed pools twice, the rest
	 * split. (8 - 2 - 0.4375 - 2 x 0.5625) / 2 = 2.21875 GiB each. */
	in.n_devices = 2;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), 0);
	assert_true(p.fixed == 2 * GiB + 448 * MiB + 2 * 576 * MiB);
	assert_true(p.kv_room == (8 * GiB - p.fixed) / 2);
	assert_int_equal(p.kv_blocks, 2272);
	assert_true(p.used == p.fixed + 2 * 2272 * MiB);
	assert_true(p.used <= p.total);
}

static void test_plan_configured(void **state)
{
	struct gpud_plan_in in = base_in();
	struct gpud_plan p;
	(void)state;

	in.kv_blocks = 5120; /* exactly the room */
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), 0);
	assert_int_equal(p.kv_blocks, 5120);
	assert_true(p.used == p.total);

	in.kv_blocks = 100000;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), SW_EEXHAUSTED);
	assert_string_equal(err, "gpud.kv_blocks=100000 needs 97.7 GiB of KV per device; "
				 "gpud.memory_fraction 0.5 of 16.0 GiB (8.0 GiB) leaves 5.0 GiB per "
				 "device after weights and fixed pools (3.0 GiB) on 1 device "
				 "(at most 5120 blocks of 1048576 bytes)");

	in.n_devices = 2;
	in.kv_blocks = 5120;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), SW_EEXHAUSTED);
	assert_non_null(strstr(err, "on 2 devices (at most 2272 blocks"));
}

static void test_plan_errors(void **state)
{
	struct gpud_plan_in in = base_in();
	struct sw_config_device mixed[2] = { { SW_DEVICE_CPU, 0, 0 }, { SW_DEVICE_CUDA, 3, 1 } };
	struct gpud_plan p;
	(void)state;

	/* The fixed pools alone do not fit. */
	in.weight_bytes = 9 * GiB;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), SW_EEXHAUSTED);
	assert_string_equal(err, "memory plan: weights (9.0 GiB) + scratch and mask pools "
				 "(576.0 MiB per device x 1) + host pools need 10.0 GiB; "
				 "gpud.memory_fraction 0.5 of 16.0 GiB is 8.0 GiB");

	/* Room for less than one block. */
	in = base_in();
	in.weight_bytes = 7 * GiB - 512 * 1024;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), SW_EEXHAUSTED);
	assert_string_equal(err, "memory plan: gpud.memory_fraction 0.5 of 16.0 GiB (8.0 GiB) "
				 "leaves 512.0 KiB per device after weights and fixed pools: not "
				 "one 1048576-byte KV block fits");

	/* A device with memory of its own needs its devmem entry. */
	in = base_in();
	in.n_devices = 2;
	in.devices = mixed;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "memory plan: inconsistent input (gpud.devices[1])");

	/* Inconsistent input. */
	in = base_in();
	in.kv_block_bytes = 0;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), -EINVAL);
	in = base_in();
	in.n_devices = 0;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), -EINVAL);
	in = base_in();
	in.memory_fraction = 1.5;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), -EINVAL);
}

/* --- devices with memory of their own (cuda), with fake device infos ---- */

static const struct sw_config_device cuda01[2] = { { SW_DEVICE_CUDA, 0, 0 },
						   { SW_DEVICE_CUDA, 1, 1 } };

/* An H200-like device holding a 3B-shaped model. */
static struct gpud_plan_devmem h200(void)
{
	return (struct gpud_plan_devmem){
		.name = "NVIDIA H200",
		.cc_major = 9,
		.total_bytes = 140 * GiB,
		.free_bytes = 139 * GiB,
		.weights = 3 * GiB + 512 * MiB,
		.masks = 64 * MiB,
		.scratch = 512 * MiB,
		.kv_block_bytes = 512 * 1024,
		.staging = 256 * MiB,
	};
}

static void test_device_check(void **state)
{
	const struct sw_config_device cpu = { SW_DEVICE_CPU, 0, 0 }, c3 = { SW_DEVICE_CUDA, 3, 0 };
	(void)state;

	assert_int_equal(gpud_plan_device_check(&cpu, 0, true, 0, err, sizeof(err)), 0);
	assert_int_equal(gpud_plan_device_check(&c3, 1, true, 4, err, sizeof(err)), 0);
	assert_int_equal(gpud_plan_device_check(&c3, 1, false, 4, err, sizeof(err)),
			 SW_EUNSUPPORTED);
	assert_string_equal(err, "gpud.devices[1]: cuda:3: this gpud was built without the CUDA "
				 "backend: rebuild with `meson setup -Dgpu=enabled` (needs nvcc "
				 "and the CUDA runtime), or use \"cpu\"");
	assert_int_equal(gpud_plan_device_check(&c3, 2, true, 0, err, sizeof(err)), -ENODEV);
	assert_string_equal(err, "gpud.devices[2]: cuda:3: no CUDA device (0 visible: no NVIDIA "
				 "driver or GPU, or CUDA_VISIBLE_DEVICES hides them)");
	assert_int_equal(gpud_plan_device_check(&c3, 0, true, 2, err, sizeof(err)), -ENODEV);
	assert_string_equal(err, "gpud.devices[0]: cuda:3: no CUDA device (2 visible: cuda:0 "
				 "to cuda:1)");
	assert_int_equal(gpud_plan_device_check(&c3, 0, true, 1, err, sizeof(err)), -ENODEV);
	assert_string_equal(err, "gpud.devices[0]: cuda:3: no CUDA device (1 visible: cuda:0)");
}

static void test_plan_cuda(void **state)
{
	struct gpud_plan_devmem dm[2] = { h200(), h200() };
	struct gpud_plan_in in = base_in();
	struct gpud_plan p;
	uint64_t fixed = 4 * GiB + 64 * MiB, budget;
	(void)state;

	/* One device: 0.5 of 140 GiB; its own pools; KV capped at 4 full
	 * contexts. The host holds its pools, the mask pool and staging, no
	 * weights (no cpu device reads them). */
	in.devices = cuda01;
	in.devmem = dm;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), 0);
	assert_int_equal(p.n_cpu, 0);
	assert_true(p.fixed == 448 * MiB + 64 * MiB + 256 * MiB);
	assert_true(p.used == p.fixed);
	assert_int_equal(p.kv_blocks, 0);
	assert_true(p.dev[0].own_memory);
	assert_true(p.dev[0].budget == 70 * GiB);
	assert_true(p.dev[0].fixed == fixed);
	assert_true(p.dev[0].kv_room == 70 * GiB - fixed);
	assert_int_equal(p.dev[0].kv_blocks, 256);
	assert_true(p.dev[0].kv_block_bytes == 512 * 1024);
	assert_true(p.dev[0].kv_bytes == 128 * MiB);
	assert_true(p.dev[0].used == fixed + 128 * MiB);

	/* Uncapped: the room decides, per device: the second has less free
	 * memory than its fraction, so free less the context reserve. */
	in.max_seqs = 1000000;
	in.n_devices = 2;
	dm[1].free_bytes = 20 * GiB;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), 0);
	assert_int_equal(p.dev[0].kv_blocks, (70 * GiB - fixed) / (512 * 1024));
	budget = 20 * GiB - GPUD_PLAN_DEVICE_RESERVE;
	assert_true(p.dev[1].budget == budget);
	assert_int_equal(p.dev[1].kv_blocks, (budget - fixed) / (512 * 1024));
	assert_true(p.dev[1].used <= p.dev[1].budget);
	assert_true(p.fixed == 448 * MiB + 2 * (64 * MiB + 256 * MiB));

	/* A configured count holds for every device. */
	in.kv_blocks = 1000;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), 0);
	assert_int_equal(p.dev[0].kv_blocks, 1000);
	assert_int_equal(p.dev[1].kv_blocks, 1000);
	assert_true(p.dev[1].kv_bytes == 500 * MiB);
}

static void test_plan_mixed(void **state)
{
	const struct sw_config_device devs[3] = {
		{ SW_DEVICE_CPU, 0, 0 }, { SW_DEVICE_CUDA, 1, 1 }, { SW_DEVICE_CUDA, 0, 2 },
	};
	struct gpud_plan_devmem dm[3] = { { .name = "" }, h200(), h200() };
	struct gpud_plan_in in = base_in();
	struct gpud_plan p;
	(void)state;

	/* The cpu device gets the host's room: weights, its scratch and mask
	 * pool, both cuda devices' host mask pools and staging, the host
	 * pools; the cuda devices their own budgets. */
	in.n_devices = 3;
	in.devices = devs;
	in.devmem = dm;
	in.max_seqs = 1000000;
	dm[2].kv_block_bytes = 256 * 1024;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), 0);
	assert_int_equal(p.n_cpu, 1);
	assert_true(p.fixed == 2 * GiB + 448 * MiB + 576 * MiB + 2 * (64 * MiB + 256 * MiB));
	assert_true(p.kv_room == 8 * GiB - p.fixed);
	assert_false(p.dev[0].own_memory);
	assert_int_equal(p.dev[0].kv_blocks, p.kv_blocks);
	assert_true(p.dev[0].kv_block_bytes == 1 * MiB);
	assert_true(p.dev[1].own_memory && p.dev[2].own_memory);
	assert_int_equal(p.dev[2].kv_blocks, 2 * p.dev[1].kv_blocks);
	assert_true(p.used == p.fixed + p.kv_bytes);
}

static void test_plan_cuda_errors(void **state)
{
	struct gpud_plan_devmem dm[2] = { h200(), h200() };
	struct gpud_plan_in in = base_in();
	struct gpud_plan p;
	(void)state;

	in.devices = cuda01;
	in.devmem = dm;
	in.n_devices = 2;

	/* The second device's own pools do not fit its budget. */
	dm[1].weights = 70 * GiB;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), SW_EEXHAUSTED);
	assert_string_equal(err, "memory plan: gpud.devices[1] cuda:1 (NVIDIA H200): weights "
				 "(70.0 GiB) + mask pool (64.0 MiB) + scratch (512.0 MiB) "
				 "need 70.6 GiB; "
				 "gpud.memory_fraction 0.5 of 140.0 GiB is 70.0 GiB");
	assert_int_equal(p.failed_dev, 1); /* the device gpud.min_devices may leave out */

	/* Less free than the fraction: both figures. */
	dm[1] = h200();
	dm[1].free_bytes = 2 * GiB;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), SW_EEXHAUSTED);
	assert_string_equal(err, "memory plan: gpud.devices[1] cuda:1 (NVIDIA H200): weights "
				 "(3.5 GiB) + mask pool (64.0 MiB) + scratch (512.0 MiB) "
				 "need 4.1 GiB; "
				 "gpud.memory_fraction 0.5 of 140.0 GiB is 70.0 GiB, but only "
				 "2.0 GiB is free (1.8 GiB after the context reserve)");

	/* A configured count too large for the device. */
	dm[1] = h200();
	in.kv_blocks = 1000000;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), SW_EEXHAUSTED);
	assert_string_equal(err, "gpud.kv_blocks=1000000 needs 488.3 GiB of KV on "
				 "gpud.devices[0] cuda:0 (NVIDIA H200); gpud.memory_fraction 0.5 "
				 "of 140.0 GiB is 70.0 GiB, which leaves 65.9 GiB after its "
				 "weights and fixed pools (4.1 GiB) (at most 135040 blocks of "
				 "524288 bytes)");

	/* Not one block. */
	in.kv_blocks = 0;
	dm[0].weights = 70 * GiB - 576 * MiB - 1000;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), SW_EEXHAUSTED);
	assert_string_equal(err, "memory plan: gpud.devices[0] cuda:0 (NVIDIA H200): "
				 "gpud.memory_fraction 0.5 of 140.0 GiB is 70.0 GiB, which leaves "
				 "1000 B after its weights and fixed pools: not one 524288-byte KV "
				 "block fits");
	assert_int_equal(p.failed_dev, 0);

	/* The host still holds its share: staging that does not fit RAM. */
	dm[0] = h200();
	dm[0].staging = 8 * GiB - 256 * MiB;
	assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), SW_EEXHAUSTED);
	assert_string_equal(err, "memory plan: host RAM: no cpu device + mask pools (64.0 MiB "
				 "per device x 2) + pinned staging (8.0 GiB) + host pools need "
				 "8.6 GiB; gpud.memory_fraction 0.5 of 16.0 GiB is 8.0 GiB");
	assert_int_equal(p.failed_dev, -1); /* host RAM: no device to leave out */

	/* Messages number a device by its configured place (.pos), which
	 * stays when gpud leaves out a device before it. */
	{
		struct sw_config_device moved[1] = { { SW_DEVICE_CUDA, 1, 4 } };
		struct gpud_plan_devmem one[1] = { h200() };

		in.devices = moved;
		in.devmem = one;
		in.n_devices = 1;
		one[0].weights = 70 * GiB;
		assert_int_equal(gpud_plan_compute(&in, &p, err, sizeof(err)), SW_EEXHAUSTED);
		assert_true(strncmp(err, "memory plan: gpud.devices[4] cuda:1 (NVIDIA H200)",
				    49) == 0);
		assert_int_equal(p.failed_dev, 0);
	}
}

struct seg_fixture {
	struct gpud_model *m;
	const struct gpud_tokenizer *tok;
	struct sw_arena arena;
	char fmt[4096], copy[4096];
	struct gpud_segtok_scratch sc;
};

static int seg_setup(void **state)
{
	struct seg_fixture *f = calloc(1, sizeof(*f));
	if (!f || gpud_model_load(&f->m, MODEL, err, sizeof(err)))
		return -1;
	f->tok = gpud_model_tokenizer(f->m);
	if (sw_arena_init(&f->arena, gpud_tokenizer_scratch_bytes(f->tok, 2048)))
		return -1;
	f->sc = (struct gpud_segtok_scratch){ .fmt = f->fmt, .fmt_cap = sizeof(f->fmt),
					      .copy = f->copy, .copy_cap = sizeof(f->copy),
					      .arena = &f->arena };
	*state = f;
	return 0;
}

static int seg_teardown(void **state)
{
	struct seg_fixture *f = *state;
	sw_arena_destroy(&f->arena);
	gpud_model_free(f->m);
	free(f);
	return 0;
}

static void test_segments_plain(void **state)
{
	struct seg_fixture *f = *state;
	struct proto_segment one[] = { { "Once upon a time", 16, PROTO_ROLE_NONE, 0 } };
	struct proto_segment two[] = { { "Once upon", 9, PROTO_ROLE_NONE, 0 },
				       { "", 0, PROTO_ROLE_NONE, 0 },
				       { "a time", 6, PROTO_ROLE_USER, 0 } };
	int32_t ids[64], want[64];
	uint32_t seg[3], n;
	size_t wn = 0;

	/* One segment: exactly the model's known tokenization, BOS first. */
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_NONE, false, one, 1, &f->sc, ids,
						64, seg, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 5);
	assert_int_equal(seg[0], 5);
	const int32_t known[] = { 1, 403, 407, 261, 378 };
	assert_memory_equal(ids, known, sizeof(known));

	/* Three segments: BOS once, an empty segment has 0 tokens, each
	 * segment is tokenized on its own (roles ignored without chat). */
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_NONE, false, two, 3, &f->sc, ids,
						64, seg, &n, err, sizeof(err)), 0);
	assert_int_equal(seg[1], 0);
	assert_int_equal(n, seg[0] + seg[2]);
	assert_int_equal(ids[0], 1);
	assert_int_equal(gpud_tokenizer_encode(f->tok, "a time", 6, 0, want, 64, &wn, &f->arena), 0);
	assert_int_equal(seg[2], wn);
	assert_memory_equal(ids + seg[0], want, wn * sizeof(int32_t));
	for (uint32_t i = 1; i < n; i++)
		assert_int_not_equal(ids[i], 1);

	/* Too long: SW_ETOOLONG with the number needed over all segments. */
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_NONE, false, two, 3, &f->sc, ids,
						3, seg, &n, err, sizeof(err)),
			 SW_ETOOLONG);
	assert_int_equal(n, seg[0] + seg[2]);
	assert_true(n > 3);
	char want_msg[128];
	snprintf(want_msg, sizeof(want_msg),
		 "prompt of %u tokens is longer than the 3 a request may have", n);
	assert_string_equal(err, want_msg);

	/* Chat without a template. */
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_NONE, true, two, 3, &f->sc, ids,
						64, seg, &n, err, sizeof(err)),
			 SW_EUNSUPPORTED);
	assert_non_null(strstr(err, "--chat-format"));
	assert_non_null(strstr(err, "gpud.chat_format"));
}

static void test_chat_segment_text(void **state)
{
	struct proto_segment s[] = { { "You are terse.  ", 16, PROTO_ROLE_SYSTEM, 0 },
				     { "Hi", 2, PROTO_ROLE_USER, 0 },
				     { "Hello!", 6, PROTO_ROLE_ASSISTANT, 0 },
				     { "Bye", 3, PROTO_ROLE_USER, 0 } };
	char out[512], copy[512];
	long n;
	(void)state;

	n = gpud_chat_segment(GPUD_CHAT_LLAMA3, s, 0, false, out, sizeof(out), copy, sizeof(copy));
	assert_string_equal(out, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
				 "You are terse.<|eot_id|>");
	assert_int_equal(n, (long)strlen(out));
	n = gpud_chat_segment(GPUD_CHAT_LLAMA3, s, 1, false, out, sizeof(out), copy, sizeof(copy));
	assert_string_equal(out, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
	n = gpud_chat_segment(GPUD_CHAT_LLAMA3, s, 3, true, out, sizeof(out), copy, sizeof(copy));
	assert_string_equal(out, "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
				 "<|start_header_id|>assistant<|end_header_id|>\n\n");
	assert_int_equal(n, (long)strlen(out));

	/* Llama 2 puts the system prompt into the next [INST]: its own segment
	 * is empty, the user segment carries it. */
	n = gpud_chat_segment(GPUD_CHAT_LLAMA2, s, 0, false, out, sizeof(out), copy, sizeof(copy));
	assert_int_equal(n, 0);
	assert_string_equal(out, "");
	n = gpud_chat_segment(GPUD_CHAT_LLAMA2, s, 1, false, out, sizeof(out), copy, sizeof(copy));
	assert_string_equal(out, "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST]");
	n = gpud_chat_segment(GPUD_CHAT_LLAMA2, s, 2, false, out, sizeof(out), copy, sizeof(copy));
	assert_string_equal(out, " Hello! </s>");
	n = gpud_chat_segment(GPUD_CHAT_LLAMA2, s, 3, true, out, sizeof(out), copy, sizeof(copy));
	assert_string_equal(out, "<s>[INST] Bye [/INST]");

	/* ChatML and Phi-3: one block per segment; Mistral v3: the system
	 * text opens the first [INST], as with Llama 2. */
	n = gpud_chat_segment(GPUD_CHAT_CHATML, s, 0, false, out, sizeof(out), copy, sizeof(copy));
	assert_string_equal(out, "<|im_start|>system\nYou are terse.  <|im_end|>\n");
	n = gpud_chat_segment(GPUD_CHAT_CHATML, s, 3, true, out, sizeof(out), copy, sizeof(copy));
	assert_string_equal(out, "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
	assert_int_equal(n, (long)strlen(out));
	n = gpud_chat_segment(GPUD_CHAT_PHI3, s, 2, false, out, sizeof(out), copy, sizeof(copy));
	assert_string_equal(out, "<|assistant|>\nHello!<|end|>\n");
	n = gpud_chat_segment(GPUD_CHAT_MISTRAL_V3, s, 0, false, out, sizeof(out), copy,
			      sizeof(copy));
	assert_int_equal(n, 0);
	n = gpud_chat_segment(GPUD_CHAT_MISTRAL_V3, s, 1, false, out, sizeof(out), copy,
			      sizeof(copy));
	assert_string_equal(out, "<s>[INST] You are terse.  \n\nHi[/INST]");
	n = gpud_chat_segment(GPUD_CHAT_MISTRAL_V3, s, 2, false, out, sizeof(out), copy,
			      sizeof(copy));
	assert_string_equal(out, " Hello!</s>");
	n = gpud_chat_segment(GPUD_CHAT_MISTRAL_V3, s, 3, true, out, sizeof(out), copy,
			      sizeof(copy));
	assert_string_equal(out, "[INST] Bye[/INST]");
	/* Mistral v7: the system prompt is a segment of its own again */
	n = gpud_chat_segment(GPUD_CHAT_MISTRAL_V7_TEKKEN, s, 0, false, out, sizeof(out), copy,
			      sizeof(copy));
	assert_string_equal(out, "<s>[SYSTEM_PROMPT]You are terse.  [/SYSTEM_PROMPT]");
	n = gpud_chat_segment(GPUD_CHAT_MISTRAL_V7_TEKKEN, s, 2, false, out, sizeof(out), copy,
			      sizeof(copy));
	assert_string_equal(out, "Hello!</s>");
	n = gpud_chat_segment(GPUD_CHAT_MISTRAL_V7_TEKKEN, s, 3, true, out, sizeof(out), copy,
			      sizeof(copy));
	assert_string_equal(out, "[INST]Bye[/INST]");
	assert_int_equal(n, (long)strlen(out));
	/* DeepSeek R1: the system text bare; an answer's reasoning dropped;
	 * the last segment opens the new answer's */
	struct proto_segment r1[] = { { "Be terse.", 9, PROTO_ROLE_SYSTEM, 0 },
				      { "Hi", 2, PROTO_ROLE_USER, 0 },
				      { "<think>\nhm</think>Hello!", 25, PROTO_ROLE_ASSISTANT, 0 },
				      { "Bye", 3, PROTO_ROLE_USER, 0 } };
	n = gpud_chat_segment(GPUD_CHAT_DEEPSEEK_R1, r1, 0, false, out, sizeof(out), copy,
			      sizeof(copy));
	assert_string_equal(out, "Be terse.");
	n = gpud_chat_segment(GPUD_CHAT_DEEPSEEK_R1, r1, 2, false, out, sizeof(out), copy,
			      sizeof(copy));
	assert_string_equal(out, "<｜Assistant｜>Hello!<｜end▁of▁sentence｜>");
	n = gpud_chat_segment(GPUD_CHAT_DEEPSEEK_R1, r1, 3, true, out, sizeof(out), copy,
			      sizeof(copy));
	assert_string_equal(out, "<｜User｜>Bye<｜Assistant｜><think>\n");
	assert_int_equal(n, (long)strlen(out));

	/* Errors: no template, no role, buffers too small. */
	assert_int_equal(gpud_chat_segment(GPUD_CHAT_NONE, s, 0, false, out, sizeof(out), copy,
					   sizeof(copy)), SW_EUNSUPPORTED);
	struct proto_segment bad[] = { { "x", 1, PROTO_ROLE_NONE, 0 } };
	assert_int_equal(gpud_chat_segment(GPUD_CHAT_LLAMA3, bad, 0, false, out, sizeof(out), copy,
					   sizeof(copy)), -EINVAL);
	assert_int_equal(gpud_chat_segment(GPUD_CHAT_LLAMA3, s, 1, false, out, 20, copy,
					   sizeof(copy)), SW_ETOOLONG);
	assert_int_equal(gpud_chat_segment(GPUD_CHAT_LLAMA3, s, 1, false, out, sizeof(out), copy,
					   10), SW_ETOOLONG);
}

/* Segments of token ids are taken as they are: the text path's ids come
 * back unchanged, no BOS is added, text after them gets none, and an id
 * outside the vocabulary is refused naming segment and position. */
static void test_segments_ids(void **state)
{
	struct seg_fixture *f = *state;
	const int32_t known[] = { 1, 403, 407, 261, 378 }; /* "Once upon a time" */
	uint8_t wire[5 * 4];
	int32_t ids[64], want[64];
	uint32_t seg[2], n;
	size_t wn = 0;

	for (int k = 0; k < 5; k++)
		proto_put32(wire + 4 * k, (uint32_t)known[k]);
	struct proto_segment s[] = { { (const char *)wire + 4, 16, 0, PROTO_SEG_IDS },
				     { " there", 6, 0, 0 } };
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_NONE, false, s, 1, &f->sc, ids,
						64, seg, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 4); /* no BOS before ids */
	assert_memory_equal(ids, known + 1, 4 * sizeof(int32_t));
	s[0] = (struct proto_segment){ (const char *)wire, 20, 0, PROTO_SEG_IDS };
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_NONE, false, s, 2, &f->sc, ids,
						64, seg, &n, err, sizeof(err)), 0);
	assert_int_equal(seg[0], 5);
	assert_memory_equal(ids, known, sizeof(known));
	assert_int_equal(gpud_tokenizer_encode(f->tok, " there", 6, 0, want, 64, &wn, &f->arena), 0);
	assert_int_equal(seg[1], wn);
	assert_memory_equal(ids + 5, want, wn * sizeof(int32_t));

	/* too long counts the ids too */
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_NONE, false, s, 2, &f->sc, ids,
						3, seg, &n, err, sizeof(err)), SW_ETOOLONG);
	assert_int_equal(n, 5 + wn);
	/* the vocabulary's bounds, both sides */
	int32_t nv = gpud_tokenizer_n_vocab(f->tok);
	proto_put32(wire + 8, (uint32_t)nv);
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_NONE, false, s, 2, &f->sc, ids,
						64, seg, &n, err, sizeof(err)), -EINVAL);
	char want_msg[128];
	snprintf(want_msg, sizeof(want_msg), "segment 0: token 2: id %d is not in the "
		 "vocabulary of %d", nv, nv);
	assert_string_equal(err, want_msg);
	proto_put32(wire + 8, (uint32_t)-1);
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_NONE, false, s, 2, &f->sc, ids,
						64, seg, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "id -1 is not"));
	proto_put32(wire + 8, (uint32_t)(nv - 1));
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_NONE, false, s, 2, &f->sc, ids,
						64, seg, &n, err, sizeof(err)), 0);
	assert_int_equal(ids[2], nv - 1);
	/* whole ids only */
	s[0].len = 18;
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_NONE, false, s, 2, &f->sc, ids,
						64, seg, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "not a multiple of 4"));
}

static void test_segments_chat(void **state)
{
	struct seg_fixture *f = *state;
	struct proto_segment s[] = { { "Be kind.", 8, PROTO_ROLE_SYSTEM, 0 },
				     { "Tell a story.", 13, PROTO_ROLE_USER, 0 } };
	struct proto_segment noroles[] = { { "a", 1, PROTO_ROLE_USER, 0 },
					   { "b", 1, PROTO_ROLE_NONE, 0 } };
	int32_t ids[512], want[512];
	uint32_t seg[2], n;
	size_t wn = 0;
	char txt[512], copy[512];
	long l;

	/* Each segment is its formatted text, special tokens parsed, no BOS
	 * added by the tokenizer (the template writes its own). */
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_LLAMA3, true, s, 2, &f->sc, ids,
						512, seg, &n, err, sizeof(err)), 0);
	assert_int_equal(n, seg[0] + seg[1]);
	assert_true(seg[0] > 0 && seg[1] > 0);
	l = gpud_chat_segment(GPUD_CHAT_LLAMA3, s, 1, true, txt, sizeof(txt), copy, sizeof(copy));
	assert_true(l > 0);
	assert_int_equal(gpud_tokenizer_encode(f->tok, txt, (size_t)l, GPUD_TOK_PARSE_SPECIAL, want,
					       512, &wn, &f->arena), 0);
	assert_int_equal(seg[1], wn);
	assert_memory_equal(ids + seg[0], want, wn * sizeof(int32_t));
	assert_int_not_equal(ids[0], gpud_tokenizer_bos(f->tok));

	/* A format without BOS of its own (ChatML): the vocab's BOS, as it
	 * asks, before the first segment only. */
	assert_true(gpud_tokenizer_add_bos(f->tok));
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_CHATML, true, s, 2, &f->sc, ids,
						512, seg, &n, err, sizeof(err)), 0);
	assert_int_equal(ids[0], gpud_tokenizer_bos(f->tok));
	for (uint32_t i = 1; i < n; i++)
		assert_int_not_equal(ids[i], gpud_tokenizer_bos(f->tok));

	/* A segment without a role. */
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_LLAMA3, true, noroles, 2, &f->sc,
						ids, 512, seg, &n, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "segment 1: chat formatting needs a role (system, user or "
				 "assistant)");

	/* A segment too long for the formatting scratch. */
	struct gpud_segtok_scratch small = f->sc;
	small.fmt_cap = 40;
	assert_int_equal(gpud_segments_tokenize(f->tok, GPUD_CHAT_LLAMA3, true, s, 2, &small, ids,
						512, seg, &n, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "segment 0: cannot format it as a chat message"));
}

/* Fake numbers in, the snapshot's entries (and its JSON) out. */
static void test_snapshot_device(void **state)
{
	static struct gpud_stats_snapshot s;
	static char json[1 << 16];
	struct gpud_dev_numbers n;
	size_t len = 0;
	(void)state;

	memset(&s, 0, sizeof(s));
	memset(&n, 0, sizeof(n));
	n.name = "cpu1";
	n.kv_block_bytes = 20480;
	n.engine.kv = (struct gpud_kv_stats){ .n_blocks = 100, .used = 30, .free = 70, .high = 55 };
	n.kv_live = 10;
	n.kv_cached = 20;
	n.engine.scratch_bytes = 4096;
	n.engine.scratch_high = 4000;
	n.mask = (struct gpud_maskcache_stats){ .hits = 7, .misses = 3, .evictions = 1,
						 .bytes = 900, .max_bytes = 8192, .entries = 2,
						 .max_entries = 10, .pinned = 1, .slot_bytes = 512,
						 .pool_used = 2, .pool_free = 9, .pool_capacity = 11 };
	n.mask_high = 5;
	n.sched = (struct gpud_sched_device_stats){ .queue = 4, .running = 3, .steps = 11,
						    .tokens = 12, .generated = 13,
						    .preemptions = 2, .prefix_hits = 21,
						    .prefix_misses = 22, .prefix_evictions = 23,
						    .prefix_hit_tokens = 336, .prefix_blocks = 25,
						    .prefix_unreferenced = 20, .prefix_bytes = 409600,
						    .prefix_max_bytes = 1 << 20, .chunk_hits = 31,
						    .chunk_misses = 32, .chunk_evictions = 33,
						    .chunk_hit_tokens = 340, .chunk_entries = 3,
						    .chunk_blocks = 6, .chunk_bytes = 6 * 20480,
						    .chunk_max_bytes = 10 * 20480 };
	n.have_watch = true;
	n.kv_watch = (struct gpud_memwatch_status){ .trough = 10, .trough_k_ago = 4, .rising = true,
						    .warning = "cpu1.kv trough rose" };
	n.mask_watch = (struct gpud_memwatch_status){ .trough = 1, .trough_k_ago = 1, .warning = "" };
	gpud_snapshot_add_device(&s, &n);

	assert_int_equal(s.n_devices, 1);
	assert_string_equal(s.devices[0].name, "cpu1");
	assert_int_equal(s.devices[0].queue, 4);
	assert_int_equal(s.devices[0].preemptions, 2);
	assert_int_equal(s.n_pools, 3);
	assert_string_equal(s.pools[0].name, "cpu1.kv");
	assert_string_equal(s.pools[0].unit, "blocks");
	assert_int_equal(s.pools[0].unit_bytes, 20480);
	assert_int_equal(s.pools[0].capacity, 100);
	assert_int_equal(s.pools[0].used + s.pools[0].free, s.pools[0].capacity);
	assert_int_equal(s.pools[0].high, 55);
	assert_int_equal(s.pools[0].trough, 10);
	assert_int_equal(s.pools[0].trough_k_ago, 4);
	assert_true(s.pools[0].rising);
	assert_string_equal(s.pools[0].warning, "cpu1.kv trough rose");
	/* used = live + what the prefix and chunk caches keep, against their
	 * bound in blocks (1 MiB + 200 KiB of 20 KiB blocks) */
	assert_int_equal(s.pools[0].live, 10);
	assert_int_equal(s.pools[0].cached, 20);
	assert_string_equal(s.pools[0].cache, "cpu1.prefix");
	assert_int_equal(s.pools[0].cache_bound, 61);
	assert_string_equal(s.pools[1].name, "cpu1.scratch");
	assert_int_equal(s.pools[1].free, 96);
	assert_int_equal(s.pools[1].trough, 4000);
	assert_int_equal(s.pools[1].live, 4000);
	assert_int_equal(s.pools[1].cached, 0);
	assert_string_equal(s.pools[1].cache, "");
	assert_false(s.pools[1].rising);
	assert_string_equal(s.pools[2].name, "cpu1.mask");
	assert_int_equal(s.pools[2].unit_bytes, 512);
	assert_int_equal(s.pools[2].capacity, 11);
	assert_int_equal(s.pools[2].high, 5);
	/* one mask pinned by a request, one kept by the cache of 10 */
	assert_int_equal(s.pools[2].live, 1);
	assert_int_equal(s.pools[2].cached, 1);
	assert_string_equal(s.pools[2].cache, "cpu1.mask");
	assert_int_equal(s.pools[2].cache_bound, 10);
	assert_int_equal(s.pools[2].trough, 1);
	assert_int_equal(s.n_caches, 3);
	assert_string_equal(s.caches[2].name, "cpu1.chunk");
	assert_int_equal(s.caches[2].hits, 31);
	assert_int_equal(s.caches[2].misses, 32);
	assert_int_equal(s.caches[2].evictions, 33);
	assert_int_equal(s.caches[2].hit_tokens, 340);
	assert_int_equal(s.caches[2].entries, 3);
	assert_int_equal(s.caches[2].bytes, 6 * 20480);
	assert_int_equal(s.caches[2].max_entries, 10);
	assert_int_equal(s.devices[0].prefix_hit_tokens, 336);
	assert_int_equal(s.devices[0].chunk_hits, 31);
	assert_int_equal(s.devices[0].chunk_misses, 32);
	assert_int_equal(s.devices[0].chunk_hit_tokens, 340);
	assert_string_equal(s.caches[0].name, "cpu1.mask");
	assert_int_equal(s.caches[0].hits, 7);
	assert_int_equal(s.caches[0].max_bytes, 8192);
	assert_string_equal(s.caches[1].name, "cpu1.prefix");
	assert_int_equal(s.caches[1].hits, 21);
	assert_int_equal(s.caches[1].pinned, 5);
	assert_int_equal(s.caches[1].hit_tokens, 336);
	assert_int_equal(s.caches[1].max_entries, 100);

	/* It renders. */
	s.version = "test";
	assert_int_equal(gpud_stats_json(&s, false, json, sizeof(json), &len), 0);
	json[len] = '\0';
	assert_non_null(strstr(json, "\"name\":\"cpu1.prefix\""));
	assert_non_null(strstr(json, "cpu1.kv trough rose"));

	/* Full arrays: entries that do not fit are left out, counts bounded. */
	for (int i = 0; i < 40; i++)
		gpud_snapshot_add_device(&s, &n);
	assert_int_equal(s.n_devices, GPUD_STATS_MAX_DEVICES);
	assert_true(s.n_pools <= GPUD_STATS_MAX_POOLS);
	assert_int_equal(s.n_caches, GPUD_STATS_MAX_CACHES);
}

/* gpud serve --check: "configuration OK" and one line per pool, or the
 * reason and 1; nothing is reserved either way. */
/* CUDA devices this process sees (0 in a build without the backend). */
static int n_cuda(void)
{
#if SW_HAVE_CUDA
	return gpud_cuda_device_count();
#else
	return 0;
#endif
}

/* `gpud serve --check` of cfg: its exit status, its output in *out (free it). */
static int check(const struct sw_config *cfg, char **out)
{
	size_t len = 0;
	FILE *f;
	int rc;

	*out = NULL;
	f = open_memstream(out, &len);
	assert_non_null(f);
	rc = gpud_serve(cfg, true, f);
	assert_int_equal(fclose(f), 0);
	return rc;
}

static void test_check_mode(void **state)
{
	struct sw_config cfg;
	int rc;
	char *out = NULL;
	(void)state;

	sw_config_defaults(&cfg);
	snprintf(cfg.gpud.model, sizeof(cfg.gpud.model), "%s", MODEL);
	cfg.gpud.devices[1] = cfg.gpud.devices[0];
	cfg.gpud.n_devices = 2;
	cfg.gpud.max_seqs = 8;
	assert_int_equal(check(&cfg, &out), 0);
	assert_true(strncmp(out, "configuration OK\n", 17) == 0);
	assert_non_null(strstr(out, "5 layers, dim 64"));
	assert_non_null(strstr(out, "  cpu0.kv: 1024 blocks x 20480 bytes = 20.0 MiB"));
	assert_non_null(strstr(out, "  cpu1.kv: 1024 blocks"));
	assert_non_null(strstr(out, "  cpu1.mask: "));
	assert_non_null(strstr(out, "  server: "));
	assert_non_null(strstr(out, "\nchat format: none (chat requests are refused; choose one "
				    "with --chat-format or gpud.chat_format)\n"));
	free(out);

	/* gpud.kv_type "f16": blocks of half the bytes, named in the plan */
	cfg.gpud.kv_type = SW_KV_F16;
	assert_int_equal(check(&cfg, &out), 0);
	assert_non_null(strstr(out, "  cpu0.kv: 1024 blocks x 10240 bytes = 10.0 MiB (16 f16 "
				    "tokens/block;"));
	free(out);
	cfg.gpud.kv_type = SW_KV_F32;

	/* gpud.chat_format: a choice is used, an unknown name stops the start. */
	snprintf(cfg.gpud.chat_format, sizeof(cfg.gpud.chat_format), "chatml");
	assert_int_equal(check(&cfg, &out), 0);
	assert_non_null(strstr(out, "\nchat format: chatml\n"));
	free(out);
	snprintf(cfg.gpud.chat_format, sizeof(cfg.gpud.chat_format), "vicuna");
	assert_int_equal(check(&cfg, &out), 1);
	assert_string_equal(out, "gpud.chat_format: unknown format \"vicuna\" (" GPUD_CHAT_NAMES
			    ")\n");
	free(out);
	snprintf(cfg.gpud.chat_format, sizeof(cfg.gpud.chat_format), "auto");

	/* Does not fit (on any machine with less than 300 GiB of RAM): the
	 * numbers, exit status 1. */
	if ((double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) < 300.0 * GiB) {
		cfg.gpud.kv_blocks = 16777216;
		assert_int_equal(check(&cfg, &out), 1);
		assert_true(strncmp(out, "gpud.kv_blocks=16777216 needs 320.0 GiB of KV per device",
				    56) == 0);
		free(out);
	}

	/* A cuda device: refused in a build without the CUDA backend, and
	 * on a machine without a device; planned per device where one is. */
	cfg.gpud.kv_blocks = 0;
	cfg.gpud.devices[1] = (struct sw_config_device){ SW_DEVICE_CUDA, 0, 1 };
	rc = check(&cfg, &out);
	if (!gpud_backend_for(SW_DEVICE_CUDA)) {
		assert_int_equal(rc, 1);
		assert_string_equal(out, "gpud.devices[1]: cuda:0: this gpud was built without "
					 "the CUDA backend: rebuild with `meson setup "
					 "-Dgpu=enabled` (needs nvcc and the CUDA runtime), or use \"cpu\"\n");
	} else if (n_cuda() == 0) {
		assert_int_equal(rc, 1);
		assert_string_equal(out, "gpud.devices[1]: cuda:0: no CUDA device (0 visible: no "
					 "NVIDIA driver or GPU, or CUDA_VISIBLE_DEVICES hides "
					 "them)\n");
	} else {
		assert_int_equal(rc, 0);
		assert_non_null(strstr(out, "  cpu0.kv: 1024 blocks"));
		assert_non_null(strstr(out, "  cuda1: cuda:0, "));
		assert_non_null(strstr(out, "  cuda1.kv: "));
		assert_non_null(strstr(out, "  cuda1.scratch: "));
		assert_null(strstr(out, "workspace")); /* no cuBLAS, no workspace */
	}
	free(out);

	/* gpud.min_devices: a device that is not there (cuda:255) is left
	 * out while enough remain, and the others keep their names (cpu2);
	 * with too few left the start is refused with both reasons. A build
	 * without the CUDA backend refuses it either way: no device can fix
	 * that. */
	cfg.gpud.devices[1] = (struct sw_config_device){ SW_DEVICE_CUDA, 255, 1 };
	cfg.gpud.devices[2] = (struct sw_config_device){ SW_DEVICE_CPU, 0, 2 };
	cfg.gpud.n_devices = 3;
	cfg.gpud.min_devices = 2;
	rc = check(&cfg, &out);
	if (!gpud_backend_for(SW_DEVICE_CUDA)) {
		assert_int_equal(rc, 1);
		assert_non_null(strstr(out, "gpud.devices[1]: cuda:255: this gpud was built without"));
		assert_null(strstr(out, "left out"));
	} else {
		assert_int_equal(rc, 0);
		assert_ptr_equal(strstr(out, "left out: cuda1 (cuda:255): gpud.devices[1]: "
					    "cuda:255: no CUDA device ("), out);
		assert_non_null(strstr(out, "configuration OK\n"));
		assert_non_null(strstr(out, "devices: 2 of the 3 configured start (gpud.min_devices "
					    "2; left out above)\n"));
		assert_non_null(strstr(out, "  cpu0.kv: "));
		assert_non_null(strstr(out, "  cpu2.kv: "));
		assert_null(strstr(out, "cuda1."));
	}
	free(out);
	cfg.gpud.min_devices = 3;
	rc = check(&cfg, &out);
	assert_int_equal(rc, 1);
	if (gpud_backend_for(SW_DEVICE_CUDA)) {
		assert_ptr_equal(strstr(out, "gpud.devices[1]: cuda:255: no CUDA device ("), out);
		assert_non_null(strstr(out, ")\ngpud.min_devices 3: 1 of the 3 configured devices "
					    "cannot start\n"));
	}
	free(out);
	cfg.gpud.n_devices = 2;
	cfg.gpud.min_devices = 0;

	/* A missing model. */
	snprintf(cfg.gpud.model, sizeof(cfg.gpud.model), "/nonexistent/m.gguf");
	assert_int_equal(check(&cfg, &out), 1);
	assert_true(strncmp(out, "gpud.model: /nonexistent/m.gguf", 31) == 0);
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_fmt_bytes),
		cmocka_unit_test(test_plan_derive),
		cmocka_unit_test(test_plan_configured),
		cmocka_unit_test(test_plan_errors),
		cmocka_unit_test(test_device_check),
		cmocka_unit_test(test_plan_cuda),
		cmocka_unit_test(test_plan_mixed),
		cmocka_unit_test(test_plan_cuda_errors),
		cmocka_unit_test(test_snapshot_device),
		cmocka_unit_test(test_check_mode),
		cmocka_unit_test(test_chat_segment_text),
		cmocka_unit_test_setup_teardown(test_segments_plain, seg_setup, seg_teardown),
		cmocka_unit_test_setup_teardown(test_segments_ids, seg_setup, seg_teardown),
		cmocka_unit_test_setup_teardown(test_segments_chat, seg_setup, seg_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
