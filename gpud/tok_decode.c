/* tok_decode.c - from token ids back to text: single pieces and the
 * streaming detokenizer, which holds an incomplete UTF-8 sequence back
 * until the token that completes it arrives (invalid bytes become U+FFFD).
 * Pieces were decoded at load (byte tokens, "▁" -> space, the GPT-2
 * byte map undone), so decoding is copying.
 */
#include <errno.h>
#include <string.h>

#include "common/err.h"
#include "gpud/tokenizer_impl.h"
#include "gpud/unicode.h"

int gpud_tokenizer_piece(const struct gpud_tokenizer *t, int32_t id, bool special, char *out,
			 size_t cap)
{
	if (id < 0 || id >= t->n_vocab)
		return -EINVAL;
	const struct tok_entry *e = &t->tok[id];
	uint32_t off = e->dec_off, len = e->dec_len;

	if (e->type == TT_UNUSED || ((e->type == TT_CONTROL || e->type == TT_UNKNOWN) && !special))
		len = 0;
	if (len > cap)
		return SW_ETOOLONG;
	memcpy(out, t->blob + off, len);
	return (int)len;
}

void gpud_detok_init(struct gpud_detok *d)
{
	memset(d, 0, sizeof(*d));
}

void gpud_detok_init_continuation(struct gpud_detok *d)
{
	memset(d, 0, sizeof(*d));
	d->started = true;
}

struct outbuf {
	char *p;
	size_t cap, n;
	bool full;
};

static void out_put(struct outbuf *o, const void *p, size_t n)
{
	if (o->n + n > o->cap) {
		o->full = true;
		return;
	}
	memcpy(o->p + o->n, p, n);
	o->n += n;
}

/* Feeds one byte through the UTF-8 assembler in d. */
static void detok_byte(struct gpud_detok *d, uint8_t b, struct outbuf *o)
{
	static const char fffd[] = "\xEF\xBF\xBD";

	for (;;) {
		if (d->n_pending == 0) {
			size_t n = gpud_utf8_seq_len(b);
			if (n == 1)
				out_put(o, &b, 1);
			else if (n == 0)
				out_put(o, fffd, 3);
			else
				d->pending[d->n_pending++] = b;
			return;
		}
		d->pending[d->n_pending] = b;
		size_t n = d->n_pending + 1;
		uint32_t cp;
		if (gpud_utf8_decode(d->pending, n, &cp) == n) {
			out_put(o, d->pending, n);
			d->n_pending = 0;
			return;
		}
		if (gpud_utf8_is_partial(d->pending, n)) {
			d->n_pending++;
			return;
		}
		/* b cannot continue what is held: that part is one bad
		 * character, and b starts afresh. */
		out_put(o, fffd, 3);
		d->n_pending = 0;
	}
}

int gpud_detok_push(const struct gpud_tokenizer *t, struct gpud_detok *d, int32_t id, char *out,
		    size_t cap)
{
	if (id < 0 || id >= t->n_vocab)
		return -EINVAL;
	const struct tok_entry *e = &t->tok[id];
	const uint8_t *p = (const uint8_t *)t->blob + e->dec_off;
	size_t len = e->dec_len;
	struct gpud_detok nd = *d;
	struct outbuf o = { .p = out, .cap = cap };

	if (e->type == TT_UNUSED || ((e->type == TT_CONTROL || e->type == TT_UNKNOWN) && !d->special))
		len = 0;
	if (len > 0 && !nd.started) {
		nd.started = true;
		if (t->kind == KIND_SPM && t->add_space_prefix && p[0] == ' ') {
			p++;
			len--;
		}
	}
	for (size_t i = 0; i < len; i++)
		detok_byte(&nd, p[i], &o);
	if (o.full)
		return SW_ETOOLONG; /* d unchanged: retry with more room */
	*d = nd;
	return (int)o.n;
}

int gpud_detok_flush(struct gpud_detok *d, char *out, size_t cap)
{
	if (d->n_pending == 0)
		return 0;
	if (cap < 3)
		return SW_ETOOLONG;
	memcpy(out, "\xEF\xBF\xBD", 3);
	d->n_pending = 0;
	return 3;
}
