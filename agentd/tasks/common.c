/* common.c - dispatch and error classes shared by the task kinds. */
#include <errno.h>

#include "agentd/tasks/tasks.h"
#include "common/err.h"

int agent_run_task(struct agent_ctx *c, const struct proto_task *t, char *location,
		   size_t loclen, char *err, size_t errlen)
{
	c->document_id = 0;
	switch (t->kind) {
	case PROTO_TASK_INGEST:
		return agent_run_ingest(c, t, location, loclen, err, errlen);
	case PROTO_TASK_SUMMARIZE:
		return agent_run_summarize(c, t, location, loclen, err, errlen);
	case PROTO_TASK_ANSWER:
		return agent_run_answer(c, t, location, loclen, err, errlen);
	}
	return sw_seterr(err, errlen, -EINVAL, "task: unknown kind %d", (int)t->kind);
}

bool agent_error_permanent(int code)
{
	switch (code) {
	case SW_EFORMAT:
	case SW_ETYPE:
	case SW_ETOOLONG:
	case SW_EUNSUPPORTED:
	case SW_ENOTFOUND:
	case -EINVAL:
	case -ELOOP:
	case -EACCES: /* a fetch the policy refuses (agentd.fetch) */
		return true;
	default:
		return false;
	}
}

bool agent_error_outage(int code)
{
	return code == SW_ECLOSED || code == SW_EBUSY;
}
