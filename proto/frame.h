/* frame.h - the fixed-layout frames gpud and its clients exchange on the
 * Unix socket (DESIGN §4; the wire format is documented in proto/README.md).
 *
 * A frame is PROTO_FRAME_SIZE bytes, every field little-endian at a fixed
 * offset. Frames are small: payloads (segment text, mask rows, token
 * batches, JSON) live in the connection's shared-memory region and a frame
 * only names them by offset and length. Nothing here allocates or blocks.
 *
 * Decoding never trusts the peer: the magic, the version, the type, the
 * reserved bits and every offset/length pair are checked before anything
 * else looks at the frame. A version mismatch is reported as SW_EVERSION
 * (distinct from SW_EFORMAT) so the server can answer with an error frame
 * carrying SW_EVERSION and close the connection.
 */
#ifndef PROTO_FRAME_H
#define PROTO_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PROTO_MAGIC 0x4d525753u /* "SWRM" in little-endian byte order */
#define PROTO_VERSION 1
#define PROTO_FRAME_SIZE 40

/* Frame types. Enums only grow at the end; never renumber. A *_REPLY type
 * (and TOKENS, DONE, ERROR) travels from gpud to the client, the others
 * from the client to gpud. */
enum proto_type {
	PROTO_T_HELLO = 1,          /* c->s: version check; no payload */
	PROTO_T_HELLO_REPLY = 2,    /* s->c: carries the region fd (SCM_RIGHTS);
				     * payload_length = region size */
	PROTO_T_SUBMIT = 3,         /* c->s: generation request (msg.h) */
	PROTO_T_CANCEL = 4,         /* c->s: cancel request_id; no payload */
	PROTO_T_TOKENS = 5,         /* s->c: token batch */
	PROTO_T_DONE = 6,           /* s->c: usage; ends a request */
	PROTO_T_ERROR = 7,          /* s->c: code + message; ends a request */
	PROTO_T_TOKENIZE = 8,       /* c->s */
	PROTO_T_TOKENIZE_REPLY = 9, /* s->c */
	PROTO_T_EMBED = 10,         /* c->s */
	PROTO_T_EMBED_REPLY = 11,   /* s->c */
	PROTO_T_STATS = 12,         /* c->s: no payload */
	PROTO_T_STATS_REPLY = 13,   /* s->c: JSON */
	PROTO_T_MEM = 14,           /* c->s: mem report request */
	PROTO_T_MEM_REPLY = 15,     /* s->c: JSON */
	PROTO_T_TOKENS_LP = 16,     /* s->c: token batch with log probabilities
				     * (a SUBMIT with PROTO_SUBMIT_LOGPROBS) */
	PROTO_T_DETOKENIZE = 17,    /* c->s: token ids -> text */
	PROTO_T_DETOKENIZE_REPLY = 18, /* s->c: the text (TOKENS layout, no ids) */
	/* New types go here, at the end. */
	PROTO_T_LAST = 19,
};

/* Frame flags; every other bit is reserved and must be 0. */
#define PROTO_F_RING 0x1u /* s->c: the payload is the next record(s) in the
			   * response ring, not at payload_offset (which is
			   * then 0, like payload_length) */
#define PROTO_F_KNOWN (PROTO_F_RING)

/* The decoded frame (host byte order). */
struct proto_frame {
	uint32_t magic;
	uint16_t version;
	uint16_t type;           /* enum proto_type */
	uint32_t flags;          /* PROTO_F_* */
	uint32_t aux;            /* per type: ERROR -> the negated error code
				  * (SW_EVERSION travels as 4103); else 0 */
	uint64_t request_id;     /* chosen by the client; 0 = connection-level */
	uint64_t payload_offset; /* bytes from the start of the region */
	uint64_t payload_length; /* bytes */
};

/* Byte offsets of the fields on the wire (static_asserted in frame.c
 * against a packed mirror struct, so they cannot drift). */
enum {
	PROTO_FRAME_OFF_MAGIC = 0,
	PROTO_FRAME_OFF_VERSION = 4,
	PROTO_FRAME_OFF_TYPE = 6,
	PROTO_FRAME_OFF_FLAGS = 8,
	PROTO_FRAME_OFF_AUX = 12,
	PROTO_FRAME_OFF_REQUEST_ID = 16,
	PROTO_FRAME_OFF_PAYLOAD_OFFSET = 24,
	PROTO_FRAME_OFF_PAYLOAD_LENGTH = 32,
};

