/* gguf.c - GGUF v2/v3 reader over mmap.
 *
 * File layout (GGUF spec, little-endian):
 *   u32 magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x { str key, u32 vtype, value },
 *   n_tensors x { str name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset },
 *   padding to general.alignment, then the data section.
 * A str is a u64 length followed by that many bytes (no NUL). An array value
 * is u32 elem_type, u64 n, then n elements. Version 2 has the same layout;
 * version 1 (u32 counts) is rejected.
 *
 * The reader walks the header once with a bounds-checked cursor, indexes
 * keys and tensor names in sorted arrays (binary search) and string arrays
 * in pointer tables (O(1) element access), then validates the tensor layout
 * as a whole. Nothing in the data section is read. Tensor types and their
 * block sizes are gpud/quant.h's; the writer is gguf_write.c.
 */
#include "gpud/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "gpud/gguf_impl.h"
#include "gpud/quant.h"

/* Real files hold tens of keys and at most tens of thousands of tensors;
 * the caps bound what a hostile header can make us allocate. */
#define GGUF_MAX_KV (1u << 20)
#define GGUF_MAX_TENSORS (1u << 20)
/* Smallest possible kv: key length, one key byte, vtype, one value byte. */
#define GGUF_MIN_KV_BYTES (8 + 1 + 4 + 1)
/* Smallest possible tensor info: name length, one byte, n_dims, one dim,
 * type, offset. */
#define GGUF_MIN_TENSOR_BYTES (8 + 1 + 4 + 8 + 4 + 8)

/* --- metadata value types ------------------------------------------------- */

uint32_t gpud__gguf_vtype_size(uint32_t t)
{
	switch (t) {
	case GPUD_GGUF_U8:
	case GPUD_GGUF_I8:
	case GPUD_GGUF_BOOL:
		return 1;
	case GPUD_GGUF_U16:
	case GPUD_GGUF_I16:
		return 2;
	case GPUD_GGUF_U32:
	case GPUD_GGUF_I32:
	case GPUD_GGUF_F32:
		return 4;
	case GPUD_GGUF_U64:
	case GPUD_GGUF_I64:
	case GPUD_GGUF_F64:
		return 8;
	default:
		return 0;
	}
}

const char *gpud_gguf_vtype_name(enum gpud_gguf_vtype t)
{
	static const char *const names[] = {
		"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
		"string", "array", "u64", "i64", "f64",
	};
	if ((unsigned)t < sizeof(names) / sizeof(names[0]))
		return names[t];
	return "?";
}

/* --- reader --------------------------------------------------------------- */

struct gguf_kv {
	char *key;                 /* NUL-terminated copy */
	enum gpud_gguf_vtype type;
	enum gpud_gguf_vtype elem; /* arrays: element type */
	uint64_t n;                /* arrays: element count; strings: length */
	const uint8_t *val;        /* scalar bytes, string bytes or first element */
	const uint8_t **strs;      /* string arrays: n pointers to element bytes,
				    * each preceded by its u64 length */
	uint64_t off;              /* file offset of the key */
	uint64_t val_off;          /* file offset of the value (after vtype) */
	uint64_t val_len;          /* serialized value bytes */
};

struct gpud_gguf {
	const uint8_t *base;
	size_t size;
	bool mapped;               /* base is our mmap */
	uint32_t version;
	uint32_t alignment;
	uint64_t n_kv;
	uint64_t n_tensors;
	uint64_t data_off;         /* start of the data section */
	struct gguf_kv *kv;        /* (n_kv) in file order */
	struct gguf_kv **kv_sorted;        /* (n_kv) by key */
	struct gpud_gguf_tensor *t;        /* (n_tensors) in file order */
	struct gpud_gguf_tensor **t_sorted; /* (n_tensors) by name */
	uint64_t *t_info_off;      /* (n_tensors) file offset of each info */
};

/* Bounds-checked cursor over the header. Every read checks the remaining
 * bytes first; on failure it sets the message and returns SW_EFORMAT. */
struct cur {
	const uint8_t *p;
	size_t size;
	size_t pos;
	const char *name;
	char *err;
	size_t errlen;
	char ctx[96];   /* "kv 3 'key': " or "tensor 2 'name': " while inside one */
};

static size_t cur_left(const struct cur *c)
{
	return c->size - c->pos;
}

static int cur_need(struct cur *c, uint64_t n, const char *what)
{
	if (n > cur_left(c))
		return sw_seterr(c->err, c->errlen, SW_EFORMAT,
				 "%s: %s%s needs %" PRIu64 " bytes but only %zu remain (file is %zu bytes) at offset %zu",
				 c->name, c->ctx, what, n, cur_left(c), c->size, c->pos);
	return 0;
}

static uint32_t rd_u32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static uint64_t rd_u64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static int cur_u32(struct cur *c, uint32_t *v, const char *what)
{
	int rc = cur_need(c, 4, what);
	if (rc)
		return rc;
	*v = rd_u32(c->p + c->pos);
	c->pos += 4;
	return 0;
}

static int cur_u64(struct cur *c, uint64_t *v, const char *what)
{
	int rc = cur_need(c, 8, what);
	if (rc)
		return rc;
	*v = rd_u64(c->p + c->pos);
	c->pos += 8;
	return 0;
}

