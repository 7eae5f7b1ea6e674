/* chunk.h - token-aware chunking with overlap (ingest).
 *
 * The text is cut into units at sentence and paragraph ends (". ", "! ",
 * "? ", a newline); each unit's tokens are counted with a callback (gpud's
 * tokenizer in the worker, a fake in tests). A unit longer than the
 * budget is halved at whitespace until each piece fits (or cannot be
 * split: one huge word stays one unit, and its chunk is over budget).
 * Chunks are then filled greedily with whole units up to max_tokens; the
 * next chunk starts with the trailing units of the previous one whose
 * tokens add up to at most overlap tokens, and always starts at least one
 * unit further, so the walk ends.
 *
 * A chunk is a byte span of the original text (units are contiguous), so
 * nothing is copied. The token count of a chunk is the sum over its
 * units: the tokenizer may merge across a boundary, so it can exceed the
 * exact count by a token or so per unit, never fall short by more than
 * that.
 */
#ifndef AGENT_CHUNK_H
#define AGENT_CHUNK_H

#include <stddef.h>
#include <stdint.h>

struct agent_chunk {
	size_t off;        /* byte offset into the text */
	size_t len;        /* bytes */
	uint32_t n_tokens; /* sum of the unit counts */
};

/* Counts the tokens of len bytes of text into *n. Returns 0 or a negative
 * code, which chunking passes through. */
typedef int (*agent_count_fn)(void *arg, const char *text, size_t len, uint32_t *n);

/* Chunks len bytes of text. *out is a malloc'd array of *n_out chunks the
 * caller frees (NULL and 0 for an empty or all-whitespace text). Returns
 * 0, -EINVAL (max_tokens 0, or overlap >= max_tokens), -ENOMEM, or the
 * counter's error; on error *out is NULL. */
int agent_chunk_text(const char *text, size_t len, uint32_t max_tokens, uint32_t overlap,
		     agent_count_fn count, void *arg, struct agent_chunk **out, size_t *n_out,
		     char *err, size_t errlen);

#endif
