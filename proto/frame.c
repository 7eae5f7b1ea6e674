/* frame.c - fixed-layout frames: encoding, decoding, validation. */
#include "proto/frame.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>

#include "common/err.h"

/* A packed mirror of the wire layout. It is never used to read frames
 * (those go through proto_get*, byte by byte, so host byte order and
 * alignment do not matter); it only proves the documented offsets. */
struct proto_frame_wire {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint32_t flags;
	uint32_t aux;
	uint64_t request_id;
	uint64_t payload_offset;
	uint64_t payload_length;
} __attribute__((packed));

static_assert(sizeof(struct proto_frame_wire) == PROTO_FRAME_SIZE, "frame size");
static_assert(offsetof(struct proto_frame_wire, magic) == PROTO_FRAME_OFF_MAGIC, "magic");
static_assert(offsetof(struct proto_frame_wire, version) == PROTO_FRAME_OFF_VERSION, "version");
static_assert(offsetof(struct proto_frame_wire, type) == PROTO_FRAME_OFF_TYPE, "type");
static_assert(offsetof(struct proto_frame_wire, flags) == PROTO_FRAME_OFF_FLAGS, "flags");
static_assert(offsetof(struct proto_frame_wire, aux) == PROTO_FRAME_OFF_AUX, "aux");
static_assert(offsetof(struct proto_frame_wire, request_id) == PROTO_FRAME_OFF_REQUEST_ID,
	      "request_id");
static_assert(offsetof(struct proto_frame_wire, payload_offset) ==
		      PROTO_FRAME_OFF_PAYLOAD_OFFSET, "payload_offset");
static_assert(offsetof(struct proto_frame_wire, payload_length) ==
		      PROTO_FRAME_OFF_PAYLOAD_LENGTH, "payload_length");
/* Naturally aligned even unpacked: no hidden padding anywhere. */
static_assert(PROTO_FRAME_OFF_REQUEST_ID % 8 == 0, "u64 fields 8-aligned");

static const char *const type_names[PROTO_T_LAST] = {
	[PROTO_T_HELLO] = "HELLO",
	[PROTO_T_HELLO_REPLY] = "HELLO_REPLY",
	[PROTO_T_SUBMIT] = "SUBMIT",
	[PROTO_T_CANCEL] = "CANCEL",
	[PROTO_T_TOKENS] = "TOKENS",
	[PROTO_T_DONE] = "DONE",
	[PROTO_T_ERROR] = "ERROR",
	[PROTO_T_TOKENIZE] = "TOKENIZE",
	[PROTO_T_TOKENIZE_REPLY] = "TOKENIZE_REPLY",
	[PROTO_T_EMBED] = "EMBED",
	[PROTO_T_EMBED_REPLY] = "EMBED_REPLY",
	[PROTO_T_STATS] = "STATS",
	[PROTO_T_STATS_REPLY] = "STATS_REPLY",
	[PROTO_T_MEM] = "MEM",
	[PROTO_T_MEM_REPLY] = "MEM_REPLY",
	[PROTO_T_TOKENS_LP] = "TOKENS_LP",
	[PROTO_T_DETOKENIZE] = "DETOKENIZE",
	[PROTO_T_DETOKENIZE_REPLY] = "DETOKENIZE_REPLY",
};

const char *proto_type_name(uint16_t type)
{
	if (type >= PROTO_T_LAST || !type_names[type])
		return "?";
	return type_names[type];
}

bool proto_type_from_client(uint16_t type)
{
	switch (type) {
	case PROTO_T_HELLO:
	case PROTO_T_SUBMIT:
	case PROTO_T_CANCEL:
	case PROTO_T_TOKENIZE:
	case PROTO_T_EMBED:
	case PROTO_T_STATS:
	case PROTO_T_MEM:
	case PROTO_T_DETOKENIZE:
		return true;
	default:
		return false;
	}
}

void proto_frame_init(struct proto_frame *f, enum proto_type type, uint64_t request_id)
{
	*f = (struct proto_frame){
		.magic = PROTO_MAGIC,
		.version = PROTO_VERSION,
		.type = (uint16_t)type,
		.request_id = request_id,
	};
}

void proto_frame_encode(const struct proto_frame *f, uint8_t out[PROTO_FRAME_SIZE])
{
	proto_put32(out + PROTO_FRAME_OFF_MAGIC, f->magic);
	proto_put16(out + PROTO_FRAME_OFF_VERSION, f->version);
	proto_put16(out + PROTO_FRAME_OFF_TYPE, f->type);
	proto_put32(out + PROTO_FRAME_OFF_FLAGS, f->flags);
	proto_put32(out + PROTO_FRAME_OFF_AUX, f->aux);
	proto_put64(out + PROTO_FRAME_OFF_REQUEST_ID, f->request_id);
	proto_put64(out + PROTO_FRAME_OFF_PAYLOAD_OFFSET, f->payload_offset);
	proto_put64(out + PROTO_FRAME_OFF_PAYLOAD_LENGTH, f->payload_length);
}

