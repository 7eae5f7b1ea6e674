/* cuda_impl.h - internal to the CUDA backend: the device memory layout,
 * shared by the pure-C sizing (plan.c: what gpud_cuda_plan_for reports)
 * and the instance (backend.cu: what init reserves), so that the plan and
 * the reservations are one computation.
 *
 * Layout of an instance, per device:
 *   weights  the model's tensors, each region 256-byte aligned. Float
 *            types (F32/F16/BF16) as in the file; Q8_0/Q4_0 repacked at
 *            upload into a quants region (rows*cols int8, or rows*cols/2
 *            bytes of nibbles keeping each block's 16-byte order) and a
 *            scales region (rows*cols/32 fp16), so kernels load aligned
 *            16-byte vectors. A tied output shares token_embd.
 *   kv       n_blocks blocks in the CPU layout (backend.h): per layer K
 *            then V, (n_kv_heads, block_tokens, head_dim) floats.
 *   masks    mask_slots equal slots, each: vis (128 segsets), block_segs
 *            (max_prompt_blocks segsets), seg (max_prompt bytes).
 *   scratch  the step's activations and the step's metadata (below).
 *   staging  pinned host memory: logits, arg max keys, hidden states,
 *            metadata, one mask's upload area; at init, the weight upload
 *            chunks.
 *
 * Step metadata (uint32 words, built in staging, one copy per step):
 *   tokens[T] pos[T] seq[T] logit_tok[NL] seqinfo[S][GPUD_CUDA_SEQ_WORDS]
 *   tiles[max_tiles] btab[max_btab]
 * A tile is up to att_tile consecutive tokens of one sequence, the query
 * tokens of one prefill attention CTA: first token | (count - 1) << 16.
 * Every function here is pure (no CUDA call, no allocation).
 */
#ifndef GPUD_BACKEND_CUDA_IMPL_H
#define GPUD_BACKEND_CUDA_IMPL_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/backend.h"
#include "gpud/draw.h"
#include "gpud/model.h"
#include "gpud/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gpud_mask;

#define GPUD_CUDA_ALIGN 256u
#define GPUD_CUDA_STAGING_MIN (8u << 20) /* weight upload chunk at least */
#define GPUD_CUDA_MAX_HEAD_DIM 256u
#define GPUD_CUDA_MAX_STEP_TOKENS 65535u /* kernels put tokens on grid.y */
#define GPUD_CUDA_VIS_SETS 128u /* GPUD_MASK_MAX_SEGMENTS + 1 */
#define GPUD_CUDA_NO_MASK 0xffffffffu
#define GPUD_CUDA_GRAPH_MAX_T 64u /* decode graphs: batches of 1 .. 64 tokens */
#define GPUD_CUDA_ATT_MAX_SPLITS 16u /* split-K attention: splits of one token's keys */
#define GPUD_CUDA_ATT_PARTS 512u /* split-K attention: (token, split) partials a step holds */
#define GPUD_CUDA_ATT_CHUNK 32u /* attention: positions of K staged at a time */
#define GPUD_CUDA_ATT_SMEM (48u * 1024) /* attention: shared memory of a CTA (no opt-in) */
#define GPUD_CUDA_ATT_MAX_TILE 16u /* attention: query tokens of a prefill CTA */
#define GPUD_CUDA_GEMV_MAX_T 8u /* matmuls of up to this many tokens: GEMVs (kernels.cuh) */
/* the int8 tensor-core matmuls (kernels.cu): a CTA's tokens and its column
 * splits at most, both kernels; the pipelined kernel's rows, the 32-column
 * blocks of a stage, its stages and the CTAs a multiprocessor it aims at
 * when it splits; the single-buffered kernel's rows and blocks a barrier */
