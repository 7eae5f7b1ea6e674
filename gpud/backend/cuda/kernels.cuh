// kernels.cuh - the CUDA backend's kernels as host-callable launchers
// (kernels.cu), used by backend.cu. Internal to the backend.
//
// Every launcher enqueues on the given stream and returns the launch's
// error (cudaGetLastError); faults inside a kernel show at the step's
// synchronization. Shapes and layouts are those of cuda_impl.h and the
// CPU reference (backend/cpu/forward.c), whose semantics each kernel
// mirrors; the comments say where the bits may differ.
#ifndef GPUD_BACKEND_CUDA_KERNELS_CUH
#define GPUD_BACKEND_CUDA_KERNELS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

// One matrix on the device (cuda_impl.h's layout): rows x cols of type
// (enum gpud_type); q the elements (or quants), d the fp16 scales of
// Q8_0/Q4_0 (NULL otherwise).
struct gpud_cuda_mat {
	int type;
	int64_t rows, cols;
	const void *q;
	const void *d;
};

// The step metadata on the device (cuda_impl.h).
struct gpud_cuda_meta {
	const int32_t *tokens;
	const uint32_t *pos, *seq, *logit_tok, *seqinfo, *btab;
};

// The KV pool: elements of kv16 ? __half : float, block b's layer l at
// b * block_elems + l * layer_elems, K of KV head h at h * head_elems, V of
// h at (n_kv_heads + h) * head_elems, position p's row at p * head_dim.
// With kv16, K (after RoPE) and V are rounded to half (nearest even) when
// stored and widened exactly when read.
struct gpud_cuda_kvshape {
	void *kv;
	uint32_t n_heads, n_kv_heads, head_dim, block_tokens, layer;
	uint64_t head_elems, layer_elems, block_elems;
	uint32_t kv16;
	float scale; // attention logits' scale (the model's attn_scale: 1/sqrt(head_dim),
		     // times YaRN's mscale^2)
};

// Programmatic dependent launch for the kernels launched on stream s from
// now on (sm_90 and later; kernels.cu says how): on or off. Fails
// (cudaErrorNotSupported) when 64 streams have it on already.
cudaError_t gpud_k_pdl(cudaStream_t s, bool on);

// Two kernels on s, the second launched behind the first (with s's
// launch mode) and reading what it wrote: p[0] and p[1] are 0x5eed after
// (p: 3 ints of device memory).
cudaError_t gpud_k_pdl_probe(cudaStream_t s, int *p);

// n launches of an empty kernel on s (one CTA, s's launch mode): what
// launches cost alone (gpud_cuda_stage_profile).
cudaError_t gpud_k_nop(cudaStream_t s, uint32_t n);

// x[t] = row tokens[t] of the embedding (the bits of gpud_dequantize_row);
// an out-of-range token gives a zero row.
cudaError_t gpud_k_embed(cudaStream_t s, const gpud_cuda_mat *emb, const int32_t *tokens,
			 uint32_t T, float *x);

// Per row r < n: src = rows ? rows[r] : r. With add: x[src] += out[r].
// Then, when w: out[r] = rmsnorm(x[src]) * w (sum of squares in double,
// as the CPU does). add and rows are exclusive. With aq (and w, dim a
// multiple of 32), out[r] is also quantized into aq, ad as
// gpud_k_quantize_act would (the next int8 matmul's input, one launch
// fewer).
cudaError_t gpud_k_add_norm(cudaStream_t s, float *x, float *out, const float *w, bool add,
			    const uint32_t *rows, uint32_t n, uint32_t dim, float eps, int8_t *aq,
			    float *ad);

// How Q and K are rotated: the angles' frequencies inv_freq (head_dim / 2
// floats), the pairs (i, i + head_dim / 2) of a head with neox (Qwen2),
// else (2i, 2i + 1) (Llama); and the Q, K and V biases added first, as the
// CPU does (NULL: none).
struct gpud_cuda_rope {
	const float *inv_freq;
	const float *bq, *bk, *bv; /* (n_heads * head_dim), (n_kv_heads * head_dim) x 2 */
	uint32_t neox;
	const float *q_norm, *k_norm; /* (head_dim) each (qwen3), or NULL */
	float eps;                    /* their RMS epsilon */
};

// The biases, the RMSNorm of each Q and K head (q_norm: qwen3), then RoPE
// (angles pos * inv_freq in double, as the CPU) on q in place and on k, and
// k, v into each token's KV block at its position. The decode GEMVs'
// epilogue (gpud_k_mv_qkv) does all but the norms.
cudaError_t gpud_k_rope_store(cudaStream_t s, float *q, const float *k, const float *v,
			      const gpud_cuda_meta *m, const gpud_cuda_rope *rope,
			      const gpud_cuda_kvshape *kv, uint32_t T);