/* A GGUF string: *s points into the buffer, *len is validated. */
static int cur_str(struct cur *c, const uint8_t **s, uint64_t *len, const char *what)
{
	size_t at = c->pos;
	int rc = cur_need(c, 8, what);
	if (rc)
		return rc;
	uint64_t n = rd_u64(c->p + c->pos);
	c->pos += 8;
	if (n > cur_left(c)) {
		c->pos = at;
		return sw_seterr(c->err, c->errlen, SW_EFORMAT,
				 "%s: %s%s length %" PRIu64 " runs past end of file (%zu bytes remain) at offset %zu",
				 c->name, c->ctx, what, n, cur_left(c) - 8, at);
	}
	*s = c->p + c->pos;
	*len = n;
	c->pos += n;
	return 0;
}

static int cmp_kv(const void *a, const void *b)
{
	const struct gguf_kv *x = *(const struct gguf_kv *const *)a;
	const struct gguf_kv *y = *(const struct gguf_kv *const *)b;
	int r = strcmp(x->key, y->key);
	if (r)
		return r;
	return (x->off > y->off) - (x->off < y->off);
}

static int cmp_tensor_name(const void *a, const void *b)
{
	const struct gpud_gguf_tensor *x = *(const struct gpud_gguf_tensor *const *)a;
	const struct gpud_gguf_tensor *y = *(const struct gpud_gguf_tensor *const *)b;
	int r = strcmp(x->name, y->name);
	if (r)
		return r;
	return (x < y) ? -1 : (x > y);
}

static int cmp_tensor_off(const void *a, const void *b)
{
	const struct gpud_gguf_tensor *x = *(const struct gpud_gguf_tensor *const *)a;
	const struct gpud_gguf_tensor *y = *(const struct gpud_gguf_tensor *const *)b;
	if (x->offset != y->offset)
		return (x->offset > y->offset) - (x->offset < y->offset);
	return (x < y) ? -1 : (x > y);
}

static bool has_nul(const uint8_t *s, uint64_t len)
{
	return memchr(s, 0, len) != NULL;
}

/* Parses one value of type t at the cursor into kv (top level) or just
 * skips it (array elements are parsed in parse_array). */
static int parse_array(struct cur *c, struct gguf_kv *kv, uint64_t idx)
{
	size_t at = c->pos;
	uint32_t et;
	uint64_t n;
	int rc;

	if ((rc = cur_u32(c, &et, "array element type")) ||
	    (rc = cur_u64(c, &n, "array length")))
		return rc;
	if (et == GPUD_GGUF_ARRAY)
		return sw_seterr(c->err, c->errlen, SW_EUNSUPPORTED,
				 "%s: kv %" PRIu64 " '%s': nested arrays are not supported at offset %zu",
				 c->name, idx, kv->key, at);
	if (et != GPUD_GGUF_STRING && gpud__gguf_vtype_size(et) == 0)
		return sw_seterr(c->err, c->errlen, SW_EFORMAT,
				 "%s: kv %" PRIu64 " '%s': unknown array element type %" PRIu32 " at offset %zu",
				 c->name, idx, kv->key, et, at);
	kv->elem = et;
	kv->n = n;
	if (et != GPUD_GGUF_STRING) {
		uint32_t es = gpud__gguf_vtype_size(et);
		if (n > cur_left(c) / es)
			return sw_seterr(c->err, c->errlen, SW_EFORMAT,
					 "%s: kv %" PRIu64 " '%s': array of %" PRIu64 " %s runs past end of file (%zu bytes remain) at offset %zu",
					 c->name, idx, kv->key, n, gpud_gguf_vtype_name(et),
					 cur_left(c), at + 4);
		kv->val = c->p + c->pos;
		if (et == GPUD_GGUF_BOOL) {
			for (uint64_t i = 0; i < n; i++)
				if (kv->val[i] > 1)
					return sw_seterr(c->err, c->errlen, SW_EFORMAT,
							 "%s: kv %" PRIu64 " '%s': element %" PRIu64 " is not a bool (%u) at offset %" PRIu64,
							 c->name, idx, kv->key, i, kv->val[i],
							 (uint64_t)c->pos + i);
		}
		c->pos += n * es;
		return 0;
	}
	/* Strings: each at least 8 bytes of length. */
	if (n > cur_left(c) / 8)
		return sw_seterr(c->err, c->errlen, SW_EFORMAT,
				 "%s: kv %" PRIu64 " '%s': array of %" PRIu64 " strings runs past end of file (%zu bytes remain) at offset %zu",
				 c->name, idx, kv->key, n, cur_left(c), at + 4);
	kv->strs = malloc((n ? n : 1) * sizeof(*kv->strs));
	if (!kv->strs)
		return sw_seterr(c->err, c->errlen, -ENOMEM,
				 "%s: out of memory indexing %" PRIu64 " strings of '%s'",
				 c->name, n, kv->key);
	kv->val = c->p + c->pos;
	for (uint64_t i = 0; i < n; i++) {
		const uint8_t *s;
		uint64_t len;
		size_t el = c->pos;
		if ((rc = cur_str(c, &s, &len, "string"))) {
			/* Re-word the cursor's message with the key. */
			return sw_seterr(c->err, c->errlen, rc,
					 "%s: kv %" PRIu64 " '%s': element %" PRIu64 " of %" PRIu64 ": string length %" PRIu64 " runs past end of file at offset %zu",
					 c->name, idx, kv->key, i, n,
					 cur_left(c) >= 8 ? rd_u64(c->p + el) : 0, el);
		}
		kv->strs[i] = s;
	}
	return 0;
}

