/* gguf_impl.h - private to gguf.c (reader) and gguf_write.c (writer).
 *
 * The limits both sides enforce, so that the writer writes back whatever
 * the reader accepts (tests/fuzz/fuzz_gguf.c checks it), and the reader's
 * raw view of a key/value that the writer copies verbatim.
 */
#ifndef GPUD_GGUF_IMPL_H
#define GPUD_GGUF_IMPL_H

#include <stdint.h>

#include "gpud/gguf.h"

#define GGUF_HEADER_BYTES 24     /* magic, version, n_tensors, n_kv */
#define GGUF_MAX_KEY_LEN 65535   /* spec limit */
#define GGUF_MAX_NAME_LEN 255    /* ggml uses 63; be lenient, but bounded */
#define GGUF_MAX_ALIGNMENT (1u << 24)

/* Bytes of one scalar value of a metadata type; 0 for string/array/unknown. */
uint32_t gpud__gguf_vtype_size(uint32_t t);

/* Key/value i (0 <= i < n_kv) of an open file: its key, value type and the
 * value's bytes as serialized in the file (after the vtype), owned by the
 * reader. Returns 0, or -ERANGE when i is out of range. */
int gpud__gguf_kv_raw(const struct gpud_gguf *g, uint64_t i, const char **key, uint32_t *type,
		      const void **val, uint64_t *len);

#endif