int proto_frame_decode(const uint8_t *buf, size_t len, struct proto_frame *out,
		       char *err, size_t errlen)
{
	if (!buf || !out)
		return sw_seterr(err, errlen, -EINVAL, "frame: NULL argument");
	if (len != PROTO_FRAME_SIZE)
		return sw_seterr(err, errlen, SW_EFORMAT, "frame: length %zu, expected %d", len,
				 PROTO_FRAME_SIZE);
	/* Frames arrive in private socket buffers, but copy anyway so the
	 * checks below and the caller see one consistent snapshot. */
	uint8_t b[PROTO_FRAME_SIZE];
	proto_copy_in(b, buf, sizeof(b));
	out->magic = proto_get32(b + PROTO_FRAME_OFF_MAGIC);
	out->version = proto_get16(b + PROTO_FRAME_OFF_VERSION);
	out->type = proto_get16(b + PROTO_FRAME_OFF_TYPE);
	out->flags = proto_get32(b + PROTO_FRAME_OFF_FLAGS);
	out->aux = proto_get32(b + PROTO_FRAME_OFF_AUX);
	out->request_id = proto_get64(b + PROTO_FRAME_OFF_REQUEST_ID);
	out->payload_offset = proto_get64(b + PROTO_FRAME_OFF_PAYLOAD_OFFSET);
	out->payload_length = proto_get64(b + PROTO_FRAME_OFF_PAYLOAD_LENGTH);

	if (out->magic != PROTO_MAGIC)
		return sw_seterr(err, errlen, SW_EFORMAT, "frame: magic 0x%08" PRIx32
				 ", expected 0x%08x", out->magic, PROTO_MAGIC);
	if (out->version != PROTO_VERSION)
		return sw_seterr(err, errlen, SW_EVERSION,
				 "frame: protocol version %u, this side speaks %d",
				 out->version, PROTO_VERSION);
	if (out->type == 0 || out->type >= PROTO_T_LAST)
		return sw_seterr(err, errlen, SW_EUNSUPPORTED, "frame: unknown type %u",
				 out->type);
	if (out->flags & ~PROTO_F_KNOWN)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "frame %s: reserved flag bits 0x%" PRIx32 " set",
				 proto_type_name(out->type), out->flags & ~PROTO_F_KNOWN);
	if (out->aux && out->type != PROTO_T_ERROR)
		return sw_seterr(err, errlen, SW_EFORMAT, "frame %s: aux %" PRIu32
				 " set on a type that has none", proto_type_name(out->type),
				 out->aux);
	if (out->payload_length > UINT64_MAX - out->payload_offset)
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "frame %s: payload offset %" PRIu64 " + length %" PRIu64
				 " overflows", proto_type_name(out->type), out->payload_offset,
				 out->payload_length);
	return 0;
}

int proto_span_check(uint64_t off, uint64_t len, uint64_t area_off, uint64_t area_len,
		     const char *what, char *err, size_t errlen)
{
	if (!what)
		what = "span";
	/* Each subtraction below is guarded by the comparison before it, so
	 * nothing can wrap whatever the four values are. */
	if (area_len > UINT64_MAX - area_off)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: area [%" PRIu64 ", +%" PRIu64
				 ") overflows", what, area_off, area_len);
	if (off < area_off || off - area_off > area_len || len > area_len - (off - area_off))
		return sw_seterr(err, errlen, SW_EFORMAT,
				 "%s: offset %" PRIu64 " + length %" PRIu64
				 " outside the area [%" PRIu64 ", %" PRIu64 ")",
				 what, off, len, area_off, area_off + area_len);
	return 0;
}

int proto_frame_payload(const struct proto_frame *f, const void *base, uint64_t area_off,
			uint64_t area_len, const void **payload, char *err, size_t errlen)
{
	if (!payload)
		return sw_seterr(err, errlen, -EINVAL, "frame: NULL argument");
	*payload = NULL;
	if (!f || !base)
		return sw_seterr(err, errlen, -EINVAL, "frame: NULL argument");
	const char *tn = proto_type_name(f->type);
	if ((f->flags & PROTO_F_RING) || f->payload_length == 0) {
		if (f->payload_offset || f->payload_length)
			return sw_seterr(err, errlen, SW_EFORMAT,
					 "frame %s: payload_offset %" PRIu64 " / payload_length %"
					 PRIu64 " must be 0 %s", tn, f->payload_offset,
					 f->payload_length,
					 (f->flags & PROTO_F_RING) ? "for a ring payload"
								   : "without a payload");
		return 0;
	}
	char what[48];
	snprintf(what, sizeof(what), "frame %s: payload", tn);
	int rc = proto_span_check(f->payload_offset, f->payload_length, area_off, area_len,
				  what, err, errlen);
	if (rc)
		return rc;
	if (f->payload_offset > SIZE_MAX)
		return sw_seterr(err, errlen, SW_EFORMAT, "%s: offset too large", what);
	*payload = (const uint8_t *)base + f->payload_offset;
	return 0;
}