static int parse_kv(struct cur *c, struct gguf_kv *kv, uint64_t idx)
{
	const uint8_t *key;
	uint64_t klen;
	uint32_t t;
	char what[64];
	int rc;

	kv->off = c->pos;
	snprintf(what, sizeof(what), "kv %" PRIu64 " key", idx);
	if ((rc = cur_str(c, &key, &klen, what)))
		return rc;
	if (klen == 0 || klen > GGUF_MAX_KEY_LEN || has_nul(key, klen))
		return sw_seterr(c->err, c->errlen, SW_EFORMAT,
				 "%s: kv %" PRIu64 ": key of length %" PRIu64 " is empty, too long or holds a NUL at offset %" PRIu64,
				 c->name, idx, klen, kv->off);
	kv->key = strndup((const char *)key, klen);
	if (!kv->key)
		return -ENOMEM;
	snprintf(c->ctx, sizeof(c->ctx), "kv %" PRIu64 " '%.60s': ", idx, kv->key);
	size_t tpos = c->pos;
	if ((rc = cur_u32(c, &t, "value type")))
		return rc;
	kv->type = t;
	kv->val_off = c->pos;
	switch (t) {
	case GPUD_GGUF_STRING: {
		const uint8_t *s;
		if ((rc = cur_str(c, &s, &kv->n, "string value")))
			return sw_seterr(c->err, c->errlen, rc,
					 "%s: kv %" PRIu64 " '%s': string length %" PRIu64 " runs past end of file at offset %" PRIu64,
					 c->name, idx, kv->key,
					 cur_left(c) >= 8 ? rd_u64(c->p + kv->val_off) : 0,
					 kv->val_off);
		kv->val = s;
		break;
	}
	case GPUD_GGUF_ARRAY:
		if ((rc = parse_array(c, kv, idx)))
			return rc;
		break;
	default: {
		uint32_t sz = gpud__gguf_vtype_size(t);
		if (sz == 0)
			return sw_seterr(c->err, c->errlen, SW_EFORMAT,
					 "%s: kv %" PRIu64 " '%s': unknown value type %" PRIu32 " at offset %zu",
					 c->name, idx, kv->key, t, tpos);
		if (cur_left(c) < sz)
			return sw_seterr(c->err, c->errlen, SW_EFORMAT,
					 "%s: kv %" PRIu64 " '%s': %s value runs past end of file at offset %" PRIu64,
					 c->name, idx, kv->key, gpud_gguf_vtype_name(t), kv->val_off);
		kv->val = c->p + c->pos;
		kv->n = 1;
		if (t == GPUD_GGUF_BOOL && kv->val[0] > 1)
			return sw_seterr(c->err, c->errlen, SW_EFORMAT,
					 "%s: kv %" PRIu64 " '%s': bool value %u is not 0 or 1 at offset %" PRIu64,
					 c->name, idx, kv->key, kv->val[0], kv->val_off);
		c->pos += sz;
	}
	}
	kv->val_len = c->pos - kv->val_off;
	c->ctx[0] = 0;
	return 0;
}

static int parse_tensor_info(struct cur *c, struct gpud_gguf *g, uint64_t idx)
{
	struct gpud_gguf_tensor *t = &g->t[idx];
	size_t at = c->pos;
	const uint8_t *name = NULL;
	uint64_t nlen = 0;
	uint32_t nd, type;
	char what[64];
	int rc;

	g->t_info_off[idx] = at;
	snprintf(what, sizeof(what), "tensor %" PRIu64 " name", idx);
	if ((rc = cur_str(c, &name, &nlen, what)))
		return rc;
	if (nlen == 0 || nlen > GGUF_MAX_NAME_LEN || has_nul(name, nlen))
		return sw_seterr(c->err, c->errlen, SW_EFORMAT,
				 "%s: tensor %" PRIu64 ": name of length %" PRIu64 " is empty, longer than %d or holds a NUL at offset %zu",
				 c->name, idx, nlen, GGUF_MAX_NAME_LEN, at);
	t->name = strndup((const char *)name, nlen);
	if (!t->name)
		return -ENOMEM;
	snprintf(c->ctx, sizeof(c->ctx), "tensor %" PRIu64 " '%.60s': ", idx, t->name);
	size_t ndpos = c->pos;
	if ((rc = cur_u32(c, &nd, "tensor n_dims")))
		return rc;
	if (nd < 1 || nd > GPUD_GGUF_MAX_DIMS)
		return sw_seterr(c->err, c->errlen, SW_EFORMAT,
				 "%s: tensor %" PRIu64 " '%s': n_dims %" PRIu32 " not in 1..%d at offset %zu",
				 c->name, idx, t->name, nd, GPUD_GGUF_MAX_DIMS, ndpos);
	t->n_dims = nd;
	uint64_t nel = 1;
	for (uint32_t d = 0; d < GPUD_GGUF_MAX_DIMS; d++)
		t->ne[d] = 1;
	for (uint32_t d = 0; d < nd; d++) {
		size_t dpos = c->pos;
		if ((rc = cur_u64(c, &t->ne[d], "tensor dimension")))
			return rc;
		if (t->ne[d] == 0 || t->ne[d] > INT64_MAX)
			return sw_seterr(c->err, c->errlen, SW_EFORMAT,
					 "%s: tensor %" PRIu64 " '%s': dimension %" PRIu32 " is %" PRIu64 " at offset %zu",
					 c->name, idx, t->name, d, t->ne[d], dpos);
		if (__builtin_mul_overflow(nel, t->ne[d], &nel) || nel > INT64_MAX)
			return sw_seterr(c->err, c->errlen, SW_EFORMAT,
					 "%s: tensor %" PRIu64 " '%s': element count overflows at dimension %" PRIu32 " at offset %zu",
					 c->name, idx, t->name, d, dpos);
	}
	size_t tpos = c->pos;
	if ((rc = cur_u32(c, &type, "tensor type")))
		return rc;
	if (!gpud_type_known(type))
		return sw_seterr(c->err, c->errlen, SW_EFORMAT,
				 "%s: tensor %" PRIu64 " '%s': unknown ggml type %" PRIu32 " at offset %zu",
				 c->name, idx, t->name, type, tpos);
	if (!gpud_type_supported(type))
		return sw_seterr(c->err, c->errlen, SW_EUNSUPPORTED,
				 "%s: tensor %" PRIu64 " '%s': type %s (%" PRIu32 ") is not supported (" GPUD_TYPE_SUPPORTED_NAMES " are) at offset %zu",
				 c->name, idx, t->name, gpud_type_name(type), type, tpos);
	t->type = type;
	uint32_t be = gpud_type_block_elems(type);
	if (t->ne[0] % be)
		return sw_seterr(c->err, c->errlen, SW_EFORMAT,
				 "%s: tensor %" PRIu64 " '%s': ne[0] = %" PRIu64 " is not a multiple of the %s block size %" PRIu32 " at offset %zu",
				 c->name, idx, t->name, t->ne[0], gpud_type_name(type), be, ndpos + 4);
	/* nel / be * block_bytes can wrap (2^62 f32 elements are 2^64
	 * bytes): a wrapped size would pass the bounds check below. */
	if (__builtin_mul_overflow(nel / be, (uint64_t)gpud_type_block_bytes(type), &t->nbytes))
		return sw_seterr(c->err, c->errlen, SW_EFORMAT,
				 "%s: tensor %" PRIu64 " '%s': %" PRIu64 " elements of %s overflow 64-bit sizes at offset %zu",
				 c->name, idx, t->name, nel, gpud_type_name(type), ndpos + 4);
	size_t opos = c->pos;
	if ((rc = cur_u64(c, &t->offset, "tensor offset")))
		return rc;
	(void)opos;
	c->ctx[0] = 0;
	return 0;
}

