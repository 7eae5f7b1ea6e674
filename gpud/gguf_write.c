/* gguf_write.c - GGUF v3 writer: metadata and tensors collected in
 * memory, then one pass to a temp file renamed over the target.
 *
 * The layout is the reader's (gguf.c) and so are the limits on names,
 * keys and alignment (gguf_impl.h): whatever the reader accepts, the
 * writer writes back. Streamed tensors are converted row by row with
 * gpud_quantize_row() (gpud/quant.h), the reference every backend matches.
 */
#include "gpud/gguf_write.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/par.h"
#include "gpud/gguf_impl.h"
#include "gpud/quant.h"

struct wkv {
	char *key;
	uint32_t type;
	uint8_t *val;   /* serialized value, as in the file */
	size_t len;
};

struct wtensor {
	char *name;
	enum gpud_type type;
	uint32_t n_dims;
	uint64_t ne[GPUD_GGUF_MAX_DIMS];
	uint64_t nbytes;
	uint64_t offset;         /* assigned at layout time */
	void *data;              /* owned copy (borrowed: the caller's), or NULL
				  * for a fill tensor */
	bool borrowed;
	gpud_gguf_fill_fn fill;
	void *arg;
};

struct gpud_gguf_writer {
	struct wkv *kv;          /* (n_kv) */
	size_t n_kv, cap_kv;
	struct wtensor *t;       /* (n_t) */
	size_t n_t, cap_t;
	uint32_t alignment;
	int threads;             /* fill threads (gpud_gguf_w_set_threads) */
};

int gpud_gguf_writer_new(struct gpud_gguf_writer **out)
{
	struct gpud_gguf_writer *w = calloc(1, sizeof(*w));
	*out = NULL;
	if (!w)
		return -ENOMEM;
	w->alignment = GPUD_GGUF_DEFAULT_ALIGNMENT;
	w->threads = 1;
	*out = w;
	return 0;
}

void gpud_gguf_writer_free(struct gpud_gguf_writer *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->n_kv; i++) {
		free(w->kv[i].key);
		free(w->kv[i].val);
	}
	for (size_t i = 0; i < w->n_t; i++) {
		free(w->t[i].name);
		if (!w->t[i].borrowed)
			free(w->t[i].data);
	}
	free(w->kv);
	free(w->t);
	free(w);
}

/* Takes ownership of val (freed on error too). */
static int w_add(struct gpud_gguf_writer *w, const char *key, uint32_t type,
		 uint8_t *val, size_t len)
{
	int rc;
	if (!w || !key || !*key || strlen(key) > GGUF_MAX_KEY_LEN) {
		rc = -EINVAL;
		goto out_free;
	}
	for (size_t i = 0; i < w->n_kv; i++) {
		if (strcmp(w->kv[i].key, key) == 0) {
			rc = -EEXIST;
			goto out_free;
		}
	}
	if (strcmp(key, "general.alignment") == 0) {
		uint32_t a;
		if (type != GPUD_GGUF_U32) {
			rc = SW_ETYPE;
			goto out_free;
		}
		memcpy(&a, val, 4);
		if (a == 0 || (a & (a - 1)) || a > GGUF_MAX_ALIGNMENT) {
			rc = -EINVAL;
			goto out_free;
		}
		w->alignment = a;
	}
	if (w->n_kv == w->cap_kv) {
		size_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
		struct wkv *kv = realloc(w->kv, cap * sizeof(*kv));
		if (!kv) {
			rc = -ENOMEM;
			goto out_free;
		}
		w->kv = kv;
		w->cap_kv = cap;
	}
	char *k = strdup(key);
	if (!k) {
		rc = -ENOMEM;
		goto out_free;
	}
	w->kv[w->n_kv++] = (struct wkv){ .key = k, .type = type, .val = val, .len = len };
	return 0;

out_free:
	free(val);
	return rc;
}

static int w_scalar(struct gpud_gguf_writer *w, const char *key, uint32_t type,
		    const void *v, size_t n)
{
	uint8_t *val = malloc(n);
	if (!val)
		return -ENOMEM;
	memcpy(val, v, n);
	return w_add(w, key, type, val, n);
}

