/* engine.c - sequences, paged KV and batched steps over one backend, plus
 * the single-request generation loop used by the CLI.
 *
 * Everything a step touches is reserved in gpud_engine_create(); a step
 * validates the batch, reserves KV blocks (rolled back on any error),
 * fills the backend's batch description in preallocated arrays and runs
 * the backend's forward pass.
 */
#include "gpud/engine.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/alloc.h"
#include "gpud/backend.h"
#include "gpud/mask.h"
#include "gpud/model.h"
#include "gpud/tokenizer.h"

/* KV budget when neither n_blocks nor kv_bytes is given and max_seqs
 * full-context sequences would need more. */
#define DEFAULT_KV_CAP ((size_t)1 << 30)

/* Generation state of the one request gpud_engine_generate() runs. */
struct gen_state {
	const struct gpud_tokenizer *tok;
	struct gpud_stop stop;
	struct gpud_detok detok;
	gpud_gen_emit_fn emit;
	void *arg;
	char piece[256];
	char out[256 + GPUD_STOP_MAX_LEN];
};

struct gpud_engine {
	const struct gpud_model *model;
	const struct gpud_model_hparams *hp;
	struct gpud_engine_params p;
	const struct gpud_backend_ops *ops;
	void *be;
	struct gpud_kv *kv;
	const struct gpud_mask **masks; /* (max_seqs) per slot, NULL = causal */

	/* Step arrays, reserved once. */
	struct gpud_fwd_seq *fseqs; /* (max_seqs) */
	int32_t *tokens;            /* (max_batch_tokens) */
	uint32_t *logit0;           /* (max_seqs) first logits row per entry, UINT32_MAX none */
	uint8_t *in_batch;          /* (max_seqs) per slot: seen in the batch being checked */
	uint32_t last_n;            /* entries of the last successful step */

	double *embed_acc;          /* (dim) */
	struct gpud_sampler *smp;   /* generate's sampler, reset per request */
	struct gen_state gen;
	int32_t *req_ids;           /* (n_ctx) prompt ids of generate/embed */

	uint64_t steps, step_tokens;
	uint64_t rows_argmax, rows_drawn, rows_host; /* gpud_engine_stats */