/* Offsets, sizes and overlaps, once the header end (and so the data
 * section) is known. */
static int check_tensor_layout(struct cur *c, struct gpud_gguf *g)
{
	uint64_t data_size = g->size - g->data_off;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct gpud_gguf_tensor *t = &g->t[i];
		uint64_t opos = g->t_info_off[i] + 8 + strlen(t->name) + 4 + 8ull * t->n_dims + 4;
		if (t->offset % g->alignment)
			return sw_seterr(c->err, c->errlen, SW_EFORMAT,
					 "%s: tensor %" PRIu64 " '%s': data offset %" PRIu64 " is not a multiple of the alignment %" PRIu32 " at offset %" PRIu64,
					 c->name, i, t->name, t->offset, g->alignment, opos);
		uint64_t end;
		if (__builtin_add_overflow(t->offset, t->nbytes, &end) || end > data_size)
			return sw_seterr(c->err, c->errlen, SW_EFORMAT,
					 "%s: tensor %" PRIu64 " '%s': data [%" PRIu64 ", %" PRIu64 ") runs past end of file (%zu bytes) at offset %" PRIu64,
					 c->name, i, t->name, g->data_off + t->offset,
					 g->data_off + t->offset + (end < t->offset ? 0 : t->nbytes),
					 g->size, opos);
		t->data = g->base + g->data_off + t->offset;
		/* K-quant blocks hold fp16 fields at even offsets (Q8_K an fp32
		 * one at 0) and are read in place: their data must start at an
		 * even (Q8_K: 4-aligned) address. The default alignment 32
		 * gives that; general.alignment 1 may not. */
		if (gpud_type_block_elems(t->type) == GPUD_QK_K &&
		    ((uintptr_t)t->data & (t->type == GPUD_TYPE_Q8_K ? 3 : 1)))
			return sw_seterr(c->err, c->errlen, SW_EFORMAT,
					 "%s: tensor %" PRIu64 " '%s': %s data at file offset %" PRIu64 " is misaligned (its blocks need an address multiple of %d) at offset %" PRIu64,
					 c->name, i, t->name, gpud_type_name(t->type),
					 g->data_off + t->offset, t->type == GPUD_TYPE_Q8_K ? 4 : 2, opos);
	}

	/* Overlaps: sort by offset, compare neighbours. t_sorted is reused as
	 * scratch and re-sorted by name below. */
	for (uint64_t i = 0; i < g->n_tensors; i++)
		g->t_sorted[i] = &g->t[i];
	qsort(g->t_sorted, g->n_tensors, sizeof(*g->t_sorted), cmp_tensor_off);
	for (uint64_t i = 1; i < g->n_tensors; i++) {
		const struct gpud_gguf_tensor *a = g->t_sorted[i - 1], *b = g->t_sorted[i];
		if (b->offset < a->offset + a->nbytes) {
			uint64_t ib = (uint64_t)(b - g->t), ia = (uint64_t)(a - g->t);
			return sw_seterr(c->err, c->errlen, SW_EFORMAT,
					 "%s: tensor %" PRIu64 " '%s': data [%" PRIu64 ", %" PRIu64 ") overlaps tensor %" PRIu64 " '%s' [%" PRIu64 ", %" PRIu64 ") at offset %" PRIu64,
					 c->name, ib, b->name, b->offset, b->offset + b->nbytes,
					 ia, a->name, a->offset, a->offset + a->nbytes,
					 g->t_info_off[ib]);
		}
	}

	qsort(g->t_sorted, g->n_tensors, sizeof(*g->t_sorted), cmp_tensor_name);
	for (uint64_t i = 1; i < g->n_tensors; i++) {
		const struct gpud_gguf_tensor *a = g->t_sorted[i - 1], *b = g->t_sorted[i];
		if (strcmp(a->name, b->name) == 0) {
			uint64_t ib = (uint64_t)(b - g->t), ia = (uint64_t)(a - g->t);
			return sw_seterr(c->err, c->errlen, SW_EFORMAT,
					 "%s: tensor %" PRIu64 " '%s': duplicate name (also tensor %" PRIu64 ") at offset %" PRIu64,
					 c->name, ib, b->name, ia, g->t_info_off[ib]);
		}
	}
	return 0;
}