int gpud_gguf_w_u32(struct gpud_gguf_writer *w, const char *key, uint32_t v)
{
	return w_scalar(w, key, GPUD_GGUF_U32, &v, 4);
}

int gpud_gguf_w_i32(struct gpud_gguf_writer *w, const char *key, int32_t v)
{
	return w_scalar(w, key, GPUD_GGUF_I32, &v, 4);
}

int gpud_gguf_w_u64(struct gpud_gguf_writer *w, const char *key, uint64_t v)
{
	return w_scalar(w, key, GPUD_GGUF_U64, &v, 8);
}

int gpud_gguf_w_f32(struct gpud_gguf_writer *w, const char *key, float v)
{
	return w_scalar(w, key, GPUD_GGUF_F32, &v, 4);
}

int gpud_gguf_w_bool(struct gpud_gguf_writer *w, const char *key, bool v)
{
	uint8_t b = v;
	return w_scalar(w, key, GPUD_GGUF_BOOL, &b, 1);
}

int gpud_gguf_w_str(struct gpud_gguf_writer *w, const char *key, const char *v)
{
	if (!v)
		return -EINVAL;
	uint64_t n = strlen(v);
	uint8_t *val = malloc(8 + n);
	if (!val)
		return -ENOMEM;
	memcpy(val, &n, 8);
	memcpy(val + 8, v, n);
	return w_add(w, key, GPUD_GGUF_STRING, val, 8 + n);
}

int gpud_gguf_w_arr(struct gpud_gguf_writer *w, const char *key,
		    enum gpud_gguf_vtype elem_type, const void *data, uint64_t n)
{
	uint32_t es = gpud__gguf_vtype_size(elem_type);
	uint32_t et = elem_type;
	if (es == 0 || (n && !data) || n > (SIZE_MAX - 12) / es)
		return -EINVAL;
	if (elem_type == GPUD_GGUF_BOOL)
		for (uint64_t i = 0; i < n; i++)
			if (((const uint8_t *)data)[i] > 1)
				return -EINVAL;
	size_t len = 12 + (size_t)n * es;
	uint8_t *val = malloc(len);
	if (!val)
		return -ENOMEM;
	memcpy(val, &et, 4);
	memcpy(val + 4, &n, 8);
	if (n)
		memcpy(val + 12, data, (size_t)n * es);
	return w_add(w, key, GPUD_GGUF_ARRAY, val, len);
}

int gpud_gguf_w_arr_str(struct gpud_gguf_writer *w, const char *key,
			const struct gpud_gguf_str *v, uint64_t n)
{
	size_t len = 12;
	uint32_t et = GPUD_GGUF_STRING;
	if (n && !v)
		return -EINVAL;
	for (uint64_t i = 0; i < n; i++) {
		if (v[i].len && !v[i].s)
			return -EINVAL;
		if (__builtin_add_overflow(len, 8, &len) ||
		    __builtin_add_overflow(len, v[i].len, &len))
			return -EOVERFLOW;
	}
	uint8_t *val = malloc(len);
	if (!val)
		return -ENOMEM;
	memcpy(val, &et, 4);
	memcpy(val + 4, &n, 8);
	size_t at = 12;
	for (uint64_t i = 0; i < n; i++) {
		memcpy(val + at, &v[i].len, 8);
		if (v[i].len)
			memcpy(val + at + 8, v[i].s, v[i].len);
		at += 8 + v[i].len;
	}
	return w_add(w, key, GPUD_GGUF_ARRAY, val, len);
}

