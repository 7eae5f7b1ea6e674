#!/usr/bin/env bash
# swarmctl_heal_test.sh - the managed swarm heals itself: the
# supervisor `swarmctl start` leaves running, against real redis-server,
# PostgreSQL with pgvector, gpud on the built-in model and agentd, in a
# temporary state directory.
#
#   swarmctl_heal_test.sh SWARMCTL
#
# Cases, in one swarm:
#   - start: Redis runs with maxmemory (SWARM_REDIS_MAXMEMORY) and
#     noeviction; status shows the supervisor, restarts and last exits;
#   - logs bounded: a service's log pushed past SWARM_LOG_MAX_BYTES is
#     copied to NAME.log.1 and emptied, and the service goes on writing
#     to it;
#   - kill -9 of gpud, of agentd's supervisor, of Redis and of PostgreSQL,
#     one after the other: each comes back by itself, and every ingest
#     pushed before, between and after the kills (plain XADDs, as any
#     client would) completes;
#   - a hung gpud (SIGSTOP): no answer for SWARM_SUPERVISOR_HANG_MS, so
#     killed and restarted, and the tasks go on;
#   - a crash loop (gpud's model replaced by garbage): gpud is marked
#     failed with its last log lines while the others keep running; once
#     the model is back, `swarmctl start` starts it again;
#   - the supervisor killed: status says so; `swarmctl start` brings one
#     back that adopts the running services; killed again: `swarmctl stop`
#     still stops everything;
#   - a host reboot (pid files and postmaster.pid naming a process that is
#     no service): `swarmctl start` just starts, and leaves that process
#     alone.
#
# Exit: 0 pass, 1 fail, 77 skip (no redis-server, PostgreSQL or pgvector
# on a developer machine; under CI=true a missing server fails).
set -uo pipefail

swarmctl=$(realpath "${1:?usage: swarmctl_heal_test.sh SWARMCTL}")
. "$(dirname "${BASH_SOURCE[0]}")/managed.sh" # check.sh, $samples
need_managed_servers
command -v redis-cli >/dev/null || skip_or_fail "redis-cli not installed"

top=$(mktemp -d /tmp/swarmsup-it.XXXXXX)
chmod 755 "$top" # PostgreSQL runs as postgres when we are root
state=$top/s
out=$top/out
stranger=

unset SWARM_MODEL SWARM_CONFIG
# the HTTP front off (swarmctl_http_test.sh covers it): these cases are about the
# other services, and a fixed port 8080 would clash between concurrent runs
export SWARM_HTTP_LISTEN=
# A worker killed with agentd leaves its task pending until the lease runs
# out: 20 s here, not agentd's 5 min, so the tasks of the kills complete
# within all_completed's wait (the soak's CI stage does the same).
export SWARM_STATE_DIR=$state SWARM_WORKERS=2 SWARM_REDIS_MAXMEMORY=64MiB \
	SWARM_LOG_MAX_BYTES=65536 SWARM_SUPERVISOR_HANG_MS=6000 SWARM_LEASE_MS=20000

