/* swarmctl_supervise_test.c - the managed-mode supervisor's pieces that
 * need no servers: each service's command line (Redis's maxmemory and
 * noeviction, the postmaster in the foreground), stale PostgreSQL lock
 * files after a reboot, the supervisor's pid and status files, and the
 * process table status and top print from them. The supervisor running
 * real services: tests/integration/swarmctl_heal_test.sh. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "swarmctl/proc.h"
#include "swarmctl/services.h"
#include "swarmctl/supervise.h"
#include "swarmctl/view.h"

static char dir[64];

static void managed_env(struct ctl_env *e)
{
	char err[SW_ERR_MAX];

	snprintf(dir, sizeof(dir), "/tmp/sc-sup-XXXXXX");
	assert_non_null(mkdtemp(dir));
	setenv("SWARM_STATE_DIR", dir, 1);
	setenv("SWARM_PG_BINDIR", "/opt/pg/bin", 1);
	setenv("SWARM_REDIS_MAXMEMORY", "100MiB", 1);
	unsetenv("SWARM_CONFIG");
	unsetenv("SWARM_MODEL");
	assert_int_equal(ctl_env_init(e, NULL, err, sizeof(err)), 0);
	assert_int_equal(ctl_state_prepare(e, err, sizeof(err)), 0);
	unsetenv("SWARM_PG_BINDIR");
	unsetenv("SWARM_REDIS_MAXMEMORY");
}

static void remove_dir(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
	unsetenv("SWARM_STATE_DIR");
}

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	assert_int_equal(fclose(f), 0);
}

/* Index of str in argv, or -1. */
static int arg_index(char *const *argv, const char *str)
{
	for (int i = 0; argv[i]; i++)
		if (strcmp(argv[i], str) == 0)
			return i;
	return -1;
}

static void test_commands(void **state)
{
	struct ctl_env e;
	struct ctl_command c;
	char err[SW_ERR_MAX], want[PATH_MAX + 64];
	int i;

	(void)state;
	managed_env(&e);

	assert_int_equal(ctl_service_command(&e, CTL_REDIS, &c, err, sizeof(err)), 0);
	assert_string_equal(c.argv[0], "redis-server");
	i = arg_index(c.argv, "--maxmemory");
	assert_true(i > 0);
	assert_string_equal(c.argv[i + 1], "104857600");
	i = arg_index(c.argv, "--maxmemory-policy");
	assert_true(i > 0);
	assert_string_equal(c.argv[i + 1], "noeviction");
	i = arg_index(c.argv, "--daemonize");
	assert_true(i > 0);
	assert_string_equal(c.argv[i + 1], "no"); /* a child the supervisor sees exit */
	snprintf(want, sizeof(want), "%s/logs/redis.log", dir);
	assert_string_equal(c.log, want);
	/* as root, the service user "swarm" when it exists (created at start) */
	assert_int_equal(c.set_ids, geteuid() == 0 && getpwnam("swarm") != NULL);
	if (c.set_ids)
		assert_int_equal(c.uid, getpwnam("swarm")->pw_uid);
	assert_true(c.start_timeout_ms > 0);

	assert_int_equal(ctl_service_command(&e, CTL_POSTGRES, &c, err, sizeof(err)), 0);
	assert_string_equal(c.argv[0], "/opt/pg/bin/postgres"); /* not pg_ctl's daemon */
	i = arg_index(c.argv, "-D");
	assert_true(i > 0);
	snprintf(want, sizeof(want), "%s/pg/data", dir);
	assert_string_equal(c.argv[i + 1], want);
	assert_true(arg_index(c.argv, "listen_addresses=") > 0);
	assert_int_equal(c.set_ids, geteuid() == 0); /* as root: the postgres user */

	assert_int_equal(ctl_service_command(&e, CTL_GPUD, &c, err, sizeof(err)), 0);
	assert_string_equal(c.argv[1], "serve");
	assert_string_equal(c.argv[3], e.config_path);
	assert_null(c.argv[4]);
	assert_int_equal(ctl_service_command(&e, CTL_AGENTD, &c, err, sizeof(err)), 0);
	assert_string_equal(c.argv[1], "--config");
	assert_string_equal(c.argv[2], e.config_path);
	assert_null(c.argv[3]);

	assert_int_equal(ctl_service_command(&e, CTL_N_SERVICES, &c, err, sizeof(err)), -EINVAL);
	e.pg_bindir[0] = '\0';
	assert_int_equal(ctl_service_command(&e, CTL_POSTGRES, &c, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "PostgreSQL server binaries not found"));

	/* managed services are the supervisor's to start */
	assert_int_equal(ctl_service_start(&e, CTL_GPUD, err, sizeof(err)), -ENOTSUP);
	assert_non_null(strstr(err, "started by the supervisor"));
	remove_dir();
}

