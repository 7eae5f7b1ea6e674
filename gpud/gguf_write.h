/* gguf_write.h - GGUF v3 writer (gpud mkmodel, tests).
 *
 * Collects metadata and tensors in memory, then writes a GGUF v3 file in
 * one pass. Tensor data passed to gpud_gguf_w_tensor is copied; tensors
 * added with gpud_gguf_w_tensor_fill are produced at write time in batches
 * of rows (8 MiB of output), so a model of any size is written in that
 * much memory. Keys are
 * written in the order added, tensors in the order added, each tensor's data
 * aligned to general.alignment (32, or what a u32 "general.alignment" key
 * set). All functions return 0 or a negative code: -EINVAL (bad argument:
 * empty name, n_dims not 1..4, a zero dim, ne[0] not a multiple of the
 * block, nbytes not matching), -EEXIST (duplicate key or tensor name),
 * SW_EUNSUPPORTED (tensor type not supported by gpud/quant.h), -ENOMEM. A
 * failed call leaves the writer as it was; it may still be used or freed.
 * Names, keys and alignment obey the reader's limits (gguf.h), so a file
 * the reader accepted can be written back.
 */
#ifndef GPUD_GGUF_WRITE_H
#define GPUD_GGUF_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/gguf.h"

struct gpud_gguf_writer;

int gpud_gguf_writer_new(struct gpud_gguf_writer **out);
void gpud_gguf_writer_free(struct gpud_gguf_writer *w); /* accepts NULL */
int gpud_gguf_w_u32(struct gpud_gguf_writer *w, const char *key, uint32_t v);
int gpud_gguf_w_u64(struct gpud_gguf_writer *w, const char *key, uint64_t v);
int gpud_gguf_w_i32(struct gpud_gguf_writer *w, const char *key, int32_t v);
int gpud_gguf_w_f32(struct gpud_gguf_writer *w, const char *key, float v);
int gpud_gguf_w_bool(struct gpud_gguf_writer *w, const char *key, bool v);
int gpud_gguf_w_str(struct gpud_gguf_writer *w, const char *key, const char *v);
/* Array of n elements of a numeric type (data in that type's layout). */
int gpud_gguf_w_arr(struct gpud_gguf_writer *w, const char *key,
		    enum gpud_gguf_vtype elem_type, const void *data, uint64_t n);
int gpud_gguf_w_arr_str(struct gpud_gguf_writer *w, const char *key,
			const struct gpud_gguf_str *v, uint64_t n);
/* Copies every key/value of src except those for which skip(key) is true
 * (used to borrow a tokenizer from another model). skip may be NULL. */
int gpud_gguf_w_copy_kv(struct gpud_gguf_writer *w, const struct gpud_gguf *src,
			bool (*skip)(const char *key, void *arg), void *arg);
int gpud_gguf_w_tensor(struct gpud_gguf_writer *w, const char *name, enum gpud_type type,
		       uint32_t n_dims, const uint64_t *ne, const void *data, size_t nbytes);
/* As gpud_gguf_w_tensor, but data is not copied: it must stay valid and
 * unchanged until the last write (a tensor of a mapped source file, as
 * gpud quantize copies the tensors it keeps). */
int gpud_gguf_w_tensor_ref(struct gpud_gguf_writer *w, const char *name, enum gpud_type type,
			   uint32_t n_dims, const uint64_t *ne, const void *data, size_t nbytes);

/* Produces row `row` (0 <= row < ne[1]*ne[2]*ne[3]) of a streamed tensor as
 * `cols` = ne[0] floats into out. Returns 0, or a negative code that aborts
 * the write (the code is returned by gpud_gguf_w_write). */
typedef int (*gpud_gguf_fill_fn)(void *arg, uint64_t row, float *out, uint64_t cols);

/* A tensor whose rows fill() produces during gpud_gguf_w_write(), in row
 * order, converted to type with gpud_quantize_row() (F32 is written as is).
 * arg must stay valid until the write. */
int gpud_gguf_w_tensor_fill(struct gpud_gguf_writer *w, const char *name, enum gpud_type type,
			    uint32_t n_dims, const uint64_t *ne, gpud_gguf_fill_fn fill, void *arg);

/* Fill tensors' rows are produced and converted by n threads side by side
 * (batches of rows, each written in order: the same bytes whatever n);
 * n <= 0: one a CPU. Default 1. With n > 1 the fill callbacks are called
 * from several threads at once (each row once, in no particular order;
 * after a failing row, rows past it may still be filled) and must allow
 * that. At most GPUD_GGUF_W_MAX_THREADS. */
#define GPUD_GGUF_W_MAX_THREADS 16
void gpud_gguf_w_set_threads(struct gpud_gguf_writer *w, int n);

/* Exact size in bytes of the file gpud_gguf_w_write() would write now. */
int gpud_gguf_w_size(struct gpud_gguf_writer *w, uint64_t *bytes);

/* Writes to path atomically: a temp file "<path>.tmp.XXXXXX" in the same
 * directory, every write checked, fsync, then rename over path. On error
 * the temp file is removed, path is untouched, err says what failed. The
 * writer is not consumed and may be written again (fill callbacks are then
 * called again). */
int gpud_gguf_w_write(struct gpud_gguf_writer *w, const char *path, char *err, size_t errlen);

#endif
