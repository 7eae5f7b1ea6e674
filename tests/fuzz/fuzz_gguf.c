/* fuzz_gguf.c - libFuzzer target for the GGUF reader (and writer).
 *
 * Bytes go to gpud_gguf_open_mem(). A rejected input must come with a
 * message naming the input; an accepted one is walked completely (every
 * key through every getter, every array element, every tensor's first and
 * last data byte) and its invariants are checked; then its metadata and
 * tensors are fed to the writer, which must accept everything the reader
 * accepted (the two validate with the same rules). A broken invariant
 * traps, which libFuzzer reports as a crash.
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/err.h"
#include "gpud/gguf.h"
#include "gpud/gguf_write.h"
#include "tests/fuzz/fuzz.h"

static volatile uint8_t sink;

static void touch(const void *p, uint64_t n)
{
	if (n) {
		sink ^= ((const uint8_t *)p)[0];
		sink ^= ((const uint8_t *)p)[n - 1];
	}
}

static bool code_ok(int rc)
{
	return rc == 0 || rc == SW_ENOTFOUND || rc == SW_ETYPE;
}

static void walk_key(const struct gpud_gguf *g, const char *key)
{
	enum gpud_gguf_vtype vt, et;
	uint32_t u32;
	int32_t i32;
	uint64_t u64, n;
	float f;
	bool b;
	struct gpud_gguf_str s;

	CHECK(gpud_gguf_has(g, key));
	CHECK(gpud_gguf_key_type(g, key, &vt) == 0);
	CHECK(code_ok(gpud_gguf_get_u32(g, key, &u32)));
	CHECK(code_ok(gpud_gguf_get_i32(g, key, &i32)));
	CHECK(code_ok(gpud_gguf_get_u64(g, key, &u64)));
	CHECK(code_ok(gpud_gguf_get_f32(g, key, &f)));
	CHECK(code_ok(gpud_gguf_get_bool(g, key, &b)));
	int rc = gpud_gguf_get_str(g, key, &s);
	CHECK((rc == 0) == (vt == GPUD_GGUF_STRING));
	if (rc == 0)
		touch(s.s, s.len);
	rc = gpud_gguf_get_arr(g, key, &et, &n);
	CHECK((rc == 0) == (vt == GPUD_GGUF_ARRAY));
	if (rc)
		return;
	for (uint64_t i = 0; i < n; i++) {
		if (et == GPUD_GGUF_STRING) {
			CHECK(gpud_gguf_arr_str(g, key, i, &s) == 0);
			touch(s.s, s.len);
		} else {
			CHECK(code_ok(gpud_gguf_arr_i32(g, key, i, &i32)));
			CHECK(code_ok(gpud_gguf_arr_f32(g, key, i, &f)));
		}
	}
	CHECK(gpud_gguf_arr_str(g, key, n, &s) == -ERANGE || et != GPUD_GGUF_STRING);
	const void *raw;
	uint64_t rn;
	rc = gpud_gguf_arr_data(g, key, &et, &raw, &rn);
	CHECK(rc == 0 ? rn == n : et == GPUD_GGUF_STRING);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gpud_gguf *g = NULL;
	char err[SW_ERR_MAX] = "";
	int rc = gpud_gguf_open_mem(&g, data, size, "fuzz", err, sizeof(err));
	if (rc) {
		CHECK(rc < 0 && g == NULL);
		CHECK(strncmp(err, "fuzz: ", 6) == 0);
		return 0;
	}
	CHECK(g != NULL);
	uint32_t align = gpud_gguf_alignment(g);
	CHECK(align && !(align & (align - 1)));
	uint64_t data_off = gpud_gguf_data_offset(g);
	CHECK(data_off <= size);

	uint64_t n_kv = gpud_gguf_n_kv(g);
	for (uint64_t i = 0; i < n_kv; i++) {
		const char *key = gpud_gguf_key(g, i);
		CHECK(key && *key);
		walk_key(g, key);
	}
	CHECK(gpud_gguf_key(g, n_kv) == NULL);

	struct gpud_gguf_writer *w = NULL;
	bool write = gpud_gguf_writer_new(&w) == 0 && gpud_gguf_w_copy_kv(w, g, NULL, NULL) == 0;
	uint64_t n_t = gpud_gguf_n_tensors(g);
	for (uint64_t i = 0; i < n_t; i++) {
		const struct gpud_gguf_tensor *t = gpud_gguf_tensor(g, i);
		CHECK(t && t->name && *t->name);
		CHECK(gpud_gguf_find_tensor(g, t->name) == t);
		CHECK(t->n_dims >= 1 && t->n_dims <= GPUD_GGUF_MAX_DIMS);
		CHECK(gpud_type_supported(t->type));
		CHECK(t->offset % align == 0);
		CHECK(t->nbytes > 0 && t->nbytes <= size - data_off - t->offset);
		CHECK((const uint8_t *)t->data == data + data_off + t->offset);
		uint64_t rows = 1;
		for (int d = 0; d < GPUD_GGUF_MAX_DIMS; d++) {
			CHECK(t->ne[d] >= 1);
			if (d >= 1)
				rows *= t->ne[d];
		}
		CHECK(gpud_type_row_bytes(t->type, t->ne[0]) * rows == t->nbytes);
		touch(t->data, t->nbytes);
		if (write)
			CHECK(gpud_gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne,
						 t->data, t->nbytes) == 0);
	}
	CHECK(gpud_gguf_tensor(g, n_t) == NULL);
	if (write) {
		uint64_t wsize;
		CHECK(gpud_gguf_w_size(w, &wsize) == 0);
		CHECK(wsize >= data_off || n_t == 0);
	}
	gpud_gguf_writer_free(w);
	gpud_gguf_close(g);
	return 0;
}
