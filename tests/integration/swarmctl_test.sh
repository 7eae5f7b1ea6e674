#!/usr/bin/env bash
# swarmctl_test.sh - swarmctl's lifecycle against real managed services:
# redis-server, a PostgreSQL cluster with pgvector, gpud on the
# built-in model, agentd, all in a temporary state directory.
#
#   swarmctl_test.sh SWARMCTL
#
# Cases: the usual mistakes while nothing runs (stop, status, submit, a
# wrong config path, a state directory too long for its sockets, a missing
# model, as root a state directory PostgreSQL cannot enter); a service
# that cannot start (gpud on a corrupt model; in external mode, gpud's
# metrics port taken) reported with its cause and nothing left running; then twice in the same state directory:
# start, status, submit --wait, results, top, double start refused, stop,
# stop again - the second round reuses the cluster and still has the first
# round's results, and refuses a submit --wait once agentd is gone (its
# supervisor killed first, then agentd; stop then works without the
# supervisor). What the supervisor heals: swarmctl_heal_test.sh.
# submit makes one task per input: a summarize of a file is one task that
# names its document, the same file again is the same document, a
# swarmctl killed right after queueing loses nothing, and with --question
# the answer over every document is queued once the document is stored.
#
# Exit: 0 pass, 1 fail, 77 skip (no redis-server, PostgreSQL or pgvector
# on a developer machine; under CI=true a missing server fails).
# Every process the test started is stopped on any exit.
set -uo pipefail

swarmctl=$(realpath "${1:?usage: swarmctl_test.sh SWARMCTL}")
. "$(dirname "${BASH_SOURCE[0]}")/managed.sh" # check.sh, $samples
need_managed_servers

top=$(mktemp -d /tmp/swarmctl-it.XXXXXX)
chmod 755 "$top" # PostgreSQL runs as postgres when we are root
state=$top/s

