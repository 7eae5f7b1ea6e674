#!/usr/bin/env bash
# scripts/lib/test-servers.sh - private Redis and PostgreSQL for tests.
#
#   test-servers.sh start [-o OWNER_PID] [-s redis|pg|redis,pg] DIR
#   test-servers.sh stop DIR
#
# start: DIR must exist and be empty (mktemp -d). Starts the servers under
# DIR on free 127.0.0.1 ports (plus Unix sockets in DIR), writes DIR/env
# and prints it to stdout, one KEY=VALUE a line:
#   SWARM_TEST_REDIS_URL=redis://127.0.0.1:PORT   SWARM_TEST_REDIS_SOCKET=PATH
#   SWARM_TEST_PG_URL=postgresql://postgres@127.0.0.1:PORT/postgres
#   SWARM_TEST_PG_SOCKET_DIR=PATH
# Exit status 0 when every requested server answers; otherwise non-zero,
# a reason on stderr, and whatever was started is stopped again.
# With -o, a watcher stops everything when process OWNER_PID exits, so a
# test that crashes leaves no server behind.
#
# stop: stops whatever start left in DIR, then removes DIR. Idempotent.
#
# As root, PostgreSQL runs as the `postgres` user (it refuses root).
set -euo pipefail

SELF=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
PG_BIN=/usr/lib/postgresql/15/bin
MARK=.swarm-test-servers

say() { printf 'test-servers: %s\n' "$*" >&2; }

# pick_port: a free 127.0.0.1 port below the ephemeral range. The caller
# still retries if the bind loses a race.
. "$(dirname "$SELF")/port.sh"

pg_run() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

start_redis() {
	local dir=$1 port
	command -v redis-server >/dev/null || { say "redis-server not installed"; return 1; }
	mkdir -p "$dir/redis"
	for _ in 1 2 3 4 5; do
		port=$(pick_port) || { say "no free port"; return 1; }
		: >"$dir/redis/redis.log"
		redis-server --port "$port" --bind 127.0.0.1 --protected-mode no \
			--unixsocket "$dir/redis/redis.sock" --unixsocketperm 700 \
			--dir "$dir/redis" --save '' --appendonly no \
			--daemonize yes --pidfile "$dir/redis/redis.pid" \
			--logfile "$dir/redis/redis.log" || true
		for _ in $(seq 1 100); do
			if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ]; then
				echo "SWARM_TEST_REDIS_URL=redis://127.0.0.1:$port" >>"$dir/env"
				echo "SWARM_TEST_REDIS_SOCKET=$dir/redis/redis.sock" >>"$dir/env"
				return 0
			fi
			grep -q 'Address already in use' "$dir/redis/redis.log" && break
			sleep 0.1
		done
		stop_redis "$dir"
		grep -q 'Address already in use' "$dir/redis/redis.log" || break
	done
	say "redis-server did not start; its log:"
	tail -n 20 "$dir/redis/redis.log" >&2
	return 1
}

start_pg() {
	local dir=$1 port
	[ -x "$PG_BIN/initdb" ] || { say "PostgreSQL 15 not installed ($PG_BIN)"; return 1; }
	mkdir -p "$dir/pg"
	if [ "$(id -u)" -eq 0 ]; then
		id postgres >/dev/null 2>&1 || { say "no postgres user"; return 1; }
		chown postgres "$dir/pg"
	fi
	if ! pg_run "$PG_BIN/initdb" -D "$dir/pg/data" -U postgres --auth=trust \
		-E UTF8 --no-locale --no-sync >"$dir/pg/initdb.log" 2>&1; then
		say "initdb failed:"
		tail -n 20 "$dir/pg/initdb.log" >&2
		return 1
	fi
	for _ in 1 2 3 4 5; do
		port=$(pick_port) || { say "no free port"; return 1; }
		if pg_run "$PG_BIN/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/postgres.log" \
			-w -t 60 -s -o "-p $port -k $dir/pg -c listen_addresses=127.0.0.1 \
-c fsync=off -c full_page_writes=off -c synchronous_commit=off \
-c shared_buffers=16MB -c max_connections=200" start >/dev/null 2>&1; then
			echo "SWARM_TEST_PG_URL=postgresql://postgres@127.0.0.1:$port/postgres" >>"$dir/env"
			echo "SWARM_TEST_PG_SOCKET_DIR=$dir/pg" >>"$dir/env"
			return 0
		fi
		grep -q 'already in use' "$dir/pg/postgres.log" 2>/dev/null || break
	done
	say "postgres did not start; its log:"
	tail -n 20 "$dir/pg/postgres.log" >&2 2>/dev/null || true
	return 1
}

