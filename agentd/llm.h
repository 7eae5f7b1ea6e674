/* llm.h - what the task kinds need from gpud, as an ops table: the real
 * one talks to gpud through proto/client.h; tests plug in a fake.
 *
 * Every op returns 0 or a negative code with a message. SW_ECLOSED means
 * gpud is gone (not running, restarting): the worker backs off and the
 * next call reconnects. SW_EBUSY means gpud's queues are full: retry
 * later. Other codes fail the request (SW_ETOOLONG: it can never fit).
 */
#ifndef AGENT_LLM_H
#define AGENT_LLM_H

#include <stddef.h>
#include <stdint.h>

#include "proto/msg.h"

struct agent_llm {
	/* Tokens of len bytes of text (no BOS) into *n. */
	int (*count_tokens)(void *ctx, const char *text, size_t len, uint32_t *n, char *err,
			    size_t errlen);
	/* Embedding of the text: *vec malloc'd (*dim floats; the caller
	 * frees it). */
	int (*embed)(void *ctx, const char *text, size_t len, float **vec, uint32_t *dim,
		     char *err, size_t errlen);
	/* Generates for req; *text malloc'd and NUL-terminated (the caller
	 * frees it). */
	int (*generate)(void *ctx, const struct proto_submit_req *req, char **text, char *err,
			size_t errlen);
	void *ctx;
};

struct agent_gpud;

/* A gpud-backed agent_llm for socket_path. Nothing connects yet: the
 * first op does, and an op after SW_ECLOSED reconnects. timeout_ms bounds
 * each call (0 = 120 s). Returns 0, -ENOMEM. */
int agent_gpud_open(struct agent_gpud **out, const char *socket_path, uint32_t timeout_ms);

/* The ops table of g (valid until agent_gpud_close). */
const struct agent_llm *agent_gpud_llm(struct agent_gpud *g);

/* Connects now if not connected. 0 or the connect error. */
int agent_gpud_connect(struct agent_gpud *g, char *err, size_t errlen);

/* Closes the connection and frees g. Accepts NULL. */
void agent_gpud_close(struct agent_gpud *g);

#endif