#define GPUD_CUDA_MM_TILE_TOKENS 64u
#define GPUD_CUDA_MM_MAX_SPLITS 8u
#define GPUD_CUDA_MMP_TILE_ROWS 64u
#define GPUD_CUDA_MMP_STEP_BLOCKS 2u
#define GPUD_CUDA_MMP_STAGES 4u
#define GPUD_CUDA_MMP_PER_SM 3u
#define GPUD_CUDA_MM1_TILE_ROWS 32u
#define GPUD_CUDA_MM1_STEP_BLOCKS 4u
#define GPUD_CUDA_MMH_STEP_COLS 32u /* the F16/BF16 matmul: columns a stage, */
#define GPUD_CUDA_MMH_STAGES 3u     /* stages (64-row tiles as the pipelined int8's) */
#define GPUD_CUDA_ARGMAX_PARTS 64u /* arg max: CTAs per logits row, a key each */
/* a draw's scratch per logits row, 64-bit words (kernels.cu: a top-k draw's
 * candidates, or the row's ranges' ends and its histogram of masses) */
#define GPUD_CUDA_DRAW_SCRATCH 5184u

/* Per-sequence words of the step metadata. */
enum {
	GPUD_CUDA_SI_BTAB = 0,    /* offset of its block table in btab */
	GPUD_CUDA_SI_SLOT = 1,    /* mask slot, or GPUD_CUDA_NO_MASK (causal) */
	GPUD_CUDA_SI_NPROMPT = 2, /* mask: n_prompt */
	GPUD_CUDA_SI_NSEG = 3,    /* mask: n_segments (G's index) */
	GPUD_CUDA_SI_NPB = 4,     /* mask: n_prompt_blocks */
	GPUD_CUDA_SEQ_WORDS = 8,
};

/* Per-logits-row words of the step metadata: the row's draw (gpud/draw.h),
 * made on the device by the draw kernel when ON is 1. */
enum {
	GPUD_CUDA_DW_ON = 0,
	GPUD_CUDA_DW_TEMP = 1, /* float bits */
	GPUD_CUDA_DW_TOPK = 2,
	GPUD_CUDA_DW_TOPP = 3, /* float bits */
	GPUD_CUDA_DW_MINP = 4, /* float bits */
	GPUD_CUDA_DW_RAND_LO = 5,
	GPUD_CUDA_DW_RAND_HI = 6,
	GPUD_CUDA_DW_NPEN = 7,    /* penalized tokens, <= GPUD_DRAW_MAX_PEN */
	GPUD_CUDA_DW_REPEAT = 8,  /* float bits */
	GPUD_CUDA_DW_FREQ = 9,    /* float bits */
	GPUD_CUDA_DW_PRES = 10,   /* float bits */
	GPUD_CUDA_DW_PEN_ID = 12, /* GPUD_DRAW_MAX_PEN ids (distinct) */
	GPUD_CUDA_DW_PEN_N = 12 + GPUD_DRAW_MAX_PEN, /* and their counts */
	GPUD_CUDA_DRAW_WORDS = 12 + 2 * GPUD_DRAW_MAX_PEN + 4,
};

struct gpud_cuda_layout {
	/* the model */
	uint32_t dim, q_dim, kv_dim, ffn_dim, n_vocab, head_dim, max_cols;
	/* step bounds */
	uint32_t T, NL, S;
	uint64_t max_pos;    /* positions one sequence can have: min(n_ctx, KV) */
	uint64_t max_btab;   /* block-table words of one step */
	/* attention CTAs: query heads (a warp each) sharing a KV head; query
	 * tokens of a prefill CTA; tiles a step can have */
	uint32_t att_heads, att_tile, max_tiles;
	/* kv */
	uint64_t head_elems, layer_elems, block_elems, kv_bytes; /* elements of kv_esz bytes */
	uint32_t kv_esz;     /* 4 (f32) or 2 (f16: cfg.kv_type) */
	/* masks */
	uint32_t mask_slots;
	uint64_t max_prompt, max_prompt_blocks, mask_slot_bytes, masks_bytes;
	/* scratch offsets (bytes) */
	uint64_t x, xb, q, k, v, att, attp, attc, hb, hb2, xl, logits, amax, dscr, actq, actd,
		actq2, actd2, mmp, mmc, acth, actl, ascale, meta;
	uint64_t mmp_floats; /* int8 matmul split-K partials (mmp), and its counters */
	uint32_t mmc_words;
	uint64_t meta_words, scratch_bytes;
	/* metadata word offsets */
	uint64_t m_tokens, m_pos, m_seq, m_logit, m_seqinfo, m_tiles, m_ndraw, m_btab, m_draw;
	/* staging offsets (bytes) */
	uint64_t st_logits, st_amax, st_hidden, st_meta, st_mask, staging_bytes;
	uint64_t weights_bytes;
	uint64_t weights_q8_bytes; /* of weights_bytes: held as Q8_0, not the file's type */
};

