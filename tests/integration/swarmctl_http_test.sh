#!/usr/bin/env bash
# swarmctl_http_test.sh - gpud-http, the OpenAI-compatible front, as a
# service of the managed swarm (issue 15): started, shown, healed and
# stopped by swarmctl like gpud and agentd.
#
#   swarmctl_http_test.sh SWARMCTL
#
# One managed swarm (redis-server, PostgreSQL with pgvector, gpud on the
# built-in model, agentd, gpud-http) in a temporary state directory, the
# front on a free 127.0.0.1 port (SWARM_HTTP_LISTEN; managed mode's
# default, 127.0.0.1:8080, would clash between concurrent runs):
#   - start reports gpud-http after agentd and prints the API's URL; GET
#     /health is 200 and GET /v1/models lists a model;
#   - status and status --json show gpud-http up with its listen address;
#     logs gpud-http prints its log;
#   - POST /v1/completions goes through gpud (the built-in model);
#   - gpud-http killed with SIGKILL is restarted by the supervisor (a new
#     pid that answers /health again), its restart counted in status;
#   - gpud killed with SIGKILL: the supervisor restarts gpud, the same
#     gpud-http answers /health with 200 again and serves again;
#   - external mode (a configuration file with http.listen, on this swarm's
#     Redis and PostgreSQL): start runs gpud-http detached, status shows
#     it, stop stops it;
#   - stop stops it first, leaves no pid file and nothing on the port;
#   - SWARM_HTTP_LISTEN= (off): a second start runs no gpud-http, status
#     does not list it, and the port stays closed; without the variable
#     but with no gpud-http to run (SWARM_GPUD_HTTP_BIN naming none) the
#     default is off too;
#   - SWARM_HTTP_LISTEN=bad: refused with the variable named, before
#     anything starts.
#
# Exit: 0 pass, 1 fail, 77 skip (gpud-http not built - it is looked for
# next to swarmctl, <build>/http/gpud-http -, no curl, or no redis-server,
# PostgreSQL or pgvector on a developer machine; under CI=true a missing
# server fails, a missing gpud-http too).
set -uo pipefail

swarmctl=$(realpath "${1:?usage: swarmctl_http_test.sh SWARMCTL}")
. "$(dirname "${BASH_SOURCE[0]}")/managed.sh" # check.sh, $samples
http_bin=$(dirname "$swarmctl")/../http/gpud-http
[ -x "$http_bin" ] || skip_or_fail "gpud-http not built ($http_bin)"
command -v curl >/dev/null || skip_or_fail "curl not installed"
need_managed_servers

top=$(mktemp -d /tmp/swarmhttp-it.XXXXXX)
chmod 755 "$top" # PostgreSQL runs as postgres when we are root
state=$top/s
out=$top/out

unset SWARM_MODEL SWARM_CONFIG SWARM_HTTP_API_KEY_FILE SWARM_GPUD_HTTP_BIN
port=$(pick_port) || { echo "FAIL: no free port"; exit 1; }
export SWARM_STATE_DIR=$state SWARM_WORKERS=1 SWARM_HTTP_LISTEN=127.0.0.1:$port
url=http://127.0.0.1:$port