/* Byte offsets of a K-quant's or a Q4_1/Q5_0/Q5_1/IQ4_NL/IQ4_XS block's fp16
 * factors (d, then dmin or m; -1: none). Q8_0/Q4_0 are not checked: their
 * quantizer stores a NaN d for a block of non-finite input. */
static void kq_factor_offsets(enum gpud_type t, int off[2])
{
	off[0] = off[1] = -1;
	switch (t) {
	case GPUD_TYPE_Q4_1:
		off[0] = offsetof(struct gpud_block_q4_1, d);
		off[1] = offsetof(struct gpud_block_q4_1, m);
		break;
	case GPUD_TYPE_Q5_1:
		off[0] = offsetof(struct gpud_block_q5_1, d);
		off[1] = offsetof(struct gpud_block_q5_1, m);
		break;
	case GPUD_TYPE_Q5_0:
		off[0] = offsetof(struct gpud_block_q5_0, d);
		break;
	case GPUD_TYPE_IQ4_NL:
		off[0] = offsetof(struct gpud_block_iq4_nl, d);
		break;
	case GPUD_TYPE_IQ4_XS:
		off[0] = offsetof(struct gpud_block_iq4_xs, d);
		break;
	case GPUD_TYPE_Q2_K:
		off[0] = offsetof(struct gpud_block_q2_k, d);
		off[1] = offsetof(struct gpud_block_q2_k, dmin);
		break;
	case GPUD_TYPE_Q3_K:
		off[0] = offsetof(struct gpud_block_q3_k, d);
		break;
	case GPUD_TYPE_Q4_K:
		off[0] = offsetof(struct gpud_block_q4_k, d);
		off[1] = offsetof(struct gpud_block_q4_k, dmin);
		break;
	case GPUD_TYPE_Q5_K:
		off[0] = offsetof(struct gpud_block_q5_k, d);
		off[1] = offsetof(struct gpud_block_q5_k, dmin);
		break;
	case GPUD_TYPE_Q6_K:
		off[0] = offsetof(struct gpud_block_q6_k, d);
		break;
	default:
		break;
	}
}

int gpud_gguf_tensor_check_data(const struct gpud_gguf *g, const struct gpud_gguf_tensor *t,
				const char *path, char *err, size_t errlen)
{
	uint32_t bs = gpud_type_block_bytes(t->type);
	const uint8_t *p = t->data;
	int off[2];

	kq_factor_offsets(t->type, off);
	if (off[0] < 0)
		return 0;
	for (uint64_t b = 0; b < t->nbytes / bs; b++, p += bs)
		for (int f = 0; f < 2 && off[f] >= 0; f++) {
			uint16_t h;

			memcpy(&h, p + off[f], sizeof(h));
			if ((h & 0x7c00) == 0x7c00) /* fp16 Inf or NaN */
				return sw_seterr(err, errlen, SW_EFORMAT,
						 "%s: tensor '%s': %s block %" PRIu64 " (row %" PRIu64 ") has a non-finite %s 0x%04x at offset %" PRIu64,
						 path ? path : "gguf", t->name, gpud_type_name(t->type), b,
						 b / (t->ne[0] / gpud_type_block_elems(t->type)),
						 !f ? "d" : gpud_type_block_elems(t->type) == GPUD_QK ? "m" : "dmin",
						 (unsigned)h,
						 (uint64_t)(p + off[f] - g->base));
		}
	return 0;
}