/* The type a matrix of type t is held in on the device: t itself for the
 * types with kernels (F32, F16, BF16, Q8_0, Q4_0); Q8_0 for the other
 * weight types (Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, Q2_K..Q6_K), which
 * upload_mat requantizes row by row (decoded as the CPU decodes them, then
 * quantized as mkmodel quantizes Q8_0); GPUD_TYPE_COUNT for a type the
 * backend cannot hold. */
enum gpud_type gpud_cuda_dev_type(enum gpud_type t);

/* Device bytes of one matrix (rows x cols of type t in the file) as
 * uploaded, in gpud_cuda_dev_type(t): 0 for a type the backend cannot
 * hold. */
uint64_t gpud_cuda_tensor_bytes(enum gpud_type t, int64_t rows, int64_t cols);

/* Rows [r0, r0 + n) of w in the device layout of an int8 matrix (w's
 * gpud_cuda_dev_type is Q8_0 or Q4_0): their quants to q (n rows of cols
 * bytes for Q8_0, cols / 2 for Q4_0), their fp16 scales to d (n rows of
 * cols / 32). A type held as Q8_0 is decoded and requantized row by row in
 * tmp, gpud_cuda_pack_tmp_bytes(w) bytes (0 for the others), 4-aligned.
 * Pure host code: upload_mat fills staging with it, the unit tests check
 * it without a device. */
uint64_t gpud_cuda_pack_tmp_bytes(const struct gpud_weight *w);
void gpud_cuda_pack_rows(const struct gpud_weight *w, uint64_t r0, uint64_t n, uint8_t *q,
			 uint8_t *d, void *tmp);

/* gpud_cuda_pack_rows with the rows split among nt threads (the caller one
 * of them; at most GPUD_CUDA_PACK_THREADS), when w is requantized (about
 * 250 MB of file a second a core: the slow part of a start-up) and there
 * are at least 4 rows a thread; tmp then holds nt rows of
 * gpud_cuda_pack_tmp_bytes(w). The same bits as one thread. Threads made
 * and joined per call (at init only); one that cannot be made leaves its
 * rows to the caller. */
#define GPUD_CUDA_PACK_THREADS 8
void gpud_cuda_pack_rows_par(const struct gpud_weight *w, uint64_t r0, uint64_t n, uint8_t *q,
			     uint8_t *d, uint8_t *tmp, int nt);

/* Bytes of the scales region of a Q8_0/Q4_0 matrix's quants region, i.e.
 * where its scales start (0 for float types). */
uint64_t gpud_cuda_quants_bytes(enum gpud_type t, int64_t rows, int64_t cols);

/* Fills *l for cfg (its model's shape and the step bounds). Returns 0, or
 * a negative code with a message when the model or cfg cannot run on the
 * backend (head_dim above GPUD_CUDA_MAX_HEAD_DIM, a zero size, a weight
 * type it cannot hold). */
int gpud_cuda_layout_for(const struct gpud_backend_config *cfg, struct gpud_cuda_layout *l,
			 char *err, size_t errlen);

/* --- the device mask slots: an LRU keyed by the host mask ----------------- */

/* A slot holds one compiled mask's image (gpud_cuda_mask_image). Its key is
 * the host mask's identity (address, array addresses) and content key
 * (hash, sizes): the engine's masks are immutable while cached, and a mask
 * recompiled in place differs in hash or sizes. */