int gpud_gguf_w_copy_kv(struct gpud_gguf_writer *w, const struct gpud_gguf *src,
			bool (*skip)(const char *key, void *arg), void *arg)
{
	if (!w || !src)
		return -EINVAL;
	for (uint64_t i = 0; i < gpud_gguf_n_kv(src); i++) {
		const char *key;
		const void *raw;
		uint64_t len;
		uint32_t type;

		if (gpud__gguf_kv_raw(src, i, &key, &type, &raw, &len))
			return -EINVAL;
		if (skip && skip(key, arg))
			continue;
		uint8_t *val = malloc(len ? len : 1);
		if (!val)
			return -ENOMEM;
		memcpy(val, raw, len);
		int rc = w_add(w, key, type, val, len);
		if (rc)
			return rc;
	}
	return 0;
}

void gpud_gguf_w_set_threads(struct gpud_gguf_writer *w, int n)
{
	if (n <= 0)
		n = sw_par_cpus(GPUD_GGUF_W_MAX_THREADS);
	w->threads = n > GPUD_GGUF_W_MAX_THREADS ? GPUD_GGUF_W_MAX_THREADS : n;
}

/* Common checks of a new tensor; fills t on success. */
static int w_tensor_new(struct gpud_gguf_writer *w, const char *name, enum gpud_type type,
			uint32_t n_dims, const uint64_t *ne, struct wtensor **out)
{
	uint64_t nel = 1;
	if (!w || !name || !*name || strlen(name) > GGUF_MAX_NAME_LEN || !ne ||
	    n_dims < 1 || n_dims > GPUD_GGUF_MAX_DIMS)
		return -EINVAL;
	if (!gpud_type_supported(type))
		return SW_EUNSUPPORTED;
	for (uint32_t d = 0; d < n_dims; d++)
		if (ne[d] == 0 || __builtin_mul_overflow(nel, ne[d], &nel) || nel > INT64_MAX)
			return -EINVAL;
	if (ne[0] % gpud_type_block_elems(type))
		return -EINVAL;
	for (size_t i = 0; i < w->n_t; i++)
		if (strcmp(w->t[i].name, name) == 0)
			return -EEXIST;
	if (w->n_t == w->cap_t) {
		size_t cap = w->cap_t ? 2 * w->cap_t : 64;
		struct wtensor *t = realloc(w->t, cap * sizeof(*t));
		if (!t)
			return -ENOMEM;
		w->t = t;
		w->cap_t = cap;
	}
	struct wtensor *t = &w->t[w->n_t];
	memset(t, 0, sizeof(*t));
	t->name = strdup(name);
	if (!t->name)
		return -ENOMEM;
	t->type = type;
	t->n_dims = n_dims;
	for (uint32_t d = 0; d < GPUD_GGUF_MAX_DIMS; d++)
		t->ne[d] = d < n_dims ? ne[d] : 1;
	t->nbytes = nel / gpud_type_block_elems(type) * gpud_type_block_bytes(type);
	*out = t;
	return 0;
}

/* A tensor of nbytes of data: copied, or borrowed (the caller's). */
static int w_tensor_data(struct gpud_gguf_writer *w, const char *name, enum gpud_type type,
			 uint32_t n_dims, const uint64_t *ne, const void *data, size_t nbytes,
			 bool copy)
{
	struct wtensor *t;
	int rc = w_tensor_new(w, name, type, n_dims, ne, &t);
	if (rc)
		return rc;
	if (t->nbytes != nbytes || !data) {
		free(t->name);
		return -EINVAL;
	}
	if (copy) {
		t->data = malloc(nbytes);
		if (!t->data) {
			free(t->name);
			return -ENOMEM;
		}
		memcpy(t->data, data, nbytes);
	} else {
		t->data = (void *)data; /* written, never changed nor freed */
		t->borrowed = true;
	}
	w->n_t++;
	return 0;
}

int gpud_gguf_w_tensor(struct gpud_gguf_writer *w, const char *name, enum gpud_type type,
		       uint32_t n_dims, const uint64_t *ne, const void *data, size_t nbytes)
{
	return w_tensor_data(w, name, type, n_dims, ne, data, nbytes, true);
}

int gpud_gguf_w_tensor_ref(struct gpud_gguf_writer *w, const char *name, enum gpud_type type,
			   uint32_t n_dims, const uint64_t *ne, const void *data, size_t nbytes)
{
	return w_tensor_data(w, name, type, n_dims, ne, data, nbytes, false);
}