// How an attention launch is cut (the layout's att_heads and att_tile).
struct gpud_cuda_attn {
	uint32_t heads;  // query heads per CTA, sharing a KV head: a warp each
	uint32_t T;      // the step's tokens: a CTA each when tiles is NULL
	uint32_t splits; // then, CTAs per token (split-K) whose partials combine
	const uint32_t *tiles; // or: the step's tiles (device metadata) ...
	uint32_t n_tiles, tile; // ... their count, and tokens per tile at most
	float *part;     // split partials (layout attp)
	unsigned *cnt;   // split arrival counters (layout attc), zero between steps
	int8_t *aq;      // or NULL: the output quantized too (head_dim a multiple
	float *ad;       // of 32), as gpud_k_quantize_act would: the O matmul's input
	const void *next;    // or NULL: next_bytes from next (the O matrix) streamed
	uint64_t next_bytes; // into L2 by the decode CTAs of splits that get no keys
};

// Attention of every (token, head): a CTA per (token or tile of a
// sequence's tokens, KV head, split), a warp per (query token, query head
// sharing the KV head); online softmax over the keys in chunks of 32
// positions whose K is staged in shared memory once for all the CTA's
// warps, chunks no warp sees skipped, per-token tests only in mixed blocks.
// With splits > 1 (decode: gpud_cuda_att_splits, T <= GPUD_CUDA_GRAPH_MAX_T)
// each token's keys are cut into that many ranges whose partials are
// combined by the last CTA to finish. masks: the mask pool.
cudaError_t gpud_k_attention(cudaStream_t s, const float *q, float *out,
			     const gpud_cuda_meta *m, const gpud_cuda_kvshape *kv,
			     const uint8_t *masks, uint64_t slot_bytes, uint64_t max_prompt_blocks,
			     const gpud_cuda_attn *a);

// *per_sm: the CTAs of the decode attention kernel (head_dim, f16 or f32
// KV, heads a CTA as gpud_cuda_attn's) one multiprocessor of the current
// device holds at once: what gpud_cuda_att_splits fills one wave of.
cudaError_t gpud_k_attention_occupancy(uint32_t head_dim, bool kv16, uint32_t heads,
				       uint32_t *per_sm);

// Per row r < rows of logits (rows, nv): keys[r * GPUD_CUDA_ARGMAX_PARTS +
// p] = the greatest gpud_cuda_argmax_key of the row's p-th range of
// indices (cuda_impl.h; gpud_cuda_argmax_pick finishes on the host).
cudaError_t gpud_k_argmax(cudaStream_t s, const float *logits, uint32_t rows, uint32_t nv,
			  uint64_t *keys);

// When *ndraw (a metadata word) is not 0, per row r < rows whose draw
// words (words + r * GPUD_CUDA_DRAW_WORDS) are on: the token gpud_draw_row
// picks from the row with that draw, as the row's keys (keys[r *
// GPUD_CUDA_ARGMAX_PARTS]: the id's key first, then 0; all 0 for a row with
// nothing usable), which gpud_cuda_argmax_pick turns into the id. The
// draw's penalties are applied to the row in place. Other rows are left as
// they are. scratch: rows x GPUD_CUDA_DRAW_SCRATCH words, where many CTAs
// of each row gather its top-k candidates or its histogram of masses
// first, so that no CTA walks a whole row more than a few times
// (kernels.cu). Three launches; cudaErrorInvalidValue without scratch.
cudaError_t gpud_k_draw(cudaStream_t s, float *logits, uint32_t rows, uint32_t nv,
			const uint32_t *ndraw, const uint32_t *words, uint64_t *keys,
			uint64_t *scratch);

// hb[i] = silu(hb[i]) * hb2[i].
cudaError_t gpud_k_swiglu(cudaStream_t s, float *hb, const float *hb2, uint64_t n);

// Activations (T, cols) to int8 blocks of 32 with fp32 scales, exactly
// as the CPU's int8 path: q (T, cols), d (T, cols/32).
cudaError_t gpud_k_quantize_act(cudaStream_t s, const float *x, uint32_t T, uint32_t cols,
				int8_t *q, float *d);

// y (T, rows) = W x for F32/F16/BF16 W and fp32 x, T <= 8: each weight
// widened to fp32 (the CPU's products; the sum's order differs).
cudaError_t gpud_k_mv_f(cudaStream_t s, const gpud_cuda_mat *w, const float *x, uint32_t T,
			float *y);