struct gpud_cuda_slot {
	const void *id, *seg, *vis;
	uint64_t hash;
	uint32_t n_prompt, n_segments, n_blocks;
	uint64_t stamp; /* step that last used it; 0: empty */
};

/* The slot for mask m in step `stamp` (stamps increase by one per step,
 * starting at 1): a hit returns its slot with *miss false; otherwise the
 * least recently used slot not used by this step is taken (an evicted
 * mask's slot is reused, nothing is freed) and *miss is true: the caller
 * uploads the image. Returns the slot index, or -1 when every slot is in
 * use by this step (n > the step's sequences prevents it). */
int gpud_cuda_slot_get(struct gpud_cuda_slot *slots, uint32_t n, const struct gpud_mask *m,
		       uint64_t stamp, bool *miss);

/* Writes m's slot image into img (layout->mask_slot_bytes): vis rows at 0,
 * block_segs at GPUD_CUDA_VIS_SETS * 16, seg ids after max_prompt_blocks
 * segsets. Returns the bytes to copy (the image up to its last seg id), or
 * 0 when m does not fit a slot (more prompt tokens than max_prompt) or was
 * compiled for another block size. */
size_t gpud_cuda_mask_image(const struct gpud_cuda_layout *l, uint32_t block_tokens,
			    const struct gpud_mask *m, uint8_t *img);

/* Fills the step metadata words (layout above) for batch b: tokens,
 * positions, sequence of each token, token of each logits row, each
 * sequence's block-table offset and mask slot, and the block tables. The
 * masks a sequence needs are looked up in slots (stamp as for
 * gpud_cuda_slot_get); each miss is appended to up_seq[] (the sequence
 * index; at most b->n_seqs) and *n_up counts them: the caller writes their
 * images to their slots before the step's kernels run. *n_tiles counts
 * the step's attention tiles (each sequence's tokens cut into runs of
 * att_tile, in batch order). *n_words is the
 * part of the metadata the step uses (the words to copy: the block tables
 * come last and are only as long as the step's); the draw words (m_draw,
 * after the block tables) are filled, and are to be copied
 * (gpud_cuda_draw_words), only when a row draws: the word m_ndraw
 * counts those rows, and the draw kernel reads nothing else when it is
 * 0. A mask that is
 * causal (or absent) takes no slot. Returns 0, or a negative code with a
 * message when the batch exceeds the layout (block tables longer than
 * max_btab, a mask larger than a slot). */
int gpud_cuda_meta_fill(const struct gpud_cuda_layout *l, uint32_t block_tokens,
			const struct gpud_fwd_batch *b, struct gpud_cuda_slot *slots,
			uint64_t stamp, uint32_t *meta, uint64_t *n_words, uint32_t *up_seq,
			uint32_t *n_up, uint32_t *n_tiles, char *err, size_t errlen);

/* The draw words of batch b to copy after the block tables (m_draw):
 * n_logits rows' when one of its sequences draws, else 0. */
uint64_t gpud_cuda_draw_words(const struct gpud_fwd_batch *b);

/* The largest decode batch with a captured graph: every size 1 .. this
 * gets one (a step of T tokens, each with its logits row, no hidden
 * states); GPUD_CUDA_GRAPH_MAX_T bounded by the step's tokens, sequences
 * (one token each) and logits rows. */
uint32_t gpud_cuda_graph_max_t(const struct gpud_cuda_layout *l);

/* Splits of the attention of a step of T tokens on a device of n_sm
 * multiprocessors (split-K, "flash decoding"): each (token, KV head)'s
 * keys are cut into this many ranges, attended by separate CTAs and
 * combined, so that a small decode batch over a long context still fills
 * the device (about two CTAs per multiprocessor, no more than one wave of
 * per_sm_max a multiprocessor: the decode kernel's occupancy, 0 for no
 * bound). 1 for a step of more than GPUD_CUDA_GRAPH_MAX_T tokens (prefill
 * has CTAs enough); at most GPUD_CUDA_ATT_MAX_SPLITS and
 * GPUD_CUDA_ATT_PARTS / T. Depends on T and the device only, never on
 * positions: a decode graph keeps its grid. */
