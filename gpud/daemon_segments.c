/* daemon_segments.c - the segments of a request to token ids
 * (gpud/daemon.h): plain, or each segment a chat message formatted with
 * the model's template. Pure (the tokenizer and the caller's scratch);
 * unit-tested on its own.
 */
#include <errno.h>
#include <string.h>

#include "common/arena.h"
#include "common/err.h"
#include "gpud/daemon.h"
#include "gpud/tokenizer.h"
#include "proto/frame.h"
#include "proto/msg.h"

/* Copies a segment's text (a view: may change under us, may hold NULs)
 * NUL-terminated into dst. */
static const char *seg_copy(const struct proto_segment *s, char *dst)
{
	memcpy(dst, s->text, s->len);
	dst[s->len] = '\0';
	return dst;
}

long gpud_chat_segment(enum gpud_chat_template tmpl, const struct proto_segment *segs,
		       uint32_t i, bool last, char *out, size_t cap, char *copy, size_t copy_cap)
{
	struct gpud_chat_msg m[2];
	uint32_t n = 0;
	size_t need_copy = segs[i].len + 1 + (i ? segs[i - 1].len + 1 : 0);
	long pre = 0, full;

	if (tmpl == GPUD_CHAT_NONE)
		return SW_EUNSUPPORTED;
	if (need_copy > copy_cap)
		return SW_ETOOLONG;
	/* A template's text for message i depends on message i and, for a
	 * deferred one (a Llama 2 system prompt), the message before it: the
	 * segment's text is format(prev, cur) minus format(prev). Templates
	 * only append, so the latter is a prefix of the former. */
	if (i > 0) {
		m[n].role = proto_role_name(segs[i - 1].role);
		m[n].content = seg_copy(&segs[i - 1], copy);
		copy += segs[i - 1].len + 1;
		n++;
	}
	m[n].role = proto_role_name(segs[i].role);
	m[n].content = seg_copy(&segs[i], copy);
	n++;
	if (!m[0].role || !m[n - 1].role)
		return -EINVAL;
	if (i > 0) {
		pre = gpud_chat_format(tmpl, m, 1, false, NULL, 0);
		if (pre < 0)
			return pre;
	}
	full = gpud_chat_format(tmpl, m, n, last, out, cap);
	if (full < 0)
		return full;
	if ((size_t)full >= cap)
		return SW_ETOOLONG;
	if (full < pre)
		return -EINVAL;
	memmove(out, out + pre, (size_t)(full - pre) + 1);
	return full - pre;
}

/* A segment of token ids (PROTO_SEG_IDS; never with chat: the codec
 * refuses it): copied from the view once, each id checked against the
 * vocabulary, stored in ids when they fit in cap (ids NULL: counted
 * only). Returns the count or a negative code with the message. */
static int segment_ids(const struct gpud_tokenizer *tok, const struct proto_segment *s,
		       uint32_t i, struct gpud_segtok_scratch *sc, int32_t *ids, uint32_t cap,
		       char *err, size_t errlen)
{
	uint32_t n = s->len / 4;
	int32_t nv = gpud_tokenizer_n_vocab(tok);

	if (s->len % 4)
		return sw_seterr(err, errlen, -EINVAL, "segment %u: token ids: %u bytes, not a "
				 "multiple of 4", i, s->len);
	if (s->len > sc->copy_cap)
		return sw_seterr(err, errlen, -EINVAL, "segment %u: %u bytes, more than the %zu a "
				 "segment may have", i, s->len, sc->copy_cap);
	memcpy(sc->copy, s->text, s->len);
	for (uint32_t k = 0; k < n; k++) {
		int32_t id = (int32_t)proto_get32((const uint8_t *)sc->copy + 4 * (size_t)k);
		if (id < 0 || id >= nv)
			return sw_seterr(err, errlen, -EINVAL, "segment %u: token %u: id %d is not "
					 "in the vocabulary of %d", i, k, id, nv);
		if (ids && k < cap)
			ids[k] = id;
	}
	return (int)n;
}

