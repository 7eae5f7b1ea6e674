// backend.cu - the CUDA backend's instance (cuda.h): the ops table, the
// device queries, init's reservations and the forward step.
//
// Memory (cuda.h, issue 12): init makes one cudaMalloc per pool (weights,
// KV, masks, scratch) and one cudaHostAlloc (staging),
// sized by gpud_cuda_layout_for (plan.c, the same figures the memory plan
// prints). Every allocating call goes through cnt_malloc/cnt_host_alloc,
// which count calls made after init into allocs_after_init. A step
// allocates nothing: its metadata is built in staging and copied once,
// masks go into device mask slots (an LRU, step.c) when first seen, and
// every matmul is a kernel of ours (no cuBLAS: its GEMMs allocated host
// memory on every call, kernels.cu's gemm_hp_kernel says where).
//
// Threads: an instance is driven by one host thread at a time (the
// engine's device worker); every entry point makes the instance's device
// current first. All work goes to the instance's one non-default stream;
// a step ends with one synchronization, where faults of its kernels show.
//
// Decode graphs: init captures one CUDA graph per decode batch size (1 ..
// gpud_cuda_graph_max_t tokens, each with its logits row): the step's
// kernels read everything step-specific (tokens, positions, block tables,
// mask slots) from the device metadata, so a graph captured once replays
// any decode step of its size. Other steps (prefill, mixed batches, hidden
// states) run the same enqueue() eagerly.
//
// Errors: every CUDA call is checked; a message names the
// device ("cuda:N"), the operation and the CUDA error string, and the code
// comes from gpud_cuda_errcode (-ENOMEM, -ENODEV, -EIO).
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/err.h"
#include "common/log.h"
#include "common/par.h"
#include "gpud/model.h"
#include "gpud/quant.h"
}
#include "gpud/backend/cuda/cuda.h"
#include "gpud/backend/cuda/cuda_impl.h"
#include "gpud/backend/cuda/kernels.cuh"

namespace {

// Module loading: CUDA 12+ loads a kernel's code onto the device on its
// first launch (lazy loading), which takes device memory while serving
// the first time a batch size picks a new kernel. Eager
// loading puts it all there when the context is created, so the memory
// used is flat from the first step. Read by the driver once, at its
// initialization: set before the process's first CUDA call (each entry
// point below may be the first); a value set by the user is kept.
void eager_modules(void)
{
	setenv("CUDA_MODULE_LOADING", "EAGER", 0);
}

struct dev_layer {
	const float *attn_norm, *ffn_norm;
	const float *bq, *bk, *bv; // Q/K/V biases (Qwen2), or NULL
	const float *q_norm, *k_norm; // per-head Q/K RMSNorm weights (Qwen3), or NULL
	gpud_cuda_mat wq, wk, wv, wo, gate, up, down;
};

// The kernel profile (GPUD_CUDA_PROFILE=1 at init; benchmarks only, never
// gpud serve): an event recorded before every launch of a step and one
// after its last, their intervals summed per (stage, op) once the step has
// synchronized. Steps then run eagerly (no graphs) and without
// programmatic dependent launch, so each interval is one kernel's time
// alone (with the launch gap before it): where a decode step's time goes,
// which the graph step's wall time (the benchmark) does not say.
constexpr uint32_t PROF_MARKS = 1024; // launches of one step (a 3B F16 prefill: ~850)
static_assert(GPUD_CUDA_PROF_ROWS >= 32, "a step's (stage, op) pairs");

//
// With GPUD_CUDA_PROFILE=graph instead, steps run as they do without a
// profile (graphs, and programmatic dependent launch when on), and
// gpud_cuda_stage_profile times a decode step's (stage, op) pairs each in a
// graph of its own: an enqueue() pass that launches nothing lists the
// pairs (PASS_LIST), then one pass per pair, captured, launches only it
// (PASS_ONE).
enum prof_pass { PASS_ALL, PASS_LIST, PASS_ONE };

struct prof {
	cudaEvent_t ev[PROF_MARKS + 1]; // a mark's, and the step's end after the last
	const char *stage[PROF_MARKS], *op[PROF_MARKS];
	uint32_t n;          // marks of the step in flight
	const char *cur;     // the stage enqueue() is in
	struct gpud_cuda_prof sum; // rows, steps, span
	bool graph;          // GPUD_CUDA_PROFILE=graph: no events between launches
	prof_pass pass;
	const char *one_stage, *one_op; // PASS_ONE's pair
	struct gpud_cuda_prof list;     // PASS_LIST's pairs, launches per step
};

struct cuda_ctx {
	struct gpud_backend_config cfg;
	const struct gpud_model_hparams *hp;
	struct gpud_cuda_layout L;
	int dev;
	bool ready; // init done: allocations from now on count
	cudaStream_t stream;

	uint8_t *wpool, *kvpool, *mpool, *spool, *staging;
	uint64_t wused; // weight pool carved so far
	int pack_threads; // requantizing upload's threads (gpud_cuda_pack_rows_par)

	gpud_cuda_mat tok_embd, output;
	dev_layer *layers; // (n_layers), host
	const float *out_norm, *rope_inv;

	float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *xl, *logits;
	uint64_t *amax;     // (NL, GPUD_CUDA_ARGMAX_PARTS) arg max keys (gpud_k_argmax)
	uint64_t *dscr;     // (NL, GPUD_CUDA_DRAW_SCRATCH) a draw's scratch (gpud_k_draw)
	float *attp;    // split-K attention partials
	unsigned *attc; // and their arrival counters (zero between steps)
	uint32_t n_sm;  // the device's multiprocessors: attention splits
	uint32_t att_per_sm; // decode attention CTAs a multiprocessor holds
	uint32_t n_tiles; // the eager step's attention tiles (gpud_cuda_meta_fill)
	gpud_cuda_ksplit ksplit; // split-K scratch of the int8 tensor-core matmul
	int8_t *actq, *actq2; // int8 activations; decode's down reads actq2,
	float *actd, *actd2;  // written by gate/up while they read actq
	void *acth_hi, *acth_lo; // F16/BF16 prefill: activations split in two
	float *ascale;           // (T) their per-token scales
	uint32_t *meta;
	gpud_cuda_meta dmeta;

	float *h_logits, *h_hidden;
	uint64_t *h_amax; // the keys, downloaded every step with logits rows
	int32_t *ids;     // (NL), host: each row's arg max (cuda_argmax)
	uint32_t *h_meta;
	uint8_t *h_mask;
	uint32_t *up_seq; // (max_seqs), host

	struct gpud_cuda_slot *slots; // (mask_slots), host
	uint64_t stamp;

	// Decode graphs: graph[T] runs enqueue(T, T logits, no hidden) in one
	// launch, for T = 1 .. gpud_cuda_graph_max_t (NULL where none).
	cudaGraphExec_t graph[GPUD_CUDA_GRAPH_MAX_T + 1];
	uint32_t n_graphs;
	bool pdl; // programmatic dependent launch on the stream (pdl_setup)
	uint32_t fuse_norm_t; // decode steps of up to this many tokens fuse norms (fuse_setup)
	uint64_t graph_steps;
	prof *pf; // or NULL: the kernel profile is off