uint32_t gpud_cuda_att_splits(const struct gpud_cuda_layout *l, uint32_t T, uint32_t n_sm,
			      uint32_t per_sm_max);

/* The int8 tensor-core kernels: the pipelined one (cp.async stages, sm_80
 * and up), which needs columns of whole stages (cols % 64 == 0), and the
 * single-buffered one, which takes every matrix (GPUD_CUDA_MM=single
 * chooses it for all, to compare them). */
enum gpud_cuda_mm_kernel {
	GPUD_CUDA_MM_PIPE = 0,
	GPUD_CUDA_MM_SINGLE = 1,
	GPUD_CUDA_MM_HALF = 2, /* the F16/BF16 tensor-core matmul (gpud_k_mm_h_set) */
};

/* Column splits of the int8 tensor-core matmul of a rows x cols matrix
 * over T tokens (gpud_k_mm_q, gpud_k_mm_h_set) by kernel k: 1 unless T is a decode batch
 * past the GEMV (GPUD_CUDA_GEMV_MAX_T < T <= GPUD_CUDA_MM_TILE_TOKENS, one
 * token tile); then about GPUD_CUDA_MMP_PER_SM (pipelined, half) or 2
 * (single) CTAs per multiprocessor, no more than one wave of per_sm_max a
 * multiprocessor (the CTAs of kernel k one holds at once, the device's
 * occupancy; 0: unknown, no bound), at most GPUD_CUDA_MM_MAX_SPLITS, a
 * stage of columns each at least, the partials (splits x T x rows floats) within
 * part_floats and the row tiles within cnt_words. A function of the shapes
 * and the device only: a decode graph keeps its grid. */
uint32_t gpud_cuda_mm_splits(enum gpud_cuda_mm_kernel k, uint64_t rows, uint64_t cols, uint32_t T,
			     uint64_t part_floats, uint32_t cnt_words, uint32_t n_sm,
			     uint32_t per_sm_max);

/* --- the arg max of a logits row, on the device --------------------------- */

#if defined(__CUDACC__)
#define GPUD_CUDA_HD static __host__ __device__ __forceinline__
#else
#define GPUD_CUDA_HD static inline
#endif

/* Logit v at index i as a key whose unsigned order is gpud_argmax's
 * (gpud/sampler.h): greater logits first, then lower indices; -0 equals
 * +0; NaN and -inf are 0, below every number. The greatest of a row's keys
 * is its arg max, whatever order they are combined in: the device reduces
 * GPUD_CUDA_ARGMAX_PARTS ranges of each row to a key each, the host picks
 * (gpud_cuda_argmax_pick). */
GPUD_CUDA_HD uint64_t gpud_cuda_argmax_key(float v, uint32_t i)
{
	union {
		float f;
		uint32_t u;
	} b;

	if (!(v == v) || v == -INFINITY)
		return 0;
	b.f = v == 0.0f ? 0.0f : v;
	b.u = b.u & 0x80000000u ? ~b.u : b.u | 0x80000000u;
	return (uint64_t)b.u << 32 | (0xffffffffu - i);
}

/* Each of n rows' arg max from its GPUD_CUDA_ARGMAX_PARTS keys (keys[row *
 * GPUD_CUDA_ARGMAX_PARTS + part]) into ids[row]: -1 for a row with no
 * number above -inf. */
void gpud_cuda_argmax_pick(const uint64_t *keys, uint32_t n, int32_t *ids);

/* A CUDA runtime error (cudaError_t value) as a swarm code: -ENOMEM for
 * out-of-memory, -ENODEV for no device / invalid device / no driver,
 * SW_EDEVICE for the sticky errors (a fault, an uncorrectable ECC error,
 * a device that stopped answering: the device is lost to this process),
 * -EIO for anything else; 0 for success. */
int gpud_cuda_errcode(int cuda_err);

#ifdef __cplusplus
}
#endif

#endif
