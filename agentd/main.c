/* main.c - the agentd command.
 *
 *   agentd --config FILE [--sql-dir DIR] [-n]
 *       the supervisor (agentd/supervisor.h): keeps agentd.workers
 *       workers alive, drains them on SIGTERM;
 *   agentd worker --config FILE [--heartbeat-fd N] [--sql-dir DIR] [-n]
 *       one worker (agentd/worker.h);
 *   agentd --version
 *       the version and where migrations are read without --sql-dir
 *       (agentd/sql_dir.h).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "agentd/sql_dir.h"
#include "agentd/supervisor.h"
#include "agentd/worker.h"
#include "sw_config.h"

/* A worker spawned by the supervisor (SWARM_SUPERVISOR_PID is its pid)
 * drains when the supervisor dies, even by SIGKILL, instead of running on
 * unsupervised. Returns false when the supervisor is already gone. */
static bool follow_supervisor(void)
{
	const char *v = getenv("SWARM_SUPERVISOR_PID");
	long pid;

	if (!v || !v[0])
		return true;
	pid = strtol(v, NULL, 10);
	if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0)
		return true;
	return getppid() == (pid_t)pid;
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "--version") == 0) {
		printf("agentd %s\nmigrations: %s\n", SW_VERSION, agent_sql_dir_default());
		return 0;
	}
	if (argc >= 2 && strcmp(argv[1], "worker") == 0) {
		if (!follow_supervisor()) {
			fprintf(stderr, "agentd worker: the supervisor is gone; not starting\n");
			return 0;
		}
		return agent_worker_main(argc - 1, argv + 1);
	}
	return agent_supervisor_main(argc, argv);
}