static const struct gguf_kv *find_kv(const struct gpud_gguf *g, const char *key)
{
	if (!g || !key)
		return NULL;
	uint64_t lo = 0, hi = g->n_kv;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		int r = strcmp(g->kv_sorted[mid]->key, key);
		if (r == 0)
			return g->kv_sorted[mid];
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int parse(struct gpud_gguf *g, const char *name, char *err, size_t errlen)
{
	struct cur c = {
		.p = g->base, .size = g->size, .pos = 0,
		.name = name, .err = err, .errlen = errlen,
	};
	uint32_t magic;
	uint64_t n_t, n_kv;
	int rc;

	if (g->size < GGUF_HEADER_BYTES)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: file is %zu bytes, shorter than the %d-byte GGUF header at offset 0",
				 name, g->size, GGUF_HEADER_BYTES);
	magic = rd_u32(g->base);
	if (magic != GPUD_GGUF_MAGIC)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: bad magic 0x%08" PRIx32 " (not a GGUF file) at offset 0",
				 name, magic);
	g->version = rd_u32(g->base + 4);
	if (g->version != 2 && g->version != 3) {
		const char *why = g->version == 1 ? " (GGUF v1 is obsolete)" :
			__builtin_bswap32(g->version) <= 3 ? " (big-endian file?)" : "";
		return sw_seterr(err, errlen, SW_EVERSION,
				 "%s: unsupported GGUF version %" PRIu32 "%s, only 2 and 3 are read at offset 4",
				 name, g->version, why);
	}
	n_t = rd_u64(g->base + 8);
	n_kv = rd_u64(g->base + 16);
	c.pos = GGUF_HEADER_BYTES;
	uint64_t room = g->size - GGUF_HEADER_BYTES;
	if (n_kv > room / GGUF_MIN_KV_BYTES)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: kv count %" PRIu64 " cannot fit in a %zu-byte file at offset 16",
				 name, n_kv, g->size);
	if (n_t > room / GGUF_MIN_TENSOR_BYTES ||
	    n_kv * GGUF_MIN_KV_BYTES + n_t * GGUF_MIN_TENSOR_BYTES > room)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: tensor count %" PRIu64 " cannot fit in a %zu-byte file at offset 8",
				 name, n_t, g->size);
	if (n_kv > GGUF_MAX_KV || n_t > GGUF_MAX_TENSORS)
		return sw_seterr(err, errlen, SW_ETOOLONG,
				 "%s: %" PRIu64 " keys / %" PRIu64 " tensors exceed the limits (%u / %u) at offset %d",
				 name, n_kv, n_t, GGUF_MAX_KV, GGUF_MAX_TENSORS, n_kv > GGUF_MAX_KV ? 16 : 8);
	g->n_kv = n_kv;
	g->n_tensors = n_t;
	g->kv = calloc(n_kv ? n_kv : 1, sizeof(*g->kv));
	g->kv_sorted = calloc(n_kv ? n_kv : 1, sizeof(*g->kv_sorted));
	g->t = calloc(n_t ? n_t : 1, sizeof(*g->t));
	g->t_sorted = calloc(n_t ? n_t : 1, sizeof(*g->t_sorted));
	g->t_info_off = calloc(n_t ? n_t : 1, sizeof(*g->t_info_off));
	if (!g->kv || !g->kv_sorted || !g->t || !g->t_sorted || !g->t_info_off)
		return sw_seterr(err, errlen, -ENOMEM, "%s: out of memory for %" PRIu64 " keys and %" PRIu64 " tensors",
				 name, n_kv, n_t);

	for (uint64_t i = 0; i < n_kv; i++) {
		if ((rc = parse_kv(&c, &g->kv[i], i)))
			return rc;
		g->kv_sorted[i] = &g->kv[i];
	}
	qsort(g->kv_sorted, n_kv, sizeof(*g->kv_sorted), cmp_kv);
	for (uint64_t i = 1; i < n_kv; i++)
		if (strcmp(g->kv_sorted[i - 1]->key, g->kv_sorted[i]->key) == 0)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "%s: duplicate key '%s' (first at offset %" PRIu64 ") at offset %" PRIu64,
					 name, g->kv_sorted[i]->key, g->kv_sorted[i - 1]->off,
					 g->kv_sorted[i]->off);

	g->alignment = GPUD_GGUF_DEFAULT_ALIGNMENT;
	const struct gguf_kv *al = find_kv(g, "general.alignment");
	if (al) {
		if (al->type != GPUD_GGUF_U32)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "%s: general.alignment has type %s, expected u32 at offset %" PRIu64,
					 name, gpud_gguf_vtype_name(al->type), al->val_off - 4);
		uint32_t a = rd_u32(al->val);
		if (a == 0 || (a & (a - 1)) || a > GGUF_MAX_ALIGNMENT)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "%s: general.alignment %" PRIu32 " is not a power of two in 1..%u at offset %" PRIu64,
					 name, a, GGUF_MAX_ALIGNMENT, al->val_off);
		g->alignment = a;
	}

	for (uint64_t i = 0; i < n_t; i++)
		if ((rc = parse_tensor_info(&c, g, i)))
			return rc;

	/* The data section starts at the next multiple of the alignment. A file
	 * without tensors may end right after its header (vocab-only files). */
	uint64_t data_off = ((uint64_t)c.pos + g->alignment - 1) / g->alignment * g->alignment;
	if (n_t > 0 && data_off > g->size)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: data section would start at %" PRIu64 ", past end of file (%zu bytes) at offset %zu",
				 name, data_off, g->size, c.pos);
	g->data_off = data_off > g->size ? g->size : data_off;
	return check_tensor_layout(&c, g);
}

static void free_tables(struct gpud_gguf *g)
{
	if (g->kv) {
		for (uint64_t i = 0; i < g->n_kv; i++) {
			free(g->kv[i].key);
			free(g->kv[i].strs);
		}
	}
	if (g->t) {
		for (uint64_t i = 0; i < g->n_tensors; i++)
			free((char *)g->t[i].name);
	}
	free(g->kv);
	free(g->kv_sorted);
	free(g->t);
	free(g->t_sorted);
	free(g->t_info_off);
}

void gpud_gguf_close(struct gpud_gguf *g)
{
	if (!g)
		return;
	free_tables(g);
	if (g->mapped && g->size)
		munmap((void *)g->base, g->size);
	free(g);
}

int gpud_gguf_open_mem(struct gpud_gguf **out, const void *data, size_t size,
		       const char *name, char *err, size_t errlen)
{
	*out = NULL;
	if (!name)
		name = "<memory>";
	if (!data && size)
		return sw_seterr(err, errlen, -EINVAL, "%s: NULL buffer", name);
	struct gpud_gguf *g = calloc(1, sizeof(*g));
	if (!g)
		return sw_seterr(err, errlen, -ENOMEM, "%s: out of memory", name);
	g->base = data;
	g->size = size;
	int rc = parse(g, name, err, errlen);
	if (rc) {
		if (rc == -ENOMEM && err && errlen && !strstr(err, name))
			sw_seterr(err, errlen, rc, "%s: out of memory while reading the header", name);
		gpud_gguf_close(g);
		return rc;
	}
	*out = g;
	return 0;
}