/* A process whose working directory is data, as a postmaster's is. */
static pid_t fake_postmaster(const char *data)
{
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		if (chdir(data) != 0)
			_exit(1);
		for (;;)
			pause();
	}
	return pid;
}

static void test_stale_postmaster_pid(void **state)
{
	struct ctl_env e;
	char err[SW_ERR_MAX], data[PATH_MAX], pidf[PATH_MAX + 32], lockf[PATH_MAX + 32];
	char text[PATH_MAX + 64];
	pid_t dead, pm;
	int st;

	(void)state;
	managed_env(&e);
	snprintf(data, sizeof(data), "%s/pg/data", dir);
	assert_int_equal(ctl_mkdirs(data, 0700), 0);
	snprintf(pidf, sizeof(pidf), "%s/postmaster.pid", data);
	snprintf(lockf, sizeof(lockf), "%s/pg/.s.PGSQL.5432.lock", dir);

	/* none: nothing to do */
	assert_int_equal(ctl_service_clear_stale(&e, CTL_POSTGRES, err, sizeof(err)), 0);
	assert_int_equal(ctl_service_pid(&e, CTL_POSTGRES), 0);

	/* a dead pid: left to PostgreSQL, which removes such a file itself */
	dead = fork();
	assert_true(dead >= 0);
	if (dead == 0)
		_exit(0);
	waitpid(dead, &st, 0);
	snprintf(text, sizeof(text), "%d\n%s\n", (int)dead, data);
	write_text(pidf, text);
	assert_int_equal(ctl_service_pid(&e, CTL_POSTGRES), 0);
	assert_int_equal(ctl_service_clear_stale(&e, CTL_POSTGRES, err, sizeof(err)), 0);
	assert_int_equal(access(pidf, F_OK), 0);

	/* a pid a reboot gave to another process (this test): not a
	 * postmaster, removed with the socket's lock file */
	snprintf(text, sizeof(text), "%d\n%s\n", (int)getpid(), data);
	write_text(pidf, text);
	write_text(lockf, text);
	assert_int_equal(ctl_service_pid(&e, CTL_POSTGRES), 0);
	assert_int_equal(ctl_service_clear_stale(&e, CTL_POSTGRES, err, sizeof(err)), 1);
	assert_int_equal(access(pidf, F_OK), -1);
	assert_int_equal(access(lockf, F_OK), -1);

	/* a live postmaster of this cluster: left alone, a spawn refused */
	pm = fake_postmaster(data);
	snprintf(text, sizeof(text), "%d\n%s\n", (int)pm, data);
	write_text(pidf, text);
	for (int t = 0; t < 2000 && ctl_service_pid(&e, CTL_POSTGRES) != pm; t += 10)
		usleep(10000); /* until the child has changed directory */
	assert_int_equal(ctl_service_pid(&e, CTL_POSTGRES), pm);
	assert_int_equal(ctl_service_clear_stale(&e, CTL_POSTGRES, err, sizeof(err)), -EBUSY);
	assert_non_null(strstr(err, "already runs"));
	assert_int_equal(access(pidf, F_OK), 0);
	kill(pm, SIGKILL);
	waitpid(pm, &st, 0);

	/* other services have nothing of the kind */
	assert_int_equal(ctl_service_clear_stale(&e, CTL_REDIS, err, sizeof(err)), 0);
	remove_dir();
}

static void test_supervisor_files(void **state)
{
	struct ctl_env e;
	char p[PATH_MAX + 32];
	json_t *st;

	(void)state;
	managed_env(&e);
	assert_int_equal(ctl_supervisor_pid(&e), 0);
	assert_null(ctl_supervisor_status(&e));

	snprintf(p, sizeof(p), "%s/run/supervisor.pid", dir);
	assert_int_equal(ctl_pidfile_write(p, getpid()), 0);
	assert_int_equal(ctl_supervisor_pid(&e), getpid());
	write_text(p, "1 12345\n"); /* pid 1 did not start at tick 12345: stale */
	assert_int_equal(ctl_supervisor_pid(&e), 0);
	assert_int_equal(access(p, F_OK), -1);

	snprintf(p, sizeof(p), "%s/%s", dir, CTL_SUP_STATUS_FILE);
	write_text(p, "{\"pid\": 5, \"state\": \"running\", \"services\": ["
		      "{\"name\": \"redis\", \"state\": \"running\"},"
		      "{\"name\": \"gpud\", \"state\": \"failed\"}]}");
	st = ctl_supervisor_status(&e);
	assert_non_null(st);
	assert_string_equal(json_string_value(json_object_get(
				    ctl_supervisor_service(st, CTL_GPUD), "state")), "failed");
	assert_null(ctl_supervisor_service(st, CTL_AGENTD));
	json_decref(st);
	write_text(p, "[]");
	assert_null(ctl_supervisor_status(&e));
	/* nothing to stop */
	assert_int_equal(ctl_supervisor_stop(&e, NULL), 0);
	remove_dir();
}