int gpud_gguf_w_tensor_fill(struct gpud_gguf_writer *w, const char *name, enum gpud_type type,
			    uint32_t n_dims, const uint64_t *ne, gpud_gguf_fill_fn fill, void *arg)
{
	struct wtensor *t;
	if (!fill)
		return -EINVAL;
	int rc = w_tensor_new(w, name, type, n_dims, ne, &t);
	if (rc)
		return rc;
	if (t->ne[0] > (1u << 28)) { /* one row is buffered as floats */
		free(t->name);
		return -EINVAL;
	}
	t->fill = fill;
	t->arg = arg;
	w->n_t++;
	return 0;
}

static uint64_t align_up(uint64_t x, uint32_t a)
{
	return (x + a - 1) / a * a;
}

/* Assigns tensor offsets; returns the header size and the file size. */
static void w_layout(struct gpud_gguf_writer *w, uint64_t *header, uint64_t *total)
{
	uint64_t h = GGUF_HEADER_BYTES;
	for (size_t i = 0; i < w->n_kv; i++)
		h += 8 + strlen(w->kv[i].key) + 4 + w->kv[i].len;
	for (size_t i = 0; i < w->n_t; i++)
		h += 8 + strlen(w->t[i].name) + 4 + 8ull * w->t[i].n_dims + 4 + 8;
	uint64_t off = 0;
	for (size_t i = 0; i < w->n_t; i++) {
		w->t[i].offset = off;
		off = align_up(off + w->t[i].nbytes, w->alignment);
	}
	*header = h;
	/* No padding after the last tensor; a file without tensors ends at
	 * its header (as vocab-only files do). */
	if (w->n_t == 0)
		*total = h;
	else
		*total = align_up(h, w->alignment) + w->t[w->n_t - 1].offset + w->t[w->n_t - 1].nbytes;
}

int gpud_gguf_w_size(struct gpud_gguf_writer *w, uint64_t *bytes)
{
	uint64_t h;
	if (!w)
		return -EINVAL;
	w_layout(w, &h, bytes);
	return 0;
}

static int w_put(FILE *f, const void *p, size_t n)
{
	if (n && fwrite(p, 1, n, f) != n)
		return errno ? -errno : -EIO;
	return 0;
}

static int w_zeros(FILE *f, uint64_t n)
{
	static const uint8_t z[256];
	while (n) {
		size_t k = n < sizeof(z) ? (size_t)n : sizeof(z);
		int rc = w_put(f, z, k);
		if (rc)
			return rc;
		n -= k;
	}
	return 0;
}

static int w_str(FILE *f, const char *s)
{
	uint64_t n = strlen(s);
	int rc = w_put(f, &n, 8);
	return rc ? rc : w_put(f, s, n);
}

/* One batch of a fill tensor's rows, [b0, b0 + n): each part's rows
 * filled and converted into out (rb bytes a row) through its own row of
 * floats; a part's first failing row and code kept. */
struct fill_batch {
	const struct wtensor *t;
	uint64_t b0;
	size_t rb;
	uint8_t *out;
	float *rows;
	int rc[GPUD_GGUF_W_MAX_THREADS];
	uint64_t bad_row[GPUD_GGUF_W_MAX_THREADS];
};

static void fill_part(void *arg, int part, uint64_t a, uint64_t e)
{
	struct fill_batch *fb = arg;
	const struct wtensor *t = fb->t;
	uint64_t cols = t->ne[0];

	for (uint64_t i = a; i < e; i++) {
		uint8_t *dst = fb->out + i * fb->rb;
		float *x = t->type == GPUD_TYPE_F32 ? (float *)dst : fb->rows + (size_t)part * cols;
		int rc = t->fill(t->arg, fb->b0 + i, x, cols);

		if (rc) {
			fb->rc[part] = rc;
			fb->bad_row[part] = fb->b0 + i;
			return;
		}
		if (t->type != GPUD_TYPE_F32)
			gpud_quantize_row(t->type, x, dst, (int64_t)cols);
	}
}