	struct gpud_chunk *cc;      /* chunk-KV cache, NULL: off */
	uint32_t *chunk_scan;       /* (max_seqs) per slot: prompt positions
				     * already stored or reused (a segment start) */
	uint32_t *chunk_attached;   /* (max_seqs) per slot: positions attached
				     * from a prefix cache at its start */
	uint32_t *chunk_blk;        /* (n_ctx / block_tokens + 1) blocks of a hit
				     * or of an entry being stored */
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void gpud_engine_params_default(struct gpud_engine_params *p)
{
	*p = (struct gpud_engine_params){
		.n_threads = 0,
		.n_ctx = 0,
		.max_batch_tokens = 512,
		.max_seqs = 16,
		.max_logits = 0,
		.block_tokens = 16,
		.n_blocks = 0,
		.kv_bytes = 0,
		.kv_type = GPUD_TYPE_F32,
		.kind = SW_DEVICE_CPU,
		.ordinal = 0,
	};
}

void gpud_gen_params_default(struct gpud_gen_params *p)
{
	memset(p, 0, sizeof(*p));
	p->max_tokens = 256;
	gpud_sampler_params_default(&p->sampling);
}

static size_t kv_block_bytes(const struct gpud_engine *e)
{
	return (size_t)gpud_kv_block_bytes(e->hp, e->p.block_tokens, e->p.kv_type);
}

/* Resolves defaults into e->p; -EINVAL with a message when inconsistent. */
static int resolve_params(struct gpud_engine *e, const struct gpud_engine_params *in, char *err,
			  size_t errlen)
{
	struct gpud_engine_params *p = &e->p;
	size_t bb;

	if (in)
		*p = *in;
	else
		gpud_engine_params_default(p);
	if (!p->n_ctx || p->n_ctx > e->hp->n_ctx)
		p->n_ctx = e->hp->n_ctx;
	if (!p->max_logits)
		p->max_logits = p->max_seqs;
	if (!p->max_batch_tokens || !p->max_seqs || !p->block_tokens || p->max_seqs > 65536 ||
	    p->block_tokens > 4096 || p->max_batch_tokens > (1u << 20) || p->max_logits > (1u << 20))
		return sw_seterr(err, errlen, -EINVAL,
				 "engine: bad params (max_batch_tokens %u, max_seqs %u, block_tokens "
				 "%u, max_logits %u)", p->max_batch_tokens, p->max_seqs,
				 p->block_tokens, p->max_logits);
	if (!gpud_kv_type_ok(p->kv_type))
		return sw_seterr(err, errlen, -EINVAL, "engine: KV type %s: f32 or f16 only",
				 gpud_type_name(p->kv_type));
	bb = kv_block_bytes(e);
	if (!p->n_blocks) {
		size_t want = (size_t)p->max_seqs * ((p->n_ctx + p->block_tokens - 1) / p->block_tokens);
		size_t budget = p->kv_bytes ? p->kv_bytes : DEFAULT_KV_CAP;
		size_t n = budget / bb;
		if (!p->kv_bytes && n > want)
			n = want;
		if (n > UINT32_MAX - 1)
			n = UINT32_MAX - 1;
		p->n_blocks = (uint32_t)n;
	}
	if (!p->n_blocks)
		return sw_seterr(err, errlen, -EINVAL,
				 "engine: KV budget of %zu bytes holds no %zu-byte block",
				 p->kv_bytes, bb);
	return 0;
}

/* e->ops: the backend for the kind of device in e->p (the registry in
 * gpud/backend.c); SW_EUNSUPPORTED with a message when this build has none. */
static int pick_backend(struct gpud_engine *e, char *err, size_t errlen)
{
	char dev[32];

	e->ops = gpud_backend_for(e->p.kind);
	if (e->ops)
		return 0;
	sw_config_device_name(&(struct sw_config_device){ e->p.kind, e->p.ordinal, 0 }, dev,
			      sizeof(dev));
	return sw_seterr(err, errlen, SW_EUNSUPPORTED,
			 "engine: %s: no backend for this kind of device in this build", dev);
}

/* The chunk cache gives a block back. */
static void chunk_release(void *ctx, uint32_t block)
{
	struct gpud_engine *e = ctx;

	gpud_kv_block_release(e->kv, block);
}

int gpud_engine_create(struct gpud_engine **out, const struct gpud_model *m,
		       const struct gpud_engine_params *p, char *err, size_t errlen)
{
	struct gpud_engine *e;
	struct gpud_backend_config cfg;
	struct gpud_kv_params kp;
	int rc;

	*out = NULL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return sw_seterr(err, errlen, -ENOMEM, "engine: out of memory");
	e->model = m;
	e->hp = gpud_model_hparams(m);
	rc = resolve_params(e, p, err, errlen);
	if (rc)
		goto out_free;
	rc = pick_backend(e, err, errlen);
	if (rc)
		goto out_free;
	kp = (struct gpud_kv_params){ .n_blocks = e->p.n_blocks, .block_tokens = e->p.block_tokens,
				      .max_seqs = e->p.max_seqs, .max_ctx = e->p.n_ctx,
				      .test_leak = e->p.test_leak_kv };
	rc = gpud_kv_create(&e->kv, &kp);
	if (rc) {
		sw_seterr(err, errlen, rc, "engine: KV pool of %u blocks: %s", kp.n_blocks,
			  sw_strerror(rc));
		goto out_free;
	}
	e->masks = calloc(e->p.max_seqs, sizeof(*e->masks));
	e->fseqs = calloc(e->p.max_seqs, sizeof(*e->fseqs));
	e->tokens = calloc(e->p.max_batch_tokens, sizeof(*e->tokens));
	e->logit0 = calloc(e->p.max_seqs, sizeof(*e->logit0));
	e->in_batch = calloc(e->p.max_seqs, 1);
	e->embed_acc = calloc(e->hp->dim, sizeof(*e->embed_acc));
	e->req_ids = calloc(e->p.n_ctx, sizeof(*e->req_ids));
	e->chunk_scan = calloc(e->p.max_seqs, sizeof(*e->chunk_scan));
	e->chunk_attached = calloc(e->p.max_seqs, sizeof(*e->chunk_attached));
	e->chunk_blk = calloc(e->p.n_ctx / e->p.block_tokens + 1, sizeof(*e->chunk_blk));
	if (!e->masks || !e->fseqs || !e->tokens || !e->logit0 || !e->in_batch ||
	    !e->embed_acc || !e->req_ids || !e->chunk_scan || !e->chunk_attached ||
	    !e->chunk_blk) {
		rc = sw_seterr(err, errlen, -ENOMEM, "engine: out of memory");
		goto out_free;
	}
	{
		struct gpud_sampler_params sp;
		gpud_sampler_params_default(&sp);
		rc = gpud_sampler_create(&e->smp, (int32_t)e->hp->n_vocab, &sp, err, errlen);
		if (rc)
			goto out_free;
	}
	cfg = (struct gpud_backend_config){
		.model = m,
		.ordinal = e->p.ordinal,
		.n_threads = e->p.n_threads,
		.n_blocks = e->p.n_blocks,
		.block_tokens = e->p.block_tokens,
		.max_batch_tokens = e->p.max_batch_tokens,
		.max_seqs = e->p.max_seqs,
		.max_logits = e->p.max_logits,
		.kv_type = e->p.kv_type,
	};
	rc = e->ops->init(&e->be, &cfg, err, errlen);
	if (rc)
		goto out_free;
	if (e->p.chunk_bytes && e->ops->kv_copy_shift) {
		struct gpud_chunk_params cp = {
			.block_tokens = e->p.block_tokens,
			.block_bytes = kv_block_bytes(e),
			.max_bytes = e->p.chunk_bytes,
			.max_blocks = e->p.n_blocks,
			.release = chunk_release,
			.ctx = e,
		};
		rc = gpud_chunk_create(&e->cc, &cp);
		if (rc) {
			sw_seterr(err, errlen, rc, "engine: chunk-KV cache of %zu bytes: %s",
				  e->p.chunk_bytes, rc == -EINVAL ? "holds no KV block" :
				  sw_strerror(rc));
			goto out_free;
		}
	}
	if (e->ops->stats) {
		/* the backend's reservations: KV storage, step scratch and the
		 * weights it holds itself (CPU: packed copies) */
		struct gpud_backend_stats bs = { 0 };

		e->ops->stats(e->be, &bs);
		gpud_alloc_device_note(e->p.device, bs.kv_bytes);
		gpud_alloc_device_note(e->p.device, bs.scratch_bytes);
		if (bs.weight_bytes)
			gpud_alloc_device_note(e->p.device, bs.weight_bytes);
	}
	*out = e;
	return 0;

out_free:
	gpud_engine_destroy(e);
	return rc;
}

void gpud_engine_destroy(struct gpud_engine *e)
{
	if (!e)
		return;
	gpud_chunk_destroy(e->cc); /* its blocks back to the pool first */
	if (e->ops)
		e->ops->destroy(e->be);
	gpud_kv_destroy(e->kv);
	free(e->chunk_scan);
	free(e->chunk_attached);
	free(e->chunk_blk);
	free(e->masks);
	free(e->fseqs);
	free(e->tokens);
	free(e->logit0);
	free(e->in_batch);
	free(e->embed_acc);
	free(e->req_ids);
	gpud_sampler_free(e->smp);
	free(e);
}

const struct gpud_model *gpud_engine_model(const struct gpud_engine *e) { return e->model; }
const struct gpud_engine_params *gpud_engine_params(const struct gpud_engine *e) { return &e->p; }
uint32_t gpud_engine_n_vocab(const struct gpud_engine *e) { return e->hp->n_vocab; }
uint32_t gpud_engine_dim(const struct gpud_engine *e) { return e->hp->dim; }

int gpud_engine_seq_add(struct gpud_engine *e, const struct gpud_mask *mask, uint32_t *seq)
{
	int rc;

	if (mask && mask->block_tokens != e->p.block_tokens)
		return -EINVAL;
	rc = gpud_kv_seq_new(e->kv, seq);
	if (rc)
		return rc;
	e->masks[*seq] = mask;
	e->chunk_scan[*seq] = 0;
	e->chunk_attached[*seq] = 0;
	return 0;
}

int gpud_engine_seq_add_prefix(struct gpud_engine *e, const struct gpud_mask *mask,
			       const uint32_t *blocks, uint32_t n, uint32_t *seq)
{
	int rc;

	if ((uint64_t)n * e->p.block_tokens > e->p.n_ctx)
		return SW_ETOOLONG;
	rc = gpud_engine_seq_add(e, mask, seq);
	if (rc)
		return rc;
	rc = gpud_kv_seq_attach(e->kv, *seq, blocks, n);
	if (rc)
		gpud_engine_seq_free(e, *seq);
	else
		e->chunk_attached[*seq] = n * e->p.block_tokens;
	return rc;
}

int gpud_engine_block_hold(struct gpud_engine *e, uint32_t block)
{
	return gpud_kv_block_hold(e->kv, block);
}

int gpud_engine_block_release(struct gpud_engine *e, uint32_t block)
{
	return gpud_kv_block_release(e->kv, block);
}

size_t gpud_engine_block_bytes(const struct gpud_engine *e)
{
	return kv_block_bytes(e);
}

const struct gpud_kv *gpud_engine_kv(const struct gpud_engine *e)
{
	return e->kv;
}

int gpud_engine_seq_free(struct gpud_engine *e, uint32_t seq)
{
	int rc = gpud_kv_seq_free(e->kv, seq);

	if (!rc)
		e->masks[seq] = NULL;
	return rc;
}

uint32_t gpud_engine_seq_len(const struct gpud_engine *e, uint32_t seq)
{
	return gpud_kv_seq_len(e->kv, seq);
}

const uint32_t *gpud_engine_block_table(const struct gpud_engine *e, uint32_t seq, uint32_t *n)
{
	return gpud_kv_block_table(e->kv, seq, n);
}

int gpud_engine_seq_truncate(struct gpud_engine *e, uint32_t seq, uint32_t n)
{
	return gpud_kv_truncate(e->kv, seq, n);
}

uint32_t gpud_engine_blocks_needed(const struct gpud_engine *e, uint32_t seq, uint32_t n)
{
	uint64_t bt = e->p.block_tokens, have = gpud_kv_seq_capacity(e->kv, seq);
	uint64_t want = (uint64_t)gpud_kv_seq_len(e->kv, seq) + n;

	return want <= have ? 0 : (uint32_t)((want - have + bt - 1) / bt);
}

uint32_t gpud_engine_free_blocks(const struct gpud_engine *e)
{
	return gpud_kv_free_blocks(e->kv) + (e->cc ? gpud_chunk_blocks(e->cc) : 0);
}

/* Evicts chunk entries until want blocks are free in the pool or no
 * unpinned entry is left; true when want are free. */
static bool chunk_reclaim(struct gpud_engine *e, uint64_t want)
{
	while (gpud_kv_free_blocks(e->kv) < want)
		if (!e->cc || gpud_chunk_evict(e->cc))
			return false;
	return true;
}

/* Checks the whole batch before anything changes. */
static int check_batch(struct gpud_engine *e, const struct gpud_batch_entry *ents,
		       const struct gpud_draw *draws, uint32_t n,
		       char *err, size_t errlen)
{
	uint32_t total = 0, rows = 0;
	int rc = 0;

	if (!n)
		return sw_seterr(err, errlen, -EINVAL, "step: empty batch");
	if (n > e->p.max_seqs)
		return sw_seterr(err, errlen, SW_ETOOLONG, "step: %u entries, at most %u", n,
				 e->p.max_seqs);
	memset(e->in_batch, 0, e->p.max_seqs);
	for (uint32_t i = 0; i < n && !rc; i++) {
		const struct gpud_batch_entry *b = &ents[i];
		uint32_t len;

		if (!gpud_kv_seq_valid(e->kv, b->seq)) {
			rc = sw_seterr(err, errlen, -EINVAL, "step: entry %u: no sequence %u", i,
				       b->seq);
			break;
		}
		if (e->in_batch[b->seq]++) {
			rc = sw_seterr(err, errlen, -EINVAL, "step: sequence %u appears twice",
				       b->seq);
			break;
		}
		if (!b->n_tokens || !b->tokens) {
			rc = sw_seterr(err, errlen, -EINVAL, "step: entry %u has no tokens", i);
			break;
		}
		len = gpud_kv_seq_len(e->kv, b->seq);
		if (b->n_tokens > e->p.n_ctx - len) {
			rc = sw_seterr(err, errlen, SW_ETOOLONG,
				       "step: sequence %u would reach %llu positions, context is %u",
				       b->seq, (unsigned long long)len + b->n_tokens, e->p.n_ctx);
			break;
		}
		for (uint32_t j = 0; j < b->n_tokens; j++) {
			if (b->tokens[j] < 0 || (uint32_t)b->tokens[j] >= e->hp->n_vocab) {
				rc = sw_seterr(err, errlen, -EINVAL,
					       "step: entry %u token %u: id %d outside the "
					       "vocabulary of %u", i, j, b->tokens[j],
					       e->hp->n_vocab);
				break;
			}
		}
		total += b->n_tokens;
		if (total > e->p.max_batch_tokens && !rc)
			rc = sw_seterr(err, errlen, SW_ETOOLONG,
				       "step: more than max_batch_tokens (%u) tokens",
				       e->p.max_batch_tokens);
		if (b->logits == GPUD_LOGITS_DRAW && !rc &&
		    (!gpud_engine_device_draw(e) || !draws || draws[i].n_pen > GPUD_DRAW_MAX_PEN))
			rc = sw_seterr(err, errlen, -EINVAL, "step: entry %u: %s", i,
				       !gpud_engine_device_draw(e) ? "this backend does not draw" :
				       !draws ? "a draw entry without its draw" :
						"a draw with too many penalized tokens");
		if (b->logits == GPUD_LOGITS_LAST || b->logits == GPUD_LOGITS_ARGMAX ||
		    b->logits == GPUD_LOGITS_DRAW)
			rows += 1;
		else if (b->logits == GPUD_LOGITS_ALL)
			rows += b->n_tokens;
		else if (b->logits != GPUD_LOGITS_NONE && !rc)
			rc = sw_seterr(err, errlen, -EINVAL, "step: entry %u: bad logits mode", i);
		if (rows > e->p.max_logits && !rc)
			rc = sw_seterr(err, errlen, SW_ETOOLONG,
				       "step: more than max_logits (%u) logits rows", e->p.max_logits);
	}
	return rc;
}

static int do_step(struct gpud_engine *e, const struct gpud_batch_entry *ents,
		   const struct gpud_draw *draws, uint32_t n, bool want_hidden, char *err,
		   size_t errlen)
{
	struct gpud_fwd_batch fb = { .tokens = e->tokens, .seqs = e->fseqs, .n_seqs = n,
				     .want_hidden = want_hidden };
	uint32_t reserved = 0;
	int rc;

	rc = check_batch(e, ents, draws, n, err, errlen);
	if (rc)
		return rc;
	if (e->cc) {
		uint64_t want = 0;
		for (uint32_t i = 0; i < n; i++)
			want += gpud_engine_blocks_needed(e, ents[i].seq, ents[i].n_tokens);
		chunk_reclaim(e, want);
	}
	for (; reserved < n; reserved++) {
		const struct gpud_batch_entry *b = &ents[reserved];
		rc = gpud_kv_reserve(e->kv, b->seq, gpud_kv_seq_len(e->kv, b->seq) + b->n_tokens);
		if (rc) {
			sw_seterr(err, errlen, rc, "step: sequence %u: %s", b->seq,
				  rc == SW_EEXHAUSTED ? "KV pool exhausted" : sw_strerror(rc));
			goto out_rollback;
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		const struct gpud_batch_entry *b = &ents[i];
		struct gpud_fwd_seq *s = &e->fseqs[i];
		uint32_t nb;

		s->blocks = gpud_kv_block_table(e->kv, b->seq, &nb);
		s->mask = e->masks[b->seq];
		s->pos0 = gpud_kv_seq_len(e->kv, b->seq);
		s->n_tokens = b->n_tokens;
		s->tok0 = fb.n_tokens;
		s->logit0 = fb.n_logits;
		s->n_logits = b->logits == GPUD_LOGITS_ALL ? b->n_tokens :
			      b->logits == GPUD_LOGITS_NONE ? 0 : 1;
		s->argmax = b->logits == GPUD_LOGITS_ARGMAX || b->logits == GPUD_LOGITS_DRAW;
		s->draw = b->logits == GPUD_LOGITS_DRAW ? &draws[i] : NULL;
		e->logit0[i] = s->n_logits ? s->logit0 : UINT32_MAX;
		memcpy(e->tokens + fb.n_tokens, b->tokens, b->n_tokens * sizeof(int32_t));
		fb.n_tokens += b->n_tokens;
		fb.n_logits += s->n_logits;
	}
	rc = e->ops->forward(e->be, &fb, err, errlen);
	if (rc)
		goto out_rollback;
	for (uint32_t i = 0; i < n; i++)
		gpud_kv_set_len(e->kv, ents[i].seq,
				gpud_kv_seq_len(e->kv, ents[i].seq) + ents[i].n_tokens);
	e->last_n = n;
	e->steps++;
	e->step_tokens += fb.n_tokens;
	for (uint32_t i = 0; i < n; i++) {
		if (ents[i].logits == GPUD_LOGITS_ARGMAX)
			e->rows_argmax++;
		else if (ents[i].logits == GPUD_LOGITS_DRAW)
			e->rows_drawn++;
		else
			e->rows_host += e->fseqs[i].n_logits;
	}
	return 0;

out_rollback:
	/* Blocks always match the length between steps, so truncating to the
	 * length returns exactly what this step reserved. */
	for (uint32_t i = 0; i < reserved; i++)
		gpud_kv_truncate(e->kv, ents[i].seq, gpud_kv_seq_len(e->kv, ents[i].seq));
	e->last_n = 0;
	return rc;
}

int gpud_engine_step(struct gpud_engine *e, const struct gpud_batch_entry *ents, uint32_t n,
		     char *err, size_t errlen)
{
	return do_step(e, ents, NULL, n, false, err, errlen);
}

int gpud_engine_step_draws(struct gpud_engine *e, const struct gpud_batch_entry *ents,
			   const struct gpud_draw *draws, uint32_t n, char *err, size_t errlen)
{
	return do_step(e, ents, draws, n, false, err, errlen);
}

const float *gpud_engine_logits(const struct gpud_engine *e, uint32_t i)
{
	if (i >= e->last_n || e->logit0[i] == UINT32_MAX || e->fseqs[i].argmax)
		return NULL;
	return e->ops->logits(e->be) + (size_t)e->logit0[i] * e->hp->n_vocab;
}

/* Entry i's last logits row in the backend's logits (i has rows). */
static const float *last_row(const struct gpud_engine *e, uint32_t i)
{
	return e->ops->logits(e->be) +
	       ((size_t)e->logit0[i] + e->fseqs[i].n_logits - 1) * e->hp->n_vocab;
}

int32_t gpud_engine_argmax(const struct gpud_engine *e, uint32_t i)
{
	int32_t id;

	if (i >= e->last_n || e->logit0[i] == UINT32_MAX)
		return -ENOENT;
	if (!e->fseqs[i].argmax || !e->ops->argmax)
		return gpud_argmax(last_row(e, i), (int32_t)e->hp->n_vocab);
	id = e->ops->argmax(e->be)[e->logit0[i]];
	return id >= 0 && (uint32_t)id < e->hp->n_vocab ? id : -EINVAL;
}

bool gpud_engine_device_argmax(const struct gpud_engine *e)
{
	return e->ops->argmax != NULL;
}

bool gpud_engine_device_draw(const struct gpud_engine *e)
{
	return e->ops->argmax != NULL && e->ops->draws;
}

int32_t gpud_engine_sample(const struct gpud_engine *e, uint32_t i, struct gpud_sampler *smp,
			   struct gpud_sampler_scratch *sc)
{
	if (i >= e->last_n || e->logit0[i] == UINT32_MAX)
		return -ENOENT;
	if (e->fseqs[i].draw) {
		gpud_sampler_draw_done(smp);
		return gpud_engine_argmax(e, i);
	}
	if (e->fseqs[i].argmax)
		return gpud_engine_argmax(e, i);
	return gpud_sampler_sample_with(smp, sc, last_row(e, i));
}

void gpud_engine_stats(const struct gpud_engine *e, struct gpud_engine_stats *st)
{
	struct gpud_backend_stats bs = { 0 };

	if (e->ops->stats)
		e->ops->stats(e->be, &bs);
	memset(st, 0, sizeof(*st));
	st->steps = e->steps;
	st->tokens = e->step_tokens;
	st->allocs_after_warmup = bs.allocs_after_init;
	st->rows_argmax = e->rows_argmax;
	st->rows_drawn = e->rows_drawn;
	st->rows_host = e->rows_host;
	st->kv_bytes = bs.kv_bytes;
	st->scratch_bytes = bs.scratch_bytes;
	st->scratch_high = bs.scratch_high;
	gpud_kv_stats(e->kv, &st->kv);
	if (e->cc)
		gpud_chunk_stats(e->cc, &st->chunk);
}

/* --- chunk-KV cache --------------------------------------------------------- */

bool gpud_engine_chunk_holds(const struct gpud_engine *e, uint32_t block)
{
	return e->cc && gpud_chunk_holds(e->cc, block);
}

bool gpud_engine_chunk_enabled(const struct gpud_engine *e)
{
	return e->cc != NULL;
}

void gpud_engine_chunk_stats(const struct gpud_engine *e, struct gpud_chunk_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (e->cc)
		gpud_chunk_stats(e->cc, st);
}

bool gpud_engine_chunk_reclaim(struct gpud_engine *e, uint64_t blocks)
{
	return chunk_reclaim(e, blocks);
}

void gpud_engine_chunk_flush(struct gpud_engine *e)
{
	while (e->cc && !gpud_chunk_evict(e->cc))
		;
}

/* True when segment s sees only itself. */
static bool self_only(const struct gpud_mask *m, unsigned s)
{
	gpud_segset one = { { 0, 0 } };

	gpud_segset_add(&one, s);
	return m->vis[s].w[0] == one.w[0] && m->vis[s].w[1] == one.w[1];
}

/* End of the segment that starts at pos (pos < n_prompt). */
static uint32_t seg_end(const struct gpud_mask *m, uint32_t pos, uint32_t n_prompt)
{
	uint8_t s = m->seg[pos];

	while (pos < n_prompt && m->seg[pos] == s)
		pos++;
	return pos;
}

/* Copies positions [0, n) of the blocks src (laid out from offset 0) to
 * positions [pos, pos + n) of the blocks dst (block j holding positions
 * [j*B, (j+1)*B)), or the other way round when to_dst is false, with K
 * rotated by delta. Runs split at both sides' block edges. */
static int chunk_copy(struct gpud_engine *e, const uint32_t *compact, const uint32_t *table,
		      uint32_t pos, uint32_t n, int32_t delta, bool to_table)
{
	uint32_t bt = e->p.block_tokens;

	for (uint32_t j = 0; j < n;) {
		uint32_t co = j % bt, to = (pos + j) % bt;
		uint32_t run = bt - (co > to ? co : to);
		uint32_t cb = compact[j / bt], tb = table[(pos + j) / bt];
		int rc;

		if (run > n - j)
			run = n - j;
		rc = to_table ? e->ops->kv_copy_shift(e->be, tb, to, cb, co, run, delta) :
				e->ops->kv_copy_shift(e->be, cb, co, tb, to, run, delta);
		if (rc)
			return rc;
		j += run;
	}
	return 0;
}

int gpud_engine_chunk_reuse(struct gpud_engine *e, uint32_t seq, const int32_t *prompt,
			    uint32_t n_prompt, uint32_t max_blocks, uint32_t *n_reused)
{
	const struct gpud_mask *m;
	uint32_t min = e->p.chunk_min_tokens ? e->p.chunk_min_tokens : e->p.block_tokens;
	int rc = 0;

	*n_reused = 0;
	if (!gpud_kv_seq_valid(e->kv, seq))
		return -EINVAL;
	m = e->masks[seq];
	if (!e->cc || !m)
		return 0;
	if (n_prompt > m->n_prompt)
		n_prompt = m->n_prompt;
	for (;;) {
		uint32_t pos = gpud_kv_seq_len(e->kv, seq), end, n, need, nb;
		struct gpud_chunk_hit hit;
		const uint32_t *table;

		if (pos >= n_prompt || (pos && m->seg[pos - 1] == m->seg[pos]) ||
		    !self_only(m, m->seg[pos]))
			break;
		end = seg_end(m, pos, n_prompt);
		n = end - pos;
		if (end >= n_prompt || n < min)
			break;
		need = gpud_engine_blocks_needed(e, seq, n);
		if (need > max_blocks)
			break;
		if (gpud_chunk_find(e->cc, prompt + pos, n, &hit, e->chunk_blk))
			break; /* computed: chunk_store counts the miss */
		/* The hit is pinned: reclaiming cannot take its blocks. */
		if (!chunk_reclaim(e, need) || gpud_kv_reserve(e->kv, seq, end)) {
			gpud_chunk_unpin(e->cc, &hit);
			break;
		}
		table = gpud_kv_block_table(e->kv, seq, &nb);
		rc = chunk_copy(e, e->chunk_blk, table, pos, n, (int32_t)pos - hit.pos0, true);
		gpud_chunk_unpin(e->cc, &hit);
		if (rc) {
			gpud_kv_truncate(e->kv, seq, pos);
			break;
		}
		gpud_kv_set_len(e->kv, seq, end);
		gpud_chunk_account(e->cc, 1, n, 0);
		e->chunk_scan[seq] = end;
		*n_reused += n;
		max_blocks -= need;
	}
	return rc;
}

uint32_t gpud_engine_chunk_until(const struct gpud_engine *e, uint32_t seq,
				 const int32_t *prompt, uint32_t n_prompt)
{
	const struct gpud_mask *m;
	uint32_t min = e->p.chunk_min_tokens ? e->p.chunk_min_tokens : e->p.block_tokens;
	uint32_t len, pos;

	if (!e->cc || !gpud_kv_seq_valid(e->kv, seq) || !(m = e->masks[seq]))
		return UINT32_MAX;
	if (n_prompt > m->n_prompt)
		n_prompt = m->n_prompt;
	len = gpud_kv_seq_len(e->kv, seq);
	if (len >= n_prompt)
		return UINT32_MAX;
	pos = len && m->seg[len - 1] == m->seg[len] ? seg_end(m, len, n_prompt) : len;
	while (pos < n_prompt) {
		uint32_t end = seg_end(m, pos, n_prompt);

		if (end >= n_prompt)
			break;
		if (end - pos >= min && self_only(m, m->seg[pos]) &&
		    gpud_chunk_contains(e->cc, prompt + pos, end - pos))
			return pos - len;
		pos = end;
	}
	return UINT32_MAX;
}

/* Caches positions [pos, pos + n) of seq (tokens: their ids). */
static int chunk_store_one(struct gpud_engine *e, uint32_t seq, const int32_t *tokens,
			   uint32_t pos, uint32_t n)
{
	uint32_t bt = e->p.block_tokens, nb = (n + bt - 1) / bt, got = 0, tn;
	const uint32_t *table;
	int rc;

	/* Stores never take the pool's last eighth: a step that needs blocks
	 * then rarely waits on evictions, and what sequences reach stays
	 * theirs alone to reach (the high-water mark of the pool). */
	if (gpud_chunk_contains(e->cc, tokens, n) || gpud_chunk_make_room(e->cc, nb) ||
	    !chunk_reclaim(e, (uint64_t)nb + e->p.n_blocks / 8))
		return 0;
	for (; got < nb; got++)
		if (gpud_kv_block_take(e->kv, &e->chunk_blk[got]))
			goto out_release;
	table = gpud_kv_block_table(e->kv, seq, &tn);
	rc = chunk_copy(e, e->chunk_blk, table, pos, n, 0, false);
	if (rc || gpud_chunk_insert(e->cc, tokens, n, (int32_t)pos, e->chunk_blk))
		goto out_release;
	return 1;

out_release:
	while (got)
		gpud_kv_block_release(e->kv, e->chunk_blk[--got]);
	return 0;
}

int gpud_engine_chunk_store(struct gpud_engine *e, uint32_t seq, const int32_t *prompt,
			    uint32_t n_prompt)
{
	const struct gpud_mask *m;
	uint32_t min = e->p.chunk_min_tokens ? e->p.chunk_min_tokens : e->p.block_tokens;
	uint32_t pos, len;
	int stored = 0;

	if (!gpud_kv_seq_valid(e->kv, seq))
		return -EINVAL;
	m = e->masks[seq];
	if (!e->cc || !m)
		return 0;
	if (n_prompt > m->n_prompt)
		n_prompt = m->n_prompt;
	len = gpud_kv_seq_len(e->kv, seq);
	for (pos = e->chunk_scan[seq]; pos < n_prompt;) {
		uint32_t end = seg_end(m, pos, n_prompt);

		if (end > len)
			break; /* not all written yet: looked at again next time */
		/* Not the first segment: at position 0 it is the prefix
		 * cache's (a chunk stored elsewhere is still reused there);
		 * nor one the prefix cache served whole: neither computed
		 * nor copied, and cached already if it ever was. */
		if (pos && end > e->chunk_attached[seq] && end - pos >= min &&
		    self_only(m, m->seg[pos])) {
			gpud_chunk_account(e->cc, 0, 0, 1); /* computed, not copied */
			stored += chunk_store_one(e, seq, prompt + pos, pos, end - pos);
		}
		pos = end;
	}
	e->chunk_scan[seq] = pos;
	return stored;
}

int gpud_engine_check(const struct gpud_engine *e, char *err, size_t errlen)
{
	return gpud_kv_check(e->kv, err, errlen);
}

/* --- embeddings ----------------------------------------------------------- */

int gpud_engine_embed_tokens(struct gpud_engine *e, const int32_t *tokens, uint32_t n,
			     float *out, char *err, size_t errlen)
{
	uint32_t dim = e->hp->dim, seq, done = 0;
	double norm = 0;
	int rc;

	if (!n)
		return sw_seterr(err, errlen, -EINVAL, "embed: no tokens");
	if (n > e->p.n_ctx)
		return sw_seterr(err, errlen, SW_ETOOLONG, "embed: %u tokens, context is %u", n,
				 e->p.n_ctx);
	if (!e->ops->hidden)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED, "embed: backend %s lacks hidden()",
				 e->ops->name);
	rc = gpud_engine_seq_add(e, NULL, &seq);
	if (rc)
		return sw_seterr(err, errlen, rc, "embed: no free sequence slot");
	memset(e->embed_acc, 0, dim * sizeof(double));
	while (done < n) {
		uint32_t chunk = n - done < e->p.max_batch_tokens ? n - done : e->p.max_batch_tokens;
		struct gpud_batch_entry b = { .seq = seq, .tokens = tokens + done,
					      .n_tokens = chunk, .logits = GPUD_LOGITS_NONE };
		const float *h;

		rc = do_step(e, &b, NULL, 1, true, err, errlen);
		if (rc)
			goto out_free_seq;
		h = e->ops->hidden(e->be);
		for (uint32_t t = 0; t < chunk; t++)
			for (uint32_t i = 0; i < dim; i++)
				e->embed_acc[i] += h[(size_t)t * dim + i];
		done += chunk;
	}
	for (uint32_t i = 0; i < dim; i++) {
		e->embed_acc[i] /= n;
		norm += e->embed_acc[i] * e->embed_acc[i];
	}
	norm = norm > 0 ? 1.0 / sqrt(norm) : 0;
	for (uint32_t i = 0; i < dim; i++)
		out[i] = (float)(e->embed_acc[i] * norm);
out_free_seq:
	gpud_engine_seq_free(e, seq);
	e->last_n = 0;
	return rc;
}

/* Tokenizes text into e->req_ids with working memory from a request arena. */
static int tokenize_request(struct gpud_engine *e, const char *text, size_t len, unsigned flags,
			    size_t *n_out, char *err, size_t errlen)
{
	const struct gpud_tokenizer *tok = gpud_model_tokenizer(e->model);
	struct sw_arena a;
	size_t cap = gpud_tokenizer_scratch_bytes(tok, len);
	int rc;

	rc = sw_arena_init(&a, cap);
	if (rc)
		return sw_seterr(err, errlen, rc, "tokenize: out of memory");
	rc = gpud_tokenizer_encode(tok, text, len, flags, e->req_ids, e->p.n_ctx, n_out, &a);
	sw_arena_destroy(&a);
	if (rc == SW_ETOOLONG)
		return sw_seterr(err, errlen, rc, "prompt of %zu tokens exceeds the context of %u",
				 *n_out, e->p.n_ctx);
	if (rc)
		return sw_seterr(err, errlen, rc, "tokenize: %s", sw_strerror(rc));
	return 0;
}

int gpud_engine_embed(struct gpud_engine *e, const char *text, size_t len, float *out,
		      char *err, size_t errlen)
{
	const struct gpud_tokenizer *tok = gpud_model_tokenizer(e->model);
	size_t n = 0;
	int rc;

	rc = tokenize_request(e, text, len, gpud_tokenizer_add_bos(tok) ? GPUD_TOK_ADD_BOS : 0, &n,
			      err, errlen);
	if (rc)
		return rc;
	return gpud_engine_embed_tokens(e, e->req_ids, (uint32_t)n, out, err, errlen);
}

/* --- generation ------------------------------------------------------------ */


/* Passes released text to the caller; GPUD_GEN_STOP_CALLER when it asks to stop. */
static int gen_emit(struct gen_state *g, const char *s, size_t n)
{
	if (n && g->emit && g->emit(g->arg, s, n))
		return GPUD_GEN_STOP_CALLER;
	return GPUD_STOP_NONE;
}

/* Feeds one sampled token through detok and the stop filter. */
static int gen_push(struct gen_state *g, int32_t id)
{
	bool eog = gpud_tokenizer_is_eog(g->tok, id);
	size_t olen = 0;
	int n = 0, reason, r2;

	if (!eog) {
		n = gpud_detok_push(g->tok, &g->detok, id, g->piece, sizeof(g->piece));
		if (n < 0)
			n = 0;
	}
	reason = gpud_stop_push(&g->stop, eog, g->piece, (size_t)n, g->out, sizeof(g->out), &olen);
	r2 = gen_emit(g, g->out, olen);
	return reason != GPUD_STOP_NONE ? reason : r2;
}

/* Releases held text at an end the stop filter did not see. */
static void gen_flush(struct gen_state *g)
{
	size_t olen = 0;
	int n;

	if (g->stop.reason == GPUD_STOP_NONE) {
		n = gpud_detok_flush(&g->detok, g->piece, sizeof(g->piece));
		gpud_stop_push(&g->stop, true, g->piece, n > 0 ? (size_t)n : 0, g->out,
			       sizeof(g->out), &olen);
		gen_emit(g, g->out, olen);
	}
}

/* How the next token's row is asked for: its arg max (greedy), a draw
 * where the row is (a backend that draws; *draw filled), or the row. */
static enum gpud_logits_mode logits_mode(const struct gpud_engine *e,
					 const struct gpud_sampler *smp, struct gpud_draw *draw)
{
	if (gpud_sampler_greedy(smp))
		return GPUD_LOGITS_ARGMAX;
	if (gpud_engine_device_draw(e) && gpud_sampler_draw_next(smp, draw))
		return GPUD_LOGITS_DRAW;
	return GPUD_LOGITS_LAST;
}

int gpud_engine_generate(struct gpud_engine *e, const char *prompt, size_t len,
			 const struct gpud_gen_params *p, gpud_gen_emit_fn emit, void *arg,
			 struct gpud_gen_result *res, char *err, size_t errlen)
{
	struct gen_state *g = &e->gen;
	struct gpud_sampler *smp = e->smp;
	struct gpud_draw draw;
	unsigned flags = 0;
	size_t n_prompt = 0;
	uint32_t seq, done = 0, chunk_max;
	double t0;
	int rc, reason = GPUD_STOP_NONE;

