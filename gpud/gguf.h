/* gguf.h - GGUF v3 model file reader (over mmap); the writer is gguf_write.h.
 *
 * gpud_gguf_open() validates the whole header before any data is touched:
 * magic, version, counts, every string and array length, value types,
 * alignment, tensor types, shapes, offsets and sizes against the file size.
 * Any bad byte yields SW_EFORMAT (or SW_EUNSUPPORTED for a well-formed but
 * unsupported type, SW_EVERSION for a version other than 2 or 3,
 * SW_ETOOLONG for more than 2^20 keys or tensors) and a
 * message naming the file, the field and its byte offset. GGUF v2 (same
 * layout, u64 counts) is read too; v1 is rejected.
 * After a successful open every accessor is bounds-safe.
 *
 * Ownership: the reader owns the mapping; every pointer it returns (strings,
 * array data, tensor data, tensor names) lives until gpud_gguf_close().
 * Strings from the file are NOT NUL-terminated: use the returned length.
 * Array data and tensor data may be unaligned only where the file is; tensor
 * data is aligned to general.alignment (validated at open). The file must
 * not shrink while it is open: touching a page past its new end is SIGBUS.
 *
 * Stricter than the spec: keys must be 1..65535 bytes without NUL, tensor
 * names 1..255 bytes without NUL, bools 0 or 1, arrays not nested
 * (SW_EUNSUPPORTED), general.alignment a u32 power of two up to 2^24,
 * tensors may neither overlap nor share a name, and every dimension is > 0.
 */
#ifndef GPUD_GGUF_H
#define GPUD_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/quant.h" /* enum gpud_type and its traits */

#define GPUD_GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GPUD_GGUF_VERSION 3
#define GPUD_GGUF_DEFAULT_ALIGNMENT 32
#define GPUD_GGUF_MAX_DIMS 4

/* Metadata value types, numbered as in the GGUF specification. */
enum gpud_gguf_vtype {
	GPUD_GGUF_U8 = 0,
	GPUD_GGUF_I8 = 1,
	GPUD_GGUF_U16 = 2,
	GPUD_GGUF_I16 = 3,
	GPUD_GGUF_U32 = 4,
	GPUD_GGUF_I32 = 5,
	GPUD_GGUF_F32 = 6,
	GPUD_GGUF_BOOL = 7,
	GPUD_GGUF_STRING = 8,
	GPUD_GGUF_ARRAY = 9,
	GPUD_GGUF_U64 = 10,
	GPUD_GGUF_I64 = 11,
	GPUD_GGUF_F64 = 12,
};

/* "u32", "string", ...; "?" when unknown. */
const char *gpud_gguf_vtype_name(enum gpud_gguf_vtype t);

struct gpud_gguf_str {
	const char *s; /* not NUL-terminated */
	uint64_t len;
};

struct gpud_gguf_tensor {
	const char *name;  /* NUL-terminated copy owned by the reader */
	uint32_t n_dims;
	uint64_t ne[GPUD_GGUF_MAX_DIMS]; /* ne[0] is the contiguous dimension; unused dims are 1 */
	enum gpud_type type;
	uint64_t offset;   /* from the start of the data section */
	uint64_t nbytes;
	const void *data;  /* into the mapping */
};

struct gpud_gguf;

/* Maps and validates path. On success *out owns the mapping and 0 is
 * returned; on failure *out is NULL, err holds "<path>: <what> at offset N"
 * and a negative code is returned. */
int gpud_gguf_open(struct gpud_gguf **out, const char *path, char *err, size_t errlen);

/* Same, over a caller-owned buffer that must outlive the reader (fuzzers,
 * tests). name is used in messages. Tensor data is aligned in memory only
 * as far as the buffer itself is (the mapping of gpud_gguf_open() is page
 * aligned). */
int gpud_gguf_open_mem(struct gpud_gguf **out, const void *data, size_t size,
		       const char *name, char *err, size_t errlen);

void gpud_gguf_close(struct gpud_gguf *g); /* accepts NULL */