int gpud_segments_tokenize(const struct gpud_tokenizer *tok, enum gpud_chat_template tmpl,
			   bool chat, const struct proto_segment *segs, uint32_t n,
			   struct gpud_segtok_scratch *sc, int32_t *ids, uint32_t cap,
			   uint32_t *seg_tokens, uint32_t *n_ids, char *err, size_t errlen)
{
	size_t total = 0;
	bool over = false;

	*n_ids = 0;
	if (chat && tmpl == GPUD_CHAT_NONE) {
		/* its message: why, and --chat-format / gpud.chat_format */
		enum gpud_chat_template t;
		int rc = gpud_tokenizer_chat_resolve(tok, GPUD_CHAT_NONE, &t, err, errlen);
		return rc ? rc : sw_seterr(err, errlen, SW_EUNSUPPORTED,
					   "chat formatting: no chat format for this model");
	}
	for (uint32_t i = 0; i < n; i++) {
		const char *text = segs[i].text;
		size_t len = segs[i].len, got = 0;
		unsigned flags = 0;
		int rc;

		if (segs[i].flags & PROTO_SEG_IDS) {
			rc = segment_ids(tok, &segs[i], i, sc, over ? NULL : ids + total,
					 over ? 0 : cap - total, err, errlen);
			if (rc < 0)
				return rc;
			over = over || (uint32_t)rc > cap - total;
			seg_tokens[i] = (uint32_t)rc;
			total += (uint32_t)rc;
			continue;
		}
		if (chat) {
			if (!proto_role_name(segs[i].role))
				return sw_seterr(err, errlen, -EINVAL,
						 "segment %u: chat formatting needs a role "
						 "(system, user or assistant)", i);
			long l = gpud_chat_segment(tmpl, segs, i, i + 1 == n, sc->fmt,
						   sc->fmt_cap, sc->copy, sc->copy_cap);
			if (l < 0)
				return sw_seterr(err, errlen, l == SW_ETOOLONG ? -EINVAL : (int)l,
						 "segment %u: cannot format it as a chat message: %s",
						 i, sw_strerror((int)l));
			text = sc->fmt;
			len = (size_t)l;
			flags = GPUD_TOK_PARSE_SPECIAL; /* the template's tokens */
			if (i == 0 && !gpud_chat_writes_bos(tmpl))
				flags |= GPUD_TOK_ADD_BOS; /* as the vocab says */
		} else {
			/* The text is a view into the client's request area, which
			 * the client may rewrite while we read it, and the
			 * tokenizer reads its input more than once (the
			 * SentencePiece encoder counts spaces to size its buffer,
			 * then fills it): it gets a private copy, taken once. */
			if (len > sc->copy_cap)
				return sw_seterr(err, errlen, -EINVAL,
						 "segment %u: %zu bytes, more than the %zu a "
						 "segment may have", i, len, sc->copy_cap);
			memcpy(sc->copy, text, len);
			text = sc->copy;
			if (i == 0)
				flags = GPUD_TOK_ADD_BOS;
		}
		if (len == 0) {
			seg_tokens[i] = 0;
			continue;
		}
		rc = gpud_tokenizer_encode(tok, text, len, flags, over ? NULL : ids + total,
					   over ? 0 : cap - total, &got, sc->arena);
		if (rc == SW_ETOOLONG) {
			over = true;
		} else if (rc) {
			return sw_seterr(err, errlen, rc == -ENOMEM ? -EINVAL : rc,
					 "segment %u: tokenizer: %s (%zu bytes)", i,
					 rc == -ENOMEM ? "text too long for the request scratch" :
					 sw_strerror(rc), len);
		}
		seg_tokens[i] = (uint32_t)got;
		total += got;
	}
	*n_ids = total > UINT32_MAX ? UINT32_MAX : (uint32_t)total;
	if (over)
		return sw_seterr(err, errlen, SW_ETOOLONG,
				 "prompt of %zu tokens is longer than the %u a request may have", total,
				 cap);
	return 0;
}