holder=
cleanup() {
	[ -n "$holder" ] && kill "$holder" 2>/dev/null
	reap "$top/ext"
	reap "$state"
	reap "$top/bad"
	rm -rf "$top"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

out=$top/out
ctl() { SWARM_STATE_DIR=$state "$swarmctl" "$@"; }

unset SWARM_MODEL SWARM_CONFIG
# the HTTP front off (swarmctl_http_test.sh covers it): these cases are about the
# other services, and a fixed port 8080 would clash between concurrent runs
export SWARM_HTTP_LISTEN=

# --- the usual mistakes, nothing running ------------------------------------
check "stop with no state directory" 0 "nothing is running" -- ctl stop
check "status when nothing runs" 1 "nothing is running" "redis +down" -- ctl status
mkdir -p "$state"
check "submit when nothing runs" 1 "cannot connect" "is the swarm running" \
	-- ctl submit "$samples/sourdough.txt"
check "results when nothing runs" 1 "postgres" "is the swarm running" -- ctl results
check "wrong config path" 1 "wrong config path" \
	-- ctl --config "$top/no-such.json" check
long=$top/$(printf 'd%.0s' $(seq 1 110))
check "state directory too long for its sockets" 1 "too long" "SWARM_STATE_DIR" \
	-- env SWARM_STATE_DIR="$long" "$swarmctl" start
[ ! -e "$long" ] || { echo "not ok - the too-long state directory was created"; failures=$((failures + 1)); }
check "submit usage: nothing to submit" 2 "nothing to submit" -- ctl submit
check "submit usage: unknown kind" 2 "unknown kind" -- ctl submit --kind sumarize x
check "submit: missing file, nothing queued" 1 "no-such.txt: No such file" \
	-- ctl submit "$top/no-such.txt"

check "a missing model: refused before anything starts" 1 \
	"gpud.model $top/no-such.gguf: No such file or directory \(SWARM_MODEL\)" \
	-- env SWARM_STATE_DIR="$top/bad" SWARM_MODEL="$top/no-such.gguf" "$swarmctl" start
n=$((n + 1))
if ls "$top/bad/run/"*.pid >/dev/null 2>&1 || [ -e "$top/bad/pg" ]; then
	echo "not ok $n - the missing model started something"
	failures=$((failures + 1))
else
	echo "ok $n - the missing model started nothing"
fi

if [ "$(id -u)" = 0 ]; then
	mkdir -m 700 "$top/private"
	check "as root, a state directory postgres cannot enter" 1 \
		"PostgreSQL runs as the user postgres.*cannot enter $top/private \(mode 700\)" \
		-- env SWARM_STATE_DIR="$top/private/s" "$swarmctl" start
	reap "$top/private/s"
	# a service user useradd refuses: tried 10 times (a lock held by
	# another swarmctl would clear), then refused with useradd's words
	check "as root, a SWARM_USER useradd refuses: start fails with its reason" 1 \
		"useradd failed" "invalid user name 'bad:name'" \
		-- env SWARM_STATE_DIR="$top/baduser" SWARM_USER='bad:name' "$swarmctl" start
	check "... and nothing is left running" 1 "nothing is running" \
		-- env SWARM_STATE_DIR="$top/baduser" "$swarmctl" status
	reap "$top/baduser"
fi

# --- a service that cannot start: gpud on a corrupt model ------------------
head -c 4096 /dev/urandom >"$top/corrupt.gguf"
check "gpud on a corrupt model: start fails with the cause" 1 \
	"gpud: gpud exited during start-up" "last lines of .*gpud.log" \
	-- env SWARM_STATE_DIR="$top/bad" SWARM_MODEL="$top/corrupt.gguf" "$swarmctl" start
check "after the failed start nothing is left running" 1 "nothing is running" \
	-- env SWARM_STATE_DIR="$top/bad" "$swarmctl" status

# --- twice in the same state directory --------------------------------------
for round in 1 2; do
	echo "# round $round"
	check "round $round: start" 0 "starting redis \.\.\. ok" "starting postgres \.\.\. ok" \
		"starting gpud \.\.\. ok" "starting agentd \.\.\. ok" "swarm is running" \
		"text is noise" -- ctl start || break
	if [ $round = 1 ]; then
		pgv=$(stat -c %Y "$state/pg/data/PG_VERSION")
	else
		n=$((n + 1))
		if [ "$(stat -c %Y "$state/pg/data/PG_VERSION")" = "$pgv" ] &&
			[ "$(grep -c 'initdb\|creating directory' "$state/logs/postgres.log")" -le 1 ]; then
			echo "ok $n - round 2 reused the PostgreSQL cluster (no second initdb)"
		else
			echo "not ok $n - round 2 ran initdb again"
			failures=$((failures + 1))
		fi
		check "round 2: round 1's result is still there" 0 "completed" "summary of document" \
			-- ctl results "$sum_id"
	fi
	check "round $round: status" 0 "redis +up" "postgres +up" "gpud +up" "agentd +up" \
		"queue: [0-9]+ waiting, [0-9]+ pending" \
		"[0-9]+ dead-lettered \([0-9]+ kept in swarm:dead\)" "DEVICE +USED MiB" "cpu0 " \
		"CACHE +HITS" -- ctl status
	check "round $round: status shows agentd's workers" 0 "agentd [a-z]+: 2 workers" \
		-- ctl status
	check "round $round: status --json" 0 '"device_memory"' '"queue"' '"pending"' \
		'"dead": [0-9]+' '"dead_kept": [0-9]+' '"up": true' -- ctl status --json
	check "round $round: double start refused" 1 "already running" -- ctl start
	if [ $round = 1 ]; then
		check "round 1: submit --wait (summarize): one task for the file" 0 \
			"queued summarize sum-[^ ]+ for .*sourdough.txt" \
			"summarize sum-[^ ]+: document [0-9]+ stored" \
			"summarize sum-[^ ]+: completed" "summary of document [0-9]+" \
			"text is noise" -- ctl submit "$samples/sourdough.txt" --wait --max-tokens 16 \
			--timeout 300
		sum_id=$(sed -n 's/^queued summarize \(sum-[^ ]*\) .*/\1/p' "$out" | head -n 1)
		doc_id=$(sed -n 's/^summary of document \([0-9]*\) .*/\1/p' "$out" | head -n 1)
		ok "round 1: one task queued for one file" test "$(grep -c '^queued ' "$out")" = 1
		check "round 1: results ID" 0 "completed after 1 attempt" "summary of document" \
			-- ctl results "$sum_id"
		check "round 1: results --json ID" 0 '"kind": "summarize"' '"summary":' \
			'"status": "completed"' "\"document_id\": $doc_id" -- ctl results --json "$sum_id"
		check "round 1: results lists the one task" 0 "$sum_id +summarize +completed" \
			-- ctl results
		ok "round 1: no separate ingest task" test "$(grep -c "$sum_id" "$out")" = 1
		check "round 1: the same file again (--kind ingest): the same document" 0 \
			"queued ingest ing-" "ingest ing-[^ ]+: completed" "document $doc_id: " \
			-- ctl submit "$samples/sourdough.txt" --kind ingest --wait --timeout 120
		check "round 1: a failing fetch: its error, exit 1" 1 \
			"summarize sum-[^ ]+: failed - fetch: file:///nonexistent/x.txt" \
			"\(summarize\): failed after 1 attempt" \
			-- ctl submit file:///nonexistent/x.txt --wait --timeout 120
		# swarmctl killed right after queueing: the task needs nothing more from it
		ctl submit "$samples/lighthouses.txt" --wait --max-tokens 16 >"$top/bg.out" 2>&1 &
		bg=$!
		for _ in $(seq 1 100); do
			grep -q '^queued summarize' "$top/bg.out" && break
			sleep 0.1
		done
		kill -KILL "$bg" 2>/dev/null
		wait "$bg" 2>/dev/null
		bg_id=$(sed -n 's/^queued summarize \(sum-[^ ]*\) .*/\1/p' "$top/bg.out")
		for _ in $(seq 1 600); do
			[ -n "$bg_id" ] && ctl results "$bg_id" >/dev/null 2>&1 && break
			sleep 0.5
		done
		check "round 1: swarmctl killed after queueing: the summarize completes anyway" 0 \
			"$bg_id \(summarize\): completed after 1 attempt" "summary of document [0-9]+" \
			-- ctl results "${bg_id:-none-queued}"
		check "round 1: submit without --wait returns once queued" 0 \
			"queued summarize sum-[^ ]+ for .*tides.txt" \
			-- ctl submit "$samples/tides.txt" --max-tokens 16
		ok "round 1: ... having waited for nothing" test "$(grep -c ': completed' "$out")" = 0
	else
		check "round 2: submit --wait (answer over every document)" 0 \
			"queued answer ask-" "answer ask-[^ ]+: completed" "question: Why" \
			"answer \(from chunks \{[0-9,]+\}\)" \
			-- ctl submit --question "Why does sourdough keep?" --wait --max-tokens 16 \
			--timeout 300
		check "round 2: summarize with --question: the answer follows the document" 0 \
			"queued summarize sum-[^ ]+ for .*lighthouses.txt" \
			"queued answer ask-[^ ]+ over every document" "summarize sum-[^ ]+: completed" \
			"answer ask-[^ ]+: completed" "question: What" \
			-- ctl submit "$samples/lighthouses.txt" --question "What do lighthouses do?" \
			--wait --max-tokens 16 --timeout 300
		n=$((n + 1))
		if [ "$(grep -n 'document [0-9]* stored' "$out" | head -n 1 | cut -d: -f1)" -lt \
			"$(grep -n '^queued answer' "$out" | cut -d: -f1)" ]; then
			echo "ok $n - round 2: the answer was queued after the document was stored"
		else
			echo "not ok $n - round 2: the answer was queued before the document was stored"
			failures=$((failures + 1))
		fi
	fi
	check "round $round: results of an unknown id" 1 "not found" -- ctl results no-such-task
	check "round $round: top --iterations 2" 0 "swarm top" "tasks: [0-9.]+/s" \
		"queue: " "tokens/s" "POOL" -- ctl top --iterations 2 --interval 0.2
	if [ $round = 2 ]; then
		# external mode against this swarm's Redis and PostgreSQL, with
		# gpud's metrics port held by another process
		python3 -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True); time.sleep(120)' >"$top/port" &
		holder=$!
		for _ in $(seq 1 50); do
			[ -s "$top/port" ] && break
			sleep 0.1
		done
		cat >"$top/ext.json" <<-EOF
		{ "state_dir": "$top/ext",
		  "redis": { "url": "unix://$state/run/redis.sock" },
		  "postgres": { "url": "host=$state/pg dbname=swarm user=swarm" },
		  "gpud": { "socket": "$top/ext/g.sock", "model": "$state/models/builtin.gguf",
		            "metrics": "127.0.0.1:$(cat "$top/port")" } }
		EOF
		check "external mode, a port taken: reported with its cause" 1 \
			"checking redis \.\.\. ok" "checking postgres \.\.\. ok" \
			"gpud exited during start-up" "Address already in use" \
			-- "$swarmctl" --config "$top/ext.json" start
		kill "$holder" 2>/dev/null
		wait "$holder" 2>/dev/null
		holder=
		# agentd gone for good: the supervisor first (it would restart it)
		read -r spid _ <"$state/run/supervisor.pid"
		kill -KILL "$spid"
		read -r apid _ <"$state/run/agentd.pid"
		kill -TERM "$apid"
		for _ in $(seq 1 100); do
			kill -0 "$apid" 2>/dev/null || break
			sleep 0.1
		done
		check "round 2: submit --wait with agentd gone: refused, nothing queued" 1 \
			"agentd is not running" "nothing queued" \
			-- ctl submit "$samples/tides.txt" --wait
		check "round 2: status shows agentd down" 1 "agentd +down" "gpud +up" \
			"supervisor +down" -- ctl status
	fi
	check "round $round: stop" 0 "stopping gpud" "stopping redis" "stopping postgres" \
		-- ctl stop
	check "round $round: stop when stopped" 0 "nothing is running" -- ctl stop
	for f in "$state"/run/*.pid; do
		if [ -f "$f" ]; then
			echo "not ok - $f left after stop"
			failures=$((failures + 1))
		fi
	done
done

echo "1..$n"
if [ $failures -ne 0 ]; then
	echo "# $failures failed"
	exit 1
fi
exit 0