	struct gpud_backend_stats st;
};

int cuerr(const cuda_ctx *c, cudaError_t e, const char *op, char *err, size_t errlen)
{
	return sw_seterr(err, errlen, gpud_cuda_errcode((int)e), "cuda:%d: %s: %s",
			 c->cfg.ordinal, op, cudaGetErrorString(e));
}

#define CK(call, op)                                            \
	do {                                                    \
		cudaError_t e_ = (call);                        \
		if (e_ != cudaSuccess)                          \
			return cuerr(c, e_, (op), err, errlen); \
	} while (0)

// A launch: marked for the profile first (prof_mark, which may skip it),
// then checked.
#define CKL(call, op)                                           \
	do {                                                    \
		if (prof_mark(c, (op)))                         \
			CK(call, op);                           \
	} while (0)

// A stage profile's pass over a launch (prof enum): whether to make it.
bool prof_pass_mark(prof *pf, const char *op)
{
	struct gpud_cuda_prof *l = &pf->list;
	uint32_t r = 0;

	if (pf->pass == PASS_ONE)
		return !strcmp(pf->cur, pf->one_stage) && !strcmp(op, pf->one_op);
	if (pf->pass == PASS_ALL)
		return true;
	while (r < l->n_rows && (strcmp(l->rows[r].op, op) || strcmp(l->rows[r].stage, pf->cur)))
		r++;
	if (r == l->n_rows) {
		if (r == GPUD_CUDA_PROF_ROWS) {
			l->dropped++;
			return false;
		}
		l->rows[r] = gpud_cuda_prof_row{ pf->cur, op, 0, 0.0 };
		l->n_rows++;
	}
	l->rows[r].launches++;
	return false;
}

// Whether to make the launch about to be made: always, but in a stage
// profile's passes. With the eager profile, an event goes before it; a
// failed record only costs the profile that mark (the launch goes on).
bool prof_mark(cuda_ctx *c, const char *op)
{
	prof *pf = c->pf;

	if (!pf)
		return true;
	if (pf->graph)
		return prof_pass_mark(pf, op);
	if (pf->n >= PROF_MARKS) {
		pf->sum.dropped++;
		return true;
	}
	if (cudaEventRecord(pf->ev[pf->n], c->stream) != cudaSuccess) {
		cudaGetLastError();
		pf->sum.dropped++;
		return true;
	}
	pf->stage[pf->n] = pf->cur;
	pf->op[pf->n] = op;
	pf->n++;
	return true;
}

// The stage the next launches belong to (a name that outlives the instance).
void prof_stage(cuda_ctx *c, const char *stage)
{
	if (c->pf)
		c->pf->cur = stage;
}

// After the step's synchronization: its intervals into the rows.
void prof_step_done(cuda_ctx *c)
{
	prof *pf = c->pf;
	struct gpud_cuda_prof *sum = pf ? &pf->sum : nullptr;
	float ms;

	if (!pf || !pf->n)
		return;
	for (uint32_t i = 0; i < pf->n; i++) {
		if (cudaEventElapsedTime(&ms, pf->ev[i], pf->ev[i + 1]) != cudaSuccess) {
			cudaGetLastError();
			sum->dropped++;
			continue;
		}
		// (stage, op) are string literals: their addresses name them
		uint32_t r = 0;
		while (r < sum->n_rows && !(sum->rows[r].op == pf->op[i] &&
					    sum->rows[r].stage == pf->stage[i]))
			r++;
		if (r == sum->n_rows) {
			if (r == GPUD_CUDA_PROF_ROWS) {
				sum->dropped++;
				continue;
			}
			sum->rows[r] = gpud_cuda_prof_row{ pf->stage[i], pf->op[i], 0, 0.0 };
			sum->n_rows++;
		}
		sum->rows[r].launches++;
		sum->rows[r].ms += ms;
	}
	if (cudaEventElapsedTime(&ms, pf->ev[0], pf->ev[pf->n]) == cudaSuccess)
		sum->span_ms += ms;
	cudaGetLastError();
	sum->steps++;
	pf->n = 0;
}

// The counting wrappers: every allocating CUDA call of the backend.
cudaError_t cnt_malloc(cuda_ctx *c, uint8_t **p, size_t n)
{
	if (c->ready)
		c->st.allocs_after_init++;
	return cudaMalloc((void **)p, n);
}

cudaError_t cnt_host_alloc(cuda_ctx *c, uint8_t **p, size_t n)
{
	if (c->ready)
		c->st.allocs_after_init++;
	return cudaHostAlloc((void **)p, n, cudaHostAllocDefault);
}

int reserve(cuda_ctx *c, uint8_t **p, uint64_t n, const char *what, char *err, size_t errlen)
{
	cudaError_t e = cnt_malloc(c, p, n ? n : GPUD_CUDA_ALIGN);

	if (e != cudaSuccess) {
		*p = nullptr;
		return sw_seterr(err, errlen, gpud_cuda_errcode((int)e),
				 "cuda:%d: cudaMalloc of the %s pool (%llu bytes, %.1f MiB): %s",
				 c->cfg.ordinal, what, (unsigned long long)n, (double)n / (1 << 20),
				 cudaGetErrorString(e));
	}
	return 0;
}

/* --- weight upload --------------------------------------------------------- */

// Copies n bytes from host src to device dst through the staging buffer.
int upload(cuda_ctx *c, uint8_t *dst, const void *src, uint64_t n, char *err, size_t errlen)
{
	const uint8_t *s = (const uint8_t *)src;

	for (uint64_t off = 0; off < n;) {
		uint64_t k = n - off < c->L.staging_bytes ? n - off : c->L.staging_bytes;
		memcpy(c->staging, s + off, k);
		CK(cudaMemcpyAsync(dst + off, c->staging, k, cudaMemcpyHostToDevice, c->stream),
		   "weight upload");
		CK(cudaStreamSynchronize(c->stream), "weight upload");
		off += k;
	}
	return 0;
}

// The next n bytes of the weight pool, or NULL past its end (the plan and
// the upload add up the same tensors: a bug, refused before any write).
uint8_t *carve_w(cuda_ctx *c, uint64_t n)
{
	uint8_t *p = c->wpool + c->wused;
	uint64_t a = (n + GPUD_CUDA_ALIGN - 1) / GPUD_CUDA_ALIGN * GPUD_CUDA_ALIGN;

	if (c->wused + a > c->L.weights_bytes)
		return nullptr;
	c->wused += a;
	return p;
}

int overrun(cuda_ctx *c, char *err, size_t errlen)
{
	return sw_seterr(err, errlen, -EINVAL,
			 "cuda:%d: the weights do not fit the pool their plan sized (%llu bytes)",
			 c->dev, (unsigned long long)c->L.weights_bytes);
}

int upload_vec(cuda_ctx *c, const float *src, uint64_t n, const float **out, char *err,
	       size_t errlen)
{
	uint8_t *d = carve_w(c, n * 4);

	if (!d)
		return overrun(c, err, errlen);
	*out = (const float *)d;
	return upload(c, d, src, n * 4, err, errlen);
}

// A matrix in the device layout (cuda_impl.h): float types as they are,
// Q8_0/Q4_0 split into quants and scales, repacked in staging by rows; the
// types without kernels here (K-quants, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS)
// requantized to Q8_0 row by row on the way (gpud_cuda_dev_type): decoded
// as the CPU decodes them, quantized as mkmodel quantizes Q8_0. A weight's
// added error is at most half a Q8_0 step (its 32-block's largest
// magnitude / 254), a fraction of the file type's own step; the device
// then holds 8.5 bits a weight where the file has 2.6 to 6.6.
int upload_mat(cuda_ctx *c, const struct gpud_weight *w, gpud_cuda_mat *m, char *err,
	       size_t errlen)
{
	enum gpud_type ft = (enum gpud_type)w->type, dt = gpud_cuda_dev_type(ft);
	uint64_t qb = gpud_cuda_quants_bytes(ft, w->rows, w->cols);
	uint8_t *base;

	if (dt == GPUD_TYPE_COUNT) // plan.c refused it already; never reached
		return sw_seterr(err, errlen, SW_EUNSUPPORTED,
				 "cuda:%d: weight type %s cannot be held by the CUDA backend; run "
				 "this model on \"cpu\"", c->dev, gpud_type_name(ft));
	base = carve_w(c, gpud_cuda_tensor_bytes(ft, w->rows, w->cols));
	if (!base)
		return overrun(c, err, errlen);
	*m = gpud_cuda_mat{ (int)dt, w->rows, w->cols, base, nullptr };
	if (dt != GPUD_TYPE_Q8_0 && dt != GPUD_TYPE_Q4_0)
		return upload(c, base, w->data, gpud_type_row_bytes(ft, (uint64_t)w->cols) *
					       (uint64_t)w->rows, err, errlen);

	// staging: [f32 row, its Q8_0 blocks] when requantizing, then the
	// chunk's quants and scales
	uint64_t nb = (uint64_t)w->cols / GPUD_QK, qrow = dt == GPUD_TYPE_Q8_0 ? 32 : 16;
	uint64_t rowq = nb * qrow, rowd = nb * 2, tmp1 = gpud_cuda_pack_tmp_bytes(w);
	int nt = tmp1 ? c->pack_threads : 1;
	uint64_t tmp = tmp1 * (uint64_t)nt;
	uint64_t chunk = c->L.staging_bytes > tmp ? (c->L.staging_bytes - tmp) / (rowq + rowd) : 0;
	uint8_t *scales = base + qb;

	m->d = scales;
	if (!chunk)
		return sw_seterr(err, errlen, -EINVAL, "cuda:%d: staging too small for a row",
				 c->cfg.ordinal);
	for (uint64_t r0 = 0; r0 < (uint64_t)w->rows; r0 += chunk) {
		uint64_t n = (uint64_t)w->rows - r0 < chunk ? (uint64_t)w->rows - r0 : chunk;
		uint8_t *hq = c->staging + tmp, *hd = hq + n * rowq;

		gpud_cuda_pack_rows_par(w, r0, n, hq, hd, c->staging, nt);
		CK(cudaMemcpyAsync(base + r0 * rowq, hq, n * rowq, cudaMemcpyHostToDevice, c->stream),
		   "weight upload");
		CK(cudaMemcpyAsync(scales + r0 * rowd, hd, n * rowd, cudaMemcpyHostToDevice,
				   c->stream), "weight upload");
		CK(cudaStreamSynchronize(c->stream), "weight upload");
	}
	return 0;
}

int upload_model(cuda_ctx *c, char *err, size_t errlen)
{
	const struct gpud_model_weights *w = gpud_model_weights(c->cfg.model);
	const struct gpud_model_hparams *hp = c->hp;
	int rc;

	// The order of plan.c's weights_bytes (the sum must match).
	rc = upload_mat(c, &w->tok_embd, &c->tok_embd, err, errlen);
	if (rc)
		return rc;
	if (w->output.data != w->tok_embd.data) {
		rc = upload_mat(c, &w->output, &c->output, err, errlen);
		if (rc)
			return rc;
	} else {
		c->output = c->tok_embd;
	}
	for (uint32_t i = 0; i < hp->n_layers; i++) {
		const struct gpud_layer_weights *L = &w->layers[i];
		dev_layer *D = &c->layers[i];

		if ((rc = upload_mat(c, &L->wq, &D->wq, err, errlen)) ||
		    (rc = upload_mat(c, &L->wk, &D->wk, err, errlen)) ||
		    (rc = upload_mat(c, &L->wv, &D->wv, err, errlen)) ||
		    (rc = upload_mat(c, &L->wo, &D->wo, err, errlen)) ||
		    (rc = upload_mat(c, &L->w_gate, &D->gate, err, errlen)) ||
		    (rc = upload_mat(c, &L->w_up, &D->up, err, errlen)) ||
		    (rc = upload_mat(c, &L->w_down, &D->down, err, errlen)) ||
		    (rc = upload_vec(c, L->attn_norm, hp->dim, &D->attn_norm, err, errlen)) ||
		    (rc = upload_vec(c, L->ffn_norm, hp->dim, &D->ffn_norm, err, errlen)))
			return rc;
		if (L->bq && ((rc = upload_vec(c, L->bq, (uint64_t)hp->n_heads * hp->head_dim, &D->bq,
					       err, errlen)) ||
			      (rc = upload_vec(c, L->bk, (uint64_t)hp->n_kv_heads * hp->head_dim,
					       &D->bk, err, errlen)) ||
			      (rc = upload_vec(c, L->bv, (uint64_t)hp->n_kv_heads * hp->head_dim,
					       &D->bv, err, errlen))))
			return rc;
		if (L->q_norm &&
		    ((rc = upload_vec(c, L->q_norm, hp->head_dim, &D->q_norm, err, errlen)) ||
		     (rc = upload_vec(c, L->k_norm, hp->head_dim, &D->k_norm, err, errlen))))
			return rc;
	}
	if ((rc = upload_vec(c, w->out_norm, hp->dim, &c->out_norm, err, errlen)) ||
	    (rc = upload_vec(c, w->rope_inv_freq, hp->head_dim / 2, &c->rope_inv, err, errlen)))
		return rc;
	return 0;
}

/* --- lifetime -------------------------------------------------------------- */

void cuda_destroy(void *ctx)
{
	cuda_ctx *c = (cuda_ctx *)ctx;

	if (!c)
		return;
	if (cudaSetDevice(c->dev) == cudaSuccess) {
		if (c->stream)
			cudaStreamSynchronize(c->stream);
		for (uint32_t t = 0; t <= GPUD_CUDA_GRAPH_MAX_T; t++)
			if (c->graph[t])
				cudaGraphExecDestroy(c->graph[t]);
		if (c->stream) {
			gpud_k_pdl(c->stream, false); // the handle may come back for another
			cudaStreamDestroy(c->stream);
		}
		cudaFree(c->wpool);
		cudaFree(c->kvpool);
		cudaFree(c->mpool);
		cudaFree(c->spool);
		if (c->staging)
			cudaFreeHost(c->staging);
		for (uint32_t i = 0; c->pf && i <= PROF_MARKS && c->pf->ev[i]; i++)
			cudaEventDestroy(c->pf->ev[i]);
	}
	free(c->pf);
	free(c->layers);
	free(c->slots);
	free(c->up_seq);
	free(c->ids);
	free(c);
}

int enqueue(cuda_ctx *c, uint32_t T, uint32_t n_logits, bool want_hidden, char *err,
	    size_t errlen);
int mm(cuda_ctx *c, const gpud_cuda_mat *w, const float *x, uint32_t T, float *y, char *err,
       size_t errlen);

// Up to this many tokens float-type weights take the GEMV (gpud_k_mv_f),
// as the int8 ones do (gpud_k_mm_q): one bound for both.
#define MV_MAX_T GPUD_K_GEMV_MAX_T
static_assert(MV_MAX_T == GPUD_CUDA_GEMV_MAX_T, "plan.c sizes actq2 for the GEMVs' tokens");

// Programmatic dependent launch (kernels.cu) on the instance's stream, so
// that each kernel is resident when the one before it ends: with
// GPUD_CUDA_PDL=1, on a device that has it (sm_90 and later), and only once
// a probe has passed. Off by default: on an H200 (2026-12-04, two runs) it
// made a 3B Q8_0 batch-1 decode step 4% slower (2.724 against 2.617 ms),
// each kernel letting the next launch at its start, before its own wait, so
// that a chain of grids could take SM slots to wait in (each now lets the
// next launch after its wait: unmeasured). The probe: two kernels, the
// second launched behind the first and reading what it wrote, eagerly and
// then replayed from a graph. A device or driver that refuses it runs
// without it, and a warning says why.
void pdl_setup(cuda_ctx *c, int major)
{
	const char *env = getenv("GPUD_CUDA_PDL");
	int *p = (int *)c->logits; // step scratch: every step rewrites it
	volatile int *h = (volatile int *)c->h_logits;
	const char *what = "eager";
	cudaGraph_t g = nullptr;
	cudaGraphExec_t ex = nullptr;
	cudaError_t e;

	if (env && strcmp(env, "0") && strcmp(env, "1"))
		log_warn("cuda:%d: GPUD_CUDA_PDL=%s is neither 0 nor 1: 0", c->dev, env);
	if (major < 9 || !env || strcmp(env, "1"))
		return;
	e = gpud_k_pdl(c->stream, true);
	for (int round = 0; round < 2 && e == cudaSuccess; round++) {
		h[0] = h[1] = 0;
		if (round == 0) {
			e = gpud_k_pdl_probe(c->stream, p);
		} else {
			what = "graph";
			e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
			if (e == cudaSuccess) {
				cudaError_t ep = gpud_k_pdl_probe(c->stream, p);
				e = cudaStreamEndCapture(c->stream, &g);
				if (ep != cudaSuccess)
					e = ep;
			}
			if (e == cudaSuccess)
				e = cudaGraphInstantiate(&ex, g, 0);
			if (e == cudaSuccess)
				e = cudaGraphLaunch(ex, c->stream);
		}
		if (e == cudaSuccess)
			e = cudaMemcpyAsync((void *)h, p, 2 * sizeof(int), cudaMemcpyDeviceToHost,
					    c->stream);
		if (e == cudaSuccess)
			e = cudaStreamSynchronize(c->stream);
		if (e == cudaSuccess && (h[0] != 0x5eed || h[1] != 0x5eed)) {
			log_warn("cuda:%d: programmatic dependent launch off: the %s probe read "
				 "%#x where 0x5eed was written", c->dev, what, (unsigned)h[1]);
			e = cudaErrorUnknown;
			what = nullptr; // said
		}
	}
	if (ex)
		cudaGraphExecDestroy(ex);
	if (g)
		cudaGraphDestroy(g);
	if (e == cudaSuccess) {
		c->pdl = true;
		return;
	}
	gpud_k_pdl(c->stream, false);
	cudaGetLastError(); // a refused launch leaves no error behind
	if (what)
		log_warn("cuda:%d: programmatic dependent launch off: the %s probe: %s", c->dev,
			 what, cudaGetErrorString(e));
}

// The int8 tensor-core matmul (kernels.cu): the pipelined kernel wherever
// a matrix's columns allow it, or with GPUD_CUDA_MM=single the
// single-buffered one everywhere (to compare them on a GPU; the benchmark
// of tests/gpu/run does). Process-wide, as the kernels' choice is; set
// before any capture, since a graph keeps the kernels and grids it saw.
void mm_setup(cuda_ctx *c)
{
	const char *env = getenv("GPUD_CUDA_MM");

	if (env && strcmp(env, "single") && strcmp(env, "pipe"))
		log_warn("cuda:%d: GPUD_CUDA_MM=%s is neither \"pipe\" nor \"single\": pipe",
			 c->dev, env);
	gpud_k_mm_single(env && !strcmp(env, "single"));
}

// Decode steps of up to GPUD_CUDA_FUSE_NORM tokens (0 to
// GPUD_K_NORM_MAX_T; FUSE_NORM_T by default) make each RMSNorm inside the
// GEMV that reads it (gpud_k_norm_fuses, enqueue): two launches a layer
// fewer, each CTA of the GEMV reading the T rows of x from L2 to norm them
// itself, which is why larger batches keep the norm's own launch. The
// same bits either way; the variable is for comparing them (tests/gpu/
// run's bench). Set before the graphs are captured: they keep the
// launches they saw. Batch 1 only by default: on an H100 (2026-12-06, the
// 3B model) fusing made a batch-1 step 7% faster in Q8_0 (2.298 against
// 2.462 ms) and 3% in F16, a batch-2 step 4% slower in Q8_0 (2.580
// against 2.490 ms) and 2% in F16.
#define FUSE_NORM_T 1u
static_assert(FUSE_NORM_T <= GPUD_K_NORM_MAX_T, "a batch the fused kernels take");

void fuse_setup(cuda_ctx *c)
{
	const char *env = getenv("GPUD_CUDA_FUSE_NORM");
	char *end = nullptr;
	unsigned long v = env ? strtoul(env, &end, 10) : FUSE_NORM_T;

	if (env && (end == env || *end || v > GPUD_K_NORM_MAX_T)) {
		log_warn("cuda:%d: GPUD_CUDA_FUSE_NORM=%s is not a number of tokens from 0 "
			 "to %u: %u", c->dev, env, GPUD_K_NORM_MAX_T, FUSE_NORM_T);
		v = FUSE_NORM_T;
	}
	c->fuse_norm_t = (uint32_t)v;
}

// Captures the decode graphs (T tokens, T logits rows, no hidden states)
// for T = 1 .. gpud_cuda_graph_max_t: each instantiated and uploaded here,
// so that a replay allocates nothing. Graphs are a speed-up only: a
// capture that fails leaves that size and the larger ones to the eager
// path, with the first failure kept in why. GPUD_CUDA_GRAPHS=0 turns
// them off (every step eager).
void capture_graphs(cuda_ctx *c, char *why, size_t whylen)
{
	uint32_t max_t = gpud_cuda_graph_max_t(&c->L);
	const char *env = getenv("GPUD_CUDA_GRAPHS");

	if (env && !strcmp(env, "0"))
		return;
	for (uint32_t T = 1; T <= max_t; T++) {
		cudaGraph_t g = nullptr;
		cudaGraphExec_t ex = nullptr;
		cudaError_t e;
		int rc;

		e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
		if (e != cudaSuccess) {
			cuerr(c, e, "cudaStreamBeginCapture", why, whylen);
			break;
		}
		rc = enqueue(c, T, T, false, why, whylen);
		e = cudaStreamEndCapture(c->stream, &g);
		if (!rc && e != cudaSuccess)
			cuerr(c, e, "cudaStreamEndCapture", why, whylen);
		if (rc || e != cudaSuccess || !g) {
			if (g)
				cudaGraphDestroy(g);
			break;
		}
		e = cudaGraphInstantiate(&ex, g, 0);
		cudaGraphDestroy(g);
		if (e == cudaSuccess)
			e = cudaGraphUpload(ex, c->stream);
		if (e != cudaSuccess) {
			cuerr(c, e, "cudaGraphInstantiate", why, whylen);
			if (ex)
				cudaGraphExecDestroy(ex);
			break;
		}
		c->graph[T] = ex;
		c->n_graphs++;
	}
	cudaGetLastError(); // a failed capture leaves no error behind
}

// The kernel profile, when GPUD_CUDA_PROFILE=1 (or graph: the stage
// profile, two events): its events, made here (events are not device
// memory: the pools stay as planned).
int prof_setup(cuda_ctx *c, char *err, size_t errlen)
{
	const char *env = getenv("GPUD_CUDA_PROFILE");
	bool graph = env && !strcmp(env, "graph");

	if (!env || (strcmp(env, "1") != 0 && !graph))
		return 0;
	c->pf = (prof *)calloc(1, sizeof(*c->pf));
	if (!c->pf)
		return sw_seterr(err, errlen, -ENOMEM, "cuda backend: out of memory");
	c->pf->graph = graph;
	for (uint32_t i = 0; i <= (graph ? 1 : PROF_MARKS); i++)
		CK(cudaEventCreate(&c->pf->ev[i]), "cudaEventCreate (profile)");
	c->pf->cur = "";
	if (graph)
		log_info("cuda:%d: stage profile on (GPUD_CUDA_PROFILE=graph): steps as usual, "
			 "gpud_cuda_stage_profile captures graphs when called", c->dev);
	else
		log_info("cuda:%d: kernel profile on (GPUD_CUDA_PROFILE=1): steps run eagerly, "
			 "without programmatic dependent launch", c->dev);
	return 0;
}

int setup(cuda_ctx *c, char *err, size_t errlen)
{
	const struct gpud_cuda_layout *L = &c->L;
	int n = 0, rc;

	eager_modules();
	if (cudaGetDeviceCount(&n) != cudaSuccess)
		n = 0;
	if (c->dev < 0 || c->dev >= n)
		return sw_seterr(err, errlen, -ENODEV, "cuda:%d: no such device (%d visible)",
				 c->dev, n);
	CK(cudaSetDevice(c->dev), "cudaSetDevice");
	CK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate");
	int major;
	{
		cudaDeviceProp p;

		CK(cudaGetDeviceProperties(&p, c->dev), "cudaGetDeviceProperties");
		c->n_sm = p.multiProcessorCount > 0 ? (uint32_t)p.multiProcessorCount : 1;
		major = p.major;
	}
	// how many CTAs of each tensor-core matmul a multiprocessor holds: the
	// split-K grids fill one wave of them (an RTX 4090 holds fewer than an
	// H100: 100 KB of shared memory a multiprocessor, not 228)
	uint32_t per_sm[3];
	CK(gpud_k_mm_occupancy(per_sm), "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
	CK(gpud_k_attention_occupancy(c->hp->head_dim, L->kv_esz == 2, L->att_heads,
				      &c->att_per_sm),
	   "cudaOccupancyMaxActiveBlocksPerMultiprocessor (attention)");
	if ((rc = reserve(c, &c->wpool, L->weights_bytes, "weights", err, errlen)) ||
	    (rc = reserve(c, &c->kvpool, L->kv_bytes, "KV", err, errlen)) ||
	    (rc = reserve(c, &c->mpool, L->masks_bytes, "mask", err, errlen)) ||
	    (rc = reserve(c, &c->spool, L->scratch_bytes, "scratch", err, errlen)))
		return rc;
	{
		cudaError_t e = cnt_host_alloc(c, &c->staging, L->staging_bytes);
		if (e != cudaSuccess) {
			c->staging = nullptr;
			return sw_seterr(err, errlen, gpud_cuda_errcode((int)e),
					 "cuda:%d: cudaHostAlloc of %llu bytes of staging: %s",
					 c->dev, (unsigned long long)L->staging_bytes,
					 cudaGetErrorString(e));
		}
	}
	// KV blocks not yet written are never read; zero them anyway so that
	// a bug shows as zeros, not as another request's data.
	CK(cudaMemsetAsync(c->kvpool, 0, L->kv_bytes, c->stream), "KV clear");
	CK(cudaMemsetAsync(c->spool, 0, L->scratch_bytes, c->stream), "scratch clear");

	uint8_t *s = c->spool;
	c->x = (float *)(s + L->x);
	c->xb = (float *)(s + L->xb);
	c->q = (float *)(s + L->q);
	c->k = (float *)(s + L->k);
	c->v = (float *)(s + L->v);
	c->att = (float *)(s + L->att);
	c->attp = (float *)(s + L->attp);
	c->attc = (unsigned *)(s + L->attc);
	c->hb = (float *)(s + L->hb);
	c->hb2 = (float *)(s + L->hb2);
	c->xl = (float *)(s + L->xl);
	c->logits = (float *)(s + L->logits);
	c->amax = (uint64_t *)(s + L->amax);
	c->dscr = (uint64_t *)(s + L->dscr);
	c->actq = (int8_t *)(s + L->actq);
	c->actd = (float *)(s + L->actd);
	c->actq2 = (int8_t *)(s + L->actq2);
	c->actd2 = (float *)(s + L->actd2);
	c->ksplit = gpud_cuda_ksplit{ (float *)(s + L->mmp), L->mmp_floats, (unsigned *)(s + L->mmc),
				      L->mmc_words, c->n_sm, { per_sm[0], per_sm[1], per_sm[2] } };
	c->acth_hi = s + L->acth;
	c->acth_lo = s + L->actl;
	c->ascale = (float *)(s + L->ascale);
	c->meta = (uint32_t *)(s + L->meta);
	c->dmeta = gpud_cuda_meta{ (const int32_t *)(c->meta + L->m_tokens), c->meta + L->m_pos,
				   c->meta + L->m_seq, c->meta + L->m_logit,
				   c->meta + L->m_seqinfo, c->meta + L->m_btab };

	{
		// one a CPU, at most GPUD_CUDA_PACK_THREADS; the variable of that
		// name to choose (the tests compare 1 with 8: the bits)
		const char *e = getenv("GPUD_CUDA_PACK_THREADS");
		long n = e && *e ? strtol(e, nullptr, 10) : sw_par_cpus(GPUD_CUDA_PACK_THREADS);

		c->pack_threads = n < 1 ? 1 : n > GPUD_CUDA_PACK_THREADS ? GPUD_CUDA_PACK_THREADS : (int)n;
	}
	rc = upload_model(c, err, errlen);
	if (rc)
		return rc;
	if (L->weights_q8_bytes)
		log_info("cuda:%d: %.1f MiB of the model's weights held as Q8_0 (the CUDA backend "
			 "has no kernels for their file types; decoded and requantized at load)",
			 c->dev, L->weights_q8_bytes / 1048576.0);
	c->h_logits = (float *)(c->staging + L->st_logits);
	c->h_amax = (uint64_t *)(c->staging + L->st_amax);
	c->h_hidden = (float *)(c->staging + L->st_hidden);
	c->h_meta = (uint32_t *)(c->staging + L->st_meta);
	c->h_mask = c->staging + L->st_mask;
	CK(cudaStreamSynchronize(c->stream), "init");
	if ((rc = prof_setup(c, err, errlen)))
		return rc;
	mm_setup(c);
	fuse_setup(c);
	if (!c->pf || c->pf->graph) {
		char why[SW_ERR_MAX] = "";
		uint32_t want = gpud_cuda_graph_max_t(L);

		pdl_setup(c, major);
		capture_graphs(c, why, sizeof(why));
		if (c->n_graphs < want && why[0])
			log_warn("cuda:%d: decode graphs for %u of %u batch sizes (the others "
				 "run eagerly): %s", c->dev, c->n_graphs, want, why);
	}
	CK(cudaStreamSynchronize(c->stream), "graph capture");
	log_info("cuda:%d: pools (MiB): weights %.1f, kv %.1f (%s), masks %.1f (%u slots), "
		 "scratch %.1f, pinned staging %.1f; %u decode graphs; "
		 "programmatic dependent launch %s; int8 matmul %s; norms fused up to %u tokens; "
		 "CTAs a multiprocessor (of %u): int8 matmul %u, single-buffered %u, F16 %u, "
		 "decode attention %u",
		 c->dev,
		 L->weights_bytes / 1048576.0, L->kv_bytes / 1048576.0, L->kv_esz == 2 ? "f16" : "f32",
		 L->masks_bytes / 1048576.0, L->mask_slots, L->scratch_bytes / 1048576.0,
		 L->staging_bytes / 1048576.0, c->n_graphs,
		 c->pdl ? "on" : "off", gpud_k_mm_pipelined(64) ? "pipelined" : "single-buffered",
		 c->fuse_norm_t, c->n_sm, c->ksplit.per_sm[GPUD_CUDA_MM_PIPE],
		 c->ksplit.per_sm[GPUD_CUDA_MM_SINGLE], c->ksplit.per_sm[GPUD_CUDA_MM_HALF],
		 c->att_per_sm);
	return 0;
}

int cuda_init(void **out, const struct gpud_backend_config *cfg, char *err, size_t errlen)
{
	cuda_ctx *c;
	int rc;

	*out = nullptr;
	c = (cuda_ctx *)calloc(1, sizeof(*c));
	if (!c)
		return sw_seterr(err, errlen, -ENOMEM, "cuda backend: out of memory");
	c->cfg = *cfg;
	c->dev = cfg->ordinal;
	// the model and cfg on this backend (qwen2, K-quants, head sizes: the
	// reasons gpud serve --check gives too)
	{
		char why[SW_ERR_MAX];

		rc = gpud_cuda_layout_for(cfg, &c->L, why, sizeof(why));
		if (rc) {
			free(c);
			return sw_seterr(err, errlen, rc, "cuda:%d: %s", cfg->ordinal, why);
		}
	}
	c->cfg.max_logits = c->L.NL;
	c->hp = gpud_model_hparams(cfg->model);
	c->layers = (dev_layer *)calloc(c->hp->n_layers ? c->hp->n_layers : 1, sizeof(dev_layer));
	c->slots = (struct gpud_cuda_slot *)calloc(c->L.mask_slots, sizeof(*c->slots));
	c->up_seq = (uint32_t *)calloc(c->L.S, sizeof(uint32_t));
	c->ids = (int32_t *)calloc(c->L.NL, sizeof(int32_t));
	if (!c->layers || !c->slots || !c->up_seq || !c->ids) {
		cuda_destroy(c);
		return sw_seterr(err, errlen, -ENOMEM, "cuda backend: out of memory");
	}
	rc = setup(c, err, errlen);
	if (rc) {
		cuda_destroy(c);
		return rc;
	}
	c->st.kv_bytes = c->L.kv_bytes;
	c->st.scratch_bytes = c->L.scratch_bytes;
	c->st.scratch_high = c->L.scratch_bytes; // carved once: the step uses all of it
	c->ready = true;
	*out = c;
	return 0;
}

uint64_t cuda_scratch_bytes(const struct gpud_backend_config *cfg)
{
	struct gpud_cuda_plan p;

	gpud_cuda_plan_for(cfg, &p);
	return p.scratch;
}

/* --- the step -------------------------------------------------------------- */

// y (T, rows) = W x (T, cols), activations already prepared for W's type
// (prep: quantized for Q8_0/Q4_0, split for F16/BF16 prefill on the tensor
// cores; the others read x as it is).
int mm(cuda_ctx *c, const gpud_cuda_mat *w, const float *x, uint32_t T, float *y, char *err,
       size_t errlen)
{
	switch (w->type) {
	case GPUD_TYPE_Q8_0:
	case GPUD_TYPE_Q4_0:
		CKL(gpud_k_mm_q(c->stream, w, c->actq, c->actd, T, y, &c->ksplit), "matmul (int8)");
		return 0;
	case GPUD_TYPE_F32:
	case GPUD_TYPE_F16:
	case GPUD_TYPE_BF16:
		if (T <= MV_MAX_T)
			CKL(gpud_k_mv_f(c->stream, w, x, T, y), "matmul (gemv)");
		else if (gpud_k_mm_h_fits(w))
			CKL(gpud_k_mm_h_set(c->stream, &w, &y, 1, c->acth_hi, c->acth_lo, c->ascale, T,
					    &c->ksplit),
			    "matmul (half)");
		else
			CKL(gpud_k_mm_f(c->stream, w, x, T, y), "matmul (fp32)");
		return 0;
	default:
		return sw_seterr(err, errlen, SW_EUNSUPPORTED, "cuda:%d: matmul of type %s",
				 c->dev, gpud_type_name((enum gpud_type)w->type));
	}
}

// Prepares activations x (T, cols) for matrices of w's type.
int prep(cuda_ctx *c, const gpud_cuda_mat *w, const float *x, uint32_t T, char *err,
	 size_t errlen)
{
	switch (w->type) {
	case GPUD_TYPE_Q8_0:
	case GPUD_TYPE_Q4_0:
		CKL(gpud_k_quantize_act(c->stream, x, T, (uint32_t)w->cols, c->actq, c->actd),
		    "quantize activations");
		break;
	case GPUD_TYPE_F16:
	case GPUD_TYPE_BF16:
		if (T > MV_MAX_T && gpud_k_mm_h_fits(w))
			CKL(gpud_k_split_act(c->stream, x, T, (uint32_t)w->cols, w->type, c->acth_hi,
					     c->acth_lo, c->ascale), "split activations");
		break;
	default:
		break;
	}
	return 0;
}

static bool is_int8(const gpud_cuda_mat *w)
{
	return w->type == GPUD_TYPE_Q8_0 || w->type == GPUD_TYPE_Q4_0;
}

// Whether ws[0..n) are matrices of one type and width whose decode GEMVs
// run as one launch (gpud_k_mv_group).
static bool one_gemv(const gpud_cuda_mat *const *ws, int n, uint32_t T)
{
	if (T > MV_MAX_T)
		return false;
	switch (ws[0]->type) {
	case GPUD_TYPE_F32:
	case GPUD_TYPE_F16:
	case GPUD_TYPE_BF16:
	case GPUD_TYPE_Q8_0:
	case GPUD_TYPE_Q4_0:
		break;
	default:
		return false;
	}
	for (int i = 1; i < n; i++)
		if (ws[i]->type != ws[0]->type || ws[i]->cols != ws[0]->cols)
			return false;
	return true;
}

// Matrices ws[0..n) over the same input x: its preparation is shared by
// consecutive matrices of the same type, and is already done for ws[0]
// when prepared (add_norm quantized x); decode GEMVs of one type run as
// one launch.
int mm_group(cuda_ctx *c, const gpud_cuda_mat *const *ws, float *const *ys, int n, const float *x,
	     uint32_t T, bool prepared, char *err, size_t errlen)
{
	int rc;

	if (one_gemv(ws, n, T)) {
		if (!prepared && (rc = prep(c, ws[0], x, T, err, errlen)))
			return rc;
		CKL(gpud_k_mv_group(c->stream, ws, ys, n, false, x, c->actq, c->actd, T, nullptr,
				    nullptr),
		    "matmul (gemv)");
		return 0;
	}
	bool i8 = is_int8(ws[0]), half = T > MV_MAX_T && gpud_k_mm_h_fits(ws[0]);
	if (n > 1 && (i8 || half)) {
		// matrices of one width for a tensor-core kernel (int8: Q8_0 and
		// Q4_0 alike; F16/BF16: one type): one preparation (quantized,
		// or split), and one launch where the kernel takes them together
		bool same = true;

		for (int i = 1; i < n; i++)
			same = same && ws[i]->cols == ws[0]->cols &&
			       (i8 ? is_int8(ws[i])
				   : ws[i]->type == ws[0]->type && gpud_k_mm_h_fits(ws[i]));
		if (same) {
			if (!prepared && (rc = prep(c, ws[0], x, T, err, errlen)))
				return rc;
			if (i8)
				CKL(gpud_k_mm_q_set(c->stream, ws, ys, n, c->actq, c->actd, T,
						    &c->ksplit),
				    "matmul (int8)");
			else
				CKL(gpud_k_mm_h_set(c->stream, ws, ys, n, c->acth_hi, c->acth_lo,
						    c->ascale, T, &c->ksplit),
				    "matmul (half)");
			return 0;
		}
	}
	for (int i = 0; i < n; i++) {
		if (i == 0 ? !prepared
			   : ws[i]->type != ws[i - 1]->type || ws[i]->cols != ws[i - 1]->cols ||
				     gpud_k_mm_h_fits(ws[i]) != gpud_k_mm_h_fits(ws[i - 1])) {
			rc = prep(c, ws[i], x, T, err, errlen);
			if (rc)
				return rc;
		}
		rc = mm(c, ws[i], x, T, ys[i], err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

// The norm of x with w made inside next's decode GEMV (fuse_setup), not
// by add_norm: x holds the whole residual stream (nothing pending in xb).
static bool norm_fused(const cuda_ctx *c, bool pend, const gpud_cuda_mat *next, uint32_t T)
{
	return !pend && T <= c->fuse_norm_t && next->cols == c->hp->dim &&
	       gpud_k_norm_fuses(next->type, next->cols, T);
}

// y += W x when the decode GEMVs take W (T <= MV_MAX_T; *done says
// whether they did): x as is for float types, xq, xd (x quantized) for
// int8, the residual add in the GEMV's store.
static int mv_acc(cuda_ctx *c, const gpud_cuda_mat *w, const float *x, const int8_t *xq,
		  const float *xd, uint32_t T, float *y, bool *done, char *err, size_t errlen)
{
	*done = one_gemv(&w, 1, T);
	if (*done)
		CKL(gpud_k_mv_group(c->stream, &w, &y, 1, false, x, xq, xd, T, nullptr, nullptr,
				    nullptr, true),
		    "matmul (gemv, residual)");
	return 0;
}

// x += xb (add), then xb = rmsnorm(x) * w when w; quantized too when
// next (the matrix that reads xb) is int8 of the model's width: returns
// whether it was (mm_group's prepared).
int add_norm(cuda_ctx *c, bool add, const float *w, const gpud_cuda_mat *next, uint32_t T,
	     bool *prepared, char *err, size_t errlen)
{
	bool q = w && next && is_int8(next) && next->cols == c->hp->dim;

	CKL(gpud_k_add_norm(c->stream, c->x, c->xb, w, add, nullptr, T, c->hp->dim,
			    c->hp->norm_eps, q ? c->actq : nullptr, q ? c->actd : nullptr),
	    "rmsnorm");
	if (prepared)
		*prepared = q;
	return 0;
}

// The step's kernels for T tokens and n_logits logits rows, reading the
// step from the device metadata; leaves the final-normed hidden states in
// xb when want_hidden and the logits in c->logits. Enqueues only: the
// same calls run a step or are captured into a graph (capture_graphs).
int enqueue(cuda_ctx *c, uint32_t T, uint32_t n_logits, bool want_hidden, char *err,
	    size_t errlen)
{
	const struct gpud_model_hparams *hp = c->hp;
	const struct gpud_cuda_layout *L = &c->L;
	gpud_cuda_kvshape kv = { c->kvpool, hp->n_heads, hp->n_kv_heads, hp->head_dim,
				 c->cfg.block_tokens, 0, L->head_elems, L->layer_elems,
				 L->block_elems, L->kv_esz == 2, hp->attn_scale };
	// Decode-sized steps (the graphs') split each token's keys; larger
	// ones share K among tiles of a sequence's tokens.
	gpud_cuda_attn att = { L->att_heads, T,
			       gpud_cuda_att_splits(L, T, c->n_sm, c->att_per_sm),
			       T > GPUD_CUDA_GRAPH_MAX_T ? c->meta + L->m_tiles : nullptr, c->n_tiles,
			       L->att_tile, c->attp, c->attc, nullptr, nullptr, nullptr, 0 };
	int rc;

	bool prepared = false; // the activations of the next matmul quantized by add_norm
	// xb holds the output of the matmul before, not yet added into x:
	// decode GEMVs add theirs into x themselves (mv_acc)
	bool pend = false;

	prof_stage(c, "embedding");
	CKL(gpud_k_embed(c->stream, &c->tok_embd, c->dmeta.tokens, T, c->x), "embedding");
	for (uint32_t l = 0; l < hp->n_layers; l++) {
		const dev_layer *D = &c->layers[l];
		const gpud_cuda_mat *qkv[3] = { &D->wq, &D->wk, &D->wv };
		float *qkv_out[3] = { c->q, c->k, c->v };
		const gpud_cuda_mat *gu[2] = { &D->gate, &D->up };
		float *gu_out[2] = { c->hb, c->hb2 };
		bool done;
		gpud_cuda_rope rope = { c->rope_inv, D->bq, D->bk, D->bv,
					hp->rope_style == GPUD_ROPE_NEOX, D->q_norm, D->k_norm,
					hp->norm_eps };
		// decode: Q, K and V in one launch, RoPE and the KV store in its
		// epilogue, and the norm before them in its CTAs where it fuses
		// (not with per-head Q/K norms, which need a head's whole row
		// before its first rotation: rope_store makes those)
		bool dec_qkv = one_gemv(qkv, 3, T) && hp->head_dim % 2 == 0 && !D->q_norm;
		bool fuse = dec_qkv && norm_fused(c, pend, &D->wq, T);
		gpud_cuda_norm nrm = { c->x, D->attn_norm, hp->norm_eps,
					GPUD_K_NORM_CTAS_PER_SM * c->n_sm };

		kv.layer = l;
		prof_stage(c, "attention norm");
		if (!fuse &&
		    (rc = add_norm(c, pend, D->attn_norm, &D->wq, T, &prepared, err, errlen)))
			return rc;
		pend = false;
		prof_stage(c, "q, k, v");
		if (dec_qkv) {
			if (!fuse && !prepared && (rc = prep(c, &D->wq, c->xb, T, err, errlen)))
				return rc;
			CKL(gpud_k_mv_qkv(c->stream, qkv, c->q, c->xb, c->actq, c->actd, T, &c->dmeta,
					  &rope, &kv, fuse ? &nrm : nullptr),
			    fuse ? "matmul (gemv, rmsnorm, rope)" : "matmul (gemv, rope)");
		} else {
			if ((rc = mm_group(c, qkv, qkv_out, 3, c->xb, T, prepared, err, errlen)))
				return rc;
			CKL(gpud_k_rope_store(c->stream, c->q, c->k, c->v, &c->dmeta, &rope, &kv,
					      T),
			    "rope");
		}
		// int8 wo: attention quantizes its output for it
		bool att_q = is_int8(&D->wo) && D->wo.cols == hp->n_heads * hp->head_dim &&
			     hp->head_dim % GPUD_QK == 0;
		att.aq = att_q ? c->actq : nullptr;
		att.ad = att_q ? c->actd : nullptr;
		att.next = D->wo.q; // contiguous: quants, then scales (upload_mat)
		att.next_bytes = gpud_cuda_tensor_bytes((enum gpud_type)D->wo.type, D->wo.rows,
							D->wo.cols);
		prof_stage(c, "attention");
		CKL(gpud_k_attention(c->stream, c->q, c->att, &c->dmeta, &kv, c->mpool,
				     L->mask_slot_bytes, L->max_prompt_blocks, &att), "attention");
		prof_stage(c, "o");
		if (!att_q && (rc = prep(c, &D->wo, c->att, T, err, errlen)))
			return rc;
		if ((rc = mv_acc(c, &D->wo, c->att, c->actq, c->actd, T, c->x, &done, err, errlen)))
			return rc;
		if (!done && (rc = mm(c, &D->wo, c->att, T, c->xb, err, errlen)))
			return rc;
		pend = !done;
		// decode: gate and up in one launch, SwiGLU in its epilogue, which
		// also quantizes for an int8 down (into actq2: actq is their
		// input), and the norm before them in its CTAs where it fuses
		bool dec_gu = one_gemv(gu, 2, T) && D->gate.rows == D->up.rows;
		fuse = dec_gu && norm_fused(c, pend, &D->gate, T);
		nrm.w = D->ffn_norm;
		prof_stage(c, "ffn norm");
		if (!fuse &&
		    (rc = add_norm(c, pend, D->ffn_norm, &D->gate, T, &prepared, err, errlen)))
			return rc;
		pend = false;
		prof_stage(c, "gate, up");
		if (dec_gu) {
			bool glu_q = is_int8(&D->gate) && is_int8(&D->down) &&
				     D->down.cols == D->gate.rows && D->gate.rows % GPUD_QK == 0;
			if (!fuse && !prepared && (rc = prep(c, &D->gate, c->xb, T, err, errlen)))
				return rc;
			CKL(gpud_k_mv_group(c->stream, gu, gu_out, 2, true, c->xb, c->actq, c->actd,
					    T, glu_q ? c->actq2 : nullptr,
					    glu_q ? c->actd2 : nullptr, fuse ? &nrm : nullptr),
			    fuse ? "matmul (gemv, rmsnorm, swiglu)" : "matmul (gemv, swiglu)");
			prof_stage(c, "down");
			if (!glu_q && (rc = prep(c, &D->down, c->hb, T, err, errlen)))
				return rc;
			if ((rc = mv_acc(c, &D->down, c->hb, glu_q ? c->actq2 : c->actq,
					 glu_q ? c->actd2 : c->actd, T, c->x, &done, err, errlen)))
				return rc;
			if (!done && (rc = mm(c, &D->down, c->hb, T, c->xb, err, errlen)))
				return rc;
		} else {
			if ((rc = mm_group(c, gu, gu_out, 2, c->xb, T, prepared, err, errlen)))
				return rc;
			CKL(gpud_k_swiglu(c->stream, c->hb, c->hb2, (uint64_t)T * hp->ffn_dim),
			    "swiglu");
			prof_stage(c, "down");
			if ((rc = prep(c, &D->down, c->hb, T, err, errlen)) ||
			    (rc = mm(c, &D->down, c->hb, T, c->xb, err, errlen)))
				return rc;
			done = false;
		}
		pend = !done;
	}
	prof_stage(c, "output");
	if (pend && (rc = add_norm(c, true, nullptr, nullptr, T, nullptr, err, errlen)))
		return rc;
	if (want_hidden && (rc = add_norm(c, false, c->out_norm, nullptr, T, nullptr, err, errlen)))
		return rc;
	if (n_logits) {
		// the logits rows' final norm, quantized for an int8 output matrix
		// in the same launch (add_norm's quants: quantize_act's bits)
		bool oq = is_int8(&c->output) && c->output.cols == hp->dim &&
			  hp->dim % GPUD_QK == 0;

		CKL(gpud_k_add_norm(c->stream, c->x, c->xl, c->out_norm, false, c->dmeta.logit_tok,
				    n_logits, hp->dim, hp->norm_eps, oq ? c->actq : nullptr,
				    oq ? c->actd : nullptr),
		    "final norm");
		if ((!oq && (rc = prep(c, &c->output, c->xl, n_logits, err, errlen))) ||
		    (rc = mm(c, &c->output, c->xl, n_logits, c->logits, err, errlen)))
			return rc;
		prof_stage(c, "sampling");
		CKL(gpud_k_argmax(c->stream, c->logits, n_logits, hp->n_vocab, c->amax), "arg max");
		CKL(gpud_k_draw(c->stream, c->logits, n_logits, hp->n_vocab, c->meta + L->m_ndraw,
			        c->meta + L->m_draw, c->amax, c->dscr), "draw");
	}
	return 0;
}

int run_step(cuda_ctx *c, const struct gpud_fwd_batch *b, char *err, size_t errlen)
{
	const struct gpud_model_hparams *hp = c->hp;
	const struct gpud_cuda_layout *L = &c->L;
	uint32_t T = b->n_tokens, n_up = 0;
	uint64_t n_words = 0;
	int rc;

	c->stamp++;
	if (c->pf)
		c->pf->n = 0; // marks of a step that failed after its launches
	rc = gpud_cuda_meta_fill(L, c->cfg.block_tokens, b, c->slots, c->stamp, c->h_meta,
				 &n_words, c->up_seq, &n_up, &c->n_tiles, err, errlen);
	for (uint32_t i = 0; !rc && i < n_up; i++) {
		// A new mask: its image into its slot (rare: once per mask).
		const struct gpud_fwd_seq *s = &b->seqs[c->up_seq[i]];
		uint32_t slot = c->h_meta[L->m_seqinfo + (uint64_t)c->up_seq[i] * GPUD_CUDA_SEQ_WORDS +
					  GPUD_CUDA_SI_SLOT];
		size_t n = gpud_cuda_mask_image(L, c->cfg.block_tokens, s->mask, c->h_mask);
		cudaError_t e;

		if (!n) {
			rc = sw_seterr(err, errlen, SW_ETOOLONG, "cuda:%d: mask does not fit a slot",
				       c->dev);
			break;
		}
		e = cudaMemcpyAsync(c->mpool + (uint64_t)slot * L->mask_slot_bytes, c->h_mask, n,
				    cudaMemcpyHostToDevice, c->stream);
		if (e == cudaSuccess)
			e = cudaStreamSynchronize(c->stream); // h_mask is reused next
		if (e != cudaSuccess)
			rc = cuerr(c, e, "mask upload", err, errlen);
	}
	if (rc) {
		// Slots taken by this step hold no image: forget them.
		for (uint32_t i = 0; i < n_up; i++) {
			uint32_t slot = c->h_meta[L->m_seqinfo +
						  (uint64_t)c->up_seq[i] * GPUD_CUDA_SEQ_WORDS +
						  GPUD_CUDA_SI_SLOT];
			if (slot < L->mask_slots)
				c->slots[slot].stamp = 0;
		}
		return rc;
	}
	CK(cudaMemcpyAsync(c->meta, c->h_meta, n_words * 4, cudaMemcpyHostToDevice,
			   c->stream), "step metadata upload");
	if (uint64_t dw = gpud_cuda_draw_words(b))
		CK(cudaMemcpyAsync(c->meta + L->m_draw, c->h_meta + L->m_draw, dw * 4,
				   cudaMemcpyHostToDevice, c->stream), "draw words upload");

	if (!b->want_hidden && b->n_logits == T && T <= GPUD_CUDA_GRAPH_MAX_T && c->graph[T]) {
		// A decode batch of a captured size: the step's kernels in one
		// launch (they read the step from the metadata just copied).
		CK(cudaGraphLaunch(c->graph[T], c->stream), "cudaGraphLaunch");
		c->graph_steps++;
	} else if ((rc = enqueue(c, T, b->n_logits, b->want_hidden, err, errlen))) {
		return rc;
	}
	if (c->pf && c->pf->n &&
	    cudaEventRecord(c->pf->ev[c->pf->n], c->stream) != cudaSuccess) {
		cudaGetLastError();
		c->pf->n = 0; // this step goes untimed
	}
	if (b->want_hidden)
		CK(cudaMemcpyAsync(c->h_hidden, c->xb, (size_t)T * hp->dim * 4,
				   cudaMemcpyDeviceToHost, c->stream), "hidden states download");
	if (b->n_logits)
		CK(cudaMemcpyAsync(c->h_amax, c->amax,
				   (size_t)b->n_logits * GPUD_CUDA_ARGMAX_PARTS * 8,
				   cudaMemcpyDeviceToHost, c->stream), "arg max download");
	// The logits rows the engine reads: those of sequences that want
	// more than the arg max, a copy per run of consecutive rows.
	for (uint32_t i = 0, r0 = 0, r1 = 0; i <= b->n_seqs; i++) {
		const struct gpud_fwd_seq *q = i < b->n_seqs ? &b->seqs[i] : nullptr;
		bool want = q && q->n_logits && !q->argmax;

		if (want && r1 > r0 && q->logit0 == r1) {
			r1 += q->n_logits;
			continue;
		}
		if (r1 > r0)
			CK(cudaMemcpyAsync(c->h_logits + (size_t)r0 * hp->n_vocab,
					   c->logits + (size_t)r0 * hp->n_vocab,
					   (size_t)(r1 - r0) * hp->n_vocab * 4, cudaMemcpyDeviceToHost,
					   c->stream), "logits download");
		r0 = want ? q->logit0 : 0;
		r1 = want ? q->logit0 + q->n_logits : 0;
	}
	CK(cudaStreamSynchronize(c->stream), "step");
	prof_step_done(c);
	if (b->n_logits)
		gpud_cuda_argmax_pick(c->h_amax, b->n_logits, c->ids);
	return 0;
}

int cuda_forward(void *ctx, const struct gpud_fwd_batch *b, char *err, size_t errlen)
{
	cuda_ctx *c = (cuda_ctx *)ctx;
	int rc;

	CK(cudaSetDevice(c->dev), "cudaSetDevice");
	rc = run_step(c, b, err, errlen);
	if (rc) {
		// Nothing of a failed step may still be in flight when the next
		// one rewrites staging (after a fault this fails too: ignored).
		cudaStreamSynchronize(c->stream);
		cudaGetLastError();
		return rc;
	}
	c->st.steps++;
	c->st.tokens += b->n_tokens;
	return 0;
}

const float *cuda_logits(void *ctx)
{
	return ((cuda_ctx *)ctx)->h_logits;
}

const int32_t *cuda_argmax(void *ctx)
{
	return ((cuda_ctx *)ctx)->ids;
}

const float *cuda_hidden(void *ctx)
{
	return ((cuda_ctx *)ctx)->h_hidden;
}

int cuda_kv_copy(void *ctx, uint32_t dst, uint32_t src)
{
	cuda_ctx *c = (cuda_ctx *)ctx;
	uint64_t n = c->L.block_elems * c->L.kv_esz;

	if (dst >= c->cfg.n_blocks || src >= c->cfg.n_blocks)
		return -EINVAL;
	if (dst == src)
		return 0;
	if (cudaSetDevice(c->dev) != cudaSuccess ||
	    cudaMemcpyAsync(c->kvpool + dst * n, c->kvpool + src * n, n, cudaMemcpyDeviceToDevice,
			    c->stream) != cudaSuccess ||
	    cudaStreamSynchronize(c->stream) != cudaSuccess)
		return -EIO;
	return 0;
}

void cuda_stats(void *ctx, struct gpud_backend_stats *st)
{
	*st = ((cuda_ctx *)ctx)->st;
}

// Microseconds per replay of ex: one replay to warm, then reps between the
// profile's two events.
int time_graph(cuda_ctx *c, cudaGraphExec_t ex, uint32_t reps, double *us, char *err,
	       size_t errlen)
{
	float ms = 0.0f;

	CK(cudaGraphLaunch(ex, c->stream), "cudaGraphLaunch (stage profile)");
	CK(cudaEventRecord(c->pf->ev[0], c->stream), "cudaEventRecord (stage profile)");
	for (uint32_t i = 0; i < reps; i++)
		CK(cudaGraphLaunch(ex, c->stream), "cudaGraphLaunch (stage profile)");
	CK(cudaEventRecord(c->pf->ev[1], c->stream), "cudaEventRecord (stage profile)");
	CK(cudaStreamSynchronize(c->stream), "stage profile");
	CK(cudaEventElapsedTime(&ms, c->pf->ev[0], c->pf->ev[1]), "cudaEventElapsedTime");
	*us = (double)ms * 1e3 / reps;
	return 0;
}

// What enq() enqueues, captured into a graph of its own and timed
// (time_graph); the graph is gone after.
template <class F>
int capture_timed(cuda_ctx *c, F enq, uint32_t reps, double *us, char *err, size_t errlen)
{
	cudaGraph_t g = nullptr;
	cudaGraphExec_t ex = nullptr;
	cudaError_t e;
	int rc;

	CK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal),
	   "cudaStreamBeginCapture (stage profile)");
	rc = enq();
	e = cudaStreamEndCapture(c->stream, &g);
	if (!rc && e != cudaSuccess)
		rc = cuerr(c, e, "cudaStreamEndCapture (stage profile)", err, errlen);
	if (!rc && (e = cudaGraphInstantiate(&ex, g, 0)) != cudaSuccess)
		rc = cuerr(c, e, "cudaGraphInstantiate (stage profile)", err, errlen);
	if (g)
		cudaGraphDestroy(g);
	if (!rc)
		rc = time_graph(c, ex, reps, us, err, errlen);
	if (ex)
		cudaGraphExecDestroy(ex);
	cudaGetLastError();
	return rc;
}

int stage_profile(cuda_ctx *c, uint32_t T, uint32_t reps, struct gpud_cuda_stage_prof *out,
		  char *err, size_t errlen)
{
	prof *pf = c->pf;
	int rc;

	// the pairs: a pass of the step that launches nothing (the caller
	// sets pf->pass back to PASS_ALL however this returns)
	memset(&pf->list, 0, sizeof(pf->list));
	pf->pass = PASS_LIST;
	if ((rc = enqueue(c, T, T, false, err, errlen)))
		return rc;
	if (pf->list.dropped)
		return sw_seterr(err, errlen, -E2BIG, "cuda:%d: stage profile: over %d pairs",
				 c->dev, GPUD_CUDA_PROF_ROWS);
	out->n_rows = pf->list.n_rows;
	for (uint32_t r = 0; r < out->n_rows; r++) {
		out->rows[r] = pf->list.rows[r];
		out->launches += out->rows[r].launches;
	}
	pf->pass = PASS_ALL; // the step's own graph launches nothing through prof_mark
	if ((rc = time_graph(c, c->graph[T], reps, &out->step_us, err, errlen)))
		return rc;
	for (uint32_t r = 0; r < out->n_rows; r++) {
		double us = 0;

		pf->pass = PASS_ONE;
		pf->one_stage = out->rows[r].stage;
		pf->one_op = out->rows[r].op;
		rc = capture_timed(c, [&] { return enqueue(c, T, T, false, err, errlen); }, reps,
				   &us, err, errlen);
		if (rc)
			return rc;
		out->rows[r].ms = us * 1e-3;
	}
	pf->pass = PASS_ALL;
	uint32_t n = (uint32_t)out->launches;
	auto nop = [&](uint32_t k) {
		cudaError_t e = gpud_k_nop(c->stream, k);
		return e == cudaSuccess ? 0 : cuerr(c, e, "empty kernels", err, errlen);
	};
	if ((rc = capture_timed(c, [&] { return nop(1); }, reps, &out->graph_us, err, errlen)))
		return rc;
	return capture_timed(c, [&] { return nop(n); }, reps, &out->floor_us, err, errlen);
}

} // namespace

extern "C" int gpud_cuda_stage_profile(void *ctx, uint32_t T, uint32_t reps,
				       struct gpud_cuda_stage_prof *out, char *err,
				       size_t errlen)
{
	cuda_ctx *c = (cuda_ctx *)ctx;
	int rc;

	memset(out, 0, sizeof(*out));
	out->T = T;
	if (!c->pf || !c->pf->graph)
		return sw_seterr(err, errlen, -ENOENT,
				 "cuda:%d: stage profile: the instance was made without "
				 "GPUD_CUDA_PROFILE=graph", c->dev);
	if (!T || T > GPUD_CUDA_GRAPH_MAX_T || !c->graph[T] || !reps)
		return sw_seterr(err, errlen, -EINVAL,
				 "cuda:%d: stage profile: no decode graph of %u tokens (or no "
				 "replays)", c->dev, T);
	CK(cudaSetDevice(c->dev), "cudaSetDevice");
	rc = stage_profile(c, T, reps, out, err, errlen);
	c->pf->pass = PASS_ALL;
	if (rc) {
		cudaStreamSynchronize(c->stream);
		cudaGetLastError();
	}
	return rc;
}

extern "C" int gpud_cuda_profiler_range(bool on)
{
	cudaError_t e = on ? cudaProfilerStart() : cudaProfilerStop();

	return e == cudaSuccess ? 0 : gpud_cuda_errcode((int)e);
}

extern "C" int gpud_cuda_profile(void *ctx, struct gpud_cuda_prof *out, bool reset)
{
	cuda_ctx *c = (cuda_ctx *)ctx;

	if (!c->pf)
		return -ENOENT;
	if (out)
		*out = c->pf->sum;
	if (reset)
		memset(&c->pf->sum, 0, sizeof(c->pf->sum));
	return 0;
}

/* --- device queries ---------------------------------------------------------- */

extern "C" int gpud_cuda_device_count(void)
{
	int n = 0;

	eager_modules();
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		cudaGetLastError(); // not sticky: clear it
		return 0;
	}
	return n;
}

extern "C" int gpud_cuda_device_info(int ordinal, struct gpud_cuda_devinfo *info, char *err,
				     size_t errlen)
{
	int n = gpud_cuda_device_count(), prev = -1;
	cudaDeviceProp p;
	size_t fr = 0, tot = 0;
	cudaError_t e;

	memset(info, 0, sizeof(*info));
	if (ordinal < 0 || ordinal >= n)
		return sw_seterr(err, errlen, -ENODEV, "cuda:%d: no such device (%d visible)",
				 ordinal, n);
	e = cudaGetDeviceProperties(&p, ordinal);
	if (e != cudaSuccess)
		return sw_seterr(err, errlen, gpud_cuda_errcode((int)e),
				 "cuda:%d: cudaGetDeviceProperties: %s", ordinal,
				 cudaGetErrorString(e));
	memcpy(info->name, p.name, sizeof(info->name) - 1); // p.name is 256 bytes
	info->name[sizeof(info->name) - 1] = '\0';
	info->cc_major = p.major;
	info->cc_minor = p.minor;
	if (cudaGetDevice(&prev) != cudaSuccess)
		prev = -1;
	e = cudaSetDevice(ordinal);
	if (e == cudaSuccess)
		e = cudaMemGetInfo(&fr, &tot);
	if (prev >= 0 && prev != ordinal)
		cudaSetDevice(prev);
	if (e != cudaSuccess)
		return sw_seterr(err, errlen, gpud_cuda_errcode((int)e),
				 "cuda:%d: cudaMemGetInfo: %s", ordinal, cudaGetErrorString(e));
	info->total_bytes = tot;
	info->free_bytes = fr;
	return 0;
}

// Positional (C++17 has no designated initializers): one line per slot of
// struct gpud_backend_ops, in its order; a slot added there is added here.
extern "C" const struct gpud_backend_ops gpud_cuda_backend = {
	/* name */ "cuda",
	/* scratch_bytes */ cuda_scratch_bytes,
	/* own_weight_bytes */ nullptr, // the replica is planned per device (devmem)
	/* init */ cuda_init,
	/* destroy */ cuda_destroy,
	/* forward */ cuda_forward,
	/* logits */ cuda_logits,
	/* argmax */ cuda_argmax,
	/* draws */ true,
	/* hidden */ cuda_hidden,
	/* kv_copy */ cuda_kv_copy,
	/* kv_copy_shift */ nullptr, // no chunk-KV cache on CUDA yet: recomputed
	/* stats */ cuda_stats,
};