cleanup() {
	[ -n "$stranger" ] && kill "$stranger" 2>/dev/null
	reap "$state"
	rm -rf "$top"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ctl() { "$swarmctl" "$@"; }
rcli() { redis-cli -s "$state/run/redis.sock" "$@"; }

# svc NAME FIELD: FIELD of service NAME in the supervisor's status ("" when
# unknown).
svc() {
	python3 - "$state/supervisor.status.json" "$1" "$2" <<-'EOF'
	import json, sys
	try:
	    d = json.load(open(sys.argv[1]))
	except Exception:
	    sys.exit(0)
	for s in d.get("services", []):
	    if s["name"] == sys.argv[2]:
	        print(s.get(sys.argv[3], ""))
	EOF
}

# service_pid NAME: the pid swarmctl's pid files name (postmaster.pid for
# postgres).
service_pid() {
	if [ "$1" = postgres ]; then
		head -n 1 "$state/pg/data/postmaster.pid"
	else
		cut -d ' ' -f 1 "$state/run/$1.pid"
	fi
}

# wait_running NAME OLD_PID: until the supervisor reports NAME running
# under a pid other than OLD_PID (60 s).
wait_running() {
	local i
	for i in $(seq 1 600); do
		if [ "$(svc "$1" state)" = running ] && [ "$(svc "$1" pid)" != "$2" ]; then
			return 0
		fi
		sleep 0.1
	done
	return 1
}

# wait_state NAME STATE: until the supervisor reports NAME in STATE (60 s).
wait_state() {
	local i
	for i in $(seq 1 600); do
		[ "$(svc "$1" state)" = "$2" ] && return 0
		sleep 0.1
	done
	return 1
}

# push ID FILE: an ingest of FILE's text as a plain XADD.
ids=()
push() {
	python3 -c 'import json, sys
print(json.dumps({"id": sys.argv[1], "kind": "ingest", "text": open(sys.argv[2]).read()}))' \
		"$1" "$2" >"$top/task.json"
	rcli XADD swarm:tasks '*' task "$(cat "$top/task.json")" >/dev/null && ids+=("$1")
}

# all_completed: every pushed task completed (180 s in all).
all_completed() {
	local id i
	for id in "${ids[@]}"; do
		for i in $(seq 1 1800); do
			ctl results --json "$id" 2>/dev/null | grep -q '"status": "completed"' && break
			sleep 0.1
		done
		if ! ctl results --json "$id" 2>/dev/null | grep -q '"status": "completed"'; then
			echo "# task $id did not complete:"
			ctl results --json "$id" 2>&1 | sed 's/^/#   /'
			return 1
		fi
	done
}

# gone PID...: none of them runs (zombies count as gone).
gone() {
	local p
	for p; do
		[ -n "$p" ] && [ -e "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null &&
			return 1
	done
	return 0
}

# --- start -----------------------------------------------------------------
check "start" 0 "starting redis \.\.\. ok" "starting postgres \.\.\. ok" \
	"starting gpud \.\.\. ok" "starting agentd \.\.\. ok" "supervisor pid [0-9]+" \
	-- ctl start || exit 1
check "status: the supervisor, each service's restarts and last exit" 0 \
	"SERVICE +STATE +PID +UPTIME +RESTARTS +LAST EXIT" "supervisor +up +[0-9]+" \
	"redis +up +[0-9]+ +[0-9.]+[smhd] +0 +-" "agentd +up +[0-9]+ +[0-9.]+[smhd] +0 +-" \
	-- ctl status
check "Redis: maxmemory from SWARM_REDIS_MAXMEMORY, noeviction" 0 "^67108864$" \
	"^noeviction$" -- rcli CONFIG GET 'maxmemory*'
check "logs supervisor" 0 "redis: spawned pid" "agentd: spawned pid" -- ctl logs supervisor

# --- logs stay bounded -------------------------------------------------------
head -c 200000 /dev/zero | tr '\0' x >>"$state/logs/redis.log"
echo >>"$state/logs/redis.log"
for _ in $(seq 1 50); do
	[ -f "$state/logs/redis.log.1" ] && break
	sleep 0.1
done
n=$((n + 1))
size=$(stat -c %s "$state/logs/redis.log")
size1=$(stat -c %s "$state/logs/redis.log.1" 2>/dev/null || echo 0)
if [ "$size1" -gt 200000 ] && [ "$size" -lt 65536 ]; then
	echo "ok $n - a log past SWARM_LOG_MAX_BYTES: copied to redis.log.1 ($size1 bytes), emptied"
else
	echo "not ok $n - redis.log $size bytes, redis.log.1 $size1 bytes"
	failures=$((failures + 1))
fi
rcli BGREWRITEAOF >/dev/null
# A busy machine can take a while to fork the rewrite: wait up to 30 s.
for _ in $(seq 1 300); do
	grep -q "rewrit" "$state/logs/redis.log" && break
	sleep 0.1
done
n=$((n + 1))
nul=$(tr -cd '\0' <"$state/logs/redis.log" | wc -c) # one read: Redis may be writing
if ! grep -q "rewrit" "$state/logs/redis.log"; then
	echo "not ok $n - no line from Redis in redis.log within 30 s of the rotation"
	failures=$((failures + 1))
elif [ "$nul" != 0 ]; then
	echo "not ok $n - redis.log has a hole of $nul NUL bytes after the rotation"
	failures=$((failures + 1))
else
	echo "ok $n - Redis goes on logging into the emptied file (from its start, no hole)"
fi

# --- kill -9 of each service: back by itself, no task lost ------------------
files=("$samples"/*.txt)
k=0
push "it-$$-$k" "${files[$((k % ${#files[@]}))]}"
k=$((k + 1))
for name in gpud agentd redis postgres; do
	push "it-$$-$k" "${files[$((k % ${#files[@]}))]}"
	k=$((k + 1))
	old=$(service_pid $name)
	kill -KILL "$old"
	ok "kill -9 $name (pid $old): restarted by the supervisor" wait_running $name "$old"
	push "it-$$-$k" "${files[$((k % ${#files[@]}))]}"
	k=$((k + 1))
done
ok "every task pushed before, between and after the kills completed (${#ids[@]})" all_completed
check "status after the kills: each restarted once, last exit signal 9" 0 \
	"gpud +up +[0-9]+ +[0-9.]+[smhd] +1 +signal 9, " \
	"agentd +up +[0-9]+ +[0-9.]+[smhd] +1 +signal 9, " \
	"redis +up +[0-9]+ +[0-9.]+[smhd] +1 +signal 9, " \
	"postgres +up +[0-9]+ +[0-9.]+[smhd] +1 +signal 9, " -- ctl status
check "status --json: restarts and last exit" 0 '"restarts": 1' '"last_exit": "signal 9"' \
	'"supervisor": \{' -- ctl status --json

# --- a hung service: killed and restarted -------------------------------------
old=$(service_pid gpud)
kill -STOP "$old"
push "it-$$-$k" "${files[$((k % ${#files[@]}))]}"
k=$((k + 1))
ok "a stopped gpud (no answer for 6 s): killed and restarted" wait_running gpud "$old"
check "the supervisor says why" 0 "gpud \(pid $old\): no answer for [0-9]+ ms \(limit 6000\).*hung, killing it" \
	-- ctl logs supervisor
ok "the tasks go on after the hang (${#ids[@]})" all_completed

# --- a crash loop: marked failed, the others keep running -------------------
model=$state/models/builtin.gguf
cp "$model" "$top/model.good"
head -c 4096 /dev/urandom >"$model"
kill -KILL "$(service_pid gpud)"
ok "gpud on a corrupt model: marked failed" wait_state gpud failed
check "status: gpud failed with its last log lines, the others up" 1 "gpud +failed +- " \
	"gpud failed: .*more than 5 deaths within 60000 ms" "last lines of .*gpud\.log" \
	"redis +up" "postgres +up" "agentd +up" "supervisor +up" -- ctl status
check "status --json: the failed state and its last lines" 1 '"state": "failed"' \
	'"last_lines": "  ' -- ctl status --json
cp "$top/model.good" "$model"
check "start with a failed service: starts it again" 0 "gpud failed: starting it again" \
	"starting gpud \.\.\. ok" "starting agentd \.\.\. ok" -- ctl start
check "status: all up again" 0 "gpud +up" "supervisor +up" -- ctl status

# --- the supervisor itself dies ---------------------------------------------
sup=$(cut -d ' ' -f 1 "$state/run/supervisor.pid")
kill -KILL "$sup"
check "status: the supervisor is down, the services run on" 1 "supervisor +down" \
	"the supervisor is not running" "gpud +up" "redis +up" -- ctl status
old_gpud=$(service_pid gpud)
check "start brings a supervisor back that adopts the running services" 0 \
	"starting one; it adopts the running services" \
	"starting redis \.\.\. ok \(pid [0-9]+, already running\)" \
	"starting gpud \.\.\. ok \(pid $old_gpud, already running\)" -- ctl start
kill -KILL "$old_gpud"
ok "an adopted gpud killed: seen and restarted" wait_running gpud "$old_gpud"
cp "$state/pg/data/postmaster.pid" "$top/postmaster.pid"
pids=$(for s in redis postgres gpud agentd; do service_pid $s; done)
kill -KILL "$(cut -d ' ' -f 1 "$state/run/supervisor.pid")"
check "stop with the supervisor gone" 0 "stopping agentd" "stopping gpud" "stopping redis" \
	"stopping postgres" -- ctl stop
# shellcheck disable=SC2086
ok "nothing left running after stop" gone $pids
ok "no pid file left after stop" bash -c "! ls '$state'/run/*.pid 2>/dev/null"

# --- a reboot: stale pid files -----------------------------------------------
sleep 300 &
stranger=$!
for f in supervisor redis gpud agentd; do
	echo "$stranger 12345" >"$state/run/$f.pid"
done
sed "1s/.*/$stranger/" "$top/postmaster.pid" >"$state/pg/data/postmaster.pid"
cp "$state/pg/data/postmaster.pid" "$state/pg/.s.PGSQL.5432.lock"
chmod 600 "$state/pg/data/postmaster.pid" "$state/pg/.s.PGSQL.5432.lock"
[ "$(id -u)" = 0 ] && chown postgres: "$state/pg/data/postmaster.pid" "$state/pg/.s.PGSQL.5432.lock"
check "start after a reboot (stale pid files, a stale postmaster.pid): just starts" 0 \
	"starting redis \.\.\. ok \(pid [0-9]+\)$" "starting postgres \.\.\. ok \(pid [0-9]+\)$" \
	"starting agentd \.\.\. ok" -- ctl start
ok "the process the stale pid files named was left alone" kill -0 "$stranger"
check "the supervisor removed the stale postmaster.pid" 0 \
	"postgres: removed a stale postmaster.pid" -- ctl logs supervisor
check "stop" 0 "stopping supervisor" "stopping postgres" -- ctl stop

echo "1..$n"
if [ $failures -ne 0 ]; then
	echo "# $failures failed"
	exit 1
fi
exit 0