/* Streams a fill tensor: batches of rows (about W_FILL_BATCH bytes of
 * output, at least a row a thread) filled and converted by nt threads side
 * by side, each batch then written in row order: the same bytes whatever
 * nt. The buffers are one write's (w_fill_bufs), not one tensor's: a
 * model's worth of tensors never adds up in the allocator's caches. */
#define W_FILL_BATCH (8u << 20)

struct fill_bufs {
	uint8_t *out;   /* a batch of converted rows */
	float *rows;    /* nt rows of floats */
	int nt;
};

static uint64_t w_fill_batch(const struct wtensor *t, int nt)
{
	uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
	uint64_t b = W_FILL_BATCH / gpud_type_row_bytes(t->type, t->ne[0]);

	if (b < (uint64_t)nt)
		b = (uint64_t)nt;
	return b < rows ? b : rows;
}

/* Buffers for every fill tensor of w: the largest batch, nt rows of the
 * widest. Returns 0 or -ENOMEM. */
static int w_fill_bufs(const struct gpud_gguf_writer *w, struct fill_bufs *fb)
{
	uint64_t out = 0, cols = 0;

	fb->nt = w->threads;
	for (size_t i = 0; i < w->n_t; i++) {
		const struct wtensor *t = &w->t[i];
		uint64_t b;

		if (!t->fill)
			continue;
		b = w_fill_batch(t, fb->nt) * gpud_type_row_bytes(t->type, t->ne[0]);
		out = b > out ? b : out;
		cols = t->ne[0] > cols ? t->ne[0] : cols;
	}
	if (!out)
		return 0;
	fb->out = malloc(out);
	fb->rows = malloc((size_t)fb->nt * cols * sizeof(float));
	return fb->out && fb->rows ? 0 : -ENOMEM;
}

static int w_fill_rows(FILE *f, const struct wtensor *t, const struct fill_bufs *fb, char *err,
		       size_t errlen, const char *path)
{
	uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
	uint64_t batch = w_fill_batch(t, fb->nt);
	struct fill_batch b = { .t = t, .rb = gpud_type_row_bytes(t->type, t->ne[0]),
				.out = fb->out, .rows = fb->rows };
	int rc;

	for (b.b0 = 0; b.b0 < rows; b.b0 += batch) {
		uint64_t n = rows - b.b0 < batch ? rows - b.b0 : batch;

		sw_par_ranges(n, fb->nt, fill_part, &b);
		for (int k = 0; k < fb->nt; k++) { /* the first failing row */
			if (!b.rc[k])
				continue;
			rc = b.rc[k] < 0 ? b.rc[k] : -EIO;
			return sw_seterr(err, errlen, rc,
					 "%s: fill callback failed for '%s' row %" PRIu64 ": %s", path,
					 t->name, b.bad_row[k], sw_strerror(b.rc[k]));
		}
		rc = w_put(f, fb->out, n * b.rb);
		if (rc)
			return sw_seterr(err, errlen, rc, "%s: write: %s", path, strerror(-rc));
	}
	return 0;
}