	memset(res, 0, sizeof(*res));
	memset(g, 0, sizeof(*g));
	g->tok = gpud_model_tokenizer(e->model);
	g->emit = emit;
	g->arg = arg;
	/* The text continues the prompt: keep the first piece's leading space. */
	gpud_detok_init_continuation(&g->detok);
	gpud_stop_init(&g->stop, p->max_tokens);
	for (uint32_t i = 0; i < p->n_stop; i++) {
		rc = gpud_stop_add(&g->stop, p->stop[i], strlen(p->stop[i]));
		if (rc) {
			sw_seterr(err, errlen, rc, "generate: stop string %u: %s", i, sw_strerror(rc));
			goto out;
		}
	}
	rc = gpud_sampler_reset(smp, &p->sampling, err, errlen);
	if (rc)
		goto out;
	if (!p->no_bos && gpud_tokenizer_add_bos(g->tok))
		flags |= GPUD_TOK_ADD_BOS;
	if (p->parse_special)
		flags |= GPUD_TOK_PARSE_SPECIAL;
	rc = tokenize_request(e, prompt, len, flags, &n_prompt, err, errlen);
	if (rc)
		goto out;
	if (!n_prompt) {
		rc = sw_seterr(err, errlen, -EINVAL, "generate: empty prompt");
		goto out;
	}
	res->n_prompt = (uint32_t)n_prompt;
	rc = gpud_engine_seq_add(e, NULL, &seq);
	if (rc) {
		sw_seterr(err, errlen, rc, "generate: no free sequence slot");
		goto out;
	}
	for (size_t i = 0; i < n_prompt; i++)
		gpud_sampler_accept(smp, e->req_ids[i]);