int gpud_gguf_open(struct gpud_gguf **out, const char *path, char *err, size_t errlen)
{
	struct stat st;
	void *map;
	int fd, rc;

	*out = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return sw_seterr(err, errlen, -errno, "%s: open: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		rc = sw_seterr(err, errlen, -errno, "%s: fstat: %s", path, strerror(errno));
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = sw_seterr(err, errlen, -EINVAL, "%s: not a regular file", path);
		goto out_close;
	}
	if ((uint64_t)st.st_size < GGUF_HEADER_BYTES) {
		rc = sw_seterr(err, errlen, SW_EFORMAT,
			       "%s: file is %jd bytes, shorter than the %d-byte GGUF header at offset 0",
			       path, (intmax_t)st.st_size, GGUF_HEADER_BYTES);
		goto out_close;
	}
	if ((uint64_t)st.st_size > SIZE_MAX) {
		rc = sw_seterr(err, errlen, -EFBIG, "%s: too large to map", path);
		goto out_close;
	}
	map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (map == MAP_FAILED) {
		rc = sw_seterr(err, errlen, -errno, "%s: mmap: %s", path, strerror(errno));
		goto out_close;
	}
	close(fd);

	struct gpud_gguf *g = calloc(1, sizeof(*g));
	if (!g) {
		munmap(map, (size_t)st.st_size);
		return sw_seterr(err, errlen, -ENOMEM, "%s: out of memory", path);
	}
	g->base = map;
	g->size = (size_t)st.st_size;
	g->mapped = true;
	rc = parse(g, path, err, errlen);
	if (rc) {
		gpud_gguf_close(g);
		return rc;
	}
	*out = g;
	return 0;

out_close:
	close(fd);
	return rc;
}

uint32_t gpud_gguf_version(const struct gpud_gguf *g)
{
	return g->version;
}

uint64_t gpud_gguf_n_kv(const struct gpud_gguf *g)
{
	return g->n_kv;
}

uint64_t gpud_gguf_n_tensors(const struct gpud_gguf *g)
{
	return g->n_tensors;
}

uint32_t gpud_gguf_alignment(const struct gpud_gguf *g)
{
	return g->alignment;
}

uint64_t gpud_gguf_data_offset(const struct gpud_gguf *g)
{
	return g->data_off;
}

const char *gpud_gguf_key(const struct gpud_gguf *g, uint64_t i)
{
	if (!g || i >= g->n_kv)
		return NULL;
	return g->kv[i].key;
}

int gpud_gguf_key_type(const struct gpud_gguf *g, const char *key, enum gpud_gguf_vtype *type)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv)
		return SW_ENOTFOUND;
	*type = kv->type;
	return 0;
}

bool gpud_gguf_has(const struct gpud_gguf *g, const char *key)
{
	return find_kv(g, key) != NULL;
}

/* Reads an integer element of type t at p as a signed 128-bit-safe pair:
 * returns false when t is not an integer type. */
static bool read_int(enum gpud_gguf_vtype t, const uint8_t *p, int64_t *sv, uint64_t *uv, bool *is_signed)
{
	*is_signed = false;
	switch (t) {
	case GPUD_GGUF_U8: *uv = p[0]; return true;
	case GPUD_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); *uv = v; return true; }
	case GPUD_GGUF_U32: *uv = rd_u32(p); return true;
	case GPUD_GGUF_U64: *uv = rd_u64(p); return true;
	default: break;
	}
	*is_signed = true;
	switch (t) {
	case GPUD_GGUF_I8: *sv = (int8_t)p[0]; return true;
	case GPUD_GGUF_I16: { int16_t v; memcpy(&v, p, 2); *sv = v; return true; }
	case GPUD_GGUF_I32: { int32_t v; memcpy(&v, p, 4); *sv = v; return true; }
	case GPUD_GGUF_I64: { int64_t v; memcpy(&v, p, 8); *sv = v; return true; }
	default: return false;
	}
}

/* Converts an integer element into [lo, hi]; SW_ETYPE when it is not an
 * integer or does not fit. */
static int int_in_range(enum gpud_gguf_vtype t, const uint8_t *p, int64_t lo, uint64_t hi,
			uint64_t *u, int64_t *s)
{
	int64_t sv = 0;
	uint64_t uv = 0;
	bool is_signed;
	if (!read_int(t, p, &sv, &uv, &is_signed))
		return SW_ETYPE;
	if (is_signed) {
		if (sv < lo || (sv > 0 && (uint64_t)sv > hi))
			return SW_ETYPE;
		*s = sv;
		*u = (uint64_t)sv;
	} else {
		if (uv > hi)
			return SW_ETYPE;
		*u = uv;
		*s = (int64_t)uv;
	}
	return 0;
}

static int get_int(const struct gpud_gguf *g, const char *key, int64_t lo, uint64_t hi,
		   uint64_t *u, int64_t *s)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv)
		return SW_ENOTFOUND;
	return int_in_range(kv->type, kv->val, lo, hi, u, s);
}

int gpud_gguf_get_u32(const struct gpud_gguf *g, const char *key, uint32_t *out)
{
	uint64_t u;
	int64_t s;
	int rc = get_int(g, key, 0, UINT32_MAX, &u, &s);
	if (!rc)
		*out = (uint32_t)u;
	return rc;
}

int gpud_gguf_get_i32(const struct gpud_gguf *g, const char *key, int32_t *out)
{
	uint64_t u;
	int64_t s;
	int rc = get_int(g, key, INT32_MIN, INT32_MAX, &u, &s);
	if (!rc)
		*out = (int32_t)s;
	return rc;
}