static int w_contents(struct gpud_gguf_writer *w, FILE *f, const char *path,
		      char *err, size_t errlen)
{
	uint64_t header, total;
	uint32_t u32;
	uint64_t u64;
	int rc = 0;

	w_layout(w, &header, &total);
	u32 = GPUD_GGUF_MAGIC;
	rc = rc ? rc : w_put(f, &u32, 4);
	u32 = GPUD_GGUF_VERSION;
	rc = rc ? rc : w_put(f, &u32, 4);
	u64 = w->n_t;
	rc = rc ? rc : w_put(f, &u64, 8);
	u64 = w->n_kv;
	rc = rc ? rc : w_put(f, &u64, 8);
	for (size_t i = 0; i < w->n_kv && !rc; i++) {
		rc = w_str(f, w->kv[i].key);
		rc = rc ? rc : w_put(f, &w->kv[i].type, 4);
		rc = rc ? rc : w_put(f, w->kv[i].val, w->kv[i].len);
	}
	for (size_t i = 0; i < w->n_t && !rc; i++) {
		const struct wtensor *t = &w->t[i];
		uint32_t type = t->type;
		rc = w_str(f, t->name);
		rc = rc ? rc : w_put(f, &t->n_dims, 4);
		rc = rc ? rc : w_put(f, t->ne, 8ull * t->n_dims);
		rc = rc ? rc : w_put(f, &type, 4);
		rc = rc ? rc : w_put(f, &t->offset, 8);
	}
	if (rc)
		return sw_seterr(err, errlen, rc, "%s: write: %s", path, strerror(-rc));
	if (w->n_t == 0)
		return 0;

	uint64_t pos = align_up(header, w->alignment);
	if ((rc = w_zeros(f, pos - header)))
		return sw_seterr(err, errlen, rc, "%s: write: %s", path, strerror(-rc));
	struct fill_bufs fb = { 0 };
	if ((rc = w_fill_bufs(w, &fb))) {
		sw_seterr(err, errlen, rc, "%s: out of memory for a batch of rows", path);
		goto out;
	}
	pos = 0;
	for (size_t i = 0; i < w->n_t; i++) {
		const struct wtensor *t = &w->t[i];
		if ((rc = w_zeros(f, t->offset - pos))) {
			sw_seterr(err, errlen, rc, "%s: write: %s", path, strerror(-rc));
			goto out;
		}
		if (t->data)
			rc = w_put(f, t->data, t->nbytes);
		else
			rc = w_fill_rows(f, t, &fb, err, errlen, path);
		if (rc) {
			if (t->data)
				sw_seterr(err, errlen, rc, "%s: write: %s", path, strerror(-rc));
			goto out;
		}
		pos = t->offset + t->nbytes;
	}
out:
	free(fb.out);
	free(fb.rows);
	return rc;
}

int gpud_gguf_w_write(struct gpud_gguf_writer *w, const char *path, char *err, size_t errlen)
{
	char *tmp;
	FILE *f;
	int fd, rc;

	if (!w || !path)
		return sw_seterr(err, errlen, -EINVAL, "gguf writer: no writer or path");
	if (asprintf(&tmp, "%s.tmp.XXXXXX", path) < 0)
		return sw_seterr(err, errlen, -ENOMEM, "%s: out of memory", path);
	fd = mkstemp(tmp);
	if (fd < 0) {
		rc = sw_seterr(err, errlen, -errno, "%s: cannot create %s: %s", path, tmp,
			       strerror(errno));
		goto out_free;
	}
	if (fchmod(fd, 0644) < 0) {
		rc = sw_seterr(err, errlen, -errno, "%s: fchmod: %s", tmp, strerror(errno));
		close(fd);
		goto out_unlink;
	}
	f = fdopen(fd, "wb");
	if (!f) {
		rc = sw_seterr(err, errlen, -errno, "%s: fdopen: %s", tmp, strerror(errno));
		close(fd);
		goto out_unlink;
	}
	setvbuf(f, NULL, _IOFBF, 1 << 20);
	errno = 0;
	rc = w_contents(w, f, path, err, errlen);
	if (!rc && fflush(f) != 0)
		rc = sw_seterr(err, errlen, -errno, "%s: write: %s", tmp, strerror(errno));
	if (!rc && fsync(fileno(f)) != 0)
		rc = sw_seterr(err, errlen, -errno, "%s: fsync: %s", tmp, strerror(errno));
	if (fclose(f) != 0 && !rc)
		rc = sw_seterr(err, errlen, -errno, "%s: close: %s", tmp, strerror(errno));
	if (rc)
		goto out_unlink;
	if (rename(tmp, path) < 0) {
		rc = sw_seterr(err, errlen, -errno, "%s: rename from %s: %s", path, tmp,
			       strerror(errno));
		goto out_unlink;
	}
	free(tmp);
	return 0;

out_unlink:
	unlink(tmp);
out_free:
	free(tmp);
	return rc;
}