static char *print_table(const struct ctl_env *e, const json_t *procs)
{
	char *out = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&out, &len);

	assert_non_null(f);
	ctl_print_processes(f, e, procs);
	assert_int_equal(fclose(f), 0);
	return out;
}

static void test_process_table(void **state)
{
	struct ctl_env e;
	char p[PATH_MAX + 32], doc[2048], *out;
	json_t *procs, *g;
	bool all_up, any_up;

	(void)state;
	managed_env(&e);
	/* redis "runs" (this process); nothing else; no supervisor */
	snprintf(p, sizeof(p), "%s/run/redis.pid", dir);
	assert_int_equal(ctl_pidfile_write(p, getpid()), 0);
	procs = ctl_processes_json(&e, &all_up, &any_up);
	assert_non_null(procs);
	assert_false(all_up);
	assert_true(any_up);
	assert_false(json_is_true(json_object_get(json_object_get(procs, "supervisor"), "up")));
	out = print_table(&e, procs);
	assert_non_null(strstr(out, "SERVICE    STATE    PID      UPTIME  RESTARTS LAST EXIT\n"));
	assert_non_null(strstr(out, "supervisor down     -        -       -        -\n"));
	assert_non_null(strstr(out, "gpud       down     -        -       -        -\n"));
	assert_non_null(strstr(out, "redis      up       "));
	assert_non_null(strstr(out, "the supervisor is not running"));
	free(out);
	json_decref(procs);

	/* with a supervisor (this process too) and its status */
	snprintf(p, sizeof(p), "%s/run/supervisor.pid", dir);
	assert_int_equal(ctl_pidfile_write(p, getpid()), 0);
	snprintf(doc, sizeof(doc),
		 "{\"pid\": %d, \"state\": \"running\", \"services\": ["
		 "{\"name\": \"redis\", \"pid\": %d, \"state\": \"running\", \"restarts\": 2,"
		 " \"crashes\": 2, \"last_exit\": \"signal 9\", \"exited_at\": 1, \"error\": \"\","
		 " \"last_lines\": \"  old\"},"
		 "{\"name\": \"gpud\", \"pid\": 0, \"state\": \"failed\", \"restarts\": 5,"
		 " \"crashes\": 6, \"last_exit\": \"exit 1\", \"exited_at\": 1,"
		 " \"error\": \"exit 1 during start-up\", \"log\": \"/x/gpud.log\","
		 " \"last_lines\": \"  gguf: bad magic\"},"
		 "{\"name\": \"agentd\", \"pid\": 0, \"state\": \"backoff\", \"restarts\": 0,"
		 " \"crashes\": 1, \"last_exit\": \"exit 1\", \"exited_at\": 1, \"error\": \"\"}]}",
		 (int)getpid(), (int)getpid());
	snprintf(p, sizeof(p), "%s/%s", dir, CTL_SUP_STATUS_FILE);
	write_text(p, doc);
	procs = ctl_processes_json(&e, &all_up, &any_up);
	g = json_object_get(procs, "gpud");
	assert_string_equal(json_string_value(json_object_get(g, "state")), "failed");
	assert_int_equal(json_integer_value(json_object_get(g, "restarts")), 5);
	assert_string_equal(json_string_value(json_object_get(g, "last_lines")),
			    "  gguf: bad magic");
	assert_true(json_real_value(json_object_get(g, "last_exit_ago_s")) > 1e6);
	assert_null(json_object_get(json_object_get(procs, "redis"), "last_lines"));
	assert_false(all_up);
	out = print_table(&e, procs);
	assert_non_null(strstr(out, "supervisor up       "));
	assert_non_null(strstr(out, "redis      up       "));
	assert_non_null(strstr(out, " 2        signal 9, "));
	assert_non_null(strstr(out, "gpud       failed   -        -       5        exit 1, "));
	assert_non_null(strstr(out, "agentd     backoff  -        -       0        exit 1, "));
	assert_non_null(strstr(out, "gpud failed: exit 1 during start-up; more than 5 deaths "
				    "within 60000 ms, not restarted"));
	assert_non_null(strstr(out, "last lines of /x/gpud.log:\n  gguf: bad magic\n"));
	assert_null(strstr(out, "the supervisor is not running"));
	free(out);
	json_decref(procs);

	/* a status file a dead supervisor left: not believed */
	snprintf(doc, sizeof(doc), "{\"pid\": 1, \"state\": \"running\", \"services\": ["
		 "{\"name\": \"gpud\", \"state\": \"failed\", \"restarts\": 5}]}");
	write_text(p, doc);
	procs = ctl_processes_json(&e, &all_up, &any_up);
	assert_null(json_object_get(json_object_get(procs, "gpud"), "state"));
	json_decref(procs);
	remove_dir();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_commands),
		cmocka_unit_test(test_stale_postmaster_pid),
		cmocka_unit_test(test_supervisor_files),
		cmocka_unit_test(test_process_table),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