/* Fills *f with magic, PROTO_VERSION, type and request_id, everything else
 * 0. Never fails. */
void proto_frame_init(struct proto_frame *f, enum proto_type type, uint64_t request_id);

/* Writes f as PROTO_FRAME_SIZE little-endian bytes to out. Writes exactly
 * what f holds (no check: encode whatever the caller built, so tests can
 * produce bad frames). Never fails. */
void proto_frame_encode(const struct proto_frame *f, uint8_t out[PROTO_FRAME_SIZE]);

/* Decodes len bytes from buf into *out and validates them:
 *  - len != PROTO_FRAME_SIZE, wrong magic, reserved flag bits set, aux set
 *    on a type other than ERROR, or a payload length/offset pair that
 *    overflows u64 -> SW_EFORMAT;
 *  - version != PROTO_VERSION -> SW_EVERSION (checked after the magic;
 *    *out is filled so the caller can log the peer's version);
 *  - type 0 or >= PROTO_T_LAST -> SW_EUNSUPPORTED (a newer peer; *out is
 *    filled so the caller can answer with an error for request_id).
 * -EINVAL when buf or out is NULL. The message (err may be NULL) names
 * the field. On SW_EFORMAT *out holds whatever was decoded and must not be
 * used. Nothing is allocated. */
int proto_frame_decode(const uint8_t *buf, size_t len, struct proto_frame *out,
		       char *err, size_t errlen);

/* True for types a client sends (HELLO, SUBMIT, CANCEL, TOKENIZE, EMBED,
 * STATS, MEM), false for the rest (unknown included). */
bool proto_type_from_client(uint16_t type);

/* Static name ("SUBMIT"), "?" for an unknown type. Never NULL. */
const char *proto_type_name(uint16_t type);

/* Overflow-safe bounds check: [off, off+len) must lie inside the area
 * [area_off, area_off+area_len). Returns 0, or SW_EFORMAT with a message
 * naming `what` ("payload: offset 4096 + length 99 past the request area
 * [256, 4352)"). A zero-length span must still start inside or at the end
 * of the area. */
int proto_span_check(uint64_t off, uint64_t len, uint64_t area_off, uint64_t area_len,
		     const char *what, char *err, size_t errlen);

/* Checks a decoded frame's payload against the request area of a region
 * (see proto_shm_layout) and, when it fits, sets *payload to base + offset.
 * Frames with PROTO_F_RING, and payload_length 0 frames, must have
 * payload_offset 0 and yield *payload NULL. Returns 0 or SW_EFORMAT
 * (naming the frame type and the field); *payload is NULL on error. */
int proto_frame_payload(const struct proto_frame *f, const void *base, uint64_t area_off,
			uint64_t area_len, const void **payload, char *err, size_t errlen);

/* Copies n bytes that a peer may be writing concurrently (the shared
 * region) into private memory. The compiler barrier stops the compiler
 * from re-reading the shared bytes later in place of the copy: validate
 * and use the copy, never the shared bytes (no double fetch). */
static inline void proto_copy_in(void *dst, const void *src, size_t n)
{
	if (n)
		memcpy(dst, src, n);
	__asm__ __volatile__("" ::: "memory");
}

/* Little-endian field access for every proto module (alignment-free,
 * correct on any host byte order). */
static inline uint16_t proto_get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t proto_get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t proto_get64(const uint8_t *p)
{
	return (uint64_t)proto_get32(p) | (uint64_t)proto_get32(p + 4) << 32;
}
static inline void proto_put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}
static inline void proto_put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static inline void proto_put64(uint8_t *p, uint64_t v)
{
	proto_put32(p, (uint32_t)v);
	proto_put32(p + 4, (uint32_t)(v >> 32));
}
static inline float proto_getf32(const uint8_t *p)
{
	uint32_t u = proto_get32(p);
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}
static inline void proto_putf32(uint8_t *p, float f)
{
	uint32_t u;
	memcpy(&u, &f, sizeof(u));
	proto_put32(p, u);
}

#endif