cleanup() {
	reap "$top/ext"
	reap "$state"
	rm -rf "$top"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

ctl() { "$swarmctl" "$@"; }
quiet() { "$@" >/dev/null 2>&1; }
# http_pid: the pid gpud-http's pid file names ("" when none)
http_pid() {
	local pid=
	read -r pid _ <"$state/run/gpud-http.pid" 2>/dev/null
	echo "$pid"
}
# health: the status code of GET /health ("000" when nothing answers)
health() { curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$url/health"; }
# wait_health CODE: up to 60 s for GET /health to answer CODE
wait_health() {
	for _ in $(seq 1 600); do
		[ "$(health)" = "$1" ] && return 0
		sleep 0.1
	done
	return 1
}
# svc NAME FIELD: FIELD of service NAME in the supervisor's status
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

check "a bad http.listen: refused before anything starts" 1 "SWARM_HTTP_LISTEN" \
	-- env SWARM_HTTP_LISTEN=no-port "$swarmctl" start
ok "... nothing started" test ! -e "$state/run/supervisor.pid"

# --- on ------------------------------------------------------------------------
check "start: gpud-http after agentd, and the API's URL" 0 "starting agentd \.\.\. ok" \
	"starting gpud-http \.\.\. ok \(pid [0-9]+\)" "OpenAI-compatible API: $url/v1" \
	-- ctl start
ok "start: gpud-http is the last service started" \
	bash -c "grep '^starting ' '$out' | tail -n 1 | grep -q gpud-http"
ok "GET /health: 200" test "$(health)" = 200
check "GET /v1/models lists a model" 0 '"object" *: *"list"' '"id"' \
	-- curl -s --max-time 5 "$url/v1/models"
model=$(curl -s --max-time 5 "$url/v1/models" |
	python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])' 2>/dev/null)
check "POST /v1/completions: a completion through gpud" 0 '"object" *: *"text_completion"' \
	'"completion_tokens" *: *4' -- curl -s --max-time 120 -H 'Content-Type: application/json' \
	-d "{\"model\": \"$model\", \"prompt\": \"hello\", \"max_tokens\": 4, \"temperature\": 0}" \
	"$url/v1/completions"
check "status: gpud-http up" 0 "gpud-http +up +[0-9]+" "gpud +up" "agentd +up" -- ctl status
check "status --json: gpud-http with its address" 0 '"gpud-http"' \
	"\"listen\": \"127.0.0.1:$port\"" -- ctl status --json
ok "logs gpud-http" quiet ctl logs gpud-http
ok "the supervisor's status names gpud-http running" test "$(svc gpud-http state)" = running
ok "gpud-http's pid file names a live process" kill -0 "$(http_pid)"

# --- healed -------------------------------------------------------------------
old=$(http_pid)
kill -KILL "$old"
for _ in $(seq 1 600); do
	new=$(http_pid)
	[ -n "$new" ] && [ "$new" != "$old" ] && kill -0 "$new" 2>/dev/null && break
	sleep 0.1
done
ok "SIGKILL: the supervisor starts a new gpud-http" test -n "$new" -a "$new" != "$old"
ok "... which answers /health with 200" wait_health 200
ok "... its restart counted" test "$(svc gpud-http restarts)" -ge 1
# "up" is the supervisor's word once its readiness probe has passed, which
# may come some time after /health first answers: up to 30 s for it
for _ in $(seq 1 300); do
	[ "$(svc gpud-http state)" = running ] && break
	sleep 0.1
done
check "status after the restart: up, last exit signal 9" 0 "gpud-http +up .*signal 9" \
	-- ctl status

# gpud killed: the supervisor restarts gpud, not the front, which answers
# /health with 200 again once gpud is back
front=$(http_pid)
read -r gp _ <"$state/run/gpud.pid"
kill -KILL "$gp"
ok "gpud killed: /health answers 200 again after gpud's restart" wait_health 200
ok "... with the same gpud-http (pid $front)" test "$(http_pid)" = "$front"
check "... which serves a completion again" 0 '"object" *: *"text_completion"' \
	-- curl -s --max-time 120 -H 'Content-Type: application/json' \
	-d "{\"model\": \"$model\", \"prompt\": \"hello\", \"max_tokens\": 4}" \
	"$url/v1/completions"

# --- external mode: a configuration file with http.listen -------------------
# against this swarm's Redis and PostgreSQL, its own gpud and agentd
port2=$(pick_port) || { echo "FAIL: no free port"; exit 1; }
cat >"$top/ext.json" <<EOF
{ "state_dir": "$top/ext",
  "redis": { "url": "unix://$state/run/redis.sock" },
  "postgres": { "url": "host=$state/pg dbname=swarm user=swarm" },
  "gpud": { "socket": "$top/ext/g.sock", "model": "$state/models/builtin.gguf" },
  "agentd": { "workers": 1 },
  "http": { "listen": "127.0.0.1:$port2" } }
EOF
extctl() { env -u SWARM_HTTP_LISTEN -u SWARM_STATE_DIR -u SWARM_WORKERS "$swarmctl" --config "$top/ext.json" "$@"; }
check "external mode: start runs gpud-http on http.listen" 0 "checking redis \.\.\. ok" \
	"starting gpud \.\.\. ok" "starting gpud-http \.\.\. ok \(pid [0-9]+\)" \
	"OpenAI-compatible API: http://127.0.0.1:$port2/v1" -- extctl start
ok "external mode: GET /health 200" \
	test "$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "http://127.0.0.1:$port2/health")" = 200
check "external mode: status shows gpud-http up" 0 "gpud-http +up" -- extctl status
check "external mode: stop stops gpud-http" 0 "stopping gpud-http" "stopping gpud" -- extctl stop
ok "external mode: no gpud-http pid file left" test ! -e "$top/ext/run/gpud-http.pid"

# --- stopped ------------------------------------------------------------------
check "stop: gpud-http first" 0 "stopping gpud-http" "stopping gpud" "stopping postgres" \
	-- ctl stop
ok "stop: gpud-http is stopped before agentd and gpud" \
	bash -c "grep '^stopping ' '$out' | grep -v supervisor | head -n 1 | grep -q gpud-http"
ok "stop: no pid file left" test ! -e "$state/run/gpud-http.pid"
ok "stop: nothing answers on the port" test "$(health)" = 000

# --- off ----------------------------------------------------------------------
check "SWARM_HTTP_LISTEN= : start runs no gpud-http" 0 "starting agentd \.\.\. ok" \
	"swarm is running" -- env SWARM_HTTP_LISTEN= "$swarmctl" start
ok "... not in start's output" bash -c "! grep -q 'gpud-http\|OpenAI-compatible' '$out'"
check "... and with no gpud-http installed, no default: status does not list it" 0 \
	"agentd +up" -- env -u SWARM_HTTP_LISTEN SWARM_GPUD_HTTP_BIN="$top/no-gpud-http" \
	"$swarmctl" status
ok "... (no gpud-http row)" bash -c "! grep -q '^gpud-http' '$out'"
check "... status does not list it" 0 "agentd +up" -- env SWARM_HTTP_LISTEN= "$swarmctl" status
ok "... (no gpud-http row)" bash -c "! grep -q '^gpud-http' '$out'"
ok "... nothing answers on the port" test "$(health)" = 000
ok "... the supervisor has four services" test -z "$(svc gpud-http state)"
check "stop" 0 "stopping gpud" -- env SWARM_HTTP_LISTEN= "$swarmctl" stop

echo "1..$n"
if [ $failures -ne 0 ]; then
	echo "# $failures failed"
	exit 1
fi
exit 0