# Sends TERM to the pid in file $1 and waits (5 s) before KILL.
kill_pidfile() {
	local pid
	[ -s "$1" ] || return 0
	pid=$(head -n 1 "$1")
	kill "$pid" 2>/dev/null || return 0
	for _ in $(seq 1 50); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	kill -9 "$pid" 2>/dev/null || true
}

stop_redis() {
	kill_pidfile "$1/redis/redis.pid"
	rm -f "$1/redis/redis.pid"
}

stop_pg() {
	local data=$1/pg/data
	[ -f "$data/postmaster.pid" ] || return 0
	pg_run "$PG_BIN/pg_ctl" -D "$data" -m immediate -w -t 20 -s stop \
		>/dev/null 2>&1 || kill_pidfile "$data/postmaster.pid"
}

cmd_stop() {
	local dir=$1
	[ -f "$dir/$MARK" ] || return 0
	stop_redis "$dir"
	stop_pg "$dir"
	if [ -s "$dir/watcher.pid" ] && [ "$(cat "$dir/watcher.pid")" != "$$" ]; then
		# The watcher leads its own process group (setsid): end it and its tail.
		kill -- "-$(cat "$dir/watcher.pid")" 2>/dev/null || true
	fi
	rm -rf "$dir"
}

cmd_start() {
	local owner="" which=redis,pg opt
	OPTIND=1
	while getopts o:s: opt; do
		case $opt in
		o) owner=$OPTARG ;;
		s) which=$OPTARG ;;
		*) return 2 ;;
		esac
	done
	shift $((OPTIND - 1))
	local dir=${1:?usage: test-servers.sh start [-o PID] [-s redis,pg] DIR}
	[ -d "$dir" ] || { say "$dir: not a directory"; return 2; }
	dir=$(cd "$dir" && pwd)
	[ -z "$(ls -A "$dir")" ] || { say "$dir: not empty"; return 2; }
	touch "$dir/$MARK" "$dir/env"
	chmod 755 "$dir"  # postgres must reach its socket directory
	if [ -n "$owner" ]; then
		# The watcher must not hold the caller's stdout open.
		setsid bash -c 'tail --pid="$1" -f /dev/null; exec "$2" stop "$3"' \
			watcher "$owner" "$SELF" "$dir" </dev/null >/dev/null 2>&1 &
		echo $! >"$dir/watcher.pid"
	fi
	local ok=1
	case ",$which," in *,redis,*) start_redis "$dir" || ok=0 ;; esac
	if [ $ok = 1 ]; then
		case ",$which," in *,pg,*) start_pg "$dir" || ok=0 ;; esac
	fi
	if [ $ok = 0 ]; then
		stop_redis "$dir"
		stop_pg "$dir"
		return 1
	fi
	cat "$dir/env"
}

case ${1:-} in
start) shift; cmd_start "$@" ;;
stop) shift; cmd_stop "${1:?usage: test-servers.sh stop DIR}" ;;
*) echo "usage: test-servers.sh start [-o PID] [-s redis,pg] DIR | stop DIR" >&2; exit 2 ;;
esac