	chunk_max = p->prefill_chunk && p->prefill_chunk < e->p.max_batch_tokens ?
		    p->prefill_chunk : e->p.max_batch_tokens;
	t0 = now_s();
	while (done < n_prompt) {
		uint32_t chunk = (uint32_t)n_prompt - done < chunk_max ? (uint32_t)n_prompt - done :
			       chunk_max;
		struct gpud_batch_entry b = {
			.seq = seq, .tokens = e->req_ids + done, .n_tokens = chunk,
			.logits = done + chunk < n_prompt ? GPUD_LOGITS_NONE :
							    logits_mode(e, smp, &draw),
		};
		rc = gpud_engine_step_draws(e, &b, &draw, 1, err, errlen);
		if (rc)
			goto out_free_seq;
		done += chunk;
	}
	res->prefill_s = now_s() - t0;

	t0 = now_s();
	for (;;) {
		int32_t id = gpud_engine_sample(e, 0, smp, NULL);
		struct gpud_batch_entry b = { .seq = seq, .tokens = &id, .n_tokens = 1 };

		if (id < 0) {
			rc = sw_seterr(err, errlen, id, "generate: no token can be sampled");
			break;
		}
		gpud_sampler_accept(smp, id);
		res->n_gen++;
		reason = gen_push(g, id);
		if (reason != GPUD_STOP_NONE)
			break;
		if (gpud_engine_seq_len(e, seq) >= e->p.n_ctx) {
			reason = GPUD_GEN_STOP_CONTEXT;
			break;
		}
		b.logits = logits_mode(e, smp, &draw);
		rc = gpud_engine_step_draws(e, &b, &draw, 1, err, errlen);
		if (rc)
			break;
	}
	res->decode_s = now_s() - t0;
	if (reason != GPUD_GEN_STOP_CALLER)
		gen_flush(g);
	res->reason = reason;

out_free_seq:
	gpud_engine_seq_free(e, seq);
	e->last_n = 0;
out:
	return rc;
}