int gpud_gguf_get_u64(const struct gpud_gguf *g, const char *key, uint64_t *out)
{
	uint64_t u;
	int64_t s;
	int rc = get_int(g, key, 0, UINT64_MAX, &u, &s);
	if (!rc)
		*out = u;
	return rc;
}

static int read_float(enum gpud_gguf_vtype t, const uint8_t *p, float *out)
{
	if (t == GPUD_GGUF_F32) {
		memcpy(out, p, 4);
		return 0;
	}
	if (t == GPUD_GGUF_F64) {
		double d;
		memcpy(&d, p, 8);
		*out = (float)d;
		return 0;
	}
	return SW_ETYPE;
}

int gpud_gguf_get_f32(const struct gpud_gguf *g, const char *key, float *out)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv)
		return SW_ENOTFOUND;
	return read_float(kv->type, kv->val, out);
}

int gpud_gguf_get_bool(const struct gpud_gguf *g, const char *key, bool *out)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv)
		return SW_ENOTFOUND;
	if (kv->type != GPUD_GGUF_BOOL)
		return SW_ETYPE;
	*out = kv->val[0] != 0;
	return 0;
}

int gpud_gguf_get_str(const struct gpud_gguf *g, const char *key, struct gpud_gguf_str *out)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv)
		return SW_ENOTFOUND;
	if (kv->type != GPUD_GGUF_STRING)
		return SW_ETYPE;
	out->s = (const char *)kv->val;
	out->len = kv->n;
	return 0;
}

int gpud_gguf_get_arr(const struct gpud_gguf *g, const char *key,
		      enum gpud_gguf_vtype *elem_type, uint64_t *n)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv)
		return SW_ENOTFOUND;
	if (kv->type != GPUD_GGUF_ARRAY)
		return SW_ETYPE;
	*elem_type = kv->elem;
	*n = kv->n;
	return 0;
}

static int arr_elem(const struct gpud_gguf *g, const char *key, uint64_t i,
		    const struct gguf_kv **kvp)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv)
		return SW_ENOTFOUND;
	if (kv->type != GPUD_GGUF_ARRAY)
		return SW_ETYPE;
	if (i >= kv->n)
		return -ERANGE;
	*kvp = kv;
	return 0;
}

int gpud_gguf_arr_i32(const struct gpud_gguf *g, const char *key, uint64_t i, int32_t *out)
{
	const struct gguf_kv *kv;
	int rc = arr_elem(g, key, i, &kv);
	if (rc)
		return rc;
	uint32_t es = gpud__gguf_vtype_size(kv->elem);
	if (es == 0 || kv->elem == GPUD_GGUF_BOOL)
		return SW_ETYPE;
	uint64_t u;
	int64_t s;
	rc = int_in_range(kv->elem, kv->val + i * es, INT32_MIN, INT32_MAX, &u, &s);
	if (!rc)
		*out = (int32_t)s;
	return rc;
}

int gpud_gguf_arr_f32(const struct gpud_gguf *g, const char *key, uint64_t i, float *out)
{
	const struct gguf_kv *kv;
	int rc = arr_elem(g, key, i, &kv);
	if (rc)
		return rc;
	uint32_t es = gpud__gguf_vtype_size(kv->elem);
	if (es == 0)
		return SW_ETYPE;
	return read_float(kv->elem, kv->val + i * es, out);
}

int gpud_gguf_arr_str(const struct gpud_gguf *g, const char *key, uint64_t i,
		      struct gpud_gguf_str *out)
{
	const struct gguf_kv *kv;
	int rc = arr_elem(g, key, i, &kv);
	if (rc)
		return rc;
	if (kv->elem != GPUD_GGUF_STRING)
		return SW_ETYPE;
	out->s = (const char *)kv->strs[i];
	out->len = rd_u64(kv->strs[i] - 8);
	return 0;
}

int gpud_gguf_arr_data(const struct gpud_gguf *g, const char *key,
		       enum gpud_gguf_vtype *elem_type, const void **data, uint64_t *n)
{
	const struct gguf_kv *kv = find_kv(g, key);
	if (!kv)
		return SW_ENOTFOUND;
	if (kv->type != GPUD_GGUF_ARRAY || kv->elem == GPUD_GGUF_STRING)
		return SW_ETYPE;
	*elem_type = kv->elem;
	*data = kv->val;
	*n = kv->n;
	return 0;
}

const struct gpud_gguf_tensor *gpud_gguf_tensor(const struct gpud_gguf *g, uint64_t i)
{
	if (!g || i >= g->n_tensors)
		return NULL;
	return &g->t[i];
}

const struct gpud_gguf_tensor *gpud_gguf_find_tensor(const struct gpud_gguf *g, const char *name)
{
	if (!g || !name)
		return NULL;
	uint64_t lo = 0, hi = g->n_tensors;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		int r = strcmp(g->t_sorted[mid]->name, name);
		if (r == 0)
			return g->t_sorted[mid];
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* --- for the writer (gguf_impl.h) ------------------------------------------ */

int gpud__gguf_kv_raw(const struct gpud_gguf *g, uint64_t i, const char **key, uint32_t *type,
		      const void **val, uint64_t *len)
{
	if (!g || i >= g->n_kv)
		return -ERANGE;
	*key = g->kv[i].key;
	*type = g->kv[i].type;
	*val = g->base + g->kv[i].val_off;
	*len = g->kv[i].val_len;
	return 0;
}