// y (T, rows) = W x for F32/F16/BF16 W, any T: a 64 x 64 tiled fp32
// kernel (each weight widened, the columns summed in order).
cudaError_t gpud_k_mm_f(cudaStream_t s, const gpud_cuda_mat *w, const float *x, uint32_t T,
			float *y);

// x (T, cols) into hi + lo of type (F16/BF16) for gpud_k_mm_h_set: per
// token, x/s = hi + lo with s a power of two (F16: max |x/s| <= 2^14;
// BF16: s = 1); scales[t] = s.
cudaError_t gpud_k_split_act(cudaStream_t s, const float *x, uint32_t T, uint32_t cols, int type,
			     void *hi, void *lo, float *scales);

// Tokens up to which the matmuls take a GEMV (a warp per row).
#define GPUD_K_GEMV_MAX_T 8u

// Scratch for the tensor-core matmuls' split-K (decode batches of
// GPUD_K_GEMV_MAX_T + 1 .. 64 tokens): part_floats of partial sums (splits x
// T x rows, the single-buffered kernel's by split, the pipelined ones' by
// row tile), and one arrival counter per 32-row tile
// (GPUD_CUDA_MM1_TILE_ROWS, the smaller of the kernels' tiles), zero
// between launches.
struct gpud_cuda_ksplit {
	float *part;
	uint64_t part_floats;
	unsigned *cnt;
	uint32_t cnt_words;
	uint32_t n_sm; // the device's multiprocessors (the splits fill them)
	// the CTAs of each tensor-core kernel (by gpud_cuda_mm_kernel) one
	// multiprocessor holds at once (gpud_k_mm_occupancy; 0: no bound)
	uint32_t per_sm[3];
};

// per_sm[k]: the occupancy of the tensor-core kernels by gpud_cuda_mm_kernel
// k (the pipelined int8 kernel's larger Q8_0 stages; F16, BF16's twin) on
// the current device, as the CUDA runtime computes it from their
// registers and shared memory: what gpud_cuda_mm_splits fills.
cudaError_t gpud_k_mm_occupancy(uint32_t per_sm[3]);

// y (T, rows) = W x for Q8_0/Q4_0 W over quantized activations: a GEMV
// (warp per row, T <= GPUD_K_GEMV_MAX_T) or an int8 tensor-core kernel
// (larger T, whose sums are the CPU's bits; with ks, batches of up to 64
// tokens split the columns over gpud_k_mm_q_splits CTAs, whose sum is not).
// The tensor-core kernel is the pipelined one where the columns allow it
// (cols % 64 == 0), else the single-buffered one (cuda_impl.h).
cudaError_t gpud_k_mm_q(cudaStream_t s, const gpud_cuda_mat *w, const int8_t *xq,
			const float *xd, uint32_t T, float *y, const gpud_cuda_ksplit *ks);

// The column splits gpud_k_mm_q makes for a rows x cols matrix and T
// tokens (1: none): a function of the shapes, ks and gpud_k_mm_single only.
uint32_t gpud_k_mm_q_splits(int64_t rows, int64_t cols, uint32_t T,
			    const gpud_cuda_ksplit *ks);

// ys[i] = ws[i] x for n (1..3) Q8_0/Q4_0 matrices of one type and width
// over the same quantized activations (Q, K, V; gate, up): one launch of
// the pipelined kernel when they allow it (T > GPUD_K_GEMV_MAX_T, one
// type, cols % 64 == 0), else gpud_k_mm_q for each.
// Unsplit, each output has gpud_k_mm_q's bits; split (T <= 64), the splits
// are those of the set, so the order of the partials' sum may differ.
cudaError_t gpud_k_mm_q_set(cudaStream_t s, const gpud_cuda_mat *const *ws, float *const *ys,
			    int n, const int8_t *xq, const float *xd, uint32_t T,
			    const gpud_cuda_ksplit *ks);

// The int8 tensor-core matmul of every matrix by the single-buffered
// kernel (on), or by the pipelined one where it fits (off, the default):
// process-wide, for benchmarks and tests that compare them. The kernel
// gpud_k_mm_q takes for cols columns now: pipelined (true) or not.
void gpud_k_mm_single(bool on);
bool gpud_k_mm_pipelined(int64_t cols);

// Whether gpud_k_mm_h_set takes w: F16/BF16, cols % 8 == 0, 16-byte
// aligned, its row tiles within a grid.
bool gpud_k_mm_h_fits(const gpud_cuda_mat *w);

