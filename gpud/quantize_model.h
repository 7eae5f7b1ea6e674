/* quantize_model.h - gpud quantize: a model's matrices converted to
 * another weight type, everything else kept.
 *
 * The source is loaded and checked as gpud serve would load it
 * (gpud_model_load: architecture, shapes, tokenizer, finite block
 * factors). Its metadata is copied as it is but general.file_type (set
 * for the new type); its tensors are written in their order. The
 * matrices the model reads (gpud_model_matrices: token_embd, output, the
 * layers' seven) take the type
 * gpud_mkmodel_tensor_type gives them (the K mixes' Q6_K tensors, the
 * 32-weight fallbacks for rows no 256-weight block fits), each row
 * decoded from the source type (gpud_dequantize_row) and encoded in the
 * new one (gpud_quantize_row): the bits gpud mkmodel writes from the same
 * floats, and the bits the CUDA backend uploads when it requantizes a type
 * it has no kernels for (gpud_cuda_pack_rows). A matrix already in its new
 * type, and every other tensor (norms, biases, rope_freqs, tensors gpud
 * does not read), is copied byte for byte. The output is written
 * atomically (gguf_write.h), streamed in batches of rows made on every
 * CPU: memory stays a batch (8 MiB of output) whatever the model's size.
 *
 * A matrix held in a quantized type and asked for another quantized type
 * (Q4_K -> Q8_0, Q8_0 -> Q4_K_M) rounds weights that are already rounded:
 * refused unless allow_requantize, as llama.cpp's llama-quantize does.
 */
#ifndef GPUD_QUANTIZE_MODEL_H
#define GPUD_QUANTIZE_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpud/mkmodel.h"
#include "gpud/quant.h"

struct gpud_quantize_params {
	const char *in, *out;      /* out must not be in */
	enum gpud_type type;       /* the matrices' type (the mix's base) */
	enum gpud_mkmodel_mix mix; /* PURE, Q4_K_M or Q5_K_M */
	bool allow_requantize;
};

struct gpud_quantize_report {
	uint64_t tensors;   /* in the file */
	uint64_t converted; /* matrices written in another type */
	uint64_t in_bytes, out_bytes; /* tensor data, both files */
};

/* Writes p->out. Returns 0 (and fills *rep when rep is not NULL), or a
 * negative code with err saying what (a source gpud cannot load, a
 * requantization not allowed, a row length the type cannot hold, a write
 * that failed: out is then untouched). */
int gpud_quantize_model(const struct gpud_quantize_params *p, struct gpud_quantize_report *rep,
			char *err, size_t errlen);

#endif
