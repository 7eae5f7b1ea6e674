/* main.c - the agentd command.
 *
 *   agentd worker --config FILE [--heartbeat-fd N] [--sql-dir DIR]
 *
 * runs one worker (agentd/worker.h). The supervisor that keeps N workers
 * alive (`agentd --config FILE`, issue 5) is not written yet.
 */
#include <stdio.h>
#include <string.h>

#include "agentd/worker.h"

int main(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "worker") == 0)
		return agentd_worker_main(argc - 1, argv + 1);
	fprintf(stderr,
		"usage: agentd worker --config FILE [--heartbeat-fd N] [--sql-dir DIR]\n"
		"(the supervisor, `agentd --config FILE`, is not implemented yet)\n");
	return 2;
}