// ys[i] = ws[i] x for n (1..3) F16/BF16 matrices of one type and width
// that gpud_k_mm_h_fits, x split by gpud_k_split_act into hi, lo (16-byte
// aligned) and scales: one launch of the tensor-core kernel (m16n8k16,
// fp32 sums; weights read once for both halves). With ks, batches of
// GPUD_K_GEMV_MAX_T + 1 .. 64 tokens split the columns as gpud_k_mm_q's
// (gpud_k_mm_h_splits), into its scratch. No cuBLAS: nothing allocated.
cudaError_t gpud_k_mm_h_set(cudaStream_t s, const gpud_cuda_mat *const *ws, float *const *ys,
			    int n, const void *hi, const void *lo, const float *scales, uint32_t T,
			    const gpud_cuda_ksplit *ks);

// The column splits gpud_k_mm_h_set makes for rows (all the set's) x cols
// and T tokens (1: none).
uint32_t gpud_k_mm_h_splits(int64_t rows, int64_t cols, uint32_t T,
			    const gpud_cuda_ksplit *ks);

// An RMSNorm that a decode GEMV makes of its input itself
// (gpud_k_mv_group, gpud_k_mv_qkv): x (T, cols) normed with w (cols) and
// eps by every CTA into its shared memory, quantized for Q8_0/Q4_0: the
// bits gpud_k_add_norm gives its out, or its aq, ad (without add: the
// matmul before adds its output into x itself, gpud_k_mv_group's acc).
// One launch a norm fewer at decode; each CTA reads x from L2. ctas (0:
// no bound): the GEMV's CTAs at most, their warps then taking rows a
// grid apart; GPUD_K_NORM_CTAS_PER_SM times the device's
// multiprocessors (what the kernels' launch bounds let reside), so that x
// is normed that many times on each rather than once for every 8 rows.
// The bits do not depend on it.
#define GPUD_K_NORM_CTAS_PER_SM 2
struct gpud_cuda_norm {
	const float *x;
	const float *w;
	float eps;
	uint32_t ctas;
};

// Whether a decode GEMV of type over cols columns makes the norm of T
// tokens itself (cols a multiple of 32 for Q8_0/Q4_0, of 8 for F32, F16
// and BF16; T <= GPUD_K_NORM_MAX_T; the norm's shared memory, T x cols
// bytes int8 or floats, within a launch's). Larger batches keep
// the norm's own launch: every CTA of the GEMV reads all T rows of x.
#define GPUD_K_NORM_MAX_T 2u
bool gpud_k_norm_fuses(int type, int64_t cols, uint32_t T);

// The decode GEMVs of n (1..3) matrices of one type and width over the
// same activations in one launch, ys[i] = ws[i] x, T <= GPUD_K_GEMV_MAX_T:
// x for F32/F16/BF16, xq and xd (quantized) for Q8_0/Q4_0; each output the
// bits gpud_k_mv_f or gpud_k_mm_q gives. glu (n = 2, gate and up of equal
// rows): ys[0] = silu(ws[0] x) * (ws[1] x), the bits of the two GEMVs and
// gpud_k_swiglu; ys[1] is not written. yq, yd (or NULL; glu of Q8_0/Q4_0
// with rows a multiple of 32 only): ys[0] also quantized into them, the
// bits of gpud_k_quantize_act (the down matmul's input, one launch fewer).
// norm (or NULL; glu, gpud_k_norm_fuses): the activations are norm's,
// made in the launch, and x, xq, xd are not read (norm's x and w: 16-byte
// aligned, else cudaErrorMisalignedAddress). acc (not glu):
// ys[i] += ws[i] x, each element one fp32 addition (the residual add of
// gpud_k_add_norm).
cudaError_t gpud_k_mv_group(cudaStream_t s, const gpud_cuda_mat *const *ws, float *const *ys,
			    int n, bool glu, const float *x, const int8_t *xq, const float *xd,
			    uint32_t T, int8_t *yq, float *yd, const gpud_cuda_norm *norm = nullptr,
			    bool acc = false);

// Decode Q, K and V (ws[0..2], one type and width, Q of n_heads * head_dim
// rows, K and V of n_kv_heads * head_dim) over the same activations, with
// RoPE and the KV store in the epilogue, T <= GPUD_K_GEMV_MAX_T: the q and
// KV bits of gpud_k_mv_group and gpud_k_rope_store, in one launch (x for
// F32/F16/BF16, xq and xd for Q8_0/Q4_0, or norm's as gpud_k_mv_group's);
// q (T, n_heads * head_dim).
cudaError_t gpud_k_mv_qkv(cudaStream_t s, const gpud_cuda_mat *const *ws, float *q,
			  const float *x, const int8_t *xq, const float *xd, uint32_t T,
			  const gpud_cuda_meta *m, const gpud_cuda_rope *rope,
			  const gpud_cuda_kvshape *kv, const gpud_cuda_norm *norm = nullptr);

#endif
