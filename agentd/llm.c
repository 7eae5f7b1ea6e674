/* llm.c - agent_llm over gpud's client library. */
#include "agentd/llm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"
#include "proto/client.h"

struct agent_gpud {
	struct proto_client *c;
	char *socket;
	uint32_t timeout_ms;
	struct agent_llm ops;
};

int agent_gpud_connect(struct agent_gpud *g, char *err, size_t errlen)
{
	struct proto_client_opts o;
	int rc;

	if (g->c && proto_client_alive(g->c))
		return 0;
	proto_client_close(g->c);
	g->c = NULL;
	proto_client_opts_default(&o);
	o.timeout_ms = g->timeout_ms;
	o.max_inflight = 8;
	rc = proto_client_connect(&g->c, g->socket, &o, err, errlen);
	/* Nothing listening is gpud being away, the same as a drop. */
	if (rc == -ENOENT || rc == -ECONNREFUSED)
		rc = SW_ECLOSED;
	if (rc == 0)
		log_info("connected to gpud (pid %d) at %s", proto_client_server_pid(g->c), g->socket);
	return rc;
}

/* A call that saw the connection break leaves it for the next connect. */
static int after(struct agent_gpud *g, int rc, char *err, size_t errlen)
{
	if (rc == SW_ECLOSED || (g->c && !proto_client_alive(g->c))) {
		proto_client_close(g->c);
		g->c = NULL;
		if (err && errlen && !err[0])
			snprintf(err, errlen, "gpud: connection to %s closed", g->socket);
		return SW_ECLOSED;
	}
	return rc;
}

static int gpud_count(void *ctx, const char *text, size_t len, uint32_t *n, char *err,
		      size_t errlen)
{
	struct agent_gpud *g = ctx;
	int32_t *ids = NULL;
	int rc = agent_gpud_connect(g, err, errlen);

	if (rc)
		return rc;
	if (err && errlen)
		err[0] = '\0';
	rc = proto_client_tokenize(g->c, text, len, 0, &ids, n, err, errlen);
	free(ids);
	return after(g, rc, err, errlen);
}

static int gpud_embed(void *ctx, const char *text, size_t len, float **vec, uint32_t *dim,
		      char *err, size_t errlen)
{
	struct agent_gpud *g = ctx;
	int rc = agent_gpud_connect(g, err, errlen);

	if (rc)
		return rc;
	if (err && errlen)
		err[0] = '\0';
	rc = proto_client_embed(g->c, text, len, vec, dim, err, errlen);
	return after(g, rc, err, errlen);
}

static int gpud_generate(void *ctx, const struct proto_submit_req *req, char **text, char *err,
			 size_t errlen)
{
	struct agent_gpud *g = ctx;
	struct proto_client_result res = { 0 };
	int rc = agent_gpud_connect(g, err, errlen);

	*text = NULL;
	if (rc)
		return rc;
	if (err && errlen)
		err[0] = '\0';
	rc = proto_client_generate(g->c, req, &res, err, errlen);
	if (rc == 0) {
		*text = res.text ? res.text : strdup("");
		res.text = NULL;
		if (!*text)
			rc = -ENOMEM;
	}
	proto_client_result_free(&res);
	return after(g, rc, err, errlen);
}

int agent_gpud_open(struct agent_gpud **out, const char *socket_path, uint32_t timeout_ms)
{
	struct agent_gpud *g = calloc(1, sizeof(*g));

	*out = NULL;
	if (!g)
		return -ENOMEM;
	g->socket = strdup(socket_path ? socket_path : "");
	if (!g->socket) {
		free(g);
		return -ENOMEM;
	}
	g->timeout_ms = timeout_ms ? timeout_ms : 120000;
	g->ops = (struct agent_llm){
		.count_tokens = gpud_count,
		.embed = gpud_embed,
		.generate = gpud_generate,
		.ctx = g,
	};
	*out = g;
	return 0;
}

const struct agent_llm *agent_gpud_llm(struct agent_gpud *g)
{
	return &g->ops;
}

void agent_gpud_close(struct agent_gpud *g)
{
	if (!g)
		return;
	proto_client_close(g->c);
	free(g->socket);
	free(g);
}