uint32_t gpud_gguf_version(const struct gpud_gguf *g);
uint64_t gpud_gguf_n_kv(const struct gpud_gguf *g);
uint64_t gpud_gguf_n_tensors(const struct gpud_gguf *g);
uint32_t gpud_gguf_alignment(const struct gpud_gguf *g);
/* File offset of the data section (tensor offsets are relative to it). */
uint64_t gpud_gguf_data_offset(const struct gpud_gguf *g);

/* Key i (0 <= i < n_kv) in file order, NUL-terminated and owned by the
 * reader; NULL when i is out of range. Used to walk all metadata. */
const char *gpud_gguf_key(const struct gpud_gguf *g, uint64_t i);
/* Value type of key: 0, or SW_ENOTFOUND. */
int gpud_gguf_key_type(const struct gpud_gguf *g, const char *key, enum gpud_gguf_vtype *type);

/* Metadata lookup by key. Each getter returns 0, SW_ENOTFOUND when the key
 * is absent, or SW_ETYPE when the value has another type (integer getters
 * accept any integer type whose value fits; float getters accept F32/F64). */
bool gpud_gguf_has(const struct gpud_gguf *g, const char *key);
int gpud_gguf_get_u32(const struct gpud_gguf *g, const char *key, uint32_t *out);
int gpud_gguf_get_i32(const struct gpud_gguf *g, const char *key, int32_t *out);
int gpud_gguf_get_u64(const struct gpud_gguf *g, const char *key, uint64_t *out);
int gpud_gguf_get_f32(const struct gpud_gguf *g, const char *key, float *out);
int gpud_gguf_get_bool(const struct gpud_gguf *g, const char *key, bool *out);
int gpud_gguf_get_str(const struct gpud_gguf *g, const char *key, struct gpud_gguf_str *out);

/* Arrays. gpud_gguf_get_arr() gives the element type and count; numeric
 * elements are read with gpud_gguf_arr_{i32,f32}() (which convert and check
 * the index), strings with gpud_gguf_arr_str(), which is O(1): the reader
 * indexes string arrays at open. Element getters return 0, SW_ENOTFOUND
 * (no such key), SW_ETYPE (not an array, or an element of another type or
 * out of the target's range) or -ERANGE (i >= n). Keys are found by binary
 * search, O(log n_kv). */
int gpud_gguf_get_arr(const struct gpud_gguf *g, const char *key,
		      enum gpud_gguf_vtype *elem_type, uint64_t *n);
int gpud_gguf_arr_i32(const struct gpud_gguf *g, const char *key, uint64_t i, int32_t *out);
int gpud_gguf_arr_f32(const struct gpud_gguf *g, const char *key, uint64_t i, float *out);
int gpud_gguf_arr_str(const struct gpud_gguf *g, const char *key, uint64_t i,
		      struct gpud_gguf_str *out);
/* Raw elements of a numeric array, in the file's little-endian layout and
 * possibly unaligned (read them with memcpy). SW_ETYPE for string arrays. */
int gpud_gguf_arr_data(const struct gpud_gguf *g, const char *key,
		       enum gpud_gguf_vtype *elem_type, const void **data, uint64_t *n);

/* Tensors: NULL when absent. gpud_gguf_tensor() is in file order;
 * gpud_gguf_find_tensor() is a binary search over the names. */
const struct gpud_gguf_tensor *gpud_gguf_tensor(const struct gpud_gguf *g, uint64_t i);
const struct gpud_gguf_tensor *gpud_gguf_find_tensor(const struct gpud_gguf *g, const char *name);

/* Checks what the header cannot show by reading t's data (a tensor of g):
 * for the K-quants (q2_k..q6_k) every super-block's fp16 factors d and
 * dmin must be finite (a NaN or Inf there makes whole blocks NaN: the file
 * is corrupt or its weights were), and so must q4_1/q5_0/q5_1/iq4_nl/
 * iq4_xs's d and m. Other types return 0 without reading. On failure returns
 * SW_EFORMAT and err says
 * "<path>: tensor '<name>': q4_k block B (row R) has a non-finite d ...".
 * Touches every page of such a tensor once. */
int gpud_gguf_tensor_check_data(const struct gpud_gguf *g, const struct gpud_gguf_tensor *t,
				const char *path, char *err, size_t errlen);

#endif
